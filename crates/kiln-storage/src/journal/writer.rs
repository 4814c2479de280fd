//! Appends records to the journal and makes each durable before returning.

use super::compress::Compressor;
pub use super::files::{JournalFiles, JournalPos};
use super::record::{self, RecordInput};
use super::FileNeed as Need;
use crate::crypt::Cipher;
use crate::io::{OpenMode, Vfs, VfsFile, DIRECT_IO_ALIGN};
// Defined with the other options, so that `options` imports nothing that imports it.
pub use crate::options::Durability;
use crate::page::PageRun;
use crate::stats::EngineCounters;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

struct OpenJournal {
    seq: u64,
    path: PathBuf,
    file: Box<dyn VfsFile>,
    size: u64,
}

/// A record encoded and placed in the chain, waiting for its journal write.
pub struct PreparedRecord {
    pub txn_id: u64,
    buf: PageRun,
    len: usize,
    checksum: u32,
    /// Body bytes with full page images, with diffs, and after compression.
    pub full_image_body_len: usize,
    /// Merged value bytes named by buffer key instead of carried (patched images).
    pub referenced_value_bytes: usize,
    pub raw_body_len: usize,
    pub stored_body_len: usize,
}

/// Places records in the chain. Used under the writer lock, so records are chained
/// in commit order while their journal writes may still be in flight.
pub struct RecordEncoder {
    chain_checksum: u32,
    nonce: u64,
    /// `None`: compression is off.
    compressor: Option<Compressor>,
    /// An encrypted environment's: every record's body is sealed under it.
    cipher: Option<Arc<Cipher>>,
    counters: Arc<EngineCounters>,
}

impl PreparedRecord {
    /// Bytes this record takes in the journal (padded).
    pub fn journal_len(&self) -> usize {
        self.len
    }
}

impl RecordEncoder {
    /// `compression`: off, or on and adaptive or not (see `journal/compress.rs`).
    pub fn new(
        chain_checksum: u32,
        compression: Option<bool>,
        cipher: Option<Arc<Cipher>>,
        counters: Arc<EngineCounters>,
    ) -> Self {
        RecordEncoder {
            chain_checksum,
            nonce: rand::random(),
            compressor: compression.map(Compressor::new),
            cipher,
            counters,
        }
    }

    /// The chain value the next record links to.
    pub fn chain_checksum(&self) -> u32 {
        self.chain_checksum
    }

    /// Takes back records encoded after the chain stood at `chain_checksum` (their
    /// commit failed before its point of no return).
    pub fn rewind_chain(&mut self, chain_checksum: u32) {
        self.chain_checksum = chain_checksum;
    }

    pub fn encode(&mut self, mut input: RecordInput) -> PreparedRecord {
        input.nonce = self.nonce;
        input.prev_checksum = self.chain_checksum;
        let mut buf = PageRun::scratch(1);
        let disk = &self.counters.journal_write_cost;
        let compress = self.compressor.as_mut().map(|c| (c, disk));
        let enc = record::encode(&input, &mut buf, compress, self.cipher.as_deref());
        self.chain_checksum = enc.checksum;
        PreparedRecord {
            txn_id: input.txn_id,
            buf,
            len: enc.padded_len,
            checksum: enc.checksum,
            full_image_body_len: enc.full_image_body_len,
            referenced_value_bytes: enc.referenced_value_bytes,
            raw_body_len: enc.raw_body_len,
            stored_body_len: enc.stored_body_len,
        }
    }
}

/// Where the next record will go once every record encoded so far is written (the
/// journal writer's position, projected past the records still in flight). Kept
/// under the writer lock, so that a commit makes sure the journal file it needs
/// exists before its point of no return.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JournalEnd {
    seq: u64,
    offset: u64,
    size: u64,
}

impl JournalEnd {
    /// Journal bytes from `from` to this end, approximately: the files between
    /// are taken to be of this one's size (a file size changed between opens
    /// makes the older ones another size).
    pub fn bytes_since(&self, from: JournalPos) -> u64 {
        (self.seq.saturating_sub(from.file_seq) * self.size + self.offset)
            .saturating_sub(from.offset)
    }

