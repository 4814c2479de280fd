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
