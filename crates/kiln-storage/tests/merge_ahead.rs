//! Merging ahead (`Options::merge_ahead`, `txn/ahead.rs`): while a write transaction
//! puts, a second thread merges the frozen write-buffer generation into the trees for
//! it. These tests check that nothing a reader, a count, an abort, a tree write, a
//! second writer thread or a reopen sees changes because of it. Each one asserts
//! that keys were merged ahead, so that it cannot pass with the thread idle.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, MergeAhead, Options};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn options(merge_ahead: MergeAhead, write_buffer_bytes: u64) -> Options {
    Options {
        write_buffer_bytes,
        merge_ahead,
        ..Options::default()
    }
}

/// Fails the test run instead of hanging it if the writer lock is never handed on.
fn watchdog(what: &'static str) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        for _ in 0..1200 {
            if flag.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{what}: still running after 120 s (a writer waits forever?)");
        std::process::abort();
    });
    done
}

fn key(i: u32) -> Vec<u8> {
    format!("k{i:06}").into_bytes()
}

fn check_reads(w: &mut kiln_storage::WriteTxn, model: &Model, rng: &mut StdRng, step: usize) {
    for _ in 0..20 {
        let k = key(rng.gen_range(0..3000));
        assert_eq!(
            w.get("t", &k).unwrap(),
            model.get(&k).map(|v| &v[..]),
            "step {step}: get {:?}",
            String::from_utf8_lossy(&k)
        );
    }
    if step.is_multiple_of(10) {
        assert_eq!(w.tree_len("t").unwrap(), model.len() as u64, "step {step}");
        let mut c = w.cursor("t").unwrap();
        let mut e = c.first().unwrap();
        let mut seen = Vec::new();
        while let Some((k, v)) = e {
            seen.push((k.to_vec(), v.to_vec()));
            e = c.next().unwrap();
        }
        let expected: Vec<(Vec<u8>, Vec<u8>)> =
            model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert!(
            seen == expected,
            "step {step}: cursor differs from the model"
        );
    }
}

/// Random puts (small ones buffered, large ones into the tree), deletes and aborts,
/// with reads, counts and scans inside the transactions while their trees are lent,
/// then a close and a reopen: every view agrees with a model.
fn model_run(merge_ahead: MergeAhead, seed: u64) {
    let done = watchdog("model_run");
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::new();
    let merged_ahead;
    {
        let env = Env::open(dir.path(), options(merge_ahead, 48 << 10)).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        // A last key above all others: later puts are inside the tree's range and
        // go to the write buffer.
        w.put("t", b"zzzz", b"end").unwrap();
        w.commit().unwrap();
        model.insert(b"zzzz".to_vec(), b"end".to_vec());
        for step in 0..300 {
            let mut w = env.begin_write().unwrap();
            let mut next = model.clone();
            check_reads(&mut w, &model, &mut rng, step);
            for _ in 0..rng.gen_range(60..140) {
                let k = key(rng.gen_range(0..3000));
                match rng.gen_range(0..100) {
                    0..=69 => {
                        let v = vec![rng.gen::<u8>(); rng.gen_range(1..120)];
                        w.put("t", &k, &v).unwrap();
                        next.insert(k, v);
                    }
                    70..=74 => {
                        // Above the buffering bound: written into the tree.
                        let v = vec![rng.gen::<u8>(); 3000];
                        w.put("t", &k, &v).unwrap();
                        next.insert(k, v);
                    }
                    _ => {
                        let existed = w.delete("t", &k).unwrap();
                        assert_eq!(existed, next.remove(&k).is_some(), "step {step}");
                    }
                }
            }
            check_reads(&mut w, &next, &mut rng, step);
            if rng.gen_bool(0.1) {
                w.abort();
            } else {
                w.commit().unwrap();
                model = next;
            }
            let r = env.begin_read().unwrap();
            assert_eq!(r.tree_len("t").unwrap(), model.len() as u64, "step {step}");
        }
        merged_ahead = env.stats().write_buffer_keys_merged_ahead;
        env.close().unwrap();
    }
    assert!(
        merged_ahead > 0,
        "no key was merged ahead: the test proves nothing"
    );
    let env = Env::open(dir.path(), Options::default()).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), model.len() as u64);
    for (k, v) in &model {
        assert_eq!(r.get("t", k).unwrap(), Some(&v[..]));
    }
    drop(r);
    assert!(
        env.check().unwrap().is_clean(),
        "integrity check after reopen"
    );
    done.store(true, Ordering::Relaxed);
}

#[test]
fn reads_counts_aborts_and_reopen_agree_with_a_model_while_open() {
    model_run(MergeAhead::WhileOpen, 1);
}

#[test]
fn reads_counts_aborts_and_reopen_agree_with_a_model_exact_keys() {
    model_run(MergeAhead::ExactKeys(100), 2);
    model_run(MergeAhead::ExactKeys(7), 3);
}

