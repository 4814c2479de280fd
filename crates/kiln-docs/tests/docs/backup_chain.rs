//! Incremental backups and point-in-time restore.
//!
//! - While 16 writers commit acknowledged puts, overwrites, deletes and
//!   multi-document batches, a full backup and increments are taken; every restore
//!   (each backup point, and points chosen by etag, transaction and time) is EXACTLY
//!   the acknowledged history up to the point it reports (ids, bodies, etags), and
//!   never splits a batch.
//! - Chains with a gap, the wrong base, the wrong order, another database, or a
//!   damaged, truncated or reordered file are refused with the input named, and
//!   leave no database behind.
//! - Increments are refused when they cannot be complete (no chain, another chain,
//!   a trimmed base).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::BackupChainError;
use kiln_docs::{
    BatchOp, BatchOutcome, Condition, Database, DocError, DocId, DocStore, DocsOptions,
    RestorePoint, RestoreReport, RestoreSource,
};
use kiln_storage::BackupOptions;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o
}

#[derive(Debug, Clone)]
enum Op {
    Put {
        id: String,
        body: Value,
        etag: String,
    },
    Delete {
        id: String,
    },
}

/// id -> (etag, body without `@metadata`)
type State = BTreeMap<String, (String, Value)>;

fn fold(history: &[(u64, Op)], upto: u64) -> State {
    let mut s = State::new();
    for (seq, op) in history {
        if *seq > upto {
            break;
        }
        match op {
            Op::Put { id, body, etag } => {
                s.insert(id.clone(), (etag.clone(), body.clone()));
            }
            Op::Delete { id } => {
                s.remove(id);
            }
        }
    }
    s
}

fn state_of(db: &Database) -> State {
    let mut s = State::new();
    let mut after: Option<String> = None;
    loop {
        let page = db.list_by_prefix("", after.as_deref(), 1000).unwrap();
        for d in &page.items {
            let mut v = d.to_value().unwrap();
            v.as_object_mut().unwrap().remove("@metadata");
            s.insert(d.id.clone(), (d.etag.to_string(), v));
        }
        match page.next {
            Some(n) => after = Some(n),
            None => return s,
        }
    }
}

fn full(db: &Database, chain: bool) -> Vec<u8> {
    let mut out = Vec::new();
    db.backup_full_to(&mut out, BackupOptions::default(), chain, |_| {})
        .unwrap();
    out
}

fn inc(db: &Database, since: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let m = kiln_docs::read_manifest(since).unwrap();
    db.backup_incremental_to(&mut out, &m, BackupOptions::default(), |_| {})
        .unwrap();
    out
}

fn source(files: &[&Vec<u8>]) -> RestoreSource<'static> {
    RestoreSource::Files(
        files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                (
                    format!("file{}", i + 1),
                    Box::new(std::io::Cursor::new((*f).clone())) as Box<dyn std::io::Read>,
                )
            })
            .collect(),
    )
}

/// Restores into a fresh data directory and returns what the database holds.
fn restore(
    files: &[&Vec<u8>],
    point: RestorePoint,
) -> Result<(RestoreReport, State, u64), Box<DocError>> {
    let dir = tempfile::tempdir().unwrap();
    let report = kiln_docs::restore_database(
        source(files),
        dir.path(),
        "copy",
        options().storage,
        false,
        point,
        |_| {},
    )
    .map_err(Box::new)?;
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.database("copy").unwrap();
    let state = state_of(&db);
    let count = db.document_count().unwrap();
    assert!(
        db.backup_chain().unwrap().is_none(),
        "a restored database has no chain"
    );
    drop(db);
    store.close().unwrap();
    Ok((report, state, count))
}

fn seq_of(etag: &str) -> u64 {
    etag.split('-').next().unwrap().parse().unwrap()
}

