//! Fuzzing the decoders of bytes read from disk (a proptest harness: cargo-fuzz needs
//! a nightly toolchain, which this machine does not have): journal records
//! (`record::decode`) and pages (`page::verify` and the cell accessors it guards).
//! The data-file header and free-list decoders are private to the crate: their
//! property tests (damaged copies refused, snapshots round-trip, overlapping runs
//! refused) are in `src/header.rs`.
//!
//! What is asserted, not only "no panic":
//! - A journal record's crc32c covers its 64-byte header (checksum field zeroed) and
//!   its body; only the zero padding to the next 4 KiB boundary is not covered. So a
//!   mutated record (byte edits, bit flips, truncation) is rejected unless every
//!   changed byte is padding, and then it decodes to exactly the original. Every
//!   single-bit flip of the header and body is rejected. Arbitrary bytes are rejected.
//! - A node page's crc32c covers bytes 4..8192 (seeded with the page number) and the
//!   stored checksum is bytes 0..4: every mutation of a sealed page is rejected (every
//!   single-bit flip is tried). An overflow run's checksum covers exactly its run;
//!   bytes after the run in the buffer are not its own, and flips there leave it valid
//!   and unchanged.
//! - With checksums recomputed after the mutation (to get past the checksum and into
//!   the parsers), decoding gives an error or a value, never a panic; rejections are
//!   counted and must occur.
//!
//! Panics fail the test: proptest's runner catches them as failing cases (and shrinks
//! them). Hangs and huge allocations are prevented by construction (every length is
//! checked against the bytes that remain before anything is allocated), not measured.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::journal::record::{self, DecodedRecord, Image};
use kiln_storage::page::{self, hdr, PAGE_SIZE};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::cell::Cell;

