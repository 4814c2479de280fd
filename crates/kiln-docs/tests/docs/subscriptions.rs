//! Data subscriptions (`subscriptions/`): definitions and positions in the
//! database's own tree (so they survive a reopen and are in full backups), batches
//! of a collection's matching documents in etag order, the position moving only on
//! an acknowledgment, one lease holder at a time, and a model test of workers that
//! die before they acknowledge: every matching document is delivered at its latest
//! version, none is skipped.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    BatchLimits, Condition, Database, DocError, DocStore, DocsOptions, LeaseStrategy,
    SubscriptionStart,
};
use kiln_docs::{QueryError, SubscriptionError};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o
}

fn fresh() -> (tempfile::TempDir, DocStore, Arc<Database>) {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("d").unwrap();
    (dir, store, db)
}

fn put(db: &Database, id: &str, body: Value) -> u64 {
    db.put(id, body.to_string().as_bytes(), Condition::None)
        .unwrap()
        .etag
        .sequence
}

fn limits(max_documents: usize) -> BatchLimits {
    BatchLimits {
        max_documents,
        max_bytes: 1 << 20,
    }
}

fn create(db: &Database, name: &str, query: &str) {
    db.create_subscription(name, query, Map::new(), SubscriptionStart::Beginning)
        .unwrap();
}

/// (id, etag sequence) of a batch's documents.
fn ids(batch: &kiln_docs::SubscriptionBatch) -> Vec<(String, u64)> {
    batch
        .documents
        .iter()
        .map(|d| (d.id.clone(), d.etag.sequence))
        .collect()
}

#[test]
fn create_list_get_delete_and_their_errors() {
    let (_dir, _store, db) = fresh();
    put(&db, "orders/1", json!({"total": 5}));
    let info = db
        .create_subscription(
            "big-orders",
            "from orders where total > $min",
            Map::from_iter([("min".into(), json!(10))]),
            SubscriptionStart::Now,
        )
        .unwrap();
    assert_eq!(info.collection, "orders");
    assert_eq!(
        info.acknowledged_sequence, 1,
        "`now` starts at the last write"
    );
    create(&db, "all", "from orders");
    let names: Vec<String> = db
        .subscriptions()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["all", "big-orders"]);
    assert_eq!(db.subscription("all").unwrap().acknowledged_sequence, 0);
    assert!(matches!(
        db.create_subscription(
            "all",
            "from users",
            Map::new(),
            SubscriptionStart::Beginning
        ),
        Err(DocError::Subscription(SubscriptionError::Exists(_)))
    ));
    for bad in ["", "a/b", ".hidden", "with space", &"x".repeat(129)] {
        assert!(
            matches!(
                db.create_subscription(bad, "from orders", Map::new(), SubscriptionStart::Now),
                Err(DocError::Subscription(SubscriptionError::Invalid(_)))
            ),
            "{bad:?}"
        );
    }
    for bad in [
        "from",
        "from orders order by total",
        "from orders where total >",
    ] {
        assert!(matches!(
            db.create_subscription("q", bad, Map::new(), SubscriptionStart::Now),
            Err(DocError::Query(QueryError::Invalid { .. }))
        ));
    }
    // A start past the last write, or an etag of no database, is refused.
    let future = db.etag_at(99).to_string();
    for start in [future.as_str(), "garbage"] {
        assert!(matches!(
            db.create_subscription(
                "s",
                "from orders",
                Map::new(),
                SubscriptionStart::parse(start)
            ),
            Err(DocError::Subscription(SubscriptionError::Invalid(_)))
        ));
    }
    let from_etag = db.etag_at(1).to_string();
    let s = db
        .create_subscription(
            "s",
            "from orders",
            Map::new(),
            SubscriptionStart::parse(&from_etag),
        )
        .unwrap();
    assert_eq!(s.acknowledged_sequence, 1);
    assert!(matches!(
        db.subscription("nope"),
        Err(DocError::Subscription(SubscriptionError::NotFound(_)))
    ));
    assert!(matches!(
        db.lease_subscription("nope", LeaseStrategy::IfFree),
        Err(DocError::Subscription(SubscriptionError::NotFound(_)))
    ));
    db.delete_subscription("all").unwrap();
    assert!(matches!(
        db.delete_subscription("all"),
        Err(DocError::Subscription(SubscriptionError::NotFound(_)))
    ));
    assert_eq!(db.subscriptions().unwrap().len(), 2);
}

