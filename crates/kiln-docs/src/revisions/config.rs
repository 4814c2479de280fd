//! Which collections keep revisions, and how many: the configuration a client sets
//! with `PUT /dbs/{db}/revisions/config`, stored as JSON under the `meta` key
//! `revisions_config`, and the copy of it the write path reads.

use crate::{validate_collection, DocError, Result};
use crate::{DocumentError, RevisionError};
use kiln_storage::WriteTxn;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The most revisions one document may keep.
pub const MAX_REVISIONS_LIMIT: u32 = 10_000;
/// The most collections a configuration may name (every input has a limit).
pub const MAX_CONFIGURED_COLLECTIONS: usize = 1_000;
/// The longest `max_age_ms`: 2^53 - 1, the largest integer every JSON client
/// reads back exactly (some 285,000 years).
pub const MAX_AGE_MS_LIMIT: u64 = (1 << 53) - 1;

/// Which collections keep revisions. A collection named here need not exist yet:
/// its documents keep revisions once they arrive.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevisionsConfig {
    #[serde(default)]
    pub collections: BTreeMap<String, CollectionRevisions>,
}

/// How much of one collection's history is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectionRevisions {
    /// Previous versions kept per document (1..=10,000): a write that makes more
    /// drops the oldest.
    pub max_revisions: u32,
    /// A revision replaced longer ago than this is dropped by the document's next
    /// write (`None`: kept whatever its age).
    #[serde(default)]
    pub max_age_ms: Option<u64>,
}

impl RevisionsConfig {
    /// Parses and checks a configuration as a client sends it.
    pub fn from_json(json: &[u8]) -> Result<RevisionsConfig> {
        let bad = |e: serde_json::Error| {
            DocError::Revision(RevisionError::InvalidConfig(format!(
                "{e} (the body is {{\"collections\": {{\"<collection>\": \
                 {{\"max_revisions\": N, \"max_age_ms\": ms or null}}}}}})"
            )))
        };
        // An object, not the array serde would also take for a struct.
        let value: serde_json::Value = serde_json::from_slice(json).map_err(bad)?;
        if !value.is_object() {
            return Err(DocError::Revision(RevisionError::InvalidConfig(
                "the configuration must be a JSON object".into(),
            )));
        }
        let config: RevisionsConfig = serde_json::from_value(value).map_err(bad)?;
        config.check()?;
        Ok(config)
    }

    /// Refuses what cannot be kept: a bad collection name, a limit out of range.
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(DocError::Revision(RevisionError::InvalidConfig(why)));
        if self.collections.len() > MAX_CONFIGURED_COLLECTIONS {
            return bad(format!(
                "{} collections named, at most {MAX_CONFIGURED_COLLECTIONS} may be",
                self.collections.len()
            ));
        }
        for (name, c) in &self.collections {
            validate_collection(name)?;
            if !(1..=MAX_REVISIONS_LIMIT).contains(&c.max_revisions) {
                return bad(format!(
                    "collection {name:?}: max_revisions {} is not in 1..={MAX_REVISIONS_LIMIT}",
                    c.max_revisions
                ));
            }
            if c.max_age_ms
                .is_some_and(|ms| !(1..=MAX_AGE_MS_LIMIT).contains(&ms))
            {
                return bad(format!(
                    "collection {name:?}: max_age_ms must be 1..={MAX_AGE_MS_LIMIT} (or null: no \
                     age limit)"
                ));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.collections.is_empty()
    }

    /// The limits of a write's document: its new collection's if that keeps
    /// revisions, else the replaced version's (a document moved out of a
    /// collection that keeps revisions keeps the version it leaves).
    pub(crate) fn policy_for(
        &self,
        new: Option<&str>,
        replaced: Option<&str>,
    ) -> Option<CollectionRevisions> {
        let of = |c: Option<&str>| c.and_then(|c| self.collections.get(c)).copied();
        of(new).or_else(|| of(replaced))
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(DocError::encode_json("the revisions configuration"))
    }

    pub(crate) fn decode(raw: &[u8]) -> Result<RevisionsConfig> {
        serde_json::from_slice(raw).map_err(|e| {
            DocError::Document(DocumentError::Corrupt {
                id: "(meta revisions_config)".into(),
                why: e.to_string(),
            })
        })
    }
}

/// The database's configuration as the write path reads it. It is replaced inside
/// the commit-queue unit that stores a new one, under the writer lock: units of
/// writes read it in their own unit, so each write follows the configuration of
/// the transactions before it (and a cluster's nodes, which apply the same log in
/// the same order, keep the same revisions).
#[derive(Clone, Default)]
pub(crate) struct SharedConfig(Arc<RwLock<Arc<RevisionsConfig>>>);

impl SharedConfig {
    pub fn new(config: RevisionsConfig) -> SharedConfig {
        SharedConfig(Arc::new(RwLock::new(Arc::new(config))))
    }

