//! `POST /dbs/{db}/bulk`: streaming bulk insert of NDJSON.
//!
//! The body is read, parsed and committed as it arrives; the answer streams back
//! while the upload goes on: one `{"acked": n, "last_etag": e}` line per committed
//! batch, then `{"done": true, ...}` or `{"error": code, "line": k, ...}`.
//!
//! Batches size themselves like a group commit: while one batch commits (through the
//! store's write queue, all or nothing), the lines that arrive meanwhile are parsed
//! into the next, which goes out as soon as the previous one is durable. A fast
//! uploader thus gets large batches (up to `MAX_BATCH_DOCS` / `MAX_BATCH_BYTES`),
//! a trickle gets each document committed at once. Memory stays bounded: at most
//! one batch committing, one filling, and one partial line.
//!
//! A bad line k: the lines before it are committed, then the error names line k;
//! nothing from k on is written. The rest of the body is then read and thrown away
//! (64 MiB or 2 s at most), so a client that sends its whole body before reading the
//! answer still gets it. A client that disconnects loses at most the batch
//! that was filling (never half a batch: each batch is one transaction).

use crate::error::{ApiError, ErrorCode};
use crate::http_util::ApiPath;
use crate::query_params::NoParams;
use crate::state::SharedState;
use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_docs::DocumentError;
use kiln_docs::{BatchOutcome, Condition, Database, DocError, DocId, Etag, WriteOp};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

const MAX_BATCH_DOCS: usize = 8192;
const MAX_BATCH_BYTES: usize = 16 << 20;
/// A batch's bytes at most in a cluster (one log entry).
const MAX_CLUSTER_BATCH_BYTES: usize = 1 << 20;
/// Answer lines buffered toward a client that reads them slowly.
const ACK_QUEUE: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    document: &'a serde_json::value::RawValue,
}

/// A line that stops the stream.
struct LineError {
    line: u64,
    code: ErrorCode,
    message: String,
}

pub async fn bulk_insert(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    key: crate::http_util::RequestKey,
    body: Body,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(ACK_QUEUE);
    let run = BulkRun {
        state: state.clone(),
        max_batch_docs: MAX_BATCH_DOCS.min(database.max_batch_ops()).max(1),
        db: database,
        acked: 0,
        last_etag: None,
        out: tx,
        max_line_bytes: state.limits.max_body_bytes,
        idle_timeout: Duration::from_millis(state.limits.request_read_timeout_ms),
        key_id: key.id(),
    };
    tokio::spawn(run.run(body));
    let stream = tokio_stream_from(rx);
    let mut resp = (StatusCode::OK, Body::from_stream(stream)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    // The head goes out before the body is read, and a bad line stops the reading
    // early (past a bounded drain, the rest of the body is never consumed), so the
    // connection cannot carry another request. Said up front so a pooling client does not reuse it.
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Ok(resp)
}

/// After a bad line, how much more of the body is read and thrown away, and for how
/// long: a client still uploading when the error line goes out (a browser's fetch,
/// which reads the answer only once its body is sent) would otherwise write into a
/// closed connection and lose the answer naming the line. Past either bound the
/// connection closes, as before.
const DRAIN_MAX_BYTES: usize = 64 << 20;
const DRAIN_MAX_MS: u64 = 2_000;

async fn drain_rest(body: &mut BodyDataStream) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(DRAIN_MAX_MS);
    let mut drained = 0usize;
    while drained < DRAIN_MAX_BYTES {
        match tokio::time::timeout_at(deadline, futures_util::StreamExt::next(body)).await {
            Ok(Some(Ok(chunk))) => drained += chunk.len(),
            // The end, a broken body, or time is up.
            _ => return,
        }
    }
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A batch on its way: the write queue's (or, in a cluster, the log's) answer.
type Commit = oneshot::Receiver<Result<Vec<BatchOutcome>, ApiError>>;

struct BulkRun {
    state: SharedState,
    db: Arc<Database>,
    acked: u64,
    last_etag: Option<Etag>,
    out: mpsc::Sender<Result<Bytes, std::io::Error>>,
    max_line_bytes: usize,
    idle_timeout: Duration,
    /// Documents per batch at most: `MAX_BATCH_DOCS` or the database's batch limit.
    max_batch_docs: usize,
    /// The API key of the request, kept with the revisions its writes make.
    key_id: Option<String>,
}

