//! The change log: one entry per document, at the sequence of its latest write.
//!
//! Trees:
//! - `changes`: sequence (u64 BE) -> entry. A put moves the document's entry from its
//!   old sequence to its new one; a delete moves it too and marks it a tombstone. So
//!   "all changes after E" is one range scan, in etag order, with each id at most once
//!   (its latest change), deletes included.
//! - `tombstones`: id -> sequence of its delete, to find the tombstone again when the
//!   id is written anew or purged.
//!
//! Entry layout: kind (1 byte: 1 put, 2 delete), time in ms (u64 BE), collection
//! length (u16 BE, 0xFFFF for none), collection bytes, id bytes (the rest). The
//! trees' names and the key encoding are in `schema.rs`.

use crate::DocumentError;
use crate::{DocError, Etag, Result};

const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;
const NO_COLLECTION: u16 = u16::MAX;
const HEADER_LEN: usize = 1 + 8 + 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Put,
    Delete,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Put => "put",
            ChangeKind::Delete => "delete",
        }
    }
}

/// One entry of the change log: the latest write of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub id: String,
    /// The etag of the write (for a delete, the tombstone's own etag).
    pub etag: Etag,
    pub kind: ChangeKind,
    pub collection: Option<String>,
    /// When the write happened (ms since the Unix epoch).
    pub at_ms: u64,
}

pub(crate) fn encode(
    kind: ChangeKind,
    at_ms: u64,
    collection: Option<&str>,
    id: &str,
) -> Result<Vec<u8>> {
    let coll = collection.unwrap_or("");
    let coll_len = match collection {
        None => NO_COLLECTION,
        Some(c) => u16::try_from(c.len())
            .ok()
            .filter(|&l| l != NO_COLLECTION)
            .ok_or_else(|| {
                DocError::Document(DocumentError::InvalidCollection {
                    name: c.to_string(),
                    why: "longer than the change log can record".into(),
                })
            })?,
    };
    let mut out = Vec::with_capacity(HEADER_LEN + coll.len() + id.len());
    out.push(match kind {
        ChangeKind::Put => KIND_PUT,
        ChangeKind::Delete => KIND_DELETE,
    });
    out.extend_from_slice(&at_ms.to_be_bytes());
    out.extend_from_slice(&coll_len.to_be_bytes());
    out.extend_from_slice(coll.as_bytes());
    out.extend_from_slice(id.as_bytes());
    Ok(out)
}

/// Decodes the entry stored under `key`; anything malformed is a `CorruptRecord`
/// naming the sequence.
pub(crate) fn decode(incarnation: u32, key: &[u8], value: &[u8]) -> Result<Change> {
    let corrupt = |why: String| {
        DocError::Document(DocumentError::Corrupt {
            id: format!("(change log entry {key:02x?})"),
            why,
        })
    };
    let sequence = u64::from_be_bytes(
        key.try_into()
            .map_err(|_| corrupt(format!("key of {} bytes, expected 8", key.len())))?,
    );
    let (header, rest) = value
        .split_at_checked(HEADER_LEN)
        .ok_or_else(|| corrupt(format!("entry of {} bytes is too short", value.len())))?;
    let kind = match header.first() {
        Some(&KIND_PUT) => ChangeKind::Put,
        Some(&KIND_DELETE) => ChangeKind::Delete,
        other => return Err(corrupt(format!("unknown kind {other:?}"))),
    };
    let at_ms = u64::from_be_bytes(header[1..9].try_into().expect("8 bytes by HEADER_LEN"));
    let coll_len = u16::from_be_bytes(header[9..11].try_into().expect("2 bytes by HEADER_LEN"));
    let (collection, id) = if coll_len == NO_COLLECTION {
        (None, rest)
    } else {
        let (c, id) = rest
            .split_at_checked(coll_len as usize)
            .ok_or_else(|| corrupt(format!("collection of {coll_len} bytes overruns the entry")))?;
        (Some(utf8(c, &corrupt)?), id)
    };
    Ok(Change {
        id: utf8(id, &corrupt)?,
        etag: Etag {
            incarnation,
            sequence,
        },
        kind,
        collection,
        at_ms,
    })
}

fn utf8(bytes: &[u8], corrupt: &dyn Fn(String) -> DocError) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("a name is not UTF-8".into()))
}

/// Which changes a reader wants. Empty = all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeFilter {
    pub id: Option<String>,
    pub prefix: Option<String>,
    pub collection: Option<String>,
}

