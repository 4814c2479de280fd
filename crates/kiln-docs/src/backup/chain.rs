//! Backup chains: a full backup that starts a chain, then incremental backups each
//! holding every write after the previous backup of the chain, read from the
//! backup history (`database/history.rs`) of one snapshot.
//!
//! - Starting a chain (a full backup with `chain`) commits `meta.backup_chain` with
//!   a new chain id, turns the history on (in the same unit, so every later write is
//!   recorded) and registers the chain as a change-log consumer at the start.
//! - An increment since backup B (etag b) of chain C covers (b, e], e being the last
//!   etag of its own snapshot. It is refused unless the database's chain is C and
//!   the history still holds everything after b (`retained_after <= b`).
//! - Once an increment since B has been written, entries at or below b are no
//!   longer needed (the client holds B and has just been sent the rest):
//!   `retained_after` moves to b and they are removed in chunks. The increment from
//!   B can still be taken again (if its file was lost) until an increment since a
//!   later backup is taken.
//! - Stopping the chain removes `meta.backup_chain`, the consumer and the history.

use super::{new_id, BackupKind, BackupManifest, BackupReport, MANIFEST_OFFSET};
use crate::attachments::Hash;
use crate::database::history::{self, ChainState};
use crate::model::schema::{
    decode_last_sequence, decode_u64, sequence_key, CHAIN_CONSUMER, CONSUMERS, HISTORY, META,
    META_CHAIN, META_LAST_ETAG,
};
use crate::stored::read_last_sequence;
use crate::{BackupChainError, DocumentError};
use crate::{Database, DocError, Result};
use kiln_storage::backup::BackupOptions;
use kiln_storage::{ContainerWriter, Env, ReadTxn, WriteTxn};
use serde::Serialize;
use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::Ordering;

/// History entries removed per transaction by a trim.
const TRIM_CHUNK: usize = 10_000;

/// The backup chain of a database, for its stats.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BackupChainStats {
    pub chain_id: String,
    /// Entries in the backup history (one per write since `retained_after`).
    pub history_entries: u64,
    /// The history holds every write after this etag sequence.
    pub retained_after_sequence: u64,
    /// The etag sequence the chain started at.
    pub started_after_sequence: u64,
}

pub(crate) fn read_chain(r: &ReadTxn<'_>) -> Result<Option<ChainState>> {
    r.get(META, META_CHAIN)?.map(ChainState::decode).transpose()
}

fn read_chain_w(w: &mut WriteTxn<'_>) -> Result<Option<ChainState>> {
    w.get(META, META_CHAIN)?.map(ChainState::decode).transpose()
}

fn last_sequence_w(w: &mut WriteTxn<'_>) -> Result<u64> {
    decode_last_sequence(w.get(META, META_LAST_ETAG)?).map_err(DocError::from)
}

impl Database {
    /// Starts a new backup chain (replacing any), returning its id. Every write
    /// committed after this call is in the backup history.
    pub(crate) fn start_backup_chain(&self) -> Result<String> {
        let env = self.live()?;
        let flag = self.history_on.clone();
        let chain_id = new_id();
        let id = chain_id.clone();
        let started = env.submit_with(move |txn| -> Result<u64> {
            let last = last_sequence_w(txn)?;
            let st = ChainState {
                chain_id: id,
                retained_after: last,
                started_after: last,
            };
            txn.ensure_tree(HISTORY)?;
            txn.put(META, META_CHAIN, &st.encode()?)?;
            txn.put(CONSUMERS, CHAIN_CONSUMER.as_bytes(), &last.to_be_bytes())?;
            // Last, once nothing in this unit can fail: the units after this one
            // (same transaction or later) record their writes.
            flag.store(true, Ordering::SeqCst);
            Ok(last)
        });
        let started = match started {
            Ok(s) => s,
            Err(e) => {
                self.reload_history_flag();
                return Err(e);
            }
        };
        // Entries of an earlier chain are no longer needed.
        self.trim_history(started)?;
        tracing::info!(database = %self.name(), chain = %chain_id, after = started, "backup chain started");
        Ok(chain_id)
    }

