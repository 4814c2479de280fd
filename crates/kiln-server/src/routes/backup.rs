//! `GET /dbs/{db}/backup`: streams a full backup of a live database (the format of
//! `kiln_storage::backup`, with the kiln-docs manifest in its header).
//!
//! The backup reads one snapshot on a blocking thread; writes go on meanwhile and
//! are not in it. Its bytes travel to the response through a bounded channel, so a
//! slow client slows the backup (and keeps its snapshot open), and a client that
//! disconnects stops it: the next send fails and the backup ends with an error.
//! A failure after the answer started aborts the response (the client sees a
//! truncated body, which `verify` refuses).

use crate::app::SharedState;
use crate::error::ApiError;
use crate::http_util::ApiPath;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
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

pub async fn backup(
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, io::Error>>(QUEUE);
    let name = db.clone();
    tokio::task::spawn_blocking(move || {
        let mut w = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(PIECE),
        };
        let started = std::time::Instant::now();
        match database.backup_to(&mut w, kiln_storage::BackupOptions::default(), |_| {}) {
            Ok(r) => tracing::info!(
                database = %name,
                etag = ?r.manifest.etag,
                bytes = r.file_bytes,
                ms = started.elapsed().as_millis() as u64,
                "backup streamed"
            ),
            Err(e) => {
                tracing::warn!(database = %name, error = %e, "backup stopped");
                let _ = tx.blocking_send(Err(io::Error::other(e.to_string())));
            }
        }
    });
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
    Ok(resp)
}
