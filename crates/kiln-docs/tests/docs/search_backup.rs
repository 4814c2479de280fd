//! Full-text indexes inside backups (`search/backup.rs`): a restore resumes each
//! index from the tantivy commit the full backup carries (at or below the backup's
//! point) and indexes only the changes after it: the increments' writes replayed,
//! the writes after the restore. A commit ahead of the restored state (what a point
//! below the shipped commit would give), damaged search files, and a backup without
//! any (an older Kiln's) are rebuilt from the first change, with correct answers.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    Condition, DocStore, DocsOptions, IndexDefinition, IndexField, QueryOptions, RestorePoint,
    RestoreSource,
};
use kiln_storage::backup::{read_container, Item};
use kiln_storage::ContainerWriter;
use serde_json::{json, Map};
use std::collections::BTreeMap;
use std::path::Path;

const INDEX: &str = "posts_text";

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o.indexing.min_batch = 8;
    o.indexing.max_batch = 64;
    o
}

fn search_def() -> IndexDefinition {
    IndexDefinition {
        name: INDEX.into(),
        collection: Some("posts".into()),
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

/// The documents as a model: id -> body.
type Model = BTreeMap<String, String>;

fn put(db: &kiln_docs::Database, model: &mut Model, i: usize, body: &str) -> u64 {
    let id = format!("posts/{i}");
    let out = db
        .put(
            &id,
            json!({"body": body, "@metadata": {"@collection": "posts"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    model.insert(id, body.to_string());
    out.etag.sequence
}

fn body(i: usize) -> &'static str {
    if i.is_multiple_of(4) {
        "durable journal"
    } else {
        "garden path"
    }
}

/// Documents matching `journals` (stemmed to `journal`), per the model.
fn expected(model: &Model) -> u64 {
    model.values().filter(|b| b.contains("journal")).count() as u64
}

fn count(db: &kiln_docs::Database) -> u64 {
    let r = db
        .query(
            "from posts where search(body, 'journals')",
            &Map::new(),
            QueryOptions {
                wait_for_non_stale_ms: 20_000,
            },
        )
        .unwrap();
    assert!(!r.stale);
    r.total
}

fn restore(backups: &[&Vec<u8>], out: &Path, name: &str, point: RestorePoint) {
    let files = backups
        .iter()
        .enumerate()
        .map(|(i, b)| {
            (
                format!("backup {i}"),
                Box::new(std::io::Cursor::new((*b).clone())) as Box<dyn std::io::Read>,
            )
        })
        .collect();
    kiln_docs::restore_database(
        RestoreSource::Files(files),
        out,
        name,
        options().storage,
        false,
        point,
        |_| {},
    )
    .unwrap();
}

/// The sequence the index's commit covered when the database opened (0: built
/// from the first change).
fn opened_at(db: &kiln_docs::Database) -> u64 {
    db.index_info(INDEX)
        .unwrap()
        .opened_at_etag
        .map_or(0, |e| e.sequence)
}

#[test]
fn a_restore_resumes_the_full_text_index_from_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("b").unwrap();
    db.define_index(search_def()).unwrap();
    let mut model = Model::new();
    let mut indexed_seq = 0;
    for i in 0..300 {
        indexed_seq = put(&db, &mut model, i, body(i));
    }
    assert_eq!(count(&db), expected(&model));
    // Written right before the backup, without waiting: the commit carried may
    // cover them or not; the restore must index whatever it lacks.
    for i in 300..320 {
        put(&db, &mut model, i, body(i));
    }
    let mut full = Vec::new();
    let full_report = db
        .backup_full_to(&mut full, Default::default(), true, |_| {})
        .unwrap();
    assert!(full_report.search_files >= 2, "{full_report:?}");
    assert_eq!(full_report.attachment_blobs, 0);
    let full_seq = {
        let e = full_report.manifest.etag.clone().unwrap();
        kiln_docs::Etag::parse(&e).unwrap().sequence
    };
    let full_model = model.clone();
    // After the full backup: new documents, an update, a delete (the increment).
    let mut middle = (0, Model::new());
    for i in 320..360 {
        let seq = put(&db, &mut model, i, body(i));
        if i == 339 {
            middle = (seq, model.clone());
        }
    }
    put(&db, &mut model, 0, "garden");
    db.delete("posts/4", Condition::None).unwrap();
    model.remove("posts/4");
    let mut inc = Vec::new();
    db.backup_incremental_to(&mut inc, &full_report.manifest, Default::default(), |_| {})
        .unwrap();
    let incarnation = db
        .index_info(INDEX)
        .unwrap()
        .database_etag
        .unwrap()
        .incarnation;
    drop(db);
    store.close().unwrap();

    // A verify reads the search files without placing them anywhere.
    let files = vec![
        (
            "full".to_string(),
            Box::new(std::io::Cursor::new(full.clone())) as Box<dyn std::io::Read>,
        ),
        (
            "inc".to_string(),
            Box::new(std::io::Cursor::new(inc.clone())) as Box<dyn std::io::Read>,
        ),
    ];
    let chain = kiln_docs::verify_chain(RestoreSource::Files(files), |_| {}).unwrap();
    assert_eq!(chain.backups[0].search_files, full_report.search_files);

    let out = tempfile::tempdir().unwrap();
    restore(&[&full, &inc], out.path(), "latest", RestorePoint::Latest);
    let point = kiln_docs::Etag {
        incarnation,
        sequence: middle.0,
    };
    restore(
        &[&full, &inc],
        out.path(),
        "middle",
        RestorePoint::Etag(point.to_string()),
    );
    restore(&[&full], out.path(), "full", RestorePoint::Latest);
    let store = DocStore::open(out.path(), options()).unwrap();
    for (name, want) in [
        ("latest", &model),
        ("middle", &middle.1),
        ("full", &full_model),
    ] {
        let db = store.database(name).unwrap();
        let at = opened_at(&db);
        assert!(
            at >= indexed_seq && at <= full_seq,
            "{name}: the index resumed from sequence {at}, not from the commit carried \
             (at or below the backup's point, {full_seq})"
        );
        assert_eq!(count(&db), expected(want), "{name}");
        // A write after the restore is indexed too.
        let mut after = want.clone();
        put(&db, &mut after, 10_000, "another journal");
        assert_eq!(count(&db), expected(&after), "{name}: after a write");
    }
    store.close().unwrap();
}

/// Builds a database with the index, returns its full backup and its model.
fn backup_of(dir: &Path, n: usize) -> (Vec<u8>, Model) {
    let store = DocStore::open(dir, options()).unwrap();
    let db = store.create_database("b").unwrap();
    db.define_index(search_def()).unwrap();
    let mut model = Model::new();
    for i in 0..n {
        put(&db, &mut model, i, body(i));
    }
    assert_eq!(count(&db), expected(&model));
    let mut full = Vec::new();
    let report = db.backup_to(&mut full, Default::default(), |_| {}).unwrap();
    assert!(report.search_files >= 2);
    drop(db);
    store.close().unwrap();
    (full, model)
}

#[test]
fn a_commit_ahead_of_the_restored_state_is_rebuilt() {
    // What a restore to a point below the carried commit would find (a restore
    // cannot go below its full backup's point, which the commit never exceeds):
    // the restored index directory replaced by the source's, which covers more.
    let dir = tempfile::tempdir().unwrap();
    let (full, model) = backup_of(dir.path(), 100);
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("b").unwrap();
    let mut later = model.clone();
    for i in 100..200 {
        put(&db, &mut later, i, "journal only");
    }
    assert_eq!(count(&db), expected(&later));
    let src_search = db.dir().join("search");
    drop(db);
    store.close().unwrap();

    let out = tempfile::tempdir().unwrap();
    restore(&[&full], out.path(), "copy", RestorePoint::Latest);
    let dst_search = out.path().join("databases").join("copy").join("search");
    std::fs::remove_dir_all(&dst_search).unwrap();
    copy_dir(&src_search, &dst_search);
    let store = DocStore::open(out.path(), options()).unwrap();
    let db = store.database("copy").unwrap();
    assert_eq!(
        opened_at(&db),
        0,
        "an index ahead of the database is rebuilt"
    );
    assert_eq!(count(&db), expected(&model));
    drop(db);
    store.close().unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A copy of a backup whose extra files pass through `edit` (`None` drops one),
/// written as a valid container (its own checksums are right).
fn rewrite(backup: &[u8], mut edit: impl FnMut(&str, Vec<u8>) -> Option<Vec<u8>>) -> Vec<u8> {
    enum Part {
        Tree(String, Vec<(Vec<u8>, Vec<u8>)>),
        File(String, Vec<u8>),
    }
    let mut parts: Vec<Part> = Vec::new();
    let sum = read_container(
        backup,
        false,
        |_| {},
        |_, item| {
            match item {
                Item::Header => {}
                Item::Tree(name) => parts.push(Part::Tree(name.to_string(), Vec::new())),
                Item::Entry(k, v) => {
                    if let Some(Part::Tree(_, entries)) = parts.last_mut() {
                        entries.push((k.to_vec(), v.to_vec()));
                    }
                }
                Item::EndTree | Item::FileEnd => {}
                Item::File { name, .. } => parts.push(Part::File(name.to_string(), Vec::new())),
                Item::FileData(bytes) => {
                    if let Some(Part::File(_, data)) = parts.last_mut() {
                        data.extend_from_slice(bytes);
                    }
                }
            }
            Ok(())
        },
    )
    .unwrap();
    let mut out = Vec::new();
    let mut w =
        ContainerWriter::new(&mut out, sum.txn_id, &sum.meta, Default::default(), |_| {}).unwrap();
    for p in parts {
        match p {
            Part::Tree(name, entries) => {
                w.begin_tree(&name).unwrap();
                for (k, v) in entries {
                    w.entry(&k, &v).unwrap();
                }
                w.end_tree().unwrap();
            }
            Part::File(name, data) => {
                if let Some(data) = edit(&name, data) {
                    w.file(&name, data.len() as u64, &mut data.as_slice())
                        .unwrap();
                }
            }
        }
    }
    w.finish().unwrap();
    out
}

#[test]
fn damaged_or_missing_search_files_are_rebuilt_and_the_data_restores() {
    let dir = tempfile::tempdir().unwrap();
    let (full, model) = backup_of(dir.path(), 200);
    // The largest segment file with one byte flipped (its tantivy checksum fails).
    let mut largest = (String::new(), 0);
    rewrite(&full, |name, data| {
        if name.starts_with("search/") && !name.ends_with("meta.json") && data.len() > largest.1 {
            largest = (name.to_string(), data.len());
        }
        Some(data)
    });
    assert!(!largest.0.is_empty());
    let damaged = rewrite(&full, |name, mut data| {
        if name == largest.0 {
            let mid = data.len() / 2;
            data[mid] ^= 0x55;
        }
        Some(data)
    });
    // meta.json that is not JSON.
    let bad_meta = rewrite(&full, |name, data| {
        Some(if name.ends_with("/meta.json") {
            b"{not json".to_vec()
        } else {
            data
        })
    });
    // A segment file missing (meta.json names it).
    let missing = rewrite(&full, |name, data| (name != largest.0).then_some(data));
    // An older Kiln's backup: no search files at all.
    let older = rewrite(&full, |name, data| {
        (!name.starts_with("search/")).then_some(data)
    });
    // The rewrite itself keeps a good backup good.
    let same = rewrite(&full, |_, data| Some(data));

    let out = tempfile::tempdir().unwrap();
    let cases = [
        ("damaged", &damaged, false),
        ("bad_meta", &bad_meta, false),
        ("missing", &missing, false),
        ("older", &older, false),
        ("same", &same, true),
    ];
    for (name, backup, _) in cases {
        restore(&[backup], out.path(), name, RestorePoint::Latest);
    }
    let store = DocStore::open(out.path(), options()).unwrap();
    for (name, _, resumes) in cases {
        let db = store.database(name).unwrap();
        assert_eq!(opened_at(&db) > 0, resumes, "{name}");
        assert_eq!(count(&db), expected(&model), "{name}");
    }
    store.close().unwrap();
}

#[test]
fn backups_taken_while_the_index_commits_and_merges_restore_a_usable_commit() {
    // Writes go on during each backup: the index commits (and tantivy merges and
    // collects segments) while a commit is pinned and copied. Every restored index
    // must check out (a file collected under the copy would make it unusable, then
    // rebuilt: `opened_at` 0) and answer as the restored documents say.
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("b").unwrap();
    db.define_index(search_def()).unwrap();
    let mut model = Model::new();
    for i in 0..200 {
        put(&db, &mut model, i, body(i));
    }
    assert_eq!(count(&db), expected(&model));
    // (sequence, i, body) of every write, to know what each backup holds.
    let written = std::sync::Mutex::new(Vec::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut backups = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Rewrites of the same documents: every commit then deletes from
            // older segments (new `.del` files; the previous ones are collected).
            let mut m = Model::new();
            let mut k = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (i, text) = (k % 250, body(k / 3));
                let seq = put(&db, &mut m, i, text);
                written.lock().unwrap().push((seq, i, text));
                k += 1;
            }
        });
        for _ in 0..6 {
            std::thread::sleep(std::time::Duration::from_millis(300));
            let mut b = Vec::new();
            let report = db.backup_to(&mut b, Default::default(), |_| {}).unwrap();
            let end = kiln_docs::Etag::parse(report.manifest.etag.as_deref().unwrap())
                .unwrap()
                .sequence;
            backups.push((b, end));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let written = written.into_inner().unwrap();
    drop(db);
    store.close().unwrap();

    let out = tempfile::tempdir().unwrap();
    for (n, (b, _)) in backups.iter().enumerate() {
        restore(&[b], out.path(), &format!("r{n}"), RestorePoint::Latest);
    }
    let store = DocStore::open(out.path(), options()).unwrap();
    for (n, (_, end)) in backups.iter().enumerate() {
        let db = store.database(&format!("r{n}")).unwrap();
        assert!(opened_at(&db) > 0, "backup {n}: the index was rebuilt");
        assert!(
            opened_at(&db) <= *end,
            "backup {n}: a commit past its point"
        );
        let mut want = model.clone();
        for (seq, i, text) in &written {
            if seq <= end {
                want.insert(format!("posts/{i}"), text.to_string());
            }
        }
        assert_eq!(count(&db), expected(&want), "backup {n}");
    }
    store.close().unwrap();
}