#[test]
fn sixteen_writers_every_restore_point_is_a_prefix_of_the_acknowledged_history() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("src").unwrap();
    let history: Arc<Mutex<Vec<(u64, Op)>>> = Arc::default();
    // (first, last) sequence of each acknowledged multi-document batch.
    let batches: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..16u64)
        .map(|t| {
            let (db, history, batches, stop) =
                (db.clone(), history.clone(), batches.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    // Ids are shared between writers: overwrites and deletes race.
                    let id = format!("d{}", rng.gen_range(0..120));
                    let roll = rng.gen_range(0..100);
                    let body = json!({"w": t, "n": n, "pad": "x".repeat(rng.gen_range(0..200))});
                    // Some documents are written once only: a write a restore
                    // lost could not hide behind a later overwrite.
                    let id = if roll < 15 { format!("u{t}-{n}") } else { id };
                    if roll < 55 {
                        let p = db
                            .put(&id, body.to_string().as_bytes(), Condition::None)
                            .unwrap();
                        let e = p.etag.to_string();
                        history
                            .lock()
                            .unwrap()
                            .push((p.etag.sequence, Op::Put { id, body, etag: e }));
                    } else if roll < 85 {
                        if let Ok(d) = db.delete(&id, Condition::None) {
                            history
                                .lock()
                                .unwrap()
                                .push((d.tombstone_etag.sequence, Op::Delete { id }));
                        }
                    } else {
                        let ids: Vec<String> = (0..3)
                            .map(|_| format!("d{}", rng.gen_range(0..120)))
                            .collect();
                        let ops = ids
                            .iter()
                            .enumerate()
                            .map(|(i, id)| BatchOp::Put {
                                id: DocId::Given(id.clone()),
                                document: json!({"w": t, "n": n, "i": i}),
                                condition: Condition::None,
                            })
                            .collect();
                        let out = db.batch(ops).unwrap();
                        let mut h = history.lock().unwrap();
                        let mut seqs = Vec::new();
                        for (i, o) in out.into_iter().enumerate() {
                            let BatchOutcome::Put(p) = o else { panic!() };
                            seqs.push(p.etag.sequence);
                            h.push((
                                p.etag.sequence,
                                Op::Put {
                                    id: p.id,
                                    body: json!({"w": t, "n": n, "i": i}),
                                    etag: p.etag.to_string(),
                                },
                            ));
                        }
                        batches
                            .lock()
                            .unwrap()
                            .push((*seqs.iter().min().unwrap(), *seqs.iter().max().unwrap()));
                    }
                }
            })
        })
        .collect();
    let pause = || std::thread::sleep(Duration::from_millis(120));
    pause();
    let f = full(&db, true);
    let mut files = vec![f];
    for _ in 0..4 {
        pause();
        let i = inc(&db, files.last().unwrap());
        files.push(i);
    }
    pause();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let stats = db.backup_chain().unwrap().expect("chain active");
    assert!(stats.history_entries > 0);
    let live = state_of(&db);
    let mut history = history.lock().unwrap().clone();
    history.sort_by_key(|h| h.0);
    let batches = batches.lock().unwrap().clone();
    let last_seq = history.last().unwrap().0;
    assert_eq!(fold(&history, u64::MAX), live, "the test's own bookkeeping");
    let ends: Vec<u64> = files
        .iter()
        .map(|f| seq_of(&kiln_docs::read_manifest(&f[..]).unwrap().etag.unwrap()))
        .collect();
    assert!(
        ends.windows(2).all(|w| w[0] < w[1]),
        "writes between backups: {ends:?}"
    );
    assert!(
        *ends.last().unwrap() < last_seq,
        "writes after the last increment"
    );
    eprintln!(
        "16 writers: {} acknowledged writes ({} batches), backups end at {ends:?}, last {last_seq}, \
         history {} entries",
        history.len(),
        batches.len(),
        stats.history_entries
    );
    let no_split = |reached: u64| {
        for (a, b) in &batches {
            assert!(
                !(*a <= reached && reached < *b),
                "restore at {reached} splits the batch {a}..={b}"
            );
        }
    };
    let t0 = std::time::Instant::now();
    let check = |files: &[&Vec<u8>], point: RestorePoint| -> (u64, RestoreReport) {
        let (report, state, count) = restore(files, point.clone()).unwrap();
        let reached = seq_of(report.reached.etag.as_deref().unwrap());
        let want = fold(&history, reached);
        assert_eq!(state.len(), want.len(), "{point:?}: documents at {reached}");
        assert_eq!(state, want, "{point:?}: restored state at {reached}");
        assert_eq!(count, want.len() as u64);
        no_split(reached);
        (reached, report)
    };
    // Each backup point: the full backup and 1..4 increments.
    let all: Vec<&Vec<u8>> = files.iter().collect();
    for k in 1..=all.len() {
        let (reached, report) = check(&all[..k], RestorePoint::Latest);
        assert_eq!(
            reached,
            ends[k - 1],
            "restore of {k} files ends at the last one's etag"
        );
        assert_eq!(report.backups.len(), k);
    }
    // Points inside the increments: by etag, then by the txn and time it reports.
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let inside: Vec<u64> = history
        .iter()
        .map(|h| h.0)
        .filter(|s| *s > ends[0] && *s <= ends[4])
        .collect();
    for _ in 0..5 {
        let target = inside[rng.gen_range(0..inside.len())];
        let etag = db.etag_at(target).to_string();
        let (reached, report) = check(&all, RestorePoint::Etag(etag.clone()));
        assert!(
            reached >= target,
            "etag {etag} restored only up to {reached}"
        );
        // Nothing past the transaction of the target: the writes in (target, reached]
        // were committed with it (same source transaction).
        let (r2, _) = check(&all, RestorePoint::Txn(report.reached.txn));
        assert_eq!(
            r2, reached,
            "txn {} restores the same point",
            report.reached.txn
        );
        let at = report.reached.at_ms.unwrap();
        let (r3, _) = check(&all, RestorePoint::TimeMs(at));
        assert!(
            r3 >= reached,
            "time {at} restores at least up to {reached}, got {r3}"
        );
    }
    eprintln!("20 restores checked in {:?}", t0.elapsed());
    drop(db);
    store.close().unwrap();
}

