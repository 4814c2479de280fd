//! SPACE: bytes on disk after a YCSB load, against the raw bytes of the records
//! (issue 41, part 3). The same records for every system (YCSB's load phase:
//! `kiln_bench::ycsb::load_record`, keys `key_name(0..n)`), each sent the way it
//! receives them: `kiln serve` over HTTP (one PUT of a JSON document per record, as
//! YCSB's load does), PostgreSQL over its wire protocol (the YCSB jsonb table), and
//! SQLite in-process (the same JSON text in a table keyed like PostgreSQL's, in WAL
//! mode; `WITHOUT ROWID` took 4.1x the raw bytes, its rows of 1.1 KB going to
//! overflow pages).
//!
//! What is counted:
//! - `raw_bytes`: per record, the key's bytes plus the JSON document's bytes as sent
//!   (`{"field0":"<100 bytes>",...}`, about 1.1 KB); `raw_field_bytes` is the key
//!   plus the ten 100-byte values alone (no field names, no JSON punctuation).
//! - `bytes_on_disk`: Kiln: the whole data directory (every database's data file,
//!   journal files, index and search directories) after a clean shutdown, in bytes
//!   allocated on disk (st_blocks); `data_file_bytes` the data file alone;
//!   `bytes_on_disk_running` the directory while the server still runs, right after
//!   the load. PostgreSQL: `pg_total_relation_size` of the table (heap, TOAST and
//!   the primary key's index); its WAL (`pg_wal`) and whole cluster directory are
//!   reported beside it. SQLite: the database file plus its WAL after a
//!   `wal_checkpoint(TRUNCATE)`.
//!
//! For Kiln the row also carries what `kiln check --json` says after the shutdown:
//! pages in use and free, and per tree its entries, key and value bytes and pages
//! (docs/benchmarks.md, "Bytes on disk", turns these into the breakdown).

use crate::ycsb::{self, Params, System};
use anyhow::{bail, Context, Result};
use kiln_bench::ycsb::{key_name, load_record};
use serde_json::{json, Map, Value};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

pub const WORKLOADS: &[&str] = &["SPACE"];

/// Why `engine` does not run SPACE (None: it does).
pub fn not_applicable(engine: &str, _workload: &str) -> Option<&'static str> {
    match engine {
        "kiln" | "postgres" | "sqlite" => None,
        _ => Some(
            "SPACE compares document stores holding YCSB's records: kiln serve, \
             PostgreSQL (jsonb) and SQLite (JSON text)",
        ),
    }
}

/// Bytes of a file tree: (apparent length, allocated on disk).
pub fn dir_bytes(dir: &Path) -> (u64, u64) {
    let mut apparent = 0;
    let mut allocated = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    for e in entries.flatten() {
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            let (a, b) = dir_bytes(&e.path());
            apparent += a;
            allocated += b;
        } else {
            apparent += m.len();
            allocated += m.blocks() * 512;
        }
    }
    (apparent, allocated)
}

/// Bytes of the files under `dir` whose path relative to it satisfies `pick`
/// (apparent, allocated, count).
fn files_where(dir: &Path, pick: &dyn Fn(&Path) -> bool) -> (u64, u64, u64) {
    let mut out = (0, 0, 0);
    each_file(dir, &mut |p, m| {
        if pick(p) {
            out.0 += m.len();
            out.1 += m.blocks() * 512;
            out.2 += 1;
        }
    });
    out
}

/// Visits every file under `dir` (symlinks not followed), with its metadata;
/// what cannot be read is skipped.
pub(crate) fn each_file(dir: &Path, visit: &mut dyn FnMut(&Path, &std::fs::Metadata)) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let Ok(m) = p.symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(p);
            } else {
                visit(&p, &m);
            }
        }
    }
}

fn is_data_file(p: &Path) -> bool {
    p.file_name().is_some_and(|n| n == kiln_storage::DATA_FILE)
}

fn in_journal(p: &Path) -> bool {
    p.components().any(|c| c.as_os_str() == "journal")
}

/// The raw bytes of records `0..n`: (key + JSON document, key + field values).
fn raw_bytes(params: &Params) -> (u64, u64) {
    let (mut json_total, mut fields_total) = (0u64, 0u64);
    for k in 0..params.records {
        let key = key_name(k).len() as u64;
        let record = load_record(params.seed, k);
        json_total += key + ycsb::record_json(&record).len() as u64;
        fields_total += key + record.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
    }
    (json_total, fields_total)
}

