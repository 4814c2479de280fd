//! A large replay (48 MiB of page images, more than `max_unflushed_bytes`) after a
//! power cut that dropped every unsynced write (what the flusher wrote back before
//! the cut), and a second cut right after the reopen, before any checkpoint (what
//! the replay wrote is gone again): each reopen must rebuild everything from the
//! journal, and a page the replay failed to write would be missing or stale.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_sim::{driver, CutMode, SimDisk};
use kiln_storage::{Env, Options};
use std::collections::BTreeMap;
use std::path::Path;

fn opts(disk: &std::sync::Arc<SimDisk>) -> Options {
    Options {
        max_unflushed_bytes: 32 << 20,
        write_back_window_bytes: 1 << 20,
        ..driver::options(disk)
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

fn assert_matches(env: &Env, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), model.len() as u64, "{when}");
    for (k, v) in model {
        assert_eq!(r.get("t", k).unwrap(), Some(&v[..]), "{when}: key {k:?}");
    }
    drop(r);
    let report = env.check().unwrap();
    assert!(report.problems.is_empty(), "{when}: {:?}", report.problems);
}

#[test]
fn a_large_replay_survives_power_cuts_before_and_after_it() {
    let disk = SimDisk::new(7);
    let dir = Path::new("/sim/budget");
    let mut model = BTreeMap::new();
    let env = Env::open(dir, opts(&disk)).unwrap();
    // 48 MiB of overflow runs and small entries (leaf diffs), none of it synced.
    for t in 0..48u32 {
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        for i in t * 64..(t + 1) * 64 {
            let big = vec![(i % 251) as u8; 16 << 10];
            w.put("t", &key(i), &big).unwrap();
            model.insert(key(i), big);
            let small = format!("small{}", i % 500).into_bytes();
            w.put("t", &small, &i.to_be_bytes()).unwrap();
            model.insert(small, i.to_be_bytes().to_vec());
        }
        w.commit().unwrap();
    }
    disk.cut_power(CutMode::DropAll);
    drop(env);
    disk.restart();

    let (env, report) = Env::open_with_report(dir, opts(&disk)).unwrap();
    assert!(report.records_replayed >= 48, "{report:?}");
    assert_matches(&env, &model, "first reopen");
    // Again before any checkpoint: the replay's writes and kept images are gone.
    disk.cut_power(CutMode::DropAll);
    drop(env);
    disk.restart();

    let env = Env::open(dir, opts(&disk)).unwrap();
    assert_matches(&env, &model, "second reopen");
    env.close().unwrap();
    let env = Env::open(dir, opts(&disk)).unwrap();
    assert_matches(&env, &model, "after a clean close");
}
