//! Full-text indexes in backups: a full backup carries, per full-text index, one
//! tantivy commit (its `meta.json` and the segment files it names) as the
//! container's extra files `search/<index id>/<file>`, so that a restore resumes
//! each index from that commit's sequence instead of rebuilding it.
//!
//! Consistency: each commit is pinned BEFORE the database snapshot is taken, and a
//! commit's payload sequence never exceeds the database's last sequence when it was
//! made (the indexer reads a snapshot), so the sequence shipped is at or below the
//! backup's point, and the restored database holds every change after it (a restore
//! only goes forward from the full backup's point). Tantivy's garbage collection
//! must not delete a file being copied; `pin` relies on three things of tantivy
//! 0.27: it holds `META_LOCK` while it loads the index's metas and opens every file
//! they name, and the collector picks the files to delete under that same lock (as
//! tantivy's own readers rely on to open segments); the metas are loaded through
//! the writer's `Index`, so their segment metas are tracked in its inventory, whose
//! files the collector counts as living while they are held (until every file is
//! open); and a file open here stays readable after an unlink (Unix). Segment files
//! and `meta.json` are never rewritten in place (new names, atomic renames). The
//! `meta.json` shipped is the metas loaded, serialized as tantivy writes them.
//! (`tests/docs/search_backup.rs` takes backups while rewrites commit new delete files
//! and the old ones are collected; without the lock and the held metas, with a
//! pause before the files are opened, its restored indexes come out unusable.)
//!
//! A restore writes the files into the staged database's `search/<id>/` (the
//! `meta.json` comes last in the backup, so a partial set has none and is rebuilt),
//! then `check_restored` writes tantivy's `.managed.json` (so its garbage collector
//! owns the restored segments) and checks each index: it opens, every file's
//! checksum passes, a reader opens, its payload parses. An index that fails is
//! removed with a warning: the database's open rebuilds it, as for a backup written
//! before search files were carried. An index whose payload is of another index or
//! incarnation, or ahead of the restored database, is rebuilt at open as before
//! (`SearchIndex::open`).

use super::{tantivy_err, Payload, SearchIndex, SEARCH_DIR};
use crate::IndexError;
use crate::{DocError, Result};
use kiln_storage::crypt::SealingKey;
use kiln_storage::ContainerWriter;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tantivy::directory::error::OpenReadError;
use tantivy::directory::{FileSlice, WritePtr, META_LOCK};
use tantivy::{Directory, HasLen};

/// The prefix of a full-text index's file among a backup's extra files (then
/// `<index id>/<file name>`).
pub(crate) const SEARCH_FILE_PREFIX: &str = "search/";
const META_FILE: &str = "meta.json";
const MANAGED_FILE: &str = ".managed.json";

/// One tantivy commit held for a backup: its metas and its segment files, open.
pub(crate) struct PinnedCommit {
    index_id: u64,
    meta_json: Vec<u8>,
    /// File name, open file (its plaintext: an encrypted database's files are
    /// shipped in clear inside a sealed backup and sealed again by a restore, under
    /// the restored database's key), length in bytes.
    files: Vec<(String, FileSlice, u64)>,
}

