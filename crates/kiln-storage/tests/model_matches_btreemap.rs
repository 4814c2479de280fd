//! Model-based test: long random sequences of operations on an environment with a
//! few trees, checked against a `BTreeMap` model after every step that matters.
//!
//! The driver is a seeded random loop (one seed per run, printed on failure together
//! with the last operations), because operations such as reopening the environment or
//! keeping read transactions across commits need state that does not fit proptest's
//! shrinking well. A small proptest at the end covers single-transaction contents and
//! cursor positioning, where shrinking does help.
//!
//! Every seed reopens the environment now and then. Odd seeds let the flusher
//! checkpoint only on request and reopen half the time from a crash image (the files
//! copied while the environment is open), so that recovery replays the journal of a
//! random workload: diff-encoded pages, overflow runs, dropped trees, file switches.
//!
//! Seeds and sizes can be changed for a soak run:
//! `KILN_MODEL_SEEDS=100 KILN_MODEL_STEPS=3000 cargo test --release --test model_matches_btreemap`
//! or a single seed with `KILN_MODEL_SEED=<n>`.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::{Cursor, Env, Error, Options, ReadTxn, WriteTxn, MAX_KEY_SIZE};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

type Val = Arc<[u8]>;
type Tree = BTreeMap<Vec<u8>, Val>;
type Model = BTreeMap<String, Tree>;

const TREES: [&str; 3] = ["alpha", "beta", "gamma"];

fn small_opts() -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        ..Options::default()
    }
}

/// The flusher checkpoints only when asked (`env.sync()`, close), so that the files can
/// be copied while the environment is open: a crash image whose journal holds every
/// commit since the last sync.
fn manual_checkpoint_opts() -> Options {
    Options {
        sync_interval_ms: 3_600_000,
        sync_after_bytes: 1 << 40,
        max_unflushed_bytes: 1 << 32,
        ..small_opts()
    }
}

/// Copies an environment's files (not the lock file) to `dst`.
fn copy_env_files(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst.join("journal")).unwrap();
    for sub in [None, Some("journal")] {
        let (from, to) = match sub {
            None => (src.to_path_buf(), dst.to_path_buf()),
            Some(s) => (src.join(s), dst.join(s)),
        };
        for entry in std::fs::read_dir(&from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() || entry.file_name() == "kiln.lock" {
                continue;
            }
            // The flusher may rename a journal file it is preparing meanwhile: a file
            // gone before it could be copied is not part of the crash image.
            match std::fs::copy(entry.path(), to.join(entry.file_name())) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("copy {:?}: {e}", entry.path()),
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Failure context: the seed and the recent operations, printed if the test panics.
// ---------------------------------------------------------------------------------

thread_local! {
    static LOG: RefCell<VecDeque<String>> = const { RefCell::new(VecDeque::new()) };
}

fn log(op: impl FnOnce() -> String) {
    LOG.with(|l| {
        let mut l = l.borrow_mut();
        if l.len() == 40 {
            l.pop_front();
        }
        l.push_back(op());
    });
}

struct DumpOnPanic {
    seed: u64,
}

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("=== model test failed with seed {} (rerun with KILN_MODEL_SEED={}); last operations:", self.seed, self.seed);
            LOG.with(|l| l.borrow().iter().for_each(|op| eprintln!("  {op}")));
        }
        LOG.with(|l| l.borrow_mut().clear());
    }
}

/// Short printable form of a key or value.
fn short(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(40);
    for c in b.iter().take(12) {
        s.push(HEX[usize::from(c >> 4)] as char);
        s.push(HEX[usize::from(c & 15)] as char);
    }
    if b.len() > 12 {
        s.push_str("..");
    }
    s.push('[');
    s.push_str(&b.len().to_string());
    s.push(']');
    s
}

fn show(e: Option<(&[u8], &[u8])>) -> String {
    match e {
        None => "None".into(),
        Some((k, v)) => format!("({}, {})", short(k), short(v)),
    }
}

#[track_caller]
fn check_entry(
    what: impl std::fmt::Display,
    got: Option<(&[u8], &[u8])>,
    want: Option<(&[u8], &[u8])>,
) {
    if got != want {
        panic!("{what}: got {}, expected {}", show(got), show(want));
    }
}

#[track_caller]
fn ok<T>(r: kiln_storage::Result<T>, what: impl std::fmt::Display) -> T {
    r.unwrap_or_else(|e| panic!("{what}: unexpected error: {e}"))
}

// ---------------------------------------------------------------------------------
// Random keys and values.
// ---------------------------------------------------------------------------------

/// How a seed draws keys: some seeds favour long keys (deep trees, few cells per page).
#[derive(Clone, Copy, Debug)]
struct Profile {
    long_key_pct: u32,
    big_value_permille: u32,
    /// Above this many entries a tree is pushed towards deletes.
    soft_cap: usize,
    /// Checkpoints only on request, and half the reopens are from a crash image.
    crashes: bool,
}

