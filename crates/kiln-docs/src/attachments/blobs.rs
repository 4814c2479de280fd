//! The blob store: attachment bytes as files named by their SHA-256, under the
//! database's directory:
//!
//! ```text
//! <database dir>/attachments/<first 2 hex digits>/<64 hex digits>   a blob
//! <database dir>/attachments/tmp/<unique>                           an upload in progress
//! ```
//!
//! Crash safety (what a kill -9 at any point leaves, and what `gc` at open makes
//! of it):
//!
//! | crash while / after            | on disk                       | after `gc`          |
//! |--------------------------------|-------------------------------|---------------------|
//! | streaming into `tmp/`          | a partial tmp file            | tmp emptied         |
//! | renamed, commit not durable    | a blob without a ref entry    | blob unlinked       |
//! | commit durable                 | blob + ref entry + document   | kept                |
//! | count reached 0, before unlink | a blob without a ref entry    | blob unlinked       |
//!
//! A blob is renamed into place (and its directory fsynced) before the commit
//! that makes a document name it, so a committed document never names a missing
//! blob; and `gc` unlinks every blob the committed ref tree does not name, so no
//! space leaks. The `lock` orders "place a blob, then commit its reference" against
//! "see a count at zero, then unlink": a blob is only unlinked after checking,
//! under the lock, that the latest commit has no reference to it.
//!
//! In an encrypted database (its environment is: `Env::is_encrypted`) a blob's
//! file is sealed (`sealed.rs`: a header, then the bytes in chunks sealed with a
//! key derived from the environment's data key), still named by the SHA-256 of
//! its plaintext; a plain database's files are the bytes themselves. Every reader
//! goes through [`BlobStore::open_blob`], a [`BlobReader`] of the plaintext of
//! either kind; a sealed file is never copied as it is to another database or
//! node (its key is not theirs): backups, snapshots and exports read the
//! plaintext, and the receiving side writes it through its own `BlobWriter`.
//!
//! A backup pins the blobs its snapshot references (`pinned_snapshot`, under the
//! lock, so no unlink falls between the snapshot and the pin): while pinned, a
//! blob freed by a later write is not unlinked but deferred, and released (the
//! latest commit checked again) when the last pin on it goes. A crash meanwhile
//! leaves a blob without a ref entry: `gc` at the next open unlinks it.

use super::{hash_hex, Hash, RefEntry};
use crate::model::schema::ATTACHMENT_REFS;
use crate::sealed_file::{self as sealed, ChunkSealer, Sealed};
use crate::DocumentError;
use crate::{DocError, Result};
use kiln_storage::crypt::SealingKey;
use kiln_storage::{Env, ReadTxn};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The buffer between an upload and its file: large writes keep the disk busy.
const WRITE_BUFFER_BYTES: usize = 4 << 20;
/// The purpose the blob key is derived for (`Env::derived_key`).
const KEY_PURPOSE: &str = "attachment-blobs";
/// Plaintext bytes per sealed chunk: a download or range opens whole chunks.
const CHUNK_BYTES: usize = 64 << 10;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DocError + '_ {
    move |source| DocError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How the bytes of an upload file are read when the file is not plaintext.
pub type UploadDecoder<'a> = dyn Fn(File) -> std::io::Result<Box<dyn Read>> + 'a;

pub(crate) struct BlobStore {
    dir: PathBuf,
    /// The key blobs are sealed with (an encrypted database), else `None`: plain
    /// files.
    key: Option<Arc<SealingKey>>,
    lock: parking_lot::Mutex<()>,
    next_tmp: AtomicU64,
    /// Hashes whose count reached zero in a write not yet followed by `release`.
    pending: parking_lot::Mutex<Vec<Hash>>,
    /// Blobs backups are reading, and the unlinks held off for them.
    pins: parking_lot::Mutex<Pins>,
    /// No staged blob's time runs out before this (0: not known yet, look). It
    /// lets `Database::expire_staged_attachments` skip its scan of the reference
    /// tree, which a cluster's node calls at every log entry of the database.
    /// Written under `lock` (staging holds it too).
    staged_due_ms: AtomicU64,
}

#[derive(Default)]
struct Pins {
    /// Per pinned hash, the backups that pin it.
    counts: HashMap<Hash, u32>,
    /// Pinned hashes a release found unreferenced: released when unpinned.
    deferred: Vec<Hash>,
}

