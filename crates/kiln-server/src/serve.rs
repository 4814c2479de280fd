//! The listener: accepts connections within the connection limit, does the TLS
//! handshake, serves HTTP/1.1 with keep-alive, and shuts down gracefully.

use crate::app::router;
use crate::auth::{AuthError, KeyVerifier};
use crate::config::{ConfigError, ServerConfig};
use crate::conn_threads::ConnThreads;
use crate::hyper_conn::ConnContext;
use crate::metrics::Metrics;
use crate::state::{AppState, ConnInfo, SharedState};
use crate::tls::TlsError;
use axum::Router;
use kiln_cluster::{ClusterConfig, ClusterNode};
use kiln_docs::{DocError, DocStore};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("starting {threads} connection threads: {source}")]
    ConnectionThreads {
        threads: usize,
        #[source]
        source: std::io::Error,
    },
    /// A task the server waited for panicked or was cancelled.
    #[error("{what} failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error(transparent)]
    Store(#[from] DocError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    #[error(transparent)]
    Cluster(#[from] kiln_cluster::ClusterError),
}

/// A server running on the current tokio runtime.
pub struct RunningServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    accept_loop: tokio::task::JoinHandle<()>,
    connections: Arc<Semaphore>,
    max_connections: u32,
    state: SharedState,
    grace: Duration,
    /// Kept until the connections have finished: dropping them ends their threads.
    conn_threads: Option<Arc<ConnThreads>>,
}

impl RunningServer {
    /// Opens the data directory and starts listening.
    pub async fn start(config: ServerConfig) -> Result<RunningServer, ServeError> {
        config.check_security()?;
        config.check_limits()?;
        config.check_cluster()?;
        let tls = tls_acceptor(&config)?;
        warn_when_no_api_key_exists(&config)?;
        let store = Arc::new(open_store(&config).await?);
        let listening = listen(config.bind).await?;
        // After the listener: the other nodes' messages wait in its backlog.
        let cluster = start_cluster_node(&config, &store).await?;
        let state = app_state(&config, store, cluster)?;
        start_tasks(&config, state, listening, tls)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn store(&self) -> Arc<DocStore> {
        self.state.store.clone()
    }

    /// Stops accepting, lets in-flight requests finish (up to the grace period),
    /// then flushes and closes every database.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.shutdown.send(true);
        let _ = self.accept_loop.await;
        // Changes connections left the HTTP pool when they upgraded: end them here.
        self.state.hubs.stop_all();
        // Raft's tasks hold the store (its state machine applies to it).
        if let Some(node) = &self.state.cluster {
            node.shutdown().await;
        }
        match tokio::time::timeout(
            self.grace,
            self.connections.acquire_many(self.max_connections),
        )
        .await
        {
            Ok(_) => tracing::info!("all connections finished"),
            Err(_) => tracing::warn!(
                grace_ms = self.grace.as_millis() as u64,
                "connections still open after the grace period"
            ),
        }
        // The accept loop has ended, so this is the last holder of the threads.
        if let Some(threads) = self.conn_threads.and_then(Arc::into_inner) {
            let handles = threads.stop();
            let joined = tokio::task::spawn_blocking(move || {
                for h in handles {
                    let _ = h.join();
                }
            });
            if tokio::time::timeout(self.grace, joined).await.is_err() {
                tracing::warn!("connection threads still running after the grace period");
            }
        }
        let mut store = self.state.store.clone();
        drop(self.state);
        // Writes still running on blocking threads hold the store; give them the
        // grace period, then close (or leave closing to the last holder).
        let deadline = tokio::time::Instant::now() + self.grace;
        loop {
            match Arc::try_unwrap(store) {
                Ok(owned) => {
                    tokio::task::spawn_blocking(move || owned.close())
                        .await
                        .map_err(|source| ServeError::Task {
                            what: "closing the databases",
                            source,
                        })??;
                    tracing::info!("databases flushed and closed");
                    return Ok(());
                }
                Err(shared) if tokio::time::Instant::now() < deadline => {
                    store = shared;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(_) => {
                    tracing::warn!("the store is still in use; it closes when released");
                    return Ok(());
                }
            }
        }
    }
}

/// The TLS acceptor of `config.tls` (`None`: plain HTTP).
fn tls_acceptor(config: &ServerConfig) -> Result<Option<tokio_rustls::TlsAcceptor>, ServeError> {
    Ok(match &config.tls {
        Some(t) => Some(tokio_rustls::TlsAcceptor::from(crate::tls::server_config(
            t,
        )?)),
        None => None,
    })
}

/// With authentication on and no client CA, an API key is the only way in: until
/// one is created no client can authenticate, which the log says at start.
fn warn_when_no_api_key_exists(config: &ServerConfig) -> Result<(), ServeError> {
    if config.require_auth
        && config
            .tls
            .as_ref()
            .is_none_or(|t| t.client_ca_pem.is_none())
    {
        let keys = crate::auth::list_api_keys(&config.data_dir)?;
        if keys.is_empty() {
            tracing::warn!("authentication is on but no API key exists yet: create one with `kiln api-key create`");
        }
    }
    Ok(())
}

/// Opens the data directory's databases (on a blocking thread: it reads their files).
async fn open_store(config: &ServerConfig) -> Result<DocStore, ServeError> {
    let data_dir = config.data_dir.clone();
    let mut docs = config.docs.clone();
    if config.cluster.is_some() {
        // Staged blobs expire at the leader's time, through the log.
        docs.expire_staged_at_open = false;
    }
    Ok(
        tokio::task::spawn_blocking(move || DocStore::open(&data_dir, docs))
            .await
            .map_err(|source| ServeError::Task {
                what: "opening the data directory",
                source,
            })??,
    )
}

/// The bound listener and its address (the port chosen when `bind` asked for 0).
struct Listening {
    listener: TcpListener,
    local_addr: SocketAddr,
}

async fn listen(bind: SocketAddr) -> Result<Listening, ServeError> {
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|source| ServeError::Bind { addr: bind, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr: bind, source })?;
    Ok(Listening {
        listener,
        local_addr,
    })
}

