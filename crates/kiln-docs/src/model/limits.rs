//! The document layer's limits on names and ids, and the one check of a document id.
//!
//! A document id is a key of several trees: `doc_ids` holds it as it is, the
//! expiration index after 8 bytes of time, the revisions tree before 9 bytes of
//! etag. Each must fit the engine's key limit, so a feature that puts the id in a
//! longer key narrows what an id may be, and says so in its own words
//! ([`IdRule`]). Other limits of the layer stay beside what they bound (the query
//! language's in `query/parse.rs`, an index definition's in `index/def.rs`).

use super::error::DocumentError;

/// The engine's limit on a key, which bounds every id from above.
pub const ENGINE_KEY_BYTES: usize = kiln_storage::MAX_KEY_SIZE;

/// Database names become directory names.
pub const MAX_DATABASE_NAME_BYTES: usize = 64;

/// Collection names are short: they prefix every key of the collection index.
pub const MAX_COLLECTION_BYTES: usize = 128;

/// Ids a store takes unless configured otherwise (`DocsOptions::max_id_bytes`, at
/// most [`ENGINE_KEY_BYTES`]).
pub const DEFAULT_MAX_ID_BYTES: usize = 512;

/// Digits a generated id's number may take after its prefix (a u64).
pub const GENERATED_ID_DIGITS: usize = 20;

/// The longest id an expiring document may have: its `expirations` key is the id
/// after 8 bytes of time.
pub const MAX_EXPIRING_ID_BYTES: usize = ENGINE_KEY_BYTES - 8;

/// The longest id a document with revisions may have: its revision key is the id
/// and 9 bytes.
pub const MAX_REVISED_ID_BYTES: usize = ENGINE_KEY_BYTES - 9;

/// Which limit an id is checked against.
#[derive(Debug, Clone, Copy)]
pub enum IdRule {
    /// A document's id in a store that takes ids of up to this many bytes.
    Configured { max_bytes: usize },
    /// An id's prefix to which a generated number is added: its room is taken off.
    GeneratedPrefix { max_bytes: usize },
    /// The id of a document that expires.
    Expiring,
    /// The id of a document whose collection keeps revisions.
    Revised,
}

impl IdRule {
    fn max_bytes(self) -> usize {
        match self {
            IdRule::Configured { max_bytes } => max_bytes,
            IdRule::GeneratedPrefix { max_bytes } => max_bytes.saturating_sub(GENERATED_ID_DIGITS),
            IdRule::Expiring => MAX_EXPIRING_ID_BYTES,
            IdRule::Revised => MAX_REVISED_ID_BYTES,
        }
    }

    fn too_long(self, len: usize) -> String {
        let max = self.max_bytes();
        match self {
            IdRule::Configured { .. } | IdRule::GeneratedPrefix { .. } => {
                format!("{len} bytes is over the limit of {max} bytes")
            }
            IdRule::Expiring => format!(
                "an expiring document's id may have at most {max} bytes, this one has {len}"
            ),
            IdRule::Revised => format!(
                "a document of a collection that keeps revisions may have an id of at most \
                 {max} bytes, this one has {len}"
            ),
        }
    }
}

/// The one check of a document id: any UTF-8 text without control characters, not
/// empty, within the rule's length. A refusal names the id (its first 80
/// characters) and why.
pub fn check_id(id: &str, rule: IdRule) -> Result<(), DocumentError> {
    let bad = |why: String| {
        Err(DocumentError::InvalidId {
            id: id.chars().take(80).collect(),
            why,
        })
    };
    if id.is_empty() {
        return bad("ids may not be empty".into());
    }
    if id.len() > rule.max_bytes() {
        return bad(rule.too_long(id.len()));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return bad(format!(
            "control character U+{:04X} is not allowed",
            c as u32
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(id: &str, rule: IdRule) -> String {
        match check_id(id, rule) {
            Err(DocumentError::InvalidId { why, .. }) => why,
            other => panic!("{id:?} under {rule:?}: {other:?}"),
        }
    }

    #[test]
    fn each_rule_has_its_length_and_its_words() {
        let configured = IdRule::Configured { max_bytes: 10 };
        assert!(check_id("users/ada", configured).is_ok());
        assert!(why(&"x".repeat(11), configured).contains("over the limit of 10 bytes"));
        let prefix = IdRule::GeneratedPrefix { max_bytes: 26 };
        assert!(check_id("users/", prefix).is_ok());
        assert!(why("users/x", prefix).contains("limit of 6 bytes"));
        let long = "x".repeat(MAX_REVISED_ID_BYTES + 1);
        assert!(why(&long, IdRule::Revised).contains("keeps revisions"));
        assert!(check_id(&long, IdRule::Expiring).is_ok());
        let longer = "x".repeat(MAX_EXPIRING_ID_BYTES + 1);
        assert!(why(&longer, IdRule::Expiring).contains("an expiring document's id"));
    }

    #[test]
    fn every_rule_refuses_empty_ids_and_control_characters() {
        for rule in [
            IdRule::Configured { max_bytes: 512 },
            IdRule::GeneratedPrefix { max_bytes: 512 },
            IdRule::Expiring,
            IdRule::Revised,
        ] {
            assert!(why("", rule).contains("empty"));
            assert!(why("a\u{7}b", rule).contains("U+0007"));
        }
    }

    #[test]
    fn a_refusal_names_the_id_shortened() {
        match check_id(&"é".repeat(600), IdRule::Configured { max_bytes: 512 }) {
            Err(DocumentError::InvalidId { id, .. }) => {
                assert_eq!(id.chars().count(), 80)
            }
            other => panic!("{other:?}"),
        }
    }
}
