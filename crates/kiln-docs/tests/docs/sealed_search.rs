//! Full-text indexes of an encrypted database (`search/directory.rs`): every file
//! tantivy writes is sealed (no term, stored id or commit payload in clear, while
//! the same index of a plain database shows them), answers are the same, a reopen
//! resumes from the sealed commit, a backup ships the index and a restore seals it
//! again under the restored database's own key (resumed, not rebuilt), and a
//! damaged file is rebuilt from the documents rather than answering wrong.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    Condition, DocStore, DocsOptions, IndexDefinition, IndexField, QueryOptions, RestorePoint,
    RestoreSource,
};
use kiln_storage::MasterKey;
use serde_json::{json, Map};
use std::path::{Path, PathBuf};

const INDEX: &str = "notes_text";
/// A word only the documents hold: in a plain index it is a term in the
/// dictionary and part of stored ids.
const MARKER: &str = "zephyrquartzite";

fn options(key: Option<&MasterKey>) -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.indexing.min_batch = 8;
    o.indexing.max_batch = 64;
    o.storage.encryption = key.cloned();
    o
}

fn def() -> IndexDefinition {
    IndexDefinition {
        name: INDEX.into(),
        collection: Some("notes".into()),
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

/// Writes `n` notes, every third holding the marker; returns how many do.
fn fill(db: &kiln_docs::Database, n: usize) -> u64 {
    let mut marked = 0;
    for i in 0..n {
        let body = if i % 3 == 0 {
            marked += 1;
            format!("the {MARKER} journal entry {i}")
        } else {
            format!("a garden path numbered {i}")
        };
        db.put(
            &format!("notes/{MARKER}-{i}"),
            json!({"body": body, "@metadata": {"@collection": "notes"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    marked
}

fn count(db: &kiln_docs::Database, word: &str) -> u64 {
    let r = db
        .query(
            &format!("from notes where search(body, '{word}')"),
            &Map::new(),
            QueryOptions {
                wait_for_non_stale_ms: 20_000,
            },
        )
        .unwrap();
    assert!(!r.stale);
    r.total
}

fn opened_at(db: &kiln_docs::Database) -> u64 {
    db.index_info(INDEX)
        .unwrap()
        .opened_at_etag
        .map_or(0, |e| e.sequence)
}

/// Every file under `dir`, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            out.push((p, bytes));
        }
    }
    out
}

fn marker_files(search_dir: &Path) -> Vec<PathBuf> {
    files_under(search_dir)
        .into_iter()
        .filter(|(_, b)| b.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()))
        .map(|(p, _)| p)
        .collect()
}

#[test]
fn an_encrypted_databases_full_text_index_is_sealed_and_survives_reopen_and_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();

    // Control: the plain index shows the marker in its files.
    let plain_dir = tmp.path().join("plain");
    let plain = DocStore::open(&plain_dir, options(None)).unwrap();
    let db = plain.create_database("n").unwrap();
    db.define_index(def()).unwrap();
    let marked = fill(&db, 90);
    assert_eq!(count(&db, MARKER), marked);
    let plain_search = db.dir().join("search");
    drop(db);
    plain.close().unwrap();
    assert!(!marker_files(&plain_search).is_empty());

    // The encrypted one: same answers, nothing in clear.
    let dir = tmp.path().join("enc");
    let store = DocStore::open(&dir, options(Some(&key))).unwrap();
    let db = store.create_database("n").unwrap();
    db.define_index(def()).unwrap();
    assert_eq!(fill(&db, 90), marked);
    assert_eq!(count(&db, MARKER), marked);
    assert_eq!(count(&db, "gardens"), 90 - marked);
    let search_dir = db.dir().join("search");
    let mut full = Vec::new();
    let report = db
        .backup_full_to(&mut full, Default::default(), false, |_| {})
        .unwrap();
    assert!(report.search_files >= 2, "{report:?}");
    drop(db);
    store.close().unwrap();
    assert!(files_under(&search_dir).len() >= 3);
    assert_eq!(marker_files(&search_dir), Vec::<PathBuf>::new());
    assert!(!full.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()));

    // Reopened: the sealed commit is resumed, not rebuilt.
    let store = DocStore::open(&dir, options(Some(&key))).unwrap();
    let db = store.database("n").unwrap();
    assert!(opened_at(&db) > 0, "the index was rebuilt");
    assert_eq!(count(&db, MARKER), marked);
    drop(db);
    store.close().unwrap();

    // Restored elsewhere (a new database, its own data key): the index files are
    // sealed again under it and resumed.
    let copy = tmp.path().join("copy");
    let files = vec![(
        "full".to_string(),
        Box::new(std::io::Cursor::new(full)) as Box<dyn std::io::Read>,
    )];
    kiln_docs::restore_database(
        RestoreSource::Files(files),
        &copy,
        "c",
        options(Some(&key)).storage,
        false,
        RestorePoint::Latest,
        |_| {},
    )
    .unwrap();
    let store = DocStore::open(&copy, options(Some(&key))).unwrap();
    let db = store.database("c").unwrap();
    assert!(opened_at(&db) > 0, "the restored index was rebuilt");
    assert_eq!(count(&db, MARKER), marked);
    let copy_search = db.dir().join("search");
    drop(db);
    store.close().unwrap();
    assert_eq!(marker_files(&copy_search), Vec::<PathBuf>::new());

    // A flipped bit in the largest file's last chunk: the index does not open, is
    // rebuilt from the documents, and answers right.
    let (largest, mut bytes) = files_under(&search_dir)
        .into_iter()
        .max_by_key(|(_, b)| b.len())
        .unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x20;
    std::fs::write(&largest, bytes).unwrap();
    let store = DocStore::open(&dir, options(Some(&key))).unwrap();
    let db = store.database("n").unwrap();
    assert_eq!(opened_at(&db), 0, "a damaged index must be rebuilt");
    assert_eq!(count(&db, MARKER), marked);
    drop(db);
    store.close().unwrap();
}
