//! Connection threads: each runs a single-threaded tokio runtime and serves the
//! connections it is given from accept to close. On the multi-threaded runtime a
//! busy connection's task moved between workers and woke idle ones to steal work:
//! under W9 a tenth of the server's CPU went to parking, unparking and futexes, and
//! one worker thread alone was already faster than two. With a runtime per thread a
//! connection's reads, handling and writes stay on one thread, and the threads
//! still use every core (the accept loop gives each new connection to the thread
//! serving the fewest).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A connection to serve: called on its thread, inside that thread's runtime, so
/// that its socket registers with that runtime's reactor.
pub(crate) type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

struct ConnThread {
    jobs: mpsc::UnboundedSender<Job>,
    handle: std::thread::JoinHandle<()>,
    /// Connections this thread serves now.
    serving: Arc<AtomicUsize>,
}

/// One connection counted as served by a thread until dropped (also when the
/// connection's task panics or is cancelled).
struct Serving(Arc<AtomicUsize>);

impl Serving {
    fn count(serving: Arc<AtomicUsize>) -> Serving {
        serving.fetch_add(1, Relaxed);
        Serving(serving)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

pub(crate) struct ConnThreads {
    threads: Vec<ConnThread>,
}

impl ConnThreads {
    pub fn start(count: usize) -> std::io::Result<ConnThreads> {
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let (jobs, mut incoming) = mpsc::unbounded_channel::<Job>();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = std::thread::Builder::new()
                .name(format!("kiln-conn-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        while let Some(job) = incoming.recv().await {
                            tokio::spawn(job());
                        }
                    });
                    // The server is gone: connections still open here end with the
                    // runtime (shutdown has waited for them within its grace).
                })?;
            threads.push(ConnThread {
                jobs,
                handle,
                serving: Arc::new(AtomicUsize::new(0)),
            });
        }
        Ok(ConnThreads { threads })
    }

    /// Ends the threads: each stops taking connections, drops its runtime (ending
    /// the connections it still serves) and exits. Returns them, to be joined.
    pub fn stop(self) -> Vec<std::thread::JoinHandle<()>> {
        self.threads
            .into_iter()
            .map(|t| {
                drop(t.jobs);
                t.handle
            })
            .collect()
    }

    /// Serves `connection` on the thread with the fewest connections. `connection`
    /// is called on that thread; what it returns runs there to the end.
    pub fn serve<F, Fut>(&self, connection: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let thread = self
            .threads
            .iter()
            .min_by_key(|t| t.serving.load(Relaxed))
            .expect("at least one connection thread");
        let serving = Serving::count(thread.serving.clone());
        let job: Job = Box::new(move || {
            Box::pin(async move {
                connection().await;
                drop(serving);
            })
        });
        if thread.jobs.send(job).is_err() {
            // Only after the thread's runtime failed: nothing serves it any more.
            tracing::error!("a connection thread is gone; the connection is dropped");
        }
    }
}
