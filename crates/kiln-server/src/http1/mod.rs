//! The connection's own HTTP/1.1 loop for the busiest requests: one document's
//! GET, PUT, POST or PATCH in plain HTTP/1.1 (no chunked body, no `Expect`, no upgrade,
//! nothing to percent-decode). Under W8 and W9 those are every request, and hyper,
//! the router and their per-request allocations cost about as much CPU as the
//! storage work itself (docs/benchmarks-history.md, "Round 2"). The first request of any other kind
//! hands the connection, with every byte already read, to hyper for the rest of its
//! life, so everything else is served exactly as before.
//!
//! What the loop keeps from hyper's behaviour: keep-alive and pipelining (answers
//! to pipelined requests go out together), `Connection: close`, half-closed clients,
//! the same header read timeout (an idle connection is closed after it too), 413
//! before reading an oversized body, 408 for a stalled body, 400 for a body cut
//! short, and a graceful shutdown that finishes the request in hand.

pub(crate) mod answer;
mod head;
mod rewind;

use crate::doc_request::{self, DocAnswer, DocMethod};
use crate::error::{ApiError, ErrorCode};
use crate::http_util::{body_read_failed, body_timed_out, HeaderLookup};
use crate::hyper_conn::ConnContext;
use crate::metrics::DOCUMENT_ROUTE;
use crate::observe::{Exchange, KeyId, RequestId};
use crate::read_offload;
use crate::state::SharedState;
use answer::Answered;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use head::{DocHead, HeadHeaders, Parsed};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// The headers an offloaded GET needs (its conditions), carried to the blocking
/// pool.
struct Conditions {
    if_none_match: Option<Vec<u8>>,
    if_modified_since: Option<Vec<u8>>,
}

impl HeaderLookup for Conditions {
    fn first(&self, name: &str) -> Option<&[u8]> {
        match name {
            "if-none-match" => self.if_none_match.as_deref(),
            "if-modified-since" => self.if_modified_since.as_deref(),
            _ => None,
        }
    }
}

/// A buffer kept between requests; a larger one (a big body) is given back.
const KEPT_BUFFER_BYTES: usize = 16 << 10;
/// A head longer than this goes to hyper, which refuses it with its own limit.
const MAX_HEAD_BYTES: usize = 64 << 10;
/// Answers to pipelined requests are sent together up to this size.
const MAX_PENDING_OUTPUT_BYTES: usize = 64 << 10;

