//! What a database name, a document id and a collection name may be.

use super::error::DocumentError;
use super::limits::{MAX_COLLECTION_BYTES, MAX_DATABASE_NAME_BYTES};

/// Database names become directory names, so they are kept to a portable set:
/// lowercase ASCII letters, digits, `_` and `-`, starting with a letter or digit.
pub fn validate_database_name(name: &str) -> Result<(), DocumentError> {
    let bad = |why: &str| {
        Err(DocumentError::InvalidDatabaseName {
            name: name.to_string(),
            why: why.to_string(),
        })
    };
    if name.is_empty() || name.len() > MAX_DATABASE_NAME_BYTES {
        return bad("must be 1 to 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return bad("only lowercase letters, digits, '_' and '-' are allowed");
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return bad("must start with a letter or a digit");
    }
    Ok(())
}

/// Collection names: 1..=128 bytes, no control characters (a NUL would break the
/// collection index's key layout), not starting with `@` (reserved).
pub fn validate_collection(name: &str) -> Result<(), DocumentError> {
    let bad = |why: &str| {
        Err(DocumentError::InvalidCollection {
            name: name.chars().take(80).collect(),
            why: why.to_string(),
        })
    };
    if name.is_empty() || name.len() > MAX_COLLECTION_BYTES {
        return bad("must be 1 to 128 bytes");
    }
    if name.chars().any(|c| c.is_control()) {
        return bad("control characters are not allowed");
    }
    if name.starts_with('@') {
        return bad("names starting with '@' are reserved");
    }
    Ok(())
}

/// The collection a document belongs to when its `@metadata` names none: the part
/// of its id before the first `/` (`users/ada` -> `users`), else no collection.
pub(crate) fn collection_from_id(id: &str) -> Option<&str> {
    match id.split_once('/') {
        Some((prefix, _)) if validate_collection(prefix).is_ok() => Some(prefix),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_ids_and_collections() {
        assert!(validate_database_name("shop-2_x").is_ok());
        for bad in ["", "Shop", "-x", "a/b", "a.b", &"x".repeat(65)] {
            assert!(validate_database_name(bad).is_err(), "{bad:?}");
        }
        use crate::model::limits::{check_id, IdRule};
        let ten = IdRule::Configured { max_bytes: 10 };
        assert!(check_id("users/ada", ten).is_ok());
        assert!(check_id("", ten).is_err());
        assert!(check_id("users/ada!", IdRule::Configured { max_bytes: 9 }).is_err());
        assert!(check_id("a\u{0}b", ten).is_err());
        assert!(check_id("é/ü", ten).is_ok());
        assert_eq!(collection_from_id("users/ada"), Some("users"));
        assert_eq!(collection_from_id("ada"), None);
        assert_eq!(collection_from_id("/ada"), None);
        assert_eq!(collection_from_id("@x/ada"), None);
    }
}
