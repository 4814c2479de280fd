//! Sealed backups (version 3): they round-trip, hold no byte of the data, the meta
//! or a tree's name in clear, need their master key, and refuse a changed byte, a
//! frame moved inside a backup, and a frame taken from another backup.

use super::write::NewSeal;
use super::*;
use crate::crypt::{MasterKey, SealingKey};
use crate::ReadTxn;
use std::collections::BTreeMap;

const MARKER: &[u8] = b"PLAINTEXT-MARKER";

fn encrypted(key: &MasterKey) -> Options {
    Options {
        encryption: Some(key.clone()),
        ..Options::default()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

type State = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

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

/// An environment (encrypted under `key`, if given) holding the marker in a tree's
/// name, in keys and in values: enough entries for several DATA frames, values
/// that compress well.
fn filled(dir: &Path, key: Option<&MasterKey>) -> Env {
    let opts = match key {
        Some(k) => encrypted(k),
        None => Options::default(),
    };
    let env = Env::open(dir, opts).unwrap();
    let marked_tree = format!("tree-{}", String::from_utf8_lossy(MARKER));
    env.submit(move |w| {
        w.ensure_tree("plain")?;
        w.ensure_tree(&marked_tree)?;
        for i in 0..3000u32 {
            let mut k = MARKER.to_vec();
            k.extend_from_slice(&i.to_be_bytes());
            let v = MARKER.repeat(40 + (i % 7) as usize);
            w.put(&marked_tree, &k, &v)?;
            w.put("plain", &i.to_be_bytes(), b"v")?;
        }
        Ok(())
    })
    .unwrap();
    env
}

fn meta() -> Vec<u8> {
    let mut m = b"{\"manifest\":\"".to_vec();
    m.extend_from_slice(MARKER);
    m.extend_from_slice(b"\"}");
    m
}

/// A full backup of `env` through `ContainerWriter::for_snapshot` (as the document
/// layer writes them), with an extra file holding the marker.
fn backup_of(env: &Env) -> Vec<u8> {
    let mut r = env.begin_read().unwrap();
    let mut out = Vec::new();
    let mut w =
        ContainerWriter::for_snapshot(&mut out, &r, &meta(), BackupOptions::default(), |_| {})
            .unwrap();
    w.snapshot_trees(&mut r, |_| true).unwrap();
    let file = MARKER.repeat(100);
    let name = format!("files/{}", String::from_utf8_lossy(MARKER));
    w.file(&name, file.len() as u64, &mut &file[..]).unwrap();
    w.finish().unwrap();
    out
}

/// A frame of a container: the offset of its header, its header, its payload.
type RawFrame = (usize, [u8; FRAME_HEADER], Vec<u8>);

/// The length of a container's header, and its frames.
fn frames(b: &[u8]) -> (usize, Vec<RawFrame>) {
    let le32 = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let sealed = le32(12) as u32 & FLAG_SEALED != 0;
    let mut at = HEADER_FIXED + le32(24) + if sealed { SEALED_HEADER_EXTRA } else { 0 } + 4;
    let header_len = at;
    let mut out = Vec::new();
    while at < b.len() {
        let h: [u8; FRAME_HEADER] = b[at..at + FRAME_HEADER].try_into().unwrap();
        let len = le32(at + 12);
        let payload = b[at + FRAME_HEADER..at + FRAME_HEADER + len].to_vec();
        out.push((at, h, payload));
        at += FRAME_HEADER + len;
    }
    (header_len, out)
}

/// A frame written back with `index` and every checksum of its own recomputed.
fn frame_bytes(h: &[u8; FRAME_HEADER], payload: &[u8], index: u32) -> Vec<u8> {
    let mut h = *h;
    h[4..8].copy_from_slice(&index.to_le_bytes());
    h[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[16..20].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let c = crc32c::crc32c(&h[..20]);
    h[20..24].copy_from_slice(&c.to_le_bytes());
    let mut v = h.to_vec();
    v.extend_from_slice(payload);
    v
}

/// The header's checksum recomputed after a change to its bytes.
fn fix_header_crc(b: &mut [u8], header_len: usize) {
    let c = crc32c::crc32c(&b[..header_len - 4]);
    b[header_len - 4..header_len].copy_from_slice(&c.to_le_bytes());
}

/// Reads the whole container with `key`, collecting what it holds.
fn items(b: &[u8], key: Option<&MasterKey>) -> BackupResult<(BackupSummary, Vec<String>)> {
    let mut seen = Vec::new();
    let sum = read_container_with_key(
        b,
        key,
        false,
        |_| {},
        |_, item| {
            seen.push(match item {
                Item::Header => "header".into(),
                Item::Tree(t) => format!("tree {t}"),
                Item::Entry(k, v) => format!("entry {k:?} {v:?}"),
                Item::EndTree => "end".into(),
                Item::File { name, len_bytes } => format!("file {name} {len_bytes}"),
                Item::FileData(d) => format!("data {d:?}"),
                Item::FileEnd => "file end".into(),
            });
            Ok(())
        },
    )?;
    Ok((sum, seen))
}

#[test]
fn a_sealed_backup_round_trips_and_holds_nothing_in_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let env = filled(&tmp.path().join("src"), Some(&key));
    let sealed = backup_of(&env);
    // The same data in clear holds the marker (so the search below can find it) and
    // is still written as version 2.
    let plain_env = filled(&tmp.path().join("plain"), None);
    let plain = backup_of(&plain_env);
    assert!(contains(&plain, MARKER));
    assert_eq!(u32::from_le_bytes(plain[8..12].try_into().unwrap()), 2);
    let plain_sum = verify(&plain[..], |_| {}).unwrap();
    assert_eq!(plain_sum.key_fingerprint, None);

    // Sealed: version 3, the sealed flag, nothing in clear (entries, tree names,
    // the meta, the extra file and its name), not even a short piece of it.
    assert_eq!(u32::from_le_bytes(sealed[8..12].try_into().unwrap()), 3);
    assert_ne!(
        u32::from_le_bytes(sealed[12..16].try_into().unwrap()) & FLAG_SEALED,
        0
    );
    assert!(!contains(&sealed, MARKER));
    assert!(!contains(&sealed, b"MARKER"));
    assert!(!contains(&sealed, b"manifest"));
    assert!(!contains(&sealed, b"plain"));
    // Compressed before it was sealed (sealed bytes do not compress): the values
    // repeat the marker, and the backup is far smaller than them.
    let sum = verify_with_key(&sealed[..], Some(&key), |_| {}).unwrap();
    assert!(sum.file_bytes < sum.kv_bytes / 4, "{sum:?}");
    assert_eq!(sum.format_version, 3);
    assert_eq!(sum.key_fingerprint, Some(key.fingerprint()));
    assert_eq!(sum.meta, meta());
    assert_eq!(
        (sum.trees, sum.entries, sum.files, sum.kv_bytes),
        (
            plain_sum.trees,
            plain_sum.entries,
            plain_sum.files,
            plain_sum.kv_bytes
        )
    );
    // Item by item what the same backup in clear holds.
    let (_, sealed_items) = items(&sealed, Some(&key)).unwrap();
    let (_, plain_items) = items(&plain, None).unwrap();
    assert_eq!(sealed_items, plain_items);
    let header = read_header_with_key(&sealed[..], Some(&key)).unwrap();
    assert_eq!((header.meta, header.txn_id), (meta(), sum.txn_id));

    // The engine's own backups of an encrypted environment are sealed too.
    let mut env_backup = Vec::new();
    env.backup_to(&mut env_backup, BackupOptions { compress: false }, |_| {})
        .unwrap();
    assert!(!contains(&env_backup, MARKER));
    let mut txn_backup = Vec::new();
    let mut r = env.begin_read().unwrap();
    r.backup_to(&mut txn_backup, &meta(), BackupOptions::default(), |_| {})
        .unwrap();
    assert!(!contains(&txn_backup, MARKER));
    let expected = state(&r);
    drop(r);

    // A restore with the key (the new environment's own) gives the same state, and
    // the restored environment is encrypted.
    let target = tmp.path().join("restored");
    let opts = RestoreOptions {
        storage: encrypted(&key),
        ..Default::default()
    };
    let restored = restore_from(&txn_backup[..], &target, opts, |_| {}).unwrap();
    assert_eq!(restored.entries, 6000);
    let env2 = Env::open(&target, encrypted(&key)).unwrap();
    assert!(env2.is_encrypted());
    assert_eq!(state(&env2.begin_read().unwrap()), expected);
    // And a backup in clear restores into an encrypted environment (the way to
    // encrypt a database).
    let target = tmp.path().join("from-plain");
    let opts = RestoreOptions {
        storage: encrypted(&key),
        ..Default::default()
    };
    restore_from(&plain[..], &target, opts, |_| {}).unwrap();
}

#[test]
fn a_sealed_backup_needs_its_master_key() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let env = filled(&tmp.path().join("src"), Some(&key));
    let sealed = backup_of(&env);

    // No key: refused, saying what to give, whatever reads it.
    let no_key = [
        verify(&sealed[..], |_| {}).unwrap_err(),
        read_header(&sealed[..]).unwrap_err(),
        read_container(&sealed[..], false, |_| {}, |_, _| Ok(())).unwrap_err(),
    ];
    for e in no_key {
        let text = e.to_string();
        assert!(
            matches!(&e, BackupError::Storage(Error::Encryption { .. }))
                && text.contains("this backup is encrypted")
                && text.contains("--encryption-key-file")
                && text.contains(&key.fingerprint()),
            "{text}"
        );
    }
    // Another key: its key does not unwrap; both keys are named.
    let other = MasterKey::generate();
    let e = verify_with_key(&sealed[..], Some(&other), |_| {}).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, BackupError::Storage(Error::Encryption { .. }))
            && text.contains("wrong encryption key")
            && text.contains(&key.fingerprint())
            && text.contains(&other.fingerprint()),
        "{text}"
    );
    // A restore into an environment without a key, or with another key, is refused
    // and leaves nothing behind.
    for (name, storage) in [
        ("no-key", Options::default()),
        ("other-key", encrypted(&other)),
    ] {
        let target = tmp.path().join(name);
        let opts = RestoreOptions {
            storage,
            ..Default::default()
        };
        let e = restore_from(&sealed[..], &target, opts, |_| {}).unwrap_err();
        assert!(
            matches!(&e, BackupError::Storage(Error::Encryption { .. })),
            "{e}"
        );
        assert!(!target.exists());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "{name}");
    }
}

