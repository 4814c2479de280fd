//! The changes feed's document-layer half: reading the change log after an etag,
//! tombstones and their purge, and the commit notifier readers wait on.

mod log;
mod notify;
pub(crate) mod upgrade;

pub use log::{Change, ChangeFilter, ChangeKind};
pub use notify::CommitListener;
pub(crate) use notify::CommitNotifier;

pub(crate) use log::{decode as decode_entry, encode as encode_entry};

use crate::model::schema::{decode_u64, sequence_key, CHANGES, CONSUMERS, TOMBSTONES};
use crate::{Database, DocError, Document, Etag, Result};
use crate::{DatabaseError, DocumentError, IndexError};
use kiln_storage::WriteTxn;
use std::time::Duration;

/// The time of the write with etag sequence `last` (the last one), if there is one.
pub(crate) fn last_write_ms(
    r: &kiln_storage::ReadTxn<'_>,
    incarnation: u32,
    last: u64,
) -> Result<Option<u64>> {
    if last == 0 {
        return Ok(None);
    }
    match r.get(CHANGES, &sequence_key(last))? {
        Some(v) => Ok(Some(
            decode_entry(incarnation, &sequence_key(last), v)?.at_ms,
        )),
        None => Ok(None),
    }
}

/// Bound on entries looked at by one filtered read, so that a filter matching
/// nothing cannot make one request walk the whole log; the page then ends early
/// with `last_sequence` where the scan stopped.
const MAX_SCANNED_PER_READ: usize = 100_000;

/// Tombstones removed per transaction by a purge.
const PURGE_CHUNK: usize = 10_000;

#[derive(Debug, Clone)]
pub struct ChangeEntry {
    pub change: Change,
    /// The document as of the same snapshot, when asked for (never for a delete).
    pub document: Option<Document>,
}

/// A page of the change log.
#[derive(Debug, Clone)]
pub struct ChangesPage {
    pub changes: Vec<ChangeEntry>,
    /// Where to continue: the sequence of the last entry looked at (which may be past
    /// the last entry returned when a filter skipped some), or the `since` given.
    pub last_sequence: u64,
    /// The database's last sequence at the read's snapshot.
    pub database_sequence: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TombstoneStats {
    pub count: u64,
    pub oldest: Option<Etag>,
    pub oldest_at_ms: Option<u64>,
    /// Registered consumers and the sequence each has read up to.
    pub consumers: Vec<(String, u64)>,
}

/// What a purge removes: tombstones below `before_sequence` (if given) AND older than
/// `older_than_ms` (if given), never one a registered consumer has not read yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct PurgeRule {
    pub before_sequence: Option<u64>,
    pub older_than_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeOutcome {
    pub purged: u64,
    pub remaining: u64,
    /// The sequence below which tombstones were eligible (the rule and the consumers).
    pub purged_below_sequence: u64,
}

impl Database {
    /// Parses an etag a reader continues from; an etag of another incarnation of this
    /// database (deleted and created again) is refused, since its sequence means
    /// nothing here.
    pub fn sequence_of(&self, etag: &str) -> Result<u64> {
        if etag.is_empty() || etag == "0" {
            return Ok(0);
        }
        let e = Etag::parse(etag)?;
        if e.incarnation != self.incarnation {
            return Err(DocError::Database(
                DatabaseError::EtagFromOtherIncarnation {
                    etag: etag.to_string(),
                    database: self.name().to_string(),
                },
            ));
        }
        Ok(e.sequence)
    }

    pub fn etag_at(&self, sequence: u64) -> Etag {
        Etag {
            incarnation: self.incarnation,
            sequence,
        }
    }

    /// The last sequence known to be durable (the notifier's view; no read).
    pub fn last_sequence(&self) -> u64 {
        self.notifier.last_sequence()
    }

    /// Blocks until a write after `after` is durable or `timeout` passes; returns the
    /// last sequence.
    pub fn wait_for_changes(&self, after: u64, timeout: Duration) -> u64 {
        self.notifier.wait_after(after, timeout)
    }

    /// Calls `listener(last_sequence)` after each durable write (on the writing
    /// thread: it must not block). Returns an id for `remove_commit_listener`.
    pub fn add_commit_listener(&self, listener: CommitListener) -> u64 {
        self.notifier.add_listener(listener)
    }

    pub fn remove_commit_listener(&self, id: u64) {
        self.notifier.remove_listener(id)
    }

    /// The change log after `since`, in etag order: each document at most once (its
    /// latest write), deletes included, at most `limit` entries that pass `filter`.
    pub fn changes_since(
        &self,
        since: u64,
        limit: usize,
        filter: &ChangeFilter,
        include_docs: bool,
    ) -> Result<ChangesPage> {
        self.changes_between(since, u64::MAX, limit, filter, include_docs)
    }

