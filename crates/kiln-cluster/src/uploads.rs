//! Attachment uploads in progress: the files the log's `AttachmentChunk` entries
//! write, one per upload, in the database's directory:
//!
//! ```text
//! <database dir>/attachments/uploads/<upload id, 16 hex digits>
//! ```
//!
//! A chunk writes its bytes at its offset (applying it again writes the same
//! bytes: a replay changes nothing) and sets the file's modification time to the
//! chunk's `keep_until_ms` (the leader's time plus the upload's time to live, the
//! latest of the chunks'). An entry of the database whose leader time is past
//! that removes the upload (`expire`): abandoned uploads go at the same log entry
//! on every node, whatever their clocks. `PutAttachment` checks the file's size
//! and SHA-256 (so a missing chunk is the same failure on every node) and removes
//! it, whatever its outcome.
//!
//! Uploads are state, so a snapshot carries them: before each database's backup
//! container, a section `@uploads/<database>` holding its uploads (`capture`,
//! `restore`). Taken before the backup and after the snapshot's last log id, a
//! section holds at least what that log id says; the chunks applied again after an
//! install write the same bytes, and an upload consumed or expired since is
//! removed again by its entry.
//!
//! In an encrypted database (its environment has a master key) an upload's file
//! is never plaintext: a header of [`SEALED_HEADER_BYTES`] (the magic
//! `KILNUPL1`, then a random 24-byte nonce drawn when the file is made), then the
//! byte at each offset at `SEALED_HEADER_BYTES + offset`, XORed with the XChaCha20
//! keystream of that nonce at that offset, under a key derived from the master
//! key ([`KEY_PURPOSE`]). A chunk applied again encrypts to the same bytes (same
//! nonce, same offset), and the key is the same on every node that shares the
//! master key (as they must), so a snapshot's section carries the files as they
//! are, never in clear. The keystream is not authenticated on its own: a
//! `PutAttachment` decrypts the file on its way into the (sealed) blob store and
//! checks its size and SHA-256, so changed bytes are the write's failure, as a
//! missing chunk is. A master key changed while an upload is in progress (the
//! cluster stopped, every node rotated) leaves that upload unreadable: its
//! `PutAttachment` fails the same way on every node, and the client uploads again.

use kiln_docs::{Database, DocError};
use kiln_storage::crypt::SealingKey;
use kiln_storage::MasterKey;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The prefix of a snapshot section that holds a database's uploads (a database
/// name cannot start with `@`).
pub(crate) const SECTION_PREFIX: &str = "@uploads/";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DocError + '_ {
    move |source| DocError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The purpose the upload key is derived for (`MasterKey::derived_key`).
const KEY_PURPOSE: &str = "cluster-attachment-uploads";
const SEALED_MAGIC: &[u8; 8] = b"KILNUPL1";
/// The header of an encrypted database's upload file: magic, nonce.
pub(crate) const SEALED_HEADER_BYTES: u64 = 32;

/// The key of the database's uploads: `None` if it is not encrypted.
fn upload_key(db: &Database) -> Option<SealingKey> {
    Some(db.env().master_key()?.derived_key(KEY_PURPOSE))
}

/// The nonce in an encrypted upload's header.
fn read_nonce(file: &File, path: &Path) -> Result<[u8; 24], DocError> {
    let mut header = [0u8; SEALED_HEADER_BYTES as usize];
    file.read_exact_at(&mut header, 0).map_err(io_err(path))?;
    let (magic, nonce) = header.split_at(8);
    if magic != SEALED_MAGIC {
        return Err(DocError::Storage(kiln_storage::Error::Corrupted {
            path: path.to_path_buf(),
            location: "header".into(),
            what: "not an encrypted upload (bad magic): an encrypted database keeps only \
                   encrypted uploads"
                .into(),
            source: None,
        }));
    }
    let mut out = [0u8; 24];
    out.copy_from_slice(nonce);
    Ok(out)
}

/// A new encrypted upload's header, written at the start of `file`.
fn write_header(file: &File, path: &Path) -> Result<[u8; 24], DocError> {
    let nonce = SealingKey::random_stream_nonce();
    let mut header = [0u8; SEALED_HEADER_BYTES as usize];
    header[..8].copy_from_slice(SEALED_MAGIC);
    header[8..].copy_from_slice(&nonce);
    file.write_all_at(&header, 0).map_err(io_err(path))?;
    Ok(nonce)
}

/// How a `PutAttachment` reads an encrypted upload's plaintext.
pub(crate) fn decoder(db: &Database) -> Option<Box<kiln_docs::UploadDecoder<'static>>> {
    decoder_under(db.env().master_key())
}

