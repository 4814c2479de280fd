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
//! ## Container format (versions 2 and 3; all integers little-endian)
//! ```text
//! header   magic "KILNBAK\0" (8) | version u32 | flags u32 (bit 0: chunks may be lz4;
//!          bit 1: sealed, version 3 only) | txn_id u64 | meta_len u32 | meta (meta_len
//!          bytes, the caller's own: kiln-docs puts a JSON manifest here)
//!          | sealed only: backup id (16 random bytes) | wrapped key (100 bytes)
//!          | crc32c u32 of all of the above
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
//!                 | (version 2 on) files u64 | file bytes u64
//! ```
//! Version 1 (no extra files, a 32-byte trailer) is still read. The extra files are
//! bytes to the engine: streamed frame by frame both ways (a file of any size never
//! sits in memory), each frame under its CRC-32C, the whole file under the END
//! frame's; what a name means and any stronger hash are the caller's.
//! The trailer is the last frame: bytes after it, a missing trailer, a frame out of
//! order (its index), a wrong count or any checksum failure rejects the backup with
//! the part and the byte offset named. Every byte is under a CRC-32C, which detects
//! every single-bit error.
//!
//! ## Sealed backups (version 3)
//! A backup of an encrypted environment (`Options::encryption`) is never written in
//! clear: it is sealed, version 3 with flag bit 1 (a backup without encryption is
//! still written as version 2, which older builds read). Each sealed backup has a
//! key of its own (`crypt::SealingKey`, 32 random bytes), stored in its header
//! wrapped by the master key (`MasterKey::wrap`: the 100-byte layout of `crypt.rs`,
//! which names the master key's fingerprint at its bytes 16..24), and a random
//! 16-byte backup id. Sealed with XChaCha20-Poly1305 under that key:
//! - the meta: `meta_len` counts the ciphertext and its 40-byte seal (nonce, tag);
//!   associated data: the header's first 28 bytes, the backup id and the wrapped key;
//! - every frame's payload, the trailer's included: compressed first (lz4, where it
//!   shrinks), then sealed; the payload is the ciphertext followed by its 40-byte
//!   seal, and `stored_len` counts both. Associated data: `"KILNFRM\0"` | backup id
//!   | txn_id u64 | the frame header's bytes 0..12 (kind, flags, index, raw_len), so
//!   that a frame cannot be moved to another place, swapped with another or taken
//!   from another backup, and its kind, length and compression cannot be changed.
//!
//! The CRC-32Cs stay, over the stored (sealed) bytes: a damaged backup fails a
//! checksum (damage, named by part and offset) before anything is opened; bytes
//! that pass their checksums but fail to open were changed on purpose or come from
//! elsewhere (an authentication error, also named by part and offset). Reading a
//! sealed backup takes the master key (`read_container_with_key`, `verify_with_key`,
//! `read_header_with_key`; a restore uses the new environment's own key): without
//! one it is refused with a clear error naming the key's fingerprint, and a wrong
//! one fails to unwrap the backup's key (`Error::Encryption`, naming both keys).

mod read;
mod restore;
#[cfg(test)]
mod tests;
mod write;

pub use read::*;
pub use restore::*;
pub use write::ContainerWriter;

use crate::crypt::{MasterKey, SealingKey, WRAPPED_KEY_BYTES};
use crate::io::Vfs;
use crate::{Env, Error, Options};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"KILNBAK\0";
/// The newest container version this build reads: a sealed backup's.
pub const FORMAT_VERSION: u32 = SEALED_FORMAT_VERSION;
/// The version of a backup written without encryption (older builds read it).
pub const PLAIN_FORMAT_VERSION: u32 = 2;
/// The version of a sealed backup (module documentation).
pub const SEALED_FORMAT_VERSION: u32 = 3;
/// The oldest container version this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
const FLAG_LZ4: u32 = 1;
const FLAG_SEALED: u32 = 2;
/// The fixed fields at the start of the header (magic to meta_len).
const HEADER_FIXED: usize = 28;
const BACKUP_ID_BYTES: usize = 16;
/// What a sealed backup's header holds after its meta: backup id, wrapped key.
const SEALED_HEADER_EXTRA: usize = BACKUP_ID_BYTES + WRAPPED_KEY_BYTES;
/// A seal (nonce, tag) after each sealed payload.
const SEAL_BYTES: usize = SealingKey::SEAL_BYTES;
const FRAME_AAD_TAG: &[u8; 8] = b"KILNFRM\0";
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

/// The key of one sealed backup and what binds its frames to it (module
/// documentation, "Sealed backups").
struct Sealer {
    key: SealingKey,
    backup_id: [u8; BACKUP_ID_BYTES],
    txn_id: u64,
}

impl Sealer {
    /// The associated data of the frame whose header (bytes 0..12 set) is `h`.
    fn frame_aad(&self, h: &[u8; FRAME_HEADER]) -> [u8; 44] {
        let mut aad = [0u8; 44];
        aad[..8].copy_from_slice(FRAME_AAD_TAG);
        aad[8..24].copy_from_slice(&self.backup_id);
        aad[24..32].copy_from_slice(&self.txn_id.to_le_bytes());
        aad[32..44].copy_from_slice(&h[..12]);
        aad
    }

    /// Encrypts `buf` in place and appends its seal.
    fn seal(&self, aad: &[u8], buf: &mut Vec<u8>) {
        let seal = self.key.seal_in_place(aad, buf);
        buf.extend_from_slice(&seal);
    }

    /// Opens `buf` (ciphertext, then its seal) in place, dropping the seal; false
    /// if it is too short or fails authentication.
    fn open(&self, aad: &[u8], buf: &mut Vec<u8>) -> bool {
        let Some(at) = buf.len().checked_sub(SEAL_BYTES) else {
            return false;
        };
        let mut seal = [0u8; SEAL_BYTES];
        let (body, tail) = buf.split_at_mut(at);
        seal.copy_from_slice(tail);
        if !self.key.open_in_place(aad, body, &seal) {
            return false;
        }
        buf.truncate(at);
        true
    }
}

/// The fingerprint of the master key a wrapped key names (its bytes 16..24, in the
/// layout of `crypt.rs`).
fn wrapped_fingerprint(wrapped: &[u8]) -> String {
    wrapped
        .get(16..24)
        .unwrap_or_default()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

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
    /// A sealed backup (version 3): the fingerprint of the master key its key is
    /// wrapped by. `None`: written in clear.
    pub key_fingerprint: Option<String>,
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
