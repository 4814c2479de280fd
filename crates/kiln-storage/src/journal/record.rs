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
use crate::io::DIRECT_IO_ALIGN;
use crate::page::{
    self, read_u16, read_u32, read_u64, write_u16, write_u32, write_u64, PageNo, PageRun, PAGE_SIZE,
};
use std::sync::Arc;

pub const MAGIC: u32 = u32::from_le_bytes(*b"KJR1");
pub const VERSION: u8 = 1;
pub const RECORD_HEADER: usize = 64;
const FLAG_LZ4: u8 = 1;
const FLAG_LOGICAL: u8 = 2;
pub const FLAG_FREEZE: u8 = 4;
pub const FLAG_MERGE_DONE: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_LZ4 | FLAG_LOGICAL | FLAG_FREEZE | FLAG_MERGE_DONE;
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

/// What a commit hands to the journal.
pub struct RecordInput<'a> {
    pub txn_id: u64,
    pub nonce: u64,
    pub prev_checksum: u32,
    pub catalog_root: PageNo,
    pub page_count: u64,
    pub freed: &'a [PageNo],
    pub pages: &'a [JournalPage<'a>],
    /// Write-buffer entries of the transaction, already in their journal form.
    pub logical: &'a LogicalLog,
    /// `FLAG_FREEZE` / `FLAG_MERGE_DONE`.
    pub buffer_flags: u8,
    /// Values this transaction merged, which leaf images may name instead of carry.
    pub merged: Option<&'a dyn MergedValueSource>,
}

/// A page of a commit, with the committed page it was copied from, if any.
pub struct JournalPage<'a> {
    pub no: PageNo,
    pub run: &'a Arc<PageRun>,
    pub source: Option<(PageNo, &'a [u8])>,
}

// Bounds: `head <= tail <= bytes.len()`, computed from the run itself just above.
#[allow(clippy::indexing_slicing)]
fn image_parts(run: &PageRun) -> (&[u8], &[u8]) {
    let bytes = run.bytes();
    if run.is_bare() {
        return (&bytes[..page::bare_image_len(bytes)], &[]);
    }
    let (head, tail) = page::image_extent(bytes);
    (&bytes[..head], &bytes[tail..])
}

/// Byte ranges where `new` differs from `old` (equal lengths), merged across small
/// gaps. Compares 8-byte words and narrows to bytes only inside differing words.
// Bounds: every word and byte index stays below `n = min(old.len(), new.len())`,
// computed at the top; this is the commit path, so no per-byte `get`.
#[allow(clippy::indexing_slicing)]
pub fn diff_runs(old: &[u8], new: &[u8]) -> Vec<(usize, usize)> {
    let n = old.len().min(new.len());
    let words = n / 8;
    let word =
        |b: &[u8], w: usize| u64::from_ne_bytes(b[w * 8..w * 8 + 8].try_into().expect("8 bytes"));
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut push = |start: usize, end: usize| match runs.last_mut() {
        Some((_, e)) if start - *e < DIFF_MERGE_GAP => *e = end,
        _ => runs.push((start, end)),
    };
    let mut w = 0;
    while w < words {
        // Most of a copied page is unchanged: skip equal 64-byte blocks with one
        // (vectorized) comparison each before looking at words.
        if w % 8 == 0 && w + 8 <= words && old[w * 8..w * 8 + 64] == new[w * 8..w * 8 + 64] {
            w += 8;
            continue;
        }
        if word(old, w) == word(new, w) {
            w += 1;
            continue;
        }
        let first = w;
        while w < words && word(old, w) != word(new, w) {
            w += 1;
        }
        // Narrow the ends to the exact differing bytes.
        let mut start = first * 8;
        while old[start] == new[start] {
            start += 1;
        }
        let mut end = w * 8;
        while old[end - 1] == new[end - 1] {
            end -= 1;
        }
        push(start, end);
    }
    for i in words * 8..n {
        if old[i] != new[i] {
            push(i, i + 1);
        }
    }
    runs
}

