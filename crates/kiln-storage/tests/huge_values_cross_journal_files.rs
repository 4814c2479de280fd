//! Values larger than a journal file go into a journal file grown for them; limits
//! give clear errors, never panics.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Env, Error, Options, MAX_KEY_SIZE};

fn opts() -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        ..Options::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_64_mib_value_survives_reopen_and_crash_replay() {
    let dir = tempfile::tempdir().unwrap();
    let big = pattern(64 << 20, 7);
    {
        let env = Env::open(dir.path(), opts()).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        w.put("t", b"big", &big).unwrap();
        w.put("t", b"mid", &pattern(3 << 20, 1)).unwrap();
        w.commit().unwrap();
        let mut w = env.begin_write().unwrap();
        w.put("t", b"mid", &pattern(2 << 20, 2)).unwrap();
        w.commit().unwrap();
        assert_eq!(
            env.begin_read()
                .unwrap()
                .get("t", b"big")
                .unwrap()
                .map(<[u8]>::len),
            Some(big.len())
        );
    }
    let env = Env::open(dir.path(), opts()).unwrap();
    let r = env.begin_read().unwrap();
    assert!(r.get("t", b"big").unwrap() == Some(&big[..]));
    assert!(r.get("t", b"mid").unwrap() == Some(&pattern(2 << 20, 2)[..]));
    drop(r);
    assert!(env.check().unwrap().is_clean());
}

#[test]
fn limits_give_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.put("t", &vec![1u8; MAX_KEY_SIZE], b"max key is fine")
        .unwrap();
    assert!(matches!(
        w.put("t", &vec![1u8; MAX_KEY_SIZE + 1], b"x"),
        Err(Error::KeyTooLarge { .. })
    ));
    assert!(matches!(w.put("t", b"", b"x"), Err(Error::EmptyKey)));
    assert!(matches!(
        w.put("nope", b"k", b"x"),
        Err(Error::TreeNotFound(_))
    ));
    assert!(matches!(w.create_tree("t"), Err(Error::TreeExists(_))));
    assert!(matches!(
        w.create_tree(""),
        Err(Error::InvalidTreeName { .. })
    ));
    // The transaction is still usable after rejected input.
    w.put("t", b"k", b"v").unwrap();
    w.commit().unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(
        r.get("t", &vec![1u8; MAX_KEY_SIZE]).unwrap(),
        Some(&b"max key is fine"[..])
    );
    assert_eq!(r.get("t", b"k").unwrap(), Some(&b"v"[..]));
}

#[test]
fn second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _env = Env::open(dir.path(), opts()).unwrap();
    assert!(matches!(
        Env::open(dir.path(), opts()),
        Err(Error::Locked { .. })
    ));
}

#[test]
fn journal_can_live_in_another_directory() {
    let data = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let o = Options {
        journal_dir: Some(journal.path().join("j")),
        ..opts()
    };
    {
        let env = Env::open(data.path(), o.clone()).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        w.put("t", b"k", b"v").unwrap();
        w.commit().unwrap();
    }
    assert!(std::fs::read_dir(journal.path().join("j")).unwrap().count() > 0);
    let env = Env::open(data.path(), o).unwrap();
    assert_eq!(
        env.begin_read().unwrap().get("t", b"k").unwrap(),
        Some(&b"v"[..])
    );
}

#[test]
fn stray_entry_in_journal_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(Env::open(dir.path(), opts()).unwrap());
    std::fs::create_dir(dir.path().join("journal").join("stray")).unwrap();
    let err = Env::open(dir.path(), opts()).err().expect("must refuse");
    assert!(err.to_string().contains("stray"), "{err}");
}
