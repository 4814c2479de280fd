//! What the disk itself does: timed sequential writes into a preallocated file, in
//! any of the ways a journal can make them durable. `durable_writes` (O_DIRECT|O_DSYNC
//! into an already-written file) is the physical floor under a journal commit; it is
//! what `kiln bench` compares against, and `kiln disk-bench` reports all the modes.
//! Also the random reads of `kiln disk-bench`'s random-read rows: a file of
//! incompressible data ([`write_incompressible`]) read with O_DIRECT ([`open_for_reads`]).

use crate::stats;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The alignment O_DIRECT needs for buffers, offsets and lengths (enough for every
/// logical block size in use).
pub const ALIGN: usize = 4096;

#[repr(C, align(4096))]
#[derive(Clone)]
struct Block([u8; ALIGN]);

/// A 4096-aligned buffer of whole blocks, usable for O_DIRECT writes.
pub struct AlignedBuf {
    blocks: Vec<Block>,
    len: usize,
}

impl AlignedBuf {
    /// `len` bytes of incompressible filler (rounded up to whole blocks underneath), so
    /// a device or host that compresses or deduplicates cannot make writes look cheap.
    pub fn new(len: usize) -> AlignedBuf {
        let mut b = AlignedBuf {
            blocks: vec![Block([0; ALIGN]); len.div_ceil(ALIGN).max(1)],
            len,
        };
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for chunk in b.bytes_mut().chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        b
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: Block is repr(C) around bytes; the Vec is contiguous and holds at
        // least `len` bytes.
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// An I/O error together with what was being done and to which file.
#[derive(Debug)]
pub struct RawDiskError {
    pub op: &'static str,
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for RawDiskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl std::error::Error for RawDiskError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RawDiskError + 'a {
    move |source| RawDiskError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// How each write is made durable (or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// pwrite into the page cache, never synced while timed.
    Buffered,
    /// pwrite, then fsync after each write.
    BufferedFsync,
    /// pwrite, then fdatasync after each write.
    BufferedFdatasync,
    /// pwrite on an O_DSYNC descriptor.
    Dsync,
    /// pwrite on an O_DIRECT descriptor, never synced while timed.
    Direct,
    /// pwrite on an O_DIRECT|O_DSYNC descriptor: what a journal commit costs.
    DirectDsync,
}

impl WriteMode {
    pub const ALL: [WriteMode; 6] = [
        WriteMode::Buffered,
        WriteMode::BufferedFsync,
        WriteMode::BufferedFdatasync,
        WriteMode::Dsync,
        WriteMode::Direct,
        WriteMode::DirectDsync,
    ];

    pub fn label(self) -> &'static str {
        match self {
            WriteMode::Buffered => "buffered",
            WriteMode::BufferedFsync => "buffered+fsync",
            WriteMode::BufferedFdatasync => "buffered+fdatasync",
            WriteMode::Dsync => "O_DSYNC",
            WriteMode::Direct => "O_DIRECT",
            WriteMode::DirectDsync => "O_DIRECT|O_DSYNC",
        }
    }

    /// Whether each write is on stable storage when the timed call returns.
    pub fn durable(self) -> bool {
        !matches!(self, WriteMode::Buffered | WriteMode::Direct)
    }

    pub fn wants_direct(self) -> bool {
        matches!(self, WriteMode::Direct | WriteMode::DirectDsync)
    }

    fn open_flags(self) -> i32 {
        match self {
            WriteMode::Dsync => libc::O_DSYNC,
            WriteMode::Direct => libc::O_DIRECT,
            WriteMode::DirectDsync => libc::O_DIRECT | libc::O_DSYNC,
            _ => 0,
        }
    }

    /// What is measured instead when the file system refuses O_DIRECT.
    fn without_direct(self) -> WriteMode {
        match self {
            WriteMode::Direct => WriteMode::Buffered,
            WriteMode::DirectDsync => WriteMode::BufferedFdatasync,
            m => m,
        }
    }
}

/// How a file's blocks were prepared before the timed writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prealloc {
    /// fallocate, then every byte written with zeros and synced: the timed writes
    /// overwrite blocks that are already allocated and written (a recycled journal).
    ZeroFilled,
    /// fallocate only: the blocks are allocated but unwritten, so each durable write
    /// also has to record that they now hold data (a fresh journal file).
    Fallocated,
    /// The file system has no fallocate: a sparse file of the right length.
    Sparse,
}

impl Prealloc {
    pub fn label(self) -> &'static str {
        match self {
            Prealloc::ZeroFilled => "zero-filled",
            Prealloc::Fallocated => "fallocated",
            Prealloc::Sparse => "sparse",
        }
    }
}

