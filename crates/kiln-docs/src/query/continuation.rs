//! Continuation tokens: where the next page of a query starts (an offset, or a
//! point in an index's entries), encoded for the client and checked on the way
//! back against the query and the index they were made for.

use super::parse;
use super::parse::Query;
use crate::index::Runtime;
use crate::QueryError;
use crate::{DocError, Result};

/// Where a page continues from.
pub(super) enum Cont {
    Offset(usize),
    After {
        index_id: u64,
        desc: bool,
        /// Matches before the point (for the total when it is counted by walking).
        before: u64,
        key: Vec<u8>,
    },
}

impl Cont {
    pub(super) fn encode(&self) -> String {
        match self {
            Cont::Offset(n) => format!("o{n}"),
            Cont::After {
                index_id,
                desc,
                before,
                key,
            } => {
                let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
                format!("k{index_id}.{}.{before}.{hex}", u8::from(*desc))
            }
        }
    }

    pub(super) fn decode(t: &str) -> Result<Cont> {
        if let Some(n) = t.strip_prefix('o') {
            let n: usize = n.parse().map_err(|_| malformed())?;
            if n > parse::MAX_OFFSET {
                return Err(malformed());
            }
            return Ok(Cont::Offset(n));
        }
        let rest = t.strip_prefix('k').ok_or_else(malformed)?;
        let parts: Vec<&str> = rest.splitn(4, '.').collect();
        let [id, desc, before, hex] = parts.as_slice() else {
            return Err(malformed());
        };
        if hex.len() % 2 != 0 || hex.len() > 2 * kiln_storage::MAX_KEY_SIZE {
            return Err(malformed());
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| malformed())?;
        Ok(Cont::After {
            index_id: id.parse().map_err(|_| malformed())?,
            desc: *desc == "1",
            before: before.parse().map_err(|_| malformed())?,
            key,
        })
    }
}

/// Where a page of an index in order resumes: (index id, descending, matches
/// before it, the entry's key).
pub(super) type After = (u64, bool, u64, Vec<u8>);

/// Where a walk of index `rt` (in the order `ordered`) resumes: the matches before
/// the point and its key, when the point is of this index in this order.
pub(super) fn resume_in(
    after: Option<After>,
    rt: &Runtime,
    ordered: Option<bool>,
) -> Result<Option<(u64, Vec<u8>)>> {
    match after {
        None => Ok(None),
        Some((id, d, before, key))
            if id == rt.id
                && ordered == Some(d)
                && !rt.compiled.def.multi_valued()
                && rt.compiled.def.fields.len() == 1 =>
        {
            Ok(Some((before, key)))
        }
        Some(_) => Err(DocError::Query(QueryError::Invalid {
            line: 0,
            column: 0,
            message: "the continuation token belongs to another query, or the \
                      index was reset since; start over"
                .into(),
        })),
    }
}

/// A token that is not one the server made.
fn malformed() -> DocError {
    DocError::Query(QueryError::Invalid {
        line: 0,
        column: 0,
        message: "malformed continuation token".into(),
    })
}

/// A continuation token given to a query it was not made for.
pub(super) fn foreign_continuation() -> DocError {
    DocError::Query(QueryError::Invalid {
        line: 0,
        column: 0,
        message: "the continuation token belongs to another query; start over".into(),
    })
}

/// A query's identity: a hash of its text and parameters. A token carries it
/// (`<16 hex>:<token>`), so that a token given to another query (or the same text
/// with other parameters) is refused instead of read as an offset into it; the
/// query's ETag (`fingerprint` in mod.rs) starts with it.
pub(super) fn query_tag(text: &str, params: &serde_json::Map<String, serde_json::Value>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    // The same text as `Value::Object(params.clone()).to_string()`, without the copy.
    serde_json::to_string(params)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// `token` as given to the client of the query tagged `tag`.
pub(super) fn bind(token: &str, tag: u64) -> String {
    format!("{tag:016x}:{token}")
}

/// The token inside `given` when it was made for the query tagged `tag`.
pub(super) fn unbind(given: &str, tag: u64) -> Result<&str> {
    let tagged = given
        .split_once(':')
        .filter(|(hex, _)| hex.len() == 16)
        .and_then(|(hex, inner)| Some((u64::from_str_radix(hex, 16).ok()?, inner)));
    match tagged {
        Some((made_for, inner)) if made_for == tag => Ok(inner),
        Some(_) => Err(foreign_continuation()),
        None => Err(malformed()),
    }
}

/// A continuation token's offset (set on `q`), or the index entry it resumes after.
pub(super) fn resume_point(q: &mut Query, continuation: Option<&str>) -> Result<Option<After>> {
    Ok(match continuation.map(Cont::decode).transpose()? {
        Some(Cont::Offset(n)) => {
            q.offset = n;
            None
        }
        Some(Cont::After {
            index_id,
            desc,
            before,
            key,
        }) => {
            q.offset = 0;
            Some((index_id, desc, before, key))
        }
        None => None,
    })
}

/// The continuation of a full page (`page_len` documents) of a walk of index
/// `index_id`: the last entry put on it (`last`: its key and match number) where
/// the entries come in key order (`key_order`), else the next page's offset.
pub(super) fn stream_continuation(
    q: &Query,
    index_id: u64,
    desc: bool,
    key_order: bool,
    last: Option<(Vec<u8>, u64)>,
    page_len: usize,
) -> String {
    if !key_order {
        return Cont::Offset(q.offset + page_len).encode();
    }
    let (key, before) = last.unwrap_or_default();
    Cont::After {
        index_id,
        desc,
        before,
        key,
    }
    .encode()
}