/// `decoder` for uploads encrypted under `master` (none: plain uploads).
pub(crate) fn decoder_under(
    master: Option<&MasterKey>,
) -> Option<Box<kiln_docs::UploadDecoder<'static>>> {
    let master = master?.clone();
    Some(Box::new(move |mut file: File| {
        let nonce = read_nonce(&file, Path::new("the upload"))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        file.seek(SeekFrom::Start(SEALED_HEADER_BYTES))?;
        Ok(Box::new(Decrypting {
            file,
            key: master.derived_key(KEY_PURPOSE),
            nonce,
            pos: 0,
        }) as Box<dyn Read>)
    }))
}

/// An encrypted upload's plaintext, read in order.
struct Decrypting {
    file: File,
    key: SealingKey,
    nonce: [u8; 24],
    pos: u64,
}

impl Read for Decrypting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        let got = buf.get_mut(..n).unwrap_or_default();
        self.key.apply_keystream_at(&self.nonce, self.pos, got);
        self.pos += n as u64;
        Ok(n)
    }
}

pub(crate) fn dir_of(db: &Database) -> PathBuf {
    db.dir().join("attachments").join("uploads")
}

pub(crate) fn path_of(db: &Database, upload_id: u64) -> PathBuf {
    dir_of(db).join(format!("{upload_id:016x}"))
}

fn to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn ms_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes `bytes` at `offset` of the upload, keeps it until at least
/// `keep_until_ms`, and syncs it (the log's entry counts as applied once the
/// state machine saves its applied index).
pub(crate) fn write_chunk(
    db: &Database,
    upload_id: u64,
    offset: u64,
    keep_until_ms: u64,
    bytes: &[u8],
) -> Result<(), DocError> {
    let dir = dir_of(db);
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let path = path_of(db, upload_id);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    let meta = file.metadata().map_err(io_err(&path))?;
    // A new file's time is now: not an earlier chunk's.
    let earlier_ms = if meta.len() == 0 {
        0
    } else {
        meta.modified().map_or(0, ms_of)
    };
    let sealed;
    let (at, bytes) = match upload_key(db) {
        None => (offset, bytes),
        Some(key) => {
            // Shorter than a header: made by a write that did not finish (no
            // chunk of it was applied), begun again.
            let nonce = if meta.len() < SEALED_HEADER_BYTES {
                write_header(&file, &path)?
            } else {
                read_nonce(&file, &path)?
            };
            let mut buf = bytes.to_vec();
            key.apply_keystream_at(&nonce, offset, &mut buf);
            sealed = buf;
            (SEALED_HEADER_BYTES + offset, &sealed[..])
        }
    };
    file.seek(SeekFrom::Start(at))
        .and_then(|_| file.write_all(bytes))
        .and_then(|_| file.set_modified(to_time(keep_until_ms.max(earlier_ms))))
        .and_then(|_| file.sync_all())
        .map_err(io_err(&path))
}

/// Moves upload `upload_id` of `db` (if it is there) to `to`, outside the
/// database's directory (a restore replaces that directory), durably.
pub(crate) fn take(db: &Database, upload_id: u64, to: &Path) -> Result<(), DocError> {
    let from = path_of(db, upload_id);
    if !from.exists() {
        return Ok(());
    }
    let dir = to.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    std::fs::rename(&from, to).map_err(io_err(to))?;
    for d in [dir, &dir_of(db)] {
        File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(io_err(d))?;
    }
    Ok(())
}

/// The plaintext of the upload file at `path`, read through `decode` if given.
pub(crate) fn open_plain(
    path: &Path,
    decode: Option<&kiln_docs::UploadDecoder<'_>>,
) -> Result<Box<dyn Read>, DocError> {
    let file = File::open(path).map_err(io_err(path))?;
    match decode {
        Some(decode) => decode(file).map_err(io_err(path)),
        None => Ok(Box::new(file)),
    }
}

/// Removes an upload (finished, dropped); a missing one is no error.
pub(crate) fn remove(db: &Database, upload_id: u64) -> Result<(), DocError> {
    let path = path_of(db, upload_id);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&path)(e)),
        _ => Ok(()),
    }
}

/// The upload file of a `PutAttachment`; an empty upload has no chunk, so its
/// file is made here.
pub(crate) fn finished_path(
    db: &Database,
    upload_id: u64,
    size_bytes: u64,
) -> Result<PathBuf, DocError> {
    let path = path_of(db, upload_id);
    if size_bytes == 0 && !path.exists() {
        let dir = dir_of(db);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let file = File::create(&path).map_err(io_err(&path))?;
        if upload_key(db).is_some() {
            write_header(&file, &path)?;
        }
    }
    Ok(path)
}

