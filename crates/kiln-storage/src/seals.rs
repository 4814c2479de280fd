//! The seal file of an encrypted environment (`crypt.rs`): where each sealed page
//! run's nonce and tag live, so that a page keeps its 8 KiB layout on disk.
//!
//! ```text
//! slot i (64 bytes at i * 64) describes the run that starts at page i:
//!  0 24  nonce
//! 24 16  tag
//! 40  4  pages in the run (1 for a node; an overflow or bare run: its length)
//! 44  4  flags: bit 0 = a bare value run (no page header inside)
//! 48 16  zero
//! slot 0 (page 0 is the file header's, never sealed): "KILNSEAL" | version u32
//! ```
//! The associated data of a run is its first page number, its length and its flags,
//! so a sealed run copied to another page, or a slot moved to another page, fails to
//! open. Slots are 64 bytes so that eight fit in a 512-byte sector: a torn sector
//! write never leaves half a slot.
//!
//! Durability follows the data file's: slots are written (buffered) with the pages
//! they seal and synced with the data file at every checkpoint, before the journal
//! records that could rebuild them are let go; recovery writes both again.

use crate::crypt::{Cipher, Sealed, NONCE_BYTES, TAG_BYTES};
use crate::io::{MappedRegion, OpenMode, Vfs, VfsFile};
use crate::page::{self, PageNo, PageRun, PAGE_SIZE};
use crate::{Error, Result};
use parking_lot::RwLock;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The seal file's name, beside the data file.
pub const SEALS_FILE: &str = "data.kiln.seals";
const SLOT_BYTES: u64 = 64;
const MAGIC: &[u8; 8] = b"KILNSEAL";
const VERSION: u32 = 1;
const FLAG_BARE: u32 = 1;

/// What a slot says of the run it seals.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    sealed: Sealed,
    pub run_pages: u32,
    pub bare: bool,
}

impl Slot {
    /// Checks that the run this slot seals is what a reader asked for at page `no`:
    /// a page (`bare_pages` None), or a bare run of that many pages. Only a damaged
    /// pointer asks for anything else.
    pub fn check_read_as(
        &self,
        no: PageNo,
        bare_pages: Option<u64>,
        data_path: &Path,
    ) -> Result<()> {
        if self.bare == bare_pages.is_some()
            && bare_pages.is_none_or(|n| n == self.run_pages as u64)
        {
            return Ok(());
        }
        Err(Error::corrupted(
            data_path,
            format!("page {no}"),
            format!(
                "page {no} was read as {}, and its seal says it starts a {} of {} pages (a damaged pointer)",
                bare_pages.map_or("a page".to_string(), |n| format!("a bare run of {n} pages")),
                if self.bare { "bare run" } else { "page run" },
                self.run_pages
            ),
        ))
    }
}

pub(crate) struct Seals {
    path: PathBuf,
    file: Box<dyn VfsFile>,
    /// The file mapped: a slot is read from memory, not with a system call per page
    /// opened (remapped when the file grows, `reserve`).
    map: RwLock<Box<dyn MappedRegion>>,
    cipher: Arc<Cipher>,
}

