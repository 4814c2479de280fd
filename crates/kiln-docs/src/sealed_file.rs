//! Sealed files: how an encrypted database keeps files outside its environment
//! (attachment blobs, full-text index files) on disk.
//!
//! The database's environment gives each kind of file its key
//! (`Env::derived_key(purpose)`, derived from its own data key: the same at every
//! open, unchanged by a change of master key, different on every database and
//! every cluster node). A file holds a header, then the plaintext in fixed-size
//! chunks, each sealed on its own (XChaCha20-Poly1305), so a reader opens only the
//! chunks it reads (ranges, streaming, an index's postings) and no more than the
//! chunks it asked for are in memory as plaintext.
//!
//! ```text
//! header (40 bytes, integers little-endian)
//!  0  8  magic "KILNBLOB"
//!  8  4  version (1)
//! 12  4  chunk size: plaintext bytes of every chunk but the last
//! 16  8  plaintext length
//! 24 16  file id (random, drawn by the writer)
//! then chunk i (0..n) at 40 + i * (40 + chunk size):
//!  0 40  seal: nonce (24), tag (16)
//! 40  ..  ciphertext: chunk size bytes; the last chunk the rest (0..=chunk size)
//! ```
//!
//! There are `max(1, ceil(length / chunk size))` chunks: an empty file has one empty
//! chunk, and a length that is a multiple of the chunk size has no empty chunk after
//! its last full one. A chunk's associated data is [`chunk_aad`]: the header's
//! first 16 bytes, the file id, the chunk's index and whether it is the last; the
//! last chunk's also the plaintext length and the file's [`Binding`] (32 bytes that
//! say which file it must be: a blob's hash, a digest of an index file's name; the
//! writer may learn the length and the binding only at the end, when it seals its
//! last chunk). A reader opens the last chunk first ([`SealedFile::open`]): that
//! authenticates the header's length against the binding and ties the file id to
//! it, and with it every other chunk. So a changed byte, chunks reordered or moved
//! from another file, a truncated or extended file, a file renamed to another
//! binding, a plain file put in place, or a file of another database all fail to
//! open, naming the file and the chunk.

use crate::{DocError, Result};
use kiln_storage::crypt::SealingKey;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a sealed file must be: 32 bytes its last chunk is bound to.
pub(crate) type Binding = [u8; 32];
const MAGIC: &[u8; 8] = b"KILNBLOB";
const VERSION: u32 = 1;
pub(crate) const HEADER_BYTES: usize = 40;
const SEAL_BYTES: usize = SealingKey::SEAL_BYTES;
/// The largest chunk size a reader accepts from a header (a damaged header must not
/// make it allocate gigabytes).
const MAX_CHUNK_BYTES: u32 = 16 << 20;
/// Where the associated data says what it is about.
const AAD_DOMAIN: &[u8; 16] = b"kiln/blob-chunk1";
const AAD_BYTES: usize = 16 + 16 + 16 + 8 + 1 + 8 + 32;

/// Overwrites plaintext that is no longer needed.
pub(crate) fn wipe(buf: &mut [u8]) {
    buf.fill(0);
    std::hint::black_box(&*buf);
}

