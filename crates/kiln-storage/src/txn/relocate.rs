//! Moving tree pages from the data file's tail into free pages lower down, at close,
//! so that the trim of the free tail (`Flusher::trim_tail_at_close`) can cut them.

use super::WriteTxn;
use crate::btree::{node, MAX_DEPTH};
use crate::page::{self, hdr, PageNo, KIND_BRANCH};
use crate::Result;

/// What one relocation transaction may still do.
struct Budget {
    /// Free pages below the cutoff not taken yet (the allocator hands out the
    /// lowest free page first, so these are the next ones it gives).
    below_cutoff: u64,
    /// New pages this transaction may still make (bounds its memory and record).
    left: u64,
    copied: u64,
}

impl Budget {
    /// Whether a node at `depth` may be copied: one page for it, and one for each
    /// ancestor that may have to be copied to point at it, all below the cutoff.
    fn allows(&self, depth: usize) -> bool {
        let need = depth as u64 + 1;
        self.below_cutoff >= need && self.left >= need
    }

    fn took(&mut self) {
        self.below_cutoff -= 1;
        self.left = self.left.saturating_sub(1);
        self.copied += 1;
    }
}

impl WriteTxn<'_> {
    /// Copies every tree node at or past `cutoff` into the lowest free pages, with
    /// ordinary copy-on-write: the parents on its path are copied too, the old pages
    /// are freed like any other (reusable, and cut by the trim, only once a
    /// checkpoint passes this transaction). At most about `max_pages` pages are
    /// copied; returns how many were. Values in overflow or bare runs stay where
    /// they are (a bare run's checksum covers its page number): only nodes move.
    ///
    /// Why at close: the close's merge of the write buffer copies leaves to the end
    /// of the file while the pages it frees wait for a checkpoint, so a closed
    /// database kept ~9% of its file as free pages (docs/benchmarks.md, SPACE).
    pub(crate) fn relocate_tail(&mut self, cutoff: PageNo, max_pages: u64) -> Result<u64> {
        let below_cutoff = {
            let alloc = self.alloc();
            alloc.free.iter().take_while(|&p| p < cutoff).count() as u64
        };
        let mut budget = Budget {
            below_cutoff,
            left: max_pages,
            copied: 0,
        };
        for name in self.tree_names()? {
            if !budget.allows(0) {
                break;
            }
            let mut st = self.tree_state_for_write(&name)?;
            if st.info.root == 0 {
                continue;
            }
            let root = st.info.root;
            let moved = self.mutate(|t| t.relocate_node(root, cutoff, 0, false, &mut budget))?;
            if moved != root {
                st.info.root = moved;
                st.modified = true;
                self.set_tree_state(&name, st);
            }
        }
        Ok(budget.copied)
    }

    /// Relocates the subtree at `no` (a leaf when `known_leaf`: not read unless it
    /// moves); returns its page number afterwards.
    fn relocate_node(
        &mut self,
        no: PageNo,
        cutoff: PageNo,
        depth: usize,
        known_leaf: bool,
        budget: &mut Budget,
    ) -> Result<PageNo> {
        if depth >= MAX_DEPTH {
            return Err(crate::btree::corrupt(
                &*self,
                no,
                "tree deeper than the depth limit",
            ));
        }
        let mut cur = no;
        if !known_leaf && hdr::kind(node(&*self, no)?) == KIND_BRANCH {
            let p = node(&*self, no)?;
            let children: Vec<PageNo> = (0..page::branch_fanout(p))
                .map(|i| page::branch_nth_child(p, i))
                .collect();
            // A branch's children are all on one level: leaves if its first is.
            let leaves = children
                .first()
                .map(|&c| node(&*self, c).map(|q| hdr::kind(q) != KIND_BRANCH))
                .transpose()?
                .unwrap_or(false);
            for (i, &child) in children.iter().enumerate() {
                if leaves && (child < cutoff || self.is_dirty(child)) {
                    continue;
                }
                if !budget.allows(depth + 1) {
                    break;
                }
                let moved = self.relocate_node(child, cutoff, depth + 1, leaves, budget)?;
                if moved != child {
                    if !self.is_dirty(cur) {
                        cur = self.writable(cur)?;
                        budget.took();
                    }
                    let q = self.dirty_mut(cur);
                    if i == 0 {
                        hdr::set_extra(q, moved);
                    } else {
                        page::set_branch_child(q, i - 1, moved);
                    }
                }
            }
        }
        if cur >= cutoff && !self.is_dirty(cur) && budget.allows(depth) {
            cur = self.writable(cur)?;
            budget.took();
        }
        Ok(cur)
    }
}
