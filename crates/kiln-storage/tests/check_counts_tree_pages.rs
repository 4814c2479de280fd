//! `Env::check` reports, per tree, its leaf, branch and out-of-leaf value pages and
//! the bytes its leaves hold (the space breakdown of `kiln check --json`).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Options, PAGE_SIZE};

#[test]
fn check_counts_each_trees_pages_and_leaf_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        // Every put straight into its tree: the check walks trees, not the buffer.
        write_buffer_bytes: 0,
        ..Options::default()
    };
    let env = Env::open(dir.path(), opts).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("small").unwrap();
    w.create_tree("other").unwrap();
    let mut inline_bytes = 0u64;
    // Keys in a scrambled order, as random inserts split leaves.
    for i in 0..3000u64 {
        let k = format!("key{:08}", i.wrapping_mul(2_654_435_761) % 1_000_003);
        let v = vec![b'v'; 300];
        w.put("small", k.as_bytes(), &v).unwrap();
        inline_bytes += (k.len() + v.len()) as u64;
    }
    w.put("other", b"big", &vec![7u8; 200_000]).unwrap();
    w.commit().unwrap();

    let report = env.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let small = &report.tree_pages["small"];
    assert_eq!(small.leaf_entry_bytes, inline_bytes);
    assert_eq!(small.value_pages, 0);
    assert!(small.branch_pages >= 1);
    let capacity = small.leaf_pages * PAGE_SIZE as u64;
    let fill = small.leaf_entry_bytes as f64 / capacity as f64;
    assert!((0.3..1.0).contains(&fill), "leaf fill {fill}");
    let other = &report.tree_pages["other"];
    assert_eq!(other.leaf_pages, 1);
    assert!(
        other.value_pages >= 200_000 / PAGE_SIZE as u64,
        "{other:?}: the 200 KB value's pages"
    );
    // Every reachable page belongs to a tree (the catalog included).
    let counted: u64 = report
        .tree_pages
        .values()
        .map(|t| t.leaf_pages + t.branch_pages + t.value_pages)
        .sum();
    assert_eq!(counted, report.pages_reachable);
}
