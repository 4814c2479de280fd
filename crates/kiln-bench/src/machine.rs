//! Facts about the machine a benchmark runs on, read from /proc: cores, kernel, CPU
//! model, memory, and the mount that holds a directory. `kiln disk-bench` prints
//! them beside its rows; bench/ records them in its results file.

use std::path::Path;

/// A file's contents, trimmed; None if unreadable or empty.
pub fn read_trimmed(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The CPUs this process may run on.
pub fn cores() -> Option<usize> {
    std::thread::available_parallelism().ok().map(|n| n.get())
}

/// The kernel's release (`uname -r`).
pub fn kernel() -> Option<String> {
    read_trimmed("/proc/sys/kernel/osrelease")
}

/// The first CPU's model name.
pub fn cpu_model() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
}

/// Total memory in GiB.
pub fn memory_gib() -> Option<f64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
}

/// A line of /proc/self/mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The device (or what stands for one: `tmpfs`, `overlay`).
    pub source: String,
    pub point: String,
    pub fs_type: String,
    pub options: String,
}

/// The mount that holds `dir` (canonicalized if it exists): the longest mount point
/// that is a prefix of it, the last one listed if several are mounted there.
pub fn mount_of(dir: &Path) -> Option<Mount> {
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let mut best: Option<Vec<String>> = None;
    for line in mounts.lines() {
        let fields: Vec<String> = line.split_whitespace().map(unescape_mount).collect();
        if fields.len() < 4 || !canon.starts_with(&fields[1]) {
            continue;
        }
        // Later entries over the same mount point shadow earlier ones.
        if best.as_ref().is_none_or(|b| fields[1].len() >= b[1].len()) {
            best = Some(fields);
        }
    }
    best.map(|mut f| {
        f.truncate(4);
        let options = f.pop().unwrap_or_default();
        let fs_type = f.pop().unwrap_or_default();
        let point = f.pop().unwrap_or_default();
        let source = f.pop().unwrap_or_default();
        Mount {
            source,
            point,
            fs_type,
            options,
        }
    })
}

/// Counters of the block device that holds a directory, from /proc/diskstats: what
/// every process writing to that disk did (the benchmark's servers and anything
/// else on the machine), so differences over a workload are upper bounds of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskCounters {
    /// Write requests completed.
    pub writes: u64,
    /// 512-byte sectors written.
    pub sectors_written: u64,
    /// Cache flushes completed (what an fsync or an O_DSYNC write asks of a disk
    /// with a volatile write cache); None on kernels before 4.18.
    pub flushes: Option<u64>,
}

impl DiskCounters {
    /// The counters now of the device `dir` is on; None when it is not a block
    /// device /proc/diskstats lists (tmpfs, overlay, a network file system).
    pub fn of(dir: &Path) -> Option<DiskCounters> {
        let source = mount_of(dir)?.source;
        // /dev/mapper/x and /dev/disk/by-*/x are links to the kernel's name.
        let canon = std::fs::canonicalize(&source).unwrap_or_else(|_| source.into());
        let name = canon.file_name()?.to_str()?.to_string();
        let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
        stats.lines().find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(2) != Some(&name.as_str()) {
                return None;
            }
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            Some(DiskCounters {
                writes: n(7)?,
                sectors_written: n(9)?,
                flushes: n(18),
            })
        })
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DiskCounters) -> DiskCounters {
        DiskCounters {
            writes: self.writes.saturating_sub(earlier.writes),
            sectors_written: self.sectors_written.saturating_sub(earlier.sectors_written),
            flushes: self
                .flushes
                .zip(earlier.flushes)
                .map(|(a, b)| a.saturating_sub(b)),
        }
    }
}

/// Undoes the octal escapes (\040 for a space) of /proc/mounts.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_mounted_somewhere() {
        let m = mount_of(Path::new("/")).expect("a mount for /");
        assert_eq!(m.point, "/");
        assert!(!m.fs_type.is_empty());
    }

    #[test]
    fn disk_counters_only_grow() {
        // Where the temporary directory is on a block device (not on tmpfs).
        let dir = std::env::temp_dir();
        let Some(before) = DiskCounters::of(&dir) else {
            return;
        };
        let after = DiskCounters::of(&dir).expect("the same device");
        let d = after.since(&before);
        assert!(after.writes >= before.writes && d.writes == after.writes - before.writes);
    }

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(unescape_mount(r"/mnt/my\040disk"), "/mnt/my disk");
        assert_eq!(unescape_mount(r"C:\\x"), r"C:\\x");
    }
}
