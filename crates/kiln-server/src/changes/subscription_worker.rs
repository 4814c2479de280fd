//! One worker of a data subscription over a WebSocket
//! (`GET /dbs/{db}/subscriptions/{name}/ws`; the subscription itself is
//! `kiln_docs`' `subscriptions/`).
//!
//! The worker first takes the subscription's lease (waiting while another worker
//! holds it, or taking it over), then gets batches: ONE batch in flight at a time,
//! the next one sent only after the worker acknowledged the last, and the position
//! moved (durably) only by that acknowledgment. While the worker processes a batch
//! the next one is already read, so a fast worker waits for nothing but its own
//! acknowledgment's commit. When there is nothing to send the task waits for the
//! database's next durable write (the hub's commit channel: one wake-up per commit,
//! no polling) and sends the shared heartbeat (the changes connections' one timer,
//! `changes/mod.rs`) when idle.
//!
//! Protocol (text frames, JSON):
//! - server: `{"type":"waiting"}` (another worker holds it), `{"type":"subscribed",
//!   "name","collection","position"}`, `{"type":"batch","batch":N,"after","last_etag",
//!   "documents":[...]}`, `{"type":"acknowledged","batch":N,"position"}`,
//!   `{"type":"heartbeat","last_etag"}`, `{"type":"error","code","message"}`;
//!   close codes: 4009 taken over by another worker, 4004 the subscription was
//!   deleted, 4011 the worker went silent (no frame, pong included, for
//!   `worker_timeout`), 4307 this node no longer leads its cluster (connect to
//!   the leader: the worker resumes after its last acknowledged batch), 1008 a
//!   protocol error, 1001 the database was deleted or the server stops.
//! - worker: `{"op":"ack","batch":N}` for the batch in flight.
//!
//! A worker that never answers pings (a peer gone without a FIN) would hold the
//! subscription forever: the server pings it at every heartbeat tick and lets it
//! go after `worker_timeout` of silence.

use super::hub::Hub;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use kiln_docs::SubscriptionError;
use kiln_docs::{
    BatchLimits, Database, DocError, LeaseStrategy, SubscriptionBatch, SubscriptionLease,
    SubscriptionReader,
};
use serde::Deserialize;
use serde_json::json;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub const CLOSE_TAKEN_OVER: u16 = 4009;
pub const CLOSE_DELETED: u16 = 4004;
pub const CLOSE_WORKER_SILENT: u16 = 4011;
/// A cluster's worker is served by the leader only: this node stopped leading,
/// or could not commit the acknowledgment.
pub const CLOSE_NOT_LEADER: u16 = 4307;
const CLOSE_PROTOCOL: u16 = 1008;
const CLOSE_GOING_AWAY: u16 = 1001;

/// How often a waiting worker tries for the lease, and a holder looks at whether
/// its lease was revoked (take-over, delete): a take-over is seen within this.
const LEASE_POLL: Duration = Duration::from_millis(50);

/// How a worker asks for the subscription (`?strategy=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Wait while another worker holds it (the default).
    Wait,
    /// Take it from the worker holding it (which is closed with 4009).
    TakeOver,
    /// Refuse (409 `subscription_busy`) if another worker holds it.
    IfFree,
}

