//! Queries: parsing (`parse.rs`), the meaning of a filter on one document
//! (`eval.rs`), choosing a plan (`plan.rs`), walking an index's entries for a page
//! (`walk.rs`), continuation tokens (`continuation.rs`), and running a query
//! against an index or a small collection (here).
//!
//! Plans, from the cheapest:
//! - an index whose first field is the field of the most selective conjunct of the
//!   `where` (`=`, `in`, `startsWith`, `between`, ranges, `exists`): a range scan of
//!   its entries. When that conjunct is the whole `where` the index answers it
//!   exactly: documents are loaded only for the page, the rest is counted from the
//!   entries (`covered`). Otherwise each candidate is loaded and the rest of the
//!   filter checked.
//! - `order by f` on an index of `f`: the entries in order (either direction), so the
//!   first page reads O(page) entries.
//! - a collection scan, only for collections up to `max_scan_docs` documents, or
//!   without a `where` (then in etag order, counted from the collection count).
//!
//! A query on a collection whose fields no index covers creates an auto index (the
//! answer says so). Ranges compare within a type (`n < 5` never matches a string or
//! null); `=`/`in` are exact; `order by` follows the total order of `index/value.rs`.
//!
//! Every plan yields the same order, so that offset pages fit together even when
//! the plan changes between them (the first page scans and creates an auto index,
//! the next ones use it; an index is defined or removed meanwhile):
//! - `order by`: by its keys, ties by document id (descending when the last key is
//!   `desc`, as an index walked backwards gives them).
//! - no `order by`, a `where` with a conjunct an index could answer: by the value of
//!   the leading conjunct's field (`leading`: the most selective one, the first of
//!   equals; the one an auto index is made on), for an array field its smallest
//!   element that satisfies that conjunct, then by document id. That is the order
//!   of a range scan of an index of that field (entries are value ++ id), so the
//!   cheapest plan sorts nothing and stops at the page; a compound index re-sorts
//!   each run of equal first values by id (`run_stream`); a scan, or an index
//!   of another conjunct's field (which load every candidate anyway), sort in memory.
//! - `from index` without such a conjunct: by the index's first field, then id.
//! - otherwise (a collection scan is the only plan): etag order.

mod ast;
mod continuation;
pub(crate) mod eval;
mod group;
mod highlight;
mod lex;
pub(crate) mod parse;
mod plan;
mod search;
mod walk;

use crate::index::def::Step;
use crate::index::value::sort_key;
use crate::index::{read_state, IndexDefinition, IndexField, Runtime};
use crate::model::schema::{collection_key, decode_u64, entries_tree, BY_COLLECTION, COUNTS};
use crate::stored::read_last_sequence;
use crate::{Database, DocError, Document, Etag, Result};
use crate::{IndexError, QueryError};
use continuation::{
    foreign_continuation, resume_in, resume_point, stream_continuation, After, Cont,
};
use eval::{eval, field_values};
use kiln_storage::ReadTxn;
use parse::{Expr, Field, Query, Source};
use plan::{
    auto_index_field, auto_name, conjuncts, index_matches, leading, priority, ranges_of, IndexPlan,
    Lead, Plan, Range,
};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walk::{count_range, RangeWalk, Stream, StreamPage};

/// Longest `wait_for_non_stale_ms` honoured.
pub const MAX_WAIT_MS: u64 = 30_000;

#[derive(Debug, Clone, Copy, Default)]
pub struct QueryOptions {
    /// Wait (bounded by `MAX_WAIT_MS`) for the index to reach the database's etag
    /// as of the start of the query.
    pub wait_for_non_stale_ms: u64,
}

#[derive(Debug, Clone)]
pub struct QueryResult {
    /// The documents (JSON text with `@metadata`) or their projections, in order.
    pub results: Vec<Vec<u8>>,
    /// Exact number of matches (at the index's state when `stale`).
    pub total: u64,
    pub skipped: u64,
    pub stale: bool,
    pub index: Option<String>,
    pub index_etag: Option<Etag>,
    pub database_etag: Option<Etag>,
    /// The auto index this query created, if it did.
    pub auto_index_created: Option<String>,
    pub duration_ms: f64,
    /// Index entries looked at, documents loaded (the query's cost).
    pub entries_read: u64,
    pub documents_loaded: u64,
    /// Given back to `query_page` for the next page; `None` after a page that was
    /// not full. For a scan of an index in order it names the last entry returned,
    /// so the next page starts there without walking the ones before.
    pub continuation: Option<String>,
}

