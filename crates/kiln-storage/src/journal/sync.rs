//! Buffered durability's background journal sync, on a thread of its own.
//!
//! In `Durability::Buffered` a commit is acknowledged once its record is handed to the
//! OS, and the stated loss window on power failure is `sync_interval_ms`. The flusher
//! used to do these syncs between its own tasks, so a long write-back window or a slow
//! data-file fsync (tens of milliseconds to seconds) stretched the window silently.
//! Here nothing else runs on the thread: the interval holds however busy the flusher is.

use crate::error::Latch;
use crate::journal::JournalFiles;
use crate::stats::EngineCounters;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the buffered-mode journal syncer may touch.
pub(crate) struct SyncHandle {
    pub journal_files: Arc<JournalFiles>,
    pub counters: Arc<EngineCounters>,
    pub latch: Arc<Latch>,
}

pub(crate) struct JournalSyncer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl JournalSyncer {
    /// Starts syncing the current journal file every `interval`.
    pub fn start(shared: SyncHandle, interval: Duration) -> std::io::Result<JournalSyncer> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop_seen = stop.clone();
        let handle = std::thread::Builder::new()
            .name("kiln-journal-sync".into())
            .spawn(move || run(&shared, interval, &stop_seen))?;
        Ok(JournalSyncer {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread and waits for it (a sync in progress finishes first).
    pub fn stop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for JournalSyncer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(shared: &SyncHandle, interval: Duration, stop: &(Mutex<bool>, Condvar)) {
    let mut next = Instant::now() + interval;
    loop {
        {
            let mut stopped = stop.0.lock();
            while !*stopped && Instant::now() < next {
                stop.1.wait_until(&mut stopped, next);
            }
            if *stopped {
                return;
            }
        }
        next = Instant::now() + interval;
        // After a failure the environment refuses writes until reopened; recovery
        // then reads the journal back and decides what was committed.
        if shared.latch.poison_reason().is_some() {
            continue;
        }
        let start = Instant::now();
        match shared.journal_files.sync_current() {
            Ok(()) => shared
                .counters
                .buffered_journal_sync_latency
                .record(start.elapsed()),
            Err(e) => {
                tracing::error!(error = %e, "background journal sync failed; the environment now refuses writes until reopened");
                shared.latch.poison(crate::Failure::from_error(
                    "background journal sync failed",
                    &e,
                ));
            }
        }
    }
}
