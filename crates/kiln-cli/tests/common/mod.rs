//! Shared by the tests that run the `kiln` binary: a free loopback port, and a
//! `kiln serve` child that answers `/health` before it is handed over.
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

pub mod cluster;
pub mod fake_clock;
pub mod pki;
pub mod raw_http;
pub mod relay;
pub mod replicas;
pub mod subscription_worker;
pub mod tmpfs;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// True when `GET /health` on `port` answers 200.
pub fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let mut out = String::new();
    s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200")
}

/// The journal file size (MiB) of the databases the tests make: the default's 64 MiB,
/// zero-filled, plus a spare, per database, filled a CI machine's small disk (the
/// backup tests hold several databases at once), and small files also make the
/// crash tests cross journal files.
pub const TEST_JOURNAL_FILE_SIZE_MIB: &str = "4";

/// Starts `kiln serve` on `data_dir` and `port` and waits (30 s at most) until it
/// answers `/health`; a server that exits first fails the test at once. The caller
/// owns the child: it kills (or SIGKILLs) and waits for it.
pub fn spawn_serve(data_dir: &Path, port: u16) -> Child {
    spawn_serve_with(data_dir, port, &[])
}

/// [`spawn_serve`] with more options for `kiln serve`.
#[allow(clippy::zombie_processes)]
pub fn spawn_serve_with(data_dir: &Path, port: u16, options: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--journal-file-size-mib",
            TEST_JOURNAL_FILE_SIZE_MIB,
        ])
        .args(options)
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_healthy(&mut child, port, "kiln serve");
    child
}

/// Waits (30 s at most) until the `kiln serve` child on `port` answers `/health`;
/// one that exits first fails the test at once. `who` names it in the message.
pub fn wait_until_healthy(child: &mut Child, port: u16, who: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthy(port) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{who} exited before answering /health: {status}");
        }
        assert!(Instant::now() < deadline, "{who} did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Crash cycles to run: the variable `name` when set (at least 1), else `default`.
pub fn cycles_from_env(name: &str, default: u64) -> u64 {
    let cycles = std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    assert!(cycles > 0, "{name} must be at least 1");
    cycles
}

/// SIGKILLs `child` (a `kiln serve` the test started) and fails the cycle unless
/// it died of that signal: a server that had exited by itself tested nothing.
pub fn kill9(child: &mut Child, cycle: u64) {
    use std::os::unix::process::ExitStatusExt;
    /// SIGKILL's number (9 on every Unix; the tests do not depend on libc).
    const SIGKILL: i32 = 9;
    if let Some(status) = child.try_wait().unwrap() {
        panic!("cycle {cycle}: kiln serve exited ({status}) before the test killed it");
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(SIGKILL),
        "cycle {cycle}: kiln serve was not killed by SIGKILL but exited ({status})"
    );
}

/// Runs `kiln` with `args` (stdin empty) and waits for it.
pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kiln")
}

/// Exit status, stdout and stderr of a run, for an assertion's message.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One request on its own connection (`Connection: close`): the status and the body.
pub fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}
