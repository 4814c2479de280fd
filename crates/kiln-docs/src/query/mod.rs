//! Queries: parsing (`parse.rs`), the meaning of a filter on one document
//! (`eval.rs`), and running a query against an index or a small collection (here).
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

pub(crate) mod eval;
mod group;
pub(crate) mod parse;
mod search;

use crate::index::def::Step;
use crate::index::value::{encoded_len, prefix_successor, sort_key, Scalar, TAG_NULL};
use crate::index::{read_state, IndexDefinition, IndexField, Runtime};
use crate::model::schema::{collection_key, decode_u64, entries_tree, BY_COLLECTION, COUNTS};
use crate::stored::read_last_sequence;
use crate::{Database, DocError, Document, Etag, Result};
use crate::{DocumentError, IndexError, QueryError};
use eval::{eval, field_values};
use kiln_storage::{Cursor, Entry, ReadTxn};
use parse::{CmpOp, Expr, Field, Query, Source};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Where a page continues from.
enum Cont {
    Offset(usize),
    After {
        index_id: u64,
        desc: bool,
        /// Matches before the point (for the total when it is counted by walking).
        before: u64,
        key: Vec<u8>,
    },
}

impl Cont {
    fn encode(&self) -> String {
        match self {
            Cont::Offset(n) => format!("o{n}"),
            Cont::After {
                index_id,
                desc,
                before,
                key,
            } => {
                let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
                format!("k{index_id}.{}.{before}.{hex}", u8::from(*desc))
            }
        }
    }

    fn decode(t: &str) -> Result<Cont> {
        let bad = || {
            DocError::Query(QueryError::Invalid {
                line: 0,
                column: 0,
                message: "malformed continuation token".into(),
            })
        };
        if let Some(n) = t.strip_prefix('o') {
            let n: usize = n.parse().map_err(|_| bad())?;
            if n > parse::MAX_OFFSET {
                return Err(bad());
            }
            return Ok(Cont::Offset(n));
        }
        let rest = t.strip_prefix('k').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.splitn(4, '.').collect();
        let [id, desc, before, hex] = parts.as_slice() else {
            return Err(bad());
        };
        if hex.len() % 2 != 0 || hex.len() > 2 * kiln_storage::MAX_KEY_SIZE {
            return Err(bad());
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| bad())?;
        Ok(Cont::After {
            index_id: id.parse().map_err(|_| bad())?,
            desc: *desc == "1",
            before: before.parse().map_err(|_| bad())?,
            key,
        })
    }
}

type Range = (Vec<u8>, Option<Vec<u8>>);

/// How much a conjunct narrows (lower is better).
fn priority(e: &Expr) -> u8 {
    match e {
        Expr::Cmp(_, CmpOp::Eq, _) => 0,
        Expr::In(..) => 1,
        Expr::StartsWith(..) => 2,
        Expr::Between(..) => 3,
        Expr::Cmp(..) => 4,
        _ => 5,
    }
}

/// The key ranges of a conjunct on its field, if an index can answer it exactly.
fn ranges_of(e: &Expr) -> Option<(&Field, Vec<Range>)> {
    let succ = |k: &[u8]| prefix_successor(k);
    Some(match e {
        Expr::Cmp(f, op, v) => {
            let enc = v.encode();
            let (lo, hi) = v.class().bounds();
            let r = match op {
                CmpOp::Eq => (enc.clone(), succ(&enc)),
                CmpOp::Ne => return None,
                CmpOp::Lt => (lo, Some(enc)),
                CmpOp::Le => (lo, succ(&enc)),
                CmpOp::Gt => (succ(&enc)?, Some(hi)),
                CmpOp::Ge => (enc, Some(hi)),
            };
            (f, vec![r])
        }
        Expr::In(f, values) => {
            let mut encs: Vec<Vec<u8>> = values.iter().map(Scalar::encode).collect();
            encs.sort();
            encs.dedup();
            (
                f,
                encs.into_iter()
                    .map(|k| {
                        let hi = succ(&k);
                        (k, hi)
                    })
                    .collect(),
            )
        }
        Expr::Between(f, lo, hi) => {
            let (l, h) = (lo.encode(), hi.encode());
            if l > h {
                (f, vec![])
            } else {
                (f, vec![(l, succ(&h))])
            }
        }
        Expr::StartsWith(f, p) => {
            let lo = Scalar::string_prefix(p);
            let hi = succ(&lo);
            (f, vec![(lo, hi)])
        }
        Expr::Exists(f) => (f, vec![(vec![TAG_NULL], None)]),
        _ => return None,
    })
}

