//! 64 threads submit interleaved units through the commit queue; some units fail
//! (return an error after writing) or panic (after writing). Every acknowledged unit
//! is present after reopening, every failed one is absent, no unit is half applied,
//! and per-key order is preserved for the units of one thread.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Error, Options};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const THREADS: u64 = 64;
const UNITS_PER_THREAD: u64 = 40;

fn opts() -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        sync_interval_ms: 50,
        ..Options::default()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Commit,
    Fail,
    Panic,
}

fn fate(t: u64, i: u64) -> Fate {
    match (t * 31 + i * 7) % 13 {
        3 => Fate::Fail,
        8 => Fate::Panic,
        _ => Fate::Commit,
    }
}

fn key(t: u64, i: u64, part: &str) -> Vec<u8> {
    format!("t{t:02}/u{i:04}/{part}").into_bytes()
}

fn value(t: u64, i: u64) -> Vec<u8> {
    // Some values large enough to need overflow pages.
    let len = if i.is_multiple_of(9) { 9000 } else { 40 };
    vec![(t * 7 + i) as u8; len]
}

#[test]
fn failed_units_roll_back_alone_and_acknowledged_ones_survive() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts()).unwrap();
    {
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        w.commit().unwrap();
    }
    let acked = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let env = &env;
            let acked = &acked;
            s.spawn(move || {
                for i in 0..UNITS_PER_THREAD {
                    let f = fate(t, i);
                    let r = env.submit(move |txn| {
                        txn.put("t", &key(t, i, "a"), &value(t, i))?;
                        txn.put("t", format!("t{t:02}/last").as_bytes(), &i.to_be_bytes())?;
                        txn.put("t", &key(t, i, "b"), &value(t, i))?;
                        match f {
                            Fate::Commit => Ok(i),
                            Fate::Fail => {
                                Err(Error::UnitFailed(format!("unit {t}/{i} refuses").into()))
                            }
                            Fate::Panic => panic!("unit {t}/{i} panics"),
                        }
                    });
                    match (f, r) {
                        (Fate::Commit, Ok(v)) => {
                            assert_eq!(v, i);
                            acked.fetch_add(1, Relaxed);
                        }
                        (Fate::Fail, Err(Error::UnitFailed(e))) => {
                            assert!(e.to_string().contains("refuses"))
                        }
                        (Fate::Panic, Err(Error::UnitPanicked(m))) => {
                            assert!(m.contains("panics"), "{m}")
                        }
                        (f, r) => panic!("unit {t}/{i} ({f:?}): unexpected outcome {r:?}"),
                    }
                }
            });
        }
    });
    let stats = env.queue_stats();
    eprintln!(
        "commit queue: {} units committed, {} failed, {} groups, avg {:.1} units/group, max {}",
        stats.units_committed,
        stats.units_failed,
        stats.groups,
        stats.avg_group_units(),
        stats.max_group_units
    );
    assert_eq!(stats.units_committed, acked.load(Relaxed));
    assert!(
        stats.groups < stats.units_committed,
        "no merging happened: {stats:?}"
    );
    drop(env);

    let env = Env::open(dir.path(), opts()).unwrap();
    let r = env.begin_read().unwrap();
    let mut expected_entries = 0;
    for t in 0..THREADS {
        let mut last_committed = None;
        for i in 0..UNITS_PER_THREAD {
            let (a, b) = (
                r.get("t", &key(t, i, "a")).unwrap(),
                r.get("t", &key(t, i, "b")).unwrap(),
            );
            if fate(t, i) == Fate::Commit {
                assert_eq!(a, Some(&value(t, i)[..]), "acknowledged unit {t}/{i} lost");
                assert_eq!(
                    b,
                    Some(&value(t, i)[..]),
                    "acknowledged unit {t}/{i} half applied"
                );
                last_committed = Some(i);
                expected_entries += 2;
            } else {
                assert_eq!((a, b), (None, None), "failed unit {t}/{i} visible");
            }
        }
        // Units of one thread are applied in submission order: the last write wins.
        let last = r.get("t", format!("t{t:02}/last").as_bytes()).unwrap();
        assert_eq!(
            last.map(|v| u64::from_be_bytes(v.try_into().unwrap())),
            last_committed,
            "thread {t}"
        );
        expected_entries += u64::from(last_committed.is_some());
    }
    assert_eq!(r.tree_len("t").unwrap(), expected_entries);
    drop(r);
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_lone_submitter_is_not_delayed_and_overload_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts();
    o.queue_limits.max_queued_units = 0;
    let env = Env::open(dir.path(), o).unwrap();
    // With a queue bound of zero every submission is refused, with a clear error.
    let err = env.submit(|txn| txn.ensure_tree("t")).unwrap_err();
    assert!(matches!(err, Error::Overloaded { .. }), "{err}");
    assert!(err.to_string().contains("overloaded"), "{err}");
    drop(env);

    let env = Env::open(dir.path(), opts()).unwrap();
    for i in 0..50u32 {
        let txn = env.submit(move |txn| {
            txn.ensure_tree("t")?;
            txn.put("t", &i.to_be_bytes(), b"v")?;
            Ok(txn.txn_id())
        });
        txn.unwrap();
    }
    let s = env.queue_stats();
    assert_eq!(
        (s.units_committed, s.groups, s.max_group_units),
        (50, 50, 1),
        "{s:?}"
    );
    assert_eq!(env.begin_read().unwrap().tree_len("t").unwrap(), 50);
}
