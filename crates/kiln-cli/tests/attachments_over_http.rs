//! Attachments through a real `kiln serve`: a multi-megabyte body streamed in and
//! out byte for byte, Range (206, 416, several ranges -> 200), ETag and 304, HEAD,
//! DELETE, the document's `@metadata.@attachments`, the change log's entry, If-Match
//! of the document, and a batch naming staged bytes by hash.

mod common;

use common::{free_port, request, spawn_serve};
use std::io::{Read, Write};
use std::net::TcpStream;

pub struct Answer {
    pub status: u16,
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
pub fn raw(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).unwrap();
    for chunk in body.chunks(1 << 16) {
        s.write_all(chunk).unwrap();
    }
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: out[split + 4..].to_vec(),
    }
}

fn bytes(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e3779b97f4a7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn attachments_stream_with_ranges_etags_and_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn_serve(dir.path(), port);
    assert_eq!(request(port, "PUT", "/dbs/d", "").0, 201);
    let (s, put) = request(port, "PUT", "/dbs/d/docs/users/1", r#"{"name":"Ada"}"#);
    assert_eq!(s, 201, "{put}");
    let data = bytes(6 << 20);
    let path = "/dbs/d/docs/users/1/attachments/photo%20one.bin";
    // A stale If-Match of the document: refused, nothing kept.
    let stale = raw(port, "PUT", path, &[("if-match", "\"1-00000000\"")], b"x");
    assert_eq!(
        stale.status,
        409,
        "{}",
        String::from_utf8_lossy(&stale.body)
    );
    let up = raw(
        port,
        "PUT",
        path,
        &[("content-type", "image/x-test")],
        &data,
    );
    assert_eq!(up.status, 201, "{}", String::from_utf8_lossy(&up.body));
    let up_json: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    let hash = up_json["attachment"]["hash"].as_str().unwrap().to_string();
    assert_eq!(up_json["attachment"]["size"], data.len());
    // The whole body, as stored.
    let got = raw(port, "GET", path, &[], b"");
    assert_eq!(got.status, 200);
    assert_eq!(got.body.len(), data.len());
    assert!(got.body == data, "the bytes came back changed");
    assert_eq!(got.header("etag"), Some(format!("\"{hash}\"").as_str()));
    assert_eq!(got.header("content-type"), Some("image/x-test"));
    assert_eq!(got.header("accept-ranges"), Some("bytes"));
    // HEAD: the same headers, no body.
    let head = raw(port, "HEAD", path, &[], b"");
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        Some(data.len().to_string().as_str())
    );
    assert!(head.body.is_empty());
    // ETag -> 304.
    let etag = format!("\"{hash}\"");
    let cached = raw(port, "GET", path, &[("if-none-match", &etag)], b"");
    assert_eq!(cached.status, 304);
    assert!(cached.body.is_empty());
    // Ranges.
    let r = raw(port, "GET", path, &[("range", "bytes=100-199")], b"");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, data[100..200]);
    let total = data.len();
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes 100-199/{total}").as_str())
    );
    let tail = raw(port, "GET", path, &[("range", "bytes=-10")], b"");
    assert_eq!((tail.status, &tail.body[..]), (206, &data[total - 10..]));
    let open = raw(
        port,
        "GET",
        path,
        &[("range", &format!("bytes={}-", total - 5))],
        b"",
    );
    assert_eq!((open.status, &open.body[..]), (206, &data[total - 5..]));
    let beyond = raw(
        port,
        "GET",
        path,
        &[("range", &format!("bytes={total}-"))],
        b"",
    );
    assert_eq!(beyond.status, 416);
    assert_eq!(
        beyond.header("content-range"),
        Some(format!("bytes */{total}").as_str())
    );
    let multi = raw(port, "GET", path, &[("range", "bytes=0-1,5-6")], b"");
    assert_eq!((multi.status, multi.body.len()), (200, total));
    // The document lists it; the change log has the document's new version.
    let (_, doc) = request(port, "GET", "/dbs/d/docs/users/1", "");
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let list = &doc["@metadata"]["@attachments"];
    assert_eq!(list[0]["name"], "photo one.bin");
    assert_eq!(list[0]["hash"], hash.as_str());
    assert_eq!(list[0]["size"], total);
    assert_eq!(list[0]["content_type"], "image/x-test");
    let (_, changes) = request(port, "GET", "/dbs/d/changes", "");
    let changes: serde_json::Value = serde_json::from_str(&changes).unwrap();
    let last = changes["results"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["id"], "users/1");
    assert_eq!(last["etag"], up_json["etag"]);
    // A body put keeps the attachment.
    assert_eq!(
        request(port, "PUT", "/dbs/d/docs/users/1", r#"{"name":"Ada L"}"#).0,
        200
    );
    assert_eq!(raw(port, "HEAD", path, &[], b"").status, 200);
    // Bad names.
    let bad = raw(
        port,
        "PUT",
        "/dbs/d/docs/users/1/attachments/a%2Fb",
        &[],
        b"x",
    );
    assert_eq!(bad.status, 400, "{}", String::from_utf8_lossy(&bad.body));
    let none = raw(
        port,
        "GET",
        "/dbs/d/docs/users/1/attachments/nope",
        &[],
        b"",
    );
    assert_eq!(none.status, 404);
    let nodoc = raw(port, "PUT", "/dbs/d/docs/users/9/attachments/x", &[], b"x");
    assert_eq!(nodoc.status, 404);
    // Staged bytes named by a batch.
    let staged = raw(port, "POST", "/dbs/d/attachments", &[], b"staged");
    assert_eq!(
        staged.status,
        201,
        "{}",
        String::from_utf8_lossy(&staged.body)
    );
    let staged: serde_json::Value = serde_json::from_slice(&staged.body).unwrap();
    let batch = serde_json::json!({"ops": [{"op": "put", "id": "users/2", "document": {
        "@metadata": {"@attachments": [{"name": "s.txt", "hash": staged["hash"], "content_type": "text/plain"}]}
    }}]});
    let (s, b) = request(port, "POST", "/dbs/d/batch", &batch.to_string());
    assert_eq!(s, 200, "{b}");
    let s = raw(
        port,
        "GET",
        "/dbs/d/docs/users/2/attachments/s.txt",
        &[],
        b"",
    );
    assert_eq!((s.status, &s.body[..]), (200, &b"staged"[..]));
    // A backup carries the bytes beside its file; a restore puts them back.
    let url = format!("http://127.0.0.1:{port}");
    let backup = dir.path().join("d.kbak");
    let b = backup.to_str().unwrap();
    let o = common::kiln(&["backup", "--url", &url, "--db", "d", "--out", b, "-q"]);
    assert!(o.status.success(), "{}", common::text(&o));
    let sidecar = std::fs::read_dir(dir.path().join("d.kbak.attachments")).unwrap();
    assert_eq!(sidecar.count(), 2, "the two blobs beside the backup");
    let o = common::kiln(&["restore", "--url", &url, "--db", "d2", b, "-q"]);
    assert!(o.status.success(), "{}", common::text(&o));
    let back = raw(port, "GET", &path.replace("/dbs/d/", "/dbs/d2/"), &[], b"");
    assert_eq!(back.status, 200);
    assert!(back.body == data, "the restored attachment differs");
    let s2 = raw(
        port,
        "GET",
        "/dbs/d2/docs/users/2/attachments/s.txt",
        &[],
        b"",
    );
    assert_eq!((s2.status, &s2.body[..]), (200, &b"staged"[..]));
    // The CLI's own commands.
    let file = dir.path().join("small.txt");
    std::fs::write(&file, b"from the cli").unwrap();
    let f = file.to_str().unwrap();
    let args = [
        "attachments",
        "put",
        "--url",
        &url,
        "--db",
        "d",
        "users/1",
        "cli.txt",
        f,
    ];
    let o = common::kiln(&[&args[..], &["--content-type", "text/plain"]].concat());
    assert!(o.status.success(), "{}", common::text(&o));
    let o = common::kiln(&[
        "attachments",
        "get",
        "--url",
        &url,
        "--db",
        "d",
        "users/1",
        "cli.txt",
    ]);
    assert_eq!(o.stdout, b"from the cli", "{}", common::text(&o));
    let o = common::kiln(&["attachments", "list", "--url", &url, "--db", "d", "users/1"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("cli.txt  12 bytes  text/plain"));
    let o = common::kiln(&[
        "attachments",
        "delete",
        "--url",
        &url,
        "--db",
        "d",
        "users/1",
        "cli.txt",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    // An attachment is not patched or posted to: 405 with what it takes.
    for method in ["PATCH", "POST", "OPTIONS"] {
        let a = raw(port, method, path, &[("If-Match", "0")], b"{}");
        assert_eq!(
            a.status,
            405,
            "{method}: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert_eq!(
            a.header("allow"),
            Some("GET, HEAD, PUT, DELETE"),
            "{method}"
        );
    }
    // Delete.
    let del = raw(port, "DELETE", path, &[], b"");
    assert_eq!(del.status, 200, "{}", String::from_utf8_lossy(&del.body));
    assert_eq!(raw(port, "GET", path, &[], b"").status, 404);
    // Only the staged blob's file is left (the freed ones are unlinked).
    let mut files = Vec::new();
    let mut dirs = vec![dir.path().join("databases/d/attachments")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    assert_eq!(files.len(), 1, "{files:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    // kiln check re-hashes the blobs: clean, then a changed byte is found.
    let d = dir.path().to_str().unwrap();
    let o = common::kiln(&["check", d]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert!(common::text(&o).contains("ok: attachments intact"));
    std::fs::write(&files[0], b"changed").unwrap();
    let o = common::kiln(&["check", "--json", d]);
    assert_eq!(o.status.code(), Some(1), "{}", common::text(&o));
    assert!(
        common::text(&o).contains("\"corrupt\":[\""),
        "{}",
        common::text(&o)
    );
}
