//! Feeding a full-text index: the indexer thread (`index/indexer.rs`) gives each
//! full-text index a round of its own. A round reads a batch of changes after the
//! index's sequence from a read snapshot, deletes each changed document from the
//! tantivy index and adds its new version (if it is still there and in the
//! collection), and commits with the batch's last sequence as the commit's payload
//! (`search/mod.rs`): one tantivy commit per batch.
//!
//! Commit cadence: a tantivy commit syncs each file of its new segment and
//! `meta.json` (about a dozen fsyncs: ~100 ms on a disk whose syncs take 4 ms,
//! which is also the idle update lag W16 measures) and leaves one more segment
//! for the merge threads, so commits are never per document: far behind, batches
//! start at 1,024 documents and double up to 4 x `max_batch` per commit; caught
//! up, a round takes every change that arrived while the last commit ran (group
//! commit, like the journal's), so under a steady stream of writes the commit rate
//! stays near 1 / commit time whatever the write rate, and tantivy's log merge
//! policy keeps the segment count low.

use super::SearchIndex;
use crate::changes::{Change, ChangeKind};
use crate::index::def::{parse_fields, values_at, Step};
use crate::index::indexer::read_changes;
use crate::index::{read_state_w, write_state, IndexState, IndexingOptions, Runtime};
use crate::model::record;
use crate::stored::read_last_sequence;
use crate::{Database, Result};
use kiln_storage::{Env, ReadTxn};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tantivy::{IndexWriter, TantivyDocument, Term};

/// The smallest batch a full-text index reads when behind (caught up, it takes
/// whatever came in).
const FIRST_BATCH: usize = 1024;

/// One batch for full-text index `rt`; false when it is caught up.
pub(crate) fn round(db: &Database, rt: &Arc<Runtime>, opts: IndexingOptions) -> Result<bool> {
    let Some(search) = rt.search.as_ref() else {
        return Ok(false);
    };
    let env = db.live()?;
    let from = rt.last_sequence.load(Ordering::SeqCst);
    let (min_batch, max_batch) = batch_bounds(opts);
    let batch = search
        .batch
        .load(Ordering::Relaxed)
        .clamp(min_batch, max_batch);
    let started = Instant::now();
    let r = env.begin_read()?;
    let db_seq = read_last_sequence(&r)?;
    if from >= db_seq {
        search
            .batch
            .store((batch / 2).max(min_batch), Ordering::Relaxed);
        return Ok(false);
    }
    let changes = read_changes(db, &r, from, db_seq, batch)?;
    let full = changes.len() == batch;
    let upto = match changes.last() {
        Some(c) if full => c.etag.sequence,
        _ => db_seq,
    };
    let mut writer = search.writer.lock();
    index_changes(&mut writer, search, rt, &r, &changes)?;
    drop(r);
    search.commit(&mut writer, upto)?;
    drop(writer);
    // Searchable now; the Kiln-side state follows (it may lag, never lead).
    rt.last_sequence.store(upto, Ordering::SeqCst);
    save_state(env, rt, upto, search.num_docs())?;
    let next = if full {
        (batch * 2).min(max_batch)
    } else {
        (batch / 2).max(min_batch)
    };
    search.batch.store(next, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64().max(1e-6);
    rt.record_rate(changes.len() as f64 / secs);
    tracing::debug!(
        index = rt.name(),
        docs = changes.len(),
        batch,
        upto,
        ms = secs * 1e3,
        segments = search.segments(),
        "full-text batch committed"
    );
    Ok(true)
}

/// The smallest and largest batch of a full-text index.
fn batch_bounds(opts: IndexingOptions) -> (usize, usize) {
    // A tantivy commit costs its fsyncs whatever its size (about a dozen files:
    // ~100 ms on a disk with 4 ms syncs), so batches start and end larger than
    // the map indexes' (whose units cost in proportion to their entries).
    let min_batch = opts.min_batch.max(FIRST_BATCH);
    let max_batch = opts.max_batch.max(1).saturating_mul(4).max(min_batch);
    (min_batch, max_batch)
}

/// Hands the batch's changes to the writer: each changed document deleted from
/// the tantivy index, and its version in the snapshot `r` added when it is still
/// there and in the collection.
fn index_changes(
    writer: &mut IndexWriter<TantivyDocument>,
    search: &SearchIndex,
    rt: &Runtime,
    r: &ReadTxn<'_>,
    changes: &[Change],
) -> Result<()> {
    let mut keys: Vec<&str> = rt.compiled.top_keys().collect();
    keys.sort_unstable();
    keys.dedup();
    for c in changes {
        writer.delete_term(Term::from_field_text(search.id_field, &c.id));
        if c.kind != ChangeKind::Put || !rt.compiled.covers_collection(c.collection.as_deref()) {
            continue;
        }
        let Some(bytes) = crate::stored::get(r, &c.id)? else {
            continue;
        };
        let json = record::decode(&c.id, bytes)?.to_json(&c.id)?;
        let fields = match parse_fields(&json, &keys) {
            Ok(v) => v,
            Err(e) => {
                // The stored document is checked when written: this is damage,
                // which `kiln check` reports; the index goes on without it.
                tracing::warn!(index = rt.name(), id = %c.id, error = %e,
                    "stored JSON does not parse; not in the full-text index");
                continue;
            }
        };
        writer
            .add_document(document_of(search, &rt.compiled.paths, &c.id, &fields))
            .map_err(|e| super::tantivy_err(&search.dir, "adding a document to", e))?;
    }
    Ok(())
}

/// Writes the Kiln-side state of index `rt` after its tantivy commit up to
/// `upto`, unless the index was reset or deleted meanwhile. (Not asserted to
/// grow: a tantivy index rebuilt at open starts again from 0 while the state
/// still says how far the old one had come.)
fn save_state(env: &Env, rt: &Runtime, upto: u64, entries: u64) -> Result<()> {
    let (name, id) = (rt.name().to_string(), rt.id);
    env.submit_with(move |txn| -> Result<()> {
        match read_state_w(txn, &name)? {
            Some(st) if st.id == id => write_state(
                txn,
                &name,
                &IndexState {
                    id,
                    last_sequence: upto,
                    entries,
                },
            ),
            _ => Ok(()),
        }
    })
}

/// The tantivy document of a Kiln document: its id and each field's text.
fn document_of(
    search: &SearchIndex,
    paths: &[Vec<Step>],
    id: &str,
    fields: &Value,
) -> TantivyDocument {
    let mut doc = TantivyDocument::new();
    doc.add_text(search.id_field, id);
    let mut found = Vec::new();
    for (path, field) in paths.iter().zip(&search.fields) {
        found.clear();
        values_at(fields, path, &mut found);
        for v in &found {
            each_text(v, &mut |s| doc.add_text(*field, s));
        }
    }
    doc
}

/// Every string (and number or boolean, as text) in `v`, arrays and objects
/// walked: a full-text field indexes all the text under its path.
pub(crate) fn each_text(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Number(n) => f(&n.to_string()),
        Value::Bool(b) => f(if *b { "true" } else { "false" }),
        Value::Null => {}
        Value::Array(items) => items.iter().for_each(|x| each_text(x, f)),
        Value::Object(m) => m.values().for_each(|x| each_text(x, f)),
    }
}
