//! Document revisions (`revisions/`): a collection configured to keep them keeps
//! every replaced version (its etag, time, writer's key and JSON) in the write's
//! own transaction, on every write path (puts, deletes, batches, bulk writes, a
//! cluster's log entries, a restore's replay), trimmed to `max_revisions` and
//! `max_age_ms`; a deleted document's revisions stay until purged; a revision can
//! be written back; backups carry them.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    Atomicity, BatchOp, BatchOutcome, Condition, Database, DocError, DocId, DocStore, DocsOptions,
    Etag, LoggedEntry, LoggedOutcome, Revision, RevisionsConfig, WriteOp,
};
use kiln_docs::{DocumentError, RevisionError};
use serde_json::{json, Value};
use std::sync::Arc;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o
}

fn config(json: Value) -> RevisionsConfig {
    RevisionsConfig::from_json(json.to_string().as_bytes()).unwrap()
}

fn keep(collection: &str, max_revisions: u32, max_age_ms: Option<u64>) -> RevisionsConfig {
    config(
        json!({"collections": {collection: {"max_revisions": max_revisions, "max_age_ms": max_age_ms}}}),
    )
}

fn put(db: &Database, id: &str, body: Value) -> Etag {
    db.put(id, body.to_string().as_bytes(), Condition::None)
        .unwrap()
        .etag
}

fn put_op(db: &Database, id: &str, body: Value) -> WriteOp {
    WriteOp::Put {
        id: DocId::Given(id.to_string()),
        document: db.parse_document(body.to_string().as_bytes()).unwrap(),
        condition: Condition::None,
    }
}

/// The body of a stored JSON, without `@metadata`.
fn body(json: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(json).unwrap();
    v.as_object_mut().unwrap().remove("@metadata");
    v
}

/// Every revision of `id`, newest first, read in pages of 2.
fn all(db: &Database, id: &str) -> Vec<Revision> {
    let mut out = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let page = db.revisions(id, before.as_deref(), 2).unwrap();
        out.extend(page.items);
        match page.next {
            Some(next) => before = Some(next),
            None => return out,
        }
    }
}

/// (etag, deleted, key id, body) of each revision, newest first.
type Summary = Vec<(Etag, bool, Option<String>, Value)>;

fn summary(db: &Database, id: &str) -> Summary {
    all(db, id)
        .into_iter()
        .map(|r| (r.etag, r.deleted, r.key_id, body(&r.json)))
        .collect()
}

fn fresh() -> (tempfile::TempDir, DocStore, Arc<Database>) {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    (dir, store, db)
}

#[test]
fn the_configuration_is_stored_checked_and_kept_across_a_reopen() {
    let (dir, store, db) = fresh();
    assert!(db.revisions_config().unwrap().is_empty());
    // A collection that has no documents yet is fine: it applies when they come.
    let c = config(json!({"collections": {
        "orders": {"max_revisions": 50, "max_age_ms": null},
        "not-yet": {"max_revisions": 1, "max_age_ms": 60000}}}));
    db.set_revisions_config(c.clone()).unwrap();
    assert_eq!(db.revisions_config().unwrap(), c);
    let mut bad = c.clone();
    bad.collections.get_mut("orders").unwrap().max_revisions = 0;
    assert!(matches!(
        db.set_revisions_config(bad),
        Err(DocError::Revision(RevisionError::InvalidConfig(_)))
    ));
    assert_eq!(
        db.revisions_config().unwrap(),
        c,
        "a refused config changes nothing"
    );
    drop(db);
    store.close().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("d").unwrap();
    assert_eq!(db.revisions_config().unwrap(), c);
    // ...and the write path follows the stored one after the reopen.
    put(&db, "orders/1", json!({"v": 1}));
    put(&db, "orders/1", json!({"v": 2}));
    assert_eq!(all(&db, "orders/1").len(), 1);
}

