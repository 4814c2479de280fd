//! `kiln-server`: HTTP/1.1 and HTTPS in front of `kiln-docs`. A thin adapter: every
//! rule about documents lives in `kiln-docs`; this crate maps requests to calls and
//! errors to statuses, enforces the limits, authenticates, and counts.

pub mod access;
mod app;
pub mod audit;
pub mod auth;
mod changes;
mod config;
mod conn_threads;
mod cross_origin;
mod doc_request;
pub mod error;
mod expiration;
mod file_body;
mod http1;
mod http_util;
mod hyper_conn;
mod metrics;
mod observe;
mod query_params;
mod read_offload;
mod route_table;
mod routes;
mod serve;
mod state;
pub mod telemetry;
pub mod tls;

pub use config::{
    default_connection_threads, ChangesConfig, ClusterSettings, Limits, ServerConfig, TlsConfig,
    DEFAULT_EXPIRATION_CHECK_MS, DEFAULT_MAX_ATTACHMENT_BYTES,
};
pub use observe::AccessLog;
pub use read_offload::ReadOffload;
pub use route_table::{route_permissions, RouteRule, Rule};
pub use serve::{RunningServer, ServeError};

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully.
/// `on_ready` is called once the data directory is locked and open and the
/// address is bound (so that "serving" is never said of a server that then fails
/// to start); `on_stopped` once the databases are flushed and closed.
pub async fn run_until_signal(
    config: ServerConfig,
    on_ready: impl FnOnce(&RunningServer),
) -> Result<(), ServeError> {
    let server = RunningServer::start(config).await?;
    on_ready(&server);
    wait_for_signal().await;
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    server.shutdown().await
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {},
                    _ = term.recv() => {},
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
