//! kill -9 of `kiln serve` while it builds an index (and while documents change,
//! and after a reset): after the restarts the index completes and holds exactly
//! what a full rebuild holds. An index commits its entries and its etag together,
//! so a crash can only lose a whole batch, which is read again.
//!
//! Slow (~20 s): `cargo test -p kiln-cli --test index_survives_kill9 -- --ignored`
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use kiln_docs::{Condition, DocStore, DocsOptions, IndexDefinition, IndexField, QueryOptions};
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::time::Duration;

const DOCS: u64 = 300_000;

use common::{free_port, request, spawn_serve as start_server};

fn def(name: &str) -> IndexDefinition {
    IndexDefinition {
        name: name.into(),
        collection: Some("items".into()),
        fields: vec![IndexField {
            path: "n".into(),
            case_insensitive: false,
            ..Default::default()
        }],
        auto: false,
        reduce: None,
    }
}

/// Every (id, n) of an index, in index order.
fn listing(db: &kiln_docs::Database, index: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let r = db
            .query(
                &format!("from index '{index}' order by n limit 10000 offset {offset}"),
                &Map::new(),
                QueryOptions::default(),
            )
            .unwrap();
        assert!(!r.stale);
        if r.results.is_empty() {
            return out;
        }
        offset += r.results.len();
        for d in r.results {
            let v: Value = serde_json::from_slice(&d).unwrap();
            out.push((
                v["@metadata"]["@id"].as_str().unwrap().to_string(),
                v["n"].clone(),
            ));
        }
    }
}

#[test]
#[ignore = "slow (~20 s): cargo test -p kiln-cli --test index_survives_kill9 -- --ignored"]
fn index_completes_after_kill9_and_matches_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DocStore::open(dir.path(), DocsOptions::default()).unwrap();
        let db = store.create_database("db").unwrap();
        let mut ops = Vec::new();
        for i in 0..DOCS {
            ops.push(kiln_docs::BatchOp::Put {
                id: kiln_docs::DocId::Given(format!("items/{i}")),
                document: json!({"n": i % 50_000, "pad": "x".repeat(100)}),
                condition: Condition::None,
            });
            if ops.len() == 10_000 {
                db.batch(std::mem::take(&mut ops)).unwrap();
            }
        }
        db.define_index(def("by-n")).unwrap();
        drop(db);
        store.close().unwrap();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut saw_stale = 0;
    for cycle in 0..6 {
        let port = free_port();
        let mut child = start_server(dir.path(), port);
        // Changes while the index builds: updates (new values) and deletes.
        for _ in 0..50 {
            let id = rng.gen_range(0..DOCS);
            if rng.gen_bool(0.3) {
                request(port, "DELETE", &format!("/dbs/db/docs/items/{id}"), "");
            } else {
                let body = json!({"n": rng.gen_range(0..100_000), "pad": "y"}).to_string();
                let (status, text) =
                    request(port, "PUT", &format!("/dbs/db/docs/items/{id}"), &body);
                assert!(status == 200 || status == 201, "{status} {text}");
            }
        }
        if cycle == 3 {
            let (status, text) = request(port, "POST", "/dbs/db/indexes/by-n/reset", "");
            assert_eq!(status, 200, "{text}");
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..400)));
        let (_, info) = request(port, "GET", "/dbs/db/indexes/by-n", "");
        let info: Value = serde_json::from_str(&info).unwrap();
        if info["stale"] == true {
            saw_stale += 1;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    assert!(saw_stale >= 2, "only {saw_stale} kills landed mid-build");

    let store = DocStore::open(dir.path(), DocsOptions::default()).unwrap();
    let db = store.database("db").unwrap();
    let last = db.last_sequence();
    assert!(db
        .wait_for_index("by-n", last, Duration::from_secs(120))
        .unwrap());
    db.define_index(def("rebuilt")).unwrap();
    assert!(db
        .wait_for_index("rebuilt", last, Duration::from_secs(120))
        .unwrap());
    let (a, b) = (
        db.index_info("by-n").unwrap(),
        db.index_info("rebuilt").unwrap(),
    );
    assert_eq!(a.entries, b.entries);
    assert_eq!(a.entries, db.document_count().unwrap());
    assert_eq!(listing(&db, "by-n"), listing(&db, "rebuilt"));
    drop(db);
    store.close().unwrap();
}
