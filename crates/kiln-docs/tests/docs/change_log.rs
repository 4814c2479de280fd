//! The change log: every write has a place in etag order, deletes included, each
//! document at most once (its latest write); tombstones are purged only as the rule
//! and the registered consumers allow; a database made before the log gets one.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::DatabaseError;
use kiln_docs::{
    BatchOutcome, ChangeFilter, ChangeKind, Condition, Database, DocStore, DocsOptions, PurgeRule,
    WriteOp,
};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::Duration;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o
}

/// The latest acknowledged write per id: Some(sequence of a put) or a delete's
/// tombstone sequence with `deleted` true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Latest {
    sequence: u64,
    deleted: bool,
}

fn all_changes(db: &Database, page: usize) -> Vec<kiln_docs::Change> {
    let mut out = Vec::new();
    let mut since = 0;
    loop {
        let p = db
            .changes_since(since, page, &ChangeFilter::default(), false)
            .unwrap();
        if p.changes.is_empty() {
            assert_eq!(p.last_sequence, p.database_sequence);
            return out;
        }
        since = p.last_sequence;
        out.extend(p.changes.into_iter().map(|e| e.change));
    }
}

#[test]
fn concurrent_writers_every_acked_write_appears_once_in_etag_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("feed").unwrap();
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut acked: Vec<(String, Latest)> = Vec::new();
                for i in 0..300 {
                    // Ids overlap between threads, so updates and deletes race.
                    let id = format!("c{}/{}", rng.gen_range(0..3), rng.gen_range(0..60));
                    if rng.gen_bool(0.25) {
                        if let Ok(d) = db.delete(&id, Condition::None) {
                            let seq = d.tombstone_etag.sequence;
                            acked.push((
                                id,
                                Latest {
                                    sequence: seq,
                                    deleted: true,
                                },
                            ));
                        }
                    } else {
                        let body = format!(r#"{{"t":{t},"i":{i}}}"#);
                        let p = db.put(&id, body.as_bytes(), Condition::None).unwrap();
                        let seq = p.etag.sequence;
                        acked.push((
                            id,
                            Latest {
                                sequence: seq,
                                deleted: false,
                            },
                        ));
                    }
                }
                acked
            })
        })
        .collect();
    let mut latest: BTreeMap<String, Latest> = BTreeMap::new();
    let mut acked_writes = 0;
    for t in threads {
        for (id, l) in t.join().unwrap() {
            acked_writes += 1;
            let e = latest.entry(id).or_insert(l);
            if l.sequence > e.sequence {
                *e = l;
            }
        }
    }
    assert!(
        acked_writes >= 1_000,
        "only {acked_writes} writes were acknowledged"
    );

    for page in [7, 1000] {
        let changes = all_changes(&db, page);
        let mut seen = BTreeMap::new();
        let mut last = 0;
        for c in &changes {
            assert!(
                c.etag.sequence > last,
                "out of etag order: {c:?} after {last}"
            );
            last = c.etag.sequence;
            assert!(
                seen.insert(c.id.clone(), c.clone()).is_none(),
                "{} twice",
                c.id
            );
        }
        assert_eq!(seen.len(), latest.len(), "every written id, no other");
        for (id, want) in &latest {
            let got = &seen[id];
            assert_eq!(got.etag.sequence, want.sequence, "{id}");
            assert_eq!(got.kind == ChangeKind::Delete, want.deleted, "{id}");
            assert_eq!(got.collection.as_deref(), id.split('/').next());
        }
    }
    let live = latest.values().filter(|l| !l.deleted).count() as u64;
    assert_eq!(db.document_count().unwrap(), live);
    assert_eq!(
        db.tombstone_stats().unwrap().count,
        latest.len() as u64 - live
    );
}

