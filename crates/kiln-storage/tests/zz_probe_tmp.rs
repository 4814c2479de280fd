use kiln_storage::{Env, Error, Options};
fn small_opts() -> Options {
    Options { journal_file_size_bytes: 1 << 20, data_grow_step_bytes: 1 << 20, ..Options::default() }
}
#[test]
fn probe_drop_then_create() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.put("t", b"a", b"1").unwrap();
    w.commit().unwrap();
    let mut w = env.begin_write().unwrap();
    assert!(w.drop_tree("t").unwrap());
    eprintln!("exists after drop: {:?}", w.tree_exists("t"));
    eprintln!("get after drop: {:?}", w.get("t", b"a").map(|o| o.map(|v| v.to_vec())));
    eprintln!("names after drop: {:?}", w.tree_names());
    eprintln!("create after drop: {:?}", w.create_tree("t"));
    eprintln!("put after drop: {:?}", w.put("t", b"b", b"2"));
    eprintln!("commit: {:?}", w.commit());
    let r = env.begin_read().unwrap();
    eprintln!("after commit: names {:?} len {:?} get a {:?}", r.tree_names(), r.tree_len("t"), r.get("t", b"a").map(|o| o.map(|v| v.to_vec())));
    let _ = Error::EmptyKey;
}
