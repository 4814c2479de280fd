//! The HTTP API end to end over a real client: databases, documents and their
//! preconditions, listings, collections, batches, routing errors, metrics,
//! concurrent conditional writes and a restart.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{encode, etag_of, expect_error, metric, Harness};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn databases_create_list_stats_delete() {
    let h = Harness::start().await;

    let r = h.http.put(h.url("/dbs/shop")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["location"], "/dbs/shop");
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"name": "shop"}));

    let r = h.http.put(h.url("/dbs/shop")).send().await.unwrap();
    expect_error(r, 409, "database_exists").await;
    let r = h.http.put(h.url("/dbs/Bad%20Name")).send().await.unwrap();
    expect_error(r, 400, "invalid_database_name").await;
    let r = h.http.get(h.url("/dbs/nope")).send().await.unwrap();
    expect_error(r, 404, "database_not_found").await;

    h.create_db("other").await;
    let r = h.http.get(h.url("/dbs")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"databases": ["other", "shop"]})
    );

    h.put_ok("shop", "users/ada", &json!({"name": "Ada"})).await;
    let last = h.put_ok("shop", "orders/1", &json!({"total": 3})).await;
    let r = h.http.get(h.url("/dbs/shop")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let stats: Value = r.json().await.unwrap();
    assert_eq!(stats["name"], "shop");
    assert_eq!(stats["documents"], 2);
    assert_eq!(stats["last_etag"], last.as_str());
    assert_eq!(
        stats["collections"],
        json!([{"name": "orders", "documents": 1}, {"name": "users", "documents": 1}])
    );
    assert!(stats["engine"]["commits"].as_u64().unwrap() >= 2, "{stats}");
    assert_eq!(stats["encrypted"], json!(false), "{stats}");
    assert_eq!(stats["encryption_key_fingerprint"], Value::Null, "{stats}");

    let r = h.http.delete(h.url("/dbs/shop")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"deleted": "shop"}));
    expect_error(h.get("shop", "users/ada").await, 404, "database_not_found").await;
    expect_error(
        h.put("shop", "users/bob", &json!({})).await,
        404,
        "database_not_found",
    )
    .await;
    let r = h.http.delete(h.url("/dbs/shop")).send().await.unwrap();
    expect_error(r, 404, "database_not_found").await;
    let r = h.http.get(h.url("/dbs")).send().await.unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"databases": ["other"]})
    );

    // Created again, the database is empty and hands out etags of a new incarnation.
    h.create_db("shop").await;
    expect_error(h.get("shop", "users/ada").await, 404, "document_not_found").await;
    let again = h.put_ok("shop", "users/ada", &json!({"name": "Ada"})).await;
    assert_ne!(again, last);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_lifecycle_etags_and_conditional_requests() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    let url = h.doc_url("shop", "users/ada");

    // Create, then replace.
    let r = h.put("shop", "users/ada", &json!({"name": "Ada"})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let e1 = etag_of(&r);
    assert_eq!(r.headers()["location"], "/dbs/shop/docs/users/ada");
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!({"id": "users/ada", "etag": e1, "collection": "users", "created": true})
    );

    let r = h
        .put("shop", "users/ada", &json!({"name": "Ada", "born": 1815}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("location").is_none());
    let e2 = etag_of(&r);
    assert_ne!(e1, e2);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["created"], false);
    assert_eq!(body["etag"], e2.as_str());

    // GET: the fields, the metadata, the headers.
    let r = h.get("shop", "users/ada").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(etag_of(&r), e2);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.headers()["cache-control"], "no-cache");
    assert!(r.headers().get("last-modified").is_some());
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["name"], "Ada");
    assert_eq!(doc["born"], 1815);
    let meta = &doc["@metadata"];
    assert_eq!(meta["@id"], "users/ada");
    assert_eq!(meta["@collection"], "users");
    assert_eq!(meta["@etag"], e2.as_str());
    let lm = meta["@last-modified"].as_str().unwrap();
    assert!(
        lm.len() == 24 && lm.ends_with('Z') && lm.starts_with("20"),
        "{lm}"
    );

    // HEAD: the same headers, no body.
    let r = h.http.head(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(etag_of(&r), e2);
    assert!(r.headers().get("last-modified").is_some());
    assert!(r.bytes().await.unwrap().is_empty());

    // If-None-Match: current -> 304 without a body; stale -> 200.
    let r = h
        .http
        .get(&url)
        .header("if-none-match", format!("\"{e2}\""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(etag_of(&r), e2);
    assert!(r.bytes().await.unwrap().is_empty());
    let r = h
        .http
        .get(&url)
        .header("if-none-match", format!("\"{e1}\""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["born"], 1815);

    // If-Modified-Since (RFC 9110, 13.1.3): its Last-Modified or later -> 304 with the
    // validators; an earlier date, an invalid one, or with If-None-Match (which takes
    // precedence) -> 200.
    let r = h.http.get(&url).send().await.unwrap();
    let last_modified = r.headers()["last-modified"].to_str().unwrap().to_string();
    let seen = httpdate::parse_http_date(&last_modified).unwrap();
    let later = httpdate::fmt_http_date(seen + std::time::Duration::from_secs(3600));
    let earlier = httpdate::fmt_http_date(seen - std::time::Duration::from_secs(1));
    for (since, none_match, want) in [
        (last_modified.as_str(), None, StatusCode::NOT_MODIFIED),
        (later.as_str(), None, StatusCode::NOT_MODIFIED),
        (earlier.as_str(), None, StatusCode::OK),
        ("not a date", None, StatusCode::OK),
        (
            last_modified.as_str(),
            Some(format!("\"{e1}\"")),
            StatusCode::OK,
        ),
    ] {
        let mut req = h.http.get(&url).header("if-modified-since", since);
        if let Some(tag) = &none_match {
            req = req.header("if-none-match", tag);
        }
        let r = req.send().await.unwrap();
        assert_eq!(
            r.status(),
            want,
            "If-Modified-Since {since}, If-None-Match {none_match:?}"
        );
        assert_eq!(etag_of(&r), e2);
        if want == StatusCode::NOT_MODIFIED {
            assert_eq!(r.headers()["last-modified"], last_modified.as_str());
            assert!(r.bytes().await.unwrap().is_empty());
        }
    }

    expect_error(
        h.get("shop", "users/nobody").await,
        404,
        "document_not_found",
    )
    .await;

    // If-Match with a stale etag: 409 naming the current etag, nothing written.
    let r = h
        .http
        .put(&url)
        .header("if-match", format!("\"{e1}\""))
        .json(&json!({"name": "stale"}))
        .send()
        .await
        .unwrap();
    assert_eq!(etag_of(&r), e2, "a conflict carries the current etag");
    let v = expect_error(r, 409, "conflict").await;
    assert_eq!(v["current_etag"], e2.as_str());
    assert_eq!(h.get_json("shop", "users/ada").await["name"], "Ada");

    // If-Match with the right etag: written.
    let r = h
        .http
        .put(&url)
        .header("if-match", format!("\"{e2}\""))
        .json(&json!({"name": "Ada Lovelace"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let e3 = etag_of(&r);
    assert_ne!(e3, e2);
    assert_eq!(
        h.get_json("shop", "users/ada").await["name"],
        "Ada Lovelace"
    );

    // If-None-Match: * creates only.
    let r = h
        .http
        .put(&url)
        .header("if-none-match", "*")
        .json(&json!({"name": "again"}))
        .send()
        .await
        .unwrap();
    let v = expect_error(r, 409, "conflict").await;
    assert_eq!(v["current_etag"], e3.as_str());
    let r = h
        .http
        .put(h.doc_url("shop", "users/new"))
        .header("if-none-match", "*")
        .json(&json!({"name": "new"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    // If-Match on a document that does not exist.
    let r = h
        .http
        .put(h.doc_url("shop", "users/ghost"))
        .header("if-match", format!("\"{e3}\""))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    expect_error(r, 409, "conflict").await;
    expect_error(
        h.get("shop", "users/ghost").await,
        404,
        "document_not_found",
    )
    .await;

    // A malformed precondition.
    let r = h
        .http
        .put(&url)
        .header("if-match", "W/\"1-00000000\"")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_etag").await;

    // DELETE: stale If-Match 409, then 200, then 404.
    let r = h
        .http
        .delete(&url)
        .header("if-match", format!("\"{e2}\""))
        .send()
        .await
        .unwrap();
    let v = expect_error(r, 409, "conflict").await;
    assert_eq!(v["current_etag"], e3.as_str());
    assert_eq!(h.get("shop", "users/ada").await.status(), StatusCode::OK);
    let r = h
        .http
        .delete(&url)
        .header("if-match", format!("\"{e3}\""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let deleted = r.json::<Value>().await.unwrap();
    assert_eq!(deleted["id"], "users/ada");
    assert_eq!(deleted["deleted_etag"], e3);
    // The delete has an etag of its own (its tombstone in the changes feed), newer.
    let tombstone = kiln_docs::Etag::parse(deleted["etag"].as_str().unwrap()).unwrap();
    assert!(tombstone.sequence > kiln_docs::Etag::parse(&e3).unwrap().sequence);
    let r = h.http.delete(&url).send().await.unwrap();
    expect_error(r, 404, "document_not_found").await;
    expect_error(h.get("shop", "users/ada").await, 404, "document_not_found").await;
    h.shutdown().await;
}

/// A write's checks before its body is read come in one order
/// (`doc_request::check_write`): a POST to a whole id, a PATCH's media type, the
/// preconditions, the database, the declared size; the document's own after it.
/// And a GET's `If-None-Match`, which a 304 answers with the 200's validators.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_checks_come_in_one_order_and_a_304_keeps_the_validators() {
    let h = Harness::start_with(|c| c.limits.max_body_bytes = 64).await;
    h.create_db("shop").await;
    let big = format!("{{\"s\":\"{}\"}}", "x".repeat(100));
    let send = |method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]| {
        let mut r = h
            .http
            .request(method.parse().unwrap(), h.url(path))
            .body(body.to_vec());
        for (name, value) in headers {
            let value = reqwest::header::HeaderValue::from_bytes(value).unwrap();
            r = r.header(*name, value);
        }
        r.send()
    };
    let hdr = |name: &'static str, value: &'static [u8]| (name, value);
    let json_patch = hdr("content-type", b"application/json-patch+json");
    let bad_etag = hdr("if-match", b"nope");
    let cases = [
        (
            "POST",
            "/dbs/nodb/docs/x",
            vec![json_patch, bad_etag],
            big.as_bytes(),
            405,
            "method_not_allowed",
        ),
        (
            "PATCH",
            "/dbs/nodb/docs/x",
            vec![json_patch, bad_etag],
            big.as_bytes(),
            415,
            "unsupported_media_type",
        ),
        (
            "PUT",
            "/dbs/nodb/docs/x",
            vec![bad_etag],
            big.as_bytes(),
            400,
            "invalid_etag",
        ),
        (
            "PUT",
            "/dbs/nodb/docs/x",
            vec![hdr("if-match", b"\"\xff\"")],
            big.as_bytes(),
            400,
            "invalid_header",
        ),
        (
            "PUT",
            "/dbs/nodb/docs/x",
            vec![hdr("if-match", b"*"), hdr("if-none-match", b"*")],
            big.as_bytes(),
            400,
            "invalid_precondition",
        ),
        (
            "PUT",
            "/dbs/nodb/docs/x",
            vec![hdr("if-none-match", b"\"1-00000000\"")],
            big.as_bytes(),
            400,
            "invalid_precondition",
        ),
        (
            "PUT",
            "/dbs/nodb/docs/x",
            vec![],
            big.as_bytes(),
            404,
            "database_not_found",
        ),
        (
            "PUT",
            "/dbs/shop/docs/x",
            vec![hdr("if-match", b"*")],
            big.as_bytes(),
            413,
            "body_too_large",
        ),
        (
            "PUT",
            "/dbs/shop/docs/x",
            vec![hdr("if-match", b"*")],
            b"{\"s\": oops}".as_slice(),
            400,
            "malformed_json",
        ),
        (
            "PUT",
            "/dbs/shop/docs/x",
            vec![hdr("if-match", b"*")],
            b"{}".as_slice(),
            409,
            "conflict",
        ),
    ];
    for (method, path, headers, body, status, code) in cases {
        let r = send(method, path, &headers, body).await.unwrap();
        let allow = r.headers().get("allow").cloned();
        expect_error(r, status, code).await;
        if status == 405 {
            assert_eq!(allow.unwrap(), "GET, PUT, PATCH, DELETE");
        }
    }
    let r = send("PUT", "/dbs/shop/docs/x", &[], b"{\"s\":\"\xff\"}")
        .await
        .unwrap();
    expect_error(r, 400, "malformed_json").await;
    expect_error(h.get("shop", "x").await, 404, "document_not_found").await;

    // A GET: its validators, then a 304 with the same ones, whichever way
    // If-None-Match names the etag; one that is not ASCII names none.
    let etag = h.put_ok("shop", "x", &json!({"n": 1})).await;
    let r = h.get("shop", "x").await;
    assert_eq!(r.status(), StatusCode::OK);
    let validators = |r: &reqwest::Response| -> Vec<Option<String>> {
        ["etag", "last-modified", "cache-control"]
            .map(|n| r.headers().get(n).map(|v| v.to_str().unwrap().to_string()))
            .to_vec()
    };
    let fresh = validators(&r);
    let doc: Value = r.json().await.unwrap();
    // Last-Modified is the document's write time, to the second.
    let written = doc["@metadata"]["@last-modified"].as_str().unwrap();
    let lm = fresh[1].clone().unwrap();
    assert!(httpdate::parse_http_date(&lm).is_ok(), "{lm}");
    let (year, day, time) = (&written[..4], &written[8..10], &written[11..19]);
    assert!(
        lm.contains(&format!(", {day} ")) && lm.ends_with(&format!(" {year} {time} GMT")),
        "{lm} vs {written}"
    );
    assert_eq!(fresh[0].as_deref(), Some(format!("\"{etag}\"").as_str()));
    assert_eq!(fresh[2].as_deref(), Some("no-cache"));
    for (value, hits) in [
        (format!("\"{etag}\""), true),
        (etag.clone(), true),
        (format!("W/\"{etag}\""), true),
        (format!("\"1-00000000\", \"{etag}\""), true),
        ("*".to_string(), true),
        ("\"1-00000000\"".to_string(), false),
    ] {
        let r = send(
            "GET",
            "/dbs/shop/docs/x",
            &[("if-none-match", value.as_bytes())],
            b"",
        )
        .await
        .unwrap();
        let status = if hits { 304 } else { 200 };
        assert_eq!(r.status().as_u16(), status, "{value}");
        assert_eq!(validators(&r), fresh, "{value}");
        assert_eq!(r.headers().contains_key("content-type"), !hits, "{value}");
        assert_eq!(r.bytes().await.unwrap().is_empty(), hits, "{value}");
    }
    let r = send(
        "GET",
        "/dbs/shop/docs/x",
        &[hdr("if-none-match", b"\"\xff\"")],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_ids_and_encoded_ids_round_trip() {
    let h = Harness::start().await;
    h.create_db("shop").await;

    let r = h
        .http
        .put(h.url("/dbs/shop/docs/users/"))
        .json(&json!({"name": "first"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let loc1 = r.headers()["location"].to_str().unwrap().to_string();
    let b1: Value = r.json().await.unwrap();
    let r = h
        .http
        .post(h.url("/dbs/shop/docs/users/"))
        .json(&json!({"name": "second"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let loc2 = r.headers()["location"].to_str().unwrap().to_string();
    let b2: Value = r.json().await.unwrap();
    let (id1, id2) = (b1["id"].as_str().unwrap(), b2["id"].as_str().unwrap());
    assert!(
        id1.starts_with("users/") && id1.len() > "users/".len(),
        "{id1}"
    );
    assert!(
        id2.starts_with("users/") && id2.len() > "users/".len(),
        "{id2}"
    );
    assert_ne!(id1, id2);
    assert_eq!(b1["collection"], "users");
    assert_eq!(loc1, format!("/dbs/shop/docs/{id1}"));
    assert_eq!(loc2, format!("/dbs/shop/docs/{id2}"));
    for (loc, name) in [(&loc1, "first"), (&loc2, "second")] {
        let r = h.http.get(h.url(loc)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.json::<Value>().await.unwrap()["name"], name);
    }

    // Ids with spaces, unicode and URL-significant characters.
    let ids = [
        "notes/hello world",
        "notes/é ü ß 日本",
        "notes/q?a=1&b=2#frag",
        "notes/100% + more",
        "notes/a/b/c",
    ];
    for (i, id) in ids.iter().enumerate() {
        let r = h.put("shop", id, &json!({"n": i})).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{id}");
        let loc = r.headers()["location"].to_str().unwrap().to_string();
        assert_eq!(loc, format!("/dbs/shop/docs/{}", encode(id)));
        assert_eq!(r.json::<Value>().await.unwrap()["id"], *id);
        let doc = h.get_json("shop", id).await;
        assert_eq!(doc["@metadata"]["@id"], *id);
        assert_eq!(doc["n"], i);
    }
    let r = h
        .http
        .get(h.url("/dbs/shop/docs"))
        .query(&[("prefix", "notes/")])
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    let listed: Vec<&str> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["@metadata"]["@id"].as_str().unwrap())
        .collect();
    let mut expected: Vec<&str> = ids.to_vec();
    expected.sort();
    assert_eq!(listed, expected);
    h.shutdown().await;
}

/// Pages through `GET /dbs/{db}/docs?prefix=..` and returns the ids in order.
async fn list_prefix(h: &Harness, db: &str, prefix: &str, page_size: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut start_after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut q = vec![
            ("prefix", prefix.to_string()),
            ("page_size", page_size.to_string()),
        ];
        if let Some(s) = &start_after {
            q.push(("start_after", s.clone()));
        }
        let r = h
            .http
            .get(h.url(&format!("/dbs/{db}/docs")))
            .query(&q)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let page: Value = r.json().await.unwrap();
        let items = page["results"].as_array().unwrap();
        assert!(items.len() <= page_size);
        ids.extend(
            items
                .iter()
                .map(|d| d["@metadata"]["@id"].as_str().unwrap().to_string()),
        );
        pages += 1;
        assert!(pages < 100, "paging does not end");
        match &page["next"] {
            Value::Null => return ids,
            Value::String(n) => {
                assert_eq!(Some(n.as_str()), ids.last().map(String::as_str));
                start_after = Some(n.clone());
            }
            other => panic!("next is {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_page_in_order_and_collections_count() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    // One batch writes the 25 items (in a scrambled order), then a few others.
    let mut ops = Vec::new();
    for i in (0..25).rev() {
        ops.push(json!({"op": "put", "id": format!("items/{i:03}"), "document": {"i": i}}));
    }
    let r = h
        .http
        .post(h.url("/dbs/shop/batch"))
        .json(&json!({ "ops": ops }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    h.put_ok("shop", "other/x", &json!({})).await;
    h.put_ok("shop", "other/y", &json!({})).await;
    h.put_ok("shop", "itemsz", &json!({})).await; // same prefix without the slash

    let expected: Vec<String> = (0..25).map(|i| format!("items/{i:03}")).collect();
    for page_size in [1, 7, 25, 100] {
        assert_eq!(
            list_prefix(&h, "shop", "items/", page_size).await,
            expected,
            "page_size {page_size}"
        );
    }
    let all = list_prefix(&h, "shop", "", 4).await;
    assert_eq!(all.len(), 28);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");

    // The default page size applies without page_size.
    let r = h.http.get(h.url("/dbs/shop/docs")).send().await.unwrap();
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["results"].as_array().unwrap().len(), 28);
    assert_eq!(page["next"], Value::Null);

    let r = h
        .http
        .get(h.url("/dbs/shop/collections"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"collections": [{"name": "items", "documents": 25}, {"name": "other", "documents": 2}]})
    );

    // Rewriting items/003 moves it to the end of the collection's etag order.
    h.put_ok("shop", "items/003", &json!({"i": 3, "rewritten": true}))
        .await;
    let mut seen = Vec::new();
    let mut etag_seqs = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut q = vec![("page_size", "6".to_string())];
        if let Some(a) = &after {
            q.push(("after", a.clone()));
        }
        let r = h
            .http
            .get(h.url("/dbs/shop/collections/items/docs"))
            .query(&q)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let link = r
            .headers()
            .get("link")
            .map(|v| v.to_str().unwrap().to_string());
        let page: Value = r.json().await.unwrap();
        let items = page["results"].as_array().unwrap();
        assert!(items.len() <= 6);
        // The next page's address in a Link header (RFC 8288), with the cursor.
        match (&page["next"], &link) {
            (Value::String(n), Some(l)) => assert_eq!(
                l,
                &format!("</dbs/shop/collections/items/docs?after={n}&page_size=6>; rel=\"next\"")
            ),
            (Value::Null, None) => {}
            other => panic!("next and Link disagree: {other:?}"),
        }
        for d in items {
            seen.push(d["@metadata"]["@id"].as_str().unwrap().to_string());
            let etag = d["@metadata"]["@etag"].as_str().unwrap();
            etag_seqs.push(etag.split('-').next().unwrap().parse::<u64>().unwrap());
        }
        match &page["next"] {
            Value::Null => break,
            Value::String(n) => {
                // The cursor is the last document's etag, as every cursor is.
                let last = items.last().unwrap()["@metadata"]["@etag"]
                    .as_str()
                    .unwrap();
                assert_eq!(n, last);
                after = Some(n.clone());
            }
            other => panic!("next is {other}"),
        }
        assert!(seen.len() <= 25, "paging repeats: {seen:?}");
    }
    assert_eq!(seen.len(), 25, "{seen:?}");
    assert!(etag_seqs.windows(2).all(|w| w[0] < w[1]), "{etag_seqs:?}");
    assert_eq!(seen.last().unwrap(), "items/003");
    assert_eq!(
        seen.iter().cloned().collect::<BTreeSet<_>>(),
        expected.iter().cloned().collect::<BTreeSet<_>>()
    );

    // A cursor that is not an etag is a JSON 400, not a deserializer's text.
    let r = h
        .http
        .get(h.url("/dbs/shop/collections/items/docs?after=7"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_etag").await;

    // Bad paging parameters.
    let r = h
        .http
        .get(h.url("/dbs/shop/docs?page_size=1025"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "page_size_too_large").await;
    let r = h
        .http
        .get(h.url("/dbs/shop/collections/items/docs?page_size=5000"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "page_size_too_large").await;
    let r = h
        .http
        .get(h.url("/dbs/shop/docs?page_size=abc"))
        .send()
        .await
        .unwrap();
    let v = expect_error(r, 400, "invalid_query").await;
    let said = v["message"].as_str().unwrap();
    assert!(
        said.contains("\"page_size\"") && said.contains("\"abc\""),
        "the parameter is named: {said}"
    );
    let r = h
        .http
        .get(h.url("/dbs/shop/collections/items/docs?after=xyz"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_etag").await;
    // Typos and repeats are refused, naming what the route takes.
    for (query, says) in [
        ("/dbs/shop/docs?limit=2", "prefix, start_after, page_size"),
        ("/dbs/shop/docs?prefx=items", "\"prefx\""),
        ("/dbs/shop/docs?prefix=a&prefix=b", "more than once"),
        ("/dbs/shop/changes?limt=1", "since, limit"),
        ("/dbs/shop/docs/items/001?rev=1", "no query parameters"),
        ("/dbs?x=1", "no query parameters"),
    ] {
        let r = h.http.get(h.url(query)).send().await.unwrap();
        let v = expect_error(r, 400, "invalid_query").await;
        assert!(
            v["message"].as_str().unwrap().contains(says),
            "{query}: {v}"
        );
        assert!(v["request_id"].is_string(), "{query}: {v}");
    }
    let r = h
        .http
        .get(h.url("/dbs/shop/docs?page_size=0"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_page_size").await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_all_or_nothing() {
    let h = Harness::start_with(|c| c.docs.max_batch_ops = 4).await;
    h.create_db("shop").await;
    let old = h.put_ok("shop", "users/old", &json!({"v": 0})).await;
    let keep = h.put_ok("shop", "users/keep", &json!({"v": 0})).await;
    let batch = |body: Value| h.http.post(h.url("/dbs/shop/batch")).json(&body).send();

    let r = batch(json!({"ops": [
        {"op": "put", "id": "users/a", "document": {"v": 1}},
        {"op": "put", "id": "users/b", "document": {"v": 2}},
        {"op": "delete", "id": "users/old", "if_match": old},
    ]}))
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{v}");
    assert_eq!(results[0]["op"], "put");
    assert_eq!(results[0]["id"], "users/a");
    assert_eq!(results[0]["created"], true);
    assert_eq!(results[1]["id"], "users/b");
    assert!(results[2]["etag"].is_string(), "{v}");
    assert_eq!(
        json!({"op": results[2]["op"], "id": results[2]["id"], "deleted_etag": results[2]["deleted_etag"]}),
        json!({"op": "delete", "id": "users/old", "deleted_etag": old})
    );
    let a = h.get_json("shop", "users/a").await;
    assert_eq!(a["v"], 1);
    assert_eq!(a["@metadata"]["@etag"], results[0]["etag"]);
    assert_eq!(h.get_json("shop", "users/b").await["v"], 2);
    expect_error(h.get("shop", "users/old").await, 404, "document_not_found").await;

    // One failing operation: 409, and none of the batch is applied.
    let r = batch(json!({"ops": [
        {"op": "put", "id": "users/c", "document": {"v": 3}},
        {"op": "put", "id": "users/a", "document": {"v": 100}},
        {"op": "delete", "id": "users/keep", "if_match": old},
    ]}))
    .await
    .unwrap();
    let v = expect_error(r, 409, "conflict").await;
    assert_eq!(v["current_etag"], keep.as_str());
    assert!(
        v["message"].as_str().unwrap().contains("operation 2"),
        "{v}"
    );
    expect_error(h.get("shop", "users/c").await, 404, "document_not_found").await;
    assert_eq!(h.get_json("shop", "users/a").await["v"], 1);
    let k = h.get_json("shop", "users/keep").await;
    assert_eq!(k["@metadata"]["@etag"], keep.as_str());

    // A delete of an id with no document: 404 as a single DELETE, naming the
    // operation, and none of the batch is applied (docs/http-api.md).
    let r = batch(json!({"ops": [
        {"op": "put", "id": "users/f", "document": {"v": 6}},
        {"op": "delete", "id": "users/never"},
    ]}))
    .await
    .unwrap();
    let v = expect_error(r, 404, "document_not_found").await;
    assert!(
        v["message"].as_str().unwrap().contains("operation 1"),
        "{v}"
    );
    expect_error(h.get("shop", "users/f").await, 404, "document_not_found").await;
    let r = h
        .http
        .delete(h.doc_url("shop", "users/never"))
        .send()
        .await
        .unwrap();
    expect_error(r, 404, "document_not_found").await;

    // An unknown operation, too many operations, a non-object document.
    let r = batch(json!({"ops": [{"op": "frobnicate", "id": "users/z"}]}))
        .await
        .unwrap();
    expect_error(r, 400, "malformed_json").await;
    let five: Vec<Value> = (0..5)
        .map(|i| json!({"op": "put", "id": format!("many/{i}"), "document": {}}))
        .collect();
    let r = batch(json!({ "ops": five })).await.unwrap();
    expect_error(r, 413, "batch_too_long").await;
    expect_error(h.get("shop", "many/0").await, 404, "document_not_found").await;
    let r = batch(json!({"ops": [
        {"op": "put", "id": "users/d", "document": {}},
        {"op": "put", "id": "users/e", "document": [1, 2]},
    ]}))
    .await
    .unwrap();
    expect_error(r, 400, "invalid_document").await;
    expect_error(h.get("shop", "users/d").await, 404, "document_not_found").await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_wrong_methods() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    let r = h.http.get(h.url("/nope")).send().await.unwrap();
    expect_error(r, 404, "not_found").await;
    let r = h
        .http
        .get(h.url("/dbs/shop/nothing/here"))
        .send()
        .await
        .unwrap();
    expect_error(r, 404, "not_found").await;
    // PATCH is a document's merge patch now; POST is not a document method.
    let r = h
        .http
        .post(h.doc_url("shop", "users/ada"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    expect_error(r, 405, "method_not_allowed").await;
    let r = h.http.post(h.url("/dbs")).send().await.unwrap();
    expect_error(r, 405, "method_not_allowed").await;
    let r = h.http.get(h.url("/dbs/shop/batch")).send().await.unwrap();
    expect_error(r, 405, "method_not_allowed").await;
    let r = h.http.get(h.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_http_engine_and_process_figures() {
    let h = Harness::start().await;
    h.create_db("m").await;
    for i in 0..3 {
        h.put_ok("m", &format!("docs/{i}"), &json!({"i": i})).await;
    }
    h.get_json("m", "docs/1").await;
    expect_error(h.get("m", "docs/none").await, 404, "document_not_found").await;

    let r = h.http.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.unwrap();
    let m = |series: &str| metric(&text, series).unwrap_or_else(|| panic!("{series}\n{text}"));

    let docs_route = r#"route="/dbs/{db}/docs/{*id}""#;
    assert_eq!(
        m(&format!(
            r#"kiln_http_requests_total{{{docs_route},method="PUT",status="201"}}"#
        )),
        3.0
    );
    assert_eq!(
        m(&format!(
            r#"kiln_http_requests_total{{{docs_route},method="GET",status="200"}}"#
        )),
        1.0
    );
    assert_eq!(
        m(&format!(
            r#"kiln_http_requests_total{{{docs_route},method="GET",status="404"}}"#
        )),
        1.0
    );
    assert_eq!(
        m(r#"kiln_http_requests_total{route="/dbs/{db}",method="PUT",status="201"}"#),
        1.0
    );
    // The /metrics request itself is counted after it renders.
    assert_eq!(
        m(r#"kiln_http_request_duration_seconds_bucket{le="+Inf"}"#),
        6.0
    );
    assert_eq!(m("kiln_http_request_duration_seconds_count"), 6.0);
    assert!(text.contains(r#"kiln_http_request_duration_seconds_bucket{le="0.0001"}"#));
    assert!(m(r#"kiln_commits_total{db="m"}"#) >= 3.0);
    assert!(m(r#"kiln_journal_writes_total{db="m"}"#) >= 1.0);
    assert!(m(r#"kiln_journal_write_seconds_count{db="m"}"#) >= 1.0);
    assert!(m(r#"kiln_journal_write_seconds{db="m",quantile="0.99"}"#) >= 0.0);
    assert!(m(r#"kiln_data_file_syncs_total{db="m"}"#) >= 0.0);
    assert_eq!(m(r#"kiln_documents{db="m"}"#), 3.0);
    assert!(m("kiln_process_resident_memory_bytes") > 1e6);
    assert!(m("kiln_process_open_fds") >= 3.0);
    assert!(m("kiln_uptime_seconds") >= 0.0);
    assert!(m("kiln_http_connections_total") >= 1.0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conditional_writes_have_exactly_one_winner() {
    let h = Harness::start().await;
    h.create_db("race").await;
    let etag = h.put_ok("race", "counter", &json!({"n": 0})).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        // Separate clients, so each writer has its own connection.
        let client = crate::common::client();
        let url = h.doc_url("race", "counter");
        let etag = etag.clone();
        tasks.push(tokio::spawn(async move {
            let r = client
                .put(url)
                .header("if-match", format!("\"{etag}\""))
                .json(&json!({"n": i}))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let new_etag = r
                .headers()
                .get("etag")
                .map(|v| v.to_str().unwrap().trim_matches('"').to_string());
            let body: Value = r.json().await.unwrap();
            (i, status, new_etag, body)
        }));
    }
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        let (i, status, new_etag, body) = t.await.unwrap();
        match status {
            StatusCode::OK => winners.push((i, new_etag.unwrap())),
            StatusCode::CONFLICT => {
                assert_eq!(body["error"], "conflict");
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(conflicts, 15);
    let (i, winner_etag) = &winners[0];
    let doc = h.get_json("race", "counter").await;
    assert_eq!(doc["n"], *i);
    assert_eq!(doc["@metadata"]["@etag"], winner_etag.as_str());
    h.shutdown().await;
}

/// Concurrent writes may share one commit; a conflicting one still fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_succeed_or_fail_each_on_their_own() {
    let h = Harness::start().await;
    h.create_db("mix").await;
    let stale = h.put_ok("mix", "guarded", &json!({"v": 0})).await;
    let current = h.put_ok("mix", "guarded", &json!({"v": 1})).await;
    let mut tasks = Vec::new();
    for i in 0..24 {
        let client = crate::common::client();
        let h_url = |id: &str| h.doc_url("mix", id);
        let (url, if_match) = match i % 6 {
            // Every sixth writer uses a stale etag on the guarded document.
            0 => (h_url("guarded"), Some(stale.clone())),
            _ => (h_url(&format!("free/{i:02}")), None),
        };
        tasks.push(tokio::spawn(async move {
            let mut req = client.put(url).json(&json!({"writer": i}));
            if let Some(e) = if_match {
                req = req.header("if-match", format!("\"{e}\""));
            }
            let r = req.send().await.unwrap();
            (i, r.status(), r.json::<Value>().await.unwrap())
        }));
    }
    for t in tasks {
        let (i, status, body) = t.await.unwrap();
        if i % 6 == 0 {
            assert_eq!(status, StatusCode::CONFLICT, "{i}: {body}");
            assert_eq!(body["current_etag"], current.as_str());
        } else {
            assert_eq!(status, StatusCode::CREATED, "{i}: {body}");
        }
    }
    for i in (0..24).filter(|i| i % 6 != 0) {
        assert_eq!(
            h.get_json("mix", &format!("free/{i:02}")).await["writer"],
            i
        );
    }
    let guarded = h.get_json("mix", "guarded").await;
    assert_eq!(guarded["v"], 1);
    assert_eq!(guarded["@metadata"]["@etag"], current.as_str());
    let r = h.http.get(h.url("/dbs/mix")).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["documents"], 21);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_and_etags_survive_a_restart() {
    let h = Harness::start().await;
    h.create_db("keep").await;
    h.create_db("empty").await;
    let mut etags = Vec::new();
    for i in 0..10 {
        let id = format!("things/{i}");
        etags.push((
            id.clone(),
            h.put_ok("keep", &id, &json!({"i": i, "s": "x".repeat(i * 10)}))
                .await,
        ));
    }
    let r = h
        .http
        .delete(h.doc_url("keep", "things/9"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    etags.pop();
    let before: Vec<Value> = {
        let mut v = Vec::new();
        for (id, _) in &etags {
            v.push(h.get_json("keep", id).await);
        }
        v
    };
    let dir = h.shutdown().await;

    let h = Harness::start_in(dir, |_| {}).await;
    let r = h.http.get(h.url("/dbs")).send().await.unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"databases": ["empty", "keep"]})
    );
    for ((id, etag), old) in etags.iter().zip(&before) {
        let r = h.get("keep", id).await;
        assert_eq!(r.status(), StatusCode::OK, "{id}");
        assert_eq!(&etag_of(&r), etag, "{id}");
        assert_eq!(&r.json::<Value>().await.unwrap(), old, "{id}");
    }
    expect_error(h.get("keep", "things/9").await, 404, "document_not_found").await;
    // Etags keep growing after the restart.
    let last_seq: u64 = etags
        .last()
        .unwrap()
        .1
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let next = h.put_ok("keep", "things/new", &json!({})).await;
    let (seq, inc) = next.split_once('-').unwrap();
    assert!(seq.parse::<u64>().unwrap() > last_seq, "{next}");
    assert!(etags[0].1.ends_with(&format!("-{inc}")), "same incarnation");
    let r = h.http.get(h.url("/dbs/keep")).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["documents"], 10);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_is_not_utf8_gets_a_json_error() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    let r = h
        .http
        .get(h.url("/dbs/shop/docs/bad%FF%FEid"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_path").await;
}

/// Deleting a database while writers hammer it: every request gets an answer (written,
/// or 404 once the database is gone), nothing hangs, and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_database_under_concurrent_writes() {
    let h = Harness::start().await;
    h.create_db("busy").await;
    let mut writers = Vec::new();
    for w in 0..8 {
        let http = h.http.clone();
        let url = h.url("/dbs/busy/docs/");
        writers.push(tokio::spawn(async move {
            // Write until the deletion is seen (bounded, so a missed deletion fails).
            let mut statuses = Vec::new();
            for i in 0..20_000 {
                let r = http
                    .put(format!("{url}w{w}-{i}"))
                    .json(&json!({"i": i}))
                    .send()
                    .await
                    .expect("every request gets an answer");
                statuses.push(r.status().as_u16());
                if r.status() == StatusCode::NOT_FOUND {
                    break;
                }
            }
            statuses
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let r = h.http.delete(h.url("/dbs/busy")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    let mut seen = BTreeSet::new();
    for w in writers {
        let statuses = tokio::time::timeout(std::time::Duration::from_secs(30), w)
            .await
            .expect("no writer hangs")
            .unwrap();
        assert_eq!(
            statuses.last(),
            Some(&404),
            "each writer ends by seeing the database gone"
        );
        seen.extend(statuses);
    }
    assert!(
        seen.iter().all(|s| [200, 201, 404].contains(s)),
        "statuses {seen:?}"
    );
    assert!(
        seen.contains(&404),
        "writes after the deletion must see it gone: {seen:?}"
    );
    // The server goes on, and the name can be used again, empty.
    h.create_db("busy").await;
    let r = h
        .http
        .get(h.url("/dbs/busy/docs?prefix=w"))
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["results"].as_array().unwrap().len(), 0);
}

/// An attachment GET's conditions: `If-Range` (RFC 9110 §13.1.5) lets a Range
/// through only with the current, strong ETag; another tag, a weak one or a date
/// gets the whole body with 200. `If-Modified-Since` is ignored (an attachment
/// has no `Last-Modified`), `If-None-Match` gives 304.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachment_reads_honour_if_range() {
    let h = Harness::start().await;
    h.create_db("a").await;
    h.put_ok("a", "d", &json!({})).await;
    let url = h.url("/dbs/a/docs/d/attachments/f.txt");
    let bytes: Vec<u8> = (0..100u8).collect();
    let r = h.http.put(&url).body(bytes.clone()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = h.http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("last-modified").is_none());
    let etag = r.headers()["etag"].to_str().unwrap().to_string();

    let get = |if_range: Option<String>, range: &str| {
        let mut b = h.http.get(&url).header("range", range.to_string());
        if let Some(v) = if_range {
            b = b.header("if-range", v);
        }
        b.send()
    };
    // The current ETag: the range.
    let r = get(Some(etag.clone()), "bytes=0-9").await.unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(r.bytes().await.unwrap().as_ref(), &bytes[..10]);
    // No If-Range: the range.
    let r = get(None, "bytes=0-9").await.unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    // Another ETag, the same one weak, or a date: the whole body, 200.
    for other in [
        "\"0000000000000000000000000000000000000000000000000000000000000000\"".to_string(),
        format!("W/{etag}"),
        "Wed, 21 Oct 2099 07:28:00 GMT".to_string(),
    ] {
        let r = get(Some(other.clone()), "bytes=0-9").await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "If-Range: {other}");
        assert!(r.headers().get("content-range").is_none(), "{other}");
        assert_eq!(r.bytes().await.unwrap().as_ref(), &bytes[..], "{other}");
    }
    // A failed If-Range ignores even an unsatisfiable Range.
    let r = get(Some("\"x\"".into()), "bytes=500-").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = get(Some(etag.clone()), "bytes=500-").await.unwrap();
    assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);

    // No Last-Modified, so If-Modified-Since is ignored; If-None-Match is not.
    let r = h
        .http
        .get(&url)
        .header("if-modified-since", "Wed, 21 Oct 2099 07:28:00 GMT")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = h
        .http
        .get(&url)
        .header("if-none-match", etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    h.shutdown().await;
}
