//! A browser cannot set headers on a WebSocket, and an API key must never travel in a
//! URL. Under --auth, a changes WebSocket upgrade may offer the key as the subprotocol
//! `kiln.key.<key>` beside `kiln.changes.v1`; the server selects `kiln.changes.v1` and
//! never echoes the key. Anything else is refused with 401.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::Harness;
use futures_util::{SinkExt, StreamExt};
use kiln_server::auth;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

fn upgrade(
    h: &Harness,
    protocols: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut req = format!("ws://{}/dbs/feed/changes/ws", h.addr)
        .into_client_request()
        .unwrap();
    if !protocols.is_empty() {
        req.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_str(protocols).unwrap(),
        );
    }
    req
}

fn refused_with(e: tokio_tungstenite::tungstenite::Error) -> u16 {
    match e {
        tokio_tungstenite::tungstenite::Error::Http(r) => r.status().as_u16(),
        other => panic!("expected an HTTP refusal, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_key_in_subprotocol_authenticates() {
    let dir = tempfile::tempdir().unwrap();
    let (_, key) = auth::create_api_key(
        dir.path(),
        "browser",
        kiln_server::access::Clearance::Operator,
    )
    .unwrap();
    let h = Harness::start_in(dir, |c| c.require_auth = true).await;
    let r = h
        .http
        .put(h.url("/dbs/feed"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    // No key, a wrong key, the key under another name: 401 before any upgrade.
    for protocols in [
        "",
        "kiln.changes.v1",
        "kiln.changes.v1, kiln.key.kiln_00000000_00",
        &format!("kiln.changes.v1, kiln.token.{key}"),
    ] {
        let e = tokio_tungstenite::connect_async(upgrade(&h, protocols))
            .await
            .expect_err(protocols);
        assert_eq!(refused_with(e), 401, "{protocols}");
    }

    // The key as a subprotocol: upgraded, and only kiln.changes.v1 comes back.
    let (mut ws, resp) =
        tokio_tungstenite::connect_async(upgrade(&h, &format!("kiln.changes.v1, kiln.key.{key}")))
            .await
            .expect("the upgrade is authenticated");
    let chosen = resp.headers()["sec-websocket-protocol"].to_str().unwrap();
    assert_eq!(chosen, "kiln.changes.v1");
    for (name, value) in resp.headers() {
        assert!(
            !value.to_str().unwrap_or("").contains(&key),
            "the key came back in {name}"
        );
    }
    ws.send(Message::text(r#"{"op":"subscribe","sub":"s"}"#))
        .await
        .unwrap();
    let r = h
        .http
        .put(h.doc_url("feed", "notes/1"))
        .bearer_auth(&key)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("a change within 10 s")
            .expect("the socket stays open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            if v["type"] == "change" {
                assert_eq!(v["id"], "notes/1");
                break;
            }
        }
    }

    // The subprotocol is no key for a plain request.
    let r = h
        .http
        .get(h.url("/dbs"))
        .header("sec-websocket-protocol", format!("kiln.key.{key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}
