//! Backups of an encrypted database are sealed (never in clear): a full backup and
//! an increment of documents holding a marker hold no trace of it, of the
//! database's name or of its manifest; they verify and restore with the master key
//! (offline and into a running store), and are refused without it or with another.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    Condition, DocStore, DocsOptions, DocumentCompression, RestorePoint, RestoreSource,
};
use kiln_storage::{BackupOptions, MasterKey};
use std::path::Path;

const MARKER: &str = "SEALED-BACKUP-MARKER";
const DB: &str = "ledger";

fn options(key: Option<&MasterKey>) -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    // Bodies as JSON text: a backup in clear shows them (the control below).
    o.document_compression = DocumentCompression::None;
    o.storage.encryption = key.cloned();
    o
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn put_marked(db: &kiln_docs::Database, from: u32, to: u32) {
    for i in from..to {
        let body = format!(r#"{{"note": "{MARKER} number {i}", "n": {i}}}"#);
        db.put(
            &format!("doc-{MARKER}-{i}"),
            body.as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
}

fn source(files: &[&Vec<u8>]) -> RestoreSource<'static> {
    RestoreSource::Files(
        files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                (
                    format!("file{}", i + 1),
                    Box::new(std::io::Cursor::new((*f).clone())) as Box<dyn std::io::Read>,
                )
            })
            .collect(),
    )
}

/// The database's documents (id, body) in the store at `dir`.
fn documents(dir: &Path, key: Option<&MasterKey>, name: &str) -> Vec<(String, String)> {
    let store = DocStore::open(dir, options(key)).unwrap();
    let db = store.database(name).unwrap();
    let page = db.list_by_prefix("", None, 1000).unwrap();
    let docs = page
        .items
        .iter()
        .map(|d| (d.id.clone(), String::from_utf8(d.json.clone()).unwrap()))
        .collect();
    drop(db);
    store.close().unwrap();
    docs
}

#[test]
fn an_encrypted_database_backs_up_sealed_and_restores_with_its_key() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();

    // Control: the same documents backed up from a store without encryption show
    // the marker and the database's name (so the searches below can find them).
    let plain_dir = tmp.path().join("plain");
    let plain_store = DocStore::open(&plain_dir, options(None)).unwrap();
    let plain_db = plain_store.create_database(DB).unwrap();
    put_marked(&plain_db, 0, 50);
    let mut plain = Vec::new();
    let report = plain_db
        .backup_to(&mut plain, BackupOptions::default(), |_| {})
        .unwrap();
    assert!(contains(&plain, MARKER.as_bytes()) && contains(&plain, DB.as_bytes()));
    assert_eq!(report.format_version, 2);
    assert_eq!(report.encryption_key_fingerprint, None);
    drop(plain_db);
    plain_store.close().unwrap();

    // The encrypted database: a full backup that starts a chain, then an increment,
    // each written to a file.
    let src_dir = tmp.path().join("src");
    let store = DocStore::open(&src_dir, options(Some(&key))).unwrap();
    let db = store.create_database(DB).unwrap();
    put_marked(&db, 0, 50);
    let full_path = tmp.path().join("full.kbak");
    let report = {
        let mut f = std::fs::File::create(&full_path).unwrap();
        db.backup_full_to(&mut f, BackupOptions::default(), true, |_| {})
            .unwrap()
    };
    assert_eq!(report.format_version, 3);
    assert_eq!(report.encryption_key_fingerprint, Some(key.fingerprint()));
    assert_eq!(report.manifest.documents, 50);
    let full = std::fs::read(&full_path).unwrap();
    put_marked(&db, 50, 80);
    let since = kiln_docs::read_manifest_with_key(&full[..], Some(&key)).unwrap();
    assert_eq!(since.database, DB);
    let inc_path = tmp.path().join("inc.kbak");
    {
        let mut f = std::fs::File::create(&inc_path).unwrap();
        db.backup_incremental_to(&mut f, &since, BackupOptions::default(), |_| {})
            .unwrap();
    }
    let inc = std::fs::read(&inc_path).unwrap();
    let expected: Vec<(String, String)> = {
        let page = db.list_by_prefix("", None, 1000).unwrap();
        page.items
            .iter()
            .map(|d| (d.id.clone(), String::from_utf8(d.json.clone()).unwrap()))
            .collect()
    };
    assert_eq!(expected.len(), 80);
    drop(db);
    store.close().unwrap();

    // No trace of the documents, the manifest or the database's name in the files.
    for file in [&full, &inc] {
        for needle in [MARKER, "MARKER", DB, "\"database\"", "number"] {
            assert!(!contains(file, needle.as_bytes()), "{needle:?} in clear");
        }
    }

    // Without the key: refused, saying what to give.
    for e in [
        kiln_docs::read_manifest(&full[..]).unwrap_err(),
        kiln_docs::verify_backup(&full[..], |_| {}).unwrap_err(),
    ] {
        let text = e.to_string();
        assert!(
            text.contains("this backup is encrypted") && text.contains("--encryption-key-file"),
            "{text}"
        );
    }
    // With it: verified, each file and the chain.
    let v = kiln_docs::verify_backup_with_key(&full[..], Some(&key), |_| {}).unwrap();
    assert_eq!(v.manifest.documents, 50);
    let chain =
        kiln_docs::verify_chain_with_key(source(&[&full, &inc]), Some(&key), |_| {}).unwrap();
    assert_eq!(chain.writes_replayed, 30);
    // A changed byte (past the header) is refused, naming where.
    let mut bad = full.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    let e = kiln_docs::verify_backup_with_key(&bad[..], Some(&key), |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("offset"), "{e}");

    // Restored offline with the key: every document, and the restored database is
    // encrypted (it opens only with the key).
    let copy_dir = tmp.path().join("copy");
    let restored = kiln_docs::restore_database(
        source(&[&full, &inc]),
        &copy_dir,
        "copy",
        options(Some(&key)).storage,
        false,
        RestorePoint::Latest,
        |_| {},
    )
    .unwrap();
    assert_eq!(restored.backups.len(), 2);
    assert_eq!(documents(&copy_dir, Some(&key), "copy"), expected);
    assert!(DocStore::open(&copy_dir, options(None)).is_err());

    // Restored into a running encrypted store.
    let running_dir = tmp.path().join("running");
    let running = DocStore::open(&running_dir, options(Some(&key))).unwrap();
    running
        .restore_database(
            source(&[&full, &inc]),
            "copy",
            false,
            RestorePoint::Latest,
            |_| {},
        )
        .unwrap();
    running.close().unwrap();
    assert_eq!(documents(&running_dir, Some(&key), "copy"), expected);

    // Into a store without a key, or with another key: refused, nothing left.
    let other = MasterKey::generate();
    for (name, k, says) in [
        ("no-key", None, "this backup is encrypted"),
        ("other-key", Some(&other), "wrong encryption key"),
    ] {
        let dir = tmp.path().join(name);
        let e = kiln_docs::restore_database(
            source(&[&full, &inc]),
            &dir,
            "copy",
            options(k).storage,
            false,
            RestorePoint::Latest,
            |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(says) && e.contains("file1"), "{name}: {e}");
        assert!(!dir.join("databases").join("copy").exists(), "{name}");
    }
}