impl SearchIndex {
    /// Pins the last commit of this index (see the module's comment); `None` if it
    /// has no commit with a payload yet.
    pub(crate) fn pin(&self) -> Result<Option<PinnedCommit>> {
        let dir = &self.dir;
        let _meta_lock = self
            .index
            .directory()
            .acquire_lock(&META_LOCK)
            .map_err(|e| {
                DocError::Index(IndexError::Search(format!(
                    "locking {}: {e}",
                    dir.display()
                )))
            })?;
        let metas = self
            .index
            .load_metas()
            .map_err(|e| tantivy_err(dir, "reading the commit of", e))?;
        let Some(raw) = metas.payload.as_deref() else {
            return Ok(None);
        };
        // A commit whose payload does not parse would be rebuilt after a restore:
        // not worth carrying.
        serde_json::from_str::<Payload>(raw).map_err(|e| {
            DocError::Index(IndexError::Search(format!("commit payload {raw:?}: {e}")))
        })?;
        let mut names: Vec<String> = metas
            .list_segment_files()
            .iter()
            .filter_map(|p| p.to_str().map(str::to_string))
            .collect();
        names.sort();
        // The files whole, as on disk (the index's own directory hands out a
        // file without tantivy's footer), in plaintext.
        let raw = super::directory::open(dir, self.index_id, self.key.as_ref())
            .map_err(|e| DocError::Index(IndexError::Search(format!("{}: {e}", dir.display()))))?;
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            match raw.open_read(Path::new(&name)) {
                Ok(slice) => {
                    let len = slice.len() as u64;
                    files.push((name, slice, len));
                }
                // Candidates a segment does not have (tantivy lists every
                // component's name; see `IndexMeta::list_segment_files`).
                Err(OpenReadError::FileDoesNotExist(_)) => {}
                Err(e) => {
                    return Err(DocError::Index(IndexError::Search(format!(
                        "{}: {e}",
                        dir.join(&name).display()
                    ))))
                }
            }
        }
        let mut meta_json = serde_json::to_vec_pretty(&metas)
            .map_err(DocError::encode_json("a full-text index's metas"))?;
        meta_json.push(b'\n');
        Ok(Some(PinnedCommit {
            index_id: self.index_id,
            meta_json,
            files,
        }))
    }
}

/// Files and bytes of full-text indexes written to a backup.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Shipped {
    pub files: u64,
    pub bytes: u64,
}

/// Writes pinned commits as extra files of `w`: each index's segment files, then
/// its `meta.json`.
pub(crate) fn write_pinned<W: std::io::Write, P: FnMut(u64)>(
    w: &mut ContainerWriter<W, P>,
    pinned: Vec<PinnedCommit>,
) -> Result<Shipped> {
    let mut out = Shipped::default();
    for p in pinned {
        let base = format!("{SEARCH_FILE_PREFIX}{}/", p.index_id);
        for (name, slice, len) in p.files {
            let mut reader = SliceReader { slice, pos: 0 };
            w.file(&format!("{base}{name}"), len, &mut reader)?;
            out.files += 1;
            out.bytes += len;
        }
        let len = p.meta_json.len() as u64;
        w.file(
            &format!("{base}{META_FILE}"),
            len,
            &mut std::io::Cursor::new(p.meta_json),
        )?;
        out.files += 1;
        out.bytes += len;
    }
    Ok(out)
}

/// A pinned file read in order, a piece at a time.
struct SliceReader {
    slice: FileSlice,
    pos: usize,
}

impl Read for SliceReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Pieces of 1 MiB: a sealed file's are opened chunk by chunk.
        let end = self.slice.len().min(self.pos + buf.len().min(1 << 20));
        if self.pos >= end {
            return Ok(0);
        }
        let bytes = self.slice.read_bytes_slice(self.pos..end)?;
        let n = bytes.len();
        buf.get_mut(..n)
            .ok_or_else(|| std::io::Error::other("a read past the buffer"))?
            .copy_from_slice(bytes.as_slice());
        self.pos += n;
        Ok(n)
    }
}

/// A backup's extra file under `search/` whose name is not `search/<id>/<file>`
/// (`name` is the whole name).
#[derive(Debug, thiserror::Error)]
pub(crate) enum MisnamedSearchFile {
    #[error("{name:?}: no index id")]
    NoIndexId { name: String },
    #[error("{name:?}: index id not a number")]
    IdNotANumber {
        name: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("{name:?}: file name not plain")]
    NotPlain { name: String },
}

/// Splits an extra file's name `search/<id>/<file>`: `None` if it is not one, an
/// error (why) if it is one but malformed.
pub(crate) fn parse_name(
    name: &str,
) -> Option<std::result::Result<(u64, &str), MisnamedSearchFile>> {
    let rest = name.strip_prefix(SEARCH_FILE_PREFIX)?;
    let name = || name.to_string();
    let parsed = (|| {
        let (id, file) = rest
            .split_once('/')
            .ok_or_else(|| MisnamedSearchFile::NoIndexId { name: name() })?;
        let id: u64 = id
            .parse()
            .map_err(|source| MisnamedSearchFile::IdNotANumber {
                name: name(),
                source,
            })?;
        let plain = !file.is_empty()
            && !file.starts_with('.')
            && !file.contains(['/', '\\'])
            && file != "..";
        if !plain {
            return Err(MisnamedSearchFile::NotPlain { name: name() });
        }
        Ok((id, file))
    })();
    Some(parsed)
}