/// How one page is written into the record.
enum Form<'a> {
    Full {
        head: &'a [u8],
        tail: &'a [u8],
    },
    Diff {
        source: PageNo,
        runs: Vec<(usize, usize)>,
        bytes: &'a [u8],
    },
    /// Runs of `bytes` over the source page (0: over zeros), then merged values by
    /// buffer key: `(offset, len, buffer key)`.
    Patched {
        source: PageNo,
        runs: Vec<(usize, usize)>,
        refs: Vec<(usize, usize, &'a [u8])>,
        bytes: &'a [u8],
    },
}

impl Form<'_> {
    fn encoded_len(&self) -> usize {
        IMAGE_HEADER
            + match self {
                Form::Full { head, tail } => FULL_HEADER + head.len() + tail.len(),
                Form::Diff { runs, .. } => DIFF_HEADER + runs_len(runs),
                Form::Patched { runs, refs, .. } => {
                    PATCHED_HEADER
                        + runs_len(runs)
                        + refs
                            .iter()
                            .map(|(_, _, k)| REF_HEADER + k.len())
                            .sum::<usize>()
                }
            }
    }

    /// Value bytes the image names rather than carries.
    fn referenced_bytes(&self) -> usize {
        match self {
            Form::Patched { refs, .. } => refs.iter().map(|(_, len, _)| len).sum(),
            _ => 0,
        }
    }
}

fn runs_len(runs: &[(usize, usize)]) -> usize {
    runs.iter().map(|(s, e)| RUN_HEADER + e - s).sum()
}

/// The values of a leaf page this transaction merged: `(offset, len, buffer key)` in
/// page order.
fn merged_values_in<'a>(
    page_bytes: &[u8],
    merged: &'a dyn MergedValueSource,
) -> Vec<(usize, usize, &'a [u8])> {
    let mut refs = Vec::new();
    for i in 0..page::hdr::count(page_bytes) {
        if let page::LeafValue::Inline(v) = page::leaf_value(page_bytes, i) {
            if v.len() < MIN_REFERENCED_VALUE {
                continue;
            }
            if let Some(bkey) = merged.merged_as(page::cell_key(page_bytes, i), v) {
                let offset = v.as_ptr() as usize - page_bytes.as_ptr() as usize;
                refs.push((offset, v.len(), bkey));
            }
        }
    }
    refs.sort_unstable_by_key(|r| r.0);
    refs
}

/// `runs` (sorted, disjoint) without the byte ranges of `holes` (sorted, disjoint).
pub fn cut_runs(runs: &[(usize, usize)], holes: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(runs.len() + holes.len());
    let mut first_hole = 0;
    for &(start, end) in runs {
        while holes.get(first_hole).is_some_and(|h| h.1 <= start) {
            first_hole += 1;
        }
        let mut at = start;
        for &(hole_start, hole_end) in holes.get(first_hole..).unwrap_or_default() {
            if hole_start >= end || at >= end {
                break;
            }
            if hole_start > at {
                out.push((at, hole_start));
            }
            at = at.max(hole_end);
        }
        if at < end {
            out.push((at, end));
        }
    }
    out
}

fn choose_form<'a>(p: &'a JournalPage<'a>, merged: Option<&'a dyn MergedValueSource>) -> Form<'a> {
    let (head, tail) = image_parts(p.run);
    let full = Form::Full { head, tail };
    let new = p.run.bytes();
    let single_node = !p.run.is_bare() && new.len() == PAGE_SIZE;
    // (source page, where this page differs from it)
    let diff = p
        .source
        .filter(|(_, old)| single_node && old.len() == PAGE_SIZE)
        .map(|(source, old)| (source, diff_runs(old, new)));
    let mut refs = match merged {
        Some(m) if single_node && page::hdr::kind(new) == page::KIND_LEAF => {
            merged_values_in(new, m)
        }
        _ => Vec::new(),
    };
    if let Some((_, runs)) = &diff {
        // A value the page holds unchanged from its source is left to the source:
        // naming it would cost its key and make the image depend on the write buffer.
        refs.retain(|&(at, len, _)| runs.iter().any(|&(s, e)| s < at + len && at < e));
    }
    let patched = (!refs.is_empty()).then(|| {
        let holes: Vec<(usize, usize)> = refs.iter().map(|&(at, len, _)| (at, at + len)).collect();
        let (source, runs) = match &diff {
            Some((source, runs)) => (*source, cut_runs(runs, &holes)),
            None => {
                let tail_start = PAGE_SIZE - tail.len();
                let parts: Vec<(usize, usize)> = [(0, head.len()), (tail_start, PAGE_SIZE)]
                    .into_iter()
                    .filter(|(s, e)| s < e)
                    .collect();
                (0, cut_runs(&parts, &holes))
            }
        };
        Form::Patched {
            source,
            runs,
            refs,
            bytes: new,
        }
    });
    let diff = diff.map(|(source, runs)| Form::Diff {
        source,
        runs,
        bytes: new,
    });
    [diff, patched].into_iter().flatten().fold(full, |best, f| {
        if f.encoded_len() < best.encoded_len() {
            f
        } else {
            best
        }
    })
}

