//! Full-text search over HTTP against a real `kiln serve`: a full-text index defined
//! with `PUT /dbs/{db}/indexes/{name}` (its fields listed back with `search` and
//! `analyzer`; an unknown analyzer is a 400 `invalid_index`), documents written
//! with a batch, `search()` queries with `order by score()`, `select
//! highlight(...)` and `wait_for_non_stale_ms` (BM25 `@score` in descending order,
//! `@highlights` with the matched words in `<b>` and the document's own markup
//! escaped, stemming by the `english` analyzer, the other conditions of the
//! `where` applied), bad search texts as 400 `invalid_query`, and the query
//! answer's `ETag`: `If-None-Match` gives 304 while nothing changed, and a tag
//! taken while the full-text index lagged is not revalidated once it caught up.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::{free_port, request, spawn_serve};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const DB: &str = "fts";

/// One request with extra headers: status, headers (lowercased names), body.
fn request_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, BTreeMap<String, String>, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// `POST /dbs/fts/queries` waiting (5 s at most) for the index: the answer.
fn query(port: u16, text: &str, params: Value) -> Value {
    let body = json!({"query": text, "params": params, "wait_for_non_stale_ms": 5000});
    let (status, body) = request(
        port,
        "POST",
        &format!("/dbs/{DB}/queries"),
        &body.to_string(),
    );
    assert_eq!(status, 200, "{text}: {body}");
    let v = json_of(&body);
    assert_eq!(v["stale"], false, "{text}: {body}");
    v
}

fn ids(answer: &Value) -> Vec<String> {
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["@metadata"]["@id"].as_str().unwrap().to_string())
        .collect()
}

fn scores(answer: &Value) -> Vec<f64> {
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["@metadata"]["@score"]
                .as_f64()
                .unwrap_or_else(|| panic!("no @score in {r}"))
        })
        .collect()
}

/// The error code of a 400 answer.
fn bad_request(port: u16, method: &str, path: &str, body: &str) -> (String, String) {
    let (status, text) = request(port, method, path, body);
    assert_eq!(status, 400, "{method} {path} {body}: {text}");
    let v = json_of(&text);
    (
        v["error"].as_str().unwrap_or_default().to_string(),
        v["message"].as_str().unwrap_or_default().to_string(),
    )
}

