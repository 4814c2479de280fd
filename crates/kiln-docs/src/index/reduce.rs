//! Reduce indexes: aggregates per group of documents, kept up to date by the
//! indexer like the map indexes (in etag order, in the same transaction as the
//! index's last indexed sequence), never recomputed.
//!
//! A document contributes to each group its `group_by` values give (an array path
//! fans out, as in a map index) its values for each aggregate. Every write takes
//! the document's old contribution back out and puts its new one in, so the
//! aggregates are exact under updates and deletes:
//! - count, sum, avg: per group, the number of documents and per aggregate a sum
//!   and a count of values. Sums are exact for decimal numbers of up to 9
//!   fractional digits in the i128 range (a decimal sum in units of 10^-9); other
//!   numbers go to a float sum beside it. Values that are not numbers are skipped.
//! - min, max: a sum cannot be taken back out of a minimum, so each value is kept
//!   in a tree ordered by (group, aggregate, value, document): the minimum is the
//!   first entry under the group's prefix, the maximum the last.
//!
//! Trees (per index id):
//! - `ix.<id>.e`: group key (the encoded group values) -> the group's state
//! - `ix.<id>.d`: document id -> its contribution (to take it back out)
//! - `ix.<id>.m`: group key ++ aggregate number ++ encoded value ++ document id ->
//!   the value as JSON
//! - `ix.<id>.x`: document id -> why it could not be reduced

use super::def::{
    compound_keys, parse_path, values_at, EntriesError, IndexField, ReduceSpec, Step,
};
use super::value::{encoded_len, prefix_successor, Scalar, TAG_NULL};
use crate::model::schema::{docs_tree, entries_tree};
use crate::{DocError, Result};
use crate::{DocumentError, IndexError};
use kiln_storage::{ReadTxn, WriteTxn};
use serde_json::Value;

const MAX_GROUP_FIELDS: usize = 8;
const MAX_AGGREGATES: usize = 16;
/// Decimal sums are kept in units of 10^-9.
const EXACT_SCALE_DIGITS: usize = 9;

/// Index `id`'s min/max values.
pub(crate) fn extremes_tree(id: u64) -> String {
    format!("ix.{id}.m")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    Count,
    Sum,
    Avg,
    Min,
    Max,
}

impl Func {
    fn name(self) -> &'static str {
        match self {
            Func::Count => "count",
            Func::Sum => "sum",
            Func::Avg => "avg",
            Func::Min => "min",
            Func::Max => "max",
        }
    }

    fn sums(self) -> bool {
        matches!(self, Func::Sum | Func::Avg)
    }
}

/// One aggregate: its function and the path it reads (its output name is the
/// definition's; a query names its own).
#[derive(Debug, Clone)]
pub(crate) struct Agg {
    pub func: Func,
    pub path: Option<String>,
    steps: Vec<Step>,
}

impl Agg {
    /// Whether this aggregate computes `func(path)`.
    pub fn computes(&self, func: Func, path: Option<&str>) -> bool {
        self.func == func && self.path.as_deref() == path
    }
}

/// Parses `count()`, `sum(path)`, ... into a function and its path.
pub(crate) fn parse_call(text: &str) -> Result<(Func, Option<String>)> {
    let bad = || {
        DocError::Index(IndexError::Invalid(format!(
            "aggregate {text:?}: count(), sum(path), avg(path), min(path) or max(path)"
        )))
    };
    let (name, rest) = text.trim().split_once('(').ok_or_else(bad)?;
    let arg = rest.strip_suffix(')').ok_or_else(bad)?.trim();
    let func = match name.trim().to_ascii_lowercase().as_str() {
        "count" => Func::Count,
        "sum" => Func::Sum,
        "avg" => Func::Avg,
        "min" => Func::Min,
        "max" => Func::Max,
        _ => return Err(bad()),
    };
    match (func, arg.is_empty()) {
        (Func::Count, true) => Ok((func, None)),
        (Func::Count, false) | (_, true) => Err(bad()),
        (_, false) => {
            parse_path(arg)?;
            Ok((func, Some(arg.to_string())))
        }
    }
}

