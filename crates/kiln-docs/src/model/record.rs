//! The stored form of a document (the value in the `doc_bodies` tree, `stored.rs`). Format 2, written
//! since issue 41 (bytes on disk):
//!
//! ```text
//! [0]      format version (2)
//! [1..9]   etag sequence, u64 big-endian
//! [9..13]  etag incarnation, u32 big-endian
//! [13..21] last modified, milliseconds since the Unix epoch, u64 big-endian
//! [21..23] collection length in bytes, u16 big-endian (0: no collection)
//! [23]     flags: bits 0-1 the body's codec (0 none, 1 LZ4 block); others 0
//! [24..28] client metadata length in bytes, u32 big-endian (0: none)
//! [28..]   collection (UTF-8), client metadata, body
//! ```
//! The client metadata is `{"@metadata":{...}}` holding only what the client put
//! there (`@collection`, `@expires`, `@attachments`, its own keys), never compressed:
//! attachments and expiration read it without touching the body. The body is the
//! document's own fields as a JSON object (`{"a":1}`), LZ4-compressed (4-byte
//! little-endian length first) when that made it smaller. The server's keys of
//! `@metadata` (`@id`, `@collection`, `@etag`, `@last-modified`) are not stored:
//! the id is the key, the rest is in the header; `Record::to_json` writes them back
//! where format 1 had them, so a client reads the same bytes as before (the test
//! `format_2_reads_back_what_format_1_stored`).
//!
//! Format 1 (read, no longer written): the same first 23 bytes, then the collection,
//! then the whole JSON a client reads, server `@metadata` included (~116 B a
//! document at YCSB's ids: docs/benchmarks.md, SPACE).
//!
//! The fixed header lets a conditional request or a HEAD answer without the JSON.

use super::error::DocumentError;
use super::etag::Etag;
use std::borrow::Cow;

const FORMAT_1: u8 = 1;
const FORMAT_2: u8 = 2;
const HEADER_1_LEN: usize = 23;
const HEADER_2_LEN: usize = 28;
const CODEC_MASK: u8 = 0b11;
const CODEC_LZ4: u8 = 1;
/// Bodies shorter than this are not worth a compression attempt.
const MIN_COMPRESS_BYTES: usize = 64;
/// A decompressed body is at most this many times its compressed bytes (LZ4's
/// bound is ~255): a damaged length never makes a read allocate more than that.
const MAX_EXPANSION: usize = 256;
const METADATA_OPEN: &[u8] = b"{\"@metadata\":{";
/// 9999-12-31T23:59:59.999Z: the last time RFC 3339 writes (`@last-modified`).
const MAX_LAST_MODIFIED_MS: u64 = 253_402_300_799_999;

/// How documents' bodies are compressed when written (`DocsOptions`). Records of
/// either kind are read whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DocumentCompression {
    /// Stored as JSON text.
    None,
    /// LZ4 (block format), kept only when it makes the body smaller. Chosen over
    /// zstd as the default for its read cost: 0.1-0.2 µs to decompress a 1.2 KB
    /// document against zstd-1's 1.5-1.8 µs, where a whole GET costs `kiln serve`
    /// about 6 µs (docs/benchmarks.md, SPACE, "Compression").
    #[default]
    Lz4,
}

/// A name `DocumentCompression` does not have (`--document-compression`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown document compression {0:?} (lz4 or none)")]
pub struct UnknownCompression(pub String);

impl std::str::FromStr for DocumentCompression {
    type Err = UnknownCompression;
    fn from_str(s: &str) -> Result<Self, UnknownCompression> {
        match s {
            "none" => Ok(DocumentCompression::None),
            "lz4" => Ok(DocumentCompression::Lz4),
            _ => Err(UnknownCompression(s.to_string())),
        }
    }
}

impl std::fmt::Display for DocumentCompression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DocumentCompression::None => "none",
            DocumentCompression::Lz4 => "lz4",
        })
    }
}

/// A stored document as a reader sees it: what a GET answers with. `json` is the
/// JSON a client reads, `@metadata` included (see `Database::get_with`).
pub struct RecordView<'a> {
    pub etag: Etag,
    pub last_modified_ms: u64,
    pub collection: Option<&'a str>,
    pub json: &'a [u8],
}

