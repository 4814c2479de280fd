//! The changes feed end to end, over a real HTTP client and real WebSockets:
//! - `GET /changes` under concurrent writers: etag order, each id once with its final
//!   state, nothing invented; paging with a small limit;
//! - long polls (wake on a matching write, time out empty) and the filters;
//! - WebSocket subscriptions: backlog + live meet at the seam with nothing missed and
//!   nothing twice, resume from the last etag seen, several filtered subscriptions on
//!   one connection, unsubscribe;
//! - heartbeats on a paused tokio clock (virtual spacing, little real time);
//! - a reader that never reads is closed 4008 with a resume etag, the server and
//!   the other subscribers carry on, and /metrics counts it;
//! - tombstones in the feed, rewriting a deleted id, purging below an etag;
//! - bad input: malformed etag, etag of a recreated database, unknown database, bad
//!   WebSocket messages (an error frame, the connection survives).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{expect_error, metric, seq_of, Harness};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn ws_connect(h: &Harness, db: &str) -> Ws {
    let (ws, resp) =
        tokio_tungstenite::connect_async(format!("ws://{}/dbs/{db}/changes/ws", h.addr))
            .await
            .expect("the WebSocket upgrade succeeds");
    assert_eq!(resp.status().as_u16(), 101);
    ws
}

