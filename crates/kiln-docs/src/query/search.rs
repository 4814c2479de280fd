//! Queries with `search()`: answered by a full-text index (tantivy), the rest of
//! the `where` checked on each match's document.
//!
//! Plans:
//! - the `where` is only `search()` conditions and the order is by score (none
//!   given, or `order by score()`): tantivy's top `offset + limit` by BM25 and its
//!   count. O(page) documents loaded, whatever the number of matches.
//! - anything else (other conditions, `order by` a field, `score() asc`): every
//!   match of the search (at most `max_scan_docs`) is loaded and checked, then
//!   sorted in memory by the order keys (score as a key like any other), ties by id.
//! - a `search()` under `or` or `not`: each search's matches are found (at most
//!   `max_scan_docs` each), then the candidates are checked with every search()
//!   answered by membership in its matches: the union of the matches when every
//!   answer must match a search (`search(a, 'x') or search(b, 'y')`), else the
//!   whole collection (`search(a, 'x') or n > 5`, `not search(...)`: at most
//!   `max_scan_docs` documents). A document's score is the sum of the scores of
//!   the searches it matches outside a `not` (as a boolean query's optional
//!   clauses add up); ties by id.
//!
//! Matches come from the index's last commit, documents from the query's snapshot:
//! a document deleted since it was indexed is left out, one changed since is
//! checked against the rest of the `where` as it is now (the answer is `stale`
//! then, as for the map indexes).

use super::eval::{eval, eval_with, field_values};
use super::highlight::Highlighter;
use super::parse::{Expr, Field, Query, SearchText, Source};
use super::{load, project_value, QueryResult};
use crate::index::value::sort_key;
use crate::index::Runtime;
use crate::search::indexing::each_text;
use crate::search::{tantivy_err, SearchIndex};
use crate::stored::read_last_sequence;
use crate::{Database, DocError, Result};
use crate::{IndexError, QueryError};
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;
use tantivy::collector::{Count, TopDocs};
use tantivy::query::{BooleanQuery, Occur, Query as TantivyQuery};
use tantivy::schema::Value as _;
use tantivy::{DocAddress, Searcher, TantivyDocument};

fn invalid(message: impl Into<String>) -> DocError {
    DocError::Query(QueryError::Invalid {
        line: 0,
        column: 0,
        message: message.into(),
    })
}

/// A `where` split in two: its `search()` conditions, and what is left of it.
type SearchSplit<'e> = (Vec<(&'e Field, &'e SearchText)>, Option<Expr>);

/// The `search()` conditions of a `where` and what is left of it, when every
/// search() is a condition of its top-level `and` (None when one is under an `or`
/// or a `not`).
fn split(filter: &Expr) -> Option<SearchSplit<'_>> {
    let parts: Vec<&Expr> = match filter {
        Expr::And(parts) => parts.iter().collect(),
        e => vec![e],
    };
    let mut searches = Vec::new();
    let mut rest = Vec::new();
    for p in parts {
        match p {
            Expr::Search(f, t) => searches.push((f, t)),
            e if e.has_search() => return None,
            e => rest.push(e.clone()),
        }
    }
    let rest = match rest.len() {
        0 => None,
        1 => rest.pop(),
        _ => Some(Expr::And(rest)),
    };
    Some((searches, rest))
}

/// Every `search()` of `e`, each with whether it is under a `not`.
fn searches_in<'a>(e: &'a Expr, negated: bool, out: &mut Vec<(&'a Field, &'a SearchText, bool)>) {
    match e {
        Expr::Search(f, t) => out.push((f, t, negated)),
        Expr::And(parts) | Expr::Or(parts) => {
            parts.iter().for_each(|p| searches_in(p, negated, out))
        }
        Expr::Not(inner) => searches_in(inner, !negated, out),
        _ => {}
    }
}

/// Whether every document `e` holds for matches at least one of its searches, so
/// that the union of their matches holds every answer.
fn needs_a_match(e: &Expr) -> bool {
    match e {
        Expr::Search(..) => true,
        Expr::And(parts) => parts.iter().any(needs_a_match),
        Expr::Or(parts) => !parts.is_empty() && parts.iter().all(needs_a_match),
        _ => false,
    }
}