    /// The position after a record of `len` bytes, switching files the way
    /// `JournalWriter::write` will, with the next file made ready (`reserve`).
    pub fn advance(&self, len: u64, files: &JournalFiles) -> Result<JournalEnd> {
        assert!(
            len.is_multiple_of(DIRECT_IO_ALIGN as u64),
            "a journal record of {len} bytes: records are padded to {DIRECT_IO_ALIGN} bytes"
        );
        let mut end = *self;
        if end.offset + len > end.size {
            let seq = end.seq + 1;
            end = JournalEnd {
                seq,
                offset: 0,
                size: files.reserve(seq, len)?,
            };
        }
        end.offset += len;
        // (`reserve` grows a file too small for the record.)
        assert!(
            end.offset <= end.size,
            "journal file {} of {} bytes: a record of {len} bytes projected to end at {}",
            end.seq,
            end.size,
            end.offset
        );
        Ok(end)
    }
}

/// Writes prepared records, in order, to the journal files.
pub struct JournalWriter {
    vfs: Arc<dyn Vfs>,
    files: Arc<JournalFiles>,
    counters: Arc<EngineCounters>,
    current: OpenJournal,
    offset: u64,
    /// The transaction whose record ends at `offset`: the next record must be the
    /// next transaction's (recovery follows the chain one txn id at a time).
    last_txn_id: u64,
    direct_io: bool,
    durability: Durability,
    /// Test-only canary: skip making journal writes durable.
    pub(crate) unsafe_skip_durability: bool,
}