impl Database {
    /// Runs a query (see `parse.rs` for the language).
    pub fn query(
        &self,
        text: &str,
        params: &Map<String, Value>,
        opts: QueryOptions,
    ) -> Result<QueryResult> {
        self.query_page(text, params, opts, None)
    }

    /// Runs a query from where a previous page's `continuation` left off.
    pub fn query_page(
        &self,
        text: &str,
        params: &Map<String, Value>,
        opts: QueryOptions,
        continuation: Option<&str>,
    ) -> Result<QueryResult> {
        let tag = continuation::query_tag(text, params);
        let inner = continuation
            .map(|t| continuation::unbind(t, tag))
            .transpose()?;
        let mut out = self.query_page_untagged(text, params, opts, inner)?;
        out.continuation = out.continuation.map(|t| continuation::bind(&t, tag));
        Ok(out)
    }

    /// `query_page` with the tokens as the plans make and read them (untagged).
    fn query_page_untagged(
        &self,
        text: &str,
        params: &Map<String, Value>,
        opts: QueryOptions,
        continuation: Option<&str>,
    ) -> Result<QueryResult> {
        let started = Instant::now();
        let env = self.live()?;
        let mut q = parse::parse(text, params)?;
        let mut after = resume_point(&mut q, continuation)?;
        if q.group.is_some() {
            if after.is_some() {
                return Err(foreign_continuation());
            }
            return self.run_grouped(&q, opts, started);
        }
        if q.filter.as_ref().is_some_and(Expr::has_search) {
            if after.is_some() {
                return Err(foreign_continuation());
            }
            return self.run_search(&q, opts, started);
        }
        let max_scan = self.indexer().options().max_scan_docs;
        let mut auto_created = None;
        let plan = self.plan(&q, &mut auto_created)?;
        if let Plan::Index(IndexPlan { rt, .. }) = &plan {
            self.use_index(rt, opts);
        }
        let r = env.begin_read()?;
        let db_seq = read_last_sequence(&r)?;
        let mut out = QueryResult {
            results: Vec::new(),
            total: 0,
            skipped: 0,
            stale: false,
            index: None,
            index_etag: None,
            database_etag: (db_seq > 0).then(|| self.etag_at(db_seq)),
            auto_index_created: auto_created,
            duration_ms: 0.0,
            entries_read: 0,
            documents_loaded: 0,
            continuation: None,
        };
        let mut docs: Vec<Document> = Vec::new();
        match plan {
            Plan::Scan { collection } => {
                self.run_scan(&r, &q, &collection, max_scan, &mut out, &mut docs)?
            }
            Plan::Index(plan) => {
                let indexed = self.run_index(&r, &q, plan, after.take(), &mut out, &mut docs)?;
                out.index_etag = (indexed > 0).then(|| self.etag_at(indexed));
                out.stale = indexed < db_seq;
            }
        }
        if after.is_some() {
            return Err(foreign_continuation());
        }
        if out.continuation.is_none() && q.limit > 0 && docs.len() == q.limit {
            out.continuation = Some(Cont::Offset(q.offset + docs.len()).encode());
        }
        out.results = docs
            .into_iter()
            .map(|d| project(&q, d))
            .collect::<Result<_>>()?;
        out.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        Ok(out)
    }

    /// Marks the index used (an auto index unused for long is removed) and, if the
    /// query asks to, waits until it has caught up with the database (bounded).
    fn use_index(&self, rt: &Arc<Runtime>, opts: QueryOptions) {
        rt.last_used_ms
            .store(crate::model::time::now_ms(), Ordering::Relaxed);
        if opts.wait_for_non_stale_ms > 0 {
            let target = self.last_sequence();
            let wait = Duration::from_millis(opts.wait_for_non_stale_ms.min(MAX_WAIT_MS));
            self.indexer().wait_for(rt, target, wait);
        }
    }