impl Seals {
    /// Makes the seal file of a new environment (before its data file exists).
    pub fn create(vfs: &dyn Vfs, dir: &Path, cipher: Arc<Cipher>) -> Result<Self> {
        let path = dir.join(SEALS_FILE);
        let mode = OpenMode {
            create: true,
            write: true,
            ..Default::default()
        };
        let file = vfs
            .open(&path, mode)
            .map_err(|e| Error::io(&path, None, "create seal file", e))?;
        let mut head = [0u8; SLOT_BYTES as usize];
        head[..8].copy_from_slice(MAGIC);
        head[8..12].copy_from_slice(&VERSION.to_le_bytes());
        file.set_len(0)
            .and_then(|()| file.write_all_at(&head, 0))
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(&path, Some(0), "write seal file header", e))?;
        vfs.sync_dir(dir)
            .map_err(|e| Error::io(dir, None, "fsync directory of seal file", e))?;
        Self::with_map(path, file, cipher)
    }

    /// Opens the seal file of an existing encrypted environment.
    pub fn open(vfs: &dyn Vfs, dir: &Path, cipher: Arc<Cipher>) -> Result<Self> {
        let path = dir.join(SEALS_FILE);
        if !vfs.exists(&path) {
            return Err(Error::corrupted(
                &path,
                "seal file",
                "missing in an encrypted environment: no page of the data file can be opened without it",
            ));
        }
        let mode = OpenMode {
            write: true,
            ..Default::default()
        };
        let file = vfs
            .open(&path, mode)
            .map_err(|e| Error::io(&path, None, "open seal file", e))?;
        let mut head = [0u8; 12];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| Error::io(&path, Some(0), "read seal file header", e))?;
        if &head[..8] != MAGIC {
            return Err(Error::corrupted(&path, "seal file header", "bad magic"));
        }
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if version != VERSION {
            return Err(Error::Incompatible {
                path,
                found: format!("seal file format {version}"),
                expected: format!("seal file format {VERSION}"),
            });
        }
        Self::with_map(path, file, cipher)
    }

    fn with_map(path: PathBuf, file: Box<dyn VfsFile>, cipher: Arc<Cipher>) -> Result<Self> {
        let map = Self::map_file(&path, file.as_ref())?;
        Ok(Seals {
            path,
            file,
            map: RwLock::new(map),
            cipher,
        })
    }

    fn map_file(path: &Path, file: &dyn VfsFile) -> Result<Box<dyn MappedRegion>> {
        let len = file
            .len()
            .map_err(|e| Error::io(path, None, "stat seal file", e))?;
        file.map(len)
            .map_err(|e| Error::io(path, None, "memory-map seal file", e))
    }

    pub fn cipher(&self) -> &Arc<Cipher> {
        &self.cipher
    }

    fn aad(no: PageNo, run_pages: u32, flags: u32) -> [u8; 24] {
        let mut aad = [0u8; 24];
        aad[..8].copy_from_slice(b"KILNPAGE");
        aad[8..16].copy_from_slice(&no.to_le_bytes());
        aad[16..20].copy_from_slice(&run_pages.to_le_bytes());
        aad[20..24].copy_from_slice(&flags.to_le_bytes());
        aad
    }

    /// Seals `run` (to be written at page `no`): returns its ciphertext and writes
    /// its slot (buffered, like the data file's pages).
    pub fn seal(&self, no: PageNo, run: &PageRun) -> Result<PageRun> {
        let run_pages = u32::try_from(run.page_count()).expect("a run of fewer than 2^32 pages");
        let flags = if run.is_bare() { FLAG_BARE } else { 0 };
        let mut out = PageRun::scratch(run.page_count());
        let sealed = self.cipher.seal_into(
            &Self::aad(no, run_pages, flags),
            run.bytes(),
            out.bytes_mut(),
        );
        let mut slot = [0u8; SLOT_BYTES as usize];
        slot[..NONCE_BYTES].copy_from_slice(&sealed.nonce);
        slot[24..24 + TAG_BYTES].copy_from_slice(&sealed.tag);
        slot[40..44].copy_from_slice(&run_pages.to_le_bytes());
        slot[44..48].copy_from_slice(&flags.to_le_bytes());
        let offset = no * SLOT_BYTES;
        self.file
            .write_all_at(&slot, offset)
            .map_err(|e| Error::io(&self.path, Some(offset), "write page seal", e))?;
        Ok(out)
    }

    /// The slot of the run starting at page `no`.
    pub fn slot(&self, no: PageNo) -> Result<Slot> {
        let offset = no * SLOT_BYTES;
        let mut b = [0u8; SLOT_BYTES as usize];
        let mapped = usize::try_from(offset).ok().and_then(|at| {
            let map = self.map.read();
            let slot = map.bytes().get(at..at + SLOT_BYTES as usize)?;
            b.copy_from_slice(slot);
            Some(())
        });
        // Past the map (a slot beyond what the last remap covered): read the file.
        let read = match mapped {
            Some(()) => Ok(()),
            None => self.file.read_exact_at(&mut b, offset),
        };
        let missing = || {
            Error::corrupted(
                &self.path,
                format!("page {no}"),
                format!("page {no} has no seal: it was never written (a damaged pointer) or the seal file lost it"),
            )
        };
        match read {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(missing()),
            Err(e) => return Err(Error::io(&self.path, Some(offset), "read page seal", e)),
            Ok(()) => {}
        }
        let run_pages = u32::from_le_bytes([b[40], b[41], b[42], b[43]]);
        if run_pages == 0 {
            return Err(missing());
        }
        let flags = u32::from_le_bytes([b[44], b[45], b[46], b[47]]);
        let mut sealed = Sealed {
            nonce: [0; NONCE_BYTES],
            tag: [0; TAG_BYTES],
        };
        sealed.nonce.copy_from_slice(&b[..NONCE_BYTES]);
        sealed.tag.copy_from_slice(&b[24..24 + TAG_BYTES]);
        Ok(Slot {
            sealed,
            run_pages,
            bare: flags & FLAG_BARE != 0,
        })
    }

    /// Decrypts the run at page `no` from its sealed bytes into a buffer of its own.
    /// A page (not a bare run) is also verified as a page.
    pub fn open_run(
        &self,
        no: PageNo,
        slot: &Slot,
        sealed_bytes: &[u8],
        data_path: &Path,
    ) -> Result<PageRun> {
        let flags = if slot.bare { FLAG_BARE } else { 0 };
        let mut out = PageRun::scratch(slot.run_pages as usize);
        if sealed_bytes.len() != slot.run_pages as usize * PAGE_SIZE
            || !self.cipher.open_into(
                &Self::aad(no, slot.run_pages, flags),
                sealed_bytes,
                out.bytes_mut(),
                &slot.sealed,
            )
        {
            return Err(Error::corrupted(
                data_path,
                format!("page {no}"),
                format!(
                    "page {no} ({} page run) fails authentication: changed on disk, moved from another page, or sealed under another key",
                    slot.run_pages
                ),
            ));
        }
        if slot.bare {
            return Ok(out.into_bare());
        }
        page::verify(out.bytes(), no, data_path)?;
        Ok(out)
    }

    /// Reserves slots for `pages` pages (the data file grew).
    pub fn reserve(&self, pages: u64) -> Result<()> {
        let len = pages * SLOT_BYTES;
        let cur = self
            .file
            .len()
            .map_err(|e| Error::io(&self.path, None, "stat seal file", e))?;
        if cur < len {
            self.file
                .allocate(cur, len - cur)
                .map_err(|e| Error::io(&self.path, Some(cur), "preallocate seal file", e))?;
            *self.map.write() = Self::map_file(&self.path, self.file.as_ref())?;
        }
        Ok(())
    }

    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(&self.path, None, "fsync seal file", e))
    }
}