fn put_batch(port: u16, docs: &[(String, Value)]) {
    let ops: Vec<Value> = docs
        .iter()
        .map(|(id, d)| json!({"op": "put", "id": id, "document": d}))
        .collect();
    let (status, body) = request(
        port,
        "POST",
        &format!("/dbs/{DB}/batch"),
        &json!({ "ops": ops }).to_string(),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn full_text_index_and_search_queries_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = spawn_serve(dir.path(), port);
    assert_eq!(request(port, "PUT", &format!("/dbs/{DB}"), "").0, 201);

    // The definition, and its fields as listed back.
    let definition = json!({
        "collection": "articles",
        "fields": [
            {"path": "body", "search": true, "analyzer": "english"},
            {"path": "title", "search": true},
        ],
    });
    let (status, body) = request(
        port,
        "PUT",
        &format!("/dbs/{DB}/indexes/articles-text"),
        &definition.to_string(),
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = request(port, "GET", &format!("/dbs/{DB}/indexes/articles-text"), "");
    assert_eq!(status, 200, "{body}");
    let info = json_of(&body);
    assert_eq!(
        info["fields"],
        json!([
            {"path": "body", "search": true, "analyzer": "english"},
            {"path": "title", "search": true},
        ]),
        "{body}"
    );
    assert_eq!(info["collection"], "articles");

    // Definitions the server refuses.
    let (code, message) = bad_request(
        port,
        "PUT",
        &format!("/dbs/{DB}/indexes/bad"),
        &json!({"collection": "articles", "fields": [{"path": "body", "search": true, "analyzer": "klingon"}]})
            .to_string(),
    );
    assert_eq!(code, "invalid_index", "{message}");
    assert!(message.contains("klingon"), "{message}");
    let (code, _) = bad_request(
        port,
        "PUT",
        &format!("/dbs/{DB}/indexes/bad"),
        &json!({"collection": "articles", "fields": [{"path": "body", "search": true}, "year"]})
            .to_string(),
    );
    assert_eq!(code, "invalid_index", "mixed full-text and plain fields");
    assert_eq!(
        request(port, "GET", &format!("/dbs/{DB}/indexes/bad"), "").0,
        404,
        "a refused definition is not kept"
    );

    let article = |title: &str, body: &str, year: u32| json!({"title": title, "body": body, "year": year, "@metadata": {"@collection": "articles"}});
    put_batch(
        port,
        &[
            (
                "articles/1".into(),
                article("Fox", "The quick brown fox jumps over the lazy dog", 2010),
            ),
            (
                "articles/2".into(),
                article(
                    "Dogs",
                    "A lazy dog sleeps all day. The dog is lazy, so lazy.",
                    2015,
                ),
            ),
            (
                "articles/3".into(),
                article("Thinking", "Quick thinking by running foxes", 1999),
            ),
            (
                "articles/4".into(),
                article(
                    "Markup",
                    "A page about <b>bold</b> <script>x()</script> and a dog",
                    2020,
                ),
            ),
            ("articles/5".into(), article("Cats", "Cats and mice", 2021)),
            // Another collection: not in the index.
            ("notes/1".into(), json!({"body": "lazy dog lazy dog"})),
        ],
    );

    // Ranked by BM25: the document with both words, several times, first.
    let a = query(
        port,
        "from articles where search(body, $q) order by score() limit 10 select highlight(body)",
        json!({"q": "lazy dog"}),
    );
    assert_eq!(a["index"], "articles-text", "{a}");
    assert_eq!(a["total"], 3, "{a}");
    let found = ids(&a);
    assert_eq!(found[0], "articles/2", "{a}");
    let mut sorted = found.clone();
    sorted.sort();
    assert_eq!(sorted, ["articles/1", "articles/2", "articles/4"], "{a}");
    let s = scores(&a);
    assert!(s.iter().all(|x| *x > 0.0), "{s:?}");
    assert!(s.windows(2).all(|w| w[0] >= w[1]), "descending: {s:?}");
    assert!(
        s[0] > s[2],
        "the best match scores above the weakest: {s:?}"
    );
    let highlight = |answer: &Value, id: &str| -> String {
        let r = answer["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["@metadata"]["@id"] == id)
            .unwrap_or_else(|| panic!("{id} not in {answer}"));
        r["@metadata"]["@highlights"]["body"]
            .as_str()
            .unwrap_or_else(|| panic!("no @highlights.body in {r}"))
            .to_string()
    };
    let h1 = highlight(&a, "articles/1");
    assert!(
        h1.contains("<b>lazy</b>") && h1.contains("<b>dog</b>"),
        "{h1}"
    );
    assert!(!h1.contains("<b>quick</b>"), "only matched words: {h1}");
    // The document's own markup comes back escaped; only the highlights are tags.
    let h4 = highlight(&a, "articles/4");
    assert!(h4.contains("<b>dog</b>"), "{h4}");
    assert!(!h4.contains("<script>"), "{h4}");
    assert!(h4.contains("&lt;script&gt;"), "{h4}");
    assert!(h4.contains("&lt;b&gt;bold&lt;/b&gt;"), "{h4}");
    // select highlight(...) alone keeps the documents whole.
    let r2 = &a["results"][0];
    assert_eq!(r2["title"], "Dogs", "{r2}");

    // The english analyzer stems: "jumping" finds "jumps", "run" finds "running".
    let a = query(
        port,
        "from articles where search(body, 'jumping') order by score()",
        json!({}),
    );
    assert_eq!(ids(&a), ["articles/1"], "{a}");
    let a = query(port, "from articles where search(body, 'run')", json!({}));
    assert_eq!(ids(&a), ["articles/3"], "{a}");
    // The standard analyzer (title) does not stem.
    let a = query(port, "from articles where search(title, 'dog')", json!({}));
    assert_eq!(ids(&a), Vec::<String>::new(), "{a}");
    let a = query(port, "from articles where search(title, 'dogs')", json!({}));
    assert_eq!(ids(&a), ["articles/2"], "{a}");

    // Phrases, required and excluded words, prefixes.
    let a = query(
        port,
        "from articles where search(body, '\"lazy dog\"')",
        json!({}),
    );
    let mut got = ids(&a);
    got.sort();
    assert_eq!(got, ["articles/1", "articles/2"], "{a}");
    let a = query(
        port,
        "from articles where search(body, '+dog -sleeps')",
        json!({}),
    );
    let mut got = ids(&a);
    got.sort();
    assert_eq!(got, ["articles/1", "articles/4"], "{a}");
    let a = query(port, "from articles where search(body, 'thin*')", json!({}));
    assert_eq!(ids(&a), ["articles/3"], "{a}");

    // With another condition, and ordered by a field.
    let a = query(
        port,
        "from articles where search(body, 'dog') and year > 2012 order by score()",
        json!({}),
    );
    let mut got = ids(&a);
    got.sort();
    assert_eq!(got, ["articles/2", "articles/4"], "{a}");
    assert_eq!(a["total"], 2, "{a}");
    let a = query(
        port,
        "from articles where search(body, 'dog') order by year desc",
        json!({}),
    );
    assert_eq!(ids(&a), ["articles/4", "articles/2", "articles/1"], "{a}");
    assert_eq!(scores(&a).len(), 3, "@score with any order");

    // Bad search texts and misplaced search(): 400 with the query error code.
    let queries = format!("/dbs/{DB}/queries");
    for bad in [
        json!({"query": "from articles where search(body, $q)", "params": {"q": "\"lazy dog"}}),
        json!({"query": "from articles where search(body, 'dog~3')"}),
        json!({"query": "from articles where search(nothere, 'dog')"}),
        json!({"query": "from articles where year > 2000 order by score()"}),
        json!({"query": "from articles where search(body, 'dog') select highlight(year)"}),
    ] {
        let (code, message) = bad_request(port, "POST", &queries, &bad.to_string());
        assert_eq!(code, "invalid_query", "{bad}: {message}");
    }

    // ETag: 304 while nothing changed; a tag taken while the full-text index lagged
    // behind a write is not revalidated after it caught up.
    let q =
        json!({"query": "from articles where search(body, 'dog') order by score()"}).to_string();
    let (status, headers, body) = request_with(port, "POST", &queries, &[], &q);
    assert_eq!(status, 200, "{body}");
    let tag = headers.get("etag").expect("an ETag").clone();
    let (status, _, body) = request_with(port, "POST", &queries, &[("if-none-match", &tag)], &q);
    assert_eq!(status, 304, "{body}");
    let new_dogs: Vec<(String, Value)> = (0..300)
        .map(|i| {
            (
                format!("articles/new{i:03}"),
                article("New", &format!("dog number {i} of many words"), 2022),
            )
        })
        .collect();
    put_batch(port, &new_dogs);
    // At once, without waiting: possibly stale.
    let (status, headers, body) =
        request_with(port, "POST", &queries, &[("if-none-match", &tag)], &q);
    assert_eq!(status, 200, "a write changes the tag: {body}");
    let early_tag = headers.get("etag").expect("an ETag").clone();
    assert_ne!(early_tag, tag);
    let early = json_of(&body);
    let early_stale = early["stale"] == true;
    // Wait until the index has caught up.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = request(port, "GET", &format!("/dbs/{DB}/indexes/articles-text"), "");
        if json_of(&body)["stale"] == false {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the index did not catch up: {body}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, headers, body) =
        request_with(port, "POST", &queries, &[("if-none-match", &early_tag)], &q);
    let held = if status == 304 {
        // Only right if the early answer was already complete.
        assert_eq!(early["stale"], false, "a stale answer revalidated: {early}");
        early
    } else {
        assert_eq!(status, 200, "{body}");
        assert_ne!(headers.get("etag"), Some(&early_tag));
        json_of(&body)
    };
    assert_eq!(held["stale"], false, "{held}");
    assert_eq!(held["total"], 303, "every dog: {}", held["total"]);
    println!(
        "early answer stale: {}, revalidation: {status}",
        early_stale
    );

    let _ = server.kill();
    let _ = server.wait();
}