pub struct Encoded {
    /// What the body would have been with full page images (no diffs).
    pub full_image_body_len: usize,
    /// Merged value bytes the record names instead of carrying (patched images).
    pub referenced_value_bytes: usize,
    pub padded_len: usize,
    pub checksum: u32,
    pub raw_body_len: usize,
    pub stored_body_len: usize,
}

/// The largest transaction a record can hold (its body length is a u32).
pub const MAX_RECORD_BODY: usize = u32::MAX as usize - (64 << 20);

/// Encodes a record into `buf` (grown as needed, aligned). With a compression
/// scratch buffer, the body is LZ4-compressed when that makes it smaller; the
/// buffer is reused from record to record (a fresh output allocation per record
/// cost more than the compression itself: new memory is zeroed by the kernel).
// Bounds: the record buffer is sized above for the header, every image, the freed list and the buffer entries, so every offset written lies below it; the hot path of a commit.
#[allow(clippy::indexing_slicing)]
pub(crate) fn encode(
    input: &RecordInput,
    buf: &mut PageRun,
    compress: Option<(&mut Compressor, &JournalWriteCost)>,
) -> Encoded {
    let forms: Vec<Form> = input
        .pages
        .iter()
        .map(|p| choose_form(p, input.merged))
        .collect();
    let logical_bytes = input.logical.encoded_len();
    let body_len =
        input.freed.len() * 8 + forms.iter().map(Form::encoded_len).sum::<usize>() + logical_bytes;
    let total = padded(RECORD_HEADER + body_len);
    if buf.page_count() * PAGE_SIZE < total {
        // Every byte up to `total` is written below (header, body, zero padding).
        *buf = PageRun::scratch(total.div_ceil(PAGE_SIZE));
    }
    let b = buf.bytes_mut();
    write_header(b, input, body_len, logical_bytes > 0);
    let mut at = RECORD_HEADER;
    for p in input.freed {
        write_u64(b, at, *p);
        at += 8;
    }
    for (p, form) in input.pages.iter().zip(&forms) {
        write_image(b, &mut at, p, form);
    }
    if logical_bytes > 0 {
        write_u32(b, at, input.logical.count());
        at += 4;
        put(b, &mut at, input.logical.bytes());
    }
    debug_assert_eq!(at, RECORD_HEADER + body_len);
    let stored = match compress {
        Some((compressor, disk)) => compress_body(b, body_len, compressor, disk),
        None => body_len,
    };
    let end = RECORD_HEADER + stored;
    let total = padded(end);
    b[end..total].fill(0);
    let sum = crc32c::crc32c(&b[..end]);
    write_u32(b, 28, sum);
    Encoded {
        full_image_body_len: full_image_body_len(input, logical_bytes),
        referenced_value_bytes: forms.iter().map(Form::referenced_bytes).sum(),
        padded_len: total,
        checksum: sum,
        raw_body_len: body_len,
        stored_body_len: stored,
    }
}