    /// Runs a query on an index: its entries in order, or the matching documents
    /// loaded and sorted. Returns the sequence the index is at.
    fn run_index(
        &self,
        r: &ReadTxn<'_>,
        q: &Query,
        plan: IndexPlan,
        after: Option<After>,
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<u64> {
        let IndexPlan {
            rt,
            ranges,
            covered,
            ordered,
        } = plan;
        let st = read_state(r, rt.name())?
            .filter(|st| st.id == rt.id)
            .ok_or_else(|| DocError::Index(IndexError::NotFound(rt.name().to_string())))?;
        out.index = Some(rt.name().to_string());
        let tree = entries_tree(st.id);
        let resume = resume_in(after, &rt, ordered)?;
        let max_scan = self.indexer().options().max_scan_docs;
        match ordered {
            Some(desc) => self.run_stream(
                r,
                q,
                &rt,
                Stream {
                    tree: &tree,
                    ranges: &ranges,
                    covered,
                    desc,
                    entries: st.entries,
                    max_scan,
                    resume,
                },
                out,
                docs,
            )?,
            None => {
                let ids = collect_ids(
                    r,
                    &tree,
                    &ranges,
                    rt.compiled.def.multi_valued(),
                    max_scan,
                    out,
                )?;
                let lead = Lead::of(q);
                let mut matched = Vec::new();
                for id in ids {
                    if let Some((d, v)) = load(r, &id, out)? {
                        if q.filter.as_ref().is_none_or(|f| eval(f, &v)) {
                            matched.push(sorted_by(q, lead.as_ref(), d.id, &v));
                        }
                    }
                }
                for id in page_sorted(q, matched, out) {
                    docs.extend(reload_document(r, &id)?);
                }
            }
        }
        Ok(st.last_sequence)
    }

    /// What an answer to this query depends on, as an HTTP entity tag: the query and
    /// its parameters, the database's last etag and the index's (no query is run).
    pub fn query_fingerprint(&self, text: &str, params: &Map<String, Value>) -> Result<String> {
        self.live()?;
        let q = parse::parse(text, params)?;
        let index_seq = if q.filter.as_ref().is_some_and(Expr::has_search) {
            self.search_runtime(&q)?
                .last_sequence
                .load(Ordering::SeqCst)
        } else {
            match self.find_index(&q)? {
                Some((rt, _)) => rt.last_sequence.load(Ordering::SeqCst),
                None => 0,
            }
        };
        Ok(fingerprint(text, params, self.last_sequence(), index_seq))
    }

    /// The entity tag of an answer.
    pub fn query_result_fingerprint(
        &self,
        text: &str,
        params: &Map<String, Value>,
        result: &QueryResult,
    ) -> String {
        fingerprint(
            text,
            params,
            result.database_etag.map_or(0, |e| e.sequence),
            result.index_etag.map_or(0, |e| e.sequence),
        )
    }

    /// The index a query would use and its driving conjunct (no auto index made).
    fn find_index<'q>(&self, q: &'q Query) -> Result<Option<(Arc<Runtime>, Option<&'q Expr>)>> {
        let candidates: Vec<Arc<Runtime>> = match &q.source {
            Source::Index(name) => {
                vec![self.indexer().get(name).ok_or_else(|| {
                    DocError::Query(QueryError::Invalid {
                        line: 1,
                        column: 1,
                        message: format!("index {name:?} does not exist"),
                    })
                })?]
            }
            Source::Collection(c) => self
                .indexer()
                .all()
                .into_iter()
                .filter(|rt| rt.compiled.def.collection.as_deref() == Some(c.as_str()))
                .collect(),
        };
        let pick = |f: &Field| -> Option<Arc<Runtime>> {
            candidates
                .iter()
                .filter(|rt| index_matches(&rt.compiled.def, f))
                .min_by_key(|rt| (rt.compiled.def.fields.len(), rt.compiled.def.multi_valued()))
                .cloned()
        };
        let mut best: Option<(u8, Arc<Runtime>, &Expr)> = None;
        if let Some(filter) = &q.filter {
            for c in conjuncts(filter) {
                if let Some((f, _)) = ranges_of(c) {
                    if let Some(rt) = pick(f) {
                        let p = priority(c);
                        if best.as_ref().is_none_or(|(bp, ..)| p < *bp) {
                            best = Some((p, rt, c));
                        }
                    }
                }
            }
        }
        if let Some((_, rt, c)) = best {
            return Ok(Some((rt, Some(c))));
        }
        if let [(f, _)] = q.order.as_slice() {
            if let Some(rt) = pick(f) {
                return Ok(Some((rt, None)));
            }
        }
        if let Source::Index(_) = q.source {
            return Ok(candidates.into_iter().next().map(|rt| (rt, None)));
        }
        Ok(None)
    }

