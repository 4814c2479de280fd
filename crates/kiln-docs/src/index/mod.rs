//! Indexes: B+trees in the database's own environment, built in the background from
//! the change log in etag order (see `indexer.rs`).
//!
//! Trees (their names: `schema.rs`):
//! - `index_defs`: name -> JSON `{"definition": ..., "id": n}`
//! - `index_state`: name -> id (u64 BE), last indexed sequence (u64 BE), entries (u64 BE)
//! - per index, named by its id (a reset gives a new id and new trees):
//!   - `ix.<id>.e` entries: encoded values ++ document id -> document id
//!   - `ix.<id>.d` document id -> the encoded values of its entries (to remove them
//!     when the document changes or goes)
//!   - `ix.<id>.x` document id -> why it could not be indexed
//!
//! An index's entries and its last indexed sequence are written in ONE transaction,
//! so after a crash an index never claims a sequence whose entries it lacks.

pub(crate) mod def;
pub(crate) mod indexer;
pub(crate) mod reduce;
pub(crate) mod value;

pub(crate) use def::Compiled;
pub use def::{IndexDefinition, IndexField, ReduceSpec};
pub(crate) use indexer::Indexer;

use crate::model::schema::{
    decode_u64, docs_tree, entries_tree, errors_tree, index_consumer, sequence_key, CHANGES,
    CONSUMERS, INDEX_DEFS, INDEX_STATE, META, META_NEXT_INDEX_ID,
};
use crate::{Database, DocError, Etag, Result};
use crate::{DocumentError, IndexError};
use kiln_storage::{ReadTxn, WriteTxn};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How the background indexer runs.
#[derive(Debug, Clone, Copy)]
pub struct IndexingOptions {
    /// Documents per batch when idle; the batch doubles while the index is behind.
    pub min_batch: usize,
    pub max_batch: usize,
    /// An auto index not used by a query for this long is removed (0: never).
    pub auto_index_idle_ms: u64,
    /// A query with no index narrowing it reads at most this many documents.
    pub max_scan_docs: usize,
}

impl Default for IndexingOptions {
    fn default() -> Self {
        IndexingOptions {
            min_batch: 128,
            max_batch: 16_384,
            auto_index_idle_ms: 30 * 60 * 1000,
            max_scan_docs: 100_000,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredDef {
    definition: IndexDefinition,
    id: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexState {
    pub id: u64,
    pub last_sequence: u64,
    pub entries: u64,
}

impl IndexState {
    fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.id.to_be_bytes());
        out[8..16].copy_from_slice(&self.last_sequence.to_be_bytes());
        out[16..].copy_from_slice(&self.entries.to_be_bytes());
        out
    }

    fn decode(b: &[u8]) -> Result<IndexState> {
        if b.len() != 24 {
            return Err(DocError::Document(DocumentError::Corrupt {
                id: "(index state)".into(),
                why: format!("{} bytes, expected 24", b.len()),
            }));
        }
        Ok(IndexState {
            id: decode_u64(&b[..8], "index id")?,
            last_sequence: decode_u64(&b[8..16], "index sequence")?,
            entries: decode_u64(&b[16..], "index entries")?,
        })
    }
}

pub(crate) fn read_state(r: &ReadTxn<'_>, name: &str) -> Result<Option<IndexState>> {
    if !r.tree_exists(INDEX_STATE)? {
        return Ok(None);
    }
    r.get(INDEX_STATE, name.as_bytes())?
        .map(IndexState::decode)
        .transpose()
}

pub(crate) fn read_state_w(w: &mut WriteTxn<'_>, name: &str) -> Result<Option<IndexState>> {
    if !w.tree_exists(INDEX_STATE)? {
        return Ok(None);
    }
    w.get(INDEX_STATE, name.as_bytes())?
        .map(IndexState::decode)
        .transpose()
}

pub(crate) fn write_state(w: &mut WriteTxn<'_>, name: &str, st: &IndexState) -> Result<()> {
    w.put(INDEX_STATE, name.as_bytes(), &st.encode())?;
    w.put(
        CONSUMERS,
        index_consumer(name).as_bytes(),
        &st.last_sequence.to_be_bytes(),
    )?;
    Ok(())
}

/// An index as the running database knows it.
pub(crate) struct Runtime {
    pub compiled: Compiled,
    /// A full-text index's tantivy index (`search/`); `None` for the others.
    // index <-> search: a full-text index is an index kind (its definition,
    // state and runtime are the index module's); search/ holds only its tantivy side.
    pub search: Option<crate::search::SearchIndex>,
    pub id: u64,
    /// The last indexed sequence known to be durable.
    pub last_sequence: AtomicU64,
    pub last_used_ms: AtomicU64,
    /// Documents per second over the last batches (f64 bits).
    pub rate: AtomicU64,
}

/// What opening a full-text index needs to know of its database.
pub(crate) struct SearchContext<'a> {
    pub db_dir: &'a std::path::Path,
    pub incarnation: u32,
    pub db_last_sequence: u64,
    /// The key its files are sealed with (an encrypted database).
    pub key: Option<std::sync::Arc<kiln_storage::crypt::SealingKey>>,
}

impl Runtime {
    /// The running index of `compiled`; a full-text index opens (or rebuilds) its
    /// tantivy index and starts from the sequence that commit covers, the others
    /// from `last_sequence` (their state in the environment).
    fn open(
        compiled: Compiled,
        id: u64,
        last_sequence: u64,
        ctx: &SearchContext<'_>,
    ) -> Result<Runtime> {
        let (search, last_sequence) = if compiled.def.is_search() {
            let (s, covered) = crate::search::SearchIndex::open(ctx, &compiled.def, id)?;
            (Some(s), covered)
        } else {
            (None, last_sequence)
        };
        Ok(Runtime {
            compiled,
            search,
            id,
            last_sequence: AtomicU64::new(last_sequence),
            last_used_ms: AtomicU64::new(crate::model::time::now_ms()),
            rate: AtomicU64::new(0f64.to_bits()),
        })
    }

