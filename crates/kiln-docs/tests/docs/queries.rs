//! Indexes and queries: random documents, updates and deletes; random queries
//! compared with a brute-force filter over the same documents (type-order edge
//! cases, paging, counts); staleness and waiting; restart; hostile queries.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::QueryError;
use kiln_docs::{
    Condition, DocError, DocStore, DocsOptions, IndexDefinition, IndexField, QueryOptions,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o.indexing.min_batch = 4;
    o.indexing.max_batch = 64;
    o
}

fn def(name: &str, collection: &str, paths: &[&str]) -> IndexDefinition {
    IndexDefinition {
        name: name.into(),
        collection: Some(collection.into()),
        fields: paths
            .iter()
            .map(|p| IndexField {
                path: p.to_string(),
                case_insensitive: false,
                ..Default::default()
            })
            .collect(),
        auto: false,
        reduce: None,
    }
}

fn wait() -> QueryOptions {
    QueryOptions {
        wait_for_non_stale_ms: 10_000,
    }
}

// ---- the model: the documented semantics, written independently ----

fn rank(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Bool(false) => 1,
        Value::Bool(true) => 2,
        Value::Number(_) => 3,
        Value::String(_) => 4,
        _ => 5,
    }
}

fn class(v: &Value) -> u8 {
    match v {
        Value::Bool(_) => 1,
        other => rank(other),
    }
}

/// The total order (numbers here are small: f64 is exact).
fn cmp(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .unwrap()
            .partial_cmp(&y.as_f64().unwrap())
            .unwrap(),
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        _ => rank(a).cmp(&rank(b)),
    }
}

fn values<'a>(doc: &'a Value, field: &str) -> Vec<&'a Value> {
    match field.strip_suffix("[]") {
        Some(f) => match doc.get(f) {
            Some(Value::Array(items)) => items.iter().collect(),
            Some(v) => vec![v],
            None => vec![],
        },
        None => doc.get(field).into_iter().collect(),
    }
}

#[derive(Debug, Clone)]
enum M {
    Cmp(&'static str, &'static str, Value),
    In(&'static str, Vec<Value>),
    Between(&'static str, Value, Value),
    StartsWith(&'static str, String),
    Exists(&'static str),
    And(Box<M>, Box<M>),
    Or(Box<M>, Box<M>),
    Not(Box<M>),
}

fn scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

fn holds(m: &M, doc: &Value) -> bool {
    match m {
        M::Cmp(f, "!=", v) => !holds(&M::Cmp(f, "=", v.clone()), doc),
        M::Cmp(f, op, v) => values(doc, f).into_iter().filter(|x| scalar(x)).any(|x| {
            if class(x) != class(v) {
                return false;
            }
            let o = cmp(x, v);
            match *op {
                "=" => o.is_eq(),
                "<" => o.is_lt(),
                "<=" => o.is_le(),
                ">" => o.is_gt(),
                ">=" => o.is_ge(),
                _ => unreachable!(),
            }
        }),
        M::In(f, vs) => values(doc, f)
            .into_iter()
            .filter(|x| scalar(x))
            .any(|x| vs.iter().any(|v| class(x) == class(v) && cmp(x, v).is_eq())),
        M::Between(f, lo, hi) => values(doc, f)
            .into_iter()
            .filter(|x| scalar(x))
            .any(|x| class(x) == class(lo) && cmp(x, lo).is_ge() && cmp(x, hi).is_le()),
        M::StartsWith(f, p) => values(doc, f)
            .into_iter()
            .any(|x| matches!(x, Value::String(s) if s.starts_with(p.as_str()))),
        M::Exists(f) => !values(doc, f).is_empty(),
        M::And(a, b) => holds(a, doc) && holds(b, doc),
        M::Or(a, b) => holds(a, doc) || holds(b, doc),
        M::Not(a) => !holds(a, doc),
    }
}

fn lit(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{}'", s.replace('\'', "''")),
        other => other.to_string(),
    }
}

fn render(m: &M) -> String {
    match m {
        M::Cmp(f, op, v) => format!("{f} {op} {}", lit(v)),
        M::In(f, vs) => format!(
            "{f} in ({})",
            vs.iter().map(lit).collect::<Vec<_>>().join(", ")
        ),
        M::Between(f, lo, hi) => format!("{f} between {} and {}", lit(lo), lit(hi)),
        M::StartsWith(f, p) => format!("startsWith({f}, {})", lit(&Value::String(p.clone()))),
        M::Exists(f) => format!("exists({f})"),
        M::And(a, b) => format!("({} and {})", render(a), render(b)),
        M::Or(a, b) => format!("({} or {})", render(a), render(b)),
        M::Not(a) => format!("not ({})", render(a)),
    }
}

fn random_value(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..12) {
        0 => Value::Null,
        1 => json!(rng.gen_bool(0.5)),
        2 => json!(rng.gen_range(-3..4) as f64 + 0.5),
        3..=6 => json!(rng.gen_range(-5..10)),
        7 => json!(["a", "b", "A", "ab", "", "b\u{0}"][rng.gen_range(0..6)]),
        8 => json!(10),
        9 => json!(9.0),
        _ => json!(rng.gen_range(0..3)),
    }
}

