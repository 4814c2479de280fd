//! A production-shaped cluster: three `kiln serve` nodes with TLS and `--auth`,
//! reaching each other over https (checked against `--cluster-ca`) and carrying the
//! cluster's key on every Raft message. Writes through the leader with an API key
//! reach the followers; a Raft message without the key, or with another key, is
//! refused; a node with `--auth` but no cluster key does not start. An API key
//! created once through a follower (`kiln api-key create --url`) lets its holder
//! in on every node, within its grants, and its revocation shuts it out of every
//! node.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::pki::{pki, Pki};
use common::text;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLUSTER_KEY: &str = "5f1c0e2d9a8b7c6d5e4f30211203a4b5c6d7e8f9";

struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn kiln(args: &[&str], key: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args).stdin(Stdio::null()).env_remove("KILN_API_KEY");
    if let Some(k) = key {
        c.env("KILN_API_KEY", k);
    }
    c.output().unwrap()
}

#[allow(clippy::zombie_processes)] // `Nodes` kills and waits
fn start_node(id: u64, data: &Path, port: u16, members: &str, pki: &Pki, key_file: &Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--auth", "--bind", &format!("127.0.0.1:{port}")])
        .args(["--node-id", &id.to_string(), "--cluster", members])
        .args([
            "--election-timeout-ms",
            &common::cluster::ELECTION_TIMEOUT_MS.to_string(),
        ])
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
        .arg("--cluster-ca")
        .arg(&pki.ca)
        .arg("--cluster-key-file")
        .arg(key_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("node {id} exited: {status}");
        }
        assert!(Instant::now() < deadline, "node {id} did not come up");
        std::thread::sleep(Duration::from_millis(30));
    }
    child
}

/// One POST over https (trusting the test CA) with `headers`; the status.
fn https_post(ca: &Path, port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    let mut roots = rustls::RootCertStore::empty();
    kiln_server::tls::add_ca_certs(&mut roots, ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, socket);
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        tls,
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = Vec::new();
    // A peer closing without close_notify ends the read with an error after the
    // answer: what was read is what counts.
    let _ = tls.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer)
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no answer to POST {path}"))
}

