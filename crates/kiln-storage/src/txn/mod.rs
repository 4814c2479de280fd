//! Read and write transactions.
//!
//! `WriteTxn`'s fields are private to this module: `pages` (allocating, freeing and
//! copying pages), `savepoint` (rolling back one unit of a merged group) and `seal`
//! (what a commit takes from the transaction: `WriteTxn::seal` returns a
//! `SealedTxn`) are its children.

mod ahead;
mod pages;
mod relocate;
mod savepoint;
mod seal;

pub(crate) use ahead::{
    lend_next_or_release, lock_writer, run_merge_thread, JobSender as MergeJobSender,
    Lent as LentToMergeThread,
};

pub(crate) use seal::{Committed, SealedTxn};

use crate::btree::cursor::TreeCursor;
use crate::btree::{self, PageSource};
use crate::page::{self, PageNo, PageRun};
use crate::shared::{Shared, Snapshot, WriterState};
use crate::store::Pins;
use crate::write_buffer::Cursor;
use crate::write_buffer::{buffer_key, Found, Gens, SlotRef, Stored, TreeId};
use crate::{Error, Result};
use parking_lot::MutexGuard;
use std::cell::RefCell;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

/// A tree as recorded in the catalog: its root, its number of entries (buffered ones
/// included) and its id (which the write buffer keys its entries by).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TreeInfo {
    pub root: PageNo,
    pub entries: u64,
    /// Unique over the environment's life (a tree dropped and created again gets a
    /// new one), so buffered entries of a dropped tree can never resurface. 0: a tree
    /// from before ids existed, given one when it is next written.
    pub id: TreeId,
    /// The tree's branches keep their children's entry counts (`btree/count.rs`):
    /// chosen when the tree is created (`WriteTxn::create_counted_tree`).
    pub counted: bool,
}

/// Catalog entry flag: the tree is counted.
const TREE_FLAG_COUNTED: u64 = 1;

impl TreeInfo {
    /// 24 bytes (root, entries, id), as before counted trees; a counted tree's
    /// entry adds a flags word (32 bytes), which a build without counted trees
    /// refuses by its length ("expected 16 or 24") instead of misreading the tree.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(&self.root.to_le_bytes());
        b.extend_from_slice(&self.entries.to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        if self.counted {
            b.extend_from_slice(&TREE_FLAG_COUNTED.to_le_bytes());
        }
        b
    }
    pub fn decode(b: &[u8], path: &Path, name: &[u8]) -> Result<Self> {
        if !matches!(b.len(), 16 | 24 | 32) {
            return Err(Error::corrupted(
                path,
                "catalog",
                format!(
                    "entry for tree {:?} has {} bytes, expected 16, 24 or 32",
                    String::from_utf8_lossy(name),
                    b.len()
                ),
            ));
        }
        let flags = if b.len() == 32 {
            page::read_u64(b, 24)
        } else {
            0
        };
        if flags & !TREE_FLAG_COUNTED != 0 {
            return Err(Error::corrupted(
                path,
                "catalog",
                format!(
                    "entry for tree {:?} has unknown flags {flags:#x} (written by a newer build?)",
                    String::from_utf8_lossy(name),
                ),
            ));
        }
        Ok(TreeInfo {
            counted: flags & TREE_FLAG_COUNTED != 0,
            root: page::read_u64(b, 0),
            entries: page::read_u64(b, 8),
            id: if b.len() >= 24 {
                page::read_u64(b, 16)
            } else {
                0
            },
        })
    }
}

/// What the write buffer says, falling back to the tree.
fn get_through<'a, S: PageSource + ?Sized>(
    src: &'a S,
    gens: &'a Gens,
    info: &TreeInfo,
    key: &[u8],
    upto_txn: u64,
) -> Result<Option<&'a [u8]>> {
    match gens.lookup(info.id, key, upto_txn) {
        Found::Value(v) => Ok(Some(v)),
        Found::Deleted => Ok(None),
        Found::InTree => btree::get(src, info.root, key),
    }
}

/// The entries of a tree as a reader at `upto_txn` sees them: those of the tree
/// itself (`TreeInfo::entries`, exact) plus the write buffer's changes.
fn logical_len(src: &dyn PageSource, gens: &Gens, info: &TreeInfo, upto_txn: u64) -> Result<u64> {
    // The buffered keys come in ascending order: one cursor walks the tree with them.
    let mut tree = btree::cursor::TreeCursor::new(src, info.root);
    let change = gens.count_change(info.id, upto_txn, |key| tree.contains(key))?;
    let len = info.entries as i64 + change;
    if len < 0 {
        return Err(Error::corrupted(
            src.data_path(),
            format!("tree {}", info.id),
            format!(
                "the tree holds {} entries but its buffered deletions remove {}",
                info.entries, -change
            ),
        ));
    }
    Ok(len as u64)
}