fn random_doc(rng: &mut StdRng) -> Value {
    let mut o = Map::new();
    if rng.gen_range(0..8) != 0 {
        o.insert("n".into(), random_value(rng));
    }
    o.insert(
        "tag".into(),
        json!(["red", "green", "blue", "Red", "gr"][rng.gen_range(0..5)]),
    );
    let tags: Vec<Value> = (0..rng.gen_range(0..3))
        .map(|_| json!(["x", "y", "z"][rng.gen_range(0..3)]))
        .collect();
    if rng.gen_bool(0.8) {
        o.insert("tags".into(), Value::Array(tags));
    }
    Value::Object(o)
}

fn random_pred(rng: &mut StdRng, depth: u32) -> M {
    let field: &'static str = ["n", "tag", "tags[]", "n"][rng.gen_range(0..4)];
    let v = || -> Value { Value::Null };
    let _ = v;
    if depth < 2 && rng.gen_range(0..4) == 0 {
        let a = Box::new(random_pred(rng, depth + 1));
        let b = Box::new(random_pred(rng, depth + 1));
        return match rng.gen_range(0..3) {
            0 => M::And(a, b),
            1 => M::Or(a, b),
            _ => M::Not(a),
        };
    }
    let value = |rng: &mut StdRng| -> Value {
        match field {
            "tag" => json!(["red", "green", "blue", "Red", "g", "zzz"][rng.gen_range(0..6)]),
            "tags[]" => json!(["x", "y", "z", "w"][rng.gen_range(0..4)]),
            _ => random_value(rng),
        }
    };
    match rng.gen_range(0..9) {
        0..=3 => {
            let op = ["=", "!=", "<", "<=", ">", ">="][rng.gen_range(0..6)];
            M::Cmp(field, op, value(rng))
        }
        4 => M::In(
            field,
            (0..rng.gen_range(1..4)).map(|_| value(rng)).collect(),
        ),
        5 => {
            let (a, b) = (value(rng), value(rng));
            if class(&a) != class(&b) {
                M::Exists(field)
            } else if cmp(&a, &b).is_le() {
                M::Between(field, a, b)
            } else {
                M::Between(field, b, a)
            }
        }
        6 => M::StartsWith(field, ["r", "g", "", "R", "x"][rng.gen_range(0..5)].into()),
        _ => M::Exists(field),
    }
}