pub(crate) fn validate(spec: &ReduceSpec) -> Result<()> {
    Reducer::new(spec).map(|_| ())
}

/// A reduce definition, compiled.
#[derive(Debug, Clone)]
pub(crate) struct Reducer {
    pub group_by: Vec<IndexField>,
    group_paths: Vec<Vec<Step>>,
    pub aggs: Vec<Agg>,
}

impl Reducer {
    pub fn new(spec: &ReduceSpec) -> Result<Reducer> {
        if spec.group_by.is_empty() || spec.group_by.len() > MAX_GROUP_FIELDS {
            return Err(DocError::Index(IndexError::Invalid(format!(
                "a reduce index groups by 1 to {MAX_GROUP_FIELDS} fields"
            ))));
        }
        if spec.aggregate.is_empty() || spec.aggregate.len() > MAX_AGGREGATES {
            return Err(DocError::Index(IndexError::Invalid(format!(
                "a reduce index has 1 to {MAX_AGGREGATES} aggregates"
            ))));
        }
        let group_paths = spec
            .group_by
            .iter()
            .map(|f| parse_path(&f.path))
            .collect::<Result<_>>()?;
        let mut aggs = Vec::with_capacity(spec.aggregate.len());
        for (name, call) in &spec.aggregate {
            let valid_name = !name.is_empty()
                && name.len() <= 64
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid_name {
                return Err(DocError::Index(IndexError::Invalid(format!(
                    "aggregate name {name:?}: 1 to 64 characters of A-Z a-z 0-9 _"
                ))));
            }
            let (func, path) = parse_call(call)?;
            let steps = path
                .as_deref()
                .map(parse_path)
                .transpose()?
                .unwrap_or_default();
            aggs.push(Agg { func, path, steps });
        }
        Ok(Reducer {
            group_by: spec.group_by.clone(),
            group_paths,
            aggs,
        })
    }

    /// Every path the reducer reads (for the indexer's partial parse).
    pub fn paths(&self) -> impl Iterator<Item = &Vec<Step>> {
        self.group_paths
            .iter()
            .chain(self.aggs.iter().map(|a| &a.steps))
    }

    /// What a document gives the index; an error says why it cannot be reduced.
    pub fn contribution(&self, doc: &Value) -> std::result::Result<Contribution, ReduceError> {
        // A missing group field groups with null (as SQL's GROUP BY does).
        let keys = compound_keys(&self.group_by, &self.group_paths, doc, TAG_NULL)?;
        let groups = keys
            .into_iter()
            .map(|key| group_values(&key).map(|values| (key, values)))
            .collect::<std::result::Result<_, ReduceError>>()?;
        let mut values = Vec::with_capacity(self.aggs.len());
        for agg in &self.aggs {
            let mut found = Vec::new();
            values_at(doc, &agg.steps, &mut found);
            values.push(match agg.func {
                Func::Count => AggValues::None,
                Func::Sum | Func::Avg => AggValues::Sum(Amount::of(&found)),
                Func::Min | Func::Max => AggValues::Extremes(extremes(&found)),
            });
        }
        Ok(Contribution { groups, values })
    }
}

