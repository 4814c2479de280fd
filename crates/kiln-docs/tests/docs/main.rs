//! kiln-docs' integration tests, one module per subject, in one test binary (each
//! file was a binary of its own, linking the document layer and tantivy again). Run
//! one subject with `cargo test -p kiln-docs --test docs -- queries::`.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod attachments;
mod backup_chain;
mod change_log;
mod documents;
mod expiration;
mod full_text;
mod logged_writes;
mod merge_patch;
mod queries;
mod reduce_index;
mod revisions;
mod sealed_attachments;
mod sealed_backup;
mod sealed_search;
mod search_backup;
mod stored_records;
mod subscriptions;
mod unordered_paging;
mod write_queue;
