//! A simulated disk behind Kiln's I/O trait, deterministic from a seed.
//!
//! It keeps two views of every file: what the OS would show (every write so far) and
//! what is durable (what survives a power cut). A write becomes durable when the file
//! is synced, or at once if the handle was opened with O_DSYNC. A directory entry
//! (create, rename, remove) becomes durable when its directory is synced.
//!
//! A power cut (at a chosen operation, or on demand) builds the next state from the
//! durable view plus a choice of the writes still pending: drop them, keep them, keep
//! a random subset, tear one at a 512-byte sector boundary, or fill its sectors with
//! garbage. A file created or renamed without a directory sync may vanish; a file
//! extended without a sync may come back shorter. After the cut the old handles fail
//! with EIO (the process is gone), and `restart` makes the post-cut state current.
//!
//! Faults: the n-th read, write, sync or allocation can fail with EIO or ENOSPC.
//!
//! Memory maps are live views of a file's bytes (like a shared mmap): each file's
//! bytes live in an anonymous mapping of fixed capacity that never moves.

use kiln_storage::io::{MappedRegion, OpenMode, Vfs, VfsFile};
use parking_lot::Mutex;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest simulated file. Anonymous memory is only committed where written.
pub const FILE_CAPACITY: usize = 1 << 30;
pub const SECTOR: usize = 512;

/// What happens to writes not yet durable when the power goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    DropAll,
    KeepAll,
    /// Each pending write is kept, dropped, torn or garbled at random.
    Random,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    Read,
    Write,
    Sync,
    Allocate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Eio,
    Enospc,
}

impl Fault {
    fn error(self) -> io::Error {
        io::Error::from_raw_os_error(match self {
            Fault::Eio => libc::EIO,
            Fault::Enospc => libc::ENOSPC,
        })
    }
}

/// Counts of what the simulation did, for the figures a test prints.
#[derive(Debug, Clone, Default)]
pub struct SimStats {
    pub power_cuts: u64,
    pub faults_injected: BTreeMap<String, u64>,
    pub writes_torn: u64,
    pub writes_garbled: u64,
    pub pending_writes_dropped: u64,
    pub pending_writes_kept: u64,
    pub files_vanished: u64,
    /// Directory renames and removals a power cut undid (not yet durable).
    pub dir_ops_undone: u64,
    pub bits_flipped: u64,
}

struct Bytes {
    map: memmap2::MmapMut,
}

impl Bytes {
    fn new() -> io::Result<Arc<Bytes>> {
        Ok(Arc::new(Bytes {
            map: memmap2::MmapMut::map_anon(FILE_CAPACITY)?,
        }))
    }
    fn ptr(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }
}

// SAFETY: the mapping never moves; writes happen under the disk's lock and, like a
// real shared mmap, readers of a map see bytes as they are written. The engine only
// reads mapped pages it is not concurrently writing.
unsafe impl Sync for Bytes {}
unsafe impl Send for Bytes {}

struct PendingWrite {
    offset: u64,
    bytes: Vec<u8>,
}

struct Inode {
    bytes: Arc<Bytes>,
    len: u64,
    durable: Vec<u8>,
    pending: Vec<PendingWrite>,
}

impl Inode {
    fn new() -> io::Result<Inode> {
        Ok(Inode {
            bytes: Bytes::new()?,
            len: 0,
            durable: Vec::new(),
            pending: Vec::new(),
        })
    }
    fn write_volatile(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let end = offset as usize + buf.len();
        if end > FILE_CAPACITY {
            return Err(Fault::Enospc.error());
        }
        // SAFETY: in bounds of the fixed-capacity mapping, under the disk's lock.
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr(),
                self.bytes.ptr().add(offset as usize),
                buf.len(),
            )
        };
        self.len = self.len.max(end as u64);
        Ok(())
    }
    fn volatile(&self) -> &[u8] {
        // SAFETY: in bounds; see `Bytes`.
        unsafe { std::slice::from_raw_parts(self.bytes.ptr(), self.len as usize) }
    }
    fn sync(&mut self) {
        self.durable = self.volatile().to_vec();
        self.pending.clear();
    }
}

