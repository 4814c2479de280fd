//! Attachments of an encrypted database (`attachments/sealed.rs`): their blob files
//! are sealed with a key of the database's own, so no file under the data
//! directory holds their bytes; they read back whole and by range; a changed
//! byte is an error naming the file and the chunk, never other bytes; backups
//! carry the plaintext and a restore seals it under the target's key; a plain
//! database keeps plain files.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{Condition, Database, DocError, DocStore, DocsOptions, StagedBlob};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const MARKER: &[u8] = b"KILN-SEALED-BLOB-MARKER-5b1e9d";
/// The plaintext bytes of a sealed chunk, and its seal (`sealed.rs`).
const CHUNK: usize = 64 << 10;
const HEADER: usize = 40;
const SEAL: usize = 40;

fn options(key: Option<&kiln_storage::MasterKey>) -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.encryption = key.cloned();
    o
}

/// 3 chunks and a bit of pseudo-random bytes with the marker at the start,
/// across the first chunk boundary and at the end.
fn secret_bytes() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut data: Vec<u8> = (0..3 * CHUNK + 1234)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let n = data.len();
    for at in [0, CHUNK - 10, n - MARKER.len()] {
        data[at..at + MARKER.len()].copy_from_slice(MARKER);
    }
    data
}

fn upload(db: &Database, bytes: &[u8]) -> StagedBlob {
    let mut w = db.attachment_writer().unwrap();
    for piece in bytes.chunks(1000) {
        w.write(piece).unwrap();
    }
    w.finish().unwrap()
}