/// The record header, but for its checksum (written last, over the stored body).
// Bounds: `b` holds at least the header (see `encode`).
#[allow(clippy::indexing_slicing)]
#[inline]
fn write_header(b: &mut [u8], input: &RecordInput, body_len: usize, logical: bool) {
    b[..RECORD_HEADER].fill(0);
    write_u32(b, 0, MAGIC);
    b[4] = VERSION;
    debug_assert_eq!(input.buffer_flags & !(FLAG_FREEZE | FLAG_MERGE_DONE), 0);
    b[5] = input.buffer_flags | if logical { FLAG_LOGICAL } else { 0 };
    write_u64(b, 8, input.txn_id);
    write_u64(b, 16, input.nonce);
    write_u32(b, 24, input.prev_checksum);
    write_u32(b, 32, body_len as u32);
    write_u32(b, 36, input.pages.len() as u32);
    write_u32(b, 40, input.freed.len() as u32);
    write_u32(b, 44, body_len as u32);
    write_u64(b, 48, input.catalog_root);
    write_u64(b, 56, input.page_count);
}

/// Copies `bytes` to `*at` and moves past them.
// Bounds: as `encode`'s.
#[allow(clippy::indexing_slicing)]
#[inline]
fn put(b: &mut [u8], at: &mut usize, bytes: &[u8]) {
    b[*at..*at + bytes.len()].copy_from_slice(bytes);
    *at += bytes.len();
}

/// One page image in the form chosen for it: full, a diff against the page's
/// last journaled image, or a diff that names merged values instead of carrying
/// them.
#[inline]
fn write_image(b: &mut [u8], at: &mut usize, p: &JournalPage, form: &Form) {
    write_u64(b, *at, p.no);
    write_u32(b, *at + 8, p.run.page_count() as u32);
    match form {
        Form::Full { head, tail } => {
            let kind = if p.run.is_bare() {
                FORM_BARE
            } else {
                FORM_FULL
            };
            write_u32(b, *at + 12, kind);
            write_u32(b, *at + 16, head.len() as u32);
            write_u32(b, *at + 20, tail.len() as u32);
            *at += IMAGE_HEADER + FULL_HEADER;
            put(b, at, head);
            put(b, at, tail);
        }
        Form::Diff {
            source,
            runs,
            bytes,
        } => {
            write_u32(b, *at + 12, FORM_DIFF);
            write_u64(b, *at + 16, *source);
            write_u32(b, *at + 24, runs.len() as u32);
            *at += IMAGE_HEADER + DIFF_HEADER;
            write_runs(b, at, runs, bytes);
        }
        Form::Patched {
            source,
            runs,
            refs,
            bytes,
        } => {
            write_u32(b, *at + 12, FORM_PATCHED);
            write_u64(b, *at + 16, *source);
            write_u32(b, *at + 24, runs.len() as u32);
            write_u32(b, *at + 28, refs.len() as u32);
            *at += IMAGE_HEADER + PATCHED_HEADER;
            write_runs(b, at, runs, bytes);
            for (offset, len, bkey) in refs {
                write_u16(b, *at, *offset as u16);
                write_u16(b, *at + 2, *len as u16);
                write_u16(b, *at + 4, bkey.len() as u16);
                *at += REF_HEADER;
                put(b, at, bkey);
            }
        }
    }
}

/// LZ4-compresses the body in place when the saving is worth storing; the
/// stored body length.
// Bounds: the packed body is shorter than the raw one, which `b` holds.
#[allow(clippy::indexing_slicing)]
fn compress_body(
    b: &mut [u8],
    body_len: usize,
    compressor: &mut Compressor,
    disk: &JournalWriteCost,
) -> usize {
    if !(MIN_COMPRESS_BODY..=MAX_RAW_BODY).contains(&body_len) {
        return body_len;
    }
    let body = RECORD_HEADER..RECORD_HEADER + body_len;
    // (Only a saving worth storing comes back: `worth_storing_packed`.)
    match compress_if_worth_it(&b[body], compressor, disk) {
        Some(packed_len) => {
            b[RECORD_HEADER..RECORD_HEADER + packed_len]
                .copy_from_slice(&compressor.output()[..packed_len]);
            b[5] |= FLAG_LZ4;
            write_u32(b, 32, packed_len as u32);
            packed_len
        }
        None => body_len,
    }
}

