//! One hub per database fans the change log out to WebSocket subscribers.
//!
//! A commit listener on the database only bumps a watch channel (a cheap call on the
//! writing thread). The hub's task then reads the new part of the log ONCE for all
//! subscribers and, under `dispatch`, offers each change to every live subscription
//! that matches, through each connection's bounded queue. A connection whose queue
//! is full is marked overflowed and closed by its own task: a slow reader never
//! holds server memory beyond its queue and never slows a commit.
//!
//! The seam between a subscription's backlog and its live changes: the connection
//! reads the backlog itself, then, holding `dispatch`, reads what is left up to the
//! last durable write (at least the hub's `position`; the hub may lag behind the
//! commits) and turns live above it (`live_after`). The hub advances `position` and
//! offers changes only while holding `dispatch`, and offers a subscription only what
//! is above its `live_after`, so every change is either in that last read or
//! dispatched live afterwards: none missed, none twice.

use axum::extract::ws::Utf8Bytes;
use kiln_docs::{Change, ChangeFilter, Database};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// Entries read from the log per step of the hub.
const HUB_READ_PAGE: usize = 1024;

/// A change for one subscription of a connection.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub sub: Arc<str>,
    pub change: Arc<Change>,
}

pub struct Subscription {
    pub name: Arc<str>,
    pub filter: ChangeFilter,
    /// Live changes above this sequence go to it (None: still catching up).
    pub live_after: Option<u64>,
}

/// A connection's side of the hub.
pub struct Subscriber {
    pub subs: Mutex<Vec<Subscription>>,
    queue: mpsc::Sender<Outgoing>,
    pub overflowed: AtomicBool,
}

impl Subscriber {
    pub fn new(queue_len: usize) -> (Arc<Subscriber>, mpsc::Receiver<Outgoing>) {
        let (queue, rx) = mpsc::channel(queue_len.max(1));
        (
            Arc::new(Subscriber {
                subs: Mutex::new(Vec::new()),
                queue,
                overflowed: AtomicBool::new(false),
            }),
            rx,
        )
    }

    /// Offers a change to each matching live subscription. False when the queue is
    /// full: the connection is then closed as a slow consumer.
    fn offer(&self, change: &Arc<Change>) -> bool {
        if self.overflowed.load(Ordering::Relaxed) {
            return false;
        }
        let subs = self.subs.lock();
        for s in subs.iter() {
            let wanted = s
                .live_after
                .is_some_and(|after| change.etag.sequence > after)
                && s.filter.matches(change);
            if wanted {
                let out = Outgoing {
                    sub: s.name.clone(),
                    change: change.clone(),
                };
                if self.queue.try_send(out).is_err() {
                    self.overflowed.store(true, Ordering::Relaxed);
                    return false;
                }
            }
        }
        true
    }
}

pub struct HubState {
    /// Every change at or below this has been offered to the live subscriptions.
    pub position: u64,
    subscribers: HashMap<u64, Arc<Subscriber>>,
    next_id: u64,
}

pub struct Hub {
    pub db: Arc<Database>,
    pub dispatch: Mutex<HubState>,
    listener_id: u64,
    stop: watch::Sender<bool>,
    commits: watch::Receiver<u64>,
    /// The heartbeat frame of the current tick, made by the first connection that
    /// needs it and shared by the rest (a frame is reference-counted bytes).
    heartbeat_frame: Mutex<(u64, Utf8Bytes)>,
    /// Slow consumers disconnected since start (for /metrics).
    pub dropped_slow: AtomicU64,
    pub changes_read: AtomicU64,
}