#[test]
fn every_changed_byte_of_a_sealed_backup_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let env = filled(&tmp.path().join("src"), Some(&key));
    let sealed = backup_of(&env);
    verify_with_key(&sealed[..], Some(&key), |_| {}).unwrap();
    // A flipped bit anywhere: a checksum (or, in the trailer's seal, an
    // authentication) error naming the part and offset, never accepted.
    let step = (sealed.len() / 1500).max(1);
    for at in (0..sealed.len()).step_by(step).chain([sealed.len() - 1]) {
        let mut bad = sealed.clone();
        bad[at] ^= 0x10;
        let e = verify_with_key(&bad[..], Some(&key), |_| {})
            .expect_err("a flipped bit was accepted")
            .to_string();
        assert!(e.contains("offset") || e.contains("encryption"), "{e}");
    }

    // With the checksums recomputed, only the seals can tell: a changed payload
    // byte, or a changed header field the seal binds (raw length, flags), fails
    // authentication, naming the frame.
    let (header_len, fs) = frames(&sealed);
    let rebuild = |fs: &[RawFrame]| {
        let mut b = sealed[..header_len].to_vec();
        for (i, (_, h, p)) in fs.iter().enumerate() {
            b.extend_from_slice(&frame_bytes(h, p, i as u32));
        }
        b
    };
    assert_eq!(rebuild(&fs), sealed);
    for i in [0, 1, fs.len() / 2, fs.len() - 1] {
        let mut changed = fs.clone();
        changed[i].2[3] ^= 1;
        let mut raw_len = fs.clone();
        let len = u32::from_le_bytes(raw_len[i].1[8..12].try_into().unwrap());
        raw_len[i].1[8..12].copy_from_slice(&(len ^ 1).to_le_bytes());
        for bad in [changed, raw_len] {
            let e = verify_with_key(&rebuild(&bad)[..], Some(&key), |_| {})
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("fails authentication") && e.contains(&format!("frame {i} ")),
                "frame {i}: {e}"
            );
        }
    }
    // The header: a changed txn id or meta byte, its checksum recomputed.
    for at in [16, HEADER_FIXED + 2] {
        let mut bad = sealed.clone();
        bad[at] ^= 1;
        fix_header_crc(&mut bad, header_len);
        let e = verify_with_key(&bad[..], Some(&key), |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("fails authentication"), "byte {at}: {e}");
    }
}

