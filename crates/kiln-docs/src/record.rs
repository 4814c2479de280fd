//! The stored form of a document (the value in the `docs` tree):
//!
//! ```text
//! [0]      format version (1)
//! [1..9]   etag sequence, u64 big-endian
//! [9..13]  etag incarnation, u32 big-endian
//! [13..21] last modified, milliseconds since the Unix epoch, u64 big-endian
//! [21..23] collection length in bytes, u16 big-endian (0: no collection)
//! [23..]   collection (UTF-8), then the document's JSON with its `@metadata`
//! ```
//! The fixed header lets a conditional request or a HEAD answer without parsing JSON.

use crate::{DocError, Etag, Result};

const FORMAT_VERSION: u8 = 1;
const HEADER_LEN: usize = 23;

/// A stored document as borrowed from a read snapshot: what a GET answers with,
/// without copying the JSON out (see `Database::get_with`).
pub struct RecordView<'a> {
    pub etag: Etag,
    pub last_modified_ms: u64,
    pub collection: Option<&'a str>,
    pub json: &'a [u8],
}

pub(crate) fn encode(
    etag: Etag,
    last_modified_ms: u64,
    collection: Option<&str>,
    json: &[u8],
) -> Vec<u8> {
    let coll = collection.unwrap_or("").as_bytes();
    let mut out = Vec::with_capacity(HEADER_LEN + coll.len() + json.len());
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&etag.sequence.to_be_bytes());
    out.extend_from_slice(&etag.incarnation.to_be_bytes());
    out.extend_from_slice(&last_modified_ms.to_be_bytes());
    out.extend_from_slice(&(coll.len() as u16).to_be_bytes());
    out.extend_from_slice(coll);
    out.extend_from_slice(json);
    out
}

pub(crate) fn decode<'a>(id: &str, bytes: &'a [u8]) -> Result<RecordView<'a>> {
    let corrupt = |why: String| DocError::CorruptRecord {
        id: id.to_string(),
        why,
    };
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "record of {} bytes is shorter than its header",
            bytes.len()
        )));
    }
    if bytes[0] != FORMAT_VERSION {
        return Err(corrupt(format!("unknown record format {}", bytes[0])));
    }
    let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let coll_len = u16::from_be_bytes([bytes[21], bytes[22]]) as usize;
    let json_start = HEADER_LEN + coll_len;
    if bytes.len() < json_start {
        return Err(corrupt(format!(
            "collection length {coll_len} runs past the record"
        )));
    }
    let collection = match coll_len {
        0 => None,
        _ => Some(
            std::str::from_utf8(&bytes[HEADER_LEN..json_start])
                .map_err(|_| corrupt("collection name is not UTF-8".into()))?,
        ),
    };
    Ok(RecordView {
        etag: Etag {
            sequence: u64_at(1),
            incarnation: u32::from_be_bytes(bytes[9..13].try_into().expect("4 bytes")),
        },
        last_modified_ms: u64_at(13),
        collection,
        json: &bytes[json_start..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects_short_or_unknown_records() {
        let etag = Etag {
            incarnation: 7,
            sequence: 99,
        };
        let rec = encode(etag, 1234, Some("users"), b"{}");
        let v = decode("x", &rec).unwrap();
        assert_eq!(
            (v.etag, v.last_modified_ms, v.collection, v.json),
            (etag, 1234, Some("users"), &b"{}"[..])
        );
        let none = encode(etag, 1, None, b"{}");
        assert_eq!(decode("x", &none).unwrap().collection, None);
        assert!(decode("x", &rec[..10]).is_err());
        let mut bad = rec.clone();
        bad[0] = 9;
        assert!(decode("x", &bad).is_err());
        let mut long = rec;
        long[21] = 0xff;
        assert!(decode("x", &long).is_err());
    }

    use proptest::prelude::*;

    proptest! {
        /// Records as written decode to what was written; a record cut short or
        /// with a byte replaced is a `CorruptRecord` or decodes within its bytes,
        /// never a panic.
        #[test]
        fn records_round_trip_and_damage_never_panics(
            sequence in any::<u64>(),
            incarnation in any::<u32>(),
            ms in any::<u64>(),
            collection in prop::option::of("\\PC{1,12}"),
            json in prop::collection::vec(any::<u8>(), 0..64),
            cut in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let etag = Etag { sequence, incarnation };
            let rec = encode(etag, ms, collection.as_deref(), &json);
            let v = decode("x", &rec).unwrap();
            prop_assert_eq!((v.etag, v.last_modified_ms, v.collection, v.json),
                (etag, ms, collection.as_deref(), &json[..]));
            let at = cut.index(rec.len());
            if at < HEADER_LEN + collection.as_ref().map_or(0, String::len) {
                prop_assert!(decode("x", &rec[..at]).is_err());
            }
            let mut flipped = rec.clone();
            flipped[at] = byte;
            if let Ok(v) = decode("x", &flipped) {
                prop_assert!(v.json.len() + v.collection.map_or(0, str::len) + HEADER_LEN == flipped.len());
            }
        }
    }
}
