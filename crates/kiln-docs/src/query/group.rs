//! Grouped queries: `from orders group by company select company, count() as n,
//! sum(amount) as total`. Answered from a reduce index that groups the same
//! collection by the same fields and keeps every aggregate asked for (whatever
//! its names); without one, or with a `where`, by reducing the matching documents
//! (a scan, bounded like any scan). One result per group, an object of the selected
//! names; in group order unless `order by` names outputs; `total` is the number of
//! groups.

use super::eval::eval;
use super::parse::{Expr, Grouping, Query, Selected, Source};
use super::{Cont, QueryOptions, QueryResult};
use crate::index::def::IndexField;
use crate::index::def::Step;
use crate::index::reduce::{self, GroupRow, Reducer};
use crate::index::value::Scalar;
use crate::index::{read_state, ReduceSpec, Runtime};
use crate::model::schema::{decode_u64, COUNTS};
use crate::{Database, DocError, Result};
use crate::{IndexError, QueryError};
use kiln_storage::ReadTxn;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// Where each output comes from: a group value, or an aggregate of the reducer.
enum Source2 {
    Group(usize),
    Aggregate(usize),
}

/// A reduce index that answers a grouped query, and where each aggregate the
/// query selects is in it.
type GroupIndex = (Arc<Runtime>, Vec<usize>);

impl Database {
    pub(super) fn run_grouped(
        &self,
        q: &Query,
        opts: QueryOptions,
        started: Instant,
    ) -> Result<QueryResult> {
        let (Source::Collection(collection), Some(g)) = (&q.source, &q.group) else {
            return Err(invalid("group by needs from <collection>"));
        };
        let env = self.live()?;
        // A `where` on the group fields only is a condition on groups: the index
        // answers it by filtering its groups (`on_groups`).
        let on_groups = q.filter.as_ref().is_some_and(|f| on_group_fields(f, g));
        let (index, auto_created) = self.grouped_query_index(q, collection, g, on_groups)?;
        if let Some((rt, _)) = &index {
            self.use_index(rt, opts);
        }
        // With search(): the groups of the search's matches (at most max_scan_docs
        // of each search), from the full-text index waited for here.
        if q.filter.as_ref().is_some_and(Expr::has_search) {
            let rt = self.search_runtime(q)?;
            self.use_index(&rt, opts);
        }
        let r = env.begin_read()?;
        let db_seq = super::read_last_sequence(&r)?;
        let mut out = empty_result(self, db_seq);
        out.auto_index_created = auto_created;
        let (rows, outputs) = match &index {
            Some((rt, outputs)) => {
                let mut rows = self.index_groups(&r, q, rt, on_groups, db_seq, &mut out)?;
                if let (true, Some(filter)) = (on_groups, &q.filter) {
                    rows.retain(|row| eval(filter, &group_document(g, &row.values)));
                    out.total = rows.len() as u64;
                }
                (rows, outputs_of(g, outputs))
            }
            None => self.groups_by_scan(&r, q, collection, g, &mut out)?,
        };
        let objects: Vec<Map<String, Value>> = rows
            .into_iter()
            .map(|row| project(g, &outputs, row))
            .collect();
        let paged_by_index = index.is_some() && !on_groups;
        page_of_groups(q, objects, paged_by_index, &mut out)?;
        out.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        Ok(out)
    }

    /// The reduce index that answers a grouped query, if one does, and the name
    /// of the auto reduce index this call defined for it, if it did.
    fn grouped_query_index(
        &self,
        q: &Query,
        collection: &str,
        g: &Grouping,
        on_groups: bool,
    ) -> Result<(Option<GroupIndex>, Option<String>)> {
        let mut index = (q.filter.is_none() || on_groups)
            .then(|| self.reduce_index_for(collection, g))
            .flatten();
        // As `where` does for map indexes: a grouped query no reduce index answers
        // defines one; a small collection is answered exactly by a scan this time,
        // a large one by the new index (stale until it has caught up).
        let mut auto_created = None;
        if index.is_none() && q.filter.is_none() {
            auto_created = self.define_auto_reduce_index(collection, g)?;
            if auto_created.is_some()
                && self.collection_len(collection)? > self.indexer().options().max_scan_docs as u64
            {
                index = self.reduce_index_for(collection, g);
            }
        }
        Ok((index, auto_created))
    }