/// A source database with a chain: full, then increments with writes between.
struct Chain {
    _dir: tempfile::TempDir,
    store: Option<DocStore>,
    db: Option<Arc<Database>>,
    files: Vec<Vec<u8>>,
}

fn writes(db: &Database, from: usize, n: usize) {
    for i in from..from + n {
        db.put(
            &format!("k{}", i % 7),
            json!({"i": i}).to_string().as_bytes(),
            Condition::None,
        )
        .unwrap();
        if i % 3 == 0 {
            let _ = db.delete(&format!("k{}", (i + 1) % 7), Condition::None);
        }
    }
}

fn chain(increments: usize) -> Chain {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("src").unwrap();
    writes(&db, 0, 10);
    let mut files = vec![full(&db, true)];
    for k in 0..increments {
        writes(&db, 10 * (k + 1), 10);
        let i = inc(&db, files.last().unwrap());
        files.push(i);
    }
    Chain {
        _dir: dir,
        store: Some(store),
        db: Some(db),
        files,
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        self.db.take();
        if let Some(s) = self.store.take() {
            let _ = s.close();
        }
    }
}

fn refused(files: &[&Vec<u8>]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let err = kiln_docs::restore_database(
        source(files),
        dir.path(),
        "copy",
        options().storage,
        false,
        RestorePoint::Latest,
        |_| {},
    )
    .expect_err("the restore must be refused");
    // Nothing that looks like a database is left.
    assert!(!dir.path().join("databases/copy").exists());
    let trash: Vec<_> = std::fs::read_dir(dir.path().join("trash"))
        .unwrap()
        .collect();
    assert!(trash.is_empty(), "staging left behind: {trash:?}");
    // verify says the same.
    let v = kiln_docs::verify_chain(source(files), |_| {}).expect_err("verify must refuse too");
    assert_eq!(v.to_string(), err.to_string());
    err.to_string()
}

