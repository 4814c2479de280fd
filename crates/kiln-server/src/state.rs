//! What every request can reach: the state the router's handlers and the own
//! HTTP/1.1 loop share (`AppState`), and what a connection knows of its client
//! (`ConnInfo`). A leaf for the router (`app.rs`), the routes and the HTTP paths:
//! it names their parts (store, metrics, limits, keys, changes hubs) and imports
//! none of them, so that a handler's module needs nothing of the router's.

use crate::auth::KeyVerifier;
use crate::changes::hub::Hubs;
use crate::config::{ChangesConfig, Limits};
use crate::metrics::Metrics;
use crate::observe::AccessLog;
use kiln_docs::DocStore;
use std::sync::Arc;

pub struct AppState {
    pub store: Arc<DocStore>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub require_auth: bool,
    pub keys: Arc<KeyVerifier>,
    /// `--audit-log`: security-relevant events, one JSON line each.
    pub audit: Option<Arc<crate::audit::AuditLog>>,
    pub changes: ChangesConfig,
    /// The changes hubs, one per database with subscribers.
    pub hubs: Hubs,
    /// The shared heartbeat tick of the changes connections.
    pub heartbeat: tokio::sync::watch::Receiver<u64>,
    /// The router's front layers as configured (`cross_origin.rs`).
    pub front: crate::cross_origin::FrontLayers,
    /// `ServerConfig::own_http1`, where the front layers leave plain answers alone.
    pub own_http1: bool,
    /// `ServerConfig::access_log`.
    pub access_log: AccessLog,
    /// `ServerConfig::traces`.
    pub traces: crate::telemetry::Traces,
    /// `ServerConfig::read_offload`.
    pub read_offload: crate::ReadOffload,
    /// This node of a cluster (`ServerConfig::cluster`); `None` for a single server.
    pub cluster: Option<Arc<kiln_cluster::ClusterNode>>,
}

pub type SharedState = Arc<AppState>;

/// What the connection knows about its client; inserted into every request.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub peer: std::net::SocketAddr,
    /// The thumbprint (hex SHA-256 of its DER bytes) of the certificate the client
    /// presented, which the configured CA verified.
    pub client_certificate: Option<Arc<str>>,
}