/// The cursor moves only on an acknowledgment: a batch read again without one is
/// the same batch; a document written several times before delivery comes once, at
/// its latest etag; deletes and other collections are not delivered; the filter's
/// skipped documents are covered by the acknowledged range.
#[test]
fn the_position_moves_only_on_an_acknowledgment() {
    let (_dir, _store, db) = fresh();
    create(&db, "s", "from orders where total >= 10");
    put(&db, "orders/1", json!({"total": 10}));
    put(&db, "users/1", json!({"total": 99}));
    put(&db, "orders/2", json!({"total": 1}));
    put(&db, "orders/3", json!({"total": 30}));
    put(&db, "orders/4", json!({"total": 40}));
    db.delete("orders/4", Condition::None).unwrap();
    let latest = put(&db, "orders/1", json!({"total": 11}));

    let lease = db.lease_subscription("s", LeaseStrategy::IfFree).unwrap();
    let reader = db.open_subscription("s").unwrap();
    assert_eq!(reader.position(), 0);
    let first = db.subscription_batch(&reader, 0, limits(1)).unwrap();
    assert_eq!(ids(&first), [("orders/3".to_string(), 4)]);
    assert_eq!(first.up_to, 4, "ends at its last document when full");
    // Not acknowledged: the position stays, and a reader opened again (a worker
    // reconnecting) gets the same batch.
    assert_eq!(db.subscription("s").unwrap().acknowledged_sequence, 0);
    let again = db.open_subscription("s").unwrap();
    assert_eq!(again.position(), 0);
    let second_read = db.subscription_batch(&again, 0, limits(1)).unwrap();
    assert_eq!(ids(&second_read), ids(&first));
    assert_eq!(db.acknowledge_subscription(&lease, first.up_to).unwrap(), 4);
    let reader = db.open_subscription("s").unwrap();
    assert_eq!(reader.position(), 4);
    let rest = db.subscription_batch(&reader, 4, limits(100)).unwrap();
    assert_eq!(ids(&rest), [("orders/1".to_string(), latest)]);
    assert_eq!(rest.up_to, rest.database_sequence);
    db.acknowledge_subscription(&lease, rest.up_to).unwrap();
    let empty = db
        .subscription_batch(&reader, rest.up_to, limits(100))
        .unwrap();
    assert!(empty.documents.is_empty());
    // Written again after delivery: delivered again, at its new etag.
    let newer = put(&db, "orders/3", json!({"total": 31}));
    let b = db
        .subscription_batch(&reader, rest.up_to, limits(100))
        .unwrap();
    assert_eq!(ids(&b), [("orders/3".to_string(), newer)]);
    let doc: Value = serde_json::from_slice(&b.documents[0].json).unwrap();
    assert_eq!(doc["total"], 31);
    assert_eq!(doc["@metadata"]["@id"], "orders/3");
    let info = db.subscription("s").unwrap();
    assert!(info.held);
    assert_eq!(info.acknowledgments, 2);
}

#[test]
fn one_worker_holds_a_subscription_and_a_taken_over_one_moves_nothing() {
    let (_dir, _store, db) = fresh();
    create(&db, "s", "from orders");
    let seq = put(&db, "orders/1", json!({}));
    let first = db.lease_subscription("s", LeaseStrategy::IfFree).unwrap();
    assert!(matches!(
        db.lease_subscription("s", LeaseStrategy::IfFree),
        Err(DocError::Subscription(SubscriptionError::Busy(_)))
    ));
    let second = db.lease_subscription("s", LeaseStrategy::TakeOver).unwrap();
    assert!(first.is_revoked());
    assert!(matches!(
        db.acknowledge_subscription(&first, seq),
        Err(DocError::Subscription(SubscriptionError::LeaseLost(_)))
    ));
    assert_eq!(db.subscription("s").unwrap().acknowledged_sequence, 0);
    drop(first);
    assert!(
        db.subscription("s").unwrap().held,
        "the new holder keeps it"
    );
    db.acknowledge_subscription(&second, seq).unwrap();
    drop(second);
    assert!(!db.subscription("s").unwrap().held);
    // Deleting revokes the holder; acknowledging then fails.
    let third = db.lease_subscription("s", LeaseStrategy::IfFree).unwrap();
    db.delete_subscription("s").unwrap();
    assert!(third.is_revoked());
    assert!(db.acknowledge_subscription(&third, seq).is_err());
}

