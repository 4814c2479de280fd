//! SOAK: what `kiln serve` does as it ages (issue 41). YCSB A (50% reads, 50%
//! one-field updates, zipfian keys) for a fixed time after a YCSB load, and per
//! interval: throughput, p50/p99, the server's RSS, its open files
//! (/proc/PID/fd), the number of journal files and the data files' size. At the
//! end the run FAILS (the job's error, so `kiln-bench` exits 1) if a resource grew
//! beyond its bound:
//! - RSS at the end over `max_growth` x the RSS after the first interval, plus
//!   64 MiB of slack (allocator and page-cache noise on a small run);
//! - open files at the end over those after the first interval plus 16;
//! - journal files over `max_journal_files` at any sample;
//! - the data files at the end over `max_growth` x their size after the first
//!   interval plus 128 MiB (two of the data file's 64 MiB growth steps): YCSB A
//!   only updates, so the live data does not grow and neither should the file.
//!
//! The first interval is the baseline because the load's write buffer, the page
//! cache of the data file and the journal's rotation all settle during it.

use crate::ycsb::{Conn, Params, System};
use anyhow::{anyhow, bail, Result};
use futures_util::future::join_all;
use kiln_bench::ycsb::{self as y, Client, InsertSequence, Op};
use serde_json::{json, Map, Value};
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub const WORKLOADS: &[&str] = &["SOAK"];

/// Why `engine` does not run SOAK (None: it does).
pub fn not_applicable(engine: &str, _workload: &str) -> Option<&'static str> {
    match engine {
        "kiln" => None,
        _ => Some("SOAK watches kiln serve's own resources as it ages"),
    }
}

/// The soak's length, sampling and bounds.
#[derive(Debug, Clone)]
pub struct Soak {
    pub seconds: f64,
    pub interval_seconds: f64,
    pub clients: u64,
    pub max_growth: f64,
    pub max_journal_files: u64,
}

/// What one sample of the server shows.
#[derive(Debug, Clone, Copy, Default)]
struct Resources {
    rss_bytes: u64,
    /// RSS's anonymous part (heap, buffers) and its file-backed part (the data
    /// file's mapped pages: page cache the kernel can drop).
    rss_anon_bytes: u64,
    rss_file_bytes: u64,
    open_files: u64,
    journal_files: u64,
    journal_bytes: u64,
    data_file_bytes: u64,
}

fn sample(pid: u32, data: &Path) -> Resources {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    let rss_bytes = kb("VmRSS:");
    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    let mut r = Resources {
        rss_bytes,
        rss_anon_bytes: kb("RssAnon:"),
        rss_file_bytes: kb("RssFile:"),
        open_files,
        ..Default::default()
    };
    crate::space::each_file(data, &mut |p, m| {
        if p.components().any(|c| c.as_os_str() == "journal") {
            r.journal_files += 1;
            r.journal_bytes += m.len();
        } else if p.file_name().is_some_and(|n| n == kiln_storage::DATA_FILE) {
            r.data_file_bytes += m.len();
        }
    });
    r
}

fn p_us(sorted: &[u32], q: f64) -> f64 {
    kiln_bench::stats::quantile(sorted, q).map_or(0.0, f64::from)
}

