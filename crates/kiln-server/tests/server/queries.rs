//! Indexes and queries over HTTP: define, list, state, reset, delete; queries with
//! parameters, paging, counts, staleness and waiting; ETag and 304; auto indexes;
//! malformed and hostile queries get clear 400s.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{expect_error, Harness};
use reqwest::StatusCode;
use serde_json::{json, Value};

async fn query(h: &Harness, db: &str, body: Value) -> reqwest::Response {
    h.http
        .post(h.url(&format!("/dbs/{db}/queries")))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn query_ok(h: &Harness, db: &str, body: Value) -> Value {
    let r = query(h, db, body.clone()).await;
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}: {text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexes_and_queries_end_to_end() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    for i in 0..50 {
        let name = ["Ada", "alan", "Grace", "Linus", "Barbara"][i % 5];
        h.put_ok(
            "shop",
            &format!("users/{i}"),
            &json!({"name": name, "age": 20 + i, "tags": [format!("t{}", i % 3)]}),
        )
        .await;
    }
    let r = h
        .http
        .put(h.url("/dbs/shop/indexes/users-by-age"))
        .json(&json!({"collection": "users", "fields": ["age"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = h
        .http
        .put(h.url("/dbs/shop/indexes/users-by-name"))
        .json(
            &json!({"collection": "users", "fields": [{"path": "name", "case_insensitive": true}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // The same definition again is fine; another one under the name is a conflict.
    let r = h
        .http
        .put(h.url("/dbs/shop/indexes/users-by-age"))
        .json(&json!({"collection": "users", "fields": ["age"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = h
        .http
        .put(h.url("/dbs/shop/indexes/users-by-age"))
        .json(&json!({"collection": "users", "fields": ["name"]}))
        .send()
        .await
        .unwrap();
    expect_error(r, 409, "index_exists").await;
    let r = h
        .http
        .put(h.url("/dbs/shop/indexes/bad"))
        .json(&json!({"fields": []}))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_index").await;

    let a = query_ok(
        &h,
        "shop",
        json!({"query": "from users where age >= $min order by age desc limit 5 offset 2",
               "params": {"min": 60}, "wait_for_non_stale_ms": 5000}),
    )
    .await;
    assert_eq!(a["total"], 10);
    assert_eq!(a["skipped"], 2);
    assert_eq!(a["stale"], false);
    assert_eq!(a["index"], "users-by-age");
    let ages: Vec<i64> = a["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["age"].as_i64().unwrap())
        .collect();
    assert_eq!(ages, vec![67, 66, 65, 64, 63]);
    assert!(a["results"][0]["@metadata"]["@id"].is_string());
    assert!(a["index_etag"].is_string());
    assert!(a["duration_ms"].is_number());

    // Paging by continuation token.
    let mut seen = Vec::new();
    let mut token = Value::Null;
    loop {
        let a = query_ok(
            &h,
            "shop",
            json!({"query": "from users where age >= 30 order by age limit 7", "continuation": token}),
        )
        .await;
        assert_eq!(a["total"], 40);
        for d in a["results"].as_array().unwrap() {
            seen.push(d["age"].as_i64().unwrap());
        }
        token = a["continuation"].clone();
        if token.is_null() {
            break;
        }
    }
    assert_eq!(seen, (30..70).collect::<Vec<i64>>());
    let r = query(
        &h,
        "shop",
        json!({"query": "from users", "continuation": "zz"}),
    )
    .await;
    let v = expect_error(r, 400, "invalid_query").await;
    // No position to give: none made up ("line 0, column 0").
    assert_eq!(
        v["message"], "invalid query: malformed continuation token",
        "{v}"
    );

    // Case-insensitive: lower(name) uses the case-insensitive index.
    let a = query_ok(
        &h,
        "shop",
        json!({"query": "from users where lower(name) startsWith 'a' select name, age",
               "wait_for_non_stale_ms": 5000}),
    )
    .await;
    assert_eq!(a["total"], 20);
    assert_eq!(a["index"], "users-by-name");
    let first = &a["results"][0];
    assert!(
        first.get("age").is_some() && first.get("tags").is_none(),
        "{first}"
    );

    // ETag and If-None-Match: 304 while nothing changed, 200 after a write.
    let body = json!({"query": "from users where age < 25"});
    let r = query(&h, "shop", body.clone()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let tag = r.headers()["etag"].to_str().unwrap().to_string();
    let r = h
        .http
        .post(h.url("/dbs/shop/queries"))
        .header("if-none-match", &tag)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    h.put_ok("shop", "users/new", &json!({"name": "Zed", "age": 1}))
        .await;
    let r = h
        .http
        .post(h.url("/dbs/shop/queries"))
        .header("if-none-match", &tag)
        .json(&json!({"query": "from users where age < 25", "wait_for_non_stale_ms": 5000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["total"], 6);

    // An auto index for a field no index covers.
    let a = query_ok(
        &h,
        "shop",
        json!({"query": "from users where tags[] = 't1'"}),
    )
    .await;
    assert_eq!(a["auto_index_created"], "auto/users/tags@each");
    assert_eq!(a["total"], 17);

    // State of the indexes.
    let r = h.http.get(h.url("/dbs/shop/indexes")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let list: Value = r.json().await.unwrap();
    let names: Vec<&str> = list["indexes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"users-by-age") && names.contains(&"auto/users/tags@each"));
    let r = h
        .http
        .get(h.url("/dbs/shop/indexes/users-by-age"))
        .send()
        .await
        .unwrap();
    let info: Value = r.json().await.unwrap();
    assert_eq!(info["entries"], 51);
    for key in [
        "last_indexed_etag",
        "database_etag",
        "docs_behind",
        "batch_size",
        "docs_per_sec",
        "errors",
    ] {
        assert!(info.get(key).is_some(), "{key} in {info}");
    }
    // An auto index's name holds slashes: percent-encoded in the path.
    let r = h
        .http
        .get(h.url("/dbs/shop/indexes/auto%2Fusers%2Ftags@each"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // Reset then delete.
    let r = h
        .http
        .post(h.url("/dbs/shop/indexes/users-by-age/reset"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let a = query_ok(
        &h,
        "shop",
        json!({"query": "from index 'users-by-age' where age between 20 and 29", "wait_for_non_stale_ms": 5000}),
    )
    .await;
    assert_eq!(
        (a["total"].as_u64(), a["stale"].as_bool()),
        (Some(10), Some(false))
    );
    let r = h
        .http
        .delete(h.url("/dbs/shop/indexes/users-by-age"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = h
        .http
        .get(h.url("/dbs/shop/indexes/users-by-age"))
        .send()
        .await
        .unwrap();
    expect_error(r, 404, "index_not_found").await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_hostile_queries_get_400() {
    let h = Harness::start().await;
    h.create_db("db").await;
    h.put_ok("db", "u/1", &json!({"a": 1})).await;
    let deep = format!("from u where {}a = 1{}", "(".repeat(2000), ")".repeat(2000));
    let long_in = format!(
        "from u where a in ({})",
        (0..3000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let cases = vec![
        json!({"query": "from u where a >"}),
        json!({"query": deep}),
        json!({"query": long_in}),
        json!({"query": "from u where a in $xs", "params": {"xs": (0..3000).collect::<Vec<_>>()}}),
        json!({"query": "from u where a = $x", "params": {"x": {"o": 1}}}),
        json!({"query": "from u where a = $nope"}),
        json!({"query": "from u where a = 1 limit 99999999"}),
        json!({"query": "from u where a = 1 offset 999999999"}),
        json!({"query": "from u where a between 1 and 'z'"}),
        json!({"query": "from index 'missing'"}),
        json!({"query": "delete from u"}),
        json!({"query": "from u where a = 1", "unknown": true}),
        json!({"nope": 1}),
    ];
    for c in cases {
        let r = query(&h, "db", c.clone()).await;
        let v = expect_error(r, 400, "invalid_query").await;
        assert!(v["message"].as_str().unwrap().len() < 500, "{c}: {v}");
    }
    let r = query(&h, "db", json!({"query": "from u where\n  a >"})).await;
    let v = expect_error(r, 400, "invalid_query").await;
    assert!(
        v["message"].as_str().unwrap().contains("line 2, column 6"),
        "{v}"
    );
    let r = query(&h, "nodb", json!({"query": "from u"})).await;
    expect_error(r, 404, "database_not_found").await;
    h.shutdown().await;
}

/// A reduce index over HTTP: defined with `group_by` and `aggregate` (the issue's
/// shape), shown with them, and answering a grouped query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reduce_index_answers_a_grouped_query() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    for i in 0..30 {
        let company = ["acme", "globex", "initech"][i % 3];
        h.put_ok(
            "shop",
            &format!("orders/{i}"),
            &json!({"company": company, "amount": i}),
        )
        .await;
    }
    let definition = json!({"collection": "orders", "group_by": ["company"],
        "aggregate": {"count": "count()", "total": "sum(amount)", "max": "max(amount)"}});
    let r = h
        .http
        .put(h.url("/dbs/shop/indexes/orders-by-company"))
        .json(&definition)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let info: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{info}");
    assert_eq!(info["group_by"][0]["path"], "company", "{info}");
    assert_eq!(info["aggregate"]["total"], "sum(amount)", "{info}");
    let v = query_ok(
        &h,
        "shop",
        json!({"query": "from orders group by company select company, count() as n, sum(amount) as total, max(amount) as top",
               "wait_for_non_stale_ms": 5000}),
    )
    .await;
    assert_eq!(v["index"], "orders-by-company", "{v}");
    assert_eq!(v["total"], 3, "{v}");
    assert_eq!(
        v["results"][0],
        json!({"company": "acme", "n": 10, "total": 135, "top": 27}),
        "{v}"
    );
    // An aggregate the index does not keep: answered by reducing a scan.
    let v = query_ok(
        &h,
        "shop",
        json!({"query": "from orders group by company select company, min(amount) as low"}),
    )
    .await;
    assert_eq!(v["index"], Value::Null, "{v}");
    assert_eq!(
        v["results"][2],
        json!({"company": "initech", "low": 2}),
        "{v}"
    );
    // Both fields and group_by: refused.
    let r = h
        .http
        .put(h.url("/dbs/shop/indexes/bad"))
        .json(&json!({"fields": ["a"], "group_by": ["b"], "aggregate": {"n": "count()"}}))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_index").await;
}