#[test]
fn puts_keep_each_previous_version_with_its_etag_in_order() {
    let (_dir, _store, db) = fresh();
    // Written before revisions were configured: its first replacement keeps it.
    let e0 = put(&db, "orders/1", json!({"v": 0}));
    db.set_revisions_config(keep("orders", 50, None)).unwrap();
    let e1 = put(&db, "orders/1", json!({"v": 1}));
    let e2 = put(&db, "orders/1", json!({"v": 2}));
    put(&db, "orders/1", json!({"v": 3}));
    put(&db, "users/1", json!({"v": 1}));
    put(&db, "users/1", json!({"v": 2}));
    let got = summary(&db, "orders/1");
    let want: Summary = vec![
        (e2, false, None, json!({"v": 2})),
        (e1, false, None, json!({"v": 1})),
        (e0, false, None, json!({"v": 0})),
    ];
    assert_eq!(got, want);
    let revs = all(&db, "orders/1");
    let stored: Value = serde_json::from_slice(&revs[0].json).unwrap();
    assert_eq!(
        stored["@metadata"]["@etag"],
        e2.to_string(),
        "the JSON as stored"
    );
    assert!(revs[0].replaced_ms >= revs[0].last_modified_ms);
    assert!(all(&db, "users/1").is_empty(), "users keeps no revisions");
    assert!(all(&db, "orders/404").is_empty());
    // One revision by etag; another database's etag or an unknown one: none.
    assert_eq!(db.revision("orders/1", e1).unwrap().unwrap().etag, e1);
    let foreign = Etag {
        incarnation: e1.incarnation ^ 1,
        ..e1
    };
    assert!(db.revision("orders/1", foreign).unwrap().is_none());
}

#[test]
fn pages_go_newest_first_and_continue_where_they_stopped() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 100, None)).unwrap();
    let etags: Vec<Etag> = (0..8).map(|i| put(&db, "c/x", json!({"i": i}))).collect();
    let first = db.revisions("c/x", None, 3).unwrap();
    let seen: Vec<Etag> = first.items.iter().map(|r| r.etag).collect();
    assert_eq!(seen, vec![etags[6], etags[5], etags[4]]);
    assert_eq!(first.next, Some(etags[4].to_string()));
    let second = db.revisions("c/x", first.next.as_deref(), 3).unwrap();
    assert_eq!(second.items[0].etag, etags[3]);
    let last = db.revisions("c/x", Some(&etags[1].to_string()), 3).unwrap();
    assert_eq!(
        (last.items.len(), last.next),
        (1, None),
        "the oldest alone, and no next"
    );
    assert_eq!(all(&db, "c/x").len(), 7);
    assert!(matches!(
        db.revisions("c/x", Some("nope"), 3),
        Err(DocError::Document(DocumentError::InvalidEtag(_)))
    ));
}

#[test]
fn revisions_are_trimmed_to_max_revisions_and_a_lower_limit_applies_at_the_next_write() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 3, None)).unwrap();
    let etags: Vec<Etag> = (0..10).map(|i| put(&db, "c/1", json!({"i": i}))).collect();
    let kept: Vec<Etag> = all(&db, "c/1").iter().map(|r| r.etag).collect();
    assert_eq!(kept, vec![etags[8], etags[7], etags[6]]);
    db.set_revisions_config(keep("c", 1, None)).unwrap();
    assert_eq!(
        all(&db, "c/1").len(),
        3,
        "kept until the document's next write"
    );
    let last = put(&db, "c/1", json!({"i": 10}));
    let kept: Vec<Etag> = all(&db, "c/1").iter().map(|r| r.etag).collect();
    assert_eq!(kept, vec![etags[9]]);
    assert_ne!(kept[0], last);
}

