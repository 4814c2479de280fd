//! Full-text indexes, kept by tantivy: one tantivy index (a directory) per Kiln
//! index whose fields are `"search": true`, at `<database dir>/search/<index id>/`.
//!
//! It is derived data, kept like the map indexes (`index/`): the background indexer
//! feeds it the changed documents in etag order (`indexing.rs`), and every tantivy
//! commit carries, as its payload, the index id, the database's incarnation and the
//! last sequence it covers — in the same atomic commit as the entries, so after a
//! crash the index resumes from there and never claims a sequence whose documents
//! it lacks. The Kiln-side state (`index_state`) is written after each tantivy
//! commit: it lags, never leads, and only serves `index_info` and the change log's
//! consumers. An index whose directory is missing, unreadable, of another index id
//! or incarnation, or ahead of the database (a restore, a copied directory) is
//! wiped and rebuilt from the first change.
//!
//! The tantivy document of a Kiln document: its id (`@id`, stored, untokenized: to
//! delete and to return it) and one text field per index field (`f0`, `f1`, ...),
//! with every string (and number or boolean, as text) found at the field's path,
//! arrays and objects included, analyzed with the field's analyzer. The text is not
//! stored: highlights are cut from the document Kiln holds.

pub mod analyzer;
pub(crate) mod backup;
mod chunk_cache;
pub(crate) mod directory;
pub(crate) mod indexing;
pub(crate) mod text;

use crate::index::IndexDefinition;
use crate::IndexError;
use crate::{DocError, Result};
use kiln_storage::crypt::SealingKey;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, STORED, STRING,
};
use tantivy::{Index, IndexReader, IndexSettings, IndexWriter, ReloadPolicy, TantivyDocument};

/// The directory of a database's full-text indexes.
pub(crate) const SEARCH_DIR: &str = "search";
const ID_FIELD: &str = "@id";
/// The writer's memory before it flushes a segment (its threads share it).
const WRITER_MEMORY_BYTES: usize = 64 << 20;

/// What each tantivy commit records (its payload).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Payload {
    index_id: u64,
    incarnation: u32,
    sequence: u64,
}

/// One full-text index, open.
pub(crate) struct SearchIndex {
    pub dir: PathBuf,
    index: Index,
    pub(crate) reader: IndexReader,
    pub(crate) writer: Mutex<IndexWriter<TantivyDocument>>,
    pub(crate) id_field: Field,
    /// The text field of each index field, in the definition's order.
    pub(crate) fields: Vec<Field>,
    /// Each field's analyzer name.
    pub(crate) analyzers: Vec<String>,
    index_id: u64,
    incarnation: u32,
    /// The key its files are sealed with (an encrypted database).
    key: Option<Arc<SealingKey>>,
    /// This index's batch size (tuned like the map indexes': `indexing.rs`).
    pub(crate) batch: AtomicUsize,
    /// The sequence its commit covered when it was opened (0: built from the
    /// first change), e.g. the commit a restore placed.
    pub(crate) opened_at_sequence: u64,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DocError + '_ {
    move |e| DocError::io(path, e)
}

/// A tantivy failure, with what was being done and in which index directory.
pub(crate) fn tantivy_err(dir: &Path, what: &str, e: tantivy::TantivyError) -> DocError {
    DocError::Index(IndexError::Search(format!("{what} {}: {e}", dir.display())))
}

fn schema_for(def: &IndexDefinition) -> (Schema, Field, Vec<Field>, Vec<String>) {
    let mut b = Schema::builder();
    let id = b.add_text_field(ID_FIELD, STRING | STORED);
    let mut fields = Vec::new();
    let mut analyzers = Vec::new();
    for (i, f) in def.fields.iter().enumerate() {
        let analyzer = f
            .analyzer
            .clone()
            .unwrap_or_else(|| analyzer::DEFAULT_ANALYZER.to_string());
        let indexing = TextFieldIndexing::default()
            .set_tokenizer(&analyzer)
            .set_index_option(IndexRecordOption::WithFreqsAndPositions);
        let opts = TextOptions::default().set_indexing_options(indexing);
        fields.push(b.add_text_field(&format!("f{i}"), opts));
        analyzers.push(analyzer);
    }
    (b.build(), id, fields, analyzers)
}

