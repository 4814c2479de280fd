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

mod write;

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

/// The extra file being read: its name, the offset of its FILE frame, its length
/// and the bytes read so far and their checksum.
struct OpenFile {
    name: String,
    start: u64,
    len_bytes: u64,
    read_bytes: u64,
    crc: u32,
}

impl OpenFile {
    /// An error of a frame inside this file, naming it and where in it.
    fn name_error(&self, e: BackupError) -> BackupError {
        let part = |p: String| {
            format!(
                "extra file {:?} (begun at byte offset {}), {p}",
                self.name, self.start
            )
        };
        let at = self.read_bytes;
        match e {
            BackupError::Corrupt {
                part: p,
                offset,
                what,
            } => BackupError::Corrupt {
                part: part(p),
                offset,
                what: format!("{what} (the frame holds the file's bytes from {at} on)"),
            },
            BackupError::Truncated { part: p, offset } => BackupError::Truncated {
                part: part(p),
                offset,
            },
            other => other,
        }
    }
}

struct Reader<R, P> {
    inner: R,
    offset: u64,
    crc: u32,
    progress: P,
}

impl<R: Read, P: FnMut(u64)> Reader<R, P> {
    /// Reads exactly `buf.len()` bytes of `part`; returns false on a clean EOF
    /// before the first byte when `eof_ok`.
    fn exact(&mut self, buf: &mut [u8], part: &dyn Fn() -> String) -> BackupResult<()> {
        let mut got = 0;
        while got < buf.len() {
            let slot = buf.get_mut(got..).unwrap_or_default();
            match self.inner.read(slot) {
                Ok(0) => {
                    return Err(BackupError::Truncated {
                        part: part(),
                        offset: self.offset + got as u64,
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(BackupError::Io {
                        op: "reading",
                        offset: self.offset + got as u64,
                        source,
                    })
                }
            }
        }
        self.crc = crc32c::crc32c_append(self.crc, buf);
        self.offset += buf.len() as u64;
        Ok(())
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

impl OpenFile {
    /// The extra file a file frame begins: its name (UTF-8, after its length).
    fn begin(frame: &Frame<'_>) -> BackupResult<OpenFile> {
        let raw = &frame.raw;
        let name = raw
            .get(8..)
            .and_then(|n| std::str::from_utf8(n).ok())
            .filter(|_| raw.len() >= 8)
            .ok_or_else(|| {
                corrupt(
                    &frame.part,
                    frame.start,
                    "file frame without a UTF-8 name".into(),
                )
            })?;
        Ok(OpenFile {
            name: name.to_string(),
            start: frame.start,
            len_bytes: le64(raw, 0),
            read_bytes: 0,
            crc: 0,
        })
    }

    /// A frame inside this file: its bytes, or its end (checked against the bytes
    /// read). Returns whether the file ended.
    fn take_frame(
        &mut self,
        frame: &Frame<'_>,
        sum: &mut BackupSummary,
        sink: &mut impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
    ) -> BackupResult<bool> {
        let (part, start, raw) = (&frame.part, frame.start, &frame.raw);
        match frame.kind {
            KIND_FILE_DATA => {
                self.read_bytes += raw.len() as u64;
                if self.read_bytes > self.len_bytes {
                    return Err(self.name_error(corrupt(
                        part,
                        start,
                        format!("the file's bytes run past its length {}", self.len_bytes),
                    )));
                }
                self.crc = crc32c::crc32c_append(self.crc, raw);
                sum.file_bytes_total += raw.len() as u64;
                sink(sum, Item::FileData(raw))?;
                Ok(false)
            }
            KIND_FILE_END => {
                let ok = raw.len() == 12
                    && le64(raw, 0) == self.len_bytes
                    && self.read_bytes == self.len_bytes
                    && le32(raw, 8) == self.crc;
                if !ok {
                    return Err(self.name_error(corrupt(
                        part,
                        start,
                        format!(
                            "file end does not match its bytes ({} read of {}, or checksum)",
                            self.read_bytes, self.len_bytes
                        ),
                    )));
                }
                sink(sum, Item::FileEnd)?;
                Ok(true)
            }
            k => Err(self.name_error(corrupt(
                part,
                start,
                format!("frame of kind {k} inside an extra file"),
            ))),
        }
    }
}

/// Reads and checks a whole backup, handing every tree and entry to `sink`.
fn read_backup<R: Read>(
    input: R,
    progress: impl FnMut(u64),
    sink: impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<BackupSummary> {
    read_container(input, false, progress, sink)
}

/// Reads and checks a whole container, handing every item to `sink` in order.
/// With `stop_at_trailer` the reader stops right after the trailer (several
/// containers may follow each other in one stream); otherwise bytes after the
/// trailer are refused. `progress` gets this container's bytes read so far.
pub fn read_container<R: Read>(
    input: R,
    stop_at_trailer: bool,
    mut progress: impl FnMut(u64),
    mut sink: impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<BackupSummary> {
    let mut rd = Reader {
        inner: input,
        offset: 0,
        crc: 0,
        progress: &mut progress,
    };
    let mut sum = read_container_header(&mut rd)?;
    sink(&sum, Item::Header)?;
    let mut index: u32 = 0;
    let mut in_tree: Option<u64> = None;
    let mut in_file: Option<OpenFile> = None;
    let mut payload = Vec::new();
    loop {
        let before_crc = rd.crc;
        let frame =
            read_frame(&mut rd, index, &mut payload).map_err(|e| match in_file.as_ref() {
                Some(f) => f.name_error(e),
                None => e,
            })?;
        index += 1;
        sum.frame = index - 1;
        sum.frame_offset = frame.start;
        if frame.kind == KIND_TRAILER && in_file.is_none() && in_tree.is_none() {
            check_trailer(&frame, &sum, index, before_crc)?;
            // With `stop_at_trailer`, what follows is the caller's (the next
            // container); otherwise it must be the end of the input.
            if !stop_at_trailer {
                refuse_bytes_after_trailer(&mut rd)?;
            }
            sum.frames = index;
            sum.file_bytes = rd.offset;
            return Ok(sum);
        }
        take_frame(&frame, &mut in_tree, &mut in_file, &mut sum, &mut sink)?;
    }
}

/// A frame of a container other than its trailer: an extra file's begin, bytes or
/// end, or a tree's name, entries or end. `in_tree` counts the entries of the tree
/// being read; `in_file` is the extra file being read.
fn take_frame(
    frame: &Frame<'_>,
    in_tree: &mut Option<u64>,
    in_file: &mut Option<OpenFile>,
    sum: &mut BackupSummary,
    sink: &mut impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<()> {
    if let Some(f) = in_file.as_mut() {
        if f.take_frame(frame, sum, sink)? {
            *in_file = None;
        }
        return Ok(());
    }
    let (part, start, raw) = (&frame.part, frame.start, &frame.raw);
    match (frame.kind, *in_tree) {
        (KIND_FILE, None) if sum.format_version >= 2 => {
            let file = OpenFile::begin(frame)?;
            sum.files += 1;
            sink(
                sum,
                Item::File {
                    name: &file.name,
                    len_bytes: file.len_bytes,
                },
            )?;
            *in_file = Some(file);
        }
        (KIND_TREE, None) => {
            let name = std::str::from_utf8(raw)
                .map_err(|_| corrupt(part, start, "tree name is not UTF-8".into()))?;
            sum.trees += 1;
            *in_tree = Some(0);
            sink(sum, Item::Tree(name))?;
        }
        (KIND_DATA, Some(n)) => {
            *in_tree = Some(read_entries(frame, n, sum, sink)?);
        }
        (KIND_END, Some(n)) => {
            check_tree_end(frame, n)?;
            sum.entries += n;
            *in_tree = None;
            sink(sum, Item::EndTree)?;
        }
        (k, _) => {
            return Err(corrupt(
                part,
                start,
                format!("frame of kind {k} out of place"),
            ))
        }
    }
    Ok(())
}

/// A tree's end frame must count the entries read.
fn check_tree_end(frame: &Frame<'_>, entries_read: u64) -> BackupResult<()> {
    let raw = &frame.raw;
    let what = match raw.len() {
        8 if le64(raw, 0) == entries_read => return Ok(()),
        8 => format!(
            "tree end says {} entries, {entries_read} were read",
            le64(raw, 0)
        ),
        n => format!("tree end frame of {n} bytes, not 8"),
    };
    Err(corrupt(&frame.part, frame.start, what))
}

/// A corrupt part of a backup, at a byte offset.
fn corrupt(part: &str, offset: u64, what: String) -> BackupError {
    BackupError::Corrupt {
        part: part.to_string(),
        offset,
        what,
    }
}

/// Reads and checks the container's header (magic, checksum, version, flags): the
/// summary as of it.
fn read_container_header<R: Read, P: FnMut(u64)>(
    rd: &mut Reader<R, P>,
) -> BackupResult<BackupSummary> {
    let hpart = || "the header".to_string();
    let mut fixed = [0u8; 28];
    rd.exact(&mut fixed, &hpart)?;
    if fixed.get(..8) != Some(&MAGIC[..]) {
        return Err(corrupt(
            "the header",
            0,
            "not a Kiln backup (bad magic)".into(),
        ));
    }
    let version = le32(&fixed, 8);
    let flags = le32(&fixed, 12);
    let txn_id = le64(&fixed, 16);
    let meta_len = le32(&fixed, 24) as usize;
    if meta_len > MAX_META {
        return Err(corrupt(
            "the header",
            24,
            format!("metadata length {meta_len} exceeds {MAX_META}"),
        ));
    }
    let mut meta = vec![0u8; meta_len];
    rd.exact(&mut meta, &hpart)?;
    let mut crc_b = [0u8; 4];
    let expect = crc32c::crc32c_append(crc32c::crc32c(&fixed), &meta);
    let at = rd.offset;
    rd.exact(&mut crc_b, &hpart)?;
    if u32::from_le_bytes(crc_b) != expect {
        return Err(corrupt("the header", at, "header checksum mismatch".into()));
    }
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(BackupError::UnsupportedVersion(version));
    }
    if flags & !FLAG_LZ4 != 0 {
        return Err(corrupt(
            "the header",
            12,
            format!("unknown flags {flags:#x}"),
        ));
    }
    Ok(BackupSummary {
        format_version: version,
        txn_id,
        meta,
        ..Default::default()
    })
}

/// A frame read and checked (header, index, payload checksum, decompressed length).
struct Frame<'a> {
    kind: u8,
    /// Byte offset of the frame's header.
    start: u64,
    /// "frame {index}", for messages.
    part: String,
    /// The payload, decompressed.
    raw: std::borrow::Cow<'a, [u8]>,
}

/// Reads frame `index` into `payload` (reused between frames) and checks it.
fn read_frame<'a, R: Read, P: FnMut(u64)>(
    rd: &mut Reader<R, P>,
    index: u32,
    payload: &'a mut Vec<u8>,
) -> BackupResult<Frame<'a>> {
    let start = rd.offset;
    let part = format!("frame {index}");
    let fpart = || format!("frame {index}");
    let mut h = [0u8; FRAME_HEADER];
    rd.exact(&mut h, &fpart)?;
    if crc32c::crc32c(&h[..20]) != le32(&h, 20) {
        return Err(corrupt(
            &part,
            start,
            "frame header checksum mismatch".into(),
        ));
    }
    let (kind, fflags) = (h[0], h[1]);
    let (raw_len, stored_len) = (le32(&h, 8) as usize, le32(&h, 12) as usize);
    if le32(&h, 4) != index {
        return Err(corrupt(
            &part,
            start,
            format!(
                "frame index {} where {index} was expected (frames reordered or missing)",
                le32(&h, 4)
            ),
        ));
    }
    if raw_len > MAX_FRAME || stored_len > MAX_FRAME || fflags > 1 || h[2] != 0 || h[3] != 0 {
        return Err(corrupt(&part, start, "invalid frame header".into()));
    }
    payload.resize(stored_len, 0);
    rd.exact(payload, &fpart)?;
    if crc32c::crc32c(payload) != le32(&h, 16) {
        return Err(corrupt(
            &part,
            start + FRAME_HEADER as u64,
            "payload checksum mismatch".into(),
        ));
    }
    (rd.progress)(rd.offset);
    let raw: std::borrow::Cow<'a, [u8]> = if fflags & 1 != 0 {
        let d = lz4_flex::block::decompress(payload, raw_len)
            .map_err(|e| corrupt(&part, start + FRAME_HEADER as u64, format!("lz4: {e}")))?;
        std::borrow::Cow::Owned(d)
    } else {
        std::borrow::Cow::Borrowed(&payload[..])
    };
    if raw.len() != raw_len {
        return Err(corrupt(&part, start, "payload length mismatch".into()));
    }
    Ok(Frame {
        kind,
        start,
        part,
        raw,
    })
}

/// Hands a DATA frame's entries to `sink`; returns the tree's entries so far
/// (`n` before this frame).
fn read_entries(
    frame: &Frame<'_>,
    n: u64,
    sum: &mut BackupSummary,
    sink: &mut impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<u64> {
    let raw = &frame.raw;
    let mut p = 0usize;
    let mut count = n;
    while p < raw.len() {
        let kl = le32(raw, p) as usize;
        let vl = le32(raw, p + 4) as usize;
        let k = raw.get(p + 8..p + 8 + kl);
        let v = raw.get(p + 8 + kl..p + 8 + kl + vl);
        let (Some(k), Some(v)) = (k, v) else {
            return Err(corrupt(
                &frame.part,
                frame.start,
                format!("entry at chunk offset {p} runs past the chunk"),
            ));
        };
        sink(sum, Item::Entry(k, v))?;
        sum.kv_bytes += (kl + vl) as u64;
        count += 1;
        p += 8 + kl + vl;
    }
    Ok(count)
}

/// Checks the trailer's counts against what was read (`frames` frames, this one
/// included) and its checksum against `before_crc`, the checksum of every byte
/// before it.
fn check_trailer(
    frame: &Frame<'_>,
    sum: &BackupSummary,
    frames: u32,
    before_crc: u32,
) -> BackupResult<()> {
    let raw = &frame.raw;
    let files_ok = match sum.format_version {
        1 => raw.len() == 32,
        _ => raw.len() == 48 && le64(raw, 32) == sum.files && le64(raw, 40) == sum.file_bytes_total,
    };
    let ok = files_ok
        && le64(raw, 0) == sum.trees
        && le64(raw, 8) == sum.entries
        && le64(raw, 16) == sum.kv_bytes
        && le32(raw, 24) == frames;
    if !ok {
        return Err(corrupt(
            &frame.part,
            frame.start,
            "trailer counts do not match the backup".into(),
        ));
    }
    if le32(raw, 28) != before_crc {
        return Err(corrupt(
            &frame.part,
            frame.start,
            "whole-file checksum mismatch".into(),
        ));
    }
    Ok(())
}

/// The input must end right after the trailer.
fn refuse_bytes_after_trailer<R: Read, P: FnMut(u64)>(rd: &mut Reader<R, P>) -> BackupResult<()> {
    let mut extra = [0u8; 1];
    loop {
        match rd.inner.read(&mut extra) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                return Err(corrupt(
                    "after the trailer",
                    rd.offset,
                    "bytes follow the trailer".into(),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(BackupError::Io {
                    op: "reading",
                    offset: rd.offset,
                    source,
                })
            }
        }
    }
}

/// Checks a whole backup (every checksum, count and the frame order) without
/// restoring it.
pub fn verify<R: Read>(input: R, progress: impl FnMut(u64)) -> BackupResult<BackupSummary> {
    read_backup(input, progress, |_, _| Ok(()))
}

/// Reads only the header of a backup (its transaction id and metadata); checked
/// by its own checksum, the rest is not read.
pub fn read_header<R: Read>(mut input: R) -> BackupResult<BackupSummary> {
    // Read through the header; stop at the first frame.
    let mut fixed = [0u8; 28];
    input
        .read_exact(&mut fixed)
        .map_err(|_| BackupError::Truncated {
            part: "the header".into(),
            offset: 0,
        })?;
    let meta_len = (le32(&fixed, 24) as usize).min(MAX_META);
    let mut rest = vec![0u8; meta_len + 4];
    input
        .read_exact(&mut rest)
        .map_err(|_| BackupError::Truncated {
            part: "the header".into(),
            offset: 28,
        })?;
    let mut whole = fixed.to_vec();
    whole.extend_from_slice(&rest);
    read_backup(&whole[..], |_| {}, |_, _| Ok(())).or_else(|e| match e {
        BackupError::Truncated { ref part, .. } if part.starts_with("frame 0") => {
            Ok(BackupSummary {
                format_version: le32(&fixed, 8),
                txn_id: le64(&fixed, 16),
                meta: rest.get(..meta_len).unwrap_or_default().to_vec(),
                ..Default::default()
            })
        }
        e => Err(e),
    })
}

#[derive(Clone, Default)]
pub struct RestoreOptions {
    /// Options of the new environment.
    pub storage: Options,
    /// Where the environment is built before it is renamed to the target (must be
    /// on the same filesystem). Default: a hidden directory next to the target.
    pub staging_dir: Option<PathBuf>,
}

fn fs_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BackupError + 'a {
    move |source| BackupError::Fs {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn sync_dir(vfs: &dyn Vfs, dir: &Path) -> BackupResult<()> {
    vfs.sync_dir(dir).map_err(fs_err("syncing directory", dir))
}

/// Restores a backup into a new environment at `target`, which must not exist.
/// Every checksum is verified while the environment is written into a staging
/// directory; only a fully verified, synced and closed environment is renamed to
/// `target`. On any failure the staging directory is removed; a crash leaves only
/// the staging directory (a hidden `.name.restore-*` next to the target, or the
/// caller's `staging_dir`), never `target`. Every file operation goes through
/// `opts.storage.vfs`, so a simulated disk can fail or cut any step.
pub fn restore_from<R: Read>(
    input: R,
    target: &Path,
    opts: RestoreOptions,
    progress: impl FnMut(u64),
) -> BackupResult<BackupSummary> {
    let vfs = opts.storage.vfs.clone();
    if vfs.exists(target) {
        return Err(BackupError::TargetExists(target.to_path_buf()));
    }
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let staging = match opts.staging_dir.clone() {
        Some(s) => s,
        None => default_staging_dir(target, &parent),
    };
    if vfs.exists(&staging) {
        return Err(BackupError::TargetExists(staging));
    }
    let result = restore_staged(input, &staging, opts.storage, progress);
    let result = result.and_then(|sum| {
        if vfs.exists(target) {
            return Err(BackupError::TargetExists(target.to_path_buf()));
        }
        vfs.rename(&staging, target)
            .map_err(fs_err("renaming into place", target))?;
        // A failed restore leaves nothing, even here: the target is complete, but
        // its name may not survive a power cut, and the caller is told it failed.
        if let Err(e) = sync_dir(vfs.as_ref(), &parent) {
            let _ = vfs.remove_dir_all(target);
            return Err(e);
        }
        Ok(sum)
    });
    if result.is_err() && vfs.exists(&staging) {
        let _ = vfs.remove_dir_all(&staging);
    }
    result
}

/// A hidden `.name.restore-<pid>-<nanos>` beside the target: on the same file
/// system (so the final rename is atomic) and never the name of an earlier attempt.
fn default_staging_dir(target: &Path, parent: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kiln".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    parent.join(format!(".{name}.restore-{}-{nanos}", std::process::id()))
}

/// The options a restore builds its environment with: it is synced and closed
/// before it is put into place, so its journal need not be synced commit by commit.
pub fn staging_options(mut storage: Options) -> Options {
    storage.journal_dir = None;
    storage.durability = crate::Durability::Buffered {
        sync_interval_ms: 1000,
    };
    storage
}

fn restore_staged<R: Read>(
    input: R,
    staging: &Path,
    storage: Options,
    progress: impl FnMut(u64),
) -> BackupResult<BackupSummary> {
    let vfs = storage.vfs.clone();
    let env = Env::open(staging, staging_options(storage))?;
    // A bare environment's trees are restored uncounted (their counts are not in
    // the container; see `restore_into`).
    let sum = restore_into(&env, input, false, &|_| false, progress)?;
    env.sync()?;
    env.close()?;
    sync_dir(vfs.as_ref(), staging)?;
    Ok(sum)
}

/// Writes every tree and entry of one container into `env` (an environment the
/// caller opened, normally empty and in a staging place), committing every
/// ~32 MiB. See `read_container` for `stop_at_trailer`. The caller syncs, closes
/// and puts the environment into place. A tree named so that `counted(name)` is
/// created counted (`WriteTxn::create_counted_tree`): the container does not say
/// (a tree's counts are derived data, and whether it keeps them is its role, which
/// the caller knows), so a backup of any build restores with the caller's choice.
pub fn restore_into<R: Read>(
    env: &Env,
    input: R,
    stop_at_trailer: bool,
    counted: &dyn Fn(&str) -> bool,
    progress: impl FnMut(u64),
) -> BackupResult<BackupSummary> {
    restore_into_with_files(
        env,
        input,
        stop_at_trailer,
        counted,
        progress,
        |_, _| Ok(()),
    )
}

/// `restore_into`, handing the container's extra files (`Item::File`,
/// `Item::FileData`, `Item::FileEnd`) to `files` as they are read: the caller
/// writes them where they belong (the engine only checks their bytes).
pub fn restore_into_with_files<R: Read>(
    env: &Env,
    input: R,
    stop_at_trailer: bool,
    counted: &dyn Fn(&str) -> bool,
    progress: impl FnMut(u64),
    mut files: impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<BackupSummary> {
    let mut txn: Option<crate::WriteTxn<'_>> = None;
    let mut tree = String::new();
    let mut pending = 0u64;
    let sum = read_container(input, stop_at_trailer, progress, |sum, item| {
        match item {
            Item::Header | Item::EndTree => {}
            Item::File { .. } | Item::FileData(_) | Item::FileEnd => files(sum, item)?,
            Item::Tree(name) => {
                let w = match txn.as_mut() {
                    Some(w) => w,
                    None => txn.insert(env.begin_write()?),
                };
                if counted(name) {
                    w.create_counted_tree(name)?;
                } else {
                    w.create_tree(name)?;
                }
                tree = name.to_string();
            }
            Item::Entry(k, v) => {
                let w = match txn.as_mut() {
                    Some(w) => w,
                    None => txn.insert(env.begin_write()?),
                };
                w.put(&tree, k, v)?;
                pending += (k.len() + v.len()) as u64;
                if pending >= RESTORE_TXN_BYTES {
                    if let Some(w) = txn.take() {
                        w.commit()?;
                    }
                    pending = 0;
                }
            }
        }
        Ok(())
    })?;
    if let Some(w) = txn.take() {
        w.commit()?;
    }
    Ok(sum)
}
