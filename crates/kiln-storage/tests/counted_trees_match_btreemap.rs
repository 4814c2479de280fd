//! Counted trees (order-statistic B+trees, `btree/count.rs`): `count_range` equals a
//! `BTreeMap` model's count for random ranges after random puts and deletes, with
//! entries still in the write buffer (small buffer: generations freeze and merge
//! all the time), after `check` merged them into the tree, inside a write
//! transaction (its own writes), from a reader's old snapshot after later commits,
//! and across reopens. Long keys make deep trees, so splits and merges of branches
//! run often. An uncounted tree gets the same operations: its walked count must
//! agree too, and `check` must find both trees clean.
//!
//! `KILN_COUNTED_SEEDS=<n>` runs more seeds.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Options, ReadTxn};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::ops::Bound;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

const COUNTED: &str = "counted";
const PLAIN: &str = "plain";

fn opts(buffered: bool) -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        write_buffer_bytes: if buffered { 64 << 10 } else { 0 },
        // Buffered: merges take the past-RAM path (leaves read ahead, a sibling
        // already held preferred by a spread).
        read_ahead: if buffered {
            kiln_storage::ReadAhead::Always
        } else {
            kiln_storage::ReadAhead::WhileFaulting
        },
        ..Options::default()
    }
}

fn key(rng: &mut StdRng) -> Vec<u8> {
    let n: u32 = rng.gen_range(0..4000);
    let mut k = format!("k{n:05}").into_bytes();
    // A third of the keys are long: few cells per page, deep trees.
    if n.is_multiple_of(3) {
        k.resize(300 + (n as usize % 500), b'.');
    }
    k
}

fn bound(rng: &mut StdRng) -> Bound<Vec<u8>> {
    match rng.gen_range(0..5) {
        0 => Bound::Unbounded,
        1 | 2 => Bound::Included(key(rng)),
        _ => Bound::Excluded(key(rng)),
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn model_count(m: &Model, lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> u64 {
    let empty = match (lo, hi) {
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
            a > b || (a == b && !matches!((lo, hi), (Bound::Included(_), Bound::Included(_))))
        }
        _ => false,
    };
    if empty {
        return 0;
    }
    m.range::<Vec<u8>, _>((lo.clone(), hi.clone())).count() as u64
}

fn check_ranges(r: &ReadTxn, m: &Model, rng: &mut StdRng, what: &str) {
    for _ in 0..25 {
        let (lo, hi) = (bound(rng), bound(rng));
        let want = model_count(m, &lo, &hi);
        for tree in [COUNTED, PLAIN] {
            let got = r.count_range(tree, as_ref(&lo), as_ref(&hi)).unwrap();
            assert_eq!(got, want, "{what}: {tree} count of {lo:?}..{hi:?}");
        }
    }
    assert_eq!(r.tree_len(COUNTED).unwrap(), m.len() as u64, "{what}: len");
}

fn run_seed(seed: u64, buffered: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut env = Env::open(dir.path(), opts(buffered)).unwrap();
    {
        let mut w = env.begin_write().unwrap();
        w.create_counted_tree(COUNTED).unwrap();
        w.create_tree(PLAIN).unwrap();
        w.commit().unwrap();
    }
    let mut model = Model::new();
    for round in 0..60 {
        let what = format!("seed {seed} buffered {buffered} round {round}");
        let mut w = env.begin_write().unwrap();
        let ops = rng.gen_range(1..150);
        // Some rounds grow the trees, some shrink them (merges of nodes).
        let delete_pct = if round % 10 < 6 { 25 } else { 75 };
        for _ in 0..ops {
            let k = key(&mut rng);
            if rng.gen_range(0..100) < delete_pct {
                let had = model.remove(&k).is_some();
                assert_eq!(w.delete(COUNTED, &k).unwrap(), had, "{what}");
                assert_eq!(w.delete(PLAIN, &k).unwrap(), had, "{what}");
            } else {
                let v = vec![b'v'; rng.gen_range(0..40)];
                w.put(COUNTED, &k, &v).unwrap();
                w.put(PLAIN, &k, &v).unwrap();
                model.insert(k, v);
            }
        }
        // The transaction's own writes count.
        for _ in 0..5 {
            let (lo, hi) = (bound(&mut rng), bound(&mut rng));
            let got = w.count_range(COUNTED, as_ref(&lo), as_ref(&hi)).unwrap();
            assert_eq!(
                got,
                model_count(&model, &lo, &hi),
                "{what}: in the write txn"
            );
        }
        w.commit().unwrap();
        {
            let r = env.begin_read().unwrap();
            check_ranges(&r, &model, &mut rng, &what);
        }
        match rng.gen_range(0..10) {
            0 => {
                // Merges the buffer into the trees, then checks every count.
                let report = env.check().unwrap();
                assert!(report.is_clean(), "{what}: {:?}", report.problems);
            }
            1 => {
                env.close().unwrap();
                env = Env::open(dir.path(), opts(buffered)).unwrap();
                let r = env.begin_read().unwrap();
                assert!(r.tree_is_counted(COUNTED).unwrap());
                assert!(!r.tree_is_counted(PLAIN).unwrap());
                check_ranges(&r, &model, &mut rng, &format!("{what}, reopened"));
            }
            _ => {}
        }
    }
    let report = env.check().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:?}", report.problems);
}

/// An old snapshot's counts stay those of its commit while later commits change
/// the tree and the buffer merges.
#[test]
fn a_snapshot_counts_as_of_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts(true)).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut model = Model::new();
    {
        let mut w = env.begin_write().unwrap();
        w.create_counted_tree(COUNTED).unwrap();
        w.create_tree(PLAIN).unwrap();
        for _ in 0..3000 {
            let k = key(&mut rng);
            w.put(COUNTED, &k, b"x").unwrap();
            w.put(PLAIN, &k, b"x").unwrap();
            model.insert(k, b"x".to_vec());
        }
        w.commit().unwrap();
    }
    let snap = env.begin_read().unwrap();
    let frozen = model.clone();
    for _ in 0..20 {
        let mut w = env.begin_write().unwrap();
        for _ in 0..200 {
            let k = key(&mut rng);
            if rng.gen_bool(0.5) {
                w.delete(COUNTED, &k).unwrap();
                w.delete(PLAIN, &k).unwrap();
                model.remove(&k);
            } else {
                w.put(COUNTED, &k, b"y").unwrap();
                w.put(PLAIN, &k, b"y").unwrap();
                model.insert(k, b"y".to_vec());
            }
        }
        w.commit().unwrap();
        check_ranges(&snap, &frozen, &mut rng, "old snapshot");
        check_ranges(&env.begin_read().unwrap(), &model, &mut rng, "new snapshot");
    }
}

