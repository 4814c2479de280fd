//! One journal record per commit.
//!
//! ```text
//! header, 64 bytes, little endian
//!  0  u32 magic "KJR1"
//!  4  u8  version (1)
//!  5  u8  flags: bit 0 = body compressed with LZ4 (block format)
//!  6  u16 reserved (0)
//!  8  u64 transaction id
//! 16  u64 nonce of the process that wrote it (new on every open)
//! 24  u32 checksum of the previous record (the chain)
//! 28  u32 crc32c of header (with this field zero) and body
//! 32  u32 body length in bytes
//! 36  u32 page image count
//! 40  u32 freed page count
//! 44  u32 body length before compression (= body length when not compressed)
//! 48  u64 catalog root after the transaction
//! 56  u64 page count (high-water mark) after the transaction
//! body (after decompression, if compressed)
//!     freed page numbers, u64 each
//!     page images, each: page u64 | run pages u32 | form u32, then by form
//!       0 full:  head len u32 | tail len u32 | head | tail
//!                (the bytes between head and tail are zero)
//!       1 diff:  source page u64 | run count u32 | runs: offset u16 | len u16 | bytes
//!                (the page is the source page's bytes with the runs written over them;
//!                 single pages only)
//!       2 bare:  as full, for a bare value run (no page header to verify)
//!       3 patched: source page u64 (0: none, start from zeros) | run count u32 |
//!                ref count u32 | runs as in a diff | refs: offset u16 | len u16 |
//!                buffer key len u16 | buffer key
//!                (single leaf pages only: the runs, then at each ref the value the
//!                 write buffer's frozen generation holds for that buffer key, which
//!                 this transaction merged into the page; see `MergedValueSource`)
//!     if flag bit 1: write-buffer entries: count u32, then each
//!       buffer key len u16 | kind u8 (0 value, 1 tombstone, 2 in tree) | value len u32 |
//!       buffer key (tree id u64 big endian + key) | value
//!
//! With flag bit 4 (an encrypted environment, `crypt.rs`) the stored body (after
//! compression) is XChaCha20-Poly1305 ciphertext followed by its 24-byte nonce and
//! 16-byte tag, and the body length counts them; the 64-byte header, checksum
//! field zero, is the associated data. The checksum still covers the stored bytes,
//! so a torn record is told from a forged or mis-keyed one.
//!
//! A diff is used when it is smaller than the full image. Its source is the page this
//! one was copied from (copy-on-write). Replaying it is safe because a page freed by
//! transaction T is not reused before T is synced (see `alloc/mod.rs`), so while T may still
//! need replay, the source page still holds the version T copied.
//! ```
//! The record is padded with zeros to a multiple of 4 KiB; the next record starts at
//! the next 4 KiB boundary. The chain (previous checksum, with the nonce inside the
//! checksummed bytes) means a stale record left in a recycled or rewritten region can
//! never pass as the continuation of the current history.

use super::compress::{Compressor, JournalWriteCost, Verdict};
use super::decode_error::take;
pub use super::decode_error::{DecodeError, EntryProblem, ImageProblem};
use super::logical;
pub use super::logical::LogicalLog;
use crate::crypt::{Cipher, Sealed, NONCE_BYTES, TAG_BYTES};
use crate::io::DIRECT_IO_ALIGN;
use crate::page::{
    self, read_u16, read_u32, read_u64, write_u16, write_u32, write_u64, PageNo, PageRun, PAGE_SIZE,
};
use std::sync::Arc;

mod decode;
mod encode;
pub use decode::*;
pub use encode::*;

