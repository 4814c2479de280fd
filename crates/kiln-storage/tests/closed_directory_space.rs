//! A clean close leaves the data directory holding what the data needs: one small
//! journal file (no spares, no live file of full size: nothing is left to replay)
//! and a data file with almost no free pages after a random-insert load (the
//! close's merge copies leaves to the end of the file; `Env::relocate_tail_at_close`
//! moves them down so that the trim cuts the free tail). Reopening finds every
//! entry, checks clean, and takes new writes, which survive another close.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Options, DATA_FILE, PAGE_SIZE};
use std::path::Path;

const KEYS: u64 = 20_000;
const VALUE_BYTES: usize = 1_000;

fn opts() -> Options {
    Options {
        // Small files, so that the load switches files and keeps spares.
        journal_file_size_bytes: 8 << 20,
        // Several generations merged during the load, and one left for the close.
        write_buffer_bytes: 4 << 20,
        ..Options::default()
    }
}

/// A key order with no locality (a multiplicative permutation of 0..KEYS).
fn key(i: u64) -> [u8; 8] {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11).to_be_bytes()
}

/// Bytes that do not compress (the journal compresses its records).
fn value(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    (0..VALUE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn journal_files(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    files.sort();
    files
}

fn load(env: &Env, keys: std::ops::Range<u64>) {
    let mut w = env.begin_write().unwrap();
    w.ensure_tree("t").unwrap();
    for i in keys {
        w.put("t", &key(i), &value(i)).unwrap();
        if i % 500 == 499 {
            w.commit().unwrap();
            w = env.begin_write().unwrap();
        }
    }
    w.commit().unwrap();
}

/// Checks the closed directory and every entry; returns the check's free pages.
fn reopen_and_verify(dir: &Path, keys: u64) -> u64 {
    let journal = journal_files(dir);
    assert_eq!(
        journal.len(),
        1,
        "a clean close leaves one journal file: {journal:?}"
    );
    assert!(
        journal[0].1 <= 4 << 20,
        "the journal file left at close is small: {journal:?}"
    );
    let env = Env::open(dir, opts()).unwrap();
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), keys);
    for i in 0..keys {
        assert_eq!(r.get("t", &key(i)).unwrap(), Some(&value(i)[..]), "key {i}");
    }
    drop(r);
    env.close().unwrap();
    report.pages_free
}

#[test]
fn a_closed_directory_holds_one_small_journal_file_and_few_free_pages() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts()).unwrap();
    load(&env, 0..KEYS);
    let before_close = journal_files(dir.path());
    assert!(
        before_close.len() >= 2 && before_close.iter().any(|f| f.1 > 4 << 20),
        "the load should leave full-size journal files to cut: {before_close:?}"
    );
    env.close().unwrap();

    let data_bytes = std::fs::metadata(dir.path().join(DATA_FILE)).unwrap().len();
    let pages = data_bytes / PAGE_SIZE as u64;
    let free = reopen_and_verify(dir.path(), KEYS);
    // A handful may stay: catalog pages, and the parents copied last.
    assert!(
        free * 100 <= pages,
        "after a random-insert load and a clean close, {free} of the data file's {pages} pages are free (more than 1%)"
    );

    // The journal left at close takes new commits, over a file switch, and the
    // next close cuts it again.
    let env = Env::open(dir.path(), opts()).unwrap();
    load(&env, KEYS..KEYS + 10_000);
    env.close().unwrap();
    reopen_and_verify(dir.path(), KEYS + 10_000);
}