#[test]
fn chains_with_gaps_wrong_bases_or_order_are_refused_with_the_input_named() {
    let c = chain(3);
    let [f, i1, i2, i3] = [&c.files[0], &c.files[1], &c.files[2], &c.files[3]];
    let e = refused(&[f, i2]);
    assert!(
        e.contains("input 2 (file2)") && e.contains("gap") && e.contains("offset 28"),
        "{e}"
    );
    let e = refused(&[f, i1, i3, i2]);
    assert!(e.contains("input 3 (file3)") && e.contains("gap"), "{e}");
    let e = refused(&[f, i1, i2, i1]);
    assert!(
        e.contains("input 4 (file4)") && e.contains("out of order"),
        "{e}"
    );
    let e = refused(&[i1, i2]);
    assert!(
        e.contains("input 1 (file1)") && e.contains("starts with a full"),
        "{e}"
    );
    let e = refused(&[f, i1, f]);
    assert!(
        e.contains("input 3") && e.contains("a full backup after"),
        "{e}"
    );
    // Two increments from the same base with no write between: the same etags,
    // different backup ids; an increment of one cannot follow the other.
    let db = c.db.as_ref().unwrap();
    let a = inc(db, i3);
    let b = inc(db, i3);
    writes(db, 100, 5);
    let after_a = inc(db, &a);
    let e = refused(&[f, i1, i2, i3, &b, &after_a]);
    assert!(e.contains("input 6") && e.contains("wrong base"), "{e}");
    // ... while the right one is accepted.
    restore(&[f, i1, i2, i3, &a, &after_a], RestorePoint::Latest).unwrap();
    // Another database's increment, another chain's increment.
    let other = chain(1);
    let e = refused(&[f, &other.files[1]]);
    assert!(
        e.contains("input 2") && e.contains("another database"),
        "{e}"
    );
    let f2 = full(db, true);
    writes(db, 200, 3);
    let j = inc(db, &f2);
    let e = refused(&[f, &j]);
    assert!(e.contains("input 2") && e.contains("chain"), "{e}");
    // A full backup without a chain takes no increment.
    let plain = full(db, false);
    let e = refused(&[&plain, &j]);
    assert!(e.contains("input 2"), "{e}");
}

/// Frames of a backup file: (offset, length) of each, after the header.
fn frames(file: &[u8]) -> Vec<(usize, usize)> {
    let meta_len = u32::from_le_bytes(file[24..28].try_into().unwrap()) as usize;
    let mut at = 28 + meta_len + 4;
    let mut out = Vec::new();
    while at < file.len() {
        let stored = u32::from_le_bytes(file[at + 12..at + 16].try_into().unwrap()) as usize;
        out.push((at, 24 + stored));
        at += 24 + stored;
    }
    out
}

#[test]
fn damaged_truncated_or_reordered_increments_are_refused_with_part_and_offset() {
    let c = chain(2);
    let [f, i1, i2] = [&c.files[0], &c.files[1], &c.files[2]];
    let fr = frames(i1);
    assert!(fr.len() >= 4, "tree, data, end, trailer: {fr:?}");
    // A bit flipped in the history's data frame.
    let mut bad = i1.clone();
    let data = fr[1];
    bad[data.0 + 24 + data.1 / 3] ^= 0x10;
    let e = refused(&[f, &bad, i2]);
    assert!(
        e.contains("input 2 (file2)") && e.contains("frame 1") && e.contains("offset"),
        "{e}"
    );
    // Truncated.
    let cut = i2[..i2.len() - 7].to_vec();
    let e = refused(&[f, i1, &cut]);
    assert!(
        e.contains("input 3 (file3)") && e.contains("truncated"),
        "{e}"
    );
    // Frames swapped (tree and data).
    let mut swapped = i1[..fr[0].0].to_vec();
    swapped.extend_from_slice(&i1[fr[1].0..fr[1].0 + fr[1].1]);
    swapped.extend_from_slice(&i1[fr[0].0..fr[0].0 + fr[0].1]);
    swapped.extend_from_slice(&i1[fr[2].0..]);
    let e = refused(&[f, &swapped, i2]);
    assert!(e.contains("input 2") && e.contains("reordered"), "{e}");
    // The manifest itself damaged.
    let mut bad = i2.clone();
    bad[40] ^= 1;
    let e = refused(&[f, i1, &bad]);
    assert!(e.contains("input 3") && e.contains("header"), "{e}");
    // A well-formed container whose history lacks one write (as a faulty writer
    // would make it): every checksum passes, the entries' links do not.
    let mut entries = Vec::new();
    let sum = kiln_storage::backup::read_container(
        &i1[..],
        false,
        |_| {},
        |_, item| {
            if let kiln_storage::backup::Item::Entry(k, v) = item {
                entries.push((k.to_vec(), v.to_vec()));
            }
            Ok(())
        },
    )
    .unwrap();
    assert!(entries.len() > 3);
    let rewrite = |skip: usize| {
        let mut out = Vec::new();
        let mut w = kiln_storage::ContainerWriter::new(
            &mut out,
            sum.txn_id,
            &sum.meta,
            BackupOptions::default(),
            |_| {},
        )
        .unwrap();
        w.begin_tree("backup_history").unwrap();
        for (i, (k, v)) in entries.iter().enumerate() {
            if i != skip {
                w.entry(k, v).unwrap();
            }
        }
        w.end_tree().unwrap();
        w.finish().unwrap();
        out
    };
    let e = refused(&[f, &rewrite(2), i2]);
    assert!(
        e.contains("input 2 (file2), frame") && e.contains("a write is missing"),
        "{e}"
    );
    // Without its last write (nothing follows to notice the hole but the end).
    let e = refused(&[f, &rewrite(entries.len() - 1), i2]);
    assert!(
        e.contains("input 2 (file2), its end") && e.contains("manifest says"),
        "{e}"
    );
    // Each one alone still verifies.
    for file in [f, i1, i2] {
        kiln_docs::verify_backup(&file[..], |_| {}).unwrap();
    }
}