    /// The groups a reduce index holds, as of the snapshot `r`: the page of them
    /// when the query is neither ordered nor filtered on its groups, else all.
    /// Sets `out`'s index, staleness, total and what was skipped and read.
    fn index_groups(
        &self,
        r: &ReadTxn<'_>,
        q: &Query,
        rt: &Runtime,
        on_groups: bool,
        db_seq: u64,
        out: &mut QueryResult,
    ) -> Result<Vec<GroupRow>> {
        let reducer = rt
            .compiled
            .reduce
            .as_ref()
            .ok_or_else(|| invalid("not a reduce index"))?;
        let st = read_state(r, rt.name())?
            .ok_or_else(|| DocError::Index(IndexError::NotFound(rt.name().into())))?;
        out.index = Some(rt.name().to_string());
        out.index_etag = (st.last_sequence > 0).then(|| self.etag_at(st.last_sequence));
        out.stale = st.last_sequence < db_seq;
        out.total = st.entries;
        let (skip, take) = if q.order.is_empty() && !on_groups {
            (q.offset, Some(q.limit))
        } else {
            (0, None)
        };
        out.skipped = skip as u64;
        let rows = reduce::read_groups(r, reducer, st.id, skip, take)?;
        out.entries_read = rows.len() as u64;
        Ok(rows)
    }

    /// The groups of a grouped query no reduce index answers, reduced from the
    /// matching documents, and where each output is among them.
    fn groups_by_scan(
        &self,
        r: &ReadTxn<'_>,
        q: &Query,
        collection: &str,
        g: &Grouping,
        out: &mut QueryResult,
    ) -> Result<(Vec<GroupRow>, Vec<Source2>)> {
        let reducer = Reducer::new(&spec_of(g))?;
        let max_scan = self.indexer().options().max_scan_docs;
        let rows = self.reduce_by_scan(r, q, collection, &reducer, max_scan, out)?;
        out.total = rows.len() as u64;
        let outputs = g
            .select
            .iter()
            .map(|s| match s {
                Selected::Group { position, .. } => Source2::Group(*position),
                Selected::Aggregate { func, path, .. } => Source2::Aggregate(
                    reducer
                        .aggs
                        .iter()
                        .position(|a| a.computes(*func, path.as_deref()))
                        .unwrap_or(0),
                ),
            })
            .collect();
        Ok((rows, outputs))
    }

    /// A reduce index of `collection` grouped by the query's fields that keeps every
    /// aggregate it selects, and where each aggregate is in it.
    fn reduce_index_for(&self, collection: &str, g: &Grouping) -> Option<GroupIndex> {
        let wanted = group_fields(g);
        self.indexer().all().into_iter().find_map(|rt| {
            let reducer = rt.compiled.reduce.as_ref()?;
            if rt.compiled.def.collection.as_deref() != Some(collection)
                || reducer.group_by != wanted
            {
                return None;
            }
            let positions: Option<Vec<usize>> = g
                .select
                .iter()
                .filter_map(|s| match s {
                    Selected::Aggregate { func, path, .. } => Some(
                        reducer
                            .aggs
                            .iter()
                            .position(|a| a.computes(*func, path.as_deref())),
                    ),
                    Selected::Group { .. } => None,
                })
                .collect();
            positions.map(|p| (rt.clone(), p))
        })
    }

