//! Data subscriptions: named, durable cursors over a collection, with an optional
//! filter in the query language (`from orders where total > 100`).
//!
//! A subscription's definition and its position live in the database's own
//! `subscriptions` tree (name -> JSON, `Stored` below), made with the first
//! subscription: they survive restarts and are in full backups like any tree.
//!
//! Delivery follows etag order through `by_collection` (collection, 0x00, etag
//! sequence -> id), which holds every document of a collection once, at the
//! sequence of its latest write. So:
//! - a batch is the collection's documents with a sequence above the position, in
//!   etag order, those the filter accepts, each as it is at the batch's read
//!   snapshot (its latest version);
//! - a document written several times before it is delivered is delivered once, at
//!   its latest etag; a document written again after it was delivered is delivered
//!   again (at its new etag);
//! - deleted documents are not delivered (a subscription delivers current
//!   documents, as RavenDB's do): a document deleted before its batch is read is
//!   simply absent; one deleted after it was delivered is not announced.
//!
//! The position moves only on an acknowledgment (`acknowledge_subscription`), to
//! the end of the batch acknowledged (`SubscriptionBatch::up_to`, which may be past
//! its last document when the filter skipped some), in a durable write of its own.
//! A worker that dies before acknowledging gets the same documents again (at least
//! once). One worker at a time holds a subscription (`lease.rs`).

mod filter;
mod lease;
mod logged;

pub(crate) use lease::LeaseTable;
pub use lease::{LeaseStrategy, SubscriptionLease};

use crate::model::schema::{collection_key, BY_COLLECTION, SUBSCRIPTIONS};
use crate::stored::read_last_sequence;
use crate::{Database, DocError, Document, Result};
use crate::{DocumentError, SubscriptionError};
use filter::Compiled;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Longest subscription name, in bytes.
pub const MAX_SUBSCRIPTION_NAME_LEN: usize = 128;
/// Subscriptions a database may have (every input has a limit).
pub const MAX_SUBSCRIPTIONS: u64 = 1024;
/// Documents of the collection looked at by one batch read at most, so that a
/// filter matching nothing cannot make one read walk a whole collection; the batch
/// then ends early (possibly empty) with `up_to` where the scan stopped.
pub const MAX_SCANNED_PER_BATCH: u64 = 100_000;

/// Where a new subscription starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionStart {
    /// Every document of the collection (the default).
    Beginning,
    /// Only documents written after the subscription is created.
    Now,
    /// Documents written after this etag (of this database).
    AfterEtag(String),
}

impl SubscriptionStart {
    /// `beginning`, `now`, or an etag.
    pub fn parse(text: &str) -> SubscriptionStart {
        match text {
            "beginning" => SubscriptionStart::Beginning,
            "now" => SubscriptionStart::Now,
            etag => SubscriptionStart::AfterEtag(etag.to_string()),
        }
    }
}

/// What is stored per subscription (JSON; fields may be added with defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    query: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    created_ms: u64,
    /// Every matching document with a sequence at or below this was delivered and
    /// acknowledged.
    position: u64,
    #[serde(default)]
    acknowledged_ms: Option<u64>,
    #[serde(default)]
    acknowledgments: u64,
}

impl Stored {
    fn decode(name: &[u8], bytes: &[u8]) -> Result<Stored> {
        serde_json::from_slice(bytes).map_err(|e| {
            DocError::Document(DocumentError::Corrupt {
                id: format!("(subscription {})", String::from_utf8_lossy(name)),
                why: format!("stored definition does not parse: {e}"),
            })
        })
    }

    fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(DocError::encode_json("a subscription"))
    }
}

/// A subscription as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionInfo {
    pub name: String,
    pub query: String,
    pub parameters: Map<String, Value>,
    pub collection: String,
    pub created_ms: u64,
    /// The position: the etag sequence up to which everything was acknowledged
    /// (0: nothing yet, from the beginning).
    pub acknowledged_sequence: u64,
    pub acknowledged_ms: Option<u64>,
    pub acknowledgments: u64,
    /// Whether a worker holds it now (this process's view).
    pub held: bool,
}

/// A subscription ready to be read: its compiled query and the position it had
/// when it was opened.
#[derive(Debug, Clone)]
pub struct SubscriptionReader {
    name: String,
    compiled: Compiled,
    position: u64,
}

impl SubscriptionReader {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn collection(&self) -> &str {
        &self.compiled.collection
    }

    /// The acknowledged position when the reader was opened: the first batch
    /// starts after it.
    pub fn position(&self) -> u64 {
        self.position
    }
}