/// Why a document cannot be reduced (kept as the document's indexing error, which a
/// client reads), or a brute-force reduce fails.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReduceError {
    /// Its group values give no group key (as a map index's entries).
    #[error(transparent)]
    Entries(#[from] EntriesError),
    #[error("a group key does not decode")]
    GroupKey,
    /// The group's values did not encode as JSON (a bug).
    #[error("{0}")]
    GroupJson(#[source] serde_json::Error),
}

/// A group key's values as JSON (an array), decoded from the key.
fn group_values(mut key: &[u8]) -> std::result::Result<String, ReduceError> {
    let mut out = Vec::new();
    while !key.is_empty() {
        let n = encoded_len(key).ok_or(ReduceError::GroupKey)?;
        out.push(decode_scalar(&key[..n]));
        key = &key[n..];
    }
    serde_json::to_string(&out).map_err(ReduceError::GroupJson)
}

/// The JSON value of an encoded scalar (a missing value is null).
fn decode_scalar(enc: &[u8]) -> Value {
    use super::value::{TAG_FALSE, TAG_NUMBER, TAG_STRING, TAG_TRUE};
    match enc.first().copied() {
        Some(TAG_FALSE) => Value::Bool(false),
        Some(TAG_TRUE) => Value::Bool(true),
        Some(TAG_NUMBER) if enc.len() == 17 => {
            let ordered = u64::from_be_bytes(enc[1..9].try_into().unwrap_or([0; 8]));
            let bits = if ordered >> 63 == 1 {
                ordered ^ (1 << 63)
            } else {
                !ordered
            };
            let f = f64::from_bits(bits);
            let diff =
                (u64::from_be_bytes(enc[9..17].try_into().unwrap_or([0; 8])) ^ (1 << 63)) as i64;
            if f.fract() == 0.0 && f.abs() < 1e38 {
                let exact = f as i128 + diff as i128;
                match i64::try_from(exact) {
                    Ok(i) => Value::from(i),
                    Err(_) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
                }
            } else {
                serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
            }
        }
        Some(TAG_STRING) => {
            let body = &enc[1..enc.len().saturating_sub(2)];
            let mut bytes = Vec::with_capacity(body.len());
            let mut i = 0;
            while i < body.len() {
                bytes.push(body[i]);
                i += if body[i] == 0 { 2 } else { 1 };
            }
            Value::String(String::from_utf8_lossy(&bytes).into_owned())
        }
        _ => Value::Null,
    }
}

/// The scalar values of a min/max path: encoded, and as JSON.
fn extremes(found: &[&Value]) -> Vec<(Vec<u8>, String)> {
    let mut out: Vec<(Vec<u8>, String)> = found
        .iter()
        .filter(|v| !v.is_null())
        .filter_map(|v| Scalar::from_json(v).map(|s| (s.encode(), v.to_string())))
        .collect();
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// A sum and the number of values summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Amount {
    /// The decimal part of the sum, in units of 10^-9.
    exact: i128,
    /// Numbers the decimal sum cannot hold exactly.
    float: f64,
    count: u64,
}

impl Amount {
    fn of(found: &[&Value]) -> Amount {
        let mut a = Amount::default();
        for v in found {
            let Value::Number(n) = v else { continue };
            match exact_scaled(&n.to_string()) {
                Some(scaled) => a.exact = a.exact.saturating_add(scaled),
                None => a.float += n.as_f64().unwrap_or(0.0),
            }
            a.count += 1;
        }
        a
    }

    fn add(&mut self, other: &Amount, sign: i64) {
        if sign > 0 {
            self.exact = self.exact.saturating_add(other.exact);
            self.float += other.float;
            self.count += other.count;
        } else {
            self.exact = self.exact.saturating_sub(other.exact);
            self.float -= other.float;
            self.count = self.count.saturating_sub(other.count);
        }
    }

    /// The sum as a JSON number (an integer when it is one).
    pub fn sum(&self) -> Value {
        let scale = 10i128.pow(EXACT_SCALE_DIGITS as u32);
        if self.float == 0.0 && self.exact % scale == 0 {
            if let Ok(i) = i64::try_from(self.exact / scale) {
                return Value::from(i);
            }
        }
        let total = self.exact as f64 / scale as f64 + self.float;
        serde_json::Number::from_f64(total).map_or(Value::Null, Value::Number)
    }

    pub fn avg(&self) -> Value {
        if self.count == 0 {
            return Value::Null;
        }
        let scale = 10f64.powi(EXACT_SCALE_DIGITS as i32);
        let total = self.exact as f64 / scale + self.float;
        serde_json::Number::from_f64(total / self.count as f64).map_or(Value::Null, Value::Number)
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.exact.to_be_bytes());
        out.extend_from_slice(&self.float.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Amount> {
        Ok(Amount {
            exact: i128::from_be_bytes(r.array()?),
            float: f64::from_be_bytes(r.array()?),
            count: u64::from_be_bytes(r.array()?),
        })
    }
}

/// A JSON number's text as an integer count of 10^-9, when it is a plain decimal
/// (no exponent) of at most 9 fractional digits that fits.
fn exact_scaled(text: &str) -> Option<i128> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let plain = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !plain(whole) || !plain(fraction) || fraction.len() > EXACT_SCALE_DIGITS
    {
        return None;
    }
    let mut scaled: i128 = whole.parse::<i128>().ok()?;
    for _ in 0..EXACT_SCALE_DIGITS {
        scaled = scaled.checked_mul(10)?;
    }
    let mut frac: i128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    for _ in fraction.len()..EXACT_SCALE_DIGITS {
        frac *= 10;
    }
    let v = scaled.checked_add(frac)?;
    // Far from overflow even for many such values (saturating beyond).
    (v.abs() < 1i128 << 100).then_some(if negative { -v } else { v })
}

/// One aggregate's part of a document's contribution.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AggValues {
    None,
    Sum(Amount),
    Extremes(Vec<(Vec<u8>, String)>),
}