/// A match on its way to the page: sort keys, then the tie-breaker.
struct Ranked {
    keys: Vec<Vec<u8>>,
    tie: Vec<u8>,
    id: String,
    score: f32,
}

/// The tie-breaker of tantivy's top hits among equal scores: its address.
fn address_tie(addr: DocAddress) -> Vec<u8> {
    let mut tie = addr.segment_ord.to_be_bytes().to_vec();
    tie.extend_from_slice(&addr.doc_id.to_be_bytes());
    tie
}

/// Orders scores like the other sort keys (bytes, ascending).
fn score_key(score: f32) -> Vec<u8> {
    let bits = score.to_bits();
    let ordered = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    ordered.to_be_bytes().to_vec()
}

impl Database {
    /// The full-text index of the query's collection (or the named index) that
    /// has every field searched.
    fn search_index_for(&self, q: &Query, fields: &[&Field]) -> Result<Arc<Runtime>> {
        let has_all = |rt: &Runtime| {
            rt.search.is_some()
                && fields.iter().all(|f| {
                    rt.compiled
                        .def
                        .fields
                        .iter()
                        .any(|d| d.search && d.path == f.path)
                })
        };
        let wanted = fields
            .iter()
            .map(|f| f.path.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        match &q.source {
            Source::Index(name) => {
                let rt = self
                    .indexer()
                    .get(name)
                    .ok_or_else(|| DocError::Index(IndexError::NotFound(name.clone())))?;
                if !has_all(&rt) {
                    return Err(invalid(format!(
                        "index {name:?} is not a full-text index of {wanted}"
                    )));
                }
                Ok(rt)
            }
            Source::Collection(c) => self
                .indexer()
                .all()
                .into_iter()
                .filter(|rt| rt.compiled.def.collection.as_deref() == Some(c.as_str()))
                .find(|rt| has_all(rt))
                .ok_or_else(|| {
                    invalid(format!(
                        "no full-text index of collection {c:?} has {wanted}: define one, e.g. \
                         {{\"collection\": \"{c}\", \"fields\": [{{\"path\": \"{}\", \"search\": true}}]}}",
                        fields.first().map_or("", |f| f.path.as_str())
                    ))
                }),
        }
    }

    /// The full-text index a query with `search()` runs on.
    pub(super) fn search_runtime(&self, q: &Query) -> Result<Arc<Runtime>> {
        let filter = q.filter.as_ref().ok_or_else(|| invalid("no search()"))?;
        let mut searches = Vec::new();
        searches_in(filter, false, &mut searches);
        let fields: Vec<&Field> = searches.iter().map(|(f, ..)| *f).collect();
        self.search_index_for(q, &fields)
    }

    /// The full-text index of the `search()` conditions of `filter` and each of
    /// them as a tantivy query, with whether it is under a `not`.
    fn prepare_searches<'q>(
        &self,
        q: &Query,
        filter: &'q Expr,
    ) -> Result<(Arc<Runtime>, Searches<'q>)> {
        let mut searches = Vec::new();
        searches_in(filter, false, &mut searches);
        let fields: Vec<&Field> = searches.iter().map(|(f, ..)| *f).collect();
        let rt = self.search_index_for(q, &fields)?;
        let s = searching(&rt)?;
        let mut each: Searches<'q> = Vec::new();
        for (f, t, negated) in searches {
            let i = field_no(&rt, f)?;
            let mut analyzer = s.analyzer(i)?;
            let lowercase = s.analyzers[i] != "keyword";
            let tq =
                crate::search::text::to_query(&t.clauses, s.fields[i], &mut analyzer, lowercase);
            each.push((t, negated, tq));
        }
        Ok((rt, each))
    }