    /// Defines the auto reduce index of a grouped query; its name if this call made
    /// it (not if it exists, or another definition has the name).
    fn define_auto_reduce_index(&self, collection: &str, g: &Grouping) -> Result<Option<String>> {
        let spec = spec_of(g);
        let name = auto_reduce_name(collection, &spec);
        let def = crate::index::IndexDefinition {
            name: name.clone(),
            collection: Some(collection.to_string()),
            fields: Vec::new(),
            auto: true,
            reduce: Some(spec),
        };
        match self.define_index(def) {
            Ok(true) => Ok(Some(name)),
            Ok(false) | Err(DocError::Index(IndexError::Exists(_))) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The groups of the documents of `collection` that match the query's filter.
    fn reduce_by_scan(
        &self,
        r: &ReadTxn<'_>,
        q: &Query,
        collection: &str,
        reducer: &Reducer,
        max_scan: usize,
        out: &mut QueryResult,
    ) -> Result<Vec<GroupRow>> {
        if q.filter.as_ref().is_some_and(Expr::has_search) {
            let docs = self.search_documents(q, r, out)?;
            let reducible = docs.iter().filter(|d| reducer.contribution(d).is_ok());
            return reduce::reduce_documents(reducer, reducible)
                .map_err(|e| invalid(&e.to_string()));
        }
        let count = r
            .get(COUNTS, collection.as_bytes())?
            .map_or(Ok(0), |b| decode_u64(b, "collection count"))?;
        if count > max_scan as u64 {
            return Err(DocError::Query(QueryError::TooExpensive(format!(
                "no reduce index answers this group by and collection {collection:?} has {count} \
                 documents (a scan reads at most {max_scan}); define a reduce index with these \
                 group_by fields and aggregates (and no where)"
            ))));
        }
        let mut docs = Vec::new();
        super::for_each_in_collection(r, collection, out, |_, v| {
            if q.filter.as_ref().is_none_or(|f| eval(f, &v)) {
                docs.push(v);
            }
        })?;
        // A document that cannot be reduced is left out, as the index leaves it.
        let reducible = docs.iter().filter(|d| reducer.contribution(d).is_ok());
        reduce::reduce_documents(reducer, reducible).map_err(|e| invalid(&e.to_string()))
    }
}

/// Whether `filter` holds of a document exactly when it holds of the document's
/// group (the group's values as a document): every condition is on a group field
/// (same path and case folding, no array fan-out: a document in several groups
/// would be kept or dropped whole) and compares with a value that is not null
/// (a missing field groups with null; such a condition is false of both alike).
fn on_group_fields(filter: &Expr, g: &Grouping) -> bool {
    let grouped = |f: &super::parse::Field| {
        !f.steps.contains(&Step::Each) && g.by.iter().any(|b| b.path == f.path && b.ci == f.ci)
    };
    let not_null = |v: &Scalar| !matches!(v, Scalar::Null);
    match filter {
        Expr::And(parts) | Expr::Or(parts) => parts.iter().all(|p| on_group_fields(p, g)),
        Expr::Not(inner) => on_group_fields(inner, g),
        Expr::Cmp(f, _, v) => grouped(f) && not_null(v),
        Expr::In(f, vs) => grouped(f) && vs.iter().all(not_null),
        Expr::Between(f, lo, hi) => grouped(f) && not_null(lo) && not_null(hi),
        Expr::StartsWith(f, _) => grouped(f),
        Expr::Exists(_) | Expr::Search(..) => false,
    }
}

/// A group's values as a document (each at its group field's path).
fn group_document(g: &Grouping, values: &[Value]) -> Value {
    let mut doc = Value::Object(Map::new());
    for (f, v) in g.by.iter().zip(values) {
        let mut at = &mut doc;
        let keys: Vec<&str> = f
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Key(k) => Some(k.as_str()),
                Step::Each => None,
            })
            .collect();
        for (i, k) in keys.iter().enumerate() {
            let Value::Object(m) = at else { break };
            let next = if i + 1 == keys.len() {
                v.clone()
            } else {
                Value::Object(Map::new())
            };
            at = m.entry(k.to_string()).or_insert(next);
        }
    }
    doc
}

fn invalid(message: &str) -> DocError {
    DocError::Query(QueryError::Invalid {
        line: 0,
        column: 0,
        message: message.to_string(),
    })
}

fn empty_result(db: &Database, db_seq: u64) -> QueryResult {
    QueryResult {
        results: Vec::new(),
        total: 0,
        skipped: 0,
        stale: false,
        index: None,
        index_etag: None,
        database_etag: (db_seq > 0).then(|| db.etag_at(db_seq)),
        auto_index_created: None,
        duration_ms: 0.0,
        entries_read: 0,
        documents_loaded: 0,
        continuation: None,
    }
}

fn group_fields(g: &Grouping) -> Vec<IndexField> {
    g.by.iter()
        .map(|f| IndexField {
            path: f.path.clone(),
            case_insensitive: f.ci,
            ..Default::default()
        })
        .collect()
}

/// The reduce definition a grouped query needs (for the scan, and to suggest).
fn spec_of(g: &Grouping) -> ReduceSpec {
    let aggregate = g
        .select
        .iter()
        .filter_map(|s| match s {
            Selected::Aggregate { func, path, name } => Some((
                name.clone(),
                format!("{func}({})", path.as_deref().unwrap_or("")),
            )),
            Selected::Group { .. } => None,
        })
        .collect::<std::collections::BTreeMap<_, _>>();
    let mut aggregate = aggregate;
    if aggregate.is_empty() {
        aggregate.insert("count".into(), "count()".into());
    }
    ReduceSpec {
        group_by: group_fields(g),
        aggregate,
    }
}

