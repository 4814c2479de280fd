//! Raw HTTP/1.1 for the attachment tests: a binary body sent in 64 KiB writes on
//! a connection of its own, the answer read whole, and deterministic bytes to send.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Answer {
    pub status: u16,
    /// The status line and the headers, as sent.
    pub head: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request with raw headers and a binary body, on its own connection.
///
/// A server may answer from the head alone (a 413 on Content-Length, a 307 to the
/// leader) and close without reading the body, as HTTP allows: the rest of the body
/// then meets a broken pipe. Sending stops there, as curl's does, and the answer
/// already on its way is read; a reset after it (the unread body) ends the read.
pub fn raw(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).unwrap();
    for chunk in body.chunks(1 << 16) {
        if s.write_all(chunk).is_err() {
            break;
        }
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if !out.is_empty() => {
                eprintln!(
                    "{method} {path}: read ended by {e} after {} bytes",
                    out.len()
                );
                break;
            }
            Err(e) => panic!("{method} {path}: no answer: {e}"),
        }
    }
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no head in {} bytes", out.len()));
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.get(9..12))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        head,
        headers,
        body: out[split + 4..].to_vec(),
    }
}

/// `n` pseudo-random bytes (xorshift), the same for the same `seed`: content no
/// compression or deduplication shortcut can fake.
pub fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Every file under `dir`, recursively (none when it does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files
}