#[test]
fn a_frame_moved_inside_a_backup_or_from_another_backup_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let env = filled(&tmp.path().join("src"), Some(&key));
    let a = backup_of(&env);
    let b = backup_of(&env);
    let (ha, fa) = frames(&a);
    let (_, fb) = frames(&b);
    assert_eq!(fa.len(), fb.len());
    let with = |fs: &[RawFrame], header: &[u8]| {
        let mut out = header.to_vec();
        for (i, (_, h, p)) in fs.iter().enumerate() {
            out.extend_from_slice(&frame_bytes(h, p, i as u32));
        }
        out
    };
    // Two frames of one backup swapped (their indexes and checksums made right).
    let data: Vec<usize> = (0..fa.len()).filter(|&i| fa[i].1[0] == KIND_DATA).collect();
    assert!(data.len() >= 2, "{} DATA frames", data.len());
    let mut swapped = fa.clone();
    swapped.swap(data[0], data[1]);
    let e = verify_with_key(&with(&swapped, &a[..ha])[..], Some(&key), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fails authentication") && e.contains(&format!("frame {} ", data[0])),
        "{e}"
    );
    // A frame of another backup of the same data, in the same place.
    for i in [0, data[0], fa.len() - 1] {
        let mut mixed = fa.clone();
        mixed[i] = fb[i].clone();
        let e = verify_with_key(&with(&mixed, &a[..ha])[..], Some(&key), |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fails authentication") && e.contains(&format!("frame {i} ")),
            "frame {i}: {e}"
        );
    }

    // Even under one key (the backup id alone tells two backups apart): two
    // backups sealed under the same key with other backup ids do not mix...
    let mut r = env.begin_read().unwrap();
    let k = SealingKey::generate();
    let wrapped = key.wrap(&k);
    let mut write = |k: SealingKey, id: u8| {
        let mut out = Vec::new();
        let seal = NewSeal::for_tests(k, wrapped, [id; BACKUP_ID_BYTES]);
        let opts = BackupOptions { compress: false };
        let mut w =
            ContainerWriter::with_seal(&mut out, r.txn_id(), b"m", opts, Some(seal), |_| {})
                .unwrap();
        w.snapshot_trees(&mut r, |_| true).unwrap();
        w.finish().unwrap();
        out
    };
    let same_key = || key.unwrap(&wrapped, Path::new("test")).unwrap();
    let x = write(k, 1);
    let y = write(same_key(), 2);
    let z = write(same_key(), 1);
    let (hx, fx) = frames(&x);
    let (_, fy) = frames(&y);
    let (_, fz) = frames(&z);
    let i = 1;
    let mut mixed = fx.clone();
    mixed[i] = fy[i].clone();
    let e = verify_with_key(&with(&mixed, &x[..hx])[..], Some(&key), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fails authentication") && e.contains(&format!("frame {i} ")),
        "{e}"
    );
    // ... while with the same id (and the same data) the frame opens: only the
    // whole-file checksum at the trailer tells. (What refused it above was the
    // backup id in the associated data.)
    let mut mixed = fx.clone();
    mixed[i] = fz[i].clone();
    let e = verify_with_key(&with(&mixed, &x[..hx])[..], Some(&key), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        !e.contains("fails authentication") && e.contains("whole-file checksum"),
        "{e}"
    );
}

