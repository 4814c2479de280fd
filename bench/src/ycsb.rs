//! YCSB's core workloads A-F (`--workloads YA..YF`) through each system's own
//! network protocol, every write durable: `kiln serve` over HTTP/1.1 (a document
//! per record; update = PATCH with a JSON merge patch; scan = the id-ordered
//! listing), PostgreSQL over its wire protocol (a jsonb table, `synchronous_commit
//! = on`; update = `doc || $2`; scan = `id >= $1 ORDER BY id LIMIT n`), and Redis
//! for A-C and F (a hash per record, `appendfsync always`). The keys, records,
//! mixes and distributions are YCSB's (kiln_bench::ycsb; docs/ycsb.md).
//!
//! One job per (workload, system): a fresh server, the load phase (every record
//! inserted one durable write at a time by `load_clients` clients), then the run
//! phase once per client count on the same data, as YCSB runs workloads one after
//! another on one load. All clients are async tasks of ONE thread of this process
//! (one connection each, the pool of YCSB's one-connection-per-thread), so the
//! load generator takes at most one of the machine's cores whatever the system.

use anyhow::{anyhow, bail, Context, Result};
use futures_util::future::join_all;
use kiln_bench::ycsb::{self, field_name, key_name, load_record, Client, InsertSequence, Op};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const WORKLOADS: &[&str] = &["YA", "YB", "YC", "YD", "YE", "YF"];

/// The operation kinds YCSB reports, in its order.
const KINDS: [&str; 5] = ["READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE"];

/// Sizes of a run.
#[derive(Debug, Clone)]
pub struct Params {
    pub records: u64,
    /// Operations of the run phase per client count (YCSB's operationcount).
    pub operations: u64,
    /// A run phase also ends after this long (YCSB's maxexecutiontime).
    pub max_seconds: f64,
    pub clients: Vec<u64>,
    pub load_clients: u64,
    pub seed: u64,
}

impl Params {
    pub fn new(
        quick: bool,
        clients: Option<&str>,
        records: Option<u64>,
        ops: Option<u64>,
    ) -> Result<Params> {
        let clients: Vec<u64> = match clients {
            Some(list) => list
                .split(',')
                .map(|c| {
                    c.trim()
                        .parse::<u64>()
                        .map_err(|_| anyhow!("--ycsb-clients: {c:?} is not a count"))
                })
                .collect::<Result<_>>()?,
            // Quick: the middle client count only (CI's smoke run).
            None if quick => vec![16],
            None => vec![1, 16, 64],
        };
        if clients.is_empty() || clients.contains(&0) {
            bail!("--ycsb-clients needs counts of at least 1");
        }
        let records = records.unwrap_or(if quick { 5_000 } else { 100_000 });
        if records < 3 {
            bail!("--ycsb-records must be at least 3");
        }
        Ok(Params {
            records,
            operations: ops.unwrap_or(if quick { 5_000 } else { 200_000 }),
            max_seconds: if quick { 5.0 } else { 20.0 },
            load_clients: 64,
            clients,
            seed: kiln_bench::workload::SEED,
        })
    }
}

/// Why `engine` does not run a YCSB workload (None: it does).
pub fn not_applicable(engine: &str, workload: &str) -> Option<&'static str> {
    match (engine, workload) {
        ("kiln" | "postgres", _) => None,
        ("redis", "YA" | "YB" | "YC" | "YF") => None,
        ("redis", _) => Some(
            "Redis joins YCSB A-C and F only (the issue's choice: D's inserts and E's scans \
             need the sorted-set index YCSB's Redis binding keeps beside the hashes)",
        ),
        _ => Some("YCSB runs against servers over the network: Kiln, PostgreSQL, Redis"),
    }
}

// ---------------------------------------------------------------------------------
// The systems
// ---------------------------------------------------------------------------------

/// A server process of the run (Kiln or Redis; PostgreSQL has its own launcher).
pub(crate) struct Proc {
    pub(crate) child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM: both servers shut down cleanly on it; then reap.
        // SAFETY: kill with a pid of our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_for_port(port: u16, child: &mut Child, what: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            bail!("{what} exited at start ({status}): {}", text.trim());
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on 127.0.0.1:{port} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU seconds (user + system) of a process and its threads, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// CPU seconds of `pid` and every process whose parent it is (PostgreSQL's
/// backends, WAL writer and checkpointer are the postmaster's children).
fn tree_cpu_seconds(pid: u32) -> f64 {
    process_tree(pid).into_iter().map(cpu_seconds).sum()
}

/// `pid` and the processes whose parent it is.
pub(crate) fn process_tree(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            pids.push(child);
        }
    }
    pids
}

