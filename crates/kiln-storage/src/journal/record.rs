//! One journal record per commit.
//!
//! ```text
//! header, 64 bytes, little endian
//!  0  u32 magic "KJR1"
//!  4  u8  version (1)
//!  5  u8  flags (0; reserved for compressed bodies)
//!  6  u16 reserved (0)
//!  8  u64 transaction id
//! 16  u64 nonce of the process that wrote it (new on every open)
//! 24  u32 checksum of the previous record (the chain)
//! 28  u32 crc32c of header (with this field zero) and body
//! 32  u32 body length in bytes
//! 36  u32 page image count
//! 40  u32 freed page count
//! 44  u32 reserved (0)
//! 48  u64 catalog root after the transaction
//! 56  u64 page count (high-water mark) after the transaction
//! body
//!     freed page numbers, u64 each
//!     page images: page u64 | run pages u32 | head len u32 | tail len u32 | head | tail
//!     (the bytes between head and tail are zero)
//! ```
//! The record is padded with zeros to a multiple of 4 KiB; the next record starts at
//! the next 4 KiB boundary. The chain (previous checksum, with the nonce inside the
//! checksummed bytes) means a stale record left in a recycled or rewritten region can
//! never pass as the continuation of the current history.

use crate::io::DIRECT_IO_ALIGN;
use crate::page::{self, read_u32, read_u64, write_u32, write_u64, PageNo, PageRun, PAGE_SIZE};
use std::sync::Arc;

pub const MAGIC: u32 = u32::from_le_bytes(*b"KJR1");
pub const VERSION: u8 = 1;
pub const RECORD_HEADER: usize = 64;
const IMAGE_HEADER: usize = 20;
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

/// What a commit hands to the journal.
pub struct RecordInput<'a> {
    pub txn_id: u64,
    pub nonce: u64,
    pub prev_checksum: u32,
    pub catalog_root: PageNo,
    pub page_count: u64,
    pub freed: &'a [PageNo],
    pub pages: &'a [(PageNo, Arc<PageRun>)],
}

fn image_parts(run: &PageRun) -> (&[u8], &[u8]) {
    let bytes = run.bytes();
    let (head, tail) = page::image_extent(bytes);
    (&bytes[..head], &bytes[tail..])
}

/// Encodes a record into `buf` (grown as needed, aligned); returns (padded length, checksum).
pub fn encode(input: &RecordInput, buf: &mut PageRun) -> (usize, u32) {
    let body_len = input.freed.len() * 8
        + input
            .pages
            .iter()
            .map(|(_, run)| {
                let (h, t) = image_parts(run);
                IMAGE_HEADER + h.len() + t.len()
            })
            .sum::<usize>();
    let total = padded(RECORD_HEADER + body_len);
    if buf.page_count() * PAGE_SIZE < total {
        *buf = PageRun::zeroed(total.div_ceil(PAGE_SIZE));
    }
    let b = buf.bytes_mut();
    b[..RECORD_HEADER].fill(0);
    write_u32(b, 0, MAGIC);
    b[4] = VERSION;
    write_u64(b, 8, input.txn_id);
    write_u64(b, 16, input.nonce);
    write_u32(b, 24, input.prev_checksum);
    write_u32(b, 32, body_len as u32);
    write_u32(b, 36, input.pages.len() as u32);
    write_u32(b, 40, input.freed.len() as u32);
    write_u64(b, 48, input.catalog_root);
    write_u64(b, 56, input.page_count);
    let mut at = RECORD_HEADER;
    for p in input.freed {
        write_u64(b, at, *p);
        at += 8;
    }
    for (no, run) in input.pages {
        let (h, t) = image_parts(run);
        write_u64(b, at, *no);
        write_u32(b, at + 8, run.page_count() as u32);
        write_u32(b, at + 12, h.len() as u32);
        write_u32(b, at + 16, t.len() as u32);
        at += IMAGE_HEADER;
        b[at..at + h.len()].copy_from_slice(h);
        at += h.len();
        b[at..at + t.len()].copy_from_slice(t);
        at += t.len();
    }
    debug_assert_eq!(at, RECORD_HEADER + body_len);
    b[at..total].fill(0);
    let sum = crc32c::crc32c(&b[..at]);
    write_u32(b, 28, sum);
    (total, sum)
}

