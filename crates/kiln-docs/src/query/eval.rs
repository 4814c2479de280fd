//! What a filter means for one document: the brute-force definition that index
//! scans must agree with.
//!
//! A field may have several values (`tags[]`); a predicate holds when ANY of them
//! satisfies it; a missing field satisfies nothing (but `!=` and `not` hold). Ranges
//! (`<`, `between`, ...) compare within one type; `=` and `in` are exact; numbers
//! compare as numbers. Arrays and objects compare with nothing (only `exists`).

use super::parse::{CmpOp, Expr, Field, SearchText};
use crate::index::def::values_at;
use crate::index::value::Scalar;
use serde_json::Value;

pub(crate) fn field_values<'a>(f: &Field, doc: &'a Value) -> Vec<&'a Value> {
    let mut out = Vec::new();
    values_at(doc, &f.steps, &mut out);
    out
}

fn scalars(f: &Field, doc: &Value) -> Vec<Scalar> {
    field_values(f, doc)
        .into_iter()
        .filter_map(Scalar::from_json)
        .map(|s| if f.ci { s.folded() } else { s })
        .collect()
}

pub(crate) fn eval(e: &Expr, doc: &Value) -> bool {
    // Only a full-text index answers a search() (the query runs it there and
    // evaluates the rest here): no document matches it on its own.
    eval_with(e, doc, &|_, _| false)
}

/// [`eval`] with each `search()` condition answered by `search` (whether the
/// document is among that condition's matches, which a full-text index found).
pub(crate) fn eval_with(
    e: &Expr,
    doc: &Value,
    search: &dyn Fn(&Field, &SearchText) -> bool,
) -> bool {
    match e {
        Expr::And(parts) => parts.iter().all(|p| eval_with(p, doc, search)),
        Expr::Or(parts) => parts.iter().any(|p| eval_with(p, doc, search)),
        Expr::Not(inner) => !eval_with(inner, doc, search),
        Expr::Cmp(f, CmpOp::Ne, v) => !eval(&Expr::Cmp(f.clone(), CmpOp::Eq, v.clone()), doc),
        Expr::Cmp(f, op, v) => {
            let want = v.encode();
            scalars(f, doc).iter().any(|s| {
                if s.class() != v.class() {
                    return false;
                }
                let k = s.encode();
                match op {
                    CmpOp::Eq => k == want,
                    CmpOp::Lt => k < want,
                    CmpOp::Le => k <= want,
                    CmpOp::Gt => k > want,
                    CmpOp::Ge => k >= want,
                    CmpOp::Ne => unreachable!("handled above"),
                }
            })
        }
        Expr::In(f, values) => {
            let wanted: Vec<Vec<u8>> = values.iter().map(Scalar::encode).collect();
            scalars(f, doc).iter().any(|s| wanted.contains(&s.encode()))
        }
        Expr::Between(f, lo, hi) => {
            let (l, h) = (lo.encode(), hi.encode());
            scalars(f, doc).iter().any(|s| {
                let k = s.encode();
                s.class() == lo.class() && k >= l && k <= h
            })
        }
        Expr::StartsWith(f, p) => scalars(f, doc)
            .iter()
            .any(|s| matches!(s, Scalar::String(x) if x.starts_with(p.as_str()))),
        Expr::Exists(f) => !field_values(f, doc).is_empty(),
        Expr::Search(f, t) => search(f, t),
    }
}