/// Creates (or truncates) `path` with `len` bytes prepared as asked (`ZeroFilled` or
/// `Fallocated`), synced. `progress` is told the bytes zero-filled so far and returns
/// false to stop early (an error of kind `Interrupted`). Returns what was actually done.
pub fn preallocate(
    path: &Path,
    len: u64,
    want: Prealloc,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<Prealloc, RawDiskError> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .map_err(err("create", path))?;
    // SAFETY: a valid descriptor; fallocate only reads its arguments.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    let mut done = if rc == 0 {
        Prealloc::Fallocated
    } else {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                f.set_len(len).map_err(err("extend", path))?;
                Prealloc::Sparse
            }
            _ => return Err(err("fallocate", path)(e)),
        }
    };
    if want == Prealloc::ZeroFilled {
        let zeros = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < len {
            let n = zeros.len().min((len - off) as usize);
            f.write_all_at(&zeros[..n], off)
                .map_err(err("zero-fill", path))?;
            off += n as u64;
            if !progress(off) {
                return Err(err("zero-fill", path)(
                    std::io::ErrorKind::Interrupted.into(),
                ));
            }
        }
        done = Prealloc::ZeroFilled;
    }
    f.sync_all().map_err(err("fsync", path))?;
    Ok(done)
}

/// A descriptor opened for one write mode.
pub struct WriteFile {
    file: File,
    path: PathBuf,
    /// The mode measured: the one asked for, or its fallback when O_DIRECT is refused.
    pub mode: WriteMode,
    pub direct_io: bool,
    /// O_DIRECT was asked for and refused (EINVAL: tmpfs before Linux 6.6, some FUSE
    /// and network file systems); `mode` is the buffered stand-in.
    pub direct_io_refused: bool,
}

impl WriteFile {
    /// One write of `bytes` at `offset`, with the sync its mode adds after it.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<(), RawDiskError> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(err("write", &self.path))?;
        match self.mode {
            WriteMode::BufferedFsync => self.file.sync_all().map_err(err("fsync", &self.path)),
            WriteMode::BufferedFdatasync => {
                self.file.sync_data().map_err(err("fdatasync", &self.path))
            }
            _ => Ok(()),
        }
    }
}

/// Opens the existing file `path` for writes in `mode`, falling back to buffered
/// writes (with fdatasync when the mode is durable) if O_DIRECT is refused.
pub fn open_for_writes(path: &Path, mode: WriteMode) -> Result<WriteFile, RawDiskError> {
    let open = |m: WriteMode| {
        OpenOptions::new()
            .write(true)
            .custom_flags(m.open_flags())
            .open(path)
    };
    match open(mode) {
        Ok(file) => Ok(WriteFile {
            file,
            path: path.to_path_buf(),
            mode,
            direct_io: mode.wants_direct(),
            direct_io_refused: false,
        }),
        Err(e) if mode.wants_direct() && e.raw_os_error() == Some(libc::EINVAL) => {
            let m = mode.without_direct();
            Ok(WriteFile {
                file: open(m).map_err(err("open", path))?,
                path: path.to_path_buf(),
                mode: m,
                direct_io: false,
                direct_io_refused: true,
            })
        }
        Err(e) => Err(err("open", path)(e)),
    }
}

impl WriteFile {
    /// Makes everything written so far durable (untimed, between measurements).
    pub fn sync_all(&self) -> Result<(), RawDiskError> {
        self.file.sync_all().map_err(err("fsync", &self.path))
    }