#[test]
fn random_queries_match_a_brute_force_filter() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("m").unwrap();
    db.define_index(def("by-n", "things", &["n"])).unwrap();
    db.define_index(def("by-tag", "things", &["tag"])).unwrap();
    db.define_index(def("by-tags", "things", &["tags[]"]))
        .unwrap();
    db.define_index(def("by-tag-n", "things", &["tag", "n"]))
        .unwrap();
    let mut rng = StdRng::seed_from_u64(17);
    let mut model: BTreeMap<String, Value> = BTreeMap::new();
    let (mut by_index, mut nonempty, mut asked) = (0, 0, 0);
    for round in 0..6 {
        for _ in 0..60 {
            let id = format!("things/{}", rng.gen_range(0..150));
            if rng.gen_range(0..5) == 0 && model.contains_key(&id) {
                db.delete(&id, Condition::None).unwrap();
                model.remove(&id);
            } else {
                let doc = random_doc(&mut rng);
                db.put(&id, doc.to_string().as_bytes(), Condition::None)
                    .unwrap();
                model.insert(id, doc);
            }
        }
        // A document of another collection never shows.
        db.put(
            &format!("others/{round}"),
            br#"{"n": 1, "tag": "red"}"#,
            Condition::None,
        )
        .unwrap();
        for _ in 0..80 {
            let m = random_pred(&mut rng, 0);
            let order = match rng.gen_range(0..4) {
                0 => "",
                1 => " order by n",
                2 => " order by n desc",
                _ => " order by tag desc, n",
            };
            let (limit, offset) = (rng.gen_range(1..20), rng.gen_range(0..10));
            let text = format!(
                "from things where {}{order} limit {limit} offset {offset}",
                render(&m)
            );
            let got = db
                .query(&text, &Map::new(), wait())
                .unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(!got.stale, "{text}");
            asked += 1;
            by_index += usize::from(got.index.is_some());
            nonempty += usize::from(got.total > 0);
            let mut want: Vec<(&String, &Value)> =
                model.iter().filter(|(_, d)| holds(&m, d)).collect();
            assert_eq!(got.total, want.len() as u64, "total of {text}");
            let got_ids: Vec<String> = got
                .results
                .iter()
                .map(|r| {
                    let v: Value = serde_json::from_slice(r).unwrap();
                    v["@metadata"]["@id"].as_str().unwrap().to_string()
                })
                .collect();
            let first = |d: &Value, f: &str| d.get(f).cloned();
            let key_cmp = |a: &Option<Value>, b: &Option<Value>| match (a, b) {
                (None, None) => Ordering::Equal,
                (None, _) => Ordering::Less,
                (_, None) => Ordering::Greater,
                (Some(x), Some(y)) => cmp(x, y),
            };
            if order.is_empty() {
                // Any order; compare as sets when the page holds everything.
                if offset == 0 && want.len() <= limit {
                    let mut g = got_ids.clone();
                    g.sort();
                    let w: Vec<String> = want.iter().map(|(id, _)| id.to_string()).collect();
                    assert_eq!(g, w, "{text}");
                } else {
                    assert_eq!(
                        got_ids.len(),
                        want.len().saturating_sub(offset).min(limit),
                        "{text}"
                    );
                    for id in &got_ids {
                        assert!(holds(&m, &model[id]), "{text}: {id} does not match");
                    }
                }
                continue;
            }
            let desc = order.contains("n desc");
            want.sort_by(|(ia, a), (ib, b)| {
                let o = if order.contains("tag desc") {
                    key_cmp(&first(b, "tag"), &first(a, "tag"))
                        .then_with(|| key_cmp(&first(a, "n"), &first(b, "n")))
                } else {
                    let o = key_cmp(&first(a, "n"), &first(b, "n"));
                    if desc {
                        o.reverse()
                    } else {
                        o
                    }
                };
                o.then_with(|| ia.cmp(ib))
            });
            let want_page: Vec<String> = want
                .iter()
                .skip(offset)
                .take(limit)
                .map(|(id, _)| id.to_string())
                .collect();
            if order.contains("tag desc") {
                assert_eq!(got_ids, want_page, "{text}");
            } else {
                // Ties on n may come in any order: compare the n's, then the sets.
                let ns = |ids: &[String]| -> Vec<Option<Value>> {
                    ids.iter().map(|id| first(&model[id], "n")).collect()
                };
                let (gn, wn) = (ns(&got_ids), ns(&want_page));
                assert_eq!(gn.len(), wn.len(), "{text}");
                for (g, w) in gn.iter().zip(&wn) {
                    assert!(key_cmp(g, w).is_eq(), "{text}: {gn:?} vs {wn:?}");
                }
            }
        }
    }
    assert!(
        by_index * 2 > asked,
        "{by_index} of {asked} answered from an index"
    );
    assert!(
        nonempty * 3 > asked,
        "{nonempty} of {asked} matched something"
    );
    // Every index agrees with its state: no errors for scalar fields.
    for info in db.indexes().unwrap() {
        assert!(!info.stale, "{}", info.definition.name);
    }
    drop(db);
    store.close().unwrap();
}