/// The bounds of the module's comment; the reasons a run fails, empty if none.
fn violations(rows: &[Value], soak: &Soak) -> Vec<String> {
    let get = |r: &Value, k: &str| r[k].as_u64().unwrap_or(0);
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return vec!["no interval was measured".into()];
    };
    let mut out = Vec::new();
    let rss_bound = (get(first, "rss_bytes") as f64 * soak.max_growth) as u64 + (64 << 20);
    if get(last, "rss_bytes") > rss_bound {
        out.push(format!(
            "RSS grew from {} MiB (first interval) to {} MiB, over the bound of {} MiB ({}x + 64 MiB)",
            get(first, "rss_bytes") >> 20,
            get(last, "rss_bytes") >> 20,
            rss_bound >> 20,
            soak.max_growth
        ));
    }
    if get(last, "open_files") > get(first, "open_files") + 16 {
        out.push(format!(
            "open files grew from {} to {} (bound: +16)",
            get(first, "open_files"),
            get(last, "open_files")
        ));
    }
    if let Some(r) = rows
        .iter()
        .find(|r| get(r, "journal_files") > soak.max_journal_files)
    {
        out.push(format!(
            "{} journal files at minute {:.2} (bound: {})",
            get(r, "journal_files"),
            r["minute"].as_f64().unwrap_or(0.0),
            soak.max_journal_files
        ));
    }
    let data_bound = (get(first, "data_file_bytes") as f64 * soak.max_growth) as u64 + (128 << 20);
    if get(last, "data_file_bytes") > data_bound {
        out.push(format!(
            "the data file grew from {} MiB to {} MiB under updates only (bound: {} MiB)",
            get(first, "data_file_bytes") >> 20,
            get(last, "data_file_bytes") >> 20,
            data_bound >> 20
        ));
    }
    out
}