fn attach(db: &Database, id: &str, bytes: &[u8]) -> String {
    db.put(id, br#"{"kind":"file"}"#, Condition::None).unwrap();
    let staged = upload(db, bytes);
    let hash = staged.hash_hex();
    db.put_attachment(id, "f", "application/octet-stream", staged, Condition::None)
        .unwrap();
    hash
}

fn read_all(db: &Database, id: &str) -> std::io::Result<Vec<u8>> {
    let mut r = db.open_attachment(id, "f").unwrap();
    let mut out = Vec::new();
    r.file.read_to_end(&mut out).map(|_| out)
}

/// Every file under `dir`.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The files under `dir` that hold the marker.
fn files_with_marker(dir: &Path) -> Vec<PathBuf> {
    all_files(dir)
        .into_iter()
        .filter(|p| contains(&std::fs::read(p).unwrap(), MARKER))
        .collect()
}

fn flip(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn sealed_blobs_hold_no_plaintext_and_read_back_whole_and_by_range() {
    let dir = tempfile::tempdir().unwrap();
    let key = kiln_storage::MasterKey::generate();
    let data = secret_bytes();
    let hash = {
        let store = DocStore::open(dir.path(), options(Some(&key))).unwrap();
        let db = store.create_database("d").unwrap();
        let hash = attach(&db, "a", &data);
        // A staged blob and an empty one are sealed too.
        let (staged, _) = db.stage_attachment(upload(&db, b"")).unwrap();
        assert_eq!(
            std::fs::metadata(db.attachment_blob_path(&staged).unwrap())
                .unwrap()
                .len(),
            (HEADER + SEAL) as u64
        );
        // The file: a header, four sealed chunks.
        let path = db.attachment_blob_path(&hash).unwrap();
        let size = std::fs::metadata(&path).unwrap().len() as usize;
        assert_eq!(size, HEADER + 4 * SEAL + data.len());
        assert_eq!(&std::fs::read(&path).unwrap()[..8], b"KILNBLOB");

        // Whole, by range (across a chunk boundary, from the end), and seeked.
        assert!(read_all(&db, "a").unwrap() == data);
        let mut r = db.open_attachment("a", "f").unwrap();
        assert_eq!(r.file.len(), data.len() as u64);
        assert!(r.file.is_sealed());
        r.file.seek(SeekFrom::Start(CHUNK as u64 - 10)).unwrap();
        let mut got = vec![0u8; MARKER.len() + 100];
        r.file.read_exact(&mut got).unwrap();
        assert_eq!(got, data[CHUNK - 10..CHUNK - 10 + got.len()]);
        r.file.seek(SeekFrom::End(-(MARKER.len() as i64))).unwrap();
        let mut tail = Vec::new();
        r.file.read_to_end(&mut tail).unwrap();
        assert_eq!(tail, MARKER);
        r.file.seek(SeekFrom::Start(5)).unwrap();
        let mut five = [0u8; 5];
        r.file.read_exact(&mut five).unwrap();
        assert_eq!(five, data[5..10]);
        // The blob by hash (backups, exports) is the plaintext too.
        let mut by_hash = Vec::new();
        db.open_attachment_blob(&hash)
            .unwrap()
            .read_to_end(&mut by_hash)
            .unwrap();
        assert!(by_hash == data);
        let check = db.check_attachments().unwrap();
        assert!(check.is_ok() && check.blobs == 2, "{check:?}");
        drop(r);
        drop(db);
        store.close().unwrap();
        hash
    };
    assert_eq!(files_with_marker(dir.path()), Vec::<PathBuf>::new());

    // The key is the environment's: the same at the next open.
    let store = DocStore::open(dir.path(), options(Some(&key))).unwrap();
    let db = store.database("d").unwrap();
    assert!(read_all(&db, "a").unwrap() == data);
    assert!(db.check_attachments().unwrap().is_ok());
    let path = db.attachment_blob_path(&hash).unwrap();
    let good = std::fs::read(&path).unwrap();

    // A byte changed in the second chunk: the attachment opens (its last chunk is
    // whole), its first chunk reads, and reading the second is an error naming the
    // file and the chunk, never changed bytes.
    flip(&path, HEADER + (SEAL + CHUNK) + SEAL + 100);
    let mut r = db.open_attachment("a", "f").unwrap();
    let mut first = vec![0u8; CHUNK];
    r.file.read_exact(&mut first).unwrap();
    assert!(first == data[..CHUNK]);
    let e = r.file.read_exact(&mut first).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    let text = e.to_string();
    assert!(text.contains("chunk 1 of 4"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(read_all(&db, "a").is_err());
    let check = db.check_attachments().unwrap();
    assert_eq!(check.corrupt, vec![hash.clone()], "{check:?}");

    // A byte changed in the last chunk or the header: the attachment does not open.
    for at in [good.len() - 1, 17] {
        std::fs::write(&path, &good).unwrap();
        flip(&path, at);
        match db.open_attachment("a", "f") {
            Err(DocError::Storage(kiln_storage::Error::Corrupted { path: p, .. })) => {
                assert_eq!(p, path, "byte {at}")
            }
            other => panic!("byte {at}: {:?}", other.map(|r| r.info)),
        }
    }
    // Truncated; the plaintext put in place of the sealed file.
    std::fs::write(&path, &good[..good.len() - 1]).unwrap();
    assert!(db.open_attachment("a", "f").is_err());
    std::fs::write(&path, &data).unwrap();
    assert!(db.open_attachment("a", "f").is_err());
    assert!(!db.check_attachments().unwrap().is_ok());
    std::fs::write(&path, &good).unwrap();
    assert!(read_all(&db, "a").unwrap() == data);
    assert!(db.check_attachments().unwrap().is_ok());
}

#[test]
fn a_plain_database_keeps_plain_blob_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options(None)).unwrap();
    let db = store.create_database("d").unwrap();
    let data = secret_bytes();
    let hash = attach(&db, "a", &data);
    let path = db.attachment_blob_path(&hash).unwrap();
    assert!(std::fs::read(&path).unwrap() == data, "byte for byte");
    let r = db.open_attachment("a", "f").unwrap();
    assert!(!r.file.is_sealed());
    let mut file = r.file.into_plain_file().unwrap();
    let mut back = Vec::new();
    file.read_to_end(&mut back).unwrap();
    assert!(back == data);
}

fn backup(db: &Database) -> Vec<u8> {
    let mut out = Vec::new();
    db.backup_to(&mut out, Default::default(), |_| {}).unwrap();
    out
}

fn restore(store: &DocStore, name: &str, backup: &[u8]) {
    let files: Vec<(String, Box<dyn Read + '_>)> =
        vec![("backup".into(), Box::new(backup) as Box<dyn Read>)];
    store
        .restore_database(
            kiln_docs::RestoreSource::Files(files),
            name,
            false,
            kiln_docs::RestorePoint::Latest,
            |_| {},
        )
        .unwrap();
}

/// A backup carries the plaintext (a sealed file's key is its database's own); the
/// restore writes it through the target's writer: sealed under the key of the
/// restored database (a new environment: a data key of its own, whatever the
/// master key), never a copy of the source's files. A plain database's backup
/// restored into an encrypted data directory is sealed too.
#[test]
fn restores_seal_blobs_under_the_target_database_key() {
    let data = secret_bytes();
    let (src_dir, enc_dir, plain_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let key = kiln_storage::MasterKey::generate();
    let src = DocStore::open(src_dir.path(), options(Some(&key))).unwrap();
    let db = src.create_database("d").unwrap();
    let hash = attach(&db, "a", &data);
    let sealed_backup = backup(&db);

    let enc = DocStore::open(enc_dir.path(), options(Some(&key))).unwrap();
    restore(&enc, "r", &sealed_backup);
    let r = enc.database("r").unwrap();
    assert!(read_all(&r, "a").unwrap() == data);
    assert!(r.check_attachments().unwrap().is_ok());
    let restored = std::fs::read(r.attachment_blob_path(&hash).unwrap()).unwrap();
    let original = std::fs::read(db.attachment_blob_path(&hash).unwrap()).unwrap();
    assert_eq!(restored.len(), original.len());
    assert!(restored != original, "sealed again, not copied");
    // The same database restored next to itself: its own new data key.
    restore(&src, "again", &sealed_backup);
    assert!(read_all(&src.database("again").unwrap(), "a").unwrap() == data);

    // A plain database's backup into the encrypted data directory.
    let plain = DocStore::open(plain_dir.path(), options(None)).unwrap();
    let p = plain.create_database("p").unwrap();
    attach(&p, "a", &data);
    restore(&enc, "from-plain", &backup(&p));
    let fp = enc.database("from-plain").unwrap();
    assert!(read_all(&fp, "a").unwrap() == data);
    assert!(fp.check_attachments().unwrap().is_ok());

    drop((r, fp, db));
    enc.close().unwrap();
    src.close().unwrap();
    assert_eq!(files_with_marker(enc_dir.path()), Vec::<PathBuf>::new());
    assert_eq!(files_with_marker(src_dir.path()), Vec::<PathBuf>::new());
}

/// A cluster's upload (a plain file the log's chunks wrote) becomes a sealed blob
/// in an encrypted database, checked against the hash and size its entry names.
#[test]
fn uploads_are_sealed_as_they_are_placed() {
    let dir = tempfile::tempdir().unwrap();
    let key = kiln_storage::MasterKey::generate();
    let store = DocStore::open(dir.path(), options(Some(&key))).unwrap();
    let db = store.create_database("d").unwrap();
    let data = secret_bytes();
    let staged = upload(&db, &data);
    let hash = staged.hash_hex();
    drop(staged);
    let upload_dir = tempfile::tempdir().unwrap();
    let upload_path = upload_dir.path().join("upload");
    std::fs::write(&upload_path, &data).unwrap();
    let short = db.attachment_from_upload(&upload_path, &hash, data.len() as u64 + 1);
    assert!(matches!(short, Err(DocError::Attachment(_))), "{short:?}");
    let staged = db
        .attachment_from_upload(&upload_path, &hash, data.len() as u64)
        .unwrap();
    db.put("a", br#"{}"#, Condition::None).unwrap();
    db.put_attachment("a", "f", "text/plain", staged, Condition::None)
        .unwrap();
    assert!(read_all(&db, "a").unwrap() == data);
    assert!(
        upload_path.exists(),
        "the upload stays for its entry's replay"
    );
    drop(db);
    store.close().unwrap();
    assert_eq!(files_with_marker(dir.path()), Vec::<PathBuf>::new());
}
