//! The document layer end to end on a real (small) storage environment.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{BatchOp, BatchOutcome, Condition, DocError, DocId, DocStore, DocsOptions};
use kiln_docs::{DatabaseError, DocumentError};
use serde_json::{json, Value};
use std::sync::Arc;

fn small_options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.max_document_bytes = 64 << 10;
    o.max_id_bytes = 64;
    o.max_batch_ops = 10;
    o
}

fn body(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn put_get_conditions_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), small_options()).unwrap();
    let db = store.create_database("shop").unwrap();
    assert!(matches!(
        store.create_database("shop"),
        Err(DocError::Database(DatabaseError::Exists(_)))
    ));
    assert!(matches!(
        store.create_database("Shop"),
        Err(DocError::Document(
            DocumentError::InvalidDatabaseName { .. }
        ))
    ));

    let first = db
        .put("users/ada", &body(json!({"name": "Ada"})), Condition::None)
        .unwrap();
    assert!(first.created);
    assert_eq!(first.collection.as_deref(), Some("users"));
    let doc = db.get("users/ada").unwrap().unwrap();
    assert_eq!(doc.etag, first.etag);
    let v = doc.to_value().unwrap();
    assert_eq!(v["name"], "Ada");
    assert_eq!(v["@metadata"]["@etag"], first.etag.to_string());
    assert_eq!(v["@metadata"]["@collection"], "users");

    // A stale etag loses and is told the current one; the right one wins.
    let second = db
        .put(
            "users/ada",
            &body(json!({"name": "Ada L"})),
            Condition::IfMatch(first.etag),
        )
        .unwrap();
    assert!(second.etag.sequence > first.etag.sequence);
    assert!(!second.created);
    match db.put(
        "users/ada",
        &body(json!({})),
        Condition::IfMatch(first.etag),
    ) {
        Err(DocError::Document(DocumentError::Conflict { current, .. })) => {
            assert_eq!(current, Some(second.etag))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        db.put("users/ada", b"{}", Condition::IfNotExists),
        Err(DocError::Document(DocumentError::Conflict { .. }))
    ));
    assert!(matches!(
        db.put("users/bob", b"{}", Condition::IfExists),
        Err(DocError::Document(DocumentError::Conflict {
            current: None,
            ..
        }))
    ));
    assert!(db.get("users/bob").unwrap().is_none());

    // Bad input: clear errors, nothing written.
    assert!(matches!(
        db.put("x", b"{\"a\": ", Condition::None),
        Err(DocError::Document(DocumentError::MalformedJson { .. }))
    ));
    assert!(matches!(
        db.put("x", b"[]", Condition::None),
        Err(DocError::Document(DocumentError::Invalid(_)))
    ));
    assert!(matches!(
        db.put(&"x".repeat(65), b"{}", Condition::None),
        Err(DocError::Document(DocumentError::InvalidId { .. }))
    ));
    assert!(matches!(
        db.put("", b"{}", Condition::None),
        Err(DocError::Document(DocumentError::InvalidId { .. }))
    ));
    let big = body(json!({"blob": "x".repeat(70 << 10)}));
    assert!(matches!(
        db.put("x", &big, Condition::None),
        Err(DocError::Document(DocumentError::TooLarge { .. }))
    ));
    assert!(db.get("x").unwrap().is_none());

    let del = db
        .delete("users/ada", Condition::IfMatch(second.etag))
        .unwrap();
    assert_eq!(del.etag, second.etag);
    assert!(db.get("users/ada").unwrap().is_none());
    assert!(matches!(
        db.delete("users/ada", Condition::None),
        Err(DocError::Document(DocumentError::NotFound { .. }))
    ));
    assert_eq!(db.document_count().unwrap(), 0);
    assert!(db.collections().unwrap().is_empty());
}