pub struct WorkerConfig {
    pub name: String,
    pub limits: BatchLimits,
    pub heartbeat: watch::Receiver<u64>,
    pub heartbeat_interval: Duration,
    pub send_timeout: Duration,
    pub worker_timeout: Duration,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The node of a cluster: acknowledgments go through its log, and the worker
    /// is let go when the node stops leading.
    pub cluster: Option<Arc<kiln_cluster::ClusterNode>>,
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum WorkerMessage {
    Ack { batch: u64 },
}

/// Why the session ended (what the worker is told, if anything).
enum End {
    /// The worker closed, or its socket failed: nothing to say.
    Gone,
    Close(u16, String),
}

impl From<axum::Error> for End {
    fn from(e: axum::Error) -> Self {
        tracing::debug!(error = %e, "subscription worker connection ended");
        End::Gone
    }
}

struct Session {
    socket: WebSocket,
    hub: Arc<Hub>,
    db: Arc<Database>,
    cfg: WorkerConfig,
    heartbeat: watch::Receiver<u64>,
    stopped: watch::Receiver<bool>,
    commits: watch::Receiver<u64>,
    last_sent: Instant,
    last_heard: Instant,
}

/// Serves a worker; `lease` is the lease taken before the upgrade (`if_free`,
/// `take_over`), or `None` to take it here (waiting).
pub async fn run(
    socket: WebSocket,
    hub: Arc<Hub>,
    lease: Option<SubscriptionLease>,
    cfg: WorkerConfig,
) {
    cfg.metrics.ws_connections_open.inc();
    cfg.metrics.ws_connections_total.inc();
    let metrics = cfg.metrics.clone();
    let mut s = Session {
        socket,
        db: hub.db.clone(),
        heartbeat: cfg.heartbeat.clone(),
        stopped: hub.stopped(),
        commits: hub.commits(),
        hub,
        cfg,
        last_sent: Instant::now(),
        last_heard: Instant::now(),
    };
    let end = s.serve(lease).await;
    if let End::Close(code, reason) = end {
        let frame = CloseFrame {
            code,
            reason: Utf8Bytes::from(reason),
        };
        let sent = tokio::time::timeout(
            s.cfg.send_timeout,
            s.socket.send(Message::Close(Some(frame))),
        )
        .await;
        if matches!(sent, Ok(Ok(()))) {
            // Without the database (a deleted one is not held open meanwhile).
            let Session {
                mut socket,
                hub,
                db,
                ..
            } = s;
            drop((hub, db));
            super::finish_closing(&mut socket).await;
        }
    }
    metrics.ws_connections_open.dec();
}

/// A batch read ahead, with its frame.
struct Prepared {
    batch: SubscriptionBatch,
    frame: Option<Utf8Bytes>,
}

impl Session {
    async fn serve(&mut self, lease: Option<SubscriptionLease>) -> End {
        let lease = match lease {
            Some(l) => l,
            None => match self.wait_for_lease().await {
                Ok(l) => l,
                Err(end) => return end,
            },
        };
        let lease = Arc::new(lease);
        let reader = {
            let db = self.db.clone();
            let name = self.cfg.name.clone();
            match tokio::task::spawn_blocking(move || db.open_subscription(&name)).await {
                Ok(Ok(r)) => Arc::new(r),
                Ok(Err(e)) => return self.fail(&e).await,
                Err(e) => return End::Close(1011, format!("reading the subscription failed: {e}")),
            }
        };
        let position = etag_or_null(&self.db, reader.position());
        let hello = json!({"type": "subscribed", "name": reader.name(),
            "collection": reader.collection(), "position": position});
        if let Err(end) = self.send(Utf8Bytes::from(hello.to_string())).await {
            return end;
        }
        match self.deliver(&lease, &reader).await {
            Ok(()) => End::Gone,
            Err(end) => end,
        }
    }

