//! A file sent as an HTTP body (an attachment's GET, a blob by hash), streamed by
//! blocking threads through small channels: at most `CHANNEL_CHUNKS` chunks in
//! flight per stage, whatever the file's size.
//!
//! Where a whole-body download's time went (W19, 1 GiB, cold cache; `perf` of the
//! server on the 2-core machine): 54% copying the file from the page cache
//! (`_copy_to_iter`: pages just read from the disk, and the page cache's own work
//! around them: a cold buffered read costs 0.6 s of system CPU per GiB here, a
//! cached one 0.15 s), 27% SHA-256, 2% zeroing a fresh 1 MiB buffer per chunk; the
//! socket's copy 4%. So:
//! - bytes the page cache does not hold are read with `O_DIRECT` (the disk writes
//!   them straight into the chunk: no page-cache copy, and a large download does
//!   not evict the database's hot pages); bytes it does hold are copied from it
//!   (`mincore` says which, per chunk), so a popular attachment is not read from
//!   the disk every time;
//! - chunks come from a pool of page-aligned buffers that return when the
//!   connection has written them (`Recycled`): no allocation or zeroing per chunk;
//! - reading and hashing are two threads, so the disk works while the chunk
//!   before is hashed.
//!
//! The integrity check is unchanged: a whole body's SHA-256 is computed over the
//! bytes sent, and the last chunk is held back until it equals the expected one.
//! On a mismatch the body ends with an error (the connection is cut, the client
//! sees a short body: the status was sent already) and the error is logged. A
//! range is sent unverified, from the page cache (buffered reads).

use axum::body::{Body, Bytes};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::sync::mpsc;

/// Chunks in flight between two stages.
const CHANNEL_CHUNKS: usize = 4;
/// The size of a chunk read from a file (a multiple of `ALIGN_BYTES`).
const READ_CHUNK_BYTES: usize = 2 << 20;
/// `O_DIRECT`'s alignment of buffers, offsets and lengths (the largest logical
/// block size in use).
const ALIGN_BYTES: usize = 4096;

type Chunk = std::io::Result<Bytes>;

/// A body of `len` bytes of `file` from `start`. With `verify` (the expected
/// SHA-256, lower-case hex; only for the whole file), the bytes are hashed as
/// they go and the last chunk is sent only if the hash matched.
pub(crate) fn send_file(file: File, start: u64, len: u64, verify: Option<String>) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(CHANNEL_CHUNKS);
    match verify {
        None => {
            tokio::task::spawn_blocking(move || {
                read_chunks(&file, None, start, len, |c| tx.blocking_send(c).is_ok());
            });
        }
        Some(want) => {
            let direct = reopen_direct(&file);
            let (htx, hrx) = mpsc::sync_channel::<Chunk>(CHANNEL_CHUNKS);
            tokio::task::spawn_blocking(move || {
                read_chunks(&file, direct.as_ref(), start, len, |c| htx.send(c).is_ok());
            });
            tokio::task::spawn_blocking(move || hash_and_forward(hrx, tx, &want));
        }
    }
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Body::from_stream(stream)
}

/// The same file opened again with `O_DIRECT` (through `/proc/self/fd`, which
/// reaches the open file even if it was unlinked since); `None` where the file
/// system refuses it (tmpfs): then every chunk is read through the page cache.
fn reopen_direct(file: &File) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

/// Reads `len` bytes from `start` in chunks, handing each to `send` (false: the
/// receiver is gone, stop); an error (a file shorter than `len` included) is
/// handed on as the last item. With `direct`, a chunk the page cache does not
/// hold whole is read with `O_DIRECT`.
fn read_chunks(
    file: &File,
    direct: Option<&File>,
    start: u64,
    len: u64,
    mut send: impl FnMut(Chunk) -> bool,
) {
    // Advice only: a larger read-ahead window for the buffered reads.
    // SAFETY: a valid descriptor for the call's duration; the call reads no memory.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL);
    }
    let (home, pool) = mpsc::channel::<AlignedBuf>();
    let end = start + len;
    let mut offset = start;
    // O_DIRECT needs aligned offsets: only a body from an aligned start uses it.
    let direct = direct.filter(|_| start.is_multiple_of(ALIGN_BYTES as u64));
    while offset < end {
        let want = (end - offset).min(READ_CHUNK_BYTES as u64) as usize;
        let mut buf = match pool.try_recv() {
            Ok(b) => b,
            Err(_) => match AlignedBuf::new(READ_CHUNK_BYTES) {
                Some(b) => b,
                None => {
                    send(Err(std::io::Error::other("out of memory for a chunk")));
                    return;
                }
            },
        };
        if let Err(e) = read_chunk(file, direct, &mut buf, offset, want) {
            send(Err(e));
            return;
        }
        offset += want as u64;
        let chunk = Recycled {
            buf: Some(buf),
            len: want,
            home: home.clone(),
        };
        if !send(Ok(Bytes::from_owner(chunk))) {
            return;
        }
    }
}