#[test]
fn generated_ids_collections_counts_and_paging() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), small_options()).unwrap();
    let db = store.create_database("app").unwrap();
    let mut ids = Vec::new();
    for i in 0..25 {
        let out = db
            .put_to(
                DocId::Generate {
                    prefix: "orders/".into(),
                },
                &body(json!({"n": i})),
                Condition::None,
            )
            .unwrap();
        assert!(out.id.starts_with("orders/"));
        ids.push(out.id);
    }
    let unique: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), 25);
    db.put(
        "people/1",
        &body(json!({"@metadata": {"@collection": "users"}})),
        Condition::None,
    )
    .unwrap();
    db.put("loose", b"{}", Condition::None).unwrap();
    let counts: Vec<(String, u64)> = db
        .collections()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.documents))
        .collect();
    assert_eq!(
        counts,
        vec![("orders".to_string(), 25), ("users".to_string(), 1)]
    );
    assert_eq!(db.document_count().unwrap(), 27);

    // Prefix listing in id order, 10 per page.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = db.list_by_prefix("orders/", after.as_deref(), 10).unwrap();
        assert!(page.items.len() <= 10);
        seen.extend(page.items.iter().map(|d| d.id.clone()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(seen, sorted);

    // Collection listing in etag order; a rewrite moves a document to the end.
    db.put(&ids[0], &body(json!({"n": "again"})), Condition::None)
        .unwrap();
    let mut order = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = db.list_collection("orders", after.as_deref(), 7).unwrap();
        order.extend(page.items.iter().map(|d| (d.etag.sequence, d.id.clone())));
        match page.next {
            Some(n) => {
                assert_eq!(
                    n,
                    page.items.last().unwrap().etag.to_string(),
                    "an etag cursor"
                );
                after = Some(n)
            }
            None => break,
        }
    }
    // A cursor that is not an etag of this database is refused, not read as 0.
    assert!(matches!(
        db.list_collection("orders", Some("12"), 7),
        Err(kiln_docs::DocError::Document(DocumentError::InvalidEtag(_)))
    ));
    assert_eq!(order.len(), 25);
    assert!(order.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(order.last().unwrap().1, ids[0]);

    // Moving a document to another collection moves its count.
    db.put(
        &ids[1],
        &body(json!({"@metadata": {"@collection": "users"}})),
        Condition::None,
    )
    .unwrap();
    let counts: Vec<(String, u64)> = db
        .collections()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.documents))
        .collect();
    assert_eq!(
        counts,
        vec![("orders".to_string(), 24), ("users".to_string(), 2)]
    );
}

#[test]
fn batch_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), small_options()).unwrap();
    let db = store.create_database("b").unwrap();
    let a = db.put("a", b"{}", Condition::None).unwrap();
    let out = db
        .batch(vec![
            BatchOp::Put {
                id: DocId::Given("b".into()),
                document: json!({"x": 1}),
                condition: Condition::None,
            },
            BatchOp::Delete {
                id: "a".into(),
                condition: Condition::IfMatch(a.etag),
            },
            BatchOp::Put {
                id: DocId::Generate {
                    prefix: "g/".into(),
                },
                document: json!({}),
                condition: Condition::None,
            },
        ])
        .unwrap();
    assert_eq!(out.len(), 3);
    assert!(matches!(&out[1], BatchOutcome::Delete(d) if d.id == "a"));
    assert!(db.get("a").unwrap().is_none());
    // The third op conflicts: the first two are rolled back with it.
    let err = db
        .batch(vec![
            BatchOp::Put {
                id: DocId::Given("c".into()),
                document: json!({}),
                condition: Condition::None,
            },
            BatchOp::Delete {
                id: "b".into(),
                condition: Condition::None,
            },
            BatchOp::Put {
                id: DocId::Given("b".into()),
                document: json!({}),
                condition: Condition::IfExists,
            },
        ])
        .unwrap_err();
    match err {
        DocError::Database(DatabaseError::BatchOpFailed { index, source }) => {
            assert_eq!(index, 2);
            assert!(matches!(
                *source,
                DocError::Document(DocumentError::Conflict { .. })
            ));
        }
        other => panic!("{other:?}"),
    }
    assert!(db.get("c").unwrap().is_none());
    assert!(db.get("b").unwrap().is_some());
    let too_long = (0..11)
        .map(|i| BatchOp::Delete {
            id: format!("{i}"),
            condition: Condition::None,
        })
        .collect();
    assert!(matches!(
        db.batch(too_long),
        Err(DocError::Database(DatabaseError::BatchTooLong {
            len: 11,
            max: 10
        }))
    ));
    let bad_doc = vec![BatchOp::Put {
        id: DocId::Given("z".into()),
        document: json!([1]),
        condition: Condition::None,
    }];
    assert!(matches!(
        db.batch(bad_doc),
        Err(DocError::Database(DatabaseError::BatchOpFailed {
            index: 0,
            ..
        }))
    ));
}