fn write_into(v: &mut Vec<u8>, offset: usize, bytes: &[u8]) {
    if v.len() < offset + bytes.len() {
        v.resize(offset + bytes.len(), 0);
    }
    v[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// A directory rename or removal the OS already shows but that no sync of the
/// directory holding it has made durable yet. A power cut keeps or undoes it as a
/// whole (a directory rename is atomic: never half of its files moved).
#[derive(Debug, Clone)]
enum PendingDirOp {
    Rename { from: PathBuf, to: PathBuf },
    Remove { path: PathBuf },
}

impl PendingDirOp {
    /// The directory whose sync makes this operation durable.
    fn holder(&self) -> Option<&Path> {
        match self {
            PendingDirOp::Rename { to, .. } => to.parent(),
            PendingDirOp::Remove { path } => path.parent(),
        }
    }

    /// Applies the operation to a name table (the durable one, or the post-cut one).
    fn apply(&self, names: &mut HashMap<PathBuf, usize>) {
        match self {
            PendingDirOp::Rename { from, to } => move_under(names, from, to),
            PendingDirOp::Remove { path } => names.retain(|p, _| !p.starts_with(path)),
        }
    }

    /// Where `p` (a path the OS shows) was before this operation, if it moved.
    fn undo_path(&self, p: &Path) -> Option<PathBuf> {
        match self {
            PendingDirOp::Rename { from, to } => rebase(p, to, from),
            PendingDirOp::Remove { .. } => None,
        }
    }
}

/// `p` with its prefix `from` replaced by `to`, if `p` is `from` or under it.
fn rebase(p: &Path, from: &Path, to: &Path) -> Option<PathBuf> {
    let rest = p.strip_prefix(from).ok()?;
    Some(if rest.as_os_str().is_empty() {
        to.to_path_buf()
    } else {
        to.join(rest)
    })
}

/// Moves every entry of `names` under `from` to the same place under `to`.
fn move_under<V>(names: &mut HashMap<PathBuf, V>, from: &Path, to: &Path) {
    let moved: Vec<PathBuf> = names
        .keys()
        .filter(|p| p.starts_with(from))
        .cloned()
        .collect();
    for old in moved {
        if let (Some(v), Some(new)) = (names.remove(&old), rebase(&old, from, to)) {
            names.insert(new, v);
        }
    }
}

struct State {
    rng: StdRng,
    inodes: Vec<Inode>,
    names: HashMap<PathBuf, usize>,
    durable_names: HashMap<PathBuf, usize>,
    dirs: std::collections::HashSet<PathBuf>,
    pending_dir_ops: Vec<PendingDirOp>,
    locks: std::collections::HashSet<PathBuf>,
    /// Increments on every power cut: handles of an older generation are dead.
    generation: u64,
    dead: bool,
    ops: u64,
    op_counts: HashMap<OpKind, u64>,
    cut_at_op: Option<(u64, CutMode)>,
    faults: Vec<(OpKind, u64, Fault)>,
    stats: SimStats,
}

/// The simulated disk. Cheap to share (`Arc`).
pub struct SimDisk {
    state: Mutex<State>,
}

impl SimDisk {
    pub fn new(seed: u64) -> Arc<SimDisk> {
        Arc::new(SimDisk {
            state: Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                inodes: Vec::new(),
                names: HashMap::new(),
                durable_names: HashMap::new(),
                dirs: Default::default(),
                pending_dir_ops: Vec::new(),
                locks: Default::default(),
                generation: 0,
                dead: false,
                ops: 0,
                op_counts: HashMap::new(),
                cut_at_op: None,
                faults: Vec::new(),
                stats: SimStats::default(),
            }),
        })
    }

    /// The I/O trait object to hand to `Options::vfs`.
    pub fn vfs(self: &Arc<Self>) -> Arc<dyn Vfs> {
        Arc::new(SimVfs { disk: self.clone() })
    }

    /// Mutating operations so far (writes, syncs, allocations, renames, ...).
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }

    pub fn stats(&self) -> SimStats {
        self.state.lock().stats.clone()
    }

    pub fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// Cuts the power when mutating operation number `op` (0-based) is attempted: if
    /// it is a write, it is torn (a random number of its sectors land).
    pub fn cut_power_at(&self, op: u64, mode: CutMode) {
        self.state.lock().cut_at_op = Some((op, mode));
    }

    /// Fails the `nth` (0-based, counted from now) operation of `kind`.
    pub fn inject_fault(&self, kind: OpKind, nth: u64, fault: Fault) {
        let mut st = self.state.lock();
        let base = st.op_counts.get(&kind).copied().unwrap_or(0);
        st.faults.push((kind, base + nth, fault));
    }

    pub fn clear_faults(&self) {
        let mut st = self.state.lock();
        st.faults.clear();
        st.cut_at_op = None;
    }

    /// Cuts the power now.
    pub fn cut_power(&self, mode: CutMode) {
        let mut st = self.state.lock();
        st.power_cut(mode, None);
    }

    /// Powers the machine back on: the post-cut state becomes current and new
    /// handles work again. Locks held by the dead process are gone.
    pub fn restart(&self) {
        let mut st = self.state.lock();
        st.dead = false;
        st.locks.clear();
    }

    /// The current (OS-visible) bytes of a file.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.lock();
        st.names
            .get(path)
            .map(|i| st.inodes[*i].volatile().to_vec())
    }

    /// Flips one bit of a file in both views (damage at rest).
    pub fn flip_bit(&self, path: &Path, offset: u64, bit: u8) -> bool {
        let mut st = self.state.lock();
        let Some(&i) = st.names.get(path) else {
            return false;
        };
        let inode = &mut st.inodes[i];
        if offset >= inode.len {
            return false;
        }
        let mut b = [inode.volatile()[offset as usize]];
        b[0] ^= 1 << (bit % 8);
        let _ = inode.write_volatile(offset, &b);
        if (offset as usize) < inode.durable.len() {
            inode.durable[offset as usize] ^= 1 << (bit % 8);
        }
        st.stats.bits_flipped += 1;
        true
    }

    /// Paths of the files that currently exist.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.state.lock().names.keys().cloned().collect();
        v.sort();
        v
    }
}