    /// Folds a batch's rate (documents per second) into the index's.
    pub fn record_rate(&self, now: f64) {
        let old = f64::from_bits(self.rate.load(Ordering::Relaxed));
        let rate = if old == 0.0 {
            now
        } else {
            old * 0.7 + now * 0.3
        };
        self.rate.store(rate.to_bits(), Ordering::Relaxed);
    }

    pub fn name(&self) -> &str {
        &self.compiled.def.name
    }
}

/// What `GET /indexes` shows of an index.
#[derive(Debug, Clone)]
pub struct IndexInfo {
    pub definition: IndexDefinition,
    pub last_indexed_etag: Option<Etag>,
    pub database_etag: Option<Etag>,
    /// Changed documents the index has not read yet (counted up to 1,000,000).
    pub docs_behind: u64,
    pub stale: bool,
    pub entries: u64,
    pub errors: u64,
    /// Up to 10 documents that could not be indexed, and why.
    pub error_samples: Vec<IndexErrorSample>,
    /// The indexer's batch size now (shared by the database's indexes).
    pub batch_size: usize,
    pub docs_per_sec: f64,
    /// A full-text index: the etag its tantivy commit covered when the database
    /// opened (e.g. the commit a restore placed); `None` for a map index or one
    /// built from the first change.
    pub opened_at_etag: Option<Etag>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IndexErrorSample {
    pub id: String,
    pub error: String,
}

/// Loads the definitions stored in a database (at open) and opens the full-text
/// indexes among them (removing the files of any that are gone).
pub(crate) fn load(
    r: &ReadTxn<'_>,
    env: &kiln_storage::Env,
    db_dir: &std::path::Path,
    incarnation: u32,
) -> Result<Vec<Runtime>> {
    let mut out = Vec::new();
    let ctx = SearchContext {
        db_dir,
        incarnation,
        db_last_sequence: crate::stored::read_last_sequence(r)?,
        key: crate::search::key_of(env),
    };
    if !r.tree_exists(INDEX_DEFS)? {
        crate::search::remove_orphans(db_dir, &[])?;
        return Ok(out);
    }
    let mut c = r.cursor(INDEX_DEFS)?;
    let mut item = c.first()?;
    while let Some((k, v)) = item {
        let name = String::from_utf8_lossy(k).into_owned();
        let stored: StoredDef = serde_json::from_slice(v).map_err(|e| {
            DocError::Document(DocumentError::Corrupt {
                id: format!("(index {name})"),
                why: e.to_string(),
            })
        })?;
        let st = read_state(r, &name)?.ok_or_else(|| {
            DocError::Document(DocumentError::Corrupt {
                id: format!("(index {name})"),
                why: "no state".into(),
            })
        })?;
        out.push(Runtime::open(
            Compiled::new(stored.definition)?,
            st.id,
            st.last_sequence,
            &ctx,
        )?);
        item = c.next()?;
    }
    let live: Vec<u64> = out.iter().map(|rt| rt.id).collect();
    crate::search::remove_orphans(db_dir, &live)?;
    Ok(out)
}

impl Database {
    /// Creates an index (it starts empty and fills in the background). Defining the
    /// same index again is a no-op that returns false; another definition under an
    /// existing name is `IndexExists`.
    pub fn define_index(&self, def: IndexDefinition) -> Result<bool> {
        let env = self.live()?;
        let compiled = Compiled::new(def.clone())?;
        let _turn = self.indexer().admin.lock();
        if let Some(rt) = self.indexer().get(&def.name) {
            if rt.compiled.def == def {
                return Ok(false);
            }
            return Err(DocError::Index(IndexError::Exists(def.name.clone())));
        }
        let stored_def = def.clone();
        let id = env.submit_with(move |txn| -> Result<u64> {
            txn.ensure_tree(INDEX_DEFS)?;
            txn.ensure_tree(INDEX_STATE)?;
            create_index(txn, stored_def)
        })?;
        let rt = Runtime::open(compiled, id, 0, &self.search_context())?;
        self.indexer().insert(Arc::new(rt));
        tracing::info!(database = self.name(), index = %def.name, auto = def.auto, "index defined");
        Ok(true)
    }

