//! Journal files of different sizes. `journal_file_size_bytes` may differ from one
//! open to the next (`kiln serve --journal-file-size-mib` changed between restarts):
//! files that exist keep their size, new ones take the new size, and recovery
//! replays a journal whose files have different sizes. And a new environment starts
//! small: its first journal file is `journal_first_file_bytes`, and its data file
//! grows from 1 MiB, doubling.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod crash_copy;
mod values;

use crash_copy::{crash_copy, without_checkpoints};
use kiln_storage::{Env, Options};
use std::collections::BTreeSet;
use std::path::Path;

const VALUE_BYTES: usize = 16 << 10;

fn options(journal_file_size_bytes: u64) -> Options {
    Options {
        journal_file_size_bytes,
        ..without_checkpoints()
    }
}

/// The value of `key`: incompressible (the journal compresses records), so that a
/// MiB of journal takes few commits.
fn value_of(key: u64) -> Vec<u8> {
    values::incompressible(key, VALUE_BYTES)
}

/// Commits one 16 KiB value per transaction until the journal has grown by `bytes`,
/// recording the keys committed in `model`.
fn commit_journal_bytes(env: &Env, model: &mut BTreeSet<u64>, bytes: u64) {
    let target = env.stats().journal_bytes + bytes;
    let mut key = model.iter().next_back().map_or(0, |k| k + 1);
    while env.stats().journal_bytes < target {
        let mut w = env.begin_write().unwrap();
        w.put("t", &key.to_be_bytes(), &value_of(key)).unwrap();
        w.commit().unwrap();
        model.insert(key);
        key += 1;
    }
}

fn assert_matches(env: &Env, model: &BTreeSet<u64>) {
    let r = env.begin_read().unwrap();
    for key in model {
        let value = r.get("t", &key.to_be_bytes()).unwrap();
        assert_eq!(value, Some(&value_of(*key)[..]), "key {key}");
    }
}

fn journal_file_sizes(dir: &Path) -> Vec<u64> {
    let mut sizes: Vec<(String, u64)> = std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    sizes.sort();
    sizes.into_iter().map(|(_, len)| len).collect()
}

#[test]
fn files_of_two_sizes_are_written_and_replayed_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let mut model = BTreeSet::new();

    // 1 MiB files, across two switches, then closed cleanly.
    let env = Env::open(dir.path(), options(1 << 20)).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    commit_journal_bytes(&env, &mut model, 5 << 19);
    env.close().unwrap();
    assert!(journal_file_sizes(dir.path())
        .iter()
        .all(|&len| len == 1 << 20));

    // Reopened with 3 MiB files: the current 1 MiB file is used up first, then the
    // new files are 3 MiB (recycled old files keep their 1 MiB).
    let env = Env::open(dir.path(), options(3 << 20)).unwrap();
    assert_matches(&env, &model);
    let commits_before = model.len() as u64;
    commit_journal_bytes(&env, &mut model, 7 << 20);
    let commits_since_open = model.len() as u64 - commits_before;
    let sizes = journal_file_sizes(dir.path());
    assert!(sizes.contains(&(3 << 20)), "{sizes:?}");
    assert!(sizes.contains(&(1 << 20)), "{sizes:?}");
    // A crash now: no checkpoint since this open, so recovery replays every commit
    // of this open from files of both sizes.
    println!(
        "journal files before the crash: {:?}",
        journal_file_sizes(dir.path())
    );
    crash_copy(dir.path(), crashed.path());
    drop(env);

    let (env, report) = Env::open_with_report(crashed.path(), options(1 << 20)).unwrap();
    assert!(
        report.records_replayed >= commits_since_open,
        "{report:?}: {commits_since_open} commits since the last open"
    );
    println!(
        "replayed {} records after the crash",
        report.records_replayed
    );
    assert_matches(&env, &model);
    // And goes on writing (new files of 1 MiB again) and reopens.
    commit_journal_bytes(&env, &mut model, 3 << 20);
    env.close().unwrap();
    let env = Env::open(crashed.path(), options(2 << 20)).unwrap();
    assert_matches(&env, &model);
    assert!(model.len() > 600, "{} commits", model.len());
}

const MIB: u64 = 1 << 20;

fn growing_options(first_mib: u64, cap_mib: u64) -> Options {
    Options {
        journal_first_file_bytes: Some(first_mib * MIB),
        journal_file_size_bytes: cap_mib * MIB,
        data_grow_step_bytes: 64 * MIB,
        ..without_checkpoints()
    }
}

/// Journal file sizes in order: `first`, then `full` ones.
fn assert_first_small(sizes: &[u64], first: u64, full: u64) {
    assert!(sizes.len() >= 2, "{sizes:?}");
    for (i, len) in sizes.iter().enumerate() {
        assert_eq!(
            *len,
            if i == 0 { first } else { full },
            "file {i} of {sizes:?}"
        );
    }
}

