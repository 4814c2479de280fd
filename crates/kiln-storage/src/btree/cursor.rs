//! Cursors: ordered iteration both ways from any key.

use super::{node, value_bytes, PageSource, MAX_DEPTH};
use crate::page::{self, hdr, PageNo, KIND_LEAF};
use crate::{Error, Result};

/// Leaves a forward scan asks the kernel to read ahead of it (256 KiB of 8 KiB
/// pages), renewed when half of them have been passed.
const READ_AHEAD_LEAVES: usize = 32;

/// A position in a tree. Entries returned borrow from the transaction.
pub struct TreeCursor<'t> {
    src: &'t dyn PageSource,
    root: PageNo,
    /// Path from the root: (page, index). Branch indexes are in 0..fanout (0 is the
    /// leftmost child); the last element is the leaf and its entry index.
    stack: Vec<(&'t [u8], usize)>,
    state: State,
    /// Read-ahead of a forward scan: the leaves' parent (its address) and the
    /// child index up to which its leaves were asked for.
    read_ahead: (usize, usize),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not yet positioned: `next` starts at the first entry, `prev` at the last.
    Fresh,
    On,
    /// Ran off the end: `next` stays there, `prev` returns the last entry.
    AfterEnd,
    /// Ran off the start: `prev` stays there, `next` returns the first entry.
    BeforeStart,
}

pub type Entry<'t> = (&'t [u8], &'t [u8]);

impl<'t> TreeCursor<'t> {
    pub(crate) fn new(src: &'t dyn PageSource, root: PageNo) -> Self {
        TreeCursor {
            src,
            root,
            stack: Vec::new(),
            state: State::Fresh,
            read_ahead: (0, 0),
        }
    }

    /// Called when a forward scan has moved to a new leaf: asks for the next
    /// leaves under the same parent ahead of it (point reads never get here, so
    /// they read only what they need).
    fn ahead_of_scan(&mut self) {
        // The leaf's parent: the entry below the top of the stack.
        let Some(&(parent, idx)) = self.stack.iter().rev().nth(1) else {
            return;
        };
        let key = parent.as_ptr() as usize;
        let (at, upto) = self.read_ahead;
        if at == key && idx + READ_AHEAD_LEAVES / 2 < upto {
            return;
        }
        let from = if at == key {
            upto.max(idx + 1)
        } else {
            idx + 1
        };
        let to = (idx + 1 + READ_AHEAD_LEAVES).min(page::branch_fanout(parent));
        let mut runs: Vec<(PageNo, u64)> = Vec::new();
        for i in from..to {
            let child = page::branch_nth_child(parent, i);
            match runs.last_mut() {
                Some((start, len)) if *start + *len == child => *len += 1,
                _ => runs.push((child, 1)),
            }
        }
        if !runs.is_empty() {
            self.src.prefetch(&runs);
        }
        self.read_ahead = (key, to.max(from));
    }

    fn descend_edge(&mut self, mut no: PageNo, leftmost: bool) -> Result<()> {
        loop {
            if self.stack.len() >= MAX_DEPTH {
                return Err(Error::corrupted(
                    self.src.data_path(),
                    format!("page {no}"),
                    "tree deeper than the depth limit",
                ));
            }
            let p = node(self.src, no)?;
            if hdr::kind(p) == KIND_LEAF {
                let idx = if leftmost {
                    0
                } else {
                    hdr::count(p).saturating_sub(1)
                };
                self.stack.push((p, idx));
                return Ok(());
            }
            let idx = if leftmost {
                0
            } else {
                page::branch_fanout(p) - 1
            };
            self.stack.push((p, idx));
            no = page::branch_nth_child(p, idx);
        }
    }

