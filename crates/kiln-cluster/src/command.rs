//! What the Raft log carries (a [`Command`] per entry) and what applying an entry
//! answers ([`Answer`]). Both travel as JSON between nodes.

use kiln_docs::{Condition, DocError, Etag};
use serde::{Deserialize, Serialize};

/// One entry's change to the document store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Creates a database with the incarnation (the etags' suffix) the leader
    /// drew at random: the same on every node, another for each creation.
    CreateDatabase {
        name: String,
        incarnation: u32,
    },
    DeleteDatabase {
        name: String,
    },
    /// Defines an index (derived data: every node builds it from its documents).
    DefineIndex {
        database: String,
        #[serde(with = "crate::codec::json_text_in_binary")]
        definition: kiln_docs::IndexDefinition,
    },
    DeleteIndex {
        database: String,
        name: String,
    },
    /// Sets which collections keep document revisions (applied once per database,
    /// its log index stored with it).
    SetRevisionsConfig {
        database: String,
        config: kiln_docs::RevisionsConfig,
    },
    /// Removes every revision of one document (applied once, as above).
    PurgeRevisions {
        database: String,
        id: String,
    },
    /// Writes to one database at the leader's time `at_ms`: all or none (a
    /// client's batch), or each on its own.
    Write {
        database: String,
        at_ms: u64,
        all_or_none: bool,
        ops: Vec<LoggedOp>,
    },
    /// Bytes of an attachment upload (`upload_id`, drawn by the leader at random),
    /// written at `offset` of the upload's file, which is kept until at least
    /// `keep_until_ms` (leader time; see `uploads`). `at_ms` is the leader's time.
    AttachmentChunk {
        database: String,
        at_ms: u64,
        upload_id: u64,
        offset: u64,
        keep_until_ms: u64,
        #[serde(with = "crate::uploads::base64_text")]
        bytes: Vec<u8>,
    },
    /// The upload `upload_id`, checked to be `size_bytes` hashing to `hash` (SHA-256,
    /// lower-case hex), attached to the document `id` as `name`, in one step with
    /// the document's new version; the upload is removed whatever the outcome.
    PutAttachment {
        database: String,
        at_ms: u64,
        upload_id: u64,
        id: String,
        name: String,
        content_type: String,
        size_bytes: u64,
        hash: String,
        condition: LoggedCondition,
    },
    DeleteAttachment {
        database: String,
        at_ms: u64,
        id: String,
        name: String,
        condition: LoggedCondition,
    },
    /// Removes an upload its leader will not finish (the request's body broke off).
    DropUpload {
        database: String,
        upload_id: u64,
    },
    /// The upload `upload_id`, checked to be `size_bytes` hashing to `hash`, staged
    /// for a batch to name (`POST /dbs/{db}/attachments`) until the leader's time
    /// `at_ms` plus `STAGED_TTL_MS`; the upload is removed whatever the outcome.
    /// A staged blob no document names expires at the first entry of its
    /// database whose leader time is past that (`uploads::expire`).
    StageAttachment {
        database: String,
        at_ms: u64,
        upload_id: u64,
        size_bytes: u64,
        hash: String,
    },
    /// Forgets the tombstones of the database (of `incarnation`) below
    /// `below_sequence`, the bound the leader computed (the etag asked for, its
    /// last write, its registered consumers), whose delete is older than
    /// `older_than_ms` at the leader's time `at_ms`
    /// (`Database::purge_tombstones_logged`).
    PurgeTombstones {
        database: String,
        incarnation: u32,
        at_ms: u64,
        below_sequence: u64,
        older_than_ms: Option<u64>,
    },
    /// Saves an API key's record on every node (the server's key file, through
    /// `api_keys::ApiKeyStore`), replacing one of the same id: the record as the
    /// server's JSON, which holds the hash of the key's secret, never the secret.
    PutApiKey {
        record_json: String,
    },
    /// Removes the API key `id` on every node.
    RevokeApiKey {
        id: String,
    },
    /// Restores `database` (replacing it) from the backup sent as upload
    /// `upload_id` of that database (`AttachmentChunk`s), checked to be
    /// `size_bytes` hashing to `hash`, up to `until` (a restore point's text; the
    /// latest when absent). The restored database records this entry as the last
    /// applied to it. The upload is removed whatever the outcome.
    RestoreDatabase {
        database: String,
        at_ms: u64,
        upload_id: u64,
        size_bytes: u64,
        hash: String,
        until: Option<String>,
    },
    /// Creates the data subscription `name` at the leader's time `at_ms`, starting
    /// at `start` (`beginning`, `now` or an etag: resolved as the entry applies,
    /// so the same on every node).
    CreateSubscription {
        database: String,
        at_ms: u64,
        name: String,
        query: String,
        #[serde(with = "crate::codec::json_text_in_binary")]
        parameters: serde_json::Map<String, serde_json::Value>,
        start: String,
    },
    DeleteSubscription {
        database: String,
        name: String,
    },
    /// A worker acknowledged a batch: the subscription's position moves to
    /// `up_to` (an etag sequence; never back), at the leader's time `at_ms`.
    AcknowledgeSubscription {
        database: String,
        at_ms: u64,
        name: String,
        up_to: u64,
    },
}

