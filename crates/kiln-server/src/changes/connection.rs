//! One WebSocket connection of the changes feed.
//!
//! The connection's task waits on three things at once: a message from the client
//! (subscribe / unsubscribe), a change the hub queued for it, and the shared
//! heartbeat tick. The tick is ONE interval task for the whole server publishing on a
//! watch channel (the seed's single shared timer): no timer per connection, no
//! allocation per tick. An idle connection answers a tick with a heartbeat frame; a
//! busy one has just sent something and skips it.
//!
//! Protocol (text frames, JSON):
//! - client: `{"op":"subscribe","sub":NAME,"id"?,"prefix"?,"collection"?,"since"?}`,
//!   `{"op":"unsubscribe","sub":NAME}`
//! - server: `{"type":"subscribed",...}`, backlog `{"type":"change",...}` then
//!   `{"type":"caught_up",...}` when `since` was given, live changes, `{"type":
//!   "heartbeat","last_etag"}`, `{"type":"error","code","message"}`; a slow reader is
//!   closed with code 4008 and "slow consumer: resume from etag E".

use super::hub::{Hub, Outgoing, Subscriber, Subscription};
use crate::error::ErrorCode;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use kiln_docs::{Change, ChangeFilter, Database};
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Backlog entries read per step while a subscription catches up.
const BACKLOG_PAGE: usize = 512;
/// Close code for a reader that fell too far behind (private range 4000-4999).
pub const CLOSE_SLOW_CONSUMER: u16 = 4008;
/// How long the close frame of a slow consumer may wait behind the frames its reader
/// has not taken yet. The connection has left the hub and the gauges by then: all it
/// holds is its socket's buffers.
const SLOW_CLOSE_LINGER: Duration = Duration::from_secs(30);

/// Why a connection stopped before its client or the server ended it.
enum ConnError {
    /// The reader fell behind (its queue overflowed, or a send timed out): it gets
    /// the close frame 4008 with the etag to resume from.
    SlowConsumer,
    Socket(axum::Error),
}

impl From<axum::Error> for ConnError {
    fn from(e: axum::Error) -> Self {
        ConnError::Socket(e)
    }
}