    async fn wait_for_lease(&mut self) -> Result<SubscriptionLease, End> {
        let mut told = false;
        let mut poll = tokio::time::interval(LEASE_POLL);
        loop {
            let db = self.db.clone();
            let name = self.cfg.name.clone();
            let taken = tokio::task::spawn_blocking(move || {
                db.lease_subscription(&name, LeaseStrategy::IfFree)
            })
            .await
            .map_err(|e| End::Close(1011, format!("taking the subscription failed: {e}")))?;
            match taken {
                Ok(lease) => return Ok(lease),
                Err(DocError::Subscription(SubscriptionError::Busy(_))) => {}
                Err(e) => return Err(self.fail(&e).await),
            }
            self.check_leads()?;
            if !told {
                told = true;
                self.send(Utf8Bytes::from_static(r#"{"type":"waiting"}"#))
                    .await?;
            }
            tokio::select! {
                _ = poll.tick() => {}
                msg = self.socket.recv() => self.on_idle_message(msg).await?,
                tick = self.heartbeat.changed() => self.on_tick(tick.is_ok()).await?,
                _ = self.stopped.changed() => return Err(self.going_away()),
            }
        }
    }

    /// Sends batches until the worker goes, the lease is lost or the server stops.
    async fn deliver(
        &mut self,
        lease: &Arc<SubscriptionLease>,
        reader: &Arc<SubscriptionReader>,
    ) -> Result<(), End> {
        let mut after = reader.position();
        let mut number = 0u64;
        let mut lease_check = tokio::time::interval(LEASE_POLL);
        // Marked seen before every read: a commit after the mark wakes the wait
        // below even if it landed while the read ran.
        self.commits.borrow_and_update();
        let mut next = self.read_ahead(reader, after, number + 1);
        loop {
            let prepared = self.join(next).await?;
            let batch = prepared.batch;
            let Some(frame) = prepared.frame else {
                // Nothing to deliver after `after`. A batch cut short by the scan
                // bound goes on from where it stopped without waiting.
                if batch.up_to > after {
                    after = batch.up_to;
                } else {
                    self.wait_for_commit(lease).await?;
                }
                self.commits.borrow_and_update();
                next = self.read_ahead(reader, after, number + 1);
                continue;
            };
            number += 1;
            self.send(frame).await?;
            // Read the next batch while the worker processes this one.
            self.commits.borrow_and_update();
            next = self.read_ahead(reader, batch.up_to, number + 1);
            self.wait_for_ack(number, &mut lease_check, lease).await?;
            let position = self.acknowledge(lease, batch.up_to).await?;
            let acked = json!({"type": "acknowledged", "batch": number,
                "position": etag_or_null(&self.db, position)});
            self.send(Utf8Bytes::from(acked.to_string())).await?;
            after = batch.up_to;
        }
    }

    fn read_ahead(
        &self,
        reader: &Arc<SubscriptionReader>,
        after: u64,
        number: u64,
    ) -> JoinHandle<kiln_docs::Result<Prepared>> {
        let db = self.db.clone();
        let reader = reader.clone();
        let limits = self.cfg.limits;
        tokio::task::spawn_blocking(move || {
            let batch = db.subscription_batch(&reader, after, limits)?;
            let frame = (!batch.documents.is_empty()).then(|| batch_frame(&db, number, &batch));
            Ok(Prepared { batch, frame })
        })
    }

    async fn join(&mut self, h: JoinHandle<kiln_docs::Result<Prepared>>) -> Result<Prepared, End> {
        match h.await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(self.fail(&e).await),
            Err(e) => Err(End::Close(1011, format!("reading a batch failed: {e}"))),
        }
    }

    async fn wait_for_commit(&mut self, lease: &SubscriptionLease) -> Result<(), End> {
        let mut lease_check = tokio::time::interval(LEASE_POLL);
        loop {
            tokio::select! {
                changed = self.commits.changed() => {
                    return if changed.is_ok() { Ok(()) } else { Err(self.going_away()) };
                }
                msg = self.socket.recv() => self.on_idle_message(msg).await?,
                tick = self.heartbeat.changed() => self.on_tick(tick.is_ok()).await?,
                _ = lease_check.tick() => self.check_lease(lease)?,
                _ = self.stopped.changed() => return Err(self.going_away()),
            }
        }
    }

    async fn wait_for_ack(
        &mut self,
        number: u64,
        lease_check: &mut tokio::time::Interval,
        lease: &SubscriptionLease,
    ) -> Result<(), End> {
        loop {
            tokio::select! {
                msg = self.socket.recv() => {
                    let Some(text) = self.frame_text(msg)? else { continue };
                    match serde_json::from_str::<WorkerMessage>(&text) {
                        Ok(WorkerMessage::Ack { batch }) if batch == number => return Ok(()),
                        Ok(WorkerMessage::Ack { batch }) => {
                            return Err(End::Close(CLOSE_PROTOCOL, format!(
                                "acknowledged batch {batch}, but batch {number} is the one in flight"
                            )));
                        }
                        Err(e) => {
                            return Err(End::Close(CLOSE_PROTOCOL, format!(
                                "not an acknowledgment ({{\"op\":\"ack\",\"batch\":{number}}}): {e}"
                            )));
                        }
                    }
                }
                tick = self.heartbeat.changed() => self.on_tick(tick.is_ok()).await?,
                _ = lease_check.tick() => self.check_lease(lease)?,
                _ = self.stopped.changed() => return Err(self.going_away()),
            }
        }
    }

    async fn acknowledge(
        &mut self,
        lease: &Arc<SubscriptionLease>,
        up_to: u64,
    ) -> Result<u64, End> {
        if let Some(node) = self.cfg.cluster.clone() {
            // Only the current holder proposes: a worker taken over stops here.
            // (Between this check and the commit a take-over may happen: the
            // position then moves over a batch that the old holder processed.)
            if !lease.is_current() {
                return Err(self.revoked());
            }
            let database = self.db.name().to_string();
            let acknowledged = crate::routes::cluster::acknowledge_subscription(
                &node,
                &database,
                &self.cfg.name,
                up_to,
            )
            .await;
            return match acknowledged {
                Ok(position) => Ok(position),
                Err(e) => Err(self.fail_in_cluster(e).await),
            };
        }
        let db = self.db.clone();
        let lease = lease.clone();
        let done =
            tokio::task::spawn_blocking(move || db.acknowledge_subscription(&lease, up_to)).await;
        match done {
            Ok(Ok(position)) => Ok(position),
            Ok(Err(e)) => Err(self.fail(&e).await),
            Err(e) => Err(End::Close(1011, format!("the acknowledgment failed: {e}"))),
        }
    }

    /// A frame's text, or `None` for a control frame; the end for a close.
    fn frame_text(
        &mut self,
        msg: Option<Result<Message, axum::Error>>,
    ) -> Result<Option<Utf8Bytes>, End> {
        self.last_heard = Instant::now();
        match msg {
            None | Some(Ok(Message::Close(_))) => Err(End::Gone),
            Some(Err(e)) => Err(e.into()),
            Some(Ok(Message::Text(t))) => Ok(Some(t)),
            Some(Ok(Message::Binary(_))) => {
                Err(End::Close(CLOSE_PROTOCOL, "send JSON text frames".into()))
            }
            // Pongs (and pings, which the library answers) only show it is alive.
            Some(Ok(_)) => Ok(None),
        }
    }

    /// A frame while no batch is in flight: only control frames are expected.
    async fn on_idle_message(
        &mut self,
        msg: Option<Result<Message, axum::Error>>,
    ) -> Result<(), End> {
        match self.frame_text(msg)? {
            None => Ok(()),
            Some(text) => Err(End::Close(
                CLOSE_PROTOCOL,
                format!(
                    "no batch is in flight, nothing to acknowledge: {}",
                    text.chars().take(100).collect::<String>()
                ),
            )),
        }
    }

    /// A heartbeat tick: a heartbeat frame when idle, a ping always (its pong
    /// shows the worker is alive), and the end of a worker silent for too long.
    async fn on_tick(&mut self, running: bool) -> Result<(), End> {
        if !running {
            return Err(self.going_away());
        }
        if self.last_heard.elapsed() >= self.cfg.worker_timeout {
            return Err(End::Close(
                CLOSE_WORKER_SILENT,
                format!(
                    "no frame from the worker for {} ms: it is let go",
                    self.cfg.worker_timeout.as_millis()
                ),
            ));
        }
        let tick = *self.heartbeat.borrow_and_update();
        if self.last_sent.elapsed() >= self.cfg.heartbeat_interval / 2 {
            let frame = self.hub.heartbeat_frame(tick);
            self.send(frame).await?;
        }
        let ping = self.socket.send(Message::Ping(Default::default()));
        match tokio::time::timeout(self.cfg.send_timeout, ping).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(End::Close(
                CLOSE_WORKER_SILENT,
                "the worker reads nothing".into(),
            )),
        }
    }

