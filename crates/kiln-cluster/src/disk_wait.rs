//! A full disk is waited out, not fatal. openraft stops a node's Raft for good at
//! the first error of its storage, so a node whose disk filled up (its log append,
//! its vote, applying an entry, building a snapshot) stayed out of the cluster
//! until it was restarted, even once space came back. Instead, the step that met
//! the full disk is tried again every `RETRY_INTERVAL` until it succeeds (or fails
//! otherwise, or the node stops). Meanwhile the node takes no part: its Raft core
//! waits in the step, and the Raft route refuses other nodes' messages at once
//! (`is_waiting`) rather than let appends pile up behind it. A follower so stuck
//! leaves the other two a majority; a leader so stuck stops its heartbeats, and
//! the others elect a new one. A failed step changed nothing (a commit that fails
//! leaves the environment as it was), so trying it again is safe.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a step waiting for space is tried again.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Default)]
struct State {
    /// Steps waiting for space now.
    waiting: AtomicUsize,
    stopping: AtomicBool,
}

/// Shared by a node's log store, state machine and Raft route.
#[derive(Clone, Default)]
pub struct DiskWait(Arc<State>);

thread_local! {
    /// Set by `sm_err`-style conversions on this thread when the error they turn
    /// into openraft's (which keeps only its text) is one to wait out: why.
    static WAITABLE_SEEN: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Why a step waits for a full disk (the words an operator greps for).
const DISK_FULL: &str = "the disk is full: waiting for space";

/// Notes, on this thread, whether `e` (or an error it wraps) is a full disk:
/// called where an error becomes openraft's `StorageError`.
pub(crate) fn note(e: &(dyn std::error::Error + 'static)) {
    if is_disk_full(e) {
        WAITABLE_SEEN.with(|seen| seen.set(Some(DISK_FULL)));
    }
}

/// Notes, on this thread, that the step failed on a file an operator can mend
/// (the API key file unreadable or not writable): the step waits as for a full
/// disk, with `why` in the log, instead of stopping the node's Raft.
pub(crate) fn note_mendable(why: &'static str) {
    WAITABLE_SEEN.with(|seen| seen.set(Some(why)));
}

/// Whether `e`, or an error in its chain of sources, is a full disk that left
/// nothing broken: a storage environment that latched (a journal write that
/// failed half-way) stays refused until it is opened again, so waiting for
/// space would wait forever.
pub fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    use kiln_storage::ErrorKind;
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(kiln_docs::DocError::Storage(s)) = e.downcast_ref::<kiln_docs::DocError>() {
            return matches!(s.kind(), ErrorKind::DiskFull);
        }
        if let Some(s) = e.downcast_ref::<kiln_storage::Error>() {
            return matches!(s.kind(), ErrorKind::DiskFull);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if kiln_storage::io_is_disk_full(io) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

impl DiskWait {
    /// Whether a step of this node waits for disk space now.
    pub fn is_waiting(&self) -> bool {
        self.0.waiting.load(Ordering::SeqCst) > 0
    }

    /// The node stops: a waiting step gives up with its error.
    pub fn stop(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.0.stopping.load(Ordering::SeqCst)
    }

    /// Runs `step` (blocking) until it succeeds or fails with anything but a full
    /// disk (as noted on this thread by [`note`] while it ran).
    pub(crate) fn blocking<T, E: std::fmt::Display>(
        &self,
        what: &str,
        mut step: impl FnMut() -> Result<T, E>,
    ) -> Result<T, E> {
        let mut waiting: Option<Waiting> = None;
        loop {
            if let Some(done) = self.try_once(what, &mut waiting, &mut step) {
                return done;
            }
            std::thread::sleep(RETRY_INTERVAL);
        }
    }

    /// [`Self::blocking`] for a step run on the async side (its error noted by
    /// [`note`] on this thread, as the step runs without an await), waiting
    /// without holding a thread.
    pub(crate) async fn retry<T, E: std::fmt::Display>(
        &self,
        what: &str,
        mut step: impl FnMut() -> Result<T, E>,
    ) -> Result<T, E> {
        let mut waiting: Option<Waiting> = None;
        loop {
            if let Some(done) = self.try_once(what, &mut waiting, &mut step) {
                return done;
            }
            tokio::time::sleep(RETRY_INTERVAL).await;
        }
    }

    /// One try of `step`: its result when that is final (a success, another
    /// error, or any error once the node stops), `None` when the disk was full
    /// (the wait then begins, once).
    fn try_once<T, E: std::fmt::Display>(
        &self,
        what: &str,
        waiting: &mut Option<Waiting>,
        step: &mut impl FnMut() -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        WAITABLE_SEEN.with(|seen| seen.set(None));
        let result = step();
        let why = WAITABLE_SEEN.with(Cell::get).filter(|_| result.is_err());
        let Some(why) = why.filter(|_| !self.stopping()) else {
            return Some(result);
        };
        if waiting.is_none() {
            let error = result.err().map(|e| e.to_string()).unwrap_or_default();
            *waiting = Some(Waiting::begin(self, what, why, &error));
        }
        None
    }
}

/// One step's wait: counted while it lasts, said when it begins and ends.
struct Waiting {
    wait: DiskWait,
    what: String,
    since: Instant,
}

impl Waiting {
    fn begin(wait: &DiskWait, what: &str, why: &str, error: &str) -> Waiting {
        wait.0.waiting.fetch_add(1, Ordering::SeqCst);
        tracing::warn!(
            step = what,
            error,
            "{why} (trying again every {} ms); this node takes no part in the cluster meanwhile",
            RETRY_INTERVAL.as_millis()
        );
        Waiting {
            wait: wait.clone(),
            what: what.to_string(),
            since: Instant::now(),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.wait.0.waiting.fetch_sub(1, Ordering::SeqCst);
        tracing::info!(
            step = %self.what,
            waited_ms = self.since.elapsed().as_millis() as u64,
            "the step that waited succeeds: the node goes on"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> std::io::Error {
        std::io::Error::from_raw_os_error(28) // ENOSPC
    }

    #[test]
    fn a_full_disk_is_tried_again_and_other_errors_are_not() {
        let wait = DiskWait::default();
        let mut tries = 0;
        let got: Result<u32, std::io::Error> = wait.blocking("test", || {
            tries += 1;
            if tries < 3 {
                let e = full();
                note(&e);
                return Err(e);
            }
            Ok(7)
        });
        assert_eq!((got.unwrap(), tries), (7, 3));
        assert!(!wait.is_waiting());
        let mut tries = 0;
        let other: Result<u32, std::io::Error> = wait.blocking("test", || {
            tries += 1;
            let e = std::io::Error::other("not a full disk");
            note(&e);
            Err(e)
        });
        assert!(other.is_err() && tries == 1);
        // A node that stops gives up.
        wait.stop();
        let stopped: Result<u32, std::io::Error> = wait.blocking("test", || {
            let e = full();
            note(&e);
            Err(e)
        });
        assert!(stopped.is_err());
    }

    #[test]
    fn a_full_disk_is_found_in_a_chain_of_errors() {
        let storage = kiln_storage::Error::Io {
            path: "x".into(),
            offset: None,
            op: "write",
            source: full(),
        };
        assert!(is_disk_full(&storage));
        assert!(!is_disk_full(&std::io::Error::other("no")));
    }
}
