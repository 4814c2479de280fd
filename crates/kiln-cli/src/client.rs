//! A blocking HTTP client for the commands that talk to a server (import, export,
//! backup, restore, query): hyper's HTTP/1.1 client over plain TCP or TLS
//! (rustls), one connection per request. A small tokio runtime drives the
//! connections and the commands wait on it. A bulk upload is full duplex: one
//! thread feeds the request body (see [`ChunkedWriter`]) while the caller reads
//! the streamed answer.

use http_body_util::channel::{Channel, Sender};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Buf, Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, AUTHORIZATION, CONNECTION, HOST};
use hyper_util::rt::TokioIo;
use kiln_server::tls::TlsError;
use std::future::Future;
use std::io::{self, BufRead, Read};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::task::AbortHandle;

/// How long the client waits for the next bytes of an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

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
    /// The exchange failed in HTTP: a connection that ended before the answer, an
    /// answer that is not HTTP/1.1.
    #[error("{what}: {}", chain(.source))]
    Http {
        what: String,
        #[source]
        source: hyper::Error,
    },
    /// A request that cannot be written (a path that is no URI, a header value
    /// with a line break).
    #[error("{what}: {source}")]
    Request {
        what: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("{what}: no answer within {} s", READ_TIMEOUT.as_secs())]
    Timeout { what: String },
    /// No connection: the host does not resolve, or refuses or drops it.
    #[error("{at}: {source}")]
    Connect {
        at: String,
        #[source]
        source: io::Error,
    },
    /// A non-2xx answer: status and the body's text (the server's error JSON).
    /// Every command prints it alike: `the server answered 404
    /// database_not_found: <message> (request id <id>)`.
    #[error("{}", status_text(*status, body))]
    Status { status: u16, body: String },
}

/// A client error with what the command was doing: printed `what: error`, and
/// its exit code is the error's ([`crate::exit::of`] looks through it).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct During {
    pub what: String,
    #[source]
    pub source: ClientError,
}

impl ClientError {
    /// The error of a non-2xx answer `status` with `body`.
    pub fn status(status: u16, body: &[u8]) -> ClientError {
        ClientError::Status {
            status,
            body: String::from_utf8_lossy(body).into_owned(),
        }
    }

    /// This error, said to have happened while doing `what`.
    pub fn during(self, what: impl Into<String>) -> During {
        During {
            what: what.into(),
            source: self,
        }
    }
}

