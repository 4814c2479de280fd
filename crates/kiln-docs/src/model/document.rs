//! Documents as clients send them (parsed and checked before a write is queued) and
//! as they are read back.

use super::error::DocumentError;
use super::etag::Etag;
use super::id::{collection_from_id, validate_collection};
use serde_json::{Map, Value};

/// Keys of `@metadata` that the server owns; a client's values for them are replaced.
const SERVER_METADATA_KEYS: [&str; 4] = ["@id", "@collection", "@etag", "@last-modified"];

/// The key of `@metadata` that makes a document expire (`expiration/`).
const EXPIRES_KEY: &str = "@expires";

/// A document read from a database. `json` is the JSON a client reads, `@metadata`
/// included, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub id: String,
    pub etag: Etag,
    pub last_modified_ms: u64,
    pub collection: Option<String>,
    pub json: Vec<u8>,
}

impl Document {
    /// An owned copy of a stored document borrowed from a snapshot.
    pub fn from_view(id: &str, view: super::record::RecordView<'_>) -> Document {
        Document {
            id: id.to_string(),
            etag: view.etag,
            last_modified_ms: view.last_modified_ms,
            collection: view.collection.map(str::to_string),
            json: view.json.to_vec(),
        }
    }

    /// Decodes a stored record (a value of the `doc_bodies` tree) into an owned document.
    pub(crate) fn from_record(id: &str, bytes: &[u8]) -> Result<Document, DocumentError> {
        let rec = super::record::decode(id, bytes)?;
        let json = rec.to_json(id)?;
        Ok(Document::from_view(id, rec.view(&json)))
    }

    pub fn to_value(&self) -> Result<Value, DocumentError> {
        serde_json::from_slice(&self.json).map_err(|e| DocumentError::Corrupt {
            id: self.id.clone(),
            why: format!("stored JSON does not parse: {e}"),
        })
    }
}

/// `@metadata.@expires`: an RFC 3339 time, or absent (or null) for a document
/// that does not expire. Anything else is refused, so a typo never leaves a
/// document that silently stays forever.
fn expires_at_ms(metadata: &Map<String, Value>) -> Result<Option<u64>, DocumentError> {
    let text = match metadata.get(EXPIRES_KEY) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) => text,
        Some(other) => {
            return Err(DocumentError::InvalidExpires {
                value: other.to_string(),
                why: "it must be a string (an RFC 3339 time such as 2026-05-01T12:00:00Z)".into(),
            })
        }
    };
    super::time::parse_rfc3339_ms(text)
        .map(Some)
        .map_err(|why| DocumentError::InvalidExpires {
            value: Value::from(text.as_str()).to_string(),
            why: why.to_string(),
        })
}

/// When a stored document expires, from its JSON as stored (for the restore's
/// replay and the index built for a database made before expiration existed).
/// Lenient where a new write is strict: an `@expires` stored before it meant
/// anything may be anything, and such a document simply does not expire.
pub(crate) fn stored_expires_at_ms(json: &[u8]) -> Option<u64> {
    // Most documents have no `@expires`: they are not parsed at all.
    let needle = b"\"@expires\"";
    if !json.windows(needle.len()).any(|w| w == needle) {
        return None;
    }
    let value: Value = serde_json::from_slice(json).ok()?;
    match value.get("@metadata")?.as_object() {
        Some(metadata) => expires_at_ms(metadata).ok().flatten(),
        None => None,
    }
}

/// A document body checked and split before its write is queued, so that the
/// commit queue (which holds the writer) only has to splice in the metadata.
#[derive(Debug, Clone)]
pub(crate) struct PreparedDoc {
    /// The document's own fields as JSON text, without `@metadata`, e.g. `{"a":1}`.
    body_json: Vec<u8>,
    /// What the client put under `@metadata`, less the server's keys.
    client_metadata: Map<String, Value>,
    /// The collection named in `@metadata`, if any.
    explicit_collection: Option<String>,
    /// When the document expires (`@metadata.@expires`, ms since the epoch).
    expires_at_ms: Option<u64>,
}

impl PreparedDoc {
    pub fn parse(body: &[u8]) -> Result<PreparedDoc, DocumentError> {
        // Most bodies need no `Value`: they are stored as they came, compacted
        // (see `compact_json`); the rest, errors included, take the long way.
        if let Some(body_json) = super::compact_json::compact(body) {
            return Ok(PreparedDoc {
                body_json,
                client_metadata: Map::new(),
                explicit_collection: None,
                expires_at_ms: None,
            });
        }
        let value: Value =
            serde_json::from_slice(body).map_err(|e| DocumentError::malformed_json(&e))?;
        Self::from_value(value)
    }