/// The key a database's full-text index files are sealed with: `None` for a
/// database that is not encrypted.
pub(crate) fn key_of(env: &kiln_storage::Env) -> Option<Arc<SealingKey>> {
    env.derived_key(directory::KEY_PURPOSE).map(Arc::new)
}

/// The directory of index `id` of the database at `db_dir`.
pub(crate) fn index_dir(db_dir: &Path, id: u64) -> PathBuf {
    db_dir.join(SEARCH_DIR).join(id.to_string())
}

/// Why a full-text index on disk cannot be reused (it is rebuilt, with a warning).
#[derive(Debug, thiserror::Error)]
enum UnreadableIndex {
    #[error(transparent)]
    Tantivy(#[from] tantivy::TantivyError),
    #[error("its schema is not the definition's")]
    OtherSchema,
    #[error("commit payload {raw:?}: {source}")]
    Payload {
        raw: String,
        #[source]
        source: serde_json::Error,
    },
}

impl SearchIndex {
    /// Opens (or creates, or rebuilds: see the module's comment) index `index_id`
    /// of a database at `db_last_sequence`; returns it with the sequence it covers.
    pub(crate) fn open(
        ctx: &crate::index::SearchContext<'_>,
        def: &IndexDefinition,
        index_id: u64,
    ) -> Result<(SearchIndex, u64)> {
        let (db_dir, incarnation, db_last_sequence) =
            (ctx.db_dir, ctx.incarnation, ctx.db_last_sequence);
        let key = ctx.key.as_ref();
        let dir = index_dir(db_dir, index_id);
        let (schema, id_field, fields, analyzers) = schema_for(def);
        let expected = Payload {
            index_id,
            incarnation,
            sequence: 0,
        };
        let reusable = Self::reusable(&dir, key, &schema, &expected, db_last_sequence);
        let (index, sequence, writer, reader) = match reusable
            .map(|(index, seq)| Self::start(&dir, index).map(|(w, r, i)| (i, seq, w, r)))
        {
            Some(Ok(started)) => started,
            found => {
                if let Some(Err(e)) = found {
                    // Files a commit names but that do not open (a copy cut short,
                    // damaged segments): the index is derived data, rebuilt.
                    tracing::warn!(dir = %dir.display(), error = %e,
                        "full-text index does not open; rebuilding");
                }
                let (writer, reader, index) = Self::create_empty(&dir, index_id, key, schema)?;
                (index, 0, writer, reader)
            }
        };
        Ok((
            SearchIndex {
                dir,
                index,
                reader,
                writer: Mutex::new(writer),
                id_field,
                fields,
                analyzers,
                index_id,
                incarnation,
                key: key.cloned(),
                batch: AtomicUsize::new(0),
                opened_at_sequence: sequence,
            },
            sequence,
        ))
    }

    /// The index in `dir` with the sequence its last commit covers, when that
    /// commit is of the `expected` index id and incarnation and not ahead of the
    /// database; `None` (with a warning if something else is there) to rebuild.
    fn reusable(
        dir: &Path,
        key: Option<&Arc<SealingKey>>,
        schema: &Schema,
        expected: &Payload,
        db_last_sequence: u64,
    ) -> Option<(Index, u64)> {
        match Self::open_existing(dir, expected.index_id, key, schema) {
            Ok(Some((index, payload)))
                if payload.index_id == expected.index_id
                    && payload.incarnation == expected.incarnation
                    && payload.sequence <= db_last_sequence =>
            {
                Some((index, payload.sequence))
            }
            Ok(None) => None,
            Ok(Some((_, payload))) => {
                tracing::warn!(dir = %dir.display(), found = ?payload, ?expected, db_last_sequence,
                    "full-text index belongs to another index or state of the database; rebuilding");
                None
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "full-text index unreadable; rebuilding");
                None
            }
        }
    }