#[test]
fn covered_first_page_reads_a_page_of_entries_and_counts_without_loading() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("c").unwrap();
    db.define_index(def("by-n", "items", &["n"])).unwrap();
    let mut ops = Vec::new();
    for i in 0..3000 {
        ops.push(kiln_docs::BatchOp::Put {
            id: kiln_docs::DocId::Given(format!("items/{i}")),
            document: json!({"n": i, "tag": format!("t{}", i % 10)}),
            condition: Condition::None,
        });
        if ops.len() == 1000 {
            db.batch(std::mem::take(&mut ops)).unwrap();
        }
    }
    let r = db
        .query("from items where n > 0 limit 20", &Map::new(), wait())
        .unwrap();
    assert_eq!(r.total, 2999);
    assert_eq!(r.results.len(), 20);
    assert_eq!(r.documents_loaded, 20);
    assert!(r.entries_read < 50, "{}", r.entries_read);
    assert_eq!(r.index.as_deref(), Some("by-n"));
    // Half the index: counted by walking the smaller side, still no document loaded.
    let r = db
        .query("from items where n < 1000 limit 0", &Map::new(), wait())
        .unwrap();
    assert_eq!((r.total, r.documents_loaded), (1000, 0));
    let r = db
        .query("from items where n >= 1000 limit 3", &Map::new(), wait())
        .unwrap();
    assert_eq!((r.total, r.documents_loaded), (2000, 3));
    let r = db
        .query("from items order by n desc limit 5", &Map::new(), wait())
        .unwrap();
    assert!(r.entries_read <= 8, "{}", r.entries_read);
    let v: Value = serde_json::from_slice(&r.results[0]).unwrap();
    assert_eq!(v["n"], json!(2999));
    assert_eq!(r.total, 3000);
    // Paging by continuation: the same documents as one big page, in order, and the
    // same total on every page.
    for text in [
        "from items where n >= 100 order by n desc limit 250",
        "from items where n >= 100 limit 333",
        "from items where n < 2500 and tag = 't3' order by n limit 17",
        "from items where tag in ('t1', 't2') order by n desc limit 100",
    ] {
        let all = db
            .query(
                &text.replace(" limit", " limit 5000 offset 0 select n, tag limit"),
                &Map::new(),
                wait(),
            )
            .err();
        assert!(all.is_some(), "two limits are refused");
        let whole_text = format!("{} limit 5000", text.rsplit_once(" limit").unwrap().0);
        let whole = db.query(&whole_text, &Map::new(), wait()).unwrap();
        let mut paged = Vec::new();
        let mut token: Option<String> = None;
        let mut pages = 0;
        loop {
            let r = db
                .query_page(text, &Map::new(), wait(), token.as_deref())
                .unwrap();
            assert_eq!(r.total, whole.total, "{text} page {pages}");
            paged.extend(r.results);
            pages += 1;
            match r.continuation {
                Some(t) => token = Some(t),
                None => break,
            }
            assert!(pages < 100);
        }
        assert_eq!(paged, whole.results, "{text}");
    }
    assert!(db
        .query_page(
            "from items where n > 0",
            &Map::new(),
            wait(),
            Some("k999.0.0.00")
        )
        .is_err());
    assert!(db
        .query_page(
            "from items where n > 0",
            &Map::new(),
            wait(),
            Some("garbage")
        )
        .is_err());
    // A token is for its query: another query (here an offset plan's token given to
    // a query over the same collection) or other parameters start over, refused.
    let page = |text: &str, params: &Map<String, Value>, token: Option<&str>| {
        let mut text = text.to_string();
        text.push_str(" limit 2");
        db.query_page(&text, params, wait(), token)
    };
    let first = page("from items where n != 3", &Map::new(), None).unwrap();
    let token = first.continuation.expect("a full page has a token");
    assert!(page("from items where n != 3", &Map::new(), Some(&token)).is_ok());
    let refused = page("from items where n != 4", &Map::new(), Some(&token)).unwrap_err();
    assert!(
        refused.to_string().contains("belongs to another query"),
        "{refused}"
    );
    let mut p = Map::new();
    p.insert("x".into(), json!(3));
    let with_params = page("from items where n != $x", &p, None).unwrap();
    let token = with_params.continuation.expect("a full page has a token");
    p.insert("x".into(), json!(4));
    assert!(page("from items where n != $x", &p, Some(&token)).is_err());
    // The token inside, without its query's tag, is refused too.
    let inner = token.split_once(':').unwrap().1;
    assert!(page("from items where n != $x", &p, Some(inner)).is_err());
    // An auto index: created by the query, said so, used after.
    let r = db
        .query(
            "from items where tag = 't3' limit 1000",
            &Map::new(),
            QueryOptions::default(),
        )
        .unwrap();
    assert_eq!(r.auto_index_created.as_deref(), Some("auto/items/tag"));
    assert_eq!(r.total, 300);
    let r = db
        .query("from items where tag = 't3'", &Map::new(), wait())
        .unwrap();
    assert_eq!(r.index.as_deref(), Some("auto/items/tag"));
    assert_eq!((r.total, r.stale), (300, false));
    drop(db);
    store.close().unwrap();
}

