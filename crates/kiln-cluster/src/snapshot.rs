//! Snapshots on disk. A snapshot is every database's backup container, one after
//! another (`name length u32 | name | container length u64 | container`,
//! big-endian), in a file of the snapshot directory: built there by streaming
//! each backup into it, sent from it in chunks, received into a file of its own,
//! installed from it by restoring each database. Before a database's container,
//! a section named `@uploads/<database>` may hold its attachment uploads in
//! progress (see `uploads`); they are restored after the databases. A first
//! section named `@api-keys` holds the cluster's API keys (see `api_keys`), taken
//! as they are when the build begins and put in place after the databases.
//! Nothing holds a whole snapshot
//! in memory: a node with a database larger than its RAM can still send and take
//! one.
//!
//! The directory holds `snapshot-<id>.snap` (the current snapshot; the
//! state machine names it in its state, see `state_machine`), and while work is
//! under way `building-*.tmp` and `receiving-*.tmp`. A file the state does not
//! name is left over from a crash or an older snapshot and is removed.

use crate::api_keys::{self, ApiKeyStore};
use crate::uploads;
use crate::StorageError;
use kiln_docs::DatabaseError;
use kiln_docs::{DocError, DocStore, RestorePoint, RestoreSource};
use openraft::{AnyError, StorageIOError};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

pub(crate) fn snapshot_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    crate::disk_wait::note(e);
    StorageIOError::write_snapshot(None, AnyError::new(e)).into()
}

/// An I/O error with the file it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct SnapshotIoError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| snapshot_err(&SnapshotIoError { what, path, source })
}

/// A snapshot's bytes in a file: what openraft reads a snapshot to send from and
/// writes a received one into (its `SnapshotData`). It knows its path, so that a
/// received file can be renamed into place.
#[derive(Debug)]
pub struct SnapshotFile {
    file: tokio::fs::File,
    path: PathBuf,
}

impl SnapshotFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().file).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> std::io::Result<()> {
        Pin::new(&mut self.get_mut().file).start_seek(position)
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        Pin::new(&mut self.get_mut().file).poll_complete(cx)
    }
}

/// The snapshot directory.
pub struct SnapshotDir {
    dir: PathBuf,
    /// Makes temporary names unique within this process.
    next_temp: AtomicU64,
}

impl SnapshotDir {
    pub fn open(dir: &Path) -> Result<SnapshotDir, StorageError> {
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        Ok(SnapshotDir {
            dir: dir.to_path_buf(),
            next_temp: AtomicU64::new(0),
        })
    }

    /// The file of the snapshot with this id.
    pub fn path_of(&self, snapshot_id: &str) -> PathBuf {
        self.dir.join(format!("snapshot-{snapshot_id}.snap"))
    }

    fn temp_path(&self, kind: &str) -> PathBuf {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("{kind}-{}-{n}.tmp", std::process::id()))
    }

    /// Opens the snapshot `snapshot_id` for reading.
    pub async fn open_snapshot(&self, snapshot_id: &str) -> Result<SnapshotFile, StorageError> {
        let path = self.path_of(snapshot_id);
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(io_err("opening the snapshot", &path))?;
        Ok(SnapshotFile { file, path })
    }

    /// Opens the snapshot `snapshot_id` for reading, from blocking code.
    pub fn open_snapshot_blocking(&self, snapshot_id: &str) -> Result<SnapshotFile, StorageError> {
        let path = self.path_of(snapshot_id);
        let file = File::open(&path).map_err(io_err("opening the snapshot", &path))?;
        Ok(SnapshotFile {
            file: tokio::fs::File::from_std(file),
            path,
        })
    }

    /// A new file to receive a snapshot into.
    pub async fn receiving(&self) -> Result<SnapshotFile, StorageError> {
        let path = self.temp_path("receiving");
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(io_err("creating", &path))?;
        Ok(SnapshotFile { file, path })
    }

    /// Makes a finished file (built or received) the snapshot `snapshot_id`:
    /// synced, renamed, the rename synced.
    pub fn promote(&self, temp: &Path, snapshot_id: &str) -> Result<PathBuf, StorageError> {
        File::open(temp)
            .and_then(|f| f.sync_all())
            .map_err(io_err("syncing", temp))?;
        let path = self.path_of(snapshot_id);
        std::fs::rename(temp, &path).map_err(io_err("renaming into place", temp))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("syncing the directory", &self.dir))?;
        Ok(path)
    }

    /// Removes the snapshots but `keep`; with `temporaries`, the files being
    /// built or received too (only when none can be: at start). A file that
    /// cannot be removed is only reported: it costs space, not correctness.
    pub fn remove_others(&self, keep: Option<&str>, temporaries: bool) {
        let keep = keep.map(|id| self.path_of(id));
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let temporary = path.extension().is_some_and(|e| e == "tmp");
            if Some(&path) == keep.as_ref() || (temporary && !temporaries) {
                continue;
            }
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not remove an old snapshot file");
            }
        }
    }

    /// Writes every database's backup container into a new file and returns its
    /// path (not yet promoted) and size.
    pub fn build(
        &self,
        store: &DocStore,
        api_keys: Option<&dyn ApiKeyStore>,
    ) -> Result<(PathBuf, u64), StorageError> {
        let path = self.temp_path("building");
        let result = write_snapshot(store, api_keys, &path);
        if result.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        result.map(|size| (path, size))
    }
}