/// A system under test: started in the run's directory, stopped when dropped.
pub(crate) enum System {
    Kiln {
        proc: Proc,
        port: u16,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        server: crate::engines::PgTcpServer,
    },
    Redis {
        proc: Proc,
        port: u16,
    },
}

impl System {
    pub(crate) fn start(engine: &str, dir: &Path) -> Result<System> {
        std::fs::create_dir_all(dir)?;
        match engine {
            "kiln" => {
                let bin = crate::server::kiln_binary()?;
                let port = free_port()?;
                let data = dir.join("kiln-data");
                let log = dir.join("kiln-serve.log");
                let mut child = Command::new(&bin)
                    .args([
                        "serve",
                        "--bind",
                        &format!("127.0.0.1:{port}"),
                        "--data-dir",
                    ])
                    .arg(&data)
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log)?)
                    .spawn()
                    .with_context(|| format!("starting {}", bin.display()))?;
                wait_for_port(port, &mut child, "kiln serve", &log)?;
                Ok(System::Kiln {
                    proc: Proc { child },
                    port,
                })
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let server = crate::engines::PgTcpServer::start(dir).map_err(|e| {
                    crate::engines::Unavailable(format!("PostgreSQL could not start: {e:#}"))
                })?;
                Ok(System::Postgres { server })
            }
            "redis" => {
                if let Some(why) = crate::server::redis_missing() {
                    return Err(crate::engines::Unavailable(why).into());
                }
                let port = free_port()?;
                let rdir = std::fs::canonicalize(dir)?.join("redis");
                std::fs::create_dir_all(&rdir)?;
                let log = rdir.join("redis.log");
                let mut child = Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(REDIS_ARGS)
                    .arg("--dir")
                    .arg(&rdir)
                    .arg("--logfile")
                    .arg(&log)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting redis-server")?;
                wait_for_port(port, &mut child, "redis-server", &log)?;
                Ok(System::Redis {
                    proc: Proc { child },
                    port,
                })
            }
            other => bail!("YCSB runs kiln, postgres and redis, not {other:?}"),
        }
    }

    /// CPU seconds the server's processes have used so far.
    pub(crate) fn server_cpu_seconds(&self) -> f64 {
        match self {
            System::Kiln { proc, .. } | System::Redis { proc, .. } => cpu_seconds(proc.child.id()),
            #[cfg(feature = "postgres")]
            System::Postgres { server } => server.postmaster_pid().map_or(0.0, tree_cpu_seconds),
        }
    }

    pub(crate) async fn connect(&self) -> Result<Conn> {
        Ok(match self {
            System::Kiln { port, .. } => Conn::Kiln(KilnConn::connect(*port).await?),
            #[cfg(feature = "postgres")]
            System::Postgres { server } => Conn::Pg(PgConn::connect(server.port).await?),
            System::Redis { port, .. } => Conn::Redis(RedisConn::connect(*port).await?),
        })
    }

    /// `n` connections, one after another (the clients of a phase).
    pub(crate) async fn connect_many(&self, n: u64) -> Result<Vec<Conn>> {
        let mut conns = Vec::new();
        for _ in 0..n {
            conns.push(self.connect().await?);
        }
        Ok(conns)
    }
}

/// Redis's durable settings (its documentation's advice for durability:
/// appendfsync always) and no snapshots.
const REDIS_ARGS: &[&str] = &[
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--save",
    "",
    "--daemonize",
    "no",
    "--protected-mode",
    "no",
];

// ---- Kiln: HTTP/1.1 with hyper ----

const KILN_DB: &str = "ycsb";

pub(crate) struct KilnConn {
    send: hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
}