/// Receives the full-text index files of a backup being restored into the
/// database directory `db_dir` (nothing is written without one: a verify).
#[derive(Default)]
pub(crate) struct SearchSink {
    db_dir: Option<PathBuf>,
    /// The restored database's key for search files (it is encrypted).
    key: Option<Arc<SealingKey>>,
    current: Option<(PathBuf, Option<WritePtr>)>,
    pub shipped: Shipped,
}

impl SearchSink {
    /// Where the files go (a restore), and the key they are sealed with there
    /// (`super::key_of` the restored database); without, they are only read.
    pub(crate) fn set_db_dir(&mut self, db_dir: &Path, key: Option<Arc<SealingKey>>) {
        self.db_dir = Some(db_dir.to_path_buf());
        self.key = key;
    }

    /// A file begins: `skip` for a file not to restore (of an increment, or
    /// misnamed).
    pub(crate) fn begin(&mut self, id: u64, file: &str, skip: bool) -> Result<()> {
        self.shipped.files += 1;
        let Some(db_dir) = self.db_dir.as_ref().filter(|_| !skip) else {
            self.current = Some((PathBuf::new(), None));
            return Ok(());
        };
        let dir = super::index_dir(db_dir, id);
        std::fs::create_dir_all(&dir).map_err(|e| DocError::io(&dir, e))?;
        let path = dir.join(file);
        let search_err =
            |e: String| DocError::Index(IndexError::Search(format!("{}: {e}", path.display())));
        let directory = super::directory::open(&dir, id, self.key.as_ref())
            .map_err(|e| search_err(e.to_string()))?;
        // A file left by an earlier attempt at the same staged restore goes first.
        if directory.exists(Path::new(file)).unwrap_or(false) {
            std::fs::remove_file(&path).map_err(|e| DocError::io(&path, e))?;
        }
        let w = directory
            .open_write(Path::new(file))
            .map_err(|e| search_err(e.to_string()))?;
        self.current = Some((path, Some(w)));
        Ok(())
    }

    pub(crate) fn data(&mut self, bytes: &[u8]) -> Result<()> {
        self.shipped.bytes += bytes.len() as u64;
        if let Some((path, Some(f))) = self.current.as_mut() {
            f.write_all(bytes).map_err(|e| DocError::io(&*path, e))?;
        }
        Ok(())
    }

    pub(crate) fn end(&mut self) -> Result<()> {
        if let Some((path, Some(w))) = self.current.take() {
            tantivy::directory::TerminatingWrite::terminate(w)
                .map_err(|e| DocError::io(&path, e))?;
        }
        Ok(())
    }

    /// Whether a file is open.
    pub(crate) fn is_open(&self) -> bool {
        self.current.is_some()
    }
}

/// Checks the full-text indexes restored into `db_dir` (see the module's
/// comment), removing those that fail; the index ids kept.
pub(crate) fn check_restored(db_dir: &Path, key: Option<&Arc<SealingKey>>) -> Result<Vec<u64>> {
    let root = db_dir.join(SEARCH_DIR);
    let mut kept = Vec::new();
    if !root.exists() {
        return Ok(kept);
    }
    for entry in std::fs::read_dir(&root).map_err(|e| DocError::io(&root, e))? {
        let entry = entry.map_err(|e| DocError::io(&root, e))?;
        let dir = entry.path();
        let id = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok());
        let checked = match id {
            Some(id) => check_one(&dir, id, key),
            None => Err(SearchCheckError::NotAnIndexId),
        };
        match (id, checked) {
            (Some(id), Ok(())) => kept.push(id),
            (_, result) => {
                let why = result.err().unwrap_or(SearchCheckError::NotAnIndexId);
                tracing::warn!(dir = %dir.display(), error = %why,
                    "full-text index files in the backup are unusable; the index will be rebuilt");
                std::fs::remove_dir_all(&dir).map_err(|e| DocError::io(&dir, e))?;
            }
        }
    }
    kept.sort_unstable();
    Ok(kept)
}