/// Times passed explicitly through `apply_logged` (a cluster's leader's times).
#[test]
fn revisions_replaced_longer_ago_than_max_age_are_dropped_at_the_next_write() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 100, Some(150))).unwrap();
    let t = 1_790_000_000_000u64;
    let mut etags = Vec::new();
    for (i, at_ms) in [t, t + 100, t + 200, t + 300].into_iter().enumerate() {
        let ops = vec![put_op(&db, "c/1", json!({"i": i}))];
        match db
            .apply_logged(i as u64 + 1, at_ms, ops, Atomicity::Each)
            .unwrap()
        {
            LoggedOutcome::Applied(mut r) => match r.pop() {
                Some(Ok(BatchOutcome::Put(p))) => etags.push(p.etag),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
    // Replaced at t+100 (200 ms before the last write): dropped; at t+200 and t+300: kept.
    let kept: Vec<(Etag, u64)> = all(&db, "c/1")
        .iter()
        .map(|r| (r.etag, r.replaced_ms))
        .collect();
    assert_eq!(kept, vec![(etags[2], t + 300), (etags[1], t + 200)]);
}

#[test]
fn a_delete_keeps_the_deleted_version_until_the_revisions_are_purged() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 1, None)).unwrap();
    put(&db, "c/1", json!({"v": 1}));
    let e2 = put(&db, "c/1", json!({"v": 2}));
    db.delete("c/1", Condition::None).unwrap();
    assert!(db.get("c/1").unwrap().is_none());
    let want: Summary = vec![(e2, true, None, json!({"v": 2}))];
    assert_eq!(summary(&db, "c/1"), want, "even with max_revisions 1");
    // Created again: nothing is replaced, the deleted version stays.
    let e3 = put(&db, "c/1", json!({"v": 3}));
    assert_eq!(summary(&db, "c/1"), want);
    db.set_revisions_config(keep("c", 5, None)).unwrap();
    put(&db, "c/1", json!({"v": 4}));
    let etags: Vec<(Etag, bool)> = all(&db, "c/1")
        .iter()
        .map(|r| (r.etag, r.deleted))
        .collect();
    assert_eq!(etags, vec![(e3, false), (e2, true)]);
    assert_eq!(db.purge_revisions("c/1").unwrap(), 2);
    assert!(all(&db, "c/1").is_empty());
    assert_eq!(db.purge_revisions("c/1").unwrap(), 0);
    // The count starts over: five more writes keep five.
    for i in 0..7 {
        put(&db, "c/1", json!({"i": i}));
    }
    assert_eq!(all(&db, "c/1").len(), 5);
}

#[test]
fn a_revision_is_written_back_as_a_new_version() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 10, None)).unwrap();
    let e1 = put(&db, "c/1", json!({"v": 1, "@metadata": {"tag": "first"}}));
    let e2 = put(&db, "c/1", json!({"v": 2}));
    let out = db
        .revert("c/1", e1, Condition::IfMatch(e2), Some("k".into()))
        .unwrap();
    assert!(!out.created && out.etag.sequence > e2.sequence);
    let doc = db.get("c/1").unwrap().unwrap();
    let v = doc.to_value().unwrap();
    assert_eq!(
        (v["v"].clone(), v["@metadata"]["tag"].clone()),
        (json!(1), json!("first"))
    );
    assert_eq!(v["@metadata"]["@etag"], out.etag.to_string());
    let etags: Vec<Etag> = all(&db, "c/1").iter().map(|r| r.etag).collect();
    assert_eq!(etags, vec![e2, e1]);
    // Conditional on the current etag; an unknown revision is not found.
    assert!(matches!(
        db.revert("c/1", e1, Condition::IfMatch(e2), None),
        Err(DocError::Document(DocumentError::Conflict { .. }))
    ));
    let none = Etag {
        sequence: 999,
        ..e1
    };
    assert!(matches!(
        db.revert("c/1", none, Condition::None, None),
        Err(DocError::Revision(RevisionError::NotFound { .. }))
    ));
    // A deleted document comes back from its revision.
    db.delete("c/1", Condition::None).unwrap();
    let deleted = all(&db, "c/1")[0].etag;
    db.revert("c/1", deleted, Condition::IfNotExists, None)
        .unwrap();
    assert_eq!(db.get("c/1").unwrap().unwrap().to_value().unwrap()["v"], 1);
    // The revert's key wrote the version the delete archived.
    assert_eq!(all(&db, "c/1")[0].key_id.as_deref(), Some("k"));
}

