//! `kiln-docs`: Kiln's document layer, embeddable without HTTP.
//!
//! - A [`DocStore`] is a directory of databases; each [`Database`] is its own
//!   `kiln-storage` environment (its own journal, data file and flusher).
//! - Documents are JSON objects stored by id. The server keeps `@metadata` in each
//!   document: `@id`, `@collection`, `@etag` and `@last-modified`; other keys a client
//!   puts under `@metadata` are kept.
//! - Every write gets a new etag from a counter per database, so etags only grow.
//!   A database also has a random incarnation number that is part of every etag, so
//!   that a database deleted and created again never hands out an etag a cache
//!   might still hold for a different document.
//! - A document with `@metadata.@expires` (an RFC 3339 time) is deleted once that
//!   time has passed by [`Database::expire`], which a server calls periodically.
//! - Writes go through the engine's commit queue (`Env::submit`): concurrent writers
//!   are merged into one transaction and one durable journal write.
//!
//! ```no_run
//! use kiln_docs::{Condition, DocStore, DocsOptions};
//! let store = DocStore::open("./kiln-data", DocsOptions::default())?;
//! let db = store.create_database("shop")?;
//! let put = db.put("users/ada", br#"{"name":"Ada"}"#, Condition::None)?;
//! let doc = db.get("users/ada")?.expect("just written");
//! assert_eq!(doc.etag, put.etag);
//! # Ok::<(), kiln_docs::DocError>(())
//! ```

mod attachments;
mod backup;
mod changes;
mod data_dir;
mod data_dir_lock;
mod database;
mod error;
mod expiration;
mod index;
mod model;
mod query;
mod revisions;
mod sealed_file;
pub mod search;
mod store;
mod stored;
mod subscriptions;
mod write_hook;
mod write_queue;

pub use attachments::{
    check_attachments_at, validate_attachment_name, AttachmentCheck, AttachmentInfo,
    AttachmentReader, BlobReader, BlobWriter, StagedBlob, UploadDecoder,
    MAX_ATTACHMENTS_PER_DOCUMENT, MAX_ATTACHMENT_NAME_BYTES, STAGED_TTL_MS,
};
pub use backup::{
    check_chain, parse_manifest, read_manifest, read_manifest_with_key, restore_database,
    restore_database_with_backup_key, verify_backup, verify_backup_with_key, verify_chain,
    verify_chain_with_key, BackupChainStats, BackupKind, BackupManifest, BackupReport, ChainReport,
    ReachedPoint, RestorePoint, RestoreReport, RestoreSource, RestoreTarget,
};
pub use changes::{
    Change, ChangeEntry, ChangeFilter, ChangeKind, ChangesPage, CommitListener, PurgeOutcome,
    PurgeRule, TombstoneStats,
};
pub use data_dir_lock::{DataDirLock, DATA_DIR_LOCK_FILE};
pub use database::{
    Atomicity, BatchOp, BatchOutcome, CollectionCount, Condition, Database, DatabaseStats,
    DeleteOutcome, DocId, LoggedEntry, LoggedOutcome, Page, ParsedDocument, PutOutcome, WriteOp,
};
pub use error::{
    AttachmentError, BackupChainError, DatabaseError, DocError, DocumentError, IndexError,
    QueryError, Result, RevisionError, SubscriptionError,
};
pub use expiration::{DueDocument, ExpireReport};
#[doc(hidden)]
pub use index::COUNTED_ENTRIES_TREES;
pub use index::{
    IndexDefinition, IndexErrorSample, IndexField, IndexInfo, IndexingOptions, ReduceSpec,
};
pub use model::document::Document;
pub use model::etag::Etag;
pub use model::id::{validate_collection, validate_database_name};
pub use model::limits::{check_id, IdRule, MAX_COLLECTION_BYTES};
pub use model::merge_patch::{check_document_patch, merge_patch, patch_document};
pub use model::record::{DocumentCompression, RecordView as DocumentView};
pub use model::time::format_rfc3339_ms;
pub use query::{QueryOptions, QueryResult};
pub use revisions::{
    CollectionRevisions, Revision, RevisionsConfig, MAX_CONFIGURED_COLLECTIONS, MAX_REVISIONS_LIMIT,
};
pub use store::{DocStore, DocsOptions};
pub use subscriptions::{
    validate_subscription_name, BatchLimits, LeaseStrategy, SubscriptionBatch, SubscriptionInfo,
    SubscriptionLease, SubscriptionReader, SubscriptionStart, MAX_SCANNED_PER_BATCH,
    MAX_SUBSCRIPTIONS, MAX_SUBSCRIPTION_NAME_LEN,
};
pub use write_queue::{Reply, WriteQueue, WriteQueueOptions};