/// The blobs a backup's snapshot references, kept on disk until it is dropped.
pub(crate) struct BlobPin<'a> {
    store: &'a BlobStore,
    env: &'a Env,
    hashes: Vec<Hash>,
}

impl BlobPin<'_> {
    /// The pinned hashes (every blob the snapshot's reference tree names), in
    /// hash order.
    pub fn hashes(&self) -> &[Hash] {
        &self.hashes
    }
}

impl Drop for BlobPin<'_> {
    fn drop(&mut self) {
        let due: Vec<Hash> = {
            let mut pins = self.store.pins.lock();
            for h in &self.hashes {
                if let Some(n) = pins.counts.get_mut(h) {
                    *n -= 1;
                    if *n == 0 {
                        pins.counts.remove(h);
                    }
                }
            }
            let Pins { counts, deferred } = &mut *pins;
            let (due, keep): (Vec<Hash>, Vec<Hash>) =
                deferred.drain(..).partition(|h| !counts.contains_key(h));
            *deferred = keep;
            due
        };
        if let Err(e) = self.store.release(self.env, &due) {
            // The files go at the next open (`gc`).
            tracing::warn!(error = %e, "attachments: could not unlink blobs a backup had pinned");
        }
    }
}

/// Streams an upload into a temporary file, hashing and counting it (sealing it
/// chunk by chunk in an encrypted database). Dropped unfinished, it removes its
/// file.
pub struct BlobWriter {
    file: Option<std::io::BufWriter<File>>,
    path: PathBuf,
    hasher: Sha256,
    size_bytes: u64,
    /// An encrypted database's: the bytes go through it.
    sealer: Option<ChunkSealer>,
}

/// An upload written and fsynced, not yet placed in the store. Dropped unused, it
/// removes its file.
#[derive(Debug)]
pub struct StagedBlob {
    pub(crate) tmp: PathBuf,
    pub hash: Hash,
    pub size_bytes: u64,
}

impl StagedBlob {
    /// The SHA-256 of the bytes, lower-case hex.
    pub fn hash_hex(&self) -> String {
        hash_hex(&self.hash)
    }
}

impl Drop for StagedBlob {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl BlobWriter {
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.hasher.update(bytes);
        self.size_bytes += bytes.len() as u64;
        let file = self.file.as_mut().ok_or_else(|| {
            DocError::Internal("an attachment writer was used after it finished".into())
        })?;
        match self.sealer.as_mut() {
            Some(sealer) => sealer.write(bytes, file),
            None => file.write_all(bytes),
        }
        .map_err(io_err(&self.path))
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Flushes and fsyncs the file: the bytes are durable, under their hash.
    pub fn finish(mut self) -> Result<StagedBlob> {
        let mut file = self
            .file
            .take()
            .ok_or_else(|| DocError::Internal("an attachment writer finished twice".into()))?;
        let hash: Hash = std::mem::take(&mut self.hasher).finalize().into();
        let header = match self.sealer.as_mut() {
            Some(sealer) => Some(
                sealer
                    .finish(self.size_bytes, &hash, &mut file)
                    .map_err(io_err(&self.path))?,
            ),
            None => None,
        };
        let file = file
            .into_inner()
            .map_err(|e| io_err(&self.path)(e.into_error()))?;
        if let Some(header) = header {
            // The length is known now: the header goes over its placeholder.
            file.write_all_at(&header, 0).map_err(io_err(&self.path))?;
        }
        file.sync_data().map_err(io_err(&self.path))?;
        Ok(StagedBlob {
            tmp: std::mem::take(&mut self.path),
            hash,
            size_bytes: self.size_bytes,
        })
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            self.file = None;
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What `kiln check` finds in a database's attachments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachmentCheck {
    /// Blobs with a reference entry, and their bytes.
    pub blobs: u64,
    pub bytes: u64,
    /// Hashes with a reference entry and no file.
    pub missing: Vec<String>,
    /// Hashes whose file's bytes do not hash to the name, or whose size differs.
    pub corrupt: Vec<String>,
    /// Files no reference entry names (freed at the next open).
    pub unreferenced: Vec<String>,
    /// Hashes whose count differs from the documents' entries naming them:
    /// (hash, counted in the tree, named by documents).
    pub miscounted: Vec<(String, u64, u64)>,
}

impl AttachmentCheck {
    pub fn is_ok(&self) -> bool {
        self.missing.is_empty()
            && self.corrupt.is_empty()
            && self.unreferenced.is_empty()
            && self.miscounted.is_empty()
    }
}

/// A blob's plaintext, read and seeked like a file, whether its file is plain or
/// sealed (`BlobStore::open_blob`). A sealed blob is opened a chunk at a time, as
/// it is read (a chunk that does not authenticate is an error naming the file and
/// the chunk, never wrong bytes); the chunk's plaintext is wiped when the next is
/// opened and when the reader is dropped. The file stays readable if the blob is
/// unlinked while it is read.
pub struct BlobReader {
    path: PathBuf,
    len: u64,
    body: Body,
}

enum Body {
    Plain(File),
    Sealed { blob: Box<Sealed>, pos: u64 },
}

impl std::fmt::Debug for BlobReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobReader")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("sealed", &self.is_sealed())
            .finish()
    }
}