fn gen_key(rng: &mut StdRng, p: &Profile) -> Vec<u8> {
    const PREFIXES: [&str; 5] = ["", "a", "user/", "user/0", "z"];
    let roll = rng.gen_range(0..100);
    if roll < p.long_key_pct {
        let len = if rng.gen_bool(0.25) {
            MAX_KEY_SIZE
        } else {
            rng.gen_range(200..=MAX_KEY_SIZE)
        };
        let mut k = vec![0u8; len];
        // A short random head so long keys spread over the key space, then filler.
        rng.fill(&mut k[..4.min(len)]);
        k[4..].iter_mut().for_each(|b| *b = b'L');
        return k;
    }
    match rng.gen_range(0..100) {
        0..=54 => format!(
            "{}{}",
            PREFIXES[rng.gen_range(0..PREFIXES.len())],
            rng.gen_range(0..3000)
        )
        .into_bytes(),
        55..=79 => {
            // Small alphabet with extreme bytes: many prefix relationships.
            const ALPHA: [u8; 6] = [0x00, 0x01, b'a', b'b', 0xfe, 0xff];
            let len = rng.gen_range(1..=6);
            (0..len)
                .map(|_| ALPHA[rng.gen_range(0..ALPHA.len())])
                .collect()
        }
        _ => {
            let len = rng.gen_range(16..200);
            let mut k = format!("m{}-", rng.gen_range(0..500)).into_bytes();
            k.resize(len, b'.');
            k
        }
    }
}

