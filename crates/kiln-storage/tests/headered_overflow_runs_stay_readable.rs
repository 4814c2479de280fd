//! Files written before bare runs hold large values in headered overflow runs.
//! This binary writes such a file (through a test hook: process-wide, hence a test
//! binary of its own), then reads, checks, replaces and frees those values with
//! today's code, which writes bare runs beside them.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::page::WRITE_HEADERED_OVERFLOW_RUNS_FOR_TESTS as HEADERED;
use kiln_storage::{Env, Options};
use std::sync::atomic::Ordering::Relaxed;

fn value(i: usize) -> Vec<u8> {
    (0..10_000 + i * 3_000)
        .map(|j| ((j * 7 + i) % 251) as u8)
        .collect()
}

#[test]
fn headered_runs_are_read_replaced_and_freed_beside_bare_ones() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        ..Options::default()
    };
    HEADERED.store(true, Relaxed);
    {
        let env = Env::open(dir.path(), opts()).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        for i in 0..6 {
            w.put("t", format!("old-{i}").as_bytes(), &value(i))
                .unwrap();
        }
        w.commit().unwrap();
        env.sync().unwrap();
    }
    HEADERED.store(false, Relaxed);

    let env = Env::open(dir.path(), opts()).unwrap();
    let pages_before = env.check().unwrap().pages_reachable;
    let mut w = env.begin_write().unwrap();
    for i in 0..6 {
        assert_eq!(
            w.get("t", format!("old-{i}").as_bytes()).unwrap(),
            Some(&value(i)[..])
        );
        w.put("t", format!("new-{i}").as_bytes(), &value(i))
            .unwrap();
    }
    // Replacing frees a headered run (its length read from its header); deleting
    // frees another.
    w.put("t", b"old-0", &value(5)).unwrap();
    assert!(w.delete("t", b"old-1").unwrap());
    w.commit().unwrap();
    env.sync().unwrap();
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(report.pages_reachable > pages_before);
    drop(env);

    let env = Env::open(dir.path(), opts()).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", b"old-0").unwrap(), Some(&value(5)[..]));
    assert_eq!(r.get("t", b"old-1").unwrap(), None);
    for i in 2..6 {
        assert_eq!(
            r.get("t", format!("old-{i}").as_bytes()).unwrap(),
            Some(&value(i)[..])
        );
    }
    for i in 0..6 {
        assert_eq!(
            r.get("t", format!("new-{i}").as_bytes()).unwrap(),
            Some(&value(i)[..])
        );
    }
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}