/// What the body would have been with full page images (no diffs): the figure
/// the diffs' saving is measured against.
fn full_image_body_len(input: &RecordInput, logical_bytes: usize) -> usize {
    input.freed.len() * 8
        + logical_bytes
        + input
            .pages
            .iter()
            .map(|p| {
                let (head, tail) = image_parts(p.run);
                Form::Full { head, tail }.encoded_len()
            })
            .sum::<usize>()
}

/// Writes `runs` of `bytes` at `*at`: `offset u16 | len u16 | bytes` each.
// Bounds: as `encode`'s, whose buffer is sized for every run; runs lie inside the page.
#[allow(clippy::indexing_slicing)]
fn write_runs(b: &mut [u8], at: &mut usize, runs: &[(usize, usize)], bytes: &[u8]) {
    for &(s, e) in runs {
        write_u16(b, *at, s as u16);
        write_u16(b, *at + 2, (e - s) as u16);
        *at += RUN_HEADER;
        b[*at..*at + e - s].copy_from_slice(&bytes[s..e]);
        *at += e - s;
    }
}

/// Compresses `body` into the compressor's scratch and returns the compressed
/// length, unless it does not pay (see `compress.rs`): compressing random bytes (a
/// typical value) costs time and saves nothing, and on a fast disk even a 16 %
/// saving costs more CPU than it saves disk time. Four 1 KiB windows spread over the
/// body are sampled, not just its start: a record's page images come first and
/// compress well even when the buffered values after them (most of the bytes) do
/// not. A body no larger than 4 KiB is compressed whole at once.
// Bounds: sample windows start at `w * stride` with `stride = (len - WINDOW) / (WINDOWS - 1)`, so each window ends within the body.
#[allow(clippy::indexing_slicing)]
fn compress_if_worth_it(
    body: &[u8],
    compressor: &mut Compressor,
    disk: &JournalWriteCost,
) -> Option<usize> {
    const WINDOW: usize = 1024;
    const WINDOWS: usize = 4;
    if compressor.skips_this_record() {
        return None;
    }
    let packed = if body.len() <= WINDOW * WINDOWS {
        compressor
            .compress(body)
            .filter(|&packed| packed < body.len() * 9 / 10)
    } else if compressor.hopeless(disk) {
        return None;
    } else {
        let stride = (body.len() - WINDOW) / (WINDOWS - 1);
        let windows = (0..WINDOWS).map(|w| &body[w * stride..w * stride + WINDOW]);
        match compressor.judge(windows, disk) {
            Verdict::Store => None,
            Verdict::Compress => compressor.compress(body),
        }
    };
    let packed = packed.filter(|&p| worth_storing_packed(p, body.len()));
    compressor.note_outcome(packed.is_some());
    packed
}