pub struct ConnectionConfig {
    pub queue_len: usize,
    pub max_subscriptions: usize,
    pub heartbeat: watch::Receiver<u64>,
    pub heartbeat_interval: Duration,
    pub send_timeout: Duration,
    pub metrics: Arc<crate::metrics::Metrics>,
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum ClientMessage {
    Subscribe {
        sub: String,
        id: Option<String>,
        prefix: Option<String>,
        collection: Option<String>,
        since: Option<String>,
    },
    Unsubscribe {
        sub: String,
    },
}

struct Conn {
    socket: WebSocket,
    hub: Arc<Hub>,
    me: Arc<Subscriber>,
    /// The last etag sequence sent per subscription name (a resume point).
    sent_up_to: Vec<(Arc<str>, u64)>,
    last_sent: Instant,
    cfg: ConnectionConfig,
}

pub async fn run(socket: WebSocket, hub: Arc<Hub>, cfg: ConnectionConfig) {
    let (me, mut queue) = Subscriber::new(cfg.queue_len);
    let id = hub.subscribe(me.clone());
    cfg.metrics.ws_connections_open.inc();
    cfg.metrics.ws_connections_total.inc();
    let mut heartbeat = cfg.heartbeat.clone();
    let mut stopped = hub.stopped();
    let mut c = Conn {
        socket,
        hub: hub.clone(),
        me,
        sent_up_to: Vec::new(),
        last_sent: Instant::now(),
        cfg,
    };
    let result = c.serve(&mut queue, &mut heartbeat, &mut stopped).await;
    hub.unsubscribe(id);
    drop(queue);
    c.cfg.metrics.ws_connections_open.dec();
    match result {
        Ok(()) => {}
        Err(ConnError::SlowConsumer) => c.close_slow().await,
        Err(ConnError::Socket(e)) => tracing::debug!(error = %e, "changes connection ended"),
    }
}

impl Conn {
    async fn serve(
        &mut self,
        queue: &mut mpsc::Receiver<Outgoing>,
        heartbeat: &mut watch::Receiver<u64>,
        stopped: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnError> {
        loop {
            if *stopped.borrow() {
                let frame = CloseFrame {
                    code: 1001,
                    reason: Utf8Bytes::from_static("the database was deleted"),
                };
                return Ok(self.socket.send(Message::Close(Some(frame))).await?);
            }
            if self.me.overflowed.load(Ordering::Relaxed) {
                return Err(ConnError::SlowConsumer);
            }
            tokio::select! {
                msg = self.socket.recv() => match msg {
                    None => return Ok(()),
                    Some(Err(e)) => return Err(e.into()),
                    Some(Ok(Message::Text(t))) => self.on_client_text(&t).await?,
                    Some(Ok(Message::Close(_))) => return Ok(()),
                    // Pings are answered by the library; binary frames mean nothing here.
                    Some(Ok(Message::Binary(_))) => self.send_error(ErrorCode::UnsupportedFrame, "send JSON text frames").await?,
                    Some(Ok(_)) => {}
                },
                out = queue.recv() => match out {
                    Some(out) => self.send_change(&out.sub, &out.change).await?,
                    None => return Ok(()),
                },
                _ = stopped.changed() => continue,
                tick = heartbeat.changed() => {
                    if tick.is_err() {
                        return Ok(()); // the server is stopping
                    }
                    if self.last_sent.elapsed() >= self.cfg.heartbeat_interval / 2 {
                        let frame = self.hub.heartbeat_frame(*heartbeat.borrow_and_update());
                        self.send_frame(frame).await?;
                    }
                }
            }
        }
    }

    async fn send_json(&mut self, v: serde_json::Value) -> Result<(), ConnError> {
        self.send_frame(Utf8Bytes::from(v.to_string())).await
    }

    /// Sends one frame. A reader that takes none for `send_timeout` is a slow
    /// consumer: its queue is full or about to be, and its task must not hang in a
    /// send forever, so the connection is closed (code 4008, with the etag to resume).
    /// A frame cut off by the timeout stays in the socket's write buffer, whole, ahead
    /// of the close frame.
    async fn send_frame(&mut self, text: Utf8Bytes) -> Result<(), ConnError> {
        self.last_sent = Instant::now();
        self.cfg.metrics.ws_messages.inc();
        match tokio::time::timeout(self.cfg.send_timeout, self.socket.send(Message::Text(text)))
            .await
        {
            Ok(sent) => Ok(sent?),
            Err(_) => Err(ConnError::SlowConsumer),
        }
    }

    async fn send_error(&mut self, code: ErrorCode, message: &str) -> Result<(), ConnError> {
        self.send_json(json!({"type": "error", "code": code.as_str(), "message": message}))
            .await
    }

    async fn send_change(&mut self, sub: &Arc<str>, c: &Change) -> Result<(), ConnError> {
        let seq = c.etag.sequence;
        self.send_json(json!({
            "type": "change",
            "sub": &**sub,
            "id": c.id,
            "etag": c.etag.to_string(),
            "change": c.kind.as_str(),
            "collection": c.collection,
        }))
        .await?;
        self.note_sent(sub, seq);
        Ok(())
    }

    /// Records how far a subscription has been sent (its resume point).
    fn note_sent(&mut self, sub: &Arc<str>, sequence: u64) {
        match self.sent_up_to.iter_mut().find(|(n, _)| n == sub) {
            Some((_, at)) => *at = (*at).max(sequence),
            None => self.sent_up_to.push((sub.clone(), sequence)),
        }
    }

    /// Called once the connection has left the hub and the gauges.
    async fn close_slow(&mut self) {
        self.cfg.metrics.ws_slow_consumers_dropped.inc();
        // Resuming every subscription from the lowest etag sent misses nothing.
        let from = self.sent_up_to.iter().map(|s| s.1).min().unwrap_or(0);
        let etag = self.hub.db.etag_at(from);
        let reason = format!("slow consumer: resume from etag {etag}");
        let frame = CloseFrame {
            code: CLOSE_SLOW_CONSUMER,
            reason: Utf8Bytes::from(reason),
        };
        // The reader may take its backlog later and must then find the close reason
        // after it: the frame waits behind what is buffered (bounded by the linger)
        // instead of going down with the socket (a reset tells the reader nothing).
        let sent = tokio::time::timeout(
            SLOW_CLOSE_LINGER,
            self.socket.send(Message::Close(Some(frame))),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::debug!("a slow consumer never took its close frame");
        }
    }

    async fn on_client_text(&mut self, text: &str) -> Result<(), ConnError> {
        let msg: ClientMessage = match serde_json::from_str(text) {
            Ok(m) => m,
            Err(e) => {
                return self
                    .send_error(ErrorCode::InvalidMessage, &e.to_string())
                    .await
            }
        };
        match msg {
            ClientMessage::Unsubscribe { sub } => {
                self.me.subs.lock().retain(|s| *s.name != *sub);
                self.sent_up_to.retain(|s| *s.0 != *sub);
                self.send_json(json!({"type": "unsubscribed", "sub": sub}))
                    .await
            }
            ClientMessage::Subscribe {
                sub,
                id,
                prefix,
                collection,
                since,
            } => {
                let filter = ChangeFilter {
                    id,
                    prefix,
                    collection,
                };
                self.subscribe(sub, filter, since).await
            }
        }
    }

    async fn subscribe(
        &mut self,
        sub: String,
        filter: ChangeFilter,
        since: Option<String>,
    ) -> Result<(), ConnError> {
        let name: Arc<str> = Arc::from(sub.as_str());
        let count = {
            let mut subs = self.me.subs.lock();
            subs.retain(|s| s.name != name); // subscribing again replaces it
            subs.len()
        };
        self.sent_up_to.retain(|s| s.0 != name);
        if count >= self.cfg.max_subscriptions {
            let msg = format!(
                "at most {} subscriptions per connection",
                self.cfg.max_subscriptions
            );
            return self.send_error(ErrorCode::TooManySubscriptions, &msg).await;
        }
        let db = self.hub.db.clone();
        let from = match since.as_deref().map(|e| db.sequence_of(e)).transpose() {
            Ok(f) => f,
            Err(e) => {
                return self
                    .send_error(ErrorCode::InvalidEtag, &e.to_string())
                    .await
            }
        };
        let Some(from) = from else {
            // Live only: from the hub's position on.
            let position = {
                let d = self.hub.dispatch.lock();
                self.me.subs.lock().push(Subscription {
                    name: name.clone(),
                    filter,
                    live_after: Some(d.position),
                });
                d.position
            };
            self.note_sent(&name, position);
            let etag = db.etag_at(position).to_string();
            return self
                .send_json(json!({"type": "subscribed", "sub": sub, "last_etag": etag}))
                .await;
        };
        self.me.subs.lock().push(Subscription {
            name: name.clone(),
            filter: filter.clone(),
            live_after: None,
        });
        self.note_sent(&name, from);
        let etag = db.etag_at(db.last_sequence()).to_string();
        self.send_json(json!({"type": "subscribed", "sub": sub, "last_etag": etag}))
            .await?;
        let up_to = self.backlog(&name, &filter, from).await?;
        let etag = db.etag_at(up_to).to_string();
        self.send_json(json!({"type": "caught_up", "sub": sub, "last_etag": etag}))
            .await
    }

    /// Sends the changes after `from` matching `filter`, then turns the subscription
    /// live at the hub's position (see the module comment of `hub.rs`). Returns the
    /// sequence it is caught up to.
    async fn backlog(
        &mut self,
        name: &Arc<str>,
        filter: &ChangeFilter,
        mut from: u64,
    ) -> Result<u64, ConnError> {
        let db: Arc<Database> = self.hub.db.clone();
        loop {
            let position = self.hub.dispatch.lock().position;
            if position.saturating_sub(from) <= BACKLOG_PAGE as u64 {
                break;
            }
            let page = match read_changes(&db, from, filter).await {
                Ok(p) => p,
                Err(e) => {
                    self.send_error(ErrorCode::ChangesReadFailed, &e.to_string())
                        .await?;
                    return Ok(from);
                }
            };
            let stalled = page.last_sequence <= from;
            for entry in page.changes {
                self.send_change(name, &entry.change).await?;
            }
            from = page.last_sequence;
            if stalled {
                break;
            }
        }
        // The seam: under `dispatch` the hub cannot advance, so what is at or below
        // `up_to` is read here and what is above comes live. `up_to` is the last
        // durable write, not just the hub's position (the hub may lag behind the
        // commits): everything written before the subscription arrives in its backlog,
        // ahead of `caught_up`, and the hub skips what it later dispatches at or below
        // `live_after`.
        let (rest, position) = {
            let d = self.hub.dispatch.lock();
            let up_to = d.position.max(db.last_sequence());
            let rest = db.changes_between(from, up_to, usize::MAX, filter, false);
            let mut subs = self.me.subs.lock();
            if let Some(s) = subs.iter_mut().find(|s| s.name == *name) {
                s.live_after = Some(up_to);
            }
            (rest, up_to)
        };
        match rest {
            Ok(page) => {
                for entry in page.changes {
                    if entry.change.etag.sequence <= position {
                        self.send_change(name, &entry.change).await?;
                    }
                }
            }
            Err(e) => {
                self.send_error(ErrorCode::ChangesReadFailed, &e.to_string())
                    .await?
            }
        }
        Ok(position)
    }
}

async fn read_changes(
    db: &Arc<Database>,
    from: u64,
    filter: &ChangeFilter,
) -> kiln_docs::Result<kiln_docs::ChangesPage> {
    let db = db.clone();
    let filter = filter.clone();
    tokio::task::spawn_blocking(move || db.changes_since(from, BACKLOG_PAGE, &filter, false))
        .await
        .unwrap_or_else(|e| {
            Err(kiln_docs::DocError::Internal(format!(
                "backlog read failed: {e}"
            )))
        })
}