/// Why restored full-text index files are unusable (logged; the index is then
/// rebuilt at open).
#[derive(Debug, thiserror::Error)]
enum SearchCheckError {
    #[error("not an index id")]
    NotAnIndexId,
    #[error("no meta.json (an incomplete set of files)")]
    Incomplete,
    #[error("{0}")]
    ListFiles(#[source] std::io::Error),
    #[error("{0}")]
    EncodeManaged(#[source] serde_json::Error),
    #[error("{}: {source}", path.display())]
    WriteManaged {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Opening the index, checking its files, loading its metas or opening a reader.
    #[error("{0}")]
    Tantivy(#[source] tantivy::TantivyError),
    #[error("checksum mismatch in {0:?}")]
    ChecksumMismatch(std::collections::HashSet<PathBuf>),
    #[error("no commit payload")]
    NoPayload,
    #[error("payload {raw:?}: {source}")]
    Payload {
        raw: String,
        #[source]
        source: serde_json::Error,
    },
}

fn check_one(
    dir: &Path,
    index_id: u64,
    key: Option<&Arc<SealingKey>>,
) -> std::result::Result<(), SearchCheckError> {
    use SearchCheckError as E;
    if !dir.join(META_FILE).exists() {
        return Err(E::Incomplete);
    }
    // Every file restored (meta.json included) is tantivy's to collect.
    let mut managed = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(E::ListFiles)? {
        let name = entry.map_err(E::ListFiles)?.file_name();
        if let Some(n) = name.to_str().filter(|n| !n.starts_with('.')) {
            managed.push(n.to_string());
        }
    }
    let mut json = serde_json::to_vec(&managed).map_err(E::EncodeManaged)?;
    json.push(b'\n');
    let directory = super::directory::open(dir, index_id, key)
        .map_err(|e| E::Tantivy(tantivy::TantivyError::from(e)))?;
    if let Err(source) = directory.atomic_write(Path::new(MANAGED_FILE), &json) {
        let path = dir.join(MANAGED_FILE);
        return Err(E::WriteManaged { path, source });
    }
    let index = tantivy::Index::open(directory).map_err(E::Tantivy)?;
    let damaged = index.validate_checksum().map_err(E::Tantivy)?;
    if !damaged.is_empty() {
        return Err(E::ChecksumMismatch(damaged));
    }
    let metas = index.load_metas().map_err(E::Tantivy)?;
    let raw = metas.payload.ok_or(E::NoPayload)?;
    if let Err(source) = serde_json::from_str::<Payload>(&raw) {
        return Err(E::Payload { raw, source });
    }
    // Opens every segment (a file missing or unreadable fails here).
    index.reader().map_err(E::Tantivy)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misnamed_search_file_says_why_as_before() {
        assert!(parse_name("attachments/ab").is_none());
        assert_eq!(
            parse_name("search/12/meta.json").unwrap().unwrap(),
            (12, "meta.json")
        );
        let why = |name| parse_name(name).unwrap().unwrap_err().to_string();
        assert_eq!(why("search/12"), "\"search/12\": no index id");
        assert_eq!(
            why("search/x/meta.json"),
            "\"search/x/meta.json\": index id not a number"
        );
        assert_eq!(why("search/1/.."), "\"search/1/..\": file name not plain");
        let e = parse_name("search/x/a").unwrap().unwrap_err();
        let cause = std::error::Error::source(&e).expect("the id's parse error is kept");
        assert!(cause.is::<std::num::ParseIntError>());
    }

    #[test]
    fn unusable_restored_index_files_say_why() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            check_one(dir.path(), 1, None).unwrap_err().to_string(),
            "no meta.json (an incomplete set of files)"
        );
        std::fs::write(dir.path().join(META_FILE), b"not json").unwrap();
        let e = check_one(dir.path(), 1, None).unwrap_err();
        assert!(matches!(e, SearchCheckError::Tantivy(_)), "{e:?}");
    }
}