/// Parses and sanity-checks a header block. `None` if it is not a record header.
pub fn parse_header(b: &[u8]) -> Option<RecordHeader> {
    if b.len() < RECORD_HEADER || read_u32(b, 0) != MAGIC || b[4] != VERSION {
        return None;
    }
    Some(RecordHeader {
        txn_id: read_u64(b, 8),
        nonce: read_u64(b, 16),
        prev_checksum: read_u32(b, 24),
        checksum: read_u32(b, 28),
        body_len: read_u32(b, 32),
        image_count: read_u32(b, 36),
        freed_count: read_u32(b, 40),
        catalog_root: read_u64(b, 48),
        page_count: read_u64(b, 56),
    })
}

/// True if the checksum over header and body matches. `record` holds at least
/// RECORD_HEADER + body_len bytes.
pub fn checksum_ok(h: &RecordHeader, record: &[u8]) -> bool {
    let len = RECORD_HEADER + h.body_len as usize;
    if record.len() < len {
        return false;
    }
    let mut head = [0u8; RECORD_HEADER];
    head.copy_from_slice(&record[..RECORD_HEADER]);
    write_u32(&mut head, 28, 0);
    let sum = crc32c::crc32c_append(crc32c::crc32c(&head), &record[RECORD_HEADER..len]);
    sum == h.checksum
}

pub struct DecodedRecord {
    pub header: RecordHeader,
    pub freed: Vec<PageNo>,
    pub images: Vec<(PageNo, PageRun)>,
}

/// Decodes a record whose checksum already passed. Arbitrary bytes give an error,
/// never a panic or an allocation larger than the body.
pub fn decode_body(h: &RecordHeader, record: &[u8]) -> Result<DecodedRecord, String> {
    let end = RECORD_HEADER
        .checked_add(h.body_len as usize)
        .filter(|e| *e <= record.len())
        .ok_or("body length beyond the record")?;
    let body = &record[RECORD_HEADER..end];
    let freed_bytes = (h.freed_count as usize).checked_mul(8).ok_or("freed count overflows")?;
    if freed_bytes > body.len() {
        return Err(format!("{} freed pages do not fit in the body", h.freed_count));
    }
    let freed = body[..freed_bytes].chunks_exact(8).map(|c| read_u64(c, 0)).collect();
    let mut at = freed_bytes;
    let mut images = Vec::new();
    for i in 0..h.image_count {
        if body.len() - at < IMAGE_HEADER {
            return Err(format!("page image {i} header runs past the body"));
        }
        let no = read_u64(body, at);
        let run_pages = read_u32(body, at + 8) as u64;
        let head = read_u32(body, at + 12) as usize;
        let tail = read_u32(body, at + 16) as usize;
        at += IMAGE_HEADER;
        if run_pages == 0 || run_pages > MAX_RUN_PAGES {
            return Err(format!("page image {i} (page {no}) has a run of {run_pages} pages"));
        }
        let run_bytes = run_pages as usize * PAGE_SIZE;
        let parts = head.checked_add(tail).ok_or("image length overflows")?;
        // The zero gap between head and tail is less than a page, so a record can
        // never make us allocate much more than its own size.
        if parts > run_bytes || run_bytes - parts >= PAGE_SIZE || parts > body.len() - at {
            return Err(format!(
                "page image {i} (page {no}): head {head} + tail {tail} inconsistent with a {run_pages}-page run"
            ));
        }
        if no < page::FIRST_DATA_PAGE || no.checked_add(run_pages).is_none_or(|e| e > h.page_count) {
            return Err(format!(
                "page image {i}: page {no} outside the data pages 2..{}",
                h.page_count
            ));
        }
        let mut run = PageRun::zeroed(run_pages as usize);
        let rb = run.bytes_mut();
        rb[..head].copy_from_slice(&body[at..at + head]);
        rb[run_bytes - tail..].copy_from_slice(&body[at + head..at + parts]);
        at += parts;
        images.push((no, run));
    }
    if at != body.len() {
        return Err(format!("{} unexplained bytes after the page images", body.len() - at));
    }
    Ok(DecodedRecord { header: *h, freed, images })
}

/// Parses and verifies a complete record from arbitrary bytes (the fuzzing entry point).
pub fn decode(record: &[u8]) -> Result<DecodedRecord, String> {
    let h = parse_header(record).ok_or("not a record header")?;
    if !checksum_ok(&h, record) {
        return Err("checksum mismatch or truncated".into());
    }
    decode_body(&h, record)
}
