//! Redis as the peer of the server workloads (W8, W9; shared/BENCHMARKS.md): a
//! throwaway `redis-server` per measurement with its append-only file synced on
//! every write (`appendonly yes`, `appendfsync always`: an acknowledged SET is on
//! disk, as an acknowledged Kiln PUT is), driven by `redis-benchmark` with the same
//! client count and 1 KiB values. Debian's redis-server and redis-benchmark are
//! used where installed; without them the Redis rows are skipped with a line.

use crate::procstat;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Value size of every SET, as W8's documents are ~1 KiB.
pub const VALUE_BYTES: usize = 1024;

/// The settings the peer runs with, printed in the JSON so the comparison can be
/// checked.
pub const SETTINGS: &str = "redis-server --appendonly yes --appendfsync always --save '' \
(a throwaway server per measurement, loopback TCP); redis-benchmark -c CONNECTIONS -d 1024 \
-r KEYSPACE -t set|get";

/// One redis-benchmark measurement.
#[derive(Debug, Clone)]
pub struct RedisResult {
    pub requests_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU time of the redis-server process per request (all its threads).
    pub server_cpu_us_per_request: f64,
    pub server_peak_rss_bytes: u64,
    pub version: String,
}

/// Whether redis-server and redis-benchmark are on the PATH.
pub fn available() -> bool {
    ["redis-server", "redis-benchmark"].iter().all(|bin| {
        Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    })
}

/// A `redis-server` child on a free loopback port with its files in `dir`, shut
/// down (SIGTERM, waited for) and its directory removed when dropped.
pub struct RedisServer {
    child: Child,
    dir: PathBuf,
    pub addr: SocketAddr,
}

impl RedisServer {
    pub fn start(dir: &Path) -> io::Result<RedisServer> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        // Absolute: redis-server changes into --dir before it opens --logfile.
        let dir = &std::fs::canonicalize(dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log_path = dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting redis-server: {e}")))?;
        let mut server = RedisServer {
            child,
            dir: dir.to_path_buf(),
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "redis-server exited at start ({status}): {}",
                    log.trim()
                )));
            }
            if ping(addr).unwrap_or(false) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(
                    "redis-server did not answer PING within 20 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `redis-benchmark` for one command (`set` or `get`) against this server.
    pub fn benchmark(
        &self,
        command: &str,
        connections: usize,
        requests: u64,
        keyspace: u64,
    ) -> io::Result<RedisResult> {
        let cpu_before = procstat::cpu_seconds(self.pid())?;
        let out = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.addr.port().to_string()])
            .args(["-c", &connections.to_string(), "-n", &requests.to_string()])
            .args(["-d", &VALUE_BYTES.to_string(), "-r", &keyspace.to_string()])
            .args(["-t", command, "--csv"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("running redis-benchmark: {e}")))?;
        let cpu = procstat::cpu_seconds(self.pid())? - cpu_before;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-benchmark -t {command} failed ({}): {} {}",
                out.status,
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let row = parse_csv_row(&text, command).ok_or_else(|| {
            io::Error::other(format!(
                "no {command} row in redis-benchmark's output: {}",
                text.trim()
            ))
        })?;
        Ok(RedisResult {
            requests_per_sec: row.rps,
            p50_ms: row.p50_ms,
            p99_ms: row.p99_ms,
            server_cpu_us_per_request: cpu * 1e6 / requests.max(1) as f64,
            server_peak_rss_bytes: procstat::peak_rss_bytes(self.pid())?,
            version: version(),
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        crate::httpbench::terminate(&mut self.child, Duration::from_secs(20));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `redis-server --version`'s version, for the report.
fn version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// True when the server answers `+PONG` to an inline PING.
fn ping(addr: SocketAddr) -> io::Result<bool> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf)?;
    Ok(buf.get(..n).is_some_and(|b| b.starts_with(b"+PONG")))
}

struct CsvRow {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// The row of `command` in redis-benchmark's `--csv` output, whose header is
/// `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"`.
fn parse_csv_row(text: &str, command: &str) -> Option<CsvRow> {
    let header: Vec<String> = text
        .lines()
        .find(|l| l.starts_with("\"test\""))?
        .split(',')
        .map(|f| f.trim_matches('"').to_string())
        .collect();
    let wanted = format!("\"{}\"", command.to_ascii_uppercase());
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with(&wanted))?
        .split(',')
        .map(|f| f.trim_matches('"'))
        .collect();
    let field = |name: &str| -> Option<f64> {
        let i = header.iter().position(|h| h == name)?;
        row.get(i)?.parse().ok()
    };
    Some(CsvRow {
        rps: field("rps")?,
        p50_ms: field("p50_latency_ms")?,
        p99_ms: field("p99_latency_ms")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_benchmark_csv() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"69060.77\",\"0.825\",\"0.272\",\"0.743\",\"1.319\",\"2.167\",\"13.543\"\n";
        let row = parse_csv_row(text, "set").expect("a SET row");
        assert_eq!(row.rps, 69060.77);
        assert_eq!(row.p50_ms, 0.743);
        assert_eq!(row.p99_ms, 2.167);
        assert!(parse_csv_row(text, "get").is_none());
        assert!(parse_csv_row("garbage", "set").is_none());
    }
}
