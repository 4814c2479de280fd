//! W16 (issue 42): full-text search, measured embedded (kiln-docs called directly,
//! as W12 and W17), against tantivy used directly on the same documents in the
//! same run.
//!
//! The corpus is real English text that every Debian machine has offline: the
//! manual pages under `/usr/share/man/man[1-8]` (gzip, troff markup stripped to
//! its text), one document per page: `{"title", "section", "body"}`. Where fewer
//! than 500 pages are installed (a slim image), the Python standard library's
//! sources (`/usr/lib/python3*/**.py`, their docstrings and comments are English)
//! stand in; the JSON says which corpus ran, with its documents and megabytes.
//!
//! Measured:
//! - the build: documents written first, then the full-text index (body: english,
//!   title: standard) defined and timed until it has caught up; the same documents
//!   added to a tantivy index of the same schema and analyzers by one writer with
//!   the same threads and memory, one commit, timed from the first add to the end
//!   of the commit (the documents already in memory: tantivy's best case).
//! - queries (top 10 by BM25 and the total count, as Kiln answers them): terms,
//!   phrases and prefixes, p50/p99 for each kind, Kiln and tantivy.
//! - the idle update lag: a page rewritten, from its acknowledgment until the
//!   full-text index has committed it.
//! - the index's bytes on disk and its segments after the build.
//!
//! SQLite FTS5 and PostgreSQL (tsvector + GIN), the peers the issue names, are
//! measured by the comparative benchmark in bench/ (`--workloads W16`: the same
//! corpus and query texts, kiln serve over HTTP beside them; docs/benchmarks.md).

use crate::corpus::{corpus, Page, PHRASES, PREFIXES, TERMS};
use crate::querybench::fresh;
use crate::run::{BenchResult, Run};
use kiln_docs::{
    BatchOutcome, Condition, Database, DocId, IndexDefinition, IndexField, ParsedDocument,
    QueryOptions, WriteOp,
};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const INDEX: &str = "pages-text";
const BATCH: usize = 1_000;
const WRITER_THREADS: usize = 2;
const WRITER_MEMORY_BYTES: usize = 64 << 20;
fn definition() -> IndexDefinition {
    let field = |path: &str, analyzer: &str| IndexField {
        path: path.into(),
        search: true,
        analyzer: Some(analyzer.into()),
        ..Default::default()
    };
    IndexDefinition {
        name: INDEX.into(),
        collection: Some("pages".into()),
        fields: vec![field("body", "english"), field("title", "standard")],
        auto: false,
        reduce: None,
    }
}

fn page_json(p: &Page) -> Value {
    json!({"title": p.title, "section": p.section, "body": p.body,
           "@metadata": {"@collection": "pages"}})
}

/// Writes the pages in batches; the last etag's sequence.
fn insert(db: &Database, pages: &[Page]) -> BenchResult<u64> {
    let mut last = 0;
    for (chunk_no, chunk) in pages.chunks(BATCH).enumerate() {
        let mut ops = Vec::with_capacity(chunk.len());
        for (i, p) in chunk.iter().enumerate() {
            ops.push(WriteOp::Put {
                id: DocId::Given(format!("pages/{:06}", chunk_no * BATCH + i)),
                document: ParsedDocument::parse(page_json(p).to_string().as_bytes())?,
                condition: Condition::None,
            });
        }
        if let Some(BatchOutcome::Put(p)) = db.write_all(ops)?.last() {
            last = p.etag.sequence;
        }
    }
    Ok(last)
}

/// tantivy on its own: the same schema and analyzers, the documents from memory;
/// (seconds to add and commit, the index, its body and title fields).
fn tantivy_build(
    dir: &Path,
    pages: &[Page],
) -> BenchResult<(f64, tantivy::Index, tantivy::schema::Field)> {
    use tantivy::schema::{
        IndexRecordOption, Schema, TextFieldIndexing, TextOptions, STORED, STRING,
    };
    let text = |analyzer: &str| {
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(analyzer)
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        )
    };
    let mut sb = Schema::builder();
    let id = sb.add_text_field("@id", STRING | STORED);
    let body = sb.add_text_field("f0", text("english"));
    let title = sb.add_text_field("f1", text("standard"));
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let index = tantivy::Index::create_in_dir(dir, sb.build())?;
    kiln_docs::search::analyzer::register_all(index.tokenizers());
    let t = Instant::now();
    let mut w: tantivy::IndexWriter =
        index.writer_with_num_threads(WRITER_THREADS, WRITER_MEMORY_BYTES)?;
    for (i, p) in pages.iter().enumerate() {
        let mut d = tantivy::TantivyDocument::new();
        d.add_text(id, format!("pages/{i:06}"));
        d.add_text(body, &p.body);
        d.add_text(title, &p.title);
        w.add_document(d)?;
    }
    w.commit()?;
    let secs = t.elapsed().as_secs_f64();
    w.wait_merging_threads()?;
    Ok((secs, index, body))
}