#[test]
fn counted_ranges_match_the_model_buffered() {
    let seeds: u64 = std::env::var("KILN_COUNTED_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    for seed in 0..seeds {
        run_seed(seed, true);
    }
}

#[test]
fn counted_ranges_match_the_model_unbuffered() {
    let seeds: u64 = std::env::var("KILN_COUNTED_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    for seed in 100..100 + seeds {
        run_seed(seed, false);
    }
}

/// A stored count that disagrees with the entries under its child is reported by
/// `check` with the page, the cell and both numbers; a range count whose descent
/// reaches a leaf under it fails as corrupted instead of answering a wrong number.
#[test]
fn check_reports_a_wrong_count_precisely() {
    use kiln_storage::page;
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts(false)).unwrap();
    {
        let mut w = env.begin_write().unwrap();
        w.create_counted_tree(COUNTED).unwrap();
        for i in 0..20_000u32 {
            w.put(COUNTED, format!("key{i:06}").as_bytes(), &[b'v'; 30])
                .unwrap();
        }
        w.commit().unwrap();
    }
    assert!(env.check().unwrap().is_clean());
    env.close().unwrap();
    let path = dir.path().join(kiln_storage::DATA_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let mut damaged = None;
    for (no, p) in bytes.chunks_mut(page::PAGE_SIZE).enumerate().skip(2) {
        if page::hdr::kind(p) == page::KIND_BRANCH
            && page::is_counted_branch(p)
            && page::hdr::count(p) > 0
        {
            let count = page::branch_count(p, 0);
            page::set_branch_count(p, 0, count + 1);
            page::seal(p, no as u64, page::hdr::txn_id(p));
            damaged = Some((no, count));
            break;
        }
    }
    let (no, count) = damaged.expect("a counted branch in the file");
    std::fs::write(&path, &bytes).unwrap();
    let env = Env::open(dir.path(), opts(false)).unwrap();
    let report = env.check().unwrap();
    assert!(
        report.problems.iter().any(|p| p.page == Some(no as u64)
            && p.what.contains("counted branch: cell 0 says child page")
            && p.what
                .contains(&format!("holds {} entries, it holds {count}", count + 1))),
        "{:?}",
        report.problems
    );
    // A descent that reaches a leaf under the wrong count (here, the damaged cell's
    // child or the leftmost, whose implied count moved the other way) fails.
    let r = env.begin_read().unwrap();
    let failed = (0..20_000u32)
        .step_by(50)
        .filter(|i| {
            let k = format!("key{i:06}");
            r.count_range(COUNTED, Bound::Included(k.as_bytes()), Bound::Unbounded)
                .is_err()
        })
        .count();
    assert!(failed > 0, "no range count through the wrong count failed");
}