/// A decoded record, borrowed from the stored bytes.
pub(crate) struct Record<'a> {
    pub etag: Etag,
    pub last_modified_ms: u64,
    pub collection: Option<&'a str>,
    /// JSON that carries the client's `@metadata` (what `@attachments` and
    /// `@expires` are read from, `attachments::stored_list`,
    /// `stored_expires_at_ms`): in format 1 the whole document, in format 2
    /// `{"@metadata":{...}}` with the client's keys only, or `{}`. Not what a
    /// client reads: that is `to_json`.
    pub json: &'a [u8],
    body: Body<'a>,
}

enum Body<'a> {
    /// Format 1: `json` is the whole document.
    Whole,
    Plain(&'a [u8]),
    Lz4(&'a [u8]),
}

/// The stored record of a document whose own fields are `body` (a JSON object)
/// and whose client metadata is `client_metadata` (`{"@metadata":{...}}` or empty).
pub(crate) fn encode(
    etag: Etag,
    last_modified_ms: u64,
    collection: Option<&str>,
    body: &[u8],
    client_metadata: &[u8],
    compression: DocumentCompression,
) -> Vec<u8> {
    let coll = collection.unwrap_or("").as_bytes();
    let fixed = HEADER_2_LEN + coll.len() + client_metadata.len();
    let mut out = Vec::with_capacity(fixed + body.len());
    out.push(FORMAT_2);
    out.extend_from_slice(&etag.sequence.to_be_bytes());
    out.extend_from_slice(&etag.incarnation.to_be_bytes());
    out.extend_from_slice(&last_modified_ms.to_be_bytes());
    out.extend_from_slice(&(coll.len() as u16).to_be_bytes());
    out.push(0);
    out.extend_from_slice(&(client_metadata.len() as u32).to_be_bytes());
    out.extend_from_slice(coll);
    out.extend_from_slice(client_metadata);
    if compression == DocumentCompression::Lz4 && body.len() >= MIN_COMPRESS_BYTES {
        let bound = lz4_flex::block::get_maximum_output_size(body.len());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.resize(fixed + 4 + bound, 0);
        if let Ok(n) = lz4_flex::block::compress_into(body, &mut out[fixed + 4..]) {
            if 4 + n < body.len() {
                out.truncate(fixed + 4 + n);
                out[23] = CODEC_LZ4;
                return out;
            }
        }
        out.truncate(fixed);
    }
    out.extend_from_slice(body);
    out
}

pub(crate) fn decode<'a>(id: &str, bytes: &'a [u8]) -> Result<Record<'a>, DocumentError> {
    let corrupt = |why: String| corrupt_record(id, why);
    let header_len = match bytes.first() {
        Some(&FORMAT_1) => HEADER_1_LEN,
        Some(&FORMAT_2) => HEADER_2_LEN,
        Some(other) => return Err(corrupt(format!("unknown record format {other}"))),
        None => return Err(corrupt("empty record".into())),
    };
    if bytes.len() < header_len {
        return Err(corrupt(format!(
            "record of {} bytes is shorter than its header",
            bytes.len()
        )));
    }
    let coll_len = u16::from_be_bytes([bytes[21], bytes[22]]) as usize;
    let coll_end = header_len + coll_len;
    if bytes.len() < coll_end {
        return Err(corrupt(format!(
            "collection length {coll_len} runs past the record"
        )));
    }
    let collection = match coll_len {
        0 => None,
        _ => Some(
            std::str::from_utf8(&bytes[header_len..coll_end])
                .map_err(|_| corrupt("collection name is not UTF-8".into()))?,
        ),
    };
    let (json, body) = if header_len == HEADER_1_LEN {
        (&bytes[coll_end..], Body::Whole)
    } else {
        metadata_and_body(id, bytes, coll_end)?
    };
    Ok(Record {
        etag: Etag {
            sequence: u64_at(bytes, 1),
            incarnation: u32::from_be_bytes(bytes[9..13].try_into().expect("4 bytes")),
        },
        last_modified_ms: u64_at(bytes, 13),
        collection,
        json,
        body,
    })
}

