//! Choosing a plan: which conjunct of a `where` narrows most, the key ranges it
//! reads in an index, which index answers it, and the auto index a query makes.

use super::eval::field_values;
use super::parse::{CmpOp, Expr, Field, Query};
use crate::index::value::{prefix_successor, sort_key, Scalar, TAG_NULL};
use crate::index::{IndexDefinition, Runtime};
use serde_json::Value;
use std::sync::Arc;

pub(super) type Range = (Vec<u8>, Option<Vec<u8>>);

/// How much a conjunct narrows (lower is better).
pub(super) fn priority(e: &Expr) -> u8 {
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
pub(super) fn ranges_of(e: &Expr) -> Option<(&Field, Vec<Range>)> {
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
pub(super) fn leading(q: &Query) -> Option<&Expr> {
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
pub(super) struct Lead<'q> {
    pub(super) field: &'q Field,
    /// The leading conjunct's key ranges: an array field sorts by its smallest
    /// element inside them, as a walk of the ranges first meets the document.
    pub(super) ranges: Vec<Range>,
}

impl<'q> Lead<'q> {
    pub(super) fn of(q: &'q Query) -> Option<Lead<'q>> {
        if !q.order.is_empty() {
            return None;
        }
        let (field, ranges) = ranges_of(leading(q)?)?;
        Some(Lead { field, ranges })
    }

    /// The document's sort key: the value an index walk of the ranges meets it at.
    pub(super) fn key(&self, v: &Value) -> Vec<u8> {
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

pub(super) fn conjuncts(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::And(parts) => parts.iter().flat_map(conjuncts).collect(),
        other => vec![other],
    }
}

pub(super) fn index_matches(def: &IndexDefinition, f: &Field) -> bool {
    def.fields
        .first()
        .is_some_and(|x| x.path == f.path && x.case_insensitive == f.ci)
}

pub(super) enum Plan {
    Scan { collection: String },
    Index(IndexPlan),
}

pub(super) struct IndexPlan {
    pub(super) rt: Arc<Runtime>,
    pub(super) ranges: Vec<Range>,
    /// The driving conjunct is the whole filter: the index answers it exactly.
    pub(super) covered: bool,
    /// Entries in the order asked for (no sort in memory): (stream, desc). `None`:
    /// the matches are sorted in memory (an `order by` on another field, or no
    /// `order by` and a leading conjunct this index is not driven by).
    pub(super) ordered: Option<bool>,
}

/// The field an auto index should cover: the best conjunct's, or the single
/// order-by field.
pub(super) fn auto_index_field(q: &Query) -> Option<&Field> {
    if let Some((f, _)) = leading(q).and_then(ranges_of) {
        return Some(f);
    }
    match q.order.as_slice() {
        [(f, _)] => Some(f),
        _ => None,
    }
}

pub(super) fn auto_name(collection: &str, f: &Field) -> String {
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