    /// The running index `name`, or `IndexNotFound`.
    fn running_index(&self, name: &str) -> Result<Arc<Runtime>> {
        self.indexer()
            .get(name)
            .ok_or_else(|| DocError::Index(IndexError::NotFound(name.to_string())))
    }

    pub fn index_definition(&self, name: &str) -> Result<IndexDefinition> {
        self.live()?;
        Ok(self.running_index(name)?.compiled.def.clone())
    }

    /// Removes an index and its trees.
    pub fn delete_index(&self, name: &str) -> Result<()> {
        let env = self.live()?;
        let _turn = self.indexer().admin.lock();
        let rt = self.running_index(name)?;
        let name_owned = name.to_string();
        let id = rt.id;
        env.submit_with(move |txn| -> Result<()> {
            txn.delete(INDEX_DEFS, name_owned.as_bytes())?;
            txn.delete(INDEX_STATE, name_owned.as_bytes())?;
            txn.delete(CONSUMERS, index_consumer(&name_owned).as_bytes())?;
            drop_trees(txn, id)
        })?;
        self.indexer().remove(name);
        self.remove_search_files(&rt);
        tracing::info!(database = self.name(), index = name, "index deleted");
        Ok(())
    }

    /// Rebuilds an index from scratch: new empty trees, read from the first change.
    pub fn reset_index(&self, name: &str) -> Result<()> {
        let env = self.live()?;
        let _turn = self.indexer().admin.lock();
        let rt = self.running_index(name)?;
        let old_id = rt.id;
        let def = rt.compiled.def.clone();
        let new_id = env.submit_with(move |txn| -> Result<u64> {
            drop_trees(txn, old_id)?;
            create_index(txn, def)
        })?;
        let fresh = Runtime::open(rt.compiled.clone(), new_id, 0, &self.search_context())?;
        self.indexer().insert(Arc::new(fresh));
        self.remove_search_files(&rt);
        Ok(())
    }

    fn search_context(&self) -> SearchContext<'_> {
        SearchContext {
            db_dir: self.dir(),
            incarnation: self.incarnation,
            db_last_sequence: self.last_sequence(),
            key: crate::search::key_of(self.env()),
        }
    }

    /// Removes a full-text index's files once it is out of the running set (a
    /// failure only leaves files that the next open removes).
    fn remove_search_files(&self, rt: &Runtime) {
        if let Some(s) = &rt.search {
            if let Err(e) = std::fs::remove_dir_all(&s.dir) {
                tracing::warn!(dir = %s.dir.display(), error = %e,
                    "removing a full-text index's files failed; the next open removes them");
            }
        }
    }

    pub fn index_names(&self) -> Result<Vec<String>> {
        self.live()?;
        Ok(self.indexer().names())
    }