/// What follows the collection (which ends at `coll_end`) in a format 2 record,
/// the rest of its header checked: the client metadata (`{}` when there is
/// none) and the body.
#[inline]
fn metadata_and_body<'a>(
    id: &str,
    bytes: &'a [u8],
    coll_end: usize,
) -> Result<(&'a [u8], Body<'a>), DocumentError> {
    let corrupt = |why: String| corrupt_record(id, why);
    if u64_at(bytes, 13) > MAX_LAST_MODIFIED_MS {
        return Err(corrupt(format!(
            "last modified {} ms is past 9999",
            u64_at(bytes, 13)
        )));
    }
    let flags = bytes[23];
    if flags & !CODEC_MASK != 0 {
        return Err(corrupt(format!("unknown record flags {flags:#04x}")));
    }
    let meta_len = u32::from_be_bytes(bytes[24..28].try_into().expect("4 bytes")) as usize;
    if bytes.len() - coll_end < meta_len {
        return Err(corrupt(format!(
            "client metadata length {meta_len} runs past the record"
        )));
    }
    let meta = &bytes[coll_end..coll_end + meta_len];
    if meta_len > 0
        && (meta_len < METADATA_OPEN.len() + 2
            || !meta.starts_with(METADATA_OPEN)
            || !meta.ends_with(b"}}"))
    {
        return Err(corrupt(
            "client metadata is not {\"@metadata\":{...}}".into(),
        ));
    }
    let rest = &bytes[coll_end + meta_len..];
    let body = match flags & CODEC_MASK {
        0 => Body::Plain(rest),
        CODEC_LZ4 => Body::Lz4(rest),
        codec => return Err(corrupt(format!("unknown body codec {codec}"))),
    };
    Ok((if meta_len == 0 { &b"{}"[..] } else { meta }, body))
}

/// The big-endian u64 at `at` of a record whose header was checked to hold it.
#[inline]
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The error of a record of document `id` that does not decode (`why`).
fn corrupt_record(id: &str, why: String) -> DocumentError {
    DocumentError::Corrupt {
        id: id.to_string(),
        why,
    }
}

impl<'a> Record<'a> {
    /// The JSON a client reads: borrowed for format 1, written out for format 2.
    pub fn to_json(&self, id: &str) -> Result<Cow<'a, [u8]>, DocumentError> {
        if let Body::Whole = self.body {
            return Ok(Cow::Borrowed(self.json));
        }
        let body_len = match self.body {
            Body::Whole => 0,
            Body::Plain(b) => b.len(),
            // Only a hint: decompress_onto checks it.
            Body::Lz4(b) => b
                .get(..4)
                .map_or(0, |l| {
                    u32::from_le_bytes(l.try_into().expect("4 bytes")) as usize
                })
                .min(b.len().saturating_mul(MAX_EXPANSION)),
        };
        let mut out = Vec::with_capacity(body_len + self.json.len() + id.len() + 112);
        self.write_json(id, &mut out)?;
        Ok(Cow::Owned(out))
    }

    /// Appends the JSON a client reads to `out`.
    pub fn write_json(&self, id: &str, out: &mut Vec<u8>) -> Result<(), DocumentError> {
        let corrupt = |why: &str| DocumentError::Corrupt {
            id: id.to_string(),
            why: why.to_string(),
        };
        // The body goes straight into `out` (decompressed there), its closing
        // brace then replaced by the metadata: no buffer between.
        let start = out.len();
        match self.body {
            Body::Whole => {
                out.extend_from_slice(self.json);
                return Ok(());
            }
            Body::Plain(b) => out.extend_from_slice(b),
            Body::Lz4(b) => {
                if let Err(why) = decompress_onto(b, out) {
                    out.truncate(start);
                    return Err(corrupt(&why.to_string()));
                }
            }
        }
        let body = &out[start..];
        if body.len() < 2 || body[0] != b'{' || body[body.len() - 1] != b'}' {
            out.truncate(start);
            return Err(corrupt("stored body is not a JSON object"));
        }
        out.pop();
        let fields = out.len() - start > 1;
        // The client metadata has been checked to be {"@metadata":{ ... }} (decode).
        let client = match self.json.len() {
            2 => &[][..],
            n => &self.json[METADATA_OPEN.len()..n - 2],
        };
        out.reserve(client.len() + id.len() + 112);
        let (c, e, ms) = (self.collection, self.etag, self.last_modified_ms);
        write_metadata(out, fields, id, c, e, ms, client);
        Ok(())
    }

    /// The view of this record whose JSON is `json` (from `to_json`).
    pub fn view<'b>(&'b self, json: &'b [u8]) -> RecordView<'b> {
        RecordView {
            etag: self.etag,
            last_modified_ms: self.last_modified_ms,
            collection: self.collection,
            json,
        }
    }
}