#[test]
fn positions_survive_a_reopen_and_are_in_full_backups() {
    let dir = tempfile::tempdir().unwrap();
    let mut full = Vec::new();
    {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.create_database("d").unwrap();
        create(&db, "s", "from orders");
        put(&db, "orders/1", json!({}));
        let seq = put(&db, "orders/2", json!({}));
        let lease = db.lease_subscription("s", LeaseStrategy::IfFree).unwrap();
        db.acknowledge_subscription(&lease, seq).unwrap();
        db.backup_to(&mut full, Default::default(), |_| {}).unwrap();
        store.close().unwrap();
    }
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("d").unwrap();
    let info = db.subscription("s").unwrap();
    assert_eq!(info.acknowledged_sequence, 2);
    assert!(!info.held, "nobody holds a subscription after a restart");

    let restored = tempfile::tempdir().unwrap();
    let source = kiln_docs::RestoreSource::Files(vec![(
        "full".into(),
        Box::new(std::io::Cursor::new(full)) as Box<dyn std::io::Read>,
    )]);
    kiln_docs::restore_database(
        source,
        restored.path(),
        "copy",
        options().storage,
        false,
        kiln_docs::RestorePoint::Latest,
        |_| {},
    )
    .unwrap();
    let copy_store = DocStore::open(restored.path(), options()).unwrap();
    let copy = copy_store.database("copy").unwrap();
    let c = copy.subscription("s").unwrap();
    assert_eq!(
        (c.query.as_str(), c.acknowledged_sequence),
        ("from orders", 2)
    );
}

/// A filter matching nothing in a long run of documents: a batch reads at most
/// `MAX_SCANNED_PER_BATCH` of them and ends there, empty, with `up_to` where it
/// stopped, so that reading goes on from there.
#[test]
fn a_filter_that_skips_everything_still_moves_through_the_collection() {
    let (_dir, _store, db) = fresh();
    create(&db, "s", "from orders where wanted = true");
    put(&db, "orders/a", json!({"wanted": false}));
    put(&db, "orders/b", json!({"wanted": false}));
    let last = put(&db, "orders/c", json!({"wanted": true}));
    let reader = db.open_subscription("s").unwrap();
    let b = db.subscription_batch(&reader, 0, limits(10)).unwrap();
    assert_eq!(ids(&b), [("orders/c".to_string(), last)]);
    assert_eq!(b.scanned, 3);
}

/// Model test: writers put, rewrite and delete documents of two collections while
/// a worker reads batches and, at random, acknowledges them or "dies" (drops its
/// lease and reader without acknowledging; a new worker opens the subscription
/// again). Every version of a matching document that was current when a batch was
/// read must be delivered: at the end, with all batches acknowledged, every
/// matching document's latest version has been delivered at least once, nothing
/// past the position was acknowledged without being delivered, and each batch is
/// in etag order.
#[test]
fn workers_that_die_before_acknowledging_lose_nothing() {
    for seed in 0..4u64 {
        // Commits acknowledged when handed to the OS: the model is about the
        // subscription's logic, not durability, and 4 seeds stay well under a second.
        let dir = tempfile::tempdir().unwrap();
        let mut o = options();
        o.storage.durability = kiln_storage::Durability::Buffered {
            sync_interval_ms: 1000,
        };
        let store = DocStore::open(dir.path(), o).unwrap();
        let db = store.create_database("d").unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        create(&db, "s", "from orders where n >= 3");
        // id -> latest n (None: deleted)
        let mut model: BTreeMap<String, Option<i64>> = BTreeMap::new();
        // (id, etag sequence) pairs delivered.
        let mut delivered: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut lease = Some(db.lease_subscription("s", LeaseStrategy::IfFree).unwrap());
        let mut reader = db.open_subscription("s").unwrap();
        let mut after = reader.position();
        let mut acked = after;
        for _ in 0..400 {
            match rng.gen_range(0..10) {
                0..=5 => {
                    let coll = if rng.gen_bool(0.8) { "orders" } else { "users" };
                    let id = format!("{coll}/{}", rng.gen_range(0..30));
                    let n: i64 = rng.gen_range(0..6);
                    put(&db, &id, json!({ "n": n }));
                    model.insert(id, Some(n));
                }
                6 => {
                    let id = format!("orders/{}", rng.gen_range(0..30));
                    if db.delete(&id, Condition::None).is_ok() {
                        model.insert(id, None);
                    }
                }
                _ => {
                    let batch = db
                        .subscription_batch(&reader, after, limits(rng.gen_range(1..8)))
                        .unwrap();
                    let seqs: Vec<u64> = batch.documents.iter().map(|d| d.etag.sequence).collect();
                    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "etag order: {seqs:?}");
                    assert!(seqs.iter().all(|s| *s > after && *s <= batch.up_to));
                    for d in &batch.documents {
                        let v: Value = serde_json::from_slice(&d.json).unwrap();
                        assert!(v["n"].as_i64().unwrap() >= 3, "the filter holds");
                        delivered
                            .entry(d.id.clone())
                            .or_default()
                            .push(d.etag.sequence);
                    }
                    // Reading moved nothing: the position is the last one acknowledged.
                    assert_eq!(db.subscription("s").unwrap().acknowledged_sequence, acked);
                    if rng.gen_bool(0.7) {
                        db.acknowledge_subscription(lease.as_ref().unwrap(), batch.up_to)
                            .unwrap();
                        after = batch.up_to;
                        acked = batch.up_to;
                    } else {
                        // The worker dies: its batch was not acknowledged.
                        drop(lease.take());
                        lease = Some(db.lease_subscription("s", LeaseStrategy::IfFree).unwrap());
                        reader = db.open_subscription("s").unwrap();
                        assert_eq!(reader.position(), acked);
                        after = reader.position();
                    }
                }
            }
        }
        // Drain with acknowledgments.
        loop {
            let batch = db.subscription_batch(&reader, after, limits(5)).unwrap();
            for d in &batch.documents {
                delivered
                    .entry(d.id.clone())
                    .or_default()
                    .push(d.etag.sequence);
            }
            db.acknowledge_subscription(lease.as_ref().unwrap(), batch.up_to)
                .unwrap();
            if batch.documents.is_empty() && batch.up_to == after {
                break;
            }
            after = batch.up_to;
        }
        for (id, n) in &model {
            let current = db.get(id).unwrap();
            let wanted = id.starts_with("orders/") && n.is_some_and(|n| n >= 3);
            if wanted {
                let etag = current.unwrap().etag.sequence;
                assert!(
                    delivered.get(id).is_some_and(|v| v.contains(&etag)),
                    "seed {seed}: {id} at {etag} never delivered ({:?})",
                    delivered.get(id)
                );
            } else if id.starts_with("users/") {
                assert!(!delivered.contains_key(id), "seed {seed}: {id} delivered");
            }
        }
        assert_eq!(
            db.subscription("s").unwrap().acknowledged_sequence,
            db.last_sequence()
        );
    }
}