impl State {
    /// Counts an operation and decides its fate: Ok(generation check passed), or the
    /// error to return. `write_tear` is called when a cut lands on a write.
    fn begin(
        &mut self,
        kind: OpKind,
        generation: u64,
        mutating: bool,
    ) -> Result<Option<CutMode>, io::Error> {
        if self.dead || generation != self.generation {
            return Err(Fault::Eio.error());
        }
        let n = self.op_counts.entry(kind).or_insert(0);
        let nth = *n;
        *n += 1;
        if let Some(pos) = self
            .faults
            .iter()
            .position(|(k, at, _)| *k == kind && *at == nth)
        {
            let (_, _, fault) = self.faults.remove(pos);
            *self
                .stats
                .faults_injected
                .entry(format!("{kind:?}/{fault:?}"))
                .or_insert(0) += 1;
            return Err(fault.error());
        }
        if !mutating {
            return Ok(None);
        }
        let op = self.ops;
        self.ops += 1;
        match self.cut_at_op {
            Some((at, mode)) if at == op => {
                self.cut_at_op = None;
                Ok(Some(mode))
            }
            _ => Ok(None),
        }
    }

    /// Decides, at a power cut, the fate of each directory rename or removal not
    /// yet durable: kept (applied to `names`, the post-cut table) or undone
    /// (returned, so that the files the OS showed inside can be found again).
    fn settle_dir_ops(
        &mut self,
        mode: CutMode,
        names: &mut HashMap<PathBuf, usize>,
    ) -> Vec<PendingDirOp> {
        let mut undone = Vec::new();
        for op in std::mem::take(&mut self.pending_dir_ops) {
            if mode == CutMode::KeepAll || (mode == CutMode::Random && self.rng.gen_bool(0.3)) {
                op.apply(names);
            } else {
                self.stats.dir_ops_undone += 1;
                undone.push(op);
            }
        }
        undone
    }

    /// Where `p`, as the OS shows it now, is in the durable view (before the
    /// directory renames not yet durable).
    fn durable_path(&self, p: &Path) -> PathBuf {
        self.pending_dir_ops
            .iter()
            .rev()
            .fold(p.to_path_buf(), |p, op| op.undo_path(&p).unwrap_or(p))
    }

    /// Builds the post-cut state from the durable view and a choice of pending
    /// writes; `torn` is a write in flight at the moment of the cut.
    fn power_cut(&mut self, mode: CutMode, torn: Option<(usize, u64, Vec<u8>, bool)>) {
        self.stats.power_cuts += 1;
        if let Some((inode, offset, bytes, dsync)) = torn {
            self.tear_in_flight_write(inode, offset, &bytes, dsync);
        }
        let names = self.post_cut_names(mode);
        let inodes = std::mem::take(&mut self.inodes);
        self.inodes = inodes
            .into_iter()
            .map(|inode| self.post_cut_inode(inode, mode))
            .collect();
        self.names = names.clone();
        self.durable_names = names;
        self.generation += 1;
        self.dead = true;
        self.cut_at_op = None;
        self.faults.clear();
    }

