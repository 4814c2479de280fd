//! kill -9 of `kiln serve` in the middle of a streaming bulk insert: after a restart
//! every document the server acknowledged is there, and what is there is a prefix of
//! what was sent (batches commit in order and whole: no document of a batch without
//! the documents before it). Each cycle waits for at least one acknowledgement
//! before the kill (else it fails, as it does when the server exits by itself or does
//! not die of the SIGKILL), so a run cannot pass without testing anything.
//!
//! Cycles: KILN_BULK_CRASH_CYCLES (default 3; the slow tier runs more).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DOCS_PER_CYCLE: u64 = 2_000_000;

use common::{free_port, spawn_serve as start_server};

fn create_db(port: u16) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(
        b"PUT /dbs/bulk HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 201"), "{out}");
}

fn doc_line(n: u64) -> String {
    format!(
        "{{\"id\":\"items/{n:010}\",\"document\":{{\"n\":{n},\"pad\":\"{}\"}}}}\n",
        "p".repeat(100)
    )
}

/// Streams documents 0.. in chunked encoding on one connection until the socket
/// breaks; another thread reads the acks. Returns the highest ack seen. Fails the
/// cycle if the server acknowledges nothing in time, exits by itself, or does not die
/// of the SIGKILL.
fn bulk_until_killed(
    cycle: u64,
    port: u16,
    child: &mut Child,
    kill_after_acks: u64,
    jitter_us: u64,
) -> u64 {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut w = s.try_clone().unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let acks_seen = Arc::new(AtomicU64::new(0));
    // The server's answer if it ends the upload with an error (not an ack).
    let refused = Arc::new(std::sync::Mutex::new(None::<String>));
    let reader = {
        let acked = acked.clone();
        let acks_seen = acks_seen.clone();
        let refused = refused.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(s);
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                // Chunked framing: the NDJSON lines are the ones that parse.
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) {
                    if v.get("error").is_some() {
                        *refused.lock().unwrap() = Some(line.trim().to_string());
                    } else if let Some(n) = v.get("acked").and_then(|n| n.as_u64()) {
                        acked.fetch_max(n, Ordering::SeqCst);
                        acks_seen.fetch_add(1, Ordering::SeqCst);
                    }
                }
                line.clear();
            }
        })
    };
    let writer = std::thread::spawn(move || {
        let head = "POST /dbs/bulk/bulk HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-type: application/x-ndjson\r\n\r\n";
        if w.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut n = 0;
        while n < DOCS_PER_CYCLE {
            let mut chunk = String::new();
            for _ in 0..200 {
                chunk.push_str(&doc_line(n));
                n += 1;
            }
            let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
            if w.write_all(framed.as_bytes()).is_err() {
                return;
            }
        }
        let _ = w.write_all(b"0\r\n\r\n");
    });
    let timeout = Duration::from_secs(60);
    let deadline = Instant::now() + timeout;
    while acks_seen.load(Ordering::SeqCst) < kill_after_acks {
        if let Some(answer) = refused.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cycle {cycle}: the server ended the upload with an error after {} acknowledgements: {answer}", acks_seen.load(Ordering::SeqCst));
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "cycle {cycle}: kiln serve exited ({status}) before the test killed it, after {} of the {kill_after_acks} acknowledgements awaited",
                acks_seen.load(Ordering::SeqCst)
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "cycle {cycle}: the server sent {} of the {kill_after_acks} acknowledgements awaited in {} s",
                acks_seen.load(Ordering::SeqCst),
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Then a little later, so that kills land inside batches too, not only right
    // after an acknowledgement.
    std::thread::sleep(Duration::from_micros(jitter_us));
    common::kill9(child, cycle);
    writer.join().unwrap();
    reader.join().unwrap();
    acked.load(Ordering::SeqCst)
}

#[test]
fn acknowledged_bulk_batches_survive_kill9() {
    let cycles = common::cycles_from_env("KILN_BULK_CRASH_CYCLES", 3);
    let mut total_acked = 0;
    for cycle in 0..cycles {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut child = start_server(dir.path(), port);
        create_db(port);
        let kill_after = 1 + cycle % 4;
        let acked = bulk_until_killed(
            cycle,
            port,
            &mut child,
            kill_after,
            (cycle * 7_919) % 30_000,
        );
        assert!(acked >= 1, "cycle {cycle}: no acknowledged document");
        total_acked += acked;

        let store = kiln_docs::DocStore::open(dir.path(), kiln_docs::DocsOptions::default())
            .expect("reopens after kill -9");
        let db = store.database("bulk").unwrap();
        let present = db.document_count().unwrap();
        assert!(
            present >= acked,
            "cycle {cycle}: {acked} acknowledged, only {present} present"
        );
        // A prefix: the last present document and every one before it.
        for n in [0, acked - 1, present - 1] {
            let id = format!("items/{n:010}");
            assert!(
                db.get(&id).unwrap().is_some(),
                "cycle {cycle}: {id} missing"
            );
        }
        assert!(
            db.get(&format!("items/{present:010}")).unwrap().is_none(),
            "cycle {cycle}: a document past the prefix of {present}"
        );
        let page = db
            .list_by_prefix("items/", None, present as usize + 1)
            .unwrap();
        assert_eq!(page.items.len() as u64, present);
        for (i, d) in page.items.iter().enumerate() {
            assert_eq!(d.id, format!("items/{i:010}"), "cycle {cycle}: a hole");
        }
        drop(db);
        store.close().unwrap();
        eprintln!("bulk kill -9 cycle {cycle}: {acked} acknowledged, {present} present");
    }
    assert!(total_acked > 0, "no acknowledged document was tested");
    eprintln!(
        "bulk kill -9 test: {cycles} cycles, {total_acked} acknowledged documents verified, none lost"
    );
}