/// Every upload of the database: id, kept until, file.
fn list(db: &Database) -> Result<Vec<(u64, u64, PathBuf)>, DocError> {
    let dir = dir_of(db);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(&dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(&dir))?;
        let path = entry.path();
        let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(|n| u64::from_str_radix(n, 16).ok())
        else {
            continue;
        };
        let until = match entry.metadata() {
            Ok(m) => m.modified().map_or(0, ms_of),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(&path)(e)),
        };
        out.push((id, until, path));
    }
    out.sort();
    Ok(out)
}

/// Removes the uploads whose time ran out before the leader's time `at_ms` (an
/// upload its leader abandoned), and frees the blobs staged for a batch
/// (`Command::StageAttachment`) that no document named before their time ran
/// out at `at_ms` (`Database::expire_staged_attachments`: a node's own clock
/// never expires them in a cluster, see `DocsOptions::expire_staged_at_open`).
/// Called with the leader time of an entry of the database before the entry
/// is applied: every node expires the same at the same entry. Returns how many
/// uploads were removed.
pub(crate) fn expire(db: &Database, at_ms: u64) -> Result<usize, DocError> {
    let staged = db.expire_staged_attachments(at_ms)?;
    if staged > 0 {
        tracing::info!(
            database = db.name(),
            freed = staged,
            "staged attachments expired"
        );
    }
    let mut removed = 0;
    for (id, until, _) in list(db)? {
        if until < at_ms {
            remove(db, id)?;
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(database = db.name(), removed, "attachment uploads expired");
    }
    Ok(removed)
}

/// Writes the database's uploads as a snapshot section's body: per upload, its
/// id, kept-until time and length (u64 each, big-endian), then its bytes. An
/// upload removed meanwhile is left out (its removal's entry is after the
/// snapshot's last log id: it is applied again after an install).
pub(crate) fn capture(db: &Database, out: &mut impl Write) -> Result<usize, DocError> {
    let mut n = 0;
    for (id, until, path) in list(db)? {
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(&path)(e)),
        };
        let len = file.metadata().map_err(io_err(&path))?.len();
        out.write_all(&id.to_be_bytes())
            .and_then(|_| out.write_all(&until.to_be_bytes()))
            .and_then(|_| out.write_all(&len.to_be_bytes()))
            .map_err(io_err(&path))?;
        // The file only grows (chunks) or goes (its inode stays readable): `len`
        // bytes are there.
        let copied = std::io::copy(&mut (&mut file).take(len), out).map_err(io_err(&path))?;
        if copied != len {
            return Err(DocError::Internal(format!(
                "upload {} shrank while a snapshot copied it",
                path.display()
            )));
        }
        n += 1;
    }
    Ok(n)
}

/// Empties the database's uploads (before a snapshot's sections are restored).
pub(crate) fn clear(db: &Database) -> Result<(), DocError> {
    let dir = dir_of(db);
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&dir)(e)),
        _ => Ok(()),
    }
}

/// Restores the uploads of a section `capture` wrote (`len` bytes of `input`).
pub(crate) fn restore(db: &Database, input: &mut impl Read, len: u64) -> Result<(), DocError> {
    let dir = dir_of(db);
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let mut left = len;
    let bad =
        |why: String| DocError::Internal(format!("a snapshot's uploads of {}: {why}", db.name()));
    while left > 0 {
        let mut header = [0u8; 24];
        if left < 24 {
            return Err(bad(format!("{left} bytes left, a header is 24")));
        }
        input
            .read_exact(&mut header)
            .map_err(|e| bad(format!("truncated: {e}")))?;
        let word = |i: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&header[i * 8..i * 8 + 8]);
            u64::from_be_bytes(bytes)
        };
        let (id, until, size) = (word(0), word(1), word(2));
        left -= 24;
        if size > left {
            return Err(bad(format!(
                "upload {id:016x} of {size} bytes runs past the section"
            )));
        }
        let path = path_of(db, id);
        let mut file = File::create(&path).map_err(io_err(&path))?;
        let copied = std::io::copy(&mut input.take(size), &mut file).map_err(io_err(&path))?;
        if copied != size {
            return Err(bad(format!("upload {id:016x} truncated")));
        }
        file.set_modified(to_time(until))
            .and_then(|_| file.sync_all())
            .map_err(io_err(&path))?;
        left -= size;
    }
    Ok(())
}

