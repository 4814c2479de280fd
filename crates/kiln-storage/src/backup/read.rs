//! Reading a container: every frame checked (its index, its checksums, its place;
//! a sealed backup's seals) as it streams by, items handed to a sink in order;
//! `verify` and `read_header`; `verify_sealed_structure`, what of a sealed backup
//! can be checked without its key.

use super::*;

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

/// Reads and checks a whole container, handing every item to `sink` in order.
/// With `stop_at_trailer` the reader stops right after the trailer (several
/// containers may follow each other in one stream); otherwise bytes after the
/// trailer are refused. `progress` gets this container's bytes read so far.
/// A sealed backup is refused: see `read_container_with_key`.
pub fn read_container<R: Read>(
    input: R,
    stop_at_trailer: bool,
    progress: impl FnMut(u64),
    sink: impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<BackupSummary> {
    read_container_with_key(input, None, stop_at_trailer, progress, sink)
}

/// `read_container`, opening a sealed backup with `encryption`, the master key its
/// key is wrapped by (a backup in clear reads with or without a key). A sealed
/// backup without a key is refused (`Error::Encryption`, naming the key's
/// fingerprint); with another key its key fails to unwrap (`Error::Encryption`,
/// naming both); a frame that passes its checksums but fails to open is corrupt,
/// named by frame and byte offset.
pub fn read_container_with_key<R: Read>(
    input: R,
    encryption: Option<&MasterKey>,
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
    let (mut sum, sealer) = read_container_header(&mut rd, encryption)?;
    sink(&sum, Item::Header)?;
    let mut index: u32 = 0;
    let mut in_tree: Option<u64> = None;
    let mut in_file: Option<OpenFile> = None;
    let mut payload = Vec::new();
    loop {
        let before_crc = rd.crc;
        let frame =
            read_frame(&mut rd, index, &mut payload, sealer.as_ref()).map_err(|e| match in_file
                .as_ref()
            {
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

/// A container's header, read and checked (magic, checksum, version, flags): what
/// needs no key. A sealed backup's meta is still sealed.
struct RawHeader {
    /// The fixed fields (magic to meta_len).
    fixed: [u8; HEADER_FIXED],
    meta: Vec<u8>,
    /// A sealed backup's backup id and wrapped key (empty in clear).
    extra: Vec<u8>,
    version: u32,
    txn_id: u64,
    sealed: bool,
}

/// Reads a container's header and checks what needs no key: its magic, its
/// checksum, its version and flags.
fn read_raw_header<R: Read, P: FnMut(u64)>(rd: &mut Reader<R, P>) -> BackupResult<RawHeader> {
    let hpart = || "the header".to_string();
    let mut fixed = [0u8; HEADER_FIXED];
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
    let sealed = flags & FLAG_SEALED != 0;
    let max_meta = if sealed {
        MAX_META + SEAL_BYTES
    } else {
        MAX_META
    };
    if meta_len > max_meta {
        return Err(corrupt(
            "the header",
            24,
            format!("metadata length {meta_len} exceeds {max_meta}"),
        ));
    }
    let mut meta = vec![0u8; meta_len];
    rd.exact(&mut meta, &hpart)?;
    let mut extra = vec![0u8; if sealed { SEALED_HEADER_EXTRA } else { 0 }];
    rd.exact(&mut extra, &hpart)?;
    let mut crc_b = [0u8; 4];
    let expect =
        crc32c::crc32c_append(crc32c::crc32c_append(crc32c::crc32c(&fixed), &meta), &extra);
    let at = rd.offset;
    rd.exact(&mut crc_b, &hpart)?;
    if u32::from_le_bytes(crc_b) != expect {
        return Err(corrupt("the header", at, "header checksum mismatch".into()));
    }
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(BackupError::UnsupportedVersion(version));
    }
    let known = if version >= SEALED_FORMAT_VERSION {
        FLAG_LZ4 | FLAG_SEALED
    } else {
        FLAG_LZ4
    };
    if flags & !known != 0 {
        return Err(corrupt(
            "the header",
            12,
            format!("unknown flags {flags:#x}"),
        ));
    }
    Ok(RawHeader {
        fixed,
        meta,
        extra,
        version,
        txn_id,
        sealed,
    })
}

/// Reads and checks the container's header (`read_raw_header`): the summary as of
/// it, its meta opened, and a sealed backup's key (unwrapped by `encryption`).
fn read_container_header<R: Read, P: FnMut(u64)>(
    rd: &mut Reader<R, P>,
    encryption: Option<&MasterKey>,
) -> BackupResult<(BackupSummary, Option<Sealer>)> {
    let RawHeader {
        fixed,
        mut meta,
        extra,
        version,
        txn_id,
        sealed,
    } = read_raw_header(rd)?;
    let mut sum = BackupSummary {
        format_version: version,
        txn_id,
        ..Default::default()
    };
    if !sealed {
        sum.meta = meta;
        return Ok((sum, None));
    }
    let (id, wrapped) = extra.split_at(BACKUP_ID_BYTES);
    let fingerprint = wrapped_fingerprint(wrapped);
    let Some(master) = encryption else {
        return Err(BackupError::Storage(Error::Encryption {
            path: PathBuf::from("the backup"),
            what: format!(
                "this backup is encrypted (sealed under master key {fingerprint}): give the \
                 master key (--encryption-key-file)"
            ),
        }));
    };
    let key = master.unwrap(wrapped, Path::new("the backup's header"))?;
    let mut backup_id = [0u8; BACKUP_ID_BYTES];
    backup_id.copy_from_slice(id);
    let sealer = Sealer {
        key,
        backup_id,
        txn_id,
    };
    let mut aad = fixed.to_vec();
    aad.extend_from_slice(&extra);
    if !sealer.open(&aad, &mut meta) {
        return Err(corrupt(
            "the header",
            HEADER_FIXED as u64,
            "the sealed metadata fails authentication (its checksum passes: it was \
             changed on purpose, or the header was put together from other backups)"
                .into(),
        ));
    }
    sum.meta = meta;
    sum.key_fingerprint = Some(fingerprint);
    Ok((sum, Some(sealer)))
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

/// Reads frame `index`'s header and its payload as stored (sealed, in a sealed
/// backup) into `payload`, and checks what needs no key: the header's checksum,
/// the index, the limits, the payload's checksum. Returns the header and the byte
/// offset it starts at.
fn read_stored_frame<R: Read, P: FnMut(u64)>(
    rd: &mut Reader<R, P>,
    index: u32,
    payload: &mut Vec<u8>,
    sealed: bool,
) -> BackupResult<([u8; FRAME_HEADER], u64)> {
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
    let fflags = h[1];
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
    let max_stored = match sealed {
        true => MAX_FRAME + SEAL_BYTES,
        false => MAX_FRAME,
    };
    if raw_len > MAX_FRAME || stored_len > max_stored || fflags > 1 || h[2] != 0 || h[3] != 0 {
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
    Ok((h, start))
}

/// Reads frame `index` into `payload` (reused between frames) and checks it; a
/// sealed backup's frame is opened under `sealer`.
fn read_frame<'a, R: Read, P: FnMut(u64)>(
    rd: &mut Reader<R, P>,
    index: u32,
    payload: &'a mut Vec<u8>,
    sealer: Option<&Sealer>,
) -> BackupResult<Frame<'a>> {
    let (h, start) = read_stored_frame(rd, index, payload, sealer.is_some())?;
    let part = format!("frame {index}");
    let (kind, fflags, raw_len) = (h[0], h[1], le32(&h, 8) as usize);
    if let Some(s) = sealer {
        if !s.open(&s.frame_aad(&h), payload) {
            return Err(corrupt(
                &part,
                start + FRAME_HEADER as u64,
                "the sealed payload fails authentication (its checksums pass: it was \
                 changed on purpose, moved from another place, or taken from another backup)"
                    .into(),
            ));
        }
    }
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
/// restoring it. A sealed backup is refused: see `verify_with_key`.
pub fn verify<R: Read>(input: R, progress: impl FnMut(u64)) -> BackupResult<BackupSummary> {
    verify_with_key(input, None, progress)
}

/// `verify`, opening a sealed backup with `encryption` (every seal checked too).
pub fn verify_with_key<R: Read>(
    input: R,
    encryption: Option<&MasterKey>,
    progress: impl FnMut(u64),
) -> BackupResult<BackupSummary> {
    read_container_with_key(input, encryption, false, progress, |_, _| Ok(()))
}

/// Reads only the header of a backup (its transaction id and metadata); checked
/// by its own checksum, the rest is not read. A sealed backup is refused: see
/// `read_header_with_key`.
pub fn read_header<R: Read>(input: R) -> BackupResult<BackupSummary> {
    read_header_with_key(input, None)
}

/// `read_header`, opening a sealed backup's metadata with `encryption`.
pub fn read_header_with_key<R: Read>(
    input: R,
    encryption: Option<&MasterKey>,
) -> BackupResult<BackupSummary> {
    let mut rd = Reader {
        inner: input,
        offset: 0,
        crc: 0,
        progress: |_| {},
    };
    read_container_header(&mut rd, encryption).map(|(sum, _)| sum)
}

/// How many of a backup's first bytes [`header_is_sealed`] looks at.
pub const HEADER_PEEK_BYTES: usize = HEADER_FIXED;

/// Whether the backup whose first bytes are `start` is sealed (version 3): a Kiln
/// backup's magic and the sealed flag. Nothing is checked (the header's checksum
/// covers more bytes): it tells a reader which way to read the backup, and that
/// reading checks it.
pub fn header_is_sealed(start: &[u8]) -> bool {
    start.get(..8) == Some(&MAGIC[..]) && start.len() >= 16 && le32(start, 12) & FLAG_SEALED != 0
}

/// What a check of a sealed backup without its key saw
/// ([`verify_sealed_structure`]): what its header and frame headers say in clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedStructure {
    pub format_version: u32,
    /// The transaction the image is consistent at.
    pub txn_id: u64,
    /// The fingerprint of the master key the backup's own key is wrapped by.
    pub key_fingerprint: String,
    /// The backup's random id (32 hex digits; not the manifest's backup id).
    pub backup_id: String,
    /// Frames, the trailer included.
    pub frames: u32,
    /// Trees and extra files (a frame's kind is in clear in its header).
    pub trees: u64,
    pub files: u64,
    /// Size of the backup file.
    pub file_bytes: u64,
}

/// What the frames read so far of a sealed backup have opened.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opened {
    Nothing,
    Tree,
    File,
}

/// Checks a sealed backup without its key: the header (its checksum, version and
/// flags), the wrapped key's own checksum, every frame's checksums over its sealed
/// bytes (every byte of the file is under a CRC-32C: damage is found), the frames'
/// order (their indexes), their kinds in turn (each tree and extra file opened and
/// closed), the lengths a kind or a seal fixes, and the trailer last with nothing
/// after it. Without the key nothing sealed is read: not the seals (bytes changed
/// on purpose, their checksums recomputed, pass), the metadata, the entries, the
/// extra files' bytes, nor the trailer's counts and whole-file checksum; with the
/// key, `verify_with_key` checks all of it. A backup in clear is refused: `verify`
/// checks all of it without a key.
pub fn verify_sealed_structure<R: Read>(
    input: R,
    mut progress: impl FnMut(u64),
) -> BackupResult<SealedStructure> {
    let mut rd = Reader {
        inner: input,
        offset: 0,
        crc: 0,
        progress: &mut progress,
    };
    let header = read_raw_header(&mut rd)?;
    check_sealed_header(&header)?;
    let (id, wrapped) = header.extra.split_at(BACKUP_ID_BYTES);
    let wrapped_at = (HEADER_FIXED + header.meta.len() + BACKUP_ID_BYTES) as u64;
    check_wrapped_key_structure(wrapped, wrapped_at)?;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut s = SealedStructure {
        format_version: header.version,
        txn_id: header.txn_id,
        key_fingerprint: wrapped_fingerprint(wrapped),
        backup_id: hex(id),
        frames: 0,
        trees: 0,
        files: 0,
        file_bytes: 0,
    };
    let mut payload = Vec::new();
    let mut opened = Opened::Nothing;
    loop {
        let (h, start) = read_stored_frame(&mut rd, s.frames, &mut payload, true)?;
        let part = format!("frame {}", s.frames);
        s.frames += 1;
        check_sealed_frame_lengths(&h, &part, start)?;
        opened = match (opened, h[0]) {
            (Opened::Nothing, KIND_TREE) => {
                s.trees += 1;
                Opened::Tree
            }
            (Opened::Nothing, KIND_FILE) => {
                s.files += 1;
                Opened::File
            }
            (Opened::Nothing, KIND_TRAILER) => {
                refuse_bytes_after_trailer(&mut rd)?;
                s.file_bytes = rd.offset;
                return Ok(s);
            }
            (Opened::Tree, KIND_DATA) | (Opened::File, KIND_FILE_DATA) => opened,
            (Opened::Tree, KIND_END) | (Opened::File, KIND_FILE_END) => Opened::Nothing,
            (_, k) => {
                return Err(corrupt(
                    &part,
                    start,
                    format!("frame of kind {k} out of place"),
                ))
            }
        };
    }
}

/// A sealed backup's header, as far as it can be checked without the key: sealed
/// at all, and its metadata at least as long as its seal.
fn check_sealed_header(header: &RawHeader) -> BackupResult<()> {
    if !header.sealed {
        return Err(BackupError::Storage(Error::Encryption {
            path: PathBuf::from("the backup"),
            what: format!(
                "this backup is not encrypted (format version {}): `verify` checks all of it \
                 without a key",
                header.version
            ),
        }));
    }
    if header.meta.len() < SEAL_BYTES {
        return Err(corrupt(
            "the header",
            24,
            format!(
                "sealed metadata of {} bytes, shorter than its seal ({SEAL_BYTES} bytes)",
                header.meta.len()
            ),
        ));
    }
    Ok(())
}

/// A wrapped key's magic and its own checksum (the layout of `crypt.rs`: magic
/// "KILNKEY1" at 0, crc32c of bytes 0..96 at 96), which need no key.
fn check_wrapped_key_structure(wrapped: &[u8], offset: u64) -> BackupResult<()> {
    let what = if wrapped.len() != WRAPPED_KEY_BYTES {
        format!("a wrapped key of {} bytes", wrapped.len())
    } else if wrapped.get(..8) != Some(&b"KILNKEY1"[..]) {
        "the wrapped key has a bad magic".to_string()
    } else if crc32c::crc32c(wrapped.get(..96).unwrap_or_default()) != le32(wrapped, 96) {
        "the wrapped key's checksum does not match".to_string()
    } else {
        return Ok(());
    };
    Err(corrupt("the header", offset, what))
}

/// The lengths a sealed frame's header must agree with: its stored length is its
/// payload's (compressed, if so) and a seal; an end, file end or trailer frame and
/// the start of an extra file have the lengths their kinds give.
fn check_sealed_frame_lengths(h: &[u8; FRAME_HEADER], part: &str, start: u64) -> BackupResult<()> {
    let (kind, lz4) = (h[0], h[1] & 1 != 0);
    let (raw_len, stored_len) = (le32(h, 8) as usize, le32(h, 12) as usize);
    let sealed_ok = match lz4 {
        true => stored_len >= SEAL_BYTES,
        false => stored_len == raw_len + SEAL_BYTES,
    };
    if !sealed_ok {
        return Err(corrupt(
            part,
            start,
            format!(
                "stored length {stored_len} does not fit a sealed payload of {raw_len} bytes{}",
                if lz4 { " compressed" } else { "" }
            ),
        ));
    }
    let kind_ok = match kind {
        KIND_END => raw_len == 8,
        KIND_FILE_END => raw_len == 12,
        KIND_TRAILER => raw_len == 48,
        KIND_FILE => raw_len >= 8,
        _ => true,
    };
    if !kind_ok {
        return Err(corrupt(
            part,
            start,
            format!("a frame of kind {kind} with a payload of {raw_len} bytes"),
        ));
    }
    Ok(())
}