    pub fn current(&self) -> Arc<RevisionsConfig> {
        self.0.read().clone()
    }

    pub fn replace(&self, config: RevisionsConfig) {
        *self.0.write() = Arc::new(config);
    }
}

/// What one commit-queue unit knows of the configuration: read once, on the
/// unit's first write, from the database's shared copy, or (a restore's replay,
/// which has no database yet) from the transaction's `meta`.
#[derive(Default)]
pub(crate) struct UnitConfig {
    shared: Option<SharedConfig>,
    read: Option<Arc<RevisionsConfig>>,
}

impl UnitConfig {
    pub fn shared(shared: SharedConfig) -> UnitConfig {
        UnitConfig {
            shared: Some(shared),
            read: None,
        }
    }

    pub fn get(&mut self, txn: &mut WriteTxn<'_>) -> Result<Arc<RevisionsConfig>> {
        if let Some(config) = &self.read {
            return Ok(config.clone());
        }
        let config = match &self.shared {
            Some(shared) => shared.current(),
            None => Arc::new(super::stored_config(txn.get(
                crate::model::schema::META,
                crate::model::schema::META_REVISIONS,
            )?)?),
        };
        self.read = Some(config.clone());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_are_checked() {
        let ok = RevisionsConfig::from_json(
            br#"{"collections": {"orders": {"max_revisions": 50, "max_age_ms": null},
                 "later": {"max_revisions": 1, "max_age_ms": 1}}}"#,
        )
        .unwrap();
        assert_eq!(ok.collections["orders"].max_revisions, 50);
        assert_eq!(ok.collections["later"].max_age_ms, Some(1));
        assert!(RevisionsConfig::from_json(b"{}").unwrap().is_empty());
        for bad in [
            r#"{"collections": {"orders": {"max_revisions": 0}}}"#,
            r#"{"collections": {"orders": {"max_revisions": 10001}}}"#,
            r#"{"collections": {"orders": {"max_revisions": -1}}}"#,
            r#"{"collections": {"orders": {"max_revisions": 5, "max_age_ms": 0}}}"#,
            r#"{"collections": {"orders": {"max_revisions": 5, "max_age_ms": 9007199254740992}}}"#,
            r#"{"collections": {"orders": {"max_age_ms": 5}}}"#,
            r#"{"collections": {"orders": {"max_revisions": 5, "max_ages": 5}}}"#,
            r#"{"collections": {"@orders": {"max_revisions": 5}}}"#,
            r#"{"collections": {"": {"max_revisions": 5}}}"#,
            r#"{"collection": {}}"#,
            r#"[]"#,
            "not json",
        ] {
            let e = RevisionsConfig::from_json(bad.as_bytes()).unwrap_err();
            assert!(
                matches!(
                    e,
                    DocError::Revision(RevisionError::InvalidConfig(_))
                        | DocError::Document(DocumentError::InvalidCollection { .. })
                ),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn a_write_follows_its_new_collection_else_the_one_it_leaves() {
        let c = RevisionsConfig::from_json(
            br#"{"collections": {"a": {"max_revisions": 1}, "b": {"max_revisions": 2}}}"#,
        )
        .unwrap();
        let max = |new, old| c.policy_for(new, old).map(|p| p.max_revisions);
        assert_eq!(max(Some("b"), Some("a")), Some(2));
        assert_eq!(max(Some("x"), Some("a")), Some(1));
        assert_eq!(max(None, Some("b")), Some(2));
        assert_eq!(max(Some("x"), None), None);
    }
}