    /// Every document of the query's collection that its `where`, with its
    /// `search()` conditions, holds for, as of the snapshot `r` (for a `group by`;
    /// the full-text index's runtime was waited for with `search_runtime`). Sets
    /// `out`'s index and staleness.
    pub(super) fn search_documents(
        &self,
        q: &Query,
        r: &kiln_storage::ReadTxn<'_>,
        out: &mut QueryResult,
    ) -> Result<Vec<Value>> {
        let filter = q.filter.as_ref().ok_or_else(|| invalid("no search()"))?;
        let (rt, each) = self.prepare_searches(q, filter)?;
        let s = searching(&rt)?;
        let db_seq = read_last_sequence(r)?;
        // The searcher after the index's sequence, as in run_search.
        let indexed = rt.last_sequence.load(std::sync::atomic::Ordering::SeqCst);
        let searcher = s.reader.searcher();
        out.index = Some(rt.name().to_string());
        out.index_etag = (indexed > 0).then(|| self.etag_at(indexed));
        out.stale = indexed < db_seq;
        let collection = rt.compiled.def.collection.as_deref();
        let mut docs = Vec::new();
        self.search_matches(
            filter,
            collection,
            &each,
            &searcher,
            s,
            r,
            out,
            |_, _, v| docs.push(v),
        )?;
        Ok(docs)
    }

    /// Runs a query whose `where` has `search()` (see the module's comment).
    pub(super) fn run_search(
        &self,
        q: &Query,
        opts: super::QueryOptions,
        started: Instant,
    ) -> Result<QueryResult> {
        let filter = q.filter.as_ref().ok_or_else(|| invalid("no search()"))?;
        let (rt, each) = self.prepare_searches(q, filter)?;
        self.use_index(&rt, opts);
        let s = searching(&rt)?;
        let top_level = split(filter);
        let env = self.live()?;
        let r = env.begin_read()?;
        let db_seq = read_last_sequence(&r)?;
        // The searcher first: the index's sequence is then at most what it holds.
        let indexed = rt.last_sequence.load(std::sync::atomic::Ordering::SeqCst);
        let searcher = s.reader.searcher();
        let mut out = QueryResult {
            results: Vec::new(),
            total: 0,
            skipped: 0,
            stale: indexed < db_seq,
            index: Some(rt.name().to_string()),
            index_etag: (indexed > 0).then(|| self.etag_at(indexed)),
            database_etag: (db_seq > 0).then(|| self.etag_at(db_seq)),
            auto_index_created: None,
            duration_ms: 0.0,
            entries_read: 0,
            documents_loaded: 0,
            continuation: None,
        };
        let by_score =
            q.order.is_empty() || matches!(q.order.as_slice(), [(f, true)] if f.is_score());
        let page: Vec<(f32, Value)> = if let Some((_, rest)) = &top_level {
            let query = all_required(&each);
            if by_score && rest.is_none() {
                search_top(q, &*query, &searcher, s, &r, &mut out)?
            } else {
                self.search_sorted(q, rest.as_ref(), &*query, &searcher, s, &r, &mut out)?
            }
        } else {
            let collection = rt.compiled.def.collection.as_deref();
            self.search_nested(q, filter, collection, &each, &searcher, s, &r, &mut out)?
        };
        let generators = highlighters(q, filter, &rt, &searcher, s)?;
        if q.limit > 0 && page.len() == q.limit {
            out.continuation = Some(super::Cont::Offset(q.offset + page.len()).encode());
        }
        for (score, mut v) in page {
            set_score_and_highlights(&mut v, score, &generators);
            let projected = project_value(q, v);
            out.results.push(
                serde_json::to_vec(&projected).map_err(DocError::encode_json("a search result"))?,
            );
        }
        out.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        Ok(out)
    }

    /// Every match of the search, checked against the rest of the `where` and
    /// sorted by the query's order (bounded by `max_scan_docs`); the page of them.
    #[allow(clippy::too_many_arguments)]
    fn search_sorted(
        &self,
        q: &Query,
        rest: Option<&Expr>,
        query: &dyn TantivyQuery,
        searcher: &Searcher,
        s: &SearchIndex,
        r: &kiln_storage::ReadTxn<'_>,
        out: &mut QueryResult,
    ) -> Result<Vec<(f32, Value)>> {
        let err = |e| tantivy_err(&s.dir, "searching", e);
        let max = self.indexer().options().max_scan_docs;
        let total = searcher.search(query, &Count).map_err(err)?;
        if total > max {
            return Err(DocError::Query(QueryError::TooExpensive(format!(
                "{total} documents match the search before the rest of the where and the order \
                 are applied (at most {max} are read); narrow the search, or order by score() only"
            ))));
        }
        let all = if total == 0 {
            Vec::new()
        } else {
            searcher
                .search(query, &TopDocs::with_limit(total).order_by_score())
                .map_err(err)?
        };
        out.entries_read = all.len() as u64;
        // Ties: by score alone, in the index's order (as tantivy's top hits break
        // them, so that both plans give one order); by fields, by document id.
        let by_score_only = q.order.iter().all(|(f, _)| f.is_score());
        let mut matched = Vec::new();
        for (score, addr) in all {
            let id = stored_id(searcher, s, addr)?;
            let Some((_, v)) = load(r, &id, out)? else {
                continue;
            };
            if rest.is_some_and(|e| !eval(e, &v)) {
                continue;
            }
            let tie = if by_score_only {
                address_tie(addr)
            } else {
                id.as_bytes().to_vec()
            };
            matched.push(Ranked {
                keys: order_keys(q, score, &v),
                tie,
                id,
                score,
            });
        }
        page_of(q, matched, r, out)
    }

