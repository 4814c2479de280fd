//! `GET /dbs/{db}/backup`: authenticated, streams a backup that verifies, and a
//! client that disconnects stops it (the database is released at once).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_requires_auth_streams_and_stops_when_the_client_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (_record, key) = kiln_server::auth::create_api_key(
        dir.path(),
        "test",
        kiln_server::access::Clearance::Operator,
    )
    .unwrap();
    let h = Harness::start_in(dir, |c| {
        c.require_auth = true;
        c.docs.delete_wait_ms = 300;
    })
    .await;
    let r = h
        .http
        .put(h.url("/dbs/shop"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    // ~64 MB of poorly compressible documents: more than the channel and the socket
    // buffers hold, so the backup is still running when the client goes away.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for batch in 0..8 {
        let ops: Vec<_> = (0..1000)
            .map(|i| {
                let blob: String = (0..1000)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        format!("{:08x}", x as u32)
                    })
                    .collect();
                json!({"op": "put", "id": format!("d/{batch}/{i}"), "document": {"blob": blob}})
            })
            .collect();
        let r = h
            .http
            .post(h.url("/dbs/shop/batch"))
            .bearer_auth(&key)
            .json(&json!({ "ops": ops }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }

    let r = h.http.get(h.url("/dbs/shop/backup")).send().await.unwrap();
    expect_error(r, 401, "unauthorized").await;
    let r = h
        .http
        .get(h.url("/dbs/nope/backup"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    expect_error(r, 404, "database_not_found").await;

    let r = h
        .http
        .get(h.url("/dbs/shop/backup"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.bytes().await.unwrap();
    let report = kiln_docs::verify_backup(&body[..], |_| {}).unwrap();
    assert_eq!(report.manifest.database, "shop");
    assert_eq!(report.manifest.documents, 8000);
    assert!(report.manifest.etag.is_some());
    assert!(body.len() > 32 << 20, "{} bytes", body.len());

    // A client that reads a little and disconnects.
    let mut r = h
        .http
        .get(h.url("/dbs/shop/backup"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!(r.chunk().await.unwrap().is_some());
    // While the client holds the answer unread, the backup waits on the bounded
    // channel with its snapshot open: the database is in use.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = h
        .http
        .delete(h.url("/dbs/shop"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    expect_error(busy, 503, "database_busy").await;
    drop(r);
    // The backup stopped and released the database: deleting it does not wait.
    let t = Instant::now();
    let r = h
        .http
        .delete(h.url("/dbs/shop"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

async fn get_bytes(h: &Harness, path: &str) -> Vec<u8> {
    let r = h.http.get(h.url(path)).send().await.unwrap();
    let status = r.status();
    let body = r.bytes().await.unwrap().to_vec();
    assert_eq!(
        status.as_u16(),
        200,
        "{path}: {}",
        String::from_utf8_lossy(&body)
    );
    body
}

fn since_query(prev: &[u8]) -> String {
    let m = kiln_docs::read_manifest(prev).unwrap();
    format!(
        "?since_chain={}&since_backup={}&since_etag={}",
        m.chain_id.unwrap(),
        m.backup_id.unwrap(),
        m.etag.unwrap_or_default()
    )
}

async fn restore(h: &Harness, db: &str, query: &str, body: Vec<u8>) -> reqwest::Response {
    h.http
        .post(h.url(&format!("/dbs/{db}/restore{query}")))
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Every document of `db` with its etag, by id.
async fn docs(h: &Harness, db: &str, ids: &[String]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for id in ids {
        let r = h.get(db, id).await;
        let e = (r.status().as_u16() == 200).then(|| etag_of(&r));
        out.push((id.clone(), e));
    }
    out
}

/// Incremental backups through the API, then restores of the chain as new
/// databases of the same running server: up to the end, up to a point, refused
/// when it exists (unless forced), when damaged, when a link is missing; the
/// chain can be stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increments_and_restore_into_the_running_server() {
    let h = Harness::start().await;
    h.create_db("shop").await;
    let ids: Vec<String> = (0..30).map(|i| format!("p/{i}")).collect();
    for id in &ids[..20] {
        h.put_ok("shop", id, &json!({"v": 1})).await;
    }
    let full = get_bytes(&h, "/dbs/shop/backup?chain=true").await;
    for id in &ids[10..25] {
        h.put_ok("shop", id, &json!({"v": 2})).await;
    }
    h.delete_ok("shop", &ids[0]).await;
    let inc1 = get_bytes(&h, &format!("/dbs/shop/backup{}", since_query(&full))).await;
    let at_inc1 = docs(&h, "shop", &ids).await;
    for id in &ids[20..30] {
        h.put_ok("shop", id, &json!({"v": 3})).await;
    }
    h.delete_ok("shop", &ids[1]).await;
    let inc2 = get_bytes(&h, &format!("/dbs/shop/backup{}", since_query(&inc1))).await;
    let at_inc2 = docs(&h, "shop", &ids).await;

    let (status, text) = h.get_text("/dbs/shop").await;
    assert_eq!(status.as_u16(), 200);
    let stats: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        stats["backup_chain"]["history_entries"].as_u64().unwrap() > 0,
        "{stats}"
    );
    let (_, text) = h.get_text("/dbs/shop/backup/chain").await;
    assert!(text.contains("\"active\":true"), "{text}");

    // The whole chain as a new database.
    let all = [full.clone(), inc1.clone(), inc2.clone()].concat();
    let r = restore(&h, "copy", "", all.clone()).await;
    assert_eq!(r.status().as_u16(), 201);
    let report: serde_json::Value = r.json().await.unwrap();
    let end2 = kiln_docs::read_manifest(&inc2[..]).unwrap().etag;
    assert_eq!(
        report["reached"]["etag"].as_str(),
        end2.as_deref(),
        "{report}"
    );
    assert_eq!(report["backups"].as_array().unwrap().len(), 3);
    assert_eq!(docs(&h, "copy", &ids).await, at_inc2);
    // It is a live database: it takes writes.
    h.put_ok("copy", "new", &json!({"x": 1})).await;

    // Exists: refused unless forced; forced, up to the end of the first increment.
    let r = restore(&h, "copy", "", all.clone()).await;
    expect_error(r, 409, "database_exists").await;
    let end1 = kiln_docs::read_manifest(&inc1[..]).unwrap().etag.unwrap();
    let r = restore(
        &h,
        "copy",
        &format!("?force=true&until=etag:{end1}"),
        all.clone(),
    )
    .await;
    let status = r.status().as_u16();
    let report: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{report}");
    assert_eq!(report["reached"]["etag"].as_str(), Some(end1.as_str()));
    assert_eq!(docs(&h, "copy", &ids).await, at_inc1);
    assert_eq!(h.get("copy", "new").await.status().as_u16(), 404);

    // Damaged, a gap, a bad point: refused, and no database is left.
    let mut bad = all.clone();
    let at = full.len() + inc1.len() / 2;
    bad[at] ^= 0x01;
    let r = restore(&h, "bad", "", bad).await;
    let e = expect_error(r, 400, "backup_invalid").await;
    assert!(e["message"].as_str().unwrap().contains("input 2"), "{e}");
    let r = restore(&h, "bad", "", [full.clone(), inc2.clone()].concat()).await;
    let e = expect_error(r, 400, "backup_chain_broken").await;
    assert!(e["message"].as_str().unwrap().contains("gap"), "{e}");
    let r = restore(&h, "bad", "", all[..all.len() - 3].to_vec()).await;
    expect_error(r, 400, "backup_invalid").await;
    let r = restore(&h, "bad", "?until=never", all.clone()).await;
    expect_error(r, 400, "invalid_restore_point").await;
    assert_eq!(h.get_text("/dbs/bad").await.0.as_u16(), 404);
    let trash: Vec<_> = std::fs::read_dir(h.data_dir().join("trash"))
        .unwrap()
        .collect();
    assert!(trash.is_empty(), "{trash:?}");

    // Stopping the chain: increments are refused after it.
    let r = h
        .http
        .delete(h.url("/dbs/shop/backup/chain"))
        .send()
        .await
        .unwrap();
    assert!(r.text().await.unwrap().contains("\"stopped\":true"));
    let r = h
        .http
        .get(h.url(&format!("/dbs/shop/backup{}", since_query(&inc2))))
        .send()
        .await
        .unwrap();
    expect_error(r, 409, "increment_not_possible").await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_endpoint_requires_auth() {
    let dir = tempfile::tempdir().unwrap();
    let (_record, key) = kiln_server::auth::create_api_key(
        dir.path(),
        "test",
        kiln_server::access::Clearance::Operator,
    )
    .unwrap();
    let h = Harness::start_in(dir, |c| c.require_auth = true).await;
    let r = restore(&h, "x", "", b"KILNBAK".to_vec()).await;
    expect_error(r, 401, "unauthorized").await;
    let r = h
        .http
        .delete(h.url("/dbs/x/backup/chain"))
        .send()
        .await
        .unwrap();
    expect_error(r, 401, "unauthorized").await;
    let r = h
        .http
        .post(h.url("/dbs/x/restore"))
        .bearer_auth(&key)
        .body(b"KILNBAK".to_vec())
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "backup_invalid").await;
}
