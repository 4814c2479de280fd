//! Offset paging is consistent whichever plan answers each page: a query without
//! `order by` paged by offset while the data does not change returns every match
//! exactly once, across a collection scan, the auto index it creates, a user's
//! index on another field and a compound index (the issue: the first page came from
//! a scan in etag order, the next ones from the new index in value order).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    BatchOp, Condition, Database, DocId, DocStore, DocsOptions, IndexDefinition, IndexField,
    QueryOptions,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o
}

fn wait() -> QueryOptions {
    QueryOptions {
        wait_for_non_stale_ms: 10_000,
    }
}

fn ids(results: &[Vec<u8>]) -> Vec<String> {
    results
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(r).unwrap();
            v["@metadata"]["@id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// The issue's case: `where age > 30 limit 100 offset k`, the first page answered by
/// a scan (which creates `auto/users/age`), the next ones by that index.
#[test]
fn offset_pages_across_an_auto_index_creation_return_each_match_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("p").unwrap();
    // Written in an order unrelated to the ids and the ages (many ties on age).
    let mut ops = Vec::new();
    let mut want = BTreeSet::new();
    // The defined order: by age, then id.
    let mut in_order = Vec::new();
    for i in 0..1000u64 {
        let n = (i * 7919) % 1000;
        let age = (n * 31) % 61;
        if age > 30 {
            want.insert(format!("users/{n}"));
            in_order.push((age, format!("users/{n}")));
        }
        ops.push(BatchOp::Put {
            id: DocId::Given(format!("users/{n}")),
            document: json!({ "age": age }),
            condition: Condition::None,
        });
    }
    db.batch(ops).unwrap();
    assert!(want.len() > 400, "{}", want.len());
    let mut seen: Vec<String> = Vec::new();
    let mut plans = Vec::new();
    let mut offset = 0;
    loop {
        let text = format!("from users where age > 30 limit 100 offset {offset}");
        // The first page creates the auto index and scans; the others wait for the
        // index and are answered by it.
        let opts = if offset == 0 {
            QueryOptions::default()
        } else {
            wait()
        };
        let r = db.query(&text, &Map::new(), opts).unwrap();
        assert!(!r.stale, "{text}");
        assert_eq!(r.total, want.len() as u64, "{text}");
        if offset == 0 {
            assert_eq!(r.auto_index_created.as_deref(), Some("auto/users/age"));
            assert_eq!(r.index, None, "the first page is a scan");
        } else {
            assert_eq!(r.index.as_deref(), Some("auto/users/age"), "{text}");
        }
        plans.push(r.index.clone());
        let page = ids(&r.results);
        let n = page.len();
        seen.extend(page);
        if n < 100 {
            break;
        }
        offset += 100;
    }
    assert!(plans.len() >= 5, "{plans:?}");
    let distinct: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(distinct.len(), seen.len(), "a document came twice");
    assert_eq!(distinct, want, "the pages together are the matches");
    in_order.sort();
    let in_order: Vec<String> = in_order.into_iter().map(|(_, id)| id).collect();
    assert_eq!(seen, in_order, "by age, then id");
    drop(db);
    store.close().unwrap();
}

// ---- the model test ----

/// A value in the model: only what the documents below hold.
fn class(v: &Value) -> u8 {
    match v {
        Value::Null => 1,
        Value::Bool(_) => 2,
        Value::Number(_) => 3,
        Value::String(_) => 4,
        _ => 5,
    }
}

/// The total order of the query language for these values (missing first).
fn cmp(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, _) => Ordering::Less,
        (_, None) => Ordering::Greater,
        (Some(Value::Number(x)), Some(Value::Number(y))) => {
            x.as_f64().unwrap().total_cmp(&y.as_f64().unwrap())
        }
        (Some(Value::String(x)), Some(Value::String(y))) => x.as_bytes().cmp(y.as_bytes()),
        (Some(x), Some(y)) => class(x).cmp(&class(y)),
    }
}

/// The values of a field (`tags[]`: each element).
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

/// A condition: its text and its meaning on one document.
struct Cond {
    text: String,
    holds: Box<dyn Fn(&Value) -> bool>,
}

fn lit(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{s}'"),
        other => other.to_string(),
    }
}