/// What one document gives a reduce index.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Contribution {
    /// The groups it belongs to: their keys, and their values as a JSON array.
    groups: Vec<(Vec<u8>, String)>,
    /// Per aggregate, in the reducer's order.
    values: Vec<AggValues>,
}

/// A little reader over stored bytes; running out is a corrupt record.
struct Reader<'b>(&'b [u8]);

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8]> {
        if self.0.len() < n {
            return Err(DocError::Document(DocumentError::Corrupt {
                id: "(reduce index)".into(),
                why: "a stored record is truncated".into(),
            }));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn bytes(&mut self) -> Result<&'b [u8]> {
        let n = u32::from_be_bytes(self.array()?) as usize;
        self.take(n)
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

impl Contribution {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.groups.len() as u32).to_be_bytes());
        for (key, json) in &self.groups {
            put_bytes(&mut out, key);
            put_bytes(&mut out, json.as_bytes());
        }
        for v in &self.values {
            match v {
                AggValues::None => out.push(0),
                AggValues::Sum(a) => {
                    out.push(1);
                    a.encode_into(&mut out);
                }
                AggValues::Extremes(list) => {
                    out.push(2);
                    out.extend_from_slice(&(list.len() as u32).to_be_bytes());
                    for (key, json) in list {
                        put_bytes(&mut out, key);
                        put_bytes(&mut out, json.as_bytes());
                    }
                }
            }
        }
        out
    }

    pub fn decode(raw: &[u8]) -> Result<Contribution> {
        let mut r = Reader(raw);
        let string = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let n = u32::from_be_bytes(r.array()?) as usize;
        let mut groups = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let key = r.bytes()?.to_vec();
            groups.push((key, string(r.bytes()?)));
        }
        let mut values = Vec::new();
        while !r.0.is_empty() {
            values.push(match r.array::<1>()?[0] {
                0 => AggValues::None,
                1 => AggValues::Sum(Amount::decode(&mut r)?),
                _ => {
                    let n = u32::from_be_bytes(r.array()?) as usize;
                    let mut list = Vec::with_capacity(n.min(1024));
                    for _ in 0..n {
                        let key = r.bytes()?.to_vec();
                        list.push((key, string(r.bytes()?)));
                    }
                    AggValues::Extremes(list)
                }
            });
        }
        Ok(Contribution { groups, values })
    }
}

/// A group's state as stored.
#[derive(Debug, Clone, PartialEq)]
struct GroupState {
    values_json: String,
    docs: u64,
    /// One per sum/avg aggregate, in the reducer's order.
    sums: Vec<Amount>,
}