/// The batch being filled.
#[derive(Default)]
struct Filling {
    ops: Vec<WriteOp>,
    /// In a cluster: the same writes as the log carries them (the documents' text).
    logged: Vec<kiln_cluster::LoggedOp>,
    bytes: usize,
}

/// Where the reading of the body stands, between its steps.
#[derive(Default)]
struct Reading {
    /// The start of a line whose newline has not arrived yet.
    partial: Vec<u8>,
    /// The number of the last line taken (lines count from 1).
    line_no: u64,
    filling: Filling,
    committing: Option<Commit>,
}

/// What a wait on the committing batch and the body brought.
enum Arrived {
    /// The committing batch finished and was acknowledged.
    Committed,
    Chunk(Bytes),
    BodyEnd,
    /// The body stopped arriving (too long idle) or could not be read.
    BodyFailed(LineError),
}

impl BulkRun {
    async fn run(mut self, body: Body) {
        let metrics = self.state.metrics.clone();
        metrics.bulk_running.inc();
        let mut body = body.into_data_stream();
        let end = self.stream(&mut body).await;
        let drain = matches!(&end, Err(e) if e.code != ErrorCode::BodyReadFailed && e.code != ErrorCode::RequestTimeout);
        metrics.bulk_running.dec();
        metrics.bulk_documents.inc_by(self.acked);
        let last = self.last_etag.map(|e| e.to_string());
        let line = match end {
            Ok(()) => json!({"done": true, "acked": self.acked, "last_etag": last}),
            Err(e) => json!({
                "error": e.code.as_str(),
                "message": e.message,
                "line": e.line,
                "acked": self.acked,
                "last_etag": last,
                "note": "every document before this line is committed; nothing from it on was written",
            }),
        };
        self.send_line(line).await;
        if drain {
            drain_rest(&mut body).await;
        }
    }

    async fn send_line(&self, v: serde_json::Value) {
        let mut text = v.to_string();
        text.push('\n');
        // The client may be gone; what was committed stays committed.
        let _ = self.out.send(Ok(Bytes::from(text))).await;
    }

    /// Reads the body line by line, committing batches; returns at the end of the
    /// body or at the first bad line (after committing the lines before it).
    async fn stream(&mut self, body: &mut BodyDataStream) -> Result<(), LineError> {
        let mut reading = Reading::default();
        loop {
            // Submit the filled batch as soon as nothing is committing.
            if reading.committing.is_none() && !reading.filling.ops.is_empty() {
                let filled = std::mem::take(&mut reading.filling);
                reading.committing = Some(self.submit(filled).await?);
            }
            let chunk = match self.wait_for_commit_or_chunk(body, &mut reading).await? {
                Arrived::Committed => continue,
                Arrived::Chunk(chunk) => chunk,
                Arrived::BodyEnd => break,
                Arrived::BodyFailed(e) => {
                    return self
                        .stop(reading.committing, e.line, e.code, e.message)
                        .await
                }
            };
            if let Some(bad) = self.take_lines(&chunk, &mut reading).await? {
                return self
                    .fail_after(reading.committing, reading.filling, bad)
                    .await;
            }
        }
        self.take_last_line_and_commit(reading).await
    }

    /// Waits for the committing batch (acknowledged as soon as it is done) or, while
    /// the filling batch has room, for the body's next chunk.
    async fn wait_for_commit_or_chunk(
        &mut self,
        body: &mut BodyDataStream,
        reading: &mut Reading,
    ) -> Result<Arrived, LineError> {
        let full = self.is_full(&reading.filling);
        let committing = &mut reading.committing;
        let chunk = tokio::select! {
            // Biased: a finished commit is acknowledged before more is read.
            biased;
            done = async { committing.as_mut().expect("guarded").await }, if committing.is_some() => {
                *committing = None;
                self.finish(done, reading.line_no).await?;
                return Ok(Arrived::Committed);
            }
            chunk = tokio::time::timeout(self.idle_timeout, futures_util::StreamExt::next(body)), if !full => chunk,
        };
        Ok(match chunk {
            Err(_) => Arrived::BodyFailed(LineError {
                line: reading.line_no + 1,
                code: ErrorCode::RequestTimeout,
                message: format!("no data for {} ms", self.idle_timeout.as_millis()),
            }),
            Ok(None) => Arrived::BodyEnd,
            // The client went away (or sent garbage framing): the batch that was
            // filling is dropped whole; the committing one finishes.
            Ok(Some(Err(e))) => Arrived::BodyFailed(LineError {
                line: reading.line_no + 1,
                code: ErrorCode::BodyReadFailed,
                message: format!("reading the body failed: {e}"),
            }),
            Ok(Some(Ok(chunk))) => Arrived::Chunk(chunk),
        })
    }

