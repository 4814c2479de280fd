//! Why the bytes of a journal record do not decode (`record::decode`,
//! `record::decode_body`): what was wrong, and where. Recovery wraps it into
//! `Error::Corrupted` with the journal file and the record's offset in it, keeping it
//! as the error's source.

use crate::page::PageNo;

/// Why a journal record does not decode. `at` is a byte offset in the record's body
/// (after decompression, if the body is compressed): where the item found wrong
/// starts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("not a record header")]
    NotARecord,

    #[error("checksum mismatch or truncated")]
    Checksum,

    #[error("body of {body_len} bytes runs past the record of {record_len} bytes")]
    BodyPastRecord { body_len: u32, record_len: usize },

    #[error("unknown record flags {flags:#x}")]
    UnknownFlags { flags: u8 },

    #[error("the record is encrypted, and the environment was opened without a key")]
    SealedWithoutKey,

    #[error("the record is not encrypted, in an encrypted environment")]
    NotSealed,

    #[error("sealed body of {body_len} bytes is shorter than its nonce and tag")]
    SealTruncated { body_len: usize },

    #[error("the encrypted body fails authentication (changed, or sealed under another key)")]
    Unauthentic,

    #[error("uncompressed body of {body_len} bytes claims a raw length of {raw_len}")]
    RawLengthMismatch { body_len: u32, raw_len: u32 },

    /// More than the decoder allows, or more than LZ4 can expand the body to.
    #[error("compressed body of {stored} bytes claims a raw length of {raw_len}")]
    RawLengthImplausible { stored: usize, raw_len: usize },

    #[error("LZ4 body does not decompress: {source}")]
    Lz4 {
        #[source]
        source: lz4_flex::block::DecompressError,
    },

    #[error("LZ4 body decompressed to {got} bytes, header says {expected}")]
    Lz4Length { got: usize, expected: usize },

    /// An item (`what`: "page image header", "run bytes"...) that the body is too
    /// short to hold.
    #[error("{what} of {len} bytes at byte {at} runs past the body of {body_len} bytes")]
    Truncated {
        what: &'static str,
        at: usize,
        len: usize,
        body_len: usize,
    },

    #[error("freed page count {count} overflows")]
    FreedCountOverflows { count: u32 },

    #[error("freed page {page} (at byte {at}) outside the data pages 2..{page_count}")]
    FreedPageOutside {
        page: PageNo,
        at: usize,
        page_count: u64,
    },

    #[error("catalog root {root} outside the data pages 2..{page_count}")]
    CatalogRootOutside { root: PageNo, page_count: u64 },

    /// Page image number `index` (of the page `page`), whose header is at `at`.
    #[error("page image {index} (page {page}) at byte {at}: {problem}")]
    Image {
        index: u32,
        page: PageNo,
        at: usize,
        problem: ImageProblem,
    },

    /// Write-buffer entry number `index`, whose header is at `at`.
    #[error("buffer entry {index} at byte {at}: {problem}")]
    Entry {
        index: usize,
        at: usize,
        problem: EntryProblem,
    },

    #[error("{count} unexplained bytes at byte {at}, after the page images")]
    TrailingBytes { at: usize, count: usize },
}

/// What is wrong with a page image (`DecodeError::Image`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageProblem {
    #[error("a run of {run_pages} pages")]
    RunLength { run_pages: u64 },

    #[error("its {run_pages}-page run is outside the data pages 2..{page_count}")]
    OutsideDataPages { run_pages: u64, page_count: u64 },

    #[error("unknown form {form} for a {run_pages}-page run")]
    UnknownForm { form: u32, run_pages: u64 },

    #[error("head {head} + tail {tail} inconsistent with a {run_pages}-page run")]
    HeadAndTail {
        head: usize,
        tail: usize,
        run_pages: u64,
    },

    #[error("diff source {from_page} outside 2..{page_count}")]
    DiffSource { from_page: PageNo, page_count: u64 },

    #[error("patch source {from_page} outside 2..{page_count}")]
    PatchSource { from_page: PageNo, page_count: u64 },

    #[error("run {run} at {offset}+{len} outside the page")]
    RunOutsidePage {
        run: usize,
        offset: usize,
        len: usize,
    },

    #[error("value reference {reference} at {offset}+{len} outside the page")]
    ReferenceOutsidePage {
        reference: usize,
        offset: usize,
        len: usize,
    },

    #[error("value reference {reference} has a buffer key of {key_len} bytes")]
    ReferenceKeyLength { reference: usize, key_len: usize },
}

/// What is wrong with a write-buffer entry (`DecodeError::Entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntryProblem {
    #[error("key of {len} bytes")]
    KeyLength { len: usize },

    #[error("kind {kind} with {value_len} value bytes")]
    Kind { kind: u8, value_len: usize },
}

/// Reads `n` bytes at `*at` from `body` (`what` they are, for the error).
pub(super) fn take<'b>(
    body: &'b [u8],
    at: &mut usize,
    n: usize,
    what: &'static str,
) -> Result<&'b [u8], DecodeError> {
    let s = at
        .checked_add(n)
        .and_then(|end| body.get(*at..end))
        .ok_or(DecodeError::Truncated {
            what,
            at: *at,
            len: n,
            body_len: body.len(),
        })?;
    *at += n;
    Ok(s)
}