#[test]
fn the_structure_of_a_sealed_backup_is_checked_without_its_key() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let env = filled(&tmp.path().join("src"), Some(&key));
    let sealed = backup_of(&env);
    assert!(header_is_sealed(&sealed[..HEADER_PEEK_BYTES]));
    let full = verify_with_key(&sealed[..], Some(&key), |_| {}).unwrap();
    let mut seen = 0;
    let s = verify_sealed_structure(&sealed[..], |n| seen = n).unwrap();
    assert_eq!(seen, sealed.len() as u64, "progress reaches the end");
    assert_eq!(s.format_version, SEALED_FORMAT_VERSION);
    assert_eq!(s.txn_id, full.txn_id);
    assert_eq!(Some(&s.key_fingerprint), full.key_fingerprint.as_ref());
    assert_eq!(s.key_fingerprint, key.fingerprint());
    assert_eq!(s.backup_id.len(), 32);
    assert_eq!(
        (s.frames, s.trees, s.files, s.file_bytes),
        (full.frames, full.trees, full.files, full.file_bytes)
    );

    // A flipped bit anywhere is found (every byte is under a checksum), named by
    // part and offset; so is a backup cut anywhere, or one with bytes after it.
    let step = (sealed.len() / 700).max(1);
    for at in (0..sealed.len()).step_by(step).chain([sealed.len() - 1]) {
        let mut bad = sealed.clone();
        bad[at] ^= 0x10;
        let e = verify_sealed_structure(&bad[..], |_| {})
            .expect_err("a flipped bit was accepted")
            .to_string();
        assert!(
            e.contains("offset") || e.contains("version"),
            "byte {at}: {e}"
        );
    }
    let (header_len, fs) = frames(&sealed);
    let cuts = [10, header_len - 1, header_len, fs[1].0, fs[1].0 + 30];
    for cut in cuts.into_iter().chain([sealed.len() - 1]) {
        let e = verify_sealed_structure(&sealed[..cut], |_| {})
            .expect_err("a truncated backup was accepted")
            .to_string();
        assert!(e.contains("truncated"), "cut at {cut}: {e}");
    }
    // Cut right before the trailer: no trailer frame.
    let last = fs.last().unwrap();
    assert_eq!(last.1[0], KIND_TRAILER);
    let e = verify_sealed_structure(&sealed[..last.0], |_| {}).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    let mut longer = sealed.clone();
    longer.push(0);
    let e = verify_sealed_structure(&longer[..], |_| {}).unwrap_err();
    assert!(e.to_string().contains("after the trailer"), "{e}");

    // Frames out of order, or a frame left out, with every checksum recomputed: the
    // indexes tell; with the indexes rewritten too, the kinds (a tree's end missing).
    let with = |fs: &[RawFrame], renumber: bool| {
        let mut out = sealed[..header_len].to_vec();
        for (i, (_, h, p)) in fs.iter().enumerate() {
            let index = match renumber {
                true => i as u32,
                false => u32::from_le_bytes(h[4..8].try_into().unwrap()),
            };
            out.extend_from_slice(&frame_bytes(h, p, index));
        }
        out
    };
    assert_eq!(with(&fs, true), sealed);
    let mut swapped = fs.clone();
    swapped.swap(1, 2);
    let e = verify_sealed_structure(&with(&swapped, false)[..], |_| {}).unwrap_err();
    assert!(e.to_string().contains("frames reordered or missing"), "{e}");
    let end = fs.iter().position(|f| f.1[0] == KIND_END).unwrap();
    let mut without_end = fs.clone();
    without_end.remove(end);
    let e = verify_sealed_structure(&with(&without_end, true)[..], |_| {}).unwrap_err();
    assert!(e.to_string().contains("out of place"), "{e}");
    // A changed raw length (checksums recomputed) no longer fits the sealed
    // payload's length.
    let mut raw_len = fs.clone();
    let first_plain = fs.iter().position(|f| f.1[1] & 1 == 0).unwrap();
    raw_len[first_plain].1[8] ^= 1;
    let e = verify_sealed_structure(&with(&raw_len, true)[..], |_| {}).unwrap_err();
    assert!(
        e.to_string().contains("does not fit a sealed payload"),
        "{e}"
    );
    // What only the key can tell: a payload byte changed with its checksums
    // recomputed passes the structure, and fails authentication with the key.
    let mut changed = fs.clone();
    changed[1].2[3] ^= 1;
    let forged = with(&changed, true);
    verify_sealed_structure(&forged[..], |_| {}).unwrap();
    let e = verify_with_key(&forged[..], Some(&key), |_| {}).unwrap_err();
    assert!(e.to_string().contains("fails authentication"), "{e}");

    // A backup in clear is not this check's: `verify` reads all of it.
    let plain_env = filled(&tmp.path().join("plain"), None);
    let plain = backup_of(&plain_env);
    assert!(!header_is_sealed(&plain[..HEADER_PEEK_BYTES]));
    let e = verify_sealed_structure(&plain[..], |_| {}).unwrap_err();
    assert!(e.to_string().contains("not encrypted"), "{e}");
    verify(&plain[..], |_| {}).unwrap();
}