    pub fn from_value(value: Value) -> Result<PreparedDoc, DocumentError> {
        let Value::Object(mut fields) = value else {
            return Err(DocumentError::Invalid(
                "a document must be a JSON object".into(),
            ));
        };
        let mut client_metadata = match fields.shift_remove("@metadata") {
            None => Map::new(),
            Some(Value::Object(m)) => m,
            Some(_) => {
                return Err(DocumentError::Invalid(
                    "@metadata must be a JSON object".into(),
                ))
            }
        };
        let explicit_collection = match client_metadata.get("@collection") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => {
                validate_collection(c)?;
                Some(c.clone())
            }
            Some(_) => {
                return Err(DocumentError::Invalid(
                    "@metadata.@collection must be a string".into(),
                ))
            }
        };
        // Kept in `client_metadata` as the client wrote it; the index has its time.
        let expires_at_ms = expires_at_ms(&client_metadata)?;
        for key in SERVER_METADATA_KEYS {
            client_metadata.shift_remove(key);
        }
        let body_json =
            serde_json::to_vec(&Value::Object(fields)).expect("a Value always serializes");
        Ok(PreparedDoc {
            body_json,
            client_metadata,
            explicit_collection,
            expires_at_ms,
        })
    }

    /// What the client put under `@metadata`, less the server's keys.
    pub fn client_metadata(&self) -> &Map<String, Value> {
        &self.client_metadata
    }

    /// This document with `@metadata.@attachments` set to `list` (removed when
    /// `list` is empty): the list a put settled on (`attachments::settle`).
    pub fn with_attachments(&self, list: &[super::attachment_list::AttachmentInfo]) -> PreparedDoc {
        let mut out = self.clone();
        let key = super::attachment_list::ATTACHMENTS_KEY;
        if list.is_empty() {
            out.client_metadata.shift_remove(key);
        } else {
            out.client_metadata
                .insert(key.to_string(), super::attachment_list::list_value(list));
        }
        out
    }

    /// When the document expires, if it does (`@metadata.@expires`).
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.expires_at_ms
    }

    /// The collection of this document when stored under `id`.
    pub fn collection_for<'a>(&'a self, id: &'a str) -> Option<&'a str> {
        self.explicit_collection
            .as_deref()
            .or_else(|| collection_from_id(id))
    }

    /// The document's own fields, a JSON object (`{"a":1}`): a record's body.
    pub fn body_json(&self) -> &[u8] {
        &self.body_json
    }

    /// What the client put under `@metadata` (less the server's keys) as a record
    /// stores it: `{"@metadata":{...}}`, empty when there is nothing.
    pub fn client_metadata_json(&self) -> Vec<u8> {
        if self.client_metadata.is_empty() {
            return Vec::new();
        }
        let mut out = b"{\"@metadata\":{".to_vec();
        self.write_client_metadata(&mut out);
        out.extend_from_slice(b"}}");
        out
    }

    /// `"k":v,...` (the server's own keys were removed in `from_value`).
    fn write_client_metadata(&self, out: &mut Vec<u8>) {
        for (i, (k, v)) in self.client_metadata.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut *out, k).expect("writing to a Vec cannot fail");
            out.push(b':');
            serde_json::to_writer(&mut *out, v).expect("a Value always serializes");
        }
    }

    /// The length of the JSON a client reads of this document stored under `id`
    /// (`record::write_json`), for `max_document_bytes`.
    pub fn stored_json_len(
        &self,
        id: &str,
        collection: Option<&str>,
        etag: Etag,
        last_modified_ms: u64,
    ) -> usize {
        let mut client = Vec::new();
        self.write_client_metadata(&mut client);
        // Only the metadata is written here: the body's length is added.
        let mut out = Vec::with_capacity(128 + client.len());
        super::record::write_json(
            &mut out,
            id,
            collection,
            etag,
            last_modified_ms,
            b"{}",
            &client,
        );
        let open = self.body_json.len() - 1;
        out.len() - 1 + open + usize::from(open > 1)
    }

    /// The JSON format 1 stored: the body with `@metadata` appended as its last
    /// key (what `record` tests format 2 against).
    #[cfg(test)]
    pub fn render_format_1(
        &self,
        id: &str,
        collection: Option<&str>,
        etag: Etag,
        last_modified: &str,
    ) -> Vec<u8> {
        // body_json is a serialized object: it ends with '}' and is "{}" when empty.
        let body = &self.body_json[..self.body_json.len() - 1];
        let mut out = Vec::with_capacity(body.len() + id.len() + 128);
        out.extend_from_slice(body);
        if body.len() > 1 {
            out.push(b',');
        }
        let string = |out: &mut Vec<u8>, s: &str| {
            serde_json::to_writer(out, s).expect("writing to a Vec cannot fail");
        };
        out.extend_from_slice(b"\"@metadata\":{\"@id\":");
        string(&mut out, id);
        if let Some(c) = collection {
            out.extend_from_slice(b",\"@collection\":");
            string(&mut out, c);
        }
        out.extend_from_slice(b",\"@etag\":\"");
        out.extend_from_slice(etag.to_string().as_bytes());
        out.extend_from_slice(b"\",\"@last-modified\":");
        string(&mut out, last_modified);
        for (k, v) in &self.client_metadata {
            out.push(b',');
            string(&mut out, k);
            out.push(b':');
            serde_json::to_writer(&mut out, v).expect("a Value always serializes");
        }
        out.extend_from_slice(b"}}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::time::format_rfc3339_ms;

    fn etag() -> Etag {
        Etag {
            incarnation: 1,
            sequence: 5,
        }
    }

    #[test]
    fn metadata_is_spliced_and_server_keys_replaced() {
        let p = PreparedDoc::parse(
            br#"{"name":"Ada","@metadata":{"@etag":"forged","tag":"x","@collection":"people"}}"#,
        )
        .unwrap();
        assert_eq!(p.collection_for("users/1"), Some("people"));
        let out = p.render_format_1("users/1", Some("people"), etag(), &format_rfc3339_ms(0));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["name"], "Ada");
        assert_eq!(v["@metadata"]["@etag"], "5-00000001");
        assert_eq!(v["@metadata"]["tag"], "x");
        assert_eq!(v["@metadata"]["@collection"], "people");
        assert_eq!(v["@metadata"]["@last-modified"], "1970-01-01T00:00:00.000Z");
        let empty = PreparedDoc::parse(b"{}").unwrap().render_format_1(
            "a",
            None,
            etag(),
            &format_rfc3339_ms(0),
        );
        let v: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(v["@metadata"]["@id"], "a");
        assert!(v["@metadata"].get("@collection").is_none());
    }

    #[test]
    fn rejects_non_objects_and_names_the_position_of_bad_json() {
        assert!(matches!(
            PreparedDoc::parse(b"[1]"),
            Err(DocumentError::Invalid(_))
        ));
        match PreparedDoc::parse(b"{\n  \"a\": tru }") {
            Err(DocumentError::MalformedJson { line, column, .. }) => {
                assert_eq!((line, column), (2, 11))
            }
            other => panic!("{other:?}"),
        }
        assert!(PreparedDoc::parse(br#"{"@metadata":[]}"#).is_err());
        assert!(PreparedDoc::parse(br#"{"@metadata":{"@collection":"@x"}}"#).is_err());
        assert!(PreparedDoc::parse(br#"{"@metadata":{"@collection":5}}"#).is_err());
    }

    /// A stored `@expires` is read leniently (one written before it meant anything
    /// may be anything): only a valid time under `@metadata` counts.
    #[test]
    fn stored_expiry_is_read_leniently() {
        let read = |json: &str| stored_expires_at_ms(json.as_bytes());
        assert_eq!(
            read(r#"{"@metadata":{"@expires":"1970-01-01T00:00:01Z"}}"#),
            Some(1_000)
        );
        assert_eq!(read(r#"{"a":1,"@metadata":{"@id":"x"}}"#), None);
        assert_eq!(read(r#"{"@metadata":{"@expires":"soon"}}"#), None);
        assert_eq!(read(r#"{"@metadata":{"@expires":5}}"#), None);
        assert_eq!(read(r#"{"@expires":"1970-01-01T00:00:01Z"}"#), None);
        assert_eq!(read(r#"{"@metadata":"@expires"}"#), None);
        assert_eq!(read("not json \"@expires\""), None);
    }
}
