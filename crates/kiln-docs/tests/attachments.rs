//! Attachments (`attachments/`): bytes stored once per SHA-256 however many
//! documents name them, counted in the documents' own transactions, freed when
//! the last reference goes; a failed write leaves no file behind; what a crash
//! leaves is removed at the next open; backups carry them.

use kiln_docs::{BatchOp, Condition, Database, DocError, DocStore, DocsOptions, StagedBlob};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o
}

fn upload(db: &Database, bytes: &[u8]) -> StagedBlob {
    let mut w = db.attachment_writer().unwrap();
    for chunk in bytes.chunks(1000) {
        w.write(chunk).unwrap();
    }
    w.finish().unwrap()
}

/// Every file under the database's `attachments/` (blobs and tmp files).
fn files(db_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![db_dir.join("attachments")];
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

fn doc(db: &Database, id: &str) -> Value {
    db.get(id).unwrap().unwrap().to_value().unwrap()
}

fn read_all(db: &Database, id: &str, name: &str) -> Vec<u8> {
    use std::io::Read;
    let mut r = db.open_attachment(id, name).unwrap();
    let mut out = Vec::new();
    r.file.read_to_end(&mut out).unwrap();
    out
}

#[test]
fn same_bytes_in_two_documents_are_one_file_freed_with_the_last_reference() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    db.put("a", br#"{"n":1}"#, Condition::None).unwrap();
    db.put("b", br#"{"n":2}"#, Condition::None).unwrap();
    let bytes = vec![7u8; 300_000];
    let before = db.get("a").unwrap().unwrap().etag;
    let put = db
        .put_attachment(
            "a",
            "x.bin",
            "application/x-test",
            upload(&db, &bytes),
            Condition::None,
        )
        .unwrap();
    assert!(put.etag > before, "the document gets a new version");
    db.put_attachment(
        "b",
        "y.bin",
        "application/octet-stream",
        upload(&db, &bytes),
        Condition::None,
    )
    .unwrap();
    assert_eq!(files(db.dir()).len(), 1, "one file for the same bytes");
    let list = &doc(&db, "a")["@metadata"]["@attachments"];
    assert_eq!(list[0]["name"], "x.bin");
    assert_eq!(list[0]["size"], 300_000);
    assert_eq!(list[0]["content_type"], "application/x-test");
    assert_eq!(read_all(&db, "b", "y.bin"), bytes);
    // A put of the body alone keeps the attachments.
    db.put("a", br#"{"n":3}"#, Condition::None).unwrap();
    assert_eq!(
        doc(&db, "a")["@metadata"]["@attachments"][0]["name"],
        "x.bin"
    );
    // Deleting one reference keeps the file; deleting the document holding the
    // last one frees it.
    db.delete_attachment("a", "x.bin", Condition::None).unwrap();
    assert!(doc(&db, "a")["@metadata"].get("@attachments").is_none());
    assert_eq!(files(db.dir()).len(), 1);
    assert!(matches!(
        db.delete_attachment("a", "x.bin", Condition::None),
        Err(DocError::AttachmentNotFound { .. })
    ));
    db.delete("b", Condition::None).unwrap();
    assert!(files(db.dir()).is_empty(), "{:?}", files(db.dir()));
    assert!(db.check_attachments().unwrap().is_ok());
}

#[test]
fn a_replaced_attachment_frees_its_old_bytes_and_an_explicit_list_removes() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    db.put("a", b"{}", Condition::None).unwrap();
    db.put_attachment("a", "f", "text/plain", upload(&db, b"one"), Condition::None)
        .unwrap();
    db.put_attachment("a", "f", "text/plain", upload(&db, b"two"), Condition::None)
        .unwrap();
    assert_eq!(files(db.dir()).len(), 1);
    assert_eq!(read_all(&db, "a", "f"), b"two");
    db.put_attachment(
        "a",
        "g",
        "text/plain",
        upload(&db, b"three"),
        Condition::None,
    )
    .unwrap();
    // An explicit list keeps what it names, and nothing else.
    let mut v = doc(&db, "a");
    let keep = v["@metadata"]["@attachments"][1].clone();
    v["@metadata"]["@attachments"] = json!([keep]);
    db.put("a", v.to_string().as_bytes(), Condition::None)
        .unwrap();
    assert_eq!(db.attachments("a").unwrap().unwrap().len(), 1);
    assert_eq!(files(db.dir()).len(), 1);
    assert_eq!(read_all(&db, "a", "g"), b"three");
    // A hash the database does not hold is refused.
    let forged = json!({"@metadata": {"@attachments": [{"name": "z", "hash": "ab".repeat(32)}]}});
    assert!(matches!(
        db.put("c", forged.to_string().as_bytes(), Condition::None),
        Err(DocError::InvalidAttachment(_))
    ));
    assert!(db.check_attachments().unwrap().is_ok());
}

#[test]
fn a_failed_attachment_write_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    let put = db.put("a", b"{}", Condition::None).unwrap();
    db.put("a", br#"{"v":2}"#, Condition::None).unwrap();
    let stale = db.put_attachment(
        "a",
        "f",
        "text/plain",
        upload(&db, b"bytes"),
        Condition::IfMatch(put.etag),
    );
    assert!(matches!(stale, Err(DocError::Conflict { .. })), "{stale:?}");
    let missing = db.put_attachment(
        "nope",
        "f",
        "text/plain",
        upload(&db, b"x"),
        Condition::None,
    );
    assert!(matches!(missing, Err(DocError::DocumentNotFound { .. })));
    assert!(files(db.dir()).is_empty(), "{:?}", files(db.dir()));
    assert!(db.attachments("a").unwrap().unwrap().is_empty());
    // An unfinished upload removes its temporary file.
    let mut w = db.attachment_writer().unwrap();
    w.write(b"partial").unwrap();
    drop(w);
    assert!(files(db.dir()).is_empty());
}

#[test]
fn a_batch_names_a_staged_blob_by_hash() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    let (hash, size) = db.stage_attachment(upload(&db, b"staged bytes")).unwrap();
    assert_eq!(size, 12);
    let document = json!({"t": 1, "@metadata": {"@attachments": [
        {"name": "s.txt", "hash": hash, "content_type": "text/plain", "size": 999}
    ]}});
    db.batch(vec![BatchOp::Put {
        id: kiln_docs::DocId::Given("p".into()),
        document,
        condition: Condition::None,
    }])
    .unwrap();
    let list = db.attachments("p").unwrap().unwrap();
    assert_eq!(
        list[0].size_bytes, 12,
        "the size is the store's, not the client's"
    );
    assert_eq!(read_all(&db, "p", "s.txt"), b"staged bytes");
    db.delete("p", Condition::None).unwrap();
    // Still staged (its time has not passed): kept for another document.
    assert_eq!(files(db.dir()).len(), 1);
}

#[test]
fn what_a_crash_leaves_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let db_dir;
    {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.create_database("d").unwrap();
        db_dir = db.dir().to_path_buf();
        db.put("a", b"{}", Condition::None).unwrap();
        db.put_attachment(
            "a",
            "kept",
            "text/plain",
            upload(&db, b"kept"),
            Condition::None,
        )
        .unwrap();
        store.close().unwrap();
    }
    // A partial upload, and a blob renamed into place whose commit never came.
    let att = db_dir.join("attachments");
    std::fs::write(att.join("tmp").join("123-partial"), b"half").unwrap();
    let orphan = "cd".repeat(32);
    std::fs::create_dir_all(att.join("cd")).unwrap();
    std::fs::write(att.join("cd").join(&orphan), b"orphan").unwrap();
    assert_eq!(files(&db_dir).len(), 3);
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("d").unwrap();
    assert_eq!(files(&db_dir).len(), 1, "{:?}", files(&db_dir));
    assert_eq!(read_all(&db, "a", "kept"), b"kept");
    assert!(db.check_attachments().unwrap().is_ok());
}

#[test]
fn check_finds_a_corrupt_and_a_missing_blob() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    db.put("a", b"{}", Condition::None).unwrap();
    db.put_attachment(
        "a",
        "one",
        "text/plain",
        upload(&db, b"one"),
        Condition::None,
    )
    .unwrap();
    db.put_attachment(
        "a",
        "two",
        "text/plain",
        upload(&db, b"two"),
        Condition::None,
    )
    .unwrap();
    let list = db.attachments("a").unwrap().unwrap();
    std::fs::write(db.attachment_blob_path(&list[0].hash).unwrap(), b"0ne").unwrap();
    std::fs::remove_file(db.attachment_blob_path(&list[1].hash).unwrap()).unwrap();
    let report = db.check_attachments().unwrap();
    assert_eq!(report.corrupt, vec![list[0].hash.clone()]);
    assert_eq!(report.missing, vec![list[1].hash.clone()]);
    assert!(!report.is_ok());
}