    /// A write the power cut landed on: a prefix of its sectors made it.
    fn tear_in_flight_write(&mut self, inode: usize, offset: u64, bytes: &[u8], dsync: bool) {
        let sectors = bytes.len().div_ceil(SECTOR);
        let keep = self.rng.gen_range(0..=sectors);
        let cut = (keep * SECTOR).min(bytes.len());
        self.stats.writes_torn += 1;
        if dsync {
            write_into(
                &mut self.inodes[inode].durable,
                offset as usize,
                &bytes[..cut],
            );
        } else {
            self.inodes[inode].pending.push(PendingWrite {
                offset,
                bytes: bytes[..cut].to_vec(),
            });
        }
    }

    /// The name table after the cut: the durable one, the directory operations
    /// kept, and a choice of the entries no directory sync made durable.
    fn post_cut_names(&mut self, mode: CutMode) -> HashMap<PathBuf, usize> {
        let mut names = self.durable_names.clone();
        let undone = self.settle_dir_ops(mode, &mut names);
        // Entries not made durable by a directory sync: a created file may still
        // appear (the kernel wrote the directory block anyway) or vanish. A rename is
        // atomic: the file shows under its old name or its new one, never both.
        // A file inside an undone directory rename is looked at where it was.
        // Sorted, so that the seed alone decides (HashMap order varies per process).
        let mut unsynced: Vec<(PathBuf, usize)> = self
            .names
            .iter()
            .map(|(p, i)| {
                let before = undone
                    .iter()
                    .rev()
                    .fold(p.clone(), |p, op| op.undo_path(&p).unwrap_or(p));
                (before, *i)
            })
            .filter(|(p, i)| names.get(p) != Some(i))
            .collect();
        unsynced.sort();
        for (path, i) in unsynced {
            if mode == CutMode::KeepAll || (mode == CutMode::Random && self.rng.gen_bool(0.3)) {
                names.retain(|_, inode| *inode != i);
                names.insert(path, i);
            } else {
                self.stats.files_vanished += 1;
            }
        }
        self.restore_dirs(&undone, &names);
        names
    }

    /// Directories are modelled as durable once created; one that an undone
    /// rename or removal had put elsewhere is back where its files are.
    fn restore_dirs(&mut self, undone: &[PendingDirOp], names: &HashMap<PathBuf, usize>) {
        for op in undone.iter().rev() {
            if let PendingDirOp::Rename { from, to } = op {
                let moved: Vec<PathBuf> = self
                    .dirs
                    .iter()
                    .filter(|d| d.starts_with(to))
                    .cloned()
                    .collect();
                for d in moved {
                    self.dirs.remove(&d);
                    self.dirs.extend(rebase(&d, to, from));
                }
            }
        }
        for path in names.keys() {
            self.dirs
                .extend(path.ancestors().skip(1).map(Path::to_path_buf));
        }
    }

    /// A file's bytes after the cut: its durable bytes and, by `mode`, each of its
    /// pending writes dropped, kept, torn at a sector boundary or garbled.
    fn post_cut_inode(&mut self, inode: Inode, mode: CutMode) -> Inode {
        let mut content = inode.durable.clone();
        for w in inode.pending {
            let fate = match mode {
                CutMode::DropAll => 0,
                CutMode::KeepAll => 1,
                CutMode::Random => self.rng.gen_range(0..4),
            };
            match fate {
                0 => self.stats.pending_writes_dropped += 1,
                1 => {
                    self.stats.pending_writes_kept += 1;
                    write_into(&mut content, w.offset as usize, &w.bytes);
                }
                2 => {
                    self.stats.writes_torn += 1;
                    let sectors = w.bytes.len().div_ceil(SECTOR);
                    let keep = (self.rng.gen_range(0..=sectors) * SECTOR).min(w.bytes.len());
                    write_into(&mut content, w.offset as usize, &w.bytes[..keep]);
                }
                _ => {
                    self.stats.writes_garbled += 1;
                    let garbage: Vec<u8> = (0..w.bytes.len()).map(|_| self.rng.gen()).collect();
                    write_into(&mut content, w.offset as usize, &garbage);
                }
            }
        }
        let mut fresh = Inode::new().expect("anonymous memory for a simulated file");
        let _ = fresh.write_volatile(0, &content);
        fresh.len = content.len() as u64;
        fresh.durable = content;
        fresh
    }
}

