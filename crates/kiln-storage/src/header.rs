//! The data file's header, double-buffered in pages 0 and 1, and the free-page
//! snapshot that goes with each copy (files `freelist-0` and `freelist-1`).
//!
//! The flusher writes the copy that is *not* the newest, so a torn header write can
//! only damage the older copy; on open the valid copy with the highest sequence wins.
//!
//! ```text
//! offset size field
//!  0     8    magic "KILNDAT1"
//!  8     4    format version (1)
//! 12     4    page size (8192)
//! 16     8    header sequence (increases with every header write)
//! 24     8    synced_txn_id: every transaction <= this is in the data file and synced
//! 32     8    catalog root page of that transaction (0 = no trees)
//! 40     8    page count (high-water mark) of that transaction
//! 48     8    journal file sequence holding the record after synced_txn_id
//! 56     8    byte offset of that record in its journal file
//! 64     4    checksum of the record of synced_txn_id (the journal chain continues from it)
//! 68     4    checksum of the free-page snapshot file of this copy
//! 72     8    length in bytes of that snapshot
//! 80     4    crc32c of bytes 0..80 (format 1 ends here)
//! 84     8    replay start: the transaction whose record ends where recovery must
//!             start reading, so that every write-buffer entry not yet merged into
//!             the synced data file is read again (format 2)
//! 92     8    journal file sequence of that position
//! 100    8    byte offset of that position
//! 108    4    chain checksum at that position
//! 112    4    crc32c of bytes 0..112 (format 2)
//! ```
//! A format 1 header (no write buffer) reads as a replay start equal to the synced
//! position.

use crate::io::{OpenMode, Vfs, DIRECT_IO_ALIGN};
use crate::page::{read_u32, read_u64, write_u32, write_u64, PageNo, PAGE_SIZE};
use crate::{Error, Result};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"KILNDAT1";
/// 3: leaf cells may point at bare runs (`page::VALUE_BARE_RUN`) and journal records
/// may hold their images (form 2), which a version-2 binary would take for damage;
/// its header layout is version 2's. Versions 1 and 2 are read (and become 3 at the
/// next checkpoint, since new values go to bare runs).
pub const FORMAT_VERSION: u32 = 3;
const HEADER_LEN_V1: usize = 84;
const HEADER_LEN: usize = 116;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileHeader {
    pub sequence: u64,
    pub synced_txn_id: u64,
    pub catalog_root: PageNo,
    pub page_count: u64,
    pub journal_file_seq: u64,
    pub journal_offset: u64,
    pub journal_chain_checksum: u32,
    pub freelist_checksum: u32,
    pub freelist_len: u64,
    pub replay_from_txn_id: u64,
    pub replay_from_file_seq: u64,
    pub replay_from_offset: u64,
    pub replay_from_chain_checksum: u32,
}