fn gen_value(rng: &mut StdRng, p: &Profile) -> Vec<u8> {
    let roll = rng.gen_range(0..1000);
    let len = if roll < p.big_value_permille {
        // Overflow runs of 1..38 pages.
        if rng.gen_bool(0.7) {
            rng.gen_range(3 * 1024..32 * 1024)
        } else {
            rng.gen_range(32 * 1024..=300 * 1024)
        }
    } else if roll < 650 {
        rng.gen_range(0..48)
    } else if roll < 950 {
        // Around the inline limit (a leaf cell of at most ~2 KiB).
        rng.gen_range(48..2100)
    } else {
        rng.gen_range(2100..3 * 1024)
    };
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// A key near the model's keys: existing, just above, just below, or unrelated.
fn probe_key(rng: &mut StdRng, keys: &[(&[u8], &[u8])], p: &Profile) -> Vec<u8> {
    if keys.is_empty() || rng.gen_bool(0.25) {
        return match rng.gen_range(0..4) {
            0 => vec![0x00],
            1 => vec![0xff; 3],
            _ => gen_key(rng, p),
        };
    }
    let k = keys[rng.gen_range(0..keys.len())].0;
    match rng.gen_range(0..4) {
        0 => k.to_vec(),
        1 => [k, &[0x00]].concat(),
        2 if k.len() > 1 => k[..k.len() - 1].to_vec(),
        _ => {
            let mut k = k.to_vec();
            let last = k.len() - 1;
            k[last] = k[last].wrapping_add(1);
            k
        }
    }
}

fn pick_existing(rng: &mut StdRng, tree: &Tree, p: &Profile) -> Option<Vec<u8>> {
    let probe = gen_key(rng, p);
    tree.range(probe..)
        .next()
        .or_else(|| tree.iter().next())
        .map(|(k, _)| k.clone())
}

// ---------------------------------------------------------------------------------
// Cursor checks against the model.
// ---------------------------------------------------------------------------------

/// Where a model cursor is, mirroring the engine's cursor states.
#[derive(Clone, Copy, Debug)]
enum Pos {
    Fresh,
    At(usize),
    AfterEnd,
    BeforeStart,
}

fn entries(tree: &Tree) -> Vec<(&[u8], &[u8])> {
    tree.iter().map(|(k, v)| (k.as_slice(), &v[..])).collect()
}

/// Full scans both ways, running off both ends, and random seeks followed by walks.
fn check_cursor(
    c: &mut Cursor<'_>,
    tree: &Tree,
    rng: &mut StdRng,
    p: &Profile,
    seeks: usize,
    what: &str,
) {
    let want = entries(tree);
    let n = want.len();
    let at = |pos: Pos| match pos {
        Pos::At(i) => Some(want[i]),
        _ => None,
    };

    // A fresh cursor: `next` starts at the first entry, `prev` at the last.
    let mut pos = Pos::Fresh;
    let (got, step) = if rng.gen_bool(0.5) {
        (ok(c.next(), what), "fresh next")
    } else {
        (ok(c.prev(), what), "fresh prev")
    };
    pos = model_step(pos, step.ends_with("next"), n);
    check_entry(format_args!("{what}: {step}"), got, at(pos));

    // Forward scan.
    let mut got = ok(c.first(), what);
    for (i, w) in want.iter().enumerate() {
        check_entry(
            format_args!("{what}: forward scan entry {i} of {n}"),
            got,
            Some(*w),
        );
        got = ok(c.next(), what);
    }
    check_entry(format_args!("{what}: forward scan end"), got, None);
    check_entry(
        format_args!("{what}: next after the end"),
        ok(c.next(), what),
        None,
    );
    check_entry(
        format_args!("{what}: prev after the end"),
        ok(c.prev(), what),
        want.last().copied(),
    );

    // Backward scan.
    let mut got = ok(c.last(), what);
    for (i, w) in want.iter().enumerate().rev() {
        check_entry(
            format_args!("{what}: backward scan entry {i} of {n}"),
            got,
            Some(*w),
        );
        got = ok(c.prev(), what);
    }
    check_entry(format_args!("{what}: backward scan end"), got, None);
    check_entry(
        format_args!("{what}: prev before the start"),
        ok(c.prev(), what),
        None,
    );
    check_entry(
        format_args!("{what}: next before the start"),
        ok(c.next(), what),
        want.first().copied(),
    );

    // Seeks, each followed by a short random walk.
    for s in 0..seeks {
        let k = probe_key(rng, &want, p);
        let ge = want.partition_point(|(ek, _)| *ek < &k[..]);
        let le = want.partition_point(|(ek, _)| *ek <= &k[..]);
        if rng.gen_bool(0.5) {
            pos = if ge < n { Pos::At(ge) } else { Pos::AfterEnd };
            check_entry(
                format_args!("{what}: seek #{s} to {}", short(&k)),
                ok(c.seek(&k), what),
                at(pos),
            );
        } else {
            pos = if le > 0 {
                Pos::At(le - 1)
            } else {
                Pos::BeforeStart
            };
            check_entry(
                format_args!("{what}: seek_for_prev #{s} to {}", short(&k)),
                ok(c.seek_for_prev(&k), what),
                at(pos),
            );
        }
        for w in 0..rng.gen_range(0..8) {
            let forward = rng.gen_bool(0.5);
            let got = if forward {
                ok(c.next(), what)
            } else {
                ok(c.prev(), what)
            };
            pos = model_step(pos, forward, n);
            check_entry(
                format_args!(
                    "{what}: step {w} ({}) after seek #{s} to {}",
                    if forward { "next" } else { "prev" },
                    short(&k)
                ),
                got,
                at(pos),
            );
        }
    }
}

fn model_step(pos: Pos, forward: bool, n: usize) -> Pos {
    let first = if n > 0 { Pos::At(0) } else { Pos::AfterEnd };
    let last = if n > 0 {
        Pos::At(n - 1)
    } else {
        Pos::BeforeStart
    };
    match (pos, forward) {
        (Pos::Fresh | Pos::BeforeStart, true) => first,
        (Pos::AfterEnd, true) => Pos::AfterEnd,
        (Pos::At(i), true) => {
            if i + 1 < n {
                Pos::At(i + 1)
            } else {
                Pos::AfterEnd
            }
        }
        (Pos::Fresh | Pos::AfterEnd, false) => last,
        (Pos::BeforeStart, false) => Pos::BeforeStart,
        (Pos::At(i), false) => {
            if i > 0 {
                Pos::At(i - 1)
            } else {
                Pos::BeforeStart
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Whole-state checks.
// ---------------------------------------------------------------------------------

/// Everything a read transaction shows must match the model: `full` also reads every
/// key and scans every tree; otherwise a sample.
fn check_read(
    r: &ReadTxn<'_>,
    model: &Model,
    rng: &mut StdRng,
    p: &Profile,
    full: bool,
    what: &str,
) {
    let names: Vec<String> = model.keys().cloned().collect();
    assert_eq!(ok(r.tree_names(), what), names, "{what}: tree names");
    for name in TREES {
        let Some(tree) = model.get(name) else {
            assert!(
                !ok(r.tree_exists(name), what),
                "{what}: dropped tree {name} still exists"
            );
            assert!(
                matches!(r.get(name, b"k"), Err(Error::TreeNotFound(_))),
                "{what}: get on missing tree {name}"
            );
            assert!(
                matches!(r.cursor(name), Err(Error::TreeNotFound(_))),
                "{what}: cursor on missing tree {name}"
            );
            continue;
        };
        let what = format!("{what}, tree {name}");
        assert_eq!(
            ok(r.tree_len(name), &what),
            tree.len() as u64,
            "{what}: tree_len"
        );
        if full {
            for (k, v) in tree {
                let got = ok(r.get(name, k), &what);
                check_entry(
                    format_args!("{what}: get {}", short(k)),
                    got.map(|g| (&k[..], g)),
                    Some((&k[..], &v[..])),
                );
            }
        } else {
            for _ in 0..10 {
                if let Some(k) = pick_existing(rng, tree, p) {
                    let got = ok(r.get(name, &k), &what);
                    check_entry(
                        format_args!("{what}: get {}", short(&k)),
                        got.map(|g| (&k[..], g)),
                        Some((&k[..], &tree[&k][..])),
                    );
                }
            }
        }
        let es = entries(tree);
        for _ in 0..if full { 20 } else { 5 } {
            let k = probe_key(rng, &es, p);
            let got = ok(r.get(name, &k), &what);
            let want = tree.get(&k).map(|v| (&k[..], &v[..]));
            check_entry(
                format_args!("{what}: probe get {}", short(&k)),
                got.map(|g| (&k[..], g)),
                want,
            );
        }
        if full || rng.gen_bool(0.3) {
            let mut c = ok(r.cursor(name), &what);
            check_cursor(&mut c, tree, rng, p, if full { 12 } else { 4 }, &what);
        }
    }
}

/// Checks what the write transaction shows of its own uncommitted state.
fn check_write(
    w: &mut WriteTxn<'_>,
    model: &Model,
    rng: &mut StdRng,
    p: &Profile,
    cursor: bool,
    what: &str,
) {
    let names: Vec<String> = model.keys().cloned().collect();
    assert_eq!(
        ok(w.tree_names(), what),
        names,
        "{what}: tree names in the write txn"
    );
    for (name, tree) in model {
        let what = format!("{what}, tree {name}");
        assert_eq!(
            ok(w.tree_len(name), &what),
            tree.len() as u64,
            "{what}: tree_len in the write txn"
        );
        for _ in 0..5 {
            let k = if rng.gen_bool(0.6) {
                pick_existing(rng, tree, p)
            } else {
                None
            }
            .unwrap_or_else(|| gen_key(rng, p));
            let got = ok(w.get(name, &k), &what);
            let want = tree.get(&k).map(|v| (&k[..], &v[..]));
            check_entry(
                format_args!("{what}: get {} in the write txn", short(&k)),
                got.map(|g| (&k[..], g)),
                want,
            );
        }
        if cursor {
            let mut c = ok(w.cursor(name), &what);
            check_cursor(
                &mut c,
                tree,
                rng,
                p,
                4,
                &format!("{what} (write txn cursor)"),
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// The driver.
// ---------------------------------------------------------------------------------

struct Driver {
    rng: StdRng,
    profile: Profile,
    /// The committed state.
    model: Model,
    last_txn: u64,
    steps_left: usize,
    commits: usize,
    aborts: usize,
    reopens: usize,
    big_values: usize,
    stale_reader_checks: usize,
    max_tree_len: usize,
    crashes: usize,
    replayed: u64,
    /// Ids of all commits that wrote something (commits without changes get no id).
    commit_ids: Vec<u64>,
}

enum TxnEnd {
    Commit,
    Abort,
    Drop,
}

impl Driver {
    /// Journal records written after txn `synced`.
    fn commits_since(&self, synced: u64) -> u64 {
        self.commit_ids.iter().filter(|id| **id > synced).count() as u64
    }

    /// One write transaction of random operations, checked as it goes, then ended.
    /// Returns whether it committed.
    fn write_txn(&mut self, env: &Env) -> bool {
        let Driver {
            rng, profile: p, ..
        } = self;
        let p = *p;
        let mut pending = self.model.clone();
        let mut w = ok(env.begin_write(), "begin_write");
        assert_eq!(w.txn_id(), self.last_txn + 1);
        let mut changed = false;
        let ops = if rng.gen_bool(0.1) {
            rng.gen_range(100..400)
        } else {
            rng.gen_range(1..40)
        };
        for op in 0..ops {
            let what = format!("txn {} op {op}", w.txn_id());
            let live: Vec<String> = pending.keys().cloned().collect();
            let roll = rng.gen_range(0..1000);
            if live.is_empty() || roll < 8 {
                // Create (or ensure) a tree.
                // (Possibly one dropped earlier in this transaction: it comes back empty.)
                let name = TREES[rng.gen_range(0..TREES.len())];
                let exists = pending.contains_key(name);
                log(|| format!("{what}: create/ensure {name} (exists {exists})"));
                if rng.gen_bool(0.5) {
                    ok(w.ensure_tree(name), &what);
                } else {
                    match w.create_tree(name) {
                        Ok(()) => assert!(
                            !exists,
                            "{what}: create_tree({name}) succeeded on an existing tree"
                        ),
                        Err(Error::TreeExists(n)) => {
                            assert!(exists && n == name, "{what}: TreeExists({n}) for {name}")
                        }
                        Err(e) => panic!("{what}: create_tree({name}): {e}"),
                    }
                }
                if !exists {
                    pending.insert(name.to_string(), Tree::new());
                    changed = true;
                }
                continue;
            }
            let name = live[rng.gen_range(0..live.len())].clone();
            let tree = pending.get_mut(&name).unwrap();
            let delete_bias = (tree.len() as f64 / p.soft_cap as f64).min(1.0);
            let roll_f = rng.gen::<f64>();
            if roll < 9 {
                log(|| format!("{what}: drop_tree {name} ({} entries)", tree.len()));
                assert!(
                    ok(w.drop_tree(&name), &what),
                    "{what}: drop_tree({name}) of an existing tree returned false"
                );
                pending.remove(&name);
                changed = true;
                if rng.gen_bool(0.5) {
                    // Gone for the rest of the transaction, until created again.
                    assert!(
                        !ok(w.tree_exists(&name), &what),
                        "{what}: {name} exists after drop_tree"
                    );
                    assert!(
                        matches!(w.get(&name, b"k"), Err(Error::TreeNotFound(_))),
                        "{what}: get on dropped {name}"
                    );
                    assert!(
                        matches!(w.put(&name, b"k", b"v"), Err(Error::TreeNotFound(_))),
                        "{what}: put into dropped {name}"
                    );
                    assert!(
                        matches!(w.delete(&name, b"k"), Err(Error::TreeNotFound(_))),
                        "{what}: delete in dropped {name}"
                    );
                    assert!(
                        !ok(w.drop_tree(&name), &what),
                        "{what}: second drop_tree({name})"
                    );
                }
            } else if roll < 19 {
                // The key limits, which must not spoil the transaction.
                let long = vec![b'k'; MAX_KEY_SIZE + 1 + rng.gen_range(0..3000)];
                log(|| format!("{what}: key limits on {name}"));
                match w.put(&name, &long, b"v") {
                    Err(Error::KeyTooLarge { len, max }) => {
                        assert_eq!((len, max), (long.len(), MAX_KEY_SIZE))
                    }
                    other => panic!("{what}: put with a {}-byte key: {other:?}", long.len()),
                }
                match w.delete(&name, &long) {
                    Err(Error::KeyTooLarge { len, max }) => {
                        assert_eq!((len, max), (long.len(), MAX_KEY_SIZE))
                    }
                    other => panic!("{what}: delete with a {}-byte key: {other:?}", long.len()),
                }
                assert!(
                    matches!(w.put(&name, b"", b"v"), Err(Error::EmptyKey)),
                    "{what}: put with an empty key"
                );
                assert!(
                    matches!(w.delete(&name, b""), Err(Error::EmptyKey)),
                    "{what}: delete with an empty key"
                );
                assert!(
                    matches!(
                        w.put("no-such-tree", b"k", b"v"),
                        Err(Error::TreeNotFound(_))
                    ),
                    "{what}: put into a missing tree"
                );
                assert!(
                    matches!(w.create_tree(""), Err(Error::InvalidTreeName { .. })),
                    "{what}: empty tree name"
                );
            } else if roll < 35 {
                let cursor = rng.gen_bool(0.3);
                check_write(&mut w, &pending, rng, &p, cursor, &what);
            } else if roll_f < 0.15 + 0.6 * delete_bias * delete_bias {
                // Delete: mostly existing keys, sometimes absent ones.
                let key = if rng.gen_bool(0.85) {
                    pick_existing(rng, tree, &p)
                } else {
                    None
                }
                .unwrap_or_else(|| gen_key(rng, &p));
                let existed = tree.remove(&key).is_some();
                log(|| format!("{what}: delete {name} {} (existed {existed})", short(&key)));
                assert_eq!(
                    ok(w.delete(&name, &key), &what),
                    existed,
                    "{what}: delete {} returned the wrong flag",
                    short(&key)
                );
                changed |= existed;
            } else {
                // Put: a new key or an overwrite.
                let key = if rng.gen_bool(0.3) {
                    pick_existing(rng, tree, &p)
                } else {
                    None
                }
                .unwrap_or_else(|| gen_key(rng, &p));
                let value = gen_value(rng, &p);
                if value.len() >= 3 * 1024 {
                    self.big_values += 1;
                }
                log(|| format!("{what}: put {name} {} = {}", short(&key), short(&value)));
                ok(w.put(&name, &key, &value), &what);
                tree.insert(key, value.into());
                changed = true;
            }
        }
        let end = match rng.gen_range(0..100) {
            0..=79 => TxnEnd::Commit,
            80..=91 => TxnEnd::Abort,
            _ => TxnEnd::Drop,
        };
        if rng.gen_bool(0.2) {
            check_write(
                &mut w,
                &pending,
                rng,
                &p,
                true,
                "before ending the write txn",
            );
        }
        match end {
            TxnEnd::Commit => {
                let expect = w.txn_id();
                let id = ok(w.commit(), "commit");
                log(|| format!("commit -> txn {id} (changed {changed})"));
                if changed {
                    assert_eq!(id, expect, "a commit with changes must get the next id");
                } else {
                    assert!(
                        id == expect || id == self.last_txn,
                        "commit id {id}, last {}",
                        self.last_txn
                    );
                }
                if id != self.last_txn {
                    self.commit_ids.push(id);
                }
                self.last_txn = id;
                self.model = pending;
                self.commits += 1;
                self.max_tree_len = self
                    .model
                    .values()
                    .map(Tree::len)
                    .max()
                    .unwrap_or(0)
                    .max(self.max_tree_len);
                true
            }
            TxnEnd::Abort => {
                log(|| "abort".into());
                w.abort();
                self.aborts += 1;
                false
            }
            TxnEnd::Drop => {
                log(|| "drop write txn (abort)".into());
                drop(w);
                self.aborts += 1;
                false
            }
        }
    }

    /// Runs operations on one opening of the environment until it is time to reopen.
    fn epoch(&mut self, env: &Env) {
        // Readers kept across later commits, with the model of their snapshot.
        let mut held: Vec<(ReadTxn<'_>, Arc<Model>)> = Vec::new();
        let mut snapshot = Arc::new(self.model.clone());
        while self.steps_left > 0 {
            self.steps_left -= 1;
            let roll = self.rng.gen_range(0..100);
            match roll {
                0..=64 => {
                    if self.write_txn(env) {
                        snapshot = Arc::new(self.model.clone());
                    }
                    let r = ok(env.begin_read(), "begin_read");
                    assert_eq!(r.txn_id(), self.last_txn);
                    let full = self.rng.gen_bool(0.1);
                    check_read(
                        &r,
                        &snapshot,
                        &mut self.rng,
                        &self.profile,
                        full,
                        &format!("after txn {}", self.last_txn),
                    );
                }
                65..=74 if held.len() < 4 => {
                    let r = ok(env.begin_read(), "begin_read");
                    log(|| format!("hold a reader at txn {}", r.txn_id()));
                    held.push((r, snapshot.clone()));
                }
                65..=79 if !held.is_empty() => {
                    let i = self.rng.gen_range(0..held.len());
                    let (r, m) = &held[i];
                    let full = roll >= 75;
                    log(|| {
                        format!(
                            "check held reader at txn {} (now {}, full {full})",
                            r.txn_id(),
                            self.last_txn
                        )
                    });
                    if r.txn_id() != self.last_txn {
                        self.stale_reader_checks += 1;
                    }
                    check_read(
                        r,
                        m,
                        &mut self.rng,
                        &self.profile,
                        full,
                        &format!("held reader at txn {} (now {})", r.txn_id(), self.last_txn),
                    );
                    if full {
                        held.swap_remove(i);
                    }
                }
                // (Rarer with crash images, so that they replay longer journals.)
                80..=86 if !self.profile.crashes || self.rng.gen_bool(0.3) => {
                    log(|| "sync".into());
                    let synced = ok(env.sync(), "sync");
                    assert_eq!(synced, self.last_txn, "sync returns the last commit");
                    assert_eq!(env.stats().synced_txn_id, self.last_txn);
                }
                87..=89 => {
                    let stats = env.stats();
                    assert_eq!(stats.last_txn_id, self.last_txn);
                    assert_eq!(stats.readers_open, held.len() as u64);
                }
                90..=92 => break,
                _ => {
                    let r = ok(env.begin_read(), "begin_read");
                    check_read(
                        &r,
                        &self.model,
                        &mut self.rng,
                        &self.profile,
                        true,
                        "full check",
                    );
                }
            }
        }
        for (r, m) in &held {
            check_read(
                r,
                m,
                &mut self.rng,
                &self.profile,
                false,
                &format!("held reader at txn {} before reopen", r.txn_id()),
            );
        }
    }
}

fn run_seed(seed: u64, steps: usize) {
    let _dump = DumpOnPanic { seed };
    let mut rng = StdRng::seed_from_u64(seed);
    let profile = Profile {
        long_key_pct: [3, 5, 30][rng.gen_range(0..3)],
        big_value_permille: [10, 20][rng.gen_range(0..2)],
        soft_cap: [400, 2000][rng.gen_range(0..2)],
        crashes: seed % 2 == 1,
    };
    log(|| format!("seed {seed}: {profile:?}"));
    let opts = if profile.crashes {
        manual_checkpoint_opts()
    } else {
        small_opts()
    };
    // The write buffer: off, merged often, merged now and then, or (the default) only
    // at close.
    let opts = Options {
        write_buffer_bytes: [0, 16 << 10, 256 << 10, 32 << 20][(seed / 2 % 4) as usize],
        ..opts
    };
    log(|| format!("write_buffer_bytes {}", opts.write_buffer_bytes));
    let mut dir = tempfile::tempdir().unwrap();
    // A clean close merges the write buffer into the trees with commits of its own.
    let mut closed_cleanly = false;
    // Commits the next open must replay (those after the last checkpoint of a crash image).
    let mut to_replay = 0;
    let mut d = Driver {
        rng,
        profile,
        model: Model::new(),
        last_txn: 0,
        steps_left: steps,
        commits: 0,
        aborts: 0,
        reopens: 0,
        big_values: 0,
        stale_reader_checks: 0,
        max_tree_len: 0,
        crashes: 0,
        replayed: 0,
        commit_ids: Vec::new(),
    };
    loop {
        let (env, report) = ok(Env::open_with_report(dir.path(), opts.clone()), "open");
        log(|| format!("opened: {report:?}"));
        assert_eq!(
            report.records_replayed, to_replay,
            "records replayed: {report:?}"
        );
        d.replayed += report.records_replayed;
        assert_eq!(report.gap_records_discarded, 0, "{report:?}");
        if closed_cleanly && report.last_txn_id > d.last_txn {
            log(|| {
                format!(
                    "the close committed merges up to txn {}",
                    report.last_txn_id
                )
            });
            d.last_txn = report.last_txn_id;
        }
        assert_eq!(report.last_txn_id, d.last_txn, "{report:?}");
        // Every reopen here follows a clean close or a copy taken between commits: the
        // tail is clean even once journal files are recycled (old bytes after the last
        // record are not a dropped record).
        assert_eq!(report.tail, kiln_storage::JournalTail::Clean, "{report:?}");
        {
            let r = ok(env.begin_read(), "begin_read");
            assert_eq!(r.txn_id(), d.last_txn);
            check_read(&r, &d.model, &mut d.rng, &d.profile, true, "after open");
        }
        d.epoch(&env);
        if d.steps_left == 0 {
            let r = ok(env.begin_read(), "begin_read");
            check_read(&r, &d.model, &mut d.rng, &d.profile, true, "at the end");
            break;
        }
        d.reopens += 1;
        to_replay = 0;
        closed_cleanly = true;
        if d.profile.crashes && d.rng.gen_bool(0.5) {
            // Crash: continue from a copy of the files taken while the environment is
            // open; every commit since the last checkpoint must come from the journal.
            let stats = env.stats();
            assert_eq!(stats.last_txn_id, d.last_txn);
            to_replay = d.commits_since(stats.synced_txn_id);
            log(|| {
                format!(
                    "crash image at txn {} (synced {}, {to_replay} commits to replay)",
                    d.last_txn, stats.synced_txn_id
                )
            });
            d.crashes += 1;
            closed_cleanly = false;
            let image = tempfile::tempdir().unwrap();
            copy_env_files(dir.path(), image.path());
            drop(env);
            dir = image;
        } else if d.rng.gen_bool(0.5) {
            log(|| "close".into());
            ok(env.close(), "close");
        } else {
            log(|| "drop env".into());
            drop(env);
        }
    }
    eprintln!(
        "seed {seed}: {:?}, {} commits, {} aborts, {} reopens ({} from crash images replaying {} commits), {} big values, {} checks of stale readers, largest tree {}",
        d.profile, d.commits, d.aborts, d.reopens, d.crashes, d.replayed, d.big_values, d.stale_reader_checks, d.max_tree_len
    );
    assert!(d.commits > steps / 4, "too few commits to mean anything");
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

#[test]
fn random_operations_match_a_btreemap() {
    let steps = env_usize("KILN_MODEL_STEPS").unwrap_or(500);
    if let Some(seed) = env_usize("KILN_MODEL_SEED") {
        return run_seed(seed as u64, steps);
    }
    let seeds = env_usize("KILN_MODEL_SEEDS").unwrap_or(5) as u64;
    for seed in 0..seeds {
        run_seed(0x6b69_6c6e_0000 + seed, steps);
    }
}

// ---------------------------------------------------------------------------------
// Targeted cases.
// ---------------------------------------------------------------------------------

#[test]
fn key_limits() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    let max = vec![0xabu8; MAX_KEY_SIZE];
    w.put("t", &max, b"fits").unwrap();
    w.put("t", &[0u8], b"one zero byte").unwrap();
    for len in [MAX_KEY_SIZE + 1, MAX_KEY_SIZE * 4, 70_000] {
        let k = vec![1u8; len];
        assert!(
            matches!(w.put("t", &k, b"v"), Err(Error::KeyTooLarge { len: l, max: m }) if l == len && m == MAX_KEY_SIZE)
        );
        assert!(
            matches!(w.delete("t", &k), Err(Error::KeyTooLarge { len: l, max: m }) if l == len && m == MAX_KEY_SIZE)
        );
    }
    assert!(matches!(w.put("t", b"", b"v"), Err(Error::EmptyKey)));
    assert!(matches!(w.delete("t", b""), Err(Error::EmptyKey)));
    // The rejected operations did not spoil the transaction.
    assert_eq!(w.commit().unwrap(), 1);
    drop(env);
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let r = env.begin_read().unwrap();
    assert_eq!(r.get("t", &max).unwrap(), Some(&b"fits"[..]));
    assert_eq!(r.get("t", &[0u8]).unwrap(), Some(&b"one zero byte"[..]));
    assert_eq!(r.tree_len("t").unwrap(), 2);
}

/// Dropping a tree and creating it again in the same transaction must give an empty
/// tree; after the drop the tree must not be visible in the transaction.
/// (Regression: the transaction used to find the dropped tree in the catalog again.)
#[test]
fn drop_then_recreate_in_one_txn() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.put("t", b"old", b"1").unwrap();
    w.commit().unwrap();

    let mut w = env.begin_write().unwrap();
    assert!(w.drop_tree("t").unwrap());
    assert!(
        !w.tree_exists("t").unwrap(),
        "dropped tree still exists in its transaction"
    );
    assert!(
        matches!(w.get("t", b"old"), Err(Error::TreeNotFound(_))),
        "dropped tree still readable"
    );
    assert!(w.tree_names().unwrap().is_empty());
    w.create_tree("t").unwrap();
    assert_eq!(w.tree_len("t").unwrap(), 0);
    w.put("t", b"new", b"2").unwrap();
    w.commit().unwrap();

    let r = env.begin_read().unwrap();
    assert_eq!(r.tree_names().unwrap(), vec!["t".to_string()]);
    assert_eq!(r.get("t", b"old").unwrap(), None);
    assert_eq!(r.get("t", b"new").unwrap(), Some(&b"2"[..]));
    assert_eq!(r.tree_len("t").unwrap(), 1);
}

/// Writes after a drop in the same transaction must not be silently accepted and lost.
#[test]
fn put_after_drop_in_one_txn_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), small_opts()).unwrap();
    let mut w = env.begin_write().unwrap();
    w.create_tree("t").unwrap();
    w.put("t", b"old", b"1").unwrap();
    w.commit().unwrap();
    let mut w = env.begin_write().unwrap();
    assert!(w.drop_tree("t").unwrap());
    assert!(matches!(
        w.put("t", b"k", b"v"),
        Err(Error::TreeNotFound(_))
    ));
}

/// Tree dropped and re-created in consecutive transactions (the supported way).
#[test]
fn drop_and_recreate_across_txns_with_large_values() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(dir.path(), small_opts()).unwrap();
    for round in 0..4u8 {
        let mut w = env.begin_write().unwrap();
        w.ensure_tree("t").unwrap();
        for i in 0..300u32 {
            let v = vec![round; if i % 37 == 0 { 50_000 } else { 100 }];
            w.put("t", format!("{i:05}").as_bytes(), &v).unwrap();
        }
        w.commit().unwrap();
        let r = env.begin_read().unwrap();
        assert_eq!(r.tree_len("t").unwrap(), 300);
        assert_eq!(
            r.get("t", b"00037").unwrap().unwrap(),
            &vec![round; 50_000][..]
        );
        drop(r);
        let mut w = env.begin_write().unwrap();
        assert!(w.drop_tree("t").unwrap());
        assert!(!w.drop_tree("never").unwrap());
        w.commit().unwrap();
        assert!(!env.begin_read().unwrap().tree_exists("t").unwrap());
        env.sync().unwrap();
    }
    // Freed pages were reused: four rounds did not need four times the space.
    let stats = env.stats();
    assert!(
        stats.pages_total < 3 * 300,
        "pages not reused: {} pages",
        stats.pages_total
    );
}

// ---------------------------------------------------------------------------------
// proptest: one transaction's contents and cursor positioning, with shrinking.
// ---------------------------------------------------------------------------------

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(b'a'), Just(0xffu8)], 1..5),
        2 => proptest::collection::vec(any::<u8>(), 1..40),
        1 => (1usize..=MAX_KEY_SIZE).prop_map(|n| vec![b'q'; n]),
    ]
}

fn value_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..64),
        2 => (0usize..2500).prop_map(|n| vec![7u8; n]),
        1 => (3000usize..40_000).prop_map(|n| vec![9u8; n]),
    ]
}