#[test]
fn concurrent_if_match_writers_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), small_options()).unwrap();
    let db = store.create_database("race").unwrap();
    for round in 0..5 {
        let base = db
            .put("doc", &body(json!({"round": round})), Condition::None)
            .unwrap();
        let handles: Vec<_> = (0..16)
            .map(|t| {
                let db = db.clone();
                std::thread::spawn(move || {
                    db.put(
                        "doc",
                        &body(json!({"writer": t})),
                        Condition::IfMatch(base.etag),
                    )
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "round {round}");
        assert!(results
            .iter()
            .all(|r| r.is_ok()
                || matches!(r, Err(DocError::Document(DocumentError::Conflict { .. })))));
    }
}

#[test]
fn data_survives_restart_and_deleted_databases_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (etag, incarnation) = {
        let store = DocStore::open(dir.path(), small_options()).unwrap();
        let db = store.create_database("keep").unwrap();
        store
            .create_database("drop")
            .unwrap()
            .put("x", b"{}", Condition::None)
            .unwrap();
        let out = db
            .put("users/1", &body(json!({"v": 1})), Condition::None)
            .unwrap();
        drop(db);
        store.delete_database("drop").unwrap();
        assert!(matches!(
            store.delete_database("drop"),
            Err(DocError::Database(DatabaseError::NotFound(_)))
        ));
        store.close().unwrap();
        (out.etag, out.etag.incarnation)
    };
    let store = DocStore::open(dir.path(), small_options()).unwrap();
    assert_eq!(store.database_names(), vec!["keep".to_string()]);
    let db = store.database("keep").unwrap();
    assert_eq!(db.get("users/1").unwrap().unwrap().etag, etag);
    // Etags keep growing after a restart.
    let next = db.put("users/2", b"{}", Condition::None).unwrap();
    assert!(next.etag.sequence > etag.sequence);
    assert_eq!(next.etag.incarnation, incarnation);
    // A database created again under a deleted name starts empty.
    let again = store.create_database("drop").unwrap();
    assert!(again.get("x").unwrap().is_none());
}

#[test]
fn deleted_database_refuses_handles_still_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = small_options();
    opts.delete_wait_ms = 50;
    let store = Arc::new(DocStore::open(dir.path(), opts).unwrap());
    let db = store.create_database("busy").unwrap();
    // A handle held elsewhere: deletion waits, gives up, and leaves the database whole.
    assert!(matches!(
        store.delete_database("busy"),
        Err(DocError::Database(DatabaseError::Busy { .. }))
    ));
    drop(db);
    store.delete_database("busy").unwrap();
}