    /// The state of one index.
    pub fn index_info(&self, name: &str) -> Result<IndexInfo> {
        let env = self.live()?;
        let rt = self.running_index(name)?;
        let r = env.begin_read()?;
        let db_seq = self.read_last_sequence(&r)?;
        let st = read_state(&r, name)?
            .ok_or_else(|| DocError::Index(IndexError::NotFound(name.into())))?;
        let mut behind = 0u64;
        if st.last_sequence < db_seq {
            let mut c = r.cursor(CHANGES)?;
            let mut item = c.seek(&sequence_key(st.last_sequence + 1))?;
            while item.is_some() && behind < 1_000_000 {
                behind += 1;
                item = c.next()?;
            }
        }
        let errors_name = errors_tree(st.id);
        let errors = if r.tree_exists(&errors_name)? {
            r.tree_len(&errors_name)?
        } else {
            0
        };
        let mut error_samples = Vec::new();
        if errors > 0 {
            let mut c = r.cursor(&errors_name)?;
            let mut item = c.first()?;
            while let Some((k, v)) = item {
                if error_samples.len() == 10 {
                    break;
                }
                error_samples.push(IndexErrorSample {
                    id: String::from_utf8_lossy(k).into_owned(),
                    error: String::from_utf8_lossy(v).into_owned(),
                });
                item = c.next()?;
            }
        }
        let etag = |s: u64| (s > 0).then(|| self.etag_at(s));
        Ok(IndexInfo {
            definition: rt.compiled.def.clone(),
            last_indexed_etag: etag(st.last_sequence),
            database_etag: etag(db_seq),
            docs_behind: behind,
            stale: st.last_sequence < db_seq,
            entries: st.entries,
            errors,
            error_samples,
            batch_size: self.indexer().batch_size(),
            docs_per_sec: f64::from_bits(rt.rate.load(Ordering::Relaxed)),
            opened_at_etag: rt.search.as_ref().and_then(|s| etag(s.opened_at_sequence)),
        })
    }

    pub fn indexes(&self) -> Result<Vec<IndexInfo>> {
        let mut out = Vec::new();
        for name in self.index_names()? {
            match self.index_info(&name) {
                Ok(i) => out.push(i),
                Err(DocError::Index(IndexError::NotFound(_))) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Blocks until the index has indexed everything up to `sequence` or `timeout`
    /// passes; true if it caught up.
    pub fn wait_for_index(&self, name: &str, sequence: u64, timeout: Duration) -> Result<bool> {
        self.live()?;
        let rt = self.running_index(name)?;
        Ok(self.indexer().wait_for(&rt, sequence, timeout))
    }

    /// The batch sizes the indexer chose since the database opened: (size, batches).
    pub fn index_batch_sizes(&self) -> Vec<(usize, u64)> {
        self.indexer().batch_histogram()
    }
}

/// Writes index `definition` afresh (defined, or reset): a new id, its empty trees,
/// its stored definition and its state, nothing indexed yet. Returns the id.
fn create_index(txn: &mut WriteTxn<'_>, definition: IndexDefinition) -> Result<u64> {
    let id = next_id(txn)?;
    create_trees(txn, id)?;
    let name = definition.name.clone();
    let stored = serde_json::to_vec(&StoredDef { definition, id })
        .map_err(DocError::encode_json("an index definition"))?;
    txn.put(INDEX_DEFS, name.as_bytes(), &stored)?;
    write_state(
        txn,
        &name,
        &IndexState {
            id,
            last_sequence: 0,
            entries: 0,
        },
    )?;
    Ok(id)
}

fn next_id(txn: &mut WriteTxn<'_>) -> Result<u64> {
    let id = match txn.get(META, META_NEXT_INDEX_ID)? {
        Some(b) => decode_u64(b, "next index id")?,
        None => 1,
    };
    txn.put(META, META_NEXT_INDEX_ID, &(id + 1).to_be_bytes())?;
    Ok(id)
}

/// Benchmark hook: when cleared, new indexes get uncounted entries trees (as
/// before counted trees), so that `kiln bench` can measure what the counts cost
/// the index build (`KILN_BENCH_UNCOUNTED_INDEXES=1`). Process-wide.
#[doc(hidden)]
pub static COUNTED_ENTRIES_TREES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(true);

fn create_trees(txn: &mut WriteTxn<'_>, id: u64) -> Result<()> {
    // The entries tree is counted: a range's count (a query's total) is two
    // descents instead of a walk of the range (kiln-storage `btree/count.rs`).
    // An index made before counted trees keeps its uncounted tree until rebuilt:
    // its totals are walked, as they were.
    if COUNTED_ENTRIES_TREES.load(std::sync::atomic::Ordering::Relaxed) {
        txn.ensure_counted_tree(&entries_tree(id))?;
    } else {
        txn.ensure_tree(&entries_tree(id))?;
    }
    for t in [docs_tree(id), errors_tree(id), reduce::extremes_tree(id)] {
        txn.ensure_tree(&t)?;
    }
    Ok(())
}

fn drop_trees(txn: &mut WriteTxn<'_>, id: u64) -> Result<()> {
    for t in [
        entries_tree(id),
        docs_tree(id),
        errors_tree(id),
        reduce::extremes_tree(id),
    ] {
        txn.drop_tree(&t)?;
    }
    Ok(())
}
