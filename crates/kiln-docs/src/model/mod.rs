//! The document model: what a document is, independent of where it is kept.
//!
//! A document and its parsed form (`document`), its stored record (`record`), its
//! id and collection (`id`, with the layer's limits in `limits`), its etag
//! (`etag`), its `@attachments` list (`attachment_list`), the JSON it is written in
//! (`compact_json`, `merge_patch`), the times in it (`time`), the names and key
//! encodings of a database's trees (`schema`), and the errors of all of these
//! (`error`).
//!
//! A leaf: nothing here imports from the rest of `kiln-docs` (only from
//! `kiln-storage`, serde and the standard library), so the modules above can all
//! use it and it can be read and tested alone. Its functions return the model's own
//! errors (`DocumentError`, `AttachmentError`), which `DocError` wraps by `From`.

pub(crate) mod attachment_list;
pub(crate) mod compact_json;
pub(crate) mod document;
pub(crate) mod error;
pub(crate) mod etag;
pub(crate) mod id;
pub(crate) mod limits;
pub(crate) mod merge_patch;
pub(crate) mod record;
pub(crate) mod schema;
pub(crate) mod time;