/// `KILN_FUZZ_SCALE`: how many times each test's number of cases to run (1 unless set).
fn fuzz_scale() -> u32 {
    std::env::var("KILN_FUZZ_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// Runs `test` on `cases` inputs from `strategy` (times `KILN_FUZZ_SCALE`, 1 unless
/// set: the slow tier of `.ci/run` runs many more); a failing or panicking case fails
/// the test (after shrinking), with the minimal input.
fn run_cases<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let mut runner = TestRunner::new(Config {
        cases: cases.saturating_mul(fuzz_scale()),
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// A record as the journal holds it: header, body, zero padding to 4 KiB.
struct ValidRecord {
    bytes: Vec<u8>,
    /// End of the checksummed bytes (header + body); padding follows.
    covered: usize,
}

/// The first record of a real environment's journal: a commit of 50 values of 300
/// bytes and one of 20,000. `compressed`: the values are repetitive and the journal
/// compresses (an LZ4 body); otherwise they are random and it does not (the page
/// images and buffered entries are parsed directly).
fn valid_record(compressed: bool) -> ValidRecord {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut value = |len: usize, fill: u8| -> Vec<u8> {
        if compressed {
            vec![fill; len]
        } else {
            (0..len).map(|_| rng.gen()).collect()
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let o = kiln_storage::Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        journal_compression: compressed,
        ..Default::default()
    };
    let env = kiln_storage::Env::open(dir.path(), o).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    for i in 0..50u32 {
        w.put("t", &i.to_be_bytes(), &value(300, i as u8)).unwrap();
    }
    w.put("t", b"big", &value(20_000, 9)).unwrap();
    w.commit().unwrap();
    let journal = first_journal_file(dir.path());
    drop(env);
    let h = record::parse_header(&journal).expect("first record");
    assert_eq!(h.flags & 1 != 0, compressed, "LZ4 flag of the record");
    let covered = record::RECORD_HEADER + h.body_len as usize;
    let padded = h.padded_len() as usize;
    assert!(padded > covered, "the record has padding to mutate");
    let rec = ValidRecord {
        bytes: journal[..padded].to_vec(),
        covered,
    };
    assert!(
        record::decode(&rec.bytes).is_ok(),
        "the valid record decodes"
    );
    rec
}

/// A record of a real environment with a patched page image (a merge slice naming
/// the values it merged by their buffer keys): commits of random 300..1,000-byte
/// values into a 64 KiB write buffer until one record holds such an image.
fn valid_patched_record() -> ValidRecord {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let dir = tempfile::tempdir().unwrap();
    let o = kiln_storage::Options {
        journal_file_size_bytes: 4 << 20,
        data_grow_step_bytes: 1 << 20,
        write_buffer_bytes: 64 << 10,
        ..Default::default()
    };
    let env = kiln_storage::Env::open(dir.path(), o).unwrap();
    for _ in 0..40 {
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        for _ in 0..20 {
            let key = rng.gen_range(0..5_000u32).to_be_bytes();
            let len = rng.gen_range(300..1_000);
            let value: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            w.put("t", &key, &value).unwrap();
        }
        w.commit().unwrap();
    }
    assert!(
        env.stats().journal_referenced_value_bytes > 0,
        "no value was named"
    );
    let journal = first_journal_file(dir.path());
    drop(env);
    let mut at = 0;
    while let Some(h) = record::parse_header(&journal[at..]) {
        let padded = h.padded_len() as usize;
        let bytes = journal[at..at + padded].to_vec();
        let decoded = record::decode(&bytes).expect("a record of the live journal decodes");
        if decoded
            .images
            .iter()
            .any(|(_, i)| matches!(i, Image::Patched { .. }))
        {
            let covered = record::RECORD_HEADER + h.body_len as usize;
            if padded > covered {
                return ValidRecord { bytes, covered };
            }
        }
        at += padded;
    }
    panic!("no record with a patched image and padding in the first journal file");
}

/// The bytes of an environment's first journal file.
fn first_journal_file(env_dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(env_dir.join("journal").join("journal-0000000000000001.log")).unwrap()
}

/// The valid records: uncompressed (0), compressed (1), with a patched image (2).
fn valid_records() -> &'static [ValidRecord; 3] {
    static RECS: std::sync::OnceLock<[ValidRecord; 3]> = std::sync::OnceLock::new();
    RECS.get_or_init(|| {
        [
            valid_record(false),
            valid_record(true),
            valid_patched_record(),
        ]
    })
}

/// True if two decoded records are the same in every field.
fn same_record(a: &DecodedRecord, b: &DecodedRecord) -> bool {
    a.header == b.header
        && a.freed == b.freed
        && a.logical == b.logical
        && a.images.len() == b.images.len()
        && a.images.iter().zip(&b.images).all(|((na, ia), (nb, ib))| {
            na == nb
                && match (ia, ib) {
                    (Image::Full(x), Image::Full(y)) => x.bytes() == y.bytes(),
                    (
                        Image::Diff {
                            source: sa,
                            runs: ra,
                        },
                        Image::Diff {
                            source: sb,
                            runs: rb,
                        },
                    ) => sa == sb && ra == rb,
                    (
                        Image::Patched {
                            source: sa,
                            runs: ra,
                            refs: fa,
                        },
                        Image::Patched {
                            source: sb,
                            runs: rb,
                            refs: fb,
                        },
                    ) => sa == sb && ra == rb && fa == fb,
                    _ => false,
                }
        })
}

/// Decodes a mutated copy of the valid record and checks the outcome: rejected if any
/// checksummed byte changed or the record was cut short, else exactly the original.
/// Returns true if it was rejected.
fn check_mutated_record(orig: &ValidRecord, rec: &[u8]) -> Result<bool, TestCaseError> {
    let covered_changed =
        rec.len() < orig.covered || rec[..orig.covered] != orig.bytes[..orig.covered];
    match record::decode(rec) {
        Err(_) => {
            prop_assert!(
                covered_changed,
                "a record with only its padding changed was rejected"
            );
            Ok(true)
        }
        Ok(d) => {
            prop_assert!(
                !covered_changed,
                "a record with checksummed bytes changed or cut short was accepted"
            );
            prop_assert!(
                same_record(&d, &record::decode(&orig.bytes).unwrap()),
                "padding edits changed what the record decodes to"
            );
            Ok(false)
        }
    }
}

/// Rewrites the checksum over what the (mutated) header says is header and body, so
/// that a mutated record reaches the body parser. False if the header is unusable.
fn reseal_record(rec: &mut [u8]) -> bool {
    let Some(h) = record::parse_header(rec) else {
        return false;
    };
    let end = record::RECORD_HEADER + h.body_len as usize;
    if end > rec.len() {
        return false;
    }
    rec[28..32].fill(0);
    let sum = crc32c::crc32c(&rec[..end]);
    rec[28..32].copy_from_slice(&sum.to_le_bytes());
    true
}

#[test]
fn arbitrary_bytes_are_not_a_record() {
    let rejected = Cell::new(0u64);
    run_cases(
        400,
        (
            proptest::collection::vec(any::<u8>(), 0..10_000),
            any::<bool>(),
        ),
        |(mut bytes, stamp)| {
            // Half the inputs look like a record header (magic and version), so that
            // the checksum, not the magic, has to reject them.
            if stamp && bytes.len() >= record::RECORD_HEADER {
                bytes[..4].copy_from_slice(&record::MAGIC.to_le_bytes());
                bytes[4] = record::VERSION;
            }
            prop_assert!(
                record::decode(&bytes).is_err(),
                "arbitrary bytes decoded as a record"
            );
            rejected.set(rejected.get() + 1);
            Ok(())
        },
    );
    assert_eq!(rejected.get(), 400 * u64::from(fuzz_scale()));
}

#[test]
fn mutated_records_are_rejected_unless_only_padding_changed() {
    let (rejected, accepted, resealed_rejected, resealed_parsed) = (
        Cell::new(0u64),
        Cell::new(0u64),
        Cell::new(0u64),
        Cell::new(0u64),
    );
    run_cases(
        600,
        (
            0..3usize,
            proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            any::<bool>(),
            proptest::option::weighted(0.25, any::<usize>()),
        ),
        |(which, edits, padding_only, truncate)| {
            let orig = &valid_records()[which];
            let len = orig.bytes.len();
            // Half the cases edit the padding only.
            let range = if padding_only {
                orig.covered..len
            } else {
                0..len
            };
            let mut rec = orig.bytes.clone();
            for (at, v) in edits {
                let i = range.start + at % (range.end - range.start);
                rec[i] = v;
            }
            if let Some(n) = truncate {
                rec.truncate(n % len);
            }
            if check_mutated_record(orig, &rec)? {
                rejected.set(rejected.get() + 1);
            } else {
                accepted.set(accepted.get() + 1);
            }
            // With the checksum made right again, the parser must cope (error or
            // value, never a panic).
            if reseal_record(&mut rec) {
                match record::decode(&rec) {
                    Err(_) => resealed_rejected.set(resealed_rejected.get() + 1),
                    Ok(_) => resealed_parsed.set(resealed_parsed.get() + 1),
                }
            }
            Ok(())
        },
    );
    eprintln!(
        "mutated records: {} rejected, {} accepted (padding-only edits); resealed: {} rejected by the parser, {} parsed",
        rejected.get(),
        accepted.get(),
        resealed_rejected.get(),
        resealed_parsed.get()
    );
    assert!(rejected.get() > 0, "no mutated record was rejected");
    assert!(accepted.get() > 0, "no padding-only edit was tried");
    assert!(
        resealed_rejected.get() > 0,
        "no resealed record was rejected by the parser"
    );
}

#[test]
fn every_bit_flip_of_a_record_header_and_body_is_rejected() {
    for (which, orig) in valid_records().iter().enumerate() {
        let original = record::decode(&orig.bytes).unwrap();
        let mut rec = orig.bytes.clone();
        let mut rejected = 0u64;
        let mut padding_flips = 0u64;
        // Every bit of the header and body (of the uncompressed record, whose body is
        // about 40 KB: every bit of every 5th byte); every bit of every 61st byte of
        // the padding.
        let stride = if which == 0 { 5 } else { 1 };
        let positions = (0..record::RECORD_HEADER)
            .chain((record::RECORD_HEADER..orig.covered).step_by(stride))
            .chain((orig.covered..rec.len()).step_by(61));
        for at in positions {
            for bit in 0..8 {
                rec[at] ^= 1 << bit;
                let result = record::decode(&rec);
                if at < orig.covered {
                    assert!(
                        result.is_err(),
                        "record {which}: flip of bit {bit} at byte {at} (checksummed) was accepted"
                    );
                    rejected += 1;
                } else {
                    let d = result.unwrap_or_else(|e| {
                        panic!("record {which}: flip of bit {bit} at byte {at} (padding) was rejected: {e}")
                    });
                    assert!(
                        same_record(&d, &original),
                        "record {which}: a padding flip at {at} changed the record"
                    );
                    padding_flips += 1;
                }
                rec[at] ^= 1 << bit;
            }
        }
        eprintln!(
            "record {which} ({} bytes checksummed, {} padding): {rejected} bit flips rejected, {padding_flips} in padding decoded unchanged",
            orig.covered,
            rec.len() - orig.covered
        );
        assert!(rejected > 0 && padding_flips > 0);
    }
}

fn exercise_page(p: &[u8], no: u64) -> bool {
    if page::verify(p, no, std::path::Path::new("fuzz")).is_err() {
        return false;
    }
    if hdr::kind(p) == page::KIND_OVERFLOW {
        return true;
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
    true
}

#[test]
fn arbitrary_pages_with_valid_checksums_never_panic() {
    let (rejected, accepted) = (Cell::new(0u64), Cell::new(0u64));
    run_cases(
        400,
        (
            proptest::collection::vec(any::<u8>(), PAGE_SIZE..=PAGE_SIZE),
            1u8..=3,
            0u16..600,
            0u16..=8192,
        ),
        |(bytes, kind, count, upper)| {
            let mut p = bytes;
            p[4] = kind;
            p[6..8].copy_from_slice(&count.to_le_bytes());
            p[24..26].copy_from_slice(&upper.to_le_bytes());
            p[28..32].copy_from_slice(&1u32.to_le_bytes());
            page::seal(&mut p, 7, 1);
            if exercise_page(&p, 7) {
                accepted.set(accepted.get() + 1);
            } else {
                rejected.set(rejected.get() + 1);
            }
            // The same bytes read as another page: a misdirected read.
            prop_assert!(
                page::verify(&p, 8, std::path::Path::new("fuzz")).is_err(),
                "a page sealed as page 7 verified as page 8"
            );
            Ok(())
        },
    );
    eprintln!(
        "arbitrary sealed pages: {} rejected, {} accepted",
        rejected.get(),
        accepted.get()
    );
    assert!(rejected.get() > 0, "no arbitrary page was rejected");
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

fn sealed_leaf() -> Vec<u8> {
    let mut p = valid_leaf();
    page::seal(&mut p, 7, 1);
    page::verify(&p, 7, std::path::Path::new("fuzz")).expect("a sealed leaf verifies");
    p
}

#[test]
fn mutated_pages_are_rejected() {
    let orig = sealed_leaf();
    let (rejected, unchanged) = (Cell::new(0u64), Cell::new(0u64));
    run_cases(
        2000,
        proptest::collection::vec((0usize..PAGE_SIZE, any::<u8>()), 1..6),
        |edits| {
            let mut p = orig.clone();
            for (at, v) in edits {
                p[at] = v;
            }
            let ok = page::verify(&p, 7, std::path::Path::new("fuzz")).is_ok();
            if p == orig {
                prop_assert!(ok, "the unchanged page was rejected");
                unchanged.set(unchanged.get() + 1);
            } else {
                prop_assert!(!ok, "a mutated page passed verification");
                rejected.set(rejected.get() + 1);
            }
            Ok(())
        },
    );
    assert!(rejected.get() > 0, "no mutated page was rejected");
}

#[test]
fn every_bit_flip_of_a_page_is_rejected() {
    let mut p = sealed_leaf();
    let mut rejected = 0u64;
    for at in 0..PAGE_SIZE {
        for bit in 0..8 {
            p[at] ^= 1 << bit;
            assert!(
                page::verify(&p, 7, std::path::Path::new("fuzz")).is_err(),
                "flip of bit {bit} at byte {at} passed verification"
            );
            rejected += 1;
            p[at] ^= 1 << bit;
        }
    }
    assert_eq!(rejected, PAGE_SIZE as u64 * 8);
}

#[test]
fn overflow_runs_reject_flips_inside_the_run_only() {
    // A 2-page run in a 3-page buffer: the third page is not part of the run, and
    // its checksum does not cover it.
    let value: Vec<u8> = (0..12_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let pages = page::overflow_run_pages(value.len());
    assert_eq!(pages, 2);
    let mut buf = vec![0u8; 3 * PAGE_SIZE];
    page::init_overflow(&mut buf[..pages * PAGE_SIZE], &value);
    page::seal(&mut buf, 9, 1);
    let run = pages * PAGE_SIZE;
    let orig = buf.clone();
    let verify = |b: &[u8]| page::verify(b, 9, std::path::Path::new("fuzz"));
    verify(&buf).expect("a sealed run verifies");
    let (mut rejected, mut outside) = (0u64, 0u64);
    for at in (0..buf.len()).step_by(3) {
        let bit = at % 8;
        buf[at] ^= 1 << bit;
        if at < run {
            assert!(
                verify(&buf).is_err(),
                "flip of bit {bit} at byte {at} inside the run passed verification"
            );
            rejected += 1;
        } else {
            verify(&buf).unwrap_or_else(|e| {
                panic!("flip of bit {bit} at byte {at}, after the run, was rejected: {e}")
            });
            // What the run holds is unchanged: its header and value.
            assert!(buf[..run] == orig[..run]);
            assert_eq!(
                &buf[page::OVERFLOW_HEADER..page::OVERFLOW_HEADER + value.len()],
                &value[..]
            );
            outside += 1;
        }
        buf[at] ^= 1 << bit;
    }
    assert!(rejected > 0 && outside > 0);
}

#[test]
fn mutated_valid_pages_with_valid_checksums_never_panic() {
    let (rejected, accepted) = (Cell::new(0u64), Cell::new(0u64));
    run_cases(
        2000,
        proptest::collection::vec((0usize..PAGE_SIZE, any::<u8>()), 1..6),
        |edits| {
            let mut p = valid_leaf();
            for (at, v) in edits {
                p[at] = v;
            }
            page::seal(&mut p, 7, 1);
            if exercise_page(&p, 7) {
                accepted.set(accepted.get() + 1);
            } else {
                rejected.set(rejected.get() + 1);
            }
            Ok(())
        },
    );
    eprintln!(
        "mutated pages resealed: {} rejected by the structural checks, {} accepted",
        rejected.get(),
        accepted.get()
    );
    assert!(
        rejected.get() > 0,
        "no resealed mutated page was rejected by the structural checks"
    );
}
