//! One connection served by hyper and the router, and what serving a connection
//! needs besides its socket (`ConnContext`). Both `serve.rs`, which starts each
//! connection on hyper or on the own HTTP/1.1 loop, and the own loop, which hands a
//! connection to hyper at its first request of another kind, come here; this
//! imports neither, so that neither imports the other.

use crate::state::{ConnInfo, SharedState};
use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

/// What serving a connection needs besides its socket.
pub(crate) struct ConnContext {
    pub info: ConnInfo,
    pub app: Router,
    pub state: SharedState,
    pub header_read_timeout: Duration,
    pub shutdown: watch::Receiver<bool>,
}

/// Serves a connection with hyper (see `http1::serve_connection` for which
/// connections start on the own loop).
pub(crate) async fn serve_with_hyper<S>(io: S, cx: ConnContext)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ConnContext {
        info,
        app,
        state: _,
        header_read_timeout,
        mut shutdown,
    } = cx;
    let peer = info.peer;
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(info.clone());
        tower::ServiceExt::oneshot(app.clone(), req.map(Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true)
        // A client may shut down its sending side once its request is sent (a bulk
        // upload does) and still read the answer streaming back.
        .half_close(true)
        .serve_connection(TokioIo::new(io), service)
        // A changes-feed WebSocket takes the connection over (it then lives in its
        // own task, outside this connection's permit; see `routes/changes.rs`).
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