#[test]
fn increments_that_cannot_be_complete_are_refused() {
    let c = chain(2);
    let db = c.db.as_ref().unwrap();
    let [f, i1, i2] = [&c.files[0], &c.files[1], &c.files[2]];
    // i2 was taken since i1: the history at or below i1 is gone, so an increment
    // since the full backup would miss writes.
    let m = kiln_docs::read_manifest(&f[..]).unwrap();
    let err = db
        .backup_incremental_to(Vec::new(), &m, BackupOptions::default(), |_| {})
        .unwrap_err();
    assert!(
        matches!(
            err,
            DocError::BackupChain(BackupChainError::IncrementNotPossible(_))
        ),
        "{err}"
    );
    assert!(err.to_string().contains("trimmed"), "{err}");
    // Since i1 it can still be taken again (a lost file).
    let again = inc(db, i1);
    restore(&[f, i1, &again], RestorePoint::Latest).unwrap();
    let _ = i2;
    // After chain-stop: refused, and the history is gone.
    assert!(db.backup_chain().unwrap().is_some());
    assert!(db.stop_backup_chain().unwrap());
    assert!(db.backup_chain().unwrap().is_none());
    writes(db, 500, 3);
    let m = kiln_docs::read_manifest(&again[..]).unwrap();
    let err = db
        .backup_incremental_to(Vec::new(), &m, BackupOptions::default(), |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("no backup chain"), "{err}");
    // Without a chain the writes leave no history.
    let plain = full(db, false);
    writes(db, 600, 3);
    assert!(db.backup_chain().unwrap().is_none());
    let m = kiln_docs::read_manifest(&plain[..]).unwrap();
    let err = db
        .backup_incremental_to(Vec::new(), &m, BackupOptions::default(), |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("not part of a chain"), "{err}");
}

#[test]
fn restore_points_outside_the_chain_are_refused() {
    let c = chain(2);
    let db = c.db.as_ref().unwrap();
    let [f, i1, i2] = [&c.files[0], &c.files[1], &c.files[2]];
    let fm = kiln_docs::read_manifest(&f[..]).unwrap();
    let full_seq = seq_of(fm.etag.as_deref().unwrap());
    let before = db.etag_at(full_seq - 1).to_string();
    let e = restore(&[f, i1, i2], RestorePoint::Etag(before)).unwrap_err();
    assert!(
        matches!(*e, DocError::BackupChain(BackupChainError::RestorePoint(_))),
        "{e}"
    );
    let i1_end = kiln_docs::read_manifest(&i1[..]).unwrap().etag.unwrap();
    let after = db.etag_at(seq_of(&i1_end) + 1).to_string();
    let e = restore(&[f, i1], RestorePoint::Etag(after.clone())).unwrap_err();
    assert!(e.to_string().contains("after the last backup"), "{e}");
    // The full backup's own point and an increment's end are exact.
    let (r, _, _) = restore(&[f, i1, i2], RestorePoint::Etag(fm.etag.clone().unwrap())).unwrap();
    assert_eq!(r.reached.etag, fm.etag);
    assert_eq!(r.writes_replayed, 0);
    let (r, _, _) = restore(&[f, i1, i2], RestorePoint::Etag(i1_end.clone())).unwrap();
    assert_eq!(r.reached.etag.as_deref(), Some(i1_end.as_str()));
    assert!(r.writes_skipped > 0);
    let e = restore(&[f, i1], RestorePoint::Txn(fm.txn_id - 1)).unwrap_err();
    assert!(e.to_string().contains("before the full backup"), "{e}");
    assert!(RestorePoint::parse("time:2026-01-02T03:04:05Z").is_ok());
    assert!(RestorePoint::parse("txn:12").is_ok());
    assert!(RestorePoint::parse("bogus").is_err());
}