impl GroupState {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_bytes(&mut out, self.values_json.as_bytes());
        out.extend_from_slice(&self.docs.to_be_bytes());
        for s in &self.sums {
            s.encode_into(&mut out);
        }
        out
    }

    fn decode(raw: &[u8]) -> Result<GroupState> {
        let mut r = Reader(raw);
        let values_json = String::from_utf8_lossy(r.bytes()?).into_owned();
        let docs = u64::from_be_bytes(r.array()?);
        let mut sums = Vec::new();
        while !r.0.is_empty() {
            sums.push(Amount::decode(&mut r)?);
        }
        Ok(GroupState {
            values_json,
            docs,
            sums,
        })
    }
}

/// Adds (`sign` 1) or takes out (-1) a document's contribution; returns the change
/// in the number of groups.
pub(crate) fn apply_contribution(
    txn: &mut WriteTxn<'_>,
    reducer: &Reducer,
    index_id: u64,
    doc_id: &str,
    c: &Contribution,
    sign: i64,
) -> Result<i64> {
    let (groups_tree, extremes) = (entries_tree(index_id), extremes_tree(index_id));
    let mut groups_delta = 0;
    for (key, values_json) in &c.groups {
        let mut state = match txn.get(&groups_tree, key)? {
            Some(raw) => GroupState::decode(raw)?,
            None => GroupState {
                values_json: values_json.clone(),
                docs: 0,
                sums: vec![
                    Amount::default();
                    reducer.aggs.iter().filter(|a| a.func.sums()).count()
                ],
            },
        };
        let was_empty = state.docs == 0;
        state.docs = if sign > 0 {
            state.docs + 1
        } else {
            state.docs.saturating_sub(1)
        };
        let mut sum_slot = 0;
        for (agg_no, (agg, v)) in reducer.aggs.iter().zip(&c.values).enumerate() {
            match v {
                AggValues::Sum(amount) if agg.func.sums() => {
                    if let Some(s) = state.sums.get_mut(sum_slot) {
                        s.add(amount, sign);
                    }
                    sum_slot += 1;
                }
                AggValues::Extremes(list) => {
                    for (value_key, json) in list {
                        let k = extreme_key(key, agg_no, value_key, doc_id);
                        if sign > 0 {
                            txn.put(&extremes, &k, json.as_bytes())?;
                        } else {
                            txn.delete(&extremes, &k)?;
                        }
                    }
                }
                _ => {}
            }
        }
        if state.docs == 0 {
            if txn.delete(&groups_tree, key)? {
                groups_delta -= 1;
            }
        } else {
            if was_empty {
                groups_delta += 1;
            }
            txn.put(&groups_tree, key, &state.encode())?;
        }
    }
    Ok(groups_delta)
}

fn extreme_key(group: &[u8], agg_no: usize, value_key: &[u8], doc_id: &str) -> Vec<u8> {
    let mut k = extreme_prefix(group, agg_no);
    k.extend_from_slice(value_key);
    k.extend_from_slice(doc_id.as_bytes());
    k
}

fn extreme_prefix(group: &[u8], agg_no: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(group.len() + 1);
    k.extend_from_slice(group);
    k.push(agg_no as u8);
    k
}

/// Replaces document `doc_id`'s contribution (`new`: `None` when it no longer
/// counts); returns the change in the number of groups.
pub(crate) fn update_document(
    txn: &mut WriteTxn<'_>,
    reducer: &Reducer,
    index_id: u64,
    doc_id: &str,
    new: Option<&Contribution>,
) -> Result<i64> {
    let docs = docs_tree(index_id);
    let old = match txn.get(&docs, doc_id.as_bytes())? {
        Some(raw) => Some(Contribution::decode(raw)?),
        None => None,
    };
    let mut delta = 0;
    if let Some(old) = &old {
        delta += apply_contribution(txn, reducer, index_id, doc_id, old, -1)?;
        txn.delete(&docs, doc_id.as_bytes())?;
    }
    if let Some(new) = new {
        delta += apply_contribution(txn, reducer, index_id, doc_id, new, 1)?;
        txn.put(&docs, doc_id.as_bytes(), &new.encode())?;
    }
    Ok(delta)
}