impl JournalWriter {
    /// Opens the writer at `pos`, where the record of transaction `last_txn_id` ends
    /// (recovery's replay end). `pos` comes from the journal or the file header read
    /// from disk: an offset that no record can end at is refused as corruption.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        files: Arc<JournalFiles>,
        counters: Arc<EngineCounters>,
        pos: JournalPos,
        last_txn_id: u64,
        direct_io: bool,
        durability: Durability,
    ) -> Result<Self> {
        let path = files.ensure_file(pos.file_seq, Need::Now)?;
        files.set_current(pos.file_seq);
        let buffered = durability != Durability::Immediate;
        let (file, direct_io) =
            open_journal_file(vfs.as_ref(), &path, direct_io, buffered, &counters)?;
        let size = file
            .len()
            .map_err(|e| Error::io(&path, None, "stat journal file", e))?;
        if !pos.offset.is_multiple_of(DIRECT_IO_ALIGN as u64) || pos.offset > size {
            return Err(Error::corrupted(
                &path,
                format!("offset {}", pos.offset),
                format!(
                    "the journal continues after txn {last_txn_id} at offset {} of this {size}-byte file, \
                     but records end on {DIRECT_IO_ALIGN}-byte boundaries inside their file \
                     (a damaged file header or journal)",
                    pos.offset
                ),
            ));
        }
        counters.journal_direct_io_active.store(direct_io, Relaxed);
        if pos.offset >= size / 2 {
            files.spare_wanted.store(true, Relaxed);
        }
        Ok(JournalWriter {
            vfs,
            files,
            counters,
            current: OpenJournal {
                seq: pos.file_seq,
                path,
                file,
                size,
            },
            offset: pos.offset,
            last_txn_id,
            direct_io,
            durability,
            unsafe_skip_durability: false,
        })
    }

    /// Where the next record goes (see `JournalEnd`).
    pub(crate) fn end(&self) -> JournalEnd {
        JournalEnd {
            seq: self.current.seq,
            offset: self.offset,
            size: self.current.size,
        }
    }

    fn note_direct_io(&self) {
        self.counters
            .journal_direct_io_active
            .store(self.direct_io, Relaxed);
    }

    /// Test-only canary: journal writes become plain buffered writes with no sync,
    /// i.e. not durable against power loss. A crash suite must catch this.
    pub(crate) fn disable_durability_for_tests(&mut self) -> Result<()> {
        self.unsafe_skip_durability = true;
        let mode = OpenMode {
            write: true,
            ..Default::default()
        };
        self.current.file = self
            .vfs
            .open(&self.current.path, mode)
            .map_err(|e| Error::io(&self.current.path, None, "open journal file", e))?;
        self.direct_io = false;
        self.note_direct_io();
        Ok(())
    }

    fn skips_sync(&self) -> bool {
        self.unsafe_skip_durability || self.durability != Durability::Immediate
    }

    /// Writes one record (records must come in chain order) and returns once it is
    /// durable (or, in buffered mode, written to the OS). On error nothing is
    /// acknowledged; the environment latches, since what reached the disk is unknown.
    pub fn write(&mut self, rec: &PreparedRecord) -> Result<JournalPos> {
        assert_eq!(
            rec.txn_id,
            self.last_txn_id + 1,
            "journal write of txn {} after txn {}: records are written in transaction order, one per transaction",
            rec.txn_id,
            self.last_txn_id
        );
        self.note_direct_io();
        if self.offset + rec.len as u64 > self.current.size {
            self.switch_file(rec.len as u64)?;
        }
        assert!(
            self.offset.is_multiple_of(DIRECT_IO_ALIGN as u64)
                && rec.len.is_multiple_of(DIRECT_IO_ALIGN)
                && self.offset + rec.len as u64 <= self.current.size,
            "journal record of txn {} ({} bytes) at offset {} of {} ({} bytes): a record must start \
             on a {DIRECT_IO_ALIGN}-byte boundary, be padded to one and lie inside its file",
            rec.txn_id,
            rec.len,
            self.offset,
            self.current.path.display(),
            self.current.size
        );
        let start = Instant::now();
        let bytes = rec.buf.bytes().get(..rec.len).ok_or_else(|| {
            Error::Poisoned(crate::Failure::internal(
                "journal write",
                "an encoded record is longer than its buffer",
            ))
        })?;
        self.write_durable(bytes)?;
        let elapsed = start.elapsed();
        self.counters.journal_write_latency.record(elapsed);
        self.counters.journal_write_cost.observe(rec.len, elapsed);
        self.counters.journal_writes.fetch_add(1, Relaxed);
        self.counters
            .journal_bytes
            .fetch_add(rec.len as u64, Relaxed);
        self.counters
            .journal_body_bytes_full_images
            .fetch_add(rec.full_image_body_len as u64, Relaxed);
        self.counters
            .journal_body_bytes_raw
            .fetch_add(rec.raw_body_len as u64, Relaxed);
        self.counters
            .journal_referenced_value_bytes
            .fetch_add(rec.referenced_value_bytes as u64, Relaxed);
        self.counters
            .journal_body_bytes_stored
            .fetch_add(rec.stored_body_len as u64, Relaxed);
        let half = self.current.size / 2;
        if self.offset < half && self.offset + rec.len as u64 >= half {
            // Half of this file is used: have the flusher make the next one ready
            // now. Asking only at a switch (or a checkpoint) left the first switch
            // after open to create and zero-fill a file on the commit path.
            self.files.spare_wanted.store(true, Relaxed);
        }
        self.offset += rec.len as u64;
        self.last_txn_id = rec.txn_id;
        Ok(JournalPos {
            file_seq: self.current.seq,
            offset: self.offset,
            chain_checksum: rec.checksum,
        })
    }

    fn write_durable(&mut self, bytes: &[u8]) -> Result<()> {
        let off = self.offset;
        match self.current.file.write_all_at(bytes, off) {
            Err(e) if self.direct_io && e.raw_os_error() == Some(libc::EINVAL) => {
                // The file system accepted O_DIRECT at open but refuses the write.
                self.fall_back_to_buffered()?;
                return self.write_durable(bytes);
            }
            Err(e) => {
                return Err(Error::io(
                    &self.current.path,
                    Some(off),
                    "write journal record",
                    e,
                ))
            }
            Ok(()) => {}
        }
        if !self.direct_io && !self.skips_sync() {
            self.current
                .file
                .sync_data()
                .map_err(|e| Error::io(&self.current.path, Some(off), "fdatasync journal", e))?;
        }
        Ok(())
    }

    fn fall_back_to_buffered(&mut self) -> Result<()> {
        let (file, _) = open_journal_file(
            self.vfs.as_ref(),
            &self.current.path,
            false,
            false,
            &self.counters,
        )?;
        note_fallback(
            &self.counters,
            &self.current.path,
            "write refused with EINVAL",
        );
        self.current.file = file;
        self.direct_io = false;
        Ok(())
    }

    fn switch_file(&mut self, record_len: u64) -> Result<()> {
        let next = self.current.seq + 1;
        if !self.files.exists(next) {
            // Not prepared (or being prepared right now): this commit waits for it.
            self.counters.journal_switch_waits.fetch_add(1, Relaxed);
        }
        let path = self.files.ensure_file(next, Need::Now)?;
        if self.durability != Durability::Immediate && !self.unsafe_skip_durability {
            // Buffered mode: the background sync only looks at the current file, so
            // make the one we leave durable now.
            self.current
                .file
                .sync_data()
                .map_err(|e| Error::io(&self.current.path, None, "fdatasync journal", e))?;
        }
        let (file, direct) = open_journal_file(
            self.vfs.as_ref(),
            &path,
            self.direct_io && !self.unsafe_skip_durability,
            self.skips_sync(),
            &self.counters,
        )?;
        let mut size = file
            .len()
            .map_err(|e| Error::io(&path, None, "stat journal file", e))?;
        if size < record_len {
            // A record larger than a journal file (a huge value): grow this file for it.
            let target = record_len.div_ceil(DIRECT_IO_ALIGN as u64) * DIRECT_IO_ALIGN as u64;
            file.allocate(0, target)
                .map_err(|e| Error::io(&path, Some(0), "grow journal file", e))?;
            file.sync_all()
                .map_err(|e| Error::io(&path, None, "fsync journal file", e))?;
            size = target;
        }
        self.direct_io = direct;
        self.current = OpenJournal {
            seq: next,
            path,
            file,
            size,
        };
        self.offset = 0;
        self.files.set_current(next);
        self.files.spare_wanted.store(true, Relaxed);
        Ok(())
    }
}