    /// `changes_since`, stopping at sequence `until` (inclusive).
    pub fn changes_between(
        &self,
        since: u64,
        until: u64,
        limit: usize,
        filter: &ChangeFilter,
        include_docs: bool,
    ) -> Result<ChangesPage> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let database_sequence = self.read_last_sequence(&r)?;
        let mut page = ChangesPage {
            changes: Vec::new(),
            last_sequence: since,
            database_sequence,
        };
        if let Some(id) = &filter.id {
            // One document: its entry is found through the document or its tombstone.
            if let Some(change) = self.change_of(&r, id)? {
                let seq = change.etag.sequence;
                if seq > since && seq <= until && filter.matches(&change) && limit > 0 {
                    page.last_sequence = change.etag.sequence;
                    page.changes.push(self.entry(&r, change, include_docs)?);
                }
            }
            page.last_sequence = page.last_sequence.max(database_sequence.min(until));
            return Ok(page);
        }
        let mut cursor = r.cursor(CHANGES)?;
        let mut item = cursor.seek(&sequence_key(since.saturating_add(1)))?;
        let mut scanned = 0;
        while let Some((k, v)) = item {
            if page.changes.len() >= limit || scanned >= MAX_SCANNED_PER_READ {
                return Ok(page);
            }
            scanned += 1;
            let change = decode_entry(self.incarnation, k, v)?;
            if change.etag.sequence > until {
                page.last_sequence = until;
                return Ok(page);
            }
            page.last_sequence = change.etag.sequence;
            if filter.matches(&change) {
                page.changes.push(self.entry(&r, change, include_docs)?);
            }
            item = cursor.next()?;
        }
        // The whole log was read: a filtered reader may continue from the end.
        page.last_sequence = page.last_sequence.max(database_sequence.min(until));
        Ok(page)
    }

    fn change_of(&self, r: &kiln_storage::ReadTxn<'_>, id: &str) -> Result<Option<Change>> {
        let sequence = match crate::stored::sequence_of(r, id)? {
            Some(sequence) => sequence,
            None => match r.get(TOMBSTONES, id.as_bytes())? {
                Some(seq) => decode_u64(seq, "tombstone sequence")?,
                None => return Ok(None),
            },
        };
        let raw = r.get(CHANGES, &sequence_key(sequence))?.ok_or_else(|| {
            DocError::Document(DocumentError::Corrupt {
                id: id.to_string(),
                why: format!("no change log entry at its sequence {sequence}"),
            })
        })?;
        decode_entry(self.incarnation, &sequence_key(sequence), raw).map(Some)
    }

    fn entry(
        &self,
        r: &kiln_storage::ReadTxn<'_>,
        change: Change,
        include_docs: bool,
    ) -> Result<ChangeEntry> {
        let document = match (include_docs, change.kind) {
            (true, ChangeKind::Put) => {
                // A put's entry sits at its document's current sequence (a later
                // write moves it), so the body is the one written there.
                let bytes = crate::stored::get_at(r, &change.id, change.etag.sequence)?;
                Some(Document::from_record(&change.id, bytes)?)
            }
            _ => None,
        };
        Ok(ChangeEntry { change, document })
    }

    /// Records that consumer `name` has read the log up to `sequence`; tombstones at
    /// or below it may be purged as far as it is concerned.
    pub fn set_consumer_position(&self, name: &str, sequence: u64) -> Result<()> {
        let env = self.live()?;
        let name = name.to_string();
        env.submit(move |txn| txn.put(CONSUMERS, name.as_bytes(), &sequence.to_be_bytes()))?;
        Ok(())
    }

    pub fn remove_consumer(&self, name: &str) -> Result<()> {
        let env = self.live()?;
        let name = name.to_string();
        env.submit(move |txn| txn.delete(CONSUMERS, name.as_bytes()).map(|_| ()))?;
        Ok(())
    }