    /// Sets the history flag from `meta` (after a failed chain start or stop: the
    /// flag may be on without a chain, which only costs history entries that the
    /// next trim removes, never off with one).
    fn reload_history_flag(&self) {
        if let Ok(env) = self.live() {
            if let Ok(r) = env.begin_read() {
                if let Ok(chain) = read_chain(&r) {
                    self.history_on.store(chain.is_some(), Ordering::SeqCst);
                }
            }
        }
    }

    /// Stops the backup chain: increments are refused from now on, writes no longer
    /// go to the history, and the history is removed. Returns false if there was
    /// no chain.
    pub fn stop_backup_chain(&self) -> Result<bool> {
        let env = self.live()?;
        let had = env.submit_with(move |txn| -> Result<bool> {
            let had = read_chain_w(txn)?.is_some();
            txn.delete(META, META_CHAIN)?;
            txn.delete(CONSUMERS, CHAIN_CONSUMER.as_bytes())?;
            Ok(had)
        })?;
        // Off only once the chain is gone for good: a write recorded in between
        // is removed by the trim below.
        self.history_on.store(false, Ordering::SeqCst);
        self.trim_history(u64::MAX)?;
        tracing::info!(database = %self.name(), had, "backup chain stopped");
        Ok(had)
    }

    pub(crate) fn backup_chain_stats(&self) -> Result<Option<BackupChainStats>> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let Some(chain) = read_chain(&r)? else {
            return Ok(None);
        };
        Ok(Some(BackupChainStats {
            chain_id: chain.chain_id,
            history_entries: r.tree_len(HISTORY)?,
            retained_after_sequence: chain.retained_after,
            started_after_sequence: chain.started_after,
        }))
    }

    /// The backup chain and its history's size, if a chain is active.
    pub fn backup_chain(&self) -> Result<Option<BackupChainStats>> {
        self.backup_chain_stats()
    }

    /// Removes history entries at or below `upto`, a chunk per transaction.
    fn trim_history(&self, upto: u64) -> Result<u64> {
        let env = self.live()?;
        let mut removed = 0;
        loop {
            let chunk: Vec<[u8; 8]> = {
                let r = env.begin_read()?;
                if !r.tree_exists(HISTORY)? {
                    return Ok(removed);
                }
                let mut c = r.cursor(HISTORY)?;
                let mut item = c.first()?;
                let mut chunk = Vec::new();
                while let Some((k, _)) = item {
                    let seq = decode_u64(k, "history key")?;
                    if seq > upto || chunk.len() == TRIM_CHUNK {
                        break;
                    }
                    chunk.push(sequence_key(seq));
                    item = c.next()?;
                }
                chunk
            };
            if chunk.is_empty() {
                return Ok(removed);
            }
            removed += chunk.len() as u64;
            env.submit(move |txn| {
                for k in &chunk {
                    txn.delete(HISTORY, k)?;
                }
                Ok(())
            })?;
        }
    }

    /// Writes an incremental backup: every write after `since` (a backup of this
    /// database's current chain: its manifest) up to the last commit, from one
    /// snapshot. Writes go on meanwhile. Afterwards the history at or below
    /// `since` is trimmed.
    pub fn backup_incremental_to<W: Write>(
        &self,
        out: W,
        since: &BackupManifest,
        opts: BackupOptions,
        progress: impl FnMut(u64),
    ) -> Result<BackupReport> {
        let env = self.live()?;
        let (since_chain, base) = self.increment_base(since)?;
        // The snapshot, with its blobs kept on disk until the backup is written.
        let (r, pin) = self.blobs.pinned_snapshot(env)?;
        let (chain, last) = self.increment_snapshot(&r, since_chain, base)?;
        let mut manifest = BackupManifest {
            base_backup_id: since.backup_id.clone(),
            base_etag: since.etag.clone(),
            ..self.new_manifest(
                &r,
                BackupKind::Incremental,
                last,
                Some(chain.chain_id.clone()),
            )?
        };
        let meta = manifest.encode()?;
        // Sealed if the database is encrypted.
        let mut w = ContainerWriter::for_snapshot(out, &r, &meta, opts, progress)?;
        let (named, last_ms) = write_history(&mut w, &r, base, last)?;
        // The blobs its writes name that the snapshot still references (see
        // `backup/mod.rs`).
        let blobs: Vec<_> = pin
            .hashes()
            .iter()
            .filter(|h| named.contains(*h))
            .copied()
            .collect();
        self.write_blobs(&mut w, &blobs)?;
        let sum = w.finish()?;
        drop(pin);
        drop(r);
        manifest.last_write_ms = last_ms;
        // The client holds the base: what is at or below it is no longer needed.
        self.retain_after(env, chain.chain_id, base)?;
        Ok(BackupReport::new(manifest, &sum, Default::default()))
    }

    /// The chain of a base backup and the etag sequence it ends at, or why an
    /// increment cannot follow it (from its manifest alone).
    fn increment_base<'m>(&self, since: &'m BackupManifest) -> Result<(&'m str, u64)> {
        let Some(since_chain) = since.chain_id.as_deref() else {
            return Err(DocError::BackupChain(
                BackupChainError::IncrementNotPossible(
                    "the base backup is not part of a chain (taken without --chain or by an \
                 older Kiln): take a full backup"
                        .into(),
                ),
            ));
        };
        if since.incarnation.is_some_and(|i| i != self.incarnation) || since.database.is_empty() {
            return Err(DocError::BackupChain(
                BackupChainError::IncrementNotPossible(format!(
                    "the base backup is of another database (incarnation {}, this one is {:08x})",
                    super::incarnation_text(since.incarnation),
                    self.incarnation
                )),
            ));
        }
        let base = match since.etag.as_deref() {
            None => 0,
            Some(e) => self.sequence_of(e)?,
        };
        Ok((since_chain, base))
    }

    /// The database's chain and last etag sequence at snapshot `r`, or why the
    /// increment since `base` (of chain `since_chain`) cannot be taken from it.
    fn increment_snapshot(
        &self,
        r: &ReadTxn<'_>,
        since_chain: &str,
        base: u64,
    ) -> Result<(ChainState, u64)> {
        let refuse = |why: String| {
            Err(DocError::BackupChain(
                BackupChainError::IncrementNotPossible(why),
            ))
        };
        let Some(chain) = read_chain(r)? else {
            return refuse(format!(
                "database {:?} has no backup chain (stopped, or never started): take a full backup",
                self.name()
            ));
        };
        if chain.chain_id != since_chain {
            return refuse(format!(
                "the base backup belongs to chain {since_chain}, the database's chain is now {} \
                 (a newer full backup started it): take a full backup, or use a backup of that chain",
                chain.chain_id
            ));
        }
        let last = read_last_sequence(r)?;
        if base < chain.retained_after {
            return refuse(format!(
                "the history before etag sequence {} was trimmed when an increment since a \
                 later backup was taken; the base (sequence {base}) is older: use the latest \
                 backup of the chain as the base, or take a full backup",
                chain.retained_after
            ));
        }
        if base > last {
            return refuse(format!(
                "the base ends at sequence {base}, after the database's last write ({last})"
            ));
        }
        Ok((chain, last))
    }

    /// Moves the chain's `retained_after` up to `base` (if the chain is still
    /// `chain_id`), and trims the history below it.
    fn retain_after(&self, env: &Env, chain_id: String, base: u64) -> Result<()> {
        let advanced = env.submit_with(move |txn| -> Result<bool> {
            match read_chain_w(txn)? {
                Some(mut st) if st.chain_id == chain_id && base > st.retained_after => {
                    st.retained_after = base;
                    txn.put(META, META_CHAIN, &st.encode()?)?;
                    txn.put(CONSUMERS, CHAIN_CONSUMER.as_bytes(), &base.to_be_bytes())?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })?;
        if advanced {
            self.trim_history(base)?;
        }
        Ok(())
    }
}

/// Writes an increment's history tree into `w`: the history entries of snapshot
/// `r` after `base` up to `last`, each write's, none missing. Returns the blobs
/// its puts name and the time of its last write.
fn write_history<W: Write, P: FnMut(u64)>(
    w: &mut ContainerWriter<W, P>,
    r: &ReadTxn<'_>,
    base: u64,
    last: u64,
) -> Result<(HashSet<Hash>, Option<u64>)> {
    let mut named = HashSet::new();
    w.begin_tree(HISTORY)?;
    let mut c = r.cursor(HISTORY)?;
    let mut item = c.seek(&sequence_key(base.saturating_add(1)))?;
    let mut seen = base;
    let mut last_ms = None;
    while let Some((k, v)) = item {
        let e = history::decode(k, v).map_err(|malformed| {
            DocError::Document(DocumentError::Corrupt {
                id: "(backup history)".into(),
                why: malformed.to_string(),
            })
        })?;
        if e.sequence > last {
            break;
        }
        seen = e.sequence;
        last_ms = Some(e.at_ms);
        if let crate::changes::ChangeKind::Put = e.kind {
            let rec = crate::model::record::decode(e.id, e.record)?;
            for a in crate::attachments::stored_list(rec.json) {
                if let Ok(h) = a.hash_bytes() {
                    named.insert(h);
                }
            }
        }
        w.entry(k, v)?;
        item = c.next()?;
    }
    // Every write has its entry, the last write included: anything else is a
    // history with a hole, which must not pass for a complete increment.
    if seen != last {
        return Err(DocError::Internal(format!(
            "the backup history ends at sequence {seen}, the database at {last}"
        )));
    }
    w.end_tree()?;
    Ok((named, last_ms))
}

/// Checks that `next` (input `n`, named `label`) follows `prev` in a chain.
pub(crate) fn check_link(
    prev: &BackupManifest,
    next: &BackupManifest,
    n: usize,
    label: &str,
) -> Result<()> {
    let broken = |what: String| {
        Err(DocError::BackupChain(BackupChainError::Broken {
            part: format!("input {n} ({label}), its manifest"),
            offset: MANIFEST_OFFSET,
            what,
        }))
    };
    if next.kind != BackupKind::Incremental {
        return broken(
            "a full backup after the first input: a chain is one full backup, then its \
             increments in order"
                .into(),
        );
    }
    if next.database != prev.database || next.incarnation != prev.incarnation {
        return broken(format!(
            "an increment of another database ({:?}, incarnation {}); the chain so far is \
             of {:?}, incarnation {}",
            next.database,
            super::incarnation_text(next.incarnation),
            prev.database,
            super::incarnation_text(prev.incarnation)
        ));
    }
    if prev.chain_id.is_none() {
        return broken("the full backup was taken without a chain (no --chain)".into());
    }
    if next.chain_id != prev.chain_id {
        return broken(format!(
            "an increment of chain {:?}, the full backup started chain {:?}",
            next.chain_id, prev.chain_id
        ));
    }
    let (base, prev_end) = (next.base_sequence()?, prev.end_sequence()?);
    if base > prev_end {
        return broken(format!(
            "a gap: it starts after etag {}, the previous input ends at etag {}; an increment \
             between them is missing",
            next.base_etag.as_deref().unwrap_or("0"),
            prev.etag.as_deref().unwrap_or("0")
        ));
    }
    if base < prev_end {
        return broken(format!(
            "out of order or on the wrong base: it starts after etag {}, before the end of the \
             previous input (etag {})",
            next.base_etag.as_deref().unwrap_or("0"),
            prev.etag.as_deref().unwrap_or("0")
        ));
    }
    if next.base_backup_id != prev.backup_id {
        return broken(format!(
            "applied to the wrong base: it follows backup {:?}, the previous input is backup {:?}",
            next.base_backup_id, prev.backup_id
        ));
    }
    Ok(())
}

/// Checks the first input of a chain.
pub(crate) fn check_first(m: &BackupManifest, label: &str) -> Result<()> {
    if m.kind != BackupKind::Full {
        return Err(DocError::BackupChain(BackupChainError::Broken {
            part: format!("input 1 ({label}), its manifest"),
            offset: MANIFEST_OFFSET,
            what: "an incremental backup: a restore starts with a full backup".into(),
        }));
    }
    Ok(())
}
