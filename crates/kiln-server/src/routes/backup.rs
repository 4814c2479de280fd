//! Backup and restore of live databases (the format of `kiln_storage::backup`, with
//! the kiln-docs manifest in its header):
//!
//! - `GET /dbs/{db}/backup[?chain=true]`: a full backup; with `chain=true` it starts
//!   a backup chain (replacing any) that increments can follow.
//! - `GET /dbs/{db}/backup?since_chain=C&since_backup=B&since_etag=E`: an incremental
//!   backup: every write after backup B (of chain C, ending at etag E).
//! - `GET /dbs/{db}/backup/chain`: the chain and its history's size;
//!   `DELETE /dbs/{db}/backup/chain` stops it (and removes the history).
//! - `POST /dbs/{db}/restore[?force=true&until=P]`: the body is a full backup and
//!   its increments back to back; creates database `db` (refusing an existing one
//!   unless `force`), up to point `P` (`etag:E`, `txn:T`, `time:T`), and answers
//!   with where it got to, once every checksum passed and the database is open.
//!
//! The backup reads one snapshot on a blocking thread; writes go on meanwhile and
//! are not in it. Its bytes travel to the response through a bounded channel, so a
//! slow client slows the backup (and keeps its snapshot open), and a client that
//! disconnects stops it: the next send fails and the backup ends with an error.
//! A failure after the answer started aborts the response (the client sees a
//! truncated body, which `verify` refuses).

use crate::error::{ApiError, ErrorCode};
use crate::http_util::{blocking, json_value, ApiPath};
use crate::query_params::{NoParams, Params};
use crate::state::SharedState;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_docs::{BackupChainError, DatabaseError};
use std::io;
use tokio::sync::mpsc;

/// Bytes gathered before a send.
const PIECE: usize = 256 << 10;
/// Pieces buffered toward the client.
const QUEUE: usize = 8;

struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(PIECE)));
        self.tx
            .blocking_send(Ok(piece))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl io::Write for ChannelWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= PIECE {
            self.send()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

#[derive(serde::Deserialize, Default)]
pub struct BackupQuery {
    /// Full backup: start a backup chain at it.
    chain: Option<bool>,
    /// Incremental backup: the base backup's chain, id and end etag.
    since_chain: Option<String>,
    since_backup: Option<String>,
    since_etag: Option<String>,
}

pub async fn backup(
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    Params(q): Params<BackupQuery>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let since = incremental_base(&db, &q);
    if let Some(m) = &since {
        // Refused before the answer starts (a clear status instead of a cut body).
        check_increment_possible(&database, &db, m)?;
    }
    let job = BackupJob {
        database,
        name: db.clone(),
        since,
        chain: q.chain.unwrap_or(false),
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(QUEUE);
    start_backup_thread(job, tx)?;
    Ok(backup_response(&db, rx))
}

/// An incremental backup's base, as the query names it (`None`: a full backup).
fn incremental_base(db: &str, q: &BackupQuery) -> Option<kiln_docs::BackupManifest> {
    q.since_chain
        .clone()
        .map(|chain| kiln_docs::BackupManifest {
            database: db.to_string(),
            kind: kiln_docs::BackupKind::Full,
            etag: q.since_etag.clone().filter(|e| !e.is_empty()),
            txn_id: 0,
            documents: 0,
            kiln_version: String::new(),
            created_at: String::new(),
            incarnation: None,
            backup_id: q.since_backup.clone(),
            chain_id: Some(chain),
            base_backup_id: None,
            base_etag: None,
            last_write_ms: None,
        })
}

/// An increment follows its base only when the base's etag is known and the base
/// belongs to the database's current backup chain.
fn check_increment_possible(
    database: &kiln_docs::Database,
    db: &str,
    base: &kiln_docs::BackupManifest,
) -> Result<(), ApiError> {
    if let Some(e) = &base.etag {
        database.sequence_of(e)?;
    }
    match database.backup_chain()? {
        Some(c) if Some(&c.chain_id) == base.chain_id.as_ref() => Ok(()),
        Some(c) => Err(
            kiln_docs::DocError::BackupChain(BackupChainError::IncrementNotPossible(format!(
                "the base backup belongs to chain {}, the database's chain is now {}: \
             take a full backup",
                base.chain_id.as_deref().unwrap_or(""),
                c.chain_id
            )))
            .into(),
        ),
        None => Err(
            kiln_docs::DocError::BackupChain(BackupChainError::IncrementNotPossible(format!(
                "database {db:?} has no backup chain (stopped, or never started): take a \
             full backup"
            )))
            .into(),
        ),
    }
}

/// What the backup thread needs.
struct BackupJob {
    database: std::sync::Arc<kiln_docs::Database>,
    /// The database's name, for the log.
    name: String,
    /// An incremental backup's base; `None`: a full backup.
    since: Option<kiln_docs::BackupManifest>,
    /// A full backup starts a backup chain.
    chain: bool,
}

/// Starts the thread that writes the backup into `tx`.
fn start_backup_thread(
    job: BackupJob,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
) -> Result<(), ApiError> {
    // A thread of its own at the lowest CPU priority: on a busy server the backup
    // (reading every tree, compressing) takes what the writers leave, instead of a
    // core's worth from them (W14: W8 at 0.38-0.54x of its rate during a backup at
    // normal priority).
    let spawned = std::thread::Builder::new()
        .name("kiln-backup".into())
        .spawn(move || job.write_to(tx));
    if let Err(e) = spawned {
        return Err(ApiError::new(
            ErrorCode::IoError,
            format!("could not start the backup thread: {e}"),
        ));
    }
    Ok(())
}

impl BackupJob {
    /// Runs on the backup thread. A failure is logged and sent as the body's error,
    /// which aborts the response.
    fn write_to(self, tx: mpsc::Sender<Result<Bytes, io::Error>>) {
        lower_own_priority();
        let mut w = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(PIECE),
        };
        let started = std::time::Instant::now();
        let opts = kiln_storage::BackupOptions::default();
        let result = match &self.since {
            Some(m) => self.database.backup_incremental_to(&mut w, m, opts, |_| {}),
            None => self
                .database
                .backup_full_to(&mut w, opts, self.chain, |_| {}),
        };
        match result {
            Ok(r) => tracing::info!(
                database = %self.name,
                kind = ?r.manifest.kind,
                etag = ?r.manifest.etag,
                bytes = r.file_bytes,
                ms = started.elapsed().as_millis() as u64,
                "backup streamed"
            ),
            Err(e) => {
                tracing::warn!(database = %self.name, error = %e, "backup stopped");
                let _ = tx.blocking_send(Err(io::Error::other(e.to_string())));
            }
        }
    }
}

/// The answer: the backup's bytes as they arrive from the backup thread.
fn backup_response(db: &str, mut rx: mpsc::Receiver<Result<Bytes, io::Error>>) -> Response {
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut resp = (StatusCode::OK, Body::from_stream(stream)).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.kiln.backup"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{db}.kbak\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    resp
}

/// `GET /dbs/{db}/backup/chain`
pub async fn chain_stats(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let stats = blocking(move || database.backup_chain()).await?;
    Ok(json_value(
        StatusCode::OK,
        serde_json::json!({ "active": stats.is_some(), "chain": stats }),
    ))
}

/// `DELETE /dbs/{db}/backup/chain`: stops the chain; increments are refused after.
pub async fn chain_stop(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let stopped = blocking(move || database.stop_backup_chain()).await?;
    Ok(json_value(
        StatusCode::OK,
        serde_json::json!({ "stopped": stopped }),
    ))
}

#[derive(serde::Deserialize, Default)]
pub struct RestoreQuery {
    force: Option<bool>,
    until: Option<String>,
}

/// Longest wait for the next piece of a restore's body.
const BODY_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// The request body as a blocking reader (the restore runs on a blocking thread).
struct BodyReader {
    rx: mpsc::Receiver<Result<Bytes, io::Error>>,
    cur: Bytes,
}

impl io::Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// `POST /dbs/{db}/restore?force=true&until=P`: see the module documentation.
pub async fn restore(
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    Params(q): Params<RestoreQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    kiln_docs::validate_database_name(&db)?;
    let point = match q.until.as_deref() {
        Some(u) => kiln_docs::RestorePoint::parse(u)?,
        None => kiln_docs::RestorePoint::Latest,
    };
    let force = q.force.unwrap_or(false);
    if state.cluster.is_some() {
        let started = std::time::Instant::now();
        let mut v =
            crate::routes::cluster::restore_database(&state, &db, q.until.clone(), force, body)
                .await?;
        v["seconds"] = started.elapsed().as_secs_f64().into();
        return Ok(json_value(StatusCode::CREATED, v));
    }
    if !force && state.store.database(&db).is_ok() {
        return Err(kiln_docs::DocError::Database(DatabaseError::Exists(db)).into());
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(QUEUE);
    tokio::spawn(async move {
        let mut s = body.into_data_stream();
        loop {
            let next = tokio::time::timeout(BODY_IDLE, futures_util::StreamExt::next(&mut s));
            let piece = match next.await {
                Ok(None) => return,
                Ok(Some(Ok(b))) => Ok(b),
                Ok(Some(Err(e))) => Err(io::Error::other(format!("reading the body: {e}"))),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the body stopped arriving",
                )),
            };
            let failed = piece.is_err();
            if tx.send(piece).await.is_err() || failed {
                return;
            }
        }
    });
    let store = state.store.clone();
    let name = db.clone();
    let started = std::time::Instant::now();
    let report = blocking(move || {
        let reader = BodyReader {
            rx,
            cur: Bytes::new(),
        };
        store.restore_database(
            kiln_docs::RestoreSource::Stream(Box::new(reader)),
            &name,
            force,
            point,
            |_| {},
        )
    })
    .await?;
    let mut v = serde_json::to_value(&report).unwrap_or_default();
    v["seconds"] = started.elapsed().as_secs_f64().into();
    Ok(json_value(StatusCode::CREATED, v))
}

/// Makes the calling thread the last to get a CPU (nice 19). On Linux the nice value
/// belongs to the thread, so the rest of the server keeps its priority. Best effort:
/// a refusal leaves the thread at normal priority.
fn lower_own_priority() {
    // SAFETY: gettid and setpriority have no memory-safety preconditions.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}