/// The database's attachment uploads in progress, as a section `@uploads/<name>`
/// before its backup (see `uploads`); none when it has none.
fn write_uploads_section(
    db: &kiln_docs::Database,
    out: &mut BufWriter<File>,
    path: &Path,
) -> Result<(), StorageError> {
    let name = format!("{}{}", uploads::SECTION_PREFIX, db.name());
    let start = out.stream_position().map_err(io_err("writing", path))?;
    (|| {
        out.write_all(&(name.len() as u32).to_be_bytes())?;
        out.write_all(name.as_bytes())?;
        out.write_all(&0u64.to_be_bytes()) // filled in below
    })()
    .map_err(io_err("writing", path))?;
    let body_at = start + 4 + name.len() as u64 + 8;
    let count = uploads::capture(db, out).map_err(|e| snapshot_err(&e))?;
    let end = out.stream_position().map_err(io_err("writing", path))?;
    let undo_or_fill = if count == 0 {
        out.seek(SeekFrom::Start(start))
            .and_then(|_| out.get_ref().set_len(start))
    } else {
        out.seek(SeekFrom::Start(body_at - 8))
            .and_then(|_| out.write_all(&(end - body_at).to_be_bytes()))
            .and_then(|_| out.seek(SeekFrom::Start(end)).map(|_| ()))
    };
    undo_or_fill.map_err(io_err("writing", path))
}

/// Writes a section `name` holding `body`.
fn write_section(out: &mut impl Write, name: &str, body: &[u8]) -> std::io::Result<()> {
    out.write_all(&(name.len() as u32).to_be_bytes())?;
    out.write_all(name.as_bytes())?;
    out.write_all(&(body.len() as u64).to_be_bytes())?;
    out.write_all(body)
}

fn write_snapshot(
    store: &DocStore,
    api_keys: Option<&dyn ApiKeyStore>,
    path: &Path,
) -> Result<u64, StorageError> {
    let file = File::create(path).map_err(io_err("creating", path))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    if let Some(keys) = api_keys {
        let exported = keys.export().map_err(|e| {
            snapshot_err(&std::io::Error::other(format!("reading the API keys: {e}")))
        })?;
        write_section(&mut out, api_keys::SECTION, &exported).map_err(io_err("writing", path))?;
    }
    let mut names = store.database_names();
    names.sort();
    for name in names {
        let Ok(db) = store.database(&name) else {
            continue; // deleted meanwhile: its delete entry is applied after this
        };
        write_uploads_section(&db, &mut out, path)?;
        let header = (|| {
            out.write_all(&(name.len() as u32).to_be_bytes())?;
            out.write_all(name.as_bytes())?;
            let length_at = out.stream_position()?;
            out.write_all(&0u64.to_be_bytes())?; // filled in below
            Ok::<u64, std::io::Error>(length_at)
        })();
        let length_at = header.map_err(io_err("writing", path))?;
        match db.backup_to(&mut out, Default::default(), |_| {}) {
            Ok(_) => {}
            Err(DocError::Database(DatabaseError::NotFound(_))) => {
                // Deleted while being backed up: take its header back out.
                let undo = out.seek(SeekFrom::Start(length_at - 4 - name.len() as u64));
                undo.and_then(|_| out.get_ref().set_len(length_at - 4 - name.len() as u64))
                    .map_err(io_err("truncating", path))?;
                continue;
            }
            Err(e) => return Err(snapshot_err(&e)),
        }
        let end = out.stream_position().map_err(io_err("writing", path))?;
        let container_len = end - length_at - 8;
        out.seek(SeekFrom::Start(length_at))
            .and_then(|_| out.write_all(&container_len.to_be_bytes()))
            .and_then(|_| out.seek(SeekFrom::Start(end)))
            .map_err(io_err("writing", path))?;
    }
    out.flush().map_err(io_err("writing", path))?;
    out.get_ref()
        .metadata()
        .map(|m| m.len())
        .map_err(io_err("reading the size of", path))
}