fn check_against(
    dir: &Path,
    expected: &Tree,
    probes: &[Vec<u8>],
) -> std::result::Result<(), TestCaseError> {
    let env = Env::open(dir, small_opts()).unwrap();
    let r = env.begin_read().unwrap();
    prop_assert_eq!(r.tree_len("t").unwrap(), expected.len() as u64);
    let want = entries(expected);
    let mut c = r.cursor("t").unwrap();
    let mut got = Vec::new();
    let mut e = c.first().unwrap();
    while let Some((k, v)) = e {
        got.push((k, v));
        e = c.next().unwrap();
    }
    prop_assert!(got == want, "forward scan differs");
    for k in probes {
        let ge = want.partition_point(|(ek, _)| *ek < &k[..]);
        let le = want.partition_point(|(ek, _)| *ek <= &k[..]);
        prop_assert_eq!(c.seek(k).unwrap(), want.get(ge).copied(), "seek {:?}", k);
        let got = c.seek_for_prev(k).unwrap();
        prop_assert_eq!(
            got,
            if le > 0 { Some(want[le - 1]) } else { None },
            "seek_for_prev {:?}",
            k
        );
        prop_assert_eq!(
            r.get("t", k).unwrap(),
            expected.get(k).map(|v| &v[..]),
            "get {:?}",
            k
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn one_batch_then_deletes_match_a_btreemap(
        puts in proptest::collection::vec((key_strategy(), value_strategy()), 0..250),
        deletes in proptest::collection::vec(any::<prop::sample::Index>(), 0..200),
        probes in proptest::collection::vec(key_strategy(), 0..30),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Tree::new();
        {
            let env = Env::open(dir.path(), small_opts()).unwrap();
            let mut w = env.begin_write().unwrap();
            w.create_tree("t").unwrap();
            for (k, v) in &puts {
                w.put("t", k, v).unwrap();
                expected.insert(k.clone(), v.clone().into());
            }
            w.commit().unwrap();
            let keys: Vec<Vec<u8>> = expected.keys().cloned().collect();
            let mut w = env.begin_write().unwrap();
            for d in &deletes {
                if keys.is_empty() { break; }
                let k = &keys[d.index(keys.len())];
                let existed = expected.remove(k).is_some();
                prop_assert_eq!(w.delete("t", k).unwrap(), existed);
            }
            w.commit().unwrap();
        }
        check_against(dir.path(), &expected, &probes)?;
    }
}