    fn current(&self) -> Result<Option<Entry<'t>>> {
        let Some(&(leaf, idx)) = self.stack.last() else {
            return Ok(None);
        };
        if self.state != State::On || idx >= hdr::count(leaf) {
            return Ok(None);
        }
        let key = page::cell_key(leaf, idx);
        let value = value_bytes(self.src, page::leaf_value(leaf, idx))?;
        Ok(Some((key, value)))
    }

    /// Positions at the smallest key.
    pub fn first(&mut self) -> Result<Option<Entry<'t>>> {
        self.stack.clear();
        self.state = State::On;
        if self.root == 0 {
            self.park_at_end();
            return Ok(None);
        }
        self.descend_edge(self.root, true)?;
        self.skip_empty_forward()
    }

    /// Positions at the largest key.
    pub fn last(&mut self) -> Result<Option<Entry<'t>>> {
        self.stack.clear();
        self.state = State::On;
        if self.root == 0 {
            self.park_at_start();
            return Ok(None);
        }
        self.descend_edge(self.root, false)?;
        self.skip_empty_backward()
    }

    /// Positions at the smallest key >= `key`.
    pub fn seek(&mut self, key: &[u8]) -> Result<Option<Entry<'t>>> {
        self.stack.clear();
        self.state = State::On;
        if self.root == 0 {
            self.park_at_end();
            return Ok(None);
        }
        let mut no = self.root;
        loop {
            if self.stack.len() >= MAX_DEPTH {
                return Err(Error::corrupted(
                    self.src.data_path(),
                    format!("page {no}"),
                    "tree deeper than the depth limit",
                ));
            }
            let p = node(self.src, no)?;
            if hdr::kind(p) == KIND_LEAF {
                let idx = page::search(p, key).unwrap_or_else(|i| i);
                self.stack.push((p, idx));
                return self.skip_empty_forward();
            }
            let route = page::branch_route(p, key);
            let idx = if route == usize::MAX { 0 } else { route + 1 };
            self.stack.push((p, idx));
            no = page::branch_nth_child(p, idx);
        }
    }

    /// Whether the tree holds `key`, leaving the cursor at or after it. Keys asked
    /// in ascending order reuse the leaf the cursor is on while they fall inside its
    /// first and last keys (no descent from the root): counting a tree's buffered
    /// keys asks for thousands in order, several per leaf.
    pub fn contains(&mut self, key: &[u8]) -> Result<bool> {
        if self.state == State::On {
            if let Some((leaf, idx)) = self.stack.last_mut() {
                let n = hdr::count(leaf);
                if n > 0 && page::cell_key(leaf, 0) <= key && key <= page::cell_key(leaf, n - 1) {
                    let found = page::search(leaf, key);
                    *idx = found.unwrap_or_else(|i| i);
                    return Ok(found.is_ok());
                }
            }
        }
        Ok(matches!(self.seek(key)?, Some((k, _)) if k == key))
    }

    /// Positions at the largest key <= `key`.
    pub fn seek_for_prev(&mut self, key: &[u8]) -> Result<Option<Entry<'t>>> {
        match self.seek(key)? {
            Some((k, v)) if k == key => Ok(Some((k, v))),
            Some(_) => self.prev(),
            None => self.last(),
        }
    }

    /// Moves to the next entry.
    // A step of a two-way cursor (beside `prev`, `seek`, `first`, `last`), fallible,
    // that can turn back after running off either end: not an `Iterator`.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Entry<'t>>> {
        match self.state {
            State::Fresh | State::BeforeStart => return self.first(),
            State::AfterEnd => return Ok(None),
            State::On => {}
        }
        match self.stack.last_mut() {
            Some((_, idx)) => *idx += 1,
            None => return Ok(None),
        }
        self.skip_empty_forward()
    }

    /// Moves to the previous entry.
    pub fn prev(&mut self) -> Result<Option<Entry<'t>>> {
        match self.state {
            State::Fresh | State::AfterEnd => return self.last(),
            State::BeforeStart => return Ok(None),
            State::On => {}
        }
        let Some((leaf, idx)) = self.stack.last_mut() else {
            return Ok(None);
        };
        if *idx == 0 || hdr::count(leaf) == 0 {
            return self.step_leaf_backward();
        }
        *idx = (*idx).min(hdr::count(leaf)) - 1;
        self.current()
    }

    /// If the leaf position is past its end, climbs to the next leaf.
    fn skip_empty_forward(&mut self) -> Result<Option<Entry<'t>>> {
        loop {
            let Some(&(leaf, idx)) = self.stack.last() else {
                return Ok(None);
            };
            if idx < hdr::count(leaf) {
                return self.current();
            }
            // Leaf exhausted: find the next branch slot to the right.
            self.stack.pop();
            loop {
                let Some((p, idx)) = self.stack.last_mut() else {
                    self.park_at_end();
                    return Ok(None);
                };
                if *idx + 1 < page::branch_fanout(p) {
                    *idx += 1;
                    let child = page::branch_nth_child(p, *idx);
                    self.descend_edge(child, true)?;
                    self.ahead_of_scan();
                    break;
                }
                self.stack.pop();
            }
        }
    }

    fn skip_empty_backward(&mut self) -> Result<Option<Entry<'t>>> {
        let Some(&(leaf, _)) = self.stack.last() else {
            return Ok(None);
        };
        if hdr::count(leaf) > 0 {
            return self.current();
        }
        self.step_leaf_backward()
    }

    /// Moves to the last entry of the previous non-empty leaf.
    fn step_leaf_backward(&mut self) -> Result<Option<Entry<'t>>> {
        loop {
            self.stack.pop();
            loop {
                let Some((p, idx)) = self.stack.last_mut() else {
                    self.park_at_start();
                    return Ok(None);
                };
                if *idx > 0 {
                    *idx -= 1;
                    let child = page::branch_nth_child(p, *idx);
                    self.descend_edge(child, false)?;
                    break;
                }
                self.stack.pop();
            }
            let Some(&(leaf, _)) = self.stack.last() else {
                return Ok(None);
            };
            if hdr::count(leaf) > 0 {
                return self.current();
            }
        }
    }

    /// After running off the end, `prev` returns the last entry.
    fn park_at_end(&mut self) {
        self.stack.clear();
        self.state = State::AfterEnd;
    }

    fn park_at_start(&mut self) {
        self.stack.clear();
        self.state = State::BeforeStart;
    }
}
