//! kill -9 during backups and restores leaves no damage:
//! - `kiln backup --incremental-since` killed at a random moment leaves no backup
//!   file (a `.partial` that verify refuses), and the increment can be taken again;
//! - `kiln serve` killed during an incremental backup: after a restart the chain
//!   goes on (its history is written with the documents, so it is as durable as
//!   they are) and the increment can be taken;
//! - `kiln restore` (offline) killed at a random moment leaves either no database
//!   or the complete one, the data directory opens, and a re-run restores;
//! - `kiln serve` killed while it restores a chain sent by `kiln restore --url`:
//!   the same, after a restart.
//!
//! Every restore that completes equals, document for document (id, etag, body),
//! the source database after its last increment.
//!
//! Slow (~1 min in release): `cargo test --release -p kiln-cli --test
//! backup_survives_kill9 -- --ignored --nocapture` (`KILN_BACKUP_KILL_CYCLES`, default 5).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::{free_port, request, spawn_serve};
use kiln_docs::{BatchOp, Condition, DocId, DocStore, DocsOptions};
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DOCS: usize = 40_000;

fn body(i: usize, round: usize) -> serde_json::Value {
    json!({"i": i, "round": round, "text": format!("{:0>900}", i * 7919 + round)})
}

/// Puts (and some deletes) through the server, 1000 per batch.
fn write_round(port: u16, round: usize, n: usize) {
    for start in (0..n).step_by(1000) {
        let ops: Vec<_> = (start..(start + 1000).min(n))
            .map(|k| {
                let i = (k * 7 + round * 13) % (DOCS + 10_000);
                if k % 10 == 3 {
                    json!({"op": "delete", "id": format!("d/{i}")})
                } else {
                    json!({"op": "put", "id": format!("d/{i}"), "document": body(i, round)})
                }
            })
            .collect();
        // A delete of a missing document fails the whole batch: retry with puts only.
        let (s, b) = request(
            port,
            "POST",
            "/dbs/shop/batch",
            &json!({ "ops": ops }).to_string(),
        );
        if s != 200 {
            let puts: Vec<_> = ops.into_iter().filter(|o| o["op"] == "put").collect();
            let (s2, b2) = request(
                port,
                "POST",
                "/dbs/shop/batch",
                &json!({ "ops": puts }).to_string(),
            );
            assert_eq!(s2, 200, "{b} / {b2}");
        }
    }
}

