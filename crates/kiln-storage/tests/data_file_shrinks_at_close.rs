//! A closing environment cuts the data file's tail of free pages and its
//! preallocated growth step (`Flusher::trim_tail_at_close`): values deleted from
//! the end of the file give their space back, and a reopen finds every entry, the
//! tree checks clean and the file grows again for new writes.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Options, DATA_FILE, PAGE_SIZE};
use std::path::Path;

fn data_file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(DATA_FILE)).unwrap().len()
}

fn opts() -> Options {
    Options {
        journal_file_size_bytes: 4 << 20,
        // Every put straight into its tree (the big values' runs land at the end).
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

const BIG_BYTES: usize = 256 << 10;

fn big(i: u32) -> Vec<u8> {
    vec![(i % 251) as u8; BIG_BYTES]
}

fn small_key(i: u32) -> String {
    format!("k{:06}", i.wrapping_mul(7919) % 100_003)
}

fn assert_all_there(env: &Env, bigs: std::ops::Range<u32>) {
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let r = env.begin_read().unwrap();
    for i in 0..3000 {
        assert_eq!(
            r.get("small", small_key(i).as_bytes()).unwrap(),
            Some(&[7u8; 100][..]),
            "small key {i}"
        );
    }
    assert_eq!(r.tree_len("big").unwrap(), bigs.len() as u64);
    for i in bigs {
        let v = r.get("big", &i.to_be_bytes()).unwrap().expect("big value");
        assert!(v == big(i), "big value {i}");
    }
}

#[test]
fn deleted_values_at_the_end_of_the_file_give_their_space_back_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("small").unwrap();
    w.create_tree("big").unwrap();
    for i in 0..3000 {
        w.put("small", small_key(i).as_bytes(), &[7u8; 100])
            .unwrap();
    }
    w.commit().unwrap();
    // 40 values of 256 KiB (10 MiB), after the small tree: at the end of the file.
    for i in 0..40u32 {
        let mut w = env.begin_write().unwrap();
        w.put("big", &i.to_be_bytes(), &big(i)).unwrap();
        w.commit().unwrap();
    }
    env.close().unwrap();
    let loaded = data_file_len(dir.path());
    assert!(loaded >= 40 * BIG_BYTES as u64, "{loaded}");

    let env = Env::open(dir.path(), opts()).unwrap();
    assert_all_there(&env, 0..40);
    // One commit: its new copies of the tree's leaf and the catalog take the
    // lowest free pages (freed copies of the load), below the deleted runs. (Pages
    // still live at the end stay: the trim cuts only a free tail.)
    let mut w = env.begin_write().unwrap();
    for i in 10..40u32 {
        w.delete("big", &i.to_be_bytes()).unwrap();
    }
    w.commit().unwrap();
    env.close().unwrap();
    let trimmed = data_file_len(dir.path());
    assert!(
        trimmed + 29 * BIG_BYTES as u64 <= loaded,
        "30 values of 256 KiB deleted from the end: the file went from {loaded} to {trimmed} bytes"
    );
    assert_eq!(trimmed % PAGE_SIZE as u64, 0);

    // A reopen finds everything; new writes grow the file again; all survives.
    let env = Env::open(dir.path(), opts()).unwrap();
    assert_all_there(&env, 0..10);
    for i in 10..20u32 {
        let mut w = env.begin_write().unwrap();
        w.put("big", &i.to_be_bytes(), &big(i)).unwrap();
        w.commit().unwrap();
    }
    env.close().unwrap();
    assert!(data_file_len(dir.path()) > trimmed);
    let env = Env::open(dir.path(), opts()).unwrap();
    assert_all_there(&env, 0..20);
    env.close().unwrap();
}