/// The conjunct of the `where` whose field orders a query without `order by`: the
/// most selective one an index could answer (the first of equals). `find_index`
/// drives by this conjunct whenever an index of its field exists.
fn leading(q: &Query) -> Option<&Expr> {
    let mut best: Option<(u8, &Expr)> = None;
    for conj in conjuncts(q.filter.as_ref()?) {
        if ranges_of(conj).is_some() {
            let p = priority(conj);
            if best.is_none_or(|(bp, _)| p < bp) {
                best = Some((p, conj));
            }
        }
    }
    best.map(|(_, c)| c)
}

/// What orders the matches of a query without `order by` (see the module comment).
struct Lead<'q> {
    field: &'q Field,
    /// The leading conjunct's key ranges: an array field sorts by its smallest
    /// element inside them, as a walk of the ranges first meets the document.
    ranges: Vec<Range>,
}

impl<'q> Lead<'q> {
    fn of(q: &'q Query) -> Option<Lead<'q>> {
        if !q.order.is_empty() {
            return None;
        }
        let (field, ranges) = ranges_of(leading(q)?)?;
        Some(Lead { field, ranges })
    }

    /// The document's sort key: the value an index walk of the ranges meets it at.
    fn key(&self, v: &Value) -> Vec<u8> {
        let values = field_values(self.field, v);
        let inside = |k: &Vec<u8>| {
            self.ranges
                .iter()
                .any(|(lo, hi)| k >= lo && hi.as_ref().is_none_or(|h| k < h))
        };
        values
            .iter()
            .filter_map(|x| Scalar::from_json(x))
            .map(|s| if self.field.ci { s.folded() } else { s }.encode())
            .filter(inside)
            .min()
            // Not for a match of the where (its leading conjunct holds); any fixed key.
            .unwrap_or_else(|| sort_key(values.first().copied(), self.field.ci))
    }
}

fn conjuncts(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::And(parts) => parts.iter().flat_map(conjuncts).collect(),
        other => vec![other],
    }
}

fn index_matches(def: &IndexDefinition, f: &Field) -> bool {
    def.fields
        .first()
        .is_some_and(|x| x.path == f.path && x.case_insensitive == f.ci)
}

enum Plan {
    Scan { collection: String },
    Index(IndexPlan),
}

struct IndexPlan {
    rt: Arc<Runtime>,
    ranges: Vec<Range>,
    /// The driving conjunct is the whole filter: the index answers it exactly.
    covered: bool,
    /// Entries in the order asked for (no sort in memory): (stream, desc). `None`:
    /// the matches are sorted in memory (an `order by` on another field, or no
    /// `order by` and a leading conjunct this index is not driven by).
    ordered: Option<bool>,
}

/// Where a page of an index in order resumes: (index id, descending, matches
/// before it, the entry's key).
type After = (u64, bool, u64, Vec<u8>);

/// Where a walk of index `rt` (in the order `ordered`) resumes: the matches before
/// the point and its key, when the point is of this index in this order.
fn resume_in(
    after: Option<After>,
    rt: &Runtime,
    ordered: Option<bool>,
) -> Result<Option<(u64, Vec<u8>)>> {
    match after {
        None => Ok(None),
        Some((id, d, before, key))
            if id == rt.id
                && ordered == Some(d)
                && !rt.compiled.def.multi_valued()
                && rt.compiled.def.fields.len() == 1 =>
        {
            Ok(Some((before, key)))
        }
        Some(_) => Err(DocError::Query(QueryError::Invalid {
            line: 0,
            column: 0,
            message: "the continuation token belongs to another query, or the \
                      index was reset since; start over"
                .into(),
        })),
    }
}

