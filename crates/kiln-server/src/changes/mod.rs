//! The changes feed over WebSocket: per-database hubs, connections, and the one
//! shared heartbeat timer.

pub mod connection;
pub mod hub;
pub mod subscription_worker;

use axum::extract::ws::{Message, WebSocket};
use std::time::Duration;
use tokio::sync::watch;

/// How long a server that sent its close frame waits for the client's.
const CLOSE_HANDSHAKE_WAIT: Duration = Duration::from_secs(1);

/// The rest of the closing handshake once the server's close frame is sent
/// (RFC 6455 7.1.1): reads, and drops, what the client still sends until its own
/// close frame, for at most `CLOSE_HANDSHAKE_WAIT`. Dropping the socket at once,
/// with an acknowledgment the client sent meanwhile unread, made the kernel reset
/// the connection, and a client could lose the close frame (and its code: 4004
/// for a deleted subscription) to the reset.
pub(crate) async fn finish_closing(socket: &mut WebSocket) {
    let client_closed = async {
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, Message::Close(_)) {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_HANDSHAKE_WAIT, client_closed).await;
}

/// Starts the server's single heartbeat timer: every `interval` it publishes a tick
/// that every idle changes connection answers with a heartbeat frame. Ends when the
/// last receiver is gone.
pub fn start_heartbeat(interval: Duration) -> watch::Receiver<u64> {
    let (tick, rx) = watch::channel(0u64);
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.tick().await; // the first tick is immediate
        let mut n = 0u64;
        loop {
            timer.tick().await;
            n += 1;
            if tick.send(n).is_err() {
                return;
            }
        }
    });
    rx
}
