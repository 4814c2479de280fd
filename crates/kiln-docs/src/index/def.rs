//! Index definitions: a name, a collection (or all documents), and fields given as
//! JSON paths; and the entries a document gives an index.

use super::value::{Scalar, TAG_MISSING};
use crate::IndexError;
use crate::{DocError, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// At most this many fields in a compound index.
pub const MAX_INDEX_FIELDS: usize = 8;
/// At most this many entries one document gives one index (arrays multiply).
pub const MAX_ENTRIES_PER_DOC: usize = 1024;
const MAX_PATH_LEN: usize = 256;
const MAX_NAME_LEN: usize = 128;

/// One indexed field: a JSON path (`address.city`, `tags[]`, `lines[].sku`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexField {
    pub path: String,
    /// Strings are indexed lowercased.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub case_insensitive: bool,
    /// A full-text field: its text is analyzed into terms and indexed by tantivy
    /// (`search/`), queried with `search(path, '...')`. An index's fields are all
    /// full-text or none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub search: bool,
    /// A full-text field's analyzer (`search/analyzer.rs`; default `standard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analyzer: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDefinition {
    pub name: String,
    /// `None`: every document of the database.
    pub collection: Option<String>,
    /// A map index's fields (empty for a reduce index).
    #[serde(default)]
    pub fields: Vec<IndexField>,
    /// Created by a query rather than a client (removed when unused).
    #[serde(default)]
    pub auto: bool,
    /// A reduce index: aggregates per group instead of an entry per document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce: Option<ReduceSpec>,
}

/// What a reduce index keeps: per group of documents (the values of `group_by`),
/// the aggregates, by output name: `count()`, `sum(path)`, `min(path)`,
/// `max(path)`, `avg(path)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReduceSpec {
    pub group_by: Vec<IndexField>,
    pub aggregate: std::collections::BTreeMap<String, String>,
}

/// A parsed path: segments, each either a key or "each element of the array here".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Key(String),
    Each,
}

pub(crate) fn parse_path(path: &str) -> Result<Vec<Step>> {
    let bad =
        |why: &str| DocError::Index(IndexError::Invalid(format!("field path {path:?}: {why}")));
    if path.is_empty() || path.len() > MAX_PATH_LEN {
        return Err(bad("must be 1 to 256 bytes"));
    }
    let mut steps = Vec::new();
    for seg in path.split('.') {
        let mut name = seg;
        let mut each = 0;
        while let Some(rest) = name.strip_suffix("[]") {
            name = rest;
            each += 1;
        }
        if name.is_empty() || name.contains(['[', ']']) {
            return Err(bad("each segment is a name, optionally followed by []"));
        }
        steps.push(Step::Key(name.to_string()));
        steps.extend(std::iter::repeat_n(Step::Each, each));
    }
    Ok(steps)
}

/// The values at a path; `[]` fans out over an array's elements (a value that is not
/// an array counts as its only element). Missing gives nothing.
pub(crate) fn values_at<'a>(doc: &'a Value, steps: &[Step], out: &mut Vec<&'a Value>) {
    let Some((first, rest)) = steps.split_first() else {
        out.push(doc);
        return;
    };
    match first {
        Step::Key(k) => {
            if let Some(v) = doc.as_object().and_then(|o| o.get(k)) {
                values_at(v, rest, out)
            }
        }
        Step::Each => match doc {
            Value::Array(items) => {
                for item in items {
                    values_at(item, rest, out)
                }
            }
            other => values_at(other, rest, out),
        },
    }
}