    /// An empty index of `schema` in `dir` (whatever was there removed), started.
    fn create_empty(
        dir: &Path,
        index_id: u64,
        key: Option<&Arc<SealingKey>>,
        schema: Schema,
    ) -> Result<(IndexWriter<TantivyDocument>, IndexReader, Index)> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(io_err(dir))?;
        }
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let index = directory::open(dir, index_id, key)
            .map_err(tantivy::TantivyError::from)
            .and_then(|d| Index::create(d, schema, IndexSettings::default()))
            .map_err(|e| tantivy_err(dir, "creating the full-text index", e))?;
        Self::start(dir, index)
    }

    /// The writer and reader of `index` (its analyzers registered).
    fn start(
        dir: &Path,
        index: Index,
    ) -> Result<(IndexWriter<TantivyDocument>, IndexReader, Index)> {
        analyzer::register_all(index.tokenizers());
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
        let writer = index
            .writer_with_num_threads(threads, WRITER_MEMORY_BYTES)
            .map_err(|e| tantivy_err(dir, "opening the writer of", e))?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e| tantivy_err(dir, "opening a reader of", e))?;
        Ok((writer, reader, index))
    }

    /// The index in `dir` and its last commit's payload, if it has one and its
    /// schema is `schema`; `None` if there is nothing (or nothing committed) there.
    fn open_existing(
        dir: &Path,
        index_id: u64,
        key: Option<&Arc<SealingKey>>,
        schema: &Schema,
    ) -> std::result::Result<Option<(Index, Payload)>, UnreadableIndex> {
        if !dir.join("meta.json").exists() {
            return Ok(None);
        }
        let index =
            Index::open(directory::open(dir, index_id, key).map_err(tantivy::TantivyError::from)?)?;
        if index.schema() != *schema {
            return Err(UnreadableIndex::OtherSchema);
        }
        let metas = index.load_metas()?;
        let Some(raw) = metas.payload else {
            return Ok(None);
        };
        let payload: Payload = serde_json::from_str(&raw)
            .map_err(|source| UnreadableIndex::Payload { raw, source })?;
        Ok(Some((index, payload)))
    }

    /// Commits what the writer holds as covering up to `sequence`, then makes it
    /// visible to searches.
    pub(crate) fn commit(
        &self,
        writer: &mut IndexWriter<TantivyDocument>,
        sequence: u64,
    ) -> Result<()> {
        let payload = serde_json::to_string(&Payload {
            index_id: self.index_id,
            incarnation: self.incarnation,
            sequence,
        })
        .map_err(DocError::encode_json("a full-text commit payload"))?;
        let mut prepared = writer
            .prepare_commit()
            .map_err(|e| tantivy_err(&self.dir, "preparing a commit of", e))?;
        prepared.set_payload(&payload);
        prepared
            .commit()
            .map_err(|e| tantivy_err(&self.dir, "committing", e))?;
        self.reader
            .reload()
            .map_err(|e| tantivy_err(&self.dir, "reloading", e))?;
        Ok(())
    }

    /// The analyzer of field `i`, as the index runs it.
    pub(crate) fn analyzer(&self, i: usize) -> Result<tantivy::tokenizer::TextAnalyzer> {
        self.index
            .tokenizers()
            .get(&self.analyzers[i])
            .ok_or_else(|| {
                DocError::Index(IndexError::Search(format!(
                    "analyzer {:?} is not registered",
                    self.analyzers[i]
                )))
            })
    }

    /// Documents in the index as its reader sees it.
    pub(crate) fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Segments of the last commit (many small ones cost queries).
    pub(crate) fn segments(&self) -> usize {
        self.reader.searcher().segment_readers().len()
    }
}

/// Removes the directories of full-text indexes that no longer exist (deleted or
/// reset while the database was closed or before a crash).
pub(crate) fn remove_orphans(db_dir: &Path, live_ids: &[u64]) -> Result<()> {
    let root = db_dir.join(SEARCH_DIR);
    if !root.exists() {
        return Ok(());
    }
    for entry in std::fs::read_dir(&root).map_err(io_err(&root))? {
        let entry = entry.map_err(io_err(&root))?;
        let keep = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|id| live_ids.contains(&id));
        if !keep {
            let p = entry.path();
            tracing::info!(dir = %p.display(), "removing the files of a full-text index that is gone");
            std::fs::remove_dir_all(&p).map_err(io_err(&p))?;
        }
    }
    Ok(())
}
