//! Full backups of an environment: one read snapshot written as a checksummed
//! stream, restored into a new environment, verified without restoring.
//!
//! ## Consistency
//! A backup reads one `ReadTxn` from start to end. A snapshot never changes and never
//! blocks the writer, so commits go on during the backup; the image is exactly the
//! state of the snapshot's transaction (its id is in the header), nothing of the
//! commits after it. Trees are read through the normal cursors, which merge the
//! engine's write buffer: buffered entries are included.
//!
//! ## Container format (version 2; all integers little-endian)
//! ```text
//! header   magic "KILNBAK\0" (8) | version u32 | flags u32 (bit 0: chunks may be lz4)
//!          | txn_id u64 | meta_len u32 | meta (meta_len bytes, the caller's own:
//!          kiln-docs puts a JSON manifest here) | crc32c u32 of all of the above
//! frames   kind u8 | flags u8 (bit 0: payload is lz4) | 0 u16 | index u32 (0, 1, 2..)
//!          | raw_len u32 | stored_len u32 | payload crc32c u32 | header crc32c u32
//!          (of the 20 bytes before it) | payload (stored_len bytes)
//!   kind 1 TREE   payload: the tree's name (UTF-8)
//!   kind 2 DATA   payload (raw): entries `key_len u32 | value_len u32 | key | value`
//!                 in key order, ~1 MiB per chunk (one larger entry makes a larger one)
//!   kind 3 END    payload: entries of the tree u64 (closes the current TREE)
//!   kind 5 FILE   payload: length u64 | name (UTF-8): an extra file of the caller's
//!                 (kiln-docs: an attachment's blob), outside any tree
//!   kind 6 FILE_DATA payload (raw): the next bytes of the file, ~1 MiB per frame
//!   kind 7 FILE_END payload: length u64 | crc32c u32 of the file's bytes (closes it)
//!   kind 4 TRAILER payload: trees u64 | entries u64 | raw kv bytes u64 | frames u32
//!                 | crc32c u32 of every byte of the file before this frame
//!                 | (version 2) files u64 | file bytes u64
//! ```
//! Version 1 (no extra files, a 32-byte trailer) is still read. The extra files are
//! bytes to the engine: streamed frame by frame both ways (a file of any size never
//! sits in memory), each frame under its CRC-32C, the whole file under the END
//! frame's; what a name means and any stronger hash are the caller's.
//! The trailer is the last frame: bytes after it, a missing trailer, a frame out of
//! order (its index), a wrong count or any checksum failure rejects the backup with
//! the part and the byte offset named. Every byte is under a CRC-32C, which detects
//! every single-bit error.

mod read;
mod restore;
mod write;

pub use read::*;
pub use restore::*;
pub use write::ContainerWriter;

use crate::io::Vfs;
use crate::{Env, Error, Options};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"KILNBAK\0";
pub const FORMAT_VERSION: u32 = 2;
/// The oldest container version this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
const FLAG_LZ4: u32 = 1;
const KIND_TREE: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_END: u8 = 3;
const KIND_TRAILER: u8 = 4;
const KIND_FILE: u8 = 5;
const KIND_FILE_DATA: u8 = 6;
const KIND_FILE_END: u8 = 7;
const FRAME_HEADER: usize = 24;
/// Target size of a DATA chunk before compression.
pub const CHUNK_BYTES: usize = 1 << 20;
/// Largest frame payload a reader accepts (a chunk holding one maximal entry).
const MAX_FRAME: usize = crate::MAX_VALUE_SIZE + crate::MAX_KEY_SIZE + 8 + CHUNK_BYTES;
const MAX_META: usize = 1 << 20;
/// Restore commits a transaction every this many key/value bytes.
const RESTORE_TXN_BYTES: u64 = 32 << 20;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    #[error("I/O error {op} at byte offset {offset} of the backup: {source}")]
    Io {
        op: &'static str,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("backup is corrupt in {part} at byte offset {offset}: {what}")]
    Corrupt {
        part: String,
        offset: u64,
        what: String,
    },
    #[error("backup is truncated: it ends in {part} at byte offset {offset}")]
    Truncated { part: String, offset: u64 },
    #[error(
        "backup format version {0} is not supported (this Kiln reads versions \
         {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}; a newer Kiln wrote it)"
    )]
    UnsupportedVersion(u32),
    #[error("restore target {0} already exists: refusing to overwrite it")]
    TargetExists(PathBuf),
    #[error("restore: {op} {path}: {source}")]
    Fs {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("storage engine: {0}")]
    Storage(#[from] Error),
    /// An extra file's source failed while it was being written into a backup.
    #[error("reading {name} to back it up, at byte {offset} of it: {source}")]
    FileSource {
        name: String,
        offset: u64,
        #[source]
        source: io::Error,
    },
    /// An extra file's source gave another length than announced.
    #[error("{name} changed while it was backed up: {what}")]
    FileChanged { name: String, what: String },
    /// The caller's sink of `read_container` refused an item (it keeps its own error).
    #[error("stopped by the reader of the backup: {0}")]
    Stopped(String),
}

pub type BackupResult<T> = std::result::Result<T, BackupError>;

#[derive(Debug, Clone, Copy)]
pub struct BackupOptions {
    /// lz4-compress chunks (a chunk that does not shrink is stored as it is).
    pub compress: bool,
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions { compress: true }
    }
}

/// What a backup holds, as written or as read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupSummary {
    pub format_version: u32,
    /// The transaction the image is consistent at.
    pub txn_id: u64,
    /// The caller's metadata stored in the header.
    pub meta: Vec<u8>,
    pub trees: u64,
    pub entries: u64,
    /// Sum of key and value lengths.
    pub kv_bytes: u64,
    pub frames: u32,
    /// Extra files (`ContainerWriter::file`) and their bytes.
    pub files: u64,
    pub file_bytes_total: u64,
    /// Size of the backup file.
    pub file_bytes: u64,
    /// While reading: the frame being handed to the sink (its index and the byte
    /// offset of its header), so that a caller can name where an entry it refuses is.
    pub frame: u32,
    pub frame_offset: u64,
}

/// What the reader hands to its consumer, in order: `Header` once its checksum
/// passed (the summary then holds the txn id and the metadata), then each tree.
#[derive(Debug)]
pub enum Item<'a> {
    Header,
    Tree(&'a str),
    Entry(&'a [u8], &'a [u8]),
    EndTree,
    /// An extra file begins (outside any tree): its name and length. Its bytes
    /// follow as `FileData` (in order, ~1 MiB each), then `FileEnd` once its length
    /// and checksum passed. `BackupSummary::frame_offset` is the offset of the
    /// frame handed over.
    File {
        name: &'a str,
        len_bytes: u64,
    },
    FileData(&'a [u8]),
    FileEnd,
}