impl IndexDefinition {
    pub fn validate(&self) -> Result<()> {
        validate_index_name(&self.name)?;
        if let Some(c) = &self.collection {
            crate::model::id::validate_collection(c)?;
        }
        if let Some(reduce) = &self.reduce {
            if let Some(f) = reduce
                .group_by
                .iter()
                .find(|f| f.search || f.analyzer.is_some())
            {
                return Err(DocError::Index(IndexError::Invalid(format!(
                    "group_by field {:?}: a reduce index groups by values, not full text",
                    f.path
                ))));
            }
            if !self.fields.is_empty() {
                return Err(DocError::Index(IndexError::Invalid(
                    "a reduce index has group_by and aggregate, not fields".into(),
                )));
            }
            // def <-> reduce: a definition is valid only with a valid reduce spec, and
            // a reducer reads documents by the definition's field paths; one index
            // kind split over two files for size, not two layers.
            return super::reduce::validate(reduce);
        }
        if self.fields.is_empty() || self.fields.len() > MAX_INDEX_FIELDS {
            return Err(DocError::Index(IndexError::Invalid(format!(
                "an index has 1 to {MAX_INDEX_FIELDS} fields"
            ))));
        }
        for f in &self.fields {
            parse_path(&f.path)?;
            if f.analyzer.is_some() && !f.search {
                return Err(DocError::Index(IndexError::Invalid(format!(
                    "field {:?}: an analyzer is for a full-text field (\"search\": true)",
                    f.path
                ))));
            }
            if f.search {
                if f.case_insensitive {
                    return Err(DocError::Index(IndexError::Invalid(format!(
                        "field {:?}: a full-text field's case is its analyzer's \
                         (standard and english lowercase, keyword keeps it)",
                        f.path
                    ))));
                }
                crate::search::analyzer::validate(f.analyzer.as_deref())?;
            }
        }
        if self.is_search() && self.fields.iter().any(|f| !f.search) {
            return Err(DocError::Index(IndexError::Invalid(
                "an index's fields are all full-text (\"search\": true) or none: \
                 define the other fields in a second index"
                    .into(),
            )));
        }
        let mut paths: Vec<&str> = self.fields.iter().map(|f| f.path.as_str()).collect();
        paths.sort_unstable();
        if self.is_search() && paths.windows(2).any(|w| w[0] == w[1]) {
            return Err(DocError::Index(IndexError::Invalid(
                "a full-text index names each field once".into(),
            )));
        }
        Ok(())
    }

    /// A full-text index (kept by tantivy, `search/`), not a B+tree of entries.
    pub fn is_search(&self) -> bool {
        self.fields.iter().any(|f| f.search)
    }

    /// Whether a document may give more than one entry (an array path).
    pub fn multi_valued(&self) -> bool {
        self.fields.iter().any(|f| f.path.contains("[]"))
    }
}

pub fn validate_index_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./@".contains(&b));
    if !ok {
        return Err(DocError::Index(IndexError::Invalid(format!(
            "index name {name:?}: 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 - _ . / @"
        ))));
    }
    Ok(())
}

impl IndexDefinition {
    /// Checks the definition as `define_index` would (name, fields, paths), without
    /// defining it: a cluster's leader checks before it logs the definition.
    pub fn check(&self) -> Result<()> {
        Compiled::new(self.clone()).map(|_| ())
    }
}

/// A definition with its paths parsed, ready to index documents.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    pub def: IndexDefinition,
    pub paths: Vec<Vec<Step>>,
    /// A reduce index's groups and aggregates.
    pub reduce: Option<super::reduce::Reducer>,
}

impl Compiled {
    pub fn new(def: IndexDefinition) -> Result<Compiled> {
        def.validate()?;
        let paths = def
            .fields
            .iter()
            .map(|f| parse_path(&f.path))
            .collect::<Result<_>>()?;
        let reduce = def
            .reduce
            .as_ref()
            .map(super::reduce::Reducer::new)
            .transpose()?;
        Ok(Compiled { def, paths, reduce })
    }

    /// The top-level keys of the document this index reads.
    pub fn top_keys(&self) -> impl Iterator<Item = &str> {
        let reduce_paths = self.reduce.iter().flat_map(|r| r.paths());
        self.paths
            .iter()
            .chain(reduce_paths)
            .filter_map(|p| match p.first() {
                Some(Step::Key(k)) => Some(k.as_str()),
                _ => None,
            })
    }