/// Fills `buf[..want]` with the bytes at `offset`: from the page cache if it
/// holds them all, else with `O_DIRECT` when given (the length rounded up to
/// the alignment: the file's end cuts the read short), else buffered.
fn read_chunk(
    file: &File,
    direct: Option<&File>,
    buf: &mut AlignedBuf,
    offset: u64,
    want: usize,
) -> std::io::Result<()> {
    let Some(direct) = direct else {
        return file.read_exact_at(&mut buf.as_mut()[..want], offset);
    };
    if resident(file, offset, want) {
        return file.read_exact_at(&mut buf.as_mut()[..want], offset);
    }
    let aligned = want.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
    let mut got = 0;
    while got < want {
        match direct.read_at(&mut buf.as_mut()[got..aligned], offset + got as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file ends at {} bytes, before its recorded size",
                        offset + got as u64
                    ),
                ))
            }
            // A short read that leaves `got` unaligned can only be the file's end.
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if got % ALIGN_BYTES != 0 && got < want {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "the file ends at {} bytes, before its recorded size",
                    offset + got as u64
                ),
            ));
        }
    }
    Ok(())
}

/// Whether the page cache holds every page of `len` bytes at `offset` (aligned):
/// asked of a mapping that is never read (`mincore`), so asking neither reads
/// the disk nor starts read-ahead (a `preadv2(RWF_NOWAIT)` probe starts it, and
/// the bytes were then read twice). Any failure says no.
fn resident(file: &File, offset: u64, len: usize) -> bool {
    let (Ok(off), true) = (libc::off_t::try_from(offset), len > 0) else {
        return false;
    };
    // SAFETY: a read-only shared mapping of the file, never dereferenced (so no
    // fault, no SIGBUS whatever the file's size), unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if map == libc::MAP_FAILED {
        return false;
    }
    let pages = len.div_ceil(ALIGN_BYTES);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a mapping of `len` bytes; `vec` has a byte per page.
    let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above, not used after.
    unsafe { libc::munmap(map, len) };
    rc == 0 && vec.iter().all(|v| v & 1 == 1)
}

/// Hashes the chunks from `from` and forwards them to `to`, one behind: the last
/// goes only once the whole hash equals `want`.
fn hash_and_forward(from: mpsc::Receiver<Chunk>, to: tokio::sync::mpsc::Sender<Chunk>, want: &str) {
    let mut hasher = Sha256::new();
    let mut held: Option<Bytes> = None;
    for item in from {
        match item {
            Ok(chunk) => {
                hasher.update(&chunk);
                if let Some(prev) = held.replace(chunk) {
                    if to.blocking_send(Ok(prev)).is_err() {
                        return; // The client went away.
                    }
                }
            }
            Err(e) => {
                let _ = to.blocking_send(Err(e));
                return;
            }
        }
    }
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got != want {
        tracing::error!(expected = %want, got = %got, "attachment: stored bytes do not match their hash; connection cut (run kiln check)");
        let e = std::io::Error::other("attachment bytes do not match their hash");
        let _ = to.blocking_send(Err(e));
        return;
    }
    if let Some(last) = held {
        let _ = to.blocking_send(Ok(last));
    }
}

/// A zeroed, `ALIGN_BYTES`-aligned buffer (what `O_DIRECT` reads into).
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is owned memory, reached only through `&self`/`&mut self`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> Option<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(len, ALIGN_BYTES).ok()
    }

    fn new(len: usize) -> Option<AlignedBuf> {
        let layout = Self::layout(len).filter(|l| l.size() > 0)?;
        // SAFETY: a layout of non-zero size.
        let ptr = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(AlignedBuf { ptr, len })
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialized (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: as `as_mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated by `new` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

/// A chunk's buffer, sent back to its reader's pool when the connection is done
/// with it (once the reader has finished, the buffer is freed).
struct Recycled {
    buf: Option<AlignedBuf>,
    len: usize,
    home: mpsc::Sender<AlignedBuf>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| &b.as_slice()[..self.len])
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let _ = self.home.send(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(file: File, direct: bool, start: u64, len: u64) -> std::io::Result<Vec<u8>> {
        let d = direct.then(|| reopen_direct(&file)).flatten();
        let mut out = Vec::new();
        let mut err = None;
        read_chunks(&file, d.as_ref(), start, len, |c| match c {
            Ok(b) => {
                out.extend_from_slice(&b);
                true
            }
            Err(e) => {
                err = Some(e);
                false
            }
        });
        err.map_or(Ok(out), Err)
    }

    /// Whole and partial reads, direct and buffered, cached or not, give the
    /// file's bytes; a file shorter than asked is an error, not a short body.
    #[test]
    fn chunks_read_every_byte_and_a_short_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let size = READ_CHUNK_BYTES * 2 + 12_345;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        // Written back, so that dropping the pages below makes them cold.
        File::open(&path).unwrap().sync_all().unwrap();
        for direct in [false, true] {
            for cold in [false, true] {
                let f = File::open(&path).unwrap();
                if cold {
                    // SAFETY: a valid descriptor; advice only.
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                }
                let got = collect(f, direct, 0, size as u64).unwrap();
                assert!(got == data, "direct {direct} cold {cold}");
            }
            // A range from an unaligned offset across chunk boundaries, ending
            // short of the file's end.
            let len = size - 4099 - 1_000;
            let f = File::open(&path).unwrap();
            let got = collect(f, direct, 4099, len as u64).unwrap();
            assert!(got == data[4099..4099 + len], "direct {direct}");
            let f = File::open(&path).unwrap();
            assert!(
                collect(f, direct, 0, size as u64 + 1).is_err(),
                "direct {direct}"
            );
        }
    }
}
