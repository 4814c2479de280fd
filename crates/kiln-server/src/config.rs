//! What `kiln serve` is told: where, how securely, and within which limits.

use crate::cross_origin::InvalidOrigin;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Clone)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    pub bind: SocketAddr,
    pub tls: Option<TlsConfig>,
    /// Every request (but `GET /health`) must carry a valid API key or come over a
    /// connection with a verified client certificate.
    pub require_auth: bool,
    /// Allow a non-loopback address without TLS and authentication.
    pub unsecured: bool,
    pub limits: Limits,
    pub docs: kiln_docs::DocsOptions,
    pub changes: ChangesConfig,
    /// How long a graceful shutdown waits for in-flight requests.
    pub shutdown_grace_ms: u64,
    /// Serve one document's GET, PUT and POST with the server's own HTTP/1.1 loop
    /// (`http1/`); `false` serves every request through hyper, as before it (kept
    /// to compare the two in one build).
    pub own_http1: bool,
    /// Threads that serve connections, each with a single-threaded runtime of its
    /// own (`conn_threads.rs`); 0 serves them on the runtime that started the server
    /// (a test on tokio's paused clock needs that). The default leaves a core to the
    /// engine's threads (write queue, commits, flusher): one fewer than the cores,
    /// at least one (`default_connection_threads`).
    pub connection_threads: usize,
    /// Where document GETs run: on the connection thread, moved to the blocking
    /// pool while they page-fault (`read_offload.rs`).
    pub read_offload: crate::ReadOffload,
    /// Browser origins allowed to call the API (CORS); `*` for any, empty for none.
    pub cors_origins: Vec<String>,
    /// A line per request (`observe::finished`).
    pub access_log: crate::observe::AccessLog,
    /// `--audit-log FILE`: security-relevant events, one JSON line each (`audit.rs`).
    pub audit_log: Option<PathBuf>,
    /// The audit log is rotated when it would grow past this.
    pub audit_log_max_bytes: u64,
    /// This server as a node of a cluster; `None` for a single server.
    pub cluster: Option<ClusterSettings>,
    /// Documents whose `@metadata.@expires` has passed are deleted by a check this
    /// often (and one at start), so at most this long after they expire; 0: never.
    pub expiration_check_ms: u64,
    /// Spans per request, exported and/or timed for the slow-request log
    /// (`telemetry.rs`; the layers themselves are the process's subscriber's).
    pub traces: crate::telemetry::Traces,
}

/// `kiln serve --node-id N --cluster 1=host:port,2=host:port,3=host:port`.
#[derive(Clone)]
pub struct ClusterSettings {
    pub node_id: u64,
    /// Every voter of a new cluster, by id: the HTTP address others reach it at.
    pub members: std::collections::BTreeMap<u64, String>,
    /// This node joins a running cluster (`kiln cluster add`), instead of forming
    /// one with `members`.
    pub joining: bool,
    /// Raft's election timeout, at least (the most is twice this); heartbeats go
    /// every quarter of it. A shorter one fails over sooner and campaigns more
    /// often on a slow network.
    pub election_timeout_ms: u64,
    /// A snapshot every this many entries; the log before it is purged, but for
    /// up to 1,000 entries (at most this many).
    pub snapshot_every_entries: u64,
    /// How long a write waits to be committed before it is answered `no_quorum`.
    pub write_timeout_ms: u64,
    /// The cluster's shared secret: every Raft message carries it, and one
    /// without it is refused. Required with `--auth`.
    pub cluster_key: Option<String>,
    /// PEM CA certificate(s) the other nodes' TLS certificates chain to: with
    /// TLS, the nodes reach each other over https and check each other.
    pub peer_ca_pem: Option<PathBuf>,
}