/// Why a stored compressed body does not decompress (the `why` of
/// `DocumentError::Corrupt`).
#[derive(Debug, thiserror::Error)]
enum BodyDecodeError {
    #[error("compressed body shorter than its length")]
    NoLength,
    #[error("compressed body of {stored} bytes claims {claimed} bytes")]
    TooLong { stored: usize, claimed: usize },
    #[error("compressed body gave {got} bytes, {claimed} expected")]
    WrongLength { got: usize, claimed: usize },
    #[error("compressed body does not decompress: {0}")]
    Lz4(#[source] lz4_flex::block::DecompressError),
}

/// Appends the decompressed body to `out`.
fn decompress_onto(stored: &[u8], out: &mut Vec<u8>) -> Result<(), BodyDecodeError> {
    if stored.len() < 4 {
        return Err(BodyDecodeError::NoLength);
    }
    let len = u32::from_le_bytes(stored[..4].try_into().expect("4 bytes")) as usize;
    if len > (stored.len() - 4).saturating_mul(MAX_EXPANSION) {
        return Err(BodyDecodeError::TooLong {
            stored: stored.len() - 4,
            claimed: len,
        });
    }
    let start = out.len();
    out.resize(start + len, 0);
    match lz4_flex::block::decompress_into(&stored[4..], &mut out[start..]) {
        Ok(n) if n == len => Ok(()),
        Ok(n) => Err(BodyDecodeError::WrongLength {
            got: n,
            claimed: len,
        }),
        Err(e) => Err(BodyDecodeError::Lz4(e)),
    }
}

/// The JSON a client reads of a document: `body` (`{...}`, its own fields) with
/// `@metadata` appended as its last key, the server's keys first and then the
/// client's (`client`: `"k":v,...` or empty). The bytes format 1 stored.
pub(crate) fn write_json(
    out: &mut Vec<u8>,
    id: &str,
    collection: Option<&str>,
    etag: Etag,
    last_modified_ms: u64,
    body: &[u8],
    client: &[u8],
) {
    let open = &body[..body.len() - 1];
    out.extend_from_slice(open);
    write_metadata(
        out,
        open.len() > 1,
        id,
        collection,
        etag,
        last_modified_ms,
        client,
    );
}

/// `"@metadata":{...}}` after a body's fields (`fields`: there are some, a comma
/// first), closing the document.
fn write_metadata(
    out: &mut Vec<u8>,
    fields: bool,
    id: &str,
    collection: Option<&str>,
    etag: Etag,
    last_modified_ms: u64,
    client: &[u8],
) {
    use std::io::Write;
    let string = |out: &mut Vec<u8>, s: &str| {
        serde_json::to_writer(out, s).expect("writing to a Vec cannot fail");
    };
    if fields {
        out.push(b',');
    }
    out.extend_from_slice(b"\"@metadata\":{\"@id\":");
    string(out, id);
    if let Some(c) = collection {
        out.extend_from_slice(b",\"@collection\":");
        string(out, c);
    }
    let _ = write!(out, ",\"@etag\":\"{etag}\",\"@last-modified\":");
    string(out, &super::time::format_rfc3339_ms(last_modified_ms));
    if !client.is_empty() {
        out.push(b',');
        out.extend_from_slice(client);
    }
    out.extend_from_slice(b"}}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format-1 encoder (no longer written): records as older servers left them.
    pub(crate) fn encode_1(etag: Etag, ms: u64, collection: Option<&str>, json: &[u8]) -> Vec<u8> {
        let coll = collection.unwrap_or("").as_bytes();
        let mut out = vec![FORMAT_1];
        out.extend_from_slice(&etag.sequence.to_be_bytes());
        out.extend_from_slice(&etag.incarnation.to_be_bytes());
        out.extend_from_slice(&ms.to_be_bytes());
        out.extend_from_slice(&(coll.len() as u16).to_be_bytes());
        out.extend_from_slice(coll);
        out.extend_from_slice(json);
        out
    }

    const ETAG: Etag = Etag {
        incarnation: 7,
        sequence: 99,
    };

    #[test]
    fn format_1_still_reads_and_short_or_unknown_records_are_refused() {
        let rec = encode_1(ETAG, 1234, Some("users"), b"{}");
        let v = decode("x", &rec).unwrap();
        assert_eq!(
            (v.etag, v.last_modified_ms, v.collection, v.json),
            (ETAG, 1234, Some("users"), &b"{}"[..])
        );
        assert!(matches!(v.to_json("x").unwrap(), Cow::Borrowed(b"{}")));
        let none = encode_1(ETAG, 1, None, b"{}");
        assert_eq!(decode("x", &none).unwrap().collection, None);
        assert!(decode("x", &rec[..10]).is_err());
        assert!(decode("x", &[]).is_err());
        let mut bad = rec.clone();
        bad[0] = 9;
        assert!(decode("x", &bad).is_err());
        let mut long = rec;
        long[21] = 0xff;
        assert!(decode("x", &long).is_err());
    }

    #[test]
    fn compression_is_kept_only_when_it_saves() {
        let body = format!("{{\"a\":\"{}\"}}", "xy".repeat(200));
        let lz4 = encode(
            ETAG,
            5,
            None,
            body.as_bytes(),
            b"",
            DocumentCompression::Lz4,
        );
        assert_eq!(lz4[23], CODEC_LZ4);
        assert!(lz4.len() < body.len() / 4, "{}", lz4.len());
        let plain = encode(
            ETAG,
            5,
            None,
            body.as_bytes(),
            b"",
            DocumentCompression::None,
        );
        assert_eq!(plain[23], 0);
        assert_eq!(plain.len(), HEADER_2_LEN + body.len());
        let json = |r: &[u8]| decode("d", r).unwrap().to_json("d").unwrap().into_owned();
        assert_eq!(json(&lz4), json(&plain));
        // Random-looking text does not shrink: stored as it is.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: String = (0..300)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect();
        let body = format!("{{\"a\":\"{noise}\"}}");
        let rec = encode(
            ETAG,
            5,
            None,
            body.as_bytes(),
            b"",
            DocumentCompression::Lz4,
        );
        assert_eq!(rec[23], 0);
        // A damaged compressed body is an error, not a panic or a huge allocation.
        let mut bad = lz4.clone();
        bad[HEADER_2_LEN..HEADER_2_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode("d", &bad).unwrap().to_json("d").is_err());
        let mut bad = lz4;
        let n = bad.len();
        bad.truncate(n - 3);
        assert!(decode("d", &bad).unwrap().to_json("d").is_err());
    }

    #[test]
    fn a_body_that_does_not_decompress_says_why_as_before() {
        let why = |stored: &[u8]| decompress_onto(stored, &mut Vec::new()).unwrap_err();
        assert_eq!(
            why(b"\x01\x00").to_string(),
            "compressed body shorter than its length"
        );
        assert_eq!(
            why(b"\xff\xff\x00\x00\x00").to_string(),
            "compressed body of 1 bytes claims 65535 bytes"
        );
        let five = lz4_flex::block::compress(b"hello");
        let mut stored = 6u32.to_le_bytes().to_vec();
        stored.extend_from_slice(&five);
        assert_eq!(
            why(&stored).to_string(),
            "compressed body gave 5 bytes, 6 expected"
        );
        stored[..4].copy_from_slice(&4u32.to_le_bytes());
        let e = why(&stored);
        assert!(
            e.to_string()
                .starts_with("compressed body does not decompress: "),
            "{e}"
        );
        let cause = std::error::Error::source(&e).expect("lz4's error is kept");
        assert!(cause.is::<lz4_flex::block::DecompressError>());
        let unknown = "zstd".parse::<DocumentCompression>().unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "unknown document compression \"zstd\" (lz4 or none)"
        );
    }

    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z]{0,8}", "\\PC{0,6}", "[\"\\\\/\u{1}é]{0,4}"]
    }

    fn value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            text().prop_map(Value::from),
            "[a-z ]{60,200}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::vec((text(), inner), 0..4)
                    .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Format 2, compressed or not, reads back the bytes format 1 stored for the
        /// same document (what `PreparedDoc::render_format_1` wrote before), and
        /// its header fields.
        #[test]
        fn format_2_reads_back_what_format_1_stored(
            fields in prop::collection::vec((text(), value()), 0..6),
            client in prop::collection::vec((text(), value()), 0..3),
            id in "\\PC{1,20}",
            collection in prop::option::of("[a-z]{1,8}"),
            sequence in any::<u64>(),
            incarnation in any::<u32>(),
            ms in 0u64..(1u64 << 45),
            lz4 in any::<bool>(),
        ) {
            let mut doc = serde_json::Map::new();
            for (k, v) in fields {
                doc.insert(k, v);
            }
            let mut meta = serde_json::Map::new();
            for (k, v) in client {
                if !k.starts_with('@') {
                    meta.insert(k, v);
                }
            }
            if !meta.is_empty() {
                doc.insert("@metadata".into(), serde_json::Value::Object(meta));
            }
            let p = crate::model::document::PreparedDoc::from_value(serde_json::Value::Object(doc)).unwrap();
            let etag = Etag { sequence, incarnation };
            let c = collection.as_deref();
            let old_json = p.render_format_1(&id, c, etag, &crate::model::time::format_rfc3339_ms(ms));
            let old = encode_1(etag, ms, c, &old_json);
            let compression = if lz4 { DocumentCompression::Lz4 } else { DocumentCompression::None };
            let new = encode(etag, ms, c, p.body_json(), &p.client_metadata_json(), compression);
            prop_assert!(new.len() < old.len());
            for rec in [&old, &new] {
                let r = decode(&id, rec).unwrap();
                prop_assert_eq!((r.etag, r.last_modified_ms, r.collection), (etag, ms, c));
                prop_assert_eq!(&r.to_json(&id).unwrap()[..], &old_json[..]);
                prop_assert_eq!(
                    crate::model::attachment_list::stored_list(r.json).len(),
                    crate::model::attachment_list::stored_list(&old_json).len()
                );
            }
            prop_assert_eq!(p.stored_json_len(&id, c, etag, ms), old_json.len());
        }

        /// A record cut short or with a byte replaced is a `CorruptRecord` or
        /// decodes to something, never a panic.
        #[test]
        fn damage_never_panics(
            body in "[a-z ]{0,200}",
            meta in prop::option::of("[a-z]{1,20}"),
            lz4 in any::<bool>(),
            cut in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let body = format!("{{\"t\":\"{body}\"}}");
            let meta = meta.map_or(String::new(), |m| format!("{{\"@metadata\":{{\"m\":\"{m}\"}}}}"));
            let compression = if lz4 { DocumentCompression::Lz4 } else { DocumentCompression::None };
            let rec = encode(ETAG, 1, Some("c"), body.as_bytes(), meta.as_bytes(), compression);
            let at = cut.index(rec.len());
            if at < HEADER_2_LEN + 1 + meta.len() {
                prop_assert!(decode("x", &rec[..at]).is_err());
            } else if let Ok(r) = decode("x", &rec[..at]) {
                let _ = r.to_json("x");
            }
            let mut flipped = rec.clone();
            flipped[at] = byte;
            if let Ok(r) = decode("x", &flipped) {
                let _ = r.to_json("x");
            }
        }
    }
}
