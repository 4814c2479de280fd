//! The document model's errors: what a document, its id, its etag or its
//! `@attachments` list can be wrong with. The layer's `DocError` holds them
//! (`DocError::Document`, `DocError::Attachment`); the model itself knows nothing
//! of it.

use super::etag::Etag;

/// One document, its id, its body and its etag: what the client sent or what is
/// stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DocumentError {
    #[error("document {id:?} does not exist")]
    NotFound { id: String },

    /// A conditional write found another etag (or no document, or a document where
    /// none was expected). `current` is the etag the document has now, if any.
    #[error("document {id:?}: {why}")]
    Conflict {
        id: String,
        current: Option<Etag>,
        why: String,
    },

    #[error("invalid document id {id:?}: {why}")]
    InvalidId { id: String, why: String },

    #[error("invalid collection name {name:?}: {why}")]
    InvalidCollection { name: String, why: String },

    #[error("invalid database name {name:?}: {why}")]
    InvalidDatabaseName { name: String, why: String },

    #[error("invalid JSON{}: {message}", at_position(*line, *column))]
    MalformedJson {
        line: usize,
        column: usize,
        message: String,
    },

    #[error("invalid document: {0}")]
    Invalid(String),

    /// `@metadata.@expires` is not an RFC 3339 time (`value` as the client sent it).
    #[error("invalid document: @metadata.@expires {value}: {why}")]
    InvalidExpires { value: String, why: String },

    #[error("document of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },

    #[error("invalid etag {0:?}")]
    InvalidEtag(String),

    #[error("stored document {id:?} is unreadable: {why}")]
    Corrupt { id: String, why: String },
}

/// Attachments and a document's `@attachments` list.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachmentError {
    /// An attachment's name, content type or a document's `@attachments` entry
    /// that is not valid (or names a hash the database does not hold).
    #[error("{0}")]
    Invalid(String),

    #[error("document {id:?} has no attachment {name:?}")]
    NotFound { id: String, name: String },
}

/// " at line L, column C" (1-based), or nothing for line 0: an error about a text
/// as a whole (a continuation token, a value decoded without a source) has no
/// place to point at, and "line 0, column 0" would send a reader looking for one.
pub(crate) fn at_position(line: usize, column: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(" at line {line}, column {column}")
    }
}

impl DocumentError {
    /// From a serde_json error, keeping its position apart from its message.
    pub fn malformed_json(e: &serde_json::Error) -> Self {
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        DocumentError::MalformedJson {
            line: e.line(),
            column: e.column(),
            message: text.strip_suffix(&suffix).unwrap_or(&text).to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_given_only_when_there_is_one() {
        let whole = crate::QueryError::Invalid {
            line: 0,
            column: 0,
            message: "malformed continuation token".into(),
        };
        assert_eq!(
            whole.to_string(),
            "invalid query: malformed continuation token"
        );
        let placed = crate::QueryError::Invalid {
            line: 2,
            column: 7,
            message: "expected a value".into(),
        };
        assert_eq!(
            placed.to_string(),
            "invalid query at line 2, column 7: expected a value"
        );
        let json = DocumentError::malformed_json(
            &serde_json::from_str::<serde_json::Value>("{").unwrap_err(),
        );
        assert_eq!(
            json.to_string(),
            "invalid JSON at line 1, column 1: EOF while parsing an object"
        );
    }
}
