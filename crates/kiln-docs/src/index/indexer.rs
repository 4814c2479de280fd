//! The background indexer: one thread per database.
//!
//! Each round takes the indexes that are furthest behind (all those at the same
//! last indexed sequence, so that documents are read and parsed once for all of
//! them), reads up to a batch of change log entries after that sequence from a read
//! snapshot, loads the changed documents in id order (their order in the `docs`
//! tree, so in page order), computes their entries, and then hands ONE small unit to
//! the engine's commit queue which removes the documents' old entries, writes the
//! new ones and the index's new sequence. The work that costs (reading, parsing) is
//! done outside the writer; the unit only applies puts and deletes, so document
//! writes merged into the same group wait little. A unit checks that the index was
//! not reset or deleted meanwhile.
//!
//! Batch sizes tune themselves: from `min_batch`, doubled after each full batch
//! (still behind) up to `max_batch`, halved after a batch that caught up.

use super::def::parse_fields;
use super::{read_state_w, write_state, IndexState, IndexingOptions, Runtime};
use crate::changes::{decode_entry, Change, ChangeKind};
use crate::model::record;
use crate::model::schema::{docs_tree, entries_tree, errors_tree, sequence_key, CHANGES};
use crate::stored::read_last_sequence;
use crate::{Database, DocError, Result};
use crate::{DatabaseError, DocumentError};
use kiln_storage::{ReadTxn, WriteTxn};
use parking_lot::{Condvar, Mutex};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Index entries written by one commit-queue unit at most (split over the indexes
/// of a batch).
const UNIT_ENTRIES: usize = 16_384;

struct State {
    indexes: BTreeMap<String, Arc<Runtime>>,
    /// Bumped by every commit, definition change and stop: the thread's wake-up.
    generation: u64,
    stop: bool,
    /// Batches run, by size (since the database opened).
    batches: BTreeMap<usize, u64>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    progress: Condvar,
    batch: AtomicUsize,
    opts: IndexingOptions,
}

pub(crate) struct Indexer {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Definition changes take turns.
    pub admin: Mutex<()>,
}

/// What one changed document gives one index.
enum Update {
    /// Deleted, or not in the index's collection: remove its entries.
    Remove,
    Entries(Vec<Vec<u8>>),
    /// A reduce index: what the document gives its groups.
    Reduce(Box<super::reduce::Contribution>),
    /// Why the document is not in the index: the text the `ix.<id>.x` tree keeps
    /// (what a client reads of the index's errors), made from a typed error once.
    Error(String),
}

struct Planned {
    rt: Arc<Runtime>,
    updates: Vec<(String, Update)>,
}

/// A changed document's fields as the indexes read them, or why its JSON does not
/// parse; `None` where no index of the batch needs it.
type Parsed = Option<std::result::Result<Value, serde_json::Error>>;

impl Indexer {
    pub fn new(opts: IndexingOptions, loaded: Vec<Runtime>) -> Indexer {
        let indexes = loaded
            .into_iter()
            .map(|rt| (rt.name().to_string(), Arc::new(rt)))
            .collect();
        Indexer {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    indexes,
                    generation: 0,
                    stop: false,
                    batches: BTreeMap::new(),
                }),
                wake: Condvar::new(),
                progress: Condvar::new(),
                batch: AtomicUsize::new(opts.min_batch.max(1)),
                opts,
            }),
            thread: Mutex::new(None),
            admin: Mutex::new(()),
        }
    }

    pub fn options(&self) -> IndexingOptions {
        self.shared.opts
    }

    /// Starts the thread (once); it holds the database only while it works.
    pub fn start(&self, db: &Arc<Database>) -> Result<()> {
        let mut t = self.thread.lock();
        if t.is_some() {
            return Ok(());
        }
        let weak = Arc::downgrade(db);
        let shared = self.shared.clone();
        let waker = self.shared.clone();
        db.add_commit_listener(Arc::new(move |_| waker.poke_for_commit()));
        let handle = std::thread::Builder::new()
            .name(format!("kiln-index-{}", db.name()))
            .spawn(move || run(weak, shared))
            .map_err(|e| DocError::io("(indexer thread)", e))?;
        *t = Some(handle);
        Ok(())
    }

    pub fn stop(&self) {
        {
            let mut st = self.shared.state.lock();
            st.stop = true;
            st.generation += 1;
        }
        self.shared.wake.notify_all();
        self.shared.progress.notify_all();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Runtime>> {
        self.shared.state.lock().indexes.get(name).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Runtime>> {
        self.shared.state.lock().indexes.values().cloned().collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.shared.state.lock().indexes.keys().cloned().collect()
    }

    pub fn insert(&self, rt: Arc<Runtime>) {
        self.shared
            .state
            .lock()
            .indexes
            .insert(rt.name().to_string(), rt);
        self.shared.poke();
    }

    pub fn remove(&self, name: &str) {
        self.shared.state.lock().indexes.remove(name);
        self.shared.poke();
    }

    /// Drops every running index (the database is closing; the thread is stopped).
    pub fn clear(&self) {
        let dropped = std::mem::take(&mut self.shared.state.lock().indexes);
        drop(dropped);
    }

    pub fn batch_size(&self) -> usize {
        self.shared.batch.load(Ordering::Relaxed)
    }

    pub fn batch_histogram(&self) -> Vec<(usize, u64)> {
        self.shared
            .state
            .lock()
            .batches
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Waits until `rt` (or the index that replaced it) reached `sequence`.
    pub fn wait_for(&self, rt: &Arc<Runtime>, sequence: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let name = rt.name().to_string();
        let mut st = self.shared.state.lock();
        loop {
            let Some(now) = st.indexes.get(&name) else {
                return false;
            };
            if now.last_sequence.load(Ordering::SeqCst) >= sequence {
                return true;
            }
            if st.stop
                || self
                    .shared
                    .progress
                    .wait_until(&mut st, deadline)
                    .timed_out()
            {
                let now = st.indexes.get(&name);
                return now.is_some_and(|n| n.last_sequence.load(Ordering::SeqCst) >= sequence);
            }
        }
    }
}

impl Shared {
    fn poke(&self) {
        self.state.lock().generation += 1;
        self.wake.notify_all();
    }

    /// A commit grew the log: only an index can have anything to do about it (a
    /// database without any would wake the thread for nothing on every commit;
    /// defining one pokes it anyway).
    fn poke_for_commit(&self) {
        let mut st = self.state.lock();
        if st.indexes.is_empty() {
            return;
        }
        st.generation += 1;
        drop(st);
        self.wake.notify_all();
    }
}

fn run(weak: Weak<Database>, shared: Arc<Shared>) {
    let mut last_cleanup = Instant::now();
    loop {
        let seen = {
            let st = shared.state.lock();
            if st.stop {
                return;
            }
            st.generation
        };
        let worked = {
            let Some(db) = weak.upgrade() else {
                return;
            };
            if last_cleanup.elapsed() > Duration::from_secs(1) {
                last_cleanup = Instant::now();
                remove_idle_auto_indexes(&db, &shared);
            }
            round(&db, &shared)
        };
        match worked {
            Ok(true) => continue,
            Ok(false) => {}
            Err(DocError::Database(DatabaseError::NotFound(_)))
            | Err(DocError::Database(DatabaseError::ShuttingDown)) => return,
            Err(e) => {
                tracing::warn!(error = %e, "indexing round failed; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let mut st = shared.state.lock();
        if st.generation == seen && !st.stop {
            shared.wake.wait_for(&mut st, Duration::from_secs(1));
        }
    }
}

fn remove_idle_auto_indexes(db: &Database, shared: &Shared) {
    let idle_ms = shared.opts.auto_index_idle_ms;
    if idle_ms == 0 {
        return;
    }
    let now = crate::model::time::now_ms();
    let doomed: Vec<String> = shared
        .state
        .lock()
        .indexes
        .values()
        .filter(|rt| {
            rt.compiled.def.auto
                && now.saturating_sub(rt.last_used_ms.load(Ordering::Relaxed)) > idle_ms
        })
        .map(|rt| rt.name().to_string())
        .collect();
    for name in doomed {
        match db.delete_index(&name) {
            Ok(()) => tracing::info!(index = %name, "unused auto index removed"),
            Err(e) => {
                tracing::warn!(index = %name, error = %e, "removing an unused auto index failed")
            }
        }
    }
}

/// One batch (or, while they stay full, a run of batches) for the indexes furthest
/// behind; false when all are caught up.
fn round(db: &Database, shared: &Shared) -> Result<bool> {
    let env = db.live()?;
    let (searches, list): (Vec<Arc<Runtime>>, Vec<Arc<Runtime>>) = shared
        .state
        .lock()
        .indexes
        .values()
        .cloned()
        .partition(|rt| rt.search.is_some());
    // Full-text indexes go their own way (`search/indexing.rs`), each a batch per
    // round, taking turns with the map indexes.
    let mut worked = false;
    for rt in &searches {
        // indexer <-> search/indexing: one indexer thread serves both kinds of
        // index (full-text rounds reuse its change reading and state), so the
        // circle is that thread's, not a layering fault.
        worked |= crate::search::indexing::round(db, rt, shared.opts)?;
        shared.progress.notify_all();
    }
    if list.is_empty() {
        return Ok(worked);
    }
    let db_seq = read_last_sequence(&env.begin_read()?)?;
    let from = list
        .iter()
        .map(|rt| rt.last_sequence.load(Ordering::SeqCst))
        .min()
        .unwrap_or(db_seq);
    if from >= db_seq {
        let b = shared.batch.load(Ordering::Relaxed);
        shared
            .batch
            .store((b / 2).max(shared.opts.min_batch.max(1)), Ordering::Relaxed);
        return Ok(worked);
    }
    // An index further ahead (defined earlier, say) is where this batch stops, so
    // that the two meet there and from then on share their batches.
    let cap = list
        .iter()
        .map(|rt| rt.last_sequence.load(Ordering::SeqCst))
        .filter(|&e| e > from && e < db_seq)
        .min()
        .unwrap_or(db_seq);
    let defined = list.len() + searches.len();
    let group: Vec<Arc<Runtime>> = list
        .into_iter()
        .filter(|rt| rt.last_sequence.load(Ordering::SeqCst) == from)
        .collect();
    run_batches(db, shared, &group, from, cap, defined)?;
    Ok(true)
}

/// The batches of `group` (whose indexes are all at `from`) up to `cap`: one, or
/// while they come full (far behind) a run of them, where the next one is read
/// and parsed while this one commits: the writer and the parsing overlap.
/// `defined`: how many indexes there were when the round began.
fn run_batches(
    db: &Database,
    shared: &Shared,
    group: &[Arc<Runtime>],
    from: u64,
    cap: u64,
    defined: usize,
) -> Result<()> {
    let mut batch = shared.batch.load(Ordering::Relaxed).max(1);
    let mut p = prepare(db, group, from, cap, batch)?;
    loop {
        let next = if p.full {
            (batch * 2).min(shared.opts.max_batch.max(1))
        } else {
            (batch / 2).max(shared.opts.min_batch.max(1))
        };
        shared.batch.store(next, Ordering::Relaxed);
        let go_on = p.full && p.upto < cap && group_unchanged(shared, group, defined);
        if !go_on {
            return commit(db, shared, group, p);
        }
        let next_from = p.upto;
        let (committed, prepared) = std::thread::scope(|s| {
            let h = s.spawn(|| commit(db, shared, group, p));
            let n = prepare(db, group, next_from, cap, next);
            (h.join(), n)
        });
        committed.map_err(|_| DocError::Internal("an indexing commit panicked".into()))??;
        p = prepared?;
        batch = next;
    }
}

/// Whether a run of batches may go on: not stopping, and the indexes are still
/// the `defined` ones with the group's runtimes. A new index ends the run, so
/// that it can catch up and join.
fn group_unchanged(shared: &Shared, group: &[Arc<Runtime>], defined: usize) -> bool {
    let st = shared.state.lock();
    !st.stop
        && st.indexes.len() == defined
        && group.iter().all(|rt| {
            st.indexes
                .get(rt.name())
                .is_some_and(|x| Arc::ptr_eq(x, rt))
        })
}

/// A batch read and turned into index updates, ready to commit.
struct Prepared {
    planned: Vec<Planned>,
    /// The sequence of each change of the batch, in order.
    sequences: Vec<u64>,
    from: u64,
    upto: u64,
    full: bool,
    batch: usize,
    started: Instant,
}

/// Reads up to `batch` changes after `from` (none past `cap`) from a fresh snapshot,
/// loads and parses their documents and computes each index's updates.
fn prepare(
    db: &Database,
    group: &[Arc<Runtime>],
    from: u64,
    cap: u64,
    batch: usize,
) -> Result<Prepared> {
    let started = Instant::now();
    let env = db.live()?;
    let r = env.begin_read()?;
    let changes = read_changes(db, &r, from, cap, batch)?;
    let full = changes.len() == batch;
    let upto = match changes.last() {
        Some(c) if full => c.etag.sequence,
        _ => cap,
    };
    let parsed = load_documents(&r, group, &changes)?;
    drop(r);
    let planned = group
        .iter()
        .map(|rt| Planned {
            rt: rt.clone(),
            updates: updates(rt, &changes, &parsed),
        })
        .collect();
    Ok(Prepared {
        sequences: changes.iter().map(|c| c.etag.sequence).collect(),
        planned,
        from,
        upto,
        full,
        batch,
        started,
    })
}

/// The changes after `from`, up to `batch` of them, none past `cap`.
pub(crate) fn read_changes(
    db: &Database,
    r: &ReadTxn<'_>,
    from: u64,
    cap: u64,
    batch: usize,
) -> Result<Vec<Change>> {
    let mut changes = Vec::with_capacity(batch.min(1 << 16));
    let mut c = r.cursor(CHANGES)?;
    let mut item = c.seek(&sequence_key(from + 1))?;
    while let Some((k, v)) = item {
        if changes.len() == batch {
            break;
        }
        let change = decode_entry(db.incarnation, k, v)?;
        if change.etag.sequence > cap {
            break;
        }
        changes.push(change);
        item = c.next()?;
    }
    Ok(changes)
}

/// The fields any index of the group reads, parsed from the documents of the
/// changes (one entry per change: `None` for a delete, a document no index of the
/// group covers or one gone since). Documents are loaded in id (page) order.
fn load_documents(
    r: &ReadTxn<'_>,
    group: &[Arc<Runtime>],
    changes: &[Change],
) -> Result<Vec<Parsed>> {
    let mut wanted: Vec<usize> = (0..changes.len())
        .filter(|&i| {
            let c = &changes[i];
            c.kind == ChangeKind::Put
                && group
                    .iter()
                    .any(|rt| rt.compiled.covers_collection(c.collection.as_deref()))
        })
        .collect();
    wanted.sort_by(|&a, &b| changes[a].id.cmp(&changes[b].id));
    let mut keys: Vec<&str> = group.iter().flat_map(|rt| rt.compiled.top_keys()).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut parsed: Vec<Parsed> = (0..changes.len()).map(|_| None).collect();
    let mut raw: Vec<(usize, std::borrow::Cow<'_, [u8]>)> = Vec::with_capacity(wanted.len());
    for i in wanted {
        let id = &changes[i].id;
        let Some(bytes) = crate::stored::get(r, id)? else {
            continue;
        };
        let rec = record::decode(id, bytes)?;
        raw.push((i, rec.to_json(id)?));
    }
    // Parsing is most of a batch's work: split over two threads when it is large.
    if raw.len() >= 2048 {
        let (a, b) = raw.split_at(raw.len() / 2);
        let parse_all =
            |part: &[(usize, std::borrow::Cow<'_, [u8]>)]| -> Vec<(usize, std::result::Result<Value, serde_json::Error>)> {
                part.iter()
                    .map(|(i, json)| (*i, parse_fields(json, &keys)))
                    .collect()
            };
        let (pa, pb) = std::thread::scope(|s| {
            let h = s.spawn(|| parse_all(b));
            let pa = parse_all(a);
            (pa, h.join())
        });
        let pb = pb.map_err(|_| DocError::Internal("an indexing thread panicked".into()))?;
        for (i, v) in pa.into_iter().chain(pb) {
            parsed[i] = Some(v);
        }
    } else {
        for (i, json) in raw {
            parsed[i] = Some(parse_fields(&json, &keys));
        }
    }
    Ok(parsed)
}

/// What each change of the batch gives index `rt`.
fn updates(rt: &Runtime, changes: &[Change], parsed: &[Parsed]) -> Vec<(String, Update)> {
    let mut updates = Vec::with_capacity(changes.len());
    for (i, c) in changes.iter().enumerate() {
        let update = match (
            &parsed[i],
            rt.compiled.covers_collection(c.collection.as_deref()),
        ) {
            (Some(Ok(doc)), true) if rt.compiled.reduce.is_some() => {
                match rt.compiled.reduce.as_ref().map(|r| r.contribution(doc)) {
                    Some(Ok(c)) => Update::Reduce(Box::new(c)),
                    Some(Err(e)) => Update::Error(e.to_string()),
                    None => Update::Remove,
                }
            }
            (Some(Ok(doc)), true) => match rt.compiled.entries(doc) {
                Ok(keys) => {
                    if let Some(k) = keys
                        .iter()
                        .find(|k| k.len() + c.id.len() > kiln_storage::MAX_KEY_SIZE)
                    {
                        Update::Error(format!(
                            "an entry of {} bytes exceeds the key limit of {} bytes",
                            k.len() + c.id.len(),
                            kiln_storage::MAX_KEY_SIZE
                        ))
                    } else {
                        Update::Entries(keys)
                    }
                }
                Err(e) => Update::Error(e.to_string()),
            },
            (Some(Err(e)), true) => Update::Error(format!("stored JSON does not parse: {e}")),
            _ => Update::Remove,
        };
        updates.push((c.id.clone(), update));
    }
    updates
}

/// Commits a prepared batch in units (see `UNIT_ENTRIES`).
fn commit(db: &Database, shared: &Shared, group: &[Arc<Runtime>], p: Prepared) -> Result<()> {
    let env = db.live()?;
    let Prepared {
        planned,
        sequences,
        from,
        upto,
        full,
        batch,
        started,
    } = p;
    let docs = sequences.len();
    let prep = started.elapsed();
    let per_unit = unit_docs(shared, group.len(), full, batch, docs);
    type Part = (Arc<Runtime>, std::vec::IntoIter<(String, Update)>);
    let mut parts: Vec<Part> = planned
        .into_iter()
        .map(|p| (p.rt, p.updates.into_iter()))
        .collect();
    let mut applied_any: Vec<u64>;
    let (mut start, mut unit_from) = (0, from);
    loop {
        let end = (start + per_unit).min(docs);
        let unit_upto = if end == docs {
            upto
        } else {
            sequences[end - 1]
        };
        let unit: Vec<Planned> = parts
            .iter_mut()
            .map(|(rt, it)| Planned {
                rt: rt.clone(),
                updates: it.by_ref().take(end - start).collect(),
            })
            .collect();
        let applied = env.submit_with(move |txn| apply(txn, &unit, unit_from, unit_upto))?;
        advance_runtimes(group, &applied, unit_upto);
        shared.progress.notify_all();
        applied_any = applied;
        if end == docs {
            break;
        }
        start = end;
        unit_from = unit_upto;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-6);
    tracing::debug!(
        batch,
        docs,
        prepare_ms = prep.as_secs_f64() * 1e3,
        total_ms = started.elapsed().as_secs_f64() * 1e3,
        "index batch committed"
    );
    record_rates(group, &applied_any, docs as f64 / secs);
    {
        let mut st = shared.state.lock();
        *st.batches.entry(batch).or_insert(0) += 1;
    }
    shared.progress.notify_all();
    Ok(())
}

/// Moves the runtimes of the indexes a unit updated (`applied`) to the unit's
/// last sequence, now durable.
fn advance_runtimes(group: &[Arc<Runtime>], applied: &[u64], unit_upto: u64) {
    for rt in group {
        if applied.contains(&rt.id) {
            // Only this thread moves a map index's runtime on, after `apply`
            // checked the stored sequence, which the runtime's follows.
            debug_assert!(
                rt.last_sequence.load(Ordering::SeqCst) <= unit_upto,
                "index {} would move its runtime's indexed sequence back from {} to {unit_upto}",
                rt.name(),
                rt.last_sequence.load(Ordering::SeqCst)
            );
            rt.last_sequence.store(unit_upto, Ordering::SeqCst);
        }
    }
}

/// How many of a batch's `docs` documents one unit commits for `indexes` indexes.
/// The batch is applied in units of a few thousand entries, each committing its
/// entries with the sequence of its last change: a document write merged into the
/// same commit group never waits long behind the indexer, and a crash still loses
/// at most the unit in flight.
/// Far behind (a full batch of the largest size) the whole batch is one unit: the
/// indexer then takes the writer for longer so that under a flood of writes it
/// cannot fall behind without bound.
fn unit_docs(shared: &Shared, indexes: usize, full: bool, batch: usize, docs: usize) -> usize {
    if full && batch >= shared.opts.max_batch {
        docs.max(1)
    } else {
        (UNIT_ENTRIES / indexes.max(1)).max(64)
    }
}

/// Folds a batch's rate (documents per second) into the rate of each index of
/// the group that the last unit updated.
fn record_rates(group: &[Arc<Runtime>], applied: &[u64], now: f64) {
    for rt in group {
        if applied.contains(&rt.id) {
            rt.record_rate(now);
        }
    }
}

/// Applies a batch inside the commit queue; returns the ids of the indexes updated
/// (one reset or deleted meanwhile is skipped).
fn apply(txn: &mut WriteTxn<'_>, planned: &[Planned], from: u64, upto: u64) -> Result<Vec<u64>> {
    let mut done = Vec::new();
    for p in planned {
        let name = p.rt.name();
        let Some(st) = read_state_w(txn, name)? else {
            continue;
        };
        if st.id != p.rt.id || st.last_sequence != from {
            continue;
        }
        // A batch holds changes after `from` (`prepare`), so an index only moves on.
        // A reset, which starts again from 0, writes a new id (`create_index`): its
        // old runtime's units are skipped above and never get here.
        assert!(
            upto >= st.last_sequence,
            "index {name} (id {}) would move its indexed sequence back from {} to {upto}",
            st.id,
            st.last_sequence
        );
        let entries = match &p.rt.compiled.reduce {
            // A reduce index: `entries` counts its groups.
            Some(reducer) => apply_reduce(txn, reducer, st, &p.updates)?,
            None => apply_map(txn, st, &p.updates)?,
        };
        write_state(
            txn,
            name,
            &IndexState {
                id: st.id,
                last_sequence: upto,
                entries: entries.max(0) as u64,
            },
        )?;
        done.push(st.id);
    }
    Ok(done)
}

/// A map index's updates: each document's old entries out, its new ones in; the
/// index's entry count after them.
fn apply_map(txn: &mut WriteTxn<'_>, st: IndexState, updates: &[(String, Update)]) -> Result<i64> {
    let (e, d, x) = (entries_tree(st.id), docs_tree(st.id), errors_tree(st.id));
    let mut entries = st.entries as i64;
    let mut errors_possible = txn.tree_len(&x)? > 0;
    let mut key = Vec::new();
    for (id, update) in updates {
        let old = txn.get(&d, id.as_bytes())?.map(<[u8]>::to_vec);
        if let Some(old) = old {
            for k in decode_list(&old)? {
                key.clear();
                key.extend_from_slice(k);
                key.extend_from_slice(id.as_bytes());
                if txn.delete(&e, &key)? {
                    entries -= 1;
                }
            }
            txn.delete(&d, id.as_bytes())?;
        }
        if errors_possible {
            txn.delete(&x, id.as_bytes())?;
        }
        match update {
            Update::Remove | Update::Reduce(_) => {}
            Update::Entries(keys) => {
                for k in keys {
                    key.clear();
                    key.extend_from_slice(k);
                    key.extend_from_slice(id.as_bytes());
                    txn.put(&e, &key, id.as_bytes())?;
                    entries += 1;
                }
                txn.put(&d, id.as_bytes(), &encode_list(keys))?;
            }
            Update::Error(why) => {
                txn.put(&x, id.as_bytes(), why.as_bytes())?;
                errors_possible = true;
            }
        }
    }
    Ok(entries)
}

/// A reduce index's updates: each document's old contribution out, its new one in;
/// the index's group count after them.
fn apply_reduce(
    txn: &mut WriteTxn<'_>,
    reducer: &super::reduce::Reducer,
    st: IndexState,
    updates: &[(String, Update)],
) -> Result<i64> {
    let x = errors_tree(st.id);
    let mut groups = st.entries as i64;
    let mut errors_possible = txn.tree_len(&x)? > 0;
    for (id, update) in updates {
        if errors_possible {
            txn.delete(&x, id.as_bytes())?;
        }
        let new = match update {
            Update::Reduce(c) => Some(c.as_ref()),
            Update::Error(why) => {
                txn.put(&x, id.as_bytes(), why.as_bytes())?;
                errors_possible = true;
                None
            }
            Update::Remove | Update::Entries(_) => None,
        };
        groups += super::reduce::update_document(txn, reducer, st.id, id, new)?;
    }
    Ok(groups)
}

fn encode_list(keys: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(keys.iter().map(|k| k.len() + 2).sum());
    for k in keys {
        out.extend_from_slice(&(k.len() as u16).to_be_bytes());
        out.extend_from_slice(k);
    }
    out
}

fn decode_list(mut b: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let bad = || {
            DocError::Document(DocumentError::Corrupt {
                id: "(index document entries)".into(),
                why: "truncated list".into(),
            })
        };
        let len =
            u16::from_be_bytes(b.get(..2).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
        out.push(b.get(2..2 + len).ok_or_else(bad)?);
        b = &b[2 + len..];
    }
    Ok(out)
}