/// A non-2xx answer in words: the status, then the error JSON's `error` code,
/// `message` and `request_id` when the body is one, else the body's text.
pub fn status_text(status: u16, body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    match (v["error"].as_str(), v["message"].as_str()) {
        (Some(code), Some(message)) => {
            let mut text = format!("the server answered {status} {code}: {message}");
            if let Some(id) = v["request_id"].as_str() {
                text.push_str(&format!(" (request id {id})"));
            }
            text
        }
        _ if body.trim().is_empty() => format!("the server answered {status}"),
        _ => format!("the server answered {status}: {}", body.trim()),
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ClientError {
    let what = what.into();
    move |source| ClientError::Io { what, source }
}

fn http_err(what: &str) -> impl FnOnce(hyper::Error) -> ClientError + '_ {
    move |source| ClientError::Http {
        what: what.to_string(),
        source,
    }
}

/// An error and its causes, `a: b: c` (hyper's own text names only the first).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
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

/// The runtime that drives the connections (one worker, made on first use); the
/// commands' blocking calls wait on it.
fn runtime() -> Result<&'static Runtime, ClientError> {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("kiln-http-client")
        .enable_all()
        .build()
        .map_err(io_err("starting the HTTP client's runtime"))?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// The answer to a request sent: its head, when it comes.
type Pending = Pin<Box<dyn Future<Output = hyper::Result<hyper::Response<Incoming>>> + Send>>;

/// A request's body: all of it at once, or an upload's chunks as they come.
type Body = BoxBody<Bytes, io::Error>;

fn whole(body: &[u8]) -> Body {
    Full::new(Bytes::copy_from_slice(body))
        .map_err(|never| match never {})
        .boxed()
}

/// The task that drives one connection on the runtime; dropping this ends it.
struct Connection(AbortHandle);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
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
        } else {
            return Err(ClientError::Url(format!(
                "{url:?}: give the server as http://HOST:PORT or https://HOST[:PORT]"
            )));
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

    /// `path`'s full URL, for messages.
    fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}{}{path}", self.host, self.port, self.base)
    }

    /// Opens a connection and sends `method path` on it with `headers` (besides
    /// those every request has) and `body`: the answer to wait for, the connection,
    /// and the request's name for messages. The request is under way on return.
    fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body,
    ) -> Result<(Pending, Connection, String), ClientError> {
        let what = format!("{method} {}", self.url(path));
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(HOST, format!("{}:{}", self.host, self.port))
            .header(CONNECTION, "close")
            .header(ACCEPT, "application/json");
        if let Some(k) = &self.api_key {
            req = req.header(AUTHORIZATION, format!("Bearer {k}"));
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(body).map_err(|source| ClientError::Request {
            what: what.clone(),
            source,
        })?;
        let (pending, conn) = runtime()?.block_on(async {
            let (mut sender, conn) = self.connect().await?;
            sender.ready().await.map_err(http_err(&what))?;
            let pending: Pending = Box::pin(sender.send_request(req));
            Ok::<_, ClientError>((pending, conn))
        })?;
        Ok((pending, conn, what))
    }

    /// A new HTTP/1.1 connection, its task spawned on the runtime.
    async fn connect(&self) -> Result<(SendRequest<Body>, Connection), ClientError> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        let at = format!("connecting to {}:{}", self.host, self.port);
        let tcp = tokio::net::TcpStream::connect((host, self.port))
            .await
            .map_err(|source| ClientError::Connect {
                at: at.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return handshake(TokioIo::new(tcp), &at).await;
        };
        let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
        let stream = connector
            .connect(tls.server_name.clone(), tcp)
            .await
            .map_err(|source| ClientError::Handshake {
                host: self.host.clone(),
                port: self.port,
                source,
            })?;
        handshake(TokioIo::new(stream), &at).await
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
        let (pending, conn, what) = self.send(method, path, &[], whole(body))?;
        let mut resp = Response::wait(pending, conn, &what)?;
        let mut out = Vec::new();
        resp.body
            .read_to_end(&mut out)
            .map_err(io_err(format!("reading the answer to {what}")))?;
        Ok((resp.status, out))
    }

    /// `GET path`, answer streamed: the status must be 2xx, the body is read by
    /// the caller (used by `kiln backup`).
    pub fn get_stream(&self, path: &str) -> Result<Response, ClientError> {
        let (pending, conn, what) = self.send("GET", path, &[], whole(b""))?;
        let mut resp = Response::wait(pending, conn, &what)?;
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

    /// Starts `POST path` with a chunked NDJSON body: the writer for the body (see
    /// [`ChunkedWriter`]) and a handle that reads the answer when called.
    pub fn start_upload(&self, path: &str) -> Result<(ChunkedWriter, Upload), ClientError> {
        self.start_upload_with("POST", path, &[("content-type", "application/x-ndjson")])
    }

    /// `start_upload` with another method and headers, e.g. an attachment's PUT.
    pub fn start_upload_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(ChunkedWriter, Upload), ClientError> {
        // Two chunks in flight: the writer waits while the connection is behind.
        let (tx, body) = Channel::<Bytes, io::Error>::new(2);
        let (pending, conn, what) = self.send(method, path, headers, body.boxed())?;
        let writer = ChunkedWriter {
            tx: Some(tx),
            rt: runtime()?,
        };
        Ok((
            writer,
            Upload {
                pending,
                conn,
                what,
            },
        ))
    }
}

/// HTTP/1.1 over `io` (a TCP or TLS stream): the request sender, and the
/// connection's task spawned on the runtime.
async fn handshake<I>(io: I, at: &str) -> Result<(SendRequest<Body>, Connection), ClientError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(http_err(at))?;
    // Its errors reach the request's answer or body, where they are reported.
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((sender, Connection(task.abort_handle())))
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
    pending: Pending,
    conn: Connection,
    what: String,
}

impl Upload {
    /// A handle to end the whole connection (both directions) from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.conn.0.clone())
    }

    /// Waits for the answer's head; its body to read line by line.
    pub fn response(self) -> Result<Response, ClientError> {
        Response::wait(self.pending, self.conn, &self.what)
    }
}

/// Ends an upload's connection from another thread: its writer and its reader
/// then fail.
pub struct ShutdownHandle(AbortHandle);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.abort();
    }
}

/// Feeds an upload's body, which goes out chunked, from the caller's thread;
/// `finish` ends it. A writer dropped without `finish` abandons the upload: the
/// server sees a broken body, never a short one that looks complete.
pub struct ChunkedWriter {
    tx: Option<Sender<Bytes, io::Error>>,
    rt: &'static Runtime,
}

impl ChunkedWriter {
    /// Sends `data` as the next chunk; waits while the connection is behind.
    pub fn chunk(&mut self, data: &[u8]) -> io::Result<()> {
        let gone = || {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the connection ended during the upload",
            )
        };
        let Some(tx) = self.tx.as_mut() else {
            return Err(gone());
        };
        if data.is_empty() {
            return Ok(());
        }
        self.rt
            .block_on(tx.send_data(Bytes::copy_from_slice(data)))
            .map_err(|_| gone())
    }

    /// Ends the body (its last chunk goes out after those before it).
    pub fn finish(mut self) -> io::Result<()> {
        // No half-close: the connection stays open for the rest of the answer.
        drop(self.tx.take());
        Ok(())
    }
}

