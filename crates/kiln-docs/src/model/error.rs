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

    #[error("invalid JSON at line {line}, column {column}: {message}")]
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
