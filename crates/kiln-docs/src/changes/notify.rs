//! Tells waiting readers that the change log grew.
//!
//! A write calls `published` after its commit is durable (and so visible to new read
//! snapshots: the engine publishes a snapshot only after its journal write). Readers
//! either block on `wait_after` (an embedder's long poll) or register a listener,
//! which the server uses to wake ONE task per database that reads the log once for
//! all its subscribers. Listeners run on the writing thread: they must be quick (a
//! channel send), never block.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type CommitListener = Arc<dyn Fn(u64) + Send + Sync>;

#[derive(Default)]
pub(crate) struct CommitNotifier {
    last_sequence: Mutex<u64>,
    grew: Condvar,
    listeners: Mutex<Vec<(u64, CommitListener)>>,
    next_listener_id: Mutex<u64>,
}

impl CommitNotifier {
    pub fn new(last_sequence: u64) -> CommitNotifier {
        CommitNotifier {
            last_sequence: Mutex::new(last_sequence),
            ..CommitNotifier::default()
        }
    }

    pub fn last_sequence(&self) -> u64 {
        *self.last_sequence.lock()
    }

    /// Records that writes up to `sequence` are durable. Calls from concurrent
    /// commits may arrive out of order; the highest wins.
    pub fn published(&self, sequence: u64) {
        {
            let mut last = self.last_sequence.lock();
            if sequence <= *last {
                return;
            }
            *last = sequence;
        }
        self.grew.notify_all();
        let listeners: Vec<CommitListener> = self
            .listeners
            .lock()
            .iter()
            .map(|(_, l)| l.clone())
            .collect();
        for l in listeners {
            l(sequence);
        }
    }

    /// Blocks until the log holds a sequence above `after`, or `timeout` passes.
    /// Returns the last sequence seen.
    pub fn wait_after(&self, after: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut last = self.last_sequence.lock();
        while *last <= after {
            if self.grew.wait_until(&mut last, deadline).timed_out() {
                break;
            }
        }
        *last
    }

    pub fn add_listener(&self, listener: CommitListener) -> u64 {
        let id = {
            let mut next = self.next_listener_id.lock();
            *next += 1;
            *next
        };
        self.listeners.lock().push((id, listener));
        id
    }

    pub fn remove_listener(&self, id: u64) {
        self.listeners.lock().retain(|(l, _)| *l != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn waiters_and_listeners_see_the_highest_sequence() {
        let n = Arc::new(CommitNotifier::new(5));
        let seen = Arc::new(AtomicU64::new(0));
        let s = seen.clone();
        let id = n.add_listener(Arc::new(move |seq| {
            s.store(seq, Ordering::SeqCst);
        }));
        assert_eq!(n.wait_after(5, Duration::from_millis(10)), 5);
        let n2 = n.clone();
        let t = std::thread::spawn(move || n2.wait_after(5, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        n.published(9);
        n.published(7); // out of order: ignored
        assert_eq!(t.join().unwrap(), 9);
        assert_eq!(seen.load(Ordering::SeqCst), 9);
        n.remove_listener(id);
        n.published(10);
        assert_eq!(seen.load(Ordering::SeqCst), 9);
        assert_eq!(n.last_sequence(), 10);
    }
}