/// Each write path archives, and names the key that wrote the archived version:
/// `batch_as`, `write_each`, `write_all` (bulk), `apply_logged`, `apply_logged_run`.
#[test]
fn every_write_path_keeps_revisions_with_the_writers_key() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 100, None)).unwrap();
    let batch = |key: &str, v: i32| {
        let op = BatchOp::Put {
            id: DocId::Given("c/1".into()),
            document: json!({"v": v}),
            condition: Condition::None,
        };
        db.batch_as(vec![op], Some(key.into())).unwrap();
    };
    batch("k1", 1);
    let by = |key: &str, v: i32| put_op(&db, "c/1", json!({"v": v})).attributed(Some(key.into()));
    db.write_each(vec![by("k2", 2)]).pop().unwrap().unwrap();
    db.write_all(vec![by("k3", 3)]).unwrap();
    db.apply_logged(1, 0, vec![by("k4", 4)], Atomicity::AllOrNone)
        .unwrap();
    let run = |index: u64, key: &str, v: i32| LoggedEntry {
        log_index: index,
        at_ms: 0,
        ops: vec![by(key, v)],
    };
    db.apply_logged_run(vec![run(2, "k5", 5), run(3, "k6", 6)])
        .unwrap();
    db.delete("c/1", Condition::None).unwrap();
    let got: Vec<(Option<String>, Value, bool)> = all(&db, "c/1")
        .into_iter()
        .map(|r| (r.key_id, body(&r.json), r.deleted))
        .collect();
    let want: Vec<(Option<String>, Value, bool)> = (1..=6)
        .rev()
        .map(|v| (Some(format!("k{v}")), json!({"v": v}), v == 6))
        .collect();
    assert_eq!(got, want);
}

/// A version written while revisions were off has no known writer: it never takes
/// the key of the version before it.
#[test]
fn a_version_written_while_revisions_were_off_has_no_writer() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 10, None)).unwrap();
    let by = |key: &str, v: i32| put_op(&db, "c/1", json!({"v": v})).attributed(Some(key.into()));
    db.write_each(vec![by("k1", 1)]).pop().unwrap().unwrap();
    db.set_revisions_config(RevisionsConfig::default()).unwrap();
    db.write_each(vec![by("k2", 2)]).pop().unwrap().unwrap();
    db.set_revisions_config(keep("c", 10, None)).unwrap();
    put(&db, "c/1", json!({"v": 3}));
    let got: Vec<(Option<String>, Value)> = all(&db, "c/1")
        .into_iter()
        .map(|r| (r.key_id, body(&r.json)))
        .collect();
    assert_eq!(got, vec![(None, json!({"v": 2}))]);
}

