//! W17 (issue 42): map-reduce aggregations, measured embedded (kiln-docs called
//! directly, as W12). N orders (~150 B: `company` one of 1,000, `amount` a decimal
//! with cents, `status`) are written first; then a reduce index grouping them by
//! company with `count()`, `sum(amount)` and `max(amount)` is defined and timed
//! until it has caught up (the build rate); then the grouped query
//! `from orders group by company ... limit 20` (its first page) and over every
//! group (`limit 1000`), p50 and p99 over repeated runs; then the idle update lag:
//! a single order rewritten, from its acknowledgment until the reduce index has
//! indexed it (what a non-stale query waits for), p50 and p99.
//!
//! PostgreSQL's `GROUP BY` over jsonb, the peer the issue names, is measured by
//! the comparative benchmark in bench/ (`--workloads W17`: the same orders, kiln
//! serve over HTTP beside it, the groups checked equal; docs/benchmarks.md).

use crate::corpus::order;
use crate::querybench::{fresh, time_query};
use crate::run::{BenchResult, Run};
use kiln_docs::{
    BatchOutcome, Condition, Database, DocId, IndexDefinition, IndexField, ParsedDocument,
    ReduceSpec, WriteOp,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::{json, Map};
use std::path::Path;
use std::time::{Duration, Instant};

const BATCH: u64 = 5_000;
const INDEX: &str = "orders-by-company";
const FIRST_PAGE: &str = "from orders group by company limit 20 \
     select company, count() as n, sum(amount) as total, max(amount) as top";
const ALL_GROUPS: &str = "from orders group by company limit 1000 \
     select company, count() as n, sum(amount) as total, max(amount) as top";

fn reduce_index() -> IndexDefinition {
    let aggregate = [
        ("n", "count()"),
        ("total", "sum(amount)"),
        ("top", "max(amount)"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    IndexDefinition {
        name: INDEX.into(),
        collection: Some("orders".into()),
        fields: Vec::new(),
        auto: false,
        reduce: Some(ReduceSpec {
            group_by: vec![IndexField {
                path: "company".into(),
                case_insensitive: false,
                ..Default::default()
            }],
            aggregate,
        }),
    }
}

/// Writes orders `from..to` in all-or-nothing batches; the last etag's sequence.
fn insert(db: &Database, from: u64, to: u64) -> BenchResult<u64> {
    let mut rng = SmallRng::seed_from_u64(from);
    let (mut n, mut last) = (from, 0);
    while n < to {
        let end = (n + BATCH).min(to);
        let mut ops = Vec::with_capacity((end - n) as usize);
        for i in n..end {
            ops.push(WriteOp::Put {
                id: DocId::Given(format!("orders/{i:09}")),
                document: ParsedDocument::parse(&order(&mut rng, i))?,
                condition: Condition::None,
            });
        }
        if let Some(BatchOutcome::Put(p)) = db.write_all(ops)?.last() {
            last = p.etag.sequence;
        }
        n = end;
    }
    Ok(last)
}

/// The time from a rewrite's acknowledgment until the index has it, `samples`
/// times (one rewrite every 20 ms, idle otherwise); sorted milliseconds.
fn update_lags(db: &Database, documents: u64, samples: usize) -> BenchResult<Vec<f64>> {
    let mut rng = SmallRng::seed_from_u64(17);
    let mut lags = Vec::with_capacity(samples);
    for _ in 0..samples {
        std::thread::sleep(Duration::from_millis(20));
        let n = rng.gen_range(0..documents);
        let put = db.put(
            &format!("orders/{n:09}"),
            &order(&mut rng, n),
            Condition::None,
        )?;
        let acked = Instant::now();
        if !db.wait_for_index(INDEX, put.etag.sequence, Duration::from_secs(10))? {
            return Err("the reduce index did not index a rewrite within 10 s".into());
        }
        lags.push(acked.elapsed().as_secs_f64() * 1e3);
    }
    lags.sort_by(f64::total_cmp);
    Ok(lags)
}

/// W17 over `documents` orders (1,000,000; 100,000 with `quick`).
pub fn w17(dir: &Path, quick: bool, documents: Option<u64>) -> BenchResult<Run> {
    let documents = documents.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let (store, db) = fresh(dir)?;
    let mut extra = Map::new();
    let t = Instant::now();
    let last = insert(&db, 0, documents)?;
    extra.insert("documents".into(), json!(documents));
    extra.insert(
        "insert_docs_per_sec".into(),
        json!(documents as f64 / t.elapsed().as_secs_f64()),
    );
    let t = Instant::now();
    db.define_index(reduce_index())?;
    if !db.wait_for_index(INDEX, last, Duration::from_secs(3600))? {
        return Err("the reduce index did not catch up".into());
    }
    let build_secs = t.elapsed().as_secs_f64();
    extra.insert("build_seconds".into(), json!(build_secs));
    extra.insert(
        "build_docs_per_sec".into(),
        json!(documents as f64 / build_secs),
    );
    let iterations = if quick { 50 } else { 200 };
    for (name, text) in [("first_page", FIRST_PAGE), ("all_groups", ALL_GROUPS)] {
        let (p50, p99, groups) = time_query(&db, text, iterations)?;
        extra.insert(format!("{name}_p50_ms"), json!(p50));
        extra.insert(format!("{name}_p99_ms"), json!(p99));
        extra.insert("groups".into(), json!(groups));
    }
    let lags = update_lags(&db, documents, if quick { 50 } else { 200 })?;
    extra.insert(
        "update_lag_p50_ms".into(),
        json!(crate::stats::quantile(&lags, 0.5).unwrap_or(f64::NAN)),
    );
    extra.insert(
        "update_lag_p99_ms".into(),
        json!(crate::stats::quantile(&lags, 0.99).unwrap_or(f64::NAN)),
    );
    drop(db);
    store.close()?;
    Ok(Run {
        ops: documents,
        commits: 1,
        seconds: build_secs,
        extra,
    })
}
