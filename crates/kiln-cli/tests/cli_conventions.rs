//! What every command of the CLI does alike: exit codes (0 done, 1 a runtime
//! error, 2 a usage error, 3 to 7 the failure classes of docs/cli.md), a closed pipe ends a command quietly, and the offline
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
fn exit_codes_are_the_same_for_every_command() {
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
    // 2 too: a --url that is no http(s) URL.
    let o = kiln(&["query", "--url", "notaurl", "--db", "x", "from x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("notaurl"), "{}", text(&o));
    // 4: what was asked for is not there (a data directory that is none).
    let o = kiln(&["get", "--data-dir", d, "nodb", "x"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    // 3: no server to talk to.
    let o = kiln(&[
        "query",
        "--url",
        "http://127.0.0.1:1",
        "--db",
        "x",
        "from x",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    // ... nor one whose host does not resolve (`.invalid` never does, RFC 2606).
    let o = kiln(&[
        "export",
        "--url",
        "http://no-such-host.invalid:8080",
        "--db",
        "x",
        "--out",
        "-",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let o = kiln(&["api-key", "list", "--data-dir", &format!("{d}/missing")]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("not a data directory"), "{}", text(&o));
    // 1, and the file is named.
    let o = kiln(&["backup", "verify", &format!("{d}/missing.kbak")]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing.kbak"), "{err}");
}

/// A command that only reads a data directory (get, list, an offline backup)
/// on one that does not exist says so and creates nothing (no directory, no
/// `databases/`, no lock file).
#[test]
fn get_and_list_create_no_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("kiln-dta");
    let t = typo.to_str().unwrap();
    let out = dir.path().join("b.kbak");
    let out = out.to_str().unwrap();
    for args in [
        vec!["get", "--data-dir", t, "db", "x"],
        vec!["list", "--data-dir", t, "db"],
        vec!["backup", "--data-dir", t, "--db", "db", "--out", out, "-q"],
        vec!["backup", "chain-stop", "--data-dir", t, "--db", "db"],
    ] {
        let o = kiln(&args);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("does not exist") && err.contains("kiln-dta"),
            "{err}"
        );
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }
    // An existing directory that is no data directory: nothing made in it.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = kiln(&["get", "--data-dir", empty.to_str().unwrap(), "db", "x"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
}

/// A server on `127.0.0.1` that answers every request with `status` and `body`
/// (JSON), `n` times: its port.
fn answering(status: u16, body: &'static str, n: usize) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for _ in 0..n {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => seen.extend_from_slice(&buf[..k]),
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// Failure classes have their own exit codes (docs/cli.md, "Exit codes"), and
/// every command prints the server's error alike: `error: the server answered
/// 404 database_not_found: ...`.
#[test]
fn exit_codes_tell_failure_classes_apart() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = common::spawn_serve(dir.path(), port);
    let url = format!("http://127.0.0.1:{port}");
    let u = url.as_str();

    // 4 and one format for a missing database, whatever the command.
    let missing: [Vec<&str>; 4] = [
        vec!["query", "--url", u, "--db", "nodb", "from x"],
        vec!["export", "--url", u, "--db", "nodb", "--out", "-", "-q"],
        vec!["subscriptions", "list", "--url", u, "--db", "nodb"],
        vec!["revisions", "list", "--url", u, "--db", "nodb", "x"],
    ];
    for args in &missing {
        let o = kiln(args);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("the server answered 404 database_not_found: "),
            "{args:?}: {err}"
        );
        assert!(!err.contains("{\""), "{args:?}: raw JSON in {err}");
    }
    assert_eq!(
        common::request(port, "PUT", "/dbs/shop", "").0,
        201,
        "the database"
    );
    // 5: the server refuses the request (a query that does not parse).
    let o = kiln(&["query", "--url", u, "--db", "shop", "from where ((("]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    // A query's pages: the table says how to get the next, and --continuation does.
    for n in 1..=3 {
        let (status, put) = common::request(
            port,
            "PUT",
            &format!("/dbs/shop/docs/p/{n}"),
            &format!(r#"{{"n": {n}}}"#),
        );
        assert_eq!(status, 201, "{put}");
    }
    let query = "from p order by n limit 2";
    let o = kiln(&["query", "--url", u, "--db", "shop", query]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let token = err
        .split("--continuation ")
        .nth(1)
        .unwrap_or_else(|| panic!("no continuation said: {}", text(&o)))
        .trim();
    let o = kiln(&[
        "query",
        "--url",
        u,
        "--db",
        "shop",
        "--json",
        "--continuation",
        token,
        query,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let page: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ns: Vec<&serde_json::Value> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["n"])
        .collect();
    assert_eq!(ns, [&serde_json::json!(3)], "{page}");
    assert!(page["continuation"].is_null(), "{page}");
    // 6: a conflict (an If-Match that does not hold).
    let (status, put) = common::request(port, "PUT", "/dbs/shop/docs/d", "{}");
    assert_eq!(status, 201, "{put}");
    let etag: serde_json::Value = serde_json::from_str(&put).unwrap();
    let etag = etag["etag"].as_str().unwrap();
    let (seq, incarnation) = etag.split_once('-').unwrap();
    let stale = format!("{}-{incarnation}", seq.parse::<u64>().unwrap() + 100);
    let file = dir.path().join("a.txt");
    std::fs::write(&file, b"bytes").unwrap();
    let o = kiln(&[
        "attachments",
        "put",
        "--url",
        u,
        "--db",
        "shop",
        "--if-match",
        &stale,
        "d",
        "a.txt",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
    server.kill().unwrap();
    let _ = server.wait();

    // 7: the server failed (501 included).
    let port = answering(
        501,
        r#"{"error":"not_supported_in_cluster","message":"no","request_id":"r-1"}"#,
        1,
    );
    let u = format!("http://127.0.0.1:{port}");
    let o = kiln(&["query", "--url", &u, "--db", "shop", "from x"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("501 not_supported_in_cluster: no (request id r-1)"),
        "{}",
        text(&o)
    );
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
    let o = kiln(&[
        "api-key",
        "create",
        "--data-dir",
        d,
        "--name",
        "ci",
        "--operator",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let listed = stdout(&kiln(&["api-key", "list", "--data-dir", d]));
    // RFC 3339, e.g. 2026-11-26T22:15:26.123Z, not epoch milliseconds.
    let created = listed.split("created ").nth(1).unwrap().trim();
    assert!(
        created.len() == 24 && created.ends_with('Z') && created.as_bytes()[10] == b'T',
        "{listed}"
    );
}
