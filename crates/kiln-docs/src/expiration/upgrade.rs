//! Databases made before expiration existed (and full backups of them being
//! restored) get the expiration trees, filled from their documents: a document
//! that already carried an `@expires` then expires like one written today. A
//! stored `@expires` that is not an RFC 3339 time is left as it is (the document
//! does not expire), since it was written when it meant nothing.
//!
//! `meta`'s `expirations_building` is set while the trees are filled: an open
//! after a crash in between fills them again (writing an entry twice is harmless:
//! nothing else writes to the database before its open returns).

use crate::model::document::stored_expires_at_ms;
use crate::model::record;
use crate::model::schema::{
    expiration_key, EXPIRATIONS, EXPIRATION_IDS, META, META_EXPIRATIONS_BUILDING,
};
use crate::Result;
use kiln_storage::Env;
use std::ops::Bound;

/// Documents read per transaction while filling the trees.
const CHUNK_DOCS: usize = 10_000;

/// One expiring document: its time, its id and its etag sequence.
type Entry = (u64, String, u64);

pub(crate) fn add_expiration_index(env: &Env, database: &str) -> Result<()> {
    {
        let r = env.begin_read()?;
        if r.tree_exists(EXPIRATION_IDS)? && r.get(META, META_EXPIRATIONS_BUILDING)?.is_none() {
            return Ok(());
        }
    }
    tracing::info!(
        database,
        "building the expiration index of a database made before it existed"
    );
    env.submit(|txn| {
        txn.ensure_tree(EXPIRATIONS)?;
        txn.ensure_tree(EXPIRATION_IDS)?;
        txn.put(META, META_EXPIRATIONS_BUILDING, &[1])
    })?;
    let mut after: Option<Vec<u8>> = None;
    while let Some((entries, last)) = read_chunk(env, after.as_deref())? {
        env.submit(move |txn| {
            for (at, id, sequence) in &entries {
                txn.put(
                    EXPIRATIONS,
                    &expiration_key(*at, id),
                    &sequence.to_be_bytes(),
                )?;
                txn.put(EXPIRATION_IDS, id.as_bytes(), &at.to_be_bytes())?;
            }
            Ok(())
        })?;
        after = Some(last);
    }
    env.submit(|txn| txn.delete(META, META_EXPIRATIONS_BUILDING).map(|_| ()))?;
    Ok(())
}

/// The expiring documents among the next `CHUNK_DOCS` after the id `after`, and
/// the last id read; `None` past the last document.
fn read_chunk(env: &Env, after: Option<&[u8]>) -> Result<Option<(Vec<Entry>, Vec<u8>)>> {
    let r = env.begin_read()?;
    let (mut entries, mut read, mut last) = (Vec::new(), 0, None);
    let start = after.map_or(Bound::Unbounded, Bound::Excluded);
    crate::stored::scan_by_id(&r, start, |id, value| {
        let rec = record::decode(id, value)?;
        if let Some(at) = stored_expires_at_ms(rec.json) {
            if id.len() <= super::MAX_EXPIRING_ID_BYTES {
                entries.push((at, id.to_string(), rec.etag.sequence));
            }
        }
        read += 1;
        last = Some(id.as_bytes().to_vec());
        Ok(read < CHUNK_DOCS)
    })?;
    Ok(last.map(|last| (entries, last)))
}