/// Serves a connection: document requests here, the rest (from the first request
/// that is not one) through hyper.
pub(crate) async fn serve_connection<S>(io: S, cx: ConnContext)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut conn = Conn {
        io,
        buf: Vec::with_capacity(8 << 10),
        start: 0,
        out: Vec::with_capacity(8 << 10),
        deadline: Instant::now() + cx.header_read_timeout,
        timer: Box::pin(tokio::time::sleep(cx.header_read_timeout)),
        read_timeout: cx.header_read_timeout,
        client_certificate: cx.info.client_certificate.clone(),
        peer: cx.info.peer,
        state: cx.state.clone(),
        shutdown: cx.shutdown.clone(),
        shutdown_signal: Some(Box::pin(shutdown_signal(cx.shutdown.clone()))),
    };
    let next = conn.run().await;
    if next == Next::HandOver {
        cx.state.metrics.connections_to_hyper.inc();
        let mut read_ahead = conn.buf;
        read_ahead.drain(..conn.start);
        let io = rewind::Rewind::new(read_ahead, conn.io);
        crate::hyper_conn::serve_with_hyper(io, cx).await;
    } else {
        let _ = conn.io.shutdown().await;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Next {
    Close,
    HandOver,
}

/// Why a wait for more bytes ended without them.
enum Stop {
    Eof,
    TimedOut,
    Shutdown,
}

struct Conn<S> {
    io: S,
    /// Bytes read; those before `start` are consumed (see `pending`).
    buf: Vec<u8>,
    start: usize,
    /// Answers not yet written.
    out: Vec<u8>,
    /// When the current wait (for a head, or for a body) times out. Moving it is a
    /// store; `timer` fires at an earlier deadline at most once per timeout period
    /// and is then set again, so a request does not touch the timer wheel.
    deadline: Instant,
    timer: Pin<Box<Sleep>>,
    read_timeout: Duration,
    /// The thumbprint of the client's verified certificate (`ConnInfo`).
    client_certificate: Option<std::sync::Arc<str>>,
    peer: std::net::SocketAddr,
    state: SharedState,
    shutdown: watch::Receiver<bool>,
    /// Resolves at shutdown; made once per connection (a `changed()` per wait
    /// registered and dropped a waiter on every request), `None` once resolved.
    shutdown_signal: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

async fn shutdown_signal(mut shutdown: watch::Receiver<bool>) {
    // Err: the server is gone, which is a shutdown too.
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// The bytes read and not yet consumed: the next request starts here. Requests
    /// are consumed by moving `start`, so pipelined requests do not each move the
    /// rest of the buffer; it is compacted once before each read.
    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        debug_assert!(self.start <= self.buf.len());
    }

    async fn run(&mut self) -> Next {
        self.deadline = Instant::now() + self.read_timeout;
        loop {
            match head::parse(self.pending(), &self.state.front) {
                Parsed::Document(head) => {
                    if let Err(next) = self.serve(head).await {
                        return next;
                    }
                    // The wait for the next request's head starts now (it may be
                    // partly here already).
                    self.deadline = Instant::now() + self.read_timeout;
                    if self.out.len() >= MAX_PENDING_OUTPUT_BYTES && self.flush().await.is_err() {
                        return Next::Close;
                    }
                }
                Parsed::Other => return self.hand_over().await,
                Parsed::Malformed(why) => {
                    let id = RequestId::new();
                    let refused = ApiError::new(ErrorCode::BadRequest, why).into_response();
                    answer::response(&mut self.out, refused, &id, true).await;
                    let _ = self.flush().await;
                    return Next::Close;
                }
                Parsed::Partial if self.pending().len() > MAX_HEAD_BYTES => {
                    return self.hand_over().await;
                }
                Parsed::Partial => {
                    // Everything buffered is answered: send it before waiting.
                    if self.flush().await.is_err() {
                        return Next::Close;
                    }
                    if *self.shutdown.borrow() {
                        return Next::Close;
                    }
                    if self.read_more(true).await.is_err() {
                        // End of stream, a head that timed out, or shutdown while
                        // no request is in hand: close, as hyper does.
                        return Next::Close;
                    }
                }
            }
        }
    }

    /// Sends the answers in hand, then gives the connection to hyper (or closes it
    /// when the client is gone).
    async fn hand_over(&mut self) -> Next {
        match self.flush().await {
            Ok(()) => Next::HandOver,
            Err(()) => Next::Close,
        }
    }

    /// Serves one document request; `Err` ends the loop (the answer is flushed).
    async fn serve(&mut self, head: DocHead) -> Result<(), Next> {
        let started = std::time::Instant::now();
        let close = head.close || *self.shutdown.borrow();
        let pending = self.pending();
        let headers = HeadHeaders {
            head: &head,
            buf: pending,
        };
        let id = RequestId::from_presented(headers.first("x-request-id"));
        // The path as the access log shows it; only built when it is on.
        let path = match self.state.access_log {
            crate::observe::AccessLog::Off => String::new(),
            _ => format!("/dbs/{}/docs/{}", head.db(pending), head.id(pending)),
        };
        let ((answered, key), close) = match head.method {
            DocMethod::Get => (self.get(&head, &id, close).await, close),
            DocMethod::Put | DocMethod::Post | DocMethod::Patch => {
                self.put(&head, &id, close).await
            }
        };
        crate::observe::finished(
            &self.state.metrics,
            self.state.access_log,
            &Exchange {
                route: DOCUMENT_ROUTE,
                method: head.method.as_str(),
                path: &path,
                status: answered.status.as_u16(),
                bytes: Some(answered.body_bytes),
                elapsed: started.elapsed(),
                request_id: &id,
                key_id: key.as_ref().map(|k| k.0.as_str()),
            },
        );
        if close {
            let _ = self.flush().await;
            return Err(Next::Close);
        }
        Ok(())
    }

    /// Admission (`app::admit`) and the document route's rule, as the router's
    /// `authenticate` and `route_table::guard` do them; a refusal is audited.
    fn admit(
        &self,
        head: &DocHead,
        id: &RequestId,
    ) -> Result<Option<KeyId>, axum::response::Response> {
        use crate::route_table::{rule_for, DOCUMENT_RULES};
        let pending = self.pending();
        let headers = HeadHeaders { head, buf: pending };
        let db = head.db(pending);
        let mut who = None;
        let verdict = crate::app::admit(&self.state, self.client_certificate.as_deref(), || {
            crate::app::presented_key(&headers)
        })
        .and_then(|caller| {
            who = caller;
            match (&who, rule_for(DOCUMENT_RULES, head.method.as_str())) {
                (Some(caller), Some(rule)) => crate::app::check_need(caller, rule.need, Some(db)),
                _ => Ok(()),
            }
        });
        match verdict {
            Ok(()) => Ok(who.map(|caller| KeyId(caller.id.clone()))),
            Err(refused) => {
                if let Some(log) = &self.state.audit {
                    let facts = crate::audit::RequestFacts {
                        method: head.method.as_str().to_string(),
                        path: format!("/dbs/{db}/docs/{}", head.id(pending)),
                        request_id: id.as_str().to_string(),
                        peer: Some(self.peer),
                    };
                    crate::app::log_refusal(log, &facts, who.as_ref(), Some(db), &refused);
                }
                Err(refused.into_response())
            }
        }
    }

    async fn get(
        &mut self,
        head: &DocHead,
        id: &RequestId,
        close: bool,
    ) -> (Answered, Option<KeyId>) {
        let (answered, key) = match self.admit(head, id) {
            Err(refused) => (Err(refused), None),
            Ok(key) if self.state.read_offload.now() => {
                (self.get_offloaded(head, id, close).await, key)
            }
            Ok(key) => (self.get_here(head, id, close), key),
        };
        let answered = match answered {
            Ok(answered) => answered,
            Err(resp) => answer::response(&mut self.out, resp, id, close).await,
        };
        self.consume(head.head_len);
        (answered, key)
    }

    /// A GET read on this thread, the answer written straight from the snapshot.
    fn get_here(
        &mut self,
        head: &DocHead,
        id: &RequestId,
        close: bool,
    ) -> Result<Answered, Response> {
        // Split borrows: the head's bytes are read while the answer is written.
        let pending = &self.buf[self.start..];
        let headers = HeadHeaders { head, buf: pending };
        let (db, doc_id) = (head.db(pending), head.id(pending));
        let out = &mut self.out;
        read_offload::watched(|| {
            doc_request::read(&self.state, db, doc_id, &headers, |answer| {
                answer::document(out, &answer, id, close)
            })
        })
        .map_err(IntoResponse::into_response)
    }

    /// A GET read on the blocking pool (`read_offload.rs`), which writes the answer
    /// into a buffer of its own: this thread serves other connections meanwhile.
    async fn get_offloaded(
        &mut self,
        head: &DocHead,
        id: &RequestId,
        close: bool,
    ) -> Result<Answered, Response> {
        let pending = &self.buf[self.start..];
        let head_headers = HeadHeaders { head, buf: pending };
        let conditions = Conditions {
            if_none_match: head_headers.first("if-none-match").map(<[u8]>::to_vec),
            if_modified_since: head_headers.first("if-modified-since").map(<[u8]>::to_vec),
        };
        let state = self.state.clone();
        let (db, doc_id, id) = (
            head.db(pending).to_string(),
            head.id(pending).to_string(),
            id.clone(),
        );
        let read = move || {
            let mut out = Vec::new();
            let answered = doc_request::read(&state, &db, &doc_id, &conditions, |answer| {
                answer::document(&mut out, &answer, &id, close)
            });
            (answered, out)
        };
        match read_offload::offloaded(read).await {
            Ok((Ok(answered), bytes)) => {
                self.out.extend_from_slice(&bytes);
                Ok(answered)
            }
            Ok((Err(e), _)) => Err(e.into_response()),
            Err(e) => Err(read_offload::unfinished(e).into_response()),
        }
    }

    /// A PUT, POST or PATCH: `doc_request`'s checks before the body, then its body
    /// read within the size and time limits, then the durable write. Returns the
    /// answer's status and whether the connection closes after it.
    async fn put(
        &mut self,
        head: &DocHead,
        id: &RequestId,
        close: bool,
    ) -> ((Answered, Option<KeyId>), bool) {
        let admitted = self.admit(head, id);
        let key = admitted.as_ref().ok().cloned().flatten();
        let checked = admitted.and_then(|_| {
            let pending = self.pending();
            let headers = HeadHeaders { head, buf: pending };
            doc_request::check_write(
                &self.state,
                head.method,
                head.db(pending),
                head.id(pending),
                &headers,
                Some(head.content_length as u64),
            )
            .map_err(IntoResponse::into_response)
        });
        // Within max_body_bytes from here on (or not read at all): no overflow.
        let body_end = head.head_len.saturating_add(head.content_length);
        let ready = match checked {
            Ok(ready) => ready,
            Err(resp) => {
                let (answered, close) = self.refuse_unread_body(resp, body_end, id, close).await;
                return ((answered, key), close);
            }
        };
        // Earlier pipelined answers do not wait for this body and its commit.
        if self.flush().await.is_err() {
            // The client is gone; nothing was read or written for this request. The
            // status is only what the metrics count.
            let gone = Answered {
                status: StatusCode::BAD_REQUEST,
                body_bytes: 0,
            };
            return ((gone, key), true);
        }
        if let Err(e) = self.read_body(head, body_end).await {
            let answered = answer::response(&mut self.out, e.into_response(), id, true).await;
            return ((answered, key), true);
        }
        let pending = &self.buf[self.start..];
        let (db, doc_id) = (head.db(pending), head.id(pending).to_string());
        let body = &pending[head.head_len..body_end];
        let key_id = key.as_ref().map(|k| k.0.clone());
        let answered = match doc_request::write(&self.state, ready, doc_id, body, key_id).await {
            Ok(outcome) => {
                let written = DocAnswer::Written {
                    db,
                    outcome: &outcome,
                };
                answer::document(&mut self.out, &written, id, close)
            }
            Err(e) => answer::response(&mut self.out, e.into_response(), id, close).await,
        };
        self.consume(body_end);
        ((answered, key), close)
    }

    /// Answers a request refused before its body was read. The body stays unread:
    /// skipped when all of it is here already, otherwise the connection closes (its
    /// rest would be taken for the next request). Returns the answer and whether the
    /// connection closes.
    async fn refuse_unread_body(
        &mut self,
        refused: Response,
        body_end: usize,
        id: &RequestId,
        close: bool,
    ) -> (Answered, bool) {
        let skip = self.pending().len() >= body_end;
        let close = close || !skip;
        let answered = answer::response(&mut self.out, refused, id, close).await;
        if skip {
            self.consume(body_end);
        }
        (answered, close)
    }

    /// Reads until the body (up to `body_end` in the pending bytes) is all here, the
    /// read timeout starting over; `Err` is the answer to a stalled or cut body.
    async fn read_body(&mut self, head: &DocHead, body_end: usize) -> Result<(), ApiError> {
        self.deadline = Instant::now() + self.read_timeout;
        while self.pending().len() < body_end {
            let missing = body_end - self.pending().len();
            self.buf.reserve(missing);
            if let Err(stop) = self.read_more(false).await {
                return Err(match stop {
                    Stop::TimedOut => body_timed_out(&self.state.limits),
                    Stop::Eof | Stop::Shutdown => body_read_failed(format_args!(
                        "the connection ended after {} of {} bytes",
                        self.pending().len() - head.head_len,
                        head.content_length
                    )),
                });
            }
        }
        Ok(())
    }

    /// Compacts the buffer (the pending bytes move to its front, into a smaller
    /// buffer when a large body left it big and a head is awaited) and reads more
    /// bytes into it. While
    /// waiting for a head (`head_phase`) the wait also ends at shutdown.
    async fn read_more(&mut self, head_phase: bool) -> Result<(), Stop> {
        let pending = self.buf.len() - self.start;
        // Not while a body arrives: its room was just reserved.
        if head_phase && self.buf.capacity() > KEPT_BUFFER_BYTES && pending <= KEPT_BUFFER_BYTES / 2
        {
            let mut smaller = Vec::with_capacity(KEPT_BUFFER_BYTES / 2);
            smaller.extend_from_slice(&self.buf[self.start..]);
            self.buf = smaller;
        } else if self.start > 0 {
            self.buf.drain(..self.start);
        }
        self.start = 0;
        let Conn {
            io,
            buf,
            deadline,
            timer,
            shutdown_signal,
            ..
        } = self;
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(8 << 10);
        }
        loop {
            tokio::select! {
                biased;
                read = io.read_buf(buf) => {
                    return match read {
                        Ok(0) | Err(_) => Err(Stop::Eof),
                        Ok(_) => Ok(()),
                    };
                }
                () = timer.as_mut() => {
                    if Instant::now() >= *deadline {
                        return Err(Stop::TimedOut);
                    }
                    let at = *deadline;
                    timer.as_mut().reset(at);
                }
                () = async { shutdown_signal.as_mut().expect("checked").await }, if head_phase && shutdown_signal.is_some() => {
                    *shutdown_signal = None;
                    return Err(Stop::Shutdown);
                }
            }
        }
    }

    /// Writes the pending answers; `Err` when the client is gone.
    async fn flush(&mut self) -> Result<(), ()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let written = self.io.write_all(&self.out).await;
        self.out.clear();
        if self.out.capacity() > KEPT_BUFFER_BYTES {
            self.out = Vec::with_capacity(8 << 10);
        }
        written.map_err(drop)?;
        self.io.flush().await.map_err(drop)
    }
}