/// Two stores that apply the same log (configuration, writes, a purge) hold the
/// same revisions; an entry applied again changes nothing.
#[test]
fn the_same_log_gives_the_same_revisions_and_is_applied_once() {
    let apply = |db: &Database| {
        assert!(db
            .set_revisions_config_logged(1, keep("c", 2, None))
            .unwrap());
        for i in 0..5u64 {
            let ops = vec![put_op(db, "c/1", json!({"i": i})).attributed(Some(format!("k{i}")))];
            db.apply_logged(2 + i, 1_000 + i, ops, Atomicity::Each)
                .unwrap();
        }
        assert_eq!(db.purge_revisions_logged(7, "c/1").unwrap(), Some(2));
        let ops = vec![put_op(db, "c/1", json!({"i": 9}))];
        db.apply_logged(8, 2_000, ops, Atomicity::Each).unwrap();
        // Applied before: skipped (a purge again would remove the new revision).
        assert_eq!(db.purge_revisions_logged(7, "c/1").unwrap(), None);
        assert!(!db
            .set_revisions_config_logged(1, RevisionsConfig::default())
            .unwrap());
        all(db, "c/1")
    };
    let (_a_dir, _a_store, a) = fresh();
    let (_b_dir, _b_store, b) = fresh();
    let (ra, rb) = (apply(&a), apply(&b));
    assert_eq!(ra.len(), 1);
    assert_eq!(
        (ra[0].key_id.as_deref(), body(&ra[0].json)),
        (Some("k4"), json!({"i": 4}))
    );
    let strip = |r: &[Revision]| -> Vec<(u64, u64, u64, bool, Option<String>, Value)> {
        r.iter()
            .map(|r| {
                let s = (
                    r.etag.sequence,
                    r.last_modified_ms,
                    r.replaced_ms,
                    r.deleted,
                );
                (s.0, s.1, s.2, s.3, r.key_id.clone(), body(&r.json))
            })
            .collect()
    };
    assert_eq!(strip(&ra), strip(&rb));
    assert_eq!(a.revisions_config().unwrap(), keep("c", 2, None));
}

fn restore(files: &[&Vec<u8>]) -> (tempfile::TempDir, DocStore, Arc<Database>) {
    let dir = tempfile::tempdir().unwrap();
    let source = kiln_docs::RestoreSource::Files(
        files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let reader = Box::new(std::io::Cursor::new((*f).clone())) as Box<dyn std::io::Read>;
                (format!("file{i}"), reader)
            })
            .collect(),
    );
    kiln_docs::restore_database(
        source,
        dir.path(),
        "copy",
        options().storage,
        false,
        kiln_docs::RestorePoint::Latest,
        |_| {},
    )
    .unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("copy").unwrap();
    (dir, store, db)
}

/// A full backup carries the revisions and the configuration (they are trees of
/// the database); an increment's replay keeps revisions for the writes it replays
/// (without their writers' keys, which the backup history does not hold).
#[test]
fn a_restored_backup_has_the_revisions() {
    let (_dir, _store, db) = fresh();
    db.set_revisions_config(keep("c", 10, None)).unwrap();
    let by = |v: i32| put_op(&db, "c/1", json!({"v": v})).attributed(Some("k".into()));
    for v in 0..3 {
        db.write_each(vec![by(v)]).pop().unwrap().unwrap();
    }
    put(&db, "c/2", json!({"gone": true}));
    db.delete("c/2", Condition::None).unwrap();
    let mut full = Vec::new();
    db.backup_full_to(&mut full, Default::default(), true, |_| {})
        .unwrap();
    let (_r_dir, _r_store, copy) = restore(&[&full]);
    assert_eq!(
        copy.revisions_config().unwrap(),
        db.revisions_config().unwrap()
    );
    assert_eq!(summary(&copy, "c/1"), summary(&db, "c/1"));
    assert_eq!(summary(&copy, "c/2"), summary(&db, "c/2"));
    assert_eq!(summary(&copy, "c/1")[0].2.as_deref(), Some("k"));
    // Writes after the full backup, carried by an increment.
    db.write_each(vec![by(3)]).pop().unwrap().unwrap();
    db.delete("c/1", Condition::None).unwrap();
    let mut inc = Vec::new();
    let base = kiln_docs::read_manifest(&full[..]).unwrap();
    db.backup_incremental_to(&mut inc, &base, Default::default(), |_| {})
        .unwrap();
    let (_i_dir, _i_store, copy) = restore(&[&full, &inc]);
    let keyless = |s: Summary| -> Vec<(Etag, bool, Value)> {
        s.into_iter().map(|(e, d, _, b)| (e, d, b)).collect()
    };
    assert_eq!(keyless(summary(&copy, "c/1")), keyless(summary(&db, "c/1")));
    assert_eq!(summary(&copy, "c/1").len(), 4);
}