fn kiln(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn run_ok(args: &[&str]) -> Duration {
    let t = Instant::now();
    let out = kiln(args).output().unwrap();
    assert!(
        out.status.success(),
        "kiln {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

/// Runs `child` and SIGKILLs `victim` (the child itself when None) after `after`;
/// true if the child had finished successfully before.
fn kill_after(mut child: Child, victim: Option<&mut Child>, after: Duration) -> bool {
    let deadline = Instant::now() + after;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.success();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    match victim {
        Some(v) => {
            v.kill().unwrap();
            v.wait().unwrap();
            child.wait().unwrap().success()
        }
        None => {
            let _ = child.kill();
            child.wait().unwrap();
            false
        }
    }
}

type Dump = Vec<(String, String, Vec<u8>)>;

/// Every document of `db` (id, etag, JSON), opening the data directory offline.
fn dump(dir: &Path, db: &str) -> Dump {
    let store = DocStore::open(dir, DocsOptions::default()).unwrap();
    let d = store.database(db).unwrap();
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = d.list_by_prefix("", after.as_deref(), 5000).unwrap();
        for doc in &page.items {
            out.push((doc.id.clone(), doc.etag.to_string(), doc.json.clone()));
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    drop(d);
    store.close().unwrap();
    out
}

/// After a kill: no database `db`, or a complete one equal to `want`; the data
/// directory opens (and its trash is emptied).
fn no_damage(dir: &Path, db: &str, want: &Dump) -> bool {
    let exists = dir.join("databases").join(db).exists();
    if exists {
        assert!(dump(dir, db) == *want, "a partial database {db} in {dir:?}");
    } else {
        let store = DocStore::open(dir, DocsOptions::default()).unwrap();
        assert!(store.database(db).is_err());
        store.close().unwrap();
    }
    let trash: Vec<_> = std::fs::read_dir(dir.join("trash")).unwrap().collect();
    assert!(trash.is_empty(), "trash left after open: {trash:?}");
    exists
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
#[ignore = "slow (~1 min in release): cargo test --release -p kiln-cli --test backup_survives_kill9 -- --ignored"]
fn kill9_during_backups_and_restores_leaves_no_damage() {
    let cycles: usize = std::env::var("KILN_BACKUP_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    {
        let store = DocStore::open(&src, DocsOptions::default()).unwrap();
        let db = store.create_database("shop").unwrap();
        for start in (0..DOCS).step_by(2000) {
            let ops = (start..start + 2000)
                .map(|i| BatchOp::Put {
                    id: DocId::Given(format!("d/{i}")),
                    document: body(i, 0),
                    condition: Condition::None,
                })
                .collect();
            db.batch(ops).unwrap();
        }
        drop(db);
        store.close().unwrap();
    }
    let port = free_port();
    let mut server = spawn_serve(&src, port);
    let url = format!("http://127.0.0.1:{port}");
    let file = |n: &str| tmp.path().join(n);
    let (full, inc1, inc2) = (file("full.kbak"), file("inc1.kbak"), file("inc2.kbak"));
    run_ok(&[
        "backup",
        "--url",
        &url,
        "--db",
        "shop",
        "--out",
        s(&full),
        "--chain",
        "-q",
    ]);

    // 1. The backup client killed during an increment.
    write_round(port, 1, 20_000);
    let inc_args = |since: &PathBuf, out: &PathBuf| -> Vec<String> {
        [
            "backup",
            "--url",
            &url,
            "--db",
            "shop",
            "--out",
            s(out),
            "--incremental-since",
            s(since),
            "-q",
        ]
        .map(String::from)
        .to_vec()
    };
    let trial = file("trial.kbak");
    let a = inc_args(&full, &trial);
    let took = run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    std::fs::remove_file(&trial).unwrap();
    let mut killed = 0;
    for _ in 0..cycles {
        let after = took.mul_f64(rng.gen_range(0.05..1.0));
        let child = kiln(&a.iter().map(String::as_str).collect::<Vec<_>>())
            .spawn()
            .unwrap();
        if kill_after(child, None, after) {
            assert!(trial.exists());
            std::fs::remove_file(&trial).unwrap();
        } else {
            killed += 1;
            // Killed after its rename (before it exited): then the file is whole.
            if trial.exists() {
                run_ok(&["backup", "verify", s(&trial), "-q"]);
                std::fs::remove_file(&trial).unwrap();
            }
            let partial = file("trial.kbak.partial");
            if partial.exists() {
                let out = kiln(&["backup", "verify", s(&partial)]).output().unwrap();
                assert!(!out.status.success(), "a partial backup verified");
                std::fs::remove_file(&partial).unwrap();
            }
        }
    }
    let a = inc_args(&full, &inc1);
    run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    println!("backup kill -9 test: {killed}/{cycles} increments killed (client)");

    // 2. The server killed during an increment; the chain survives the restart.
    write_round(port, 2, 20_000);
    let a = inc_args(&inc1, &trial);
    let took = run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    std::fs::remove_file(&trial).unwrap();
    let mut killed = 0;
    for _ in 0..cycles {
        // Most of the client's time is the server's work: aim inside it.
        let after = took.mul_f64(rng.gen_range(0.02..0.6));
        let child = kiln(&a.iter().map(String::as_str).collect::<Vec<_>>())
            .spawn()
            .unwrap();
        if kill_after(child, Some(&mut server), after) {
            std::fs::remove_file(&trial).unwrap();
        } else {
            killed += 1;
            if trial.exists() {
                // Complete before the server died (the client renames only a
                // stream that verified to its trailer).
                run_ok(&["backup", "verify", s(&trial), "-q"]);
                std::fs::remove_file(&trial).unwrap();
            }
            assert!(
                !file("trial.kbak.partial").exists() || {
                    let out = kiln(&["backup", "verify", s(&file("trial.kbak.partial"))])
                        .output()
                        .unwrap();
                    let _ = std::fs::remove_file(file("trial.kbak.partial"));
                    !out.status.success()
                }
            );
        }
        if server.try_wait().map(|s| s.is_some()).unwrap_or(true) {
            server = spawn_serve(&src, port);
        }
    }
    let a = inc_args(&inc1, &inc2);
    run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    println!("backup kill -9 test: {killed}/{cycles} increments cut by killing the server");
    server.kill().unwrap();
    server.wait().unwrap();
    let want = dump(&src, "shop");
    assert!(want.len() > DOCS / 2);

    // 3. The offline restore killed.
    let chain = [s(&full), s(&inc1), s(&inc2)];
    let restore_args = |dir: &Path, force: bool| -> Vec<String> {
        let mut v: Vec<String> = ["restore"].into_iter().map(String::from).collect();
        v.extend(chain.iter().map(|c| c.to_string()));
        v.extend(["--data-dir", s(dir), "--db", "shop", "-q"].map(String::from));
        v.extend(
            [
                "--journal-file-size-mib",
                common::TEST_JOURNAL_FILE_SIZE_MIB,
            ]
            .map(String::from),
        );
        if force {
            v.push("--force".into());
        }
        v
    };
    let reference = file("reference");
    let a = restore_args(&reference, false);
    let took = run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        dump(&reference, "shop") == want,
        "the restore differs from the source"
    );
    let mut killed = 0;
    for c in 0..cycles {
        let dir = file(&format!("offline-{c}"));
        let a = restore_args(&dir, false);
        let after = took.mul_f64(rng.gen_range(0.05..1.0));
        let child = kiln(&a.iter().map(String::as_str).collect::<Vec<_>>())
            .spawn()
            .unwrap();
        if !kill_after(child, None, after) {
            killed += 1;
        }
        let exists = no_damage(&dir, "shop", &want);
        let a = restore_args(&dir, exists);
        run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(dump(&dir, "shop") == want);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    println!("restore kill -9 test: {killed}/{cycles} offline restores killed");

    // 4. The server killed while it restores.
    let dst = file("dst");
    let port2 = free_port();
    let url2 = format!("http://127.0.0.1:{port2}");
    let mut target = spawn_serve(&dst, port2);
    let remote = |force: bool| -> Vec<String> {
        let mut v: Vec<String> = vec!["restore".into()];
        v.extend(chain.iter().map(|c| c.to_string()));
        v.extend(["--url", &url2, "--db", "copy", "-q"].map(String::from));
        if force {
            v.push("--force".into());
        }
        v
    };
    let a = remote(false);
    let took = run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let (st, _) = request(port2, "DELETE", "/dbs/copy", "");
    assert_eq!(st, 200);
    let mut killed = 0;
    for _ in 0..cycles {
        let after = took.mul_f64(rng.gen_range(0.05..1.0));
        let child = kiln(&a.iter().map(String::as_str).collect::<Vec<_>>())
            .spawn()
            .unwrap();
        let finished = kill_after(child, Some(&mut target), after);
        if target.try_wait().map(|s| s.is_some()).unwrap_or(true) {
            killed += 1;
        } else {
            target.kill().unwrap();
            target.wait().unwrap();
        }
        let exists = no_damage(&dst, "copy", &want);
        assert!(
            exists || !finished,
            "a restore that answered success left no database"
        );
        target = spawn_serve(&dst, port2);
        let a2 = remote(exists);
        run_ok(&a2.iter().map(String::as_str).collect::<Vec<_>>());
        target.kill().unwrap();
        target.wait().unwrap();
        assert!(dump(&dst, "copy") == want);
        target = spawn_serve(&dst, port2);
        let (st, b) = request(port2, "DELETE", "/dbs/copy", "");
        assert_eq!(st, 200, "{b}");
    }
    target.kill().unwrap();
    target.wait().unwrap();
    println!("restore kill -9 test: {killed}/{cycles} server restores killed");
}
