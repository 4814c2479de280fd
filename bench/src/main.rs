//! Comparative benchmark: the workloads of shared/BENCHMARKS.md (W1-W6) run against
//! Kiln and its peers (SQLite, LMDB, redb, fjall, RocksDB; PostgreSQL for W6 only), each
//! commit durable by the engine's own mechanism. The parameters are those of `kiln bench`
//! (crates/kiln-bench): the same seed, keys, values and operation counts, taken from
//! its `workload` module.
//!
//! The parent process runs every (engine, workload, run) in a child process — this
//! binary re-executed — in a fresh directory under `--dir`, one after another. Each
//! child prints one JSON line; the parent takes medians, prints a Markdown table with
//! the ratio of Kiln to the best peer, and writes every figure to `--out`.

mod curve;
mod docbench;
mod engines;
mod server;
mod soak;
mod space;
mod ycsb;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_bench::stats::{median, quantile};
use kiln_bench::workload::{self, Fill, Puts, Values, KEY_BYTES, SEED, VALUE_BYTES};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

include!(concat!(env!("OUT_DIR"), "/versions.rs"));

#[derive(Parser, Debug)]
#[command(
    name = "kiln-bench",
    about = "Kiln against its peers on the workloads of BENCHMARKS.md"
)]
struct Args {
    /// Comma-separated engines: kiln, sqlite, lmdb, redb, fjall, rocksdb, postgres
    /// (W6 only; a throwaway server of its own, skipped if PostgreSQL is not
    /// installed), redis (W8 and W9 only, against `kiln serve`; skipped if Debian's
    /// redis-server is not installed).
    #[arg(
        long,
        default_value = "kiln,sqlite,lmdb,redb,fjall,rocksdb,postgres,redis"
    )]
    engines: String,
    /// Comma-separated workloads: W1, W2, W3, W4, W5, W6 (embedded engines), W8, W9
    /// (`kiln serve` over HTTP against Redis, through `kiln bench`), YA..YF (the
    /// YCSB core workloads A-F against kiln serve, PostgreSQL and, for A-C and F,
    /// Redis, each over its own network protocol; docs/ycsb.md), W16 (full-text
    /// search: kiln serve against SQLite FTS5 and PostgreSQL) and W17 (aggregations:
    /// kiln serve's reduce index against PostgreSQL's GROUP BY); W16 and W17 are not
    /// in the default list; nor are SPACE (bytes on disk after a YCSB load: kiln
    /// serve, PostgreSQL, SQLite) and SOAK (kiln serve under YCSB A for a while).
    #[arg(long, default_value = "W1,W2,W3,W4,W5,W6,W8,W9")]
    workloads: String,
    /// 1/20 of the operations of every workload: the whole suite in about a minute.
    #[arg(long)]
    quick: bool,
    /// Runs per engine and workload, the median reported. Default: 3, or 1 when the
    /// first run takes over 10 s.
    #[arg(long)]
    runs: Option<usize>,
    /// Thread counts for W6.
    #[arg(long, default_value = "1,8,64")]
    threads: String,
    /// Client counts of the YCSB run phases (default 1,16,64; 16 with --quick).
    #[arg(long)]
    ycsb_clients: Option<String>,
    /// Records the YCSB load phase inserts (default 100,000; 5,000 with --quick).
    #[arg(long)]
    ycsb_records: Option<u64>,
    /// Operations of each YCSB run phase, per client count (default 200,000;
    /// 5,000 with --quick); a run phase also stops after 20 s (5 s with --quick).
    #[arg(long)]
    ycsb_ops: Option<u64>,
    /// Seconds a YCSB run phase lasts at most, per client count (default 20; 5
    /// with --quick).
    #[arg(long)]
    ycsb_seconds: Option<f64>,
    /// SOAK (kiln serve under YCSB A and a mixed load, docs/benchmarks.md "Soak"):
    /// how long it runs (default 600 s; 60 with --quick), a row every --soak-interval seconds
    /// (default 60; 10 with --quick), with --ycsb-clients clients (default 16) on
    /// --ycsb-records records (default 100,000).
    #[arg(long)]
    soak_seconds: Option<f64>,
    #[arg(long)]
    soak_interval: Option<f64>,
    /// SOAK fails if RSS, the data file or the data directory ends over this many
    /// times its size after the first interval (plus slack), ...
    #[arg(long, default_value_t = 2.0)]
    soak_max_growth: f64,
    /// ... or if there are ever more journal files than this.
    #[arg(long, default_value_t = 16)]
    soak_max_journal_files: u64,
    /// ... or if YCSB's p99 in the last interval is over max(this many times the
    /// first interval's, the first's + 5 ms).
    #[arg(long, default_value_t = 3.0)]
    soak_max_p99_growth: f64,
    /// SOAK: seconds between two full backups of the soaked database (default 120;
    /// the first half an interval in).
    #[arg(long, default_value_t = 120.0)]
    soak_backup_interval: f64,
    /// SOAK: where to draw the intervals (RSS, disk, p99, throughput) as SVG
    /// (default: --out with the extension .svg).
    #[arg(long)]
    soak_plot: Option<PathBuf>,
    /// CURVE (bench/scripts/cost_curve.sh): seconds of each phase (default 30) and
    /// the memory cgroup (v1) the server runs in after the load.
    #[arg(long)]
    curve_seconds: Option<f64>,
    #[arg(long)]
    curve_cgroup: Option<PathBuf>,
    /// Directory to run in: a fresh subdirectory per run, removed afterwards.
    #[arg(long, default_value = "./bench-data")]
    dir: PathBuf,
    /// Where to write every figure as JSON.
    #[arg(long, default_value = "bench-results.json")]
    out: PathBuf,

    /// (internal) Run one workload against one engine in this process.
    #[arg(long, hide = true)]
    child_engine: Option<String>,
    #[arg(long, hide = true)]
    child_workload: Option<String>,
    #[arg(long, hide = true, default_value_t = 1)]
    child_threads: u64,
}