/// A restore with increments leaves indexes and collection counts right: the replay
/// writes the change log, from which the indexer catches up, and the counts.
#[test]
fn indexes_and_collection_counts_are_right_after_replayed_increments() {
    use kiln_docs::{IndexDefinition, IndexField, QueryOptions};
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("src").unwrap();
    db.define_index(IndexDefinition {
        name: "by-n".into(),
        collection: Some("items".into()),
        fields: vec![IndexField {
            path: "n".into(),
            case_insensitive: false,
            ..Default::default()
        }],
        auto: false,
        reduce: None,
    })
    .unwrap();
    let put = |id: String, n: i64| {
        db.put(
            &id,
            json!({ "n": n }).to_string().as_bytes(),
            Condition::None,
        )
        .unwrap();
    };
    for i in 0..50 {
        put(format!("items/{i}"), i % 10);
    }
    let f = full(&db, true);
    for i in 0..30 {
        put(format!("items/{i}"), 100 + i);
    }
    for i in 40..45 {
        db.delete(&format!("items/{i}"), Condition::None).unwrap();
    }
    put("others/x".into(), 1);
    let i1 = inc(&db, &f);
    for i in 50..60 {
        put(format!("items/{i}"), 5);
    }
    db.delete("others/x", Condition::None).unwrap();
    let i2 = inc(&db, &i1);
    drop(db);
    store.close().unwrap();
    for files in [vec![&f, &i1], vec![&f, &i1, &i2]] {
        let out = tempfile::tempdir().unwrap();
        kiln_docs::restore_database(
            source(&files),
            out.path(),
            "copy",
            options().storage,
            false,
            RestorePoint::Latest,
            |_| {},
        )
        .unwrap();
        let store = DocStore::open(out.path(), options()).unwrap();
        let db = store.database("copy").unwrap();
        let state = state_of(&db);
        let mut want: Vec<(String, i64)> = state
            .iter()
            .filter(|(id, _)| id.starts_with("items/"))
            .map(|(id, (_, v))| (id.clone(), v["n"].as_i64().unwrap()))
            .collect();
        want.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        let r = db
            .query(
                "from index 'by-n' order by n limit 1000",
                &serde_json::Map::new(),
                QueryOptions {
                    wait_for_non_stale_ms: 10_000,
                },
            )
            .unwrap();
        assert!(!r.stale);
        let mut got: Vec<(String, i64)> = r
            .results
            .iter()
            .map(|d| {
                let v: Value = serde_json::from_slice(d).unwrap();
                (
                    v["@metadata"]["@id"].as_str().unwrap().to_string(),
                    v["n"].as_i64().unwrap(),
                )
            })
            .collect();
        // In the index's order (a stale entry would put a document where its old
        // value was), then as a set.
        assert!(
            got.windows(2).all(|w| w[0].1 <= w[1].1),
            "{} files: index order {got:?}",
            files.len()
        );
        got.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        assert_eq!(got, want, "{} files", files.len());
        let counts: BTreeMap<String, u64> = db
            .collections()
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.documents))
            .collect();
        let mut want_counts = BTreeMap::new();
        for id in state.keys() {
            *want_counts
                .entry(id.split('/').next().unwrap().to_string())
                .or_insert(0u64) += 1;
        }
        assert_eq!(counts, want_counts, "{} files", files.len());
        // The index's entries tree comes back counted (a range's total in O(log n)),
        // and a range's total agrees with its documents.
        let r = db.env().begin_read().unwrap();
        let entries: Vec<String> = r
            .tree_names()
            .unwrap()
            .into_iter()
            .filter(|t| t.starts_with("ix.") && t.ends_with(".e"))
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert!(r.tree_is_counted(&entries[0]).unwrap(), "{}", entries[0]);
        drop(r);
        let total = db
            .query(
                "from index 'by-n' where n >= 5 limit 1",
                &serde_json::Map::new(),
                QueryOptions::default(),
            )
            .unwrap()
            .total;
        assert_eq!(
            total,
            want.iter().filter(|(_, n)| *n >= 5).count() as u64,
            "{} files",
            files.len()
        );
        drop(db);
        store.close().unwrap();
    }
}