/// Bounds on one batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_documents: usize,
    /// The batch ends once its documents' JSON reaches this many bytes (a single
    /// larger document still goes alone).
    pub max_bytes: usize,
}

/// One batch of a subscription.
#[derive(Debug, Clone)]
pub struct SubscriptionBatch {
    /// The matching documents, in etag order.
    pub documents: Vec<Document>,
    /// The batch covers the sequences in (`after`, `up_to`]: acknowledging it moves
    /// the position to `up_to`.
    pub after: u64,
    pub up_to: u64,
    /// Documents of the collection looked at (matching or not).
    pub scanned: u64,
    /// The database's last sequence at the batch's read snapshot.
    pub database_sequence: u64,
}

/// 1..=128 bytes of ASCII letters, digits, `-`, `_` and `.`, not starting with `.`:
/// a name that is safe in a URL path and a file name.
pub fn validate_subscription_name(name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(DocError::Subscription(SubscriptionError::Invalid(format!(
            "name {:?}: {why}",
            name.chars().take(80).collect::<String>()
        ))))
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_SUBSCRIPTION_NAME_LEN {
        return bad(&format!("longer than {MAX_SUBSCRIPTION_NAME_LEN} bytes"));
    }
    if name.starts_with('.') {
        return bad("starts with '.'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    Ok(())
}

impl Database {
    /// Creates a subscription; `SubscriptionExists` if the name is taken (even
    /// with the same query: creating is not idempotent, the position would be
    /// ambiguous).
    pub fn create_subscription(
        &self,
        name: &str,
        query: &str,
        parameters: Map<String, Value>,
        start: SubscriptionStart,
    ) -> Result<SubscriptionInfo> {
        let env = self.live()?;
        let (new, collection) = self.new_subscription(name, query, parameters, start)?;
        let now = crate::model::time::now_ms();
        let stored = env.submit_with(move |txn| new.create_in(txn, now))?;
        Ok(self.info(name, stored, collection))
    }

    /// A subscription checked (name, query, start) before its creation's
    /// transaction, and the collection it reads.
    fn new_subscription(
        &self,
        name: &str,
        query: &str,
        parameters: Map<String, Value>,
        start: SubscriptionStart,
    ) -> Result<(NewSubscription, String)> {
        validate_subscription_name(name)?;
        let compiled = Compiled::parse(query, &parameters)?;
        let after_sequence = match &start {
            SubscriptionStart::AfterEtag(etag) => {
                let seq = self.sequence_of(etag).map_err(|e| {
                    DocError::Subscription(SubscriptionError::Invalid(format!(
                        "start {etag:?}: give \"beginning\", \"now\" or an etag of this database ({e})"
                    )))
                })?;
                Some(seq)
            }
            _ => None,
        };
        let new = NewSubscription {
            name: name.to_string(),
            query: query.to_string(),
            parameters,
            start,
            after_sequence,
        };
        Ok((new, compiled.collection))
    }

    fn info(&self, name: &str, s: Stored, collection: String) -> SubscriptionInfo {
        SubscriptionInfo {
            held: self.subscription_leases.is_held(name),
            name: name.to_string(),
            query: s.query,
            parameters: s.parameters,
            collection,
            created_ms: s.created_ms,
            acknowledged_sequence: s.position,
            acknowledged_ms: s.acknowledged_ms,
            acknowledgments: s.acknowledgments,
        }
    }

    fn info_of(&self, name: &[u8], bytes: &[u8]) -> Result<SubscriptionInfo> {
        let s = Stored::decode(name, bytes)?;
        let collection = Compiled::parse(&s.query, &s.parameters)?.collection;
        Ok(self.info(&String::from_utf8_lossy(name), s, collection))
    }

    /// Every subscription, by name.
    pub fn subscriptions(&self) -> Result<Vec<SubscriptionInfo>> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let mut out = Vec::new();
        if !r.tree_exists(SUBSCRIPTIONS)? {
            return Ok(out);
        }
        let mut cursor = r.cursor(SUBSCRIPTIONS)?;
        let mut item = cursor.first()?;
        while let Some((k, v)) = item {
            out.push(self.info_of(k, v)?);
            item = cursor.next()?;
        }
        Ok(out)
    }

    /// One subscription; `SubscriptionNotFound` if there is none by that name.
    pub fn subscription(&self, name: &str) -> Result<SubscriptionInfo> {
        let env = self.live()?;
        validate_subscription_name(name)?;
        let r = env.begin_read()?;
        match read_stored(&r, name)? {
            Some(bytes) => self.info_of(name.as_bytes(), bytes),
            None => Err(DocError::Subscription(SubscriptionError::NotFound(
                name.to_string(),
            ))),
        }
    }

    /// Deletes a subscription; its worker, if any, loses its lease (and its
    /// acknowledgments are refused from then on).
    pub fn delete_subscription(&self, name: &str) -> Result<()> {
        let env = self.live()?;
        validate_subscription_name(name)?;
        let key = name.to_string();
        env.submit_with(move |txn| delete_in(txn, key))?;
        self.subscription_leases.revoke(name);
        Ok(())
    }

    /// Takes the exclusive right to a subscription's batches (`lease.rs`);
    /// `SubscriptionNotFound` if it does not exist, `SubscriptionBusy` if another
    /// worker holds it and `strategy` is `IfFree`.
    pub fn lease_subscription(
        &self,
        name: &str,
        strategy: LeaseStrategy,
    ) -> Result<SubscriptionLease> {
        self.subscription(name)?;
        self.subscription_leases.acquire(name, strategy)
    }

    /// The subscription's compiled query and its current position.
    pub fn open_subscription(&self, name: &str) -> Result<SubscriptionReader> {
        let env = self.live()?;
        validate_subscription_name(name)?;
        let r = env.begin_read()?;
        let bytes = read_stored(&r, name)?
            .ok_or_else(|| DocError::Subscription(SubscriptionError::NotFound(name.into())))?;
        let s = Stored::decode(name.as_bytes(), bytes)?;
        Ok(SubscriptionReader {
            name: name.to_string(),
            compiled: Compiled::parse(&s.query, &s.parameters)?,
            position: s.position,
        })
    }

    /// The next batch after sequence `after` (the position, or the end of the
    /// batch before when the worker acknowledged it), from one read snapshot.
    pub fn subscription_batch(
        &self,
        reader: &SubscriptionReader,
        after: u64,
        limits: BatchLimits,
    ) -> Result<SubscriptionBatch> {
        let env = self.live()?;
        let r = env.begin_read()?;
        let database_sequence = read_last_sequence(&r)?;
        let mut batch = SubscriptionBatch {
            documents: Vec::new(),
            after,
            up_to: after,
            scanned: 0,
            database_sequence,
        };
        let collection = &reader.compiled.collection;
        let start = collection_key(collection, after.saturating_add(1));
        let prefix = &start[..collection.len() + 1];
        let mut cursor = r.cursor(BY_COLLECTION)?;
        let mut entry = cursor.seek(&start)?;
        let mut bytes = 0usize;
        let max_documents = limits.max_documents.max(1);
        while let Some((key, id)) = entry {
            if !key.starts_with(prefix) {
                break;
            }
            if batch.documents.len() >= max_documents
                || bytes >= limits.max_bytes
                || batch.scanned >= MAX_SCANNED_PER_BATCH
            {
                return Ok(batch);
            }
            let sequence =
                crate::model::schema::decode_u64(&key[prefix.len()..], "collection entry")?;
            let id = std::str::from_utf8(id).map_err(|_| {
                DocError::Document(DocumentError::Corrupt {
                    id: String::from_utf8_lossy(id).into_owned(),
                    why: "id in by_collection is not UTF-8".into(),
                })
            })?;
            let record = crate::stored::get_at(&r, id, sequence)?;
            let rec = crate::model::record::decode(id, record)?;
            let json = rec.to_json(id)?;
            let view = rec.view(&json);
            batch.scanned += 1;
            batch.up_to = sequence;
            if reader.compiled.matches(id, view.json)? {
                bytes += view.json.len();
                batch.documents.push(Document::from_view(id, view));
            }
            entry = cursor.next()?;
        }
        // The collection was read to its end at this snapshot: nothing of it is left
        // up to the database's last sequence.
        batch.up_to = batch.up_to.max(database_sequence);
        Ok(batch)
    }

    /// Moves the subscription's position to `up_to` (the end of an acknowledged
    /// batch) in a durable write, if `lease` is still the subscription's current
    /// lease: a worker that was taken over, or whose subscription was deleted, gets
    /// `SubscriptionLeaseLost` and moves nothing. The position never moves back
    /// (a taken-over worker's last acknowledgment may land after the new holder
    /// read its first batch). Returns the position after the write.
    pub fn acknowledge_subscription(&self, lease: &SubscriptionLease, up_to: u64) -> Result<u64> {
        let env = self.live()?;
        let check = lease.check();
        let refused =
            |name: &str| DocError::Subscription(SubscriptionError::LeaseLost(name.to_string()));
        // Checked here first only to save a commit; the check that counts is the
        // one inside the unit, under the lease table's lock.
        if !check.with_current(|current| current) {
            return Err(refused(lease.name()));
        }
        let name = lease.name().to_string();
        let now = crate::model::time::now_ms();
        let position = env.submit_with(move |txn| -> Result<u64> {
            acknowledge_in(txn, &name, up_to, now, |txn, value| {
                check.with_current(|current| {
                    if !current {
                        return Err(refused(&name));
                    }
                    txn.put(SUBSCRIPTIONS, name.as_bytes(), value)?;
                    Ok(())
                })
            })
        })?;
        Ok(position)
    }
}

/// A subscription to create, checked.
pub(crate) struct NewSubscription {
    name: String,
    query: String,
    parameters: Map<String, Value>,
    start: SubscriptionStart,
    /// The start etag's sequence (`SubscriptionStart::AfterEtag`).
    after_sequence: Option<u64>,
}

impl NewSubscription {
    /// Stores the subscription, created at `created_ms`, inside `txn`: its position
    /// is resolved against the database's last write in this very transaction.
    fn create_in(self, txn: &mut kiln_storage::WriteTxn<'_>, created_ms: u64) -> Result<Stored> {
        let last = crate::model::schema::decode_last_sequence(txn.get(
            crate::model::schema::META,
            crate::model::schema::META_LAST_ETAG,
        )?)?;
        let position = match (self.start, self.after_sequence) {
            (SubscriptionStart::Now, _) => last,
            (_, Some(seq)) if seq > last => {
                return Err(DocError::Subscription(SubscriptionError::Invalid(format!(
                    "start etag sequence {seq} is past the database's last write ({last})"
                ))))
            }
            (_, Some(seq)) => seq,
            _ => 0,
        };
        let stored = Stored {
            query: self.query,
            parameters: self.parameters,
            created_ms,
            position,
            acknowledged_ms: None,
            acknowledgments: 0,
        };
        let key = self.name;
        if txn.tree_exists(SUBSCRIPTIONS)? {
            if txn.get(SUBSCRIPTIONS, key.as_bytes())?.is_some() {
                return Err(DocError::Subscription(SubscriptionError::Exists(key)));
            }
            if txn.tree_len(SUBSCRIPTIONS)? >= MAX_SUBSCRIPTIONS {
                return Err(DocError::Subscription(SubscriptionError::Invalid(format!(
                    "a database has at most {MAX_SUBSCRIPTIONS} subscriptions"
                ))));
            }
        }
        txn.ensure_tree(SUBSCRIPTIONS)?;
        txn.put(SUBSCRIPTIONS, key.as_bytes(), &stored.encode()?)?;
        Ok(stored)
    }
}

/// Removes the subscription `name` inside `txn`; `SubscriptionNotFound` if there
/// is none.
fn delete_in(txn: &mut kiln_storage::WriteTxn<'_>, name: String) -> Result<()> {
    let gone = txn.tree_exists(SUBSCRIPTIONS)? && txn.delete(SUBSCRIPTIONS, name.as_bytes())?;
    if !gone {
        return Err(DocError::Subscription(SubscriptionError::NotFound(name)));
    }
    Ok(())
}

/// Moves the position of `name` to `up_to` (never back) at `now_ms` inside `txn`;
/// `put` stores the new record (a local acknowledgment checks its lease there).
/// The position after it.
fn acknowledge_in(
    txn: &mut kiln_storage::WriteTxn<'_>,
    name: &str,
    up_to: u64,
    now_ms: u64,
    put: impl FnOnce(&mut kiln_storage::WriteTxn<'_>, &[u8]) -> Result<()>,
) -> Result<u64> {
    let raw = match txn.tree_exists(SUBSCRIPTIONS)? {
        true => txn.get(SUBSCRIPTIONS, name.as_bytes())?.map(<[u8]>::to_vec),
        false => None,
    };
    let Some(raw) = raw else {
        return Err(DocError::Subscription(SubscriptionError::NotFound(
            name.to_string(),
        )));
    };
    let mut s = Stored::decode(name.as_bytes(), &raw)?;
    s.position = s.position.max(up_to);
    s.acknowledged_ms = Some(now_ms);
    s.acknowledgments += 1;
    put(txn, &s.encode()?)?;
    Ok(s.position)
}

fn read_stored<'r>(r: &'r kiln_storage::ReadTxn<'_>, name: &str) -> Result<Option<&'r [u8]>> {
    if !r.tree_exists(SUBSCRIPTIONS)? {
        return Ok(None);
    }
    Ok(r.get(SUBSCRIPTIONS, name.as_bytes())?)
}
