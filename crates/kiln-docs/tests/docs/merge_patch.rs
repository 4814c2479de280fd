//! `Database::patch` and `WriteOp::Patch`: a JSON merge patch (RFC 7396) read,
//! merged and written in the write's own transaction. A new etag like a put; 404
//! for a missing document; If-Match checked against the document as read there;
//! `@metadata` patched as a PUT may set it; and concurrent patches of one document
//! never lose each other's changes (each reads what the previous one wrote).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::DocumentError;
use kiln_docs::{BatchOutcome, Condition, Database, DocError, DocStore, DocsOptions, WriteOp};
use serde_json::{json, Value};
use std::sync::Arc;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o
}

fn doc(db: &Database, id: &str) -> Value {
    db.get(id).unwrap().expect("exists").to_value().unwrap()
}

#[test]
fn a_patch_merges_gets_a_new_etag_and_checks_its_condition() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    let put = db
        .put(
            "users/1",
            br#"{"name":"Ada","address":{"city":"London","zip":"N1"},"tags":["a"]}"#,
            Condition::None,
        )
        .unwrap();
    let patched = db
        .patch(
            "users/1",
            json!({"address": {"zip": null, "street": "Main"}, "tags": ["b"], "age": 36}),
            Condition::IfMatch(put.etag),
        )
        .unwrap();
    assert!(patched.etag.sequence > put.etag.sequence);
    assert!(!patched.created);
    assert_eq!(patched.collection.as_deref(), Some("users"));
    let v = doc(&db, "users/1");
    assert_eq!(v["name"], "Ada");
    assert_eq!(v["address"], json!({"city": "London", "street": "Main"}));
    assert_eq!(v["tags"], json!(["b"]));
    assert_eq!(v["age"], 36);
    assert_eq!(v["@metadata"]["@etag"], patched.etag.to_string());

    // The etag it was given is stale now: a conflict, and nothing written.
    match db.patch("users/1", json!({"age": 1}), Condition::IfMatch(put.etag)) {
        Err(DocError::Document(DocumentError::Conflict { current, .. })) => {
            assert_eq!(current, Some(patched.etag))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(doc(&db, "users/1")["age"], 36);

    // A missing document is not created, whatever the condition.
    for condition in [Condition::None, Condition::IfExists] {
        assert!(matches!(
            db.patch("users/2", json!({"a": 1}), condition),
            Err(DocError::Document(DocumentError::NotFound { .. }))
        ));
    }
    assert!(db.get("users/2").unwrap().is_none());

    // A patch that is not an object, or that touches the server's metadata.
    for bad in [
        json!([1]),
        json!("x"),
        json!({"@metadata": {"@etag": "1-00000001"}}),
        json!({"@metadata": null}),
    ] {
        assert!(matches!(
            db.patch("users/1", bad.clone(), Condition::None),
            Err(DocError::Document(DocumentError::Invalid(_)))
        ));
    }
    // An invalid result (a bad @expires) is refused inside the unit and leaves
    // the document as it was.
    assert!(matches!(
        db.patch(
            "users/1",
            json!({"@metadata": {"@expires": "soon"}}),
            Condition::None
        ),
        Err(DocError::Document(DocumentError::InvalidExpires { .. }))
    ));
    assert_eq!(
        db.get("users/1").unwrap().unwrap().etag,
        patched.etag,
        "a refused patch wrote nothing"
    );
}

#[test]
fn metadata_is_patched_as_a_put_may_set_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    db.put("x", br#"{"a":1,"@metadata":{"tag":"t"}}"#, Condition::None)
        .unwrap();
    let out = db
        .patch(
            "x",
            json!({"@metadata": {"@collection": "things", "tag": null, "owner": "me"}}),
            Condition::None,
        )
        .unwrap();
    assert_eq!(out.collection.as_deref(), Some("things"));
    let v = doc(&db, "x");
    assert_eq!(v["@metadata"]["@collection"], "things");
    assert_eq!(v["@metadata"]["owner"], "me");
    assert!(v["@metadata"].get("tag").is_none());
    assert_eq!(v["@metadata"]["@id"], "x");
    let counts = db.collections().unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!(
        (counts[0].name.as_str(), counts[0].documents),
        ("things", 1)
    );
}

/// Threads patch different fields of ONE document at once, through the commit
/// queue (each call its own unit, merged with the others'), and patches in one
/// `write_each` unit follow one another: every field is there at the end. A patch
/// merged into what it read before the transaction would lose the others'.
#[test]
fn concurrent_patches_of_one_document_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db: Arc<Database> = store.create_database("d").unwrap();
    db.put("counter", b"{}", Condition::None).unwrap();
    let (threads, each) = (4, 25);
    std::thread::scope(|s| {
        for t in 0..threads {
            let db = &db;
            s.spawn(move || {
                for i in 0..each {
                    db.patch(
                        "counter",
                        json!({ format!("t{t}_{i}"): i }),
                        Condition::None,
                    )
                    .unwrap();
                }
            });
        }
    });
    let ops = (0..10)
        .map(|i| WriteOp::Patch {
            id: "counter".into(),
            patch: json!({ format!("unit_{i}"): i }),
            condition: Condition::None,
        })
        .collect();
    for r in db.write_each(ops) {
        assert!(matches!(r, Ok(BatchOutcome::Put(_))), "{r:?}");
    }
    let v = doc(&db, "counter");
    let fields = v.as_object().unwrap().len() - 1; // less @metadata
    assert_eq!(fields, threads * each + 10, "{v}");
    assert_eq!(
        db.get("counter").unwrap().unwrap().etag.sequence,
        1 + (threads * each + 10) as u64
    );
}
