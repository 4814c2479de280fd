//! How the database's trees are keyed and their small values encoded, and the
//! decoding of stored records back into documents.

use super::{META, META_LAST_ETAG};
use crate::{record, DocError, Document, Result};
use kiln_storage::ReadTxn;

/// `by_collection` key: collection, 0x00, etag sequence (u64 BE).
pub(crate) fn collection_key(collection: &str, sequence: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(collection.len() + 9);
    k.extend_from_slice(collection.as_bytes());
    k.push(0);
    k.extend_from_slice(&sequence.to_be_bytes());
    k
}

pub(crate) fn decode_u64(b: &[u8], what: &str) -> Result<u64> {
    let arr: [u8; 8] = b.try_into().map_err(|_| DocError::CorruptRecord {
        id: "(meta)".into(),
        why: format!("{what} has {} bytes, expected 8", b.len()),
    })?;
    Ok(u64::from_be_bytes(arr))
}

pub(crate) fn read_last_sequence(r: &ReadTxn<'_>) -> Result<u64> {
    Ok(r.get(META, META_LAST_ETAG)?
        .map(|b| decode_u64(b, "last etag"))
        .transpose()?
        .unwrap_or(0))
}

pub(crate) fn to_document(id: &str, bytes: &[u8]) -> Result<Document> {
    Ok(Document::from_view(id, record::decode(id, bytes)?))
}