pub const MAGIC: u32 = u32::from_le_bytes(*b"KJR1");
pub const VERSION: u8 = 1;
pub const RECORD_HEADER: usize = 64;
const FLAG_LZ4: u8 = 1;
const FLAG_LOGICAL: u8 = 2;
pub const FLAG_FREEZE: u8 = 4;
pub const FLAG_MERGE_DONE: u8 = 8;
/// The body is sealed (encrypted and authenticated) under the environment's key.
const FLAG_SEALED: u8 = 16;
const KNOWN_FLAGS: u8 = FLAG_LZ4 | FLAG_LOGICAL | FLAG_FREEZE | FLAG_MERGE_DONE | FLAG_SEALED;
/// A sealed body's nonce and tag, after its ciphertext.
const SEAL_TRAILER: usize = NONCE_BYTES + TAG_BYTES;
/// Bodies smaller than this are not worth compressing.
const MIN_COMPRESS_BODY: usize = 1024;
/// A record's body may not decompress to more than this (bounds allocation).
const MAX_RAW_BODY: usize = page::MAX_VALUE_SIZE + (64 << 20);
const IMAGE_HEADER: usize = 16;
const FULL_HEADER: usize = 8;
const DIFF_HEADER: usize = 12;
const RUN_HEADER: usize = 4;
const FORM_FULL: u32 = 0;
const FORM_DIFF: u32 = 1;
/// A full image of a bare run (`page::VALUE_BARE_RUN`): laid out as `FORM_FULL`, but
/// replay must not verify it as a page, since it has no header.
const FORM_BARE: u32 = 2;
/// A leaf page as runs over a source page (or zeros) plus values named by their
/// buffer key (`Form::Patched`).
const FORM_PATCHED: u32 = 3;
const PATCHED_HEADER: usize = 16;
const REF_HEADER: usize = 6;
/// Values shorter than this are always written out: naming one costs its buffer key,
/// and finding it costs a lookup per cell.
pub const MIN_REFERENCED_VALUE: usize = 256;
/// The longest buffer key a reference may carry (tree id + the longest key).
const MAX_REF_KEY: usize = 8 + page::MAX_KEY_SIZE;
/// Equal stretches shorter than this do not split a diff run (a run header costs 4).
const DIFF_MERGE_GAP: usize = 8;
/// The largest run a record may describe (a value of the maximum size).
const MAX_RUN_PAGES: u64 = (page::MAX_VALUE_SIZE / PAGE_SIZE + 2) as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub txn_id: u64,
    pub nonce: u64,
    pub prev_checksum: u32,
    pub checksum: u32,
    pub body_len: u32,
    pub image_count: u32,
    pub freed_count: u32,
    pub flags: u8,
    pub raw_body_len: u32,
    pub catalog_root: PageNo,
    pub page_count: u64,
}

impl RecordHeader {
    /// Bytes the record occupies in the journal, padding included.
    pub fn padded_len(&self) -> u64 {
        padded(RECORD_HEADER + self.body_len as usize) as u64
    }
}

pub fn padded(len: usize) -> usize {
    len.div_ceil(DIRECT_IO_ALIGN) * DIRECT_IO_ALIGN
}

/// The values a transaction merged from the write buffer's frozen generation into
/// leaf pages. A record names such a value by its buffer key instead of repeating
/// its bytes, which are already in the journal as the entry that buffered it: replay
/// rebuilds the frozen generation from those entries before it reaches the merge
/// (docs/design/storage.md §2.4, "Patched images").
pub trait MergedValueSource {
    /// The buffer key under which this transaction merged exactly `value` for `key`
    /// (a key of the leaf's tree), if it did.
    fn merged_as(&self, key: &[u8], value: &[u8]) -> Option<&[u8]>;
}

/// Parses and sanity-checks a header block. `None` if it is not a record header.
pub fn parse_header(b: &[u8]) -> Option<RecordHeader> {
    if b.len() < RECORD_HEADER || read_u32(b, 0) != MAGIC || b.get(4) != Some(&VERSION) {
        return None;
    }
    let flags = *b.get(5)?;
    Some(RecordHeader {
        txn_id: read_u64(b, 8),
        nonce: read_u64(b, 16),
        prev_checksum: read_u32(b, 24),
        checksum: read_u32(b, 28),
        body_len: read_u32(b, 32),
        image_count: read_u32(b, 36),
        freed_count: read_u32(b, 40),
        flags,
        raw_body_len: read_u32(b, 44),
        catalog_root: read_u64(b, 48),
        page_count: read_u64(b, 56),
    })
}

/// Bit errors in the magic and version bytes up to which a block still counts as a
/// record header (damaged if it does not parse). A bit flip there must not make the
/// last acknowledged record look like the zeros or stale bytes of a clean end;
/// random bytes come within 3 of these 40 bits about once in 10^8 blocks.
const HEADER_MAX_BIT_ERRORS: u32 = 3;