/// A key written into the tree (a large value) while an older small version of it
/// waits in the frozen generation leaves an in-tree version in the active one: the
/// merge thread must not merge the frozen version over the tree's newer value.
#[test]
fn an_in_tree_version_is_never_merged_over() {
    let done = watchdog("in_tree");
    let dir = tempfile::tempdir().unwrap();
    // 256 keys merged ahead per transaction, the whole slice of a one-put commit.
    let opts = options(MergeAhead::ExactKeys(256), 16 << 10);
    let late = key(900);
    let large = vec![9u8; 5000];
    {
        let (env, _) = frozen_thousand(dir.path(), 256, b"old");
        // The merge thread has the first 256 keys; `late` is key 900.
        let mut w = env.begin_write().unwrap();
        w.put("t", &late, &large).unwrap();
        w.commit().unwrap();
        // One-put commits until the frozen generation is merged.
        let mut i = 0;
        while env.stats().write_buffer_merges == 0 {
            let mut w = env.begin_write().unwrap();
            w.put("t", &key(2000 + i), b"x").unwrap();
            w.commit().unwrap();
            i += 1;
            assert!(i < 100, "the frozen generation never finished merging");
        }
        assert!(env.stats().write_buffer_keys_merged_ahead > 0);
        let r = env.begin_read().unwrap();
        assert_eq!(r.get("t", &late).unwrap(), Some(&large[..]));
        drop(r);
        env.close().unwrap();
    }
    let env = Env::open(dir.path(), opts).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", &late).unwrap(), Some(&large[..]));
    assert_eq!(r.get("t", &key(899)).unwrap(), Some(&b"old"[..]));
    done.store(true, Ordering::Relaxed);
}

/// Several threads writing through `begin_write`, with the commit queue and
/// integrity checks beside them: the writer lock, lent between a commit and the next
/// `begin`, reaches every kind of waiter, and every commit is kept.
#[test]
fn writers_on_many_threads_hand_the_lent_lock_on() {
    let done = watchdog("many_threads");
    let dir = tempfile::tempdir().unwrap();
    let env = Arc::new(Env::open(dir.path(), options(MergeAhead::WhileOpen, 64 << 10)).unwrap());
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.put("t", b"zzzz", b"end").unwrap();
    w.commit().unwrap();
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let env = env.clone();
            std::thread::spawn(move || {
                for round in 0..40u32 {
                    if t == 3 && round % 10 == 5 {
                        env.submit(move |w| w.put("t", &key(90_000 + round), b"queued"))
                            .unwrap();
                        continue;
                    }
                    let mut w = env.begin_write().unwrap();
                    for i in 0..100u32 {
                        let k = key(t * 10_000 + round * 100 + i);
                        w.put("t", &k, &k).unwrap();
                    }
                    w.commit().unwrap();
                }
            })
        })
        .collect();
    let checker = {
        let env = env.clone();
        std::thread::spawn(move || {
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(30));
                assert!(env.check().unwrap().is_clean());
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    checker.join().unwrap();
    // With others waiting a commit seldom lends (it hands the lock to them): a writer
    // alone lends again, and the merge it was given ends up in its commits.
    for round in 0..30u32 {
        let mut w = env.begin_write().unwrap();
        for i in 0..100u32 {
            let k = key(50_000 + round * 100 + i);
            w.put("t", &k, &k).unwrap();
        }
        w.commit().unwrap();
    }
    assert!(env.stats().write_buffer_keys_merged_ahead > 0);
    let r = env.begin_read().unwrap();
    for t in 0..4u32 {
        for round in 0..40u32 {
            if t == 3 && round % 10 == 5 {
                assert_eq!(
                    r.get("t", &key(90_000 + round)).unwrap(),
                    Some(&b"queued"[..])
                );
                continue;
            }
            for i in [0, 57, 99] {
                let k = key(t * 10_000 + round * 100 + i);
                assert_eq!(r.get("t", &k).unwrap(), Some(&k[..]));
            }
        }
    }
    // Three threads of 40 rounds, one of 36 rounds and 4 queued puts, the lone
    // writer's 30 rounds, and "zzzz".
    assert_eq!(
        r.tree_len("t").unwrap(),
        1 + 3 * 40 * 100 + 36 * 100 + 4 + 3000
    );
    drop(r);
    Arc::try_unwrap(env).ok().unwrap().close().unwrap();
    done.store(true, Ordering::Relaxed);
}

/// An environment in `dir` whose last commit (its id returned) froze 1,000 buffered
/// keys of `value` and lent the next transaction to the merge thread, which merges
/// `keys_ahead` keys a transaction.
fn frozen_thousand(dir: &std::path::Path, keys_ahead: usize, value: &[u8]) -> (Env, u64) {
    let env = Env::open(dir, options(MergeAhead::ExactKeys(keys_ahead), 16 << 10)).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    // A last key above all others: the keys below go to the write buffer.
    w.put("t", b"zzzz", b"end").unwrap();
    w.commit().unwrap();
    let mut w = env.begin_write().unwrap();
    for i in 0..1000 {
        w.put("t", &key(i), value).unwrap();
    }
    let froze_at = w.commit().unwrap();
    assert_eq!(env.stats().write_buffer_freezes, 1);
    (env, froze_at)
}

/// An abort of a transaction that adopted merged pages returns them, and only
/// explicit aborts count as aborts (taking a lent transaction back at close does not).
#[test]
fn an_abort_returns_what_was_merged_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (env, _) = frozen_thousand(dir.path(), 64, b"v");
    let pages_before = env.stats();
    for i in 0..5 {
        let mut w = env.begin_write().unwrap();
        w.put("t", &key(5000 + i), b"gone").unwrap();
        w.abort();
    }
    assert_eq!(env.stats().aborts, 5);
    assert_eq!(env.stats().write_buffer_keys_merged_ahead, 0);
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", &key(5000)).unwrap(), None);
    assert_eq!(r.tree_len("t").unwrap(), 1001);
    drop(r);
    // Five aborted merges took no page for good: the file did not grow by them.
    assert_eq!(env.stats().data_file_bytes, pages_before.data_file_bytes);
    // An abort releases the lock (nothing is lent after it): this commit merges its
    // slice itself and lends the next transaction, whose commit counts keys ahead.
    for i in 0..2 {
        let mut w = env.begin_write().unwrap();
        w.put("t", &key(6000 + i), b"kept").unwrap();
        w.commit().unwrap();
    }
    assert!(env.stats().write_buffer_keys_merged_ahead > 0);
    assert!(env.check().unwrap().is_clean());
    assert_eq!(
        env.stats().aborts,
        5,
        "taking lent trees back is not an abort"
    );
    env.close().unwrap();
}

