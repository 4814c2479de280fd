//! CURVE: the cost of operations as the data outgrows memory (issue 41, part 2).
//! Run by hand through bench/scripts/cost_curve.sh, which makes the memory cgroup;
//! not part of `.ci/run` (10M documents take ~25 GB of disk).
//!
//! One job: `kiln serve` on a fresh directory; YCSB's records 0..N (ten 100-byte
//! fields, ~1.1 KB of JSON) plus `"n": <record number>`, in collection `usertable`
//! (`@metadata.@collection`; the id is YCSB's key), with an index on `n` created
//! first; loaded through the bulk endpoint (`POST /dbs/ycsb/bulk`, 2,000 documents
//! a request, 4 requests at a time) OUTSIDE the memory limit, the load's cost not
//! being the question. Then the server is stopped, its files written back and
//! dropped from the page cache (fdatasync + POSIX_FADV_DONTNEED per file: the load's
//! cached pages are charged to the cgroup the load ran in, and would otherwise serve
//! reads for free), the limited cgroup emptied (`memory.force_empty`), and the
//! server started again INSIDE the cgroup (its pid written to `cgroup.procs` at
//! once: its memory and the page cache it reads from then on are charged there),
//! and four phases run on the cold cache, one after another, `seconds` each with
//! `clients` clients:
//! - GET: W5-style point reads, record numbers uniform over 0..N;
//! - PUT: W8-style writes of new documents (ids after N), the same shape;
//! - YB: YCSB B (95% reads, 5% one-field PATCHes, zipfian);
//! - QUERY: `from usertable where n = $n`, n uniform (one document through the index).
//!
//! Per phase: ops/s, p50/p99, the server's RSS at the end, and its disk reads per
//! operation (`read_bytes` of /proc/PID/io over the phase, over its operations),
//! with the cgroup's memory use (`memory.usage_in_bytes`, `memory.stat` cache/rss).
//!
//! `--engines postgres` runs the same job against PostgreSQL's YCSB table (`ycsb_key
//! text PRIMARY KEY, doc jsonb`, the documents without `@metadata`): loaded 2,000
//! rows a statement from 4 connections, then an expression index on
//! `(doc->>'n')::bigint`, VACUUM ANALYZE and CHECKPOINT; stopped, its files dropped
//! from the cache, and started again by a pg_ctl that first moves itself into the
//! cgroup (so the postmaster and every backend are charged there). Its disk reads
//! are summed over the postmaster and its children, every client connected for the
//! whole phase (a backend's counters go when it exits).

use crate::ycsb::{KilnConn, Params, System};
use anyhow::{anyhow, bail, Context, Result};
use futures_util::future::join_all;
use kiln_bench::ycsb::{self as y, key_name, load_record, Client, InsertSequence, Op};
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const WORKLOADS: &[&str] = &["CURVE"];

pub fn not_applicable(engine: &str, _workload: &str) -> Option<&'static str> {
    match engine {
        "kiln" | "postgres" => None,
        _ => Some("CURVE runs kiln serve and PostgreSQL"),
    }
}

/// A phase's length and the memory cgroup (None: no limit).
#[derive(Debug, Clone)]
pub struct Curve {
    pub seconds: f64,
    pub clients: u64,
    pub cgroup: Option<PathBuf>,
}

const DB: &str = "ycsb";

fn doc(seed: u64, k: u64) -> Value {
    let mut m: Map<String, Value> = load_record(seed, k)
        .into_iter()
        .map(|(f, v)| (f, Value::String(v)))
        .collect();
    m.insert("n".into(), json!(k));
    m.insert("@metadata".into(), json!({"@collection": "usertable"}));
    Value::Object(m)
}

fn proc_field(pid: u32, file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
}

fn rss_bytes(pid: u32) -> u64 {
    proc_field(pid, "status", "VmRSS:") * 1024
}

fn read_bytes(pid: u32) -> u64 {
    proc_field(pid, "io", "read_bytes:")
}