    /// A `where` with a `search()` under `or` or `not` (see the module's comment).
    #[allow(clippy::too_many_arguments)]
    fn search_nested(
        &self,
        q: &Query,
        filter: &Expr,
        collection: Option<&str>,
        each: &[(&SearchText, bool, Box<dyn TantivyQuery>)],
        searcher: &Searcher,
        s: &SearchIndex,
        r: &kiln_storage::ReadTxn<'_>,
        out: &mut QueryResult,
    ) -> Result<Vec<(f32, Value)>> {
        let mut matched = Vec::new();
        self.search_matches(
            filter,
            collection,
            each,
            searcher,
            s,
            r,
            out,
            |id, score, v| {
                matched.push(Ranked {
                    keys: order_keys(q, score, &v),
                    tie: id.as_bytes().to_vec(),
                    id,
                    score,
                })
            },
        )?;
        page_of(q, matched, r, out)
    }

    /// Visits every document `filter` holds for, with each `search()` answered by
    /// membership in its matches (any shape of `where`; see the module's comment),
    /// with its id and score.
    #[allow(clippy::too_many_arguments)]
    fn search_matches(
        &self,
        filter: &Expr,
        collection: Option<&str>,
        each: &[(&SearchText, bool, Box<dyn TantivyQuery>)],
        searcher: &Searcher,
        s: &SearchIndex,
        r: &kiln_storage::ReadTxn<'_>,
        out: &mut QueryResult,
        mut visit: impl FnMut(String, f32, Value),
    ) -> Result<()> {
        let max = self.indexer().options().max_scan_docs;
        let matches = matches_of_each(each, searcher, s, out, max)?;
        let candidates = self.search_candidates(filter, collection, &matches, r, out, max)?;
        for id in candidates {
            let Some((d, v)) = load(r, &id, out)? else {
                continue;
            };
            if collection.is_some_and(|c| d.collection.as_deref() != Some(c)) {
                continue;
            }
            let found = |t: &SearchText| {
                matches
                    .iter()
                    .find(|(p, ..)| std::ptr::eq(*p, t))
                    .is_some_and(|(_, _, m)| m.contains_key(&id))
            };
            if !eval_with(filter, &v, &|_, t| found(t)) {
                continue;
            }
            // Folded from +0: `sum()` of no f32 is -0 (a document that matches no
            // search, under an `or`, showed `@score: -0` and sorted apart from 0).
            let score: f32 = matches
                .iter()
                .filter(|(_, negated, _)| !negated)
                .filter_map(|(_, _, m)| m.get(&id))
                .fold(0.0, |sum, s| sum + s);
            visit(id, score, v);
        }
        Ok(())
    }

    /// The ids `search_matches` checks: the union of the searches' matches when
    /// every answer must match one, else every document of the collection (at
    /// most `max`).
    fn search_candidates(
        &self,
        filter: &Expr,
        collection: Option<&str>,
        matches: &EachMatches,
        r: &kiln_storage::ReadTxn<'_>,
        out: &mut QueryResult,
        max: usize,
    ) -> Result<Vec<String>> {
        if needs_a_match(filter) {
            let union: BTreeSet<&String> = matches.iter().flat_map(|(_, _, m)| m.keys()).collect();
            return Ok(union.into_iter().cloned().collect());
        }
        let c = collection.ok_or_else(|| {
            invalid("a search() under or / not that any document may satisfy needs a collection")
        })?;
        let n = self.collection_len(c)?;
        if n > max as u64 {
            return Err(DocError::Query(QueryError::TooExpensive(format!(
                "the where holds for documents that match no search() (a search() under \
                 or / not), so all {n} documents of {c} would be read (at most {max})"
            ))));
        }
        let mut ids = Vec::new();
        super::for_each_in_collection(r, c, out, |d, _| ids.push(d.id))?;
        Ok(ids)
    }
}

