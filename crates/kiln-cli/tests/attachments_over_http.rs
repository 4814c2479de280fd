//! Attachments through a real `kiln serve`: a multi-megabyte body streamed in and
//! out byte for byte, Range (206, 416, several ranges -> 200), ETag and 304, HEAD,
//! DELETE, the document's `@metadata.@attachments`, the change log's entry, If-Match
//! of the document, and a batch naming staged bytes by hash.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::raw_http::{files_under, pseudo_random_bytes, raw};
use common::{free_port, request, spawn_serve};
use std::io::{Read, Write};
use std::net::TcpStream;

/// Deterministic bytes no shortcut can fake.
fn bytes(n: usize) -> Vec<u8> {
    pseudo_random_bytes(n, 0)
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
    // A backup carries the bytes inside its file; a restore puts them back.
    let url = format!("http://127.0.0.1:{port}");
    let backup = dir.path().join("d.kbak");
    let b = backup.to_str().unwrap();
    let o = common::kiln(&["backup", "--url", &url, "--db", "d", "--out", b, "-q"]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert!(
        !dir.path().join("d.kbak.attachments").exists(),
        "no sidecar any more"
    );
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

/// Every blob file of database `db` under the data directory `data`.
fn blob_files(data: &std::path::Path, db: &str) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![data.join("databases").join(db).join("attachments")];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                if !p.ends_with("tmp") {
                    dirs.push(p);
                }
            } else {
                files.push(p);
            }
        }
    }
    files
}