fn note_fallback(counters: &EngineCounters, path: &Path, why: &str) {
    if !counters.journal_direct_io_fallback.swap(true, Relaxed) {
        tracing::warn!(
            path = %path.display(),
            "journal: O_DIRECT unavailable ({why}); falling back to buffered writes + fdatasync"
        );
    }
}

fn open_journal_file(
    vfs: &dyn Vfs,
    path: &Path,
    direct: bool,
    buffered: bool,
    counters: &EngineCounters,
) -> Result<(Box<dyn VfsFile>, bool)> {
    if direct && !buffered {
        let mode = OpenMode {
            write: true,
            direct: true,
            dsync: true,
            ..Default::default()
        };
        match vfs.open(path, mode) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                note_fallback(counters, path, "open refused with EINVAL")
            }
            Err(e) => return Err(Error::io(path, None, "open journal file", e)),
        }
    }
    let mode = OpenMode {
        write: true,
        ..Default::default()
    };
    let f = vfs
        .open(path, mode)
        .map_err(|e| Error::io(path, None, "open journal file", e))?;
    Ok((f, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::FileSizes;

    /// The writer continues where recovery says the journal ends, a position read
    /// from disk: one no record can end at is refused as corruption, with the file
    /// and offset, instead of writing there.
    #[test]
    fn open_refuses_a_position_no_record_ends_at() {
        let dir = tempfile::tempdir().unwrap();
        let vfs: Arc<dyn Vfs> = Arc::new(crate::io::OsVfs);
        let counters = Arc::new(EngineCounters::default());
        let sizes = FileSizes {
            first: 1 << 20,
            full: 1 << 20,
        };
        let files = Arc::new(
            JournalFiles::open(vfs.clone(), dir.path(), sizes, counters.clone(), 1).unwrap(),
        );
        let open_at = |offset| {
            let pos = JournalPos {
                file_seq: 1,
                offset,
                chain_checksum: 0,
            };
            JournalWriter::open(
                vfs.clone(),
                files.clone(),
                counters.clone(),
                pos,
                7,
                false,
                Durability::Immediate,
            )
        };
        assert!(open_at(8192).is_ok());
        assert!(open_at(1 << 20).is_ok(), "a file filled to its end");
        for offset in [100, (1 << 20) + 4096] {
            let err = open_at(offset).err().expect("refused");
            assert!(err.is_corruption(), "{err}");
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("offset {offset}"))
                    && msg.contains("after txn 7")
                    && msg.contains("journal-0000000000000001.log"),
                "{msg}"
            );
        }
    }
}