/// The state every request is served with, around the opened store.
/// This server's node of its cluster (Raft's log under `<data>/cluster/raft`).
async fn start_cluster_node(
    config: &ServerConfig,
    store: &Arc<DocStore>,
) -> Result<Option<Arc<ClusterNode>>, ServeError> {
    let Some(settings) = &config.cluster else {
        return Ok(None);
    };
    let raft_dir = config.data_dir.join("cluster").join("raft");
    let mut cluster = ClusterConfig::new(settings.node_id, settings.members.clone(), raft_dir);
    cluster.storage = config.docs.storage.clone();
    cluster.storage.journal_dir = None;
    cluster.joining = settings.joining;
    cluster.election_timeout_min_ms = settings.election_timeout_ms;
    cluster.election_timeout_max_ms = settings.election_timeout_ms * 2;
    cluster.heartbeat_interval_ms = (settings.election_timeout_ms / 4).max(1);
    cluster.snapshot_every_entries = settings.snapshot_every_entries;
    cluster.write_timeout_ms = settings.write_timeout_ms;
    cluster.entries_kept_after_snapshot = settings.snapshot_every_entries.min(1_000);
    cluster.security = peer_security(config, settings)?;
    // The cluster's API keys, saved on every node through the log.
    cluster.api_keys = Some(Arc::new(crate::auth::KeyFileStore {
        data_dir: config.data_dir.clone(),
    }));
    let node = ClusterNode::start(
        store.clone(),
        cluster,
        Some(crate::routes::cluster::classifier()),
    )
    .await?;
    tracing::info!(
        node_id = settings.node_id,
        members = ?settings.members,
        "cluster node started"
    );
    Ok(Some(Arc::new(node)))
}

/// TLS to the other nodes when this one serves TLS (checked against
/// `--cluster-ca`), and the cluster key.
fn peer_security(
    config: &ServerConfig,
    settings: &crate::config::ClusterSettings,
) -> Result<kiln_cluster::network::PeerSecurity, ServeError> {
    let tls = match (&config.tls, &settings.peer_ca_pem) {
        (Some(_), Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            crate::tls::add_ca_certs(&mut roots, ca)?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let client = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(crate::tls::TlsError::Setup)?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Some(Arc::new(client))
        }
        _ => None,
    };
    Ok(kiln_cluster::network::PeerSecurity {
        tls,
        cluster_key: settings.cluster_key.as_deref().map(Arc::from),
    })
}