fn cgroup_memory(cg: &Option<PathBuf>) -> Value {
    let Some(cg) = cg else {
        return Value::Null;
    };
    let usage = std::fs::read_to_string(cg.join("memory.usage_in_bytes"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let stat = std::fs::read_to_string(cg.join("memory.stat")).unwrap_or_default();
    let field = |name: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    json!({"usage_bytes": usage, "cache_bytes": field("cache "), "rss_bytes": field("rss ")})
}

/// Writes back and drops from the page cache every file under `dir`
/// (fdatasync, then POSIX_FADV_DONTNEED); returns the bytes of the files.
fn evict_page_cache(dir: &Path) -> Result<u64> {
    use std::os::unix::io::AsRawFd;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)
            .with_context(|| format!("listing {}", d.display()))?
            .flatten()
        {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let f = std::fs::File::open(&p).with_context(|| format!("opening {}", p.display()))?;
            f.sync_data()
                .with_context(|| format!("syncing {}", p.display()))?;
            // SAFETY: an fd we own; fadvise only advises.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if rc != 0 {
                bail!("posix_fadvise(DONTNEED) of {}: error {rc}", p.display());
            }
            total += f.metadata().map_or(0, |m| m.len());
        }
    }
    Ok(total)
}

fn enter_cgroup(cg: &Option<PathBuf>, pid: u32) -> Result<()> {
    if let Some(cg) = cg {
        std::fs::write(cg.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving pid {pid} into {}", cg.display()))?;
    }
    Ok(())
}

/// The server's processes: Kiln's one, or PostgreSQL's postmaster and its children
/// (backends, checkpointer, WAL writer).
fn server_pids(system: &System) -> Vec<u32> {
    match system {
        System::Kiln { proc, .. } => vec![proc.child.id()],
        #[cfg(feature = "postgres")]
        System::Postgres { server } => server
            .postmaster_pid()
            .map(crate::ycsb::process_tree)
            .unwrap_or_default(),
        System::Redis { proc, .. } => vec![proc.child.id()],
    }
}

fn tree_read_bytes(system: &System) -> u64 {
    server_pids(system).into_iter().map(read_bytes).sum()
}

/// VmRSS summed over the server's processes (PostgreSQL's shared buffers are
/// counted once per process that touched them: an upper bound).
fn tree_rss_bytes(system: &System) -> u64 {
    server_pids(system).into_iter().map(rss_bytes).sum()
}

fn port(system: &System) -> u16 {
    match system {
        System::Kiln { port, .. } | System::Redis { port, .. } => *port,
        #[cfg(feature = "postgres")]
        System::Postgres { server } => server.port,
    }
}

async fn load(port: u16, params: &Params) -> Result<f64> {
    const PER_REQUEST: u64 = 2000;
    const STREAMS: u64 = 4;
    let start = Instant::now();
    let tasks = (0..STREAMS).map(|s| async move {
        let mut first = s * PER_REQUEST;
        while first < params.records {
            let mut body = Vec::with_capacity(PER_REQUEST as usize * 1300);
            for k in first..(first + PER_REQUEST).min(params.records) {
                serde_json::to_writer(
                    &mut body,
                    &json!({"id": key_name(k), "document": doc(params.seed, k)}),
                )?;
                body.push(b'\n');
            }
            // A connection per request: the server closes one after a bulk insert.
            let mut c = KilnConn::connect(port).await?;
            let answer = c
                .expect(
                    hyper::Method::POST,
                    &format!("/dbs/{DB}/bulk"),
                    Some("application/x-ndjson"),
                    body,
                    &[200],
                )
                .await?;
            let text = String::from_utf8_lossy(&answer);
            if text.contains("\"error\"") || !text.contains("\"done\"") {
                bail!("bulk insert from {first}: {}", &text[..text.len().min(300)]);
            }
            first += STREAMS * PER_REQUEST;
        }
        Ok::<_, anyhow::Error>(())
    });
    for r in join_all(tasks).await {
        r?;
    }
    Ok(start.elapsed().as_secs_f64())
}

async fn wait_index(port: u16) -> Result<f64> {
    let start = Instant::now();
    let mut c = KilnConn::connect(port).await?;
    loop {
        let body = c
            .expect(
                hyper::Method::GET,
                &format!("/dbs/{DB}/indexes/by-n"),
                None,
                Vec::new(),
                &[200],
            )
            .await?;
        let v: Value = serde_json::from_slice(&body)?;
        if v["stale"] == json!(false) {
            return Ok(start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A document as PostgreSQL's jsonb row holds it: the fields and `n` (the table
/// is the collection).
#[cfg(feature = "postgres")]
fn pg_doc(seed: u64, k: u64) -> String {
    let mut d = doc(seed, k);
    if let Some(m) = d.as_object_mut() {
        m.remove("@metadata");
    }
    d.to_string()
}

#[cfg(feature = "postgres")]
const PG_INSERT_MANY: &str = "INSERT INTO usertable (ycsb_key, doc) \
     SELECT k, d::jsonb FROM unnest($1::text[], $2::text[]) AS t(k, d)";
#[cfg(feature = "postgres")]
const PG_INSERT: &str = "INSERT INTO usertable (ycsb_key, doc) VALUES ($1, $2::text::jsonb)";
/// The index on `n`: an expression index, the jsonb way of indexing one field.
#[cfg(feature = "postgres")]
const PG_INDEX: &str = "CREATE INDEX usertable_n ON usertable (((doc->>'n')::bigint))";
#[cfg(feature = "postgres")]
const PG_QUERY: &str = "SELECT doc::text FROM usertable WHERE (doc->>'n')::bigint = $1";

/// PostgreSQL's load: 2,000 rows a statement (one durable commit each), 4
/// connections at a time, as Kiln's bulk requests; then the index on `n`
/// (built after the load, PostgreSQL's advice for bulk loads), VACUUM ANALYZE and
/// a CHECKPOINT. Returns the load's and the index build's seconds.
#[cfg(feature = "postgres")]
async fn pg_load(port: u16, params: &Params) -> Result<(f64, f64)> {
    const PER_STATEMENT: u64 = 2000;
    const STREAMS: u64 = 4;
    let start = Instant::now();
    let tasks = (0..STREAMS).map(|s| async move {
        let client = crate::ycsb::pg_connect_bare(port).await?;
        let insert = client.prepare(PG_INSERT_MANY).await?;
        let mut first = s * PER_STATEMENT;
        while first < params.records {
            let ks: Vec<u64> = (first..(first + PER_STATEMENT).min(params.records)).collect();
            let keys: Vec<String> = ks.iter().map(|&k| key_name(k)).collect();
            let docs: Vec<String> = ks.iter().map(|&k| pg_doc(params.seed, k)).collect();
            client
                .execute(&insert, &[&keys, &docs])
                .await
                .with_context(|| format!("inserting records from {first}"))?;
            first += STREAMS * PER_STATEMENT;
        }
        Ok::<_, anyhow::Error>(())
    });
    for r in join_all(tasks).await {
        r?;
    }
    let load_s = start.elapsed().as_secs_f64();
    let client = crate::ycsb::pg_connect_bare(port).await?;
    let t = Instant::now();
    client.batch_execute(PG_INDEX).await?;
    let index_s = t.elapsed().as_secs_f64();
    // Two statements: VACUUM may not run in the implicit transaction of a
    // multi-statement query.
    client.batch_execute("VACUUM ANALYZE usertable").await?;
    client.batch_execute("CHECKPOINT").await?;
    Ok((load_s, index_s))
}

/// A client's own connection for the phases that are not YCSB operations (PUT of
/// a new document, the query on `n`).
enum Direct {
    Kiln(KilnConn),
    #[cfg(feature = "postgres")]
    Pg {
        client: tokio_postgres::Client,
        insert: tokio_postgres::Statement,
        query: tokio_postgres::Statement,
    },
}

impl Direct {
    async fn connect(system: &System) -> Result<Direct> {
        Ok(match system {
            #[cfg(feature = "postgres")]
            System::Postgres { server } => {
                let client = crate::ycsb::pg_connect_bare(server.port).await?;
                Direct::Pg {
                    insert: client.prepare(PG_INSERT).await?,
                    query: client.prepare(PG_QUERY).await?,
                    client,
                }
            }
            other => Direct::Kiln(KilnConn::connect(port(other)).await?),
        })
    }

    /// A new document `k`.
    async fn put(&mut self, seed: u64, k: u64) -> Result<()> {
        match self {
            Direct::Kiln(kc) => {
                kc.expect(
                    hyper::Method::PUT,
                    &format!("/dbs/{DB}/docs/{}", key_name(k)),
                    Some("application/json"),
                    serde_json::to_vec(&doc(seed, k))?,
                    &[200, 201],
                )
                .await?;
            }
            #[cfg(feature = "postgres")]
            Direct::Pg { client, insert, .. } => {
                client
                    .execute(&*insert, &[&key_name(k), &pg_doc(seed, k)])
                    .await?;
            }
        }
        Ok(())
    }

    /// The document whose `n` is `n`, through the index; an error unless found.
    async fn query(&mut self, n: u64) -> Result<()> {
        let found = match self {
            Direct::Kiln(kc) => {
                let body = kc
                    .expect(
                        hyper::Method::POST,
                        &format!("/dbs/{DB}/queries"),
                        Some("application/json"),
                        serde_json::to_vec(&json!({
                            "query": "from usertable where n = $n",
                            "params": {"n": n}
                        }))?,
                        &[200],
                    )
                    .await?;
                let needle = format!("\"n\":{n}");
                body.windows(needle.len()).any(|w| w == needle.as_bytes())
            }
            #[cfg(feature = "postgres")]
            Direct::Pg { client, query, .. } => {
                let rows = client.query(&*query, &[&(n as i64)]).await?;
                let needle = format!("\"n\": {n}");
                rows.len() == 1 && rows[0].get::<_, String>(0).contains(&needle)
            }
        };
        if !found {
            bail!("query n = {n}: no such document");
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Phase {
    Get,
    Put,
    YcsbB,
    Query,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Get => "GET",
            Phase::Put => "PUT",
            Phase::YcsbB => "YB",
            Phase::Query => "QUERY",
        }
    }
}

/// What the clients of one phase share.
struct PhaseShared {
    seq: InsertSequence,
    /// The next new document's number (PUT).
    next_new: std::sync::atomic::AtomicU64,
    // Every client connects before the clock starts, and keeps its connections
    // until the disk reads are sampled: PostgreSQL's backends are processes whose
    // counters go when they exit.
    connected: tokio::sync::Barrier,
    finished: tokio::sync::Barrier,
    sampled: tokio::sync::Barrier,
}

async fn phase(
    system: &System,
    engine: &str,
    ph: Phase,
    records: u64,
    params: &Params,
    curve: &Curve,
) -> Result<Value> {
    let shared = PhaseShared {
        seq: InsertSequence::new(records),
        next_new: std::sync::atomic::AtomicU64::new(records),
        connected: tokio::sync::Barrier::new(curve.clients as usize + 1),
        finished: tokio::sync::Barrier::new(curve.clients as usize + 1),
        sampled: tokio::sync::Barrier::new(curve.clients as usize + 1),
    };
    let dur = Duration::from_secs_f64(curve.seconds);
    let tasks =
        (0..curve.clients).map(|i| phase_client(system, ph, records, params, dur, &shared, i));
    let sampler = sample_phase(system, &shared);
    let (results, (reads, rss, seconds)) = tokio::join!(join_all(tasks), sampler);
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    all.sort_unstable();
    let q = |p: f64| kiln_bench::stats::quantile(&all, p).map_or(0.0, f64::from);
    let ops = all.len() as u64;
    Ok(json!({
        "workload": "CURVE", "engine": engine, "phase": ph.name(), "documents": records,
        "clients": curve.clients, "operations": ops, "seconds": seconds,
        "ops_per_sec": ops as f64 / seconds, "p50_us": q(0.5), "p99_us": q(0.99),
        "rss_bytes": rss, "disk_read_bytes": reads,
        "disk_read_bytes_per_op": reads as f64 / ops.max(1) as f64,
        "cgroup_memory": cgroup_memory(&curve.cgroup),
    }))
}

/// Client `i` of phase `ph`: connects, waits for the others, then runs the
/// phase's operations for `dur`; their latencies (µs).
async fn phase_client(
    system: &System,
    ph: Phase,
    records: u64,
    params: &Params,
    dur: Duration,
    shared: &PhaseShared,
    i: u64,
) -> Result<Vec<u32>> {
    let (seq, next_new) = (&shared.seq, &shared.next_new);
    let mut lat = Vec::new();
    let mut direct = Direct::connect(system).await?;
    let mut conn = system.connect().await?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(params.seed ^ (i + 1) * 7919);
    let wl = y::by_name("B").ok_or_else(|| anyhow!("no YCSB B"))?;
    let mut gen = Client::new(wl, records, 1 << 40, seq, params.seed, i);
    shared.connected.wait().await;
    let deadline = Instant::now() + dur;
    while Instant::now() < deadline {
        let t = Instant::now();
        match ph {
            Phase::Get => conn.read(&key_name(rng.gen_range(0..records))).await?,
            Phase::Put => {
                let k = next_new.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                direct.put(params.seed, k).await?;
            }
            Phase::YcsbB => match gen.next_op() {
                Op::Read { key } => conn.read(&key).await?,
                Op::Update { key, field, value } => conn.update(&key, field, &value).await?,
                other => bail!("YCSB B made a {} operation", other.kind()),
            },
            Phase::Query => direct.query(rng.gen_range(0..records)).await?,
        }
        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    shared.finished.wait().await;
    shared.sampled.wait().await;
    Ok(lat)
}

/// The server's disk reads from when every client has connected until every
/// client has finished, its RSS then, and the seconds between.
async fn sample_phase(system: &System, shared: &PhaseShared) -> (u64, u64, f64) {
    shared.connected.wait().await;
    let (read0, start) = (tree_read_bytes(system), Instant::now());
    shared.finished.wait().await;
    let sample = (
        tree_read_bytes(system).saturating_sub(read0),
        tree_rss_bytes(system),
        start.elapsed().as_secs_f64(),
    );
    shared.sampled.wait().await;
    sample
}

/// Empties the limited cgroup's page cache (it holds no task now).
fn empty_cgroup(curve: &Curve) -> Result<()> {
    if let Some(cg) = &curve.cgroup {
        std::fs::write(cg.join("memory.force_empty"), "0")
            .with_context(|| format!("emptying {}", cg.display()))?;
    }
    Ok(())
}

/// The load, without a limit: the system on its cold restart inside the cgroup,
/// the load's and index's seconds, and the bytes on disk (with PostgreSQL's
/// table-and-indexes size).
fn load_and_restart(
    engine: &str,
    dir: &Path,
    params: &Params,
    curve: &Curve,
    rt: &tokio::runtime::Runtime,
    local: &tokio::task::LocalSet,
) -> Result<(System, f64, f64, u64, Option<u64>)> {
    #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
    let mut system = System::start(engine, dir)?;
    let (load_s, index_s, table_bytes) = local.block_on(rt, load_and_index(&system, params))?;
    eprintln!(
        "CURVE {engine}: {} documents loaded in {load_s:.0} s ({:.0}/s), index {index_s:.0} s more",
        params.records,
        params.records as f64 / load_s
    );
    // The load's pages are cached and charged to the cgroup this ran in, not to the
    // limited one: out of the page cache with them, file by file (no global
    // drop_caches on a shared machine).
    let evict = |data: &Path| -> Result<u64> {
        let (_, on_disk) = crate::space::dir_bytes(data);
        let evicted = evict_page_cache(data)?;
        eprintln!(
            "CURVE {engine}: {} MB on disk; asked the kernel to drop {} MB of its cached pages",
            on_disk / 1_000_000,
            evicted / 1_000_000
        );
        Ok(on_disk)
    };
    match system {
        #[cfg(feature = "postgres")]
        System::Postgres { ref mut server } => {
            let mut on_disk = 0;
            server.restart_in(curve.cgroup.as_deref(), |data| {
                on_disk = evict(data)?;
                empty_cgroup(curve)
            })?;
            Ok((system, load_s, index_s, on_disk, table_bytes))
        }
        _ => {
            drop(system);
            let on_disk = evict(&dir.join("kiln-data"))?;
            empty_cgroup(curve)?;
            let system = System::start(engine, dir)?;
            if let System::Kiln { proc, .. } = &system {
                enter_cgroup(&curve.cgroup, proc.child.id())?;
            }
            Ok((system, load_s, index_s, on_disk, table_bytes))
        }
    }
}

/// The load and the index on `n` (Kiln: the index first, then the bulk load,
/// then the wait for the index); the load's and the index's seconds, and
/// PostgreSQL's table-and-indexes size.
async fn load_and_index(system: &System, params: &Params) -> Result<(f64, f64, Option<u64>)> {
    crate::ycsb::setup(system).await?;
    #[cfg(feature = "postgres")]
    if let System::Postgres { server } = system {
        let (load_s, index_s) = pg_load(server.port, params).await?;
        let client = crate::ycsb::pg_connect_bare(server.port).await?;
        let size: i64 = client
            .query_one("SELECT pg_total_relation_size('usertable')", &[])
            .await?
            .get(0);
        return Ok((load_s, index_s, Some(size as u64)));
    }
    let mut c = KilnConn::connect(port(system)).await?;
    c.expect(
        hyper::Method::PUT,
        &format!("/dbs/{DB}/indexes/by-n"),
        Some("application/json"),
        serde_json::to_vec(&json!({"collection": "usertable", "fields": ["n"]}))?,
        &[200, 201],
    )
    .await?;
    let load_s = load(port(system), params).await?;
    let index_s = wait_index(port(system)).await?;
    Ok((load_s, index_s, None))
}

/// One CURVE job in `dir`, as a child's JSON object.
pub fn run(engine: &str, dir: &Path, params: &Params, curve: &Curve) -> Result<Value> {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let (system, load_s, index_s, on_disk, table_bytes) =
        load_and_restart(engine, dir, params, curve, &rt, &local)?;
    let mut rows = Vec::new();
    let rss_start = tree_rss_bytes(&system);
    local.block_on(&rt, async {
        let mut records = params.records;
        for ph in [Phase::Get, Phase::Put, Phase::YcsbB, Phase::Query] {
            let mut r = phase(&system, engine, ph, records, params, curve).await?;
            if let Phase::Put = ph {
                records += r["operations"].as_u64().unwrap_or(0);
            }
            r["bytes_on_disk"] = json!(on_disk);
            eprintln!(
                "  {:>5} {:>9.0} ops/s p50 {:>7.0} us p99 {:>8.0} us RSS {:>5} MiB disk reads {:>8.0} B/op",
                ph.name(),
                r["ops_per_sec"].as_f64().unwrap_or(0.0),
                r["p50_us"].as_f64().unwrap_or(0.0),
                r["p99_us"].as_f64().unwrap_or(0.0),
                r["rss_bytes"].as_u64().unwrap_or(0) >> 20,
                r["disk_read_bytes_per_op"].as_f64().unwrap_or(0.0)
            );
            rows.push(r);
        }
        Ok::<_, anyhow::Error>(())
    })?;
    drop(system);
    let summary = json!({
        "workload": "CURVE", "engine": engine, "documents": params.records,
        "load_seconds": load_s, "index_catch_up_seconds": index_s,
        "bytes_on_disk": on_disk, "table_and_index_bytes": table_bytes,
        "rss_bytes_at_start": rss_start, "cgroup": curve.cgroup, "phases": rows,
    });
    let out_rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"row": format!("CURVE {} N={}", r["phase"].as_str().unwrap_or("?"), params.records),
                   "unit": "ops/s", "value": r["ops_per_sec"], "lower_is_better": false})
        })
        .collect();
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "rows": out_rows,
        "extra": { "documents_row": summary },
    }))
}
