//! What follows a document's writes. Revisions, attachments and expiration each
//! keep trees of their own about every document (its earlier versions, the blobs
//! it names, when it expires). Each implements `WriteHook`; `database/apply.rs`
//! calls them through it for every put and delete — a client's, a cluster log
//! entry's, a restore's replay — once the write's checks have passed and before
//! the document's own trees are written (the revisions read the version a write
//! replaces). So `database/` does not call into each concern's internals, and no
//! concern writes a document's trees.

use crate::model::attachment_list::{AttachmentInfo, Hash};
use crate::{Etag, Result};
use kiln_storage::WriteTxn;

/// One put or delete of a document, as the hooks see it.
pub(crate) struct DocWrite<'a> {
    pub id: &'a str,
    /// The version the write replaces: its etag and collection (none: a new
    /// document).
    pub replaced: Option<(Etag, Option<&'a str>)>,
    /// The attachments the replaced version lists.
    pub old_attachments: &'a [AttachmentInfo],
    /// The API key making the write, when known (a replay does not know it).
    pub key_id: Option<&'a str>,
    /// The write's time: when the replaced version stopped being current (a
    /// replay's is the original write's).
    pub at_ms: u64,
    /// The time of the unit applying it (a replay's is the restore's).
    pub unit_ms: u64,
}

/// The version a put writes.
pub(crate) struct Written<'a> {
    pub sequence: u64,
    pub collection: Option<&'a str>,
    pub attachments: &'a [AttachmentInfo],
    pub expires_at_ms: Option<u64>,
}

/// Blobs that no document or revision names any more after a write: collected
/// across the hooks of one write, unlinked after the commit.
pub(crate) type FreedBlobs = Vec<Hash>;

/// A concern that keeps state about each document, kept in step with its writes
/// inside the write's transaction.
pub(crate) trait WriteHook {
    fn on_put(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        written: &Written<'_>,
        freed: &mut FreedBlobs,
    ) -> Result<()>;

    fn on_delete(
        &mut self,
        txn: &mut WriteTxn<'_>,
        write: &DocWrite<'_>,
        freed: &mut FreedBlobs,
    ) -> Result<()>;
}