/// A backup of an encrypted environment lets go of the pages its snapshot decrypted
/// as it goes (here every eight pages, the unit tests' limit, with no shared cache
/// to keep them), resuming each tree after the last key written: every entry is in
/// the backup exactly once, in order, and the snapshot ends holding little.
#[test]
fn a_sealed_backup_scan_lets_go_of_decrypted_pages_and_misses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let opts = Options {
        encryption: Some(key.clone()),
        decrypted_cache_bytes: 0,
        write_buffer_bytes: 0,
        ..Options::default()
    };
    let env = Env::open(tmp.path(), opts).unwrap();
    env.submit(|w| {
        for t in ["a", "b"] {
            w.ensure_tree(t)?;
            for i in 0..4000u32 {
                w.put(t, &i.to_be_bytes(), &[(i % 251) as u8; 60])?;
            }
        }
        Ok(())
    })
    .unwrap();
    env.sync().unwrap();
    // Read the pages back from the data file, not from the unflushed table.
    env.close().unwrap();
    let env = Env::open(
        tmp.path(),
        Options {
            encryption: Some(key.clone()),
            decrypted_cache_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let mut r = env.begin_read().unwrap();
    let expected = state(&r);
    r.release_decrypted();
    let mut out = Vec::new();
    let mut w =
        ContainerWriter::for_snapshot(&mut out, &r, b"", BackupOptions::default(), |_| {}).unwrap();
    w.snapshot_trees(&mut r, |_| true).unwrap();
    w.finish().unwrap();
    let held = r.decrypted_bytes_held();
    assert!(
        held <= 2 * DECRYPTED_HELD_BYTES_FOR_TESTS,
        "the snapshot still holds {held} bytes"
    );
    let mut got = State::new();
    let mut tree = String::new();
    read_container_with_key(
        &out[..],
        Some(&key),
        false,
        |_| {},
        |_, item| {
            match item {
                Item::Tree(t) => {
                    tree = t.to_string();
                    got.entry(tree.clone()).or_default();
                }
                Item::Entry(k, v) => {
                    let previous = got
                        .entry(tree.clone())
                        .or_default()
                        .insert(k.to_vec(), v.to_vec());
                    assert!(previous.is_none(), "key {k:?} of {tree} written twice");
                }
                _ => {}
            }
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(got, expected);
    assert_eq!(got["a"].len() + got["b"].len(), 8000);
}

const DECRYPTED_HELD_BYTES_FOR_TESTS: u64 = 64 << 10;