// ---------------------------------------------------------------------------------
// Workloads (run in the child)
// ---------------------------------------------------------------------------------

/// One figure a workload reports.
fn row(name: &str, unit: &str, value: f64, lower_is_better: bool) -> Value {
    json!({ "row": name, "unit": unit, "value": value, "lower_is_better": lower_is_better })
}

fn scaled(full: u64, quick: bool) -> u64 {
    if quick {
        (full / 20).max(1)
    } else {
        full
    }
}

/// W1: transactions of one 16 KiB random value under a sequential 8-byte big-endian
/// key, each durable.
fn w1(db: &dyn engines::Engine, quick: bool) -> Result<(Vec<Value>, f64, Map<String, Value>)> {
    let n = scaled(workload::W1_COMMITS, quick);
    let mut values = Values::w1();
    let mut value = vec![0u8; workload::W1_VALUE_BYTES];
    let start = Instant::now();
    for i in 0..n {
        values.next(&mut value);
        db.commit(&[(&i.to_be_bytes(), &value)])?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let ms_per_commit = seconds * 1e3 / n as f64;
    let mut extra = Map::new();
    extra.insert("transactions".into(), json!(n));
    extra.insert("total_ms".into(), json!(seconds * 1e3));
    extra.insert("commits_per_sec".into(), json!(n as f64 / seconds));
    Ok((
        vec![row("W1 journal-16k", "ms/commit", ms_per_commit, true)],
        seconds,
        extra,
    ))
}

/// W2/W3/W4 (and W5's data): `txns` durable transactions of `per_txn` puts of 16-byte
/// keys and 100-byte random values, keys sequential big-endian or random, generated as
/// `kiln bench` generates them. Returns the seconds taken and, if asked, the keys.
fn fill(
    db: &dyn engines::Engine,
    txns: u64,
    per_txn: u64,
    sequential: bool,
    keep_keys: bool,
) -> Result<(f64, Vec<[u8; KEY_BYTES]>)> {
    let mut puts = Puts::fill(sequential);
    let mut kept = Vec::new();
    let mut keys = vec![[0u8; KEY_BYTES]; per_txn as usize];
    let mut values = vec![[0u8; VALUE_BYTES]; per_txn as usize];
    let start = Instant::now();
    for _ in 0..txns {
        for (key, value) in keys.iter_mut().zip(values.iter_mut()) {
            puts.next(key, value);
        }
        let pairs: Vec<engines::Pair> = keys
            .iter()
            .zip(values.iter())
            .map(|(k, v)| (&k[..], &v[..]))
            .collect();
        db.commit(&pairs)?;
        if keep_keys {
            kept.extend_from_slice(&keys);
        }
    }
    Ok((start.elapsed().as_secs_f64(), kept))
}

fn fill_workload(
    db: &dyn engines::Engine,
    name: &str,
    spec: Fill,
    quick: bool,
) -> Result<(Vec<Value>, f64, Map<String, Value>)> {
    let (txns, per_txn) = (scaled(spec.txns, quick), spec.per_txn);
    let (seconds, _) = fill(db, txns, per_txn, spec.sequential, false)?;
    let puts = txns * per_txn;
    let mut extra = Map::new();
    extra.insert("puts".into(), json!(puts));
    extra.insert("transactions".into(), json!(txns));
    extra.insert("seconds".into(), json!(seconds));
    extra.insert("ms_per_commit".into(), json!(seconds * 1e3 / txns as f64));
    Ok((
        vec![row(name, "puts/s", puts as f64 / seconds, false)],
        seconds,
        extra,
    ))
}

/// W5: the W3 data, reopened, one warming scan, then a full forward scan, a full
/// reverse scan and random point gets of existing keys (one thread, then the same
/// gets split between two threads).
fn w5(engine: &str, dir: &Path, quick: bool) -> Result<(Vec<Value>, f64, Map<String, Value>)> {
    let w3 = workload::W3;
    let db = engines::open(engine, dir)?;
    let (fill_seconds, keys) = fill(
        &*db,
        scaled(w3.txns, quick),
        w3.per_txn,
        w3.sequential,
        true,
    )?;
    db.close()?;
    let n = keys.len() as u64;
    let db = engines::open(engine, dir)?;
    let scans = w5_scans(&*db, engine, n)?;
    let gets = scaled(1_000_000, quick);
    let mut rng = SmallRng::seed_from_u64(SEED ^ 0x5735);
    let lookup: Vec<[u8; KEY_BYTES]> = (0..gets)
        .map(|_| keys[rng.gen_range(0..keys.len())])
        .collect();
    let (get_s, get2_s) = w5_gets(&*db, engine, &lookup)?;
    db.close()?;
    let mut extra = Map::new();
    extra.insert("entries".into(), json!(n));
    extra.insert("gets".into(), json!(gets));
    extra.insert("fill_seconds".into(), json!(fill_seconds));
    extra.insert("forward_scan_seconds".into(), json!(scans.forward_s));
    extra.insert("forward_scan_bytes".into(), json!(scans.forward_bytes));
    extra.insert("reverse_scan_seconds".into(), json!(scans.reverse_s));
    extra.insert("gets_seconds".into(), json!(get_s));
    extra.insert("gets_two_threads_seconds".into(), json!(get2_s));
    let (fwd_s, rev_s) = (scans.forward_s, scans.reverse_s);
    Ok((
        vec![
            row("W5 scan forward", "reads/s", n as f64 / fwd_s, false),
            row("W5 scan reverse", "reads/s", n as f64 / rev_s, false),
            row("W5 random gets", "reads/s", gets as f64 / get_s, false),
            row("W5 random gets T=2", "reads/s", gets as f64 / get2_s, false),
        ],
        fwd_s + rev_s + get_s + get2_s,
        extra,
    ))
}

/// W5's timed scans.
struct W5Scans {
    forward_s: f64,
    forward_bytes: u64,
    reverse_s: f64,
}

/// W5's scans of the `n` entries: one warming scan (not timed), then a full
/// forward and a full reverse scan, each timed and checked.
fn w5_scans(db: &dyn engines::Engine, engine: &str, n: u64) -> Result<W5Scans> {
    let (warm, _) = db.scan(false)?;
    if warm != n {
        bail!("{engine}: warming scan saw {warm} entries, {n} were written");
    }
    let t = Instant::now();
    let (fwd, forward_bytes) = db.scan(false)?;
    let forward_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (rev, _) = db.scan(true)?;
    let reverse_s = t.elapsed().as_secs_f64();
    if fwd != n || rev != n {
        bail!("{engine}: scans saw {fwd} / {rev} entries, {n} were written");
    }
    Ok(W5Scans {
        forward_s,
        forward_bytes,
        reverse_s,
    })
}

/// W5's point gets of `lookup` (existing keys): from one thread, then the same
/// gets from two; the seconds of each, every get checked to find its key.
fn w5_gets(
    db: &dyn engines::Engine,
    engine: &str,
    lookup: &[[u8; KEY_BYTES]],
) -> Result<(f64, f64)> {
    let gets = lookup.len() as u64;
    let t = Instant::now();
    let found = db.gets(lookup)?;
    let get_s = t.elapsed().as_secs_f64();
    if found != gets {
        bail!("{engine}: {found} of {gets} point gets found their key");
    }
    // The same gets from two threads at once, half each (readers that never block
    // each other finish in about half the time on two cores).
    let (first_half, second_half) = lookup.split_at(lookup.len() / 2);
    let t = Instant::now();
    let found_by_two = std::thread::scope(|s| -> Result<u64> {
        let other = s.spawn(move || db.gets(second_half));
        let here = db.gets(first_half)?;
        let there = other
            .join()
            .map_err(|_| anyhow!("{engine}: a get thread panicked"))??;
        Ok(here + there)
    })?;
    let get2_s = t.elapsed().as_secs_f64();
    if found_by_two != gets {
        bail!("{engine}: {found_by_two} of {gets} point gets from two threads found their key");
    }
    Ok((get_s, get2_s))
}

/// W6: `threads` threads each committing transactions of one random put, durable,
/// 20,000 commits in total (the keys and values of `kiln bench` W6).
fn w6(
    db: &dyn engines::Engine,
    quick: bool,
    threads: u64,
) -> Result<(Vec<Value>, f64, Map<String, Value>)> {
    let total = scaled(workload::W6_COMMITS, quick);
    let per_thread = (total / threads).max(1);
    // Each thread's client (its own connection, for a server), opened before the clock.
    let opened = Instant::now();
    let clients = (0..threads)
        .map(|_| db.client())
        .collect::<Result<Vec<_>>>()?;
    let clients_open_seconds = opened.elapsed().as_secs_f64();
    let start = Instant::now();
    let latencies: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .into_iter()
            .zip(0u64..)
            .map(|(mut client, t)| {
                s.spawn(move || -> Result<Vec<u32>> {
                    let mut puts = Puts::w6_thread(t);
                    let mut lat = Vec::with_capacity(per_thread as usize);
                    for _ in 0..per_thread {
                        let (mut key, mut value) = ([0u8; KEY_BYTES], [0u8; VALUE_BYTES]);
                        puts.next(&mut key, &mut value);
                        let begin = Instant::now();
                        client.commit_one(&key, &value)?;
                        lat.push(begin.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("W6 thread panicked"))?)
            .collect::<Result<_>>()
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let mut all: Vec<u32> = latencies.into_iter().flatten().collect();
    all.sort_unstable();
    let q = |f: f64| quantile(&all, f);
    let commits = all.len() as u64;
    let mut extra = Map::new();
    extra.insert("threads".into(), json!(threads));
    extra.insert("commits".into(), json!(commits));
    extra.insert("p50_us".into(), json!(q(0.50)));
    extra.insert("p99_us".into(), json!(q(0.99)));
    extra.insert("clients_open_seconds".into(), json!(clients_open_seconds));
    Ok((
        vec![row(
            &format!("W6 T={threads}"),
            "commits/s",
            commits as f64 / seconds,
            false,
        )],
        seconds,
        extra,
    ))
}

/// The child: one workload against one engine, in `dir`; prints one JSON line.
fn child(engine: &str, workload: &str, dir: &Path, quick: bool, threads: u64) -> Result<()> {
    let (rows, seconds, extra) = match workload {
        "W5" => w5(engine, dir, quick)?,
        wl => {
            let db = engines::open(engine, dir)?;
            let mut out = match wl {
                "W1" => w1(&*db, quick)?,
                "W2" => fill_workload(&*db, "W2 fill-seq", workload::W2, quick)?,
                "W3" => fill_workload(&*db, "W3 fill-rnd", workload::W3, quick)?,
                "W4" => fill_workload(&*db, "W4 fill-rnd-10k-tx", workload::W4, quick)?,
                "W6" => w6(&*db, quick, threads)?,
                other => bail!("unknown workload {other:?} (available: W1..W6)"),
            };
            out.2.extend(db.info());
            db.close()?;
            out
        }
    };
    let line = json!({
        "engine": engine,
        "workload": workload,
        "threads": threads,
        "rows": rows,
        "seconds": seconds,
        "extra": extra,
    });
    println!("{line}");
    Ok(())
}

// ---------------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------------

/// One (workload, variant) the parent runs for every engine.
struct Job {
    workload: String,
    threads: u64,
    label: String,
}

/// The figures of one row for one engine across runs.
#[derive(Default)]
struct Cell {
    values: Vec<f64>,
    extras: Vec<Value>,
    unit: String,
    lower_is_better: bool,
}

fn spawn_child(args: &Args, engine: &str, job: &Job, run_dir: &Path) -> Result<Value> {
    if server::WORKLOADS.contains(&job.workload.as_str()) {
        return server::run(engine, &job.workload, run_dir, args.quick);
    }
    if docbench::WORKLOADS.contains(&job.workload.as_str()) {
        return docbench::run(engine, &job.workload, &run_dir.join("docs"), args.quick);
    }
    if curve::WORKLOADS.contains(&job.workload.as_str()) {
        let params = ycsb::Params::new(args.quick, None, args.ycsb_records, None)?;
        let c = curve::Curve {
            seconds: args
                .curve_seconds
                .unwrap_or(if args.quick { 5.0 } else { 30.0 }),
            clients: args
                .ycsb_clients
                .as_deref()
                .unwrap_or("16")
                .trim()
                .parse()?,
            cgroup: args.curve_cgroup.clone(),
        };
        return curve::run(engine, &run_dir.join("curve"), &params, &c);
    }
    if soak::WORKLOADS.contains(&job.workload.as_str()) {
        let params = ycsb::Params::new(false, None, args.ycsb_records, None)?;
        let clients = args
            .ycsb_clients
            .as_deref()
            .unwrap_or("16")
            .trim()
            .parse()?;
        let soak = soak::Soak {
            seconds: args
                .soak_seconds
                .unwrap_or(if args.quick { 60.0 } else { 600.0 }),
            interval_seconds: args
                .soak_interval
                .unwrap_or(if args.quick { 10.0 } else { 60.0 }),
            clients,
            max_growth: args.soak_max_growth,
            max_journal_files: args.soak_max_journal_files,
            backup_interval_seconds: args.soak_backup_interval,
            max_p99_growth: args.soak_max_p99_growth,
            plot: Some(
                args.soak_plot
                    .clone()
                    .unwrap_or_else(|| args.out.with_extension("svg")),
            ),
        };
        return soak::run(&run_dir.join("soak"), &params, &soak);
    }
    if space::WORKLOADS.contains(&job.workload.as_str()) {
        let params = ycsb::Params::new(args.quick, None, args.ycsb_records, None)?;
        return space::run(engine, &run_dir.join("space"), &params);
    }
    if ycsb::WORKLOADS.contains(&job.workload.as_str()) {
        let mut params = ycsb::Params::new(
            args.quick,
            args.ycsb_clients.as_deref(),
            args.ycsb_records,
            args.ycsb_ops,
        )?;
        if let Some(s) = args.ycsb_seconds.filter(|s| *s > 0.0) {
            params.max_seconds = s;
        }
        return ycsb::run(engine, &job.workload, &ycsb::job_dir(run_dir), &params);
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--child-engine")
        .arg(engine)
        .arg("--child-workload")
        .arg(&job.workload)
        .arg("--child-threads")
        .arg(job.threads.to_string())
        .arg("--dir")
        .arg(run_dir);
    if args.quick {
        cmd.arg("--quick");
    }
    cmd.stderr(std::process::Stdio::piped());
    let out = cmd.output().context("spawning the child")?;
    if !out.status.success() {
        let last = last_line(&out.stderr);
        let last = last.as_str();
        if out.status.code() == Some(engines::UNAVAILABLE_EXIT) {
            let why = last.trim().trim_start_matches("kiln-bench: ");
            let why = why.strip_prefix(&format!("{engine}: ")).unwrap_or(why);
            return Err(engines::Unavailable(why.to_string()).into());
        }
        bail!("child exited with {}: {}", out.status, last.trim());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("child printed no JSON line"))?;
    Ok(serde_json::from_str(line)?)
}

/// The last non-empty line a child printed (its error, when it failed).
fn last_line(output: &[u8]) -> String {
    String::from_utf8_lossy(output)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

fn fmt_value(v: f64, unit: &str) -> String {
    if unit == "ms/commit" || (unit == "ms" && v < 10.0) {
        format!("{v:.3}")
    } else if v >= 100.0 {
        // Thousands separators keep wide numbers readable.
        let s = format!("{:.0}", v);
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else {
        format!("{v:.1}")
    }
}

fn machine() -> Value {
    use kiln_bench::machine;
    json!({
        "cores": machine::cores().unwrap_or(0),
        "cpu": machine::cpu_model().unwrap_or_else(|| "unknown".into()),
        "kernel": machine::kernel().unwrap_or_else(|| "unknown".into()),
        "memory_gib": machine::memory_gib(),
    })
}

/// The file system holding `dir`: (type, mount point, device) from /proc/self/mounts.
fn file_system(dir: &Path) -> Value {
    let path = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    match kiln_bench::machine::mount_of(&path) {
        Some(m) => {
            json!({ "path": path, "type": m.fs_type, "mount_point": m.point, "device": m.source })
        }
        None => json!({ "path": path, "type": "unknown" }),
    }
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's civil_from_days).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Engine -> why (it cannot run here, it does not run a workload, it failed).
type Reasons = BTreeMap<String, String>;
/// Job label -> engine -> why.
type ByJob = BTreeMap<String, Reasons>;

/// The engines of `--engines`, all known ones.
fn plan_engines(args: &Args) -> Result<Vec<String>> {
    let engines: Vec<String> = args
        .engines
        .split(',')
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .collect();
    if let Some(bad) = engines.iter().find(|e| !engines::ALL.contains(&e.as_str())) {
        bail!(
            "unknown engine {bad:?} (known: {})",
            engines::ALL.join(", ")
        );
    }
    Ok(engines)
}

/// The jobs of `--workloads`: one per workload, W6 one per thread count.
fn plan_jobs(args: &Args) -> Result<Vec<Job>> {
    let threads: Vec<u64> = args
        .threads
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .filter(|t| *t > 0)
        .collect();
    let mut jobs = Vec::new();
    for wl in args
        .workloads
        .split(',')
        .map(|w| w.trim().to_ascii_uppercase())
        .filter(|w| !w.is_empty())
    {
        match wl.as_str() {
            "W1" | "W2" | "W3" | "W4" | "W5" | "W8" | "W9" | "YA" | "YB" | "YC" | "YD" | "YE"
            | "YF" | "W16" | "W17" | "SPACE" | "SOAK" | "CURVE" => jobs.push(Job {
                label: wl.clone(),
                workload: wl,
                threads: 1,
            }),
            "W6" => {
                for &t in &threads {
                    jobs.push(Job {
                        workload: wl.clone(),
                        threads: t,
                        label: format!("W6 T={t}"),
                    })
                }
            }
            other => {
                bail!("unknown workload {other:?} (available: W1, W2, W3, W4, W5, W6, W8, W9, YA..YF, W16, W17, SPACE, SOAK, CURVE)")
            }
        }
    }
    Ok(jobs)
}

/// The engines built in and available here, and why the others are not (said on
/// stderr as they are found).
fn runnable_engines(engines: &[String]) -> (Vec<String>, Reasons) {
    let mut missing = Reasons::new();
    let mut runnable = Vec::new();
    for e in engines {
        match engines::missing_reason(e) {
            Some(why) => {
                eprintln!("{e}: {why}");
                missing.insert(e.clone(), why);
            }
            None => runnable.push(e.clone()),
        }
    }
    (runnable, missing)
}

/// Engines that do not run some workloads at all (PostgreSQL: W6 only).
fn not_applicable(jobs: &[Job], engines: &[String]) -> ByJob {
    let mut na = ByJob::new();
    for job in jobs {
        for engine in engines {
            if let Some(why) = engines::not_applicable(engine, &job.workload) {
                na.entry(job.label.clone())
                    .or_default()
                    .insert(engine.clone(), why.to_string());
            }
        }
    }
    na
}

fn applies(na: &ByJob, engine: &str, job: &Job) -> bool {
    na.get(&job.label).is_none_or(|m| !m.contains_key(engine))
}

/// What the runs gave: row name -> engine -> cell, rows in first-seen order; and
/// the failed runs.
#[derive(Default)]
struct Collected {
    row_order: Vec<String>,
    cells: BTreeMap<String, BTreeMap<String, Cell>>,
    errors: ByJob,
    /// The YCSB jobs' flat rows (workload, engine, clients, ops_per_sec, p99_us,
    /// ...), one per run phase of every run.
    ycsb: Vec<Value>,
    /// The W16/W17 jobs' flat rows (workload, engine and every figure), one per run.
    documents: Vec<Value>,
}

/// Every job for every engine that runs it, one child process per run; engines
/// that turn out unavailable go to `missing`.
fn run_suite(
    args: &Args,
    jobs: &[Job],
    runnable: &[String],
    na: &ByJob,
    missing: &mut Reasons,
) -> Result<Collected> {
    let planned = jobs
        .iter()
        .map(|j| runnable.iter().filter(|e| applies(na, e, j)).count())
        .sum::<usize>();
    let pb = ProgressBar::new(planned as u64);
    pb.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] [{bar:30}] {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let mut collected = Collected::default();
    for job in jobs {
        for engine in runnable {
            if !applies(na, engine, job) {
                continue;
            }
            // An engine already in `missing` became unavailable in an earlier job
            // (its server would not start).
            if !missing.contains_key(engine) {
                run_engine_job(args, engine, job, &pb, &mut collected, missing)?;
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    Ok(collected)
}

/// The runs of one job for one engine: `--runs` of them (default 3, or 1 when the
/// first takes over 10 s), or fewer if one fails or finds the engine unavailable.
fn run_engine_job(
    args: &Args,
    engine: &str,
    job: &Job,
    pb: &ProgressBar,
    collected: &mut Collected,
    missing: &mut Reasons,
) -> Result<()> {
    let mut run = 0usize;
    loop {
        run += 1;
        pb.set_message(format!("{} {engine} run {run}", job.label));
        let run_dir = args.dir.join(format!(
            "{engine}-{}-{}-{}",
            job.label.replace([' ', '='], ""),
            run,
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(&run_dir)?;
        let t = Instant::now();
        let res = spawn_child(args, engine, job, &run_dir);
        let _ = std::fs::remove_dir_all(&run_dir);
        let out = match res {
            Ok(v) => v,
            Err(e) if e.is::<engines::Unavailable>() => {
                // Built in, but cannot run here: one line, and the suite goes on.
                let why = format!("skipped: {e}");
                pb.suspend(|| eprintln!("{engine}: {why}"));
                missing.insert(engine.to_string(), why);
                return Ok(());
            }
            Err(e) => {
                let msg = format!("{e:#}");
                pb.suspend(|| eprintln!("{} {engine}: FAILED: {msg}", job.label));
                collected
                    .errors
                    .entry(job.label.clone())
                    .or_default()
                    .insert(engine.to_string(), msg);
                return Ok(());
            }
        };
        let summary = collect_rows(&out, engine, collected);
        pb.suspend(|| {
            eprintln!(
                "  {engine:<8} run {run}: {} ({:.1} s wall)",
                summary.join(", "),
                t.elapsed().as_secs_f64()
            )
        });
        let seconds = out["seconds"].as_f64().unwrap_or(0.0);
        let wanted = match args.runs {
            Some(n) => n.max(1),
            None if run == 1 && seconds > 10.0 => 1,
            None => 3,
        };
        if run >= wanted {
            return Ok(());
        }
    }
}

/// Adds the rows of one child's answer to the cells of `engine`; returns them as
/// "name value unit" for the progress line.
fn collect_rows(out: &Value, engine: &str, collected: &mut Collected) -> Vec<String> {
    let mut summary = Vec::new();
    if let Some(rows) = out["extra"]["ycsb"].as_array() {
        collected.ycsb.extend(rows.iter().cloned());
    }
    if out["extra"]["documents_row"].is_object() {
        collected
            .documents
            .push(out["extra"]["documents_row"].clone());
    }
    for r in out["rows"].as_array().into_iter().flatten() {
        let name = r["row"].as_str().unwrap_or("?").to_string();
        let value = r["value"].as_f64().unwrap_or(f64::NAN);
        let unit = r["unit"].as_str().unwrap_or("").to_string();
        summary.push(format!("{name} {} {unit}", fmt_value(value, &unit)));
        if !collected.row_order.contains(&name) {
            collected.row_order.push(name.clone());
        }
        let cell = collected
            .cells
            .entry(name)
            .or_default()
            .entry(engine.to_string())
            .or_default();
        cell.values.push(value);
        cell.extras.push(out["extra"].clone());
        cell.unit = unit;
        cell.lower_is_better = r["lower_is_better"].as_bool().unwrap_or(false);
    }
    summary
}

/// The results: the Markdown table, every row for the results file, and where Kiln
/// is behind its best peer.
struct Table {
    md: String,
    results: Vec<Value>,
    behind: Vec<String>,
}

/// The table's columns (one per engine asked for, in order) and rows (one per row
/// name seen, in order), with a last column of Kiln over its best peer.
fn table(
    engines: &[String],
    jobs: &[Job],
    na: &ByJob,
    missing: &Reasons,
    collected: &Collected,
) -> Table {
    let mut cols: Vec<String> = engines.to_vec();
    cols.dedup();
    let has_kiln = cols.iter().any(|e| e == "kiln");
    let mut md = String::new();
    md.push_str("| workload | unit |");
    for c in &cols {
        md.push_str(&format!(" {c} |"));
    }
    if has_kiln {
        md.push_str(" Kiln / best peer |");
    }
    md.push('\n');
    md.push_str("|---|---|");
    for _ in &cols {
        md.push_str("---:|");
    }
    if has_kiln {
        md.push_str("---:|");
    }
    md.push('\n');
    let mut t = Table {
        md,
        results: Vec::new(),
        behind: Vec::new(),
    };
    let inputs = TableInputs {
        cols: &cols,
        jobs,
        na,
        missing,
        collected,
    };
    for name in &collected.row_order {
        table_row(&mut t, name, &inputs);
    }
    // Workloads where every engine failed have no row yet: list them.
    for (label, errs) in &collected.errors {
        if !collected
            .row_order
            .iter()
            .any(|r| r == label || r.starts_with(&format!("{label} ")))
        {
            t.results.push(json!({ "row": label, "engines": errs }));
        }
    }
    t
}

/// What every row of the table is made from.
struct TableInputs<'a> {
    /// The engines' columns, in order.
    cols: &'a [String],
    jobs: &'a [Job],
    na: &'a ByJob,
    missing: &'a Reasons,
    collected: &'a Collected,
}

/// One row of the table (and of the results file).
fn table_row(t: &mut Table, name: &str, inputs: &TableInputs<'_>) {
    let row_cells = &inputs.collected.cells[name];
    let any = row_cells.values().next().expect("a row has a cell");
    let (unit, lower) = (any.unit.clone(), any.lower_is_better);
    let unit_label = if lower {
        format!("{unit} (lower is better)")
    } else {
        unit.clone()
    };
    t.md.push_str(&format!("| {name} | {unit_label} |"));
    let job_label = inputs
        .jobs
        .iter()
        .find(|j| name == j.label || name.starts_with(&format!("{} ", j.label)))
        .map(|j| j.label.clone())
        .unwrap_or_default();
    let mut per_engine = Map::new();
    for c in inputs.cols {
        let (text, figures) = engine_cell(c, row_cells.get(c), &unit, &job_label, inputs);
        if let Some(v) = figures {
            per_engine.insert(c.clone(), v);
        }
        t.md.push_str(&format!(" {text} |"));
    }
    let mut ratio_json = Value::Null;
    if inputs.cols.iter().any(|e| e == "kiln") {
        let text = match kiln_vs_best_peer(inputs.cols, row_cells, lower) {
            Some(r) => {
                ratio_json = json!({ "ratio": r.ratio, "best_peer": r.peer, "best_peer_value": r.peer_value,
                                     "meaning": "Kiln's speed over the best peer's: > 1 means Kiln is ahead" });
                if r.ratio < 1.0 {
                    t.behind
                        .push(format!("{name}: {:.2}x of {}", r.ratio, r.peer));
                }
                format!("{:.2}x ({})", r.ratio, r.peer)
            }
            None => "-".to_string(),
        };
        t.md.push_str(&format!(" {text} |"));
    }
    t.md.push('\n');
    t.results.push(json!({
        "row": name,
        "unit": unit,
        "lower_is_better": lower,
        "engines": per_engine,
        "kiln_vs_best_peer": ratio_json,
    }));
}

/// Engine `c`'s cell of a row: the text of the table (its median, or why there is
/// none) and its entry in the results file (None: nothing to say).
fn engine_cell(
    c: &str,
    cell: Option<&Cell>,
    unit: &str,
    job_label: &str,
    inputs: &TableInputs<'_>,
) -> (String, Option<Value>) {
    let na = inputs.na.get(job_label);
    match (cell, inputs.missing.get(c)) {
        (Some(cell), _) => {
            let m = median(&cell.values);
            let figures = json!({ "median": m, "runs": cell.values, "extra": cell.extras });
            (fmt_value(m, unit), Some(figures))
        }
        // A workload the engine never runs (PostgreSQL: all but W6): "-",
        // whether or not the engine is built or available.
        (None, _) if na.is_some_and(|m| m.contains_key(c)) => (
            "-".to_string(),
            Some(json!({ "not_applicable": na.unwrap()[c] })),
        ),
        (None, Some(why)) => {
            let text = if why.starts_with("not built") {
                "not built"
            } else {
                "skipped"
            };
            (text.to_string(), Some(json!({ "not_run": why })))
        }
        (None, None) => {
            let err = inputs
                .collected
                .errors
                .get(job_label)
                .and_then(|m| m.get(c));
            match err {
                Some(e) => ("failed".to_string(), Some(json!({ "error": e }))),
                None => ("-".to_string(), None),
            }
        }
    }
}

/// Kiln's median over the best peer's in a row.
struct VsBestPeer<'a> {
    /// > 1 means Kiln is ahead, whichever way the unit goes.
    ratio: f64,
    peer: &'a str,
    peer_value: f64,
}

/// Kiln against the best of the other engines' medians in a row; None when Kiln or
/// every peer has no figure.
fn kiln_vs_best_peer<'a>(
    cols: &'a [String],
    row_cells: &BTreeMap<String, Cell>,
    lower: bool,
) -> Option<VsBestPeer<'a>> {
    let kiln = row_cells.get("kiln").map(|c| median(&c.values));
    let best = cols
        .iter()
        .filter(|e| *e != "kiln")
        .filter_map(|p| row_cells.get(p).map(|c| (p.as_str(), median(&c.values))))
        .reduce(|a, b| {
            let b_better = if lower { b.1 < a.1 } else { b.1 > a.1 };
            if b_better {
                b
            } else {
                a
            }
        });
    let (k, (peer, b)) = (kiln?, best?);
    Some(VsBestPeer {
        ratio: if lower { b / k } else { k / b },
        peer,
        peer_value: b,
    })
}

/// The table on stdout: a title line with the run's settings and machine, the
/// table, then what did not run or failed.
fn print_table(
    args: &Args,
    date: &str,
    machine: &Value,
    fs: &Value,
    t: &Table,
    missing: &Reasons,
    errors: &ByJob,
) {
    println!(
        "Kiln vs peers, {}, {}{}; {} ({} cores, kernel {}), {} on {}",
        date,
        args.runs
            .map_or("median of 3 runs (1 if over 10 s)".to_string(), |n| {
                if n == 1 {
                    "1 run".to_string()
                } else {
                    format!("median of {n} runs")
                }
            }),
        if args.quick {
            ", --quick (1/20 scale)"
        } else {
            ", full scale"
        },
        machine["cpu"].as_str().unwrap_or("?"),
        machine["cores"],
        machine["kernel"].as_str().unwrap_or("?"),
        fs["type"].as_str().unwrap_or("?"),
        fs["device"].as_str().unwrap_or("?"),
    );
    println!();
    print!("{}", t.md);
    println!();
    println!("Kiln / best peer: Kiln's speed over the best peer's in the same run (> 1: Kiln ahead; for ms/commit the peer's time over Kiln's).");
    for (e, why) in missing {
        println!("{e}: {why}");
    }
    for (label, errs) in errors {
        for (e, msg) in errs {
            println!("{label} {e}: failed: {msg}");
        }
    }
    if !t.behind.is_empty() {
        println!("Kiln behind the best peer: {}", t.behind.join("; "));
    }
}

/// Server engines (PostgreSQL): version and settings, as the first run reported them.
fn servers(collected: &Collected) -> Map<String, Value> {
    let mut servers = Map::new();
    for by_engine in collected.cells.values() {
        for (engine, cell) in by_engine {
            if servers.contains_key(engine) {
                continue;
            }
            if let Some(x) = cell
                .extras
                .iter()
                .find(|x| x.get("server_version").is_some())
            {
                let keep = [
                    "server_version",
                    "server_version_full",
                    "server_bindir",
                    "server_user",
                    "settings",
                ];
                let picked: Map<String, Value> = keep
                    .iter()
                    .filter_map(|k| x.get(*k).map(|v| (k.to_string(), v.clone())))
                    .collect();
                servers.insert(engine.clone(), Value::Object(picked));
            }
        }
    }
    servers
}

/// How each engine made its commits durable (the results file's settings).
fn durability() -> Value {
    json!({
        "kiln": "Options::default() (journal, Durability::Immediate); W6 through Env::submit",
        "sqlite": "WAL, synchronous=FULL, table kv(key BLOB PRIMARY KEY, value BLOB)",
        "lmdb": "heed, default flags (sync on commit)",
        "redb": "Durability::Immediate",
        "fjall": "batch commit + Keyspace::persist(PersistMode::SyncAll) per transaction; Config::cache_size(256 MiB)",
        "rocksdb": "WriteOptions::set_sync(true); LRU block cache 256 MiB, Bloom filter 10 bits/key, index and filter blocks cached, level_compaction_dynamic_level_bytes, increase_parallelism(2)",
        "kiln_serve": "W8/W9: `kiln bench --workloads W8|W9 --no-redis` (kiln serve's defaults; 64 keep-alive connections, one single-threaded load generator; W8 PUTs ~1 KiB JSON documents, each a new id)",
        "redis": "W8/W9 only: `kiln bench --redis-only`: a throwaway redis-server --appendonly yes --appendfsync always --save '' on loopback; redis-benchmark -c 64 -d 1024 -t set|get (W8: 200,000 SETs over as many keys; W9: GETs of 10,000 keys filled first)",
        "documents": "W16/W17: kiln serve's defaults over HTTP/1.1 (bulk insert, then the index timed until not stale); SQLite FTS5: WAL, synchronous=FULL, one transaction; PostgreSQL: the W6 server's settings (synchronous_commit=on) over loopback TCP, COPY then CREATE INDEX (W16) / the plain GROUP BY (W17); each run's `extra.settings` says more",
        "ycsb": "YA..YF: kiln serve's defaults over HTTP/1.1 (PATCH with a JSON merge patch for updates); PostgreSQL: the W6 server's settings plus listen_addresses='127.0.0.1', a jsonb table, tokio-postgres; Redis (A-C, F): redis-server --appendonly yes --appendfsync always --save ''; each job's `extra.settings` and the `ycsb` rows say more (docs/ycsb.md)",
        "postgres": "W6 only: a throwaway server (initdb in the run's directory, Unix socket only) with fsync=on, synchronous_commit=on, full_page_writes=on (the defaults), shared_buffers=256MB, max_connections=200; table kv(key bytea PRIMARY KEY, value bytea); one connection per thread, each commit an autocommit INSERT ... ON CONFLICT (key) DO UPDATE",
    })
}

/// Everything the suite ran and measured, as the results file holds it.
struct Suite<'a> {
    args: &'a Args,
    engines: &'a [String],
    jobs: &'a [Job],
    na: &'a ByJob,
    missing: &'a Reasons,
    collected: &'a Collected,
    table: &'a Table,
    /// W16/W17: Kiln's answers against each peer's, Kiln's ratio to each peer.
    checks: &'a Value,
    date: &'a str,
    machine: Value,
    fs: Value,
    seconds: f64,
}

/// The results file (`--out`): settings, machine, versions, every figure.
fn write_results(s: &Suite) -> Result<()> {
    let args = s.args;
    let versions: Map<String, Value> = CRATE_VERSIONS
        .iter()
        .map(|(n, v)| (n.to_string(), json!(v)))
        .collect();
    // Why an engine shows "-" for a workload it does not run.
    let mut notes = Map::new();
    for m in s.na.values() {
        for (engine, why) in m {
            if s.engines.contains(engine) {
                notes.insert(engine.clone(), json!(why));
            }
        }
    }
    let (not_built, skipped): (Reasons, Reasons) = s
        .missing
        .iter()
        .map(|(e, why)| (e.clone(), why.clone()))
        .partition(|(_, why)| why.starts_with("not built"));
    let report = json!({
        "date": s.date,
        "command": std::env::args().collect::<Vec<_>>(),
        "settings": {
            "engines": s.engines,
            "workloads": s.jobs.iter().map(|j| j.label.clone()).collect::<Vec<_>>(),
            "quick": args.quick,
            "scale": if args.quick { "1/20" } else { "full" },
            "runs": args.runs.map_or(json!("3, or 1 when the first run takes over 10 s"), |n| json!(n)),
            "seed": SEED,
            "key_bytes": KEY_BYTES,
            "value_bytes": VALUE_BYTES,
            "dir": args.dir,
            "durability": durability(),
            "suite_seconds": s.seconds,
        },
        "machine": { "host": s.machine, "file_system": s.fs },
        "crate_versions": versions,
        "servers": servers(s.collected),
        "notes": notes,
        "not_built": not_built,
        "skipped": skipped,
        "errors": s.collected.errors,
        "results": s.table.results,
        "ycsb": s.collected.ycsb,
        "documents": { "rows": s.collected.documents, "checks": s.checks },
        "markdown": s.table.md,
    });
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

/// The suite's first line: what runs where, on what machine.
fn announce(args: &Args, engines: usize, jobs: usize, fs: &Value, machine: &Value) {
    eprintln!(
        "kiln-bench: {} engine(s) x {} workload variant(s){}, in {} ({}); {} cores, kernel {}",
        engines,
        jobs,
        if args.quick {
            ", --quick (1/20 scale)"
        } else {
            ""
        },
        args.dir.display(),
        fs["type"].as_str().unwrap_or("?"),
        machine["cores"],
        machine["kernel"].as_str().unwrap_or("?"),
    );
}

/// The parent: plans the jobs, runs each (engine, job, run) in a child, prints the
/// table and writes the results file.
fn parent(args: &Args) -> Result<()> {
    let jobs = plan_jobs(args)?;
    let engines = plan_engines(args)?;
    let (runnable, mut missing) = runnable_engines(&engines);

    let created_dir = !args.dir.exists();
    std::fs::create_dir_all(&args.dir)?;
    let fs = file_system(&args.dir);
    let machine = machine();
    announce(args, runnable.len(), jobs.len(), &fs, &machine);

    let na = not_applicable(&jobs, &engines);
    let suite_start = Instant::now();
    let mut collected = run_suite(args, &jobs, &runnable, &na, &mut missing)?;
    let (checks, check_errors, check_lines) = docbench::check(&collected.cells);
    for (label, engine, msg) in check_errors {
        collected
            .errors
            .entry(label)
            .or_default()
            .insert(engine, msg);
    }
    if created_dir {
        let _ = std::fs::remove_dir(&args.dir);
    }

    let table = table(&engines, &jobs, &na, &missing, &collected);
    let date = utc_now();
    print_table(
        args,
        &date,
        &machine,
        &fs,
        &table,
        &missing,
        &collected.errors,
    );
    for line in &check_lines {
        println!("{line}");
    }
    write_results(&Suite {
        args,
        engines: &engines,
        jobs: &jobs,
        na: &na,
        missing: &missing,
        collected: &collected,
        table: &table,
        checks: &checks,
        date: &date,
        machine,
        fs,
        seconds: suite_start.elapsed().as_secs_f64(),
    })?;
    let failed: usize = collected.errors.values().map(BTreeMap::len).sum();
    if failed > 0 {
        bail!("{failed} engine/workload run(s) failed (see above); the other figures are in the table");
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    let res = match (&args.child_engine, &args.child_workload) {
        (Some(engine), Some(workload)) => {
            child(engine, workload, &args.dir, args.quick, args.child_threads)
        }
        _ => parent(&args),
    };
    if let Err(e) = res {
        eprintln!("kiln-bench: {}", format!("{e:#}").replace('\n', " "));
        let unavailable = e.chain().any(|c| c.is::<engines::Unavailable>());
        std::process::exit(if unavailable {
            engines::UNAVAILABLE_EXIT
        } else {
            1
        });
    }
}
