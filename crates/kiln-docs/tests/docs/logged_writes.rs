//! Writes from a replicated log (`Database::apply_logged`): two stores that apply
//! the same entries end with the same documents, etags and times; an entry is
//! never applied twice, across a reopen too; an all-or-none entry that fails
//! writes nothing on any node.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    Atomicity, BatchOutcome, Condition, Database, DocId, DocStore, DocsOptions, Etag,
    LoggedOutcome, WriteOp,
};
use std::path::Path;

const INCARNATION: u32 = 0x5eed_0001;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o
}

fn put(db: &Database, id: &str, json: &str, condition: Condition) -> WriteOp {
    WriteOp::Put {
        id: DocId::Given(id.to_string()),
        document: db.parse_document(json.as_bytes()).unwrap(),
        condition,
    }
}

/// One log entry: its index, the leader's time, and how to build its writes
/// (parsing needs the database).
struct Entry {
    index: u64,
    at_ms: u64,
    atomicity: Atomicity,
    ops: fn(&Database) -> Vec<WriteOp>,
}

fn log() -> Vec<Entry> {
    let at = 1_790_000_000_000;
    vec![
        Entry {
            index: 3,
            at_ms: at,
            atomicity: Atomicity::Each,
            ops: |db| vec![put(db, "users/1", r#"{"name":"ada"}"#, Condition::None)],
        },
        Entry {
            index: 4,
            at_ms: at + 5,
            atomicity: Atomicity::Each,
            ops: |db| {
                vec![
                    put(db, "users/2", r#"{"name":"bob"}"#, Condition::IfNotExists),
                    // Fails (exists), alone.
                    put(db, "users/1", r#"{"name":"eve"}"#, Condition::IfNotExists),
                ]
            },
        },
        Entry {
            index: 7,
            at_ms: at + 9,
            atomicity: Atomicity::AllOrNone,
            ops: |db| {
                vec![
                    put(db, "users/3", r#"{"name":"cy"}"#, Condition::None),
                    // Fails: the whole entry writes nothing.
                    put(
                        db,
                        "users/2",
                        r#"{"name":"x"}"#,
                        Condition::IfMatch(Etag {
                            incarnation: INCARNATION,
                            sequence: 999,
                        }),
                    ),
                ]
            },
        },
        Entry {
            index: 8,
            at_ms: at + 9,
            atomicity: Atomicity::AllOrNone,
            ops: |db| {
                vec![
                    put(db, "users/4", r#"{"name":"dee"}"#, Condition::None),
                    WriteOp::Delete {
                        id: "users/2".into(),
                        condition: Condition::IfExists,
                    },
                ]
            },
        },
    ]
}

/// Applies the log to a new store at `dir`; the outcome of each entry as text.
fn apply_all(db: &Database) -> Vec<String> {
    log()
        .iter()
        .map(|e| {
            let out = db
                .apply_logged(e.index, e.at_ms, (e.ops)(db), e.atomicity)
                .unwrap();
            describe(&out)
        })
        .collect()
}

fn describe(out: &LoggedOutcome) -> String {
    match out {
        LoggedOutcome::AlreadyApplied => "already applied".into(),
        LoggedOutcome::Applied(results) => results
            .iter()
            .map(|r| match r {
                Ok(BatchOutcome::Put(p)) => {
                    format!("put {} {} {}", p.id, p.etag, p.last_modified_ms)
                }
                Ok(BatchOutcome::Delete(d)) => format!("delete {d:?}"),
                Err(e) => format!("error {e}"),
            })
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// Every document as (id, etag, last-modified, body).
fn contents(db: &Database) -> Vec<String> {
    (1..=4)
        .filter_map(|i| db.get(&format!("users/{i}")).unwrap())
        .map(|d| format!("{d:?}"))
        .collect()
}

fn open_node(dir: &Path) -> (DocStore, std::sync::Arc<Database>) {
    let store = DocStore::open(dir, options()).unwrap();
    let db = match store.database("shop") {
        Ok(db) => db,
        Err(_) => store
            .create_database_with_incarnation("shop", INCARNATION)
            .unwrap(),
    };
    (store, db)
}

#[test]
fn two_nodes_applying_one_log_agree_and_no_entry_applies_twice() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a_store, a) = open_node(a_dir.path());
    let (b_store, b) = open_node(b_dir.path());
    let a_out = apply_all(&a);
    let b_out = apply_all(&b);
    assert_eq!(a_out, b_out);
    assert_eq!(contents(&a), contents(&b));
    // What each entry did, as a client would have been told.
    assert!(
        a_out[0].starts_with(&format!("put users/1 1-{INCARNATION:08x} 1790000000000")),
        "{a_out:?}"
    );
    assert!(
        a_out[1].contains("put users/2 2-") && a_out[1].contains("error"),
        "{a_out:?}"
    );
    assert!(
        a_out[2].starts_with("error") && !a_out[2].contains(';'),
        "{a_out:?}"
    );
    assert!(
        a_out[3].contains("put users/4 3-") && a_out[3].contains("delete"),
        "{a_out:?}"
    );
    assert!(
        a.get("users/3").unwrap().is_none(),
        "a failed all-or-none entry wrote"
    );
    assert_eq!(a.applied_log_index().unwrap(), 8);

    // Again, now and after a reopen: every entry is recognised (the failed one
    // too: a later one is applied), nothing moves.
    let before = contents(&a);
    let all_recognised = |out: Vec<String>| out.iter().all(|o| o == "already applied");
    assert!(all_recognised(apply_all(&a)));
    drop(a);
    a_store.close().unwrap();
    let (_a_store, a) = open_node(a_dir.path());
    assert!(all_recognised(apply_all(&a)));
    assert_eq!(contents(&a), before);
    assert_eq!(contents(&a), contents(&b));
    drop(b);
    b_store.close().unwrap();
}

/// Entries applied in runs (one transaction each, as a cluster's leader applies a
/// batch) give what applying them one by one gives: outcomes, documents, etags
/// and times; a run applied again is recognised entry by entry.
#[test]
fn runs_of_entries_equal_entries_one_by_one() {
    use kiln_docs::LoggedEntry;
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_a_store, a) = open_node(a_dir.path());
    let (_b_store, b) = open_node(b_dir.path());
    // 60 entries over 10 documents: creations, replacements, conditional writes
    // that fail (IfNotExists on an existing one), deletes; times that go back.
    let entry = |db: &Database, i: u64| -> LoggedEntry {
        let id = format!("users/{}", i % 10);
        let ops = match i % 4 {
            0 | 1 => vec![put(db, &id, &format!(r#"{{"i":{i}}}"#), Condition::None)],
            2 => vec![
                put(db, &id, r#"{"created":true}"#, Condition::IfNotExists),
                put(db, &format!("other/{i}"), "{}", Condition::None),
            ],
            _ => vec![WriteOp::Delete {
                id,
                condition: Condition::IfExists,
            }],
        };
        LoggedEntry {
            log_index: 10 + i,
            at_ms: 1_790_000_000_000 + (i * 7919) % 100,
            ops,
        }
    };
    let one_by_one: Vec<String> = (0..60)
        .map(|i| {
            let e = entry(&a, i);
            describe(
                &a.apply_logged(e.log_index, e.at_ms, e.ops, Atomicity::Each)
                    .unwrap(),
            )
        })
        .collect();
    let mut in_runs = Vec::new();
    let mut i = 0;
    for len in [1u64, 7, 2, 13, 5, 20, 12] {
        let run: Vec<LoggedEntry> = (i..i + len).map(|i| entry(&b, i)).collect();
        in_runs.extend(b.apply_logged_run(run).unwrap().iter().map(describe));
        i += len;
    }
    assert_eq!(i, 60);
    assert_eq!(in_runs, one_by_one);
    let contents = |db: &Database| -> Vec<String> {
        (0..10)
            .map(|i| format!("users/{i}"))
            .chain((0..60).map(|i| format!("other/{i}")))
            .map(|id| format!("{:?}", db.get(&id).unwrap()))
            .collect()
    };
    assert_eq!(contents(&a), contents(&b));
    assert_eq!(b.applied_log_index().unwrap(), 69);
    // Again: every entry recognised, nothing moves.
    let again = b
        .apply_logged_run((0..60).map(|i| entry(&b, i)).collect())
        .unwrap();
    assert!(again
        .iter()
        .all(|o| matches!(o, LoggedOutcome::AlreadyApplied)));
    assert_eq!(contents(&a), contents(&b));
}

/// A restore for a cluster's log entry (`DocStore::restore_database_logged`): the
/// restored database records that entry as its last applied, even when the
/// backup came from a log further on (another cluster's), so the entries after
/// it are applied, not skipped as seen.
#[test]
fn a_logged_restore_takes_its_entrys_index_whatever_the_backup_held() {
    let dir = tempfile::tempdir().unwrap();
    let source = DocStore::open(dir.path().join("a"), options()).unwrap();
    let db = source
        .create_database_with_incarnation("s", INCARNATION)
        .unwrap();
    let ops = vec![put(&db, "users/1", r#"{"name":"ada"}"#, Condition::None)];
    db.apply_logged(1_000, 1, ops, Atomicity::Each).unwrap();
    assert_eq!(db.applied_log_index().unwrap(), 1_000);
    let mut backup = Vec::new();
    db.backup_to(&mut backup, Default::default(), |_| {})
        .unwrap();
    drop(db);
    source.close().unwrap();

    let target = DocStore::open(dir.path().join("b"), options()).unwrap();
    let source = kiln_docs::RestoreSource::Stream(Box::new(std::io::Cursor::new(backup)));
    target
        .restore_database_logged(source, "s", kiln_docs::RestorePoint::Latest, 5)
        .unwrap();
    let db = target.database("s").unwrap();
    assert_eq!(db.applied_log_index().unwrap(), 5);
    assert!(db.get("users/1").unwrap().is_some());
    let ops = vec![put(&db, "users/2", r#"{"name":"bob"}"#, Condition::None)];
    let applied = db.apply_logged(6, 2, ops, Atomicity::Each).unwrap();
    assert!(
        matches!(applied, LoggedOutcome::Applied(_)),
        "entry 6 after the restore was skipped"
    );
    assert!(db.get("users/2").unwrap().is_some());
}

/// A leader whose clock runs ahead stamps an entry whose only write fails (a
/// conflict: nothing is written, but the entry moves the write clock); the next
/// leader's clock is behind. A node that reopened its database between the two
/// must give the later write the same time as one that did not: the clock is
/// stored with the entry, not only kept in memory.
#[test]
fn a_reopen_between_entries_keeps_the_write_clock() {
    let at = 1_790_000_000_000;
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let entries: [(u64, u64, &str, Condition); 3] = [
        (1, at, "users/1", Condition::None),
        // Ten seconds ahead, and a conflict: nothing is written.
        (2, at + 10_000, "users/1", Condition::IfNotExists),
        // Twenty seconds behind that.
        (3, at - 10_000, "users/2", Condition::None),
    ];
    let apply = |db: &Database, (index, at_ms, id, condition): &(u64, u64, &str, Condition)| {
        let op = put(db, id, r#"{"v": 1}"#, *condition);
        describe(
            &db.apply_logged(*index, *at_ms, vec![op], Atomicity::Each)
                .unwrap(),
        )
    };
    let (_a_store, a) = open_node(a_dir.path());
    let a_out: Vec<String> = entries.iter().map(|e| apply(&a, e)).collect();
    let (b_store, b) = open_node(b_dir.path());
    let mut b_out: Vec<String> = entries[..2].iter().map(|e| apply(&b, e)).collect();
    drop(b);
    b_store.close().unwrap();
    let (_b_store, b) = open_node(b_dir.path());
    b_out.push(apply(&b, &entries[2]));
    assert!(a_out[1].starts_with("error"), "{a_out:?}");
    assert!(
        a_out[2].ends_with(&format!(" {}", at + 10_000)),
        "the write after the conflict took the clock's time: {a_out:?}"
    );
    assert_eq!(
        a_out, b_out,
        "the node that reopened its database disagrees"
    );
    assert_eq!(contents(&a), contents(&b));
}
