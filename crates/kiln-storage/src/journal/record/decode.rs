//! Decoding a journal record's body back into freed pages, page images and
//! write-buffer entries, refusing what the format does not allow.

use super::*;

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
pub(crate) fn decode_body(
    h: &RecordHeader,
    record: &[u8],
    cipher: Option<&Cipher>,
) -> Result<DecodedRecord, DecodeError> {
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
    let opened;
    let stored = match (h.flags & FLAG_SEALED != 0, cipher) {
        (false, None) => stored,
        (false, Some(_)) => return Err(DecodeError::NotSealed),
        (true, None) => return Err(DecodeError::SealedWithoutKey),
        (true, Some(cipher)) => {
            opened = open_body(record, stored, cipher)?;
            &opened[..]
        }
    };
    if h.flags & FLAG_LZ4 == 0 {
        if h.raw_body_len as usize != stored.len() {
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

/// Decrypts a sealed body (ciphertext, nonce, tag) into a copy; the header with its
/// checksum field zero is the associated data, as `encode::seal_body` sealed it.
fn open_body(record: &[u8], stored: &[u8], cipher: &Cipher) -> Result<Vec<u8>, DecodeError> {
    let Some(text_len) = stored.len().checked_sub(SEAL_TRAILER) else {
        return Err(DecodeError::SealTruncated {
            body_len: stored.len(),
        });
    };
    let (text, trailer) = stored.split_at(text_len);
    let (nonce, tag) = trailer.split_at(NONCE_BYTES);
    let mut seal = Sealed {
        nonce: [0; NONCE_BYTES],
        tag: [0; TAG_BYTES],
    };
    seal.nonce.copy_from_slice(nonce);
    seal.tag.copy_from_slice(tag);
    let mut head = [0u8; RECORD_HEADER];
    head.copy_from_slice(record.get(..RECORD_HEADER).ok_or(DecodeError::NotARecord)?);
    write_u32(&mut head, 28, 0);
    let mut body = text.to_vec();
    if !cipher.open_in_place(&head, &mut body, &seal) {
        return Err(DecodeError::Unauthentic);
    }
    Ok(body)
}

pub(super) fn decode_parts(h: &RecordHeader, body: &[u8]) -> Result<DecodedRecord, DecodeError> {
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
    decode_with(record, None)
}

/// `decode` of a record of an environment whose records are sealed under `cipher`.
pub(crate) fn decode_with(
    record: &[u8],
    cipher: Option<&Cipher>,
) -> Result<DecodedRecord, DecodeError> {
    let h = parse_header(record).ok_or(DecodeError::NotARecord)?;
    if !checksum_ok(&h, record) {
        return Err(DecodeError::Checksum);
    }
    decode_body(&h, record, cipher)
}
