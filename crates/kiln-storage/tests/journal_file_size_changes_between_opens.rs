//! `journal_file_size_bytes` may differ from one open to the next (`kiln serve
//! --journal-file-size-mib` changed between restarts): files that exist keep their
//! size, new ones take the new size, and recovery replays a journal whose files have
//! different sizes.

mod crash_copy;

use crash_copy::{crash_copy, without_checkpoints};
use kiln_storage::{Env, Options};
use std::collections::BTreeMap;
use std::path::Path;

const VALUE_BYTES: usize = 16 << 10;

fn options(journal_file_size_bytes: u64) -> Options {
    Options {
        journal_file_size_bytes,
        ..without_checkpoints()
    }
}

/// Commits one 16 KiB value per transaction until the journal has grown by `bytes`,
/// recording what was committed in `model`.
fn commit_journal_bytes(env: &Env, model: &mut BTreeMap<u64, u8>, bytes: u64) {
    let target = env.stats().journal_bytes + bytes;
    let mut key = model.keys().next_back().map_or(0, |k| k + 1);
    while env.stats().journal_bytes < target {
        let fill = (key % 251) as u8;
        let mut w = env.begin_write().unwrap();
        w.put("t", &key.to_be_bytes(), &vec![fill; VALUE_BYTES])
            .unwrap();
        w.commit().unwrap();
        model.insert(key, fill);
        key += 1;
    }
}

fn assert_matches(env: &Env, model: &BTreeMap<u64, u8>) {
    let r = env.begin_read().unwrap();
    for (key, fill) in model {
        let value = r.get("t", &key.to_be_bytes()).unwrap();
        assert_eq!(value, Some(&vec![*fill; VALUE_BYTES][..]), "key {key}");
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
    let mut model = BTreeMap::new();

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
    assert!(model.len() > 900, "{} commits", model.len());
}