impl BlobReader {
    /// The plaintext's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the file is sealed (an encrypted database's).
    pub fn is_sealed(&self) -> bool {
        matches!(self.body, Body::Sealed { .. })
    }

    /// The blob's file (for messages: a sealed file's bytes are not the blob's).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A plain blob's file, whose bytes are the blob's (for readers that use the
    /// file itself: `O_DIRECT`, `sendfile`), at its current position; a sealed
    /// blob's reader is given back.
    pub fn into_plain_file(self) -> std::result::Result<File, BlobReader> {
        match self.body {
            Body::Plain(file) => Ok(file),
            Body::Sealed { .. } => Err(self),
        }
    }

    /// `Read::read` with this layer's errors (a sealed chunk that does not
    /// authenticate is `DocError::Storage(Corrupted)`).
    pub fn read_plain(&mut self, buf: &mut [u8]) -> Result<usize> {
        match &mut self.body {
            Body::Plain(file) => loop {
                match file.read(buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    other => return other.map_err(io_err(&self.path)),
                }
            },
            Body::Sealed { blob, pos } => {
                let n = blob.read_at(*pos, buf)?;
                *pos += n as u64;
                Ok(n)
            }
        }
    }

    /// The SHA-256 and length of the rest of the plaintext.
    fn hash_rest(&mut self) -> Result<(Hash, u64)> {
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = self.read_plain(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(buf.get(..n).unwrap_or_default());
            size += n as u64;
        }
        if self.is_sealed() {
            sealed::wipe(&mut buf);
        }
        Ok((hasher.finalize().into(), size))
    }
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_plain(buf).map_err(|e| {
            let kind = match &e {
                DocError::Io { source, .. } => source.kind(),
                _ => std::io::ErrorKind::InvalidData,
            };
            std::io::Error::new(kind, e)
        })
    }
}

impl Seek for BlobReader {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let len = self.len;
        match &mut self.body {
            Body::Plain(file) => file.seek(to),
            Body::Sealed { pos, .. } => {
                let new = match to {
                    SeekFrom::Start(n) => Some(n),
                    SeekFrom::End(d) => len.checked_add_signed(d),
                    SeekFrom::Current(d) => pos.checked_add_signed(d),
                };
                *pos = new.ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "a seek before the start of an attachment blob",
                    )
                })?;
                Ok(*pos)
            }
        }
    }
}

impl BlobStore {
    /// The store of the database at `db_dir` (its directories made if missing),
    /// whose environment is `env` (encrypted: blobs are sealed).
    pub fn open(db_dir: &Path, env: &Env) -> Result<BlobStore> {
        let store = BlobStore::at(db_dir, env);
        let tmp = store.dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
        Ok(store)
    }

    /// The store of the database at `db_dir`, as it is (for a check: nothing made).
    pub fn at(db_dir: &Path, env: &Env) -> BlobStore {
        BlobStore {
            dir: db_dir.join("attachments"),
            key: env.derived_key(KEY_PURPOSE).map(Arc::new),
            lock: parking_lot::Mutex::new(()),
            next_tmp: AtomicU64::new(0),
            pending: Default::default(),
            pins: Default::default(),
            staged_due_ms: AtomicU64::new(0),
        }
    }

    /// The file of the blob `hash` (sealed in an encrypted database: read it with
    /// `open_blob`, never copy it to another database or node).
    pub fn blob_path(&self, hash: &Hash) -> PathBuf {
        let hex = hash_hex(hash);
        self.dir.join(&hex[..2]).join(hex)
    }

