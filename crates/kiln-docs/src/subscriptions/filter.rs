//! A subscription's query: `from <collection> [where ...]` in the query language,
//! parsed by `query/parse.rs` and evaluated per document by `query/eval.rs` (the
//! same meaning a query's `where` has), never a language of its own.

use crate::query::eval::eval;
use crate::query::parse::{self, Expr, Source, DEFAULT_LIMIT};
use crate::{DocError, Result};
use crate::{DocumentError, QueryError};
use serde_json::{Map, Value};

/// What a subscription delivers: the documents of one collection, those for which
/// the filter holds when there is one.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    pub collection: String,
    pub filter: Option<Expr>,
}

impl Compiled {
    /// Parses `text` with `params` (`$name` values). Only a collection and a
    /// `where` mean something to a subscription: it delivers every matching
    /// document in etag order, so `order by`, `limit`, `offset`, `select`, `group
    /// by` and `from index` are refused rather than ignored.
    pub fn parse(text: &str, params: &Map<String, Value>) -> Result<Compiled> {
        let q = parse::parse(text, params)?;
        let refuse = |what: &str| {
            DocError::Query(QueryError::Invalid {
            line: 0,
            column: 0,
            message: format!(
                "a subscription's query is `from <collection> [where ...]`: {what} is not taken (documents come in etag order, all of them)"
            ),
        })
        };
        let collection = match q.source {
            Source::Collection(c) => c,
            Source::Index(_) => return Err(refuse("`from index`")),
        };
        if q.group.is_some() {
            return Err(refuse("`group by`"));
        }
        if !q.order.is_empty() {
            return Err(refuse("`order by`"));
        }
        if q.select.is_some() {
            return Err(refuse("`select`"));
        }
        // The parser fills in the default limit when none is written, so an explicit
        // `limit 128` cannot be told apart; any other limit or offset is refused.
        if q.limit != DEFAULT_LIMIT || q.offset != 0 {
            return Err(refuse("`limit`/`offset`"));
        }
        // `search()` is answered by a full-text index only (on a single document it
        // matches nothing): a subscription with it would silently deliver nothing.
        if q.filter.as_ref().is_some_and(Expr::has_search) {
            return Err(refuse("`search()`"));
        }
        crate::model::id::validate_collection(&collection)?;
        Ok(Compiled {
            collection,
            filter: q.filter,
        })
    }

    /// Whether the document (its stored JSON) is delivered. A document whose JSON
    /// does not parse is corruption, reported rather than skipped: skipping would
    /// lose it silently.
    pub fn matches(&self, id: &str, json: &[u8]) -> Result<bool> {
        let Some(filter) = &self.filter else {
            return Ok(true);
        };
        let doc: Value = serde_json::from_slice(json).map_err(|e| {
            DocError::Document(DocumentError::Corrupt {
                id: id.to_string(),
                why: format!("stored JSON does not parse: {e}"),
            })
        })?;
        Ok(eval(filter, &doc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_collection_and_a_where_are_taken() {
        let none = Map::new();
        let c = Compiled::parse("from orders where total > 10", &none).unwrap();
        assert_eq!(c.collection, "orders");
        assert!(c.matches("o/1", br#"{"total": 11}"#).unwrap());
        assert!(!c.matches("o/2", br#"{"total": 9}"#).unwrap());
        assert!(!c.matches("o/3", br#"{"other": 1}"#).unwrap());
        let all = Compiled::parse("from orders", &none).unwrap();
        assert!(all.matches("o/1", b"not even json").unwrap());
        for bad in [
            "from orders order by total",
            "from orders limit 5",
            "from orders offset 2",
            "from orders select total",
            "from orders group by company select company, count() as n",
            "from index 'x'",
            "from orders where",
            "from orders where search(text, 'x')",
            "select",
        ] {
            assert!(
                matches!(
                    Compiled::parse(bad, &none),
                    Err(DocError::Query(QueryError::Invalid { .. }))
                ),
                "{bad}"
            );
        }
        let params = Map::from_iter([("min".to_string(), Value::from(5))]);
        let p = Compiled::parse("from orders where total >= $min", &params).unwrap();
        assert!(p.matches("o/1", br#"{"total": 5}"#).unwrap());
        assert!(matches!(
            Compiled::parse("from orders where total >= $min", &none),
            Err(DocError::Query(QueryError::Invalid { .. }))
        ));
        assert!(matches!(
            p.matches("o/1", b"{broken"),
            Err(DocError::Document(DocumentError::Corrupt { .. }))
        ));
    }
}
