//! The public cursor: a tree's entries merged with the write buffer's versions of
//! them (buffered values win, tombstones hide tree entries), both directions.

use crate::btree::cursor::{Entry, TreeCursor};
use crate::write_buffer::{Found, Gens, TreeId};
use crate::Result;

/// A position in a tree. Entries returned borrow from the transaction.
pub struct Cursor<'t> {
    tree: TreeCursor<'t>,
    /// `None` when the snapshot has nothing buffered: the tree cursor alone answers.
    buffer: Option<BufferView<'t>>,
    pos: Pos<'t>,
    /// Where the tree cursor stands, so that a run of steps in one direction moves
    /// it one entry at a time instead of seeking for every step.
    tree_at: TreeAt<'t>,
}

struct BufferView<'t> {
    gens: &'t Gens,
    tree: TreeId,
    upto_txn: u64,
}

#[derive(Clone, Copy)]
enum Pos<'t> {
    /// Not yet positioned: `next` starts at the first entry, `prev` at the last.
    Fresh,
    On(&'t [u8]),
    /// Ran off the end: `next` stays there, `prev` returns the last entry.
    AfterEnd,
    /// Ran off the start: `prev` stays there, `next` returns the first entry.
    BeforeStart,
}

#[derive(Clone, Copy)]
enum TreeAt<'t> {
    Unknown,
    /// On this entry, the nearest one in direction `forward` from the last position.
    On(Entry<'t>, bool),
    /// No tree entry left in direction `forward`.
    Exhausted(bool),
}

impl<'t> Cursor<'t> {
    pub(crate) fn new(tree: TreeCursor<'t>, gens: &'t Gens, id: TreeId, upto_txn: u64) -> Self {
        let buffer = (!gens.is_empty()).then_some(BufferView {
            gens,
            tree: id,
            upto_txn,
        });
        Cursor {
            tree,
            buffer,
            pos: Pos::Fresh,
            tree_at: TreeAt::Unknown,
        }
    }

