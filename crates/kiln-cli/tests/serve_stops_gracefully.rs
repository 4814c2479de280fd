//! `kiln serve` as users run it: answers on its port, and on SIGTERM stops accepting,
//! finishes, flushes and exits 0 with the data intact (read back without a server).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn request(port: u16, raw: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(raw.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn sigterm_flushes_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while request(
        port,
        "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .is_err()
    {
        assert!(Instant::now() < deadline, "kiln serve did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let created = request(
        port,
        "PUT /dbs/shop HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let body = r#"{"name":"Ada"}"#;
    let put = request(
        port,
        &format!(
            "PUT /dbs/shop/docs/users/ada HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .unwrap();
    assert!(put.starts_with("HTTP/1.1 201"), "{put}");

    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "kiln serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}");
    assert!(
        request(port, "GET /health HTTP/1.1\r\nhost: x\r\n\r\n").is_err(),
        "still listening"
    );

    let got = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["get", "--data-dir"])
        .arg(dir.path())
        .args(["shop", "users/ada"])
        .output()
        .unwrap();
    assert!(got.status.success(), "{got:?}");
    let doc: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(doc["name"], "Ada");
    // A clean shutdown leaves nothing to replay.
    let check = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("check")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
}