impl KilnConn {
    pub(crate) async fn connect(port: u16) -> Result<KilnConn> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
        Ok(KilnConn { send })
    }

    /// One request; the answer's status and body.
    async fn request(
        &mut self,
        method: hyper::Method,
        path: &str,
        content_type: Option<&'static str>,
        body: Vec<u8>,
    ) -> Result<(u16, bytes::Bytes)> {
        use http_body_util::BodyExt;
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "127.0.0.1");
        if let Some(ct) = content_type {
            req = req.header(hyper::header::CONTENT_TYPE, ct);
        }
        let req = req.body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
        self.send.ready().await?;
        let resp = self.send.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    pub(crate) async fn expect(
        &mut self,
        method: hyper::Method,
        path: &str,
        content_type: Option<&'static str>,
        body: Vec<u8>,
        ok: &[u16],
    ) -> Result<bytes::Bytes> {
        let (status, body) = self
            .request(method.clone(), path, content_type, body)
            .await?;
        if !ok.contains(&status) {
            bail!(
                "{method} {path}: {status} {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
        Ok(body)
    }
}

/// The greatest id below `key` in YCSB's key alphabet ("user" and decimal
/// digits): the listing starts after it, so the scan includes `key` itself (the
/// listing's `start_after` is exclusive; YCSB scans from its start key on).
fn just_before(key: &str) -> String {
    let mut b = key.as_bytes().to_vec();
    if let Some(last) = b.last_mut() {
        *last -= 1;
    }
    b.push(b'~');
    String::from_utf8(b).expect("ASCII")
}

fn query_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn record_json(record: &[(String, String)]) -> Vec<u8> {
    let map: Map<String, Value> = record
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    serde_json::to_vec(&map).expect("a map of strings serializes")
}

// ---- PostgreSQL: tokio-postgres ----

#[cfg(feature = "postgres")]
pub(crate) struct PgConn {
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
    read: tokio_postgres::Statement,
    update: tokio_postgres::Statement,
    scan: tokio_postgres::Statement,
}

#[cfg(feature = "postgres")]
const PG_TABLE: &str = "CREATE TABLE usertable (ycsb_key text PRIMARY KEY, doc jsonb NOT NULL)";
#[cfg(feature = "postgres")]
const PG_STATEMENTS: [&str; 4] = [
    "INSERT INTO usertable (ycsb_key, doc) VALUES ($1, $2::text::jsonb)",
    "SELECT doc::text FROM usertable WHERE ycsb_key = $1",
    "UPDATE usertable SET doc = doc || $2::text::jsonb WHERE ycsb_key = $1",
    "SELECT ycsb_key, doc::text FROM usertable WHERE ycsb_key >= $1 ORDER BY ycsb_key LIMIT $2",
];

#[cfg(feature = "postgres")]
impl PgConn {
    /// A connection without the statements (before the table exists).
    async fn connect_bare(port: u16) -> Result<tokio_postgres::Client> {
        let (client, conn) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(port)
            .user("postgres")
            .dbname("postgres")
            .application_name("kiln-bench-ycsb")
            .connect(tokio_postgres::NoTls)
            .await
            .context("connecting to PostgreSQL over TCP")?;
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
        Ok(client)
    }

    async fn connect(port: u16) -> Result<PgConn> {
        let client = PgConn::connect_bare(port).await?;
        let [insert, read, update, scan] = PG_STATEMENTS;
        Ok(PgConn {
            insert: client.prepare(insert).await?,
            read: client.prepare(read).await?,
            update: client.prepare(update).await?,
            scan: client.prepare(scan).await?,
            client,
        })
    }
}

/// A connection to the YCSB PostgreSQL server without prepared statements.
#[cfg(feature = "postgres")]
pub(crate) async fn pg_connect_bare(port: u16) -> Result<tokio_postgres::Client> {
    PgConn::connect_bare(port).await
}

// ---- Redis: RESP over TCP ----

pub(crate) struct RedisConn {
    io: tokio::io::BufStream<tokio::net::TcpStream>,
    line: Vec<u8>,
}

impl RedisConn {
    async fn connect(port: u16) -> Result<RedisConn> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(RedisConn {
            io: tokio::io::BufStream::new(stream),
            line: Vec::new(),
        })
    }

    /// Sends one command and reads its reply; returns the number of elements of
    /// an array reply (or 1 for another reply), an error reply as an error.
    async fn command(&mut self, args: &[&[u8]]) -> Result<usize> {
        use tokio::io::AsyncWriteExt;
        let mut out = Vec::with_capacity(64 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.io.write_all(&out).await?;
        self.io.flush().await?;
        self.reply().await
    }

    async fn read_line(&mut self) -> Result<()> {
        use tokio::io::AsyncBufReadExt;
        self.line.clear();
        let n = self.io.read_until(b'\n', &mut self.line).await?;
        if n < 3 || !self.line.ends_with(b"\r\n") {
            bail!("redis: the connection ended mid-reply");
        }
        self.line.truncate(n - 2);
        Ok(())
    }

    fn line_number(&self) -> Result<i64> {
        std::str::from_utf8(&self.line[1..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                anyhow!(
                    "redis: bad length {:?}",
                    String::from_utf8_lossy(&self.line)
                )
            })
    }

    async fn reply(&mut self) -> Result<usize> {
        self.read_line().await?;
        match self.line.first() {
            Some(b'+') | Some(b':') => Ok(1),
            Some(b'-') => bail!("redis: {}", String::from_utf8_lossy(&self.line[1..])),
            Some(b'$') => {
                self.skip_bulk().await?;
                Ok(1)
            }
            Some(b'*') => {
                let n = self.line_number()?.max(0) as usize;
                for _ in 0..n {
                    self.read_line().await?;
                    match self.line.first() {
                        Some(b'$') => self.skip_bulk().await?,
                        Some(b'+') | Some(b':') => {}
                        _ => bail!("redis: unexpected element in an array reply"),
                    }
                }
                Ok(n)
            }
            _ => bail!(
                "redis: unexpected reply {:?}",
                String::from_utf8_lossy(&self.line)
            ),
        }
    }

    async fn skip_bulk(&mut self) -> Result<()> {
        use tokio::io::AsyncReadExt;
        let len = self.line_number()?;
        if len >= 0 {
            let mut buf = vec![0u8; len as usize + 2];
            self.io.read_exact(&mut buf).await?;
        }
        Ok(())
    }
}

// ---- One connection of any system ----

pub(crate) enum Conn {
    Kiln(KilnConn),
    #[cfg(feature = "postgres")]
    Pg(PgConn),
    Redis(RedisConn),
}

impl Conn {
    pub(crate) async fn insert(&mut self, key: &str, record: &[(String, String)]) -> Result<()> {
        match self {
            Conn::Kiln(c) => {
                let path = format!("/dbs/{KILN_DB}/docs/{key}");
                c.expect(
                    hyper::Method::PUT,
                    &path,
                    Some("application/json"),
                    record_json(record),
                    &[200, 201],
                )
                .await?;
            }
            #[cfg(feature = "postgres")]
            Conn::Pg(c) => {
                let doc = String::from_utf8(record_json(record))?;
                c.client.execute(&c.insert, &[&key, &doc]).await?;
            }
            Conn::Redis(c) => {
                let mut args: Vec<&[u8]> = vec![b"HSET", key.as_bytes()];
                for (f, v) in record {
                    args.push(f.as_bytes());
                    args.push(v.as_bytes());
                }
                c.command(&args).await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn read(&mut self, key: &str) -> Result<()> {
        match self {
            Conn::Kiln(c) => {
                let path = format!("/dbs/{KILN_DB}/docs/{key}");
                c.expect(hyper::Method::GET, &path, None, Vec::new(), &[200])
                    .await?;
            }
            #[cfg(feature = "postgres")]
            Conn::Pg(c) => {
                let row = c.client.query_opt(&c.read, &[&key]).await?;
                let doc: String = row.ok_or_else(|| anyhow!("{key} not found"))?.get(0);
                if doc.len() < ycsb::FIELD_LENGTH {
                    bail!("{key}: a short record");
                }
            }
            Conn::Redis(c) => {
                if c.command(&[b"HGETALL", key.as_bytes()]).await? == 0 {
                    bail!("{key} not found");
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn update(&mut self, key: &str, field: usize, value: &str) -> Result<()> {
        let name = field_name(field);
        match self {
            Conn::Kiln(c) => {
                let path = format!("/dbs/{KILN_DB}/docs/{key}");
                let patch = serde_json::to_vec(&json!({ name: value }))?;
                c.expect(
                    hyper::Method::PATCH,
                    &path,
                    Some("application/merge-patch+json"),
                    patch,
                    &[200],
                )
                .await?;
            }
            #[cfg(feature = "postgres")]
            Conn::Pg(c) => {
                let patch = json!({ name: value }).to_string();
                if c.client.execute(&c.update, &[&key, &patch]).await? != 1 {
                    bail!("{key}: the update found no row");
                }
            }
            Conn::Redis(c) => {
                c.command(&[b"HSET", key.as_bytes(), name.as_bytes(), value.as_bytes()])
                    .await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn scan(&mut self, start: &str, count: u64) -> Result<()> {
        match self {
            Conn::Kiln(c) => {
                let path = format!(
                    "/dbs/{KILN_DB}/docs?start_after={}&page_size={count}",
                    query_value(&just_before(start))
                );
                let body = c
                    .expect(hyper::Method::GET, &path, None, Vec::new(), &[200])
                    .await?;
                if !body.windows(start.len()).any(|w| w == start.as_bytes()) {
                    bail!("scan from {start}: the start record is not in the page");
                }
            }
            #[cfg(feature = "postgres")]
            Conn::Pg(c) => {
                let rows = c.client.query(&c.scan, &[&start, &(count as i64)]).await?;
                if rows.first().map(|r| r.get::<_, String>(0)).as_deref() != Some(start) {
                    bail!("scan from {start}: the start record is not the first row");
                }
            }
            Conn::Redis(_) => bail!("Redis does not run scans here"),
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Load and run phases
// ---------------------------------------------------------------------------------

/// Per-kind latencies (µs) of one client.
#[derive(Default)]
struct Latencies {
    by_kind: [Vec<u32>; 5],
    /// Every operation as YCSB counts it (a read-modify-write is one).
    all: Vec<u32>,
}

fn micros(since: Instant) -> u32 {
    since.elapsed().as_micros().min(u32::MAX as u128) as u32
}

fn kind_index(kind: &str) -> usize {
    KINDS.iter().position(|k| *k == kind).expect("a YCSB kind")
}

pub(crate) async fn setup(system: &System) -> Result<()> {
    #[cfg(feature = "postgres")]
    if let System::Postgres { server } = system {
        let client = PgConn::connect_bare(server.port).await?;
        client.batch_execute(PG_TABLE).await?;
        return Ok(());
    }
    match system.connect().await? {
        Conn::Kiln(mut c) => {
            c.expect(
                hyper::Method::PUT,
                &format!("/dbs/{KILN_DB}"),
                None,
                Vec::new(),
                &[200, 201],
            )
            .await?;
        }
        #[cfg(feature = "postgres")]
        Conn::Pg(_) => {}
        Conn::Redis(_) => {}
    }
    Ok(())
}

/// Inserts records `0..records`, client `i` taking every `clients`-th one.
pub(crate) async fn load(system: &System, params: &Params) -> Result<(f64, Vec<u32>)> {
    let clients = params.load_clients.min(params.records);
    let conns = system.connect_many(clients).await?;
    let start = Instant::now();
    let tasks = conns
        .into_iter()
        .zip(0u64..)
        .map(|(mut conn, i)| async move {
            let mut lat = Vec::new();
            let mut k = i;
            while k < params.records {
                let record = load_record(params.seed, k);
                let t = Instant::now();
                conn.insert(&key_name(k), &record).await?;
                lat.push(micros(t));
                k += clients;
            }
            Ok::<_, anyhow::Error>(lat)
        });
    let mut all = Vec::new();
    for r in join_all(tasks).await {
        all.extend(r?);
    }
    Ok((start.elapsed().as_secs_f64(), all))
}

struct RunOutcome {
    seconds: f64,
    operations: u64,
    lat: Latencies,
    server_cpu_seconds: f64,
    counters: Map<String, Value>,
}

/// The run phase with `clients` clients on `records` records; returns what it
/// measured and the record count after it (inserts add records).
async fn run_phase(
    system: &System,
    workload: ycsb::Workload,
    records: u64,
    clients: u64,
    params: &Params,
) -> Result<(RunOutcome, u64)> {
    let seq = InsertSequence::new(records);
    let conns = system.connect_many(clients).await?;
    let before = counters(system).await;
    let budget = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs_f64(params.max_seconds);
    let cpu0 = system.server_cpu_seconds();
    let start = Instant::now();
    let phase = PhaseClients {
        workload,
        records,
        params,
        seq: &seq,
        budget: &budget,
        deadline,
    };
    let tasks = conns
        .into_iter()
        .zip(0u64..)
        .map(|(conn, i)| run_client(conn, i, &phase));
    let results = join_all(tasks).await;
    let seconds = start.elapsed().as_secs_f64();
    let server_cpu_seconds = system.server_cpu_seconds() - cpu0;
    let lat = merge_latencies(results)?;
    let after = counters(system).await;
    let operations = lat.all.len() as u64;
    let records_after = seq.last_value() + 1;
    Ok((
        RunOutcome {
            seconds,
            operations,
            lat,
            server_cpu_seconds,
            counters: counters_since(&before, &after),
        },
        records_after,
    ))
}

/// What the clients of a run phase share.
#[derive(Clone, Copy)]
struct PhaseClients<'a> {
    workload: ycsb::Workload,
    records: u64,
    params: &'a Params,
    seq: &'a InsertSequence,
    /// Operations started so far, by all clients: the phase ends at
    /// `params.operations`.
    budget: &'a AtomicU64,
    deadline: Instant,
}

/// Client `i` of a run phase on `conn`: YCSB's operations until the budget or the
/// deadline runs out; their latencies.
async fn run_client(mut conn: Conn, i: u64, phase: &PhaseClients<'_>) -> Result<Latencies> {
    let PhaseClients {
        workload,
        records,
        params,
        seq,
        budget,
        deadline,
    } = *phase;
    let mut gen = Client::new(workload, records, params.operations, seq, params.seed, i);
    let mut lat = Latencies::default();
    while budget.fetch_add(1, Ordering::Relaxed) < params.operations && Instant::now() < deadline {
        let op = gen.next_op();
        let t = Instant::now();
        match &op {
            Op::Read { key } => conn.read(key).await?,
            Op::Update { key, field, value } => conn.update(key, *field, value).await?,
            Op::Insert { keynum, key } => {
                let record = gen.record();
                conn.insert(key, &record).await?;
                seq.acknowledge(*keynum);
            }
            Op::Scan { start, count } => conn.scan(start, *count).await?,
            Op::ReadModifyWrite { key, field, value } => {
                // YCSB: a read, then an update, each measured on its own
                // too (its DBWrapper times every call).
                let r = Instant::now();
                conn.read(key).await?;
                lat.by_kind[0].push(micros(r));
                let u = Instant::now();
                conn.update(key, *field, value).await?;
                lat.by_kind[1].push(micros(u));
            }
        }
        let us = micros(t);
        lat.by_kind[kind_index(op.kind())].push(us);
        lat.all.push(us);
    }
    Ok(lat)
}

/// The clients' latencies together (the first error if a client failed).
fn merge_latencies(results: Vec<Result<Latencies>>) -> Result<Latencies> {
    let mut lat = Latencies::default();
    for r in results {
        let l = r?;
        for (all, mine) in lat.by_kind.iter_mut().zip(l.by_kind) {
            all.extend(mine);
        }
        lat.all.extend(l.all);
    }
    Ok(lat)
}

/// The numeric counters' growth from `before` to `after`.
fn counters_since(before: &Map<String, Value>, after: &Map<String, Value>) -> Map<String, Value> {
    let mut delta = Map::new();
    for (k, v) in after {
        if let (Some(a), Some(b)) = (v.as_f64(), before.get(k).and_then(Value::as_f64)) {
            delta.insert(k.clone(), json!(a - b));
        }
    }
    delta
}

/// The server's own counters of durable writes, read before and after a run
/// phase: Kiln's journal writes and HTTP connections handed to hyper (from
/// /metrics), PostgreSQL's WAL writes and syncs (pg_stat_wal).
async fn counters(system: &System) -> Map<String, Value> {
    let mut out = Map::new();
    match system.connect().await {
        Ok(Conn::Kiln(mut c)) => {
            if let Ok(body) = c
                .expect(hyper::Method::GET, "/metrics", None, Vec::new(), &[200])
                .await
            {
                let text = String::from_utf8_lossy(&body);
                for name in [
                    "kiln_journal_writes_total",
                    "kiln_commits_total",
                    "kiln_commit_groups_total",
                    "kiln_http_connections_to_hyper_total",
                    "kiln_data_file_syncs_total",
                ] {
                    let sum: f64 = text
                        .lines()
                        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum();
                    out.insert(name.to_string(), json!(sum));
                }
            }
        }
        #[cfg(feature = "postgres")]
        Ok(Conn::Pg(c)) => {
            if let Ok(row) = c
                .client
                .query_one(
                    "SELECT wal_records, wal_write, wal_sync FROM pg_stat_wal",
                    &[],
                )
                .await
            {
                out.insert("wal_records".into(), json!(row.get::<_, i64>(0)));
                out.insert("wal_write".into(), json!(row.get::<_, i64>(1)));
                out.insert("wal_sync".into(), json!(row.get::<_, i64>(2)));
            }
        }
        _ => {}
    }
    out
}

fn quantile_us(sorted: &[u32], q: f64) -> f64 {
    kiln_bench::stats::quantile(sorted, q).map_or(0.0, f64::from)
}

fn summary(mut lat: Vec<u32>) -> Value {
    lat.sort_unstable();
    json!({
        "count": lat.len(),
        "p50_us": quantile_us(&lat, 0.50),
        "p99_us": quantile_us(&lat, 0.99),
        "p999_us": quantile_us(&lat, 0.999),
        "max_us": lat.last().copied().unwrap_or(0),
    })
}

/// What the system ran with, for the results file.
async fn settings(system: &System) -> Value {
    match system {
        System::Kiln { .. } => json!({
            "server": "kiln serve (its defaults: every write acknowledged after its journal write, O_DIRECT|O_DSYNC)",
            "client": "hyper 1 HTTP/1.1, one keep-alive connection per client",
            "record": "a document per record (id = the YCSB key), fields field0..field9",
            "update": "PATCH /dbs/ycsb/docs/{key} with a JSON merge patch of one field (Content-Type: application/merge-patch+json)",
            "scan": "GET /dbs/ycsb/docs?start_after=<the id just before the start key>&page_size=<n> (the id-ordered listing)",
        }),
        #[cfg(feature = "postgres")]
        System::Postgres { server } => {
            let mut s = Map::new();
            if let Ok(Conn::Pg(c)) = system.connect().await {
                for name in crate::engines::PG_REPORTED_SETTINGS {
                    if let Ok(row) = c
                        .client
                        .query_one("SELECT current_setting($1)", &[name])
                        .await
                    {
                        s.insert(name.to_string(), json!(row.get::<_, String>(0)));
                    }
                }
                if let Ok(row) = c.client.query_one("SELECT version()", &[]).await {
                    s.insert("version".into(), json!(row.get::<_, String>(0)));
                }
            }
            json!({
                "server": format!("a throwaway server ({}), loopback TCP port {}", server.version(), server.port),
                "settings": s,
                "table": PG_TABLE,
                "statements": PG_STATEMENTS,
                "client": "tokio-postgres, one connection per client, prepared statements, autocommit (each write a durable commit)",
            })
        }
        System::Redis { .. } => {
            let version = Command::new("redis-server")
                .arg("--version")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            json!({
                "server": format!("redis-server {}", REDIS_ARGS.join(" ")),
                "version": version,
                "record": "a hash per record (HSET key field0 v0 ... field9 v9)",
                "read": "HGETALL", "update": "HSET key field value",
                "client": "a RESP client over tokio, one connection per client",
            })
        }
    }
}

/// One job: `workload` against `engine` in `dir`, as a child's JSON object
/// (`seconds`, `rows` for the table, `extra`; `extra.ycsb` holds the flat rows).
pub fn run(engine: &str, workload: &str, dir: &Path, params: &Params) -> Result<Value> {
    let w = ycsb::by_name(workload).ok_or_else(|| anyhow!("unknown YCSB workload {workload:?}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let started = Instant::now();
    let system = System::start(engine, dir)?;
    let out = local.block_on(&rt, async {
        setup(&system).await?;
        let (load_s, load_lat) = load(&system, params).await?;
        let mut rows = vec![json!({
            "row": format!("{workload} load"),
            "unit": "inserts/s",
            "value": params.records as f64 / load_s,
            "lower_is_better": false,
        })];
        let mut flat = Vec::new();
        let mut records = params.records;
        for &clients in &params.clients {
            let (o, after) = run_phase(&system, w, records, clients, params).await?;
            records = after;
            let job = Job {
                engine,
                workload,
                clients,
            };
            let (table_rows, flat_row) = phase_rows(&job, o, records);
            rows.extend(table_rows);
            flat.push(flat_row);
        }
        let settings = settings(&system).await;
        let extra = job_extra(w, params, flat, (load_s, load_lat), settings);
        Ok::<_, anyhow::Error>((rows, extra))
    });
    drop(system);
    let (rows, extra) = out?;
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "rows": rows,
        "extra": extra,
    }))
}

/// Which run phase a row is of.
struct Job<'a> {
    engine: &'a str,
    workload: &'a str,
    clients: u64,
}

/// A run phase's rows for the table (ops/s, p99) and its flat row for
/// `extra.ycsb`; `records` is what the flat row calls `records_at_start`.
fn phase_rows(job: &Job, o: RunOutcome, records: u64) -> ([Value; 2], Value) {
    let Job {
        engine,
        workload,
        clients,
    } = *job;
    let ops_per_sec = o.operations as f64 / o.seconds;
    let mut all = o.lat.all;
    all.sort_unstable();
    let per_op: Map<String, Value> = KINDS
        .iter()
        .zip(o.lat.by_kind)
        .filter(|(_, l)| !l.is_empty())
        .map(|(k, l)| (k.to_string(), summary(l)))
        .collect();
    let p99 = quantile_us(&all, 0.99);
    let table = [
        json!({ "row": format!("{workload} c={clients}"), "unit": "ops/s",
                      "value": ops_per_sec, "lower_is_better": false }),
        json!({ "row": format!("{workload} c={clients} p99"), "unit": "us",
                      "value": p99, "lower_is_better": true }),
    ];
    let flat = json!({
        "workload": workload,
        "engine": engine,
        "clients": clients,
        "ops_per_sec": ops_per_sec,
        "p50_us": quantile_us(&all, 0.50),
        "p99_us": p99,
        "p999_us": quantile_us(&all, 0.999),
        "operations": o.operations,
        "seconds": o.seconds,
        "records_at_start": records,
        "per_op": per_op,
        "server_cpu_us_per_op": o.server_cpu_seconds * 1e6 / o.operations.max(1) as f64,
        "server_counters": o.counters,
    });
    (table, flat)
}

/// A job's `extra`: the flat rows of its run phases, the load's figures (its
/// seconds and latencies), the parameters and the system's `settings`.
fn job_extra(
    w: ycsb::Workload,
    params: &Params,
    flat: Vec<Value>,
    (load_s, load_lat): (f64, Vec<u32>),
    settings: Value,
) -> Value {
    let mut load_sorted = load_lat;
    load_sorted.sort_unstable();
    json!({
        "ycsb": flat,
        "load": {
            "records": params.records,
            "clients": params.load_clients,
            "seconds": load_s,
            "p50_us": quantile_us(&load_sorted, 0.5),
            "p99_us": quantile_us(&load_sorted, 0.99),
        },
        "params": {
            "records": params.records, "operations_per_client_count": params.operations,
            "max_seconds_per_client_count": params.max_seconds, "clients": params.clients,
            "field_count": ycsb::FIELD_COUNT, "field_length": ycsb::FIELD_LENGTH,
            "distribution": format!("{:?}", w.distribution), "seed": params.seed,
        },
        "settings": settings,
    })
}

/// Where `kiln serve`'s data and the peers' files go for one job.
pub fn job_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("ycsb")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_starts_just_before_the_key() {
        for key in ["user123", "user120", "user6284781860667377211"] {
            let before = just_before(key);
            assert!(before.as_str() < key);
            // No YCSB key lies between: a key below `key` with the same prefix
            // has a smaller digit where they differ, so it is below `before`.
            let prefix = &key[..key.len() - 1];
            for d in b'0'..=b'9' {
                let other = format!("{prefix}{}", d as char);
                if other.as_str() < key {
                    assert!(other.as_str() < before.as_str(), "{other} vs {before}");
                }
                let longer = format!("{other}5");
                if longer.as_str() < key {
                    assert!(longer.as_str() < before.as_str(), "{longer} vs {before}");
                }
            }
        }
        assert_eq!(query_value("user12/~"), "user12%2F~");
    }
}
