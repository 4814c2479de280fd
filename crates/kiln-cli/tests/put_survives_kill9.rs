//! kill -9 of `kiln serve` while clients PUT documents one by one over keep-alive
//! connections (the server's own HTTP/1.1 loop and the write queue): after a restart
//! every acknowledged write is there, at its acknowledged version or a later one the
//! client sent, and nothing a client never sent. Each cycle waits for acknowledgements
//! before the kill (and fails if the server exits by itself or does not die of the
//! SIGKILL), so a run cannot pass without testing anything.
//!
//! Cycles: KILN_PUT_CRASH_CYCLES (default 2; the slow tier runs more).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::{free_port, spawn_serve_with};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: u64 = 8;
/// Ids per client: writes cycle over them, so most writes replace a document.
const IDS_PER_CLIENT: u64 = 40;

/// One answer off a keep-alive connection: (status, body).
fn exchange(s: &mut TcpStream, request: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    s.write_all(request)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status: u16 = head[9..12].parse().expect("a status");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("a length"));
            while buf.len() < end + 4 + length {
                let n = s.read(&mut chunk)?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok((status, buf[end + 4..end + 4 + length].to_vec()));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn put_request(id: &str, body: &str) -> Vec<u8> {
    format!(
        "PUT /dbs/k/docs/{id} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Per id: the highest version acknowledged and the highest sent.
#[derive(Default, Clone, Copy)]
struct Versions {
    acked: u64,
    sent: u64,
}

/// Clients write `{"v": n}` with n rising per client until the server dies; every
/// acknowledgement is recorded before the next write is sent.
fn write_until_killed(
    cycle: u64,
    port: u16,
    child: &mut std::process::Child,
    versions: &Arc<Mutex<HashMap<String, Versions>>>,
    next_version: &Arc<AtomicU64>,
    kill_after_acks: u64,
) -> u64 {
    let acks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (versions, next_version, acks, stop) = (
            versions.clone(),
            next_version.clone(),
            acks.clone(),
            stop.clone(),
        );
        clients.push(std::thread::spawn(move || {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                return;
            };
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("c{c}/{}", i % IDS_PER_CLIENT);
                i += 1;
                let v = next_version.fetch_add(1, Ordering::SeqCst);
                versions.lock().unwrap().entry(id.clone()).or_default().sent = v;
                match exchange(&mut s, &put_request(&id, &format!("{{\"v\":{v}}}"))) {
                    Ok((200 | 201, _)) => {
                        let mut all = versions.lock().unwrap();
                        let e = all.get_mut(&id).expect("recorded when sent");
                        e.acked = e.acked.max(v);
                        acks.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok((status, body)) => panic!(
                        "cycle {cycle}: PUT {id}: {status} {}",
                        String::from_utf8_lossy(&body)
                    ),
                    // The server is gone: what it acknowledged is what counts.
                    Err(_) => return,
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while acks.load(Ordering::SeqCst) < kill_after_acks {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("cycle {cycle}: kiln serve exited ({status}) before the test killed it");
        }
        assert!(
            Instant::now() < deadline,
            "cycle {cycle}: only {} acknowledgements in 60 s",
            acks.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // A little later still, so that kills land in the middle of commits.
    std::thread::sleep(Duration::from_micros(1_000 + 3_517 * cycle % 20_000));
    common::kill9(child, cycle);
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().expect("a client thread panicked");
    }
    acks.load(Ordering::SeqCst)
}

/// `kiln serve`'s read-ahead flag for a cycle: `always` on odd cycles.
fn read_ahead(cycle: u64) -> &'static [&'static str] {
    if cycle % 2 == 1 {
        &["--read-ahead", "always"]
    } else {
        &[]
    }
}

#[test]
fn acknowledged_puts_survive_kill9() {
    let cycles = common::cycles_from_env("KILN_PUT_CRASH_CYCLES", 2);
    let dir = tempfile::tempdir().unwrap();
    let versions = Arc::new(Mutex::new(HashMap::<String, Versions>::new()));
    let next_version = Arc::new(AtomicU64::new(1));
    for cycle in 0..cycles {
        let port = free_port();
        // Every other cycle, batches of writes ask for their pages ahead (the path
        // taken past RAM, docs/design/storage.md §13.3): kills land there too.
        let mut child = spawn_serve_with(dir.path(), port, read_ahead(cycle));
        if cycle == 0 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (status, _) = exchange(
                &mut s,
                b"PUT /dbs/k HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
            )
            .unwrap();
            assert_eq!(status, 201);
        }
        let kill_after = 200 + 150 * (cycle % 5);
        let acked = write_until_killed(
            cycle,
            port,
            &mut child,
            &versions,
            &next_version,
            kill_after,
        );

        // Restart: every acknowledged version (or a later one sent) is there.
        let port = free_port();
        let mut child = spawn_serve_with(dir.path(), port, read_ahead(cycle));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let all = versions.lock().unwrap().clone();
        let mut checked = 0;
        for (id, v) in &all {
            let get = format!("GET /dbs/k/docs/{id} HTTP/1.1\r\nhost: x\r\n\r\n");
            let (status, body) = exchange(&mut s, get.as_bytes()).unwrap();
            if v.acked == 0 {
                // Never acknowledged: absent, or one of the versions sent.
                assert!(status == 404 || status == 200, "{id}: {status}");
                continue;
            }
            assert_eq!(status, 200, "cycle {cycle}: acknowledged {id} is gone");
            let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let found = doc["v"].as_u64().expect("a version");
            assert!(
                found >= v.acked && found <= v.sent,
                "cycle {cycle}: {id} holds version {found}; acknowledged {}, last sent {}",
                v.acked,
                v.sent
            );
            checked += 1;
        }
        eprintln!(
            "put kill -9 cycle {cycle}: {acked} acknowledged this cycle, {checked} documents checked"
        );
        assert!(checked > 0, "cycle {cycle}: nothing to check");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