/// A continuation token given to a query it was not made for.
fn foreign_continuation() -> DocError {
    DocError::Query(QueryError::Invalid {
        line: 0,
        column: 0,
        message: "the continuation token belongs to another query; start over".into(),
    })
}

/// A continuation token's offset (set on `q`), or the index entry it resumes after.
fn resume_point(q: &mut Query, continuation: Option<&str>) -> Result<Option<After>> {
    Ok(match continuation.map(Cont::decode).transpose()? {
        Some(Cont::Offset(n)) => {
            q.offset = n;
            None
        }
        Some(Cont::After {
            index_id,
            desc,
            before,
            key,
        }) => {
            q.offset = 0;
            Some((index_id, desc, before, key))
        }
        None => None,
    })
}

/// The field an auto index should cover: the best conjunct's, or the single
/// order-by field.
fn auto_index_field(q: &Query) -> Option<&Field> {
    if let Some((f, _)) = leading(q).and_then(ranges_of) {
        return Some(f);
    }
    match q.order.as_slice() {
        [(f, _)] => Some(f),
        _ => None,
    }
}

fn auto_name(collection: &str, f: &Field) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.@".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let path = f.path.replace("[]", "@each");
    let mut name = format!("auto/{}/{}", clean(collection), clean(&path));
    if f.ci {
        name.push_str("@ci");
    }
    name.truncate(128);
    name
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
                    docs.extend(load_document(r, &id, out)?);
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
            docs.extend(load_document(r, &id, out)?);
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

/// The continuation of a full page (`page_len` documents) of a walk of index
/// `index_id`: the last entry put on it (`last`: its key and match number) where
/// the entries come in key order (`key_order`), else the next page's offset.
fn stream_continuation(
    q: &Query,
    index_id: u64,
    desc: bool,
    key_order: bool,
    last: Option<(Vec<u8>, u64)>,
    page_len: usize,
) -> String {
    if !key_order {
        return Cont::Offset(q.offset + page_len).encode();
    }
    let (key, before) = last.unwrap_or_default();
    Cont::After {
        index_id,
        desc,
        before,
        key,
    }
    .encode()
}

/// The ranges of an index a stream walks, in the defined order.
struct RangeWalk<'s> {
    tree: &'s str,
    ranges: &'s [Range],
    desc: bool,
    /// A compound index: runs of equal first values are read whole (`next_in_order`).
    grouped: bool,
    resume_key: Option<&'s [u8]>,
}

