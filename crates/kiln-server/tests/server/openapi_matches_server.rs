//! `docs/openapi.yaml` against the server's one list of error codes,
//! [`kiln_server::error::ErrorCode::ALL`].
//!
//! The `Error` schema's `error` field is an `enum` of every code the server sends,
//! written as one flow-style line right after the marker comment
//! `# error codes: generated from kiln_server::error::ErrorCode::ALL`. This test
//! fails when that list and the enum differ (in either direction; the order does
//! not matter), and when a status an error code is sent with is documented
//! nowhere.
//!
//! To regenerate the list from the Rust enum (after adding or removing a code):
//!
//! ```text
//! KILN_WRITE_OPENAPI=1 cargo test -p kiln-server --test server -- openapi_matches_server::
//! ```
//!
//! which rewrites that one line of `docs/openapi.yaml` in the enum's order (and
//! then passes). Document the new code's status on the operations that answer it.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{expect_error, Harness};
use kiln_server::error::ErrorCode;
use std::collections::BTreeSet;
use std::path::PathBuf;

const MARKER: &str = "# error codes: generated from kiln_server::error::ErrorCode::ALL";

fn openapi_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.yaml")
}

/// The index of the `enum: [...]` line after the marker, its indentation, and the
/// codes it lists.
fn documented_codes(yaml: &str) -> (usize, String, Vec<String>) {
    let lines: Vec<&str> = yaml.lines().collect();
    let markers: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim() == MARKER)
        .collect();
    assert_eq!(
        markers.len(),
        1,
        "docs/openapi.yaml must have the line {MARKER:?} exactly once (before the Error schema's `enum` of `error`)"
    );
    let at = markers[0] + 1;
    let line = lines.get(at).copied().unwrap_or("");
    let indent: String = line.chars().take_while(|c| *c == ' ').collect();
    let list = line
        .trim()
        .strip_prefix("enum: [")
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or_else(|| {
            panic!(
                "the line after {MARKER:?} must be `enum: [code, ...]` on one line, not {line:?}"
            )
        });
    let codes = list
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_string())
        .filter(|c| !c.is_empty())
        .collect();
    (at, indent, codes)
}

fn enum_line(indent: &str) -> String {
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    format!("{indent}enum: [{}]", codes.join(", "))
}

#[test]
fn the_error_codes_of_the_openapi_document_are_those_of_the_server() {
    let path = openapi_path();
    let yaml = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let (at, indent, documented) = documented_codes(&yaml);

    if std::env::var("KILN_WRITE_OPENAPI").as_deref() == Ok("1") {
        let mut out: Vec<String> = yaml.lines().map(str::to_string).collect();
        out[at] = enum_line(&indent);
        let mut text = out.join("\n");
        if yaml.ends_with('\n') {
            text.push('\n');
        }
        if text != yaml {
            std::fs::write(&path, text)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            eprintln!("rewrote the error codes of {}", path.display());
        }
        return;
    }

    let server: BTreeSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    let doc: BTreeSet<&str> = documented.iter().map(String::as_str).collect();
    assert_eq!(
        documented.len(),
        doc.len(),
        "docs/openapi.yaml lists an error code twice"
    );
    let missing: Vec<_> = server.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&server).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/openapi.yaml's error codes differ from ErrorCode::ALL: not documented {missing:?}, \
         documented but never sent {extra:?}; regenerate the list with \
         KILN_WRITE_OPENAPI=1 cargo test -p kiln-server --test server -- openapi_matches_server::"
    );

    // Every status an error code is sent with is a documented response somewhere.
    for code in ErrorCode::ALL {
        let status = code.status().as_u16();
        assert!(
            yaml.contains(&format!("\"{status}\":")),
            "{code} is sent with {status}, which no operation of docs/openapi.yaml documents"
        );
    }
}

#[test]
fn the_codes_are_unique_and_well_formed() {
    let mut seen = BTreeSet::new();
    for code in ErrorCode::ALL {
        let s = code.as_str();
        assert!(seen.insert(s), "{s} twice in ErrorCode::ALL");
        assert!(
            !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{s:?}: codes are snake_case (written bare in the YAML list)"
        );
        assert!(
            code.status().as_u16() >= 400,
            "{s}: an error code with a success status"
        );
    }
}

/// Answers the document gives the error schema to, which once came as axum's plain
/// text: a GET on the WebSocket route that is no upgrade (400 `bad_request`), and
/// a studio path that does not decode (400 `invalid_path`).
#[tokio::test]
async fn refusals_that_were_plain_text_are_json_errors() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    let r = h
        .http
        .get(h.url("/dbs/shop/changes/ws"))
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("x-request-id"));
    let v = expect_error(r, 400, "bad_request").await;
    assert!(
        v["message"].as_str().unwrap().contains("WebSocket upgrade"),
        "{v}"
    );
    assert!(v["request_id"].is_string(), "{v}");
    let r = h.http.get(h.url("/studio/%FF")).send().await.unwrap();
    expect_error(r, 400, "invalid_path").await;
    // A database that does not exist is still a 400 for a plain GET (the upgrade is
    // checked first), and a real upgrade still works (tests/server/changes_feed.rs).
    let r = h
        .http
        .get(h.url("/dbs/nope/changes/ws"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "bad_request").await;
    h.shutdown().await;
}