/// Each `search()` of a `where` as a tantivy query, with whether it is under a `not`.
type Searches<'q> = Vec<(&'q SearchText, bool, Box<dyn TantivyQuery>)>;

/// Each search's matches: its text's address (a search() is known by it) ->
/// (negated, id -> score).
type EachMatches = Vec<(*const SearchText, bool, HashMap<String, f32>)>;

/// The matches of each search under an or / not (at most `max` each).
fn matches_of_each(
    each: &[(&SearchText, bool, Box<dyn TantivyQuery>)],
    searcher: &Searcher,
    s: &SearchIndex,
    out: &mut QueryResult,
    max: usize,
) -> Result<EachMatches> {
    let err = |e| tantivy_err(&s.dir, "searching", e);
    let mut matches: EachMatches = Vec::new();
    for (text, negated, query) in each {
        let total = searcher.search(&**query, &Count).map_err(err)?;
        if total > max {
            return Err(DocError::Query(QueryError::TooExpensive(format!(
                "{total} documents match search('{}') under an or / not (at most {max} \
                 are read); narrow it, or make it a condition of the where's top-level and",
                text.text
            ))));
        }
        let hits = if total == 0 {
            Vec::new()
        } else {
            searcher
                .search(&**query, &TopDocs::with_limit(total).order_by_score())
                .map_err(err)?
        };
        out.entries_read += hits.len() as u64;
        let mut ids = HashMap::with_capacity(hits.len());
        for (score, addr) in hits {
            ids.insert(stored_id(searcher, s, addr)?, score);
        }
        matches.push((*text as *const SearchText, *negated, ids));
    }
    Ok(matches)
}

/// The searches of a `where`'s top-level `and` as one query, every one required.
fn all_required(each: &[(&SearchText, bool, Box<dyn TantivyQuery>)]) -> Box<dyn TantivyQuery> {
    let mut parts: Vec<(Occur, Box<dyn TantivyQuery>)> = each
        .iter()
        .filter(|(_, negated, _)| !negated)
        .map(|(_, _, tq)| (Occur::Must, tq.box_clone()))
        .collect();
    if parts.len() == 1 {
        parts.pop().expect("one").1
    } else {
        Box::new(BooleanQuery::new(parts))
    }
}

/// The page of a query that is only searches ordered by score: tantivy's top
/// `offset + limit` and its count, the page's documents loaded.
fn search_top(
    q: &Query,
    query: &dyn TantivyQuery,
    searcher: &Searcher,
    s: &SearchIndex,
    r: &kiln_storage::ReadTxn<'_>,
    out: &mut QueryResult,
) -> Result<Vec<(f32, Value)>> {
    let err = |e| tantivy_err(&s.dir, "searching", e);
    let total = searcher.search(query, &Count).map_err(err)?;
    out.total = total as u64;
    let want = q.offset + q.limit;
    let top = if q.limit == 0 || total == 0 {
        Vec::new()
    } else {
        let collector = TopDocs::with_limit(want.min(total)).order_by_score();
        searcher.search(query, &collector).map_err(err)?
    };
    out.entries_read = top.len() as u64;
    out.skipped = (q.offset as u64).min(out.total);
    let mut page = Vec::new();
    for (score, addr) in top.into_iter().skip(q.offset) {
        let id = stored_id(searcher, s, addr)?;
        if let Some((_, v)) = load(r, &id, out)? {
            page.push((score, v));
        }
    }
    Ok(page)
}

/// A highlighter for each field the query highlights (see `highlight.rs`).
fn highlighters<'q>(
    q: &'q Query,
    filter: &Expr,
    rt: &Runtime,
    searcher: &Searcher,
    s: &SearchIndex,
) -> Result<Vec<(&'q Field, Highlighter)>> {
    let err = |e| tantivy_err(&s.dir, "searching", e);
    let mut searches = Vec::new();
    searches_in(filter, false, &mut searches);
    q.highlight
        .iter()
        .map(|f| {
            let i = field_no(rt, f)?;
            let h = Highlighter::new(f, s.fields[i], s.analyzer(i)?, &searches, searcher)
                .map_err(err)?;
            Ok((f, h))
        })
        .collect()
}

