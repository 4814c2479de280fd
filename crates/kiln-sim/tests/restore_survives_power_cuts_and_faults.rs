//! A restore on the simulated disk. Every file operation of `restore_from` — the
//! staging environment, its sync, the rename into place and the directory syncs —
//! goes through the I/O trait, so the simulator can cut the power at any of them or
//! fail any write or sync. What must hold:
//! - a restore that returned `Ok` survives a power cut right after it (the target
//!   is there, complete, after any cut mode);
//! - after a cut or a fault the target is either absent or the complete backup,
//!   never a part of it, and a failed restore leaves no staging directory behind
//!   (a cut may: the next restore picks a new staging name);
//! - a retry on the same disk then succeeds.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_sim::driver::{self, Model};
use kiln_sim::{CutMode, Fault, OpKind, SimDisk};
use kiln_storage::backup::restore_from;
use kiln_storage::{BackupOptions, Env, RestoreOptions};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;

const TARGET: &str = "/sim/restored/env";

/// A source environment of three trees (small entries, and values large enough
/// to need overflow pages), and a full backup of it.
fn source_backup() -> (Vec<u8>, Model) {
    let disk = SimDisk::new(1);
    let env = Env::open(Path::new("/sim/source"), driver::options(&disk)).unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    for round in 0..6u32 {
        let mut w = env.begin_write().unwrap();
        for tree in ["orders", "users", "blobs"] {
            w.ensure_tree(tree).unwrap();
            for i in 0..300u32 {
                let key = format!("{tree}-{:05}", rng.gen_range(0..1500u32)).into_bytes();
                let len = if tree == "blobs" && i % 20 == 0 {
                    rng.gen_range(5_000..40_000)
                } else {
                    rng.gen_range(1..300)
                };
                let value: Vec<u8> = (0..len).map(|b| (b as u32 + round * 7) as u8).collect();
                w.put(tree, &key, &value).unwrap();
            }
        }
        w.commit().unwrap();
    }
    let mut backup = Vec::new();
    env.backup_to(&mut backup, BackupOptions::default(), |_| {})
        .unwrap();
    let model = driver::read_state(&env).unwrap();
    assert!(model.values().map(|t| t.len()).sum::<usize>() > 2_000);
    (backup, model)
}