/// A cluster's entries: created, acknowledged and deleted with the leader's time,
/// each entry applied once (a second apply of the same log index, as after a
/// crash, changes nothing), a start resolved as the entry applies, and the
/// position never moving back.
#[test]
fn logged_changes_apply_once_with_the_leaders_time() {
    let (_dir, _store, db) = fresh();
    let first = put(&db, "orders/1", json!({"total": 5}));
    let now = SubscriptionStart::Now;
    let made = db
        .create_subscription_logged(10, 1_000, "s", "from orders", Map::new(), now.clone())
        .unwrap()
        .expect("applied");
    assert_eq!(
        (made.created_ms, made.acknowledged_sequence),
        (1_000, first)
    );
    // The same entry again: not applied; a later one that takes the name: refused.
    let again = db.create_subscription_logged(10, 2_000, "s", "from orders", Map::new(), now);
    assert!(again.unwrap().is_none());
    let taken = db.create_subscription_logged(
        11,
        2_000,
        "s",
        "from orders",
        Map::new(),
        SubscriptionStart::Beginning,
    );
    assert!(matches!(
        taken,
        Err(DocError::Subscription(SubscriptionError::Exists(_)))
    ));
    // A refused entry claims nothing: the next one applies.
    let second = put(&db, "orders/2", json!({"total": 6}));
    assert_eq!(
        db.acknowledge_subscription_logged(12, 3_000, "s", second)
            .unwrap(),
        Some(second)
    );
    assert_eq!(
        db.acknowledge_subscription_logged(12, 4_000, "s", second)
            .unwrap(),
        None
    );
    // Never back (a worker taken over acknowledging late).
    assert_eq!(
        db.acknowledge_subscription_logged(13, 5_000, "s", first)
            .unwrap(),
        Some(second)
    );
    let info = db.subscription("s").unwrap();
    assert_eq!(
        (
            info.acknowledged_sequence,
            info.acknowledged_ms,
            info.acknowledgments
        ),
        (second, Some(5_000), 2)
    );
    assert_eq!(db.applied_log_index().unwrap(), 13);
    let lease = db.lease_subscription("s", LeaseStrategy::IfFree).unwrap();
    assert!(lease.is_current());
    assert!(db.delete_subscription_logged(14, "s").unwrap());
    assert!(
        lease.is_revoked() && !lease.is_current(),
        "a delete lets this node's worker go"
    );
    assert!(!db.delete_subscription_logged(14, "s").unwrap());
    let missing = db.acknowledge_subscription_logged(15, 6_000, "s", second);
    assert!(matches!(
        missing,
        Err(DocError::Subscription(SubscriptionError::NotFound(_)))
    ));
    // The leader checks a creation before proposing it, without writing.
    let bad = db.check_new_subscription(
        "t",
        "from orders where",
        &Map::new(),
        &SubscriptionStart::Beginning,
    );
    assert!(matches!(bad, Err(DocError::Query(_))), "{bad:?}");
    db.check_new_subscription(
        "t",
        "from orders",
        &Map::new(),
        &SubscriptionStart::Beginning,
    )
    .unwrap();
    assert!(db.subscriptions().unwrap().is_empty());
}
