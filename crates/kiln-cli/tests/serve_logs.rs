//! What an operator reads on `kiln serve`'s stderr: "serving" once the server is
//! really up (never when it fails to start), an access-log line per request with
//! `--access-log` (as JSON with `--log-format json`: method, path, status, bytes,
//! microseconds, request id, key id), no ANSI colour when stderr is not a
//! terminal, and a line at shutdown.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn access_log_lines_are_json_and_the_server_says_when_it_starts_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--access-log", "--log-format", "json", "--bind"])
        .arg(format!("localhost:{port}"))
        .args([
            "--journal-file-size-mib",
            common::TEST_JOURNAL_FILE_SIZE_MIB,
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a first line");
    assert!(
        first.starts_with("kiln serving") && first.contains(&format!("http://127.0.0.1:{port}")),
        "{first}"
    );
    while !common::healthy(port) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let exchange = |req: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let made = exchange(
        "PUT /dbs/logs HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
    );
    assert!(made.starts_with("HTTP/1.1 201"), "{made}");
    let put = exchange(
        "PUT /dbs/logs/docs/a HTTP/1.1\r\nhost: x\r\nx-request-id: req-7\r\nconnection: close\r\ncontent-length: 7\r\n\r\n{\"n\":1}",
    );
    assert!(put.starts_with("HTTP/1.1 201"), "{put}");

    // SIGTERM: a graceful stop, and a line that says so.
    // SAFETY: signals the child this test started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let lines: Vec<String> = rx.iter().collect();
    let text = lines.join("\n");
    assert!(
        !text.contains('\u{1b}'),
        "no ANSI colour off a terminal: {text}"
    );
    assert!(lines.last().unwrap().contains("kiln stopped"), "{text}");
    let access: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "kiln::access")
        .collect();
    let put_line = access
        .iter()
        .find(|v| v["fields"]["request_id"] == "req-7")
        .unwrap_or_else(|| panic!("no access line for req-7 in {text}"));
    let f = &put_line["fields"];
    assert_eq!(f["method"], "PUT");
    assert_eq!(f["path"], "/dbs/logs/docs/a");
    assert_eq!(f["status"], 201);
    assert!(f["bytes"].as_u64().unwrap() > 0, "{f}");
    assert!(f["micros"].as_u64().is_some(), "{f}");
    assert!(
        access
            .iter()
            .any(|v| v["fields"]["path"] == "/dbs/logs" && v["fields"]["status"] == 201),
        "{text}"
    );
}