impl Hub {
    /// Starts the hub of `db` on the current runtime.
    pub fn start(db: Arc<Database>) -> Arc<Hub> {
        let (wake, woken) = watch::channel(0u64);
        let commits = woken.clone();
        let mut woken = woken;
        let listener_id = db.add_commit_listener(Arc::new(move |seq| {
            wake.send_replace(seq);
        }));
        let (stop, mut stopped) = watch::channel(false);
        let hub = Arc::new(Hub {
            dispatch: Mutex::new(HubState {
                position: db.last_sequence(),
                subscribers: HashMap::new(),
                next_id: 0,
            }),
            db,
            listener_id,
            stop,
            commits,
            heartbeat_frame: Mutex::new((u64::MAX, Utf8Bytes::from_static(""))),
            dropped_slow: AtomicU64::new(0),
            changes_read: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&hub);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = woken.changed() => if changed.is_err() { return },
                    _ = stopped.changed() => return,
                }
                let Some(hub) = weak.upgrade() else { return };
                if let Err(e) = hub.catch_up().await {
                    tracing::warn!(database = hub.db.name(), error = %e, "changes hub could not read the change log");
                }
            }
        });
        hub
    }

    /// The heartbeat of tick `tick`: `{"type":"heartbeat","last_etag":...}`.
    pub fn heartbeat_frame(&self, tick: u64) -> Utf8Bytes {
        let mut f = self.heartbeat_frame.lock();
        if f.0 != tick {
            let last = self.db.etag_at(self.db.last_sequence());
            let text = format!(r#"{{"type":"heartbeat","last_etag":"{last}"}}"#);
            *f = (tick, Utf8Bytes::from(text));
        }
        f.1.clone()
    }

    /// Changes value after every durable write to the database (for long polls).
    pub fn commits(&self) -> watch::Receiver<u64> {
        self.commits.clone()
    }

    /// Changes to true when the hub stops (its database was deleted).
    pub fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    pub fn subscribe(&self, s: Arc<Subscriber>) -> u64 {
        let mut d = self.dispatch.lock();
        d.next_id += 1;
        let id = d.next_id;
        d.subscribers.insert(id, s);
        id
    }

    pub fn unsubscribe(&self, id: u64) {
        self.dispatch.lock().subscribers.remove(&id);
    }

    /// Reads the log past `position` and offers it to the subscribers.
    async fn catch_up(&self) -> kiln_docs::Result<()> {
        loop {
            let (from, idle) = {
                let d = self.dispatch.lock();
                (d.position, d.subscribers.is_empty())
            };
            if idle {
                // Nobody listens: nothing to read, just keep up.
                let mut d = self.dispatch.lock();
                if d.subscribers.is_empty() {
                    d.position = d.position.max(self.db.last_sequence());
                    return Ok(());
                }
                continue;
            }
            let db = self.db.clone();
            let everything = ChangeFilter::default();
            let page = tokio::task::spawn_blocking(move || {
                db.changes_since(from, HUB_READ_PAGE, &everything, false)
            })
            .await
            .map_err(|e| kiln_docs::DocError::Internal(format!("hub read failed: {e}")))??;
            let changes: Vec<Arc<Change>> = page
                .changes
                .into_iter()
                .map(|e| Arc::new(e.change))
                .collect();
            let full = changes.len() == HUB_READ_PAGE;
            let mut d = self.dispatch.lock();
            // Only this task advances `position`, so it is still `from`.
            debug_assert_eq!(d.position, from);
            let mut slow = Vec::new();
            for c in &changes {
                for (id, s) in d.subscribers.iter() {
                    if !s.offer(c) {
                        slow.push(*id);
                    }
                }
            }
            self.changes_read
                .fetch_add(changes.len() as u64, Ordering::Relaxed);
            for id in slow {
                if d.subscribers.remove(&id).is_some() {
                    self.dropped_slow.fetch_add(1, Ordering::Relaxed);
                }
            }
            d.position = page.last_sequence.max(from);
            if !full {
                return Ok(());
            }
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.db.remove_commit_listener(self.listener_id);
        let _ = self.stop.send(true);
    }
}

/// The hubs of all databases, made when a database gets its first subscriber.
#[derive(Default)]
pub struct Hubs {
    hubs: Mutex<HashMap<String, Arc<Hub>>>,
}

impl Hubs {
    pub fn hub(&self, db: &Arc<Database>) -> Arc<Hub> {
        let mut hubs = self.hubs.lock();
        if let Some(h) = hubs.get(db.name()) {
            if Arc::ptr_eq(&h.db, db) {
                return h.clone();
            }
        }
        // New, or the database was deleted and created again under the same name.
        let h = Hub::start(db.clone());
        hubs.insert(db.name().to_string(), h.clone());
        h
    }

    /// Forgets the hub of a deleted database (its subscribers' connections end when
    /// they next read from it).
    /// Ends every changes connection (the server is stopping).
    pub fn stop_all(&self) {
        for (_, h) in self.hubs.lock().drain() {
            let _ = h.stop.send(true);
        }
    }

    pub fn remove(&self, name: &str) {
        if let Some(h) = self.hubs.lock().remove(name) {
            let _ = h.stop.send(true);
        }
    }
}
