//! Document revisions over HTTP: the configuration (`/dbs/{db}/revisions/config`,
//! bad ones refused with 400s), the pages of a document's revisions
//! (`/dbs/{db}/revisions/docs/{id}`), revert and purge; and with `--auth`, each
//! revision names the API key that wrote its version, whichever route wrote it
//! (PUT through the own HTTP/1.1 loop, DELETE, batch, bulk insert, revert).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{expect_error, Harness};
use kiln_server::auth;
use reqwest::StatusCode;
use serde_json::{json, Value};

async fn set_config(h: &Harness, db: &str, config: &Value) -> reqwest::Response {
    h.http
        .put(h.url(&format!("/dbs/{db}/revisions/config")))
        .json(config)
        .send()
        .await
        .unwrap()
}

async fn revisions(h: &Harness, db: &str, id: &str, query: &str) -> reqwest::Response {
    let path = format!(
        "/dbs/{db}/revisions/docs/{}{query}",
        crate::common::encode(id)
    );
    h.http.get(h.url(&path)).send().await.unwrap()
}

/// Every revision of `id`, newest first, following the continuations.
async fn all_revisions(h: &Harness, db: &str, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut query = "?limit=2".to_string();
    loop {
        let r = revisions(h, db, id, &query).await;
        assert_eq!(r.status(), StatusCode::OK);
        let page: Value = r.json().await.unwrap();
        out.extend(page["revisions"].as_array().unwrap().iter().cloned());
        match page["continuation"].as_str() {
            Some(next) => query = format!("?limit=2&continuation={next}"),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configurations_are_refused_and_a_good_one_is_kept() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    let (status, body) = h.get_text("/dbs/shop/revisions/config").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"collections": {}})
    );
    for bad in [
        json!({"collections": {"orders": {"max_revisions": 0}}}),
        json!({"collections": {"orders": {"max_revisions": 10_001}}}),
        json!({"collections": {"orders": {"max_revisions": 5, "max_age_ms": 0}}}),
        json!({"collections": {"orders": {"max_revisions": -5}}}),
        json!({"collections": {"orders": {}}}),
        json!({"collections": {"orders": {"max_revisions": 5, "keep": true}}}),
        json!({"collection": {}}),
        json!([]),
    ] {
        let r = set_config(&h, "shop", &bad).await;
        let e = expect_error(r, 400, "invalid_revisions_config").await;
        assert!(e["message"].as_str().unwrap().len() > 20, "{e}");
    }
    let r = set_config(
        &h,
        "shop",
        &json!({"collections": {"@x": {"max_revisions": 1}}}),
    )
    .await;
    expect_error(r, 400, "invalid_collection").await;
    let r = set_config(&h, "nope", &json!({"collections": {}})).await;
    expect_error(r, 404, "database_not_found").await;
    // Collections with no documents yet are fine.
    let good = json!({"collections": {
        "orders": {"max_revisions": 50, "max_age_ms": null},
        "later": {"max_revisions": 2, "max_age_ms": 86_400_000}}});
    let r = set_config(&h, "shop", &good).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap(), good);
    let (_, body) = h.get_text("/dbs/shop/revisions/config").await;
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), good);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_page_revert_and_purge() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    let r = set_config(
        &h,
        "shop",
        &json!({"collections": {"orders": {"max_revisions": 10}}}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let mut etags = Vec::new();
    for v in 1..=4 {
        etags.push(h.put_ok("shop", "orders/1", &json!({"v": v})).await);
    }
    // A document whose id ends in /revisions is a document like any other.
    h.put_ok("shop", "orders/1/revisions", &json!({"plain": true}))
        .await;
    assert_eq!(
        h.get_json("shop", "orders/1/revisions").await["plain"],
        true
    );
    let r = h
        .http
        .delete(h.doc_url("shop", "orders/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let r = revisions(&h, "shop", "orders/1", "?limit=3").await;
    assert_eq!(r.status(), StatusCode::OK);
    let link = r.headers()["link"].to_str().unwrap().to_string();
    let page: Value = r.json().await.unwrap();
    let got: Vec<(&str, bool, i64)> = page["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let v = r["document"]["v"].as_i64().unwrap();
            (
                r["etag"].as_str().unwrap(),
                r["deleted"].as_bool().unwrap(),
                v,
            )
        })
        .collect();
    let want = vec![
        (etags[3].as_str(), true, 4),
        (etags[2].as_str(), false, 3),
        (etags[1].as_str(), false, 2),
    ];
    assert_eq!(got, want);
    let first = &page["revisions"][0];
    assert_eq!(first["document"]["@metadata"]["@etag"], etags[3].as_str());
    assert!(
        first["last_modified"].as_str().unwrap().ends_with('Z'),
        "{first}"
    );
    assert!(
        first["replaced_at"].as_str().unwrap().ends_with('Z'),
        "{first}"
    );
    assert_eq!(first["key_id"], Value::Null, "no --auth: no key");
    assert_eq!(page["continuation"], etags[1].as_str());
    assert!(
        link.contains(&format!("continuation={}", etags[1])),
        "{link}"
    );
    assert_eq!(all_revisions(&h, "shop", "orders/1").await.len(), 4);

    // Paging and target errors.
    let r = revisions(&h, "shop", "orders/1", "?limit=0").await;
    expect_error(r, 400, "invalid_page_size").await;
    let r = revisions(&h, "shop", "orders/1", "?page_size=2").await;
    expect_error(r, 400, "invalid_query").await;
    let r = revisions(&h, "shop", "orders/1", "?continuation=nope").await;
    expect_error(r, 400, "invalid_etag").await;
    let r = revisions(&h, "shop", "never", "").await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"revisions": [], "continuation": null})
    );

    // Revert: the deleted document comes back from its revision 2.
    let revert = |etag: &str, if_match: Option<&str>| {
        let url = h.url(&format!("/dbs/shop/revisions/revert/orders/1?etag={etag}"));
        let req = h.http.post(url);
        match if_match {
            Some(m) => req.header("if-match", format!("\"{m}\"")),
            None => req,
        }
    };
    let r = revert(&etags[1], None).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["location"], "/dbs/shop/docs/orders/1");
    let now = crate::common::etag_of(&r);
    let doc = h.get_json("shop", "orders/1").await;
    assert_eq!(
        (doc["v"].clone(), doc["@metadata"]["@etag"].clone()),
        (json!(2), json!(now))
    );
    let r = revert(&etags[0], Some(&etags[3])).send().await.unwrap();
    let e = expect_error(r, 409, "conflict").await;
    assert_eq!(e["current_etag"], now.as_str());
    let r = revert(&etags[0], Some(&now)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(h.get_json("shop", "orders/1").await["v"], 1);
    let r = revert("999-00000001", None).send().await.unwrap();
    expect_error(r, 404, "revision_not_found").await;
    let r = revert("nope", None).send().await.unwrap();
    expect_error(r, 400, "invalid_etag").await;
    let url = h.url("/dbs/shop/revisions/revert/orders/1");
    let r = h.http.post(url).send().await.unwrap();
    expect_error(r, 400, "invalid_query").await;
    // The version each revert replaced is a revision too.
    assert_eq!(all_revisions(&h, "shop", "orders/1").await.len(), 5);

    // Purge.
    let url = h.url("/dbs/shop/revisions/docs/orders/1");
    let r = h.http.delete(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"id": "orders/1", "purged": 5})
    );
    assert!(all_revisions(&h, "shop", "orders/1").await.is_empty());
    h.shutdown().await;
}