/// The entries of a tree with a key inside (`lo`, `hi`) as a reader at `upto_txn`
/// sees them. A counted tree answers in two descents plus a tree lookup per
/// buffered key of the range (`Gens::count_change_in`); any other tree is walked.
fn range_len(
    src: &dyn PageSource,
    gens: &Gens,
    info: &TreeInfo,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    upto_txn: u64,
) -> Result<u64> {
    if !info.counted {
        let mut c = Cursor::new(TreeCursor::new(src, info.root), gens, info.id, upto_txn);
        let mut e = match lo {
            Bound::Unbounded => c.first()?,
            Bound::Included(k) => c.seek(k)?,
            Bound::Excluded(k) => match c.seek(k)? {
                Some((key, _)) if key == k => c.next()?,
                other => other,
            },
        };
        let mut n = 0;
        while let Some((key, _)) = e {
            let inside = match hi {
                Bound::Unbounded => true,
                Bound::Included(h) => key <= h,
                Bound::Excluded(h) => key < h,
            };
            if !inside {
                break;
            }
            n += 1;
            e = c.next()?;
        }
        return Ok(n);
    }
    let in_tree = btree::count::count_range(src, info.root, info.entries, lo, hi)?;
    let mut tree = btree::cursor::TreeCursor::new(src, info.root);
    let change = gens.count_change_in(info.id, lo, hi, upto_txn, |key| tree.contains(key))?;
    let len = in_tree as i64 + change;
    if len < 0 {
        return Err(Error::corrupted(
            src.data_path(),
            format!("tree {}", info.id),
            format!(
                "the tree holds {in_tree} entries in a range but its buffered deletions there remove {}",
                -change
            ),
        ));
    }
    Ok(len as u64)
}

pub const MAX_TREE_NAME: usize = 255;

pub(crate) fn check_tree_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_TREE_NAME {
        return Err(Error::InvalidTreeName {
            len: name.len(),
            max: MAX_TREE_NAME,
        });
    }
    Ok(())
}

pub(crate) fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if key.len() > page::MAX_KEY_SIZE {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            max: page::MAX_KEY_SIZE,
        });
    }
    Ok(())
}

fn lookup_tree(src: &dyn PageSource, catalog_root: PageNo, name: &str) -> Result<Option<TreeInfo>> {
    match btree::get(src, catalog_root, name.as_bytes())? {
        Some(v) => TreeInfo::decode(v, src.data_path(), name.as_bytes()).map(Some),
        None => Ok(None),
    }
}

fn list_trees(src: &dyn PageSource, catalog_root: PageNo) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut c = TreeCursor::new(src, catalog_root);
    let mut e = c.first()?;
    while let Some((k, _)) = e {
        names.push(String::from_utf8_lossy(k).into_owned());
        e = c.next()?;
    }
    Ok(names)
}

/// A consistent, read-only view of the last commit at the time it began. It never
/// changes while open and never blocks the writer. Values borrow from it.
pub struct ReadTxn<'env> {
    env: &'env Shared,
    snap: Snapshot,
    pins: Pins,
    trees: RefCell<crate::fasthash::FastMap<String, TreeInfo>>,
}

impl<'env> ReadTxn<'env> {
    pub(crate) fn new(env: &'env Shared, snap: Snapshot) -> Self {
        ReadTxn {
            env,
            snap,
            pins: Pins::default(),
            trees: RefCell::new(Default::default()),
        }
    }

    /// The id of the commit this snapshot shows.
    pub fn txn_id(&self) -> u64 {
        self.snap.txn_id
    }

    /// Bytes of decrypted pages this transaction holds (an encrypted environment's:
    /// every page a transaction reads stays readable until it ends).
    pub fn decrypted_bytes_held(&self) -> u64 {
        (self.pins.decrypted_pages() * crate::PAGE_SIZE) as u64
    }

    /// Lets go of the decrypted pages this transaction holds (those still in the
    /// environment's shared cache stay there), so that a long scan of an encrypted
    /// environment in one snapshot (a backup) holds a bounded amount: call it
    /// between batches, with no cursor open. `&mut self` proves no slice of a page is
    /// still borrowed. A no-op without encryption.
    pub fn release_decrypted(&mut self) {
        self.pins.release_decrypted();
    }

