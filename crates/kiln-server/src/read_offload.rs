//! Document reads that wait on the disk, moved off the connection thread.
//!
//! A document GET is a lookup in the engine's memory map, served on the connection
//! thread: cached, that is a few microseconds, and a hand-off to another thread
//! would cost more than the read. But when the data is larger than memory, a
//! lookup page-faults and the thread sleeps on the disk, and with it every other
//! connection it serves: on 2 cores (one connection thread) a single read is in
//! flight at a time. At 10M documents in 2 GiB Kiln served 0.23x PostgreSQL's
//! GETs, whose backends each fault on their own (docs/cost-curve.md).
//!
//! So the server watches for faults: a read slower than `MAYBE_FAULTED_AFTER` asks
//! the kernel for the thread's major-fault count (`getrusage(RUSAGE_THREAD)`, only
//! then: a cached read pays one clock read), and when it grew, document reads go
//! to tokio's blocking pool for the next `OFFLOAD_WINDOW_MS`, where many faults
//! wait on the disk at once while the connection thread serves the others. Reads
//! on the pool keep watching, so the window lasts as long as reads fault, and
//! reads come back to the connection thread once a window passes without one.

use crate::error::{ApiError, ErrorCode};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A read slower than this may have waited on the disk (a cached GET takes a few
/// microseconds; a read from an SSD, 50 to 200).
const MAYBE_FAULTED_AFTER: Duration = Duration::from_micros(50);
/// After a read that faulted, reads leave the connection thread for this long.
const OFFLOAD_WINDOW_MS: u64 = 1_000;

/// Where document reads run (`kiln serve --read-offload`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadOffload {
    /// On the connection thread, moved to the blocking pool while reads fault.
    #[default]
    Auto,
    /// Always on the blocking pool.
    Always,
    /// Always on the connection thread (as before this module).
    Never,
}

/// Until when (ms on `clock_ms`'s clock) reads go to the blocking pool.
static OFFLOAD_UNTIL_MS: AtomicU64 = AtomicU64::new(0);
/// Reads sent to the blocking pool since the process started.
static READS_OFFLOADED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The thread's major faults when last asked; `u64::MAX` before the first time
    /// (the faults a thread took loading code before serving are not a read's).
    static MAJOR_FAULTS_SEEN: Cell<u64> = const { Cell::new(u64::MAX) };
}

fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl ReadOffload {
    /// Whether the next read goes to the blocking pool.
    pub(crate) fn now(self) -> bool {
        match self {
            ReadOffload::Auto => clock_ms() < OFFLOAD_UNTIL_MS.load(Relaxed),
            ReadOffload::Always => true,
            ReadOffload::Never => false,
        }
    }
}

/// Reads sent to the blocking pool so far (`/metrics`).
pub(crate) fn reads_offloaded() -> u64 {
    READS_OFFLOADED.load(Relaxed)
}

/// Runs the read `read` on the calling thread, watching it for faults.
pub(crate) fn watched<R>(read: impl FnOnce() -> R) -> R {
    let started = Instant::now();
    let out = read();
    if started.elapsed() >= MAYBE_FAULTED_AFTER && thread_faulted() {
        OFFLOAD_UNTIL_MS.fetch_max(clock_ms() + OFFLOAD_WINDOW_MS, Relaxed);
    }
    out
}

/// Runs `read` on tokio's blocking pool, watched.
pub(crate) async fn offloaded<R: Send + 'static>(
    read: impl FnOnce() -> R + Send + 'static,
) -> Result<R, tokio::task::JoinError> {
    READS_OFFLOADED.fetch_add(1, Relaxed);
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(|| watched(read))).await
}

/// The answer to an offloaded read that did not finish: its runtime shut down, or
/// it panicked (a bug: 500).
pub(crate) fn unfinished(e: tokio::task::JoinError) -> ApiError {
    if e.is_panic() {
        ApiError::new(ErrorCode::InternalError, "a document read failed")
    } else {
        ApiError::new(
            ErrorCode::ShuttingDown,
            "the read was cut short: the server is shutting down",
        )
    }
}

/// Whether this thread took a major fault since it last asked.
fn thread_faulted() -> bool {
    let Some(now) = thread_major_faults() else {
        return false;
    };
    let seen = MAJOR_FAULTS_SEEN.with(|seen| seen.replace(now));
    seen != u64::MAX && seen < now
}

fn thread_major_faults() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_THREAD asks for the
    // calling thread only.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded, so it filled `usage`.
    Some(unsafe { usage.assume_init() }.ru_majflt as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn modes_other_than_auto_ignore_the_window() {
        assert!(ReadOffload::Always.now());
        assert!(!ReadOffload::Never.now());
    }

    /// A read through a memory map of pages the cache was told to drop takes major
    /// faults: the window opens. A cached read afterwards does not move it. (Skipped
    /// where the file's pages cannot be dropped, as on tmpfs: no fault is taken.)
    #[test]
    fn a_read_that_faults_opens_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cold");
        let len = 8 << 20;
        let mut file = std::fs::File::create(&path).unwrap();
        let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251 + 1) as u8).collect();
        for _ in 0..len >> 20 {
            file.write_all(&block).unwrap();
        }
        file.sync_all().unwrap();
        drop(file);
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a valid descriptor; advice only.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        // SAFETY: a private read-only map of a file no one changes while it lives.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        thread_faulted(); // the thread's first ask only records the count
        let faults_before = thread_major_faults().unwrap();
        let sum = watched(|| map.iter().step_by(4096).map(|&b| b as u64).sum::<u64>());
        assert!(sum > 0);
        if thread_major_faults().unwrap() == faults_before {
            eprintln!("no major fault taken (tmpfs?): skipped");
            return;
        }
        assert!(
            ReadOffload::Auto.now(),
            "a read that faulted left the window closed"
        );
        let until = OFFLOAD_UNTIL_MS.load(Relaxed);
        watched(|| map.iter().step_by(4096).count());
        assert_eq!(OFFLOAD_UNTIL_MS.load(Relaxed), until);
    }
}