/// True if `b` starts with our magic and version, or with bytes a few bits away from
/// them. A block that resembles a header but does not parse is a damaged record
/// (recovery reports it), never the clean end of the journal.
pub fn resembles_header(b: &[u8]) -> bool {
    let Some(head) = b.get(..5) else {
        return false;
    };
    let mut expected = [0u8; 5];
    expected[..4].copy_from_slice(&MAGIC.to_le_bytes());
    expected[4] = VERSION;
    let bit_errors: u32 = head
        .iter()
        .zip(expected)
        .map(|(a, e)| (a ^ e).count_ones())
        .sum();
    bit_errors <= HEADER_MAX_BIT_ERRORS
}

/// True if the checksum over header and body matches. `record` holds at least
/// RECORD_HEADER + body_len bytes.
pub fn checksum_ok(h: &RecordHeader, record: &[u8]) -> bool {
    let len = RECORD_HEADER + h.body_len as usize;
    if record.len() < len {
        return false;
    }
    let (Some(stored_head), Some(body)) =
        (record.get(..RECORD_HEADER), record.get(RECORD_HEADER..len))
    else {
        return false;
    };
    let mut head = [0u8; RECORD_HEADER];
    head.copy_from_slice(stored_head);
    write_u32(&mut head, 28, 0);
    let sum = crc32c::crc32c_append(crc32c::crc32c(&head), body);
    sum == h.checksum
}

#[cfg(test)]
mod tests {
    use super::decode::decode_parts;
    use super::*;
    use crate::write_buffer::{Slot, SlotRef};

    fn apply(old: &[u8], new: &[u8]) -> Vec<u8> {
        let mut out = old.to_vec();
        for (s, e) in diff_runs(old, new) {
            out[s..e].copy_from_slice(&new[s..e]);
        }
        out
    }