/// A blob file that is not what it should be: corruption, naming the file and where.
pub(crate) fn corrupt(
    path: &Path,
    location: impl Into<String>,
    what: impl Into<String>,
) -> DocError {
    DocError::Storage(kiln_storage::Error::Corrupted {
        path: path.to_path_buf(),
        location: location.into(),
        what: what.into(),
        source: None,
    })
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DocError + '_ {
    move |source| DocError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The header's fields.
#[derive(Debug, Clone, Copy)]
struct Header {
    chunk_bytes: u32,
    len: u64,
    file_id: [u8; 16],
}

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        let (magic, rest) = b.split_at_mut(8);
        magic.copy_from_slice(MAGIC);
        let (version, rest) = rest.split_at_mut(4);
        version.copy_from_slice(&VERSION.to_le_bytes());
        let (chunk, rest) = rest.split_at_mut(4);
        chunk.copy_from_slice(&self.chunk_bytes.to_le_bytes());
        let (len, id) = rest.split_at_mut(8);
        len.copy_from_slice(&self.len.to_le_bytes());
        id.copy_from_slice(&self.file_id);
        b
    }

    fn decode(b: &[u8; HEADER_BYTES], path: &Path) -> Result<Header> {
        let (magic, rest) = b.split_at(8);
        let (version, rest) = rest.split_at(4);
        let (chunk, rest) = rest.split_at(4);
        let (len, id) = rest.split_at(8);
        if magic != MAGIC {
            return Err(corrupt(
                path,
                "header",
                "not a sealed file (bad magic): an encrypted database keeps only sealed files here",
            ));
        }
        let u32_of = |s: &[u8]| s.try_into().map(u32::from_le_bytes).unwrap_or(0);
        let version = u32_of(version);
        if version != VERSION {
            return Err(DocError::Storage(kiln_storage::Error::Incompatible {
                path: path.to_path_buf(),
                found: format!("sealed file format {version}"),
                expected: format!("sealed file format {VERSION}"),
            }));
        }
        let chunk_bytes = u32_of(chunk);
        if chunk_bytes == 0 || chunk_bytes > MAX_CHUNK_BYTES {
            return Err(corrupt(
                path,
                "header",
                format!("a chunk size of {chunk_bytes} bytes"),
            ));
        }
        let mut file_id = [0u8; 16];
        file_id.copy_from_slice(id);
        Ok(Header {
            chunk_bytes,
            len: len.try_into().map(u64::from_le_bytes).unwrap_or(0),
            file_id,
        })
    }

    /// How many chunks the blob has (at least one).
    fn chunks(&self) -> u64 {
        self.len.div_ceil(u64::from(self.chunk_bytes)).max(1)
    }

    /// The plaintext bytes of chunk `i`.
    fn chunk_len(&self, i: u64) -> usize {
        let start = i.saturating_mul(u64::from(self.chunk_bytes));
        (self.len.saturating_sub(start)).min(u64::from(self.chunk_bytes)) as usize
    }

    /// Where chunk `i` (its seal) starts in the file.
    fn chunk_offset(&self, i: u64) -> u64 {
        HEADER_BYTES as u64 + i * (SEAL_BYTES as u64 + u64::from(self.chunk_bytes))
    }

    /// The length of a whole file with this header; `None` if it cannot be.
    fn file_len(&self) -> Option<u64> {
        let seals = self.chunks().checked_mul(SEAL_BYTES as u64)?;
        (HEADER_BYTES as u64)
            .checked_add(seals)?
            .checked_add(self.len)
    }
}

/// The associated data of chunk `index`: what it is (the header's magic, version
/// and chunk size), which file it belongs to, where in it, and whether it is the
/// last; the last chunk's also binds the length and the file's binding.
fn chunk_aad(header: &Header, index: u64, last: Option<&Binding>) -> [u8; AAD_BYTES] {
    let encoded = header.encode();
    let (len, binding) = match last {
        Some(binding) => (header.len, *binding),
        None => (0, [0u8; 32]),
    };
    let (index, len, is_last) = (
        index.to_le_bytes(),
        len.to_le_bytes(),
        [u8::from(last.is_some())],
    );
    let parts: [&[u8]; 7] = [
        AAD_DOMAIN,
        encoded.get(..16).unwrap_or_default(),
        &header.file_id,
        &index,
        &is_last,
        &len,
        &binding,
    ];
    let mut aad = [0u8; AAD_BYTES];
    let mut w: &mut [u8] = &mut aad;
    for part in parts {
        // The parts add up to `AAD_BYTES` exactly: a write into the slice cannot fail.
        let _ = w.write_all(part);
    }
    aad
}

/// The sealing half of a sealed file's writer: plaintext gathered into chunks,
/// each sealed and written once the next byte shows it is not the last.
pub(crate) struct ChunkSealer {
    key: Arc<SealingKey>,
    header: Header,
    /// The chunk being gathered (plaintext until sealed).
    chunk: Vec<u8>,
    index: u64,
}

impl ChunkSealer {
    /// A sealer of chunks of `chunk_bytes` (at most 16 MiB), and the placeholder
    /// header to write first (the real one is written at `finish`, once the length
    /// is known).
    pub fn new(key: Arc<SealingKey>, chunk_bytes: usize) -> (ChunkSealer, [u8; HEADER_BYTES]) {
        let chunk_bytes = chunk_bytes.clamp(1, MAX_CHUNK_BYTES as usize);
        let header = Header {
            chunk_bytes: chunk_bytes as u32,
            len: 0,
            file_id: rand::random(),
        };
        let sealer = ChunkSealer {
            key,
            header,
            chunk: Vec::with_capacity(chunk_bytes),
            index: 0,
        };
        (sealer, [0u8; HEADER_BYTES])
    }

