#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer
use kiln_storage::{Env, Error, Options};

fn small_opts() -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        ..Options::default()
    }
}

#[test]
fn put_get_delete_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let env = Env::open(dir.path(), small_opts()).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        for i in 0..5000u32 {
            w.put(
                "t",
                format!("key{i:06}").as_bytes(),
                format!("value{i}").as_bytes(),
            )
            .unwrap();
        }
        w.commit().unwrap();
        let mut w = env.begin_write().unwrap();
        for i in (0..5000u32).step_by(2) {
            assert!(w.delete("t", format!("key{i:06}").as_bytes()).unwrap());
        }
        w.put("t", b"big", &vec![7u8; 100_000]).unwrap();
        w.commit().unwrap();
        let r = env.begin_read().unwrap();
        assert_eq!(r.tree_len("t").unwrap(), 2501);
        assert_eq!(r.get("t", b"key000001").unwrap(), Some(&b"value1"[..]));
        assert_eq!(r.get("t", b"key000002").unwrap(), None);
    }
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_len("t").unwrap(), 2501);
    assert_eq!(r.get("t", b"big").unwrap().unwrap().len(), 100_000);
    let mut c = r.cursor("t").unwrap();
    let mut n = 0;
    let mut e = c.first().unwrap();
    while let Some((k, _)) = e {
        n += 1;
        let _ = k;
        e = c.next().unwrap();
    }
    assert_eq!(n, 2501);
    assert!(matches!(r.get("nope", b"x"), Err(Error::TreeNotFound(_))));
}

/// `submit_with`: a unit's own error type comes back as it was (not boxed into a
/// storage error), its writes are rolled back, and a storage failure inside a unit
/// arrives converted, keeping its kind.
#[test]
fn submit_with_returns_the_units_own_error_type() {
    #[derive(Debug, PartialEq)]
    enum AppError {
        Refused(&'static str),
        Storage(String),
    }
    impl From<Error> for AppError {
        fn from(e: Error) -> Self {
            AppError::Storage(e.to_string())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();

    let value: Result<u32, AppError> = env.submit_with(|txn| {
        txn.put("t", b"kept", b"1")?;
        Ok(7)
    });
    assert_eq!(value, Ok(7));
    let refused: Result<u32, AppError> = env.submit_with(|txn| {
        txn.put("t", b"rolled-back", b"1")?;
        Err(AppError::Refused("not today"))
    });
    assert_eq!(refused, Err(AppError::Refused("not today")));
    let missing_tree: Result<(), AppError> = env.submit_with(|txn| {
        txn.put("no-such-tree", b"k", b"v")?;
        Ok(())
    });
    assert!(
        matches!(missing_tree, Err(AppError::Storage(_))),
        "{missing_tree:?}"
    );
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", b"kept").unwrap(), Some(&b"1"[..]));
    assert_eq!(r.get("t", b"rolled-back").unwrap(), None);
}

/// Keys arriving in ascending order fill whole pages: a node at the right edge that
/// overflows by an appended key is split there, not in half. With half splits the
/// same fill took twice the pages (and twice the write-back and journal images).
#[test]
fn an_ascending_fill_packs_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.commit().unwrap();
    let (keys, value) = (20_000u64, [7u8; 100]);
    for chunk in 0..keys / 1000 {
        let mut w = env.begin_write().unwrap();
        for i in chunk * 1000..(chunk + 1) * 1000 {
            w.put("t", &i.to_be_bytes(), &value).unwrap();
        }
        w.commit().unwrap();
    }
    // A random fill of another tree beside it splits in halves and must stay sound.
    let mut w = env.begin_write().unwrap();
    w.create_tree("r").unwrap();
    for i in 0..5_000u64 {
        w.put(
            "r",
            &i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes(),
            &value,
        )
        .unwrap();
    }
    w.commit().unwrap();
    let report = env.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.entries, keys + 5_000);
    let r = env.begin_read().unwrap();
    for i in (0..keys).step_by(997) {
        assert_eq!(r.get("t", &i.to_be_bytes()).unwrap(), Some(&value[..]));
    }
    // Each cell is ~120 bytes with its slot: 20,000 of them fill ~300 8 KiB pages
    // when packed, ~600 when split in halves. The random tree adds ~110 at most.
    let packed_leaves = keys * 120 / 8192;
    assert!(
        report.pages_reachable < packed_leaves * 5 / 4 + 120,
        "{} pages reachable for {} packed leaves of the ascending tree",
        report.pages_reachable,
        packed_leaves
    );
}
