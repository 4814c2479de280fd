//! Large values live in bare runs: the value's bytes from the run's first byte, no
//! page header, the checksum in the leaf cell. A 16 KiB value takes two pages, not
//! three. These tests read such values from every place they can be (the writing
//! transaction, the unflushed table, the data file, a replayed journal) and damage
//! one on disk.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod crash_copy;

use crash_copy::{crash_copy, without_checkpoints};
use kiln_storage::{Env, Error, PAGE_SIZE};

/// Values whose sizes sit on and around page multiples, one with a long run of
/// trailing zeros (the journal image drops them; the replay must restore them).
fn values() -> Vec<(Vec<u8>, Vec<u8>)> {
    let sizes = [
        16 * 1024,
        16 * 1024,
        PAGE_SIZE,
        PAGE_SIZE + 1,
        3 * PAGE_SIZE - 1,
        40_000,
    ];
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let value = (0..len)
                .map(|j| ((j * 131 + i * 17) % 251) as u8 | 1)
                .collect();
            (format!("value-{i}").into_bytes(), value)
        })
        .collect();
    let mut zero_tail = vec![0u8; 20_000];
    zero_tail[..5_000].iter_mut().for_each(|b| *b = 0xA5);
    out.push((b"zero-tail".to_vec(), zero_tail));
    out
}

fn write_all(env: &Env, values: &[(Vec<u8>, Vec<u8>)]) {
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    for (k, v) in values {
        w.put("t", k, v).unwrap();
        // Read back inside the writing transaction: the run is still a dirty page.
        assert_eq!(w.get("t", k).unwrap(), Some(&v[..]));
    }
    w.commit().unwrap();
}

fn assert_all(env: &Env, values: &[(Vec<u8>, Vec<u8>)], when: &str) {
    let r = env.begin_read().unwrap();
    for (k, v) in values {
        let got = r.get("t", k).unwrap();
        assert!(
            got == Some(&v[..]),
            "{when}: value {} differs",
            String::from_utf8_lossy(k)
        );
    }
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{when}: {:?}", report.problems);
}

#[test]
fn a_16_kib_value_takes_two_pages_and_reads_back_from_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let vals = values();
    {
        let env = Env::open(dir.path(), without_checkpoints()).unwrap();
        let before = env.check().unwrap().pages_reachable;
        let mut w = env.begin_write().unwrap();
        w.create_tree("sixteen").unwrap();
        w.put("sixteen", b"k", &vec![7u8; 16 * 1024]).unwrap();
        w.commit().unwrap();
        let after = env.check().unwrap().pages_reachable;
        // The tree's one leaf, its catalog entry's page copy, and the value's run:
        // a headered run would have needed three pages.
        let leaf_and_catalog = 2;
        assert_eq!(
            after - before,
            leaf_and_catalog + 2,
            "pages used by one 16 KiB value"
        );

        write_all(&env, &vals);
        assert_all(&env, &vals, "just committed");
        env.sync().unwrap();
        assert_all(&env, &vals, "after a checkpoint");
    }
    let env = Env::open(dir.path(), without_checkpoints()).unwrap();
    assert_all(&env, &vals, "reopened");

    // Replacing and deleting values frees their runs; the check accounts for every
    // page (a run freed with the wrong length would show as leaked or doubly used).
    let mut w = env.begin_write().unwrap();
    for (i, (k, v)) in vals.iter().enumerate() {
        if i % 2 == 0 {
            assert!(w.delete("t", k).unwrap());
        } else {
            w.put("t", k, &v[..v.len() / 2]).unwrap();
        }
    }
    w.commit().unwrap();
    env.sync().unwrap();
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// What a crash leaves with no checkpoint since the environment was created: the
/// data file's pages are wiped in the copy, so every run must come back from its
/// journal image (`FORM_BARE`), zeros after the value included.
#[test]
fn bare_runs_come_back_from_the_journal_alone() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let copy = dir.path().join("copy");
    let vals = values();
    let env = Env::open(&live, without_checkpoints()).unwrap();
    write_all(&env, &vals);
    crash_copy(&live, &copy);
    drop(env);

    let data = copy.join(kiln_storage::DATA_FILE);
    let mut bytes = std::fs::read(&data).unwrap();
    let header_pages = 2 * PAGE_SIZE;
    assert!(bytes.len() > header_pages);
    bytes[header_pages..].fill(0);
    std::fs::write(&data, &bytes).unwrap();

    let env = Env::open(&copy, without_checkpoints()).unwrap();
    assert_all(&env, &vals, "replayed from the journal");
}

/// A damaged byte of a bare run on disk is reported as corruption by a read and by
/// the check, never returned as data.
#[test]
fn a_damaged_bare_run_is_an_error_not_data() {
    let dir = tempfile::tempdir().unwrap();
    let value: Vec<u8> = (0..16 * 1024u32).map(|i| (i * 7 % 253) as u8).collect();
    {
        let env = Env::open(dir.path(), without_checkpoints()).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        w.put("t", b"k", &value).unwrap();
        w.commit().unwrap();
        env.sync().unwrap();
    }
    let data = dir.path().join(kiln_storage::DATA_FILE);
    let mut bytes = std::fs::read(&data).unwrap();
    let at = find(&bytes, &value[..64]).expect("the value's run in the data file");
    assert_eq!(at % PAGE_SIZE, 0, "a bare run starts on a page boundary");
    bytes[at + 12_345] ^= 0x10;
    std::fs::write(&data, &bytes).unwrap();

    let env = Env::open(dir.path(), without_checkpoints()).unwrap();
    let r = env.begin_read().unwrap();
    match r.get("t", b"k") {
        Err(Error::Corrupted { .. }) => {}
        other => panic!(
            "a damaged run read as {:?}",
            other.map(|v| v.map(<[u8]>::len))
        ),
    }
    let report = env.check().unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| format!("{p:?}").contains("checksum mismatch")),
        "{:?}",
        report.problems
    );
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