    /// Takes `bytes`, writing every chunk they fill (but the last full one: it may
    /// be the file's last) to `out`.
    pub fn write(&mut self, mut bytes: &[u8], out: &mut impl Write) -> std::io::Result<()> {
        let chunk_bytes = self.header.chunk_bytes as usize;
        while !bytes.is_empty() {
            if self.chunk.len() == chunk_bytes {
                self.seal_chunk(None, out)?;
            }
            let take = (chunk_bytes - self.chunk.len()).min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            self.chunk.extend_from_slice(now);
            bytes = rest;
        }
        Ok(())
    }

    /// Seals and writes the last chunk (bound to `len` and `binding`); returns the
    /// header to write at offset 0.
    pub fn finish(
        &mut self,
        len: u64,
        binding: &Binding,
        out: &mut impl Write,
    ) -> std::io::Result<[u8; HEADER_BYTES]> {
        self.header.len = len;
        self.seal_chunk(Some(binding), out)?;
        Ok(self.header.encode())
    }

    fn seal_chunk(&mut self, last: Option<&Binding>, out: &mut impl Write) -> std::io::Result<()> {
        let aad = chunk_aad(&self.header, self.index, last);
        let seal = self.key.seal_in_place(&aad, &mut self.chunk);
        self.index += 1;
        let written = out
            .write_all(&seal)
            .and_then(|()| out.write_all(&self.chunk));
        self.chunk.clear();
        written
    }
}

impl Drop for ChunkSealer {
    fn drop(&mut self) {
        // Plaintext of a file that did not finish, or capacity once used.
        let len = self.chunk.len();
        self.chunk.resize(self.chunk.capacity(), 0);
        wipe(&mut self.chunk);
        self.chunk.truncate(len);
    }
}

/// `data` sealed whole, as a file's bytes (for small files written at once).
pub(crate) fn seal_to_vec(
    key: Arc<SealingKey>,
    chunk_bytes: usize,
    data: &[u8],
    binding: &Binding,
) -> Vec<u8> {
    let (mut sealer, placeholder) = ChunkSealer::new(key, chunk_bytes);
    let mut out = placeholder.to_vec();
    // Writes into a Vec cannot fail.
    let _ = sealer.write(data, &mut out);
    if let Ok(header) = sealer.finish(data.len() as u64, binding, &mut out) {
        if let Some(h) = out.get_mut(..HEADER_BYTES) {
            h.copy_from_slice(&header);
        }
    }
    out
}

/// A sealed file open for reading, shared: each read opens the chunks it needs.
pub(crate) struct SealedFile {
    file: File,
    path: PathBuf,
    key: Arc<SealingKey>,
    binding: Binding,
    /// What the file is, for errors ("attachment blob <hash>").
    what: String,
    header: Header,
}

impl std::fmt::Debug for SealedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedFile")
            .field("path", &self.path)
            .field("len", &self.header.len)
            .finish_non_exhaustive()
    }
}

impl SealedFile {
    /// Opens the sealed file at `path` that must be `binding`: its header checked
    /// against the file's length, its last chunk opened (which authenticates both).
    pub fn open(
        path: &Path,
        key: Arc<SealingKey>,
        binding: Binding,
        what: String,
    ) -> Result<SealedFile> {
        let file = File::open(path).map_err(io_err(path))?;
        let file_len = file.metadata().map_err(io_err(path))?.len();
        if file_len < HEADER_BYTES as u64 {
            return Err(corrupt(
                path,
                "header",
                format!("{file_len} bytes: shorter than a sealed file's header ({HEADER_BYTES})"),
            ));
        }
        let mut raw = [0u8; HEADER_BYTES];
        file.read_exact_at(&mut raw, 0).map_err(io_err(path))?;
        let header = Header::decode(&raw, path)?;
        let want = header.file_len();
        if want != Some(file_len) {
            return Err(corrupt(
                path,
                "header",
                format!(
                    "the file has {file_len} bytes; a sealed file of {} bytes in chunks of {} has {} \
                     (truncated, extended or a damaged header)",
                    header.len,
                    header.chunk_bytes,
                    want.map_or_else(|| "more than a file can".to_string(), |n| n.to_string())
                ),
            ));
        }
        let sealed = SealedFile {
            file,
            path: path.to_path_buf(),
            key,
            binding,
            what,
            header,
        };
        let mut last = Vec::new();
        let opened = sealed.open_chunk(header.chunks() - 1, &mut last);
        wipe(&mut last);
        opened.map(|_| sealed)
    }