/// `auto/<collection>/group/<fields>/<aggregates>`, e.g.
/// `auto/orders/group/company/count.sum_amount`; a name over 128 bytes keeps its
/// first 111 and a hash of the whole.
fn auto_reduce_name(collection: &str, spec: &ReduceSpec) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_@".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let fields: Vec<String> = spec
        .group_by
        .iter()
        .map(|f| {
            let p = clean(&f.path.replace("[]", "@each"));
            if f.case_insensitive {
                format!("{p}@ci")
            } else {
                p
            }
        })
        .collect();
    let aggs: Vec<String> = spec
        .aggregate
        .values()
        .map(|call| clean(call.trim_end_matches("()").trim_end_matches(')')))
        .collect();
    let name = format!(
        "auto/{}/group/{}/{}",
        clean(collection),
        fields.join("."),
        aggs.join(".")
    );
    if name.len() <= 128 {
        return name;
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    format!("{}-{:016x}", &name[..111], h.finish())
}

/// Each output's source, for an index whose aggregates the query's are at
/// `positions` (in select order).
fn outputs_of(g: &Grouping, positions: &[usize]) -> Vec<Source2> {
    let mut aggs = positions.iter();
    g.select
        .iter()
        .map(|s| match s {
            Selected::Group { position, .. } => Source2::Group(*position),
            Selected::Aggregate { .. } => Source2::Aggregate(aggs.next().copied().unwrap_or(0)),
        })
        .collect()
}

/// The page of the groups as `out`'s results: those ordered by outputs sorted
/// here, then paged here unless the index paged them (`paged_by_index`); with
/// the continuation when more follow.
fn page_of_groups(
    q: &Query,
    mut objects: Vec<Map<String, Value>>,
    paged_by_index: bool,
    out: &mut QueryResult,
) -> Result<()> {
    if !q.order.is_empty() {
        sort_objects(q, &mut objects)?;
        out.skipped = q.offset.min(objects.len()) as u64;
        objects = objects.into_iter().skip(q.offset).take(q.limit).collect();
    } else if !paged_by_index {
        out.skipped = q.offset.min(objects.len()) as u64;
        objects = objects.into_iter().skip(q.offset).take(q.limit).collect();
    }
    if q.limit > 0 && objects.len() == q.limit && ((q.offset + q.limit) as u64) < out.total {
        out.continuation = Some(Cont::Offset(q.offset + q.limit).encode());
    }
    out.results = objects
        .into_iter()
        .map(|o| serde_json::to_vec(&Value::Object(o)))
        .collect::<std::result::Result<_, _>>()
        .map_err(DocError::encode_json("a grouped result"))?;
    Ok(())
}

fn project(g: &Grouping, outputs: &[Source2], row: GroupRow) -> Map<String, Value> {
    g.select
        .iter()
        .zip(outputs)
        .map(|(s, from)| {
            let v = match from {
                Source2::Group(i) => row.values.get(*i).cloned().unwrap_or(Value::Null),
                Source2::Aggregate(i) => row.aggregates.get(*i).cloned().unwrap_or(Value::Null),
            };
            (s.name().to_string(), v)
        })
        .collect()
}

/// `order by` over the outputs, by name.
fn sort_objects(q: &Query, objects: &mut [Map<String, Value>]) -> Result<()> {
    let g = q.group.as_ref().ok_or_else(|| invalid("not grouped"))?;
    for (f, _) in &q.order {
        if !g.select.iter().any(|s| s.name() == f.path) {
            return Err(invalid(&format!(
                "order by {}: a grouped query orders by its outputs ({})",
                f.path,
                g.select
                    .iter()
                    .map(Selected::name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    objects.sort_by(|a, b| {
        for (f, desc) in &q.order {
            let ka = crate::index::value::sort_key(a.get(&f.path), false);
            let kb = crate::index::value::sort_key(b.get(&f.path), false);
            let o = if *desc { kb.cmp(&ka) } else { ka.cmp(&kb) };
            if o != std::cmp::Ordering::Equal {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    });
    Ok(())
}