/// One SPACE run for `engine` in `dir`, as a child's JSON object.
pub fn run(engine: &str, dir: &Path, params: &Params) -> Result<Value> {
    let started = Instant::now();
    let (raw, raw_fields) = raw_bytes(params);
    let mut row = Map::new();
    row.insert("workload".into(), json!("SPACE"));
    row.insert("engine".into(), json!(engine));
    row.insert("documents".into(), json!(params.records));
    row.insert("raw_bytes".into(), json!(raw));
    row.insert("raw_field_bytes".into(), json!(raw_fields));
    row.insert(
        "raw_bytes_counts".into(),
        json!("key + the JSON document as sent, per record"),
    );
    let load_s;
    match engine {
        "kiln" | "postgres" => {
            let (secs, extra) = server_load(engine, dir, params)?;
            load_s = secs;
            row.extend(extra);
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let (secs, extra) = sqlite_load(dir, params)?;
            load_s = secs;
            row.extend(extra);
        }
        other => bail!("SPACE runs kiln, postgres and sqlite, not {other:?}"),
    }
    let on_disk = row["bytes_on_disk"].as_u64().unwrap_or(0);
    let ratio = on_disk as f64 / raw.max(1) as f64;
    row.insert("ratio".into(), json!(ratio));
    row.insert("load_seconds".into(), json!(load_s));
    let rows = vec![
        json!({"row": "SPACE bytes on disk / raw", "unit": "x", "value": ratio, "lower_is_better": true}),
        json!({"row": "SPACE bytes on disk", "unit": "MB", "value": on_disk as f64 / 1e6, "lower_is_better": true}),
    ];
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "rows": rows,
        "extra": { "documents_row": Value::Object(row) },
    }))
}

/// Loads through YCSB's load phase against a server; measures once it is loaded.
fn server_load(engine: &str, dir: &Path, params: &Params) -> Result<(f64, Map<String, Value>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let system = System::start(engine, dir)?;
    let mut out = Map::new();
    let load_s = local.block_on(&rt, async {
        ycsb::setup(&system).await?;
        let (secs, _) = ycsb::load(&system, params).await?;
        Ok::<_, anyhow::Error>(secs)
    })?;
    match &system {
        System::Kiln { .. } => {
            let data = dir.join("kiln-data");
            // Let the flusher write the load back (the directory as it would be a
            // few seconds into a quiet period), then measure while it runs.
            std::thread::sleep(std::time::Duration::from_secs(3));
            let (app, alloc) = dir_bytes(&data);
            out.insert("bytes_on_disk_running".into(), json!(alloc));
            out.insert("bytes_on_disk_running_apparent".into(), json!(app));
            let (_, d_run, _) = files_where(&data, &is_data_file);
            let (_, j_run, j_files) = files_where(&data, &in_journal);
            out.insert("data_file_bytes_running".into(), json!(d_run));
            out.insert("journal_bytes_running".into(), json!(j_run));
            out.insert("journal_files_running".into(), json!(j_files));
            drop(system);
            kiln_breakdown(&data, &mut out)?;
        }
        #[cfg(feature = "postgres")]
        System::Postgres { server } => {
            let port = server.port;
            let sizes = local.block_on(&rt, pg_sizes(port))?;
            out.extend(sizes);
            let cluster = server.data_dir().to_path_buf();
            let (app, alloc) = dir_bytes(&cluster);
            out.insert("cluster_dir_bytes".into(), json!(alloc));
            out.insert("cluster_dir_bytes_apparent".into(), json!(app));
            drop(system);
        }
        _ => bail!("SPACE: no measurement for {engine}"),
    }
    Ok((load_s, out))
}