/// Writes a full backup of `db` to `path` and syncs it; the backup's report.
fn write_backup(db: &Database, path: &Path) -> BenchResult<kiln_docs::BackupReport> {
    let file = std::fs::File::create(path)?;
    let mut out = std::io::BufWriter::new(file);
    let report = db.backup_to(&mut out, Default::default(), |_| {})?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(report)
}

/// The backup file at `backup`, opened as a restore's source.
fn restore_source(backup: &Path) -> BenchResult<kiln_docs::RestoreSource<'static>> {
    Ok(kiln_docs::RestoreSource::Files(vec![(
        backup.display().to_string(),
        Box::new(std::io::BufReader::new(std::fs::File::open(backup)?)) as Box<dyn std::io::Read>,
    )]))
}

/// The first search of a restored database, waiting until its index is caught
/// up (`params` binds `$q`); the hits on the page.
fn first_query(restored: &Database, params: &Map<String, Value>) -> BenchResult<usize> {
    let options = QueryOptions {
        wait_for_non_stale_ms: 3_600_000,
    };
    let r = restored.query(
        "from pages where search(body, $q) limit 10",
        params,
        options,
    )?;
    if r.stale || r.results.is_empty() {
        return Err(format!(
            "W16: the restored database answered stale={} with {} results",
            r.stale,
            r.results.len()
        )
        .into());
    }
    Ok(r.results.len())
}

/// Timings of a restore, in seconds, and the hits its first search found.
struct Restored {
    /// The restore alone (Kiln's) or with the removal of the index's files left
    /// out (the peer's).
    restore_secs: f64,
    /// From the start of the restore until the first search answered.
    to_first_query_secs: f64,
    found: usize,
}

/// Kiln's restore: `backup` restored into `store`, its full-text index resumed
/// from the commit the backup carries; timed until a search answers.
fn restore_resumed(
    store: &kiln_docs::DocStore,
    backup: &Path,
    params: &Map<String, Value>,
) -> BenchResult<Restored> {
    let t = Instant::now();
    store.restore_database(
        restore_source(backup)?,
        "restored",
        false,
        kiln_docs::RestorePoint::Latest,
        |_| {},
    )?;
    let restore_secs = t.elapsed().as_secs_f64();
    let restored = store.database("restored")?;
    let found = first_query(&restored, params)?;
    let to_first_query_secs = t.elapsed().as_secs_f64();
    if restored.index_info(INDEX)?.opened_at_etag.is_none() {
        return Err("W16: the restored full-text index was rebuilt, not resumed".into());
    }
    Ok(Restored {
        restore_secs,
        to_first_query_secs,
        found,
    })
}

/// The peer: `backup` restored offline into a data directory of its own under
/// `dir`, the index's files removed before the database opens, so the index is
/// rebuilt from the first change; timed until a search answers (the removal not
/// counted). The data directory is removed afterwards.
fn restore_rebuilt(
    dir: &Path,
    backup: &Path,
    params: &Map<String, Value>,
) -> BenchResult<Restored> {
    let data = dir.join("w16-rebuild");
    let t = Instant::now();
    kiln_docs::restore_database(
        restore_source(backup)?,
        &data,
        "rebuilt",
        crate::querybench::docs_options().storage,
        false,
        kiln_docs::RestorePoint::Latest,
        |_| {},
    )?;
    let restore_secs = t.elapsed().as_secs_f64();
    let search_dir = data.join("databases").join("rebuilt").join("search");
    let removed = Instant::now();
    std::fs::remove_dir_all(&search_dir)?;
    let removal_secs = removed.elapsed().as_secs_f64();
    let peer = kiln_docs::DocStore::open(&data, crate::querybench::docs_options())?;
    let rebuilt = peer.database("rebuilt")?;
    let found = first_query(&rebuilt, params)?;
    let to_first_query_secs = t.elapsed().as_secs_f64() - removal_secs;
    drop(rebuilt);
    peer.close()?;
    std::fs::remove_dir_all(&data)?;
    Ok(Restored {
        restore_secs,
        to_first_query_secs,
        found,
    })
}