fn restore(disk: &Arc<SimDisk>, backup: &[u8]) -> Result<(), String> {
    let opts = RestoreOptions {
        storage: driver::options(disk),
        staging_dir: None,
    };
    restore_from(backup, Path::new(TARGET), opts, |_| {})
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Names under the target's parent other than the target: staging leftovers.
fn leftovers(disk: &Arc<SimDisk>) -> Vec<String> {
    let parent = Path::new(TARGET).parent().unwrap();
    disk.files()
        .into_iter()
        .filter(|p| p.starts_with(parent) && !p.starts_with(TARGET))
        .map(|p| p.display().to_string())
        .collect()
}

/// The target, if there: it must open and hold exactly the backup.
fn target_state(disk: &Arc<SimDisk>, when: &str) -> Option<Model> {
    if !disk.files().iter().any(|p| p.starts_with(TARGET)) {
        return None;
    }
    let env = Env::open(Path::new(TARGET), driver::options(disk))
        .unwrap_or_else(|e| panic!("{when}: the restored target does not open: {e}"));
    let state = driver::read_state(&env).unwrap();
    let report = env.check().unwrap();
    assert!(report.problems.is_empty(), "{when}: {:?}", report.problems);
    env.close().unwrap();
    Some(state)
}

fn assert_complete(disk: &Arc<SimDisk>, want: &Model, when: &str) {
    match target_state(disk, when) {
        Some(got) => assert!(got == *want, "{when}: the target differs from the backup"),
        None => panic!("{when}: no target"),
    }
}

/// How many mutating operations one undisturbed restore takes.
fn ops_of_a_restore(backup: &[u8], want: &Model) -> u64 {
    let disk = SimDisk::new(3);
    restore(&disk, backup).unwrap();
    let ops = disk.ops();
    disk.cut_power(CutMode::DropAll);
    disk.restart();
    assert_complete(&disk, want, "an undisturbed restore after a cut");
    assert!(leftovers(&disk).is_empty(), "{:?}", leftovers(&disk));
    ops
}

#[test]
fn a_restore_cut_anywhere_is_all_or_nothing_and_a_retry_succeeds() {
    let (backup, want) = source_backup();
    let total_ops = ops_of_a_restore(&backup, &want);
    assert!(total_ops > 20, "a restore of {total_ops} operations");
    let points: u64 = std::env::var("KILN_SIM_RESTORE_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    // Spread over the restore, and each of its last operations (the environment's
    // close, the directory syncs, the rename into place) and one past its end.
    let mut cut_points: Vec<u64> = (0..points).map(|k| k * total_ops / points).collect();
    cut_points.extend(total_ops.saturating_sub(8)..=total_ops);
    let (mut absent, mut complete) = (0, 0);
    for (k, at) in cut_points.into_iter().enumerate() {
        let mode = [CutMode::DropAll, CutMode::KeepAll, CutMode::Random][k % 3];
        let disk = SimDisk::new(100 + k as u64);
        disk.cut_power_at(at, mode);
        let result = restore(&disk, &backup);
        let acknowledged = result.is_ok();
        if acknowledged {
            // The cut point was past the restore: cut now, after the answer.
            disk.cut_power(mode);
        }
        disk.restart();
        let when = format!("cut at op {at}/{total_ops} ({mode:?}, restore said {result:?})");
        match target_state(&disk, &when) {
            Some(got) => {
                assert!(got == want, "{when}: the target differs from the backup");
                complete += 1;
            }
            None => {
                assert!(!acknowledged, "{when}: an acknowledged restore is gone");
                absent += 1;
                restore(&disk, &backup).unwrap_or_else(|e| panic!("{when}: the retry: {e}"));
                assert_complete(&disk, &want, &format!("{when}, retried"));
            }
        }
    }
    println!("{} cuts over {total_ops} operations: {absent} left no target (retried), {complete} a complete one", absent + complete);
    assert!(
        absent > 0 && complete > 0,
        "the cuts must land on both sides of the rename"
    );
}

#[test]
fn a_failed_write_or_sync_fails_the_restore_and_leaves_nothing() {
    let (backup, want) = source_backup();
    let probe = SimDisk::new(4);
    restore(&probe, &backup).unwrap();
    let stats = probe.stats();
    println!("an undisturbed restore: {stats:?}");
    let mut failed = 0;
    for (kind, count) in [(OpKind::Write, 12u64), (OpKind::Sync, 6)] {
        for nth in 0..count {
            // Spread over the restore: the first writes, and later ones.
            let nth = nth * nth;
            let disk = SimDisk::new(200 + nth);
            disk.inject_fault(kind, nth, Fault::Eio);
            let when = format!("{kind:?} #{nth} fails");
            match restore(&disk, &backup) {
                Ok(()) => {
                    // The fault never came (fewer operations than `nth`).
                    disk.clear_faults();
                    assert_complete(&disk, &want, &when)
                }
                Err(e) => {
                    failed += 1;
                    assert!(
                        e.contains("I/O error") || e.contains("Input/output"),
                        "{when}: {e}"
                    );
                    assert!(
                        target_state(&disk, &when).is_none(),
                        "{when}: a target appeared"
                    );
                    assert!(
                        leftovers(&disk).is_empty(),
                        "{when}: left {:?}",
                        leftovers(&disk)
                    );
                    disk.clear_faults();
                    restore(&disk, &backup).unwrap_or_else(|e| panic!("{when}, retried: {e}"));
                    assert_complete(&disk, &want, &format!("{when}, retried"));
                }
            }
        }
    }
    assert!(
        failed >= 10,
        "only {failed} injected faults failed the restore"
    );
}
