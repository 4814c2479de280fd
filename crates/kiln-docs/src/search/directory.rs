//! Where a full-text index's files live: tantivy's `MmapDirectory` for a plain
//! database; for an encrypted one, [`SealedDirectory`], which keeps every file
//! tantivy writes (segments, `meta.json`, `.managed.json`) sealed as
//! `crate::sealed_file` describes, under the database's key for search files.
//!
//! A file is bound to its index and its name (a segment file copied into another
//! index, or renamed, does not open), sealed in chunks of 16 KiB: tantivy reads
//! small ranges (a term's postings, a block of stored documents), and each read
//! opens only the chunks it covers. What a read returns is plaintext in memory,
//! wiped when tantivy drops it. A read of a whole file (tantivy reads a term
//! dictionary whole when it opens a segment) is kept by the file's handle, and
//! the handles of open files are shared, so a reader reopening a segment after a
//! commit does not decrypt its dictionary again. Locks, deletes, directory syncs
//! and the watch on `meta.json` are the `MmapDirectory`'s.

use super::chunk_cache::{ChunkCache, Plaintext, SharedPlaintext};
use crate::sealed_file::{self, Binding, SealedFile};
use crate::DocError;
use kiln_storage::crypt::SealingKey;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use tantivy::directory::error::{
    DeleteError, LockError, OpenDirectoryError, OpenReadError, OpenWriteError,
};
use tantivy::directory::{
    AntiCallToken, Directory, DirectoryLock, FileHandle, Lock, MmapDirectory, OwnedBytes,
    TerminatingWrite, WatchCallback, WatchHandle, WritePtr,
};
use tantivy::HasLen;

/// The purpose the search files' key is derived for (`Env::derived_key`).
pub(crate) const KEY_PURPOSE: &str = "search-files";
/// Plaintext bytes per sealed chunk (see the module's comment).
const CHUNK_BYTES: usize = 16 << 10;
/// Decrypted chunks kept per index (`chunk_cache`).
const CHUNK_CACHE_BYTES: usize = 16 << 20;
/// Numbers the files opened in this process (a chunk cache's keys).
static NEXT_FILE_NUMBER: AtomicU64 = AtomicU64::new(1);

/// The directory of full-text index `index_id` at `dir` (which must exist),
/// sealed with `key` if the database is encrypted.
pub(crate) fn open(
    dir: &Path,
    index_id: u64,
    key: Option<&Arc<SealingKey>>,
) -> Result<Box<dyn Directory>, OpenDirectoryError> {
    let inner = MmapDirectory::open(dir)?;
    Ok(match key {
        None => Box::new(inner),
        Some(key) => Box::new(SealedDirectory {
            inner,
            root: dir.to_path_buf(),
            index_id,
            key: key.clone(),
            handles: Arc::default(),
            chunks: Arc::new(Mutex::new(ChunkCache::new(CHUNK_CACHE_BYTES))),
        }),
    })
}

/// What file `path` of index `index_id` must be.
fn binding(index_id: u64, path: &Path) -> Binding {
    let mut h = Sha256::new();
    h.update(b"kiln/search-file\0");
    h.update(index_id.to_le_bytes());
    h.update(path.as_os_str().as_encoded_bytes());
    h.finalize().into()
}

/// A full-text index's directory whose files are sealed.
#[derive(Clone)]
pub(crate) struct SealedDirectory {
    inner: MmapDirectory,
    root: PathBuf,
    index_id: u64,
    key: Arc<SealingKey>,
    /// The handles of files open now, shared (see the module's comment).
    handles: Arc<Mutex<HashMap<PathBuf, Weak<SealedHandle>>>>,
    /// Decrypted chunks of this index's files, for the reads after.
    chunks: Arc<Mutex<ChunkCache>>,
}

impl std::fmt::Debug for SealedDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedDirectory")
            .field("root", &self.root)
            .field("index_id", &self.index_id)
            .finish_non_exhaustive()
    }
}

/// A failure to open or read a sealed file, as tantivy's `io::Error` (the message
/// names the file and the chunk).
fn to_io(e: DocError) -> io::Error {
    match e {
        DocError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => source,
        e => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
    }
}

