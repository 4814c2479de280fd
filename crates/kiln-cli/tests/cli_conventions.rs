//! What every command of the CLI does alike: exit codes (0 done, 1 a runtime
//! error, 2 a usage error), a closed pipe ends a command quietly, and the offline
//! document commands read documents from stdin or a file and page with
//! --start-after; check and stats name the database they speak of.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::{kiln, text};
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn kiln_with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn exit_codes_are_zero_one_two_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // 2: clap's usage errors and the CLI's own (a choice left out).
    assert_eq!(kiln(&["put", "--no-such-flag"]).status.code(), Some(2));
    let backup = dir.path().join("some.kbk");
    std::fs::write(&backup, b"not checked before the usage").unwrap();
    let o = kiln(&["restore", "--db", "x", backup.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = kiln(&["serve", "--bind", "nohostport"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // 1: the world says no (a missing database, an unreachable server).
    let o = kiln(&["get", "--data-dir", d, "nodb", "x"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = kiln(&[
        "query",
        "--url",
        "http://127.0.0.1:1",
        "--db",
        "x",
        "from x",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = kiln(&["api-key", "list", "--data-dir", &format!("{d}/missing")]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("not a data directory"), "{}", text(&o));
}

#[test]
fn put_reads_stdin_and_files_and_list_pages_with_start_after() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = kiln_with_stdin(&["put", "--data-dir", d, "db", "a/1", "-"], br#"{"n":1}"#);
    assert!(o.status.success(), "{}", text(&o));
    let file = dir.path().join("doc.json");
    std::fs::write(&file, br#"{"n":2}"#).unwrap();
    let at_file = format!("@{}", file.display());
    let o = kiln(&["put", "--data-dir", d, "db", "a/2", &at_file]);
    assert!(o.status.success(), "{}", text(&o));
    let o = kiln(&["put", "--data-dir", d, "db", "a/3", r#"{"n":3}"#]);
    assert!(o.status.success(), "{}", text(&o));
    let o = kiln(&["put", "--data-dir", d, "db", "a/4", "@/no/such/file"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let o = kiln(&["get", "--data-dir", d, "db", "a/1"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["n"], 1);
    let o = kiln(&["get", "--data-dir", d, "db", "a/2"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["n"], 2);

    let o = kiln(&["list", "--data-dir", d, "db", "--limit", "2"]);
    assert_eq!(stdout(&o).lines().count(), 2, "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--start-after"),
        "{}",
        text(&o)
    );
    let o = kiln(&["list", "--data-dir", d, "db", "--start-after", "a/2"]);
    let ns: Vec<i64> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ns, vec![3], "{}", text(&o));
}

#[test]
fn a_closed_pipe_ends_a_command_quietly_and_check_and_stats_name_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for i in 0..300 {
        // One put per process is slow; a few suffice with a large document.
        if i % 100 == 0 {
            let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(100_000));
            let o = kiln(&["put", "--data-dir", d, "shop", &format!("d/{i}"), &big]);
            assert!(o.status.success(), "{}", text(&o));
        }
    }
    // `kiln list | head -c 10`: the reader goes away after a few bytes.
    for args in [
        vec!["list", "--data-dir", d, "shop"],
        vec!["stats", d],
        vec!["check", "--json", d],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut first = [0u8; 1];
        use std::io::Read;
        let _ = out.read(&mut first);
        drop(out);
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_ne!(o.status.code(), Some(101), "{args:?}: {err}");
    }

    let o = kiln(&["check", "--json", d]);
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(report["database"], "shop", "{report}");
    assert_eq!(report["clean"], true, "{report}");

    let o = kiln(&["stats", "--json", d]);
    assert!(o.status.success(), "{}", text(&o));
    let stats: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(stats["database"], "shop", "{stats}");
    assert!(
        stats["last_txn_id"].as_u64().unwrap() >= 3,
        "the database's history is counted: {stats}"
    );
}

#[test]
fn api_key_list_prints_dates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = kiln(&["api-key", "create", "--data-dir", d, "--name", "ci"]);
    assert!(o.status.success(), "{}", text(&o));
    let listed = stdout(&kiln(&["api-key", "list", "--data-dir", d]));
    // RFC 3339, e.g. 2026-11-26T22:15:26.123Z, not epoch milliseconds.
    let created = listed.split("created ").nth(1).unwrap().trim();
    assert!(
        created.len() == 24 && created.ends_with('Z') && created.as_bytes()[10] == b'T',
        "{listed}"
    );
}
