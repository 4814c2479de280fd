//! kill -9 of `kiln serve` while a client uploads large attachments (some replacing
//! an earlier upload of the same name, so blobs are also being freed): after a
//! restart every acknowledged upload is there with its bytes, nothing is there that
//! the client never sent, the upload in flight is there whole or not at all,
//! `attachments/tmp/` is empty, and the blob files are exactly the hashes the
//! document names (no space leaked). Each cycle waits for at least one
//! acknowledgement before the kill, so a run cannot pass without testing anything.
//!
//! Cycles: KILN_ATTACH_CRASH_CYCLES (default 2; the slow tier runs more).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::raw_http::{files_under, pseudo_random_bytes};
use common::{cycles_from_env, free_port, kill9, request, spawn_serve};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Names the uploads cycle over: most uploads replace (and free) an earlier blob.
const NAMES: u64 = 5;

/// The bytes of upload `seed`: 4 to 32 MiB of pseudo-random data.
fn content(seed: u64) -> Vec<u8> {
    let len = (4 << 20) + (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) % (28 << 20)) as usize;
    pseudo_random_bytes(len, seed)
}

/// Sends one upload; `Ok(None)` when acknowledged (201), else the answer.
/// `streaming` is set while the body is being sent.
fn upload(
    port: u16,
    name: &str,
    bytes: &[u8],
    streaming: &AtomicBool,
) -> std::io::Result<Option<String>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    streaming.store(true, Ordering::SeqCst);
    write!(
        s,
        "PUT /dbs/d/docs/files/1/attachments/{name} HTTP/1.1\r\nhost: x\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        bytes.len()
    )?;
    for chunk in bytes.chunks(1 << 16) {
        s.write_all(chunk)?;
    }
    streaming.store(false, Ordering::SeqCst);
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    if out.is_empty() {
        // The server died before answering (killed after the body arrived).
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if out.starts_with(b"HTTP/1.1 201") {
        return Ok(None);
    }
    Ok(Some(String::from_utf8_lossy(&out).into_owned()))
}

fn get(port: u16, path: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    // A body cut short (a hash mismatch cuts the connection) shows as a short body.
    let _ = s.read_to_end(&mut out);
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&out[9..12]).parse().unwrap();
    (status, out[at + 4..].to_vec())
}

#[test]
fn uploads_survive_kill9_whole_or_not_at_all_without_leaks() {
    let cycles = cycles_from_env("KILN_ATTACH_CRASH_CYCLES", 2);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn_serve(dir.path(), port);
    assert_eq!(request(port, "PUT", "/dbs/d", "").0, 201);
    assert_eq!(request(port, "PUT", "/dbs/d/docs/files/1", "{}").0, 201);
    // name -> seed of its last acknowledged upload.
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let next_seed = Arc::new(AtomicU64::new(1));
    let mut rng = 0x5eed_u64;
    for cycle in 0..cycles {
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight: Arc<Mutex<Option<(String, u64)>>> = Arc::default();
        let acks = Arc::new(AtomicU64::new(0));
        let streaming = Arc::new(AtomicBool::new(false));
        let client = {
            let (stop, in_flight, acks, acked, next_seed, streaming) = (
                stop.clone(),
                in_flight.clone(),
                acks.clone(),
                acked.clone(),
                next_seed.clone(),
                streaming.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let seed = next_seed.fetch_add(1, Ordering::SeqCst);
                    let name = format!("n{}", seed % NAMES);
                    let bytes = content(seed);
                    *in_flight.lock().unwrap() = Some((name.clone(), seed));
                    match upload(port, &name, &bytes, &streaming) {
                        Ok(None) => {
                            acked.lock().unwrap().insert(name, seed);
                            acks.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Some(answer)) => {
                            panic!("cycle {cycle}: upload {seed} refused: {answer}")
                        }
                        Err(_) => return, // The server was killed.
                    }
                }
            })
        };
        // At least one acknowledgement, then a kill at a random point of a later
        // upload: while its body streams (most cycles) or just after (its commit).
        let deadline = Instant::now() + Duration::from_secs(60);
        while acks.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: no upload acknowledged"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        while !streaming.load(Ordering::SeqCst) {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: no upload started"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_micros(rng % 60_000));
        stop.store(true, Ordering::SeqCst);
        kill9(&mut child, cycle);
        client.join().unwrap();
        let in_flight = in_flight.lock().unwrap().clone();
        child = spawn_serve(dir.path(), port);
        let landed = verify(
            dir.path(),
            port,
            cycle,
            &acked.lock().unwrap(),
            in_flight.as_ref(),
        );
        // The upload in flight committed before the kill: it is durable now, and
        // what the next cycles must find.
        if let (true, Some((name, seed))) = (landed, in_flight) {
            acked.lock().unwrap().insert(name, seed);
        }
        eprintln!(
            "attachment kill -9 cycle {cycle}: {} acknowledged this cycle, {} names held",
            acks.load(Ordering::SeqCst),
            acked.lock().unwrap().len()
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The document's attachments are the acknowledged ones (or the one in flight,
/// whole), their bytes come back as sent, and the blob files are exactly the
/// hashes named, with nothing in `tmp/`. True if the upload in flight is there.
fn verify(
    data: &Path,
    port: u16,
    cycle: u64,
    acked: &BTreeMap<String, u64>,
    in_flight: Option<&(String, u64)>,
) -> bool {
    let (status, doc) = request(port, "GET", "/dbs/d/docs/files/1", "");
    assert_eq!(status, 200, "{doc}");
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let empty = vec![];
    let list = doc["@metadata"]["@attachments"]
        .as_array()
        .unwrap_or(&empty);
    let mut named = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut landed = false;
    for a in list {
        let name = a["name"].as_str().unwrap().to_string();
        named.insert(a["hash"].as_str().unwrap().to_string());
        let (status, body) = get(port, &format!("/dbs/d/docs/files/1/attachments/{name}"));
        assert_eq!(status, 200, "cycle {cycle}: {name}");
        let acked_seed = acked.get(&name).copied();
        let flying = in_flight.filter(|(n, _)| *n == name).map(|(_, s)| *s);
        let matches = |seed: Option<u64>| seed.is_some_and(|s| body == content(s));
        assert!(
            matches(acked_seed) || matches(flying),
            "cycle {cycle}: attachment {name} ({} bytes) is neither its acknowledged \
             upload ({acked_seed:?}) nor the one in flight ({flying:?}), whole",
            body.len()
        );
        if !matches(acked_seed) {
            landed = true;
        }
        seen.insert(name);
    }
    for name in acked.keys() {
        assert!(
            seen.contains(name),
            "cycle {cycle}: acknowledged {name} is missing"
        );
    }
    let root = data.join("databases/d/attachments");
    let tmp = files_under(&root.join("tmp"));
    assert!(tmp.is_empty(), "cycle {cycle}: left in tmp/: {tmp:?}");
    let blobs: BTreeSet<String> = files_under(&root)
        .into_iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        blobs, named,
        "cycle {cycle}: the blob files are not exactly the hashes the document names"
    );
    landed
}
