//! Per-database permissions, walked over every operation of `docs/openapi.yaml`.
//!
//! Each operation there says what it needs (`x-kiln-permission`); the server's own
//! table (`kiln_server::route_permissions`, the rules declared with the routes)
//! must say the same, operation for operation, in both directions. Then every
//! operation is sent with a key of each clearance (operator; admin, read_write
//! and read of `shop`; admin of `other-*` only) and without a key: an answer is
//! 403 `forbidden` naming the missing permission exactly when the table says the
//! key falls short, and a refused request changes nothing (the database's
//! documents, last etag, indexes, subscriptions, revisions configuration and the
//! database list are compared before and after each). The audit log holds one
//! `access.denied` line per refusal, and the audited operations that were let
//! through.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::Harness;
use kiln_server::access::{Clearance, DbGrant};
use kiln_server::auth;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// (path as documented, method) -> permission, from `docs/openapi.yaml`.
fn documented_permissions() -> BTreeMap<(String, String), String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.yaml");
    let yaml = std::fs::read_to_string(path).unwrap();
    let mut out = BTreeMap::new();
    let (mut in_paths, mut route, mut method) = (false, String::new(), String::new());
    for line in yaml.lines() {
        if line == "paths:" {
            in_paths = true;
            continue;
        }
        if in_paths && !line.is_empty() && !line.starts_with(' ') {
            break;
        }
        if !in_paths {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if indent == 2 && text.starts_with('/') && text.ends_with(':') {
            route = text.trim_end_matches(':').to_string();
        } else if indent == 4 && text.ends_with(':') {
            method = text.trim_end_matches(':').to_uppercase();
        } else if indent == 6 {
            if let Some(need) = text.strip_prefix("x-kiln-permission:") {
                let prior = out.insert((route.clone(), method.clone()), need.trim().to_string());
                assert!(prior.is_none(), "{route} {method}: two x-kiln-permission");
            }
        }
    }
    out
}

/// The server's route template as the OpenAPI document spells it.
fn documented_path(server_path: &str) -> String {
    server_path.replace("{*", "{")
}

#[test]
fn the_server_and_the_openapi_document_declare_the_same_permissions() {
    let documented = documented_permissions();
    assert!(
        documented.len() > 40,
        "only {} operations read",
        documented.len()
    );
    let mut declared = BTreeMap::new();
    for r in kiln_server::route_permissions() {
        declared.insert(
            (documented_path(r.path), r.rule.method.to_string()),
            r.rule.need.as_str().to_string(),
        );
    }
    for ((path, method), need) in &declared {
        // An attachment shares the document route; both are documented.
        assert_eq!(
            documented.get(&(path.clone(), method.clone())),
            Some(need),
            "{method} {path}: the server needs {need}; docs/openapi.yaml must say so (x-kiln-permission)"
        );
    }
    for ((path, method), need) in &documented {
        let server_path = if path.contains("/attachments/{name}") {
            "/dbs/{db}/docs/{id}".to_string()
        } else {
            path.clone()
        };
        assert_eq!(
            declared.get(&(server_path, method.clone())),
            Some(need),
            "{method} {path} is documented as {need}, the server declares otherwise"
        );
    }
}

struct Keys {
    operator: String,
    shop_admin: String,
    shop_read_write: String,
    shop_read: String,
    other_admin: String,
}

fn make_keys(dir: &std::path::Path) -> Keys {
    let grants = |list: &[&str]| {
        Clearance::Databases(list.iter().map(|g| DbGrant::parse(g).unwrap()).collect())
    };
    let key = |name: &str, c: Clearance| auth::create_api_key(dir, name, c).unwrap().1;
    Keys {
        operator: key("ops", Clearance::Operator),
        shop_admin: key("shop admin", grants(&["shop:admin"])),
        shop_read_write: key("shop app", grants(&["shop:read_write", "other-*:read"])),
        shop_read: key("shop reports", grants(&["shop:read"])),
        other_admin: key("other admin", grants(&["other-*:admin"])),
    }
}

