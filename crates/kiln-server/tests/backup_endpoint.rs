//! `GET /dbs/{db}/backup`: authenticated, streams a backup that verifies, and a
//! client that disconnects stops it (the database is released at once).

mod common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_requires_auth_streams_and_stops_when_the_client_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (_record, key) = kiln_server::auth::create_api_key(dir.path(), "test").unwrap();
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