impl std::fmt::Debug for ClusterSettings {
    // Never the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSettings")
            .field("node_id", &self.node_id)
            .field("members", &self.members)
            .field("cluster_key", &self.cluster_key.as_ref().map(|_| "<set>"))
            .field("peer_ca_pem", &self.peer_ca_pem)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
pub struct TlsConfig {
    pub cert_chain_pem: PathBuf,
    pub private_key_pem: PathBuf,
    /// CA certificates whose client certificates authenticate a connection.
    pub client_ca_pem: Option<PathBuf>,
}

/// The WebSocket changes feed.
#[derive(Debug, Clone, Copy)]
pub struct ChangesConfig {
    /// An idle subscriber gets a heartbeat this often (one shared timer).
    pub heartbeat_ms: u64,
    /// Changes queued toward one connection at most; a reader that lets it fill is
    /// disconnected as a slow consumer.
    pub subscriber_queue_len: usize,
    pub max_subscriptions_per_connection: usize,
    /// A reader that takes no frame for this long is closed as a slow consumer.
    pub send_timeout_ms: u64,
    /// Open changes WebSockets at most (they do not count in `max_connections`: an
    /// upgraded connection leaves the HTTP connection pool).
    pub max_connections: usize,
    /// Tombstones older than this are purged once an hour (as far as the registered
    /// consumers allow); `None` keeps them until purged by hand.
    pub tombstone_retention_ms: Option<u64>,
}

impl Default for ChangesConfig {
    fn default() -> Self {
        ChangesConfig {
            heartbeat_ms: 5_000,
            subscriber_queue_len: 4_096,
            max_subscriptions_per_connection: 256,
            send_timeout_ms: 10_000,
            max_connections: 20_000,
            tombstone_retention_ms: Some(14 * 24 * 3_600_000),
        }
    }
}

/// Limits on what a client may send; each has its own clear error when crossed.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Request bodies above this get 413 `body_too_large`.
    pub max_body_bytes: usize,
    /// Listing pages above this get 400 `page_size_too_large`.
    pub max_page_size: usize,
    /// Connections beyond this get 429 `too_many_connections` and are closed.
    pub max_connections: usize,
    /// A request whose headers or body take longer than this to arrive gets 408
    /// `request_timeout` (or, for headers, a closed connection).
    pub request_read_timeout_ms: u64,
    /// Default page size of listings.
    pub default_page_size: usize,
    /// An attachment upload (PUT of an attachment, `POST /dbs/{db}/attachments`)
    /// above this many bytes gets 413 `attachment_too_large`: at once when its
    /// Content-Length says so, else when the streamed body passes it. 0: no cap.
    pub max_attachment_bytes: u64,
}

/// The default `max_attachment_bytes`, 4 GiB: far above the files a document
/// database is usually given, while one runaway or hostile upload cannot fill the
/// disk every database of the data directory journals to.
pub const DEFAULT_MAX_ATTACHMENT_BYTES: u64 = 4 << 30;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 << 20,
            max_page_size: 1024,
            max_connections: 1024,
            request_read_timeout_ms: 30_000,
            default_page_size: 100,
            max_attachment_bytes: DEFAULT_MAX_ATTACHMENT_BYTES,
        }
    }
}

/// How often a server deletes the documents that expired (`ServerConfig::
/// expiration_check_ms`): a minute, as late as an expired document may linger.
pub const DEFAULT_EXPIRATION_CHECK_MS: u64 = 60_000;

/// One thread per core but one, at least one. On 2 cores (`kiln bench`, medians
/// of alternated runs, docs/benchmarks-history.md, "Round 2, ninth pass"): W8 55-58k PUTs/s with one
/// connection thread, 54-56k with two, 48-50k on the shared runtime; W9 147-158k
/// GETs/s with one, 125-129k with two, 133-144k on the shared runtime.
pub fn default_connection_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .saturating_sub(1)
        .max(1)
}

impl ServerConfig {
    pub fn new(data_dir: impl Into<PathBuf>, bind: SocketAddr) -> ServerConfig {
        ServerConfig {
            data_dir: data_dir.into(),
            bind,
            tls: None,
            require_auth: false,
            unsecured: false,
            limits: Limits::default(),
            docs: kiln_docs::DocsOptions::default(),
            changes: ChangesConfig::default(),
            shutdown_grace_ms: 10_000,
            own_http1: true,
            connection_threads: default_connection_threads(),
            read_offload: crate::ReadOffload::Auto,
            cors_origins: Vec::new(),
            access_log: crate::observe::AccessLog::Off,
            audit_log: None,
            audit_log_max_bytes: crate::audit::DEFAULT_AUDIT_LOG_MAX_BYTES,
            cluster: None,
            expiration_check_ms: DEFAULT_EXPIRATION_CHECK_MS,
            traces: crate::telemetry::Traces::default(),
        }
    }

    /// Refuses to expose data in the clear: off loopback, TLS and authentication are
    /// required unless `unsecured` says otherwise.
    pub fn check_security(&self) -> Result<(), ConfigError> {
        if self.bind.ip().is_loopback() || self.unsecured {
            return Ok(());
        }
        let mut missing = Vec::new();
        if self.tls.is_none() {
            missing.push("TLS (--tls-cert and --tls-key)");
        }
        if !self.require_auth {
            missing.push("authentication (--auth)");
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Insecure {
            bind: self.bind,
            missing: missing.join(" and "),
        })
    }

    pub fn check_limits(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        if l.max_connections == 0 || l.max_page_size == 0 || l.max_body_bytes == 0 {
            return Err(ConfigError::Limit("limits must be positive"));
        }
        if l.default_page_size == 0 || l.default_page_size > l.max_page_size {
            return Err(ConfigError::Limit(
                "the default page size must be 1..=max_page_size",
            ));
        }
        if l.request_read_timeout_ms == 0 {
            return Err(ConfigError::Limit(
                "the request read timeout must be positive",
            ));
        }
        if u32::try_from(l.max_connections).is_err() {
            return Err(ConfigError::Limit("max_connections is too large"));
        }
        Ok(crate::cross_origin::check_origins(&self.cors_origins)?)
    }