    /// The plaintext length.
    pub fn len(&self) -> u64 {
        self.header.len
    }

    /// Plaintext bytes per chunk (the last may have fewer).
    pub fn chunk_bytes(&self) -> u64 {
        u64::from(self.header.chunk_bytes)
    }

    /// Reads and opens chunk `i` into `buf` (seal, then plaintext); returns the
    /// plaintext's range in `buf`. On failure `buf` holds nothing readable.
    pub fn open_chunk(&self, i: u64, buf: &mut Vec<u8>) -> Result<std::ops::Range<usize>> {
        let chunks = self.header.chunks();
        if i >= chunks {
            return Err(corrupt(
                &self.path,
                format!("chunk {i}"),
                format!("past the last of its {chunks} chunks"),
            ));
        }
        let n = self.header.chunk_len(i);
        let last = i + 1 == chunks;
        let offset = self.header.chunk_offset(i);
        buf.resize(SEAL_BYTES + n, 0);
        self.file
            .read_exact_at(buf, offset)
            .map_err(io_err(&self.path))?;
        let (seal, body) = buf.split_at_mut(SEAL_BYTES);
        let seal: [u8; SEAL_BYTES] = (&*seal).try_into().unwrap_or([0; SEAL_BYTES]);
        let aad = chunk_aad(&self.header, i, last.then_some(&self.binding));
        if !self.key.open_in_place(&aad, body, &seal) {
            wipe(body);
            return Err(corrupt(
                &self.path,
                format!("chunk {i} of {chunks} at offset {offset}"),
                format!(
                    "{} does not authenticate: its bytes were changed, moved from elsewhere or \
                     sealed by another database's key",
                    self.what
                ),
            ));
        }
        Ok(SEAL_BYTES..SEAL_BYTES + n)
    }

    /// The plaintext in `range` (within the length), appended to `out`.
    pub fn read_range(&self, range: std::ops::Range<u64>, out: &mut Vec<u8>) -> Result<()> {
        let chunk = self.chunk_bytes();
        let end = range.end.min(self.header.len);
        let mut pos = range.start;
        let mut buf = Vec::new();
        let result = (|| {
            while pos < end {
                let i = pos / chunk;
                let plain = self.open_chunk(i, &mut buf)?;
                let from = plain.start + (pos - i * chunk) as usize;
                let to = plain.end.min(from + (end - pos) as usize);
                let part = buf.get(from..to).unwrap_or_default();
                if part.is_empty() {
                    break;
                }
                out.extend_from_slice(part);
                pos += part.len() as u64;
            }
            Ok(())
        })();
        wipe(&mut buf);
        result
    }
}

/// A sealed file read in order (an attachment download): the chunk at hand,
/// opened, and its plaintext (wiped when another is opened and when dropped).
pub(crate) struct Sealed {
    file: SealedFile,
    /// The chunk `buf` holds, opened; `None` before the first and after a failure.
    current: Option<u64>,
    /// Seal and ciphertext as read, then the plaintext (in `plain`).
    buf: Vec<u8>,
    plain: std::ops::Range<usize>,
}

impl Sealed {
    /// Opens the sealed file at `path` that must be `binding` (see [`SealedFile::open`]).
    pub fn open(
        path: &Path,
        key: Arc<SealingKey>,
        binding: Binding,
        what: String,
    ) -> Result<Sealed> {
        Ok(Sealed {
            file: SealedFile::open(path, key, binding, what)?,
            current: None,
            buf: Vec::new(),
            plain: 0..0,
        })
    }

    /// The plaintext length.
    pub fn len(&self) -> u64 {
        self.file.len()
    }

    /// Up to `out.len()` plaintext bytes at `pos` (0 at or past the end).
    pub fn read_at(&mut self, pos: u64, out: &mut [u8]) -> Result<usize> {
        if pos >= self.file.len() || out.is_empty() {
            return Ok(0);
        }
        let chunk = self.file.chunk_bytes();
        let i = pos / chunk;
        if self.current != Some(i) {
            self.current = None;
            self.plain = self.file.open_chunk(i, &mut self.buf)?;
            self.current = Some(i);
        }
        let from = self.plain.start + (pos - i * chunk) as usize;
        let avail = self.buf.get(from..self.plain.end).unwrap_or_default();
        let n = avail.len().min(out.len());
        if let (Some(dst), Some(src)) = (out.get_mut(..n), avail.get(..n)) {
            dst.copy_from_slice(src);
        }
        Ok(n)
    }
}