struct SimVfs {
    disk: Arc<SimDisk>,
}

struct SimFile {
    disk: Arc<SimDisk>,
    inode: usize,
    generation: u64,
    dsync: bool,
}

struct SimMap {
    bytes: Arc<Bytes>,
    len: usize,
}

impl MappedRegion for SimMap {
    fn bytes(&self) -> &[u8] {
        // SAFETY: in bounds of the fixed-capacity mapping; see `Bytes`.
        unsafe { std::slice::from_raw_parts(self.bytes.ptr(), self.len) }
    }
}

impl SimFile {
    fn mutate(
        &self,
        kind: OpKind,
        f: impl FnOnce(&mut State, usize) -> io::Result<()>,
        write: Option<(u64, &[u8])>,
    ) -> io::Result<()> {
        let mut st = self.disk.state.lock();
        match st.begin(kind, self.generation, true)? {
            Some(mode) => {
                let torn = write.map(|(off, b)| (self.inode, off, b.to_vec(), self.dsync));
                st.power_cut(mode, torn);
                Err(Fault::Eio.error())
            }
            None => f(&mut st, self.inode),
        }
    }
}

impl VfsFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut st = self.disk.state.lock();
        st.begin(OpKind::Read, self.generation, false)?;
        let data = st.inodes[self.inode].volatile();
        let end = offset as usize + buf.len();
        if end > data.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the file",
            ));
        }
        buf.copy_from_slice(&data[offset as usize..end]);
        Ok(())
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let dsync = self.dsync;
        self.mutate(
            OpKind::Write,
            |st, i| {
                let inode = &mut st.inodes[i];
                inode.write_volatile(offset, buf)?;
                if dsync {
                    write_into(&mut inode.durable, offset as usize, buf);
                } else {
                    inode.pending.push(PendingWrite {
                        offset,
                        bytes: buf.to_vec(),
                    });
                }
                Ok(())
            },
            Some((offset, buf)),
        )
    }
    fn sync_data(&self) -> io::Result<()> {
        self.mutate(
            OpKind::Sync,
            |st, i| {
                st.inodes[i].sync();
                Ok(())
            },
            None,
        )
    }
    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        let st = self.disk.state.lock();
        if st.dead || st.generation != self.generation {
            return Err(Fault::Eio.error());
        }
        Ok(st.inodes[self.inode].len)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.mutate(
            OpKind::Allocate,
            |st, i| {
                let inode = &mut st.inodes[i];
                if len as usize > FILE_CAPACITY {
                    return Err(Fault::Enospc.error());
                }
                if len < inode.len {
                    // SAFETY: in bounds; zero the cut-off tail so a later extension reads zeros.
                    unsafe {
                        std::ptr::write_bytes(
                            inode.bytes.ptr().add(len as usize),
                            0,
                            (inode.len - len) as usize,
                        )
                    };
                }
                inode.len = len;
                // The new length is durable only after a sync.
                inode.pending.push(PendingWrite {
                    offset: len,
                    bytes: Vec::new(),
                });
                Ok(())
            },
            None,
        )
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.mutate(
            OpKind::Allocate,
            |st, i| {
                let inode = &mut st.inodes[i];
                let end = offset + len;
                if end as usize > FILE_CAPACITY {
                    return Err(Fault::Enospc.error());
                }
                inode.len = inode.len.max(end);
                Ok(())
            },
            None,
        )
    }
    fn map(&self, len: u64) -> io::Result<Box<dyn MappedRegion>> {
        let st = self.disk.state.lock();
        if st.dead || st.generation != self.generation {
            return Err(Fault::Eio.error());
        }
        Ok(Box::new(SimMap {
            bytes: st.inodes[self.inode].bytes.clone(),
            len: (len as usize).min(FILE_CAPACITY),
        }))
    }
}

struct SimLock {
    disk: Arc<SimDisk>,
    path: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.disk.state.lock().locks.remove(&self.path);
    }
}

impl SimVfs {
    fn namespace_op(&self, f: impl FnOnce(&mut State) -> io::Result<()>) -> io::Result<()> {
        let mut st = self.disk.state.lock();
        let generation = st.generation;
        match st.begin(OpKind::Write, generation, true)? {
            Some(mode) => {
                st.power_cut(mode, None);
                Err(Fault::Eio.error())
            }
            None => f(&mut st),
        }
    }
}

