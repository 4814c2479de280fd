//! Building blocks for a `Vfs` that changes a few calls of another one (fault
//! injection in tests, instrumentation): implement `ForwardVfs` and `ForwardFile`,
//! override the calls that differ, and every other call goes to `inner()`.
//!
//! ```ignore
//! struct CountingFile { inner: Box<dyn VfsFile>, writes: AtomicU64 }
//! impl ForwardFile for CountingFile {
//!     fn inner(&self) -> &dyn VfsFile { self.inner.as_ref() }
//!     fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
//!         self.writes.fetch_add(1, Relaxed);
//!         self.inner.write_all_at(buf, offset)
//!     }
//! }
//! ```

use super::{MappedRegion, OpenMode, Vfs, VfsFile};
use std::io;
use std::path::{Path, PathBuf};

/// A file whose calls go to `inner()` unless overridden; a `VfsFile` through the
/// blanket implementation below.
// `len` is the file's size in bytes, as in `VfsFile`.
#[allow(clippy::len_without_is_empty)]
pub trait ForwardFile: Send + Sync {
    fn inner(&self) -> &dyn VfsFile;

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner().read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner().write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner().sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.inner().sync_all()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner().len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner().set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner().allocate(offset, len)
    }
    fn map(&self, len: u64) -> io::Result<Box<dyn MappedRegion>> {
        self.inner().map(len)
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner().write_back(offset, len)
    }
    fn wait_written_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner().wait_written_back(offset, len)
    }
}

impl<T: ForwardFile> VfsFile for T {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        ForwardFile::read_exact_at(self, buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        ForwardFile::write_all_at(self, buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        ForwardFile::sync_data(self)
    }
    fn sync_all(&self) -> io::Result<()> {
        ForwardFile::sync_all(self)
    }
    fn len(&self) -> io::Result<u64> {
        ForwardFile::len(self)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        ForwardFile::set_len(self, len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        ForwardFile::allocate(self, offset, len)
    }
    fn map(&self, len: u64) -> io::Result<Box<dyn MappedRegion>> {
        ForwardFile::map(self, len)
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        ForwardFile::write_back(self, offset, len)
    }
    fn wait_written_back(&self, offset: u64, len: u64) -> io::Result<()> {
        ForwardFile::wait_written_back(self, offset, len)
    }
}

/// A file system whose calls go to `inner()` unless overridden; a `Vfs` through the
/// blanket implementation below. `open` usually wraps the inner file in a
/// `ForwardFile` of one's own.
pub trait ForwardVfs: Send + Sync + 'static {
    fn inner(&self) -> &dyn Vfs;

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        self.inner().open(path, mode)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner().create_dir_all(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner().sync_dir(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner().rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner().remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner().remove_dir_all(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner().exists(path)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        self.inner().list_dir(dir)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        self.inner().lock_exclusive(path)
    }
}

impl<T: ForwardVfs> Vfs for T {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        ForwardVfs::open(self, path, mode)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        ForwardVfs::create_dir_all(self, path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        ForwardVfs::sync_dir(self, dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        ForwardVfs::rename(self, from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        ForwardVfs::remove_file(self, path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        ForwardVfs::remove_dir_all(self, path)
    }
    fn exists(&self, path: &Path) -> bool {
        ForwardVfs::exists(self, path)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        ForwardVfs::list_dir(self, dir)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        ForwardVfs::lock_exclusive(self, path)
    }
}
