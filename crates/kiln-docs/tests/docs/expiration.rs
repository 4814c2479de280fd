//! Document expiration, on a clock the tests hold (`now_ms` is passed in):
//! `@metadata.@expires` puts a document in the expiration index in the same
//! transaction as its write; a rewrite moves or removes the entry, a delete
//! removes it; `expired` lists what is due in time order with each document's
//! etag; `delete_expired` and `expire` delete them as ordinary deletes (a
//! tombstone in the change log), skipping a document rewritten in between; the
//! index survives a reopen, a full backup and a replayed increment; a database
//! made before the index gets one built from its documents. A model test checks
//! random puts, deletes and clock steps against a map.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::DocumentError;
use kiln_docs::{
    format_rfc3339_ms, ChangeFilter, ChangeKind, Condition, Database, DocError, DocStore,
    DocsOptions, DueDocument, Etag, RestorePoint, RestoreSource,
};
use kiln_storage::BackupOptions;
use proptest::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Times of the tests: far from the wall clock, which nothing here reads.
const T0_MS: u64 = 1_900_000_000_000;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o
}

fn store_with_db(dir: &std::path::Path) -> (DocStore, Arc<Database>) {
    let store = DocStore::open(dir, options()).unwrap();
    let db = store.create_database("d").unwrap();
    (store, db)
}

/// Writes `id` expiring at `at_ms` (or not at all); its etag.
fn put(db: &Database, id: &str, at_ms: Option<u64>) -> Etag {
    let body = match at_ms {
        Some(at) => json!({"n": id, "@metadata": {"@expires": format_rfc3339_ms(at)}}),
        None => json!({"n": id}),
    };
    db.put(id, body.to_string().as_bytes(), Condition::None)
        .unwrap()
        .etag
}

/// Everything due at `now_ms`, as (id, etag, time).
fn due(db: &Database, now_ms: u64) -> Vec<(String, Etag, u64)> {
    db.expired(now_ms, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|d: DueDocument| (d.id, d.etag, d.expires_at_ms))
        .collect()
}

fn ids(due: &[(String, Etag, u64)]) -> Vec<&str> {
    due.iter().map(|d| d.0.as_str()).collect()
}

#[test]
fn due_documents_come_in_time_order_with_their_etags() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, db) = store_with_db(dir.path());
    let c = put(&db, "c", Some(T0_MS + 3_000));
    let a = put(&db, "a", Some(T0_MS + 1_000));
    let b = put(&db, "b", Some(T0_MS + 2_000));
    put(&db, "forever", None);
    // Same time: by id.
    let a2 = put(&db, "a2", Some(T0_MS + 1_000));
    assert!(due(&db, T0_MS).is_empty());
    assert!(due(&db, T0_MS + 999).is_empty());
    assert_eq!(
        due(&db, T0_MS + 2_000),
        vec![
            ("a".into(), a, T0_MS + 1_000),
            ("a2".into(), a2, T0_MS + 1_000),
            ("b".into(), b, T0_MS + 2_000),
        ]
    );
    assert_eq!(ids(&due(&db, u64::MAX)), ["a", "a2", "b", "c"]);
    assert_eq!(due(&db, u64::MAX)[3].1, c);
    let limited: Vec<String> = db
        .expired(u64::MAX, 2)
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(limited, ["a", "a2"]);
    assert!(db.expired(u64::MAX, 0).unwrap().is_empty());
}

#[test]
fn rewrites_move_or_drop_the_entry_and_deletes_drop_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, db) = store_with_db(dir.path());
    put(&db, "moved", Some(T0_MS + 1_000));
    put(&db, "kept", Some(T0_MS + 1_000));
    put(&db, "dropped", Some(T0_MS + 1_000));
    put(&db, "deleted", Some(T0_MS + 1_000));
    put(&db, "later", None);
    let moved = put(&db, "moved", Some(T0_MS + 5_000));
    let kept = put(&db, "kept", Some(T0_MS + 1_000));
    put(&db, "dropped", None);
    db.delete("deleted", Condition::None).unwrap();
    let later = put(&db, "later", Some(T0_MS + 500));
    assert_eq!(
        due(&db, T0_MS + 1_000),
        vec![
            ("later".into(), later, T0_MS + 500),
            ("kept".into(), kept, T0_MS + 1_000),
        ]
    );
    assert_eq!(
        due(&db, T0_MS + 5_000)[2],
        ("moved".into(), moved, T0_MS + 5_000)
    );
    // A document written again after its delete starts without an entry.
    put(&db, "deleted", None);
    assert_eq!(ids(&due(&db, u64::MAX)), ["later", "kept", "moved"]);
}