/// `GET /dbs/d/backup` carries the attachments' bytes in its stream, pinned: the
/// documents naming them are deleted while the backup streams (its client holds
/// off reading), their blobs stay on disk until the backup is done and arrive in
/// it (without the pin they are unlinked at the delete), then go. The backup
/// restores through the CLI with the bytes; `kiln backup`/`kiln restore` offline
/// and `kiln check` agree; a changed byte of a blob in the backup fails the
/// restore, naming the blob and the offset.
#[test]
fn a_backup_stream_carries_blobs_freed_while_it_streams() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn_serve(dir.path(), port);
    assert_eq!(request(port, "PUT", "/dbs/d", "").0, 201);
    // Larger than what the server's queue and the sockets' buffers hold: the
    // backup is still streaming while the client holds off.
    let other: Vec<u8> = bytes(13 << 20).iter().map(|b| b ^ 0x5a).collect();
    let blobs = [bytes(12 << 20), other];
    let mut hashes = Vec::new();
    for (i, data) in blobs.iter().enumerate() {
        let doc = format!("/dbs/d/docs/f/{i}");
        assert_eq!(request(port, "PUT", &doc, "{}").0, 201);
        let up = raw(port, "PUT", &format!("{doc}/attachments/b"), &[], data);
        assert_eq!(up.status, 201, "{}", String::from_utf8_lossy(&up.body));
        let v: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
        hashes.push(v["attachment"]["hash"].as_str().unwrap().to_string());
    }
    assert_eq!(blob_files(dir.path(), "d").len(), 2);
    // The backup's response begins (its snapshot is taken); the client reads no more.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /dbs/d/backup HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    // Read until the container's first bytes come: they are written after the
    // snapshot (the response's head may come before it).
    let mut first = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !first.windows(8).any(|w| w == b"KILNBAK\0") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&first));
        first.extend_from_slice(&buf[..n]);
    }
    assert!(
        first.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first)
    );
    for i in 0..2 {
        let (st, b) = request(port, "DELETE", &format!("/dbs/d/docs/f/{i}"), "");
        assert_eq!(st, 200, "{b}");
    }
    assert_eq!(
        blob_files(dir.path(), "d").len(),
        2,
        "freed while a backup reads them: pinned, not unlinked"
    );
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    first.extend_from_slice(&rest);
    let split = first.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&first[..split]).to_lowercase();
    let body = dechunk(
        &first[split + 4..],
        head.contains("transfer-encoding: chunked"),
    );
    // Done: the freed blobs go (the next write's release, at the latest).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !blob_files(dir.path(), "d").is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(blob_files(dir.path(), "d").is_empty(), "unpinned, unlinked");

    let file = dir.path().join("streamed.kbak");
    std::fs::write(&file, &body).unwrap();
    let f = file.to_str().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let o = common::kiln(&["restore", "--url", &url, "--db", "r", f, "-q"]);
    assert!(o.status.success(), "{}", common::text(&o));
    for (i, data) in blobs.iter().enumerate() {
        let got = raw(
            port,
            "GET",
            &format!("/dbs/r/docs/f/{i}/attachments/b"),
            &[],
            b"",
        );
        assert_eq!(got.status, 200);
        assert!(&got.body == data, "blob {i} restored differs");
    }
    // One byte of the big blob changed in the backup: the restore fails, naming it.
    let at = body
        .windows(32)
        .position(|w| w == &blobs[0][1 << 20..(1 << 20) + 32])
        .unwrap();
    let mut bad = body.clone();
    bad[at + 7] ^= 0x40;
    let bad_file = dir.path().join("bad.kbak");
    std::fs::write(&bad_file, &bad).unwrap();
    let o = common::kiln(&[
        "restore",
        "--url",
        &url,
        "--db",
        "r2",
        bad_file.to_str().unwrap(),
        "-q",
    ]);
    let t = common::text(&o);
    assert!(!o.status.success(), "{t}");
    let big = &hashes[0];
    assert!(
        t.contains(&format!("attachments/{big}")) && t.contains("byte offset"),
        "{t}"
    );
    assert_eq!(
        request(port, "GET", "/dbs/r2", "").0,
        404,
        "nothing restored"
    );
    child.kill().unwrap();
    child.wait().unwrap();

    // Offline: backup of the restored database, restore, check.
    let d = dir.path().to_str().unwrap();
    let off = dir.path().join("offline.kbak");
    let o = common::kiln(&[
        "backup",
        "--data-dir",
        d,
        "--db",
        "r",
        "--out",
        off.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    // A count, as `kiln export --json` prints it (not the string "2").
    let summary: serde_json::Value = String::from_utf8_lossy(&o.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON summary: {}", common::text(&o)));
    assert_eq!(
        summary["attachment_blobs"],
        serde_json::json!(2),
        "{summary}"
    );
    let o = common::kiln(&[
        "restore",
        "--data-dir",
        d,
        "--db",
        "r3",
        off.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert_eq!(blob_files(dir.path(), "r3").len(), 2);
    let o = common::kiln(&["check", d]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert!(
        common::text(&o).contains("ok: attachments intact"),
        "{}",
        common::text(&o)
    );
}

/// The body of a response, de-chunked if it was sent chunked.
fn dechunk(b: &[u8], chunked: bool) -> Vec<u8> {
    if !chunked {
        return b.to_vec();
    }
    let mut out = Vec::new();
    let mut p = 0;
    loop {
        let eol = p + b[p..].windows(2).position(|w| w == b"\r\n").unwrap();
        let line = std::str::from_utf8(&b[p..eol]).unwrap();
        let len = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap();
        p = eol + 2;
        if len == 0 {
            return out;
        }
        out.extend_from_slice(&b[p..p + len]);
        p += len + 2;
    }
}

/// `kiln export --out F` writes the attachments' bytes to `F.attachments/<sha256>`
/// and `kiln import F` uploads them before the documents: the imported database
/// serves the same bytes and `kiln check` is clean. An export to stdout with
/// `--attachments-dir` carries them too; without it, it says what it left out.
#[test]
fn export_and_import_carry_attachments() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn_serve(dir.path(), port);
    assert_eq!(request(port, "PUT", "/dbs/d", "").0, 201);
    let blobs = [bytes(1_500_000), b"second".to_vec()];
    for (i, data) in blobs.iter().enumerate() {
        let doc = format!("/dbs/d/docs/f/{i}");
        assert_eq!(request(port, "PUT", &doc, r#"{"k":1}"#).0, 201);
        for name in ["a", "b"] {
            // Two names, one blob: exported once.
            let up = raw(port, "PUT", &format!("{doc}/attachments/{name}"), &[], data);
            assert_eq!(up.status, 201, "{}", String::from_utf8_lossy(&up.body));
        }
    }
    let url = format!("http://127.0.0.1:{port}");
    let out = dir.path().join("d.ndjson");
    let o = common::kiln(&[
        "export",
        "--url",
        &url,
        "--db",
        "d",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert!(
        common::text(&o).contains("\"attachment_blobs\":2"),
        "{}",
        common::text(&o)
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("d.ndjson.attachments"))
            .unwrap()
            .count(),
        2
    );
    let o = common::kiln(&[
        "import",
        "--url",
        &url,
        "--db",
        "e",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    for (i, data) in blobs.iter().enumerate() {
        for name in ["a", "b"] {
            let got = raw(
                port,
                "GET",
                &format!("/dbs/e/docs/f/{i}/attachments/{name}"),
                &[],
                b"",
            );
            assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
            assert!(&got.body == data, "f/{i}/{name} differs after import");
        }
    }
    // Imported again (as a resumed import would): the blobs the database has named
    // by documents are not sent again.
    let staged_posts = || {
        let metrics = request(port, "GET", "/metrics", "").1;
        metrics
            .lines()
            .find(|l| {
                l.starts_with("kiln_http_requests_total{")
                    && l.contains(r#"route="/dbs/{db}/attachments",method="POST",status="201""#)
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(staged_posts(), 2, "the first import sends both blobs");
    let o = common::kiln(&[
        "import",
        "--url",
        &url,
        "--db",
        "e",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert_eq!(staged_posts(), 2, "the second import sends none");
    // To stdout: with a directory for the bytes, and without.
    let side = dir.path().join("side");
    let o = common::kiln(&[
        "export",
        "--url",
        &url,
        "--db",
        "d",
        "--attachments-dir",
        side.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert_eq!(std::fs::read_dir(&side).unwrap().count(), 2);
    let piped = dir.path().join("piped.ndjson");
    std::fs::write(&piped, &o.stdout).unwrap();
    let o2 = common::kiln(&["export", "--url", &url, "--db", "d"]);
    assert!(
        o2.status.success() && o2.stdout == o.stdout,
        "{}",
        common::text(&o2)
    );
    assert!(
        common::text(&o2).contains("2 attachment blobs named by the documents were not exported")
    );
    let o = common::kiln(&[
        "import",
        "--url",
        &url,
        "--db",
        "g",
        "--attachments-dir",
        side.to_str().unwrap(),
        piped.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let got = raw(port, "GET", "/dbs/g/docs/f/0/attachments/b", &[], b"");
    assert!(got.status == 200 && got.body == blobs[0]);
    child.kill().unwrap();
    child.wait().unwrap();
    let o = common::kiln(&["check", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", common::text(&o));
}

/// Every file under the database's `attachments/`, the upload area `tmp/` included.
fn all_attachment_files(data: &std::path::Path, db: &str) -> Vec<std::path::PathBuf> {
    files_under(&data.join("databases").join(db).join("attachments"))
}

/// A chunked upload (no Content-Length) of `total` bytes; write errors are
/// ignored (the server may answer and close before the body ends).
fn chunked(port: u16, method: &str, path: &str, total: usize) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let data = bytes(total);
    for chunk in data.chunks(1 << 16) {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(chunk);
        frame.extend_from_slice(b"\r\n");
        if s.write_all(&frame).is_err() {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// `--max-attachment-bytes`: an upload over the cap gets 413
/// `attachment_too_large`, from its Content-Length before the body is read, or
/// when a chunked body passes it; either way nothing is left under
/// `attachments/` (no blob, no temporary file). One at the cap is stored.
#[test]
fn an_attachment_over_the_cap_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child =
        common::spawn_serve_with(dir.path(), port, &["--max-attachment-bytes", "300000"]);
    assert_eq!(request(port, "PUT", "/dbs/d", "").0, 201);
    assert_eq!(request(port, "PUT", "/dbs/d/docs/a", "{}").0, 201);
    let over = bytes(300_001);
    let put = raw(port, "PUT", "/dbs/d/docs/a/attachments/big", &[], &over);
    assert_eq!(put.status, 413, "{}", String::from_utf8_lossy(&put.body));
    let text = String::from_utf8_lossy(&put.body);
    assert!(
        text.contains("attachment_too_large") && text.contains("300000"),
        "{text}"
    );
    let staged = raw(port, "POST", "/dbs/d/attachments", &[], &over);
    assert_eq!(staged.status, 413);
    for (method, path) in [
        ("PUT", "/dbs/d/docs/a/attachments/big"),
        ("POST", "/dbs/d/attachments"),
    ] {
        let (status, answer) = chunked(port, method, path, 2_000_000);
        assert_eq!(status, 413, "{method} chunked: {answer}");
        assert!(answer.contains("attachment_too_large"), "{answer}");
    }
    // The upload's worker removes its file after the answer: give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !all_attachment_files(dir.path(), "d").is_empty() && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        all_attachment_files(dir.path(), "d"),
        Vec::<std::path::PathBuf>::new()
    );
    let doc = request(port, "GET", "/dbs/d/docs/a", "").1;
    assert!(!doc.contains("@attachments"), "{doc}");
    // At the cap: stored.
    let at = bytes(300_000);
    let put = raw(port, "PUT", "/dbs/d/docs/a/attachments/ok", &[], &at);
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    let (status, answer) = chunked(port, "PUT", "/dbs/d/docs/a/attachments/ok2", 300_000);
    assert_eq!(status, 201, "{answer}");
    let got = raw(port, "GET", "/dbs/d/docs/a/attachments/ok2", &[], b"");
    assert!(got.status == 200 && got.body == at);
    child.kill().unwrap();
    child.wait().unwrap();
}