/// Sets a match's `@score` and, when the query highlights fields,
/// `@highlights` in its `@metadata`.
fn set_score_and_highlights(v: &mut Value, score: f32, generators: &[(&Field, Highlighter)]) {
    if let Some(Value::Object(m)) = v.get_mut("@metadata") {
        // Computed here, never taken from what a client stored.
        m.remove("@highlights");
        // A zero score is written 0, never -0 (whatever sum gave it).
        let score = if score == 0.0 { 0.0 } else { f64::from(score) };
        m.insert("@score".into(), Value::from(score));
        if !generators.is_empty() {
            let h = highlights(v, generators);
            if let Some(Value::Object(m)) = v.get_mut("@metadata") {
                m.insert("@highlights".into(), Value::Object(h));
            }
        }
    }
}

/// Each highlighted field's snippet of `v`: the field's texts, joined by ` … `.
fn highlights(v: &Value, generators: &[(&Field, Highlighter)]) -> Map<String, Value> {
    let mut h = Map::new();
    for (f, g) in generators {
        let mut text = String::new();
        for x in field_values(f, v) {
            each_text(x, &mut |t| {
                if !text.is_empty() {
                    text.push_str(" … ");
                }
                text.push_str(t)
            });
        }
        h.insert(f.path.clone(), Value::String(g.snippet_html(&text)));
    }
    h
}

/// A full-text index's tantivy side.
fn searching(rt: &Runtime) -> Result<&SearchIndex> {
    rt.search
        .as_ref()
        .ok_or_else(|| invalid("not a full-text index"))
}

/// The position of `f` among the index's fields.
fn field_no(rt: &Runtime, f: &Field) -> Result<usize> {
    rt.compiled
        .def
        .fields
        .iter()
        .position(|d| d.path == f.path)
        .ok_or_else(|| invalid(format!("{} is not a field of the index", f.path)))
}

/// A match's sort keys: the query's order (score as a key like the fields), or
/// its score alone.
fn order_keys(q: &Query, score: f32, v: &Value) -> Vec<Vec<u8>> {
    if q.order.is_empty() {
        return vec![score_key(score)];
    }
    q.order
        .iter()
        .map(|(f, _)| {
            if f.is_score() {
                score_key(score)
            } else {
                sort_key(field_values(f, v).first().copied(), f.ci)
            }
        })
        .collect()
}

/// Sorts the matches by the query's order (descending where no order is given:
/// the score), then their tie-breakers, and loads the page's documents.
fn page_of(
    q: &Query,
    mut matched: Vec<Ranked>,
    r: &kiln_storage::ReadTxn<'_>,
    out: &mut QueryResult,
) -> Result<Vec<(f32, Value)>> {
    let desc = |i: usize| q.order.get(i).is_none_or(|(_, d)| *d);
    matched.sort_by(|a, b| {
        for (i, (x, y)) in a.keys.iter().zip(&b.keys).enumerate() {
            let o = if desc(i) { y.cmp(x) } else { x.cmp(y) };
            if o.is_ne() {
                return o;
            }
        }
        a.tie.cmp(&b.tie)
    });
    out.total = matched.len() as u64;
    out.skipped = (q.offset as u64).min(out.total);
    let mut page = Vec::new();
    for m in matched.into_iter().skip(q.offset).take(q.limit) {
        // Loaded (and counted) once already, when it was checked.
        if let Some((_, v)) = super::reload(r, &m.id)? {
            page.push((m.score, v));
        }
    }
    Ok(page)
}

/// The Kiln id of a tantivy document.
fn stored_id(searcher: &Searcher, s: &SearchIndex, addr: DocAddress) -> Result<String> {
    let doc: TantivyDocument = searcher
        .doc(addr)
        .map_err(|e| tantivy_err(&s.dir, "reading a match of", e))?;
    doc.get_first(s.id_field)
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            DocError::Index(IndexError::Search(format!(
                "{}: a match without an id",
                s.dir.display()
            )))
        })
}
