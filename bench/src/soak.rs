//! SOAK: what `kiln serve` does as it ages (issues 41 and 55). After a YCSB load,
//! YCSB A (50% reads, 50% one-field updates, zipfian keys) for a fixed time, and
//! beside it on the same server and database a mixed load (src/soak_load.rs): an
//! index over `field0` and a query using it every 100 ms, a changes-feed reader on
//! the WebSocket, a data subscription's worker, a full backup every
//! `backup_interval_seconds`, an attachment put and read back every second. Per
//! interval: YCSB throughput, p50/p99, the query's p99, backups (count, longest,
//! bytes), changes received, subscription documents acknowledged, attachment
//! operations, the server's RSS, its open files (/proc/PID/fd), the number of
//! journal files, the data file's size and the whole data directory's. At the end
//! the run FAILS (the job's error, so `kiln-bench` exits 1) if a resource grew
//! beyond its bound:
//! - RSS at the end over `max_growth` x the RSS after the first interval, plus
//!   64 MiB of slack (allocator and page-cache noise on a small run);
//! - open files at the end over those after the first interval plus 16;
//! - journal files over `max_journal_files` at any sample;
//! - the data files at the end over `max_growth` x their size after the first
//!   interval plus 128 MiB (two of the data file's 64 MiB growth steps): YCSB A
//!   only updates, so the live data does not grow and neither should the file;
//! - the data directory (data file, journal, indexes, attachments, ...) at the end
//!   over `max_growth` x its size after the first interval plus 256 MiB (the
//!   data file's slack and two journal files);
//! - YCSB's p99 in the last interval over max(`max_p99_growth` x the first
//!   interval's, the first's + 5 ms);
//! - or if a side load failed: an error answer, an attachment read back wrong, a
//!   WebSocket closed (a slow consumer too), the changes reader more than
//!   `MAX_CHANGES_LAG` etags behind the database once writes stopped and it had
//!   `DRAIN` to catch up, a subscription that acknowledged nothing, or no backup
//!   when one was due.
//!
//! The first interval is the baseline because the load's write buffer, the page
//! cache of the data file and the journal's rotation all settle during it.

#[path = "soak_load.rs"]
mod load;
#[path = "soak_plot.rs"]
mod plot;

use crate::ycsb::{Conn, Params, System};
use anyhow::{anyhow, bail, Context, Result};
use futures_util::future::join_all;
use kiln_bench::ycsb::{self as y, Client, InsertSequence, Op};
use serde_json::{json, Map, Value};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
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
    /// Seconds between two full backups (the first half an interval in).
    pub backup_interval_seconds: f64,
    /// The last interval's YCSB p99 over max(this x the first's, first + 5 ms)
    /// fails the run.
    pub max_p99_growth: f64,
    /// Where to draw the intervals as SVG (None: nowhere).
    pub plot: Option<PathBuf>,
}

/// How many etags behind the database the changes reader may be at the end,
/// after `load::DRAIN` with the writes stopped.
const MAX_CHANGES_LAG: u64 = 0;

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
    /// Every file of the data directory.
    disk_bytes: u64,
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
        r.disk_bytes += m.len();
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

/// What the side loads left at the end of the soak (src/soak_load.rs).
#[derive(Debug, Default)]
struct End {
    /// Each failed side load, with its minute and error.
    failures: Vec<String>,
    changes_total: u64,
    /// The sequence of the last etag the changes reader saw, and the database's
    /// last, after the drain.
    changes_seen_seq: u64,
    database_seq: u64,
    sub_docs_total: u64,
    backups_total: u64,
    /// Whether the soak was long enough for a backup to start.
    backup_due: bool,
}