/// Bytes as base64 text in the log's JSON (a JSON array of numbers would be
/// about 3.5 bytes a byte; base64 is 4 per 3), by the `base64` crate; as
/// themselves in the binary form (`codec`).
pub(crate) mod base64_text {
    use serde::de::{Error, Visitor};
    use serde::{Deserialize, Deserializer, Serializer};

    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;

    pub fn encode(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    pub fn decode(text: &str) -> Result<Vec<u8>, String> {
        STANDARD
            .decode(text)
            .map_err(|e| format!("not base64: {e}"))
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&encode(bytes))
        } else {
            s.serialize_bytes(bytes)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
            return decode(&text).map_err(Error::custom);
        }
        struct Bytes;
        impl Visitor<'_> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::base64_text::{decode, encode};
    use super::*;
    use kiln_docs::AttachmentError;
    use kiln_docs::{Condition, DocStore, DocsOptions};

    fn store(dir: &Path) -> DocStore {
        store_with(dir, None)
    }

    fn store_with(dir: &Path, key: Option<&MasterKey>) -> DocStore {
        let mut docs = DocsOptions::default();
        docs.storage.journal_file_size_bytes = 1 << 20;
        docs.storage.data_grow_step_bytes = 1 << 20;
        docs.storage.encryption = key.cloned();
        DocStore::open(dir, docs).unwrap()
    }

    /// A snapshot taken between an upload's chunks carries them: a node that
    /// installs it finishes the upload as the leader does; its own uploads that
    /// the snapshot does not hold are gone; the upload expires at leader time.
    #[test]
    fn a_snapshot_carries_uploads_in_progress() {
        snapshot_carries_uploads(None);
    }