fn random_cond(rng: &mut StdRng) -> Cond {
    let field = ["n", "n", "tag", "tags[]", "s"][rng.gen_range(0..5)];
    let value = |rng: &mut StdRng| -> Value {
        match field {
            "tag" => json!(["red", "green", "blue", "Red", "gr"][rng.gen_range(0..5)]),
            "tags[]" => json!(["x", "y", "z"][rng.gen_range(0..3)]),
            _ => json!(rng.gen_range(-1..12)),
        }
    };
    let any = move |doc: &Value, p: &dyn Fn(&Value) -> bool| values(doc, field).into_iter().any(p);
    let same = |x: &Value, v: &Value| class(x) == class(v);
    match rng.gen_range(0..10) {
        0..=3 => {
            let op = ["=", "<", "<=", ">", ">="][rng.gen_range(0..5)];
            let v = value(rng);
            let text = format!("{field} {op} {}", lit(&v));
            Cond {
                text,
                holds: Box::new(move |d| {
                    any(d, &|x| {
                        let o = cmp(Some(x), Some(&v));
                        same(x, &v)
                            && match op {
                                "=" => o.is_eq(),
                                "<" => o.is_lt(),
                                "<=" => o.is_le(),
                                ">" => o.is_gt(),
                                _ => o.is_ge(),
                            }
                    })
                }),
            }
        }
        4 => {
            let vs: Vec<Value> = (0..rng.gen_range(1..4)).map(|_| value(rng)).collect();
            let text = format!(
                "{field} in ({})",
                vs.iter().map(lit).collect::<Vec<_>>().join(", ")
            );
            Cond {
                text,
                holds: Box::new(move |d| {
                    any(d, &|x| {
                        vs.iter()
                            .any(|v| same(x, v) && cmp(Some(x), Some(v)).is_eq())
                    })
                }),
            }
        }
        5 => {
            let (a, b) = (value(rng), value(rng));
            let (lo, hi) = if cmp(Some(&a), Some(&b)).is_le() {
                (a, b)
            } else {
                (b, a)
            };
            let text = format!("{field} between {} and {}", lit(&lo), lit(&hi));
            Cond {
                text,
                holds: Box::new(move |d| {
                    any(d, &|x| {
                        same(x, &lo)
                            && cmp(Some(x), Some(&lo)).is_ge()
                            && cmp(Some(x), Some(&hi)).is_le()
                    })
                }),
            }
        }
        6 => {
            let p = ["r", "g", "x", "R"][rng.gen_range(0..4)];
            Cond {
                text: format!("startsWith({field}, '{p}')"),
                holds: Box::new(move |d| any(d, &|x| x.as_str().is_some_and(|s| s.starts_with(p)))),
            }
        }
        7 => Cond {
            text: format!("exists({field})"),
            holds: Box::new(move |d| !values(d, field).is_empty()),
        },
        8 => {
            // No index answers these: the query keeps another leading conjunct.
            let v = value(rng);
            Cond {
                text: format!("{field} != {}", lit(&v)),
                holds: Box::new(move |d| {
                    !any(d, &|x| same(x, &v) && cmp(Some(x), Some(&v)).is_eq())
                }),
            }
        }
        _ => Cond {
            text: "lower(tag) = 'red'".into(),
            holds: Box::new(|d| {
                d.get("tag")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.to_lowercase() == "red")
            }),
        },
    }
}

fn random_doc(rng: &mut StdRng) -> Value {
    let mut o = Map::new();
    match rng.gen_range(0..10) {
        0 => {}
        1 => {
            o.insert("n".into(), Value::Null);
        }
        2 => {
            o.insert("n".into(), json!(["a", "b"][rng.gen_range(0..2)]));
        }
        _ => {
            o.insert("n".into(), json!(rng.gen_range(0..10)));
        }
    }
    o.insert(
        "tag".into(),
        json!(["red", "green", "blue", "Red", "gr"][rng.gen_range(0..5)]),
    );
    if rng.gen_bool(0.8) {
        let tags: Vec<Value> = (0..rng.gen_range(0..3))
            .map(|_| json!(["x", "y", "z"][rng.gen_range(0..3)]))
            .collect();
        o.insert("tags".into(), Value::Array(tags));
    }
    if rng.gen_bool(0.7) {
        o.insert("s".into(), json!(rng.gen_range(0..4)));
    }
    Value::Object(o)
}

