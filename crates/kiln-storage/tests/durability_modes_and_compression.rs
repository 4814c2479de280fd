//! Buffered durability acknowledges before the journal is synced but still survives
//! a process crash (the OS has the writes); compressed journal records replay
//! correctly after a crash.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod crash_copy;

use crash_copy::{crash_copy, without_checkpoints};
use kiln_storage::{Durability, Env, Options};
use std::path::Path;

/// No checkpoint during the test: everything must come back from the journal.
fn opts() -> Options {
    Options {
        // Compress by the fixed rule: on a fast disk the adaptive one would rightly
        // store these records as they are, and the test is about compressed ones.
        journal_compression_adaptive: false,
        ..without_checkpoints()
    }
}

fn commit_batches(env: &Env, batches: u32, compressible: bool) {
    for b in 0..batches {
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        for i in 0..200u32 {
            let v: Vec<u8> = if compressible {
                vec![b as u8; 300]
            } else {
                (0..300).map(|j| (i * 7 + j * 13 + b) as u8).collect()
            };
            w.put("t", format!("{b:04}/{i:04}").as_bytes(), &v).unwrap();
        }
        w.commit().unwrap();
    }
}

fn verify(dir: &Path, o: Options, batches: u32, compressible: bool) -> u64 {
    let (env, report) = Env::open_with_report(dir, o).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), batches as u64 * 200);
    for b in [0, batches / 2, batches - 1] {
        let v = r
            .get("t", format!("{b:04}/0007").as_bytes())
            .unwrap()
            .unwrap();
        let want: Vec<u8> = if compressible {
            vec![b as u8; 300]
        } else {
            (0..300).map(|j| (7 * 7 + j * 13 + b) as u8).collect()
        };
        assert_eq!(v, &want[..]);
    }
    drop(r);
    assert!(env.check().unwrap().is_clean());
    report.records_replayed
}

#[test]
fn compressed_records_replay_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts()).unwrap();
    commit_batches(&env, 30, true);
    let s = env.stats();
    assert!(
        s.journal_body_bytes_stored * 2 < s.journal_body_bytes_raw,
        "repetitive values should compress: raw {} stored {}",
        s.journal_body_bytes_raw,
        s.journal_body_bytes_stored
    );
    assert!(s.journal_body_bytes_raw <= s.journal_body_bytes_full_images);
    crash_copy(dir.path(), copy.path());
    drop(env);
    assert_eq!(
        verify(copy.path(), opts(), 30, true),
        30,
        "every commit must come back from the journal"
    );
}

#[test]
fn incompressible_records_are_stored_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let o = Options {
        journal_compression: true,
        ..opts()
    };
    let env = Env::open(dir.path(), o).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    let mut noise = vec![0u8; 200_000];
    rand::RngCore::fill_bytes(
        &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7),
        &mut noise,
    );
    w.put("t", b"noise", &noise).unwrap();
    w.commit().unwrap();
    let s = env.stats();
    assert_eq!(
        s.journal_body_bytes_stored, s.journal_body_bytes_raw,
        "random bytes must not be 'compressed'"
    );
}

#[test]
fn buffered_durability_survives_a_process_crash() {
    let dir = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let o = Options {
        durability: Durability::Buffered {
            sync_interval_ms: 50,
        },
        ..opts()
    };
    let env = Env::open(dir.path(), o.clone()).unwrap();
    commit_batches(&env, 20, false);
    assert!(
        !env.stats().journal_direct_io_fallback,
        "buffered mode is a choice, not a fallback"
    );
    crash_copy(dir.path(), copy.path());
    drop(env);
    assert_eq!(verify(copy.path(), o.clone(), 20, false), 20);
    // And a clean close keeps everything too.
    let env = Env::open(dir.path(), o.clone()).unwrap();
    drop(env);
    verify(dir.path(), o, 20, false);
}

/// The buffered-mode journal sync runs on its own thread while the writer switches
/// journal files and checkpoints recycle them: nothing of that may latch the
/// environment or lose a commit. Journal files of 1 MiB, a checkpoint every 2 ms and a
/// journal sync every millisecond make the switches and recycles constant. (The race
/// of a file recycled between the sync reading which file is current and opening it
/// is forced in `io_failure_fails_commit_and_latches.rs`.)
#[test]
fn buffered_syncs_survive_constant_journal_switches_and_recycling() {
    let dir = tempfile::tempdir().unwrap();
    let o = Options {
        durability: Durability::Buffered {
            sync_interval_ms: 1,
        },
        sync_interval_ms: 2,
        sync_after_bytes: 256 << 10,
        write_back_window_bytes: 1 << 20,
        ..opts()
    };
    let env = Env::open(dir.path(), o.clone()).unwrap();
    // Incompressible values, so that the journal really fills its files.
    let mut value = vec![0u8; 20_000];
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(11);
    for i in 0..1500u32 {
        rand::RngCore::fill_bytes(&mut rng, &mut value);
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        w.put("t", &(i % 300).to_be_bytes(), &value).unwrap();
        w.commit().unwrap();
    }
    let s = env.stats();
    assert!(s.journal_files_recycled > 5, "{s:?}");
    assert!(s.buffered_journal_sync_latency.count > 0, "{s:?}");
    env.close().unwrap();
    let env = Env::open(dir.path(), o).unwrap();
    assert_eq!(env.begin_read().unwrap().tree_len("t").unwrap(), 300);
}