    /// fdatasync: the data written so far, and what is needed to read it back.
    pub fn sync_data(&self) -> Result<(), RawDiskError> {
        self.file.sync_data().map_err(err("fdatasync", &self.path))
    }
}

/// Creates (or truncates) `path` and writes `len` bytes of incompressible data into
/// it in `chunk`-byte O_DIRECT writes (buffered ones if O_DIRECT is refused), then
/// fdatasync. Every 4 KiB block differs from every other and none is zeros, so a
/// thin-provisioned or deduplicating disk cannot answer reads of it without its media.
/// `len` and `chunk` are multiples of [`ALIGN`]. `progress` is told the bytes written
/// so far and returns false to stop early (an error of kind `Interrupted`). Returns
/// whether the writes bypassed the page cache.
pub fn write_incompressible(
    path: &Path,
    len: u64,
    chunk: usize,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<bool, RawDiskError> {
    preallocate(path, len, Prealloc::Fallocated, &mut |_| true)?;
    let wf = open_for_writes(path, WriteMode::Direct)?;
    let base = AlignedBuf::new(chunk);
    let mut buf = AlignedBuf::new(chunk);
    let mut off = 0;
    while off < len {
        let n = chunk.min((len - off) as usize);
        stamp_blocks(base.bytes(), &mut buf.bytes_mut()[..n], off);
        wf.write_at(&buf.bytes()[..n], off)?;
        off += n as u64;
        if !progress(off) {
            return Err(err("write", path)(std::io::ErrorKind::Interrupted.into()));
        }
    }
    wf.sync_data()?;
    Ok(wf.direct_io)
}

/// `base` copied into `out` with each 4 KiB block's first 8 bytes XORed with the
/// block's file offset: random bytes, different in every block of the file.
fn stamp_blocks(base: &[u8], out: &mut [u8], file_offset: u64) {
    out.copy_from_slice(&base[..out.len()]);
    for (i, block) in out.chunks_mut(ALIGN).enumerate() {
        let at = (file_offset + (i * ALIGN) as u64).to_le_bytes();
        for (b, s) in block.iter_mut().zip(at) {
            *b ^= s;
        }
    }
}

/// A descriptor for random reads: O_DIRECT, or buffered when O_DIRECT is refused.
pub struct ReadFile {
    file: File,
    path: PathBuf,
    pub direct_io: bool,
    /// O_DIRECT was refused (at open, or by the first read); reads go through the
    /// page cache, emptied of the file's pages (POSIX_FADV_DONTNEED) at open.
    pub direct_io_refused: bool,
}

impl ReadFile {
    /// Reads `buf.len()` bytes at `offset` (one pread, or more if it comes up short).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), RawDiskError> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(err("read", &self.path))
    }
}

/// Opens `path` for O_DIRECT reads, probed with one 4 KiB read at offset 0 (some
/// file systems accept the flag at open and refuse the reads). If O_DIRECT is
/// refused, opens it for buffered reads and drops its cached pages first, so that
/// what can be read from the disk is (except on a file system that keeps files in
/// memory, where the pages are the file).
pub fn open_for_reads(path: &Path) -> Result<ReadFile, RawDiskError> {
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    let refused = |e: &std::io::Error| e.raw_os_error() == Some(libc::EINVAL);
    match direct {
        Ok(file) => {
            let mut probe = AlignedBuf::new(ALIGN);
            match file.read_at(probe.bytes_mut(), 0) {
                Ok(_) => {
                    return Ok(ReadFile {
                        file,
                        path: path.to_path_buf(),
                        direct_io: true,
                        direct_io_refused: false,
                    })
                }
                Err(e) if !refused(&e) => return Err(err("read", path)(e)),
                Err(_) => {}
            }
        }
        Err(e) if !refused(&e) => return Err(err("open", path)(e)),
        Err(_) => {}
    }
    let file = File::open(path).map_err(err("open", path))?;
    drop_cached_pages(&file, path)?;
    Ok(ReadFile {
        file,
        path: path.to_path_buf(),
        direct_io: false,
        direct_io_refused: true,
    })
}