/// One group of a reduce index as a query reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GroupRow {
    /// The group's values (`group_by` order).
    pub values: Vec<Value>,
    /// Per aggregate, in the reducer's order.
    pub aggregates: Vec<Value>,
}

/// Reads groups of index `index_id` in key order: `skip` of them, then at most
/// `take` (all when `None`).
pub(crate) fn read_groups(
    r: &ReadTxn<'_>,
    reducer: &Reducer,
    index_id: u64,
    skip: usize,
    take: Option<usize>,
) -> Result<Vec<GroupRow>> {
    let mut out = Vec::new();
    let mut c = r.cursor(&entries_tree(index_id))?;
    let mut item = c.first()?;
    let mut skipped = 0;
    while let Some((key, raw)) = item {
        if take.is_some_and(|t| out.len() >= t) {
            break;
        }
        if skipped < skip {
            skipped += 1;
        } else {
            let key = key.to_vec();
            let state = GroupState::decode(raw)?;
            out.push(group_row(r, reducer, index_id, &key, &state)?);
        }
        item = c.next()?;
    }
    Ok(out)
}

fn group_row(
    r: &ReadTxn<'_>,
    reducer: &Reducer,
    index_id: u64,
    key: &[u8],
    state: &GroupState,
) -> Result<GroupRow> {
    let values: Vec<Value> = serde_json::from_str(&state.values_json).map_err(|e| {
        DocError::Document(DocumentError::Corrupt {
            id: "(reduce index group)".into(),
            why: e.to_string(),
        })
    })?;
    let mut sums = state.sums.iter();
    let mut aggregates = Vec::with_capacity(reducer.aggs.len());
    for (agg_no, agg) in reducer.aggs.iter().enumerate() {
        aggregates.push(match agg.func {
            Func::Count => Value::from(state.docs),
            Func::Sum => sums.next().map_or(Value::Null, Amount::sum),
            Func::Avg => sums.next().map_or(Value::Null, Amount::avg),
            Func::Min | Func::Max => extreme(r, index_id, key, agg_no, agg.func == Func::Max)?,
        });
    }
    Ok(GroupRow { values, aggregates })
}

/// The least or greatest value of aggregate `agg_no` in group `key` (null if none).
fn extreme(r: &ReadTxn<'_>, index_id: u64, key: &[u8], agg_no: usize, max: bool) -> Result<Value> {
    let prefix = extreme_prefix(key, agg_no);
    let mut c = r.cursor(&extremes_tree(index_id))?;
    let found = if max {
        match prefix_successor(&prefix) {
            Some(end) => c.seek_for_prev(&end)?.filter(|(k, _)| *k != end.as_slice()),
            None => c.last()?,
        }
    } else {
        c.seek(&prefix)?
    };
    Ok(match found {
        Some((k, v)) if k.starts_with(&prefix) => serde_json::from_slice(v).unwrap_or(Value::Null),
        _ => Value::Null,
    })
}

/// Brute force, for a query no reduce index answers and for tests: the groups of
/// `docs`, in group key order.
pub(crate) fn reduce_documents<'d>(
    reducer: &Reducer,
    docs: impl Iterator<Item = &'d Value>,
) -> std::result::Result<Vec<GroupRow>, ReduceError> {
    use std::collections::BTreeMap;
    struct Acc {
        values: String,
        docs: u64,
        sums: Vec<Amount>,
        extremes: Vec<Vec<(Vec<u8>, String)>>,
    }
    let mut groups: BTreeMap<Vec<u8>, Acc> = BTreeMap::new();
    for doc in docs {
        let c = reducer.contribution(doc)?;
        for (key, values) in &c.groups {
            let acc = groups.entry(key.clone()).or_insert_with(|| Acc {
                values: values.clone(),
                docs: 0,
                sums: vec![Amount::default(); reducer.aggs.len()],
                extremes: vec![Vec::new(); reducer.aggs.len()],
            });
            acc.docs += 1;
            for (i, v) in c.values.iter().enumerate() {
                match v {
                    AggValues::Sum(a) => acc.sums[i].add(a, 1),
                    AggValues::Extremes(list) => acc.extremes[i].extend(list.iter().cloned()),
                    AggValues::None => {}
                }
            }
        }
    }
    Ok(groups
        .into_values()
        .map(|acc| GroupRow {
            values: serde_json::from_str(&acc.values).unwrap_or_default(),
            aggregates: reducer
                .aggs
                .iter()
                .enumerate()
                .map(|(i, agg)| match agg.func {
                    Func::Count => Value::from(acc.docs),
                    Func::Sum => acc.sums[i].sum(),
                    Func::Avg => acc.sums[i].avg(),
                    Func::Min => pick(&acc.extremes[i], false),
                    Func::Max => pick(&acc.extremes[i], true),
                })
                .collect(),
        })
        .collect())
}