#[test]
fn stale_answers_say_so_and_waiting_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options();
    o.indexing.min_batch = 1;
    o.indexing.max_batch = 1;
    let store = DocStore::open(dir.path(), o).unwrap();
    let db = store.create_database("s").unwrap();
    for i in 0..300 {
        db.put(
            &format!("u/{i}"),
            json!({"age": i}).to_string().as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    db.define_index(def("by-age", "u", &["age"])).unwrap();
    let r = db
        .query(
            "from u where age >= 0",
            &Map::new(),
            QueryOptions::default(),
        )
        .unwrap();
    assert!(r.stale, "a new index over 300 documents, one per batch");
    assert!(r.total < 300);
    let started = Instant::now();
    let r = db
        .query("from u where age >= 0", &Map::new(), wait())
        .unwrap();
    assert!(!r.stale);
    assert_eq!(r.total, 300);
    assert!(started.elapsed() < Duration::from_secs(10));
    let info = db.index_info("by-age").unwrap();
    assert_eq!(
        (info.entries, info.docs_behind, info.stale),
        (300, 0, false)
    );
    // Reset: empty again, then rebuilt.
    db.reset_index("by-age").unwrap();
    let r = db
        .query("from u where age >= 0", &Map::new(), wait())
        .unwrap();
    assert_eq!((r.total, r.stale), (300, false));
    drop(db);
    store.close().unwrap();
}

#[test]
fn indexes_survive_a_restart_and_errors_are_per_document() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.create_database("r").unwrap();
        db.define_index(def("by-a", "t", &["a"])).unwrap();
        db.put("t/1", br#"{"a": 1}"#, Condition::None).unwrap();
        db.put("t/2", br#"{"a": {"nested": true}}"#, Condition::None)
            .unwrap();
        db.put("t/3", br#"{"a": 3}"#, Condition::None).unwrap();
        let r = db.query("from t where a > 0", &Map::new(), wait()).unwrap();
        assert_eq!(r.total, 2);
        let info = db.index_info("by-a").unwrap();
        assert_eq!(info.errors, 1);
        assert_eq!(info.error_samples[0].id, "t/2");
        drop(db);
        store.close().unwrap();
    }
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("r").unwrap();
    db.put("t/4", br#"{"a": 4}"#, Condition::None).unwrap();
    db.delete("t/1", Condition::None).unwrap();
    let r = db.query("from t where a > 0", &Map::new(), wait()).unwrap();
    assert_eq!(r.total, 2);
    assert_eq!(db.index_names().unwrap(), vec!["by-a".to_string()]);
    drop(db);
    store.close().unwrap();
}

#[test]
fn hostile_queries_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("h").unwrap();
    let bad = |q: &str, params: Value| {
        let params = params.as_object().cloned().unwrap_or_default();
        match db.query(q, &params, QueryOptions::default()) {
            Err(DocError::Query(QueryError::Invalid { .. }))
            | Err(DocError::Query(QueryError::TooExpensive(_))) => {}
            other => panic!("{q}: {other:?}"),
        }
    };
    bad(
        &format!("from u where {}a = 1{}", "(".repeat(5000), ")".repeat(5000)),
        json!({}),
    );
    bad(
        &format!("from u where {}a = 1", "not ".repeat(100)),
        json!({}),
    );
    let long_in = (0..5000)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    bad(&format!("from u where a in ({long_in})"), json!({}));
    bad(
        "from u where a in $xs",
        json!({"xs": (0..5000).collect::<Vec<_>>()}),
    );
    bad("from u where a = $x", json!({"x": [1, 2]}));
    bad("from u where a = $missing", json!({}));
    bad("from u where a = 1 limit 100000000", json!({}));
    bad("from u where a = 1 offset -1", json!({}));
    bad("from u where a startsWith 3", json!({}));
    bad("from u where a between 1 and 'z'", json!({}));
    bad("from u where", json!({}));
    bad("select * from u", json!({}));
    bad("from index 'nope' where a = 1", json!({}));
    bad(&"x".repeat(100_000), json!({}));
    drop(db);
    store.close().unwrap();
}

#[test]
fn unused_auto_indexes_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options();
    o.indexing.auto_index_idle_ms = 300;
    let store = DocStore::open(dir.path(), o).unwrap();
    let db = store.create_database("a").unwrap();
    db.define_index(def("kept", "u", &["b"])).unwrap();
    db.put("u/1", br#"{"a": 1, "b": 2}"#, Condition::None)
        .unwrap();
    let r = db
        .query("from u where a = 1", &Map::new(), QueryOptions::default())
        .unwrap();
    assert_eq!(r.auto_index_created.as_deref(), Some("auto/u/a"));
    assert!(db.index_names().unwrap().contains(&"auto/u/a".to_string()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.index_names().unwrap().contains(&"auto/u/a".to_string()) {
        assert!(
            Instant::now() < deadline,
            "the unused auto index is still there"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A client's own index stays, however long unused.
    assert_eq!(db.index_names().unwrap(), vec!["kept".to_string()]);
    drop(db);
    store.close().unwrap();
}

/// Issue 55: `documents_loaded` counted 4 for a 3-document collection: a plan that
/// sorts its matches read the page's documents a second time and counted them
/// again. Each document a query reads counts once.
#[test]
fn documents_loaded_counts_each_document_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("a").unwrap();
    for (i, n) in [(1, 3), (2, 1), (3, 2)] {
        db.put(
            &format!("c/{i}"),
            json!({"n": n, "m": 10 - n}).to_string().as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    let loaded = |text: &str| {
        let r = db.query(text, &Map::new(), wait()).unwrap();
        (r.total, r.results.len(), r.documents_loaded)
    };
    // A plain collection scan, in etag order.
    assert_eq!(loaded("from c"), (3, 3, 3));
    assert_eq!(loaded("from c limit 2"), (3, 2, 2));
    // Filtered scans: every document read once to check it, the page read again
    // after the sort (not counted again).
    assert_eq!(loaded("from c where n != 2"), (2, 2, 3));
    assert_eq!(loaded("from c where n != 5 order by m"), (3, 3, 3));
    // The first query on `n` makes an auto index and answers by a scan.
    let r = db
        .query("from c where n >= 1", &Map::new(), wait())
        .unwrap();
    assert_eq!(r.auto_index_created.as_deref(), Some("auto/c/n"));
    assert_eq!((r.total, r.results.len(), r.documents_loaded), (3, 3, 3));
    // The auto index now: covered (only the page is loaded), or each candidate
    // loaded to check the rest of the where, then sorted.
    assert_eq!(loaded("from c where n >= 2"), (2, 2, 2));
    assert_eq!(loaded("from c where n >= 1 and m != 9"), (2, 2, 3));
    assert_eq!(loaded("from c where n >= 1 order by m desc"), (3, 3, 3));
    drop(db);
    store.close().unwrap();
}