    fn plan(&self, q: &Query, auto_created: &mut Option<String>) -> Result<Plan> {
        let mut found = self.find_index(q)?;
        if found.is_none() {
            if let Source::Collection(c) = &q.source {
                if let Some(f) = auto_index_field(q) {
                    if let Some(name) = self.define_auto_index(c, f)? {
                        *auto_created = Some(name);
                    }
                    found = self.find_index(q)?;
                    // A new index has nothing yet: a small collection is answered
                    // exactly by a scan this time.
                    if auto_created.is_some()
                        && self.collection_len(c)? <= self.indexer().options().max_scan_docs as u64
                    {
                        return Ok(Plan::Scan {
                            collection: c.clone(),
                        });
                    }
                }
            }
        }
        let Some((rt, driver)) = found else {
            return match &q.source {
                Source::Collection(c) => Ok(Plan::Scan {
                    collection: c.clone(),
                }),
                Source::Index(n) => Err(DocError::Index(IndexError::NotFound(n.clone()))),
            };
        };
        let ranges = match driver.and_then(ranges_of) {
            Some((_, r)) => r,
            None => vec![(vec![0u8], None)],
        };
        let covered = match (&q.filter, driver) {
            (None, _) => true,
            (Some(f), Some(d)) => conjuncts(f).len() == 1 && std::ptr::eq(conjuncts(f)[0], d),
            _ => false,
        };
        let ordered = match q.order.as_slice() {
            // Without `order by`, the leading conjunct's field orders the matches:
            // the index walk gives that order when the index is driven by it.
            [] => match leading(q) {
                Some(lead) if !driver.is_some_and(|d| std::ptr::eq(d, lead)) => None,
                _ => Some(false),
            },
            [(f, desc)] if index_matches(&rt.compiled.def, f) => Some(*desc),
            _ => None,
        };
        Ok(Plan::Index(IndexPlan {
            rt,
            ranges,
            covered,
            ordered,
        }))
    }