impl SealedDirectory {
    fn open_sealed(&self, path: &Path) -> Result<SealedFile, OpenReadError> {
        let full = self.root.join(path);
        SealedFile::open(
            &full,
            self.key.clone(),
            binding(self.index_id, path),
            format!("full-text index file {}", full.display()),
        )
        .map_err(|e| match to_io(e) {
            e if e.kind() == io::ErrorKind::NotFound => {
                OpenReadError::FileDoesNotExist(path.to_path_buf())
            }
            e => OpenReadError::wrap_io_error(e, path.to_path_buf()),
        })
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Weak<SealedHandle>>> {
        self.handles.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Directory for SealedDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        let mut handles = self.handles();
        if let Some(open) = handles.get(path).and_then(Weak::upgrade) {
            return Ok(open);
        }
        let handle = Arc::new(SealedHandle {
            file: self.open_sealed(path)?,
            whole: OnceLock::new(),
            number: NEXT_FILE_NUMBER.fetch_add(1, Ordering::Relaxed),
            chunks: self.chunks.clone(),
        });
        handles.retain(|_, h| h.strong_count() > 0);
        handles.insert(path.to_path_buf(), Arc::downgrade(&handle));
        Ok(handle)
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        self.handles().remove(path);
        self.inner.delete(path)
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.inner.exists(path)
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        let full = self.root.join(path);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&full)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    OpenWriteError::FileAlreadyExists(path.to_path_buf())
                } else {
                    OpenWriteError::wrap_io_error(e, path.to_path_buf())
                }
            })?;
        let (sealer, placeholder) = sealed_file::ChunkSealer::new(self.key.clone(), CHUNK_BYTES);
        let mut out = BufWriter::with_capacity(4 * CHUNK_BYTES, file);
        out.write_all(&placeholder)
            .map_err(|e| OpenWriteError::wrap_io_error(e, path.to_path_buf()))?;
        Ok(BufWriter::new(Box::new(SealedWriter {
            out,
            sealer,
            len: 0,
            binding: binding(self.index_id, path),
            path: full,
        })))
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        let file = self.open_sealed(path)?;
        let mut out = Vec::with_capacity(file.len() as usize);
        file.read_range(0..file.len(), &mut out)
            .map_err(|e| OpenReadError::wrap_io_error(to_io(e), path.to_path_buf()))?;
        Ok(out)
    }

    fn atomic_write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        let sealed = sealed_file::seal_to_vec(
            self.key.clone(),
            CHUNK_BYTES,
            data,
            &binding(self.index_id, path),
        );
        self.inner.atomic_write(path, &sealed)
    }

    fn sync_directory(&self) -> io::Result<()> {
        self.inner.sync_directory()
    }

    fn acquire_lock(&self, lock: &Lock) -> Result<DirectoryLock, LockError> {
        self.inner.acquire_lock(lock)
    }

    fn watch(&self, watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        self.inner.watch(watch_callback)
    }
}

/// An open sealed file, shared by the readers of its segment.
struct SealedHandle {
    file: SealedFile,
    /// The whole plaintext, once something read it whole.
    whole: OnceLock<OwnedBytes>,
    /// This open's number, its chunks' key in `chunks`.
    number: u64,
    chunks: Arc<Mutex<ChunkCache>>,
}

impl std::fmt::Debug for SealedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.file.fmt(f)
    }
}

impl SealedHandle {
    /// Chunk `i`'s plaintext: from the cache, or decrypted (and kept there).
    fn chunk(&self, i: u64) -> io::Result<Arc<Plaintext>> {
        let lock = || self.chunks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(chunk) = lock().get((self.number, i)) {
            return Ok(chunk);
        }
        let mut buf = Vec::new();
        let plain = match self.file.open_chunk(i, &mut buf) {
            Ok(range) => buf.get(range).unwrap_or_default().to_vec(),
            Err(e) => return Err(to_io(e)),
        };
        sealed_file::wipe(&mut buf);
        let chunk = Arc::new(Plaintext(plain.into_boxed_slice()));
        lock().insert((self.number, i), chunk.clone());
        Ok(chunk)
    }

    /// The plaintext of `range` (within the file, not empty): a slice of its
    /// chunk's when one chunk holds it, else a copy.
    fn read_chunked(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        let size = self.file.chunk_bytes() as usize;
        let (first, last) = (range.start / size, (range.end - 1) / size);
        let short = || {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{:?}: bytes {range:?} past its chunks", self.file),
            )
        };
        if first == last {
            let chunk = self.chunk(first as u64)?;
            let (from, to) = (range.start - first * size, range.end - first * size);
            if to > chunk.len() {
                return Err(short());
            }
            return Ok(OwnedBytes::new(SharedPlaintext(chunk)).slice(from..to));
        }
        let mut out = Vec::with_capacity(range.len());
        for i in first..=last {
            let chunk = self.chunk(i as u64)?;
            let from = range.start.saturating_sub(i * size);
            let to = (range.end - i * size).min(chunk.len());
            out.extend_from_slice(chunk.get(from..to).ok_or_else(short)?);
        }
        if out.len() != range.len() {
            sealed_file::wipe(&mut out);
            return Err(short());
        }
        Ok(OwnedBytes::new(Plaintext(out.into_boxed_slice())))
    }
}

impl HasLen for SealedHandle {
    fn len(&self) -> usize {
        self.file.len() as usize
    }
}

impl FileHandle for SealedHandle {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        if range.start >= range.end {
            return Ok(OwnedBytes::empty());
        }
        let whole = range.start == 0 && range.end == self.len();
        if let Some(bytes) = self.whole.get().filter(|_| whole) {
            return Ok(bytes.clone());
        }
        if !whole {
            return self.read_chunked(range);
        }
        let mut out = Vec::with_capacity(range.len());
        let read = self
            .file
            .read_range(range.start as u64..range.end as u64, &mut out);
        if let Err(e) = read {
            sealed_file::wipe(&mut out);
            return Err(to_io(e));
        }
        if out.len() != range.len() {
            sealed_file::wipe(&mut out);
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{:?}: bytes {range:?} asked of a file of {} bytes",
                    self.file,
                    self.file.len()
                ),
            ));
        }
        let bytes = OwnedBytes::new(Plaintext(out.into_boxed_slice()));
        if whole {
            // Another reader may have set it meanwhile: either copy will do.
            let _ = self.whole.set(bytes.clone());
        }
        Ok(bytes)
    }
}

