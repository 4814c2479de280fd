//! W8 and W9 of shared/BENCHMARKS.md: the document server under load. The server
//! runs as a child process (`kiln serve`); this process is the load generator: a
//! minimal HTTP/1.1 keep-alive client per connection over raw sockets, on one
//! thread, so that it costs the server as little CPU as possible on a small machine.

use crate::{procstat, stats};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A `kiln serve` child on a free loopback port, stopped (SIGTERM, then waited
/// for) when dropped.
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Starts `kiln serve` on `data_dir` with `args` added to its command line.
    pub fn start_with(data_dir: &Path, args: &[&str]) -> io::Result<ServerProcess> {
        ServerProcess::start_at(free_loopback_addr()?, data_dir, args, true)
    }

    /// Starts `kiln serve` on `addr` (a cluster node's address is in every node's
    /// `--cluster` list before it starts). `fresh_log`: truncate the log beside the
    /// data directory, else add to it (a node restarted after a kill keeps the
    /// lines of its first life).
    pub fn start_at(
        addr: SocketAddr,
        data_dir: &Path,
        args: &[&str],
        fresh_log: bool,
    ) -> io::Result<ServerProcess> {
        let exe: PathBuf = crate::kiln_exe()?;
        // The server's log goes beside its data directory, out of the table's way;
        // what this start wrote is quoted if the server fails to start.
        let log_path = data_dir.with_extension("serve.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .truncate(false)
            .open(&log_path)?;
        if fresh_log {
            log.set_len(0)?;
        }
        let log_start = log.metadata()?.len() as usize;
        let child = Command::new(exe)
            .args(["serve", "--bind", &addr.to_string(), "--data-dir"])
            .arg(data_dir)
            .args(args)
            .args(
                std::env::var("KILN_BENCH_SERVE_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let mut server = ServerProcess { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read(&log_path).unwrap_or_default();
                let log = String::from_utf8_lossy(log.get(log_start..).unwrap_or_default());
                return Err(io::Error::other(format!(
                    "kiln serve exited at start ({status}): {}",
                    log.trim()
                )));
            }
            if blocking_request(addr, "GET", "/health", b"")
                .map(|(s, _)| s == 200)
                .unwrap_or(false)
            {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(
                    "kiln serve did not answer /health within 30 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A loopback address with a port free at the time of the call.
pub fn free_loopback_addr() -> io::Result<SocketAddr> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(([127, 0, 0, 1], port).into())
}

impl ServerProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// kill -9: SIGKILL, then waited for (the process is gone when this returns;
    /// it had no chance to stop cleanly). Its exit status: killed by signal 9,
    /// unless it had exited on its own before.
    pub fn kill9(mut self) -> io::Result<std::process::ExitStatus> {
        self.child.kill()?;
        self.child.wait()
        // Drop: `terminate` sees the status and signals nothing.
    }

    /// CPU time (user + system, all threads) the server process has used so far.
    pub fn cpu_seconds(&self) -> io::Result<f64> {
        procstat::cpu_seconds(self.child.id())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(30));
    }
}

/// Stops a child server: SIGTERM, up to `grace` for it to exit on its own (a clean
/// shutdown), then SIGKILL; always waited for.
pub fn terminate(child: &mut Child, grace: Duration) {
    // A child already waited for (`kill9`) may have its pid reused: no signal.
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: kill(2) on our own child's pid, not yet waited for (a zombie at worst).
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// One request on a fresh connection (setup and health checks), on the load
/// generator's raw [`Conn`]: the setup needs no second HTTP client in this crate.
pub fn blocking_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> io::Result<(u16, Vec<u8>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut conn = Conn::connect(addr).await?;
        conn.send(&request_bytes(method, path, &[], body)).await
    })
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nhost: kiln\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A keep-alive HTTP/1.1 connection that understands `content-length` bodies (all
/// the server sends for these routes) and bodiless 304s.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 << 10),
        })
    }

    /// Sends one request and reads its response: (status, body).
    pub async fn send(&mut self, request: &[u8]) -> io::Result<(u16, Vec<u8>)> {
        self.stream.write_all(request).await?;
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head =
                    std::str::from_utf8(&self.buf[..end]).map_err(|_| bad("non-UTF-8 header"))?;
                let status: u16 = head
                    .get(9..12)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("no status line"))?;
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                let total = end + 4 + len;
                while self.buf.len() < total {
                    self.fill().await?;
                }
                let body = self.buf[end + 4..total].to_vec();
                self.buf.drain(..total);
                return Ok((status, body));
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 << 10];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Result of a load run: requests, seconds, sorted latencies, statuses seen.
pub struct LoadResult {
    pub requests: u64,
    pub seconds: f64,
    pub latencies_us: Vec<u32>,
    pub unexpected: Vec<(u16, String)>,
    /// CPU time (user + system) of the load generator's thread during the load.
    pub load_generator_cpu_seconds: f64,
}

impl LoadResult {
    pub fn per_sec(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    pub fn quantile_ms(&self, q: f64) -> f64 {
        stats::quantile(&self.latencies_us, q).map_or(f64::NAN, |us| us as f64 / 1e3)
    }
}

/// Runs `connections` connections, each sending `per_connection` requests made by
/// `make(connection, i)`, expecting `expect_status`.
pub fn run_load(
    addr: SocketAddr,
    connections: usize,
    per_connection: usize,
    expect_status: u16,
    make: impl Fn(usize, usize) -> Vec<u8> + Send + Sync + 'static,
    progress: &indicatif::ProgressBar,
) -> io::Result<LoadResult> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let make = std::sync::Arc::new(make);
    rt.block_on(async {
        let mut conns = Vec::with_capacity(connections);
        for _ in 0..connections {
            conns.push(Conn::connect(addr).await?);
        }
        let start = Instant::now();
        let cpu_start = procstat::thread_cpu_seconds();
        let tasks: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(c, mut conn)| {
                let make = make.clone();
                let pb = progress.clone();
                tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(per_connection);
                    let mut unexpected = Vec::new();
                    for i in 0..per_connection {
                        let req = make(c, i);
                        let t = Instant::now();
                        let (status, body) = conn.send(&req).await?;
                        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        if status != expect_status && unexpected.len() < 5 {
                            unexpected.push((
                                status,
                                String::from_utf8_lossy(&body).chars().take(200).collect(),
                            ));
                        }
                        if i % 64 == 63 {
                            pb.inc(64);
                        }
                    }
                    Ok::<_, io::Error>((lat, unexpected))
                })
            })
            .collect();
        let mut latencies_us = Vec::with_capacity(connections * per_connection);
        let mut unexpected = Vec::new();
        for t in tasks {
            let (lat, unexp) = t.await.map_err(io::Error::other)??;
            latencies_us.extend(lat);
            unexpected.extend(unexp);
        }
        let seconds = start.elapsed().as_secs_f64();
        let load_generator_cpu_seconds = procstat::thread_cpu_seconds() - cpu_start;
        latencies_us.sort_unstable();
        Ok(LoadResult {
            requests: latencies_us.len() as u64,
            seconds,
            latencies_us,
            unexpected,
            load_generator_cpu_seconds,
        })
    })
}