    /// Whether this store seals its blobs (the database is encrypted).
    pub fn seals(&self) -> bool {
        self.key.is_some()
    }

    /// The blob `hash`'s plaintext. A missing file is `DocError::Io` (NotFound);
    /// a sealed file whose header or last chunk does not check out is
    /// `DocError::Storage(Corrupted)`, naming it.
    pub fn open_blob(&self, hash: &Hash) -> Result<BlobReader> {
        let path = self.blob_path(hash);
        let (len, body) = match &self.key {
            None => {
                let file = File::open(&path).map_err(io_err(&path))?;
                let len = file.metadata().map_err(io_err(&path))?.len();
                (len, Body::Plain(file))
            }
            Some(key) => {
                let blob = Sealed::open(
                    &path,
                    key.clone(),
                    *hash,
                    format!("attachment blob {}", hash_hex(hash)),
                )?;
                (
                    blob.len(),
                    Body::Sealed {
                        blob: Box::new(blob),
                        pos: 0,
                    },
                )
            }
        };
        Ok(BlobReader { path, len, body })
    }

    /// The SHA-256 and length of the blob `hash`'s plaintext (errors as
    /// `open_blob`).
    pub fn hash_blob(&self, hash: &Hash) -> Result<(Hash, u64)> {
        match &self.key {
            None => hash_file(&self.blob_path(hash)),
            Some(_) => self.open_blob(hash)?.hash_rest(),
        }
    }

    /// The bytes of the (plain) file at `path` written into the store: an
    /// import, a cluster's upload. Its NotFound is `DocError::Io` on `path`.
    pub fn stage_copy(&self, path: &Path) -> Result<StagedBlob> {
        self.stage_copy_through(path, None)
    }