#[test]
fn write_each_applies_independent_writes_in_one_unit() {
    use kiln_docs::{ParsedDocument, WriteOp};
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), small_options()).unwrap();
    let db = store.create_database("each").unwrap();
    let old = db.put("a", b"{}", Condition::None).unwrap();
    db.put("a", b"{\"v\":2}", Condition::None).unwrap();
    let doc = |j: &str| ParsedDocument::parse(j.as_bytes()).unwrap();
    let commits_before = db.env().stats().commits;
    let results = db.write_each(vec![
        WriteOp::Put {
            id: DocId::Given("b".into()),
            document: doc("{\"v\":1}"),
            condition: Condition::None,
        },
        // Stale etag: fails alone.
        WriteOp::Put {
            id: DocId::Given("a".into()),
            document: doc("{\"v\":3}"),
            condition: Condition::IfMatch(old.etag),
        },
        WriteOp::Delete {
            id: "missing".into(),
            condition: Condition::None,
        },
        WriteOp::Put {
            id: DocId::Given("".into()),
            document: doc("{}"),
            condition: Condition::None,
        },
        WriteOp::Put {
            id: DocId::Generate {
                prefix: "g/".into(),
            },
            document: doc("{}"),
            condition: Condition::None,
        },
        WriteOp::Delete {
            id: "b".into(),
            condition: Condition::None,
        },
    ]);
    assert_eq!(results.len(), 6);
    assert!(matches!(&results[0], Ok(BatchOutcome::Put(p)) if p.id == "b"));
    assert!(matches!(
        &results[1],
        Err(DocError::Document(DocumentError::Conflict { .. }))
    ));
    assert!(matches!(
        &results[2],
        Err(DocError::Document(DocumentError::NotFound { .. }))
    ));
    assert!(matches!(
        &results[3],
        Err(DocError::Document(DocumentError::InvalidId { .. }))
    ));
    let generated = match &results[4] {
        Ok(BatchOutcome::Put(p)) => p.id.clone(),
        other => panic!("{other:?}"),
    };
    assert!(matches!(&results[5], Ok(BatchOutcome::Delete(d)) if d.id == "b"));
    assert_eq!(
        db.env().stats().commits,
        commits_before + 1,
        "one unit, one commit"
    );
    assert_eq!(db.get("a").unwrap().unwrap().to_value().unwrap()["v"], 2);
    assert!(db.get("b").unwrap().is_none());
    assert!(db.get(&generated).unwrap().is_some());
    // Etags stay strictly increasing across the failed writes.
    let e_gen = db.get(&generated).unwrap().unwrap().etag.sequence;
    let next = db.put("c", b"{}", Condition::None).unwrap();
    assert!(next.etag.sequence > e_gen);
}

#[test]
fn numbers_are_stored_exactly_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), small_options()).unwrap();
    let db = store.create_database("nums").unwrap();
    // Beyond u64 and f64: a database must not round what it was given.
    let sent = br#"{"big":123456789012345678901234567890,"neg":-98765432109876543210,"precise":0.1000000000000000055511151231257827,"exp":1.5e300,"small":42}"#;
    db.put("n/1", sent, Condition::None).unwrap();
    let doc = db.get("n/1").unwrap().unwrap();
    let text = String::from_utf8(doc.json.clone()).unwrap();
    for literal in [
        "123456789012345678901234567890",
        "-98765432109876543210",
        "0.1000000000000000055511151231257827",
        "42",
    ] {
        assert!(text.contains(literal), "{literal} not kept in {text}");
    }
    // The same number; only the exponent's spelling may be normalized.
    assert!(
        text.contains("1.5e+300") || text.contains("1.5e300"),
        "{text}"
    );
}

/// A server hosts many databases, most of them small: a new database takes a 4 MiB
/// journal file and at most a 1 MiB data file (it took a 64 MiB one of each; a
/// close cuts the data file's unused growth step), and one that writes more moves
/// on to full-size journal files.
#[test]
fn a_new_database_takes_little_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), DocsOptions::default()).unwrap();
    let db = store.create_database("small").unwrap();
    db.put("a", &body(json!({"n": 1})), Condition::None)
        .unwrap();
    let db_dir = dir.path().join("databases").join("small");
    let lens = |sub: &str| -> Vec<u64> {
        let mut v: Vec<u64> = std::fs::read_dir(db_dir.join(sub))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                e.path()
                    .extension()
                    .is_some_and(|x| x == "log" || x == "kiln")
            })
            .map(|e| e.metadata().unwrap().len())
            .collect();
        v.sort();
        v
    };
    assert_eq!(lens("journal"), vec![4 << 20]);
    let data = lens("");
    assert!(data.len() == 1 && data[0] <= 1 << 20, "{data:?}");
    // Past half of that file (incompressible text: the journal compresses records):
    // the next file made is a full-size one (or one cut short if the writer caught
    // up with its zero-filling, then a full-size one).
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut text = || -> String {
        (0..60_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect()
    };
    for i in 0..40 {
        db.put(
            &format!("big/{i}"),
            &body(json!({ "s": text() })),
            Condition::None,
        )
        .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !lens("journal").contains(&(64 << 20)) {
        assert!(
            std::time::Instant::now() < deadline,
            "no full-size journal file: {:?}",
            lens("journal")
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let journal = lens("journal");
    // The small first file is the oldest: kept as a spare, or removed once two
    // newer spares are there.
    assert!(
        journal.iter().filter(|&&l| l == 4 << 20).count() <= 1,
        "{journal:?}"
    );
}
