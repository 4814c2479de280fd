//! A small blocking HTTP/1.1 client for `kiln import` / `kiln export`: plain
//! `std::net` sockets, one connection per request (`Connection: close`), bodies
//! with `content-length`, chunked, or up to the end of the connection. A bulk
//! upload is full duplex: one thread writes the chunked request body while the
//! caller reads the streamed answer on a clone of the same socket.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Where the server is: `http://host:port[/base]`, and the API key to send.
#[derive(Clone, Debug)]
pub struct Endpoint {
    host: String,
    port: u16,
    base: String,
    api_key: Option<String>,
}

#[derive(Debug)]
pub enum ClientError {
    Url(String),
    Io {
        what: String,
        source: io::Error,
    },
    Protocol(String),
    /// A non-2xx answer: status and the body's text (the server's error JSON).
    Status {
        status: u16,
        body: String,
    },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Url(m) => write!(f, "bad --url: {m}"),
            ClientError::Io { what, source } => write!(f, "{what}: {source}"),
            ClientError::Protocol(m) => write!(f, "unexpected answer from the server: {m}"),
            ClientError::Status { status, body } => {
                write!(f, "the server answered {status}: {}", body.trim())
            }
        }
    }
}

impl std::error::Error for ClientError {}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ClientError {
    let what = what.into();
    move |source| ClientError::Io { what, source }
}

/// `--url` and `--api-key`: the server that `kiln import` and `kiln export` talk to.
#[derive(clap::Args)]
pub struct ServerArgs {
    /// The server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// API key for a server running with --auth (sent as `Authorization: Bearer`).
    #[arg(long)]
    pub api_key: Option<String>,
}

impl ServerArgs {
    pub fn endpoint(&self) -> Result<Endpoint, ClientError> {
        Endpoint::parse(&self.url, self.api_key.clone())
    }
}