/// The bounds of the module's comment; the reasons a run fails, empty if none.
fn violations(rows: &[Value], soak: &Soak, end: &End) -> Vec<String> {
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
    let disk_bound = (get(first, "disk_bytes") as f64 * soak.max_growth) as u64 + (256 << 20);
    if get(last, "disk_bytes") > disk_bound {
        out.push(format!(
            "the data directory grew from {} MiB to {} MiB (bound: {} MiB, {}x + 256 MiB)",
            get(first, "disk_bytes") >> 20,
            get(last, "disk_bytes") >> 20,
            disk_bound >> 20,
            soak.max_growth
        ));
    }
    let p99 = |r: &Value| r["p99_us"].as_f64().unwrap_or(0.0) / 1000.0;
    let p99_bound = (p99(first) * soak.max_p99_growth).max(p99(first) + 5.0);
    if rows.len() > 1 && p99(last) > p99_bound {
        out.push(format!(
            "YCSB p99 grew from {:.2} ms (first interval) to {:.2} ms, over the bound of {:.2} ms (max({}x, +5 ms))",
            p99(first),
            p99(last),
            p99_bound,
            soak.max_p99_growth
        ));
    }
    out.extend(end.failures.iter().cloned());
    let reader_failed = end.failures.iter().any(|f| f.contains("changes-feed"));
    let lag = end.database_seq.saturating_sub(end.changes_seen_seq);
    if !reader_failed && lag > MAX_CHANGES_LAG {
        out.push(format!(
            "the changes feed's reader was {lag} etags behind at the end (saw {}, the database at {}, after {} s without writes; bound: {MAX_CHANGES_LAG})",
            end.changes_seen_seq,
            end.database_seq,
            load::DRAIN.as_secs()
        ));
    }
    if !end.failures.iter().any(|f| f.contains("subscription")) && end.sub_docs_total == 0 {
        out.push(
            "the data subscription's worker had no document acknowledged (bound: at least 1)"
                .into(),
        );
    }
    if end.backup_due
        && end.backups_total == 0
        && !end.failures.iter().any(|f| f.contains("backup"))
    {
        out.push("no backup was made though one was due (bound: at least 1)".into());
    }
    out
}