async fn ws_send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// The next JSON text frame (pings/pongs skipped); panics on a close, an error or
/// nothing within `limit`.
async fn ws_next(ws: &mut Ws, limit: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no frame within {limit:?}"));
        match msg {
            Some(Ok(Message::Text(t))) => {
                return serde_json::from_str(t.as_str()).unwrap_or_else(|e| panic!("{e}: {t}"))
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// The next frame that is not a heartbeat.
async fn ws_next_event(ws: &mut Ws, limit: Duration) -> Value {
    loop {
        let v = ws_next(ws, limit).await;
        if v["type"] != "heartbeat" {
            return v;
        }
    }
}

/// Subscribes and checks the `subscribed` answer; returns it.
async fn subscribe(ws: &mut Ws, msg: Value) -> Value {
    let sub = msg["sub"].clone();
    ws_send(ws, msg).await;
    let v = ws_next_event(ws, Duration::from_secs(5)).await;
    assert_eq!(v["type"], "subscribed", "{v}");
    assert_eq!(v["sub"], sub, "{v}");
    assert!(v["last_etag"].is_string(), "{v}");
    v
}

/// A deterministic pseudo-random step (no rand dependency in the tests).
fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

/// One acknowledged write: its etag and whether it was a delete (tombstone etag).
#[derive(Debug, Clone)]
struct Acked {
    id: String,
    etag: String,
    delete: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_feed_is_in_etag_order_once_per_id_with_final_state() {
    let h = Arc::new(Harness::start().await);
    h.create_db("feed").await;
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = t * 7919 + 17;
            let mut acked = Vec::new();
            let mut refused_deletes = 0;
            for i in 0..45 {
                let r = lcg(&mut rng);
                let id = format!(
                    "{}/{}",
                    if r.is_multiple_of(2) { "a" } else { "b" },
                    (r >> 3) % 24
                );
                if (r >> 10).is_multiple_of(4) {
                    let resp = h.http.delete(h.doc_url("feed", &id)).send().await.unwrap();
                    match resp.status().as_u16() {
                        200 => {
                            let v: Value = resp.json().await.unwrap();
                            assert_eq!(v["id"], id.as_str());
                            let tomb = v["etag"].as_str().unwrap().to_string();
                            let deleted = v["deleted_etag"].as_str().unwrap();
                            assert!(seq_of(&tomb) > seq_of(deleted), "{v}");
                            acked.push(Acked {
                                id,
                                etag: tomb,
                                delete: true,
                            });
                        }
                        404 => {
                            expect_error(resp, 404, "document_not_found").await;
                            refused_deletes += 1;
                        }
                        s => panic!("DELETE {id}: {s} {}", resp.text().await.unwrap()),
                    }
                } else {
                    let etag = h.put_ok("feed", &id, &json!({"t": t, "i": i})).await;
                    acked.push(Acked {
                        id,
                        etag,
                        delete: false,
                    });
                }
            }
            (acked, refused_deletes)
        }));
    }
    // Ids that were only ever deleted-when-absent must not show up: "never/…" are
    // deleted (404) and never written.
    for i in 0..5 {
        let resp = h
            .http
            .delete(h.doc_url("feed", &format!("never/{i}")))
            .send()
            .await
            .unwrap();
        expect_error(resp, 404, "document_not_found").await;
    }
    let mut all: Vec<Acked> = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap().0);
    }
    assert!(all.len() >= 300, "only {} writes were acked", all.len());
    assert!(all.iter().any(|a| a.delete), "no delete was acked");
    // The last acked write of each id is the one with the highest etag.
    let mut last: HashMap<String, Acked> = HashMap::new();
    let mut seen_etags = HashSet::new();
    for a in &all {
        assert!(
            seen_etags.insert(a.etag.clone()),
            "etag {} acked twice",
            a.etag
        );
        let e = last.entry(a.id.clone()).or_insert_with(|| a.clone());
        if seq_of(&a.etag) > seq_of(&e.etag) {
            *e = a.clone();
        }
    }
    let max_seq = all.iter().map(|a| seq_of(&a.etag)).max().unwrap();

    for limit in [7, 1000] {
        let (entries, last_etag) = h.all_changes("feed", "", limit, "").await;
        assert_eq!(seq_of(&last_etag), max_seq, "limit {limit}");
        let mut prev = 0;
        let mut ids = HashSet::new();
        for e in &entries {
            let id = e["id"].as_str().unwrap();
            let seq = seq_of(e["etag"].as_str().unwrap());
            assert!(
                seq > prev,
                "etags not strictly increasing at {e} (limit {limit})"
            );
            prev = seq;
            assert!(
                ids.insert(id.to_string()),
                "{id} twice in the feed (limit {limit})"
            );
            let want = last
                .get(id)
                .unwrap_or_else(|| panic!("{id} in the feed but never written: {e}"));
            assert_eq!(e["etag"], want.etag.as_str(), "{id}: not its last write");
            let kind = if want.delete { "delete" } else { "put" };
            assert_eq!(e["change"], kind, "{id}: {e}");
            assert_eq!(e["collection"], &id[..1], "{e}");
            assert!(
                e.get("document").is_none(),
                "no include_docs, no document: {e}"
            );
        }
        assert_eq!(
            ids.len(),
            last.len(),
            "ids missing from the feed (limit {limit}): {:?}",
            last.keys()
                .filter(|k| !ids.contains(*k))
                .collect::<Vec<_>>()
        );
    }
    // The stored documents agree with the feed's final state.
    for (id, a) in &last {
        let r = h.get("feed", id).await;
        if a.delete {
            assert_eq!(r.status().as_u16(), 404, "{id} was deleted last");
        } else {
            assert_eq!(crate::common::etag_of(&r), a.etag, "{id}");
        }
    }
    Arc::try_unwrap(h).ok().unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_a_matching_write_and_times_out_empty_and_filters_apply() {
    let h = Arc::new(Harness::start().await);
    h.create_db("poll").await;
    let e0 = h.put_ok("poll", "users/ada", &json!({"name": "Ada"})).await;

    // Nothing new: an empty page after about wait_ms, last_etag unchanged.
    let t = std::time::Instant::now();
    let page = h.changes("poll", &format!("since={e0}&wait_ms=200")).await;
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(1500),
        "an empty 200 ms poll took {took:?}"
    );
    assert_eq!(page["results"], json!([]), "{page}");
    assert_eq!(page["last_etag"], e0.as_str());

    // A write during the wait ends it, well before wait_ms, with that change.
    let poll = {
        let h = h.clone();
        let e0 = e0.clone();
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let page = h.changes("poll", &format!("since={e0}&wait_ms=5000")).await;
            (page, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !poll.is_finished(),
        "the poll returned before anything was written"
    );
    let e1 = h.put_ok("poll", "users/bob", &json!({"name": "Bob"})).await;
    let (page, took) = poll.await.unwrap();
    assert!(
        took < Duration::from_millis(2500),
        "the poll took {took:?} to see a write"
    );
    assert_eq!(
        page["results"],
        json!([{"id": "users/bob", "etag": e1, "change": "put", "collection": "users"}])
    );
    assert_eq!(page["last_etag"], e1.as_str());

    // A filtered poll is not ended by a write it does not match, only by one it does.
    let poll = {
        let h = h.clone();
        let e1 = e1.clone();
        tokio::spawn(async move {
            h.changes(
                "poll",
                &format!("since={e1}&wait_ms=5000&collection=orders"),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.put_ok("poll", "users/cy", &json!({"name": "Cy"})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !poll.is_finished(),
        "a poll for collection=orders returned on a write to users: {:?}",
        poll.await.unwrap()
    );
    let e_order = h.put_ok("poll", "orders/1", &json!({"total": 3})).await;
    let page = tokio::time::timeout(Duration::from_secs(3), poll)
        .await
        .expect("the matching write ends the poll")
        .unwrap();
    assert_eq!(
        page["results"],
        json!([{"id": "orders/1", "etag": e_order, "change": "put", "collection": "orders"}])
    );

    // Filters without waiting. people/x is in collection users by its metadata but
    // outside the users/ prefix; misc/1 is in no listed collection.
    h.put_ok(
        "poll",
        "people/x",
        &json!({"name": "X", "@metadata": {"@collection": "users"}}),
    )
    .await;
    h.put_ok("poll", "misc/1", &json!({})).await;
    let del = h.delete_ok("poll", "users/cy").await;
    let ids = |page: &Value| -> Vec<String> {
        page["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    let p = h.changes("poll", "collection=users").await;
    assert_eq!(
        ids(&p),
        ["users/ada", "users/bob", "people/x", "users/cy"],
        "{p}"
    );
    let p = h.changes("poll", "prefix=users/").await;
    assert_eq!(ids(&p), ["users/ada", "users/bob", "users/cy"], "{p}");
    assert_eq!(p["results"][2]["change"], "delete");
    assert_eq!(p["results"][2]["etag"], del["etag"]);
    let p = h.changes("poll", "prefix=people/&collection=users").await;
    assert_eq!(ids(&p), ["people/x"], "{p}");
    let p = h.changes("poll", "id=orders/1").await;
    assert_eq!(ids(&p), ["orders/1"], "{p}");
    let p = h.changes("poll", "id=users/nobody").await;
    assert_eq!(ids(&p), Vec::<String>::new(), "{p}");
    let p = h.changes("poll", &format!("id=users/ada&since={e0}")).await;
    assert_eq!(
        ids(&p),
        Vec::<String>::new(),
        "id filter must respect since: {p}"
    );

    // include_docs: puts carry the document, deletes none.
    let p = h.changes("poll", "prefix=users/&include_docs=true").await;
    let r = p["results"].as_array().unwrap();
    assert_eq!(r.len(), 3, "{p}");
    assert_eq!(r[0]["document"]["name"], "Ada", "{p}");
    assert_eq!(r[1]["document"]["name"], "Bob", "{p}");
    assert_eq!(r[1]["document"]["@metadata"]["@etag"], e1.as_str(), "{p}");
    assert!(
        r[2].get("document").is_none(),
        "a delete has no document: {p}"
    );
    let p = h.changes("poll", "prefix=users/").await;
    assert!(p["results"][0].get("document").is_none(), "{p}");
    Arc::try_unwrap(h).ok().unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_backlog_and_live_meet_at_the_seam_and_resume_misses_nothing() {
    let h = Arc::new(Harness::start().await);
    h.create_db("ws").await;
    let ops: Vec<Value> = (0..200)
        .map(|i| json!({"op": "put", "id": format!("init/{i:03}"), "document": {"i": i}}))
        .collect();
    let r = h
        .http
        .post(h.url("/dbs/ws/batch"))
        .json(&json!({ "ops": ops }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let (initial, _) = h.all_changes("ws", "", 1000, "").await;
    assert_eq!(initial.len(), 200);
    let since = initial[99]["etag"].as_str().unwrap().to_string();
    let since_seq = seq_of(&since);

    // A writer writes continuously: new ids, and rewrites of ids before and after
    // `since` (which moves their entry in the log).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let h = h.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut acked: Vec<(String, String)> = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let id = if i.is_multiple_of(3) {
                    format!("init/{:03}", (i * 37) % 200)
                } else {
                    format!("live/{i}")
                };
                let etag = h.put_ok("ws", &id, &json!({"w": i})).await;
                acked.push((id, etag));
                i += 1;
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut ws = ws_connect(&h, "ws").await;
    subscribe(
        &mut ws,
        json!({"op": "subscribe", "sub": "all", "since": since}),
    )
    .await;
    let mut got: Vec<(String, String)> = Vec::new();
    let mut caught_up: Option<u64> = None;
    let mut live = 0;
    let started = std::time::Instant::now();
    loop {
        let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
        match v["type"].as_str().unwrap() {
            "change" => {
                assert_eq!(v["sub"], "all", "{v}");
                got.push((
                    v["id"].as_str().unwrap().to_string(),
                    v["etag"].as_str().unwrap().to_string(),
                ));
                if caught_up.is_some() {
                    live += 1;
                }
            }
            "caught_up" => {
                assert!(caught_up.is_none(), "caught_up twice: {v}");
                assert_eq!(v["sub"], "all");
                let at = seq_of(v["last_etag"].as_str().unwrap());
                // Every backlog change is at or below the caught_up etag.
                if let Some((_, e)) = got.last() {
                    assert!(seq_of(e) <= at, "backlog change {e} above caught_up {v}");
                }
                caught_up = Some(at);
            }
            other => panic!("unexpected {other}: {v}"),
        }
        if caught_up.is_some() && live >= 20 && started.elapsed() > Duration::from_millis(300) {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    let last_written = written.iter().map(|(_, e)| seq_of(e)).max().unwrap();
    // Read on until the writer's last write has arrived.
    while got.last().is_none_or(|(_, e)| seq_of(e) < last_written) {
        let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
        assert_eq!(v["type"], "change", "{v}");
        got.push((
            v["id"].as_str().unwrap().to_string(),
            v["etag"].as_str().unwrap().to_string(),
        ));
    }
    let caught_up = caught_up.unwrap();
    let backlog = got.iter().filter(|(_, e)| seq_of(e) <= caught_up).count();
    assert!(backlog >= 100, "only {backlog} backlog changes");
    assert!(
        got.len() - backlog >= 20,
        "the writer must have written across the seam"
    );

    // Strictly increasing etags: nothing twice, in order, all after `since`.
    let mut prev = since_seq;
    for (id, e) in &got {
        assert!(
            seq_of(e) > prev,
            "{id} {e} not after {prev}: out of order or repeated"
        );
        prev = seq_of(e);
    }
    // Every change is a real write.
    let mut real: HashMap<String, String> = initial
        .iter()
        .map(|e| {
            (
                e["etag"].as_str().unwrap().to_string(),
                e["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (id, e) in &written {
        real.insert(e.clone(), id.clone());
    }
    for (id, e) in &got {
        assert_eq!(real.get(e), Some(id), "{id} {e} was never written");
    }
    // Nothing missed: every write after the seam arrived live, and the final state of
    // every id changed after `since` arrived.
    let got_set: HashSet<(String, String)> = got.iter().cloned().collect();
    for (id, e) in &written {
        if seq_of(e) > caught_up {
            assert!(
                got_set.contains(&(id.clone(), e.clone())),
                "live write {id} {e} missed"
            );
        }
    }
    let (final_state, _) = h.all_changes("ws", &since, 1000, "").await;
    assert!(final_state.len() > 100);
    for entry in &final_state {
        let key = (
            entry["id"].as_str().unwrap().to_string(),
            entry["etag"].as_str().unwrap().to_string(),
        );
        assert!(got_set.contains(&key), "final state {key:?} never sent");
    }

    // Disconnect, write more, resume from the last etag seen: exactly the missed ones.
    let last_seen = got.last().unwrap().1.clone();
    ws.close(None).await.ok();
    drop(ws);
    let mut latest: HashMap<String, String> = HashMap::new();
    let ids = (0..10).map(|i| format!("after/{i}")).chain([
        "init/005".to_string(),
        "init/150".to_string(),
        "after/3".to_string(),
    ]);
    for id in ids {
        let e = h.put_ok("ws", &id, &json!({"again": true})).await;
        latest.insert(id, e);
    }
    let mut missed: Vec<(String, String)> = latest.into_iter().collect();
    missed.sort_by_key(|(_, e)| seq_of(e));

    let mut ws = ws_connect(&h, "ws").await;
    subscribe(
        &mut ws,
        json!({"op": "subscribe", "sub": "again", "since": last_seen}),
    )
    .await;
    let mut resumed = Vec::new();
    loop {
        let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
        match v["type"].as_str().unwrap() {
            "change" => resumed.push((
                v["id"].as_str().unwrap().to_string(),
                v["etag"].as_str().unwrap().to_string(),
            )),
            "caught_up" => break,
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert_eq!(resumed, missed, "resuming from {last_seen}");
    assert_eq!(resumed.len(), 12);
    Arc::try_unwrap(h).ok().unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_subscriptions_on_one_connection_get_only_their_changes_until_unsubscribed() {
    let h = Harness::start().await;
    h.create_db("subs").await;
    let mut ws = ws_connect(&h, "subs").await;
    subscribe(
        &mut ws,
        json!({"op": "subscribe", "sub": "p", "prefix": "users/"}),
    )
    .await;
    subscribe(
        &mut ws,
        json!({"op": "subscribe", "sub": "c", "collection": "orders"}),
    )
    .await;
    subscribe(
        &mut ws,
        json!({"op": "subscribe", "sub": "i", "id": "special/1"}),
    )
    .await;

    let mut want: BTreeMap<&str, Vec<(String, String, &str)>> = BTreeMap::new();
    let hr = &h;
    let put = |id: &str, doc: Value| {
        let id = id.to_string();
        async move { (id.clone(), hr.put_ok("subs", &id, &doc).await) }
    };
    let (id, e) = put("users/1", json!({})).await;
    want.entry("p").or_default().push((id, e, "put"));
    let (id, e) = put("orders/1", json!({})).await;
    want.entry("c").or_default().push((id, e, "put"));
    let (id, e) = put("special/1", json!({})).await;
    want.entry("i").or_default().push((id, e, "put"));
    put("other/1", json!({})).await;
    put("special/10", json!({})).await; // the id filter is exact, not a prefix
    let (id, e) = put("misc/9", json!({"@metadata": {"@collection": "orders"}})).await;
    want.entry("c").or_default().push((id, e, "put"));
    let (id, e) = put("users/2", json!({})).await;
    want.entry("p").or_default().push((id, e, "put"));
    let d = h.delete_ok("subs", "users/1").await;
    want.entry("p").or_default().push((
        "users/1".into(),
        d["etag"].as_str().unwrap().into(),
        "delete",
    ));
    let d = h.delete_ok("subs", "special/1").await;
    want.entry("i").or_default().push((
        "special/1".into(),
        d["etag"].as_str().unwrap().into(),
        "delete",
    ));
    // A sentinel subscription and write: changes on one connection come in etag
    // order, so once it arrives everything before it has arrived too.
    ws_send(
        &mut ws,
        json!({"op": "subscribe", "sub": "s", "id": "sentinel/1"}),
    )
    .await;
    let mut sentinel = None;
    let mut got: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    loop {
        let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
        if v["type"] == "subscribed" && v["sub"] == "s" {
            sentinel = Some(put("sentinel/1", json!({})).await.1);
            continue;
        }
        assert_eq!(v["type"], "change", "{v}");
        if v["sub"] == "s" {
            assert_eq!(v["etag"], sentinel.as_deref().unwrap());
            break;
        }
        got.entry(v["sub"].as_str().unwrap().to_string())
            .or_default()
            .push((
                v["id"].as_str().unwrap().to_string(),
                v["etag"].as_str().unwrap().to_string(),
                v["change"].as_str().unwrap().to_string(),
            ));
    }
    let want: BTreeMap<String, Vec<(String, String, String)>> = want
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                v.into_iter()
                    .map(|(a, b, c)| (a, b, c.to_string()))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.values().map(Vec::len).sum::<usize>(), 7);

    // Unsubscribed, p gets nothing more; c still does.
    ws_send(&mut ws, json!({"op": "unsubscribe", "sub": "p"})).await;
    let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
    assert_eq!(v, json!({"type": "unsubscribed", "sub": "p"}));
    h.put_ok("subs", "users/3", &json!({})).await;
    let e = h.put_ok("subs", "orders/3", &json!({})).await;
    let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
    assert_eq!(v["sub"], "c", "after unsubscribing p, got {v}");
    assert_eq!(v["etag"], e.as_str());
    drop(ws);
    h.shutdown().await;
}

/// Heartbeats on tokio's paused clock: the server runs in this test's runtime, so
/// its shared interval and the connection's idle clock are virtual; time jumps to
/// each tick as soon as everything is idle, so 4 heartbeats 5 s apart take 20 s of
/// virtual time and almost no real time.
#[tokio::test(start_paused = true)]
async fn idle_subscriber_gets_heartbeats_spaced_by_the_interval_on_a_paused_clock() {
    let real = std::time::Instant::now();
    let h = Harness::start_with(|c| {
        c.changes.heartbeat_ms = 5_000;
        c.changes.tombstone_retention_ms = None;
        c.changes.send_timeout_ms = 3_600_000;
        // Connections on this runtime, so that they run on its paused clock.
        c.connection_threads = 0;
    })
    .await;
    // HTTP writes wait on the store's write-queue thread, which tokio cannot see: on
    // a paused clock the runtime looks idle, time jumps ahead and the client's 10 s
    // timeout fires. So the clock runs for the writes and is paused for the wait.
    tokio::time::resume();
    h.create_db("hb").await;
    let e = h.put_ok("hb", "a/1", &json!({})).await;
    tokio::time::pause();
    let mut ws = ws_connect(&h, "hb").await;
    subscribe(&mut ws, json!({"op": "subscribe", "sub": "x"})).await;
    let mut at = Vec::new();
    for _ in 0..4 {
        let v = ws_next(&mut ws, Duration::from_secs(60)).await;
        assert_eq!(v, json!({"type": "heartbeat", "last_etag": e}));
        at.push(tokio::time::Instant::now());
    }
    for w in at.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap >= Duration::from_millis(4_900) && gap <= Duration::from_millis(5_100),
            "heartbeats {gap:?} apart, want 5 s"
        );
    }
    // A change resets the idle clock; heartbeats then report the new last etag.
    tokio::time::resume();
    let e2 = h.put_ok("hb", "a/2", &json!({})).await;
    tokio::time::pause();
    let v = ws_next(&mut ws, Duration::from_secs(60)).await;
    assert_eq!(v["type"], "change", "{v}");
    assert_eq!(v["etag"], e2.as_str(), "{v}");
    let v = ws_next(&mut ws, Duration::from_secs(60)).await;
    assert_eq!(v, json!({"type": "heartbeat", "last_etag": e2}));
    assert!(
        real.elapsed() < Duration::from_secs(5),
        "20 s of heartbeats took {:?} of real time: the clock is not paused",
        real.elapsed()
    );
    drop(ws);
    h.shutdown().await;
}

/// What a stalled reader finds once it reads again.
#[derive(Debug, Default)]
struct Drained {
    changes: Vec<(String, String)>,
    close: Option<(u16, String)>,
    end: String,
}

async fn drain(ws: &mut Ws, limit: Duration) -> Drained {
    let mut d = Drained::default();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => {
                d.end = "still open (timeout)".into();
                return d;
            }
            Ok(None) => {
                d.end = "stream ended".into();
                return d;
            }
            Ok(Some(Err(e))) => {
                d.end = format!("error: {e}");
                return d;
            }
            Ok(Some(Ok(Message::Close(f)))) => {
                d.close = f.map(|f| (u16::from(f.code), f.reason.to_string()));
                d.end = "close frame".into();
                return d;
            }
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["type"] == "change" {
                    d.changes.push((
                        v["id"].as_str().unwrap().to_string(),
                        v["etag"].as_str().unwrap().to_string(),
                    ));
                }
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

// A reader that subscribes to everything and then stops reading while changes are
// written one small commit at a time (fewer than the queue holds, so only the
// reader's own backpressure can fill it): its socket buffers fill, its queue fills,
// it is dropped as a slow consumer; the server and the other subscribers carry on,
// /metrics counts it, and nothing is lost for a reader that resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_that_never_reads_is_dropped_and_the_server_and_other_subscribers_carry_on() {
    stalled_reader(false).await;
}

// The same, and the stalled reader, when it reads again, finds the close frame 4008
// "slow consumer: resume from etag E" after the frames that were already sent.
//
// The close frame waits behind the frames the reader has not taken (it once was
// given 1 s and then the socket was dropped: a reset without the resume etag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_that_never_reads_finds_close_4008_with_a_resume_etag_when_it_reads_again() {
    stalled_reader(true).await;
}

async fn stalled_reader(require_close_frame: bool) {
    let h = Arc::new(
        Harness::start_with(|c| {
            c.changes.subscriber_queue_len = 16;
            c.changes.send_timeout_ms = 500;
            c.docs.max_id_bytes = 1000;
        })
        .await,
    );
    h.create_db("slow").await;
    h.put_ok("slow", "start/1", &json!({})).await;

    // The stalled reader: a small receive buffer so the kernel's buffers fill fast.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let stream = sock.connect(h.addr).await.unwrap();
    let (mut slow, _) = tokio_tungstenite::client_async(
        format!("ws://{}/dbs/slow/changes/ws", h.addr),
        MaybeTlsStream::Plain(stream),
    )
    .await
    .unwrap();
    let sub = subscribe(&mut slow, json!({"op": "subscribe", "sub": "all"})).await;
    let from = sub["last_etag"].as_str().unwrap().to_string();

    // A healthy subscriber with a narrow filter, on its own connection.
    let mut probe = ws_connect(&h, "slow").await;
    subscribe(
        &mut probe,
        json!({"op": "subscribe", "sub": "probe", "id": "probe/1"}),
    )
    .await;

    // Flood in commits of 8 changes with ~1 KB ids (so ~1 KB frames).
    let pad = "x".repeat(900);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut written = 0;
    let mut b = 0;
    loop {
        let ops: Vec<Value> = (0..8)
            .map(|j| json!({"op": "put", "id": format!("flood/{b:05}/{j}/{pad}"), "document": {}}))
            .collect();
        let r = h
            .http
            .post(h.url("/dbs/slow/batch"))
            .json(&json!({ "ops": ops }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        written += 8;
        b += 1;
        if b % 25 == 0 {
            let m = h.metrics_text().await;
            if metric(&m, "kiln_changes_ws_slow_consumers_dropped_total").unwrap_or(0.0) >= 1.0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{written} changes toward a reader that never reads and it was not dropped"
            );
        }
    }
    assert!(written >= 100);
    // Longer than the server waits for the close frame to go out (1 s): the reader
    // must still find the close reason when it finally reads.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // The server is healthy and the other subscriber still gets its changes.
    let (status, _) = h.get_text("/health").await;
    assert_eq!(status.as_u16(), 200);
    let e = h.put_ok("slow", "probe/1", &json!({})).await;
    let v = ws_next_event(&mut probe, Duration::from_secs(5)).await;
    assert_eq!(
        (v["sub"].as_str(), v["etag"].as_str()),
        (Some("probe"), Some(e.as_str())),
        "{v}"
    );
    let m = h.metrics_text().await;
    assert!(metric(&m, "kiln_changes_ws_slow_consumers_dropped_total").unwrap() >= 1.0);
    assert_eq!(
        metric(&m, "kiln_changes_ws_connections_open"),
        Some(1.0),
        "only the probe is open"
    );

    // The stalled reader reads at last: what was sent, then the end of the connection.
    let d = drain(&mut slow, Duration::from_secs(5)).await;
    assert_ne!(
        d.end, "still open (timeout)",
        "the stalled connection was never closed"
    );
    assert!(
        !d.changes.is_empty(),
        "the reader got nothing at all before stalling"
    );
    assert!(
        d.changes.len() < written,
        "the reader got everything: it was not stalled"
    );
    let (log, _) = h.all_changes("slow", &from, 1000, "&prefix=flood/").await;
    assert_eq!(log.len(), written);
    // What was delivered is a prefix of the log, in order (nothing skipped).
    for (i, (id, etag)) in d.changes.iter().enumerate() {
        assert_eq!(
            (log[i]["id"].as_str(), log[i]["etag"].as_str()),
            (Some(id.as_str()), Some(etag.as_str())),
            "delivered change {i}"
        );
    }
    let resume = match (&d.close, require_close_frame) {
        (Some((code, reason)), _) => {
            assert_eq!(*code, 4008, "{reason}");
            let resume = reason
                .strip_prefix("slow consumer: resume from etag ")
                .unwrap_or_else(|| panic!("reason {reason:?}"))
                .to_string();
            assert!(
                seq_of(&resume) >= seq_of(&from),
                "{resume} before the subscription {from}"
            );
            // Resuming from that etag misses nothing: every change up to it was delivered.
            let upto = log
                .iter()
                .filter(|e| seq_of(e["etag"].as_str().unwrap()) <= seq_of(&resume))
                .count();
            assert!(
                upto <= d.changes.len(),
                "the resume etag {resume} is past what was delivered"
            );
            resume
        }
        (None, true) => panic!(
            "no close frame for the slow consumer after {} changes; the stream \
             ended as: {}",
            d.changes.len(),
            d.end
        ),
        (None, false) => d.changes.last().unwrap().1.clone(),
    };

    // A new connection resumes from there and gets exactly the rest.
    let mut again = ws_connect(&h, "slow").await;
    subscribe(
        &mut again,
        json!({"op": "subscribe", "sub": "r", "since": resume, "prefix": "flood/"}),
    )
    .await;
    let mut rest = Vec::new();
    loop {
        let v = ws_next_event(&mut again, Duration::from_secs(5)).await;
        if v["type"] == "caught_up" {
            break;
        }
        rest.push(v["etag"].as_str().unwrap().to_string());
    }
    let want: Vec<String> = log
        .iter()
        .map(|e| e["etag"].as_str().unwrap().to_string())
        .filter(|e| seq_of(e) > seq_of(&resume))
        .collect();
    assert_eq!(rest, want, "resumed from {resume}");
    assert!(!rest.is_empty());
    Arc::try_unwrap(h).ok().unwrap().shutdown().await;
}

// A burst of changes larger than the connection's queue (one commit of 200 with a
// queue of 16) overflows it even for a reader that reads: the connection is closed
// with 4008 and a resume etag at or below which everything was delivered, and a
// reader resuming from it gets exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_overflow_closes_4008_with_a_resume_etag_that_loses_nothing() {
    let h = Harness::start_with(|c| c.changes.subscriber_queue_len = 16).await;
    h.create_db("burst").await;
    let mut ws = ws_connect(&h, "burst").await;
    let sub = subscribe(&mut ws, json!({"op": "subscribe", "sub": "all"})).await;
    let from = sub["last_etag"].as_str().unwrap().to_string();
    let ops: Vec<Value> = (0..200)
        .map(|i| json!({"op": "put", "id": format!("b/{i:03}"), "document": {}}))
        .collect();
    let r = h
        .http
        .post(h.url("/dbs/burst/batch"))
        .json(&json!({ "ops": ops }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let d = drain(&mut ws, Duration::from_secs(5)).await;
    let (code, reason) = d
        .close
        .clone()
        .unwrap_or_else(|| panic!("no close frame: {d:?}"));
    assert_eq!(code, 4008, "{reason}");
    let resume = reason
        .strip_prefix("slow consumer: resume from etag ")
        .unwrap_or_else(|| panic!("reason {reason:?}"))
        .to_string();
    assert!(
        d.changes.len() < 200,
        "the whole burst was delivered: no overflow"
    );
    let (log, _) = h.all_changes("burst", &from, 1000, "").await;
    assert_eq!(log.len(), 200);
    let upto: Vec<String> = log
        .iter()
        .map(|e| e["etag"].as_str().unwrap().to_string())
        .filter(|e| seq_of(e) <= seq_of(&resume))
        .collect();
    let delivered: Vec<String> = d.changes.iter().map(|c| c.1.clone()).collect();
    assert!(
        delivered.starts_with(&upto),
        "not every change up to the resume etag {resume} was delivered"
    );
    let mut again = ws_connect(&h, "burst").await;
    subscribe(
        &mut again,
        json!({"op": "subscribe", "sub": "r", "since": resume}),
    )
    .await;
    let mut rest = Vec::new();
    loop {
        let v = ws_next_event(&mut again, Duration::from_secs(5)).await;
        if v["type"] == "caught_up" {
            break;
        }
        rest.push(v["etag"].as_str().unwrap().to_string());
    }
    assert_eq!(
        upto.len() + rest.len(),
        200,
        "resume from {resume} must give exactly the rest"
    );
    let m = h.metrics_text().await;
    assert!(metric(&m, "kiln_changes_ws_slow_consumers_dropped_total").unwrap() >= 1.0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_are_deletes_in_the_feed_vanish_on_rewrite_and_purge_below_an_etag() {
    let h = Harness::start().await;
    h.create_db("tomb").await;
    let e1 = h.put_ok("tomb", "a/1", &json!({"v": 1})).await;
    for i in 2..=5 {
        h.put_ok("tomb", &format!("a/{i}"), &json!({})).await;
    }
    let d1 = h.delete_ok("tomb", "a/1").await;
    assert_eq!(d1["id"], "a/1");
    assert_eq!(d1["deleted_etag"], e1.as_str());
    let t1 = d1["etag"].as_str().unwrap().to_string();

    let (feed, last) = h.all_changes("tomb", "", 100, "&include_docs=true").await;
    assert_eq!(last, t1, "the tombstone is the last change");
    let entry = feed
        .iter()
        .find(|e| e["id"] == "a/1")
        .expect("a/1 in the feed");
    assert_eq!(entry["change"], "delete");
    assert_eq!(entry["etag"], t1.as_str());
    assert!(entry.get("document").is_none(), "{entry}");
    assert_eq!(feed.last().unwrap()["id"], "a/1");
    assert_eq!(feed.iter().filter(|e| e["id"] == "a/1").count(), 1);

    let stats = tomb_stats(&h).await;
    assert_eq!(stats["tombstones"], 1, "{stats}");
    assert_eq!(stats["oldest_etag"], t1.as_str(), "{stats}");
    assert!(stats["oldest_at"].is_string(), "{stats}");
    assert_eq!(stats["consumers"], json!([]), "{stats}");

    // Written again: the delete entry is gone, the put is there, the tombstone too.
    let e1b = h.put_ok("tomb", "a/1", &json!({"v": 2})).await;
    let (feed, _) = h.all_changes("tomb", "", 100, "").await;
    let a1: Vec<&Value> = feed.iter().filter(|e| e["id"] == "a/1").collect();
    assert_eq!(a1.len(), 1, "{feed:?}");
    assert_eq!(a1[0]["change"], "put");
    assert_eq!(a1[0]["etag"], e1b.as_str());
    assert_eq!(feed.len(), 5);
    let stats = tomb_stats(&h).await;
    assert_eq!(stats["tombstones"], 0, "{stats}");
    assert_eq!(stats["oldest_etag"], Value::Null, "{stats}");

    // Three more deletes; purge below the second removes only the first.
    let t2 = h.delete_ok("tomb", "a/2").await["etag"]
        .as_str()
        .unwrap()
        .to_string();
    let t3 = h.delete_ok("tomb", "a/3").await["etag"]
        .as_str()
        .unwrap()
        .to_string();
    let t4 = h.delete_ok("tomb", "a/4").await["etag"]
        .as_str()
        .unwrap()
        .to_string();
    h.put_ok("tomb", "a/6", &json!({})).await; // a tombstone is not the last write
    assert_eq!(tomb_stats(&h).await["tombstones"], 3);
    let p = purge(&h, &format!("before={t3}")).await;
    assert_eq!(p["purged"], 1, "{p}");
    assert_eq!(p["tombstones"], 2, "{p}");
    assert_eq!(p["oldest_etag"], t3.as_str(), "{p}");
    let (feed, _) = h.all_changes("tomb", "", 100, "").await;
    assert!(
        !feed.iter().any(|e| e["id"] == "a/2"),
        "purged a/2 still in the feed"
    );
    let deletes: Vec<&str> = feed
        .iter()
        .filter(|e| e["change"] == "delete")
        .map(|e| e["etag"].as_str().unwrap())
        .collect();
    assert_eq!(deletes, [t3.as_str(), t4.as_str()]);
    let _ = t2;
    // Again below the same etag: nothing left to purge.
    assert_eq!(purge(&h, &format!("before={t3}")).await["purged"], 0);
    // An age the tombstones have not reached purges nothing.
    let p = purge(&h, "older_than_ms=3600000").await;
    assert_eq!(
        (p["purged"].as_u64(), p["tombstones"].as_u64()),
        (Some(0), Some(2)),
        "{p}"
    );
    // Neither: every tombstone (no consumer holds them back).
    let p = purge(&h, "").await;
    assert_eq!(
        (p["purged"].as_u64(), p["tombstones"].as_u64()),
        (Some(2), Some(0)),
        "{p}"
    );
    let (feed, _) = h.all_changes("tomb", "", 100, "").await;
    assert!(feed.iter().all(|e| e["change"] == "put"), "{feed:?}");
    assert_eq!(feed.len(), 3); // a/5, a/1, a/6
    let r = h
        .http
        .delete(h.url("/dbs/tomb/tombstones?before=nonsense"))
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "invalid_etag").await;
    h.shutdown().await;
}

// A purge with neither `before` nor `older_than_ms` removes every tombstone the
// consumers allow, the database's last write included (its bound is exclusive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_of_everything_also_removes_a_tombstone_that_is_the_last_write() {
    let h = Harness::start().await;
    h.create_db("tomb").await;
    h.put_ok("tomb", "a/1", &json!({})).await;
    h.put_ok("tomb", "a/2", &json!({})).await;
    h.delete_ok("tomb", "a/1").await;
    h.delete_ok("tomb", "a/2").await; // the last write of the database
    assert_eq!(tomb_stats(&h).await["tombstones"], 2);
    let p = purge(&h, "").await;
    assert_eq!(
        (p["purged"].as_u64(), p["tombstones"].as_u64()),
        (Some(2), Some(0)),
        "{p}"
    );
    let (feed, _) = h.all_changes("tomb", "", 100, "").await;
    assert_eq!(feed, Vec::<Value>::new());
    h.shutdown().await;
}

async fn tomb_stats(h: &Harness) -> Value {
    let (status, text) = h.get_text("/dbs/tomb/tombstones").await;
    assert_eq!(status.as_u16(), 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

async fn purge(h: &Harness, query: &str) -> Value {
    let r = h
        .http
        .delete(h.url(&format!("/dbs/tomb/tombstones?{query}")))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status.as_u16(), 200, "purge {query}: {text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_etags_recreated_databases_unknown_databases_and_bad_ws_messages_get_clear_errors() {
    let h = Harness::start().await;
    h.create_db("bad").await;
    let old = h.put_ok("bad", "a/1", &json!({})).await;
    for since in ["garbage", "12", "-1", "x-0000", "12-zz"] {
        let r = h
            .http
            .get(h.url(&format!("/dbs/bad/changes?since={since}")))
            .send()
            .await
            .unwrap();
        expect_error(r, 400, "invalid_etag").await;
    }
    // The etag of a previous incarnation of the database.
    let r = h.http.delete(h.url("/dbs/bad")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    h.create_db("bad").await;
    let new = h.put_ok("bad", "a/1", &json!({})).await;
    assert_ne!(new, old);
    let r = h
        .http
        .get(h.url(&format!("/dbs/bad/changes?since={old}")))
        .send()
        .await
        .unwrap();
    expect_error(r, 410, "etag_from_other_incarnation").await;
    let r = h
        .http
        .get(h.url(&format!("/dbs/bad/changes?since={old}&wait_ms=1000")))
        .send()
        .await
        .unwrap();
    expect_error(r, 410, "etag_from_other_incarnation").await;
    // Unknown database: HTTP and WebSocket.
    let r = h.http.get(h.url("/dbs/nope/changes")).send().await.unwrap();
    expect_error(r, 404, "database_not_found").await;
    let r = h
        .http
        .get(h.url("/dbs/nope/tombstones"))
        .send()
        .await
        .unwrap();
    expect_error(r, 404, "database_not_found").await;
    match tokio_tungstenite::connect_async(format!("ws://{}/dbs/nope/changes/ws", h.addr)).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 404)
        }
        other => panic!(
            "a WebSocket on an unknown database: {:?}",
            other.map(|_| ())
        ),
    }

    // Bad WebSocket messages: an error frame each, and the connection lives on.
    let mut ws = ws_connect(&h, "bad").await;
    let bad = [
        "not json".to_string(),
        json!({"op": "subscribe"}).to_string(),
        json!({"op": "jump", "sub": "x"}).to_string(),
        json!({"op": "subscribe", "sub": "x", "bogus": 1}).to_string(),
    ];
    for text in &bad {
        ws.send(Message::text(text.clone())).await.unwrap();
        let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
        assert_eq!(v["type"], "error", "{text}: {v}");
        assert_eq!(v["code"], "invalid_message", "{text}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    ws_send(
        &mut ws,
        json!({"op": "subscribe", "sub": "x", "since": "zzz"}),
    )
    .await;
    let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
    assert_eq!(
        (v["type"].as_str(), v["code"].as_str()),
        (Some("error"), Some("invalid_etag")),
        "{v}"
    );
    ws_send(
        &mut ws,
        json!({"op": "subscribe", "sub": "y", "since": old}),
    )
    .await;
    let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
    assert_eq!(v["type"], "error", "an etag of the old incarnation: {v}");
    ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
    assert_eq!(v["type"], "error", "{v}");
    // Still alive, and the refused subscriptions were not registered.
    subscribe(&mut ws, json!({"op": "subscribe", "sub": "ok"})).await;
    let e = h.put_ok("bad", "a/2", &json!({})).await;
    let v = ws_next_event(&mut ws, Duration::from_secs(5)).await;
    assert_eq!(
        (v["sub"].as_str(), v["etag"].as_str()),
        (Some("ok"), Some(e.as_str())),
        "{v}"
    );
    drop(ws);
    h.shutdown().await;
}