#[test]
fn expires_is_checked_and_kept_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, db) = store_with_db(dir.path());
    for bad in [
        json!("tomorrow"),
        json!("2030-01-01"),
        json!("2030-01-01T00:00:00"),
        json!("2030-13-01T00:00:00Z"),
        json!(1_900_000_000),
        json!({"at": "2030-01-01T00:00:00Z"}),
    ] {
        let body = json!({"@metadata": {"@expires": bad}}).to_string();
        match db.put("x", body.as_bytes(), Condition::None) {
            Err(DocError::Document(DocumentError::InvalidExpires { value, .. })) => {
                assert_eq!(value, bad.to_string())
            }
            other => panic!("{bad}: {other:?}"),
        }
        // Refused in a batch too, naming the operation.
        let op = kiln_docs::BatchOp::Put {
            id: kiln_docs::DocId::Given("x".into()),
            document: serde_json::from_str(&body).unwrap(),
            condition: Condition::None,
        };
        assert!(db.batch(vec![op]).is_err(), "{bad}");
    }
    assert!(db.get("x").unwrap().is_none());
    // An offset is taken into account; the text stays as the client wrote it.
    let body = json!({"@metadata": {"@expires": "2030-01-01T02:00:00.5+02:00"}});
    db.put("x", body.to_string().as_bytes(), Condition::None)
        .unwrap();
    let stored = db.get("x").unwrap().unwrap().to_value().unwrap();
    assert_eq!(
        stored["@metadata"]["@expires"],
        "2030-01-01T02:00:00.5+02:00"
    );
    assert_eq!(due(&db, u64::MAX)[0].2, 1_893_456_000_500);
    // null: no expiry.
    let body = json!({"@metadata": {"@expires": null}}).to_string();
    db.put("x", body.as_bytes(), Condition::None).unwrap();
    assert!(due(&db, u64::MAX).is_empty());
}

#[test]
fn expired_documents_are_deleted_with_a_tombstone_unless_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, db) = store_with_db(dir.path());
    for i in 0..25 {
        put(&db, &format!("old/{i:02}"), Some(T0_MS + i));
    }
    put(&db, "young", Some(T0_MS + 60_000));
    let found = db.expired(T0_MS + 100, usize::MAX).unwrap();
    assert_eq!(found.len(), 25);
    // Rewritten after it was found (still due): its delete is skipped, and the
    // next pass deletes it at its new etag.
    let rewritten = put(&db, "old/03", Some(T0_MS + 3));
    let report = db.delete_expired(found).unwrap();
    assert_eq!((report.deleted, report.skipped), (24, 1));
    assert_eq!(db.get("old/03").unwrap().unwrap().etag, rewritten);
    assert_eq!(ids(&due(&db, T0_MS + 100)), ["old/03"]);
    let report = db.expire(T0_MS + 100, 10).unwrap();
    assert_eq!((report.deleted, report.skipped), (1, 0));
    assert!(due(&db, T0_MS + 100).is_empty());
    assert_eq!(db.document_count().unwrap(), 1);
    let changes = db
        .changes_since(0, 1_000, &ChangeFilter::default(), false)
        .unwrap()
        .changes;
    let deletes = changes
        .iter()
        .filter(|c| c.change.kind == ChangeKind::Delete)
        .count();
    assert_eq!(deletes, 25);
    // Nothing due: nothing done.
    assert_eq!(db.expire(T0_MS + 100, 10).unwrap().deleted, 0);
}

#[test]
fn expire_works_through_many_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, db) = store_with_db(dir.path());
    let ops = (0..2_345)
        .map(|i| kiln_docs::BatchOp::Put {
            id: kiln_docs::DocId::Given(format!("e/{i}")),
            document: json!({"@metadata": {"@expires": format_rfc3339_ms(T0_MS + i % 7)}}),
            condition: Condition::None,
        })
        .collect();
    db.batch(ops).unwrap();
    put(&db, "stays", Some(T0_MS + 7));
    let report = db.expire(T0_MS + 6, 1_000).unwrap();
    assert_eq!((report.deleted, report.skipped), (2_345, 0));
    assert_eq!(db.document_count().unwrap(), 1);
}