    /// Parses the chunk's complete lines into the filling batch, submitting it each
    /// time it is full, and keeps the chunk's unfinished last line. `Some` is the
    /// first bad line (nothing from it on is parsed); `Err` ends the stream.
    async fn take_lines(
        &mut self,
        chunk: &[u8],
        reading: &mut Reading,
    ) -> Result<Option<LineError>, LineError> {
        let mut rest: &[u8] = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(nl);
            rest = &tail[1..];
            reading.line_no += 1;
            let line: std::borrow::Cow<[u8]> = if reading.partial.is_empty() {
                head.into()
            } else {
                reading.partial.extend_from_slice(head);
                std::mem::take(&mut reading.partial).into()
            };
            if let Err(e) = self.parse_into(&line, reading.line_no, &mut reading.filling) {
                return Ok(Some(e));
            }
            // A chunk may hold more lines than a batch: a full batch goes out
            // (after the one committing) before the chunk's next line is parsed.
            if self.is_full(&reading.filling) {
                if let Some(c) = reading.committing.take() {
                    self.finish(c.await, reading.line_no).await?;
                }
                let filled = std::mem::take(&mut reading.filling);
                reading.committing = Some(self.submit(filled).await?);
            }
        }
        reading.partial.extend_from_slice(rest);
        if reading.partial.len() > self.max_line_bytes {
            return Ok(Some(LineError {
                line: reading.line_no + 1,
                code: ErrorCode::DocumentTooLarge,
                message: format!(
                    "a line longer than {} bytes (--max-body-bytes)",
                    self.max_line_bytes
                ),
            }));
        }
        Ok(None)
    }

    /// The body ended: its last line (when it has no newline) joins the filling
    /// batch, then the committing batch and the filling one commit, in that order.
    async fn take_last_line_and_commit(&mut self, mut reading: Reading) -> Result<(), LineError> {
        if !reading.partial.is_empty() {
            reading.line_no += 1;
            let last = std::mem::take(&mut reading.partial);
            if let Err(e) = self.parse_into(&last, reading.line_no, &mut reading.filling) {
                return self
                    .fail_after(reading.committing, reading.filling, e)
                    .await;
            }
        }
        if let Some(c) = reading.committing.take() {
            self.finish(c.await, reading.line_no).await?;
        }
        if !reading.filling.ops.is_empty() {
            let c = self.submit(reading.filling).await?;
            self.finish(c.await, reading.line_no).await?;
        }
        Ok(())
    }

    fn is_full(&self, filling: &Filling) -> bool {
        // In a cluster a batch is one log entry, which a follower must take within
        // one append (a heartbeat interval): smaller.
        let max_bytes = if self.state.cluster.is_some() {
            MAX_CLUSTER_BATCH_BYTES
        } else {
            MAX_BATCH_BYTES
        };
        filling.ops.len() >= self.max_batch_docs || filling.bytes >= max_bytes
    }

    fn parse_into(
        &self,
        line: &[u8],
        line_no: u64,
        filling: &mut Filling,
    ) -> Result<(), LineError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let bad = |code: ErrorCode, message: String| LineError {
            line: line_no,
            code,
            message,
        };
        let parsed: Line = serde_json::from_slice(line).map_err(|e| {
            let why = match DocError::malformed_json(&e) {
                DocError::Document(DocumentError::MalformedJson {
                    column, message, ..
                }) => format!("{message} at column {column}"),
                other => other.to_string(),
            };
            bad(
                ErrorCode::MalformedJson,
                format!("{why} (a line is {{\"id\": ..., \"document\": {{...}}}})"),
            )
        })?;
        let refused = |e: DocError| {
            let message = e.to_string();
            bad(ApiError::from(e).code, message)
        };
        let document = self
            .db
            .parse_document(parsed.document.get().as_bytes())
            .map_err(refused)?;
        let id = parsed.id.into_owned();
        let target = if id.ends_with('/') {
            DocId::Generate { prefix: id }
        } else {
            DocId::Given(id)
        };
        // Checked here, not when the batch is written: a bad id must stop the stream
        // at its own line, with every line before it committed.
        self.db.check_id(&target).map_err(refused)?;
        if self.state.cluster.is_some() {
            filling.logged.push(
                kiln_cluster::LoggedOp::Put {
                    id: match &target {
                        DocId::Given(id) => id.clone(),
                        DocId::Generate { prefix } => prefix.clone(),
                    },
                    json: parsed.document.get().to_string(),
                    condition: kiln_cluster::LoggedCondition::None,
                }
                .attributed(self.key_id.clone()),
            );
        }
        filling.bytes += line.len();
        filling.ops.push(
            WriteOp::Put {
                id: target,
                document,
                condition: Condition::None,
            }
            .attributed(self.key_id.clone()),
        );
        Ok(())
    }

    async fn submit(&self, filling: Filling) -> Result<Commit, LineError> {
        let (reply, answer) = oneshot::channel();
        if self.state.cluster.is_some() {
            // One log entry per batch, all or none, as the write queue commits it.
            let (state, db) = (self.state.clone(), self.db.name().to_string());
            tokio::spawn(async move {
                let written = crate::routes::cluster::write(&state, &db, filling.logged, true)
                    .await
                    .and_then(|outcomes| outcomes.into_iter().collect());
                let _ = reply.send(written);
            });
            return Ok(answer);
        }
        self.state
            .store
            .writes()
            .write_all(self.db.clone(), filling.ops, move |r| {
                let _ = reply.send(r.map_err(ApiError::from));
            })
            .map_err(|e| LineError {
                line: 0,
                code: ApiError::from(e).code,
                message: "the write queue refused the batch".into(),
            })?;
        Ok(answer)
    }

    /// Records a committed batch (or turns its failure into the stream's end).
    async fn finish(
        &mut self,
        done: Result<Result<Vec<BatchOutcome>, ApiError>, oneshot::error::RecvError>,
        line_no: u64,
    ) -> Result<(), LineError> {
        match done {
            Ok(Ok(outcomes)) => {
                self.acked += outcomes.len() as u64;
                if let Some(BatchOutcome::Put(p)) = outcomes.last() {
                    self.last_etag = Some(p.etag);
                }
                let last = self.last_etag.map(|e| e.to_string());
                self.send_line(json!({"acked": self.acked, "last_etag": last}))
                    .await;
                Ok(())
            }
            Ok(Err(e)) => Err(LineError {
                line: line_no,
                code: e.code,
                message: format!("a batch failed and was not applied: {}", e.message),
            }),
            Err(_) => Err(LineError {
                line: line_no,
                code: ErrorCode::InternalError,
                message: "a batch was dropped before it finished".into(),
            }),
        }
    }

    /// A bad line: commit what came before it, then report it.
    async fn fail_after(
        &mut self,
        committing: Option<Commit>,
        filling: Filling,
        e: LineError,
    ) -> Result<(), LineError> {
        if let Some(c) = committing {
            self.finish(c.await, e.line).await?;
        }
        if !filling.ops.is_empty() {
            let c = self.submit(filling).await?;
            self.finish(c.await, e.line).await?;
        }
        Err(e)
    }

    /// The body ended badly: the committing batch finishes, the filling one is dropped.
    async fn stop(
        &mut self,
        committing: Option<Commit>,
        line: u64,
        code: ErrorCode,
        message: String,
    ) -> Result<(), LineError> {
        if let Some(c) = committing {
            self.finish(c.await, line).await?;
        }
        Err(LineError {
            line,
            code,
            message,
        })
    }
}