/// Issue 42: a restore of a database with a full-text index, to its first search
/// answered from the caught-up index. A full backup carries each index's tantivy
/// commit (`kiln_docs::search` backup files), so the restored index resumes from
/// it: timed, a backup of `db` restored into the same store until a search answers.
/// The peer, measured in the same run: the same backup restored (offline, into a
/// data directory of its own) with the index's files removed before the database
/// opens, so the index is rebuilt from the first change (what every restore did
/// before the files were carried, and what a backup of an older Kiln still gets).
fn restore_to_first_query(
    store: &kiln_docs::DocStore,
    db: &Database,
    dir: &Path,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    let backup = dir.join("w16.backup");
    let report = write_backup(db, &backup)?;
    let mut params = Map::new();
    params.insert("q".into(), json!(TERMS[0]));

    let shipped = restore_resumed(store, &backup, &params)?;
    let rebuilt = restore_rebuilt(dir, &backup, &params)?;
    std::fs::remove_file(&backup)?;
    if rebuilt.found != shipped.found {
        return Err(format!(
            "W16: the resumed index found {} top hits, the rebuilt one {}",
            shipped.found, rebuilt.found
        )
        .into());
    }
    let shipped_secs = shipped.to_first_query_secs;
    let rebuild_secs = rebuilt.to_first_query_secs;
    extra.insert("restore_seconds".into(), json!(shipped.restore_secs));
    extra.insert("restore_to_first_query_seconds".into(), json!(shipped_secs));
    extra.insert(
        "rebuild_restore_to_first_query_seconds".into(),
        json!(rebuild_secs),
    );
    extra.insert(
        "rebuild_restore_seconds".into(),
        json!(rebuilt.restore_secs),
    );
    extra.insert(
        "restore_ratio_to_rebuild".into(),
        json!(shipped_secs / rebuild_secs.max(1e-9)),
    );
    extra.insert("backup_search_files".into(), json!(report.search_files));
    extra.insert(
        "backup_search_mb".into(),
        json!(report.search_bytes as f64 / 1e6),
    );
    extra.insert("backup_mb".into(), json!(report.file_bytes as f64 / 1e6));
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn quantiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    (
        crate::stats::quantile(&ms, 0.5).unwrap_or(f64::NAN),
        crate::stats::quantile(&ms, 0.99).unwrap_or(f64::NAN),
    )
}

/// A p50 and a p99, in ms.
type Percentiles = (f64, f64);

/// p50/p99 (ms) of Kiln's and tantivy's answers (top 10 + count) to `texts`,
/// each run `rounds` times, and the matches Kiln counted in total.
fn time_kind(
    db: &Database,
    index: &tantivy::Index,
    body: tantivy::schema::Field,
    texts: &[&str],
    rounds: usize,
) -> BenchResult<(Percentiles, Percentiles, u64)> {
    use tantivy::collector::{Count, TopDocs};
    let reader = index.reader()?;
    let searcher = reader.searcher();
    let parser = tantivy::query::QueryParser::for_index(index, vec![body]);
    let mut kiln_ms = Vec::new();
    let mut tantivy_ms = Vec::new();
    let mut matches = 0;
    for round in 0..rounds + 1 {
        for text in texts {
            let mut params = Map::new();
            params.insert("q".into(), json!(text));
            let t = Instant::now();
            let r = db.query(
                "from pages where search(body, $q) limit 10",
                &params,
                QueryOptions::default(),
            )?;
            let kiln = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let q: Box<dyn tantivy::query::Query> = match text.strip_suffix('*') {
                Some(prefix) => Box::new(tantivy::query::FuzzyTermQuery::new_prefix(
                    tantivy::Term::from_field_text(body, prefix),
                    0,
                    true,
                )),
                None => parser.parse_query(text)?,
            };
            let (top, count) =
                searcher.search(&*q, &(TopDocs::with_limit(10).order_by_score(), Count))?;
            let tantivy = t.elapsed().as_secs_f64() * 1e3;
            if r.total != count as u64 || r.results.len() != top.len() {
                return Err(format!(
                    "W16: {text}: Kiln found {} ({} on the page), tantivy {count} ({})",
                    r.total,
                    r.results.len(),
                    top.len()
                )
                .into());
            }
            // The first round warms both (page cache, term dictionaries).
            if round > 0 {
                kiln_ms.push(kiln);
                tantivy_ms.push(tantivy);
                matches += r.total;
            }
        }
    }
    Ok((
        quantiles(kiln_ms),
        quantiles(tantivy_ms),
        matches / rounds.max(1) as u64,
    ))
}