impl FileHeader {
    // Bounds: fixed offsets inside the `HEADER_LEN`-byte array built here.
    #[allow(clippy::indexing_slicing)]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE_SIZE];
        b[..8].copy_from_slice(MAGIC);
        write_u32(&mut b, 8, FORMAT_VERSION);
        write_u32(&mut b, 12, PAGE_SIZE as u32);
        write_u64(&mut b, 16, self.sequence);
        write_u64(&mut b, 24, self.synced_txn_id);
        write_u64(&mut b, 32, self.catalog_root);
        write_u64(&mut b, 40, self.page_count);
        write_u64(&mut b, 48, self.journal_file_seq);
        write_u64(&mut b, 56, self.journal_offset);
        write_u32(&mut b, 64, self.journal_chain_checksum);
        write_u32(&mut b, 68, self.freelist_checksum);
        write_u64(&mut b, 72, self.freelist_len);
        let v1_sum = crc32c::crc32c(&b[..80]);
        write_u32(&mut b, 80, v1_sum);
        write_u64(&mut b, 84, self.replay_from_txn_id);
        write_u64(&mut b, 92, self.replay_from_file_seq);
        write_u64(&mut b, 100, self.replay_from_offset);
        write_u32(&mut b, 108, self.replay_from_chain_checksum);
        let sum = crc32c::crc32c(&b[..112]);
        write_u32(&mut b, 112, sum);
        b
    }

    /// Decodes one copy; `Err` carries why the copy is unusable, and whether it is a
    /// valid header of another format version (not damage).
    pub fn decode(b: &[u8], path: &Path) -> Result<Self, (String, bool)> {
        Self::decode_inner(b, path)
    }

    fn decode_inner(b: &[u8], path: &Path) -> Result<Self, (String, bool)> {
        let damaged = |s: &str| Err((s.to_string(), false));
        if b.len() < HEADER_LEN_V1 {
            return damaged("header truncated");
        }
        if b.get(..8) != Some(&MAGIC[..]) {
            return damaged("bad magic");
        }
        if b.get(..80).map(crc32c::crc32c) != Some(read_u32(b, 80)) {
            return damaged("checksum mismatch");
        }
        let version = read_u32(b, 8);
        let page_size = read_u32(b, 12);
        if !(1..=FORMAT_VERSION).contains(&version) || page_size as usize != PAGE_SIZE {
            return Err((
                format!(
                    "format version {version} with {page_size}-byte pages ({})",
                    path.display()
                ),
                true,
            ));
        }
        if version >= 2
            && (b.len() < HEADER_LEN || b.get(..112).map(crc32c::crc32c) != Some(read_u32(b, 112)))
        {
            return damaged("checksum mismatch (replay start)");
        }
        let v2 = version >= 2;
        Ok(FileHeader {
            replay_from_txn_id: if v2 { read_u64(b, 84) } else { read_u64(b, 24) },
            replay_from_file_seq: if v2 { read_u64(b, 92) } else { read_u64(b, 48) },
            replay_from_offset: if v2 {
                read_u64(b, 100)
            } else {
                read_u64(b, 56)
            },
            replay_from_chain_checksum: if v2 {
                read_u32(b, 108)
            } else {
                read_u32(b, 64)
            },
            sequence: read_u64(b, 16),
            synced_txn_id: read_u64(b, 24),
            catalog_root: read_u64(b, 32),
            page_count: read_u64(b, 40),
            journal_file_seq: read_u64(b, 48),
            journal_offset: read_u64(b, 56),
            journal_chain_checksum: read_u32(b, 64),
            freelist_checksum: read_u32(b, 68),
            freelist_len: read_u64(b, 72),
        })
    }

    /// Which of the two slots this header lives in.
    pub fn slot(&self) -> u64 {
        self.sequence % 2
    }

    pub fn replay_start(&self) -> crate::journal::ReplayStart {
        crate::journal::ReplayStart::new(
            self.replay_from_txn_id,
            crate::journal::writer::JournalPos {
                file_seq: self.replay_from_file_seq,
                offset: self.replay_from_offset,
                chain_checksum: self.replay_from_chain_checksum,
            },
        )
    }

    /// Checks a header read from disk for what its checksum cannot vouch for: the
    /// catalog root lies inside the data pages, both journal positions are where a
    /// record can end (a multiple of `DIRECT_IO_ALIGN`), and the replay start is at
    /// or before the synced position (a later one would skip the page images of
    /// records the data file lacks). A copy that fails was written this way or
    /// damaged beyond its checksum: it is refused, never trusted.
    pub fn check(&self, path: &Path) -> Result<()> {
        let bad = |what: String| {
            Err(Error::corrupted(
                path,
                format!(
                    "file header copy {} (page {}, sequence {})",
                    self.slot(),
                    self.slot(),
                    self.sequence
                ),
                what,
            ))
        };
        let root = self.catalog_root;
        if self.page_count < crate::page::FIRST_DATA_PAGE
            || (root != 0 && !(crate::page::FIRST_DATA_PAGE..self.page_count).contains(&root))
        {
            return bad(format!(
                "catalog root {root} outside the data pages 2..{} of synced txn {}",
                self.page_count, self.synced_txn_id
            ));
        }
        let align = DIRECT_IO_ALIGN as u64;
        if !self.journal_offset.is_multiple_of(align)
            || !self.replay_from_offset.is_multiple_of(align)
        {
            return bad(format!(
                "journal offsets {} (synced position) and {} (replay start) must be multiples of {align}",
                self.journal_offset, self.replay_from_offset
            ));
        }
        let synced = (self.journal_file_seq, self.journal_offset);
        let start = (self.replay_from_file_seq, self.replay_from_offset);
        if self.replay_from_txn_id > self.synced_txn_id || start > synced {
            return bad(format!(
                "replay start (after txn {}, journal file {} offset {}) is past the synced position \
                 (after txn {}, journal file {} offset {})",
                self.replay_from_txn_id,
                start.0,
                start.1,
                self.synced_txn_id,
                synced.0,
                synced.1
            ));
        }
        Ok(())
    }

    pub fn set_replay_start(&mut self, r: &crate::journal::ReplayStart) {
        self.replay_from_txn_id = r.txn_id;
        self.replay_from_file_seq = r.pos.file_seq;
        self.replay_from_offset = r.pos.offset;
        self.replay_from_chain_checksum = r.pos.chain_checksum;
    }
}

