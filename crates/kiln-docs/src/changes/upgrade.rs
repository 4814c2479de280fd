//! Databases created before the change log existed get one on open: the trees are
//! created and every stored document is entered at its etag's sequence. Deletes made
//! before then left no tombstone and cannot be recovered.

use super::{encode_entry, ChangeKind};
use crate::model::record;
use crate::model::schema::{sequence_key, CHANGES, CONSUMERS, TOMBSTONES};
use crate::Result;
use kiln_storage::Env;
use std::ops::Bound;

/// Documents entered per transaction while building the log.
const CHUNK: usize = 10_000;

pub(crate) fn add_change_log(env: &Env, database: &str) -> Result<()> {
    if env.begin_read()?.tree_exists(TOMBSTONES)? {
        return Ok(());
    }
    tracing::info!(
        database,
        "building the change log of a database made before it existed"
    );
    // CHANGES is filled before TOMBSTONES is created: a crash in between leaves the
    // trees to be built again, entries already written are written again harmlessly.
    env.submit(|txn| {
        txn.ensure_tree(CHANGES)?;
        txn.ensure_tree(CONSUMERS)
    })?;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let chunk = {
            let r = env.begin_read()?;
            let mut chunk = Vec::with_capacity(CHUNK);
            let start = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            crate::stored::scan_by_id(&r, start, |id, value| {
                let rec = record::decode(id, value)?;
                let entry =
                    encode_entry(ChangeKind::Put, rec.last_modified_ms, rec.collection, id)?;
                chunk.push((rec.etag.sequence, entry, id.as_bytes().to_vec()));
                Ok(chunk.len() < CHUNK)
            })?;
            chunk
        };
        let Some(last) = chunk.last().map(|c| c.2.clone()) else {
            break;
        };
        env.submit(move |txn| {
            for (sequence, entry, _) in &chunk {
                txn.put(CHANGES, &sequence_key(*sequence), entry)?;
            }
            Ok(())
        })?;
        after = Some(last);
    }
    env.submit(|txn| txn.ensure_tree(TOMBSTONES))?;
    Ok(())
}