/// One soak of `kiln serve` in `dir`, as a child's JSON object; an error if a
/// bound was crossed (after printing every interval).
pub fn run(dir: &Path, params: &Params, soak: &Soak) -> Result<Value> {
    let started = Instant::now();
    let workload = y::by_name("A").ok_or_else(|| anyhow!("YCSB A is not defined"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let system = System::start("kiln", dir)?;
    let System::Kiln { proc, .. } = &system else {
        bail!("SOAK runs kiln serve only");
    };
    let pid = proc.child.id();
    let data = dir.join("kiln-data");
    let rows = local.block_on(
        &rt,
        load_and_soak(&system, workload, params, soak, pid, &data),
    )?;
    drop(system);
    outcome(started, params, soak, rows)
}

/// The YCSB load, then YCSB A's clients until the soak's time is up, a row
/// every interval (printed as it is taken); the rows.
async fn load_and_soak(
    system: &System,
    workload: y::Workload,
    params: &Params,
    soak: &Soak,
    pid: u32,
    data: &Path,
) -> Result<Vec<Value>> {
    crate::ycsb::setup(system).await?;
    let (load_s, _) = crate::ycsb::load(system, params).await?;
    eprintln!(
        "SOAK: loaded {} records in {load_s:.1} s; YCSB A with {} clients for {:.0} s, a row every {:.0} s",
        params.records, soak.clients, soak.seconds, soak.interval_seconds
    );
    eprintln!(
        "{:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>9}",
        "minute", "ops/s", "p50 us", "p99 us", "RSS MiB", "anon MiB", "fds", "journals", "data MiB"
    );
    let seq = InsertSequence::new(params.records);
    let conns = system.connect_many(soak.clients).await?;
    let lat: Rc<RefCell<Vec<u32>>> = Rc::default();
    let stop = Rc::new(Cell::new(false));
    let clients = conns.into_iter().zip(0u64..).map(|(conn, i)| {
        let (seq, lat, stop) = (&seq, lat.clone(), stop.clone());
        soak_client(conn, i, workload, params, seq, lat, stop)
    });
    let sampler = sample_intervals(soak, pid, data, lat.clone(), stop.clone());
    let (rows, results) = tokio::join!(sampler, join_all(clients));
    for r in results {
        r?;
    }
    Ok(rows)
}

/// Client `i` on `conn`: YCSB A's reads and updates until `stop`, each one's
/// latency (µs) added to `lat`.
async fn soak_client(
    mut conn: Conn,
    i: u64,
    workload: y::Workload,
    params: &Params,
    seq: &InsertSequence,
    lat: Rc<RefCell<Vec<u32>>>,
    stop: Rc<Cell<bool>>,
) -> Result<()> {
    let mut gen = Client::new(workload, params.records, u64::MAX / 4, seq, params.seed, i);
    while !stop.get() {
        let op = gen.next_op();
        let t = Instant::now();
        match &op {
            Op::Read { key } => conn.read(key).await?,
            Op::Update { key, field, value } => conn.update(key, *field, value).await?,
            other => bail!("YCSB A made a {} operation", other.kind()),
        }
        lat.borrow_mut()
            .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    Ok(())
}

/// Every `soak.interval_seconds`: the latencies the clients added to `lat` since
/// the last interval and a sample of the server (`pid`, its data in `data`), as a
/// row; sets `stop` and returns the rows once `soak.seconds` have passed.
async fn sample_intervals(
    soak: &Soak,
    pid: u32,
    data: &Path,
    lat: Rc<RefCell<Vec<u32>>>,
    stop: Rc<Cell<bool>>,
) -> Vec<Value> {
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut tick = 1u32;
    loop {
        let due = Duration::from_secs_f64(soak.interval_seconds * tick as f64);
        let now = t0.elapsed();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        let mut l = std::mem::take(&mut *lat.borrow_mut());
        let elapsed = t0.elapsed().as_secs_f64();
        l.sort_unstable();
        let r = sample(pid, data);
        rows.push(interval_row(elapsed, &l, &r, soak.interval_seconds));
        if elapsed + 1e-3 >= soak.seconds {
            stop.set(true);
            return rows;
        }
        tick += 1;
    }
}

/// One interval, `elapsed` seconds into the soak: printed, and as its row. `l`:
/// the interval's latencies (µs), sorted; `r`: the server's sample.
fn interval_row(elapsed: f64, l: &[u32], r: &Resources, interval_seconds: f64) -> Value {
    let ops_per_sec = l.len() as f64 / interval_seconds;
    eprintln!(
        "{:>7.2} {:>9.0} {:>8.0} {:>8.0} {:>8} {:>8} {:>6} {:>8} {:>9}",
        elapsed / 60.0,
        ops_per_sec,
        p_us(l, 0.5),
        p_us(l, 0.99),
        r.rss_bytes >> 20,
        r.rss_anon_bytes >> 20,
        r.open_files,
        r.journal_files,
        r.data_file_bytes >> 20
    );
    json!({
        "workload": "SOAK", "engine": "kiln", "minute": elapsed / 60.0,
        "operations": l.len(), "ops_per_sec": ops_per_sec,
        "p50_us": p_us(l, 0.5), "p99_us": p_us(l, 0.99),
        "rss_bytes": r.rss_bytes, "rss_anon_bytes": r.rss_anon_bytes,
        "rss_file_bytes": r.rss_file_bytes, "open_files": r.open_files,
        "journal_files": r.journal_files, "journal_bytes": r.journal_bytes,
        "data_file_bytes": r.data_file_bytes,
    })
}

/// The soak's JSON object from its interval rows (first and last interval's
/// throughput in the table, the summary for the results file), or an error if a
/// bound was crossed.
fn outcome(started: Instant, params: &Params, soak: &Soak, rows: Vec<Value>) -> Result<Value> {
    let bad = violations(&rows, soak);
    let ops: Vec<f64> = rows
        .iter()
        .filter_map(|r| r["ops_per_sec"].as_f64())
        .collect();
    let mut summary = Map::new();
    summary.insert("workload".into(), json!("SOAK"));
    summary.insert("engine".into(), json!("kiln"));
    summary.insert("records".into(), json!(params.records));
    summary.insert("clients".into(), json!(soak.clients));
    summary.insert("seconds".into(), json!(soak.seconds));
    summary.insert("interval_seconds".into(), json!(soak.interval_seconds));
    summary.insert("max_growth".into(), json!(soak.max_growth));
    summary.insert("max_journal_files".into(), json!(soak.max_journal_files));
    summary.insert("violations".into(), json!(bad));
    summary.insert("intervals".into(), json!(rows));
    if !bad.is_empty() {
        bail!("SOAK: a resource grew beyond its bound: {}", bad.join("; "));
    }
    let first = ops.first().copied().unwrap_or(0.0);
    let last = ops.last().copied().unwrap_or(0.0);
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "rows": [
            {"row": "SOAK YA first interval", "unit": "ops/s", "value": first, "lower_is_better": false},
            {"row": "SOAK YA last interval", "unit": "ops/s", "value": last, "lower_is_better": false},
        ],
        "extra": { "documents_row": Value::Object(summary) },
    }))
}