    #[test]
    fn diff_runs_of_random_edits_are_exact() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..500 {
            let old: Vec<u8> = (0..PAGE_SIZE).map(|_| rng.gen()).collect();
            let mut new = old.clone();
            for _ in 0..rng.gen_range(0..6) {
                let at = rng.gen_range(0..PAGE_SIZE);
                let len = rng.gen_range(1..300).min(PAGE_SIZE - at);
                for b in &mut new[at..at + len] {
                    *b = rng.gen();
                }
            }
            let runs = diff_runs(&old, &new);
            assert_eq!(apply(&old, &new), new);
            for (s, e) in runs {
                // Ends are exact: a run starts and ends on a changed byte.
                assert!(old[s] != new[s] && old[e - 1] != new[e - 1]);
            }
        }
    }

    #[test]
    fn diff_runs_reproduce_the_new_bytes() {
        let old: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7) as u8).collect();
        for edits in [
            vec![],
            vec![0],
            vec![PAGE_SIZE - 1],
            vec![5, 6, 100, 101, 4000],
            vec![8, 15, 16, 23],
        ] {
            let mut new = old.clone();
            for e in &edits {
                new[*e] ^= 0xFF;
            }
            let runs = diff_runs(&old, &new);
            assert_eq!(apply(&old, &new), new, "edits {edits:?} runs {runs:?}");
            assert_eq!(runs.is_empty(), edits.is_empty());
        }
        let odd_old = vec![1u8; 13];
        let mut odd_new = odd_old.clone();
        odd_new[12] = 9;
        assert_eq!(apply(&odd_old, &odd_new), odd_new);
    }

    #[test]
    fn logical_entries_round_trip_in_order_with_truncation() {
        let mut log = LogicalLog::default();
        let a = log.push(7, b"alpha", Slot::Value(b"one".to_vec().into()).as_ref());
        log.push(7, b"beta", SlotRef::Tombstone);
        let c = log.push(9, b"alpha", SlotRef::InTree);
        log.push(9, b"gamma", SlotRef::Value(&[5u8; 3000]));
        assert_eq!(
            log.buffer_key(a),
            crate::write_buffer::buffer_key(7, b"alpha").as_ref()
        );
        assert_eq!(
            log.buffer_key(c),
            crate::write_buffer::buffer_key(9, b"alpha").as_ref()
        );
        log.truncate(c, 2);
        log.push(9, b"alpha", Slot::Value(b"two".to_vec().into()).as_ref());
        let mut buf = PageRun::scratch(1);
        let input = RecordInput {
            txn_id: 3,
            nonce: 1,
            prev_checksum: 0,
            catalog_root: 2,
            page_count: 3,
            freed: &[],
            pages: &[],
            logical: &log,
            buffer_flags: 0,
            merged: None,
        };
        let (mut c, disk) = (Compressor::new(false), JournalWriteCost::default());
        let enc = encode(&input, &mut buf, Some((&mut c, &disk)), None);
        let rec = decode(&buf.bytes()[..enc.padded_len]).expect("decodes");
        let expect: Vec<(Box<[u8]>, Slot)> = vec![
            (
                crate::write_buffer::buffer_key(7, b"alpha"),
                Slot::Value(b"one".to_vec().into()),
            ),
            (crate::write_buffer::buffer_key(7, b"beta"), Slot::Tombstone),
            (
                crate::write_buffer::buffer_key(9, b"alpha"),
                Slot::Value(b"two".to_vec().into()),
            ),
        ];
        assert_eq!(rec.logical, expect);
    }

    /// A sealed record decodes with its key only; changing a byte of its body or a
    /// field of its header (with the checksum made to match) fails authentication.
    #[test]
    fn sealed_records_open_with_their_key_only() {
        let mut log = LogicalLog::default();
        for i in 0..200u32 {
            log.push(
                7,
                &i.to_be_bytes(),
                Slot::Value(b"secret value".repeat(10).into()).as_ref(),
            );
        }
        let input = RecordInput {
            txn_id: 3,
            nonce: 1,
            prev_checksum: 0,
            catalog_root: 2,
            page_count: 3,
            freed: &[],
            pages: &[],
            logical: &log,
            buffer_flags: 0,
            merged: None,
        };
        let cipher = Cipher::for_tests([9; 32]);
        let mut buf = PageRun::scratch(1);
        let (mut c, disk) = (Compressor::new(false), JournalWriteCost::default());
        let enc = encode(&input, &mut buf, Some((&mut c, &disk)), Some(&cipher));
        let rec = buf.bytes()[..enc.padded_len].to_vec();
        assert!(!rec.windows(12).any(|w| w == b"secret value"));
        let decoded = decode_with(&rec, Some(&cipher)).expect("opens with its key");
        assert_eq!(decoded.logical.len(), 200);
        assert!(matches!(
            decode_with(&rec, None),
            Err(DecodeError::SealedWithoutKey)
        ));
        let other = Cipher::for_tests([8; 32]);
        assert!(matches!(
            decode_with(&rec, Some(&other)),
            Err(DecodeError::Unauthentic)
        ));
        // A body byte, then a header field (the catalog root), changed and the
        // checksum fixed: the tag catches both.
        for at in [RECORD_HEADER + 5, 48] {
            let mut bad = rec.clone();
            bad[at] ^= 1;
            write_u32(&mut bad, 28, 0);
            let h = parse_header(&bad).unwrap();
            let sum = crc32c::crc32c(&bad[..RECORD_HEADER + h.body_len as usize]);
            write_u32(&mut bad, 28, sum);
            assert!(
                matches!(
                    decode_with(&bad, Some(&cipher)),
                    Err(DecodeError::Unauthentic)
                ),
                "byte {at}"
            );
        }
    }

    /// Fuzzing a sealed record: random byte changes anywhere (half the time with the
    /// checksum made to match, so the tag is what must catch them) never panic and
    /// never decode, unless they touched only the padding. `KILN_FUZZ_SCALE` runs
    /// more cases (the slow tier: 200x).
    #[test]
    fn mutated_sealed_records_are_rejected_unless_only_padding_changed() {
        use rand::{Rng, SeedableRng};
        let scale: u32 = std::env::var("KILN_FUZZ_SCALE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let mut log = LogicalLog::default();
        for i in 0..60u32 {
            log.push(
                7,
                &i.to_be_bytes(),
                Slot::Value(vec![i as u8; 50].into()).as_ref(),
            );
        }
        let input = RecordInput {
            txn_id: 9,
            nonce: 4,
            prev_checksum: 1,
            catalog_root: 2,
            page_count: 40,
            freed: &[5, 6, 7],
            pages: &[],
            logical: &log,
            buffer_flags: 0,
            merged: None,
        };
        let cipher = Cipher::for_tests([4; 32]);
        let mut buf = PageRun::scratch(1);
        let enc = encode(&input, &mut buf, None, Some(&cipher));
        let original = buf.bytes()[..enc.padded_len].to_vec();
        let covered = RECORD_HEADER + parse_header(&original).unwrap().body_len as usize;
        assert!(covered < original.len(), "the record has padding");
        let good = decode_with(&original, Some(&cipher)).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5EA1);
        let (mut rejected, mut padding_only) = (0u32, 0u32);
        for case in 0..500 * scale.max(1) {
            let mut rec = original.clone();
            for _ in 0..rng.gen_range(1..=4) {
                // Not the checksum field: rewriting it below would undo the change.
                let at = match rng.gen_range(0..rec.len()) {
                    28..=31 => 32,
                    at => at,
                };
                rec[at] ^= rng.gen_range(1..=255u8);
            }
            // (Two changes of one byte may cancel out: compare, do not count.)
            let touched_covered = rec[..covered] != original[..covered];
            if rng.gen_bool(0.5) {
                if let Some(h) = parse_header(&rec) {
                    let end = (RECORD_HEADER + h.body_len as usize).min(rec.len());
                    write_u32(&mut rec, 28, 0);
                    let sum = crc32c::crc32c(&rec[..end]);
                    write_u32(&mut rec, 28, sum);
                }
            }
            match decode_with(&rec, Some(&cipher)) {
                Err(_) => rejected += 1,
                Ok(d) => {
                    assert!(
                        !touched_covered,
                        "case {case}: a changed sealed record decoded"
                    );
                    assert_eq!(d.logical, good.logical, "case {case}");
                    padding_only += 1;
                }
            }
        }
        assert!(
            rejected > 0 && padding_only > 0,
            "{rejected} rejected, {padding_only} padding-only"
        );
    }

    /// A record whose checksum holds but whose catalog root lies outside its data
    /// pages is refused by the decoder (replay then fails with the file and offset).
    /// A body that does not decode says what is wrong and at which byte of the body.
    #[test]
    fn decode_errors_say_what_and_where() {
        let log = LogicalLog::default();
        let mut buf = PageRun::scratch(1);
        let input = RecordInput {
            txn_id: 3,
            nonce: 1,
            prev_checksum: 0,
            catalog_root: 0,
            page_count: 10,
            freed: &[],
            pages: &[],
            logical: &log,
            buffer_flags: 0,
            merged: None,
        };
        let enc = encode(&input, &mut buf, None, None);
        let mut h = parse_header(&buf.bytes()[..enc.padded_len]).expect("a header");
        // One freed page, then an image of page 3 with a run of no pages.
        h.freed_count = 1;
        h.image_count = 1;
        let mut body = 2u64.to_le_bytes().to_vec();
        body.extend_from_slice(&3u64.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&FORM_FULL.to_le_bytes());
        let e = decode_parts(&h, &body).err().expect("refused");
        assert!(
            matches!(
                e,
                DecodeError::Image {
                    index: 0,
                    page: 3,
                    at: 8,
                    problem: ImageProblem::RunLength { run_pages: 0 }
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "page image 0 (page 3) at byte 8: a run of 0 pages"
        );
        body.truncate(12);
        let e = decode_parts(&h, &body).err().expect("refused");
        assert_eq!(
            e.to_string(),
            "page image header of 16 bytes at byte 8 runs past the body of 12 bytes"
        );
        h.image_count = 0;
        body.truncate(11);
        let e = decode_parts(&h, &body).err().expect("refused");
        assert!(
            matches!(e, DecodeError::TrailingBytes { at: 8, count: 3 }),
            "{e:?}"
        );
        h.freed_count = 2;
        body = [2u64.to_le_bytes(), 10u64.to_le_bytes()].concat();
        let e = decode_parts(&h, &body).err().expect("refused");
        assert_eq!(
            e.to_string(),
            "freed page 10 (at byte 8) outside the data pages 2..10"
        );
    }

    #[test]
    fn a_catalog_root_outside_the_data_pages_is_refused() {
        let log = LogicalLog::default();
        for (root, ok) in [(0, true), (2, true), (9, true), (1, false), (10, false)] {
            let mut buf = PageRun::scratch(1);
            let input = RecordInput {
                txn_id: 3,
                nonce: 1,
                prev_checksum: 0,
                catalog_root: root,
                page_count: 10,
                freed: &[],
                pages: &[],
                logical: &log,
                buffer_flags: 0,
                merged: None,
            };
            let enc = encode(&input, &mut buf, None, None);
            let decoded = decode(&buf.bytes()[..enc.padded_len]);
            match decoded {
                Ok(rec) => assert!(ok && rec.header.catalog_root == root, "root {root} decoded"),
                Err(e) => assert!(
                    !ok && e.to_string()
                        == format!("catalog root {root} outside the data pages 2..10"),
                    "root {root}: {e}"
                ),
            }
        }
    }

    #[test]
    fn cut_runs_removes_exactly_the_holes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let ranges = |rng: &mut rand::rngs::StdRng, n: usize| {
            let mut at = 0;
            let mut out = Vec::new();
            for _ in 0..n {
                let start = at + rng.gen_range(0..200);
                let end = start + rng.gen_range(1..300);
                if end > PAGE_SIZE {
                    break;
                }
                out.push((start, end));
                at = end + 1;
            }
            out
        };
        for _ in 0..2000 {
            let (n_runs, n_holes) = (rng.gen_range(0..12), rng.gen_range(0..12));
            let runs = ranges(&mut rng, n_runs);
            let holes = ranges(&mut rng, n_holes);
            let cut = cut_runs(&runs, &holes);
            let covered =
                |rs: &[(usize, usize)], i: usize| rs.iter().any(|&(s, e)| s <= i && i < e);
            for i in 0..PAGE_SIZE {
                assert_eq!(
                    covered(&cut, i),
                    covered(&runs, i) && !covered(&holes, i),
                    "byte {i}: runs {runs:?} holes {holes:?} cut {cut:?}"
                );
            }
            assert!(cut.windows(2).all(|w| w[0].1 <= w[1].0));
            assert!(cut.iter().all(|(s, e)| s < e));
        }
    }

    /// Values merged by a test transaction, by key.
    struct Merged(std::collections::HashMap<Vec<u8>, (Vec<u8>, Vec<u8>)>);

    impl MergedValueSource for Merged {
        fn merged_as(&self, key: &[u8], value: &[u8]) -> Option<&[u8]> {
            let (bkey, v) = self.0.get(key)?;
            (v.as_slice() == value).then_some(bkey.as_slice())
        }
    }

    fn leaf_with(no: PageNo, cells: &[(Vec<u8>, Vec<u8>)]) -> PageRun {
        let mut run = PageRun::zeroed(1);
        let b = run.bytes_mut();
        page::init_node(b, page::KIND_LEAF, no);
        for (i, (k, v)) in cells.iter().enumerate() {
            assert!(page::insert_cell(b, i, &page::encode_leaf_cell(k, v)));
        }
        page::seal(b, no, 9);
        run
    }

    /// Encodes one page with `merged`, decodes it and rebuilds it, resolving buffer
    /// keys through `merged`: (rebuilt page, referenced bytes, record length).
    fn patched_round_trip(
        page: &JournalPage,
        merged: Option<&Merged>,
        source_bytes: &[u8],
    ) -> (Vec<u8>, usize, usize) {
        let log = LogicalLog::default();
        let input = RecordInput {
            txn_id: 9,
            nonce: 1,
            prev_checksum: 0,
            catalog_root: 2,
            page_count: 100,
            freed: &[],
            pages: std::slice::from_ref(page),
            logical: &log,
            buffer_flags: 0,
            merged: merged.map(|m| m as &dyn MergedValueSource),
        };
        let mut buf = PageRun::scratch(1);
        let enc = encode(&input, &mut buf, None, None);
        let mut rec = decode(&buf.bytes()[..enc.padded_len]).expect("decodes");
        let (no, image) = rec.images.pop().expect("one image");
        assert_eq!(no, page.no);
        let rebuilt = image
            .materialize(
                |_| Ok(source_bytes.to_vec()),
                |bkey, dest| {
                    let m = merged.expect("references only when values were merged");
                    let (_, v) =
                        m.0.values()
                            .find(|(b, _)| b.as_slice() == bkey)
                            .expect("a named value");
                    dest.copy_from_slice(v);
                    Ok(())
                },
            )
            .expect("materializes");
        (
            rebuilt.bytes().to_vec(),
            enc.referenced_value_bytes,
            enc.raw_body_len,
        )
    }

    #[test]
    fn patched_images_name_merged_values_and_rebuild_the_page() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let cells: Vec<(Vec<u8>, Vec<u8>)> = (0..6u8)
            .map(|i| {
                let len = [10, 63, 64, 300, 900, 1000][i as usize];
                (vec![b'k', i], (0..len).map(|_| rng.gen()).collect())
            })
            .collect();
        // Cells 1..5 were merged by the transaction, 0 and 2 not (and 1 is too
        // short to be named); the page was copied from one without cells 3 and 5.
        let merged = Merged(
            [1usize, 3, 4, 5]
                .iter()
                .map(|&i| {
                    let (k, v) = &cells[i];
                    let mut bkey = 7u64.to_be_bytes().to_vec();
                    bkey.extend_from_slice(k);
                    (k.clone(), (bkey, v.clone()))
                })
                .collect(),
        );
        let new = Arc::new(leaf_with(40, &cells));
        let old_cells: Vec<_> = [0usize, 1, 2, 4]
            .iter()
            .map(|&i| cells[i].clone())
            .collect();
        let old = leaf_with(40, &old_cells);
        let named: usize = [3usize, 4, 5].iter().map(|&i| cells[i].1.len()).sum();
        let no_source = JournalPage {
            no: 40,
            run: &new,
            source: None,
        };
        let copied = JournalPage {
            no: 40,
            run: &new,
            source: Some((33, old.bytes())),
        };
        for page in [&no_source, &copied] {
            let (plain, plain_refs, plain_len) = patched_round_trip(page, None, old.bytes());
            assert_eq!(plain, new.bytes());
            assert_eq!(plain_refs, 0);
            let (rebuilt, refs, len) = patched_round_trip(page, Some(&merged), old.bytes());
            assert_eq!(rebuilt, new.bytes(), "the page comes back byte for byte");
            assert!(page::verify(&rebuilt, 40, std::path::Path::new("<test>")).is_ok());
            assert_eq!(
                refs, named,
                "exactly the merged values of 256 bytes or more"
            );
            assert!(
                len + named - 3 * 40 <= plain_len,
                "the record carries the named values' keys, not their bytes: {len} vs {plain_len}"
            );
        }
        // A value that differs from what was merged is carried, not named.
        let mut stale = Merged(merged.0.clone());
        stale.0.get_mut(&cells[4].0).expect("merged").1[0] ^= 1;
        let (rebuilt, refs, _) = patched_round_trip(&no_source, Some(&stale), old.bytes());
        assert_eq!(rebuilt, new.bytes());
        assert_eq!(refs, named - cells[4].1.len());
    }

    #[test]
    fn a_reference_that_cannot_be_resolved_fails_the_rebuild() {
        let cells = vec![(b"key".to_vec(), vec![3u8; 500])];
        let new = Arc::new(leaf_with(12, &cells));
        let mut bkey = 1u64.to_be_bytes().to_vec();
        bkey.extend_from_slice(b"key");
        let merged = Merged(
            [(b"key".to_vec(), (bkey, vec![3u8; 500]))]
                .into_iter()
                .collect(),
        );
        let page = JournalPage {
            no: 12,
            run: &new,
            source: None,
        };
        let log = LogicalLog::default();
        let input = RecordInput {
            txn_id: 4,
            nonce: 1,
            prev_checksum: 0,
            catalog_root: 2,
            page_count: 100,
            freed: &[],
            pages: std::slice::from_ref(&page),
            logical: &log,
            buffer_flags: 0,
            merged: Some(&merged),
        };
        let mut buf = PageRun::scratch(1);
        let enc = encode(&input, &mut buf, None, None);
        assert_eq!(enc.referenced_value_bytes, 500);
        let mut rec = decode(&buf.bytes()[..enc.padded_len]).expect("decodes");
        let (_, image) = rec.images.pop().expect("one image");
        assert!(!image.is_self_contained());
        let err = image
            .materialize(
                |_| unreachable!("no source"),
                |_, _| Err(crate::Error::Misuse("not held")),
            )
            .err()
            .expect("fails");
        assert!(err.to_string().contains("not held"), "{err}");
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..2000 {
            let len = rng.gen_range(0..9000);
            let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if len >= RECORD_HEADER && rng.gen_bool(0.5) {
                write_u32(&mut b, 0, MAGIC);
                b[4] = VERSION;
            }
            let _ = decode(&b);
            if let Some(h) = parse_header(&b) {
                let _ = decode_body(&h, &b, None);
            }
        }
    }
}