fn data_file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(kiln_storage::DATA_FILE))
        .unwrap()
        .len()
}

fn open_with_tree(dir: &Path, opts: Options) -> Env {
    let env = Env::open(dir, opts).unwrap();
    let mut w = env.begin_write().unwrap();
    w.ensure_tree("t").unwrap();
    w.commit().unwrap();
    env
}

/// A new environment takes little disk, and its files grow with use: the first
/// journal file is `journal_first_file_bytes`, each file made after it is full size
/// (`journal_file_size_bytes`), and the small one is recycled among them; the data
/// file starts at 1 MiB and doubles up to a growth step. A crash replays a journal
/// made of files of both sizes.
#[test]
fn a_new_environment_starts_small_and_its_files_grow_with_use() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let mut model = BTreeSet::new();
    let env = open_with_tree(dir.path(), growing_options(4, 16));
    assert_eq!(journal_file_sizes(dir.path()), vec![4 * MIB]);
    assert_eq!(data_file_len(dir.path()), MIB);

    // Sixteen commits written back: still one 4 MiB journal file, and a data file
    // of a few MiB (a whole 64 MiB step before).
    commit_journal_bytes(&env, &mut model, 256 << 10);
    env.sync().unwrap();
    assert_eq!(journal_file_sizes(dir.path()), vec![4 * MIB]);
    let data_len = data_file_len(dir.path());
    assert!(data_len <= 4 * MIB, "data file of {data_len} bytes");

    // 40 MiB of journal, no checkpoint: files of 4, 16, 16... MiB, in order.
    let synced_commits = model.len() as u64;
    commit_journal_bytes(&env, &mut model, 40 * MIB);
    assert_first_small(&journal_file_sizes(dir.path()), 4 * MIB, 16 * MIB);

    crash_copy(dir.path(), crashed.path());
    let (copy, report) = Env::open_with_report(crashed.path(), growing_options(4, 16)).unwrap();
    let commits_since_sync = model.len() as u64 - synced_commits;
    assert!(report.records_replayed >= commits_since_sync, "{report:?}");
    assert_matches(&copy, &model);
    drop(copy);

    // Checkpoints now and then: files below the synced point are recycled (the small
    // one keeps its size, if it is still among them), no file is made past what the
    // rounds of recycling need, and at most two spares are kept beside the current
    // file (the 40 MiB written without a checkpoint above made four files: the
    // spares beyond two are removed once synced).
    for _ in 0..8 {
        commit_journal_bytes(&env, &mut model, 8 * MIB);
        env.sync().unwrap();
    }
    let stats = env.stats();
    assert!(stats.journal_files_recycled >= 3, "{stats:?}");
    let sizes = journal_file_sizes(dir.path());
    assert!(
        sizes.iter().filter(|&&len| len == 4 * MIB).count() <= 1,
        "{sizes:?}"
    );
    assert!(
        sizes.len() <= 3,
        "current file and at most two spares: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&len| len == 4 * MIB || len == 16 * MIB),
        "{sizes:?}"
    );
    env.close().unwrap();
    let env = Env::open(dir.path(), growing_options(4, 16)).unwrap();
    assert_matches(&env, &model);
}

/// A young environment reopened makes full-size files from then on; one whose
/// files are already full size (made before files grew, or with the first size equal
/// to the full one) keeps making full-size files.
#[test]
fn a_reopened_environment_makes_full_size_files() {
    let young = tempfile::tempdir().unwrap();
    let mut model = BTreeSet::new();
    let env = open_with_tree(young.path(), growing_options(4, 64));
    commit_journal_bytes(&env, &mut model, 64 << 10);
    env.close().unwrap();
    assert_eq!(journal_file_sizes(young.path()), vec![4 * MIB]);
    let env = Env::open(young.path(), growing_options(4, 64)).unwrap();
    commit_journal_bytes(&env, &mut model, 5 * MIB);
    // (A second 64 MiB file may be ready already: the writer asks for a spare on
    // switching.)
    assert_first_small(&journal_file_sizes(young.path()), 4 * MIB, 64 * MIB);
    assert_matches(&env, &model);
    drop(env);

    let grown = tempfile::tempdir().unwrap();
    let env = open_with_tree(grown.path(), growing_options(16, 16));
    commit_journal_bytes(&env, &mut model, MIB);
    env.close().unwrap();
    let env = Env::open(grown.path(), growing_options(4, 16)).unwrap();
    commit_journal_bytes(&env, &mut model, 20 * MIB);
    // Every file made after the reopen is full size; the one small file is the
    // one the clean close left (4 MiB, `CLOSE_FILE_BYTES`), kept in the rotation.
    let sizes = journal_file_sizes(grown.path());
    assert!(
        sizes.len() >= 2
            && sizes.iter().filter(|&&len| len == 16 * MIB).count() >= sizes.len() - 1
            && sizes.iter().all(|&len| len == 16 * MIB || len == 4 * MIB),
        "{sizes:?}"
    );
}