impl Drop for Sealed {
    fn drop(&mut self) {
        wipe(&mut self.buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    const CHUNK_BYTES: usize = 64 << 10;
    type Hash = Binding;

    fn open(path: &Path, key: Arc<SealingKey>, hash: Hash) -> Result<Sealed> {
        Sealed::open(path, key, hash, "attachment blob x".to_string())
    }

    /// Writes `data` as a sealed blob at `path` (in pieces of `piece` bytes).
    fn write_sealed(path: &Path, key: &Arc<SealingKey>, data: &[u8], piece: usize) -> Hash {
        let (mut sealer, placeholder) = ChunkSealer::new(key.clone(), CHUNK_BYTES);
        let mut out = placeholder.to_vec();
        for p in data.chunks(piece.max(1)) {
            sealer.write(p, &mut out).unwrap();
        }
        let hash: Hash = Sha256::digest(data).into();
        let header = sealer.finish(data.len() as u64, &hash, &mut out).unwrap();
        out[..HEADER_BYTES].copy_from_slice(&header);
        std::fs::write(path, &out).unwrap();
        hash
    }

    fn read_all(s: &mut Sealed) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 10_000];
        loop {
            let n = s.read_at(out.len() as u64, &mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn every_length_round_trips_and_the_file_has_the_documented_size() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(SealingKey::generate());
        for len in [
            0,
            1,
            CHUNK_BYTES - 1,
            CHUNK_BYTES,
            CHUNK_BYTES + 1,
            3 * CHUNK_BYTES,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 7) as u8).collect();
            let path = dir.path().join(format!("b{len}"));
            let hash = write_sealed(&path, &key, &data, 1000);
            let chunks = len.div_ceil(CHUNK_BYTES).max(1);
            let size = std::fs::metadata(&path).unwrap().len() as usize;
            assert_eq!(size, HEADER_BYTES + chunks * SEAL_BYTES + len, "len {len}");
            let mut s = open(&path, key.clone(), hash).unwrap();
            assert_eq!(s.len(), len as u64);
            assert!(read_all(&mut s).unwrap() == data, "len {len}");
        }
    }

    #[test]
    fn changed_moved_or_misnamed_chunks_do_not_open() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(SealingKey::generate());
        let data: Vec<u8> = (0..3 * CHUNK_BYTES + 5).map(|i| i as u8).collect();
        let path = dir.path().join("b");
        let hash = write_sealed(&path, &key, &data, 7777);
        let good = std::fs::read(&path).unwrap();
        let stride = SEAL_BYTES + CHUNK_BYTES;
        let read = |bytes: &[u8], hash: Hash, key: &Arc<SealingKey>| {
            std::fs::write(&path, bytes).unwrap();
            open(&path, key.clone(), hash).and_then(|mut s| read_all(&mut s))
        };
        // A flipped byte anywhere: header, seal, ciphertext of any chunk.
        for at in [
            0,
            20,
            30,
            HEADER_BYTES + 3,
            HEADER_BYTES + 100,
            HEADER_BYTES + stride + 50,
            good.len() - 1,
        ] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            assert!(read(&bad, hash, &key).is_err(), "byte {at}");
        }
        // Two chunks swapped.
        let mut swapped = good.clone();
        let (a, b) = (HEADER_BYTES, HEADER_BYTES + stride);
        let first = good[a..a + stride].to_vec();
        swapped.copy_within(b..b + stride, a);
        swapped[b..b + stride].copy_from_slice(&first);
        let e = read(&swapped, hash, &key).unwrap_err().to_string();
        assert!(e.contains("chunk 0 of 4"), "{e}");
        assert!(e.contains(&path.display().to_string()), "{e}");
        // Truncated to whole chunks, with the header's length made to fit.
        let mut cut = good[..HEADER_BYTES + 2 * stride].to_vec();
        cut[16..24].copy_from_slice(&(2 * CHUNK_BYTES as u64).to_le_bytes());
        assert!(read(&cut, hash, &key).is_err());
        // Another name, another key, a plain file.
        assert!(read(&good, [9; 32], &key).is_err());
        assert!(read(&good, hash, &Arc::new(SealingKey::generate())).is_err());
        assert!(read(&data, hash, &key).is_err());
        // And the original still reads.
        assert!(read(&good, hash, &key).unwrap() == data);
    }
}