/// What a refused request must leave as it was.
async fn fingerprint(h: &Harness, operator: &str) -> Value {
    let get = |path: &str| {
        let req = h.http.get(h.url(path)).bearer_auth(operator);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (_, db) = get("/dbs/shop").await;
    let (_, dbs) = get("/dbs").await;
    let (_, indexes) = get("/dbs/shop/indexes").await;
    let (_, subs) = get("/dbs/shop/subscriptions").await;
    let (_, revisions) = get("/dbs/shop/revisions/config").await;
    let (_, doc) = get("/dbs/shop/docs/users/1").await;
    let names = |v: &Value, field: &str| -> Vec<Value> {
        v.as_array()
            .or_else(|| v.get(field).and_then(Value::as_array))
            .map(|a| a.iter().map(|i| i["name"].clone()).collect())
            .unwrap_or_default()
    };
    json!({
        "documents": db["documents"], "last_etag": db["last_etag"],
        "collections": db["collections"], "dbs": dbs,
        "indexes": names(&indexes, "indexes"),
        "subscriptions": names(&subs, "subscriptions"),
        "revisions": revisions, "doc": doc,
    })
}

fn concrete(path: &str) -> String {
    path.replace("{db}", "shop")
        .replace("{id}/attachments/{name}", "users/1/attachments/a.txt")
        .replace("/cluster/members/{id}", "/cluster/members/2")
        .replace("/admin/api-keys/{id}", "/admin/api-keys/0000ffff")
        .replace("{id}", "users/1")
        .replace("{hash}", &"0".repeat(64))
        .replace("/indexes/{name}", "/indexes/by-name")
        .replace("/subscriptions/{name}", "/subscriptions/sub1")
        .replace("{collection}", "users")
}

fn allowed(need: &str, key: &str, keys: &Keys) -> bool {
    let rank = |k: &str| -> u8 {
        if k == keys.operator {
            4
        } else if k == keys.shop_admin {
            3
        } else if k == keys.shop_read_write {
            2
        } else if k == keys.shop_read {
            1
        } else {
            0
        }
    };
    match need {
        "authenticated" => true,
        "operator" => rank(key) == 4,
        "admin" => rank(key) >= 3,
        "read_write" => rank(key) >= 2,
        "read" => rank(key) >= 1,
        other => panic!("unknown permission {other}"),
    }
}

async fn send(h: &Harness, method: &str, path: &str, key: Option<&str>) -> (u16, Value) {
    let url = h.url(&concrete(path));
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = h.http.request(m, url);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    req = match method {
        "PATCH" => req
            .header("content-type", "application/merge-patch+json")
            .body("{}"),
        "PUT" | "POST" => req.header("content-type", "application/json").body("{}"),
        _ => req,
    };
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json::<Value>().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_with_every_clearance() {
    let dir = tempfile::tempdir().unwrap();
    let keys = make_keys(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let audit_path = audit.clone();
    let h = Harness::start_in(dir, |c| {
        c.require_auth = true;
        c.audit_log = Some(audit_path);
    })
    .await;
    let op = keys.operator.clone();
    let setup = [
        ("PUT", "/dbs/shop", json!(null)),
        ("PUT", "/dbs/other-1", json!(null)),
        ("PUT", "/dbs/shop/docs/users/1", json!({"name": "ada"})),
        (
            "PUT",
            "/dbs/shop/indexes/by-name",
            json!({"collection": "users", "fields": ["name"]}),
        ),
        (
            "POST",
            "/dbs/shop/subscriptions",
            json!({"name": "sub1", "query": "from users"}),
        ),
    ];
    for (method, path, body) in setup {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = h.http.request(m, h.url(path)).bearer_auth(&op);
        if !body.is_null() {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        assert!(
            r.status().is_success(),
            "{method} {path}: {}",
            r.text().await.unwrap()
        );
    }

    // What each caller sees of the database list.
    let list = |key: &str| {
        let req = h.http.get(h.url("/dbs")).bearer_auth(key);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap()["databases"].clone() }
    };
    assert_eq!(list(&keys.operator).await, json!(["other-1", "shop"]));
    assert_eq!(list(&keys.shop_read).await, json!(["shop"]));
    assert_eq!(
        list(&keys.shop_read_write).await,
        json!(["other-1", "shop"])
    );
    assert_eq!(list(&keys.other_admin).await, json!(["other-1"]));

    let ops = documented_permissions();
    let callers = [
        &keys.shop_read,
        &keys.other_admin,
        &keys.shop_read_write,
        &keys.shop_admin,
    ];
    let mut denied = 0;
    let mut let_through = 0;
    // Refusals first, on a database in a known state; each one is checked to
    // change nothing.
    for ((path, method), need) in &ops {
        let (status, body) = send(&h, method, path, None).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("unauthorized")),
            "{method} {path} without a key"
        );
        for key in callers {
            if allowed(need, key, &keys) {
                continue;
            }
            let before = fingerprint(&h, &op).await;
            let (status, body) = send(&h, method, path, Some(key)).await;
            assert_eq!(status, 403, "{method} {path} needs {need}: {body}");
            assert_eq!(body["error"], "forbidden", "{method} {path}: {body}");
            let message = body["message"].as_str().unwrap();
            assert!(
                message.contains(need.as_str()),
                "{method} {path}: {message:?} does not name {need}"
            );
            assert_eq!(
                fingerprint(&h, &op).await,
                before,
                "{method} {path} refused, yet something changed"
            );
            denied += 1;
        }
    }
    // Then what each caller may do is let through (its answer depends on the
    // body and the state: never 401 or 403). Destructive operations go last.
    let mut allowed_ops: Vec<_> = ops.iter().collect();
    allowed_ops.sort_by_key(|((path, method), _)| {
        (
            method == "DELETE" && path == "/dbs/{db}",
            method == "DELETE",
        )
    });
    for key in callers.iter().chain([&&keys.operator]) {
        for ((path, method), need) in &allowed_ops {
            if !allowed(need, key, &keys) || (method == "DELETE" && path == "/dbs/{db}") {
                continue;
            }
            let (status, body) = send(&h, method, path, Some(key)).await;
            assert!(
                status != 401 && status != 403,
                "{method} {path} ({need}) refused: {status} {body}"
            );
            let_through += 1;
        }
    }
    let (status, body) = send(&h, "DELETE", "/dbs/{db}", Some(&keys.shop_admin)).await;
    assert_eq!(status, 200, "an admin of shop deletes it: {body}");
    assert!(
        denied > 60 && let_through > 100,
        "{denied} refused, {let_through} let through"
    );

    // The audit log: a line per refusal with who, and the audited operations.
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |event: &str| lines.iter().filter(|l| l["event"] == event).count();
    assert_eq!(
        count("access.denied"),
        denied,
        "one access.denied line per refusal"
    );
    assert_eq!(count("authentication.failed"), ops.len());
    let refusal = lines
        .iter()
        .find(|l| l["event"] == "access.denied")
        .unwrap();
    assert!(
        refusal["who"]["key_id"].is_string() && refusal["request_id"].is_string(),
        "{refusal}"
    );
    assert_eq!(refusal["outcome"], "refused");
    let deleted = lines
        .iter()
        .find(|l| l["event"] == "database.delete" && l["outcome"] == "done")
        .unwrap();
    assert_eq!(deleted["who"]["name"], "shop admin");
    assert_eq!(deleted["database"], "shop");
    assert_eq!(deleted["status"], 200);
    assert!(
        count("database.create") >= 2 && count("backup") >= 2,
        "{lines:?}"
    );
    h.shutdown().await;
}
