//! The real file system: positional I/O, fallocate, memmap2, flock.

use super::{MappedRegion, OpenMode, Vfs, VfsFile};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Clone, Copy)]
pub struct OsVfs;

struct OsFile {
    file: File,
}

struct OsMap(memmap2::Mmap);

impl MappedRegion for OsMap {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn will_need(&self, offset: usize, len: usize) {
        // Advisory: a failure only leaves the pages to be faulted in one by one.
        let _ = self.0.advise_range(memmap2::Advice::WillNeed, offset, len);
    }
}

impl OsFile {
    fn sync_file_range(&self, offset: u64, len: u64, flags: libc::c_uint) -> io::Result<()> {
        let (Ok(off), Ok(l)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Ok(());
        };
        // SAFETY: plain syscall on an owned, open descriptor.
        let rc = unsafe { libc::sync_file_range(self.file.as_raw_fd(), off, l, flags) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl VfsFile for OsFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let (Ok(off), Ok(l)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range too large",
            ));
        };
        // SAFETY: plain syscall on an owned, open descriptor.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, off, l) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
            // File systems without fallocate: extending the length still reserves the
            // logical range; space errors then surface on write instead.
            let end = offset + len;
            if self.len()? < end {
                self.file.set_len(end)?;
            }
            return Ok(());
        }
        Err(err)
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.sync_file_range(offset, len, libc::SYNC_FILE_RANGE_WRITE)
    }
    fn wait_written_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.sync_file_range(offset, len, libc::SYNC_FILE_RANGE_WAIT_BEFORE)
    }
    fn map(&self, len: u64) -> io::Result<Box<dyn MappedRegion>> {
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "map too large"))?;
        // SAFETY: the engine never truncates a mapped data file below a mapped length
        // while a map is alive, and holds an exclusive lock on the environment so that
        // no other process of ours changes it underneath.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(&self.file)? };
        // Reads of the data file are B+tree descents: a page here, a page there.
        // Without this, each page fault that goes to the disk reads around the page
        // (the device's read_ahead_kb, 8 MiB on the VM measured): past RAM, a GET
        // read 19.6 MB from disk at 10M documents in a 2 GiB cgroup, and at 1M this
        // one call cut disk reads per operation 40-340x and made YCSB B 8.8x faster
        // (docs/cost-curve.md). Pages already cached are mapped as before.
        if let Err(e) = map.advise(memmap2::Advice::Random) {
            tracing::debug!(error = %e, "madvise(MADV_RANDOM) on the data file's map failed");
        }
        Ok(Box::new(OsMap(map)))
    }
}

struct FlockGuard {
    _file: File,
}

impl Vfs for OsVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        let mut flags = 0;
        if mode.direct {
            flags |= libc::O_DIRECT;
        }
        if mode.dsync {
            flags |= libc::O_DSYNC;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(mode.write || mode.create)
            .create(mode.create)
            .custom_flags(flags)
            .open(path)?;
        Ok(Box::new(OsFile { file }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            out.push((entry.path(), entry.file_type()?.is_dir()));
        }
        Ok(out)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        // SAFETY: plain syscall on an owned, open descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Box::new(FlockGuard { _file: file }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data file's map is advised random access: the kernel shows it as the
    /// `rr` flag of the mapping in /proc/self/smaps.
    #[test]
    fn the_data_files_map_is_advised_random() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let mode = OpenMode {
            create: false,
            write: false,
            direct: false,
            dsync: false,
        };
        let file = OsVfs.open(&path, mode).unwrap();
        let map = file.map(1 << 20).unwrap();
        let start = map.bytes().as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut ours = false;
        let mut flags = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, _)) = range.split_once('-') {
                    if let Ok(lo) = usize::from_str_radix(lo, 16) {
                        ours = lo == start;
                        continue;
                    }
                }
            }
            if ours {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    flags = Some(f.split_whitespace().map(str::to_string).collect::<Vec<_>>());
                }
            }
        }
        let flags = flags.expect("the mapping is in /proc/self/smaps");
        assert!(flags.iter().any(|f| f == "rr"), "VmFlags {flags:?}");
    }
}