/// Random documents; random queries (one to three conditions, no `order by`, and
/// some `order by n [desc]`) paged by offset with random page sizes. The first page
/// scans and creates an auto index; between pages the plan is changed at random:
/// the auto index deleted (the next page scans and creates it again), a user's
/// index on some field or a compound index defined or deleted. Every page is exact
/// (not stale) and the pages together are the brute-force matches, each once (in
/// the defined order when there is an `order by`).
#[test]
fn offset_pages_are_consistent_whichever_plan_answers_each_page() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("m").unwrap();
    let mut rng = StdRng::seed_from_u64(29);
    let mut plans: BTreeMap<String, usize> = BTreeMap::new();
    let mut matched_pages = 0;
    let mut failures: Vec<String> = Vec::new();
    for round in 0..24 {
        let c = format!("c{round}");
        let mut model: BTreeMap<String, Value> = BTreeMap::new();
        let mut ops = Vec::new();
        for i in 0..rng.gen_range(250..450) {
            // Ids out of etag order, and not all of one length.
            let id = format!("{c}/{}", i * 7919 % 1000);
            let doc = random_doc(&mut rng);
            model.insert(id.clone(), doc.clone());
            ops.push(BatchOp::Put {
                id: DocId::Given(id),
                document: doc,
                condition: Condition::None,
            });
        }
        db.batch(ops).unwrap();
        let conds: Vec<Cond> = (0..rng.gen_range(1..4))
            .map(|_| random_cond(&mut rng))
            .collect();
        let order = match rng.gen_range(0..6) {
            0 => " order by n",
            1 => " order by n desc",
            _ => "",
        };
        let where_ = if !order.is_empty() && rng.gen_bool(0.3) {
            String::new()
        } else {
            let texts: Vec<&str> = conds.iter().map(|c| c.text.as_str()).collect();
            format!(" where {}", texts.join(" and "))
        };
        let matches = |d: &Value| where_.is_empty() || conds.iter().all(|c| (c.holds)(d));
        let mut want: Vec<(&String, &Value)> = model.iter().filter(|(_, d)| matches(d)).collect();
        if !order.is_empty() {
            want.sort_by(|(ia, a), (ib, b)| cmp(a.get("n"), b.get("n")).then_with(|| ia.cmp(ib)));
            if order.ends_with("desc") {
                want.reverse();
            }
        }
        let want: Vec<String> = want.into_iter().map(|(id, _)| id.clone()).collect();
        let mut user_indexes: Vec<String> = Vec::new();
        let mut got: Vec<String> = Vec::new();
        let mut offset = 0;
        for page in 0.. {
            if page > 0 {
                change_plan(&db, &c, &mut rng, &mut user_indexes);
            }
            let limit = if rng.gen_bool(0.3) {
                rng.gen_range(1..8)
            } else {
                rng.gen_range(8..80)
            };
            let text = format!("from {c}{where_}{order} limit {limit} offset {offset}");
            // The first page does not wait: a scan answers it, creating the index.
            let opts = if page == 0 {
                QueryOptions::default()
            } else {
                wait()
            };
            let r = db
                .query(&text, &Map::new(), opts)
                .unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(!r.stale, "{text}");
            assert_eq!(r.total, want.len() as u64, "total of {text}");
            let kind = match r.index.as_deref() {
                None => "scan".to_string(),
                Some(n) if n.starts_with("auto/") => "auto index".into(),
                Some(n) => n.split('.').next().unwrap().to_string(),
            };
            *plans.entry(kind).or_default() += 1;
            let ids = ids(&r.results);
            let n = ids.len();
            got.extend(ids);
            matched_pages += usize::from(n > 0);
            if n < limit {
                break;
            }
            offset += limit;
        }
        // Every query is checked; the failures are listed together at the end.
        let distinct: BTreeSet<&String> = got.iter().collect();
        let want_set: BTreeSet<&String> = want.iter().collect();
        let twice = got.len() - distinct.len();
        let missing = want_set.difference(&distinct).count();
        if twice > 0 || missing > 0 || (!order.is_empty() && got != want) {
            failures.push(format!(
                "from {c}{where_}{order}: {} matches, {twice} returned twice, {missing} never \
                 returned{}",
                want.len(),
                if order.is_empty() {
                    ""
                } else {
                    ", or out of order"
                }
            ));
        }
        assert!(distinct.is_subset(&want_set), "{c}{where_}: not a match");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The pages really crossed plans.
    for kind in ["scan", "auto index", "compound", "single"] {
        assert!(
            plans.get(kind).is_some_and(|n| *n >= 3),
            "{kind}: {plans:?}"
        );
    }
    assert!(matched_pages > 100, "{matched_pages}");
    drop(db);
    store.close().unwrap();
}

/// Changes what the next page's plan can be: the auto index deleted, or a user's
/// index (one field, or compound: its name says which) defined or deleted.
fn change_plan(db: &Database, c: &str, rng: &mut StdRng, user: &mut Vec<String>) {
    match rng.gen_range(0..6) {
        0 | 1 => {
            for name in db.index_names().unwrap() {
                if name.starts_with(&format!("auto/{c}/")) {
                    db.delete_index(&name).unwrap();
                }
            }
        }
        2 | 3 => {
            let fields: &[&str] = [
                &["n"][..],
                &["tag"],
                &["tags[]"],
                &["s"],
                &["n", "s"],
                &["tag", "n"],
                &["tags[]", "s"],
                &["s", "n"],
            ][rng.gen_range(0..8)];
            let kind = if fields.len() > 1 {
                "compound"
            } else {
                "single"
            };
            let name = format!("{kind}.{c}.{}", fields.join("-").replace("[]", "@each"));
            let def = IndexDefinition {
                name: name.clone(),
                collection: Some(c.to_string()),
                fields: fields
                    .iter()
                    .map(|p| IndexField {
                        path: p.to_string(),
                        case_insensitive: false,
                        ..Default::default()
                    })
                    .collect(),
                auto: false,
                reduce: None,
            };
            if db.define_index(def).unwrap() {
                user.push(name);
            }
        }
        4 if !user.is_empty() => {
            let name = user.remove(rng.gen_range(0..user.len()));
            db.delete_index(&name).unwrap();
        }
        _ => {}
    }
}
