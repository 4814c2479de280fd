//! The server workloads of shared/BENCHMARKS.md: W8 (PUT per request), W8I (W8 with
//! indexes kept up), W9 (GET, and GET answered 304), each against a `kiln serve`
//! child on a fresh data directory, with Redis measured beside W8 and W9 in the
//! same run as the peer (`redisbench`).

use crate::httpbench::{self, request_bytes, ServerProcess};
use crate::procstat;
use crate::redisbench;
use crate::run::{progress, BenchResult, Run};
use crate::workload::SEED;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// A JSON document of about 1 KiB (W8, W9).
pub fn doc_1k(rng: &mut SmallRng, n: u64) -> Vec<u8> {
    let payload: String = (0..900)
        .map(|_| (b'a' + rng.gen_range(0..26)) as char)
        .collect();
    serde_json::to_vec(&json!({"name": format!("user-{n}"), "age": n % 100, "tags": ["bench", "w8"], "payload": payload}))
        .expect("serializable")
}

/// Starts `kiln serve` on a fresh data directory with a database `bench`.
pub fn fresh_server(dir: &Path) -> BenchResult<ServerProcess> {
    let flags: Vec<&str> = SERVE_FLAGS
        .get()
        .map(|f| f.iter().map(String::as_str).collect())
        .unwrap_or_default();
    fresh_server_with(dir, &flags)
}