#[cfg(test)]
mod tests {
    use crate::{Env, Error, MasterKey, Options};
    use std::path::Path;

    fn encrypted(key: &MasterKey) -> Options {
        Options {
            encryption: Some(key.clone()),
            ..Options::default()
        }
    }

    /// Every file of the environment (data, seals, journal), searched for `needle`.
    fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
        let mut found = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if std::fs::read(&path)
                    .unwrap()
                    .windows(needle.len())
                    .any(|w| w == needle)
                {
                    found.push(path.display().to_string());
                }
            }
        }
        found
    }

    fn value(i: u32) -> Vec<u8> {
        let len = match i % 50 {
            0 => 100_000, // a bare run
            1 => 9_000,   // an overflow run
            _ => 200,
        };
        let mut v = format!("SECRET-{i:06}-").into_bytes();
        v.resize(len, b'x');
        v
    }

    #[test]
    fn an_encrypted_environment_reads_back_and_keeps_nothing_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let key = MasterKey::generate();
        let env = Env::open(dir.path(), encrypted(&key)).unwrap();
        for chunk in 0..10u32 {
            let mut w = env.begin_write().unwrap();
            w.ensure_tree("t").unwrap();
            for i in chunk * 100..(chunk + 1) * 100 {
                w.put("t", &i.to_be_bytes(), &value(i)).unwrap();
            }
            w.commit().unwrap();
        }
        // Before close: values are in the journal (and maybe written back).
        assert_eq!(
            files_containing(dir.path(), b"SECRET-"),
            Vec::<String>::new()
        );
        env.close().unwrap();
        assert_eq!(
            files_containing(dir.path(), b"SECRET-"),
            Vec::<String>::new()
        );
        for _ in 0..2 {
            let env = Env::open(dir.path(), encrypted(&key)).unwrap();
            let r = env.begin_read().unwrap();
            for i in 0..1000u32 {
                assert_eq!(
                    r.get("t", &i.to_be_bytes()).unwrap(),
                    Some(&value(i)[..]),
                    "key {i}"
                );
            }
            drop(r);
            assert!(env.check().unwrap().is_clean());
            env.close().unwrap();
        }
        // The same bytes, unencrypted, are there in clear: the search above works.
        let plain = tempfile::tempdir().unwrap();
        let env = Env::open(plain.path(), Options::default()).unwrap();
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        w.put("t", b"k", &value(3)).unwrap();
        w.commit().unwrap();
        env.close().unwrap();
        assert!(!files_containing(plain.path(), b"SECRET-").is_empty());
    }

    #[test]
    fn the_wrong_key_no_key_or_a_key_for_a_plain_environment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = MasterKey::generate();
        let env = Env::open(dir.path(), encrypted(&key)).unwrap();
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        w.put("t", b"k", b"v").unwrap();
        w.commit().unwrap();
        env.close().unwrap();
        let wrong = Env::open(dir.path(), encrypted(&MasterKey::generate()))
            .err()
            .unwrap();
        assert!(matches!(wrong, Error::Encryption { .. }), "{wrong}");
        assert!(
            wrong.to_string().contains("wrong encryption key"),
            "{wrong}"
        );
        let none = Env::open(dir.path(), Options::default()).err().unwrap();
        assert!(
            none.to_string().contains("open it with its master key"),
            "{none}"
        );
        // A new master key, after a rotation: the old one no longer opens it.
        let new = MasterKey::generate();
        crate::crypt::rotate_master_key(dir.path(), &key, &new).unwrap();
        assert!(Env::open(dir.path(), encrypted(&key)).is_err());
        let env = Env::open(dir.path(), encrypted(&new)).unwrap();
        assert_eq!(
            env.begin_read().unwrap().get("t", b"k").unwrap(),
            Some(&b"v"[..])
        );
        env.close().unwrap();

        let plain = tempfile::tempdir().unwrap();
        Env::open(plain.path(), Options::default())
            .unwrap()
            .close()
            .unwrap();
        let e = Env::open(plain.path(), encrypted(&key)).err().unwrap();
        assert!(e.to_string().contains("created without one"), "{e}");
    }

    /// Pages written back, freed and reused under a small shared cache of decrypted
    /// pages: every read matches a model (the cache never serves a page number's old
    /// version), and a snapshot kept open for a while reads its own state.
    #[test]
    fn reused_pages_never_read_stale_through_the_decrypted_cache() {
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeMap;
        let dir = tempfile::tempdir().unwrap();
        let opts = Options {
            encryption: Some(MasterKey::generate()),
            decrypted_cache_bytes: 24 * crate::PAGE_SIZE as u64,
            write_buffer_bytes: 0,
            sync_interval_ms: 5,
            sync_after_bytes: 64 << 10,
            write_back_window_bytes: 1 << 20,
            ..Options::default()
        };
        let env = Env::open(dir.path(), opts.clone()).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut model: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        w.commit().unwrap();
        // A snapshot kept a while (no page it can reach is reused meanwhile), then
        // dropped: from then on freed pages are reused.
        let mut old = Some(env.begin_read().unwrap());
        for round in 0..300u32 {
            if round == 30 {
                let snapshot = old.take().unwrap();
                assert_eq!(
                    snapshot.tree_len("t").unwrap(),
                    0,
                    "the old snapshot saw later commits"
                );
            }
            let mut w = env.begin_write().unwrap();
            for _ in 0..40 {
                let k: u32 = rng.gen_range(0..3000);
                if rng.gen_bool(0.3) {
                    w.delete("t", &k.to_be_bytes()).unwrap();
                    model.remove(&k);
                } else {
                    let v = vec![(round % 251) as u8; rng.gen_range(10..400)];
                    w.put("t", &k.to_be_bytes(), &v).unwrap();
                    model.insert(k, v);
                }
            }
            w.commit().unwrap();
            let r = env.begin_read().unwrap();
            for _ in 0..50 {
                let k: u32 = rng.gen_range(0..3000);
                assert_eq!(
                    r.get("t", &k.to_be_bytes()).unwrap(),
                    model.get(&k).map(|v| &v[..]),
                    "round {round} key {k}"
                );
            }
        }
        drop(old);
        let r = env.begin_read().unwrap();
        assert_eq!(r.tree_len("t").unwrap(), model.len() as u64);
        for (k, v) in &model {
            assert_eq!(r.get("t", &k.to_be_bytes()).unwrap(), Some(&v[..]));
        }
        drop(r);
        assert!(env.check().unwrap().is_clean());
        // Pages went through the data file (and so through sealing and the cache),
        // not only through the unflushed table.
        let written = env.stats().pages_written_back;
        assert!(written > 100, "only {written} pages written back");
        env.close().unwrap();
    }

    #[test]
    fn a_flipped_bit_in_a_sealed_page_is_an_authentication_failure_naming_the_page() {
        let dir = tempfile::tempdir().unwrap();
        let key = MasterKey::generate();
        let env = Env::open(dir.path(), encrypted(&key)).unwrap();
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        for i in 0..2000u32 {
            w.put("t", &i.to_be_bytes(), &[7u8; 100]).unwrap();
        }
        w.commit().unwrap();
        env.close().unwrap();
        // Flip one bit in every data page (not the two header pages): any read of
        // the tree then meets one.
        let data = dir.path().join(crate::DATA_FILE);
        let mut bytes = std::fs::read(&data).unwrap();
        let pages = bytes.len() / crate::PAGE_SIZE;
        for p in 2..pages {
            bytes[p * crate::PAGE_SIZE + 1000] ^= 0x10;
        }
        std::fs::write(&data, bytes).unwrap();
        let env = Env::open(dir.path(), encrypted(&key)).unwrap();
        let r = env.begin_read().unwrap();
        let e = r.get("t", &5u32.to_be_bytes()).err().unwrap();
        let msg = e.to_string();
        assert!(e.is_corruption(), "{msg}");
        assert!(
            msg.contains("fails authentication") && msg.contains("page "),
            "{msg}"
        );
    }
}