/// POSIX_FADV_DONTNEED over the whole file: its clean cached pages are dropped.
fn drop_cached_pages(file: &File, path: &Path) -> Result<(), RawDiskError> {
    // SAFETY: a valid descriptor; posix_fadvise only reads its arguments.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(err("posix_fadvise", path)(
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    Ok(())
}

/// The writes one stream made and how long each took.
pub struct WriteRun {
    pub writes: u64,
    pub seconds: f64,
    pub latencies_ms: Vec<f64>,
    /// Stopped by the time bound (or by `keep_going`) before `max_writes`.
    pub stopped_early: bool,
}

/// Times up to `max_writes` sequential writes of `buf` through `wf`, starting at
/// `region_start` and wrapping around within `region_len` bytes, stopping once
/// `max_time` has passed. `keep_going` is called after each write with the count so
/// far and returns false to stop.
pub fn timed_writes(
    wf: &WriteFile,
    buf: &mut AlignedBuf,
    region_start: u64,
    region_len: u64,
    max_writes: u64,
    max_time: Duration,
    keep_going: &mut dyn FnMut(u64) -> bool,
) -> Result<WriteRun, RawDiskError> {
    let size = buf.bytes().len() as u64;
    let slots = (region_len / size.max(1)).max(1);
    let mut lat = Vec::with_capacity(max_writes.min(1 << 20) as usize);
    let start = Instant::now();
    let mut writes = 0;
    let mut stopped_early = false;
    while writes < max_writes {
        // A different payload each time, as a log would write.
        let stamp = writes.to_le_bytes();
        let n = stamp.len().min(buf.bytes().len());
        buf.bytes_mut()[..n].copy_from_slice(&stamp[..n]);
        let off = region_start + (writes % slots) * size;
        let t = Instant::now();
        wf.write_at(buf.bytes(), off)?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        writes += 1;
        if writes < max_writes && (start.elapsed() >= max_time || !keep_going(writes)) {
            stopped_early = true;
            break;
        }
    }
    Ok(WriteRun {
        writes,
        seconds: start.elapsed().as_secs_f64(),
        latencies_ms: lat,
        stopped_early,
    })
}

/// Mean and percentiles (nearest rank) of latencies in ms.
#[derive(Clone, Copy, Debug, Default)]
pub struct LatencySummary {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

pub fn summarize(lat: &mut [f64]) -> LatencySummary {
    let mean_ms = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    lat.sort_by(f64::total_cmp);
    let q = |f: f64| stats::quantile(lat, f).unwrap_or(0.0);
    LatencySummary {
        mean_ms,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        max_ms: lat.last().copied().unwrap_or(0.0),
    }
}

/// Removes a file when dropped, whatever happened in between.
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub struct RawDiskResult {
    /// Total time / writes: comparable with a workload's ms per commit.
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// False when O_DIRECT was refused and pwrite+fdatasync was measured instead.
    pub direct_io: bool,
}

/// Times `writes` sequential durable `write_size`-byte writes into a file in `dir`
/// that was zero-filled first.
pub fn durable_writes(
    dir: &Path,
    write_size: usize,
    writes: usize,
) -> Result<RawDiskResult, RawDiskError> {
    let path = dir.join(format!("rawdisk-{}.kiln-tmp", std::process::id()));
    let _remove = RemoveOnDrop(path.clone());
    let file_len = (write_size * writes) as u64;
    preallocate(&path, file_len, Prealloc::ZeroFilled, &mut |_| true)?;
    let wf = open_for_writes(&path, WriteMode::DirectDsync)?;
    let mut buf = AlignedBuf::new(write_size);
    let mut run = timed_writes(
        &wf,
        &mut buf,
        0,
        file_len,
        writes as u64,
        Duration::MAX,
        &mut |_| true,
    )?;
    let direct_io = wf.direct_io;
    drop(wf);
    let s = summarize(&mut run.latencies_ms);
    Ok(RawDiskResult {
        mean_ms: s.mean_ms,
        p50_ms: s.p50_ms,
        p99_ms: s.p99_ms,
        direct_io,
    })
}
