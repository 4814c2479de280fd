//! Fuzzing the decoders of bytes read from disk (a proptest harness: cargo-fuzz needs
//! a nightly toolchain, which this machine does not have). Arbitrary bytes, and
//! valid records and pages with bytes changed and checksums recomputed (to get past
//! the checksum and into the parser), give an error, never a panic. (Hangs and huge
//! allocations are prevented by construction — every length is checked against the
//! bytes that remain before anything is allocated — not measured here.)

use kiln_storage::journal::record;
use kiln_storage::page::{self, hdr, PAGE_SIZE};
use proptest::prelude::*;

fn valid_record() -> Vec<u8> {
    // Build a record through a real environment's journal: open, commit, read file.
    let dir = tempfile::tempdir().unwrap();
    let o = kiln_storage::Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        ..Default::default()
    };
    {
        let env = kiln_storage::Env::open(dir.path(), o).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        for i in 0..50u32 {
            w.put("t", &i.to_be_bytes(), &[i as u8; 300]).unwrap();
        }
        w.put("t", b"big", &[9u8; 20_000]).unwrap();
        w.commit().unwrap();
        let journal = std::fs::read(
            dir.path()
                .join("journal")
                .join("journal-0000000000000001.log"),
        )
        .unwrap();
        let h = record::parse_header(&journal).expect("first record");
        journal[..record::RECORD_HEADER + h.body_len as usize].to_vec()
    }
}

/// Rewrites the checksum so that a mutated record reaches the body parser.
fn reseal_record(rec: &mut [u8]) {
    rec[28..32].fill(0);
    let sum = crc32c::crc32c(rec);
    rec[28..32].copy_from_slice(&sum.to_le_bytes());
}

fn exercise_page(p: &[u8], no: u64) {
    if page::verify(p, no, std::path::Path::new("fuzz")).is_err() {
        return;
    }
    if hdr::kind(p) == page::KIND_OVERFLOW {
        return;
    }
    for i in 0..hdr::count(p) {
        let _ = page::cell_key(p, i);
        if hdr::kind(p) == page::KIND_LEAF {
            let _ = page::leaf_value(p, i);
        } else {
            let _ = page::branch_child(p, i);
        }
    }
    let _ = page::search(p, b"key");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_are_not_a_record(bytes in proptest::collection::vec(any::<u8>(), 0..10_000)) {
        let _ = record::decode(&bytes);
    }

    #[test]
    fn mutated_valid_records_fail_cleanly(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), truncate in any::<bool>()) {
        let mut rec = valid_record_cached().clone();
        for (at, v) in edits {
            let i = at % rec.len();
            rec[i] = v;
        }
        if truncate {
            let n = rec.len() / 2;
            rec.truncate(n);
        }
        // With the checksum wrong it must be rejected; with it fixed, parsed safely.
        let _ = record::decode(&rec);
        if rec.len() >= record::RECORD_HEADER {
            reseal_record(&mut rec);
            let _ = record::decode(&rec);
        }
    }

    #[test]
    fn arbitrary_pages_with_valid_checksums_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), PAGE_SIZE..=PAGE_SIZE),
        kind in 1u8..=3,
        count in 0u16..600,
        upper in 0u16..=8192,
    ) {
        let mut p = bytes;
        p[4] = kind;
        p[6..8].copy_from_slice(&count.to_le_bytes());
        p[24..26].copy_from_slice(&upper.to_le_bytes());
        p[28..32].copy_from_slice(&1u32.to_le_bytes());
        page::seal(&mut p, 7, 1);
        exercise_page(&p, 7);
    }
}

fn valid_leaf() -> Vec<u8> {
    let mut p = vec![0u8; PAGE_SIZE];
    page::init_node(&mut p, page::KIND_LEAF, 7);
    for i in 0..40u32 {
        let cell = page::encode_leaf_cell(&i.to_be_bytes(), &[i as u8; 90]);
        assert!(page::insert_cell(&mut p, i as usize, &cell));
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_valid_pages_with_valid_checksums_never_panic(edits in proptest::collection::vec((0usize..PAGE_SIZE, any::<u8>()), 1..6)) {
        let mut p = valid_leaf();
        for (at, v) in edits {
            p[at] = v;
        }
        page::seal(&mut p, 7, 1);
        exercise_page(&p, 7);
    }
}

fn valid_record_cached() -> &'static Vec<u8> {
    static REC: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    REC.get_or_init(valid_record)
}