fn app_state(
    config: &ServerConfig,
    store: Arc<DocStore>,
    cluster: Option<Arc<ClusterNode>>,
) -> Result<SharedState, ServeError> {
    let front = crate::cross_origin::FrontLayers {
        cors_origins: config.cors_origins.clone(),
    };
    let audit = match &config.audit_log {
        Some(path) => Some(Arc::new(crate::audit::AuditLog::open(
            path,
            config.audit_log_max_bytes,
        )?)),
        None => None,
    };
    let keys = KeyVerifier::new(&config.data_dir)?.with_audit(audit.clone());
    let state = Arc::new(AppState {
        store,
        metrics: Arc::new(Metrics::default()),
        limits: config.limits,
        require_auth: config.require_auth,
        keys: Arc::new(keys),
        audit,
        changes: config.changes,
        hubs: crate::changes::hub::Hubs::default(),
        heartbeat: crate::changes::start_heartbeat(Duration::from_millis(
            config.changes.heartbeat_ms.max(1),
        )),
        // A cluster's requests pass the router's front door (a follower sends
        // writes to the leader, a read may ask for linearizability): the own loop
        // (a single server's fast path) stays off.
        // Nor with traces: the own loop makes no spans (`telemetry.rs`).
        own_http1: config.own_http1
            && front.leave_plain_answers_alone()
            && cluster.is_none()
            && !config.traces.on(),
        traces: config.traces,
        front,
        access_log: config.access_log,
        read_offload: config.read_offload,
        cluster,
    });
    // A database deleted or replaced by a cluster's log (not a request of this
    // node) ends its changes connections too: they hold it open.
    let weak = Arc::downgrade(&state);
    state.store.on_database_removed(Box::new(move |name| {
        if let Some(state) = weak.upgrade() {
            state.hubs.remove(name);
        }
    }));
    Ok(state)
}

/// Starts what runs beside the requests (the tombstone purge, when a retention is
/// set; the deletion of expired documents, unless turned off; the connection
/// threads, when asked for), then the accept loop.
fn start_tasks(
    config: &ServerConfig,
    state: SharedState,
    listening: Listening,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<RunningServer, ServeError> {
    // `check_limits` refused a count that does not fit.
    let max_connections = u32::try_from(config.limits.max_connections).unwrap_or(u32::MAX);
    let connections = Arc::new(Semaphore::new(max_connections as usize));
    let (shutdown, shutdown_rx) = watch::channel(false);
    if let Some(retention_ms) = config.changes.tombstone_retention_ms {
        tokio::spawn(purge_tombstones_hourly(
            Arc::downgrade(&state),
            retention_ms,
            shutdown_rx.clone(),
        ));
    }
    if config.expiration_check_ms > 0 {
        tokio::spawn(crate::expiration::expire_periodically(
            Arc::downgrade(&state),
            config.expiration_check_ms,
            shutdown_rx.clone(),
        ));
    }
    if state.audit.is_some() {
        tokio::spawn(watch_key_file(Arc::downgrade(&state), shutdown_rx.clone()));
    }
    let conn_threads = match config.connection_threads {
        0 => None,
        threads => {
            Some(Arc::new(ConnThreads::start(threads).map_err(|source| {
                ServeError::ConnectionThreads { threads, source }
            })?))
        }
    };
    let serving = Serving {
        tls,
        app: router(state.clone()),
        state: state.clone(),
        connections: connections.clone(),
        conn_threads: conn_threads.clone(),
    };
    let accept_loop = tokio::spawn(accept_loop(listening.listener, serving, shutdown_rx));
    tracing::info!(addr = %listening.local_addr, tls = config.tls.is_some(), auth = config.require_auth, "kiln serving");
    Ok(RunningServer {
        local_addr: listening.local_addr,
        shutdown,
        accept_loop,
        connections,
        max_connections,
        state,
        grace: Duration::from_millis(config.shutdown_grace_ms),
        conn_threads,
    })
}

/// With an audit log, a change of the key file (`kiln api-key create/revoke`) is
/// recorded within a second, not only when a request next presents a key.
async fn watch_key_file(state: std::sync::Weak<AppState>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let Some(state) = state.upgrade() else { return };
        if let Err(e) = state.keys.refresh() {
            tracing::warn!(error = %e, "could not re-read the API key file");
        }
    }
}