impl Drop for ChunkedWriter {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            tx.abort(io::Error::other("the upload was abandoned"));
        }
    }
}

/// An answer: status and a reader of its body.
pub struct Response {
    pub status: u16,
    pub body: Box<dyn BufRead + Send>,
}

impl Response {
    /// Waits for the head of the answer to `what` on `conn`.
    fn wait(pending: Pending, conn: Connection, what: &str) -> Result<Response, ClientError> {
        let rt = runtime()?;
        let answer = rt.block_on(async { tokio::time::timeout(READ_TIMEOUT, pending).await });
        let answer = match answer {
            Err(_) => {
                return Err(ClientError::Timeout {
                    what: what.to_string(),
                })
            }
            Ok(answer) => answer.map_err(http_err(what))?,
        };
        Ok(Response {
            status: answer.status().as_u16(),
            body: Box::new(BodyReader {
                body: answer.into_body(),
                data: Bytes::new(),
                done: false,
                rt,
                _conn: conn,
            }),
        })
    }
}

/// An answer's body, read as it arrives: each read waits (at most
/// [`READ_TIMEOUT`]) for the next piece from the connection.
struct BodyReader {
    body: Incoming,
    data: Bytes,
    done: bool,
    rt: &'static Runtime,
    /// Ends the connection when the answer is dropped.
    _conn: Connection,
}

impl BufRead for BodyReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.data.is_empty() && !self.done {
            let body = &mut self.body;
            let next = self
                .rt
                .block_on(async { tokio::time::timeout(READ_TIMEOUT, body.frame()).await });
            match next {
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the server sent nothing for {} s", READ_TIMEOUT.as_secs()),
                    ))
                }
                Ok(None) => self.done = true,
                Ok(Some(Err(e))) => return Err(io::Error::other(chain(&e))),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.data = data;
                    }
                }
            }
        }
        Ok(&self.data)
    }

    fn consume(&mut self, n: usize) {
        self.data.advance(n.min(self.data.len()));
    }
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let data = self.fill_buf()?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        self.consume(n);
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
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

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

    /// Reads from `s` into `seen` until `seen` holds `want`; false at the end of
    /// the connection.
    fn read_until(s: &mut TcpStream, seen: &mut Vec<u8>, want: &[u8]) -> bool {
        let mut buf = [0u8; 4096];
        while !seen.windows(want.len()).any(|w| w == want) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        true
    }

    fn local(port: u16) -> Endpoint {
        Endpoint::parse(
            &format!("http://127.0.0.1:{port}"),
            None,
            &TlsArgs::default(),
        )
        .unwrap()
    }

    #[test]
    fn an_upload_reads_the_answer_while_it_sends() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // The server answers the first line before the second is sent: the body
        // and the answer go on at once.
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            assert!(read_until(&mut s, &mut seen, b"one\n"));
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n8\r\ngot one\n\r\n")
                .unwrap();
            assert!(read_until(&mut s, &mut seen, b"0\r\n\r\n"));
            s.write_all(b"8\r\ngot two\n\r\n0\r\n\r\n").unwrap();
            String::from_utf8(seen).unwrap()
        });
        let (mut writer, upload) = local(port).start_upload("/dbs/shop/bulk").unwrap();
        writer.chunk(b"one\n").unwrap();
        let mut resp = upload.response().unwrap();
        assert_eq!(resp.status, 200);
        let mut line = String::new();
        resp.body.read_line(&mut line).unwrap();
        assert_eq!(line, "got one\n");
        writer.chunk(b"two\n").unwrap();
        writer.finish().unwrap();
        let mut rest = String::new();
        resp.body.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "got two\n");
        let request = server.join().unwrap();
        assert!(
            request.starts_with("POST /dbs/shop/bulk HTTP/1.1\r\n"),
            "{request}"
        );
        let head = request.to_ascii_lowercase();
        assert!(head.contains("transfer-encoding: chunked\r\n"), "{request}");
        assert!(
            head.contains("content-type: application/x-ndjson\r\n"),
            "{request}"
        );
    }

    #[test]
    fn an_upload_dropped_unfinished_does_not_end_its_body() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // Whatever comes up to the end of the connection.
            let mut seen = Vec::new();
            let _ = read_until(&mut s, &mut seen, b"never sent");
            String::from_utf8(seen).unwrap()
        });
        let (mut writer, upload) = local(port).start_upload("/dbs/shop/bulk").unwrap();
        writer.chunk(b"one\n").unwrap();
        drop(writer);
        assert!(upload.response().is_err());
        let request = server.join().unwrap();
        // Nothing, the head, or some of the body: never the last chunk.
        let body = request.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        assert!(!body.ends_with("0\r\n\r\n"), "{request:?}");
    }
}