    async fn send(&mut self, text: Utf8Bytes) -> Result<(), End> {
        self.last_sent = Instant::now();
        self.cfg.metrics.ws_messages.inc();
        match tokio::time::timeout(self.cfg.send_timeout, self.socket.send(Message::Text(text)))
            .await
        {
            Ok(sent) => Ok(sent?),
            Err(_) => Err(End::Close(
                CLOSE_WORKER_SILENT,
                format!(
                    "the worker took no frame for {} ms",
                    self.cfg.send_timeout.as_millis()
                ),
            )),
        }
    }

    /// Tells the worker what failed, then ends the session with the matching code.
    async fn fail(&mut self, e: &DocError) -> End {
        match e {
            DocError::Subscription(SubscriptionError::LeaseLost(_)) => return self.revoked(),
            DocError::Subscription(SubscriptionError::NotFound(_)) => return deleted(),
            _ => {}
        }
        let code = crate::error::error_code(e);
        let _ = self
            .send(Utf8Bytes::from(error_frame(code, &e.to_string())))
            .await;
        // A close reason has at most 123 bytes; the error frame has the whole text.
        End::Close(1011, code.as_str().to_string())
    }

    /// Ends the session of a worker whose acknowledgment the cluster did not
    /// commit: a refusal of the cluster (no leader here, no quorum) sends it to the
    /// leader with 4307, whatever the outcome (the acknowledgment may still be
    /// committed: the batch comes again, or the next one does); another error is
    /// told in an error frame first.
    async fn fail_in_cluster(&mut self, e: crate::error::ApiError) -> End {
        use crate::error::ErrorCode;
        match e.code {
            ErrorCode::SubscriptionNotFound => return deleted(),
            // No error frame: a client reconnects on the close code alone.
            ErrorCode::NotLeader | ErrorCode::NoQuorum | ErrorCode::ClusterError => {
                tracing::info!(subscription = %self.cfg.name, error = %e.message, "a worker's acknowledgment was not committed: it is sent to the leader");
                return End::Close(CLOSE_NOT_LEADER, e.code.as_str().to_string());
            }
            _ => {}
        }
        let _ = self
            .send(Utf8Bytes::from(error_frame(e.code, &e.message)))
            .await;
        End::Close(1011, e.code.as_str().to_string())
    }

