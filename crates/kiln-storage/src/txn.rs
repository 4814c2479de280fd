//! Read and write transactions.

use crate::btree::cursor::Cursor;
use crate::btree::{self, PageSource};
use crate::env::Shared;
use crate::page::{self, PageNo, PageRun};
use crate::store::Pins;
use crate::{Error, Result};
use parking_lot::MutexGuard;
use std::cell::RefCell;
use std::path::Path;

/// The committed state a transaction starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub txn_id: u64,
    pub catalog_root: PageNo,
    pub page_count: u64,
}

/// A tree as recorded in the catalog: its root and its number of entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TreeInfo {
    pub root: PageNo,
    pub entries: u64,
}

impl TreeInfo {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.root.to_le_bytes());
        b[8..].copy_from_slice(&self.entries.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8], path: &Path, name: &[u8]) -> Result<Self> {
        if b.len() != 16 {
            return Err(Error::corrupted(
                path,
                "catalog",
                format!(
                    "entry for tree {:?} has {} bytes, expected 16",
                    String::from_utf8_lossy(name),
                    b.len()
                ),
            ));
        }
        Ok(TreeInfo {
            root: page::read_u64(b, 0),
            entries: page::read_u64(b, 8),
        })
    }
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
    let mut c = Cursor::new(src, catalog_root);
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

    fn tree(&self, name: &str) -> Result<TreeInfo> {
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

    /// Number of entries in a tree.
    pub fn tree_len(&self, name: &str) -> Result<u64> {
        Ok(self.tree(name)?.entries)
    }

    pub fn get(&self, tree: &str, key: &[u8]) -> Result<Option<&[u8]>> {
        let root = self.tree(tree)?.root;
        btree::get(self, root, key)
    }

    pub fn cursor(&self, tree: &str) -> Result<Cursor<'_>> {
        let root = self.tree(tree)?.root;
        Ok(Cursor::new(self, root))
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
    fn data_path(&self) -> &Path {
        &self.env.store.path
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
    pub(crate) env: &'env Shared,
    pub(crate) writer: Option<MutexGuard<'env, crate::env::WriterState>>,
    pub(crate) txn_id: u64,
    pub(crate) base: Snapshot,
    pub(crate) pins: Pins,
    /// Pages (and overflow runs, keyed by first page) written by this transaction.
    pub(crate) dirty: crate::fasthash::FastMap<PageNo, PageRun>,
    /// For dirty pages copied from a committed page: that page (the journal may
    /// record the difference instead of the whole page).
    pub(crate) sources: crate::fasthash::FastMap<PageNo, PageNo>,
    /// Committed pages this transaction made unreachable.
    pub(crate) freed_committed: Vec<PageNo>,
    /// Pages allocated and freed again within this transaction.
    pub(crate) local_free: Vec<PageNo>,
    /// Pages taken from the allocator's free list (returned on abort).
    pub(crate) taken_from_free: Vec<PageNo>,
    pub(crate) catalog_root: PageNo,
    pub(crate) trees: crate::fasthash::FastMap<String, TreeState>,
    pub(crate) dropped: Vec<String>,
    /// Open savepoint of the unit being run by the commit queue, if any.
    pub(crate) savepoint: Option<crate::savepoint::Savepoint>,
    /// Running total of bytes of pages created (see `dirty_bytes`).
    pub(crate) dirty_bytes_written: usize,
    /// Set when an operation failed half-way: the in-memory tree may be inconsistent,
    /// so the transaction can only be aborted.
    pub(crate) broken: Option<String>,
}

impl<'env> WriteTxn<'env> {
    pub fn txn_id(&self) -> u64 {
        self.txn_id
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    pub(crate) fn broken_reason(&self) -> String {
        self.broken.clone().unwrap_or_default()
    }

    pub(crate) fn base_txn_id(&self) -> u64 {
        self.base.txn_id
    }

    pub(crate) fn alloc(&mut self) -> &mut crate::alloc::Allocator {
        &mut self
            .writer
            .as_mut()
            .expect("writer guard held until commit/abort")
            .alloc
    }

    fn guard_usable(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::Poisoned(format!(
                "an earlier operation in this transaction failed: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Runs a mutation; if it fails, the transaction is marked unusable.
    pub(crate) fn mutate<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.guard_usable()?;
        let r = f(self);
        if let Err(e) = &r {
            self.broken = Some(e.to_string());
        }
        r
    }

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

    pub fn tree_exists(&mut self, name: &str) -> Result<bool> {
        match self.tree_state(name) {
            Ok(_) => Ok(true),
            Err(Error::TreeNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates an empty tree; an error if it exists.
    pub fn create_tree(&mut self, name: &str) -> Result<()> {
        check_tree_name(name)?;
        if self.tree_exists(name)? {
            return Err(Error::TreeExists(name.to_string()));
        }
        self.dropped.retain(|d| d != name);
        self.trees.insert(
            name.to_string(),
            TreeState {
                info: TreeInfo::default(),
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
        let st = self.tree_state(name)?;
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

    pub fn tree_len(&mut self, name: &str) -> Result<u64> {
        Ok(self.tree_state(name)?.info.entries)
    }

    pub fn get(&mut self, tree: &str, key: &[u8]) -> Result<Option<&[u8]>> {
        let root = self.tree_state(tree)?.info.root;
        btree::get(&*self, root, key)
    }

    pub fn cursor(&mut self, tree: &str) -> Result<Cursor<'_>> {
        let root = self.tree_state(tree)?.info.root;
        Ok(Cursor::new(&*self, root))
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
        let mut st = self.tree_state(tree)?;
        let (root, existed) = self.mutate(|t| t.tree_put(st.info.root, key, value))?;
        st.info.root = root;
        st.info.entries += u64::from(!existed);
        st.modified = true;
        self.trees.insert(tree.to_string(), st);
        Ok(())
    }

    /// Removes a key; false if it was absent.
    pub fn delete(&mut self, tree: &str, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        let mut st = self.tree_state(tree)?;
        if btree::get(&*self, st.info.root, key)?.is_none() {
            return Ok(false);
        }
        st.info.root = self.mutate(|t| t.tree_delete(st.info.root, key))?;
        st.info.entries -= 1;
        st.modified = true;
        self.trees.insert(tree.to_string(), st);
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
        if let Some(mut w) = self.writer.take() {
            for p in self.taken_from_free.drain(..) {
                w.alloc.free.insert(p);
            }
            w.alloc.page_count = self.base.page_count;
            self.env
                .counters
                .aborts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub(crate) fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
            || !self.freed_committed.is_empty()
            || !self.dropped.is_empty()
            || self.trees.values().any(|t| t.modified)
    }
}

impl PageSource for WriteTxn<'_> {
    fn page(&self, no: PageNo) -> Result<&[u8]> {
        if let Some(run) = self.dirty.get(&no) {
            return Ok(run.bytes());
        }
        self.env.store.page(no, &self.pins)
    }
    fn data_path(&self) -> &Path {
        &self.env.store.path
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        self.rollback();
    }
}