/// Kiln's build: the pages written (their rate into `extra`), then the full-text
/// index defined and timed until it has caught up; its seconds.
fn kiln_build(db: &Database, pages: &[Page], extra: &mut Map<String, Value>) -> BenchResult<f64> {
    let t = Instant::now();
    let last = insert(db, pages)?;
    extra.insert(
        "insert_docs_per_sec".into(),
        json!(pages.len() as f64 / t.elapsed().as_secs_f64()),
    );
    let t = Instant::now();
    db.define_index(definition())?;
    if !db.wait_for_index(INDEX, last, Duration::from_secs(3600))? {
        return Err("the full-text index did not catch up".into());
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The two builds' rates and the two indexes' sizes on disk, into `extra`.
fn report_builds(
    extra: &mut Map<String, Value>,
    pages: &[Page],
    corpus_bytes: usize,
    (kiln_secs, kiln_dir): (f64, &Path),
    (tantivy_secs, tantivy_dir): (f64, &Path),
) {
    let docs = pages.len() as f64;
    extra.insert("build_seconds".into(), json!(kiln_secs));
    extra.insert("build_docs_per_sec".into(), json!(docs / kiln_secs));
    extra.insert(
        "build_mb_per_sec".into(),
        json!(corpus_bytes as f64 / 1e6 / kiln_secs),
    );
    extra.insert("tantivy_build_seconds".into(), json!(tantivy_secs));
    extra.insert(
        "tantivy_build_docs_per_sec".into(),
        json!(docs / tantivy_secs),
    );
    extra.insert(
        "build_ratio_to_tantivy".into(),
        json!(tantivy_secs / kiln_secs),
    );
    extra.insert("index_mb".into(), json!(dir_bytes(kiln_dir) as f64 / 1e6));
    extra.insert(
        "tantivy_index_mb".into(),
        json!(dir_bytes(tantivy_dir) as f64 / 1e6),
    );
}

/// The idle update lag: one page rewritten every 20 ms, each timed from its
/// acknowledgment until the full-text index has committed it; p50/p99 in ms.
fn update_lag(db: &Database, pages: &[Page], rewrites: usize) -> BenchResult<Percentiles> {
    let mut lags = Vec::new();
    for i in 0..rewrites {
        std::thread::sleep(Duration::from_millis(20));
        let n = (i * 7919) % pages.len();
        let put = db.put(
            &format!("pages/{n:06}"),
            page_json(&pages[n]).to_string().as_bytes(),
            Condition::None,
        )?;
        let acked = Instant::now();
        if !db.wait_for_index(INDEX, put.etag.sequence, Duration::from_secs(10))? {
            return Err("the full-text index did not index a rewrite within 10 s".into());
        }
        lags.push(acked.elapsed().as_secs_f64() * 1e3);
    }
    Ok(quantiles(lags))
}

/// W16 over up to `documents` pages (all man pages up to 20,000 and 128 MB of
/// text; 2,000 with `quick`).
pub fn w16(dir: &Path, quick: bool, documents: Option<u64>) -> BenchResult<Run> {
    let limit = documents.unwrap_or(if quick { 2_000 } else { 20_000 }) as usize;
    let (name, pages) = corpus(limit, 128 << 20)?;
    let corpus_bytes: usize = pages.iter().map(|p| p.body.len() + p.title.len()).sum();
    let mut extra = Map::new();
    extra.insert("corpus".into(), json!(name));
    extra.insert("documents".into(), json!(pages.len()));
    extra.insert("corpus_mb".into(), json!(corpus_bytes as f64 / 1e6));
    let (store, db) = fresh(&dir.join("kiln"))?;
    let kiln_secs = kiln_build(&db, &pages, &mut extra)?;
    let tantivy_dir = dir.join("tantivy");
    let (tantivy_secs, index, body) = tantivy_build(&tantivy_dir, &pages)?;
    let search_dir = db.dir().join("search");
    report_builds(
        &mut extra,
        &pages,
        corpus_bytes,
        (kiln_secs, &search_dir),
        (tantivy_secs, &tantivy_dir),
    );
    let rounds = if quick { 5 } else { 30 };
    for (kind, texts) in [("term", TERMS), ("phrase", PHRASES), ("prefix", PREFIXES)] {
        let ((k50, k99), (t50, t99), matches) = time_kind(&db, &index, body, texts, rounds)?;
        extra.insert(format!("{kind}_p50_ms"), json!(k50));
        extra.insert(format!("{kind}_p99_ms"), json!(k99));
        extra.insert(format!("tantivy_{kind}_p50_ms"), json!(t50));
        extra.insert(format!("tantivy_{kind}_p99_ms"), json!(t99));
        extra.insert(format!("{kind}_matches_per_round"), json!(matches));
    }
    let (lag50, lag99) = update_lag(&db, &pages, if quick { 20 } else { 100 })?;
    extra.insert("update_lag_p50_ms".into(), json!(lag50));
    extra.insert("update_lag_p99_ms".into(), json!(lag99));
    restore_to_first_query(&store, &db, dir, &mut extra)?;
    drop(db);
    store.close()?;
    Ok(Run {
        ops: pages.len() as u64,
        commits: 1,
        seconds: kiln_secs,
        extra,
    })
}
