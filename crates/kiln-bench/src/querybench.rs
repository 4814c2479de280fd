//! W12 and W13 of shared/BENCHMARKS.md: indexes and queries, measured embedded
//! (kiln-docs called directly, no HTTP: what is measured is the indexer and the
//! query engine, not the network).
//!
//! - W12: N documents (~300 B: `n` 1..=N, `tag` one of 100, `name`), indexes on `n`
//!   and `tag`: the full index build rate; `where n > 0` first page of 20 (p50/p99)
//!   and its count; `where tag = 'x'` likewise; `order by n desc limit 20`.
//! - W13: index lag: one write every 50 ms, time from its ack until it is visible to
//!   a non-stale query; then a bulk insert with 3 indexes: the largest lag during it,
//!   the time after it until every index has caught up, and the batch sizes the
//!   indexer chose.

use kiln_docs::{
    BatchOutcome, Condition, Database, DocId, DocStore, DocsOptions, IndexDefinition, IndexField,
    ParsedDocument, QueryOptions, WriteOp,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::run::{BenchResult, Run};

/// What W12 or W13 measured.
struct Figures {
    pub documents: u64,
    pub seconds: f64,
    pub extra: Map<String, Value>,
}

const BATCH: u64 = 5_000;

fn doc(rng: &mut SmallRng, n: u64) -> Vec<u8> {
    let payload: String = (0..170)
        .map(|_| (b'a' + rng.gen_range(0..26)) as char)
        .collect();
    json!({
        "name": format!("item-{n}"),
        "n": n,
        "tag": format!("tag-{}", n % 100),
        "email": format!("user{n}@example.com"),
        "payload": payload,
    })
    .to_string()
    .into_bytes()
}

/// `kiln bench --encryption-key-file`: the master key the embedded document
/// workloads (W12, W13, W16, W17) open their stores with.
pub static ENCRYPTION: std::sync::OnceLock<kiln_storage::MasterKey> = std::sync::OnceLock::new();

/// The options of an embedded document workload's store: the defaults, encrypted
/// under `ENCRYPTION` when it is set.
pub(crate) fn docs_options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.encryption = ENCRYPTION.get().cloned();
    o
}

pub(crate) fn fresh(dir: &Path) -> BenchResult<(DocStore, Arc<Database>)> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let store = DocStore::open(dir, docs_options())?;
    let db = store.create_database("bench")?;
    Ok((store, db))
}

/// Writes documents `from..to` (ids `items/<n>`) in all-or-nothing batches; calls
/// `acked(last_sequence)` after each.
fn insert(db: &Database, from: u64, to: u64, mut acked: impl FnMut(u64)) -> BenchResult<()> {
    let mut rng = SmallRng::seed_from_u64(from);
    let mut n = from;
    while n < to {
        let end = (n + BATCH).min(to);
        let mut ops = Vec::with_capacity((end - n) as usize);
        for i in n..end {
            ops.push(WriteOp::Put {
                id: DocId::Given(format!("items/{i:09}")),
                document: ParsedDocument::parse(&doc(&mut rng, i))?,
                condition: Condition::None,
            });
        }
        let out = db.write_all(ops)?;
        if let Some(BatchOutcome::Put(p)) = out.last() {
            acked(p.etag.sequence);
        }
        n = end;
    }
    Ok(())
}