pub fn freelist_path(dir: &Path, slot: u64) -> PathBuf {
    dir.join(format!("freelist-{slot}"))
}

/// Free pages as sorted runs: (start u64, length u64) pairs.
pub fn encode_freelist(pages: impl Iterator<Item = PageNo>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut run: Option<(u64, u64)> = None;
    for p in pages {
        run = match run {
            Some((s, l)) if s + l == p => Some((s, l + 1)),
            Some((s, l)) => {
                out.extend_from_slice(&s.to_le_bytes());
                out.extend_from_slice(&l.to_le_bytes());
                Some((p, 1))
            }
            None => Some((p, 1)),
        };
    }
    if let Some((s, l)) = run {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
    out
}

/// Decodes a free-page snapshot. Its runs must be non-empty, inside the data pages
/// and in ascending order without overlap, as `encode_freelist` writes them from a
/// sorted set: a page listed twice would be handed out twice, so a snapshot that
/// breaks this (a bug, since its checksum matched) is refused rather than used.
pub fn decode_freelist(b: &[u8], page_count: u64, path: &Path) -> Result<Vec<PageNo>> {
    if !b.len().is_multiple_of(16) {
        return Err(Error::corrupted(
            path,
            "whole file",
            "length is not a multiple of 16",
        ));
    }
    let mut pages = Vec::new();
    let mut previous_end = crate::page::FIRST_DATA_PAGE;
    for (i, chunk) in b.chunks_exact(16).enumerate() {
        let (start, len) = (read_u64(chunk, 0), read_u64(chunk, 8));
        let end = start.checked_add(len).filter(|e| *e <= page_count);
        let Some(end) = end.filter(|_| start >= crate::page::FIRST_DATA_PAGE) else {
            return Err(Error::corrupted(
                path,
                format!("run {i}"),
                format!("free run {start}+{len} outside pages 2..{page_count}"),
            ));
        };
        if len == 0 || start < previous_end {
            return Err(Error::corrupted(
                path,
                format!("run {i}"),
                format!(
                    "free run {start}+{len} is empty or not after the previous run, \
                     which ends at page {previous_end}"
                ),
            ));
        }
        pages.extend(start..end);
        previous_end = end;
    }
    Ok(pages)
}

/// Writes the free-page snapshot for `slot` and makes it durable.
pub fn write_freelist(vfs: &dyn Vfs, dir: &Path, slot: u64, bytes: &[u8]) -> Result<()> {
    let path = freelist_path(dir, slot);
    let mode = OpenMode {
        create: true,
        write: true,
        ..Default::default()
    };
    let file = vfs
        .open(&path, mode)
        .map_err(|e| Error::io(&path, None, "open", e))?;
    file.write_all_at(bytes, 0)
        .map_err(|e| Error::io(&path, Some(0), "write free-page snapshot", e))?;
    file.set_len(bytes.len() as u64)
        .map_err(|e| Error::io(&path, None, "truncate free-page snapshot", e))?;
    file.sync_all()
        .map_err(|e| Error::io(&path, None, "fsync free-page snapshot", e))
}

pub fn read_freelist(vfs: &dyn Vfs, dir: &Path, header: &FileHeader) -> Result<Vec<PageNo>> {
    if header.freelist_len == 0 {
        return Ok(Vec::new());
    }
    let path = freelist_path(dir, header.slot());
    let file = vfs
        .open(&path, OpenMode::default())
        .map_err(|e| Error::io(&path, None, "open free-page snapshot", e))?;
    let len = file.len().map_err(|e| Error::io(&path, None, "stat", e))?;
    if len < header.freelist_len {
        return Err(Error::corrupted(
            &path,
            "whole file",
            format!("{len} bytes, header expects {}", header.freelist_len),
        ));
    }
    let mut buf = vec![0u8; header.freelist_len as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| Error::io(&path, Some(0), "read free-page snapshot", e))?;
    if crc32c::crc32c(&buf) != header.freelist_checksum {
        return Err(Error::corrupted(&path, "whole file", "checksum mismatch"));
    }
    let pages = decode_freelist(&buf, header.page_count, &path)?;
    // A free page is never referenced; the catalog root is checked (its pages are
    // sorted, so this is one lookup): handing it out would overwrite the catalog.
    let root = header.catalog_root;
    if root != 0 && pages.binary_search(&root).is_ok() {
        return Err(Error::corrupted(
            &path,
            format!("page {root}"),
            format!(
                "lists page {root} as free, the catalog root of synced txn {}",
                header.synced_txn_id
            ),
        ));
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::{decode_freelist, encode_freelist, FileHeader};
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    fn runs(pairs: &[(u64, u64)]) -> Vec<u8> {
        pairs
            .iter()
            .flat_map(|(s, l)| s.to_le_bytes().into_iter().chain(l.to_le_bytes()))
            .collect()
    }

    proptest! {
        /// A header copy with any bytes changed in its checksummed range is refused as
        /// damaged, and arbitrary bytes never panic the decoder.
        #[test]
        fn damaged_header_copies_are_refused(
            edits in proptest::collection::vec((0usize..112, 1u8..=255), 1..4),
            junk in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let h = FileHeader { sequence: 7, synced_txn_id: 42, page_count: 99, ..Default::default() };
            let mut b = h.encode();
            prop_assert_eq!(FileHeader::decode(&b, Path::new("data")).unwrap(), h);
            for (at, x) in edits {
                b[at] ^= x;
            }
            let (why, other_format) = FileHeader::decode(&b, Path::new("data")).unwrap_err();
            // A flip that lands on the version or page size with a matching checksum
            // is impossible here: the checksum covers both.
            prop_assert!(!other_format, "{}", why);
            let _ = FileHeader::decode(&junk, Path::new("data"));
        }

        /// Any set of data pages survives the snapshot's encoding unchanged.
        #[test]
        fn free_page_snapshots_round_trip(pages in proptest::collection::btree_set(2u64..5_000, 0..400)) {
            let bytes = encode_freelist(pages.iter().copied());
            let back = decode_freelist(&bytes, 5_000, Path::new("freelist-0")).unwrap();
            prop_assert_eq!(back.into_iter().collect::<BTreeSet<_>>(), pages);
        }
    }

    /// What a checksum cannot vouch for in a header read from disk is refused as
    /// corruption naming the copy: a replay start past the synced position, journal
    /// offsets no record ends at, a catalog root outside the data pages.
    #[test]
    fn headers_with_impossible_journal_positions_or_root_are_refused() {
        let path = Path::new("data.kiln");
        let good = FileHeader {
            sequence: 5,
            synced_txn_id: 40,
            catalog_root: 7,
            page_count: 100,
            journal_file_seq: 3,
            journal_offset: 8192,
            replay_from_txn_id: 30,
            replay_from_file_seq: 2,
            replay_from_offset: 4096,
            ..Default::default()
        };
        good.check(path).unwrap();
        FileHeader {
            replay_from_txn_id: 40,
            replay_from_file_seq: 3,
            replay_from_offset: 8192,
            ..good.clone()
        }
        .check(path)
        .unwrap();
        for (bad, why) in [
            (
                FileHeader {
                    replay_from_txn_id: 41,
                    ..good.clone()
                },
                "replay start (after txn 41, journal file 2 offset 4096) is past the synced position",
            ),
            (
                FileHeader {
                    replay_from_file_seq: 3,
                    replay_from_offset: 12288,
                    ..good.clone()
                },
                "is past the synced position (after txn 40, journal file 3 offset 8192)",
            ),
            (
                FileHeader {
                    replay_from_file_seq: 4,
                    replay_from_offset: 0,
                    ..good.clone()
                },
                "past the synced position",
            ),
            (
                FileHeader {
                    journal_offset: 8200,
                    ..good.clone()
                },
                "must be multiples of 4096",
            ),
            (
                FileHeader {
                    catalog_root: 100,
                    ..good.clone()
                },
                "catalog root 100 outside the data pages 2..100",
            ),
            (
                FileHeader {
                    catalog_root: 1,
                    ..good.clone()
                },
                "catalog root 1 outside",
            ),
        ] {
            let err = bad.check(path).unwrap_err();
            assert!(err.is_corruption(), "{err}");
            let msg = err.to_string();
            assert!(
                msg.contains(why) && msg.contains("file header copy 1 (page 1, sequence 5)"),
                "{msg}"
            );
        }
    }

    /// A free-page snapshot that lists the catalog root is refused (page named).
    #[test]
    fn a_snapshot_listing_the_catalog_root_as_free_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let vfs = crate::io::OsVfs;
        let bytes = encode_freelist([5u64, 6, 7, 20].into_iter());
        super::write_freelist(&vfs, dir.path(), 0, &bytes).unwrap();
        let header = FileHeader {
            sequence: 2,
            synced_txn_id: 9,
            catalog_root: 9,
            page_count: 50,
            freelist_checksum: crc32c::crc32c(&bytes),
            freelist_len: bytes.len() as u64,
            ..Default::default()
        };
        assert_eq!(
            super::read_freelist(&vfs, dir.path(), &header).unwrap(),
            [5, 6, 7, 20]
        );
        let err = super::read_freelist(
            &vfs,
            dir.path(),
            &FileHeader {
                catalog_root: 6,
                ..header
            },
        )
        .unwrap_err();
        assert!(err.is_corruption(), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("freelist-0")
                && msg.contains("page 6")
                && msg.contains("the catalog root of synced txn 9"),
            "{msg}"
        );
    }

    #[test]
    fn overlapping_unordered_or_empty_runs_are_refused() {
        let path = Path::new("freelist-1");
        assert_eq!(
            decode_freelist(&runs(&[(2, 3), (10, 2)]), 100, path).unwrap(),
            [2, 3, 4, 10, 11]
        );
        for (bad, why) in [
            (runs(&[(2, 3), (4, 2)]), "not after the previous run"),
            (runs(&[(10, 2), (2, 3)]), "not after the previous run"),
            (runs(&[(2, 3), (5, 0)]), "empty"),
            (runs(&[(1, 3)]), "outside pages"),
            (runs(&[(98, 3)]), "outside pages"),
            (runs(&[(u64::MAX, 2)]), "outside pages"),
        ] {
            let err = decode_freelist(&bad, 100, path).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }
}
