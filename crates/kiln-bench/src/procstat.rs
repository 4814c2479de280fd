//! Figures of a process read from /proc (CPU time, resident memory and its peak,
//! bytes sent to storage) and from getrusage (this thread's and this process's CPU
//! time). The benchmarks use them for the server child, a peer server (Redis) and
//! the benchmark process itself.

use std::io;

/// A field of `/proc/PID/status` given in kB (`VmRSS:`, `RssAnon:`, `VmHWM:`), in bytes.
pub fn status_bytes(pid: u32, field: &str) -> io::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {path}: {e}")))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::other(format!("no {field} in {path}")))
}

/// The resident set's high-water mark (VmHWM) of a process, in bytes.
pub fn peak_rss_bytes(pid: u32) -> io::Result<u64> {
    status_bytes(pid, "VmHWM:")
}

/// Resets this process's resident-set high-water mark to its current RSS
/// (`echo 5 > /proc/self/clear_refs`), so that the next workload's peak is its own.
/// Returns false where the kernel does not offer it (then peaks accumulate).
pub fn reset_own_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// CPU time (user + system, all threads) a process has used so far: where the time
/// per request goes on a machine the load generator shares.
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {path}: {e}")))?;
    let unexpected = || io::Error::other(format!("unexpected format of {path}: {stat:?}"));
    // Fields after the parenthesised command name; utime and stime are the 14th
    // and 15th fields of the line, in clock ticks.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(unexpected)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> io::Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or_else(unexpected)
    };
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// The bytes a process has caused to be sent to storage so far (`write_bytes` of
/// `/proc/PID/io`: O_DIRECT writes when issued, buffered ones when dirtied).
pub fn storage_write_bytes(pid: u32) -> io::Result<u64> {
    let path = format!("/proc/{pid}/io");
    let io = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {path}: {e}")))?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other(format!("no write_bytes in {path}")))
}

/// CPU time (user + system) of the calling thread.
pub fn thread_cpu_seconds() -> f64 {
    rusage_cpu_seconds(libc::RUSAGE_THREAD)
}

/// CPU time (user + system) of this whole process.
pub fn process_cpu_seconds() -> f64 {
    rusage_cpu_seconds(libc::RUSAGE_SELF)
}

fn rusage_cpu_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes into the struct we pass; all-zero is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` and a valid pointer.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        // Unknown rather than a plausible-looking zero: the figure prints as NaN.
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
