//! Full backups: a backup taken while 4 writers commit is exactly its snapshot,
//! restores to that state (and a clean `check()`); every single-bit flip and every
//! truncation of a backup is refused by `verify`, and by `restore` with nothing left
//! behind.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::backup::{self, BackupError};
use kiln_storage::{BackupOptions, Env, Options, ReadTxn, RestoreOptions};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

type State = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

fn small_opts() -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        prepare_journal_files_ahead: false,
        // Small: generations freeze and merge while the backup reads.
        write_buffer_bytes: 256 << 10,
        ..Options::default()
    }
}

fn state(r: &ReadTxn<'_>) -> State {
    let mut s = State::new();
    for t in r.tree_names().unwrap() {
        let mut m = BTreeMap::new();
        let mut c = r.cursor(&t).unwrap();
        let mut e = c.first().unwrap();
        while let Some((k, v)) = e {
            m.insert(k.to_vec(), v.to_vec());
            e = c.next().unwrap();
        }
        s.insert(t, m);
    }
    s
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn backup_during_writes_is_exactly_its_snapshot_and_restores() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Arc::new(Env::open(tmp.path().join("src"), small_opts()).unwrap());
    {
        let mut w = env.begin_write().unwrap();
        for t in ["a", "b", "empty"] {
            w.ensure_tree(t).unwrap();
        }
        for i in 0..20_000u32 {
            w.put(
                "a",
                format!("k{i:08}").as_bytes(),
                &vec![i as u8; (i % 300) as usize + 1],
            )
            .unwrap();
        }
        // A value larger than a chunk.
        w.put("b", b"big", &vec![7u8; 3 << 20]).unwrap();
        w.commit().unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let (env, stop, commits) = (env.clone(), stop.clone(), commits.clone());
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                while !stop.load(SeqCst) {
                    let mut w = env.begin_write().unwrap();
                    for _ in 0..20 {
                        let k = format!("k{:08}", rng.gen_range(0..30_000u32));
                        if rng.gen_bool(0.2) {
                            w.delete("a", k.as_bytes()).unwrap();
                        } else {
                            let v = vec![t as u8; rng.gen_range(1..500)];
                            w.put("a", k.as_bytes(), &v).unwrap();
                        }
                    }
                    w.put(
                        "b",
                        format!("w{t}").as_bytes(),
                        &commits.load(SeqCst).to_le_bytes(),
                    )
                    .unwrap();
                    w.commit().unwrap();
                    commits.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let before = commits.load(SeqCst);
    let mut r = env.begin_read().unwrap();
    let mut buf = Vec::new();
    let in_backup = commits.clone();
    let sum = r
        .backup_to(&mut buf, b"meta!", BackupOptions::default(), |_| {
            // Hold the backup until a commit has landed while it runs (a fixed sleep
            // was not enough on a busy machine: the backup could finish between two
            // commits), then go on slowly so that more interleave.
            let waiting = std::time::Instant::now();
            while in_backup.load(SeqCst) == before && waiting.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(Duration::from_micros(200));
        })
        .unwrap();
    let during = commits.load(SeqCst) - before;
    let expected = state(&r);
    let snap_txn = r.txn_id();
    drop(r);
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, SeqCst);
    for w in writers {
        w.join().unwrap();
    }
    assert!(during > 0, "no commit happened during the backup");
    assert_eq!(sum.txn_id, snap_txn);
    // The live state moved on: the backup must not be it.
    assert_ne!(state(&env.begin_read().unwrap()), expected);

    let v = backup::verify(&buf[..], |_| {}).unwrap();
    assert_eq!(v.txn_id, snap_txn);
    assert_eq!(v.meta, b"meta!");
    assert_eq!(v.entries, sum.entries);
    assert_eq!(v.file_bytes, buf.len() as u64);
    assert_eq!(backup::read_header(&buf[..]).unwrap().txn_id, snap_txn);

    let target = tmp.path().join("restored");
    let opts = RestoreOptions {
        storage: small_opts(),
        staging_dir: None,
    };
    let rs = backup::restore_from(&buf[..], &target, opts.clone(), |_| {}).unwrap();
    assert_eq!(rs.entries, sum.entries);
    // Refuses an existing target.
    assert!(matches!(
        backup::restore_from(&buf[..], &target, opts, |_| {}),
        Err(BackupError::TargetExists(_))
    ));
    assert_eq!(files_in(tmp.path()), vec!["restored", "src"]);
    let restored = Env::open(&target, small_opts()).unwrap();
    assert_eq!(state(&restored.begin_read().unwrap()), expected);
    assert!(restored.check().unwrap().is_clean());
    eprintln!(
        "backup of {} entries, {} bytes; {during} commits during it",
        sum.entries,
        buf.len()
    );
}

#[test]
fn every_bit_flip_and_truncation_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::open(tmp.path().join("src"), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.ensure_tree("t").unwrap();
    w.ensure_tree("u").unwrap();
    for i in 0..40u32 {
        w.put(
            "t",
            format!("key{i}").as_bytes(),
            format!("value {i}").as_bytes(),
        )
        .unwrap();
    }
    w.put("u", b"x", &[1, 2, 3]).unwrap();
    w.commit().unwrap();
    for compress in [false, true] {
        let mut good = Vec::new();
        env.backup_to(&mut good, BackupOptions { compress }, |_| {})
            .unwrap();
        backup::verify(&good[..], |_| {}).unwrap();
        let bits = good.len() * 8;
        for bit in 0..bits {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let e = backup::verify(&bad[..], |_| {}).expect_err("a flipped bit was accepted");
            if bit == 0 {
                assert!(e.to_string().contains("offset"), "{e}");
            }
        }
        for len in 0..good.len() {
            assert!(
                backup::verify(&good[..len], |_| {}).is_err(),
                "truncated at {len} accepted"
            );
        }
        // Trailing garbage.
        let mut longer = good.clone();
        longer.push(0);
        assert!(backup::verify(&longer[..], |_| {}).is_err());

        // Restore: a sample of flips and truncations, each refused, nothing left.
        let dir = tmp.path().join(format!("restores-{compress}"));
        std::fs::create_dir(&dir).unwrap();
        let target = dir.join("db");
        let mut rng = rand::rngs::StdRng::seed_from_u64(compress as u64);
        for i in 0..24 {
            let bad = if i % 2 == 0 {
                let bit = rng.gen_range(0..bits);
                let mut b = good.clone();
                b[bit / 8] ^= 1 << (bit % 8);
                b
            } else {
                good[..rng.gen_range(0..good.len())].to_vec()
            };
            let opts = RestoreOptions {
                storage: small_opts(),
                staging_dir: None,
            };
            assert!(backup::restore_from(&bad[..], &target, opts, |_| {}).is_err());
            assert!(
                files_in(&dir).is_empty(),
                "left behind: {:?}",
                files_in(&dir)
            );
        }
    }
}

#[test]
fn reordered_or_duplicated_chunks_are_refused_with_the_frame_named() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::open(tmp.path().join("src"), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.ensure_tree("t").unwrap();
    for i in 0..3000u32 {
        w.put("t", format!("k{i:06}").as_bytes(), &[i as u8; 1000])
            .unwrap();
    }
    w.commit().unwrap();
    let mut good = Vec::new();
    env.backup_to(&mut good, BackupOptions { compress: false }, |_| {})
        .unwrap();
    // Frame boundaries: after the header (28 bytes + meta + crc), 24-byte frame
    // headers with the stored length at 12..16.
    let meta_len = u32::from_le_bytes(good[24..28].try_into().unwrap()) as usize;
    let mut at = 28 + meta_len + 4;
    let mut frames = Vec::new();
    while at < good.len() {
        let len = u32::from_le_bytes(good[at + 12..at + 16].try_into().unwrap()) as usize;
        frames.push(at..at + 24 + len);
        at += 24 + len;
    }
    assert!(frames.len() >= 5, "{} frames", frames.len());
    let (a, b) = (frames[1].clone(), frames[2].clone()); // two DATA chunks of tree t
    let mut swapped = good[..a.start].to_vec();
    swapped.extend_from_slice(&good[b.clone()]);
    swapped.extend_from_slice(&good[a.clone()]);
    swapped.extend_from_slice(&good[b.end..]);
    let e = backup::verify(&swapped[..], |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("frame 1") && e.contains("reordered"), "{e}");
    let mut duplicated = good[..b.start].to_vec();
    duplicated.extend_from_slice(&good[a.clone()]);
    duplicated.extend_from_slice(&good[b.start..]);
    let e = backup::verify(&duplicated[..], |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("frame 2"), "{e}");
}

/// A container's extra files: streamed in ~1 MiB frames after the trees, handed
/// back in order with their bytes intact; a flipped byte inside one is refused
/// with the file named and where in it, and a source of the wrong length fails
/// the writer.
#[test]
fn extra_files_round_trip_and_a_damaged_one_is_named() {
    use kiln_storage::backup::Item;
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::open(tmp.path().join("src"), small_opts()).unwrap();
    env.submit(|w| {
        w.ensure_tree("t")?;
        w.put("t", b"k", b"v")
    })
    .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let big: Vec<u8> = (0..2_500_000).map(|_| rng.gen()).collect();
    let small = b"hello".to_vec();
    let mut out = Vec::new();
    let mut r = env.begin_read().unwrap();
    let mut w = kiln_storage::ContainerWriter::new(
        &mut out,
        r.txn_id(),
        b"m",
        BackupOptions::default(),
        |_| {},
    )
    .unwrap();
    w.snapshot_trees(&mut r, |_| true).unwrap();
    w.file("big", big.len() as u64, &mut &big[..]).unwrap();
    w.file("empty", 0, &mut &b""[..]).unwrap();
    w.file("small", 5, &mut &small[..]).unwrap();
    let sum = w.finish().unwrap();
    assert_eq!((sum.files, sum.file_bytes_total), (3, big.len() as u64 + 5));
    drop(r);

    let read = |bytes: &[u8]| {
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        backup::read_container(
            bytes,
            false,
            |_| {},
            |_, item| {
                match item {
                    Item::File { name, .. } => files.push((name.to_string(), Vec::new())),
                    Item::FileData(d) => files.last_mut().unwrap().1.extend_from_slice(d),
                    _ => {}
                }
                Ok(())
            },
        )
        .map(|_| files)
    };
    let files = read(&out).unwrap();
    assert_eq!(files.len(), 3);
    assert_eq!(files[0], ("big".to_string(), big.clone()));
    assert_eq!(files[1], ("empty".to_string(), Vec::new()));
    assert_eq!(files[2], ("small".to_string(), small.clone()));
    // A restore of the bare environment skips the files and keeps the trees.
    let restored = tmp.path().join("restored");
    backup::restore_from(&out[..], &restored, RestoreOptions::default(), |_| {}).unwrap();
    let env2 = Env::open(&restored, small_opts()).unwrap();
    assert_eq!(
        env2.begin_read().unwrap().get("t", b"k").unwrap(),
        Some(&b"v"[..])
    );
    drop(env2);

    // A byte of the big file's second data frame flipped: refused, naming the file
    // and the part of it (its bytes from 1 MiB on).
    let at = out
        .windows(8)
        .position(|w| w == &big[1 << 20..(1 << 20) + 8])
        .unwrap();
    let mut bad = out.clone();
    bad[at + 3] ^= 0x10;
    let e = read(&bad).unwrap_err().to_string();
    assert!(
        e.contains("extra file \"big\"") && e.contains("from 1048576 on") && e.contains("checksum"),
        "{e}"
    );
    let e = backup::restore_from(
        &bad[..],
        &tmp.path().join("r2"),
        RestoreOptions::default(),
        |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("extra file \"big\""), "{e}");
    assert!(!tmp.path().join("r2").exists());

    // A source shorter than announced fails the writer.
    let r = env.begin_read().unwrap();
    let mut sink = Vec::new();
    let mut w = kiln_storage::ContainerWriter::new(
        &mut sink,
        r.txn_id(),
        b"",
        BackupOptions::default(),
        |_| {},
    )
    .unwrap();
    let e = w.file("short", 6, &mut &small[..]).unwrap_err();
    assert!(
        e.to_string().contains("short") && e.to_string().contains("5 bytes"),
        "{e}"
    );
}

/// A version 1 container (before extra files: a 32-byte trailer) still reads and
/// restores: built here from a version 2 one by rewriting its header's version and
/// its trailer, every checksum recomputed.
#[test]
fn a_version_1_backup_still_restores() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::open(tmp.path().join("src"), small_opts()).unwrap();
    env.submit(|w| {
        w.ensure_tree("t")?;
        w.put("t", b"k", b"v")
    })
    .unwrap();
    let mut v2 = Vec::new();
    env.backup_to(&mut v2, BackupOptions::default(), |_| {})
        .unwrap();
    // The header: 28 fixed bytes, no metadata here, its CRC.
    let le32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
    assert_eq!(le32(&v2[24..28]), 0);
    let mut v1 = v2[..v2.len() - (24 + 48)].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let c = crc32c::crc32c(&v1[..28]);
    v1[28..32].copy_from_slice(&c.to_le_bytes());
    let old_trailer = &v2[v2.len() - 48..];
    let mut t = old_trailer[..28].to_vec();
    t.extend_from_slice(&crc32c::crc32c(&v1).to_le_bytes());
    let index = le32(&v2[v2.len() - 72 + 4..v2.len() - 72 + 8]);
    let mut h = [0u8; 24];
    h[0] = 4;
    h[4..8].copy_from_slice(&index.to_le_bytes());
    h[8..12].copy_from_slice(&32u32.to_le_bytes());
    h[12..16].copy_from_slice(&32u32.to_le_bytes());
    h[16..20].copy_from_slice(&crc32c::crc32c(&t).to_le_bytes());
    let hc = crc32c::crc32c(&h[..20]);
    h[20..24].copy_from_slice(&hc.to_le_bytes());
    v1.extend_from_slice(&h);
    v1.extend_from_slice(&t);
    let sum = backup::verify(&v1[..], |_| {}).unwrap();
    assert_eq!((sum.format_version, sum.entries, sum.files), (1, 1, 0));
    let target = tmp.path().join("restored");
    backup::restore_from(&v1[..], &target, RestoreOptions::default(), |_| {}).unwrap();
    let env2 = Env::open(&target, small_opts()).unwrap();
    assert_eq!(
        env2.begin_read().unwrap().get("t", b"k").unwrap(),
        Some(&b"v"[..])
    );
    // A version this build does not know is refused, naming it.
    let mut v9 = v2.clone();
    v9[8..12].copy_from_slice(&9u32.to_le_bytes());
    let c = crc32c::crc32c(&v9[..28]);
    v9[28..32].copy_from_slice(&c.to_le_bytes());
    let e = backup::verify(&v9[..], |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("version 9") && e.contains("versions 1 to 3"),
        "{e}"
    );
}