    /// The same, encrypted: the upload's file and the snapshot never hold its
    /// bytes in clear, and the node that installs the snapshot (its own data key)
    /// finishes the upload with the same answer.
    #[test]
    fn an_encrypted_databases_uploads_are_never_in_clear() {
        snapshot_carries_uploads(Some(&MasterKey::generate()));
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    fn snapshot_carries_uploads(key: Option<&MasterKey>) {
        let store = |dir: &Path| store_with(dir, key);
        let root = tempfile::tempdir().unwrap();
        let a = store(&root.path().join("a"));
        let db = a.create_database("att").unwrap();
        db.put("d", br#"{"x":1}"#, Condition::None).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
        // Out of order, as proposals in flight may be applied.
        write_chunk(&db, 7, 200_000, 5_000, &data[200_000..]).unwrap();
        write_chunk(&db, 7, 0, 4_000, &data[..200_000]).unwrap();
        let snapshots = crate::snapshot::SnapshotDir::open(&root.path().join("snap")).unwrap();
        let (built, _) = snapshots.build(&a, None).unwrap();
        // In clear exactly when the database is not encrypted.
        let probe = &data[150_000..150_064];
        let upload_file = std::fs::read(path_of(&db, 7)).unwrap();
        let snapshot_file = std::fs::read(&built).unwrap();
        assert_eq!(contains(&upload_file, probe), key.is_none());
        assert_eq!(contains(&snapshot_file, probe), key.is_none());

        let b = store(&root.path().join("b"));
        let other = b.create_database("att").unwrap();
        write_chunk(&other, 9, 0, 1, b"not in the snapshot").unwrap();
        drop(other);
        crate::snapshot::install(&b, &built, None).unwrap();
        let db_b = b.database("att").unwrap();
        let listed: Vec<(u64, u64)> = list(&db_b)
            .unwrap()
            .into_iter()
            .map(|(id, until, _)| (id, until))
            .collect();
        assert_eq!(listed, vec![(7, 5_000)]);
        let on_b = std::fs::read(path_of(&db_b, 7)).unwrap();
        assert_eq!(on_b == data, key.is_none());

        // The same check and attachment on both nodes.
        let mut writer = db.attachment_writer().unwrap();
        writer.write(&data).unwrap();
        let hash = writer.finish().unwrap().hash_hex();
        let mut etags = Vec::new();
        for db in [&db, &db_b] {
            let blob =
                crate::state_machine::finished_upload(db, 7, data.len() as u64, &hash).unwrap();
            let out = db
                .put_attachment_logged(10, 6_000, "d", "f", "x/y", blob, Condition::None)
                .unwrap()
                .unwrap();
            etags.push(out.etag.to_string());
            assert!(db.check_attachments().unwrap().is_ok());
        }
        assert_eq!(etags[0], etags[1]);
        // A short upload is refused alike.
        write_chunk(&db_b, 8, 0, 5_000, &data[..10]).unwrap();
        let short = crate::state_machine::finished_upload(&db_b, 8, data.len() as u64, &hash);
        assert!(
            matches!(
                short,
                Err(DocError::Attachment(AttachmentError::Invalid(_)))
            ),
            "{short:?}"
        );
        // Expired by an entry whose leader time is past its last chunk's time.
        assert_eq!(expire(&db_b, 5_000).unwrap(), 0);
        assert_eq!(expire(&db_b, 5_001).unwrap(), 2);
        assert!(list(&db_b).unwrap().is_empty());
    }

    /// What two nodes do with the same entries: a blob staged by the log is kept
    /// until its leader time runs out at an entry, then freed by it on both; a
    /// purge of tombstones with the leader's bound and cutoff removes the same
    /// tombstones on both, although one node has a consumer that read nothing.
    #[test]
    fn staged_blobs_expire_and_tombstones_purge_at_leader_time() {
        use kiln_docs::{Atomicity, DocId, WriteOp};
        let root = tempfile::tempdir().unwrap();
        let data = b"bytes staged for a batch".to_vec();
        let mut outcomes = Vec::new();
        let mut leader_bound = None;
        for node in ["a", "b"] {
            let s = store(&root.path().join(node));
            let db = s.create_database_with_incarnation("st", 7).unwrap();
            let put = |id: &str| WriteOp::Put {
                id: DocId::Given(id.into()),
                document: db.parse_document(br#"{"n":1}"#).unwrap(),
                condition: Condition::None,
            };
            let delete = |id: &str| WriteOp::Delete {
                id: id.into(),
                condition: Condition::None,
            };
            let ops = vec![put("d0"), put("d1"), put("d2")];
            db.apply_logged(1, 1_000, ops, Atomicity::AllOrNone)
                .unwrap();
            db.apply_logged(2, 2_000, vec![delete("d0")], Atomicity::Each)
                .unwrap();
            db.apply_logged(3, 5_000, vec![delete("d1")], Atomicity::Each)
                .unwrap();
            write_chunk(&db, 3, 0, 9_000, &data).unwrap();
            expire(&db, 5_000).unwrap();
            let mut w = db.attachment_writer().unwrap();
            w.write(&data).unwrap();
            let hash = w.finish().unwrap().hash_hex();
            let path = finished_path(&db, 3, data.len() as u64).unwrap();
            let blob = db
                .attachment_from_upload(&path, &hash, data.len() as u64)
                .unwrap();
            let staged = db.stage_attachment_logged(4, 5_000, blob).unwrap();
            assert_eq!(staged, Some((hash.clone(), data.len() as u64)));
            remove(&db, 3).unwrap();
            let until = 5_000 + kiln_docs::STAGED_TTL_MS;
            // Kept by an entry before its time, freed by the first at it.
            expire(&db, until - 1).unwrap();
            assert_eq!(db.attachment_blobs().unwrap().len(), 1, "node {node}");
            expire(&db, until).unwrap();
            assert!(db.attachment_blobs().unwrap().is_empty(), "node {node}");
            assert!(db.check_attachments().unwrap().is_ok(), "node {node}");

            // The leader's bound (a has no consumer); b's lagging consumer is its
            // own and changes nothing.
            if node == "b" {
                db.set_consumer_position("lagging", 0).unwrap();
            }
            let bound = *leader_bound.get_or_insert(db.tombstone_purge_bound(None).unwrap());
            let out = db
                .purge_tombstones_logged(bound, Some(6_000 - 2_000), Duration::from_secs(5))
                .unwrap();
            let stats = db.tombstone_stats().unwrap();
            outcomes.push((
                out.purged,
                out.remaining,
                out.purged_below_sequence,
                stats.count,
                stats.oldest.map(|e| e.to_string()),
            ));
        }
        assert_eq!(outcomes[0].0, 1, "{outcomes:?}");
        assert_eq!(outcomes[0], outcomes[1]);
    }

    #[test]
    fn base64_round_trips() {
        assert_eq!(encode(b""), "");
        assert_eq!(encode(b"f"), "Zg==");
        assert_eq!(encode(b"fo"), "Zm8=");
        assert_eq!(encode(b"foo"), "Zm9v");
        assert_eq!(encode(b"foobar"), "Zm9vYmFy");
        for n in 0..300usize {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
            assert_eq!(decode(&encode(&bytes)).unwrap(), bytes);
        }
        assert!(decode("Zg=").is_err());
        assert!(decode("Z===").is_err());
        assert!(decode("Zg==Zg==").is_err());
        assert!(decode("Z!==").is_err());
    }
}