impl RangeWalk<'_> {
    /// Hands every entry of the ranges to `page` until it stops the walk (a full
    /// page whose total is known already) or the ranges end.
    fn run(
        &self,
        page: &mut StreamPage<'_, '_, '_>,
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<()> {
        let desc = self.desc;
        let mut group: Vec<Entry<'_>> = Vec::new();
        let mut c = page.r.cursor(self.tree)?;
        let order: Vec<&Range> = if desc {
            self.ranges.iter().rev().collect()
        } else {
            self.ranges.iter().collect()
        };
        for (lo, hi) in order {
            let inside = |k: &[u8]| {
                if desc {
                    k >= lo.as_slice()
                } else {
                    hi.as_ref().is_none_or(|h| k < h.as_slice())
                }
            };
            let mut item = range_start(&mut c, lo, hi.as_deref(), desc, self.resume_key)?;
            loop {
                if page.counted && page.covered && docs.len() >= page.q.limit {
                    return Ok(());
                }
                let Some(first) = item.filter(|(k, _)| inside(k)) else {
                    break;
                };
                item = next_in_order(&mut c, first, &inside, desc, self.grouped, &mut group)?;
                out.entries_read += group.len() as u64;
                for &(k, id) in &group {
                    if page.take(k, id, out, docs)? == Walk::Stop {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether a stream walks on.
#[derive(PartialEq, Eq)]
enum Walk {
    On,
    Stop,
}

/// A page being filled from an index stream: each entry is a match to skip (the
/// offset), to put on the page, or only to count (the total).
struct StreamPage<'q, 'r, 't> {
    q: &'q Query,
    r: &'r ReadTxn<'t>,
    /// The index answers the whole where: an entry is a match without loading its
    /// document (but a stale index's document is checked before it goes on the page).
    covered: bool,
    /// The total is known already (`count_range`): stop once the page is full.
    counted: bool,
    max_scan: usize,
    /// Matches before the continuation point.
    before: u64,
    matches: u64,
    /// The last entry put on the page, and its match number.
    last: Option<(Vec<u8>, u64)>,
    /// Ids already taken, for a multi-valued index (one entry per array element).
    seen: Option<HashSet<Vec<u8>>>,
    /// The index's top-level fields: all that a covered where reads of a document.
    index_keys: Vec<&'q str>,
}

impl StreamPage<'_, '_, '_> {
    fn take(
        &mut self,
        k: &[u8],
        id: &[u8],
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<Walk> {
        if let Some(seen) = self.seen.as_mut() {
            if !seen.insert(id.to_vec()) {
                return Ok(Walk::On);
            }
        }
        let q = self.q;
        let page_full = docs.len() >= q.limit;
        let skipping = self.matches < q.offset as u64;
        if self.covered {
            if page_full && self.counted {
                return Ok(Walk::Stop);
            }
            if !skipping && !page_full {
                self.load_onto_page(k, id, out, docs)?;
            } else if skipping {
                out.skipped += 1;
            }
            self.matches += 1;
            return Ok(Walk::On);
        }
        if out.documents_loaded as usize >= self.max_scan {
            return Err(DocError::Query(QueryError::TooExpensive(format!(
                "the query would load more than {} documents to check \
                 its where; put its most selective field first in an index, or \
                 narrow it",
                self.max_scan
            ))));
        }
        let id = String::from_utf8_lossy(id).into_owned();
        if let Some((d, v)) = load(self.r, &id, out)? {
            if q.filter.as_ref().is_none_or(|f| eval(f, &v)) {
                if skipping {
                    out.skipped += 1;
                } else if !page_full {
                    docs.push(d);
                    self.last = Some((k.to_vec(), self.before + self.matches + 1));
                }
                self.matches += 1;
            }
        }
        Ok(Walk::On)
    }

    /// A covered match's document onto the page, unless it changed since a stale
    /// index listed it.
    fn load_onto_page(
        &mut self,
        k: &[u8],
        id: &[u8],
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<()> {
        let id = String::from_utf8_lossy(id).into_owned();
        let Some(d) = load_document(self.r, &id, out)? else {
            return Ok(());
        };
        // Covered: the where is one conjunct on the index's own fields, so only those
        // are parsed to check it (the rest of the JSON is skipped, not built).
        let still_matches = match &self.q.filter {
            None => true,
            Some(f) => {
                let fields =
                    crate::index::def::parse_fields(&d.json, &self.index_keys).map_err(|why| {
                        DocError::Document(DocumentError::Corrupt {
                            id: id.clone(),
                            why: format!("stored JSON does not parse: {why}"),
                        })
                    })?;
                eval(f, &fields)
            }
        };
        if still_matches {
            docs.push(d);
            self.last = Some((k.to_vec(), self.before + self.matches + 1));
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

/// Reads the next entries in the defined order into `group`, starting with
/// `first`: that one entry, or for a compound index (`grouped`) the whole run of
/// entries with its first value, sorted by id. Returns the entry after them.
fn next_in_order<'t>(
    c: &mut Cursor<'t>,
    first: Entry<'t>,
    inside: &impl Fn(&[u8]) -> bool,
    desc: bool,
    grouped: bool,
    group: &mut Vec<Entry<'t>>,
) -> Result<Option<Entry<'t>>> {
    group.clear();
    group.push(first);
    let mut item = if desc { c.prev()? } else { c.next()? };
    if grouped {
        let k = first.0;
        let head = &k[..encoded_len(k).unwrap_or(k.len())];
        while let Some(e) = item.filter(|(k, _)| inside(k) && k.starts_with(head)) {
            group.push(e);
            item = if desc { c.prev()? } else { c.next()? };
        }
        group.sort_by(|a, b| if desc { b.1.cmp(a.1) } else { a.1.cmp(b.1) });
    }
    Ok(item)
}

/// The first entry of the range `[lo, hi)` to walk up from, or with `desc` the
/// last one to walk back from; past the continuation point `resume` when that lies
/// within the range.
fn range_start<'t>(
    c: &mut Cursor<'t>,
    lo: &[u8],
    hi: Option<&[u8]>,
    desc: bool,
    resume: Option<&[u8]>,
) -> Result<Option<Entry<'t>>> {
    if desc {
        // The exclusive end to walk back from.
        let end = match (resume, hi) {
            (Some(k), Some(h)) => Some(if k < h { k } else { h }),
            (Some(k), None) => Some(k),
            (None, h) => h,
        };
        Ok(match end {
            Some(h) => {
                let mut it = c.seek_for_prev(h)?;
                if it.is_some_and(|(k, _)| k >= h) {
                    it = c.prev()?;
                }
                it
            }
            None => c.last()?,
        })
    } else {
        Ok(match resume {
            Some(k) if k >= lo => {
                let mut it = c.seek(k)?;
                if it.is_some_and(|(x, _)| x == k) {
                    it = c.next()?;
                }
                it
            }
            _ => c.seek(lo)?,
        })
    }
}

/// How `run_stream` walks an index.
struct Stream<'a> {
    tree: &'a str,
    ranges: &'a [Range],
    covered: bool,
    desc: bool,
    entries: u64,
    max_scan: usize,
    /// Continue after this entry; the matches before it.
    resume: Option<(u64, Vec<u8>)>,
}

/// The number of entries in `[lo, hi)`. A counted index tree (every index made
/// since counted trees) answers in O(log n): two descents summing the counts its
/// branches keep, whatever the range's size. An older, uncounted one is walked:
/// the range and its complement (the entries below `lo` and from `hi`) a step at a
/// time each, stopping when either ends: the range's size, or `entries` less the
/// complement's, so twice the smaller of the two.
fn count_range(
    r: &ReadTxn<'_>,
    tree: &str,
    lo: &[u8],
    hi: Option<&[u8]>,
    entries: u64,
    out: &mut QueryResult,
) -> Result<u64> {
    if r.tree_is_counted(tree)? {
        let hi = hi.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        return Ok(r.count_range(tree, std::ops::Bound::Included(lo), hi)?);
    }
    let mut inside = r.cursor(tree)?;
    let mut below = r.cursor(tree)?;
    let mut above = r.cursor(tree)?;
    let mut it_in = inside.seek(lo)?;
    let mut it_below = below.first()?;
    let mut it_above = match hi {
        Some(h) => above.seek(h)?,
        None => None,
    };
    let (mut n_in, mut n_out) = (0u64, 0u64);
    loop {
        match it_in {
            Some((k, _)) if hi.is_none_or(|h| k < h) => {
                n_in += 1;
                it_in = inside.next()?;
            }
            _ => {
                out.entries_read += n_in + n_out;
                return Ok(n_in);
            }
        }
        if let Some((k, _)) = it_below {
            if k < lo {
                n_out += 1;
                it_below = below.next()?;
                continue;
            }
            it_below = None;
        }
        if it_above.is_some() {
            n_out += 1;
            it_above = above.next()?;
            continue;
        }
        out.entries_read += n_in + n_out;
        return Ok(entries.saturating_sub(n_out));
    }
}

fn fingerprint(text: &str, params: &Map<String, Value>, db_seq: u64, index_seq: u64) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    Value::Object(params.clone()).to_string().hash(&mut h);
    format!("q{:016x}-{db_seq}-{index_seq}", h.finish())
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

/// A document without parsing its JSON.
fn load_document(r: &ReadTxn<'_>, id: &str, out: &mut QueryResult) -> Result<Option<Document>> {
    let Some(bytes) = crate::stored::get(r, id)? else {
        return Ok(None);
    };
    out.documents_loaded += 1;
    Ok(Some(Document::from_record(id, bytes)?))
}

fn load(r: &ReadTxn<'_>, id: &str, out: &mut QueryResult) -> Result<Option<(Document, Value)>> {
    let Some(bytes) = crate::stored::get(r, id)? else {
        return Ok(None);
    };
    out.documents_loaded += 1;
    let d = Document::from_record(id, bytes)?;
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
