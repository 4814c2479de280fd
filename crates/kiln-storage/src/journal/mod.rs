//! The write-ahead journal: preallocated files written sequentially with
//! O_DIRECT|O_DSYNC, one record per commit.

pub(crate) mod compress;
mod decode_error;
mod files;
pub mod logical;
pub mod record;
mod replay_start;
pub(crate) mod sync;

pub(crate) use files::{FileSizes, JournalFiles, JournalPos, Need as FileNeed};
pub(crate) use replay_start::ReplayStart;
pub(crate) mod writer;

use crate::io::Vfs;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

pub fn file_name(seq: u64) -> String {
    format!("journal-{seq:016}.log")
}

pub fn file_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(file_name(seq))
}

fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("journal-")?.strip_suffix(".log")?;
    if digits.len() != 16 {
        return None;
    }
    digits.parse().ok()
}

/// The journal files in `dir`, sorted by sequence. Anything else in the journal
/// directory is an error: a stray file may be a journal from elsewhere, and guessing
/// is how data gets lost.
pub fn list_files(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<u64>> {
    let entries = vfs
        .list_dir(dir)
        .map_err(|e| Error::io(dir, None, "list journal directory", e))?;
    let mut seqs = Vec::new();
    for (path, is_dir) in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        match parse_file_name(name) {
            Some(seq) if !is_dir => seqs.push(seq),
            _ if name.ends_with(".tmp") && !is_dir => {}
            _ => {
                return Err(Error::corrupted(
                    dir,
                    "journal directory",
                    format!(
                        "unexpected {} {:?}; the journal directory must hold only journal files",
                        if is_dir { "directory" } else { "file" },
                        path.display()
                    ),
                ))
            }
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}
