//! Where recovery must start reading the journal, followed commit by commit.

use super::JournalPos;

/// Where recovery must start reading the journal so that every buffered entry not
/// yet merged into a synced data file is read again: just after the record that
/// froze the newest generation whose merge is synced (or the journal's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplayStart {
    /// The transaction whose record ends at `pos` (0 at the journal's start).
    pub txn_id: u64,
    pub pos: JournalPos,
    /// The last freeze seen, not yet known to be merged.
    last_freeze: Option<(u64, JournalPos)>,
}

impl ReplayStart {
    pub fn new(txn_id: u64, pos: JournalPos) -> Self {
        ReplayStart {
            txn_id,
            pos,
            last_freeze: None,
        }
    }

    /// Follows the commits in order: `end` is where transaction `txn_id`'s record
    /// ends; `buffer_empty` says nothing is buffered after it.
    pub fn note(
        &mut self,
        txn_id: u64,
        end: JournalPos,
        froze: bool,
        merge_done: bool,
        buffer_empty: bool,
    ) {
        let at = |p: JournalPos| (p.file_seq, p.offset);
        assert!(
            txn_id > self.txn_id
                && at(end) > at(self.pos)
                && self.last_freeze.is_none_or(|(t, p)| t < txn_id && at(p) < at(end)),
            "replay start after txn {} (journal file {} offset {}, last freeze {:?}) was shown txn {txn_id} \
             ending at file {} offset {}: commits must be noted in order, each after the replay start",
            self.txn_id,
            self.pos.file_seq,
            self.pos.offset,
            self.last_freeze.map(|(t, _)| t),
            end.file_seq,
            end.offset
        );
        if buffer_empty {
            // No record up to here holds an entry still needed.
            *self = ReplayStart::new(txn_id, end);
            return;
        }
        // A commit does not both finish a merge and freeze (see `prepare_commit`),
        // and a merge that finishes refers to the last freeze.
        if merge_done {
            if let Some((t, p)) = self.last_freeze.take() {
                self.txn_id = t;
                self.pos = p;
            }
        }
        if froze {
            self.last_freeze = Some((txn_id, end));
        }
    }
}