/// What the accept loop serves every connection with.
struct Serving {
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    state: SharedState,
    /// A permit per open connection: the connection limit.
    connections: Arc<Semaphore>,
    /// `None`: connections are served on this runtime.
    conn_threads: Option<Arc<ConnThreads>>,
}

async fn accept_loop(listener: TcpListener, serving: Serving, mut shutdown: watch::Receiver<bool>) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = serving.connections.clone().try_acquire_owned() else {
            serving.state.metrics.connections_refused.inc();
            tokio::spawn(refuse(stream, serving.tls.is_some()));
            continue;
        };
        let _ = stream.set_nodelay(true);
        serving.state.metrics.connections_total.inc();
        let accepted = Accepted {
            tls: serving.tls.clone(),
            parts: ConnParts {
                peer,
                app: serving.app.clone(),
                state: serving.state.clone(),
                shutdown: shutdown.clone(),
            },
            permit,
        };
        start_connection(stream, accepted, serving.conn_threads.as_ref());
    }
}

/// A connection accepted under the limit, not served yet.
struct Accepted {
    tls: Option<tokio_rustls::TlsAcceptor>,
    parts: ConnParts,
    /// Its place under the connection limit, held until the connection ends.
    permit: OwnedSemaphorePermit,
}

/// What a connection's `ConnContext` is made of, but for whether the client showed
/// a certificate (known after the TLS handshake).
struct ConnParts {
    peer: SocketAddr,
    app: Router,
    state: SharedState,
    shutdown: watch::Receiver<bool>,
}

impl ConnParts {
    fn into_context(
        self,
        client_certificate: Option<Arc<str>>,
        read_timeout: Duration,
    ) -> ConnContext {
        ConnContext {
            info: ConnInfo {
                peer: self.peer,
                client_certificate,
            },
            app: self.app,
            state: self.state,
            header_read_timeout: read_timeout,
            shutdown: self.shutdown,
        }
    }
}

/// Serves the connection on this runtime, or on one of the connection threads.
fn start_connection(
    stream: TcpStream,
    accepted: Accepted,
    conn_threads: Option<&Arc<ConnThreads>>,
) {
    let Some(threads) = conn_threads else {
        tokio::spawn(accepted.serve(stream));
        return;
    };
    let peer = accepted.parts.peer;
    // The socket leaves this runtime's reactor and joins its thread's.
    match stream.into_std() {
        Ok(stream) => threads.serve(move || async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => accepted.serve(stream).await,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "a connection could not join its thread")
                }
            }
        }),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "a connection could not leave the accept loop")
        }
    }
}

impl Accepted {
    /// Serves the connection (after the TLS handshake when TLS is on), counted in
    /// `connections_open` and holding its permit until it ends.
    async fn serve(self, stream: TcpStream) {
        let open = OpenConnection::count(self.parts.state.clone());
        let read_timeout = Duration::from_millis(self.parts.state.limits.request_read_timeout_ms);
        match self.tls {
            None => serve_connection(stream, self.parts.into_context(None, read_timeout)).await,
            Some(acceptor) => serve_over_tls(stream, acceptor, self.parts, read_timeout).await,
        }
        drop(open);
        drop(self.permit);
    }
}

/// The TLS handshake within `read_timeout`, then the connection; a client speaking
/// plain HTTP gets an answer it can read instead.
async fn serve_over_tls(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    parts: ConnParts,
    read_timeout: Duration,
) {
    if speaks_plain_http(&stream, read_timeout).await {
        answer_plain_http_on_tls_port(stream).await;
        return;
    }
    let peer = parts.peer;
    match tokio::time::timeout(read_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls_stream)) => {
            // The client's own certificate comes first in what it presented.
            let client_certificate = tls_stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|cert| Arc::from(crate::auth::certificate_thumbprint(cert)));
            serve_connection(
                tls_stream,
                parts.into_context(client_certificate, read_timeout),
            )
            .await
        }
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