impl Endpoint {
    pub fn parse(url: &str, api_key: Option<String>) -> Result<Endpoint, ClientError> {
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.starts_with("https://") {
            return Err(ClientError::Url(format!(
                "{url}: https is not supported by import/export yet (use http, e.g. through a local proxy)"
            )));
        } else if url.contains("://") {
            return Err(ClientError::Url(format!("{url}: only http:// URLs")));
        } else {
            url
        };
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| ClientError::Url(format!("{url}: bad port {p:?}")))?;
                (h.to_string(), port)
            }
            _ => (authority.to_string(), 80),
        };
        if host.is_empty() {
            return Err(ClientError::Url(format!("{url}: no host")));
        }
        Ok(Endpoint {
            host,
            port,
            base: base.to_string(),
            api_key,
        })
    }

    fn connect(&self) -> Result<TcpStream, ClientError> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        let stream = TcpStream::connect((host, self.port))
            .map_err(io_err(format!("connecting to {}:{}", self.host, self.port)))?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    fn head(&self, method: &str, path: &str, extra: &str) -> String {
        let mut h = format!(
            "{method} {}{path} HTTP/1.1\r\nhost: {}:{}\r\nconnection: close\r\naccept: application/json\r\n",
            self.base, self.host, self.port
        );
        if let Some(k) = &self.api_key {
            h.push_str(&format!("authorization: Bearer {k}\r\n"));
        }
        h.push_str(extra);
        h.push_str("\r\n");
        h
    }

    /// One request with a small body; the whole answer, which must be 2xx.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> Result<Vec<u8>, ClientError> {
        let (status, body) = self.request_any(method, path, body)?;
        if !(200..300).contains(&status) {
            return Err(ClientError::Status {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(body)
    }

    /// One request; (status, whole answer body) whatever the status.
    pub fn request_any(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let mut stream = self.connect()?;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(300)));
        let mut req = self
            .head(method, path, &format!("content-length: {}\r\n", body.len()))
            .into_bytes();
        req.extend_from_slice(body);
        stream
            .write_all(&req)
            .map_err(io_err(format!("sending {method} {path}")))?;
        let mut resp = Response::read(BufReader::new(stream))?;
        let mut out = Vec::new();
        resp.body
            .read_to_end(&mut out)
            .map_err(io_err(format!("reading the answer to {method} {path}")))?;
        Ok((resp.status, out))
    }

    /// `GET path`, answer streamed: the status must be 2xx, the body is read by
    /// the caller (used by `kiln backup`).
    pub fn get_stream(&self, path: &str) -> Result<Response, ClientError> {
        let mut stream = self.connect()?;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(300)));
        stream
            .write_all(self.head("GET", path, "").as_bytes())
            .map_err(io_err(format!("sending GET {path}")))?;
        let mut resp = Response::read(BufReader::new(stream))?;
        if !(200..300).contains(&resp.status) {
            let mut body = Vec::new();
            let _ = resp.body.read_to_end(&mut body);
            return Err(ClientError::Status {
                status: resp.status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(resp)
    }

    /// Starts `POST path` with a chunked body: the writer for the body (see
    /// [`ChunkedWriter`]) and a handle that reads the answer when called.
    pub fn start_upload(&self, path: &str) -> Result<(ChunkedWriter, Upload), ClientError> {
        let stream = self.connect()?;
        let mut w = stream
            .try_clone()
            .map_err(io_err("cloning the socket for the upload"))?;
        let head = self.head(
            "POST",
            path,
            "content-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n",
        );
        w.write_all(head.as_bytes())
            .map_err(io_err(format!("sending POST {path}")))?;
        Ok((ChunkedWriter { out: w }, Upload { stream }))
    }
}

/// The read side of an upload.
pub struct Upload {
    stream: TcpStream,
}

impl Upload {
    /// A handle to end the whole connection (both directions) from another thread.
    pub fn shutdown_handle(&self) -> Result<TcpStream, ClientError> {
        self.stream
            .try_clone()
            .map_err(io_err("cloning the socket"))
    }

    /// Waits for the answer's head; its body to read line by line.
    pub fn response(self) -> Result<Response, ClientError> {
        Response::read(BufReader::new(self.stream))
    }
}

/// Writes a request body as HTTP/1.1 chunks; `finish` writes the last chunk.
pub struct ChunkedWriter {
    out: TcpStream,
}

impl ChunkedWriter {
    pub fn chunk(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut frame = Vec::with_capacity(data.len() + 16);
        frame.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        frame.extend_from_slice(data);
        frame.extend_from_slice(b"\r\n");
        self.out.write_all(&frame)
    }

    pub fn finish(mut self) -> io::Result<()> {
        self.out.write_all(b"0\r\n\r\n")?;
        // No half-close: the server would take the end of the connection's input
        // for a client gone and drop the rest of its answer.
        self.out.flush()
    }
}

/// An answer: status and a reader of its (de-chunked) body.
pub struct Response {
    pub status: u16,
    pub body: Box<dyn BufRead + Send>,
}

impl Response {
    fn read(mut r: BufReader<TcpStream>) -> Result<Response, ClientError> {
        let mut status_line = String::new();
        r.read_line(&mut status_line)
            .map_err(io_err("reading the answer's status line"))?;
        if status_line.is_empty() {
            return Err(ClientError::Protocol(
                "the server closed the connection without an answer".into(),
            ));
        }
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| ClientError::Protocol(format!("status line {status_line:?}")))?;
        let mut length: Option<u64> = None;
        let mut chunked = false;
        loop {
            let mut line = String::new();
            r.read_line(&mut line)
                .map_err(io_err("reading the answer's headers"))?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim(), v.trim());
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.parse().ok();
                } else if k.eq_ignore_ascii_case("transfer-encoding")
                    && v.to_ascii_lowercase().contains("chunked")
                {
                    chunked = true;
                }
            }
        }
        let body: Box<dyn BufRead + Send> = if chunked {
            Box::new(BufReader::new(Chunked {
                inner: r,
                left: 0,
                done: false,
            }))
        } else if let Some(n) = length {
            Box::new(BufReader::new(r.take(n)))
        } else {
            Box::new(r)
        };
        Ok(Response { status, body })
    }
}

/// De-chunks a chunked body.
struct Chunked {
    inner: BufReader<TcpStream>,
    left: u64,
    done: bool,
}

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut size = String::new();
            self.inner.read_line(&mut size)?;
            if size.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection ended inside a chunked answer",
                ));
            }
            let hex = size.trim().split(';').next().unwrap_or("");
            self.left = u64::from_str_radix(hex, 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad chunk size {size:?}"),
                )
            })?;
            if self.left == 0 {
                // Trailers up to the empty line.
                loop {
                    let mut t = String::new();
                    if self.inner.read_line(&mut t)? == 0 || t.trim().is_empty() {
                        break;
                    }
                }
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf.len().min(self.left as usize);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection ended inside a chunk",
            ));
        }
        self.left -= n as u64;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// Percent-encodes a query parameter value.
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes a path segment (a database name).
pub fn path_escape(s: &str) -> String {
    query_escape(s)
}