    /// The master key of an encrypted environment (its backups are sealed under it).
    pub(crate) fn master_key(&self) -> Option<&'env crate::MasterKey> {
        self.env.opts.encryption.as_ref()
    }

    pub(crate) fn tree(&self, name: &str) -> Result<TreeInfo> {
        if let Some(t) = self.trees.borrow().get(name) {
            return Ok(*t);
        }
        let info = lookup_tree(self, self.snap.catalog_root, name)?
            .ok_or_else(|| Error::TreeNotFound(name.to_string()))?;
        self.trees.borrow_mut().insert(name.to_string(), info);
        Ok(info)
    }

    pub fn tree_exists(&self, name: &str) -> Result<bool> {
        match self.tree(name) {
            Ok(_) => Ok(true),
            Err(Error::TreeNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn tree_names(&self) -> Result<Vec<String>> {
        list_trees(self, self.snap.catalog_root)
    }

    /// Number of entries in a tree. Costs a tree lookup per key of the tree that
    /// is in the write buffer (see `Gens::count_change`).
    pub fn tree_len(&self, name: &str) -> Result<u64> {
        let info = self.tree(name)?;
        logical_len(self, &self.snap.gens, &info, self.snap.txn_id)
    }

    /// Number of entries with a key inside (`lo`, `hi`). O(log n) on a counted tree
    /// (plus a tree lookup per buffered key in the range); a walk of the range on
    /// any other.
    pub fn count_range(&self, tree: &str, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<u64> {
        let info = self.tree(tree)?;
        range_len(self, &self.snap.gens, &info, lo, hi, self.snap.txn_id)
    }

    /// Whether the tree keeps counts (`WriteTxn::create_counted_tree`).
    pub fn tree_is_counted(&self, name: &str) -> Result<bool> {
        Ok(self.tree(name)?.counted)
    }

    pub fn get(&self, tree: &str, key: &[u8]) -> Result<Option<&[u8]>> {
        let info = self.tree(tree)?;
        get_through(self, &self.snap.gens, &info, key, self.snap.txn_id)
    }

    /// Asks the kernel for the leaves of `tree` that lookups of `keys` will read,
    /// all at once, when reads have been taking major faults lately
    /// (`Options::read_ahead`): a writer that is about to look up many keys past
    /// RAM calls this before taking its turn, so that the disk serves the reads
    /// together instead of one fault after another. Returns the pages asked for
    /// (0 in memory). Advisory: nothing is read into the transaction.
    pub fn read_ahead<'k>(
        &self,
        tree: &str,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<usize> {
        let window = &self.env.store.read_ahead;
        if !window.is_open() {
            return Ok(0);
        }
        window.count_batch();
        let root = self.tree(tree)?.root;
        crate::prefetch::leaves_ahead(self, root, keys.into_iter().map(|k| (k, 0)), |_| false)
    }

    pub fn cursor(&self, tree: &str) -> Result<Cursor<'_>> {
        let info = self.tree(tree)?;
        Ok(Cursor::new(
            TreeCursor::new(self, info.root),
            &self.snap.gens,
            info.id,
            self.snap.txn_id,
        ))
    }

    pub(crate) fn catalog_root(&self) -> PageNo {
        self.snap.catalog_root
    }
    pub(crate) fn page_count(&self) -> u64 {
        self.snap.page_count
    }
}

impl PageSource for ReadTxn<'_> {
    fn page(&self, no: PageNo) -> Result<&[u8]> {
        self.env.store.page(no, &self.pins)
    }
    fn bare_run(&self, no: PageNo, pages: u64) -> Result<&[u8]> {
        self.env.store.bare_run(no, pages, &self.pins)
    }
    fn data_path(&self) -> &Path {
        &self.env.store.path
    }
    fn prefetch(&self, runs: &[(PageNo, u64)]) {
        self.env.store.prefetch(runs)
    }
}

impl Drop for ReadTxn<'_> {
    fn drop(&mut self) {
        self.env.end_read(self.snap.txn_id);
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct TreeState {
    pub info: TreeInfo,
    pub modified: bool,
}

/// The single write transaction. Changes are invisible to others until `commit`
/// returns, which happens only once the journal record is durable. Dropping it
/// without committing aborts.
pub struct WriteTxn<'env> {
    env: &'env Shared,
    writer: Option<MutexGuard<'env, WriterState>>,
    txn_id: u64,
    base: Snapshot,
    pins: Pins,
    /// Pages (and overflow runs, keyed by first page) written by this transaction.
    dirty: crate::fasthash::FastMap<PageNo, PageRun>,
    /// For dirty pages copied from a committed page: that page (the journal may
    /// record the difference instead of the whole page).
    sources: crate::fasthash::FastMap<PageNo, PageNo>,
    /// Committed pages this transaction made unreachable.
    freed_committed: Vec<PageNo>,
    /// Pages allocated and freed again within this transaction.
    local_free: Vec<PageNo>,
    /// Pages taken from the allocator's free list (returned on abort).
    taken_from_free: Vec<PageNo>,
    catalog_root: PageNo,
    trees: crate::fasthash::FastMap<String, TreeState>,
    dropped: Vec<String>,
    /// Open savepoint of the unit being run by the commit queue, if any.
    savepoint: Option<savepoint::Savepoint>,
    /// Running total of bytes of pages created (see `dirty_bytes`).
    dirty_bytes_written: usize,
    /// Every buffer write of this transaction: where its entry starts in `logical`,
    /// and the version it replaced (its own earlier one), so that an abort or a
    /// savepoint can take it back. One per entry of `logical`.
    undo: Vec<(usize, Option<Stored>)>,
    /// The buffer writes in their journal form (the record copies them at commit).
    logical: crate::journal::record::LogicalLog,
    /// Values merged from the frozen generation by this transaction, which its
    /// record may name instead of carrying (`MergedValues`).
    merged_values: crate::write_buffer::MergedValues,
    /// Per tree id, the largest key in the tree itself as this transaction last saw
    /// it (`None`: empty), found once per transaction (see `buffers`).
    tree_last_key: crate::fasthash::FastMap<TreeId, Option<Vec<u8>>>,
    /// Trees given an id by this transaction (ids are txn id << 20 | this).
    trees_named: u64,
    /// Merge the whole write buffer into the trees, a slice per commit (close, check).
    force_merge: bool,
    /// Set when an operation failed half-way (to its error): the in-memory tree may be
    /// inconsistent, so the transaction can only be aborted.
    broken: Option<Arc<Error>>,
    /// While the merge thread works on this transaction's trees (`ahead.rs`): the
    /// fields above that hold tree state (pages, allocator, writer lock) are lent to
    /// it, and any use of them first takes them back (`join_ahead`).
    ahead: Option<ahead::Lent>,
    /// What the merge thread did for this transaction, once taken back.
    merged_ahead: Option<ahead::Merged>,
    /// Whether its commit lends the next transaction to the merge thread (begun by
    /// `begin`, not by the commit queue, and not merging everything at close).
    lends_next: bool,
}

impl<'env> WriteTxn<'env> {
    /// Starts the write transaction, waiting while another one is open. It is
    /// built on the latest commit (which may still be waiting for its journal
    /// write) and holds the writer lock until it commits or aborts.
    pub(crate) fn begin(env: &'env Shared) -> Result<Self> {
        Self::start(env, true)
    }

    /// As `begin`, but the trees are never lent to the merge thread: the commit queue
    /// opens a savepoint per unit at once, which would take them straight back.
    pub(crate) fn begin_for_queue(env: &'env Shared) -> Result<Self> {
        Self::start(env, false)
    }

    fn start(env: &'env Shared, may_merge_ahead: bool) -> Result<Self> {
        if let Some(why) = env.poison_reason() {
            return Err(Error::Poisoned(why));
        }
        let mut txn = match ahead::acquire_writer(env) {
            ahead::Acquired::Writer(mut w) => {
                Self::make_writer_ready(env, &mut w);
                let base = w.latest.clone();
                WriteTxn::with_state(env, Some(w), base)
            }
            ahead::Acquired::Lent(lent) => WriteTxn::adopt(env, lent),
        };
        if !may_merge_ahead {
            // The commit queue opens a savepoint per unit at once.
            txn.join_ahead();
            if let Some(why) = txn.broken.clone() {
                return Err(Error::TransactionBroken(why));
            }
        }
        txn.lends_next = may_merge_ahead;
        Ok(txn)
    }

    /// Before a transaction starts on the writer: pages freed by commits no reader
    /// can see any more become reusable.
    fn make_writer_ready(env: &Shared, w: &mut WriterState) {
        let horizon = env
            .readers
            .oldest_reader()
            .min(env.synced_txn_id.load(std::sync::atomic::Ordering::SeqCst));
        let store = &env.store;
        w.alloc.release(horizon, |pages| store.forget(pages));
        env.note_alloc(&w.alloc);
    }

    /// A transaction on `base` that has written nothing yet.
    fn with_state(
        env: &'env Shared,
        writer: Option<MutexGuard<'env, WriterState>>,
        base: Snapshot,
    ) -> Self {
        WriteTxn {
            env,
            txn_id: base.txn_id + 1,
            catalog_root: base.catalog_root,
            writer,
            base,
            pins: Default::default(),
            dirty: Default::default(),
            sources: Default::default(),
            freed_committed: Vec::new(),
            local_free: Vec::new(),
            taken_from_free: Vec::new(),
            undo: Vec::new(),
            logical: Default::default(),
            merged_values: Default::default(),
            tree_last_key: Default::default(),
            trees_named: 0,
            force_merge: false,
            trees: Default::default(),
            dropped: Vec::new(),
            broken: None,
            savepoint: None,
            dirty_bytes_written: 0,
            ahead: None,
            merged_ahead: None,
            lends_next: false,
        }
    }

    pub fn txn_id(&self) -> u64 {
        self.txn_id
    }

    /// The failure that broke the transaction, if one did.
    pub(crate) fn broken_cause(&self) -> Option<Arc<Error>> {
        self.broken.clone()
    }

    pub(crate) fn base_txn_id(&self) -> u64 {
        self.base.txn_id
    }

    pub(crate) fn alloc(&mut self) -> &mut crate::alloc::Allocator {
        self.join_ahead();
        &mut self
            .writer
            .as_mut()
            .expect("writer guard held until commit/abort")
            .alloc
    }

    fn guard_usable(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::TransactionBroken(why.clone())),
            None => Ok(()),
        }
    }

    /// Runs a mutation; if it fails, the transaction is marked unusable. Its error
    /// goes to the caller, and a copy stays as the cause every later operation reports
    /// (`Error::copy` says why it is a copy).
    pub(crate) fn mutate<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.join_ahead();
        self.guard_usable()?;
        let r = f(self);
        if let (Err(e), None) = (&r, &self.broken) {
            self.broken = Some(Arc::new(e.copy()));
        }
        r
    }

    /// Records a tree's new state (its root, entry count, or id changed).
    pub(crate) fn set_tree_state(&mut self, name: &str, st: TreeState) {
        self.join_ahead();
        // Called per put: an existing entry is updated in place, without
        // allocating its name again.
        match self.trees.get_mut(name) {
            Some(t) => *t = st,
            None => {
                self.trees.insert(name.to_string(), st);
            }
        }
    }

    /// The page store this transaction reads and writes.
    pub(crate) fn store(&self) -> &crate::store::PageStore {
        &self.env.store
    }

    /// A tree's state as this transaction sees it. While the trees are lent to the
    /// merge thread that is the base's: good for reading, not for writing, which
    /// goes through `tree_state_for_write`.
    pub(crate) fn tree_state(&mut self, name: &str) -> Result<TreeState> {
        if let Some(t) = self.trees.get(name) {
            return Ok(*t);
        }
        if self.dropped.iter().any(|d| d == name) {
            return Err(Error::TreeNotFound(name.to_string()));
        }
        let info = lookup_tree(self, self.catalog_root, name)?
            .ok_or_else(|| Error::TreeNotFound(name.to_string()))?;
        let st = TreeState {
            info,
            modified: false,
        };
        self.trees.insert(name.to_string(), st);
        Ok(st)
    }

    /// A tree's state to write to: the trees taken back from the merge thread first,
    /// so that its root is the newest.
    pub(crate) fn tree_state_for_write(&mut self, name: &str) -> Result<TreeState> {
        self.join_ahead();
        self.tree_state(name)
    }

    pub fn tree_exists(&mut self, name: &str) -> Result<bool> {
        match self.tree_state(name) {
            Ok(_) => Ok(true),
            Err(Error::TreeNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates an empty tree; an error if it exists.
    pub fn create_tree(&mut self, name: &str) -> Result<()> {
        self.create_tree_counted(name, false)
    }

    /// Creates an empty counted tree: its branches keep their children's entry
    /// counts, so `count_range` takes O(log n) whatever the range; each write
    /// rewrites the counts on its path (which copy-on-write copies anyway).
    pub fn create_counted_tree(&mut self, name: &str) -> Result<()> {
        self.create_tree_counted(name, true)
    }

    /// Creates the counted tree unless a tree of that name exists (counted or not).
    pub fn ensure_counted_tree(&mut self, name: &str) -> Result<()> {
        if self.tree_exists(name)? {
            return Ok(());
        }
        self.create_counted_tree(name)
    }

    fn create_tree_counted(&mut self, name: &str, counted: bool) -> Result<()> {
        check_tree_name(name)?;
        self.join_ahead();
        if self.tree_exists(name)? {
            return Err(Error::TreeExists(name.to_string()));
        }
        self.dropped.retain(|d| d != name);
        let id = self.new_tree_id();
        self.trees.insert(
            name.to_string(),
            TreeState {
                info: TreeInfo {
                    id,
                    counted,
                    ..TreeInfo::default()
                },
                modified: true,
            },
        );
        Ok(())
    }

    /// Creates the tree unless it exists.
    pub fn ensure_tree(&mut self, name: &str) -> Result<()> {
        if self.tree_exists(name)? {
            return Ok(());
        }
        self.create_tree(name)
    }

    /// Deletes a tree and all its entries; false if it did not exist.
    pub fn drop_tree(&mut self, name: &str) -> Result<bool> {
        if !self.tree_exists(name)? {
            return Ok(false);
        }
        let st = self.tree_state_for_write(name)?;
        self.mutate(|t| t.free_tree(st.info.root))?;
        self.trees.remove(name);
        self.dropped.push(name.to_string());
        Ok(true)
    }

    pub fn tree_names(&self) -> Result<Vec<String>> {
        let mut names = list_trees(self, self.catalog_root)?;
        names.retain(|n| !self.dropped.contains(n));
        for n in self.trees.keys() {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Number of entries in a tree (see `ReadTxn::tree_len`).
    pub fn tree_len(&mut self, name: &str) -> Result<u64> {
        let info = self.tree_state(name)?.info;
        logical_len(&*self, &self.base.gens, &info, self.txn_id)
    }

    /// `ReadTxn::count_range`, seeing this transaction's own writes.
    pub fn count_range(&mut self, tree: &str, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<u64> {
        let info = self.tree_state(tree)?.info;
        range_len(&*self, &self.base.gens, &info, lo, hi, self.txn_id)
    }

    /// Whether the tree keeps counts.
    pub fn tree_is_counted(&mut self, name: &str) -> Result<bool> {
        Ok(self.tree_state(name)?.info.counted)
    }

    pub fn get(&mut self, tree: &str, key: &[u8]) -> Result<Option<&[u8]>> {
        let info = self.tree_state(tree)?.info;
        get_through(&*self, &self.base.gens, &info, key, self.txn_id)
    }

    pub fn cursor(&mut self, tree: &str) -> Result<Cursor<'_>> {
        let info = self.tree_state(tree)?.info;
        Ok(Cursor::new(
            TreeCursor::new(&*self, info.root),
            &self.base.gens,
            info.id,
            self.txn_id,
        ))
    }

    fn new_tree_id(&mut self) -> TreeId {
        assert!(
            self.trees_named < 1 << 20,
            "more than 2^20 trees created in one transaction"
        );
        self.trees_named += 1;
        (self.txn_id << 20) | self.trees_named
    }

    /// Whether a put goes to the write buffer (else into the tree): a small entry
    /// that does not extend the tree past its last key. Appends go into the tree:
    /// they land in the rightmost leaf, already copied and in cache after the first,
    /// so the tree takes them at about half the CPU and journal bytes the buffer
    /// would (W2, sequential keys: 1.38M puts/s into the tree, 0.63M through the
    /// buffer). A put anywhere else would copy a cold leaf, which is what the buffer
    /// saves.
    fn buffers(&mut self, st: &TreeState, key: &[u8], value: &[u8]) -> Result<bool> {
        if self.env.opts.write_buffer_bytes == 0
            || key.len() + value.len() > self.env.opts.write_buffer_max_entry_bytes
        {
            return Ok(false);
        }
        if let Some(last) = self.tree_last_key.get(&st.info.id) {
            return Ok(last.as_deref().is_some_and(|last| key <= last));
        }
        let last = btree::cursor::TreeCursor::new(&*self, st.info.root)
            .last()?
            .map(|(k, _)| k.to_vec());
        let buffered = last.as_deref().is_some_and(|last| key <= last);
        self.tree_last_key.insert(st.info.id, last);
        Ok(buffered)
    }

    /// Journals a buffer write of `slot` for `key` of tree `tree` and writes it into
    /// the active generation.
    fn buffer_write(&mut self, tree: TreeId, key: &[u8], slot: SlotRef<'_>) {
        let at = self.logical.push(tree, key, slot);
        let previous = self
            .base
            .gens
            .active
            .write(self.logical.buffer_key(at), self.txn_id, slot);
        self.undo.push((at, previous));
    }

    /// Takes back the buffer writes made after the first `keep`.
    pub(crate) fn undo_buffer_writes(&mut self, keep: usize) {
        while self.undo.len() > keep {
            let (at, previous) = self.undo.pop().expect("checked");
            self.base
                .gens
                .active
                .undo(self.logical.buffer_key(at), self.txn_id, previous);
            self.logical.truncate(at, self.undo.len());
        }
    }

    /// The tree's state, with an id if it had none (a tree from an older format).
    fn tree_state_with_id(&mut self, tree: &str) -> Result<TreeState> {
        let mut st = self.tree_state(tree)?;
        if st.info.id == 0 {
            st = self.tree_state_for_write(tree)?;
            st.info.id = self.new_tree_id();
            st.modified = true;
            self.trees.insert(tree.to_string(), st);
        }
        Ok(st)
    }

    /// Whether `key` exists for this transaction; `bkey` is its buffer key.
    fn exists(&self, info: &TreeInfo, bkey: &[u8], key: &[u8]) -> Result<bool> {
        match self.base.gens.lookup_bkey(bkey, self.txn_id) {
            Found::Value(_) => Ok(true),
            Found::Deleted => Ok(false),
            Found::InTree => Ok(btree::get(self, info.root, key)?.is_some()),
        }
    }

    /// Inserts or replaces a value.
    pub fn put(&mut self, tree: &str, key: &[u8], value: &[u8]) -> Result<()> {
        check_key(key)?;
        if value.len() > page::MAX_VALUE_SIZE {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: page::MAX_VALUE_SIZE,
            });
        }
        self.guard_usable()?;
        let st = self.tree_state_with_id(tree)?;
        if self.buffers(&st, key, value)? {
            // No look at the tree: a tree's entry count is that of the tree itself,
            // and `tree_len` adds what the buffer changes (see there).
            self.buffer_write(st.info.id, key, SlotRef::Value(value));
            return Ok(());
        }
        // Written into the tree: its root must be the newest.
        let mut st = self.tree_state_for_write(tree)?;
        // Older buffered versions must stop hiding it.
        let buffered =
            !self.base.gens.is_empty() && self.base.gens.holds(&buffer_key(st.info.id, key));
        let (root, existed) =
            self.mutate(|t| t.tree_put(st.info.root, st.info.counted, key, value))?;
        st.info.root = root;
        st.info.entries += u64::from(!existed);
        st.modified = true;
        self.set_tree_state(tree, st);
        // Appends move the last key on with every put: its buffer is reused (a new
        // allocation per put was a tenth of W2's CPU with the copy and free).
        match self.tree_last_key.get_mut(&st.info.id) {
            Some(Some(last)) if key > last.as_slice() => {
                last.clear();
                last.extend_from_slice(key);
            }
            Some(last @ None) => *last = Some(key.to_vec()),
            _ => {}
        }
        if buffered {
            self.buffer_write(st.info.id, key, SlotRef::InTree);
        }
        Ok(())
    }

    /// Removes a key; false if it was absent.
    pub fn delete(&mut self, tree: &str, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        self.guard_usable()?;
        let st = self.tree_state_with_id(tree)?;
        let bkey = buffer_key(st.info.id, key);
        if !self.exists(&st.info, &bkey, key)? {
            return Ok(false);
        }
        if self.env.opts.write_buffer_bytes > 0 {
            self.buffer_write(st.info.id, key, SlotRef::Tombstone);
            return Ok(true);
        }
        let mut st = self.tree_state_for_write(tree)?;
        if btree::get(&*self, st.info.root, key)?.is_some() {
            st.info.root = self.mutate(|t| t.tree_delete(st.info.root, key))?;
            st.info.entries -= 1;
            st.modified = true;
            self.set_tree_state(tree, st);
        }
        if self.base.gens.holds(&bkey) {
            self.buffer_write(st.info.id, key, SlotRef::Tombstone);
        }
        Ok(true)
    }

    /// Makes the transaction durable and visible. Returns its id (or the id of the
    /// last commit if nothing changed: an empty transaction writes nothing).
    pub fn commit(mut self) -> Result<u64> {
        self.guard_usable()?;
        let env = self.env;
        env.commit(&mut self)
    }

    /// Discards all changes.
    pub fn abort(mut self) {
        self.rollback();
    }

    pub(crate) fn rollback(&mut self) {
        if self.roll_back_state() {
            self.env
                .counters
                .aborts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Takes back everything the transaction did and releases the writer lock; false
    /// if it no longer held it (committed, or rolled back already).
    fn roll_back_state(&mut self) -> bool {
        self.join_ahead();
        if self.writer.is_none() {
            return false;
        }
        self.undo_buffer_writes(0);
        let mut w = self.writer.take().expect("checked above");
        w.alloc.put_free(self.taken_from_free.drain(..));
        w.alloc.page_count = self.base.page_count;
        true
    }

    /// Drops a transaction adopted only to release the writer lock, or a tree side
    /// that cannot be handed on (not an abort).
    fn discard(mut self) {
        self.roll_back_state();
    }

    /// Whether committing it lends the next transaction to the merge thread.
    pub(crate) fn lends_next(&self) -> bool {
        self.lends_next
    }

    /// Whether committing would change anything. While the trees are lent, the tree
    /// state here is untouched, so this is whether the caller changed anything.
    pub(crate) fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
            || !self.freed_committed.is_empty()
            || !self.dropped.is_empty()
            || self.trees.values().any(|t| t.modified)
            || !self.undo.is_empty()
            || (self.force_merge && !self.base.gens.is_empty())
    }
}

impl PageSource for WriteTxn<'_> {
    fn page(&self, no: PageNo) -> Result<&[u8]> {
        if let Some(run) = self.dirty.get(&no) {
            if run.is_bare() {
                return Err(crate::store::bare_run_read_as_page(
                    &self.env.store.path,
                    no,
                ));
            }
            return Ok(run.bytes());
        }
        self.env.store.page(no, &self.pins)
    }
    fn bare_run(&self, no: PageNo, pages: u64) -> Result<&[u8]> {
        if let Some(run) = self.dirty.get(&no) {
            return Ok(run.bytes());
        }
        self.env.store.bare_run(no, pages, &self.pins)
    }
    fn data_path(&self) -> &Path {
        &self.env.store.path
    }
    fn prefetch(&self, runs: &[(PageNo, u64)]) {
        self.env.store.prefetch(runs)
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        self.rollback();
    }
}

#[cfg(test)]
mod tests {
    use crate::btree::PageSource;
    use crate::{Env, Error, ErrorKind, Options};
    use std::error::Error as _;

    fn no_space() -> Error {
        Error::io(
            "/elsewhere/data.kiln",
            Some(8192),
            "read page",
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        )
    }

    /// An operation that fails half-way gives its caller its error as it was, and
    /// every later operation of the transaction fails with `TransactionBroken`, whose
    /// source is that error (its kind too), not its text.
    #[test]
    fn a_broken_transaction_keeps_the_failure_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::open(dir.path(), Options::default()).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        match w.mutate(|_| Err::<(), _>(no_space())) {
            Err(Error::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::ENOSPC)),
            other => panic!("{other:?}"),
        }
        let later = w.put("t", b"k", b"v").unwrap_err();
        let Error::TransactionBroken(cause) = &later else {
            panic!("{later}")
        };
        assert!(matches!(&**cause, Error::Io { .. }), "{cause}");
        assert_eq!(later.kind(), ErrorKind::DiskFull);
        assert_eq!(later.source().unwrap().to_string(), no_space().to_string());
        assert!(
            later.to_string().contains("/elsewhere/data.kiln"),
            "{later}"
        );
        assert!(matches!(w.commit(), Err(Error::TransactionBroken(_))));
        // A unit of work that goes on after such a failure is rolled back and told why,
        // with the failure as the source of its error.
        let e = env
            .submit(|w| {
                w.ensure_tree("t")?;
                let _ = w.mutate(|_| Err::<(), _>(no_space()));
                Ok(())
            })
            .unwrap_err();
        let Error::UnitFailed(why) = &e else {
            panic!("{e}")
        };
        assert!(
            why.to_string()
                .starts_with("an operation of this unit failed and the unit went on: I/O error on /elsewhere/data.kiln"),
            "{why}"
        );
        let cause = why
            .source()
            .and_then(|s| s.downcast_ref::<std::sync::Arc<Error>>());
        assert!(
            matches!(cause.map(|c| &**c), Some(Error::Io { .. })),
            "{why}"
        );
        assert!(env.failure().is_none(), "nothing latched");
        env.submit(|w| {
            w.ensure_tree("t")?;
            w.put("t", b"k", b"v")
        })
        .unwrap();
    }

    /// Only a damaged pointer asks for a page where a bare run starts; the run's value
    /// bytes could pass for a node's header, so the page read must refuse it, whether
    /// the run is still the writer's, waiting for write-back, or in the data file.
    #[test]
    fn a_bare_run_is_never_read_as_a_page() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::open(dir.path(), Options::default()).unwrap();
        // Byte 4 of the value is 2, a leaf's kind: the value looks like a leaf header.
        let value = vec![2u8; 20_000];
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        w.put("t", b"k", &value).unwrap();
        let start = *w
            .dirty
            .iter()
            .find(|(_, run)| run.is_bare())
            .map(|(no, _)| no)
            .unwrap();
        let refused = |r: crate::Result<&[u8]>| matches!(r, Err(Error::Corrupted { .. }));
        assert!(refused(PageSource::page(&w, start)), "the writer's own run");
        w.commit().unwrap();
        let r = env.begin_read().unwrap();
        assert!(refused(PageSource::page(&r, start)), "after the commit");
        drop(r);
        env.sync().unwrap();
        let r = env.begin_read().unwrap();
        assert!(refused(PageSource::page(&r, start)), "from the data file");
        assert_eq!(r.get("t", b"k").unwrap(), Some(&value[..]));
    }
}