/// A file being written: plaintext sealed chunk by chunk; the header (length)
/// and the last chunk (bound to the file's name) at `terminate`.
struct SealedWriter {
    out: BufWriter<File>,
    sealer: sealed_file::ChunkSealer,
    len: u64,
    binding: Binding,
    path: PathBuf,
}

impl Write for SealedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sealer.write(buf, &mut self.out)?;
        self.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl TerminatingWrite for SealedWriter {
    fn terminate_ref(&mut self, _: AntiCallToken) -> io::Result<()> {
        let context =
            |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", self.path.display()));
        let header = self
            .sealer
            .finish(self.len, &self.binding, &mut self.out)
            .and_then(|h| self.out.flush().map(|()| h))
            .map_err(context)?;
        let file = self.out.get_ref();
        file.write_all_at(&header, 0)
            .and_then(|()| file.sync_data())
            .map_err(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed_dir(dir: &Path, id: u64, key: &Arc<SealingKey>) -> Box<dyn Directory> {
        open(dir, id, Some(key)).unwrap()
    }

    #[test]
    fn written_files_read_back_in_any_range_and_are_not_in_clear() {
        let tmp = tempfile::tempdir().unwrap();
        let key = Arc::new(SealingKey::generate());
        let d = sealed_dir(tmp.path(), 7, &key);
        let data: Vec<u8> = (0..3 * CHUNK_BYTES + 123)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut w = d.open_write(Path::new("seg.idx")).unwrap();
        for piece in data.chunks(1000) {
            w.write_all(piece).unwrap();
        }
        w.terminate().unwrap();
        assert!(matches!(
            d.open_write(Path::new("seg.idx")),
            Err(OpenWriteError::FileAlreadyExists(_))
        ));
        let on_disk = std::fs::read(tmp.path().join("seg.idx")).unwrap();
        assert!(!on_disk
            .windows(64)
            .any(|w| data.windows(64).next() == Some(w)));
        let slice = d.open_read(Path::new("seg.idx")).unwrap();
        assert_eq!(slice.len(), data.len());
        // Twice: decrypted, then from the chunk cache.
        for pass in 0..2 {
            for r in [
                0..1,
                5..CHUNK_BYTES + 7,
                CHUNK_BYTES - 1..CHUNK_BYTES + 1,
                0..data.len(),
                data.len() - 1..data.len(),
                CHUNK_BYTES..3 * CHUNK_BYTES,
                2 * CHUNK_BYTES + 3..2 * CHUNK_BYTES + 9,
            ] {
                let got = slice.read_bytes_slice(r.clone()).unwrap();
                assert_eq!(got.as_slice(), &data[r.clone()], "pass {pass}, range {r:?}");
            }
        }
        // A whole read is kept and handed out again.
        let again = slice.read_bytes().unwrap();
        assert_eq!(again.as_slice(), &data[..]);
        d.atomic_write(Path::new("meta.json"), b"{\"x\":1}")
            .unwrap();
        assert_eq!(d.atomic_read(Path::new("meta.json")).unwrap(), b"{\"x\":1}");
        assert!(!std::fs::read(tmp.path().join("meta.json"))
            .unwrap()
            .windows(5)
            .any(|w| w == b"\"x\":1"));
        assert!(matches!(
            d.open_read(Path::new("missing")),
            Err(OpenReadError::FileDoesNotExist(_))
        ));
    }

    #[test]
    fn a_file_moved_renamed_or_under_another_key_does_not_open() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let key = Arc::new(SealingKey::generate());
        let d = sealed_dir(&a, 1, &key);
        d.atomic_write(Path::new("one"), b"first").unwrap();
        std::fs::copy(a.join("one"), a.join("two")).unwrap();
        std::fs::copy(a.join("one"), b.join("one")).unwrap();
        let e = d.atomic_read(Path::new("two")).unwrap_err().to_string();
        assert!(e.contains("does not authenticate"), "{e}");
        assert!(sealed_dir(&b, 2, &key)
            .atomic_read(Path::new("one"))
            .is_err());
        let other = Arc::new(SealingKey::generate());
        assert!(sealed_dir(&a, 1, &other)
            .atomic_read(Path::new("one"))
            .is_err());
        assert_eq!(d.atomic_read(Path::new("one")).unwrap(), b"first");
        // A flipped bit names the file and the chunk.
        let mut bytes = std::fs::read(a.join("one")).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(a.join("one"), bytes).unwrap();
        let e = d.atomic_read(Path::new("one")).unwrap_err().to_string();
        assert!(e.contains("chunk 0 of 1") && e.contains("one"), "{e}");
    }
}
