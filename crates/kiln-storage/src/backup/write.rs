//! Writing the container: a full backup of a read snapshot (`ReadTxn::backup_to`)
//! or entries a caller supplies (`ContainerWriter`, the document layer's
//! incremental backups), in clear or sealed under a master key. The format is
//! documented in `mod.rs`.

use super::{
    wrapped_fingerprint, BackupError, BackupOptions, BackupResult, BackupSummary, Sealer,
    BACKUP_ID_BYTES, CHUNK_BYTES, FLAG_LZ4, FLAG_SEALED, FRAME_HEADER, HEADER_FIXED, KIND_DATA,
    KIND_END, KIND_FILE, KIND_FILE_DATA, KIND_FILE_END, KIND_TRAILER, KIND_TREE, MAGIC, MAX_META,
    PLAIN_FORMAT_VERSION, SEALED_FORMAT_VERSION,
};
use crate::crypt::{MasterKey, SealingKey, WRAPPED_KEY_BYTES};
use crate::{Env, Error, ReadTxn};
use std::io::{Read, Write};

/// A writer that counts and checksums what goes through it.
struct Tally<W> {
    inner: W,
    offset: u64,
    crc: u32,
}

impl<W: Write> Tally<W> {
    fn put(&mut self, b: &[u8]) -> BackupResult<()> {
        self.inner.write_all(b).map_err(|source| BackupError::Io {
            op: "writing",
            offset: self.offset,
            source,
        })?;
        self.crc = crc32c::crc32c_append(self.crc, b);
        self.offset += b.len() as u64;
        Ok(())
    }
}

struct FrameWriter<W, P> {
    out: Tally<W>,
    next_index: u32,
    compress: bool,
    progress: P,
    /// A sealed backup's key (every payload is sealed under it).
    sealer: Option<Sealer>,
    /// The sealed payload being written (reused between frames).
    sealed: Vec<u8>,
}

impl<W: Write, P: FnMut(u64)> FrameWriter<W, P> {
    fn frame(&mut self, kind: u8, raw: &[u8]) -> BackupResult<()> {
        let compressed;
        let (flags, payload): (u8, &[u8]) = if self.compress && kind == KIND_DATA {
            compressed = lz4_flex::block::compress(raw);
            if compressed.len() < raw.len() {
                (1, &compressed)
            } else {
                (0, raw)
            }
        } else {
            (0, raw)
        };
        let mut h = [0u8; FRAME_HEADER];
        h[0] = kind;
        h[1] = flags;
        h[4..8].copy_from_slice(&self.next_index.to_le_bytes());
        h[8..12].copy_from_slice(&(raw.len() as u32).to_le_bytes());
        // Compressed first, then sealed: its header's first 12 bytes (kind, flags,
        // index, raw length) are part of what the seal authenticates.
        let payload: &[u8] = match &self.sealer {
            Some(s) => {
                self.sealed.clear();
                self.sealed.extend_from_slice(payload);
                s.seal(&s.frame_aad(&h), &mut self.sealed);
                &self.sealed
            }
            None => payload,
        };
        h[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        h[16..20].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        let hc = crc32c::crc32c(&h[..20]);
        h[20..24].copy_from_slice(&hc.to_le_bytes());
        self.out.put(&h)?;
        self.out.put(payload)?;
        self.next_index += 1;
        (self.progress)(self.out.offset);
        Ok(())
    }
}

impl ReadTxn<'_> {
    /// Writes a full backup of this snapshot to `out`; `meta` (at most 1 MiB) is
    /// stored in the header as it is. `progress` gets the bytes written so far after
    /// each chunk. The backup of an encrypted environment is sealed under its
    /// master key (version 3: see the module documentation).
    pub fn backup_to<W: Write>(
        &mut self,
        out: W,
        meta: &[u8],
        opts: BackupOptions,
        progress: impl FnMut(u64),
    ) -> BackupResult<BackupSummary> {
        write_backup(self, out, meta, opts, progress, |_| true)
    }

    /// `backup_to`, writing the trees for which `with_entries(name)` is false as
    /// empty trees (they are created by a restore, without their entries): for a
    /// caller's own bookkeeping trees that must not travel with an image.
    pub fn backup_filtered_to<W: Write>(
        &mut self,
        out: W,
        meta: &[u8],
        opts: BackupOptions,
        progress: impl FnMut(u64),
        with_entries: impl Fn(&str) -> bool,
    ) -> BackupResult<BackupSummary> {
        write_backup(self, out, meta, opts, progress, with_entries)
    }
}