fn index(name: &str, field: &str) -> IndexDefinition {
    IndexDefinition {
        name: name.into(),
        collection: Some("items".into()),
        fields: vec![IndexField {
            path: field.into(),
            case_insensitive: false,
            ..Default::default()
        }],
        auto: false,
        reduce: None,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs a query `iterations` times (after 3 warm-ups); (p50, p99) ms and the last
/// answer's total.
pub(crate) fn time_query(
    db: &Database,
    text: &str,
    iterations: usize,
) -> BenchResult<(f64, f64, u64)> {
    let params = Map::new();
    let mut total = 0;
    for _ in 0..3 {
        db.query(text, &params, QueryOptions::default())?;
    }
    let mut ms = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let r = db.query(text, &params, QueryOptions::default())?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        total = r.total;
    }
    ms.sort_by(f64::total_cmp);
    Ok((percentile(&ms, 0.5), percentile(&ms, 0.99), total))
}

/// The batches run between two histograms, as `{"<size>": batches}`.
fn batch_summary(before: &[(usize, u64)], after: &[(usize, u64)]) -> Value {
    let mut out = Map::new();
    for (size, n) in after {
        let was = before
            .iter()
            .find(|(s, _)| s == size)
            .map_or(0, |(_, n)| *n);
        if *n > was {
            out.insert(size.to_string(), json!(n - was));
        }
    }
    Value::Object(out)
}

/// W12: index build and queries over 1,000,000 documents (100,000 with `quick`)
/// unless `documents` says otherwise.
pub fn w12(dir: &Path, quick: bool, documents: Option<u64>) -> BenchResult<Run> {
    let documents = documents.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    Ok(index_and_queries(dir, documents)?.run())
}

/// W13: index lag, idle and under a bulk insert of 3,000,000 documents (300,000
/// with `quick`, unless `documents` says otherwise) with 3 indexes.
pub fn w13(dir: &Path, quick: bool, documents: Option<u64>) -> BenchResult<Run> {
    let documents = documents.unwrap_or(if quick { 300_000 } else { 3_000_000 });
    Ok(index_lag(dir, documents, if quick { 50 } else { 200 })?.run())
}

impl Figures {
    /// As a run of `kiln bench`: one commit (the figures are not per commit).
    fn run(self) -> Run {
        Run {
            ops: self.documents,
            commits: 1,
            seconds: self.seconds,
            extra: self.extra,
        }
    }
}

fn index_and_queries(dir: &Path, documents: u64) -> BenchResult<Figures> {
    // `KILN_BENCH_UNCOUNTED_INDEXES=1`: indexes as before counted trees (totals
    // walked), to compare the build rate and the query times.
    let uncounted = std::env::var_os("KILN_BENCH_UNCOUNTED_INDEXES").is_some_and(|v| v == "1");
    kiln_docs::COUNTED_ENTRIES_TREES.store(!uncounted, Ordering::Relaxed);
    let (store, db) = fresh(dir)?;
    let mut extra = Map::new();
    let build_secs = insert_and_build(&db, documents, &mut extra)?;
    extra.insert("counted_indexes".into(), json!(!uncounted));
    extra.insert(
        "index_build_batch_sizes".into(),
        batch_summary(&[], &db.index_batch_sizes()),
    );
    query_latencies(&db, documents, &mut extra)?;
    drop(db);
    store.close()?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(Figures {
        documents,
        seconds: build_secs,
        extra,
    })
}

/// W12's data: `documents` written (the insert rate into `extra`), then the
/// indexes on `n` and `tag` defined and timed until both have caught up; the
/// build's seconds.
fn insert_and_build(
    db: &Database,
    documents: u64,
    extra: &mut Map<String, Value>,
) -> BenchResult<f64> {
    let t = Instant::now();
    insert(db, 1, documents + 1, |_| {})?;
    let insert_secs = t.elapsed().as_secs_f64();
    extra.insert("documents".into(), json!(documents));
    extra.insert(
        "insert_docs_per_sec".into(),
        json!(documents as f64 / insert_secs),
    );
    let last = db.last_sequence();
    let t = Instant::now();
    db.define_index(index("items-by-n", "n"))?;
    db.define_index(index("items-by-tag", "tag"))?;
    for name in ["items-by-n", "items-by-tag"] {
        if !db.wait_for_index(name, last, Duration::from_secs(3600))? {
            return Err(format!("index {name} did not catch up").into());
        }
    }
    let build_secs = t.elapsed().as_secs_f64();
    extra.insert(
        "index_build_docs_per_sec".into(),
        json!(documents as f64 / build_secs),
    );
    extra.insert("index_build_seconds".into(), json!(build_secs));
    Ok(build_secs)
}

/// W12's queries over the `documents` written: each first page of 20 (p50/p99,
/// its total checked) and its count, then `order by n desc`; into `extra`.
fn query_latencies(
    db: &Database,
    documents: u64,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    let iterations = 200;
    let queries = [
        (
            "",
            "from items where n > 0 limit 20",
            "from items where n > 0 limit 0",
            documents,
        ),
        (
            "tag_",
            "from items where tag = 'tag-7' limit 20",
            "from items where tag = 'tag-7' limit 0",
            documents / 100,
        ),
        (
            "half_",
            "from items where n <= $half limit 20",
            "from items where n <= $half limit 0",
            documents / 2,
        ),
    ];
    for (prefix, page, count, expect) in queries {
        let half = (documents / 2).to_string();
        let page = page.replace("$half", &half);
        let count = count.replace("$half", &half);
        let (p50, p99, total) = time_query(db, &page, iterations)?;
        if total != expect {
            return Err(format!("{page}: total {total}, expected {expect}").into());
        }
        let (c50, _, _) = time_query(db, &count, iterations.min(50))?;
        extra.insert(format!("{prefix}first_page_p50_ms"), json!(p50));
        extra.insert(format!("{prefix}first_page_p99_ms"), json!(p99));
        extra.insert(format!("{prefix}count_ms"), json!(c50));
    }
    let (p50, p99, _) = time_query(db, "from items order by n desc limit 20", iterations)?;
    extra.insert("order_desc_first_page_p50_ms".into(), json!(p50));
    extra.insert("order_desc_first_page_p99_ms".into(), json!(p99));
    Ok(())
}

/// W13's indexes.
const LAG_INDEXES: [&str; 3] = ["items-by-n", "items-by-tag", "items-by-name"];

fn index_lag(dir: &Path, flood_documents: u64, idle_writes: u64) -> BenchResult<Figures> {
    let (store, db) = fresh(dir)?;
    for (name, field) in LAG_INDEXES.into_iter().zip(["n", "tag", "name"]) {
        db.define_index(index(name, field))?;
    }
    let mut extra = Map::new();
    idle_lag(&db, idle_writes, &mut extra)?;
    let insert_secs = flood_lag(&db, flood_documents, &mut extra)?;
    drop(db);
    store.close()?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(Figures {
        documents: flood_documents,
        seconds: insert_secs,
        extra,
    })
}

/// Idle: one write every 50 ms; ack -> every index has it (a non-stale query sees it).
/// The lag's p50/p99 into `extra`.
fn idle_lag(db: &Database, idle_writes: u64, extra: &mut Map<String, Value>) -> BenchResult<()> {
    let mut rng = SmallRng::seed_from_u64(13);
    let mut lags = Vec::new();
    for i in 0..idle_writes {
        let n = 10_000_000_000 + i;
        let put = db.put(&format!("items/{n}"), &doc(&mut rng, n), Condition::None)?;
        let acked = Instant::now();
        for name in LAG_INDEXES {
            db.wait_for_index(name, put.etag.sequence, Duration::from_secs(10))?;
        }
        lags.push(acked.elapsed().as_secs_f64() * 1e3);
        let r = db.query(
            &format!("from items where n = {n}"),
            &Map::new(),
            QueryOptions::default(),
        )?;
        if r.total != 1 || r.stale {
            return Err(format!("write {n} not visible after its index caught up").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    lags.sort_by(f64::total_cmp);
    extra.insert("lag_p50_ms".into(), json!(percentile(&lags, 0.5)));
    extra.insert("lag_p99_ms".into(), json!(percentile(&lags, 0.99)));
    Ok(())
}

/// Flood: a bulk insert of `flood_documents` while a sampler measures how old the
/// oldest acknowledged write not yet in every index is; the insert rate, the
/// largest lag, the catch-up after the insert and the indexer's batches into
/// `extra`. The insert's seconds.
fn flood_lag(
    db: &Arc<Database>,
    flood_documents: u64,
    extra: &mut Map<String, Value>,
) -> BenchResult<f64> {
    let acks: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = spawn_lag_sampler(db.clone(), acks.clone(), done.clone());
    let before = db.index_batch_sizes();
    let t = Instant::now();
    insert(db, 1, flood_documents + 1, |seq| {
        acks.lock()
            .expect("not poisoned")
            .push((seq, Instant::now()))
    })?;
    let insert_secs = t.elapsed().as_secs_f64();
    let ended = Instant::now();
    let last = db.last_sequence();
    for name in LAG_INDEXES {
        db.wait_for_index(name, last, Duration::from_secs(3600))?;
    }
    let catch_up_ms = ended.elapsed().as_secs_f64() * 1e3;
    done.store(true, Ordering::SeqCst);
    let max_lag = sampler.join().map_err(|_| "the lag sampler failed")?;
    let sizes = db.index_batch_sizes();
    extra.insert("flood_documents".into(), json!(flood_documents));
    extra.insert(
        "flood_insert_docs_per_sec".into(),
        json!(flood_documents as f64 / insert_secs),
    );
    extra.insert("flood_max_lag_ms".into(), json!(max_lag.max(catch_up_ms)));
    extra.insert("catch_up_ms".into(), json!(catch_up_ms));
    extra.insert("batch_sizes".into(), batch_summary(&before, &sizes));
    Ok(insert_secs)
}

/// Every 50 ms until `done`: the age of the oldest of `acks` (sequence, when
/// acknowledged) that some index of W13 has not reached yet. The thread returns
/// the largest age seen, in ms.
fn spawn_lag_sampler(
    db: Arc<Database>,
    acks: Arc<Mutex<Vec<(u64, Instant)>>>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || -> f64 {
        let mut max_lag: f64 = 0.0;
        while !done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
            let indexed = LAG_INDEXES
                .iter()
                .filter_map(|n| db.index_info(n).ok())
                .map(|i| i.last_indexed_etag.map_or(0, |e| e.sequence))
                .min()
                .unwrap_or(0);
            let acks = acks.lock().expect("not poisoned");
            let oldest = acks.iter().find(|(seq, _)| *seq > indexed);
            if let Some((_, at)) = oldest {
                max_lag = max_lag.max(at.elapsed().as_secs_f64() * 1e3);
            }
        }
        max_lag
    })
}
