//! Merging the write buffer's frozen generation into the trees, a slice per commit.
//!
//! A slice is the next keys of the frozen generation in key order, so the puts that
//! land in one leaf are applied to it together: the leaf is copied, journaled and
//! written back once for all of them. Re-applying a slice is harmless (each key gets
//! its newest buffered value again), so after a crash the merge simply starts over.
//!
//! A circle, on purpose: merging is a `WriteTxn` method (write_buffer -> txn), and
//! the transaction reads through the buffer's generations (txn -> write_buffer). A
//! slice is applied to the trees by the transaction being committed, with its
//! copy-on-write and savepoint bookkeeping, through the transaction's own methods
//! (`tree_state`, `tree_put`, `tree_delete`), not its fields.

use crate::btree;
use crate::fasthash::FastMap;
use crate::page::{self, prefetch};
use crate::txn::TreeState;
use crate::txn::WriteTxn;
use crate::write_buffer::{split_buffer_key, Generation, SlotRef, TreeId};
use crate::Result;
use std::sync::Arc;

/// A value larger than this goes to an overflow run, leaving a small reference in
/// the leaf: the read-ahead's guess of what a cell adds need not be closer.
const MAX_INLINE_GUESS: usize = 2048;

/// How many keys ahead of the one being merged the arena is prefetched.
const PREFETCH_AHEAD: usize = 8;

/// Whether a frozen key is looked up in the active generation before it is merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Superseded {
    /// Skipped if the active generation holds the key: a newer version waits there
    /// (or the key was written into the tree since, an in-tree version).
    Skip,
    /// Merged anyway; the caller has made sure the active generation holds no
    /// in-tree version. Merging a key the active generation holds is then only
    /// work done early: its newer version hides the tree's from every reader (and
    /// from counts), and its own merge later replaces it. The merge thread runs so,
    /// as the caller's puts would contend for the generation's lock with its
    /// lookups (they made W3 slower, not faster).
    Merge,
}

/// The trees with buffered entries, by id (a tree dropped has none).
pub(crate) type TreeNames = FastMap<TreeId, String>;

