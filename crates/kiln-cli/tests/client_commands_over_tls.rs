//! Every client command reaches a production-shaped server: `kiln serve` with TLS
//! and `--auth`. import, export, backup, restore --url and query over https with
//! `--ca-cert` and the API key from `KILN_API_KEY` (or `--api-key`), and with a
//! client certificate instead of a key; refused with a clear error without the CA
//! or the key.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::text;

use common::pki::{new_ca, pki, Pki};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve_tls(data: &Path, pki: &Pki, port: u16) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--auth", "--bind", &format!("127.0.0.1:{port}")])
        .args([
            "--journal-file-size-mib",
            common::TEST_JOURNAL_FILE_SIZE_MIB,
        ])
        .arg("--data-dir")
        .arg(data)
        .arg("--tls-cert")
        .arg(&pki.cert)
        .arg("--tls-key")
        .arg(&pki.key)
        .arg("--tls-client-ca")
        .arg(&pki.ca)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("kiln serve exited: {status}");
        }
        assert!(Instant::now() < deadline, "kiln serve did not come up");
        std::thread::sleep(Duration::from_millis(30));
    }
    Server(child)
}

fn kiln(args: &[&str], key: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args).stdin(Stdio::null()).env_remove("KILN_API_KEY");
    if let Some(k) = key {
        c.env("KILN_API_KEY", k);
    }
    c.output().unwrap()
}

#[test]
fn every_client_command_works_over_https_with_auth() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let o = kiln(
        &[
            "api-key",
            "create",
            "--data-dir",
            data.to_str().unwrap(),
            "--name",
            "cli",
            "--operator",
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let key = String::from_utf8_lossy(&o.stdout).trim().to_string();
    // The client certificate authenticates once registered, with its own clearance:
    // admin of the database its restore writes.
    let o = kiln(
        &[
            "api-key",
            "create",
            "--data-dir",
            data.to_str().unwrap(),
            "--name",
            "restorer",
            "--db",
            "copy:admin",
            "--certificate",
            pki.client_cert.to_str().unwrap(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("registered certificate"), "{}", text(&o));
    let listed = text(&kiln(
        &["api-key", "list", "--data-dir", data.to_str().unwrap()],
        None,
    ));
    assert!(
        listed.contains("certificate ") && listed.contains("copy:admin"),
        "{listed}"
    );
    let port = common::free_port();
    let _server = serve_tls(&data, &pki, port);
    let url = format!("https://localhost:{port}");
    let ca = pki.ca.to_str().unwrap();
    let p = |path: &Path| path.to_str().unwrap().to_string();

    // import: NDJSON lines into a database it creates.
    let input = dir.path().join("in.ndjson");
    let lines: String = (0..50)
        .map(|i| {
            format!(
                "{{\"id\":\"u/{i:03}\",\"document\":{{\"n\":{i},\"age\":{}}}}}\n",
                20 + i
            )
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let o = kiln(
        &[
            "import",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "--db",
            "shop",
            &p(&input),
            "--quiet",
        ],
        Some(&key),
    );
    assert!(o.status.success(), "import: {}", text(&o));

    // export: all of it back.
    let out = dir.path().join("out.ndjson");
    let o = kiln(
        &[
            "export",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "--db",
            "shop",
            "--out",
            &p(&out),
            "--quiet",
        ],
        Some(&key),
    );
    assert!(o.status.success(), "export: {}", text(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 50);

    // query, with the key as a flag this time.
    let o = kiln(
        &[
            "query",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "--api-key",
            &key,
            "--db",
            "shop",
            "--json",
            "from u where age >= 60",
        ],
        None,
    );
    assert!(o.status.success(), "query: {}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["results"].as_array().unwrap().len(), 10, "{v}");

    // backup and restore --url: a second database with the same documents.
    let backup = dir.path().join("shop.kbk");
    let o = kiln(
        &[
            "backup",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "--db",
            "shop",
            "--out",
            &p(&backup),
            "--quiet",
        ],
        Some(&key),
    );
    assert!(o.status.success(), "backup: {}", text(&o));
    // With a client certificate instead of a key.
    let o = kiln(
        &[
            "restore",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "--client-cert",
            &p(&pki.client_cert),
            "--client-key",
            &p(&pki.client_key),
            "--db",
            "copy",
            &p(&backup),
            "--quiet",
            "--json",
        ],
        None,
    );
    assert!(o.status.success(), "restore: {}", text(&o));
    let o = kiln(
        &[
            "export",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "--db",
            "copy",
            "--out",
            &p(&out),
            "--quiet",
        ],
        Some(&key),
    );
    assert!(o.status.success(), "export of the copy: {}", text(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 50);

    // Refusals, each saying why: no key, a CA that did not sign the server's
    // certificate, and https options on a plain URL.
    let o = kiln(
        &[
            "export",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "--db",
            "shop",
            "--out",
            &p(&out),
            "--quiet",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(5), "refused: {}", text(&o));
    assert!(text(&o).contains("401"), "{}", text(&o));
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, new_ca().0.pem()).unwrap();
    let o = kiln(
        &[
            "query",
            "--url",
            &url,
            "--ca-cert",
            &p(&other),
            "--db",
            "shop",
            "from u",
        ],
        Some(&key),
    );
    assert_eq!(o.status.code(), Some(3), "cannot connect: {}", text(&o));
    assert!(text(&o).contains("TLS"), "{}", text(&o));
    let o = kiln(
        &[
            "query",
            "--url",
            &format!("http://127.0.0.1:{port}"),
            "--ca-cert",
            ca,
            "--db",
            "shop",
            "from u",
        ],
        Some(&key),
    );
    assert_eq!(o.status.code(), Some(2), "a usage error: {}", text(&o));
    assert!(text(&o).contains("https://"), "{}", text(&o));
}
