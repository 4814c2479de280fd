//! Attachments (`attachments/`): bytes stored once per SHA-256 however many
//! documents name them, counted in the documents' own transactions, freed when
//! the last reference goes; a failed write leaves no file behind; what a crash
//! leaves is removed at the next open; backups carry them.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{AttachmentError, DocumentError};
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
        Err(DocError::Attachment(AttachmentError::NotFound { .. }))
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
        Err(DocError::Attachment(AttachmentError::Invalid(_)))
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
    assert!(
        matches!(
            stale,
            Err(DocError::Document(DocumentError::Conflict { .. }))
        ),
        "{stale:?}"
    );
    let missing = db.put_attachment(
        "nope",
        "f",
        "text/plain",
        upload(&db, b"x"),
        Condition::None,
    );
    assert!(matches!(
        missing,
        Err(DocError::Document(DocumentError::NotFound { .. }))
    ));
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

/// A `Write` that runs `on_first` at its first write (the backup's header: its
/// snapshot is taken and its blobs not yet read).
struct OnFirstWrite<F: FnMut()> {
    out: Vec<u8>,
    on_first: Option<F>,
}

impl<F: FnMut()> std::io::Write for OnFirstWrite<F> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Some(mut f) = self.on_first.take() {
            f();
        }
        self.out.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn restore(store: &DocStore, name: &str, backups: &[&[u8]]) -> kiln_docs::Result<()> {
    let files: Vec<(String, Box<dyn std::io::Read + '_>)> = backups
        .iter()
        .enumerate()
        .map(|(i, b)| {
            (
                format!("backup {i}"),
                Box::new(*b) as Box<dyn std::io::Read>,
            )
        })
        .collect();
    store
        .restore_database(
            kiln_docs::RestoreSource::Files(files),
            name,
            false,
            kiln_docs::RestorePoint::Latest,
            |_| {},
        )
        .map(|_| ())
}

/// A backup carries the blobs its snapshot references, pinned: the documents
/// naming them are deleted (and their blobs freed) right after the snapshot, while
/// the backup is written, and the blobs still arrive (without the pin, the unlink
/// runs before the backup reads them and the backup fails); they are unlinked once
/// it is done. The restore has the bytes and checks clean; an increment carries
/// the blobs its writes name; a blob whose bytes do not hash to its name (its
/// frames' checksums right) fails the restore, naming the blob.
#[test]
fn backups_carry_pinned_blobs_and_restores_check_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    let (a, b) = (pseudo_random(3_000_000, 1), pseudo_random(10_000, 2));
    for (id, bytes) in [("a", &a), ("b", &b)] {
        db.put(id, br#"{"n":1}"#, Condition::None).unwrap();
        db.put_attachment(
            id,
            "f",
            "application/x-test",
            upload(&db, bytes),
            Condition::None,
        )
        .unwrap();
    }
    let mut w = OnFirstWrite {
        out: Vec::new(),
        on_first: Some(|| {
            db.delete("a", Condition::None).unwrap();
            db.delete("b", Condition::None).unwrap();
        }),
    };
    let full = db
        .backup_full_to(&mut w, Default::default(), true, |_| {})
        .unwrap();
    let full_bytes = std::mem::take(&mut w.out);
    drop(w);
    assert_eq!(full.attachment_blobs, 2);
    assert_eq!(full.attachment_bytes, (a.len() + b.len()) as u64);
    assert!(files(db.dir()).is_empty(), "unpinned, the freed blobs go");

    restore(&store, "r", &[&full_bytes]).unwrap();
    let r = store.database("r").unwrap();
    assert_eq!(read_all(&r, "a", "f"), a);
    assert_eq!(read_all(&r, "b", "f"), b);
    assert!(r.check_attachments().unwrap().is_ok());

    // An increment: the blob a write after the full backup names.
    let c = pseudo_random(5000, 3);
    db.put("c", br#"{}"#, Condition::None).unwrap();
    db.put_attachment("c", "g", "text/plain", upload(&db, &c), Condition::None)
        .unwrap();
    let mut inc = Vec::new();
    let report = db
        .backup_incremental_to(&mut inc, &full.manifest, Default::default(), |_| {})
        .unwrap();
    assert_eq!(report.attachment_blobs, 1);
    restore(&store, "r2", &[&full_bytes, &inc]).unwrap();
    let r2 = store.database("r2").unwrap();
    assert_eq!(read_all(&r2, "c", "g"), c);
    assert!(r2.get("a").unwrap().is_none());
    let check = r2.check_attachments().unwrap();
    assert!(check.is_ok() && check.blobs == 1, "{check:?}");

    // The full backup rewritten with one byte of blob b changed and every
    // checksum of the container right: the SHA-256 check refuses it.
    use kiln_storage::backup::Item;
    let mut w2 = Vec::new();
    type Writer<'w> = kiln_storage::ContainerWriter<&'w mut Vec<u8>, fn(u64)>;
    let mut cw: Option<Writer<'_>> = None;
    let mut file: Option<(String, Vec<u8>)> = None;
    let mut out_slot = Some(&mut w2);
    kiln_storage::backup::read_container(
        &full_bytes[..],
        false,
        |_| {},
        |sum, item| {
            match item {
                Item::Header => {
                    cw = Some(
                        kiln_storage::ContainerWriter::new(
                            out_slot.take().unwrap(),
                            sum.txn_id,
                            &sum.meta,
                            Default::default(),
                            (|_| {}) as fn(u64),
                        )
                        .unwrap(),
                    )
                }
                Item::Tree(t) => cw.as_mut().unwrap().begin_tree(t).unwrap(),
                Item::Entry(k, v) => cw.as_mut().unwrap().entry(k, v).unwrap(),
                Item::EndTree => cw.as_mut().unwrap().end_tree().unwrap(),
                Item::File { name, .. } => file = Some((name.to_string(), Vec::new())),
                Item::FileData(d) => file.as_mut().unwrap().1.extend_from_slice(d),
                Item::FileEnd => {
                    let (name, mut bytes) = file.take().unwrap();
                    if bytes.len() == b.len() {
                        bytes[1234] ^= 1;
                    }
                    cw.as_mut()
                        .unwrap()
                        .file(&name, bytes.len() as u64, &mut &bytes[..])
                        .unwrap();
                }
            }
            Ok(())
        },
    )
    .unwrap();
    cw.take().unwrap().finish().unwrap();
    let e = restore(&store, "r3", &[&w2]).unwrap_err().to_string();
    let b_hash = doc(&r, "b")["@metadata"]["@attachments"][0]["hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!("attachment blob {b_hash}")) && e.contains("not to its name"),
        "{e}"
    );
    assert!(store.database("r3").is_err());
}

/// A revision that names an attachment holds its bytes: removed from the current
/// version, the blob stays; a revert serves it again; trimming and purging the
/// revisions give the references back (the blob is unlinked with the last), and
/// `check` agrees with the counts at every step.
#[test]
fn revisions_hold_their_attachments_bytes_until_trimmed_or_purged() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    let config = json!({"collections": {"files": {"max_revisions": 2}}});
    db.set_revisions_config(
        kiln_docs::RevisionsConfig::from_json(config.to_string().as_bytes()).unwrap(),
    )
    .unwrap();
    let bytes = pseudo_random(200_000, 3);
    db.put("files/1", br#"{"v":1}"#, Condition::None).unwrap();
    let with = db
        .put_attachment(
            "files/1",
            "a.bin",
            "application/x-test",
            upload(&db, &bytes),
            Condition::None,
        )
        .unwrap();
    // Overwritten with an explicit empty list: the attachment leaves the current
    // version, but the revision `with` still names it.
    db.put(
        "files/1",
        br#"{"v":2,"@metadata":{"@attachments":[]}}"#,
        Condition::None,
    )
    .unwrap();
    assert!(db.attachments("files/1").unwrap().unwrap().is_empty());
    assert_eq!(files(db.dir()).len(), 1, "the revision keeps the blob");
    let check = db.check_attachments().unwrap();
    assert!(check.is_ok(), "{check:?}");
    db.revert("files/1", with.etag, Condition::None, None)
        .unwrap();
    assert_eq!(read_all(&db, "files/1", "a.bin"), bytes);
    assert!(db.check_attachments().unwrap().is_ok());

    // Trimmed: two writes without it push the revisions naming it out
    // (max_revisions 2), and the blob goes with the last reference.
    db.put(
        "files/1",
        br#"{"v":3,"@metadata":{"@attachments":[]}}"#,
        Condition::None,
    )
    .unwrap();
    assert_eq!(files(db.dir()).len(), 1);
    for v in 4..7 {
        db.put(
            "files/1",
            format!(r#"{{"v":{v}}}"#).as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    assert!(
        files(db.dir()).is_empty(),
        "trimmed revisions free the blob"
    );
    assert!(db.check_attachments().unwrap().is_ok());

    // Purged: a deleted document's last version names the blob until purged.
    db.put("files/2", b"{}", Condition::None).unwrap();
    db.put_attachment(
        "files/2",
        "b.bin",
        "application/x-test",
        upload(&db, &bytes),
        Condition::None,
    )
    .unwrap();
    db.delete("files/2", Condition::None).unwrap();
    assert_eq!(
        files(db.dir()).len(),
        1,
        "the deleted version's revision keeps it"
    );
    assert!(db.check_attachments().unwrap().is_ok());
    assert_eq!(db.purge_revisions("files/2").unwrap(), 2);
    assert!(files(db.dir()).is_empty(), "purged revisions free the blob");
    assert!(db.check_attachments().unwrap().is_ok());
}

/// A staged blob no document named is freed by the periodic pass once its time
/// has passed (the clock is the caller's), not only at the next open; one a
/// document names stays, and a blob staged again later is not the pass's.
#[test]
fn staged_blobs_expire_while_the_database_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let (lonely, _) = db
        .stage_attachment(upload(&db, b"nobody names me"))
        .unwrap();
    let (named, _) = db
        .stage_attachment(upload(&db, b"a document names me"))
        .unwrap();
    let document = json!({"@metadata": {"@attachments": [{"name": "n", "hash": named}]}});
    db.put("n", document.to_string().as_bytes(), Condition::None)
        .unwrap();
    assert_eq!(files(db.dir()).len(), 2);
    // Before their time: nothing goes.
    assert_eq!(db.expire_staged_attachments(now()).unwrap(), 0);
    assert_eq!(files(db.dir()).len(), 2);
    let later = now() + kiln_docs::STAGED_TTL_MS + 1;
    assert_eq!(db.expire_staged_attachments(later).unwrap(), 1);
    assert_eq!(files(db.dir()).len(), 1);
    let held: Vec<String> = db
        .attachment_blobs()
        .unwrap()
        .into_iter()
        .map(|b| b.0)
        .collect();
    assert_eq!(held, vec![named.clone()]);
    assert_ne!(lonely, named);
    assert_eq!(read_all(&db, "n", "n"), b"a document names me");
    assert!(db.check_attachments().unwrap().is_ok());
    // Named, it stays past its time; a second pass frees nothing.
    assert_eq!(db.expire_staged_attachments(later).unwrap(), 0);
    assert_eq!(files(db.dir()).len(), 1);
}