impl WriteTxn<'_> {
    /// Applies up to `limit` keys of the frozen generation after `*cursor` to the
    /// trees, and moves `*cursor` past them. True when the generation is done.
    pub(crate) fn merge_slice(
        &mut self,
        cursor: &mut Option<Box<[u8]>>,
        limit: usize,
    ) -> Result<bool> {
        let mut names = None;
        let (_, done) = self.merge_keys(cursor, limit, Superseded::Skip, &mut names)?;
        Ok(done)
    }

    /// `merge_slice`, returning how many keys it went past, under a rule for what
    /// supersedes a key, with the trees' names looked up once (`names`) for a
    /// caller that merges in many small steps.
    pub(crate) fn merge_keys(
        &mut self,
        cursor: &mut Option<Box<[u8]>>,
        limit: usize,
        rule: Superseded,
        names: &mut Option<TreeNames>,
    ) -> Result<(usize, bool)> {
        let Some(frozen) = self.base_gens().frozen.clone() else {
            return Ok((0, false));
        };
        // Borrowed from the frozen generation, which `frozen` keeps alive and nobody
        // writes to any more.
        let slice = frozen.newest_from(cursor.as_deref(), limit);
        let done = slice.len() < limit;
        if names.is_none() {
            *names = Some(self.trees_by_id()?);
        }
        let names = names.as_ref().expect("set above");
        let faults_before = self.read_ahead_slice(&slice, names)?;
        let superseded = match rule {
            Superseded::Skip => self
                .base_gens()
                .active
                .holds_each(slice.iter().map(|(k, _)| *k)),
            Superseded::Merge => vec![false; slice.len()],
        };
        // Keys come sorted by tree id first: one tree's state is looked up once per
        // run of its keys and stored back when the run ends, not per key.
        let mut current: Option<(TreeId, &str, TreeState)> = None;
        for (i, (&(bkey, slot), &superseded)) in slice.iter().zip(&superseded).enumerate() {
            // Keys and values sit in the arena in the order they were written, not
            // in key order: each one merged is a cache miss unless asked for early.
            if let Some((ahead_key, ahead_slot)) = slice.get(i + PREFETCH_AHEAD) {
                prefetch(ahead_key);
                if let SlotRef::Value(v) = ahead_slot {
                    prefetch(v);
                }
            }
            let (id, key) = split_buffer_key(bkey);
            if current.as_ref().is_none_or(|c| c.0 != id) {
                self.store_tree_run(current.take());
                // A dropped tree's entries die with it.
                let Some(name) = names.get(&id) else {
                    continue;
                };
                current = Some((id, name.as_str(), self.tree_state(name)?));
            }
            let Some((_, _, st)) = current.as_mut() else {
                continue;
            };
            if superseded {
                continue;
            }
            // SAFETY: `bkey` and the slot's value are borrowed from `frozen`
            // (`newest_from`), which is alive for the whole call.
            unsafe { self.merge_one(&frozen, st, bkey, key, &slot)? };
        }
        self.store_tree_run(current);
        self.store().read_ahead.note_batch(faults_before);
        *cursor = if done {
            None
        } else {
            slice.last().map(|(k, _)| Box::from(*k))
        };
        Ok((slice.len(), done))
    }

    /// Applies one frozen key to its tree: a value is put, a tombstone deletes
    /// (when the tree holds the key). The entry count is the tree's own: it moves
    /// with the merge.
    ///
    /// # Safety
    /// `bkey` and a `SlotRef::Value` must be borrowed from `frozen`.
    #[inline]
    unsafe fn merge_one(
        &mut self,
        frozen: &Arc<Generation>,
        st: &mut TreeState,
        bkey: &[u8],
        key: &[u8],
        slot: &SlotRef,
    ) -> Result<()> {
        match *slot {
            SlotRef::Value(v) => {
                // SAFETY: the caller's.
                unsafe { self.note_merged(frozen, bkey, v) };
                let root = st.info.root;
                let counted = st.info.counted;
                let (root, existed) = self.mutate(|t| t.tree_put(root, counted, key, v))?;
                st.info.root = root;
                st.info.entries += u64::from(!existed);
            }
            SlotRef::Tombstone => {
                if btree::get(&*self, st.info.root, key)?.is_none() {
                    return Ok(());
                }
                let root = st.info.root;
                st.info.root = self.mutate(|t| t.tree_delete(root, key))?;
                st.info.entries -= 1;
            }
            SlotRef::InTree => return Ok(()),
        }
        st.modified = true;
        Ok(())
    }

    /// While reads fault, asks for the slice's leaves ahead; returns the thread's
    /// major faults before the slice, for `FaultWindow::note_batch` after it.
    fn read_ahead_slice(&mut self, slice: &[(&[u8], SlotRef)], names: &TreeNames) -> Result<u64> {
        let faults_before = crate::prefetch::thread_major_faults();
        let read_ahead = &self.store().read_ahead;
        if read_ahead.is_open() {
            read_ahead.count_batch();
            self.leaves_ahead(slice, names)?;
        }
        Ok(faults_before)
    }

    /// Asks for the leaves the slice's keys land in, tree by tree (`prefetch.rs`).
    fn leaves_ahead(&mut self, slice: &[(&[u8], SlotRef)], names: &TreeNames) -> Result<()> {
        let mut rest = slice;
        while let Some(&(first, _)) = rest.first() {
            let (id, _) = split_buffer_key(first);
            let run = rest
                .iter()
                .position(|&(k, _)| split_buffer_key(k).0 != id)
                .unwrap_or(rest.len());
            let (keys, after) = rest.split_at(run);
            rest = after;
            let Some(name) = names.get(&id) else {
                continue;
            };
            let root = self.tree_state(name)?.info.root;
            let this = &*self;
            crate::prefetch::leaves_ahead(
                this,
                root,
                keys.iter().map(|(k, slot)| {
                    let key = split_buffer_key(k).1;
                    let adds = match slot {
                        SlotRef::Value(v) => {
                            page::LEAF_CELL_FIXED + key.len() + v.len().min(MAX_INLINE_GUESS)
                        }
                        _ => 0,
                    };
                    (key, adds)
                }),
                |no| this.is_dirty(no),
            )?;
        }
        Ok(())
    }

    /// Records the state a run of merged keys left its tree in, if they changed it.
    fn store_tree_run(&mut self, run: Option<(TreeId, &str, TreeState)>) {
        if let Some((_, name, st)) = run {
            if st.modified {
                self.set_tree_state(name, st);
            }
        }
    }

    fn trees_by_id(&mut self) -> Result<FastMap<TreeId, String>> {
        let mut names = FastMap::default();
        for name in self.tree_names()? {
            let id = self.tree_state(&name)?.info.id;
            if id != 0 {
                names.insert(id, name);
            }
        }
        Ok(names)
    }
}