/// Replaces the store's databases with those of the snapshot file at `path`: each
/// restored (replacing the one of its name), then any database the snapshot does
/// not hold deleted. A crash part way leaves some databases replaced: the node's
/// applied state still says the older point, so it is sent the snapshot again,
/// and a restore of a database is itself all or nothing.
pub fn install(
    store: &DocStore,
    path: &Path,
    api_keys: Option<&dyn ApiKeyStore>,
) -> Result<(), StorageError> {
    let file = File::open(path).map_err(io_err("opening", path))?;
    let size = file.metadata().map_err(io_err("reading", path))?.len();
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut kept = Vec::new();
    let mut uploads_sections = Vec::new();
    let mut keys = None;
    let mut at = 0u64;
    while at < size {
        let section = read_section_header(&mut input, path, at, size)?;
        at = section.at + section.len;
        if section.name == api_keys::SECTION {
            // Small (records of keys); put in place once the databases are.
            let mut bytes = Vec::new();
            (&mut input)
                .take(section.len)
                .read_to_end(&mut bytes)
                .map_err(io_err("reading", path))?;
            keys = Some(bytes);
        } else if section.name.starts_with(uploads::SECTION_PREFIX) {
            // Restored once every database is (a restore replaces its directory).
            uploads_sections.push(section);
        } else {
            let container = (&mut input).take(section.len);
            store
                .restore_database(
                    RestoreSource::Stream(Box::new(container)),
                    &section.name,
                    true,
                    RestorePoint::Latest,
                    |_| {},
                )
                .map_err(|e| snapshot_err(&e))?;
            kept.push(section.name);
        }
        // To the next section: a restore may stop reading before the container's
        // end (its trailer).
        input
            .seek(SeekFrom::Start(at))
            .map_err(io_err("seeking in", path))?;
    }
    for name in store.database_names() {
        if !kept.contains(&name) {
            store.delete_database(&name).map_err(|e| snapshot_err(&e))?;
        }
    }
    restore_uploads(store, &mut input, path, uploads_sections)?;
    // A snapshot from a build that carried no keys leaves this node's as they are.
    if let (Some(store_keys), Some(bytes)) = (api_keys, keys) {
        store_keys.import(&bytes).map_err(|e| {
            snapshot_err(&std::io::Error::other(format!(
                "installing the API keys: {e}"
            )))
        })?;
    }
    Ok(())
}

/// A section of a snapshot file: a database's backup container, or the uploads
/// of one (named `@uploads/<database>`), of `len` bytes at offset `at`.
struct Section {
    name: String,
    at: u64,
    len: u64,
}

/// Reads and checks the header of the section at offset `at` of the snapshot
/// file at `path` (of `size` bytes), leaving `input` at the section's bytes.
fn read_section_header(
    input: &mut impl Read,
    path: &Path,
    at: u64,
    size: u64,
) -> Result<Section, StorageError> {
    let bad = |what: String| {
        snapshot_err(&std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("snapshot {}: {what}", path.display()),
        ))
    };
    let mut read_exact = |buf: &mut [u8]| -> Result<(), StorageError> {
        input
            .read_exact(buf)
            .map_err(|e| bad(format!("truncated at offset {at}: {e}")))
    };
    let mut u32_bytes = [0u8; 4];
    read_exact(&mut u32_bytes)?;
    let name_len = u32::from_be_bytes(u32_bytes) as usize;
    if name_len > 1024 {
        return Err(bad(format!(
            "a database name of {name_len} bytes at offset {at}"
        )));
    }
    let mut name = vec![0u8; name_len];
    read_exact(&mut name)?;
    let name = String::from_utf8(name)
        .map_err(|_| bad(format!("the database name at offset {at} is not UTF-8")))?;
    let mut u64_bytes = [0u8; 8];
    read_exact(&mut u64_bytes)?;
    let container_len = u64::from_be_bytes(u64_bytes);
    let container_at = at + 4 + name_len as u64 + 8;
    if container_at + container_len > size {
        return Err(bad(format!(
            "database {name:?}: a backup of {container_len} bytes at offset {container_at} \
             runs past the end ({size} bytes)"
        )));
    }
    Ok(Section {
        name,
        at: container_at,
        len: container_len,
    })
}

/// Replaces the store's attachment uploads in progress with the snapshot's
/// `sections` of them, read from `input` (the snapshot file at `path`).
fn restore_uploads(
    store: &DocStore,
    input: &mut BufReader<File>,
    path: &Path,
    sections: Vec<Section>,
) -> Result<(), StorageError> {
    // The uploads in progress are the snapshot's, none other.
    for name in store.database_names() {
        if let Ok(db) = store.database(&name) {
            uploads::clear(&db).map_err(|e| snapshot_err(&e))?;
        }
    }
    for section in sections {
        let name = &section.name[uploads::SECTION_PREFIX.len()..];
        let Ok(db) = store.database(name) else {
            continue; // deleted while the snapshot was built: its uploads went with it
        };
        input
            .seek(SeekFrom::Start(section.at))
            .map_err(io_err("seeking in", path))?;
        uploads::restore(&db, &mut input.by_ref().take(section.len), section.len)
            .map_err(|e| snapshot_err(&e))?;
    }
    Ok(())
}