/// Kiln's directory after a clean shutdown, and what `kiln check` says of it.
fn kiln_breakdown(data: &Path, out: &mut Map<String, Value>) -> Result<()> {
    let (app, alloc) = dir_bytes(data);
    out.insert("bytes_on_disk".into(), json!(alloc));
    out.insert("bytes_on_disk_apparent".into(), json!(app));
    let (d_app, d_alloc, _) = files_where(data, &is_data_file);
    out.insert("data_file_bytes".into(), json!(d_alloc));
    out.insert("data_file_bytes_apparent".into(), json!(d_app));
    let (j_app, j_alloc, j_files) = files_where(data, &in_journal);
    out.insert("journal_bytes".into(), json!(j_alloc));
    out.insert("journal_bytes_apparent".into(), json!(j_app));
    out.insert("journal_files".into(), json!(j_files));
    out.insert(
        "other_bytes".into(),
        json!(alloc.saturating_sub(d_alloc + j_alloc)),
    );
    let bin = crate::server::kiln_binary()?;
    let check = Command::new(&bin)
        .args(["check", "--json"])
        .arg(data)
        .output()
        .with_context(|| format!("running {} check", bin.display()))?;
    let text = String::from_utf8_lossy(&check.stdout);
    let reports: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if !check.status.success() {
        bail!(
            "kiln check failed after the load: {} {}",
            text.trim(),
            String::from_utf8_lossy(&check.stderr).trim()
        );
    }
    out.insert("kiln_check".into(), json!(reports));
    Ok(())
}

#[cfg(feature = "postgres")]
async fn pg_sizes(port: u16) -> Result<Map<String, Value>> {
    let client = ycsb::pg_connect_bare(port).await?;
    // One statement a call: VACUUM refuses to run in the implicit transaction of a
    // multi-statement string.
    client.batch_execute("VACUUM ANALYZE usertable").await?;
    client.batch_execute("CHECKPOINT").await?;
    let row = client
        .query_one(
            "SELECT pg_total_relation_size('usertable'), pg_relation_size('usertable'), \
             pg_indexes_size('usertable'), \
             coalesce(pg_total_relation_size(reltoastrelid), 0), \
             (SELECT coalesce(sum(size), 0)::bigint FROM pg_ls_waldir()) \
             FROM pg_class WHERE relname = 'usertable'",
            &[],
        )
        .await?;
    let mut m = Map::new();
    m.insert("bytes_on_disk".into(), json!(row.get::<_, i64>(0)));
    m.insert("heap_bytes".into(), json!(row.get::<_, i64>(1)));
    m.insert("index_bytes".into(), json!(row.get::<_, i64>(2)));
    m.insert("toast_bytes".into(), json!(row.get::<_, i64>(3)));
    m.insert("wal_bytes".into(), json!(row.get::<_, i64>(4)));
    m.insert(
        "bytes_on_disk_counts".into(),
        json!("pg_total_relation_size('usertable'): heap + TOAST + the primary key's index, after CHECKPOINT and VACUUM ANALYZE; pg_wal beside it"),
    );
    Ok(m)
}

#[cfg(feature = "sqlite")]
fn sqlite_load(dir: &Path, params: &Params) -> Result<(f64, Map<String, Value>)> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("ycsb.sqlite");
    let mut db = rusqlite::Connection::open(&path)?;
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
         CREATE TABLE usertable (ycsb_key TEXT PRIMARY KEY, doc TEXT NOT NULL);",
    )?;
    let start = Instant::now();
    // In YCSB's insert order, 1,000 records a transaction (the bytes stored do
    // not depend on the batching; a commit per record would only take longer).
    let mut k = 0;
    while k < params.records {
        let tx = db.transaction()?;
        {
            let mut ins = tx.prepare_cached("INSERT INTO usertable VALUES (?1, ?2)")?;
            for k2 in k..(k + 1000).min(params.records) {
                let doc = ycsb::record_json(&load_record(params.seed, k2));
                ins.execute(rusqlite::params![key_name(k2), String::from_utf8(doc)?])?;
            }
        }
        tx.commit()?;
        k += 1000;
    }
    let secs = start.elapsed().as_secs_f64();
    db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    let mut m = Map::new();
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0);
    let wal = dir.join("ycsb.sqlite-wal");
    let (db_bytes, wal_bytes) = (size(&path), size(&wal));
    drop(db);
    m.insert("bytes_on_disk".into(), json!(db_bytes + wal_bytes));
    m.insert("db_file_bytes".into(), json!(db_bytes));
    m.insert("wal_bytes".into(), json!(wal_bytes));
    m.insert(
        "bytes_on_disk_counts".into(),
        json!("the database file + its WAL after wal_checkpoint(TRUNCATE); a rowid table (ycsb_key TEXT PRIMARY KEY, doc TEXT) with its primary key's index, as PostgreSQL's (WITHOUT ROWID took 4.1x: SQLite moves rows over ~1/20 of a page to overflow pages), journal_mode=WAL, 1,000 records a transaction"),
    );
    Ok((secs, m))
}