fn leader(url: &str, ca: &str, key: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = kiln(
            &["cluster", "status", "--url", url, "--ca-cert", ca],
            Some(key),
        );
        if o.status.success() {
            let status: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if let Some(id) = status["leader"].as_u64() {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "no leader: {}", text(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `kiln import` of `file` into database `shop` at `url` with `key`.
fn import(url: &str, ca: &str, key: &str, file: &Path) -> Output {
    let args = ["import", "--url", url, "--ca-cert", ca, "--db", "shop"];
    let args: Vec<&str> = args
        .into_iter()
        .chain([file.to_str().unwrap(), "--quiet"])
        .collect();
    kiln(&args, Some(key))
}

fn export(url: &str, ca: &str, key: &str, out: &Path) -> Option<String> {
    let o = kiln(
        &[
            "export",
            "--url",
            url,
            "--ca-cert",
            ca,
            "--db",
            "shop",
            "--quiet",
        ]
        .into_iter()
        .chain(["--out", out.to_str().unwrap()])
        .collect::<Vec<_>>(),
        Some(key),
    );
    o.status
        .success()
        .then(|| std::fs::read_to_string(out).unwrap())
}

#[test]
fn a_cluster_over_tls_with_auth_replicates_and_refuses_messages_without_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let ca = pki.ca.to_str().unwrap();
    let key_file = dir.path().join("cluster.key");
    std::fs::write(&key_file, format!("{CLUSTER_KEY}\n")).unwrap();
    let data: Vec<PathBuf> = (1..=3)
        .map(|id| dir.path().join(format!("node{id}")))
        .collect();
    // API keys live in each node's data directory (not replicated): the same
    // file on every node.
    std::fs::create_dir_all(&data[0]).unwrap();
    let o = kiln(
        &[
            "api-key",
            "create",
            "--data-dir",
            data[0].to_str().unwrap(),
            "--name",
            "app",
            "--operator",
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let api_key = String::from_utf8_lossy(&o.stdout).trim().to_string();
    for d in &data[1..] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::copy(data[0].join("api-keys.json"), d.join("api-keys.json")).unwrap();
    }
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let members = (1..=3)
        .map(|id| format!("{id}=127.0.0.1:{}", ports[id - 1]))
        .collect::<Vec<_>>()
        .join(",");
    let _nodes = Nodes(
        (1..=3)
            .map(|id| {
                start_node(
                    id as u64,
                    &data[id - 1],
                    ports[id - 1],
                    &members,
                    &pki,
                    &key_file,
                )
            })
            .collect(),
    );
    let url = |id: u64| format!("https://localhost:{}", ports[id as usize - 1]);

    // Writes through the leader, over https with the API key.
    let leader_id = leader(&url(1), ca, &api_key);
    let input = dir.path().join("in.ndjson");
    let lines: String = (0..200)
        .map(|i| format!("{{\"id\":\"u/{i:03}\",\"document\":{{\"n\":{i}}}}}\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let o = import(&url(leader_id), ca, &api_key, &input);
    assert!(o.status.success(), "import: {}", text(&o));
    let leader_export = export(
        &url(leader_id),
        ca,
        &api_key,
        &dir.path().join("leader.ndjson"),
    )
    .expect("export from the leader");
    assert_eq!(leader_export.lines().count(), 200);

    // ... reach every follower, which the leader reached over https with the key.
    for id in (1..=3).filter(|id| *id != leader_id) {
        let out = dir.path().join(format!("node{id}.ndjson"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if export(&url(id), ca, &api_key, &out).as_deref() == Some(leader_export.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not get the leader's documents"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    cluster_keys_reach_every_node(
        &url,
        ca,
        &api_key,
        (dir.path(), &data),
        leader_id,
        &leader_export,
    );

    // A Raft message needs the cluster's key (an API key is not it).
    let port = ports[0];
    let vote = "{}";
    assert_eq!(
        https_post(&pki.ca, port, "/cluster/raft/vote", &[], vote),
        401
    );
    let other_key = [("kiln-cluster-key", "0123456789abcdef0123456789abcdef")];
    assert_eq!(
        https_post(&pki.ca, port, "/cluster/raft/vote", &other_key, vote),
        401
    );
    let bearer = format!("Bearer {api_key}");
    let api = [("authorization", bearer.as_str())];
    assert_eq!(
        https_post(&pki.ca, port, "/cluster/raft/vote", &api, vote),
        401
    );
    // With the key, the message reaches Raft (which finds this one malformed).
    let right_key = [("kiln-cluster-key", CLUSTER_KEY)];
    assert_eq!(
        https_post(&pki.ca, port, "/cluster/raft/vote", &right_key, vote),
        400
    );

    // --auth without a cluster key: the node refuses to start.
    let lone = dir.path().join("lone");
    let o = kiln(
        &[
            "serve",
            "--auth",
            "--node-id",
            "1",
            "--cluster",
            "1=127.0.0.1:1",
        ]
        .into_iter()
        .chain(["--data-dir", lone.to_str().unwrap()])
        .collect::<Vec<_>>(),
        None,
    );
    assert!(!o.status.success());
    assert!(text(&o).contains("--cluster-key-file"), "{}", text(&o));
}

/// Retries `check` for up to 20 s (a follower applies the log a moment after the
/// leader answered).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A key made through a follower: read on every node, no write; listed by every
/// node; revoked through another follower, refused everywhere. Meanwhile the other
/// follower's key file is broken by hand when the key is made: that node waits
/// (its Raft does not stop), and applies the key once the file is mended.
fn cluster_keys_reach_every_node(
    url: &dyn Fn(u64) -> String,
    ca: &str,
    operator_key: &str,
    (dir, data): (&Path, &[PathBuf]),
    leader_id: u64,
    leader_export: &str,
) {
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader_id).collect();
    let broken = data[followers[1] as usize - 1].join("api-keys.json");
    let good = std::fs::read(&broken).unwrap();
    std::fs::write(&broken, b"{ an operator's edit gone wrong").unwrap();
    let o = kiln(
        &[
            "api-key",
            "create",
            "--url",
            &url(followers[0]),
            "--ca-cert",
            ca,
        ]
        .into_iter()
        .chain(["--name", "bi", "--db", "shop:read"])
        .collect::<Vec<_>>(),
        Some(operator_key),
    );
    assert!(o.status.success(), "api-key create --url: {}", text(&o));
    // The broken node tries to apply the key, waits, and leaves the file alone.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        std::fs::read(&broken).unwrap(),
        b"{ an operator's edit gone wrong"
    );
    std::fs::write(&broken, &good).unwrap();
    let bi_key = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let id = bi_key
        .strip_prefix("kiln_")
        .and_then(|rest| rest.split('_').next())
        .unwrap()
        .to_string();
    let out = dir.join("bi.ndjson");
    for node in 1..=3 {
        eventually(
            &format!("node {node} does not let the new key read"),
            || export(&url(node), ca, &bi_key, &out).as_deref() == Some(leader_export),
        );
        let o = kiln(
            &["api-key", "list", "--url", &url(node), "--ca-cert", ca],
            Some(operator_key),
        );
        assert!(o.status.success() && text(&o).contains(&id), "{}", text(&o));
    }
    // Read only: a write with it is refused (403: the leader's answer).
    let o = import(&url(leader_id), ca, &bi_key, &out);
    assert!(
        !o.status.success() && text(&o).contains("403"),
        "{}",
        text(&o)
    );
    // Revoked through the other follower: out of every node.
    let o = kiln(
        &[
            "api-key",
            "revoke",
            "--url",
            &url(followers[1]),
            "--ca-cert",
            ca,
            &id,
        ],
        Some(operator_key),
    );
    assert!(o.status.success(), "api-key revoke --url: {}", text(&o));
    for node in 1..=3 {
        eventually(
            &format!("node {node} still lets the revoked key in"),
            || export(&url(node), ca, &bi_key, &out).is_none(),
        );
    }
    // The operator's key (copied to every node before the start) still works.
    assert!(export(&url(followers[1]), ca, operator_key, &out).is_some());
}