/// A transaction that writes nothing commits nothing, even when the merge thread
/// merged keys for it: its commit returns the last id and writes no record.
#[test]
fn an_empty_transaction_stays_empty() {
    let dir = tempfile::tempdir().unwrap();
    let (env, froze_at) = frozen_thousand(dir.path(), 64, b"v");
    let commits = env.stats().commits;
    // Adopts the transaction lent at that commit, with 64 keys merged.
    let w = env.begin_write().unwrap();
    assert_eq!(w.commit().unwrap(), froze_at);
    assert_eq!(env.stats().commits, commits);
    let mut w = env.begin_write().unwrap();
    assert_eq!(w.txn_id(), froze_at + 1);
    w.put("t", &key(5000), b"v").unwrap();
    w.commit().unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), 1002);
}

/// A queued group adopts a transaction lent by a direct commit and takes its trees
/// back before its first unit: a unit that fails is rolled back alone, and what was
/// merged ahead for the group stays.
#[test]
fn queued_groups_merge_ahead_and_roll_back_units_alone() {
    let done = watchdog("queued");
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    {
        let env = Env::open(dir.path(), options(MergeAhead::WhileOpen, 32 << 10)).unwrap();
        env.submit(|w| {
            w.ensure_tree("t")?;
            w.put("t", b"zzzz", b"end")
        })
        .unwrap();
        model.insert(b"zzzz".to_vec(), b"end".to_vec());
        for round in 0..200u32 {
            let keys: Vec<Vec<u8>> = (0..40)
                .map(|i| key((round * 7919 + i * 13) % 5000))
                .collect();
            let fails = round % 9 == 4;
            let unit_keys = keys.clone();
            let r = env.submit(move |w| {
                for k in &unit_keys {
                    w.put("t", k, k)?;
                }
                if fails {
                    return Err(kiln_storage::Error::TreeNotFound("on purpose".into()));
                }
                Ok(())
            });
            assert_eq!(r.is_err(), fails, "round {round}");
            // A direct commit of 40 buffer writes lends the next transaction, which
            // the next round's group adopts.
            let mut w = env.begin_write().unwrap();
            for i in 0..40 {
                let k = key(6000 + (round * 31 + i) % 3000);
                w.put("t", &k, b"direct").unwrap();
                model.insert(k, b"direct".to_vec());
            }
            w.commit().unwrap();
            if !fails {
                for k in keys {
                    model.insert(k.clone(), k);
                }
            }
        }
        assert!(
            env.stats().write_buffer_keys_merged_ahead > 0,
            "nothing was merged ahead"
        );
        let r = env.begin_read().unwrap();
        assert_eq!(r.tree_len("t").unwrap(), model.len() as u64);
        drop(r);
        env.close().unwrap();
    }
    let env = Env::open(dir.path(), Options::default()).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), model.len() as u64);
    for (k, v) in &model {
        assert_eq!(r.get("t", k).unwrap(), Some(&v[..]));
    }
    done.store(true, Ordering::Relaxed);
}