/// With `--auth`, a revision names the key that wrote its version, on every write
/// route; a revision of a version written with no key known says null.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_revision_names_the_key_that_wrote_it() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<(String, String)> = ["put", "batch", "bulk", "revert"]
        .iter()
        .map(|name| {
            let (record, key) =
                auth::create_api_key(dir.path(), name, kiln_server::access::Clearance::Operator)
                    .unwrap();
            (record.id, key)
        })
        .collect();
    let h = Harness::start_in(dir, |c| c.require_auth = true).await;
    let (put_key, batch_key, bulk_key, revert_key) = (&keys[0], &keys[1], &keys[2], &keys[3]);
    let r = h
        .http
        .put(h.url("/dbs/shop"))
        .bearer_auth(&put_key.1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let config = json!({"collections": {"c": {"max_revisions": 10}}});
    let url = h.url("/dbs/shop/revisions/config");
    let r = h
        .http
        .put(&url)
        .bearer_auth(&put_key.1)
        .json(&config)
        .send()
        .await;
    assert_eq!(r.unwrap().status(), StatusCode::OK);
    // A plain PUT on a new connection: the own HTTP/1.1 loop serves it (a
    // connection whose first request was another goes to hyper for good).
    let r = crate::common::client()
        .put(h.doc_url("shop", "c/1"))
        .bearer_auth(&put_key.1)
        .json(&json!({"v": 1}));
    let first = crate::common::etag_of(&r.send().await.unwrap());
    let batch = json!({"ops": [{"op": "put", "id": "c/1", "document": {"v": 2}}]});
    let r = h
        .http
        .post(h.url("/dbs/shop/batch"))
        .bearer_auth(&batch_key.1)
        .json(&batch);
    assert_eq!(r.send().await.unwrap().status(), StatusCode::OK);
    let line = "{\"id\": \"c/1\", \"document\": {\"v\": 3}}\n";
    let r = h
        .http
        .post(h.url("/dbs/shop/bulk"))
        .bearer_auth(&bulk_key.1)
        .body(line);
    let acks = r.send().await.unwrap().text().await.unwrap();
    assert!(acks.contains("\"acked\""), "{acks}");
    let revert = format!("/dbs/shop/revisions/revert/c/1?etag={first}");
    let r = h
        .http
        .post(h.url(&revert))
        .bearer_auth(&revert_key.1)
        .send()
        .await;
    assert_eq!(r.unwrap().status(), StatusCode::OK);
    // The delete archives the revert's version.
    let r = h
        .http
        .delete(h.doc_url("shop", "c/1"))
        .bearer_auth(&put_key.1)
        .send()
        .await;
    assert_eq!(r.unwrap().status(), StatusCode::OK);
    let url = h.url("/dbs/shop/revisions/docs/c/1");
    let page: Value = h
        .http
        .get(&url)
        .bearer_auth(&put_key.1)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let got: Vec<(Value, Value, Value)> = page["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key_id"].clone(),
                r["document"]["v"].clone(),
                r["deleted"].clone(),
            )
        })
        .collect();
    let want = vec![
        (json!(revert_key.0), json!(1), json!(true)),
        (json!(bulk_key.0), json!(3), json!(false)),
        (json!(batch_key.0), json!(2), json!(false)),
        (json!(put_key.0), json!(1), json!(false)),
    ];
    assert_eq!(got, want);
    // Without a key: refused like every API route.
    let r = h.http.get(&url).send().await.unwrap();
    expect_error(r, 401, "unauthorized").await;
    h.shutdown().await;
}