    pub fn covers_collection(&self, collection: Option<&str>) -> bool {
        match &self.def.collection {
            None => true,
            Some(c) => collection == Some(c.as_str()),
        }
    }

    /// The entry keys (encoded values, without the id) a document gives this index,
    /// sorted and without duplicates; every document of the collection gives at
    /// least one (a missing field is encoded as missing). An error says why the
    /// document cannot be indexed.
    pub fn entries(&self, doc: &Value) -> std::result::Result<Vec<Vec<u8>>, EntriesError> {
        compound_keys(&self.def.fields, &self.paths, doc, TAG_MISSING)
    }
}

/// The compound keys a document gives `fields` (parsed as `paths`): the encoded
/// values of each field, one key per combination (arrays fan out), sorted, without
/// duplicates; a missing field is encoded as `missing` (a tag: `TAG_MISSING`, or
/// `TAG_NULL` where missing and null are one).
pub(crate) fn compound_keys(
    fields: &[IndexField],
    paths: &[Vec<Step>],
    doc: &Value,
    missing: u8,
) -> std::result::Result<Vec<Vec<u8>>, EntriesError> {
    {
        let mut keys: Vec<Vec<u8>> = vec![Vec::new()];
        for (field, steps) in fields.iter().zip(paths) {
            let mut found = Vec::new();
            values_at(doc, steps, &mut found);
            let mut encoded: Vec<Vec<u8>> = Vec::with_capacity(found.len().max(1));
            for v in found {
                let s = Scalar::from_json(v).ok_or_else(|| EntriesError::NotIndexable {
                    path: field.path.clone(),
                    kind: kind(v),
                })?;
                let s = if field.case_insensitive {
                    s.folded()
                } else {
                    s
                };
                encoded.push(s.encode());
            }
            if encoded.is_empty() {
                encoded.push(vec![missing]);
            }
            encoded.sort();
            encoded.dedup();
            if keys.len().saturating_mul(encoded.len()) > MAX_ENTRIES_PER_DOC {
                return Err(EntriesError::TooMany);
            }
            let mut next = Vec::with_capacity(keys.len() * encoded.len());
            for k in &keys {
                for e in &encoded {
                    let mut n = k.clone();
                    n.extend_from_slice(e);
                    next.push(n);
                }
            }
            keys = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// Why a document gives an index no entries (kept as the document's indexing error,
/// which a client reads).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EntriesError {
    #[error("field {path:?} is {kind}; index its elements with [] or a deeper path")]
    NotIndexable { path: String, kind: &'static str },
    #[error("more than {} entries for one document", MAX_ENTRIES_PER_DOC)]
    TooMany,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
        Value::Number(_) => "a number out of range",
        _ => "not indexable",
    }
}

/// Parses a document's JSON keeping only the given top-level keys (the others are
/// skipped without being built), for the indexer, which reads few fields of many
/// documents. The error is serde_json's, as a whole parse would give it.
pub(crate) fn parse_fields(
    json: &[u8],
    keys: &[&str],
) -> std::result::Result<Value, serde_json::Error> {
    use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
    struct Only<'k>(&'k [&'k str]);
    impl<'de> Visitor<'de> for Only<'_> {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Value, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some(k) = m.next_key::<String>()? {
                if self.0.contains(&k.as_str()) {
                    let v: Value = m.next_value()?;
                    out.insert(k, v);
                } else {
                    m.next_value::<IgnoredAny>()?;
                }
            }
            Ok(Value::Object(out))
        }
    }
    impl<'de> DeserializeSeed<'de> for Only<'_> {
        type Value = Value;
        fn deserialize<D: serde::Deserializer<'de>>(
            self,
            d: D,
        ) -> std::result::Result<Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let v = Only(keys).deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}
