//! Reduce indexes (map-reduce aggregations): random documents, updates and deletes,
//! and after each round the grouped query answered by the index compared with the
//! groups computed here by brute force from a model of the documents; the same
//! query with a `where` (answered by a scan) too. Also: a restart keeps the
//! aggregates, a reset rebuilds them, exact decimal sums, bad definitions refused.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    Condition, DocStore, DocsOptions, IndexDefinition, IndexField, QueryOptions, ReduceSpec,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.indexing.min_batch = 4;
    o.indexing.max_batch = 64;
    o
}

fn wait() -> QueryOptions {
    QueryOptions {
        wait_for_non_stale_ms: 10_000,
    }
}

fn reduce_def(name: &str) -> IndexDefinition {
    let aggregate = [
        ("n", "count()"),
        ("total", "sum(amount)"),
        ("mean", "avg(amount)"),
        ("lo", "min(amount)"),
        ("hi", "max(amount)"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    IndexDefinition {
        name: name.into(),
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

const QUERY: &str = "from orders group by company select company, count() as n, \
                     sum(amount) as total, avg(amount) as mean, min(amount) as lo, \
                     max(amount) as hi limit 1000";

fn random_order(rng: &mut StdRng) -> Value {
    let mut doc = Map::new();
    match rng.gen_range(0..10) {
        0 => {}                                               // no company: the null group
        1 => drop(doc.insert("company".into(), Value::Null)), // null too
        _ => drop(doc.insert("company".into(), json!(format!("c{}", rng.gen_range(0..6))))),
    }
    match rng.gen_range(0..10) {
        0 => {}
        1 => drop(doc.insert("amount".into(), json!("n/a"))),
        2 => drop(doc.insert("amount".into(), json!(rng.gen_range(-50i64..50)))),
        _ => {
            let cents = rng.gen_range(-10_000i64..100_000);
            let text = format!(
                "{}{}.{:02}",
                if cents < 0 { "-" } else { "" },
                cents.abs() / 100,
                cents.abs() % 100
            );
            doc.insert("amount".into(), serde_json::from_str(&text).unwrap());
        }
    }
    Value::Object(doc)
}

/// The model's answer: per company (missing and null are one group, null), the
/// count, the sum and mean of the numeric amounts (in cents, exact), and the least
/// and greatest amount in the index order (numbers before strings).
/// A group's count, sum, mean, least and greatest.
type Group = (u64, i64, u64, Option<Value>, Option<Value>);

fn brute_force(model: &BTreeMap<String, Value>) -> BTreeMap<String, Group> {
    let mut groups = BTreeMap::new();
    for doc in model.values() {
        let company = doc
            .get("company")
            .cloned()
            .unwrap_or(Value::Null)
            .to_string();
        let g = groups
            .entry(company)
            .or_insert((0u64, 0i64, 0u64, None::<Value>, None::<Value>));
        g.0 += 1;
        let Some(amount) = doc.get("amount") else {
            continue;
        };
        if let Some(f) = amount.as_f64() {
            g.1 += (f * 100.0).round() as i64;
            g.2 += 1;
        }
        let key = |v: &Value| match v {
            Value::Number(n) => (0, n.as_f64().unwrap(), String::new()),
            Value::String(s) => (1, 0.0, s.clone()),
            _ => (2, 0.0, String::new()),
        };
        let less =
            |a: &Value, b: &Value| key(a).partial_cmp(&key(b)) == Some(std::cmp::Ordering::Less);
        if g.3.as_ref().is_none_or(|lo| less(amount, lo)) {
            g.3 = Some(amount.clone());
        }
        if g.4.as_ref().is_none_or(|hi| less(hi, amount)) {
            g.4 = Some(amount.clone());
        }
    }
    groups
}

fn check(db: &kiln_docs::Database, text: &str, model: &BTreeMap<String, Value>, by_index: bool) {
    let got = db
        .query(text, &Map::new(), wait())
        .unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(!got.stale, "{text}");
    assert_eq!(
        got.index.is_some(),
        by_index,
        "{text}: index {:?}",
        got.index
    );
    let want = brute_force(model);
    assert_eq!(got.total, want.len() as u64, "{text}: groups");
    assert_eq!(got.results.len(), want.len(), "{text}");
    for raw in &got.results {
        let row: Value = serde_json::from_slice(raw).unwrap();
        let company = row["company"].to_string();
        let (n, cents, values, lo, hi) = want
            .get(&company)
            .unwrap_or_else(|| panic!("{text}: a group {company} the model does not have"));
        assert_eq!(row["n"], json!(n), "{text}: count of {company}");
        let total = row["total"].as_f64().unwrap();
        assert!(
            (total * 100.0 - *cents as f64).abs() < 1e-6,
            "{text}: sum of {company}: {total} vs {cents} cents"
        );
        if *values == 0 {
            assert_eq!(row["mean"], Value::Null, "{text}: mean of {company}");
        } else {
            let mean = row["mean"].as_f64().unwrap();
            let want_mean = *cents as f64 / 100.0 / *values as f64;
            assert!((mean - want_mean).abs() < 1e-6, "{text}: mean of {company}");
        }
        assert_eq!(
            row["lo"],
            lo.clone().unwrap_or(Value::Null),
            "{text}: min of {company}"
        );
        assert_eq!(
            row["hi"],
            hi.clone().unwrap_or(Value::Null),
            "{text}: max of {company}"
        );
    }
}

#[test]
fn reduce_index_matches_brute_force_through_updates_deletes_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut model: BTreeMap<String, Value> = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(42);
    {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.create_database("m").unwrap();
        db.define_index(reduce_def("by-company")).unwrap();
        for _round in 0..6 {
            for _ in 0..80 {
                let id = format!("orders/{}", rng.gen_range(0..120));
                if rng.gen_range(0..5) == 0 && model.contains_key(&id) {
                    db.delete(&id, Condition::None).unwrap();
                    model.remove(&id);
                } else {
                    let doc = random_order(&mut rng);
                    db.put(&id, doc.to_string().as_bytes(), Condition::None)
                        .unwrap();
                    model.insert(id, doc);
                }
            }
            // Another collection never counts.
            db.put(
                "others/1",
                br#"{"company": "c1", "amount": 1000}"#,
                Condition::None,
            )
            .unwrap();
            check(&db, QUERY, &model, true);
            // With a where: reduced from a scan of the matching documents.
            let all = QUERY.replace("group by", "where not exists(zzz) group by");
            check(&db, &all, &model, false);
            // A where on the group field only: the index answers it by filtering
            // its groups, exactly as reducing the matching documents does.
            for w in [
                "company = 'c1'",
                "company in ('c2', 'c3') or company > 'c4'",
                "not company startsWith 'c1'",
                "company != 'c4'",
                "not (company < 'c3')",
            ] {
                let by_index = QUERY.replace("group by", &format!("where {w} group by"));
                let by_scan = QUERY.replace(
                    "group by",
                    &format!("where ({w}) and not exists(zzz) group by"),
                );
                let (a, b) = (
                    db.query(&by_index, &Map::new(), wait()).unwrap(),
                    db.query(&by_scan, &Map::new(), wait()).unwrap(),
                );
                assert!(a.index.is_some() && b.index.is_none(), "{w}");
                assert_eq!(a.total, b.total, "{w}");
                let rows = |r: &kiln_docs::QueryResult| -> Vec<Value> {
                    r.results
                        .iter()
                        .map(|x| serde_json::from_slice(x).unwrap())
                        .collect()
                };
                assert_eq!(rows(&a), rows(&b), "{w}");
            }
        }
        drop(db);
        store.close().unwrap();
    }
    // Reopened: the aggregates are as they were.
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("m").unwrap();
    check(&db, QUERY, &model, true);
    // Reset: rebuilt from the change log, same answer.
    db.reset_index("by-company").unwrap();
    check(&db, QUERY, &model, true);
    // Paging over groups, and ordering by an output.
    let page = db
        .query(
            "from orders group by company order by n desc, company limit 2 offset 1 select company, count() as n",
            &Map::new(),
            wait(),
        )
        .unwrap();
    assert_eq!(page.results.len(), 2);
    assert_eq!(page.total, brute_force(&model).len() as u64);
    let counts: Vec<u64> = page
        .results
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(r).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(counts[0] >= counts[1], "{counts:?}");
}

#[test]
fn decimal_sums_stay_exact_through_many_updates() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("m").unwrap();
    db.define_index(reduce_def("by-company")).unwrap();
    // 0.1 written and rewritten many times: a float sum would drift.
    for i in 0..300 {
        let id = format!("orders/{}", i % 10);
        db.put(&id, br#"{"company": "a", "amount": 0.1}"#, Condition::None)
            .unwrap();
    }
    let got = db.query(QUERY, &Map::new(), wait()).unwrap();
    let row: Value = serde_json::from_slice(&got.results[0]).unwrap();
    assert_eq!(row["total"], json!(1), "{row}");
    assert_eq!(row["n"], json!(10));
}

#[test]
fn bad_reduce_definitions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("m").unwrap();
    let mut d = reduce_def("x");
    d.reduce
        .as_mut()
        .unwrap()
        .aggregate
        .insert("bad".into(), "median(amount)".into());
    assert!(db.define_index(d).is_err());
    let mut d = reduce_def("x");
    d.reduce.as_mut().unwrap().group_by.clear();
    assert!(db.define_index(d).is_err());
    let mut d = reduce_def("x");
    d.fields.push(IndexField {
        path: "a".into(),
        case_insensitive: false,
        ..Default::default()
    });
    assert!(db.define_index(d).is_err());
    // A query selecting a field it does not group by, or an aggregate without
    // group by, is refused with a message.
    for text in [
        "from orders group by company select amount",
        "from orders select count()",
        "from orders group by company select company, sum() as s",
    ] {
        let e = db.query(text, &Map::new(), wait()).unwrap_err();
        assert!(e.to_string().len() > 10, "{text}: {e}");
    }
}

#[test]
fn a_grouped_query_defines_an_auto_reduce_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options();
    o.indexing.max_scan_docs = 50;
    let store = DocStore::open(dir.path(), o).unwrap();
    let db = store.create_database("auto").unwrap();
    let put = |i: usize| {
        db.put(
            &format!("orders/{i}"),
            json!({"company": format!("c{}", i % 3), "amount": i, "@metadata": {"@collection": "orders"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    };
    for i in 0..30 {
        put(i);
    }
    let text = "from orders group by company select company, count() as n, sum(amount) as total";
    let rows = |r: &kiln_docs::QueryResult| -> Vec<Value> {
        r.results
            .iter()
            .map(|b| serde_json::from_slice(b).unwrap())
            .collect()
    };
    // Small collection: answered exactly by a scan, the index defined for next time.
    let first = db
        .query(text, &Map::new(), QueryOptions::default())
        .unwrap();
    let name = first
        .auto_index_created
        .clone()
        .expect("an auto reduce index");
    assert_eq!(name, "auto/orders/group/company/count.sum_amount");
    assert!(first.index.is_none());
    assert_eq!(
        rows(&first)[0],
        json!({"company": "c0", "n": 10, "total": 135})
    );
    let def = db.index_definition(&name).unwrap();
    assert!(def.auto && def.reduce.is_some());
    // Next time (other output names, the same aggregates): the index answers.
    let second = db
        .query(
            "from orders group by company select company, sum(amount) as s, count() as c",
            &Map::new(),
            wait(),
        )
        .unwrap();
    assert_eq!(second.index.as_deref(), Some(name.as_str()));
    assert!(second.auto_index_created.is_none());
    assert_eq!(
        rows(&second)[1],
        json!({"company": "c1", "s": 145, "c": 10})
    );
    // A collection past the scan limit: the new index answers at once (stale,
    // then exact once it has caught up), where a scan would be refused.
    for i in 30..80 {
        put(i);
    }
    let big = "from orders group by company select company, max(amount) as top";
    let r = db.query(big, &Map::new(), wait()).unwrap();
    assert!(r.auto_index_created.is_some());
    let r = db.query(big, &Map::new(), wait()).unwrap();
    assert!(!r.stale);
    assert_eq!(rows(&r)[2], json!({"company": "c2", "top": 77}));
    drop(db);
    store.close().unwrap();
}
