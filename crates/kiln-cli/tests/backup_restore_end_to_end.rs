//! End to end: documents written to a real `kiln serve`, `kiln backup --url` while
//! writes go on, `kiln restore` into a new data directory, a server started on it:
//! every document acknowledged before the backup started is there with the same
//! body and etag.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

fn request(port: u16, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// (status line, etag header, body) of an answer.
fn parts(resp: &str) -> (String, String, String) {
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((resp, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    let etag = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("etag:"))
        .map(|l| l[5..].trim().to_string())
        .unwrap_or_default();
    (status, etag, body.to_string())
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> (Server, u16) {
    let port = common::free_port();
    (Server(common::spawn_serve(dir, port)), port)
}

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        // A key in the environment would stand in for the one a test leaves out.
        .env_remove("KILN_ENCRYPTION_KEY_FILE")
        .output()
        .unwrap()
}

#[test]
fn backup_over_http_during_writes_restores_every_acknowledged_document() {
    let tmp = tempfile::tempdir().unwrap();
    let (src_dir, dst_dir) = (tmp.path().join("src"), tmp.path().join("dst"));
    let (server, port) = serve(&src_dir);
    assert!(request(port, "PUT", "/dbs/shop", "").starts_with("HTTP/1.1 201"));
    const N: usize = 300;
    for i in 0..N {
        let body = format!(r#"{{"n":{i},"text":"{}"}}"#, "x".repeat(i % 200));
        let r = request(port, "PUT", &format!("/dbs/shop/docs/pre/{i}"), &body);
        assert!(r.starts_with("HTTP/1.1 201"), "{r}");
    }
    // Writes go on during the backup (other ids; the pre/ documents never change).
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut j = 0u64;
            while !stop.load(SeqCst) {
                let r = request(
                    port,
                    "PUT",
                    &format!("/dbs/shop/docs/live/{j}"),
                    r#"{"live":true}"#,
                );
                assert!(r.starts_with("HTTP/1.1 201"), "{r}");
                j += 1;
                written.store(j, SeqCst);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let file = tmp.path().join("shop.kbak");
    let url = format!("http://127.0.0.1:{port}");
    let before = written.load(SeqCst);
    let out = kiln(&[
        "backup",
        "--url",
        &url,
        "--db",
        "shop",
        "--out",
        file.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, SeqCst);
    writer.join().unwrap();
    assert!(
        written.load(SeqCst) > before,
        "no write went on during the backup"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["database"], "shop");
    assert!(summary["etag"].is_string(), "{summary}");
    assert!(summary["documents"].as_u64().unwrap() >= N as u64);

    let out = kiln(&["backup", "verify", file.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dst = dst_dir.to_str().unwrap();
    let out = kiln(&[
        "restore",
        file.to_str().unwrap(),
        "--data-dir",
        dst,
        "--db",
        "shop",
        "--journal-file-size-mib",
        common::TEST_JOURNAL_FILE_SIZE_MIB,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An existing database is refused without --force.
    let again = kiln(&[
        "restore",
        file.to_str().unwrap(),
        "--data-dir",
        dst,
        "--db",
        "shop",
    ]);
    assert!(!again.status.success());
    // A damaged backup is refused and leaves no database behind.
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    let bad = tmp.path().join("bad.kbak");
    std::fs::write(&bad, &bytes).unwrap();
    let out = kiln(&[
        "restore",
        bad.to_str().unwrap(),
        "--data-dir",
        dst,
        "--db",
        "other",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("offset"));
    assert!(!dst_dir.join("databases/other").exists());

    let (restored, port2) = serve(&dst_dir);
    let last_etag_in_backup = summary["etag"].as_str().unwrap().to_string();
    let mut live_restored = 0;
    for i in 0..N {
        let path = format!("/dbs/shop/docs/pre/{i}");
        let (s1, e1, b1) = parts(&request(port, "GET", &path, ""));
        let (s2, e2, b2) = parts(&request(port2, "GET", &path, ""));
        assert!(s1.contains("200") && s2.contains("200"), "{s1} / {s2}");
        assert!(!e1.is_empty());
        assert_eq!((e1, b1), (e2, b2), "document pre/{i}");
    }
    // Nothing after the backup's snapshot: every restored live document has an
    // etag at or below the backup's last etag.
    let seq = |e: &str| {
        e.trim_matches('"')
            .split('-')
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    for j in 0..written.load(SeqCst) {
        let (s, e, _) = parts(&request(
            port2,
            "GET",
            &format!("/dbs/shop/docs/live/{j}"),
            "",
        ));
        if s.contains("200") {
            live_restored += 1;
            assert!(
                seq(&e) <= seq(&last_etag_in_backup),
                "{e} after {last_etag_in_backup}"
            );
        }
    }
    assert_eq!(
        N as u64 + live_restored,
        summary["documents"].as_u64().unwrap(),
        "the restored database holds exactly the backup's documents"
    );
    drop(restored);
    drop(server);
}

fn ok(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn documents(port: u16, db: &str) -> u64 {
    let (s, _, b) = parts(&request(port, "GET", &format!("/dbs/{db}"), ""));
    assert!(s.contains("200"), "{s} {b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    v["documents"].as_u64().unwrap()
}

/// The CLI's chain: a full backup that starts a chain, two increments, `verify` of
/// the chain (and its refusal of a gap), a point-in-time restore offline, a
/// restore into the running server, `chain-stop`.
#[test]
fn incremental_chain_verify_point_in_time_and_restore_into_a_server() {
    let tmp = tempfile::tempdir().unwrap();
    let (src_dir, dst_dir) = (tmp.path().join("src"), tmp.path().join("dst"));
    let (server, port) = serve(&src_dir);
    let url = format!("http://127.0.0.1:{port}");
    assert!(request(port, "PUT", "/dbs/shop", "").starts_with("HTTP/1.1 201"));
    let put = |i: usize, v: usize| {
        let r = request(
            port,
            "PUT",
            &format!("/dbs/shop/docs/d/{i}"),
            &format!(r#"{{"v":{v}}}"#),
        );
        assert!(r.starts_with("HTTP/1.1 20"), "{r}");
    };
    for i in 0..40 {
        put(i, 0);
    }
    let path = |n: &str| tmp.path().join(n).to_str().unwrap().to_string();
    let (full, inc1, inc2) = (path("full.kbak"), path("inc1.kbak"), path("inc2.kbak"));
    let backup = |out: &str, since: Option<&str>| {
        let mut args = vec![
            "backup", "--url", &url, "--db", "shop", "--out", out, "--json",
        ];
        match since {
            Some(s) => args.extend(["--incremental-since", s]),
            None => args.push("--chain"),
        }
        kiln(&args)
    };
    let f = ok(&backup(&full, None));
    assert_eq!(f["kind"], "full");
    assert!(f["chain_id"].is_string(), "{f}");
    for i in 30..60 {
        put(i, 1);
    }
    let r = request(port, "DELETE", "/dbs/shop/docs/d/0", "");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let i1 = ok(&backup(&inc1, Some(&full)));
    assert_eq!(i1["kind"], "incremental");
    assert_eq!(i1["base_etag"], f["etag"]);
    assert_eq!(i1["entries"], 31);
    let docs_at_inc1 = documents(port, "shop");
    for i in 50..70 {
        put(i, 2);
    }
    let i2 = ok(&backup(&inc2, Some(&inc1)));
    let docs_at_inc2 = documents(port, "shop");

    let v = ok(&kiln(&["backup", "verify", &full, &inc1, &inc2, "--json"]));
    assert_eq!(v["backups"].as_array().unwrap().len(), 3);
    assert_eq!(v["reached"]["etag"], i2["etag"]);
    let out = kiln(&["backup", "verify", &full, &inc2]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("input 2") && err.contains("gap"), "{err}");
    ok(&kiln(&["backup", "verify", &inc2, "--json"]));

    // Offline, up to the end of the first increment.
    let dst = dst_dir.to_str().unwrap();
    let until = format!("etag:{}", i1["etag"].as_str().unwrap());
    let r = ok(&kiln(&[
        "restore",
        &full,
        &inc1,
        &inc2,
        "--data-dir",
        dst,
        "--db",
        "shop",
        "--until",
        &until,
        "--journal-file-size-mib",
        common::TEST_JOURNAL_FILE_SIZE_MIB,
        "--json",
    ]));
    assert_eq!(r["reached"]["etag"], i1["etag"], "{r}");
    assert_eq!(r["writes_replayed"], 31);
    assert_eq!(r["writes_skipped"], 20);
    // Into the running server, all of it.
    let r = ok(&kiln(&[
        "restore", &full, &inc1, &inc2, "--url", &url, "--db", "copy", "--json",
    ]));
    assert_eq!(r["reached"]["etag"], i2["etag"], "{r}");
    assert_eq!(documents(port, "copy"), docs_at_inc2);
    let out = kiln(&["restore", &full, "--url", &url, "--db", "copy"]);
    assert!(!out.status.success(), "an existing database needs --force");
    // A server restores with its own storage options: one given here is refused,
    // not ignored.
    let out = kiln(&[
        "restore",
        &full,
        "--url",
        &url,
        "--db",
        "copy2",
        "--journal-file-size-mib",
        "8",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("offline restores"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let s = ok(&kiln(&[
        "backup",
        "chain-stop",
        "--url",
        &url,
        "--db",
        "shop",
        "--json",
    ]));
    assert_eq!(s["stopped"], true);
    let out = backup(&path("inc3.kbak"), Some(&inc2));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no backup chain"));
    assert!(!tmp.path().join("inc3.kbak").exists());

    let (_restored, port2) = serve(&dst_dir);
    assert_eq!(documents(port2, "shop"), docs_at_inc1);
    let (s, _, _) = parts(&request(port2, "GET", "/dbs/shop/docs/d/0", ""));
    assert!(s.contains("404"), "deleted in the first increment: {s}");
    let (s, _, b) = parts(&request(port2, "GET", "/dbs/shop/docs/d/55", ""));
    assert!(s.contains("200") && b.contains(r#""v":1"#), "{s} {b}");
    drop(server);
}

/// A new master key file (`kiln encryption new-key`) in `dir`.
fn new_key(dir: &Path, name: &str) -> String {
    let path = dir.join(name).to_str().unwrap().to_string();
    let o = kiln(&["encryption", "new-key", "--out", &path]);
    assert!(o.status.success(), "{}", common::text(&o));
    path
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Every file under `dir` holding `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if holds(&std::fs::read(&p).unwrap_or_default(), needle) {
                found.push(p);
            }
        }
    }
    found
}

/// An encrypted data directory offline: its backup is sealed (the document's bytes
/// are not in the file), `verify` with the key checks all of it and without the key
/// only its structure (and says so; a damaged byte still fails), an increment's
/// base is read with the key only, and a restore needs the key and makes an
/// encrypted database holding the document.
#[test]
fn an_encrypted_database_backs_up_sealed_verifies_and_restores_offline() {
    const MARKER: &str = "SEALED-BACKUP-MARKER-4b1d";
    let tmp = tempfile::tempdir().unwrap();
    let k = new_key(tmp.path(), "master.key");
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let (d, d2) = (src.to_str().unwrap(), dst.to_str().unwrap());
    let path = |n: &str| tmp.path().join(n).to_str().unwrap().to_string();
    let doc = format!(r#"{{"name":"{MARKER}"}}"#);
    let o = kiln(&[
        "put",
        "--data-dir",
        d,
        "--encryption-key-file",
        &k,
        "shop",
        "users/ada",
        &doc,
    ]);
    assert!(o.status.success(), "{}", common::text(&o));

    let file = path("shop.kbak");
    let b = ok(&kiln(&[
        "backup",
        "--data-dir",
        d,
        "--db",
        "shop",
        "--out",
        &file,
        "--encryption-key-file",
        &k,
        "--chain",
        "--json",
    ]));
    assert_eq!(b["encrypted"], true, "{b}");
    let fingerprint = b["encryption_key_fingerprint"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(fingerprint.len(), 16, "{b}");
    let bytes = std::fs::read(&file).unwrap();
    assert!(
        !holds(&bytes, MARKER),
        "the document is in the backup in clear"
    );
    assert!(
        !holds(&bytes, "users/ada"),
        "the id is in the backup in clear"
    );

    // With the key: all of it.
    let v = ok(&kiln(&[
        "backup",
        "verify",
        &file,
        "--encryption-key-file",
        &k,
        "--json",
    ]));
    assert_eq!(
        (&v["encrypted"], &v["contents_verified"], &v["documents"]),
        (&true.into(), &true.into(), &1.into()),
        "{v}"
    );
    // Without: its structure, and it says so (stderr, JSON, text).
    let o = kiln(&["backup", "verify", &file, "--json"]);
    let v = ok(&o);
    assert_eq!(
        (&v["encrypted"], &v["contents_verified"]),
        (&true.into(), &false.into()),
        "{v}"
    );
    assert_eq!(v["encryption_key_fingerprint"], fingerprint.as_str(), "{v}");
    assert_eq!(v["file_bytes"], bytes.len() as u64, "{v}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&fingerprint) && err.contains("contents were not checked"),
        "{err}"
    );
    let o = kiln(&["backup", "verify", &file]);
    assert!(o.status.success(), "{}", common::text(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("structure only") && text.contains("NOT verified"),
        "{text}"
    );
    // A damaged byte fails the structure check too; so does a cut file.
    for bad_bytes in [
        {
            let mut b = bytes.clone();
            let mid = b.len() / 2;
            b[mid] ^= 0x10;
            b
        },
        bytes[..bytes.len() - 10].to_vec(),
    ] {
        let bad = path("bad.kbak");
        std::fs::write(&bad, &bad_bytes).unwrap();
        let o = kiln(&["backup", "verify", &bad]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("offset"), "{err}");
    }

    // An increment: its base's manifest is sealed, so the key is asked for first.
    let doc2 = format!(r#"{{"name":"{MARKER}-2"}}"#);
    let o = kiln(&[
        "put",
        "--data-dir",
        d,
        "--encryption-key-file",
        &k,
        "shop",
        "users/bob",
        &doc2,
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let inc = path("inc.kbak");
    let increment = |key: Option<&str>| {
        let mut args = vec![
            "backup",
            "--data-dir",
            d,
            "--db",
            "shop",
            "--out",
            &inc,
            "--incremental-since",
            &file,
            "--json",
        ];
        if let Some(k) = key {
            args.extend(["--encryption-key-file", k]);
        }
        kiln(&args)
    };
    let o = increment(None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("--incremental-since")
            && err.contains("--encryption-key-file")
            && err.contains(&fingerprint),
        "{err}"
    );
    let i = ok(&increment(Some(&k)));
    assert_eq!(i["kind"], "incremental", "{i}");
    assert!(!holds(&std::fs::read(&inc).unwrap(), MARKER));
    let v = ok(&kiln(&[
        "backup",
        "verify",
        &file,
        &inc,
        "--encryption-key-file",
        &k,
        "--json",
    ]));
    assert_eq!(v["backups"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["contents_verified"], true, "{v}");
    let v = ok(&kiln(&["backup", "verify", &file, &inc, "--json"]));
    assert_eq!(
        (&v["contents_verified"], &v["chain_verified"]),
        (&false.into(), &false.into()),
        "{v}"
    );
    assert_eq!(v["backups"].as_array().unwrap().len(), 2, "{v}");

    // A restore without the key is refused before anything is made.
    let restore = |files: &[&str], db: &str, key: Option<&str>| {
        let mut args = vec!["restore"];
        args.extend(files);
        args.extend(["--data-dir", d2, "--db", db, "--json"]);
        if let Some(k) = key {
            args.extend(["--encryption-key-file", k]);
        }
        kiln(&args)
    };
    let o = restore(&[&file], "shop2", None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("encrypted") && err.contains("--encryption-key-file"),
        "{err}"
    );
    assert!(!dst.join("databases/shop2").exists());
    let r = ok(&restore(&[&file], "shop2", Some(&k)));
    assert_eq!(r["restored_as"], "shop2", "{r}");
    let get =
        |db: &str, id: &str| kiln(&["get", "--data-dir", d2, "--encryption-key-file", &k, db, id]);
    let o = get("shop2", "users/ada");
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(MARKER),
        "{}",
        common::text(&o)
    );
    // The chain, offline, with the key: both documents.
    ok(&restore(&[&file, &inc], "shop3", Some(&k)));
    let o = get("shop3", "users/bob");
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(&format!("{MARKER}-2")),
        "{}",
        common::text(&o)
    );
    // The restored databases are encrypted: nothing of the documents in clear.
    assert_eq!(
        files_holding(&dst, MARKER),
        Vec::<std::path::PathBuf>::new()
    );
}

/// An encrypted server: `kiln backup --url` without a key on the client downloads
/// the sealed backup and checks its structure (saying its contents were not
/// checked), with the key all of it; an increment needs the key to read its base;
/// `kiln restore --url` sends sealed backups to the server, which opens them with
/// its own key, no client key needed.
#[test]
fn an_encrypted_server_s_backups_download_and_restore_without_a_client_key() {
    const MARKER: &str = "SEALED-HTTP-MARKER-93ce";
    let tmp = tempfile::tempdir().unwrap();
    let k = new_key(tmp.path(), "master.key");
    let src = tmp.path().join("src");
    let port = common::free_port();
    let server = Server(common::spawn_serve_with(
        &src,
        port,
        &["--encryption-key-file", &k],
    ));
    let url = format!("http://127.0.0.1:{port}");
    let path = |n: &str| tmp.path().join(n).to_str().unwrap().to_string();
    assert!(request(port, "PUT", "/dbs/shop", "").starts_with("HTTP/1.1 201"));
    let body = format!(r#"{{"name":"{MARKER}"}}"#);
    let r = request(port, "PUT", "/dbs/shop/docs/users/ada", &body);
    assert!(r.starts_with("HTTP/1.1 201"), "{r}");

    let backup = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "backup", "--url", &url, "--db", "shop", "--out", out, "--json",
        ];
        args.extend(extra);
        kiln(&args)
    };
    let file = path("shop.kbak");
    let o = backup(&file, &["--chain"]);
    let b = ok(&o);
    assert_eq!(
        (&b["encrypted"], &b["contents_verified"], &b["database"]),
        (&true.into(), &false.into(), &"shop".into()),
        "{b}"
    );
    let fingerprint = b["encryption_key_fingerprint"]
        .as_str()
        .unwrap()
        .to_string();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&fingerprint) && err.contains("contents were not checked"),
        "{err}"
    );
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(b["file_bytes"], bytes.len() as u64, "{b}");
    assert!(
        !holds(&bytes, MARKER),
        "the document is in the backup in clear"
    );
    // With the key the client checks all of it as it arrives.
    let full2 = path("shop2.kbak");
    let b2 = ok(&backup(&full2, &["--encryption-key-file", &k]));
    assert_eq!(
        (&b2["contents_verified"], &b2["documents"]),
        (&true.into(), &1.into()),
        "{b2}"
    );
    assert_eq!(b2["encryption_key_fingerprint"], fingerprint.as_str());

    // An increment reads its base's sealed manifest: the key is asked for.
    let r = request(port, "PUT", "/dbs/shop/docs/users/bob", &body);
    assert!(r.starts_with("HTTP/1.1 201"), "{r}");
    let inc = path("inc.kbak");
    let o = backup(&inc, &["--incremental-since", &file]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--encryption-key-file"),
        "{err}"
    );
    assert!(!tmp.path().join("inc.kbak").exists());
    let i = ok(&backup(
        &inc,
        &["--incremental-since", &file, "--encryption-key-file", &k],
    ));
    assert_eq!(i["kind"], "incremental", "{i}");
    assert!(!holds(&std::fs::read(&inc).unwrap(), MARKER));

    // Restores into the server: no client key.
    let r = ok(&kiln(&[
        "restore", &file, "--url", &url, "--db", "other", "--json",
    ]));
    assert_eq!(r["restored_as"], "other", "{r}");
    let (s, _, b) = parts(&request(port, "GET", "/dbs/other/docs/users/ada", ""));
    assert!(s.contains("200") && b.contains(MARKER), "{s} {b}");
    ok(&kiln(&[
        "restore", &file, &inc, "--url", &url, "--db", "chained", "--json",
    ]));
    assert_eq!(documents(port, "chained"), 2);
    // A key given on this side only serves the pre-check (the manifests).
    ok(&kiln(&[
        "restore",
        &file,
        &inc,
        "--url",
        &url,
        "--db",
        "keyed",
        "--encryption-key-file",
        &k,
        "--json",
    ]));
    assert_eq!(documents(port, "keyed"), 2);
    drop(server);
    assert_eq!(
        files_holding(&src, MARKER),
        Vec::<std::path::PathBuf>::new()
    );
}