/// A connection counted in `connections_open` until dropped (also when its task
/// panics or is cancelled).
struct OpenConnection(SharedState);

impl OpenConnection {
    fn count(state: SharedState) -> OpenConnection {
        state.metrics.connections_open.inc();
        OpenConnection(state)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.metrics.connections_open.dec();
    }
}

/// Over the connection limit: a plain-HTTP client gets a 429 it can read; a TLS
/// client only sees the connection close (answering would need a handshake).
async fn refuse(stream: TcpStream, tls: bool) {
    if !tls {
        let mut e = crate::error::ApiError::new(
            crate::error::ErrorCode::TooManyConnections,
            "the server is at its connection limit; retry later",
        );
        e.retry_after_s = Some(1);
        answer_and_close(stream, e).await;
    }
}

/// An answer sent before any request was read (the connection limit, plain HTTP
/// on the TLS port), rendered as every other answer is (a request id made for it,
/// the JSON error), then the connection closes.
async fn answer_and_close(mut stream: TcpStream, e: crate::error::ApiError) {
    use axum::response::IntoResponse;
    let mut out = Vec::new();
    let id = crate::observe::RequestId::new();
    crate::http1::answer::response(&mut out, e.into_response(), &id, true).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
}

/// True when a client on the TLS port starts with what looks like a plain HTTP
/// request line (an ASCII method) rather than a TLS record (a handshake starts
/// with byte 0x16).
async fn speaks_plain_http(stream: &TcpStream, wait: Duration) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, stream.peek(&mut first)).await,
        Ok(Ok(1)) if first[0].is_ascii_uppercase()
    )
}

/// The answer curl and browsers can read instead of a failed handshake ("Received
/// HTTP/0.9"): a 400 in plain HTTP that says to use https.
async fn answer_plain_http_on_tls_port(stream: TcpStream) {
    let e = crate::error::ApiError::new(
        crate::error::ErrorCode::BadRequest,
        "this port speaks HTTPS: use an https:// URL",
    );
    answer_and_close(stream, e).await;
}

async fn serve_connection<S>(io: S, cx: ConnContext)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if cx.state.own_http1 {
        crate::http1::serve_connection(io, cx).await
    } else {
        crate::hyper_conn::serve_with_hyper(io, cx).await
    }
}

/// The tombstone retention rule: once an hour, every database forgets the deletes
/// older than `retention_ms` that no registered consumer still needs. In a
/// cluster the leader proposes the purge through the log (the age counted at
/// its time, `routes::cluster::purge_tombstones`) and the other nodes purge
/// nothing of their own: every node forgets the same deletes.
async fn purge_tombstones_hourly(
    state: std::sync::Weak<AppState>,
    retention_ms: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut timer = tokio::time::interval(Duration::from_secs(3_600));
    loop {
        tokio::select! {
            _ = timer.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(state) = state.upgrade() else { return };
        let leads = state
            .cluster
            .as_ref()
            .map(|node| node.status().leader == Some(node.node_id()));
        if leads == Some(false) {
            continue;
        }
        for db in state.store.databases() {
            let name = db.name().to_string();
            if leads == Some(true) {
                match crate::routes::cluster::purge_tombstones(
                    &state,
                    &db,
                    None,
                    Some(retention_ms),
                )
                .await
                {
                    Ok(out) if out.purged > 0 => {
                        tracing::info!(database = %name, purged = out.purged, remaining = out.remaining, "tombstones purged by the retention rule")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(database = %name, error = %e.code, message = %e.message, "tombstone purge failed")
                    }
                }
                continue;
            }
            let rule = kiln_docs::PurgeRule {
                before_sequence: None,
                older_than_ms: Some(retention_ms),
            };
            match tokio::task::spawn_blocking(move || db.purge_tombstones(rule)).await {
                Ok(Ok(out)) if out.purged > 0 => {
                    tracing::info!(database = %name, purged = out.purged, remaining = out.remaining, "tombstones purged by the retention rule")
                }
                Ok(Err(e)) => {
                    tracing::warn!(database = %name, error = %e, "tombstone purge failed")
                }
                _ => {}
            }
        }
    }
}
