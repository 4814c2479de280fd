//! `kiln-server`: HTTP/1.1 and HTTPS in front of `kiln-docs`. A thin adapter: every
//! rule about documents lives in `kiln-docs`; this crate maps requests to calls and
//! errors to statuses, enforces the limits, authenticates, and counts.

mod app;
pub mod auth;
mod changes;
mod config;
mod conn_threads;
mod error;
mod http1;
mod http_util;
mod metrics;
mod routes;
mod serve;
mod tls;

pub use config::{default_connection_threads, ChangesConfig, Limits, ServerConfig, TlsConfig};
pub use serve::{RunningServer, ServeError};

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully.
pub async fn run_until_signal(config: ServerConfig) -> Result<(), ServeError> {
    let server = RunningServer::start(config).await?;
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
