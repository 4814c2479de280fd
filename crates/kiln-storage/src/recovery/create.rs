//! Creating a new environment, and reading an existing one's file header.

use crate::header::{self, FileHeader};
use crate::io::{OpenMode, Vfs};
use crate::journal::writer::JournalFiles;
use crate::options::Options;
use crate::page::{self, PAGE_SIZE};
use crate::stats::EngineCounters;
use crate::{Error, ForeignFiles, Result};
use std::path::Path;
use std::sync::Arc;

/// Creates a new environment. The data file is built under a temporary name and
/// renamed into place last, so a crash part-way leaves no half-made environment; the
/// first journal file exists before the data file does.
pub(crate) fn create_environment(
    vfs: Arc<dyn Vfs>,
    dir: &Path,
    journal_dir: &Path,
    data_path: &Path,
    opts: &Options,
    counters: Arc<EngineCounters>,
) -> Result<FileHeader> {
    vfs.create_dir_all(journal_dir)
        .map_err(|e| Error::io(journal_dir, None, "create journal directory", e))?;
    if let Some(parent) = journal_dir.parent() {
        vfs.sync_dir(parent)
            .map_err(|e| Error::io(parent, None, "fsync journal directory's parent", e))?;
    }
    refuse_another_environments_journal(vfs.as_ref(), dir, journal_dir)?;
    // A random chain start: records left in the journal directory by an earlier
    // environment can never pass as this one's.
    let chain: u32 = rand::random();
    let h = FileHeader {
        page_count: page::FIRST_DATA_PAGE,
        journal_file_seq: 1,
        journal_chain_checksum: chain,
        replay_from_file_seq: 1,
        replay_from_chain_checksum: chain,
        ..Default::default()
    };
    JournalFiles::open(
        vfs.clone(),
        journal_dir,
        crate::journal::FileSizes::of(opts),
        counters,
        0,
    )?
    .ensure_file(h.journal_file_seq, crate::journal::FileNeed::Now)?;
    for slot in 0..2 {
        header::write_freelist(vfs.as_ref(), dir, slot, &[])?;
    }
    build_data_file(vfs.as_ref(), dir, data_path, &h, opts)?;
    Ok(h)
}

/// Journal files of another environment must never be mistaken for ours; and a
/// leftover journal-1 from an interrupted creation of this one holds no commits.
fn refuse_another_environments_journal(
    vfs: &dyn Vfs,
    dir: &Path,
    journal_dir: &Path,
) -> Result<()> {
    let leftovers: Vec<u64> = crate::journal::list_files(vfs, journal_dir)?
        .into_iter()
        .filter(|s| *s != 1)
        .collect();
    let first = crate::journal::file_path(journal_dir, 1);
    if vfs.exists(&first) && holds_records(vfs, &first)? {
        return Err(Error::ForeignJournal {
            found: ForeignFiles::Records(first),
            dir: dir.to_path_buf(),
        });
    }
    if !leftovers.is_empty() {
        return Err(Error::ForeignJournal {
            found: ForeignFiles::Files {
                dir: journal_dir.to_path_buf(),
                files: leftovers.len(),
            },
            dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// Builds the data file with header `h` as `data.kiln.tmp` (truncated, preallocated,
/// synced) and renames it into place, then syncs the directory.
fn build_data_file(
    vfs: &dyn Vfs,
    dir: &Path,
    data_path: &Path,
    h: &FileHeader,
    opts: &Options,
) -> Result<()> {
    let tmp = data_path.with_extension("kiln.tmp");
    let mode = OpenMode {
        create: true,
        write: true,
        ..Default::default()
    };
    let file = vfs
        .open(&tmp, mode)
        .map_err(|e| Error::io(&tmp, None, "create data file", e))?;
    file.set_len(0)
        .map_err(|e| Error::io(&tmp, None, "truncate data file", e))?;
    // Sized as the data file's growth would size it from nothing (`store.rs`).
    let first_bytes = crate::store::grow_target(0, 2 * PAGE_SIZE as u64, opts.data_grow_step_bytes);
    file.allocate(0, first_bytes)
        .map_err(|e| Error::io(&tmp, Some(0), "preallocate data file", e))?;
    file.write_all_at(&h.encode(), 0)
        .map_err(|e| Error::io(&tmp, Some(0), "write file header", e))?;
    file.sync_all()
        .map_err(|e| Error::io(&tmp, None, "fsync data file", e))?;
    drop(file);
    vfs.rename(&tmp, data_path)
        .map_err(|e| Error::io(&tmp, None, "rename new data file into place", e))?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(dir, None, "fsync data directory", e))
}

/// True if the file's first block is (or resembles) a journal record header (zeros
/// otherwise: a file made by an interrupted creation of this environment).
fn holds_records(vfs: &dyn Vfs, path: &Path) -> Result<bool> {
    let f = vfs
        .open(path, OpenMode::default())
        .map_err(|e| Error::io(path, None, "open journal file", e))?;
    let len = f
        .len()
        .map_err(|e| Error::io(path, None, "stat journal file", e))?;
    if len < crate::journal::record::RECORD_HEADER as u64 {
        return Ok(false);
    }
    let mut head = vec![0u8; crate::journal::record::RECORD_HEADER];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(path, Some(0), "read journal file", e))?;
    // A damaged header counts too: better to refuse than to reuse another
    // environment's journal.
    Ok(crate::journal::record::resembles_header(&head))
}

/// Reads the newer valid copy of the file header.
pub(crate) fn load_header(vfs: &dyn Vfs, data_path: &Path) -> Result<FileHeader> {
    let file = vfs
        .open(data_path, OpenMode::default())
        .map_err(|e| Error::io(data_path, None, "open data file", e))?;
    let mut copies = Vec::new();
    let mut problems = Vec::new();
    for slot in 0..2u64 {
        let mut b = vec![0u8; PAGE_SIZE];
        let off = slot * PAGE_SIZE as u64;
        match file.read_exact_at(&mut b, off) {
            Ok(()) => match FileHeader::decode(&b, data_path) {
                Ok(h) if h.slot() == slot => copies.push(h),
                Ok(h) => problems.push(format!(
                    "copy {slot}: sequence {} belongs in the other slot",
                    h.sequence
                )),
                Err((why, true)) => {
                    return Err(Error::Incompatible {
                        path: data_path.to_path_buf(),
                        found: why,
                        expected: format!(
                            "format version {} with {PAGE_SIZE}-byte pages",
                            header::FORMAT_VERSION
                        ),
                    })
                }
                Err((why, false)) => problems.push(format!("copy {slot}: {why}")),
            },
            Err(e) => problems.push(format!("copy {slot}: unreadable: {e}")),
        }
    }
    if !problems.is_empty() && !copies.is_empty() {
        // Normal after a crash during a header write (the older copy is the one torn).
        tracing::info!(path = %data_path.display(), problems = problems.join("; "), "one file header copy is not valid; using the other");
    }
    let newest = copies
        .into_iter()
        .max_by_key(|h| h.sequence)
        .ok_or_else(|| {
            Error::corrupted(
                data_path,
                "pages 0-1 (file header)",
                format!("no valid header copy ({})", problems.join("; ")),
            )
        })?;
    // (Not the older copy instead: journal files it needs may have been recycled.)
    newest.check(data_path)?;
    Ok(newest)
}
