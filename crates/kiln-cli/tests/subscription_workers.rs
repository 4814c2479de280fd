//! Data subscriptions against a real `kiln serve`: the routes' answers and errors,
//! the cursor that moves only on an acknowledgment, one worker at a time (a second
//! waits and gets nothing meanwhile, then gets the unacknowledged batch again when
//! the first goes), take-over, live delivery, and no document skipped.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::subscription_worker::{documents, sequence, Said, Worker};
use common::{free_port, request, spawn_serve_with};
use serde_json::Value;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn position(port: u16) -> Value {
    let (status, body) = request(port, "GET", "/dbs/shop/subscriptions/orders", "");
    assert_eq!(status, 200, "{body}");
    json(&body)["position"].clone()
}

#[test]
fn workers_get_batches_in_etag_order_and_the_cursor_moves_only_on_an_ack() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = spawn_serve_with(dir.path(), port, &["--changes-heartbeat-ms", "200"]);
    assert_eq!(request(port, "PUT", "/dbs/shop", "").0, 201);
    let mut etags = Vec::new();
    for i in 0..30 {
        let (status, body) = request(
            port,
            "PUT",
            &format!("/dbs/shop/docs/orders/{i:02}"),
            &format!(r#"{{"n": {i}}}"#),
        );
        assert_eq!(status, 201, "{body}");
        etags.push(json(&body)["etag"].as_str().unwrap().to_string());
        // Documents of another collection and ones the filter refuses.
        request(port, "PUT", &format!("/dbs/shop/docs/users/{i}"), "{}");
        request(
            port,
            "PUT",
            &format!("/dbs/shop/docs/orders/x{i:02}"),
            r#"{"n": -1}"#,
        );
    }
    let create =
        r#"{"name": "orders", "query": "from orders where n >= $min", "parameters": {"min": 0}}"#;
    let (status, body) = request(port, "POST", "/dbs/shop/subscriptions", create);
    assert_eq!(status, 201, "{body}");
    assert_eq!(json(&body)["collection"], "orders");
    assert_eq!(json(&body)["position"], Value::Null);

    // Errors.
    let (status, body) = request(port, "POST", "/dbs/shop/subscriptions", create);
    assert_eq!(
        (status, json(&body)["error"].clone()),
        (409, "subscription_exists".into())
    );
    for (bad, code) in [
        (
            r#"{"name": "a b", "query": "from orders"}"#,
            "invalid_subscription",
        ),
        (
            r#"{"name": "q", "query": "from orders where"}"#,
            "invalid_query",
        ),
        (
            r#"{"name": "q", "query": "from orders order by n"}"#,
            "invalid_query",
        ),
        (
            r#"{"name": "q", "query": "from orders", "start": "x"}"#,
            "invalid_subscription",
        ),
        (r#"{"name": "q"}"#, "malformed_json"),
    ] {
        let (status, body) = request(port, "POST", "/dbs/shop/subscriptions", bad);
        assert_eq!(
            (status, json(&body)["error"].clone()),
            (400, code.into()),
            "{bad}"
        );
    }
    let (status, body) = request(port, "GET", "/dbs/shop/subscriptions/nope", "");
    assert_eq!(
        (status, json(&body)["error"].clone()),
        (404, "subscription_not_found".into())
    );
    assert_eq!(
        Worker::connect(port, "shop", "nope", "").err().map(|e| e.0),
        Some(404)
    );
    assert_eq!(
        Worker::connect(port, "shop", "orders", "batch_size=0")
            .err()
            .map(|e| e.0),
        Some(400)
    );

    // The first worker gets batch 1 and does not acknowledge it yet.
    let mut a = Worker::connect(port, "shop", "orders", "batch_size=10").unwrap();
    a.expect("subscribed", WAIT);
    let b1 = a.expect("batch", WAIT);
    let first: Vec<_> = documents(&b1);
    assert_eq!(first.len(), 10);
    assert_eq!(first[0], ("orders/00".to_string(), etags[0].clone()));
    assert_eq!(position(port), Value::Null, "no ack, no move");
    // A second worker waits, and gets nothing while the first holds it.
    let mut b = Worker::connect(port, "shop", "orders", "batch_size=10").unwrap();
    b.expect("waiting", WAIT);
    assert!(
        matches!(b.next(Duration::from_millis(300)), Said::Nothing),
        "a second worker got something while the first held the subscription"
    );
    assert_eq!(
        Worker::connect(port, "shop", "orders", "strategy=if_free")
            .err()
            .map(|e| e.0),
        Some(409),
        "if_free while held (refused before the upgrade)"
    );
    let listed = json(&request(port, "GET", "/dbs/shop/subscriptions", "").1);
    assert_eq!(listed["subscriptions"][0]["connected"], true);
    assert_eq!(position(port), Value::Null, "still no ack, no move");

    a.ack(1).unwrap();
    let acked = a.expect("acknowledged", WAIT);
    assert_eq!(acked["position"], etags[9].as_str());
    assert_eq!(position(port), etags[9].as_str());
    let b2 = a.expect("batch", WAIT);
    let second = documents(&b2);
    assert_eq!(second[0].0, "orders/10");
    // The first worker dies before acknowledging batch 2: the second gets it again.
    drop(a);
    b.expect("subscribed", WAIT);
    let again = b.expect("batch", WAIT);
    assert_eq!(documents(&again), second, "the unacknowledged batch, again");
    let mut seen: Vec<(String, String)> = first.clone();
    let mut batch = again;
    loop {
        let docs = documents(&batch);
        seen.extend(docs);
        b.ack(batch["batch"].as_u64().unwrap()).unwrap();
        b.expect("acknowledged", WAIT);
        match b.next(Duration::from_millis(300)) {
            Said::Json(v) if v["type"] == "batch" => batch = v,
            Said::Nothing => break,
            other => panic!("{other:?}"),
        }
    }
    let want: Vec<(String, String)> = (0..30)
        .map(|i| (format!("orders/{i:02}"), etags[i].clone()))
        .collect();
    assert_eq!(seen, want, "every matching document once, in etag order");
    assert!(seen
        .windows(2)
        .all(|w| sequence(&w[0].1) < sequence(&w[1].1)));

    // A live write reaches the idle worker.
    let (_, body) = request(port, "PUT", "/dbs/shop/docs/orders/live", r#"{"n": 99}"#);
    let live_etag = json(&body)["etag"].as_str().unwrap().to_string();
    let live = b.expect("batch", WAIT);
    assert_eq!(documents(&live), [("orders/live".to_string(), live_etag)]);

    // Take-over: the holder is closed with 4009, and its late ack moves nothing.
    let before = position(port);
    let mut c = Worker::connect(port, "shop", "orders", "strategy=take_over").unwrap();
    c.expect("subscribed", WAIT);
    let _ = b.ack(live["batch"].as_u64().unwrap());
    match b.next(WAIT) {
        Said::Closed(code, _) => assert_eq!(code, 4009),
        other => panic!("the taken-over worker got {other:?}"),
    }
    assert_eq!(
        position(port),
        before,
        "a taken-over worker's ack moved the cursor"
    );
    let redelivered = c.expect("batch", WAIT);
    assert_eq!(documents(&redelivered)[0].0, "orders/live");

    // Deleting closes the holder with 4004.
    let (status, _) = request(port, "DELETE", "/dbs/shop/subscriptions/orders", "");
    assert_eq!(status, 200);
    match c.next(WAIT) {
        Said::Closed(code, _) => assert_eq!(code, 4004),
        other => panic!("the deleted subscription's worker got {other:?}"),
    }
    let (status, _) = request(port, "DELETE", "/dbs/shop/subscriptions/orders", "");
    assert_eq!(status, 404);
    server.kill().unwrap();
    server.wait().unwrap();
}
