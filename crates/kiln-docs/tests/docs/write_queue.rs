//! The write queue under concurrent writers: independent writes to two databases
//! and all-or-nothing jobs mixed in all complete, whichever worker gathers them
//! (one worker at a time gathers a database's independent writes; the others are
//! woken only for what it would not take).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{BatchOutcome, Condition, DocId, DocStore, DocsOptions, WriteOp};
use std::sync::Arc;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o
}

#[test]
fn concurrent_writes_to_two_databases_all_complete() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(DocStore::open(dir.path(), options()).unwrap());
    let dbs = [
        store.create_database("a").unwrap(),
        store.create_database("b").unwrap(),
    ];
    let put = |db: &kiln_docs::Database, id: String| WriteOp::Put {
        id: DocId::Given(id),
        document: db.parse_document(br#"{"n":1}"#).unwrap(),
        condition: Condition::None,
    };
    let threads = 16;
    let per_thread = 50;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, dbs) = (&store, &dbs);
            s.spawn(move || {
                for i in 0..per_thread {
                    let db = &dbs[(t + i) % 2];
                    if i % 10 == 9 {
                        // An all-or-nothing job among the independent writes.
                        let (tx, rx) = std::sync::mpsc::channel();
                        let ops = vec![
                            put(db, format!("all/{t}-{i}-x")),
                            put(db, format!("all/{t}-{i}-y")),
                        ];
                        store
                            .writes()
                            .write_all(db.clone(), ops, move |r| tx.send(r).unwrap())
                            .unwrap();
                        assert_eq!(rx.recv().unwrap().unwrap().len(), 2);
                    } else {
                        let out = store
                            .writes()
                            .write_blocking(db.clone(), put(db, format!("one/{t}-{i}")))
                            .unwrap();
                        assert!(matches!(out, BatchOutcome::Put(p) if p.created));
                    }
                }
            });
        }
    });
    let singles = threads * per_thread * 9 / 10;
    let alls = threads * per_thread / 10;
    let total: u64 = dbs.iter().map(|d| d.document_count().unwrap()).sum();
    assert_eq!(total, (singles + 2 * alls) as u64);
    assert_eq!(store.writes().queued(), 0);
}