    /// Defines the auto index of collection `c` on field `f`; its name if this call
    /// created it (not if it exists already).
    fn define_auto_index(&self, c: &str, f: &Field) -> Result<Option<String>> {
        let name = auto_name(c, f);
        let def = IndexDefinition {
            name: name.clone(),
            collection: Some(c.to_string()),
            fields: vec![IndexField {
                path: f.path.clone(),
                case_insensitive: f.ci,
                ..Default::default()
            }],
            auto: true,
            reduce: None,
        };
        match self.define_index(def) {
            Ok(true) => Ok(Some(name)),
            Ok(false) | Err(DocError::Index(IndexError::Exists(_))) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn collection_len(&self, c: &str) -> Result<u64> {
        let env = self.live()?;
        let r = env.begin_read()?;
        r.get(COUNTS, c.as_bytes())?.map_or(Ok(0), |b| {
            decode_u64(b, "collection count").map_err(DocError::from)
        })
    }

    fn run_scan(
        &self,
        r: &ReadTxn<'_>,
        q: &Query,
        collection: &str,
        max_scan: usize,
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<()> {
        let count = r
            .get(COUNTS, collection.as_bytes())?
            .map_or(Ok(0), |b| decode_u64(b, "collection count"))?;
        if q.filter.is_none() && q.order.is_empty() {
            // Etag order, counted from the collection count.
            out.total = count;
            let prefix = collection_key(collection, 0);
            let prefix = &prefix[..collection.len() + 1];
            let mut c = r.cursor(BY_COLLECTION)?;
            let mut item = c.seek(prefix)?;
            let mut i = 0usize;
            while let Some((k, id)) = item {
                if !k.starts_with(prefix) || docs.len() == q.limit {
                    break;
                }
                out.entries_read += 1;
                if i >= q.offset {
                    let id = String::from_utf8_lossy(id).into_owned();
                    if let Some((d, _)) = load(r, &id, out)? {
                        docs.push(d);
                    }
                } else {
                    out.skipped += 1;
                }
                i += 1;
                item = c.next()?;
            }
            return Ok(());
        }
        if count > max_scan as u64 {
            return Err(DocError::Query(QueryError::TooExpensive(format!(
                "no index covers this query and collection {collection:?} has {count} documents \
                 (a scan reads at most {max_scan}); define an index on a field of the where or order by"
            ))));
        }
        let lead = Lead::of(q);
        let mut matched = Vec::new();
        for_each_in_collection(r, collection, out, |d, v| {
            if q.filter.as_ref().is_none_or(|f| eval(f, &v)) {
                matched.push(sorted_by(q, lead.as_ref(), d.id, &v));
            }
        })?;
        // In etag order so far: `page_sorted` keeps it only for a query that has no
        // order by and no leading conjunct (only a scan ever answers that).
        for id in page_sorted(q, matched, out) {
            docs.extend(reload_document(r, &id)?);
        }
        Ok(())
    }

    fn run_stream(
        &self,
        r: &ReadTxn<'_>,
        q: &Query,
        rt: &Runtime,
        s: Stream<'_>,
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<()> {
        let Stream {
            tree,
            ranges,
            covered,
            desc,
            entries,
            max_scan,
            resume,
        } = s;
        let (before, resume_key) = match resume {
            Some((b, k)) => (b, Some(k)),
            None => (0, None),
        };
        let multi = rt.compiled.def.multi_valued();
        // A compound index's entries go by all its values, then id; the defined order
        // is its first field's value, then id: each run of entries with equal first
        // values is read whole and sorted by id (descending when walking backwards).
        let grouped = rt.compiled.def.fields.len() > 1;
        // One range answered by a single-valued index: counted without walking it
        // all (see `count_range`), so the walk stops when the page is full.
        let fast_total = match ranges {
            [(lo, hi)] if covered && !multi => {
                Some(count_range(r, tree, lo, hi.as_deref(), entries, out)?)
            }
            _ => None,
        };
        let mut page = StreamPage {
            q,
            r,
            covered,
            counted: fast_total.is_some(),
            max_scan,
            before,
            matches: 0,
            last: None,
            seen: multi.then(HashSet::new),
            index_keys: rt.compiled.top_keys().collect(),
        };
        let walk = RangeWalk {
            tree,
            ranges,
            desc,
            grouped,
            resume_key: resume_key.as_deref(),
        };
        walk.run(&mut page, out, docs)?;
        out.total = fast_total.unwrap_or(before + page.matches);
        if q.limit > 0 && docs.len() == q.limit {
            // An entry to resume after only where entries come in key order.
            let key_order = !(multi || grouped);
            out.continuation = Some(stream_continuation(
                q,
                rt.id,
                desc,
                key_order,
                page.last,
                docs.len(),
            ));
        }
        Ok(())
    }
}

/// Every document of `collection`, loaded, in etag order (the scan's cost counted in
/// `out`).
pub(super) fn for_each_in_collection(
    r: &ReadTxn<'_>,
    collection: &str,
    out: &mut QueryResult,
    mut visit: impl FnMut(Document, Value),
) -> Result<()> {
    let prefix = collection_key(collection, 0);
    let prefix = &prefix[..collection.len() + 1];
    let mut c = r.cursor(BY_COLLECTION)?;
    let mut item = c.seek(prefix)?;
    while let Some((k, id)) = item {
        if !k.starts_with(prefix) {
            break;
        }
        out.entries_read += 1;
        let id = String::from_utf8_lossy(id).into_owned();
        if let Some((d, v)) = load(r, &id, out)? {
            visit(d, v);
        }
        item = c.next()?;
    }
    Ok(())
}

fn fingerprint(text: &str, params: &Map<String, Value>, db_seq: u64, index_seq: u64) -> String {
    let query = continuation::query_tag(text, params);
    format!("q{query:016x}-{db_seq}-{index_seq}")
}

/// The distinct ids in the ranges, bounded by `max`.
fn collect_ids(
    r: &ReadTxn<'_>,
    tree: &str,
    ranges: &[Range],
    multi: bool,
    max: usize,
    out: &mut QueryResult,
) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    let mut seen = HashSet::new();
    let mut c = r.cursor(tree)?;
    for (lo, hi) in ranges {
        let mut item = c.seek(lo)?;
        while let Some((k, id)) = item {
            if hi.as_ref().is_some_and(|h| k >= h.as_slice()) {
                break;
            }
            out.entries_read += 1;
            if !multi || seen.insert(id.to_vec()) {
                if ids.len() >= max {
                    return Err(DocError::Query(QueryError::TooExpensive(format!(
                        "more than {max} documents match before sorting; add an index whose first \
                         field is the order by field (without order by: the field of the where's \
                         most selective condition)"
                    ))));
                }
                ids.push(String::from_utf8_lossy(id).into_owned());
            }
            item = c.next()?;
        }
    }
    Ok(ids)
}

/// A document without parsing its JSON (counted in `documents_loaded`).
fn load_document(r: &ReadTxn<'_>, id: &str, out: &mut QueryResult) -> Result<Option<Document>> {
    let d = reload_document(r, id)?;
    out.documents_loaded += u64::from(d.is_some());
    Ok(d)
}

/// A document and its JSON parsed (counted in `documents_loaded`).
fn load(r: &ReadTxn<'_>, id: &str, out: &mut QueryResult) -> Result<Option<(Document, Value)>> {
    let d = reload(r, id)?;
    out.documents_loaded += u64::from(d.is_some());
    Ok(d)
}

/// A document this query loaded already (a sort keeps only ids and keys, then
/// reads the page's documents again): not counted again, so `documents_loaded` is
/// the number of documents the query read, each once.
fn reload_document(r: &ReadTxn<'_>, id: &str) -> Result<Option<Document>> {
    let Some(bytes) = crate::stored::get(r, id)? else {
        return Ok(None);
    };
    Ok(Some(Document::from_record(id, bytes)?))
}

/// `reload_document` with its JSON parsed.
fn reload(r: &ReadTxn<'_>, id: &str) -> Result<Option<(Document, Value)>> {
    let Some(d) = reload_document(r, id)? else {
        return Ok(None);
    };
    let v = d.to_value()?;
    Ok(Some((d, v)))
}

/// A match's id with its sort keys: the order-by fields' values, or without
/// `order by` the leading conjunct's (see `Lead`), or none (etag order is kept).
fn sorted_by(q: &Query, lead: Option<&Lead>, id: String, v: &Value) -> (Vec<Vec<u8>>, String) {
    let keys = if q.order.is_empty() {
        lead.map(|lead| lead.key(v)).into_iter().collect()
    } else {
        q.order
            .iter()
            .map(|(f, _)| sort_key(field_values(f, v).first().copied(), f.ci))
            .collect()
    };
    (keys, id)
}

/// Sorts the matches in memory (by their keys, then id) and returns the page's ids
/// (the documents are loaded again for the page only: a sort holds no document).
/// Ties go by id descending when the last `order by` key is descending (as the
/// walk of an index backwards gives them), else ascending. Matches without keys
/// keep their order.
fn page_sorted(
    q: &Query,
    mut matched: Vec<(Vec<Vec<u8>>, String)>,
    out: &mut QueryResult,
) -> Vec<String> {
    out.total = matched.len() as u64;
    let desc = |i: usize| q.order.get(i).is_some_and(|(_, d)| *d);
    let id_desc = q.order.last().is_some_and(|(_, d)| *d);
    if matched.first().is_some_and(|(keys, _)| !keys.is_empty()) {
        matched.sort_by(|a, b| {
            for (i, (x, y)) in a.0.iter().zip(&b.0).enumerate() {
                let o = x.cmp(y);
                let o = if desc(i) { o.reverse() } else { o };
                if o.is_ne() {
                    return o;
                }
            }
            let o = a.1.as_bytes().cmp(b.1.as_bytes());
            if id_desc {
                o.reverse()
            } else {
                o
            }
        });
    }
    out.skipped = (q.offset as u64).min(out.total);
    matched
        .into_iter()
        .skip(q.offset)
        .take(q.limit)
        .map(|(_, id)| id)
        .collect()
}

/// The document's JSON, or with `select` an object of the selected fields (by their
/// path) and `@metadata`.
fn project(q: &Query, d: Document) -> Result<Vec<u8>> {
    if q.select.is_none() {
        return Ok(d.json);
    }
    let v = project_value(q, d.to_value()?);
    serde_json::to_vec(&v).map_err(DocError::encode_json("a query's projection"))
}

/// A document's JSON as `select` projects it (as it is without a `select`).
fn project_value(q: &Query, v: Value) -> Value {
    let Some(fields) = &q.select else {
        return v;
    };
    let mut obj = Map::new();
    for f in fields {
        let values = field_values(f, &v);
        let each = f.steps.contains(&Step::Each);
        let value = if each {
            Value::Array(values.into_iter().cloned().collect())
        } else {
            values.first().map_or(Value::Null, |x| (*x).clone())
        };
        obj.insert(f.path.clone(), value);
    }
    if let Some(m) = v.get("@metadata") {
        obj.insert("@metadata".into(), m.clone());
    }
    Value::Object(obj)
}
