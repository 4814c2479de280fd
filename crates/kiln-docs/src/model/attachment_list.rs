//! A document's `@metadata.@attachments` list: its entries, their names, content
//! types and hashes, as a client sends them and as they are stored. Part of the
//! document model (writing the list is writing the document); the blobs and their
//! reference counts are `crate::attachments`.

use super::error::AttachmentError;
use serde_json::Value;

/// The key of `@metadata` that lists a document's attachments.
pub(crate) const ATTACHMENTS_KEY: &str = "@attachments";

/// The longest attachment name, in bytes.
pub const MAX_ATTACHMENT_NAME_BYTES: usize = 255;

/// The most attachments one document may have.
pub const MAX_ATTACHMENTS_PER_DOCUMENT: usize = 1024;

/// Content of an attachment: its SHA-256.
pub type Hash = [u8; 32];

/// One entry of `@metadata.@attachments`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentInfo {
    pub name: String,
    /// SHA-256 of the bytes, lower-case hex (also the HTTP ETag).
    pub hash: String,
    pub size_bytes: u64,
    pub content_type: String,
}

impl AttachmentInfo {
    fn to_value(&self) -> Value {
        serde_json::json!({
            "name": self.name,
            "hash": self.hash,
            "size": self.size_bytes,
            "content_type": self.content_type,
        })
    }

    pub(crate) fn hash_bytes(&self) -> Result<Hash, AttachmentError> {
        parse_hash(&self.hash)
    }
}

/// Checks an attachment name: non-empty, at most `MAX_ATTACHMENT_NAME_BYTES`, no
/// `/` (a name is the last segment of its URL), no control characters.
pub fn validate_attachment_name(name: &str) -> Result<(), AttachmentError> {
    let bad = |why: &str| {
        Err(AttachmentError::Invalid(format!(
            "invalid attachment name {name:?}: {why}"
        )))
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_ATTACHMENT_NAME_BYTES {
        return bad(&format!(
            "it is {} bytes, the limit is {MAX_ATTACHMENT_NAME_BYTES}",
            name.len()
        ));
    }
    if name.contains('/') {
        return bad("it contains '/'");
    }
    if name.chars().any(char::is_control) {
        return bad("it contains a control character");
    }
    Ok(())
}

/// A content type as stored: visible ASCII and spaces, at most 255 bytes.
pub fn validate_content_type(ct: &str) -> Result<(), AttachmentError> {
    if ct.is_empty() || ct.len() > 255 || !ct.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(AttachmentError::Invalid(format!(
            "invalid content type {ct:?}: it must be 1 to 255 visible ASCII characters"
        )));
    }
    Ok(())
}

pub(crate) fn parse_hash(text: &str) -> Result<Hash, AttachmentError> {
    let mut out = [0u8; 32];
    let bytes = text.as_bytes();
    let valid = bytes.len() == 64 && bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !valid {
        return Err(AttachmentError::Invalid(format!(
            "invalid attachment hash {text:?}: it must be 64 lower-case hex digits (SHA-256)"
        )));
    }
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |c: u8| if c <= b'9' { c - b'0' } else { c - b'a' + 10 };
        out[i] = digit(pair[0]) << 4 | digit(pair[1]);
    }
    Ok(out)
}

pub(crate) fn hash_hex(hash: &Hash) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(64);
    for b in hash {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The attachments listed in a stored document's JSON (lenient about what is not
/// a list of entries: nothing). Documents without the key are not parsed.
pub(crate) fn stored_list(json: &[u8]) -> Vec<AttachmentInfo> {
    let needle = b"\"@attachments\"";
    if !json.windows(needle.len()).any(|w| w == needle) {
        return Vec::new();
    }
    let Ok(value) = serde_json::from_slice::<Value>(json) else {
        return Vec::new();
    };
    match value.get("@metadata").and_then(|m| m.get(ATTACHMENTS_KEY)) {
        Some(list) => parse_list(list, false).unwrap_or_default(),
        None => Vec::new(),
    }
}

/// A `@attachments` value as entries; `strict` (a client's) refuses what a stored
/// one would skip.
pub(crate) fn parse_list(
    list: &Value,
    strict: bool,
) -> Result<Vec<AttachmentInfo>, AttachmentError> {
    let bad = |why: String| AttachmentError::Invalid(format!("@metadata.@attachments: {why}"));
    let Value::Array(items) = list else {
        return Err(bad("it must be an array".into()));
    };
    if items.len() > MAX_ATTACHMENTS_PER_DOCUMENT {
        return Err(bad(format!(
            "{} entries, the limit is {MAX_ATTACHMENTS_PER_DOCUMENT}",
            items.len()
        )));
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let field = |k: &str| item.get(k).and_then(Value::as_str);
        let (Some(name), Some(hash)) = (field("name"), field("hash")) else {
            return Err(bad("each entry needs a string \"name\" and \"hash\"".into()));
        };
        let content_type = field("content_type").unwrap_or("application/octet-stream");
        if strict {
            validate_attachment_name(name)?;
            parse_hash(hash)?;
            validate_content_type(content_type)?;
        }
        out.push(AttachmentInfo {
            name: name.to_string(),
            hash: hash.to_string(),
            size_bytes: item.get("size").and_then(Value::as_u64).unwrap_or(0),
            content_type: content_type.to_string(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = out.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(bad(format!("the name {:?} is listed twice", w[0].name)));
    }
    Ok(out)
}

/// A `@attachments` list as stored (entries sorted by name).
pub(crate) fn list_value(list: &[AttachmentInfo]) -> Value {
    Value::Array(list.iter().map(AttachmentInfo::to_value).collect())
}

/// What an attachment write does to a document's `@attachments` list.
#[derive(Debug, Clone)]
pub(crate) enum AttachmentChange {
    /// Adds the attachment, or replaces the one of that name.
    Put {
        name: String,
        content_type: String,
        hash: Hash,
    },
    Delete {
        name: String,
    },
}

impl AttachmentChange {
    /// The change made to `list` (sorted by name), the list of document `id`.
    pub(crate) fn apply_to(
        &self,
        list: &mut Vec<AttachmentInfo>,
        id: &str,
    ) -> Result<(), AttachmentError> {
        match self {
            AttachmentChange::Put {
                name,
                content_type,
                hash,
            } => {
                list.retain(|a| &a.name != name);
                list.push(AttachmentInfo {
                    name: name.clone(),
                    hash: hash_hex(hash),
                    size_bytes: 0,
                    content_type: content_type.clone(),
                });
                list.sort_by(|a, b| a.name.cmp(&b.name));
            }
            AttachmentChange::Delete { name } => {
                let before = list.len();
                list.retain(|a| &a.name != name);
                if list.len() == before {
                    return Err(AttachmentError::NotFound {
                        id: id.to_string(),
                        name: name.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}