fn pick(list: &[(Vec<u8>, String)], max: bool) -> Value {
    let found = if max {
        list.iter().max_by(|a, b| a.0.cmp(&b.0))
    } else {
        list.iter().min_by(|a, b| a.0.cmp(&b.0))
    };
    found.map_or(Value::Null, |(_, json)| {
        serde_json::from_str(json).unwrap_or(Value::Null)
    })
}

impl std::fmt::Display for Func {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_sums_are_exact() {
        assert_eq!(exact_scaled("12.34"), Some(12_340_000_000));
        assert_eq!(exact_scaled("-0.5"), Some(-500_000_000));
        assert_eq!(exact_scaled("7"), Some(7_000_000_000));
        assert_eq!(exact_scaled("1e3"), None);
        assert_eq!(exact_scaled("0.1234567891"), None);
        let mut a = Amount::default();
        for _ in 0..10 {
            a.add(&Amount::of(&[&serde_json::json!(0.1)]), 1);
        }
        assert_eq!(a.sum(), serde_json::json!(1));
        a.add(&Amount::of(&[&serde_json::json!(0.1)]), -1);
        assert_eq!(a.sum().as_f64(), Some(0.9));
    }

    #[test]
    fn encoded_scalars_decode_back() {
        for v in [
            serde_json::json!("acme"),
            serde_json::json!("a\u{0}b"),
            serde_json::json!(42),
            serde_json::json!(-7),
            serde_json::json!(2.5),
            serde_json::json!(true),
            serde_json::json!(null),
            serde_json::json!(9007199254740993u64),
        ] {
            let enc = Scalar::from_json(&v).unwrap().encode();
            assert_eq!(decode_scalar(&enc), v, "{v}");
        }
    }

    #[test]
    fn calls_parse() {
        assert_eq!(parse_call("count()").unwrap(), (Func::Count, None));
        assert_eq!(
            parse_call(" SUM(amount) ").unwrap(),
            (Func::Sum, Some("amount".into()))
        );
        assert!(parse_call("sum()").is_err());
        assert!(parse_call("count(x)").is_err());
        assert!(parse_call("median(x)").is_err());
    }

    #[test]
    fn a_document_that_cannot_be_reduced_says_why_as_before() {
        let spec = ReduceSpec {
            group_by: vec![IndexField {
                path: "tags[]".into(),
                ..IndexField::default()
            }],
            aggregate: [("n".to_string(), "count()".to_string())].into(),
        };
        let reducer = Reducer::new(&spec).unwrap();
        let why = |doc| reducer.contribution(&doc).err().map(|e| e.to_string());
        assert_eq!(why(serde_json::json!({"tags": ["a", "b"]})), None);
        assert_eq!(
            why(serde_json::json!({"tags": [{"x": 1}]})).as_deref(),
            Some("field \"tags[]\" is an object; index its elements with [] or a deeper path")
        );
        let many: Vec<usize> = (0..=super::super::def::MAX_ENTRIES_PER_DOC).collect();
        assert_eq!(
            why(serde_json::json!({ "tags": many })).as_deref(),
            Some("more than 1024 entries for one document")
        );
        assert_eq!(
            group_values(&[super::super::value::TAG_NUMBER, 1])
                .unwrap_err()
                .to_string(),
            "a group key does not decode"
        );
    }
}