    /// `stage_copy`, the file's bytes read through `decode` if given (an upload
    /// a cluster keeps encrypted, decrypted on the way).
    pub fn stage_copy_through(
        &self,
        path: &Path,
        decode: Option<&UploadDecoder<'_>>,
    ) -> Result<StagedBlob> {
        let mut writer = self.writer()?;
        let file = File::open(path).map_err(io_err(path))?;
        let mut file: Box<dyn Read> = match decode {
            Some(decode) => decode(file).map_err(io_err(path))?,
            None => Box::new(file),
        };
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match file.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err(path)(e)),
            };
            if n == 0 {
                break;
            }
            writer.write(buf.get(..n).unwrap_or_default())?;
        }
        if self.seals() {
            sealed::wipe(&mut buf);
        }
        writer.finish()
    }

    pub fn writer(&self) -> Result<BlobWriter> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = self
            .dir
            .join("tmp")
            .join(format!("{}-{nanos}-{n}", std::process::id()));
        let file = File::create(&path).map_err(io_err(&path))?;
        let mut file = std::io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        let sealer = match &self.key {
            Some(key) => {
                let (sealer, placeholder) = ChunkSealer::new(key.clone(), CHUNK_BYTES);
                file.write_all(&placeholder).map_err(io_err(&path))?;
                Some(sealer)
            }
            None => None,
        };
        Ok(BlobWriter {
            file: Some(file),
            path,
            hasher: Sha256::new(),
            size_bytes: 0,
            sealer,
        })
    }

    /// Holds off unlinks (`release`) while a blob is placed and its reference
    /// committed.
    pub fn lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// Puts an upload in place under its hash (the caller holds `lock`); if the
    /// store has the bytes already, the upload's file is removed instead.
    pub fn place(&self, mut staged: StagedBlob) -> Result<()> {
        let path = self.blob_path(&staged.hash);
        let tmp = std::mem::take(&mut staged.tmp);
        if path.exists() {
            return std::fs::remove_file(&tmp).map_err(io_err(&tmp));
        }
        let parent = path.parent().unwrap_or(&self.dir).to_path_buf();
        if !parent.exists() {
            std::fs::create_dir(&parent).map_err(io_err(&parent))?;
            sync_dir(&self.dir)?;
        }
        std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(&parent)
    }

    /// Hashes a write freed (called inside its transaction); `release_pending`
    /// unlinks them after the commit.
    pub fn freed(&self, hashes: Vec<Hash>) {
        self.pending.lock().extend(hashes);
    }

    /// Unlinks the blobs that writes freed, if the latest commit still has no
    /// reference to them (a write that freed one may have rolled back, or a later
    /// one named it again).
    pub fn release_pending(&self, env: &Env) -> Result<()> {
        let freed = std::mem::take(&mut *self.pending.lock());
        self.release(env, &freed)
    }

    /// Unlinks the blobs of `freed` that the latest commit does not reference.
    pub fn release(&self, env: &Env, freed: &[Hash]) -> Result<()> {
        if freed.is_empty() {
            return Ok(());
        }
        let _guard = self.lock();
        let r = env.begin_read()?;
        for hash in freed {
            // A staged blob a write stopped naming before its time ran out
            // (`adjust`): it now waits for expiry, which must not skip it.
            if let Some(raw) = r.get(ATTACHMENT_REFS, hash)? {
                let e = RefEntry::decode(hash, raw)?;
                if e.refs == 0 {
                    self.note_staged(e.staged_until_ms);
                }
            }
        }
        for hash in freed {
            if r.get(ATTACHMENT_REFS, hash)?.is_none() {
                let mut pins = self.pins.lock();
                if pins.counts.contains_key(hash) {
                    // A backup reads it: unlinked when the backup is done.
                    pins.deferred.push(*hash);
                    continue;
                }
                drop(pins);
                self.unlink(hash)?;
            }
        }
        Ok(())
    }

    /// A read snapshot of `env` and a pin on every blob its reference tree names,
    /// taken together under the lock (no unlink between them): what a backup reads.
    pub fn pinned_snapshot<'e>(&'e self, env: &'e Env) -> Result<(ReadTxn<'e>, BlobPin<'e>)> {
        let _guard = self.lock();
        let r = env.begin_read()?;
        let mut hashes = Vec::new();
        if r.tree_exists(ATTACHMENT_REFS)? {
            let mut cursor = r.cursor(ATTACHMENT_REFS)?;
            let mut entry = cursor.first()?;
            while let Some((raw, _)) = entry {
                if let Ok(h) = Hash::try_from(raw) {
                    hashes.push(h);
                }
                entry = cursor.next()?;
            }
        }
        let mut pins = self.pins.lock();
        for h in &hashes {
            *pins.counts.entry(*h).or_default() += 1;
        }
        drop(pins);
        Ok((
            r,
            BlobPin {
                store: self,
                env,
                hashes,
            },
        ))
    }

    fn unlink(&self, hash: &Hash) -> Result<()> {
        let path = self.blob_path(hash);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&path)(e)),
            _ => Ok(()),
        }
    }

    /// At open: empties `tmp/`, frees staged blobs past their time, and unlinks
    /// every blob no reference entry names (see the module's table). Returns the
    /// number of files removed.
    pub fn gc(&self, env: &Env, now_ms: u64) -> Result<u64> {
        let _guard = self.lock();
        let mut removed = 0;
        let tmp = self.dir.join("tmp");
        for entry in std::fs::read_dir(&tmp).map_err(io_err(&tmp))? {
            let path = entry.map_err(io_err(&tmp))?.path();
            std::fs::remove_file(&path).map_err(io_err(&path))?;
            removed += 1;
        }
        let expired = self.expired_staged(env, now_ms)?;
        if !expired.is_empty() {
            env.submit(move |w| {
                for hash in &expired {
                    w.delete(ATTACHMENT_REFS, hash)?;
                }
                Ok(())
            })?;
        }
        let r = env.begin_read()?;
        for (hash, path) in self.files()? {
            let referenced = match hash {
                Some(h) => r.get(ATTACHMENT_REFS, &h)?.is_some(),
                None => false,
            };
            if !referenced {
                std::fs::remove_file(&path).map_err(io_err(&path))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The hashes of staged blobs no document names whose time ran out at `now_ms`.
    pub fn expired_staged(&self, env: &Env, now_ms: u64) -> Result<Vec<Vec<u8>>> {
        Ok(self.expired_staged_and_due(env, now_ms)?.0)
    }

    /// `expired_staged`, and the earliest time a staged blob's time runs out
    /// after `now_ms` (`u64::MAX`: none). A blob whose time ran out while a
    /// document names it is freed by the write that drops its last reference
    /// (`adjust`), not by expiry: it does not count.
    pub fn expired_staged_and_due(&self, env: &Env, now_ms: u64) -> Result<(Vec<Vec<u8>>, u64)> {
        let r = env.begin_read()?;
        let mut cursor = r.cursor(ATTACHMENT_REFS)?;
        let mut entry = cursor.first()?;
        let mut out = Vec::new();
        let mut due_ms = u64::MAX;
        while let Some((hash, raw)) = entry {
            let e = RefEntry::decode(hash, raw)?;
            if e.refs == 0 && e.staged_until_ms <= now_ms {
                out.push(hash.to_vec());
            } else if e.staged_until_ms > now_ms {
                due_ms = due_ms.min(e.staged_until_ms);
            }
            entry = cursor.next()?;
        }
        Ok((out, due_ms))
    }

    /// Whether a staged blob's time may have run out at `now_ms` (see
    /// `staged_due_ms`).
    pub fn staged_may_be_due(&self, now_ms: u64) -> bool {
        now_ms >= self.staged_due_ms.load(Ordering::SeqCst)
    }

    /// Records when staged blobs next run out (the caller holds `lock`).
    pub fn set_staged_due(&self, due_ms: u64) {
        self.staged_due_ms.store(due_ms, Ordering::SeqCst);
    }

    /// A blob was staged until `until_ms` (the caller holds `lock`).
    pub fn note_staged(&self, until_ms: u64) {
        self.staged_due_ms.fetch_min(until_ms, Ordering::SeqCst);
    }

    /// Every file of the store's blob directories, with the hash its name gives
    /// (`None`: a name that is no hash).
    pub fn files(&self) -> Result<Vec<(Option<Hash>, PathBuf)>> {
        let mut out = Vec::new();
        if !self.dir.exists() {
            return Ok(out);
        }
        for entry in std::fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let entry = entry.map_err(io_err(&self.dir))?;
            let name = entry.file_name();
            let is_fanout = name.len() == 2 && entry.path().is_dir();
            if !is_fanout {
                continue;
            }
            let sub = entry.path();
            for file in std::fs::read_dir(&sub).map_err(io_err(&sub))? {
                let file = file.map_err(io_err(&sub))?;
                let hash = file
                    .file_name()
                    .to_str()
                    .and_then(|n| super::parse_hash(n).ok());
                out.push((hash, file.path()));
            }
        }
        Ok(out)
    }

    /// Re-hashes every blob the ref tree names and looks for files it does not.
    pub fn check(&self, env: &Env) -> Result<AttachmentCheck> {
        let mut report = AttachmentCheck::default();
        let r = env.begin_read()?;
        let mut cursor = r.cursor(ATTACHMENT_REFS)?;
        let mut entry = cursor.first()?;
        while let Some((raw_hash, raw)) = entry {
            let e = RefEntry::decode(raw_hash, raw)?;
            let hash: Hash = raw_hash.try_into().map_err(|_| {
                DocError::Document(DocumentError::Corrupt {
                    id: "(attachment refs)".into(),
                    why: format!("a key of {} bytes is no SHA-256", raw_hash.len()),
                })
            })?;
            report.blobs += 1;
            report.bytes += e.size_bytes;
            // A sealed blob is hashed by its plaintext; one that does not
            // authenticate is corrupt as one that hashes wrong.
            match self.hash_blob(&hash) {
                Ok((h, size)) if h == hash && size == e.size_bytes => {}
                Ok(_) => report.corrupt.push(hash_hex(&hash)),
                Err(DocError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    report.missing.push(hash_hex(&hash))
                }
                Err(DocError::Storage(kiln_storage::Error::Corrupted {
                    path,
                    location,
                    what,
                    ..
                })) => {
                    tracing::warn!(file = %path.display(), %location, %what, "attachments: a sealed blob does not authenticate");
                    report.corrupt.push(hash_hex(&hash))
                }
                Err(other) => return Err(other),
            }
            entry = cursor.next()?;
        }
        for (hash, path) in self.files()? {
            let referenced = match hash {
                Some(h) => r.get(ATTACHMENT_REFS, &h)?.is_some(),
                None => false,
            };
            if !referenced {
                report.unreferenced.push(path.display().to_string());
            }
        }
        Ok(report)
    }
}

/// The SHA-256 and length of a plain file, read in large blocks (a sealed blob:
/// `BlobStore::hash_blob`).
pub(crate) fn hash_file(path: &Path) -> Result<(Hash, u64)> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hasher.finalize().into(), size))
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}