    /// A node must be one of the cluster's members; with `--auth` its Raft messages
    /// need the cluster key, and with TLS the CA to check the other nodes by.
    pub fn check_cluster(&self) -> Result<(), ConfigError> {
        let Some(c) = &self.cluster else {
            return Ok(());
        };
        if !c.members.contains_key(&c.node_id) {
            return Err(ConfigError::NodeNotInCluster { node_id: c.node_id });
        }
        if self.require_auth && c.cluster_key.is_none() {
            return Err(ConfigError::ClusterKeyNeeded);
        }
        if let Some(key) = &c.cluster_key {
            if key.len() < MIN_CLUSTER_KEY_CHARS || !key.chars().all(|ch| ch.is_ascii_graphic()) {
                return Err(ConfigError::WeakClusterKey);
            }
        }
        if self.tls.is_some() && c.peer_ca_pem.is_none() {
            return Err(ConfigError::ClusterCaNeeded);
        }
        Ok(())
    }
}

/// The shortest cluster key accepted (a hex key of 128 bits).
pub const MIN_CLUSTER_KEY_CHARS: usize = 32;

/// A server configuration that cannot start: what is wrong, in the words of the
/// flag to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "refusing to listen on {bind} (not a loopback address) without {missing}; \
         pass --unsecured to do it anyway"
    )]
    Insecure { bind: SocketAddr, missing: String },
    #[error("{0}")]
    Limit(&'static str),
    #[error(
        "a cluster node with --auth needs --cluster-key-file: the nodes' Raft messages \
         carry that key, and the others refuse a message without it"
    )]
    ClusterKeyNeeded,
    #[error(
        "the cluster key must be at least {MIN_CLUSTER_KEY_CHARS} printable characters \
         without spaces (e.g. `openssl rand -hex 32`)"
    )]
    WeakClusterKey,
    #[error(
        "a cluster node with TLS needs --cluster-ca: the CA certificate(s) the other \
         nodes' certificates chain to (the nodes reach each other over https)"
    )]
    ClusterCaNeeded,
    #[error("--cluster must name this node (--node-id {node_id})")]
    NodeNotInCluster { node_id: u64 },
    #[error(transparent)]
    CorsOrigin(#[from] InvalidOrigin),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_needs_tls_and_auth_or_unsecured() {
        let mut c = ServerConfig::new("/tmp/x", "0.0.0.0:8080".parse().unwrap());
        let e = c.check_security().unwrap_err().to_string();
        assert!(e.contains("TLS") && e.contains("authentication"), "{e}");
        c.require_auth = true;
        assert!(c.check_security().unwrap_err().to_string().contains("TLS"));
        c.tls = Some(TlsConfig {
            cert_chain_pem: "c".into(),
            private_key_pem: "k".into(),
            client_ca_pem: None,
        });
        assert!(c.check_security().is_ok());
        let mut open = ServerConfig::new("/tmp/x", "0.0.0.0:8080".parse().unwrap());
        open.unsecured = true;
        assert!(open.check_security().is_ok());
        assert!(ServerConfig::new("/tmp/x", "127.0.0.1:0".parse().unwrap())
            .check_security()
            .is_ok());
        assert!(ServerConfig::new("/tmp/x", "[::1]:0".parse().unwrap())
            .check_security()
            .is_ok());
    }

    #[test]
    fn a_cluster_node_with_auth_needs_a_strong_key_and_with_tls_a_ca() {
        let mut c = ServerConfig::new("/tmp/x", "0.0.0.0:8080".parse().unwrap());
        c.cluster = Some(ClusterSettings {
            node_id: 1,
            members: [(1, "10.0.0.1:8080".to_string())].into(),
            joining: false,
            election_timeout_ms: 400,
            snapshot_every_entries: 5_000,
            write_timeout_ms: 5_000,
            cluster_key: None,
            peer_ca_pem: None,
        });
        assert!(c.check_cluster().is_ok());
        c.require_auth = true;
        let e = c.check_cluster().unwrap_err().to_string();
        assert!(e.contains("--cluster-key-file"), "{e}");
        let settings = c.cluster.as_mut().unwrap();
        settings.cluster_key = Some("short".into());
        assert!(matches!(
            c.check_cluster(),
            Err(ConfigError::WeakClusterKey)
        ));
        c.cluster.as_mut().unwrap().cluster_key = Some("ab".repeat(16));
        assert!(c.check_cluster().is_ok());
        c.tls = Some(TlsConfig {
            cert_chain_pem: "c".into(),
            private_key_pem: "k".into(),
            client_ca_pem: None,
        });
        let e = c.check_cluster().unwrap_err().to_string();
        assert!(e.contains("--cluster-ca"), "{e}");
        c.cluster.as_mut().unwrap().peer_ca_pem = Some("ca.pem".into());
        assert!(c.check_cluster().is_ok());
        // Off loopback with TLS and --auth (so with a cluster key): allowed.
        assert!(c.check_security().is_ok());
    }
}