/// A write as the log carries it: the document as its JSON text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LoggedOp {
    /// An `id` ending in `/` is a prefix: the document gets a new id under it,
    /// made from its etag (the same on every node).
    Put {
        id: String,
        json: String,
        condition: LoggedCondition,
    },
    Delete {
        id: String,
        condition: LoggedCondition,
    },
    /// A write made with an API key, whose id every node keeps with the revisions
    /// of the version it writes.
    Attributed { key_id: String, op: Box<LoggedOp> },
}

impl LoggedOp {
    /// The document id (or prefix) the write is for.
    pub fn id(&self) -> &str {
        match self {
            LoggedOp::Put { id, .. } | LoggedOp::Delete { id, .. } => id,
            LoggedOp::Attributed { op, .. } => op.id(),
        }
    }

    /// This write, made by the API key `key_id` (as it is without one).
    pub fn attributed(self, key_id: Option<String>) -> LoggedOp {
        let op = match self {
            LoggedOp::Attributed { op, .. } => *op,
            op => op,
        };
        match key_id {
            Some(key_id) => LoggedOp::Attributed {
                key_id,
                op: Box::new(op),
            },
            None => op,
        }
    }
}

/// A write's precondition; an etag as its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoggedCondition {
    None,
    IfMatch(String),
    IfExists,
    IfNotExists,
}

impl LoggedCondition {
    pub fn from_condition(c: &Condition) -> LoggedCondition {
        match c {
            Condition::None => LoggedCondition::None,
            Condition::IfMatch(etag) => LoggedCondition::IfMatch(etag.to_string()),
            Condition::IfExists => LoggedCondition::IfExists,
            Condition::IfNotExists => LoggedCondition::IfNotExists,
        }
    }

    pub fn to_condition(&self) -> Result<Condition, DocError> {
        Ok(match self {
            LoggedCondition::None => Condition::None,
            LoggedCondition::IfMatch(text) => Condition::IfMatch(Etag::parse(text)?),
            LoggedCondition::IfExists => Condition::IfExists,
            LoggedCondition::IfNotExists => Condition::IfNotExists,
        })
    }
}

/// What applying an entry answered, the same on every node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Answer {
    /// An entry of Raft's own (blank, membership).
    Nothing,
    DatabaseCreated {
        name: String,
        incarnation: u32,
    },
    DatabaseDeleted {
        name: String,
    },
    /// `created` is false when the same definition existed already.
    IndexDefined {
        created: bool,
    },
    IndexDeleted,
    RevisionsConfigSet,
    /// How many revisions the purge removed.
    RevisionsPurged {
        count: u64,
    },
    /// One answer per write, in order.
    Writes(Vec<WriteAnswer>),
    /// The whole command failed (the database does not exist, ...).
    Failed(ErrorAnswer),
    /// Applied before (found applied after a restart): the client that asked is gone.
    AlreadyApplied,
    /// An upload's chunk is written (or an upload dropped).
    UploadWritten,
    /// An upload staged for a batch: its hash (lower-case hex) and size.
    AttachmentStaged {
        hash: String,
        size_bytes: u64,
    },
    /// A purge of tombstones: how many went, how many remain, and the sequence
    /// below which they were eligible.
    TombstonesPurged {
        purged: u64,
        remaining: u64,
        purged_below_sequence: u64,
    },
    /// An API key's record is saved.
    ApiKeySaved,
    /// An API key is revoked; `existed` is false when no key had that id.
    ApiKeyRevoked {
        existed: bool,
    },
    /// A database restored: the restore's report as the server's JSON.
    Restored {
        report_json: String,
    },
    SubscriptionCreated,
    SubscriptionDeleted,
    /// The subscription's position after an acknowledgment.
    SubscriptionAcknowledged {
        position: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WriteAnswer {
    Put {
        id: String,
        etag: String,
        collection: Option<String>,
        last_modified_ms: u64,
        created: bool,
    },
    Delete {
        id: String,
        /// The etag the document had.
        deleted_etag: String,
        /// The delete's own etag (its tombstone's).
        etag: String,
    },
    Failed(ErrorAnswer),
}

/// An error as it crosses nodes: a machine-readable code (the server's error
/// code, chosen by the classifier the node was given) and the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorAnswer {
    pub code: String,
    pub message: String,
    /// On a conflict: the document's current etag.
    pub current_etag: Option<String>,
}

/// Turns a document-layer error into what a client is told: the server passes
/// its own mapping (HTTP error codes); the default keeps the message only.
pub type ClassifyError = std::sync::Arc<dyn Fn(&DocError) -> ErrorAnswer + Send + Sync>;

pub fn default_classifier() -> ClassifyError {
    std::sync::Arc::new(|e: &DocError| ErrorAnswer {
        code: "error".into(),
        message: e.to_string(),
        current_etag: None,
    })
}
