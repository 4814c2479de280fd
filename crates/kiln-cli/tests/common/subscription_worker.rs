//! A blocking data subscription worker for the process tests: connects to
//! `/dbs/{db}/subscriptions/{name}/ws`, reads the server's messages, acknowledges
//! batches. Dropping it closes the TCP connection without a close frame, as a
//! killed worker process would.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use serde_json::Value;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

pub struct Worker {
    ws: WebSocket<TcpStream>,
}

/// What the server said.
#[derive(Debug)]
pub enum Said {
    Json(Value),
    /// The server closed the connection with this code (and reason).
    Closed(u16, String),
    /// Nothing within the time given.
    Nothing,
}

impl Worker {
    /// Connects; `query` is the WS route's query string (`batch_size=5&strategy=wait`).
    /// An HTTP refusal comes back as `Err((status, body))`.
    pub fn connect(port: u16, db: &str, name: &str, query: &str) -> Result<Worker, (u16, String)> {
        let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| (0, e.to_string()))?;
        stream.set_nodelay(true).ok();
        let url = format!("ws://127.0.0.1:{port}/dbs/{db}/subscriptions/{name}/ws?{query}");
        match tungstenite::client::client(url, stream) {
            Ok((ws, _)) => Ok(Worker { ws }),
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
                let status = resp.status().as_u16();
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                Err((status, body))
            }
            Err(e) => Err((0, e.to_string())),
        }
    }

    /// The next JSON message other than a heartbeat, within `within`.
    pub fn next(&mut self, within: Duration) -> Said {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Said::Nothing;
            }
            self.ws.get_ref().set_read_timeout(Some(left)).ok();
            match self.ws.read() {
                Ok(Message::Text(t)) => {
                    let v: Value = serde_json::from_str(&t).expect("the server sends JSON");
                    if v["type"] == "heartbeat" {
                        continue;
                    }
                    return Said::Json(v);
                }
                Ok(Message::Close(frame)) => {
                    let (code, reason) = frame
                        .map(|f| (u16::from(f.code), f.reason.to_string()))
                        .unwrap_or((u16::from(CloseCode::Status), String::new()));
                    return Said::Closed(code, reason);
                }
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Said::Nothing
                }
                Err(e) => return Said::Closed(0, e.to_string()),
            }
        }
    }

    /// The next message, which must be JSON of type `kind`.
    pub fn expect(&mut self, kind: &str, within: Duration) -> Value {
        match self.next(within) {
            Said::Json(v) if v["type"] == kind => v,
            other => panic!("expected a {kind:?} message, got {other:?}"),
        }
    }

    pub fn ack(&mut self, batch: u64) -> Result<(), tungstenite::Error> {
        let text = format!(r#"{{"op":"ack","batch":{batch}}}"#);
        self.ws.send(Message::text(text))
    }
}

/// (id, etag) of a batch message's documents.
pub fn documents(batch: &Value) -> Vec<(String, String)> {
    batch["documents"]
        .as_array()
        .expect("a batch has documents")
        .iter()
        .map(|d| {
            (
                d["@metadata"]["@id"].as_str().unwrap().to_string(),
                d["@metadata"]["@etag"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The sequence of an etag `<sequence>-<incarnation>`.
pub fn sequence(etag: &str) -> u64 {
    etag.split('-').next().unwrap().parse().unwrap()
}
