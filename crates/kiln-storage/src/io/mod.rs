//! The one I/O seam of the engine. Every file operation goes through [`Vfs`] and
//! [`VfsFile`], so that tests can substitute a storage that loses unsynced writes,
//! tears writes or fails on command.
//!
//! Errors here are plain `std::io::Error`; the caller adds the path and offset.

mod forward;
mod os;

pub use forward::{ForwardFile, ForwardVfs};
pub use os::OsVfs;

use std::io;
use std::path::{Path, PathBuf};

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenMode {
    pub create: bool,
    pub write: bool,
    /// O_DIRECT: bypass the page cache. Buffers, offsets and lengths must then be
    /// aligned to [`DIRECT_IO_ALIGN`].
    pub direct: bool,
    /// O_DSYNC: a write returns only when its data is durable.
    pub dsync: bool,
}

/// Alignment used for every O_DIRECT buffer, offset and length. 4 KiB covers both
/// 512-byte and 4 KiB logical sectors.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// A read-only view of a file's bytes, usually a memory map.
pub trait MappedRegion: Send + Sync {
    fn bytes(&self) -> &[u8];
    /// Starts reading `[offset, offset+len)` of the region in the background
    /// (madvise WILLNEED): a scan's next pages. Advisory; no-op by default.
    fn will_need(&self, _offset: usize, _len: usize) {}
}

// `len` is the file's size in bytes, not a count of items: an `is_empty` would be no use.
#[allow(clippy::len_without_is_empty)]
pub trait VfsFile: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`; a short file is an `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn sync_data(&self) -> io::Result<()>;
    fn sync_all(&self) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves blocks for `[offset, offset+len)` (fallocate) so later writes cannot
    /// fail for lack of space and need no allocation metadata update.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Maps the first `len` bytes read-only.
    fn map(&self, len: u64) -> io::Result<Box<dyn MappedRegion>>;
    /// Starts writing `[offset, offset+len)` of the page cache to the disk, without
    /// a cache flush (durability still needs a sync); no-op where there is no page
    /// cache. With `wait_written_back`, a way to spread write-back over time and
    /// bound what is in flight at once.
    fn write_back(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Waits until the write-back of `[offset, offset+len)` started earlier is done.
    fn wait_written_back(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

pub trait Vfs: Send + Sync + 'static {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>>;
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory entries in `dir` (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Renames a file or a directory (with everything in it), atomically; durable
    /// once the directory that receives it is synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything in it. Like a file removal, it is durable
    /// only once the parent directory is synced.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    fn exists(&self, path: &Path) -> bool;
    /// Entries of `dir`: (path, is_dir).
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>>;
    /// Takes an exclusive advisory lock for the life of the returned guard.
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>>;
}