    /// The end of a holder whose lease was revoked: the subscription was deleted,
    /// or another worker took it over.
    fn revoked(&self) -> End {
        match self.db.subscription(&self.cfg.name) {
            Err(DocError::Subscription(SubscriptionError::NotFound(_))) => deleted(),
            _ => End::Close(CLOSE_TAKEN_OVER, "taken over by another worker".into()),
        }
    }

    fn check_lease(&self, lease: &SubscriptionLease) -> Result<(), End> {
        if lease.is_revoked() {
            return Err(self.revoked());
        }
        self.check_leads()
    }

    /// In a cluster, the end of a worker whose node no longer leads: its
    /// acknowledgments could not be committed here any more.
    fn check_leads(&self) -> Result<(), End> {
        match &self.cfg.cluster {
            Some(node) if !node.is_leader() => Err(End::Close(
                CLOSE_NOT_LEADER,
                "this node no longer leads the cluster: connect to the leader".into(),
            )),
            _ => Ok(()),
        }
    }

    fn going_away(&self) -> End {
        End::Close(
            CLOSE_GOING_AWAY,
            "the database was deleted or the server stops".into(),
        )
    }
}

/// `{"type":"error","code","message"}`.
fn error_frame(code: crate::error::ErrorCode, message: &str) -> String {
    json!({"type": "error", "code": code.as_str(), "message": message}).to_string()
}

fn deleted() -> End {
    End::Close(CLOSE_DELETED, "the subscription was deleted".into())
}

fn etag_or_null(db: &Database, sequence: u64) -> serde_json::Value {
    if sequence == 0 {
        serde_json::Value::Null
    } else {
        db.etag_at(sequence).to_string().into()
    }
}

/// `{"type":"batch","batch":N,"after":E|null,"last_etag":E,"documents":[...]}`, the
/// documents copied as they are stored (their JSON text, `@metadata` included).
fn batch_frame(db: &Database, number: u64, batch: &SubscriptionBatch) -> Utf8Bytes {
    let bytes: usize = batch.documents.iter().map(|d| d.json.len() + 1).sum();
    let mut s = String::with_capacity(bytes + 160);
    let _ = write!(
        s,
        r#"{{"type":"batch","batch":{number},"after":{},"last_etag":"{}","documents":["#,
        etag_or_null(db, batch.after),
        db.etag_at(batch.up_to)
    );
    for (i, d) in batch.documents.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        // Stored documents were parsed as JSON text when written: UTF-8.
        s.push_str(&String::from_utf8_lossy(&d.json));
    }
    s.push_str("]}");
    Utf8Bytes::from(s)
}
