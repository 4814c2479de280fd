//! A small blocking HTTP/1.1 client for the commands that talk to a server
//! (import, export, backup, restore, query): one connection per request
//! (`Connection: close`), bodies with `content-length`, chunked, or up to the end
//! of the connection, over plain TCP or TLS (rustls). A bulk upload is full
//! duplex: one thread writes the chunked request body while the caller reads the
//! streamed answer on the other half of the same connection.

use kiln_server::tls::TlsError;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Where the server is: `http[s]://host:port[/base]`, the API key to send and,
/// for https, the TLS client settings.
#[derive(Clone)]
pub struct Endpoint {
    host: String,
    port: u16,
    base: String,
    api_key: Option<String>,
    tls: Option<TlsClient>,
}

#[derive(Clone)]
struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    server_name: rustls::pki_types::ServerName<'static>,
}

/// How to reach a server over https: whom to trust and who we are.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// PEM CA certificate(s) that signed an https:// server's certificate
    /// (default: the system's trusted roots).
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate chain, for a server started with --tls-client-ca
    /// (it then needs no API key).
    #[arg(long, requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// The PEM private key of --client-cert.
    #[arg(long, requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl TlsArgs {
    fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_cert {
            Some(path) => kiln_server::tls::add_ca_certs(&mut roots, path)?,
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(TlsError::NoTrustedRoots);
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Setup)?
            .with_root_certificates(roots);
        let mut config = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(
                    kiln_server::tls::load_certs(cert)?,
                    kiln_server::tls::load_private_key(key)?,
                )
                .map_err(TlsError::KeyMismatch)?,
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad --url: {0}")]
    Url(String),
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    #[error(
        "TLS: handshake with {host}:{port} failed: {source} (is it an https port? is --ca-cert the CA that signed its certificate?)"
    )]
    Handshake {
        host: String,
        port: u16,
        #[source]
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
    /// A non-2xx answer: status and the body's text (the server's error JSON).
    #[error("the server answered {status}: {}", body.trim())]
    Status { status: u16, body: String },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ClientError {
    let what = what.into();
    move |source| ClientError::Io { what, source }
}

/// `--url`, `--api-key` and the TLS options: the server a command talks to.
#[derive(clap::Args)]
pub struct ServerArgs {
    /// The server, e.g. http://127.0.0.1:8080 or https://kiln.example:8443.
    #[arg(long)]
    pub url: String,
    /// API key for a server running with --auth (sent as `Authorization: Bearer`).
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl ServerArgs {
    pub fn endpoint(&self) -> Result<Endpoint, ClientError> {
        Endpoint::parse(&self.url, self.api_key.clone(), &self.tls)
    }
}

/// The runtime that drives TLS connections (rustls over tokio, bridged to the
/// blocking reads and writes of the commands): one worker, made on first use.
fn tls_runtime() -> Result<&'static tokio::runtime::Runtime, ClientError> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(io_err("starting the TLS runtime"))?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// A connection: its read and write halves, and the socket itself (to end it
/// from another thread, and for timeouts on plain TCP).
struct Connection {
    read: Box<dyn Read + Send>,
    write: Box<dyn Write + Send>,
    socket: TcpStream,
}

impl Endpoint {
    pub fn parse(
        url: &str,
        api_key: Option<String>,
        tls: &TlsArgs,
    ) -> Result<Endpoint, ClientError> {
        let (rest, https) = if let Some(r) = url.strip_prefix("http://") {
            (r, false)
        } else if let Some(r) = url.strip_prefix("https://") {
            (r, true)
        } else if url.contains("://") {
            return Err(ClientError::Url(format!(
                "{url}: only http:// and https:// URLs"
            )));
        } else {
            (url, false)
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
            _ => (authority.to_string(), if https { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(ClientError::Url(format!("{url}: no host")));
        }
        let given_tls = tls.ca_cert.is_some() || tls.client_cert.is_some();
        let tls = match https {
            true => {
                let name = host.trim_start_matches('[').trim_end_matches(']');
                let server_name = rustls::pki_types::ServerName::try_from(name.to_string())
                    .map_err(|e| ClientError::Url(format!("{url}: {e}")))?;
                Some(TlsClient {
                    config: tls.client_config()?,
                    server_name,
                })
            }
            false if given_tls => {
                return Err(ClientError::Url(format!(
                    "{url}: --ca-cert and --client-cert are for https:// URLs"
                )))
            }
            false => None,
        };
        Ok(Endpoint {
            host,
            port,
            base: base.to_string(),
            api_key,
            tls,
        })
    }

    fn connect(&self) -> Result<Connection, ClientError> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        let at = || format!("connecting to {}:{}", self.host, self.port);
        let stream = TcpStream::connect((host, self.port)).map_err(io_err(at()))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(300)));
        let socket = stream.try_clone().map_err(io_err(at()))?;
        let Some(tls) = &self.tls else {
            return Ok(Connection {
                read: Box::new(stream.try_clone().map_err(io_err(at()))?),
                write: Box::new(stream),
                socket,
            });
        };
        let rt = tls_runtime()?;
        stream.set_nonblocking(true).map_err(io_err(at()))?;
        let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
        let name = tls.server_name.clone();
        let tls_stream = rt
            .block_on(async move {
                let tcp = tokio::net::TcpStream::from_std(stream)?;
                connector.connect(name, tcp).await
            })
            .map_err(|source| ClientError::Handshake {
                host: self.host.clone(),
                port: self.port,
                source,
            })?;
        // Two halves: a bulk upload writes while the answer is read.
        let (read, write) = tokio::io::split(tls_stream);
        let handle = rt.handle().clone();
        Ok(Connection {
            read: Box::new(tokio_util::io::SyncIoBridge::new_with_handle(
                read,
                handle.clone(),
            )),
            write: Box::new(tokio_util::io::SyncIoBridge::new_with_handle(write, handle)),
            socket,
        })
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

    /// One request; (status, whole answer body) whatever the status. A 503 whose
    /// answer says `"outcome":"not_written"` (a cluster between leaders, a full
    /// commit queue) is sent again, after 0.25 s growing to 1 s, for up to
    /// [`NOT_WRITTEN_RETRY_MS`]: the server guarantees nothing was written, so
    /// resending is safe whatever the method.
    pub fn request_any(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let deadline = std::time::Instant::now() + Duration::from_millis(NOT_WRITTEN_RETRY_MS);
        let mut pause = Duration::from_millis(250);
        loop {
            let (status, answer) = self.request_once(method, path, body)?;
            if status != 503
                || !is_not_written(&answer)
                || std::time::Instant::now() + pause > deadline
            {
                return Ok((status, answer));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    fn request_once(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let mut conn = self.connect()?;
        let mut req = self
            .head(method, path, &format!("content-length: {}\r\n", body.len()))
            .into_bytes();
        req.extend_from_slice(body);
        conn.write
            .write_all(&req)
            .and_then(|()| conn.write.flush())
            .map_err(io_err(format!("sending {method} {path}")))?;
        let mut resp = Response::read(BufReader::new(conn.read))?;
        let mut out = Vec::new();
        resp.body
            .read_to_end(&mut out)
            .map_err(io_err(format!("reading the answer to {method} {path}")))?;
        Ok((resp.status, out))
    }

    /// `GET path`, answer streamed: the status must be 2xx, the body is read by
    /// the caller (used by `kiln backup`).
    pub fn get_stream(&self, path: &str) -> Result<Response, ClientError> {
        let mut conn = self.connect()?;
        conn.write
            .write_all(self.head("GET", path, "").as_bytes())
            .and_then(|()| conn.write.flush())
            .map_err(io_err(format!("sending GET {path}")))?;
        let mut resp = Response::read(BufReader::new(conn.read))?;
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
        self.start_upload_with("POST", path, "content-type: application/x-ndjson\r\n")
    }

    /// `start_upload` with another method and headers (`extra`: lines ending in
    /// CRLF), e.g. an attachment's PUT.
    pub fn start_upload_with(
        &self,
        method: &str,
        path: &str,
        extra: &str,
    ) -> Result<(ChunkedWriter, Upload), ClientError> {
        let Connection {
            read,
            write: mut w,
            socket,
        } = self.connect()?;
        let head = self.head(
            method,
            path,
            &format!("{extra}transfer-encoding: chunked\r\n"),
        );
        w.write_all(head.as_bytes())
            .map_err(io_err(format!("sending {method} {path}")))?;
        Ok((ChunkedWriter { out: w }, Upload { read, socket }))
    }
}

/// How long a request answered 503 "not written" is retried (see
/// [`Endpoint::request_any`]): a cluster's election takes well under this.
pub const NOT_WRITTEN_RETRY_MS: u64 = 15_000;

/// Whether an error answer says the request was not written (and may be resent).
fn is_not_written(answer: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(answer).is_ok_and(|v| v["outcome"] == "not_written")
}

/// The read side of an upload.
pub struct Upload {
    read: Box<dyn Read + Send>,
    socket: TcpStream,
}

impl Upload {
    /// A handle to end the whole connection (both directions) from another thread.
    pub fn shutdown_handle(&self) -> Result<TcpStream, ClientError> {
        self.socket
            .try_clone()
            .map_err(io_err("cloning the socket"))
    }

    /// Waits for the answer's head; its body to read line by line.
    pub fn response(self) -> Result<Response, ClientError> {
        Response::read(BufReader::new(self.read))
    }
}

/// Writes a request body as HTTP/1.1 chunks; `finish` writes the last chunk.
pub struct ChunkedWriter {
    out: Box<dyn Write + Send>,
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
        self.out.write_all(&frame)?;
        // Over TLS the bytes wait in the record layer until flushed.
        self.out.flush()
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

/// What an answer is read from.
type Source = BufReader<Box<dyn Read + Send>>;

impl Response {
    fn read(mut r: Source) -> Result<Response, ClientError> {
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
    inner: Source,
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

/// What a query value or a path segment keeps as it is: RFC 3986's unreserved
/// characters.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes a query parameter value.
pub fn query_escape(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

/// Percent-encodes a path segment (a database name).
pub fn path_escape(s: &str) -> String {
    query_escape(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers each connection with the next of `answers` (status,
    /// body), and counts the requests.
    fn serve(answers: Vec<(u16, &'static str)>) -> (u16, std::thread::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = std::thread::spawn(move || {
            let mut served = 0;
            for (status, body) in answers {
                let (mut s, _) = listener.accept().unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap() == 1 {
                    head.push(byte[0]);
                }
                served += 1;
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(answer.as_bytes()).unwrap();
            }
            served
        });
        (port, handle)
    }

    /// `PUT /dbs/shop` through `request_any` to the test server on `port`.
    fn put_status(port: u16) -> u16 {
        let endpoint = Endpoint::parse(
            &format!("http://127.0.0.1:{port}"),
            None,
            &TlsArgs::default(),
        )
        .unwrap();
        endpoint.request_any("PUT", "/dbs/shop", b"").unwrap().0
    }

    #[test]
    fn a_not_written_503_is_sent_again_and_another_503_is_not() {
        let not_written = r#"{"error":"no_quorum","message":"retry","outcome":"not_written"}"#;
        let (port, server) = serve(vec![(503, not_written), (503, not_written), (201, "{}")]);
        let status = put_status(port);
        assert_eq!(status, 201);
        assert_eq!(server.join().unwrap(), 3);

        // A 503 that may have been written is the caller's to handle.
        let unknown = r#"{"error":"no_quorum","message":"?","outcome":"unknown"}"#;
        let (port, server) = serve(vec![(503, unknown)]);
        let status = put_status(port);
        assert_eq!(status, 503);
        assert_eq!(server.join().unwrap(), 1);
    }
}