/// One soak of `kiln serve` in `dir`, as a child's JSON object; an error if a
/// bound was crossed (after printing every interval, and drawing them when
/// `soak.plot` says where).
pub fn run(dir: &Path, params: &Params, soak: &Soak) -> Result<Value> {
    let started = Instant::now();
    let workload = y::by_name("A").ok_or_else(|| anyhow!("YCSB A is not defined"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let system = System::start("kiln", dir)?;
    let System::Kiln { proc, port } = &system else {
        bail!("SOAK runs kiln serve only");
    };
    let (pid, port) = (proc.child.id(), *port);
    let data = dir.join("kiln-data");
    let (rows, end) = local.block_on(
        &rt,
        load_and_soak(&system, workload, params, soak, (pid, port), dir, &data),
    )?;
    drop(system);
    if let Some(path) = &soak.plot {
        plot::write(path, &rows).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("SOAK: the intervals drawn in {}", path.display());
    }
    outcome(started, params, soak, rows, end)
}

/// The YCSB load, the side loads' setup, then YCSB A's clients and the side
/// loads until the soak's time is up, a row every interval (printed as it is
/// taken); then the changes reader's drain. The rows and what the side loads
/// left.
async fn load_and_soak(
    system: &System,
    workload: y::Workload,
    params: &Params,
    soak: &Soak,
    (pid, port): (u32, u16),
    dir: &Path,
    data: &Path,
) -> Result<(Vec<Value>, End)> {
    crate::ycsb::setup(system).await?;
    let (load_s, _) = crate::ycsb::load(system, params).await?;
    eprintln!(
        "SOAK: loaded {} records in {load_s:.1} s; YCSB A with {} clients for {:.0} s, a row every {:.0} s; beside it a query every 100 ms, the changes feed, a subscription, a backup every {:.0} s, an attachment every second",
        params.records, soak.clients, soak.seconds, soak.interval_seconds, soak.backup_interval_seconds
    );
    load::setup(port).await?;
    eprintln!(
        "{:>6} {:>7} {:>6} {:>6} {:>6} | {:>5} {:>5} {:>4} {:>5} {:>5} {:>5} | {:>4} {:>5} {:>7} {:>6} {:>4}",
        "minute", "ops/s", "p50us", "p99us", "q p99", "RSS", "anon", "fds", "jrnls", "data", "disk",
        "bkps", "bkp s", "changes", "subdoc", "att"
    );
    let seq = InsertSequence::new(params.records);
    let conns = system.connect_many(soak.clients).await?;
    let lat: Rc<RefCell<Vec<u32>>> = Rc::default();
    let stop = Rc::new(Cell::new(false));
    let side = load::Side::default();
    let done = Cell::new(false);
    let clients = conns.into_iter().zip(0u64..).map(|(conn, i)| {
        let (seq, lat, stop) = (&seq, lat.clone(), stop.clone());
        soak_client(conn, i, workload, params, seq, lat, stop)
    });
    let readers = async {
        tokio::join!(
            load::changes_reader(port, &side, &done),
            load::subscription_worker(port, &side, &done)
        );
    };
    let main = async {
        side.t0.set(Some(Instant::now()));
        let first_backup = Duration::from_secs_f64(soak.interval_seconds / 2.0);
        let every = Duration::from_secs_f64(soak.backup_interval_seconds.max(1.0));
        let (rows, results, ..) = tokio::join!(
            sample_intervals(soak, pid, data, lat.clone(), &side, stop.clone()),
            join_all(clients),
            load::queries(port, params.seed, &side, &stop),
            load::soak_writer(port, &side, &stop),
            load::attachments(port, params.seed, &side, &stop),
            load::backups(port, dir, first_backup, every, &side, &stop),
        );
        // Every writer has stopped: the reader has DRAIN to reach the last etag.
        let drained = async {
            let db = load::database_seq(port).await?;
            let deadline = Instant::now() + load::DRAIN;
            while side.last_change_seq.get() < db && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<_, anyhow::Error>((side.last_change_seq.get(), db))
        }
        .await;
        done.set(true);
        (rows, results, drained)
    };
    let ((rows, results, drained), ()) = tokio::join!(main, readers);
    for r in results {
        r?;
    }
    let (changes_seen_seq, database_seq) = drained?;
    let end = End {
        failures: side.failures.take(),
        changes_total: side.changes_total.get(),
        changes_seen_seq,
        database_seq,
        sub_docs_total: side.sub_docs_total.get(),
        backups_total: side.backups_total.get(),
        backup_due: soak.seconds > soak.interval_seconds / 2.0,
    };
    eprintln!(
        "SOAK: the changes reader got {} changes, last etag {} (the database's: {}); the subscription {} documents; {} backups",
        end.changes_total, end.changes_seen_seq, end.database_seq, end.sub_docs_total, end.backups_total
    );
    Ok((rows, end))
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
/// the last interval, the side loads' part and a sample of the server (`pid`, its
/// data in `data`), as a row; sets `stop` and returns the rows once
/// `soak.seconds` have passed.
async fn sample_intervals(
    soak: &Soak,
    pid: u32,
    data: &Path,
    lat: Rc<RefCell<Vec<u32>>>,
    side: &load::Side,
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
        let s = side.take_interval();
        let elapsed = t0.elapsed().as_secs_f64();
        l.sort_unstable();
        let r = sample(pid, data);
        rows.push(interval_row(elapsed, &l, &r, &s, soak.interval_seconds));
        if elapsed + 1e-3 >= soak.seconds {
            stop.set(true);
            return rows;
        }
        tick += 1;
    }
}

/// One interval, `elapsed` seconds into the soak: printed, and as its row. `l`:
/// the interval's YCSB latencies (µs), sorted; `r`: the server's sample; `s`:
/// the side loads' part.
fn interval_row(
    elapsed: f64,
    l: &[u32],
    r: &Resources,
    s: &load::SideInterval,
    interval_seconds: f64,
) -> Value {
    let ops_per_sec = l.len() as f64 / interval_seconds;
    let q = &s.query_lat;
    eprintln!(
        "{:>6.2} {:>7.0} {:>6.0} {:>6.0} {:>6.0} | {:>5} {:>5} {:>4} {:>5} {:>5} {:>5} | {:>4} {:>5.1} {:>7} {:>6} {:>4}",
        elapsed / 60.0,
        ops_per_sec,
        p_us(l, 0.5),
        p_us(l, 0.99),
        p_us(q, 0.99),
        r.rss_bytes >> 20,
        r.rss_anon_bytes >> 20,
        r.open_files,
        r.journal_files,
        r.data_file_bytes >> 20,
        r.disk_bytes >> 20,
        s.backups,
        s.backup_max_secs,
        s.changes,
        s.sub_docs,
        s.attachment_ops
    );
    json!({
        "workload": "SOAK", "engine": "kiln", "minute": elapsed / 60.0,
        "operations": l.len(), "ops_per_sec": ops_per_sec,
        "p50_us": p_us(l, 0.5), "p99_us": p_us(l, 0.99),
        "rss_bytes": r.rss_bytes, "rss_anon_bytes": r.rss_anon_bytes,
        "rss_file_bytes": r.rss_file_bytes, "open_files": r.open_files,
        "journal_files": r.journal_files, "journal_bytes": r.journal_bytes,
        "data_file_bytes": r.data_file_bytes, "disk_bytes": r.disk_bytes,
        "queries": q.len(), "query_p50_us": p_us(q, 0.5), "query_p99_us": p_us(q, 0.99),
        "backups": s.backups, "backup_max_seconds": s.backup_max_secs,
        "backup_bytes": s.backup_bytes, "changes": s.changes,
        "subscription_docs_acked": s.sub_docs, "attachment_ops": s.attachment_ops,
        "soak_writes": s.soak_writes,
    })
}

/// The soak's JSON object from its interval rows (first and last interval's
/// throughput and p99 in the table, the summary for the results file), or an
/// error if a bound was crossed.
fn outcome(
    started: Instant,
    params: &Params,
    soak: &Soak,
    rows: Vec<Value>,
    end: End,
) -> Result<Value> {
    let bad = violations(&rows, soak, &end);
    let col = |k: &str| -> Vec<f64> { rows.iter().filter_map(|r| r[k].as_f64()).collect() };
    let (ops, p99) = (col("ops_per_sec"), col("p99_us"));
    let mut summary = Map::new();
    summary.insert("workload".into(), json!("SOAK"));
    summary.insert("engine".into(), json!("kiln"));
    summary.insert("records".into(), json!(params.records));
    summary.insert("clients".into(), json!(soak.clients));
    summary.insert("seconds".into(), json!(soak.seconds));
    summary.insert("interval_seconds".into(), json!(soak.interval_seconds));
    summary.insert(
        "backup_interval_seconds".into(),
        json!(soak.backup_interval_seconds),
    );
    summary.insert("max_growth".into(), json!(soak.max_growth));
    summary.insert("max_journal_files".into(), json!(soak.max_journal_files));
    summary.insert("max_p99_growth".into(), json!(soak.max_p99_growth));
    summary.insert("changes_total".into(), json!(end.changes_total));
    summary.insert("changes_last_seen_seq".into(), json!(end.changes_seen_seq));
    summary.insert("database_last_seq".into(), json!(end.database_seq));
    summary.insert("subscription_docs_acked".into(), json!(end.sub_docs_total));
    summary.insert("backups".into(), json!(end.backups_total));
    summary.insert("violations".into(), json!(bad));
    summary.insert("intervals".into(), json!(rows));
    if !bad.is_empty() {
        bail!(
            "SOAK: a resource grew beyond its bound (or a load failed): {}",
            bad.join("; ")
        );
    }
    let first = |v: &[f64]| v.first().copied().unwrap_or(0.0);
    let last = |v: &[f64]| v.last().copied().unwrap_or(0.0);
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "rows": [
            {"row": "SOAK YA first interval", "unit": "ops/s", "value": first(&ops), "lower_is_better": false},
            {"row": "SOAK YA last interval", "unit": "ops/s", "value": last(&ops), "lower_is_better": false},
            {"row": "SOAK YA p99 first interval", "unit": "ms", "value": first(&p99) / 1000.0, "lower_is_better": true},
            {"row": "SOAK YA p99 last interval", "unit": "ms", "value": last(&p99) / 1000.0, "lower_is_better": true},
        ],
        "extra": { "documents_row": Value::Object(summary) },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soak() -> Soak {
        Soak {
            seconds: 120.0,
            interval_seconds: 15.0,
            clients: 16,
            max_growth: 2.0,
            max_journal_files: 16,
            backup_interval_seconds: 30.0,
            max_p99_growth: 3.0,
            plot: None,
        }
    }

    fn row(minute: f64, p99_us: f64, rss_mib: u64, disk_mib: u64) -> Value {
        json!({
            "minute": minute, "p99_us": p99_us, "ops_per_sec": 1000.0,
            "rss_bytes": rss_mib << 20, "rss_anon_bytes": (rss_mib / 2) << 20,
            "open_files": 40, "journal_files": 4, "data_file_bytes": 256u64 << 20,
            "disk_bytes": disk_mib << 20, "query_p99_us": 2000.0,
        })
    }

    fn fine() -> End {
        End {
            changes_seen_seq: 100,
            database_seq: 100,
            sub_docs_total: 10,
            backups_total: 1,
            backup_due: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_steady_soak_passes() {
        let rows = [row(0.25, 10_000.0, 500, 700), row(2.0, 14_000.0, 600, 800)];
        assert_eq!(violations(&rows, &soak(), &fine()), Vec::<String>::new());
    }

    #[test]
    fn p99_over_the_larger_of_the_factor_and_5_ms_fails() {
        // First 10 ms: the bound is 30 ms (3x beats +5 ms).
        let rows = [row(0.25, 10_000.0, 500, 700), row(2.0, 31_000.0, 500, 700)];
        let v = violations(&rows, &soak(), &fine());
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("p99 grew from 10.00 ms") && v[0].contains("30.00 ms"),
            "{v:?}"
        );
        // First 1 ms: the bound is 6 ms (+5 ms beats 3x).
        let rows = [row(0.25, 1_000.0, 500, 700), row(2.0, 5_900.0, 500, 700)];
        assert!(violations(&rows, &soak(), &fine()).is_empty());
        let rows = [row(0.25, 1_000.0, 500, 700), row(2.0, 6_100.0, 500, 700)];
        assert_eq!(violations(&rows, &soak(), &fine()).len(), 1);
    }

    #[test]
    fn the_data_directory_has_its_bound() {
        // 2 x 700 + 256 = 1,656 MiB.
        let rows = [
            row(0.25, 10_000.0, 500, 700),
            row(2.0, 10_000.0, 500, 1_700),
        ];
        let v = violations(&rows, &soak(), &fine());
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("data directory grew from 700 MiB to 1700 MiB (bound: 1656 MiB"));
    }

    #[test]
    fn side_loads_fail_the_run() {
        let rows = [row(0.25, 10_000.0, 500, 700), row(2.0, 10_000.0, 500, 700)];
        let behind = End {
            changes_seen_seq: 90,
            ..fine()
        };
        let v = violations(&rows, &soak(), &behind);
        assert!(v.len() == 1 && v[0].contains("10 etags behind"), "{v:?}");
        let failed = End {
            failures: vec!["the changes-feed reader failed at minute 1.00: closed".into()],
            changes_seen_seq: 90,
            ..fine()
        };
        // The disconnection is the reason; its lag is not reported again.
        assert_eq!(violations(&rows, &soak(), &failed), failed.failures);
        let idle = End {
            sub_docs_total: 0,
            backups_total: 0,
            ..fine()
        };
        let v = violations(&rows, &soak(), &idle);
        assert!(
            v.len() == 2 && v[0].contains("subscription") && v[1].contains("no backup"),
            "{v:?}"
        );
    }

    #[test]
    fn the_plot_has_four_panels() {
        let rows = [row(0.25, 10_000.0, 500, 700), row(0.5, 12_000.0, 520, 720)];
        let path = std::env::temp_dir().join(format!("soak-plot-test-{}.svg", std::process::id()));
        plot::write(&path, &rows).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for title in ["Server memory", "Disk", "p99 latency", "Throughput"] {
            assert!(svg.contains(&format!(">{title}</text>")), "{title}");
        }
        assert_eq!(svg.matches("<polyline points=\"").count(), 4 + 7);
    }
}
