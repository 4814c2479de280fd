//! Encoding a commit into a journal record (the format is in `record/mod.rs`):
//! each page image in its smallest form, the body compressed when it pays.

use super::*;

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
    cipher: Option<&Cipher>,
) -> Encoded {
    let forms: Vec<Form> = input
        .pages
        .iter()
        .map(|p| choose_form(p, input.merged))
        .collect();
    let logical_bytes = input.logical.encoded_len();
    let body_len =
        input.freed.len() * 8 + forms.iter().map(Form::encoded_len).sum::<usize>() + logical_bytes;
    let seal_len = if cipher.is_some() { SEAL_TRAILER } else { 0 };
    let total = padded(RECORD_HEADER + body_len + seal_len);
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
    let stored = match cipher {
        Some(cipher) => seal_body(b, stored, cipher),
        None => stored,
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

/// Encrypts the stored body (after compression, which finds nothing to shrink in
/// ciphertext) and appends its nonce and tag; the header, with the flag set and
/// the sealed length but no checksum yet, is the associated data, so no header
/// field can be changed without the body failing to open. Returns the new
/// stored length.
// Bounds: `b` was sized in `encode` for the header, the body and the trailer.
#[allow(clippy::indexing_slicing)]
fn seal_body(b: &mut [u8], stored: usize, cipher: &Cipher) -> usize {
    b[5] |= FLAG_SEALED;
    let sealed_len = stored + SEAL_TRAILER;
    write_u32(b, 32, sealed_len as u32);
    debug_assert_eq!(read_u32(b, 28), 0, "the checksum is written after sealing");
    let (head, rest) = b.split_at_mut(RECORD_HEADER);
    let seal = cipher.seal_in_place(head, &mut rest[..stored]);
    rest[stored..stored + NONCE_BYTES].copy_from_slice(&seal.nonce);
    rest[stored + NONCE_BYTES..sealed_len].copy_from_slice(&seal.tag);
    sealed_len
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
