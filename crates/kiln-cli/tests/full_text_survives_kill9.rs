//! kill -9 of `kiln serve` while it builds a full-text index (tantivy), while
//! documents change, and after a reset: after the restarts the index completes
//! and answers exactly what a full-text index built afresh answers (the same
//! matches and totals for every query). Each tantivy commit carries the sequence it
//! covers as its payload, so a crash loses at most the batch in flight, which is
//! read again; a commit that claimed more than it holds would show here as matches
//! missing from the killed index.
//!
//! Slow (~30 s): `cargo test --release -p kiln-cli --test full_text_survives_kill9 -- --ignored`
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::{free_port, request, spawn_serve as start_server};
use kiln_docs::{Condition, DocStore, DocsOptions, IndexDefinition, IndexField, QueryOptions};
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const DOCS: u64 = 200_000;
const WORDS: &[&str] = &[
    "river", "stone", "bridge", "garden", "light", "house", "winter", "summer", "paper", "engine",
    "journal", "commit", "durable", "crash", "power", "disk", "page", "tree", "index", "search",
    "query", "text", "running", "runs", "quick", "brown", "fox", "lazy",
];

fn def(name: &str) -> IndexDefinition {
    IndexDefinition {
        name: name.into(),
        collection: Some("items".into()),
        fields: vec![IndexField {
            path: "body".into(),
            search: true,
            analyzer: Some("english".into()),
            ..Default::default()
        }],
        auto: false,
        reduce: None,
    }
}

fn body(rng: &mut impl Rng) -> String {
    (0..rng.gen_range(5..25))
        .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every id a search finds through index `index`, and the total it reports.
fn matches(db: &kiln_docs::Database, index: &str, text: &str) -> (BTreeSet<String>, u64) {
    let mut ids = BTreeSet::new();
    let mut offset = 0;
    let mut total: u64;
    loop {
        let mut params = Map::new();
        params.insert("q".into(), json!(text));
        let r = db
            .query(
                &format!(
                    "from index '{index}' where search(body, $q) order by score() limit 10000 offset {offset}"
                ),
                &params,
                QueryOptions::default(),
            )
            .unwrap();
        assert!(!r.stale);
        total = r.total;
        if r.results.is_empty() {
            return (ids, total);
        }
        offset += r.results.len();
        for d in r.results {
            let v: Value = serde_json::from_slice(&d).unwrap();
            assert!(ids.insert(v["@metadata"]["@id"].as_str().unwrap().to_string()));
        }
    }
}

#[test]
#[ignore = "slow (~30 s): cargo test --release -p kiln-cli --test full_text_survives_kill9 -- --ignored"]
fn full_text_index_completes_after_kill9_and_matches_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    {
        let store = DocStore::open(dir.path(), DocsOptions::default()).unwrap();
        let db = store.create_database("db").unwrap();
        let mut ops = Vec::new();
        for i in 0..DOCS {
            ops.push(kiln_docs::BatchOp::Put {
                id: kiln_docs::DocId::Given(format!("items/{i}")),
                document: json!({"body": body(&mut rng), "@metadata": {"@collection": "items"}}),
                condition: Condition::None,
            });
            if ops.len() == 10_000 {
                db.batch(std::mem::take(&mut ops)).unwrap();
            }
        }
        db.define_index(def("by-text")).unwrap();
        drop(db);
        store.close().unwrap();
    }
    let mut saw_stale = 0;
    for cycle in 0..6 {
        let port = free_port();
        let mut child = start_server(dir.path(), port);
        for _ in 0..50 {
            let id = rng.gen_range(0..DOCS);
            if rng.gen_bool(0.3) {
                request(port, "DELETE", &format!("/dbs/db/docs/items/{id}"), "");
            } else {
                let doc = json!({"body": format!("{} zebra", body(&mut rng)), "@metadata": {"@collection": "items"}});
                let (status, text) = request(
                    port,
                    "PUT",
                    &format!("/dbs/db/docs/items/{id}"),
                    &doc.to_string(),
                );
                assert!(status == 200 || status == 201, "{status} {text}");
            }
        }
        if cycle == 3 {
            let (status, text) = request(port, "POST", "/dbs/db/indexes/by-text/reset", "");
            assert_eq!(status, 200, "{text}");
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..600)));
        let (_, info) = request(port, "GET", "/dbs/db/indexes/by-text", "");
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
        .wait_for_index("by-text", last, Duration::from_secs(300))
        .unwrap());
    db.define_index(def("rebuilt")).unwrap();
    assert!(db
        .wait_for_index("rebuilt", last, Duration::from_secs(300))
        .unwrap());
    let (a, b) = (
        db.index_info("by-text").unwrap(),
        db.index_info("rebuilt").unwrap(),
    );
    assert_eq!(a.entries, db.document_count().unwrap());
    assert_eq!(a.entries, b.entries);
    for text in [
        "zebra",
        "river stone",
        "\"quick brown\"",
        "run*",
        "+durable -crash",
        "lazy",
    ] {
        let (killed, killed_total) = matches(&db, "by-text", text);
        let (fresh, fresh_total) = matches(&db, "rebuilt", text);
        assert!(!fresh.is_empty(), "{text}: the corpus has matches");
        assert_eq!(killed_total, fresh_total, "{text}");
        assert_eq!(killed, fresh, "{text}");
    }
    drop(db);
    store.close().unwrap();
}