impl Env {
    /// A full backup of the last commit, taken from one read snapshot while writes
    /// go on (see the module documentation).
    pub fn backup_to<W: Write>(
        &self,
        out: W,
        opts: BackupOptions,
        progress: impl FnMut(u64),
    ) -> BackupResult<BackupSummary> {
        let mut r = self.begin_read()?;
        write_backup(&mut r, out, &[], opts, progress, |_| true)
    }
}

/// Writes a container of the format above from entries the caller supplies (the
/// document layer's incremental backups use it): `begin_tree`, `entry`s in key
/// order, `end_tree`, ..., `finish`. `txn_id` and `meta` go in the header.
pub struct ContainerWriter<W: Write, P: FnMut(u64)> {
    w: FrameWriter<W, P>,
    sum: BackupSummary,
    chunk: Vec<u8>,
    in_tree: Option<u64>,
}

/// A sealed backup's key as its header carries it, with its id.
pub(crate) struct NewSeal {
    key: SealingKey,
    wrapped: [u8; WRAPPED_KEY_BYTES],
    backup_id: [u8; BACKUP_ID_BYTES],
}

impl NewSeal {
    /// A new random key wrapped by `master`, and a new random backup id.
    fn generate(master: &MasterKey) -> NewSeal {
        let key = SealingKey::generate();
        let wrapped = master.wrap(&key);
        let mut backup_id = [0u8; BACKUP_ID_BYTES];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut backup_id);
        NewSeal {
            key,
            wrapped,
            backup_id,
        }
    }

    /// A seal of the caller's choosing (tests: two backups under one key).
    #[cfg(test)]
    pub(crate) fn for_tests(
        key: SealingKey,
        wrapped: [u8; WRAPPED_KEY_BYTES],
        backup_id: [u8; BACKUP_ID_BYTES],
    ) -> NewSeal {
        NewSeal {
            key,
            wrapped,
            backup_id,
        }
    }
}

impl<W: Write, P: FnMut(u64)> ContainerWriter<W, P> {
    /// A container written in clear (version 2). A backup of an encrypted
    /// environment must be sealed: see `with_encryption` and `for_snapshot`.
    pub fn new(
        out: W,
        txn_id: u64,
        meta: &[u8],
        opts: BackupOptions,
        progress: P,
    ) -> BackupResult<Self> {
        Self::with_seal(out, txn_id, meta, opts, None, progress)
    }

    /// A container sealed under `encryption` (version 3: the meta and every frame
    /// encrypted and authenticated under a new key of its own, wrapped by the master
    /// key), or written in clear without one.
    pub fn with_encryption(
        out: W,
        txn_id: u64,
        meta: &[u8],
        opts: BackupOptions,
        encryption: Option<&MasterKey>,
        progress: P,
    ) -> BackupResult<Self> {
        let seal = encryption.map(NewSeal::generate);
        Self::with_seal(out, txn_id, meta, opts, seal, progress)
    }

    /// A container of snapshot `r` (its transaction id in the header), sealed under
    /// its environment's master key if the environment is encrypted: a backup of an
    /// encrypted environment is never written in clear.
    pub fn for_snapshot(
        out: W,
        r: &ReadTxn<'_>,
        meta: &[u8],
        opts: BackupOptions,
        progress: P,
    ) -> BackupResult<Self> {
        Self::with_encryption(out, r.txn_id(), meta, opts, r.master_key(), progress)
    }

