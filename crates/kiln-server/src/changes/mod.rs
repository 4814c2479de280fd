//! The changes feed over WebSocket: per-database hubs, connections, and the one
//! shared heartbeat timer.

pub mod connection;
pub mod hub;
pub mod subscription_worker;

use std::time::Duration;
use tokio::sync::watch;

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