impl ChangeFilter {
    pub fn matches(&self, c: &Change) -> bool {
        self.id.as_ref().is_none_or(|id| *id == c.id)
            && self.prefix.as_ref().is_none_or(|p| c.id.starts_with(p))
            && self
                .collection
                .as_ref()
                .is_none_or(|want| c.collection.as_ref() == Some(want))
    }

    pub fn is_everything(&self) -> bool {
        self.id.is_none() && self.prefix.is_none() && self.collection.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::schema::sequence_key;

    #[test]
    fn entries_round_trip_and_bad_ones_are_corruption() {
        for (kind, coll) in [
            (ChangeKind::Put, Some("users")),
            (ChangeKind::Delete, None),
            (ChangeKind::Put, Some("")),
        ] {
            let v = encode(kind, 1234, coll, "users/ada").unwrap();
            let c = decode(7, &sequence_key(42), &v).unwrap();
            assert_eq!(c.kind, kind);
            assert_eq!(c.collection.as_deref(), coll);
            assert_eq!(c.id, "users/ada");
            assert_eq!(
                (c.etag.sequence, c.etag.incarnation, c.at_ms),
                (42, 7, 1234)
            );
        }
        let v = encode(ChangeKind::Put, 1, Some("users"), "x").unwrap();
        for cut in 0..v.len() - 1 {
            // Cutting into the header or the collection must be caught; cutting the
            // id only shortens it (the id is the rest), which the key check can't see.
            if cut < HEADER_LEN + 5 {
                assert!(
                    decode(1, &sequence_key(1), &v[..cut]).is_err(),
                    "cut at {cut}"
                );
            }
        }
        let mut bad = v.clone();
        bad[0] = 9;
        assert!(matches!(
            decode(1, &sequence_key(1), &bad),
            Err(DocError::Document(DocumentError::Corrupt { .. }))
        ));
        assert!(decode(1, b"short", &v).is_err());
    }

    #[test]
    fn filters_match_id_prefix_and_collection() {
        let c = Change {
            id: "users/ada".into(),
            etag: Etag {
                incarnation: 1,
                sequence: 1,
            },
            kind: ChangeKind::Put,
            collection: Some("users".into()),
            at_ms: 0,
        };
        assert!(ChangeFilter::default().matches(&c));
        let f = |id: Option<&str>, p: Option<&str>, col: Option<&str>| ChangeFilter {
            id: id.map(Into::into),
            prefix: p.map(Into::into),
            collection: col.map(Into::into),
        };
        assert!(f(Some("users/ada"), None, None).matches(&c));
        assert!(!f(Some("users/ad"), None, None).matches(&c));
        assert!(f(None, Some("users/"), None).matches(&c));
        assert!(!f(None, Some("orders/"), None).matches(&c));
        assert!(f(None, None, Some("users")).matches(&c));
        assert!(!f(None, None, Some("orders")).matches(&c));
    }

    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = ChangeKind> {
        prop_oneof![Just(ChangeKind::Put), Just(ChangeKind::Delete)]
    }

    proptest! {
        /// What the engine hands back is checksummed, but a decoder must not trust
        /// it: damaged entries are a `CorruptRecord`, never a panic, and entries as
        /// written decode to what was written.
        #[test]
        fn entries_round_trip_and_damage_is_an_error(
            k in kind(),
            at_ms in any::<u64>(),
            collection in prop::option::of("\\PC{1,12}"),
            id in "\\PC{1,24}",
            sequence in any::<u64>(),
            cut in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let value = encode(k, at_ms, collection.as_deref(), &id).unwrap();
            let c = decode(7, &sequence_key(sequence), &value).unwrap();
            prop_assert_eq!((c.kind, c.at_ms, c.collection.as_deref(), c.id.as_str()),
                (k, at_ms, collection.as_deref(), id.as_str()));
            prop_assert_eq!(c.etag, Etag { incarnation: 7, sequence });
            let short = &value[..cut.index(value.len())];
            if short.len() < HEADER_LEN + collection.as_ref().map_or(0, String::len) {
                prop_assert!(decode(7, &sequence_key(sequence), short).is_err());
            }
            let mut flipped = value.clone();
            flipped[cut.index(value.len())] = byte;
            let _ = decode(7, &sequence_key(sequence), &flipped);
            prop_assert!(decode(7, &value[..cut.index(value.len()).min(7)], &value).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(k in prop::collection::vec(any::<u8>(), 0..12),
                                       v in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(1, &k, &v);
        }
    }
}
