//! Merges that read their leaves ahead (`Options::read_ahead`, the path taken
//! past RAM) leave the same contents as a model, across reopen, and the statistics
//! show that they did read ahead; with `Never` they do not.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Options, ReadAhead};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::BTreeMap;

fn opts(read_ahead: ReadAhead) -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        // Small: many freezes and merge slices, leaves overflowing into siblings.
        write_buffer_bytes: 64 << 10,
        read_ahead,
        ..Options::default()
    }
}

fn run(read_ahead: ReadAhead) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(11);
    let mut slices = 0;
    for round in 0..3 {
        let env = Env::open(dir.path(), opts(read_ahead)).unwrap();
        for _ in 0..40 {
            let mut w = env.begin_write().unwrap();
            w.ensure_tree("t").unwrap();
            for _ in 0..200 {
                let key = format!("k{:06}", rng.gen_range(0..30_000)).into_bytes();
                if rng.gen_bool(0.1) {
                    if model.remove(&key).is_some() {
                        w.delete("t", &key).unwrap();
                    }
                } else {
                    let value = vec![rng.gen::<u8>(); rng.gen_range(50..400)];
                    w.put("t", &key, &value).unwrap();
                    model.insert(key, value);
                }
            }
            w.commit().unwrap();
        }
        slices += env.stats().batches_read_ahead;
        let r = env.begin_read().unwrap();
        assert_eq!(
            r.tree_len("t").unwrap(),
            model.len() as u64,
            "round {round}"
        );
        for (k, v) in model.iter().step_by(7) {
            assert_eq!(r.get("t", k).unwrap(), Some(&v[..]), "round {round}");
        }
        drop(r);
        env.close().unwrap();
    }
    let env = Env::open(dir.path(), opts(read_ahead)).unwrap();
    env.check().unwrap();
    let r = env.begin_read().unwrap();
    let mut c = r.cursor("t").unwrap();
    let mut seen = Vec::new();
    let mut e = c.first().unwrap();
    while let Some((k, v)) = e {
        seen.push((k.to_vec(), v.to_vec()));
        e = c.next().unwrap();
    }
    let want: Vec<_> = model.into_iter().collect();
    assert!(seen == want, "the tree equals the model after reopen");
    slices
}

#[test]
fn merges_that_read_ahead_keep_every_entry() {
    let slices = run(ReadAhead::Always);
    assert!(slices > 10, "merge slices read ahead: {slices}");
}

#[test]
fn never_reads_ahead_with_never() {
    assert_eq!(run(ReadAhead::Never), 0);
}
