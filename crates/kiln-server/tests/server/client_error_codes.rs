//! The clients' lists of error codes are generated from the server's one list
//! (`kiln_server::error::ErrorCode::ALL`), not written by hand or found by reading
//! the server's source:
//!
//! - `clients/error-codes.json`: every code with its status, for any client (the
//!   TypeScript client reads it);
//! - `clients/python/src/kiln_client/_codes.py`: the same as a Python dict, which the
//!   Python client's errors module and its tests check their classes against.
//!
//! This test fails when either file differs from what the enum gives. After adding or
//! removing a code, rewrite both with
//!
//! ```text
//! KILN_WRITE_CLIENT_CODES=1 cargo test -p kiln-server --test server -- client_error_codes::
//! ```
//!
//! and give the Python client a class for the new code (its tests say which is missing).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_server::error::ErrorCode;
use std::path::PathBuf;

const HOW_TO_REGENERATE: &str =
    "KILN_WRITE_CLIENT_CODES=1 cargo test -p kiln-server --test server -- client_error_codes::";

fn repo_file(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

fn json_list() -> String {
    let mut out = String::from("{\n");
    out.push_str(&format!(
        "  \"generated_from\": \"kiln_server::error::ErrorCode::ALL (crates/kiln-server/src/error.rs); regenerate with {HOW_TO_REGENERATE}\",\n"
    ));
    out.push_str("  \"codes\": [\n");
    let rows: Vec<String> = ErrorCode::ALL
        .iter()
        .map(|c| {
            format!(
                "    {{\"code\": \"{}\", \"status\": {}}}",
                c.as_str(),
                c.status().as_u16()
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ]\n}\n");
    out
}

fn python_list() -> String {
    let mut out = String::from(
        "\"\"\"Every error code the server sends, with the HTTP status it is sent with.\n\n\
         Generated from the server's one list (kiln_server::error::ErrorCode::ALL in\n\
         crates/kiln-server/src/error.rs) by crates/kiln-server/tests/server/client_error_codes.rs:\n\
         do not edit. After adding a code to the server, run\n",
    );
    out.push_str(&format!("{HOW_TO_REGENERATE}\n\"\"\"\n\n"));
    out.push_str("from typing import Dict\n\n");
    out.push_str("SERVER_ERROR_CODES: Dict[str, int] = {\n");
    for c in ErrorCode::ALL {
        out.push_str(&format!(
            "    \"{}\": {},\n",
            c.as_str(),
            c.status().as_u16()
        ));
    }
    out.push_str("}\n");
    out
}

/// Compares `path` with `expected`, or rewrites it when asked to.
fn check_or_write(relative: &str, expected: &str) {
    let path = repo_file(relative);
    if std::env::var("KILN_WRITE_CLIENT_CODES").as_deref() == Ok("1") {
        std::fs::write(&path, expected)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        found == expected,
        "{relative} is not what ErrorCode::ALL gives (a code was added, removed or moved): \
         regenerate it with {HOW_TO_REGENERATE}"
    );
}

#[test]
fn the_json_list_is_the_servers() {
    check_or_write("clients/error-codes.json", &json_list());
}

#[test]
fn the_python_list_is_the_servers() {
    check_or_write("clients/python/src/kiln_client/_codes.py", &python_list());
}

#[test]
fn the_json_list_parses_and_holds_every_code_once() {
    let v: serde_json::Value = serde_json::from_str(&json_list()).unwrap();
    let codes = v["codes"].as_array().unwrap();
    assert_eq!(codes.len(), ErrorCode::ALL.len());
    let mut seen = std::collections::BTreeSet::new();
    for (row, code) in codes.iter().zip(ErrorCode::ALL) {
        assert_eq!(row["code"], code.as_str());
        assert_eq!(row["status"], code.status().as_u16());
        assert!(seen.insert(code.as_str()), "{code} twice");
    }
}