/// `kiln bench --serve-flag`: extra `kiln serve` flags for the server workloads'
/// servers (to compare settings in one build, e.g. `--hyper-only`).
pub static SERVE_FLAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// `fresh_server` with extra `kiln serve` flags.
pub fn fresh_server_with(dir: &Path, args: &[&str]) -> BenchResult<ServerProcess> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let server = ServerProcess::start_with(dir, args)?;
    let (status, body) = httpbench::blocking_request(server.addr, "PUT", "/dbs/bench", b"")?;
    if status != 201 {
        return Err(format!(
            "creating the bench database: {status} {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    Ok(server)
}

/// The load's figures, the server's CPU per request since `server_cpu_before` and
/// its peak memory.
fn load_figures(
    r: &httpbench::LoadResult,
    connections: usize,
    server: &ServerProcess,
    server_cpu_before: f64,
) -> BenchResult<Map<String, Value>> {
    if let Some((status, body)) = r.unexpected.first() {
        return Err(format!("unexpected answer {status}: {body}").into());
    }
    let server_cpu_seconds = server.cpu_seconds()? - server_cpu_before;
    let per_request_us = |s: f64| s * 1e6 / r.requests.max(1) as f64;
    let mut extra = Map::new();
    extra.insert(
        "server_cpu_us_per_request".into(),
        json!(per_request_us(server_cpu_seconds)),
    );
    extra.insert(
        "load_generator_cpu_us_per_request".into(),
        json!(per_request_us(r.load_generator_cpu_seconds)),
    );
    extra.insert("connections".into(), json!(connections));
    extra.insert("requests_per_sec".into(), json!(r.per_sec()));
    extra.insert("p50_us".into(), json!(r.quantile_ms(0.5) * 1e3));
    extra.insert("p99_us".into(), json!(r.quantile_ms(0.99) * 1e3));
    extra.insert(
        "server_peak_rss_bytes".into(),
        json!(procstat::peak_rss_bytes(server.pid())?),
    );
    Ok(extra)
}

/// The server workloads' scale and the peer they are compared with.
#[derive(Debug, Clone, Copy)]
pub struct ServerLoad {
    pub connections: usize,
    /// W8's PUTs in all (and Redis's SETs).
    pub w8_requests: u64,
    /// W9's GETs in all (and Redis's GETs).
    pub w9_requests: u64,
    /// Measure Redis beside Kiln (skipped with a line when it is not installed).
    pub redis: bool,
    /// Measure Redis alone: the run's figures are Redis's.
    pub redis_only: bool,
}

impl ServerLoad {
    pub fn new(quick: bool, connections: usize, w8_requests: Option<u64>, redis: bool) -> Self {
        let connections = connections.max(1);
        let w8_requests = w8_requests.unwrap_or(if quick { 6_400 } else { 200_000 });
        ServerLoad {
            connections,
            w8_requests: w8_requests.max(connections as u64),
            w9_requests: if quick { 12_800 } else { 128_000 },
            redis,
            redis_only: false,
        }
    }

    fn per_connection(&self, requests: u64) -> usize {
        (requests / self.connections as u64).max(1) as usize
    }
}

/// W8: `connections` keep-alive connections PUT 1 KiB JSON documents, one per
/// request, to a `kiln serve` child process; then Redis (AOF, `appendfsync always`)
/// takes as many 1 KiB SETs from as many clients, in the same run, for the ratio.
pub fn w8(dir: &Path, load: ServerLoad, quick: bool) -> BenchResult<Run> {
    if load.redis_only {
        return redis_alone(
            dir,
            "set",
            load.connections,
            load.w8_requests,
            load.w8_requests,
        );
    }
    let mut run = w8_http(dir, quick, load.connections, Some(load.w8_requests))?;
    if load.redis {
        // Every SET a new key at first, as every W8 PUT is a new document.
        redis_peer(
            &mut run,
            dir,
            "set",
            load.connections,
            load.w8_requests,
            load.w8_requests,
        )?;
    }
    Ok(run)
}

/// Redis alone for `command`: a run whose figures are Redis's.
fn redis_alone(
    dir: &Path,
    command: &str,
    connections: usize,
    requests: u64,
    keyspace: u64,
) -> BenchResult<Run> {
    if !redisbench::available() {
        return Err("redis-server or redis-benchmark is not installed".into());
    }
    let r = redis_measure(dir, command, connections, requests, keyspace)?;
    let mut extra = Map::new();
    extra.insert("requests_per_sec".into(), json!(r.requests_per_sec));
    extra.insert("p50_us".into(), json!(r.p50_ms * 1e3));
    extra.insert("p99_us".into(), json!(r.p99_ms * 1e3));
    extra.insert(
        "server_cpu_us_per_request".into(),
        json!(r.server_cpu_us_per_request),
    );
    extra.insert(
        "server_peak_rss_bytes".into(),
        json!(r.server_peak_rss_bytes),
    );
    extra.insert("redis_version".into(), json!(r.version));
    extra.insert("redis_settings".into(), json!(redisbench::SETTINGS));
    Ok(Run {
        ops: requests,
        commits: requests,
        seconds: requests as f64 / r.requests_per_sec,
        extra,
    })
}

/// One throwaway Redis server measured for `command` (GET after SETs that fill the
/// keyspace).
fn redis_measure(
    dir: &Path,
    command: &str,
    connections: usize,
    requests: u64,
    keyspace: u64,
) -> BenchResult<redisbench::RedisResult> {
    let server = redisbench::RedisServer::start(&dir.with_extension("redis"))?;
    if command == "get" {
        // The keys GET reads: SETs over the keyspace first (random keys, ten
        // times as many as the keyspace, so that nearly all exist).
        server.benchmark("set", connections, keyspace * 10, keyspace)?;
    }
    Ok(server.benchmark(command, connections, requests, keyspace)?)
}

/// Measures Redis for `command` and puts its figures and the ratio in `run`.
fn redis_peer(
    run: &mut Run,
    dir: &Path,
    command: &str,
    connections: usize,
    requests: u64,
    keyspace: u64,
) -> BenchResult<()> {
    if !redisbench::available() {
        run.extra.insert(
            "redis_skipped".into(),
            json!("redis-server or redis-benchmark not installed"),
        );
        return Ok(());
    }
    // A peer that will not run here is a line in the report, not a failed benchmark.
    let r = match redis_measure(dir, command, connections, requests, keyspace) {
        Ok(r) => r,
        Err(e) => {
            run.extra
                .insert("redis_skipped".into(), json!(format!("Redis failed: {e}")));
            return Ok(());
        }
    };
    let ours = run.ops_per_sec();
    run.extra
        .insert("redis_requests_per_sec".into(), json!(r.requests_per_sec));
    run.extra
        .insert("redis_p50_us".into(), json!(r.p50_ms * 1e3));
    run.extra
        .insert("redis_p99_us".into(), json!(r.p99_ms * 1e3));
    run.extra.insert(
        "redis_server_cpu_us_per_request".into(),
        json!(r.server_cpu_us_per_request),
    );
    run.extra.insert(
        "redis_peak_rss_bytes".into(),
        json!(r.server_peak_rss_bytes),
    );
    run.extra.insert("redis_version".into(), json!(r.version));
    run.extra
        .insert("redis_settings".into(), json!(redisbench::SETTINGS));
    run.extra
        .insert("ratio_to_redis".into(), json!(ours / r.requests_per_sec));
    Ok(())
}

/// The HTTP part of W8 alone.
pub fn w8_http(
    dir: &Path,
    quick: bool,
    connections: usize,
    requests: Option<u64>,
) -> BenchResult<Run> {
    let load = ServerLoad::new(quick, connections, requests, false);
    w8_http_indexed(dir, load, false, false)
}

/// W8 with two indexes (users by age, by name) built in the background while it
/// runs, beside W8 without indexes measured right before (issue 17: >= 0.8x).
pub fn w8_indexed(dir: &Path, load: ServerLoad) -> BenchResult<Run> {
    let plain = w8_http_indexed(dir, load, false, false)?;
    let mut run = w8_http_indexed(dir, load, true, false)?;
    run.extra.insert(
        "w8_without_indexes_requests_per_sec".into(),
        json!(plain.ops_per_sec()),
    );
    run.extra.insert(
        "ratio_to_w8_without_indexes".into(),
        json!(run.ops_per_sec() / plain.ops_per_sec()),
    );
    Ok(run)
}

/// W8 with a backup chain active (issue 18: every write also goes to the backup
/// history, in the same transaction), beside W8 without one measured right before.
pub fn w8_chained(dir: &Path, load: ServerLoad) -> BenchResult<Run> {
    let plain = w8_http_indexed(dir, load, false, false)?;
    let mut run = w8_http_indexed(dir, load, false, true)?;
    run.extra.insert(
        "w8_without_chain_requests_per_sec".into(),
        json!(plain.ops_per_sec()),
    );
    for k in ["journal_bytes_per_write", "p99_us"] {
        if let Some(v) = plain.extra.get(k) {
            run.extra.insert(format!("w8_without_chain_{k}"), v.clone());
        }
    }
    run.extra.insert(
        "ratio_to_w8_without_chain".into(),
        json!(run.ops_per_sec() / plain.ops_per_sec()),
    );
    Ok(run)
}

/// Starts a backup chain on the `bench` database of `server` (a full backup with
/// chain=true of the empty database) and waits until it is recorded.
fn start_chain(server: &ServerProcess) -> BenchResult<()> {
    let (status, text) =
        httpbench::blocking_request(server.addr, "GET", "/dbs/bench/backup?chain=true", b"")?;
    // The answer streams (this client reads only its head): the chain starts on
    // the server's side; wait until it is recorded.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, chain) =
            httpbench::blocking_request(server.addr, "GET", "/dbs/bench/backup/chain", b"")?;
        if status == 200 && String::from_utf8_lossy(&chain).contains("\"active\":true") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "starting the backup chain: {status} {}",
                String::from_utf8_lossy(&text)
                    .chars()
                    .take(200)
                    .collect::<String>()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn w8_http_indexed(dir: &Path, load: ServerLoad, indexes: bool, chain: bool) -> BenchResult<Run> {
    let server = fresh_server(dir)?;
    if chain {
        start_chain(&server)?;
    }
    if indexes {
        for (name, field) in [("users-by-age", "age"), ("users-by-name", "name")] {
            let body = json!({"collection": "users", "fields": [field]}).to_string();
            let (status, text) = httpbench::blocking_request(
                server.addr,
                "PUT",
                &format!("/dbs/bench/indexes/{name}"),
                body.as_bytes(),
            )?;
            if status != 201 {
                return Err(format!(
                    "defining {name}: {status} {}",
                    String::from_utf8_lossy(&text)
                )
                .into());
            }
        }
    }
    w8_load(&server, load, "users", "W8")
}

/// W8's load (`load.w8_requests` PUTs of new 1 KiB documents `{prefix}/{c}-{i}`
/// over `load.connections` connections) on a running server's `bench` database.
pub fn w8_load(
    server: &ServerProcess,
    load: ServerLoad,
    prefix: &str,
    label: &str,
) -> BenchResult<Run> {
    let connections = load.connections;
    let per_connection = load.per_connection(load.w8_requests);
    let mut rng = SmallRng::seed_from_u64(SEED);
    let bodies: Vec<Vec<u8>> = (0..256).map(|n| doc_1k(&mut rng, n)).collect();
    let prefix = prefix.to_string();
    let pb = progress((connections * per_connection) as u64, label);
    let server_cpu_before = server.cpu_seconds()?;
    let r = httpbench::run_load(
        server.addr,
        connections,
        per_connection,
        201,
        move |c, i| {
            request_bytes(
                "PUT",
                &format!("/dbs/bench/docs/{prefix}/{c}-{i}"),
                &[("content-type", "application/json")],
                &bodies[(c * 31 + i) % bodies.len()],
            )
        },
        &pb,
    )?;
    pb.finish_and_clear();
    let mut extra = load_figures(&r, connections, server, server_cpu_before)?;
    let (_, stats) = httpbench::blocking_request(server.addr, "GET", "/dbs/bench", b"")?;
    let stats: Value = serde_json::from_slice(&stats)?;
    extra.insert(
        "avg_group_size".into(),
        stats["engine"]["avg_group_units"].clone(),
    );
    for k in [
        "journal_write_p50_us",
        "journal_write_p99_us",
        "journal_writes",
        "journal_bytes",
        "commit_units",
        "data_syncs",
        "write_buffer_keys_merged_ahead",
    ] {
        extra.insert(k.into(), stats["engine"][k].clone());
    }
    if let (Some(bytes), Some(writes)) = (
        stats["engine"]["journal_bytes"].as_f64(),
        stats["engine"]["journal_writes"].as_f64(),
    ) {
        extra.insert(
            "journal_bytes_per_write".into(),
            json!(bytes / writes.max(1.0)),
        );
        extra.insert(
            "requests_per_journal_write".into(),
            json!(r.requests as f64 / writes.max(1.0)),
        );
    }
    Ok(Run {
        ops: r.requests,
        commits: r.requests,
        seconds: r.seconds,
        extra,
    })
}

/// W9's documents: `docs` 1 KiB documents `users/{n}` written in batches of 500;
/// their etags, quoted as If-None-Match wants them.
fn preload_users(server: &ServerProcess, docs: usize) -> BenchResult<Vec<String>> {
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut etags = Vec::with_capacity(docs);
    for chunk in (0..docs).collect::<Vec<_>>().chunks(500) {
        let ops: Vec<Value> = chunk
            .iter()
            .map(|&n| {
                let doc: Value =
                    serde_json::from_slice(&doc_1k(&mut rng, n as u64)).expect("valid");
                json!({"op": "put", "id": format!("users/{n}"), "document": doc})
            })
            .collect();
        let body = serde_json::to_vec(&json!({ "ops": ops }))?;
        let (status, answer) =
            httpbench::blocking_request(server.addr, "POST", "/dbs/bench/batch", &body)?;
        if status != 200 {
            return Err(format!(
                "preload batch: {status} {}",
                String::from_utf8_lossy(&answer)
            )
            .into());
        }
        let answer: Value = serde_json::from_slice(&answer)?;
        for r in answer["results"]
            .as_array()
            .ok_or("batch answer without results")?
        {
            etags.push(format!(
                "\"{}\"",
                r["etag"].as_str().ok_or("batch result without etag")?
            ));
        }
    }
    Ok(etags)
}

/// W9: `connections` connections GET existing documents at random, with
/// If-None-Match of the current etag (every answer a 304) or without (200s).
pub fn w9(dir: &Path, load: ServerLoad, quick: bool, conditional: bool) -> BenchResult<Run> {
    let docs: usize = if quick { 2_000 } else { 10_000 };
    let connections = load.connections;
    if load.redis_only {
        if conditional {
            return Err("Redis has no conditional GET: W9 304 has no Redis run".into());
        }
        return redis_alone(dir, "get", connections, load.w9_requests, docs as u64);
    }
    let per_connection = load.per_connection(load.w9_requests);
    let server = fresh_server(dir)?;
    let etags = preload_users(&server, docs)?;
    let label = if conditional { "W9 304" } else { "W9 GET" };
    let pb = progress((connections * per_connection) as u64, label);
    let server_cpu_before = server.cpu_seconds()?;
    let r = httpbench::run_load(
        server.addr,
        connections,
        per_connection,
        if conditional { 304 } else { 200 },
        move |c, i| {
            let n = (c * 7919 + i * 104_729) % docs;
            let path = format!("/dbs/bench/docs/users/{n}");
            if conditional {
                request_bytes("GET", &path, &[("if-none-match", &etags[n])], b"")
            } else {
                request_bytes("GET", &path, &[], b"")
            }
        },
        &pb,
    )?;
    pb.finish_and_clear();
    let mut extra = load_figures(&r, connections, &server, server_cpu_before)?;
    extra.insert("documents".into(), json!(docs));
    drop(server);
    let mut run = Run {
        ops: r.requests,
        commits: r.requests,
        seconds: r.seconds,
        extra,
    };
    // Redis has no conditional GET: it is the peer of the plain one only.
    if load.redis && !conditional {
        redis_peer(
            &mut run,
            dir,
            "get",
            connections,
            load.w9_requests,
            docs as u64,
        )?;
    }
    Ok(run)
}