#[test]
fn the_index_survives_reopen_full_backup_and_replayed_increment() {
    let dir = tempfile::tempdir().unwrap();
    let (store, db) = store_with_db(dir.path());
    put(&db, "a", Some(T0_MS + 1));
    put(&db, "b", Some(T0_MS + 2));
    let mut full = Vec::new();
    db.backup_full_to(&mut full, BackupOptions::default(), true, |_| {})
        .unwrap();
    // After the full backup: replayed from the increment.
    put(&db, "c", Some(T0_MS + 3));
    put(&db, "a", None);
    db.delete("b", Condition::None).unwrap();
    let mut inc = Vec::new();
    let m = kiln_docs::read_manifest(&full[..]).unwrap();
    db.backup_incremental_to(&mut inc, &m, BackupOptions::default(), |_| {})
        .unwrap();
    let expected = due(&db, u64::MAX);
    assert_eq!(ids(&expected), ["c"]);
    store
        .restore_database(source(&[&full]), "r1", false, RestorePoint::Latest, |_| {})
        .unwrap();
    let r1 = store.database("r1").unwrap();
    assert_eq!(ids(&due(&r1, u64::MAX)), ["a", "b"]);
    store
        .restore_database(
            source(&[&full, &inc]),
            "r2",
            false,
            RestorePoint::Latest,
            |_| {},
        )
        .unwrap();
    assert_eq!(due(&store.database("r2").unwrap(), u64::MAX), expected);
    drop((db, r1));
    store.close().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    for name in ["d", "r2"] {
        let db = store.database(name).unwrap();
        assert_eq!(due(&db, u64::MAX), expected, "{name}");
        // The reopened database still keeps it up.
        put(&db, "c", None);
        assert!(due(&db, u64::MAX).is_empty(), "{name}");
    }
}

fn source(files: &[&Vec<u8>]) -> RestoreSource<'static> {
    RestoreSource::Files(
        files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let reader = std::io::Cursor::new((*f).clone());
                (
                    format!("file{i}"),
                    Box::new(reader) as Box<dyn std::io::Read>,
                )
            })
            .collect(),
    )
}

/// A database made before expiration existed (its trees dropped here, as if
/// never made) gets them on open, filled from the documents that carry an
/// `@expires`.
#[test]
fn a_database_made_before_the_index_gets_one_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (store, db) = store_with_db(dir.path());
    let a = put(&db, "a", Some(T0_MS + 2));
    let b = put(&db, "b", Some(T0_MS + 1));
    put(&db, "plain", None);
    db.env()
        .submit(|w| {
            w.drop_tree("expirations")?;
            w.drop_tree("expiration_ids")
        })
        .unwrap();
    drop(db);
    store.close().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("d").unwrap();
    assert_eq!(
        due(&db, u64::MAX),
        vec![("b".into(), b, T0_MS + 1), ("a".into(), a, T0_MS + 2)]
    );
    put(&db, "a", None);
    assert_eq!(ids(&due(&db, u64::MAX)), ["b"]);
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Step {
    Put { id: u8, expires_in_ms: Option<u64> },
    Delete { id: u8 },
    Advance { ms: u64 },
    Expire { batch: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..8, prop::option::of(0u64..50)).prop_map(|(id, expires_in_ms)| Step::Put { id, expires_in_ms }),
        1 => (0u8..8).prop_map(|id| Step::Delete { id }),
        2 => (0u64..30).prop_map(|ms| Step::Advance { ms }),
        1 => (1usize..4).prop_map(|batch| Step::Expire { batch }),
    ]
}

/// id -> (etag, expiry): the model of what the database holds.
type Model = BTreeMap<String, (Etag, Option<u64>)>;

fn model_due(model: &Model, now_ms: u64) -> Vec<(String, Etag, u64)> {
    let mut due: Vec<_> = model
        .iter()
        .filter_map(|(id, (etag, at))| {
            at.filter(|&at| at <= now_ms)
                .map(|at| (id.clone(), *etag, at))
        })
        .collect();
    due.sort_by(|x, y| (x.2, &x.0).cmp(&(y.2, &y.0)));
    due
}

fn run_model(db: &Database, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut model = Model::new();
    let mut now_ms = T0_MS;
    for s in steps {
        match s {
            Step::Put { id, expires_in_ms } => {
                let id = format!("m/{id}");
                let at = expires_in_ms.map(|ms| now_ms + ms);
                model.insert(id.clone(), (put(db, &id, at), at));
            }
            Step::Delete { id } => {
                let id = format!("m/{id}");
                let deleted = db.delete(&id, Condition::None).is_ok();
                prop_assert_eq!(deleted, model.remove(&id).is_some());
            }
            Step::Advance { ms } => now_ms += ms,
            Step::Expire { batch } => {
                let report = db.expire(now_ms, *batch).unwrap();
                let want = model_due(&model, now_ms);
                prop_assert_eq!(report.deleted, want.len() as u64);
                for (id, ..) in want {
                    model.remove(&id);
                }
            }
        }
        prop_assert_eq!(due(db, now_ms), model_due(&model, now_ms));
        prop_assert_eq!(due(db, u64::MAX), model_due(&model, u64::MAX));
    }
    prop_assert_eq!(db.document_count().unwrap(), model.len() as u64);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random puts (expiring or not), deletes, clock steps and expiry passes: the
    /// index says exactly what a map of the documents says is due, in order, with
    /// the etags the writes returned; an expiry pass deletes exactly those.
    #[test]
    fn the_index_matches_a_model(steps in prop::collection::vec(step(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let (_store, db) = store_with_db(dir.path());
        run_model(&db, &steps)?;
    }
}