    pub fn tombstone_stats(&self) -> Result<TombstoneStats> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let count = r.tree_len(TOMBSTONES)?;
        let mut oldest = None;
        if count > 0 {
            let mut cursor = r.cursor(CHANGES)?;
            let mut item = cursor.first()?;
            while let Some((k, v)) = item {
                let c = decode_entry(self.incarnation, k, v)?;
                if c.kind == ChangeKind::Delete {
                    oldest = Some(c);
                    break;
                }
                item = cursor.next()?;
            }
        }
        Ok(TombstoneStats {
            count,
            oldest: oldest.as_ref().map(|c| c.etag),
            oldest_at_ms: oldest.map(|c| c.at_ms),
            consumers: read_consumers(&r)?,
        })
    }

    /// The exclusive sequence bound a purge by `before_sequence` has now: below
    /// the last write (inclusive), the sequence given, and what every registered
    /// consumer has read.
    pub fn tombstone_purge_bound(&self, before_sequence: Option<u64>) -> Result<u64> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let consumers_min = read_consumers(&r)?.iter().map(|c| c.1).min();
        let last = self.read_last_sequence(&r)?;
        // `bound` is exclusive: the last write itself may be a tombstone to purge.
        Ok([
            Some(last + 1),
            before_sequence,
            consumers_min.map(|s| s + 1),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0))
    }

    /// Removes tombstones by `rule`, a chunk per transaction (writers go on between
    /// chunks). Walks the change log from its start: a purge costs a scan of the log
    /// below its bound.
    pub fn purge_tombstones(&self, rule: PurgeRule) -> Result<PurgeOutcome> {
        let bound = self.tombstone_purge_bound(rule.before_sequence)?;
        let cutoff_ms = rule
            .older_than_ms
            .map(|age| crate::model::time::now_ms().saturating_sub(age));
        self.purge_below(bound, cutoff_ms)
    }

    /// A cluster's purge (one log entry, applied on every node): removes the
    /// tombstones below `below_sequence` (the bound the leader computed with
    /// `tombstone_purge_bound`: its consumers are in it) whose delete is at or
    /// before `cutoff_ms` (the leader's time less the age asked for). What it
    /// removes depends on these and on the change log only, which every node
    /// has alike at the entry, so every node removes the same tombstones.
    ///
    /// This node's own consumers (its indexes, built by its own indexer, and its
    /// backup chain) are not consulted, since their positions differ from node
    /// to node. Instead each index of this node first reads the change log up to
    /// the bound (waited for at most `index_wait`); an index that does not catch
    /// up in time is rebuilt from the documents (`reset_index`), which needs no
    /// tombstone. A backup chain reads its own history tree, which a purge does
    /// not touch.
    pub fn purge_tombstones_logged(
        &self,
        below_sequence: u64,
        cutoff_ms: Option<u64>,
        index_wait: Duration,
    ) -> Result<PurgeOutcome> {
        let bound = {
            let env = self.live()?;
            let r = env.begin_read()?;
            below_sequence.min(self.read_last_sequence(&r)? + 1)
        };
        if bound > 1 {
            let deadline = std::time::Instant::now() + index_wait;
            for name in self.index_names()? {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match self.wait_for_index(&name, bound - 1, left) {
                    Ok(true) | Err(DocError::Index(IndexError::NotFound(_))) => {}
                    Ok(false) => {
                        tracing::warn!(database = %self.name(), index = %name, "an index had not read the tombstones a cluster purges: rebuilt");
                        match self.reset_index(&name) {
                            Ok(()) | Err(DocError::Index(IndexError::NotFound(_))) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.purge_below(bound, cutoff_ms)
    }

    fn purge_below(&self, bound: u64, cutoff_ms: Option<u64>) -> Result<PurgeOutcome> {
        let env = self.live()?;
        let mut from = 0u64;
        let mut purged = 0;
        loop {
            // Find a chunk under a read snapshot, then delete it in one write; a
            // tombstone replaced in between (the id written again) is skipped by the
            // check inside the write.
            let (chunk, next_from, done) = {
                let r = env.begin_read()?;
                let mut cursor = r.cursor(CHANGES)?;
                let mut item = cursor.seek(&sequence_key(from))?;
                let mut chunk = Vec::new();
                let mut next_from = from;
                let mut done = true;
                while let Some((k, v)) = item {
                    let c = decode_entry(self.incarnation, k, v)?;
                    if c.etag.sequence >= bound {
                        break;
                    }
                    next_from = c.etag.sequence + 1;
                    if c.kind == ChangeKind::Delete && cutoff_ms.is_none_or(|t| c.at_ms <= t) {
                        chunk.push((c.etag.sequence, c.id));
                        if chunk.len() == PURGE_CHUNK {
                            done = false;
                            break;
                        }
                    }
                    item = cursor.next()?;
                }
                (chunk, next_from, done)
            };
            if !chunk.is_empty() {
                purged += env.submit(move |txn| remove_tombstones(txn, &chunk))?;
            }
            from = next_from;
            if done {
                break;
            }
        }
        let remaining = env.begin_read()?.tree_len(TOMBSTONES)?;
        Ok(PurgeOutcome {
            purged,
            remaining,
            purged_below_sequence: bound,
        })
    }
}

fn remove_tombstones(txn: &mut WriteTxn<'_>, chunk: &[(u64, String)]) -> kiln_storage::Result<u64> {
    let mut removed = 0;
    for (sequence, id) in chunk {
        let current = txn.get(TOMBSTONES, id.as_bytes())?;
        if current == Some(&sequence.to_be_bytes()[..]) {
            txn.delete(TOMBSTONES, id.as_bytes())?;
            txn.delete(CHANGES, &sequence_key(*sequence))?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn read_consumers(r: &kiln_storage::ReadTxn<'_>) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let mut cursor = r.cursor(CONSUMERS)?;
    let mut item = cursor.first()?;
    while let Some((k, v)) = item {
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            decode_u64(v, "consumer position")?,
        ));
        item = cursor.next()?;
    }
    Ok(out)
}