    pub(crate) fn with_seal(
        out: W,
        txn_id: u64,
        meta: &[u8],
        opts: BackupOptions,
        seal: Option<NewSeal>,
        progress: P,
    ) -> BackupResult<Self> {
        if meta.len() > MAX_META {
            return Err(BackupError::Corrupt {
                part: "header".into(),
                offset: 0,
                what: format!("metadata of {} bytes exceeds {MAX_META}", meta.len()),
            });
        }
        let mut w = FrameWriter {
            out: Tally {
                inner: out,
                offset: 0,
                crc: 0,
            },
            next_index: 0,
            compress: opts.compress,
            progress,
            sealer: None,
            sealed: Vec::new(),
        };
        let (version, mut flags) = match seal {
            Some(_) => (SEALED_FORMAT_VERSION, FLAG_SEALED),
            None => (PLAIN_FORMAT_VERSION, 0),
        };
        if opts.compress {
            flags |= FLAG_LZ4;
        }
        let mut h = Vec::with_capacity(HEADER_FIXED + meta.len() + 200);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&version.to_le_bytes());
        h.extend_from_slice(&flags.to_le_bytes());
        h.extend_from_slice(&txn_id.to_le_bytes());
        let mut key_fingerprint = None;
        match seal {
            Some(seal) => {
                let sealed_len = meta.len() + SealingKey::SEAL_BYTES;
                h.extend_from_slice(&(sealed_len as u32).to_le_bytes());
                let mut aad = h.clone();
                aad.extend_from_slice(&seal.backup_id);
                aad.extend_from_slice(&seal.wrapped);
                let sealer = Sealer {
                    key: seal.key,
                    backup_id: seal.backup_id,
                    txn_id,
                };
                let mut sealed_meta = meta.to_vec();
                sealer.seal(&aad, &mut sealed_meta);
                h.extend_from_slice(&sealed_meta);
                h.extend_from_slice(&seal.backup_id);
                h.extend_from_slice(&seal.wrapped);
                key_fingerprint = Some(wrapped_fingerprint(&seal.wrapped));
                w.sealer = Some(sealer);
            }
            None => {
                h.extend_from_slice(&(meta.len() as u32).to_le_bytes());
                h.extend_from_slice(meta);
            }
        }
        let c = crc32c::crc32c(&h);
        h.extend_from_slice(&c.to_le_bytes());
        w.out.put(&h)?;
        Ok(ContainerWriter {
            w,
            sum: BackupSummary {
                format_version: version,
                txn_id,
                meta: meta.to_vec(),
                key_fingerprint,
                ..Default::default()
            },
            chunk: Vec::with_capacity(CHUNK_BYTES + 4096),
            in_tree: None,
        })
    }

    fn misuse(what: &'static str) -> BackupError {
        BackupError::Storage(Error::Misuse(what))
    }

    pub fn begin_tree(&mut self, name: &str) -> BackupResult<()> {
        if self.in_tree.is_some() {
            return Err(Self::misuse(
                "backup container writer: begin_tree inside a tree",
            ));
        }
        self.w.frame(KIND_TREE, name.as_bytes())?;
        self.sum.trees += 1;
        self.in_tree = Some(0);
        Ok(())
    }

    pub fn entry(&mut self, k: &[u8], v: &[u8]) -> BackupResult<()> {
        let Some(n) = self.in_tree.as_mut() else {
            return Err(Self::misuse(
                "backup container writer: entry outside a tree",
            ));
        };
        *n += 1;
        self.chunk
            .extend_from_slice(&(k.len() as u32).to_le_bytes());
        self.chunk
            .extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.chunk.extend_from_slice(k);
        self.chunk.extend_from_slice(v);
        self.sum.kv_bytes += (k.len() + v.len()) as u64;
        if self.chunk.len() >= CHUNK_BYTES {
            self.w.frame(KIND_DATA, &self.chunk)?;
            self.chunk.clear();
        }
        Ok(())
    }

    pub fn end_tree(&mut self) -> BackupResult<()> {
        let Some(n) = self.in_tree.take() else {
            return Err(Self::misuse(
                "backup container writer: end_tree outside a tree",
            ));
        };
        if !self.chunk.is_empty() {
            self.w.frame(KIND_DATA, &self.chunk)?;
            self.chunk.clear();
        }
        self.w.frame(KIND_END, &n.to_le_bytes())?;
        self.sum.entries += n;
        Ok(())
    }

    /// Writes every tree of snapshot `r` (those for which `with_entries(name)` is
    /// false as empty trees), as `ReadTxn::backup_filtered_to` does; extra files
    /// (`file`) may follow before `finish`.
    ///
    /// Of an encrypted environment, the snapshot holds every page it decrypts until
    /// it ends: the scan lets them go whenever they pass
    /// `DECRYPTED_HELD_BYTES` (closing its cursor and seeking back to the key after
    /// the last one written), so a backup larger than memory does not hold it all.
    pub fn snapshot_trees(
        &mut self,
        r: &mut ReadTxn<'_>,
        with_entries: impl Fn(&str) -> bool,
    ) -> BackupResult<()> {
        for name in r.tree_names()? {
            self.begin_tree(&name)?;
            if with_entries(&name) {
                let mut resume: Option<Vec<u8>> = None;
                while let Some(after) = self.scan_tree_part(r, &name, resume.as_deref())? {
                    resume = Some(after);
                    r.release_decrypted();
                }
            }
            self.end_tree()?;
        }
        Ok(())
    }

    /// Writes the entries of tree `name` after key `after` (from the first without
    /// one) until the tree ends (`None`) or the snapshot holds more than
    /// `DECRYPTED_HELD_BYTES` of decrypted pages: then the last key written.
    fn scan_tree_part(
        &mut self,
        r: &ReadTxn<'_>,
        name: &str,
        after: Option<&[u8]>,
    ) -> BackupResult<Option<Vec<u8>>> {
        let mut c = r.cursor(name)?;
        let mut e = match after {
            None => c.first()?,
            Some(key) => match c.seek(key)? {
                Some((k, _)) if k == key => c.next()?,
                other => other,
            },
        };
        while let Some((k, v)) = e {
            self.entry(k, v)?;
            if r.decrypted_bytes_held() > DECRYPTED_HELD_BYTES {
                return Ok(Some(k.to_vec()));
            }
            e = c.next()?;
        }
        Ok(None)
    }

    /// Writes an extra file (outside any tree): `name`, then exactly `len_bytes`
    /// bytes read from `src` in ~1 MiB frames (never the whole file in memory),
    /// then its length and CRC-32C. A source that ends early or has more bytes
    /// fails the backup (`FileChanged`): the file changed while it was read.
    pub fn file(&mut self, name: &str, len_bytes: u64, src: &mut dyn Read) -> BackupResult<()> {
        if self.in_tree.is_some() {
            return Err(Self::misuse(
                "backup container writer: a file inside a tree",
            ));
        }
        let mut head = Vec::with_capacity(8 + name.len());
        head.extend_from_slice(&len_bytes.to_le_bytes());
        head.extend_from_slice(name.as_bytes());
        self.w.frame(KIND_FILE, &head)?;
        self.sum.files += 1;
        let mut done = 0u64;
        let mut crc = 0u32;
        let mut buf = std::mem::take(&mut self.chunk);
        buf.clear();
        buf.resize(CHUNK_BYTES, 0);
        let result = (|| {
            loop {
                // Fill a whole chunk (a source may return short reads).
                let mut n = 0;
                while n < buf.len() {
                    let slot = buf.get_mut(n..).unwrap_or_default();
                    match src.read(slot) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(source) => {
                            return Err(BackupError::FileSource {
                                name: name.to_string(),
                                offset: done + n as u64,
                                source,
                            })
                        }
                    }
                }
                if n == 0 {
                    break;
                }
                let bytes = buf.get(..n).unwrap_or_default();
                done += n as u64;
                if done > len_bytes {
                    return Err(BackupError::FileChanged {
                        name: name.to_string(),
                        what: format!("it has more than the {len_bytes} bytes announced"),
                    });
                }
                crc = crc32c::crc32c_append(crc, bytes);
                self.w.frame(KIND_FILE_DATA, bytes)?;
            }
            Ok(())
        })();
        buf.clear();
        self.chunk = buf;
        result?;
        if done != len_bytes {
            return Err(BackupError::FileChanged {
                name: name.to_string(),
                what: format!("it has {done} bytes, {len_bytes} were announced"),
            });
        }
        let mut end = [0u8; 12];
        end[..8].copy_from_slice(&len_bytes.to_le_bytes());
        end[8..].copy_from_slice(&crc.to_le_bytes());
        self.w.frame(KIND_FILE_END, &end)?;
        self.sum.file_bytes_total += len_bytes;
        Ok(())
    }

    /// Writes the trailer and flushes; the summary of what was written.
    pub fn finish(mut self) -> BackupResult<BackupSummary> {
        if self.in_tree.is_some() {
            self.end_tree()?;
        }
        let sum = &mut self.sum;
        let w = &mut self.w;
        let mut t = Vec::with_capacity(48);
        t.extend_from_slice(&sum.trees.to_le_bytes());
        t.extend_from_slice(&sum.entries.to_le_bytes());
        t.extend_from_slice(&sum.kv_bytes.to_le_bytes());
        t.extend_from_slice(&(w.next_index + 1).to_le_bytes());
        t.extend_from_slice(&w.out.crc.to_le_bytes());
        t.extend_from_slice(&sum.files.to_le_bytes());
        t.extend_from_slice(&sum.file_bytes_total.to_le_bytes());
        w.frame(KIND_TRAILER, &t)?;
        w.out.inner.flush().map_err(|source| BackupError::Io {
            op: "flushing",
            offset: w.out.offset,
            source,
        })?;
        sum.frames = w.next_index;
        sum.file_bytes = w.out.offset;
        Ok(self.sum)
    }
}

/// What a backup's snapshot of an encrypted environment may hold of decrypted pages
/// before its scan lets them go (`ContainerWriter::snapshot_trees`).
#[cfg(not(test))]
const DECRYPTED_HELD_BYTES: u64 = 32 << 20;
/// Eight pages: the unit tests' small trees pass it many times.
#[cfg(test)]
const DECRYPTED_HELD_BYTES: u64 = 64 << 10;

fn write_backup<W: Write>(
    r: &mut ReadTxn<'_>,
    out: W,
    meta: &[u8],
    opts: BackupOptions,
    progress: impl FnMut(u64),
    with_entries: impl Fn(&str) -> bool,
) -> BackupResult<BackupSummary> {
    let mut w = ContainerWriter::for_snapshot(out, r, meta, opts, progress)?;
    w.snapshot_trees(r, with_entries)?;
    w.finish()
}