#[test]
fn filters_include_docs_and_the_write_queue_feed_the_same_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("f").unwrap();
    let parse = |s: &str| db.parse_document(s.as_bytes()).unwrap();
    let put = |id: &str, body: &str| WriteOp::Put {
        id: kiln_docs::DocId::Given(id.into()),
        document: parse(body),
        condition: Condition::None,
    };
    let out = store
        .writes()
        .write_blocking(db.clone(), put("users/ada", r#"{"n":1}"#))
        .unwrap();
    assert!(matches!(out, BatchOutcome::Put(_)));
    db.write_all(vec![
        put("users/bob", r#"{"n":2}"#),
        put("orders/1", r#"{"n":3}"#),
        put("x", r#"{"@metadata":{"@collection":"misc"}}"#),
    ])
    .unwrap();
    let only = |f: ChangeFilter| -> Vec<String> {
        db.changes_since(0, 100, &f, false)
            .unwrap()
            .changes
            .into_iter()
            .map(|e| e.change.id)
            .collect()
    };
    let f = |id: Option<&str>, prefix: Option<&str>, coll: Option<&str>| ChangeFilter {
        id: id.map(Into::into),
        prefix: prefix.map(Into::into),
        collection: coll.map(Into::into),
    };
    assert_eq!(
        only(f(None, Some("users/"), None)),
        ["users/ada", "users/bob"]
    );
    assert_eq!(only(f(None, None, Some("misc"))), ["x"]);
    assert_eq!(only(f(Some("orders/1"), None, None)), ["orders/1"]);
    assert!(only(f(Some("nope"), None, None)).is_empty());
    let page = db
        .changes_since(0, 1, &f(None, None, Some("orders")), true)
        .unwrap();
    let doc = page.changes[0].document.as_ref().unwrap();
    assert_eq!(doc.id, "orders/1");
    assert!(std::str::from_utf8(&doc.json).unwrap().contains(r#""n":3"#));
    // A filtered read that matched nothing still moves the reader to the end.
    let p = db
        .changes_since(0, 10, &f(None, Some("zzz"), None), false)
        .unwrap();
    assert_eq!(p.last_sequence, p.database_sequence);
    assert_eq!(p.database_sequence, 4);
    // `until` bounds a read.
    let p = db
        .changes_between(0, 2, 10, &ChangeFilter::default(), false)
        .unwrap();
    assert_eq!(p.changes.len(), 2);
    assert_eq!(p.last_sequence, 2);
}

#[test]
fn waiting_readers_wake_on_a_durable_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("w").unwrap();
    let before = db.last_sequence();
    let waiter = {
        let db = db.clone();
        std::thread::spawn(move || db.wait_for_changes(before, Duration::from_secs(20)))
    };
    std::thread::sleep(Duration::from_millis(50));
    let p = db.put("a", b"{}", Condition::None).unwrap();
    assert_eq!(waiter.join().unwrap(), p.etag.sequence);
    let t = std::time::Instant::now();
    assert_eq!(
        db.wait_for_changes(p.etag.sequence, Duration::from_millis(50)),
        p.etag.sequence
    );
    assert!(t.elapsed() >= Duration::from_millis(50));
}

#[test]
fn tombstones_are_replaced_by_a_new_write_and_purged_as_consumers_allow() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("t").unwrap();
    for i in 0..20 {
        db.put(&format!("d/{i}"), b"{}", Condition::None).unwrap();
    }
    let mut tombstones = Vec::new();
    for i in 0..10 {
        tombstones.push(db.delete(&format!("d/{i}"), Condition::None).unwrap());
    }
    assert_eq!(db.tombstone_stats().unwrap().count, 10);
    assert_eq!(
        db.tombstone_stats().unwrap().oldest,
        Some(tombstones[0].tombstone_etag)
    );
    // Writing d/0 again supersedes its tombstone.
    db.put("d/0", b"{}", Condition::None).unwrap();
    assert_eq!(db.tombstone_stats().unwrap().count, 9);
    let d0: Vec<_> = all_changes(&db, 100)
        .into_iter()
        .filter(|c| c.id == "d/0")
        .collect();
    assert_eq!(d0.len(), 1);
    assert_eq!(d0[0].kind, ChangeKind::Put);

    // A consumer that has read only up to the 3rd tombstone holds the rest back.
    db.set_consumer_position("backup", tombstones[3].tombstone_etag.sequence)
        .unwrap();
    let out = db.purge_tombstones(PurgeRule::default()).unwrap();
    assert_eq!(out.purged, 3, "d/1..d/3 (d/0 was written again)");
    assert_eq!(out.remaining, 6);
    // A rule's bound applies too; with the consumer gone, everything below it goes.
    db.remove_consumer("backup").unwrap();
    let rule = PurgeRule {
        before_sequence: Some(tombstones[6].tombstone_etag.sequence),
        older_than_ms: None,
    };
    assert_eq!(db.purge_tombstones(rule).unwrap().purged, 2);
    // Tombstones younger than an hour stay under an age rule.
    let rule = PurgeRule {
        before_sequence: None,
        older_than_ms: Some(3_600_000),
    };
    assert_eq!(db.purge_tombstones(rule).unwrap().purged, 0);
    assert_eq!(
        db.purge_tombstones(PurgeRule::default()).unwrap().remaining,
        0
    );
    let deletes = all_changes(&db, 100)
        .into_iter()
        .filter(|c| c.kind == ChangeKind::Delete)
        .count();
    assert_eq!(deletes, 0);
}

#[test]
fn the_log_survives_reopen_and_old_databases_get_one_built() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.create_database("old").unwrap();
        for i in 0..2_500 {
            db.put(&format!("u/{i:05}"), b"{}", Condition::None)
                .unwrap();
        }
        db.delete("u/00001", Condition::None).unwrap();
        drop(db);
        store.close().unwrap();
    }
    let expected: Vec<_> = {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.database("old").unwrap();
        let all = all_changes(&db, 500);
        assert_eq!(all.len(), 2_500);
        drop(db);
        store.close().unwrap();
        all.into_iter()
            .filter(|c| c.kind == ChangeKind::Put)
            .collect()
    };
    // Make it look like a database from before the change log: drop its trees.
    {
        let env_dir = dir.path().join("databases").join("old");
        let env = kiln_storage::Env::open(&env_dir, options().storage).unwrap();
        let mut w = env.begin_write().unwrap();
        for t in ["changes", "tombstones", "consumers"] {
            assert!(w.drop_tree(t).unwrap(), "{t} existed");
        }
        w.commit().unwrap();
        env.close().unwrap();
    }
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("old").unwrap();
    let rebuilt = all_changes(&db, 333);
    assert_eq!(rebuilt, expected, "every stored document at its etag");
    // And it is kept up to date from then on.
    let p = db.put("u/new", b"{}", Condition::None).unwrap();
    let last = all_changes(&db, 10_000).pop().unwrap();
    assert_eq!((last.id.as_str(), last.etag), ("u/new", p.etag));
}

#[test]
fn etags_of_another_incarnation_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("x").unwrap();
    let e = db.put("a", b"{}", Condition::None).unwrap().etag;
    assert_eq!(db.sequence_of(&e.to_string()).unwrap(), e.sequence);
    assert_eq!(db.sequence_of("").unwrap(), 0);
    drop(db);
    store.delete_database("x").unwrap();
    let db = store.create_database("x").unwrap();
    if db.etag_at(1).incarnation == e.incarnation {
        return; // 1 in 2^32: the new incarnation drew the same number
    }
    assert!(matches!(
        db.sequence_of(&e.to_string()),
        Err(kiln_docs::DocError::Database(
            DatabaseError::EtagFromOtherIncarnation { .. }
        ))
    ));
    assert!(db.sequence_of("garbage").is_err());
}