    pub fn first(&mut self) -> Result<Option<Entry<'t>>> {
        self.tree_at = TreeAt::Unknown;
        self.find(None, true, true)
    }

    pub fn last(&mut self) -> Result<Option<Entry<'t>>> {
        self.tree_at = TreeAt::Unknown;
        self.find(None, true, false)
    }

    /// Positions at the smallest key >= `key`.
    pub fn seek(&mut self, key: &[u8]) -> Result<Option<Entry<'t>>> {
        self.tree_at = TreeAt::Unknown;
        self.find(Some(key), true, true)
    }

    /// Positions at the largest key <= `key`.
    pub fn seek_for_prev(&mut self, key: &[u8]) -> Result<Option<Entry<'t>>> {
        self.tree_at = TreeAt::Unknown;
        self.find(Some(key), true, false)
    }

    /// Moves to the next entry.
    // A step of a two-way cursor (beside `prev`, `seek`, `first`, `last`), fallible,
    // that can turn back after running off either end: not an `Iterator`.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Entry<'t>>> {
        match self.pos {
            Pos::Fresh | Pos::BeforeStart => self.first(),
            Pos::AfterEnd => Ok(None),
            Pos::On(k) => self.find(Some(k), false, true),
        }
    }

    /// Moves to the previous entry.
    pub fn prev(&mut self) -> Result<Option<Entry<'t>>> {
        match self.pos {
            Pos::Fresh | Pos::AfterEnd => self.last(),
            Pos::BeforeStart => Ok(None),
            Pos::On(k) => self.find(Some(k), false, false),
        }
    }

    /// The nearest visible entry from `from` in a direction, and positions there.
    fn find(
        &mut self,
        from: Option<&[u8]>,
        inclusive: bool,
        forward: bool,
    ) -> Result<Option<Entry<'t>>> {
        let found = match &self.buffer {
            None => self.tree_only(from, inclusive, forward)?,
            Some(_) => self.merged(from, inclusive, forward)?,
        };
        self.pos = match found {
            Some((k, _)) => Pos::On(k),
            None if forward => Pos::AfterEnd,
            None => Pos::BeforeStart,
        };
        Ok(found)
    }

    fn tree_only(
        &mut self,
        from: Option<&[u8]>,
        inclusive: bool,
        forward: bool,
    ) -> Result<Option<Entry<'t>>> {
        match (from, inclusive) {
            // A step from the current entry: the tree cursor is on it.
            (Some(_), false) => self.tree_step(forward),
            _ => self.tree_seek(from, forward),
        }
    }

    fn tree_step(&mut self, forward: bool) -> Result<Option<Entry<'t>>> {
        if forward {
            self.tree.next()
        } else {
            self.tree.prev()
        }
    }

    /// The tree's nearest entry at or beyond `from` (the first or last without it).
    fn tree_seek(&mut self, from: Option<&[u8]>, forward: bool) -> Result<Option<Entry<'t>>> {
        match (from, forward) {
            (None, true) => self.tree.first(),
            (None, false) => self.tree.last(),
            (Some(k), true) => self.tree.seek(k),
            (Some(k), false) => self.tree.seek_for_prev(k),
        }
    }

    /// The tree's nearest entry from `from` (see `find`), reusing the tree cursor's
    /// position when the last step went the same way.
    fn tree_candidate(
        &mut self,
        from: Option<&[u8]>,
        inclusive: bool,
        forward: bool,
    ) -> Result<Option<Entry<'t>>> {
        let beyond = |k: &[u8], from: &[u8]| {
            if forward {
                k > from || (inclusive && k == from)
            } else {
                k < from || (inclusive && k == from)
            }
        };
        let reused = match (self.tree_at, from) {
            (TreeAt::Exhausted(dir), Some(_)) if dir == forward => Some(None),
            (TreeAt::On(e, dir), Some(f)) if dir == forward && beyond(e.0, f) => Some(Some(e)),
            (TreeAt::On(e, dir), Some(f)) if dir == forward && e.0 == f => {
                Some(self.tree_step(forward)?)
            }
            _ => None,
        };
        let entry = match reused {
            Some(e) => e,
            None => {
                let e = self.tree_seek(from, forward)?;
                match (e, from) {
                    (Some(e), Some(f)) if !inclusive && e.0 == f => self.tree_step(forward)?,
                    (e, _) => e,
                }
            }
        };
        self.tree_at = match entry {
            Some(e) => TreeAt::On(e, forward),
            None => TreeAt::Exhausted(forward),
        };
        Ok(entry)
    }

    fn merged(
        &mut self,
        mut from: Option<&[u8]>,
        mut inclusive: bool,
        forward: bool,
    ) -> Result<Option<Entry<'t>>> {
        loop {
            let tree_entry = self.tree_candidate(from, inclusive, forward)?;
            let view = self.buffer.as_ref().expect("merged cursor has a buffer");
            let buffered = view
                .gens
                .step(view.tree, from, inclusive, forward, view.upto_txn);
            let (key, version) = match (tree_entry, buffered) {
                (None, None) => return Ok(None),
                (Some(t), None) => return Ok(Some(t)),
                (None, Some(b)) => b,
                (Some(t), Some(b)) => {
                    let tree_first = if forward { t.0 < b.0 } else { t.0 > b.0 };
                    if tree_first {
                        return Ok(Some(t));
                    }
                    b
                }
            };
            match version {
                Found::Value(v) => return Ok(Some((key, v))),
                Found::InTree => {
                    if let Some(t) = tree_entry.filter(|t| t.0 == key) {
                        return Ok(Some(t));
                    }
                }
                Found::Deleted => {}
            }
            // Hidden (deleted, or written to the tree and since removed): go past it.
            from = Some(key);
            inclusive = false;
        }
    }
}