impl Vfs for SimVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        let mut st = self.disk.state.lock();
        if st.dead {
            return Err(Fault::Eio.error());
        }
        let inode = match st.names.get(path) {
            Some(&i) => i,
            None if mode.create => {
                drop(st);
                let mut created = None;
                self.namespace_op(|st| {
                    let i = st.inodes.len();
                    st.inodes.push(Inode::new()?);
                    st.names.insert(path.to_path_buf(), i);
                    created = Some(i);
                    Ok(())
                })?;
                st = self.disk.state.lock();
                created.expect("created")
            }
            None => return Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        Ok(Box::new(SimFile {
            disk: self.disk.clone(),
            inode,
            generation: st.generation,
            dsync: mode.dsync,
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.disk.state.lock();
        if st.dead {
            return Err(Fault::Eio.error());
        }
        // Directories are modelled as always durable.
        let mut p = Some(path);
        while let Some(d) = p {
            st.dirs.insert(d.to_path_buf());
            p = d.parent();
        }
        Ok(())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.disk.state.lock();
        let generation = st.generation;
        if let Some(mode) = st.begin(OpKind::Sync, generation, true)? {
            st.power_cut(mode, None);
            return Err(Fault::Eio.error());
        }
        // Directory renames and removals held by `dir` become durable, in order.
        let (durable_now, still_pending): (Vec<_>, Vec<_>) =
            std::mem::take(&mut st.pending_dir_ops)
                .into_iter()
                .partition(|op| op.holder() == Some(dir));
        st.pending_dir_ops = still_pending;
        for op in &durable_now {
            op.apply(&mut st.durable_names);
        }
        let durable_dir = st.durable_path(dir);
        st.durable_names
            .retain(|p, _| p.parent() != Some(durable_dir.as_path()));
        let entries: Vec<(PathBuf, usize)> = st
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, i)| (st.durable_path(p), *i))
            .collect();
        st.durable_names.extend(entries);
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.namespace_op(|st| {
            if st.dirs.contains(from) {
                if st.dirs.contains(to) || st.names.keys().any(|p| p.starts_with(to)) {
                    return Err(io::Error::from(io::ErrorKind::AlreadyExists));
                }
                move_under(&mut st.names, from, to);
                let moved: Vec<PathBuf> = st
                    .dirs
                    .iter()
                    .filter(|d| d.starts_with(from))
                    .cloned()
                    .collect();
                for d in moved {
                    st.dirs.remove(&d);
                    st.dirs.extend(rebase(&d, from, to));
                }
                st.pending_dir_ops.push(PendingDirOp::Rename {
                    from: from.to_path_buf(),
                    to: to.to_path_buf(),
                });
                return Ok(());
            }
            let i = st
                .names
                .remove(from)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
            st.names.insert(to.to_path_buf(), i);
            Ok(())
        })
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.namespace_op(|st| {
            st.names
                .remove(path)
                .map(|_| ())
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        })
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.namespace_op(|st| {
            if !st.dirs.contains(path) {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            }
            st.names.retain(|p, _| !p.starts_with(path));
            st.dirs.retain(|d| !d.starts_with(path));
            st.pending_dir_ops.push(PendingDirOp::Remove {
                path: path.to_path_buf(),
            });
            Ok(())
        })
    }
    fn exists(&self, path: &Path) -> bool {
        let st = self.disk.state.lock();
        st.names.contains_key(path) || st.dirs.contains(path)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        let st = self.disk.state.lock();
        if st.dead {
            return Err(Fault::Eio.error());
        }
        let mut out: Vec<(PathBuf, bool)> = st
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .map(|p| (p.clone(), false))
            .collect();
        out.extend(
            st.dirs
                .iter()
                .filter(|p| p.parent() == Some(dir))
                .map(|p| (p.clone(), true)),
        );
        out.sort();
        Ok(out)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        let mut st = self.disk.state.lock();
        if st.dead {
            return Err(Fault::Eio.error());
        }
        if !st.locks.insert(path.to_path_buf()) {
            return Err(io::Error::from_raw_os_error(libc::EWOULDBLOCK));
        }
        Ok(Box::new(SimLock {
            disk: self.disk.clone(),
            path: path.to_path_buf(),
        }))
    }
}

pub mod driver;
