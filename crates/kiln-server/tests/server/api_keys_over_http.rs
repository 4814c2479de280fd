//! API keys managed over HTTP (`/admin/api-keys`, operator only): a key created
//! so works at once with exactly its grants, is listed without its secret or the
//! secret's hash, is refused once revoked; bad bodies get 400 naming the field;
//! a client certificate is registered by its PEM once; the audit log records
//! each change.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{expect_error, Harness};
use kiln_server::access::Clearance;
use kiln_server::auth;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

async fn post_key(h: &Harness, operator_key: &str, body: Value) -> reqwest::Response {
    h.http
        .post(h.url("/admin/api-keys"))
        .bearer_auth(operator_key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn status_of(h: &Harness, method: reqwest::Method, path: &str, key: &str) -> StatusCode {
    let mut req = h.http.request(method.clone(), h.url(path)).bearer_auth(key);
    if method == reqwest::Method::PUT {
        req = req.json(&json!({"n": 1}));
    }
    req.send().await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_made_listed_and_revoked_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let (_, op) = auth::create_api_key(dir.path(), "ops", Clearance::Operator).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let audit_path = audit.clone();
    let h = Harness::start_in(dir, |c| {
        c.require_auth = true;
        c.audit_log = Some(audit_path);
    })
    .await;
    let put_db = h
        .http
        .put(h.url("/dbs/shop"))
        .bearer_auth(&op)
        .send()
        .await
        .unwrap();
    assert_eq!(put_db.status(), StatusCode::CREATED);

    // Made: the key is answered once, with its clearance.
    let r = post_key(
        &h,
        &op,
        json!({"name": "shop-app", "grants": ["shop:read_write"]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let made: Value = r.json().await.unwrap();
    let key = made["key"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(key.starts_with(&format!("kiln_{id}_")), "{made}");
    assert_eq!(made["kind"], "key");
    assert_eq!(
        made["clearance"],
        json!({"databases": [{"database": "shop", "access": "read_write"}]})
    );

    // It works at once, within its grants.
    use reqwest::Method as M;
    assert_eq!(
        status_of(&h, M::PUT, "/dbs/shop/docs/a", &key).await,
        StatusCode::CREATED
    );
    assert_eq!(
        status_of(&h, M::GET, "/dbs/shop/docs/a", &key).await,
        StatusCode::OK
    );
    assert_eq!(
        status_of(&h, M::DELETE, "/dbs/shop", &key).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        status_of(&h, M::GET, "/admin/api-keys", &key).await,
        StatusCode::FORBIDDEN
    );
    let r = post_key(&h, &key, json!({"name": "mine", "operator": true})).await;
    expect_error(r, 403, "forbidden").await;

    // Listed without the secret or its hash.
    let listed = h
        .http
        .get(h.url("/admin/api-keys"))
        .bearer_auth(&op)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let secret = key.rsplit('_').next().unwrap();
    let hash = hex::encode(Sha256::digest(secret.as_bytes()));
    assert!(
        listed.contains(&id) && listed.contains("shop-app"),
        "{listed}"
    );
    assert!(
        !listed.contains(secret) && !listed.contains(&hash),
        "{listed}"
    );
    let names: Vec<String> = serde_json::from_str::<Value>(&listed).unwrap()["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["ops", "shop-app"]);

    // Bad bodies: 400 saying what is wrong; nothing made.
    for (body, says) in [
        (json!({"name": "x"}), "operator"),
        (
            json!({"name": "x", "operator": true, "grants": ["shop:read"]}),
            "not both",
        ),
        (json!({"name": "x", "grants": ["shop:write"]}), "grants"),
        (json!({"name": "", "operator": true}), "name"),
        (json!({"name": "x", "operator": true, "extra": 1}), "extra"),
        (
            json!({"name": "x", "operator": true, "certificate_pem": "no"}),
            "certificate",
        ),
    ] {
        let r = post_key(&h, &op, body.clone()).await;
        let e = expect_error(r, 400, "bad_request").await;
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    assert_eq!(auth::list_api_keys(&h.data_dir()).unwrap().len(), 2);

    // A certificate registered by its PEM, once.
    let cert = rcgen::generate_simple_self_signed(vec!["client".to_string()]).unwrap();
    let pem = cert.cert.pem();
    let body = json!({"name": "svc", "grants": ["shop:read"], "certificate_pem": pem});
    let r = post_key(&h, &op, body.clone()).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let registered: Value = r.json().await.unwrap();
    assert_eq!(registered["kind"], "certificate");
    assert!(registered.get("key").is_none(), "{registered}");
    assert_eq!(
        registered["certificate_sha256"],
        auth::certificate_thumbprint(cert.cert.der())
    );
    let again = expect_error(post_key(&h, &op, body).await, 400, "bad_request").await;
    assert!(again["message"]
        .as_str()
        .unwrap()
        .contains("already registered"));

    // Revoked: refused from the next request; a second revoke is 404.
    let revoke = |id: String| {
        let req = h
            .http
            .delete(h.url(&format!("/admin/api-keys/{id}")))
            .bearer_auth(&op);
        async move { req.send().await.unwrap() }
    };
    let r = revoke(id.clone()).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"revoked": id}));
    assert_eq!(
        status_of(&h, M::GET, "/dbs/shop/docs/a", &key).await,
        StatusCode::UNAUTHORIZED
    );
    expect_error(revoke(id.clone()).await, 404, "not_found").await;

    // Each change is in the audit log, with who made it.
    let lines = std::fs::read_to_string(&audit).unwrap();
    for event in ["api_key.create", "api_key.revoke"] {
        assert!(
            lines
                .lines()
                .any(|l| l.contains(event) && l.contains("\"ops\"")),
            "{event} not audited: {lines}"
        );
    }
}
