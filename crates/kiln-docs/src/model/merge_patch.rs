//! JSON merge patch (RFC 7396), and what a patch may change in a stored document.
//!
//! [`merge_patch`] is the RFC's algorithm as it stands (section 2): an object patch
//! merges member by member, recursively; a `null` member removes the target's
//! member; any other patch value (an array, a string, a number...) replaces the
//! target whole. [`patch_document`] applies a patch to a document as stored (its
//! `@metadata` included) and keeps the server's metadata out of the client's reach:
//! a patch may change what a PUT may set under `@metadata` (`@collection`,
//! `@expires`, the client's own keys), and nothing else.

use super::error::DocumentError;
use serde_json::{Map, Value};

/// Keys of `@metadata` that the server writes on every put: a patch that names
/// them is refused (a PUT silently replaces them, because clients send back what
/// they read; a patch only carries what the client means to change).
const SERVER_OWNED: [&str; 3] = ["@id", "@etag", "@last-modified"];

/// RFC 7396 section 2, `MergePatch(Target, Patch)`, applied in place.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else {
        unreachable!("made an object just above")
    };
    for (name, value) in patch {
        if value.is_null() {
            // shift_remove keeps the order of the other members (the stored
            // document's field order is the client's).
            target.shift_remove(name);
        } else {
            merge_patch(target.entry(name.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Checks a merge patch of a whole document: an object (a patch that is not one
/// would replace the document with a non-object), and an `@metadata` member, if
/// any, that is an object naming none of the server's own keys.
pub fn check_document_patch(patch: &Value) -> Result<(), DocumentError> {
    let Value::Object(members) = patch else {
        return Err(DocumentError::Invalid(
            "a merge patch of a document must be a JSON object (RFC 7396: any other \
             value would replace the document with something that is not a document)"
                .into(),
        ));
    };
    match members.get("@metadata") {
        None => Ok(()),
        Some(Value::Object(m)) => match SERVER_OWNED.iter().find(|k| m.contains_key(**k)) {
            Some(key) => Err(DocumentError::Invalid(format!(
                "@metadata.{key} is the server's and cannot be patched"
            ))),
            None => Ok(()),
        },
        Some(Value::Null) => Err(DocumentError::Invalid(
            "\"@metadata\": null would remove the server's metadata: remove its keys \
             one by one instead (\"@metadata\": {\"key\": null})"
                .into(),
        )),
        Some(_) => Err(DocumentError::Invalid(
            "@metadata in a merge patch must be a JSON object".into(),
        )),
    }
}

/// The document `stored` (as stored, `@metadata` included) with `patch` merged in;
/// the result goes through the same checks as a PUT's body.
pub fn patch_document(stored: &[u8], id: &str, patch: &Value) -> Result<Value, DocumentError> {
    check_document_patch(patch)?;
    let mut doc: Value = serde_json::from_slice(stored).map_err(|e| DocumentError::Corrupt {
        id: id.to_string(),
        why: format!("stored JSON does not parse: {e}"),
    })?;
    merge_patch(&mut doc, patch);
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(target: Value, patch: Value) -> Value {
        let mut t = target;
        merge_patch(&mut t, &patch);
        t
    }

    /// RFC 7396 appendix A, every example in order.
    #[test]
    fn merge_patch_matches_the_rfc_appendix() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (i, (target, patch, want)) in cases.into_iter().enumerate() {
            assert_eq!(merged(target, patch), want, "appendix A example {}", i + 1);
        }
    }

    /// The RFC's section 3 example: a nested object merged, a member removed, an
    /// array replaced, and the untouched members kept in their order.
    #[test]
    fn merge_patch_matches_the_rfc_example_and_keeps_member_order() {
        let target = json!({
            "title": "Goodbye!",
            "author": {"givenName": "John", "familyName": "Doe"},
            "tags": ["example", "sample"],
            "content": "This will be unchanged"
        });
        let patch = json!({
            "title": "Hello!",
            "phoneNumber": "+01-123-456-7890",
            "author": {"familyName": null},
            "tags": ["example"]
        });
        let out = merged(target, patch);
        assert_eq!(
            out.to_string(),
            r#"{"title":"Hello!","author":{"givenName":"John"},"tags":["example"],"content":"This will be unchanged","phoneNumber":"+01-123-456-7890"}"#
        );
    }

    #[test]
    fn a_document_patch_must_be_an_object_and_leave_the_servers_metadata_alone() {
        for bad in [
            json!([1]),
            json!("x"),
            json!(null),
            json!(3),
            json!({"@metadata": null}),
            json!({"@metadata": 1}),
            json!({"@metadata": {"@etag": "1-00000001"}}),
            json!({"@metadata": {"@id": "other"}}),
            json!({"@metadata": {"@last-modified": null}}),
        ] {
            assert!(
                matches!(check_document_patch(&bad), Err(DocumentError::Invalid(_))),
                "{bad} was accepted"
            );
        }
        for good in [
            json!({}),
            json!({"a": null}),
            json!({"@metadata": {"@collection": "people", "tag": null}}),
            json!({"@metadata": {"@expires": "2030-01-01T00:00:00Z"}}),
        ] {
            check_document_patch(&good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn patch_document_merges_into_the_stored_text() {
        let stored =
            br#"{"a":1,"b":{"c":2},"@metadata":{"@id":"x","@etag":"1-00000001","tag":"t"}}"#;
        let out = patch_document(
            stored,
            "x",
            &json!({"b":{"d":3},"a":null,"@metadata":{"tag":null}}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"b":{"c":2,"d":3},"@metadata":{"@id":"x","@etag":"1-00000001"}})
        );
        assert!(matches!(
            patch_document(b"{not json", "x", &json!({})),
            Err(DocumentError::Corrupt { .. })
        ));
    }
}