/// Whether a body compressed to `packed` bytes is stored so: it must save at least a
/// quarter of a direct-I/O block, or the record is written as it is.
fn worth_storing_packed(packed: usize, body: usize) -> bool {
    packed + DIRECT_IO_ALIGN / 4 < body
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

/// A page as the journal holds it.
pub enum Image {
    Full(PageRun),
    /// The source page's bytes with `runs` written over them.
    Diff {
        source: PageNo,
        runs: Vec<(usize, Vec<u8>)>,
    },
    /// Runs over the source page (or zeros), then merged values named by buffer key:
    /// `(offset, len, buffer key)`.
    Patched {
        source: Option<PageNo>,
        runs: Vec<(usize, Vec<u8>)>,
        refs: Vec<(usize, usize, Vec<u8>)>,
    },
}

impl Image {
    pub fn page_count(&self) -> usize {
        match self {
            Image::Full(run) => run.page_count(),
            Image::Diff { .. } | Image::Patched { .. } => 1,
        }
    }

    /// Whether the image is the page's bytes as they stand (else it is rebuilt from
    /// a source page or buffered values, and can be verified only then).
    pub fn is_self_contained(&self) -> bool {
        matches!(self, Image::Full(_))
    }

    /// Rebuilds the page; `source` is called for the source page of a diff or a
    /// patched image, `value` to fill a referenced value's bytes from its buffer key.
    // Bounds: runs and refs were checked to lie inside one page when decoded, and the source is a whole page.
    #[allow(clippy::indexing_slicing)]
    pub fn materialize(
        self,
        source: impl FnOnce(PageNo) -> crate::Result<Vec<u8>>,
        mut value: impl FnMut(&[u8], &mut [u8]) -> crate::Result<()>,
    ) -> crate::Result<PageRun> {
        let patch = |run: &mut PageRun, runs: Vec<(usize, Vec<u8>)>| {
            let b = run.bytes_mut();
            for (off, bytes) in runs {
                b[off..off + bytes.len()].copy_from_slice(&bytes);
            }
        };
        match self {
            Image::Full(run) => Ok(run),
            Image::Diff { source: s, runs } => {
                let mut run = PageRun::from_bytes(&source(s)?);
                patch(&mut run, runs);
                Ok(run)
            }
            Image::Patched {
                source: s,
                runs,
                refs,
            } => {
                let mut run = match s {
                    Some(s) => PageRun::from_bytes(&source(s)?),
                    None => PageRun::zeroed(1),
                };
                patch(&mut run, runs);
                let b = run.bytes_mut();
                for (off, len, bkey) in refs {
                    value(&bkey, &mut b[off..off + len])?;
                }
                Ok(run)
            }
        }
    }
}

pub struct DecodedRecord {
    pub header: RecordHeader,
    pub freed: Vec<PageNo>,
    pub images: Vec<(PageNo, Image)>,
    pub logical: Vec<logical::LogicalEntry>,
}

/// Decodes a record whose checksum already passed. Arbitrary bytes give an error,
/// never a panic or an allocation much larger than the body (or its stated raw size,
/// which is bounded).
pub fn decode_body(h: &RecordHeader, record: &[u8]) -> Result<DecodedRecord, DecodeError> {
    let stored = RECORD_HEADER
        .checked_add(h.body_len as usize)
        .and_then(|end| record.get(RECORD_HEADER..end))
        .ok_or(DecodeError::BodyPastRecord {
            body_len: h.body_len,
            record_len: record.len(),
        })?;
    if h.flags & !KNOWN_FLAGS != 0 {
        return Err(DecodeError::UnknownFlags { flags: h.flags });
    }
    if h.flags & FLAG_LZ4 == 0 {
        if h.raw_body_len != h.body_len {
            return Err(DecodeError::RawLengthMismatch {
                body_len: h.body_len,
                raw_len: h.raw_body_len,
            });
        }
        return decode_parts(h, stored);
    }
    let raw_len = h.raw_body_len as usize;
    // LZ4 expands at most ~255x; anything claiming more is damage.
    if raw_len > MAX_RAW_BODY || raw_len > stored.len().saturating_mul(255) {
        return Err(DecodeError::RawLengthImplausible {
            stored: stored.len(),
            raw_len,
        });
    }
    let raw = lz4_flex::block::decompress(stored, raw_len)
        .map_err(|source| DecodeError::Lz4 { source })?;
    if raw.len() != raw_len {
        return Err(DecodeError::Lz4Length {
            got: raw.len(),
            expected: raw_len,
        });
    }
    decode_parts(h, &raw)
}

fn decode_parts(h: &RecordHeader, body: &[u8]) -> Result<DecodedRecord, DecodeError> {
    let mut at = 0;
    let freed = decode_freed(h, body, &mut at)?;
    let root = h.catalog_root;
    if root != 0 && !(page::FIRST_DATA_PAGE..h.page_count).contains(&root) {
        return Err(DecodeError::CatalogRootOutside {
            root,
            page_count: h.page_count,
        });
    }
    let mut images = Vec::new();
    for index in 0..h.image_count {
        images.push(decode_image(h, body, &mut at, index)?);
    }
    let logical = if h.flags & FLAG_LOGICAL != 0 {
        logical::decode_entries(body, &mut at)?
    } else {
        Vec::new()
    };
    if at != body.len() {
        return Err(DecodeError::TrailingBytes {
            at,
            count: body.len() - at,
        });
    }
    Ok(DecodedRecord {
        header: *h,
        freed,
        images,
        logical,
    })
}

/// The freed page list: each a data page inside the file the record describes.
fn decode_freed(h: &RecordHeader, body: &[u8], at: &mut usize) -> Result<Vec<PageNo>, DecodeError> {
    let freed_bytes =
        (h.freed_count as usize)
            .checked_mul(8)
            .ok_or(DecodeError::FreedCountOverflows {
                count: h.freed_count,
            })?;
    let freed: Vec<PageNo> = take(body, at, freed_bytes, "freed page list")?
        .chunks_exact(8)
        .map(|c| read_u64(c, 0))
        .collect();
    if let Some((i, &bad)) = freed
        .iter()
        .enumerate()
        .find(|(_, p)| **p < page::FIRST_DATA_PAGE || **p >= h.page_count)
    {
        return Err(DecodeError::FreedPageOutside {
            page: bad,
            at: i * 8,
            page_count: h.page_count,
        });
    }
    Ok(freed)
}

/// The `index`-th page image at `*at`: its run inside the data pages, its form.
fn decode_image(
    h: &RecordHeader,
    body: &[u8],
    at: &mut usize,
    index: u32,
) -> Result<(PageNo, Image), DecodeError> {
    let image_at = *at;
    let ih = take(body, at, IMAGE_HEADER, "page image header")?;
    let (no, run_pages, form) = (read_u64(ih, 0), read_u32(ih, 8) as u64, read_u32(ih, 12));
    let bad = |problem| DecodeError::Image {
        index,
        page: no,
        at: image_at,
        problem,
    };
    if run_pages == 0 || run_pages > MAX_RUN_PAGES {
        return Err(bad(ImageProblem::RunLength { run_pages }));
    }
    if no < page::FIRST_DATA_PAGE || no.checked_add(run_pages).is_none_or(|e| e > h.page_count) {
        return Err(bad(ImageProblem::OutsideDataPages {
            run_pages,
            page_count: h.page_count,
        }));
    }
    let image = match form {
        FORM_FULL => decode_full(body, at, run_pages).map(Image::Full),
        FORM_BARE => decode_full(body, at, run_pages).map(|r| Image::Full(r.into_bare())),
        FORM_DIFF if run_pages == 1 => decode_diff(body, at, h.page_count),
        FORM_PATCHED if run_pages == 1 => decode_patched(body, at, h.page_count),
        form => Err(Problem::Image(ImageProblem::UnknownForm {
            form,
            run_pages,
        })),
    };
    match image {
        Ok(image) => Ok((no, image)),
        Err(Problem::Image(problem)) => Err(bad(problem)),
        Err(Problem::Decode(e)) => Err(e),
    }
}

/// What went wrong decoding one page image: about the image (the caller names it),
/// or the body running short.
enum Problem {
    Image(ImageProblem),
    Decode(DecodeError),
}

impl From<DecodeError> for Problem {
    fn from(e: DecodeError) -> Self {
        Problem::Decode(e)
    }
}

impl From<ImageProblem> for Problem {
    fn from(p: ImageProblem) -> Self {
        Problem::Image(p)
    }
}

// Bounds: `head + tail <= run_bytes` and `bytes.len() == head + tail` are checked just above.
#[allow(clippy::indexing_slicing)]
fn decode_full(body: &[u8], at: &mut usize, run_pages: u64) -> Result<PageRun, Problem> {
    let fh = take(body, at, FULL_HEADER, "full image header")?;
    let (head, tail) = (read_u32(fh, 0) as usize, read_u32(fh, 4) as usize);
    let run_bytes = run_pages as usize * PAGE_SIZE;
    let inconsistent = ImageProblem::HeadAndTail {
        head,
        tail,
        run_pages,
    };
    let parts = head.checked_add(tail).ok_or(inconsistent)?;
    // The zero gap between head and tail is less than a page, so a record can never
    // make us allocate much more than its own size.
    if parts > run_bytes || run_bytes - parts >= PAGE_SIZE {
        return Err(inconsistent.into());
    }
    let bytes = take(body, at, parts, "page image bytes")?;
    let (head_bytes, tail_bytes) = bytes.split_at(head);
    Ok(PageRun::from_head_tail(
        run_pages as usize,
        head_bytes,
        tail_bytes,
    ))
}

fn decode_diff(body: &[u8], at: &mut usize, page_count: u64) -> Result<Image, Problem> {
    let dh = take(body, at, DIFF_HEADER, "diff header")?;
    let (source, count) = (read_u64(dh, 0), read_u32(dh, 8) as usize);
    if source < page::FIRST_DATA_PAGE || source >= page_count {
        return Err(ImageProblem::DiffSource {
            from_page: source,
            page_count,
        }
        .into());
    }
    let runs = decode_runs(body, at, count)?;
    Ok(Image::Diff { source, runs })
}

fn decode_runs(
    body: &[u8],
    at: &mut usize,
    count: usize,
) -> Result<Vec<(usize, Vec<u8>)>, Problem> {
    let mut runs = Vec::with_capacity(count.min(PAGE_SIZE / RUN_HEADER));
    for run in 0..count {
        let rh = take(body, at, RUN_HEADER, "run header")?;
        let (offset, len) = (read_u16(rh, 0) as usize, read_u16(rh, 2) as usize);
        if offset + len > PAGE_SIZE {
            return Err(ImageProblem::RunOutsidePage { run, offset, len }.into());
        }
        runs.push((offset, take(body, at, len, "run bytes")?.to_vec()));
    }
    Ok(runs)
}

fn decode_patched(body: &[u8], at: &mut usize, page_count: u64) -> Result<Image, Problem> {
    let ph = take(body, at, PATCHED_HEADER, "patched image header")?;
    let (source, run_count, ref_count) = (
        read_u64(ph, 0),
        read_u32(ph, 8) as usize,
        read_u32(ph, 12) as usize,
    );
    let source = match source {
        0 => None,
        s if (page::FIRST_DATA_PAGE..page_count).contains(&s) => Some(s),
        s => {
            return Err(ImageProblem::PatchSource {
                from_page: s,
                page_count,
            }
            .into())
        }
    };
    let runs = decode_runs(body, at, run_count)?;
    let mut refs = Vec::with_capacity(ref_count.min(PAGE_SIZE / MIN_REFERENCED_VALUE));
    for reference in 0..ref_count {
        let rh = take(body, at, REF_HEADER, "value reference header")?;
        let (offset, len, key_len) = (
            read_u16(rh, 0) as usize,
            read_u16(rh, 2) as usize,
            read_u16(rh, 4) as usize,
        );
        if offset + len > PAGE_SIZE || len == 0 {
            return Err(ImageProblem::ReferenceOutsidePage {
                reference,
                offset,
                len,
            }
            .into());
        }
        if !(9..=MAX_REF_KEY).contains(&key_len) {
            return Err(ImageProblem::ReferenceKeyLength { reference, key_len }.into());
        }
        refs.push((
            offset,
            len,
            take(body, at, key_len, "value reference key")?.to_vec(),
        ));
    }
    Ok(Image::Patched { source, runs, refs })
}

/// Parses and verifies a complete record from arbitrary bytes (the fuzzing entry point).
pub fn decode(record: &[u8]) -> Result<DecodedRecord, DecodeError> {
    let h = parse_header(record).ok_or(DecodeError::NotARecord)?;
    if !checksum_ok(&h, record) {
        return Err(DecodeError::Checksum);
    }
    decode_body(&h, record)
}

#[cfg(test)]
mod tests {
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
        let enc = encode(&input, &mut buf, Some((&mut c, &disk)));
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
        let enc = encode(&input, &mut buf, None);
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
            let enc = encode(&input, &mut buf, None);
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
        let enc = encode(&input, &mut buf, None);
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
        let enc = encode(&input, &mut buf, None);
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
                let _ = decode_body(&h, &b);
            }
        }
    }
}
