//! Leaves stay well filled under random inserts: an overflowing leaf first shares
//! cells with a sibling, or two full leaves become three (`btree/write.rs`,
//! `place_overflow`), instead of splitting in halves (67% fill at 1M YCSB documents).
//! Ascending keys still fill whole leaves; every tree checks clean and reads back.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Options, PAGE_SIZE};

/// Loads `n` entries with values of `value_bytes` (keys ascending or scrambled) into
/// tree `t`, a commit every 500; returns the leaves' fill (entry bytes over leaf pages).
fn load(buffered: bool, counted: bool, n: u64, value_bytes: usize, ascending: bool) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        journal_file_size_bytes: 4 << 20,
        data_grow_step_bytes: 1 << 20,
        // Buffered: small generations, merged into the tree in sorted runs as a
        // server's load is (the check walks trees; what stays buffered is not seen).
        write_buffer_bytes: if buffered { 256 << 10 } else { 0 },
        ..Options::default()
    };
    let env = Env::open(dir.path(), opts).unwrap();
    let key = |i: u64| {
        let k = if ascending {
            i
        } else {
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
        };
        format!("user{k:020}")
    };
    let mut w = env.begin_write().unwrap();
    if counted {
        w.create_counted_tree("t").unwrap();
    } else {
        w.create_tree("t").unwrap();
    }
    for i in 0..n {
        let v = vec![(i % 251) as u8; value_bytes];
        w.put("t", key(i).as_bytes(), &v).unwrap();
        if i % 500 == 499 {
            w.commit().unwrap();
            w = env.begin_write().unwrap();
        }
    }
    w.commit().unwrap();
    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), n);
    for i in (0..n).step_by(97) {
        let v = r
            .get("t", key(i).as_bytes())
            .unwrap()
            .expect("every key reads back");
        assert_eq!(v.len(), value_bytes);
    }
    let t = &report.tree_pages["t"];
    t.leaf_entry_bytes as f64 / (t.leaf_pages * PAGE_SIZE as u64) as f64
}

#[test]
fn random_inserts_fill_leaves_above_three_quarters() {
    for (buffered, counted, value_bytes, bound) in [
        (false, false, 100, 0.75),
        (false, true, 100, 0.75),
        (true, false, 1100, 0.72),
        (true, true, 300, 0.75),
    ] {
        let fill = load(buffered, counted, 20_000, value_bytes, false);
        eprintln!("random: buffered {buffered} counted {counted} value {value_bytes} B: leaf fill {fill:.3}");
        assert!(
            fill >= bound,
            "random inserts (buffered {buffered}, counted {counted}, {value_bytes} B values): leaf fill {fill:.3} < {bound}"
        );
    }
}

#[test]
fn ascending_inserts_fill_leaves_almost_whole() {
    for buffered in [false, true] {
        let fill = load(buffered, false, 20_000, 300, true);
        eprintln!("ascending: buffered {buffered}: leaf fill {fill:.3}");
        assert!(fill >= 0.9, "ascending inserts: leaf fill {fill:.3}");
    }
}
