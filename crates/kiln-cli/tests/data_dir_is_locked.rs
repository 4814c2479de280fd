//! One process at a time owns a data directory: a second `kiln serve`, an offline
//! `kiln restore --data-dir` and `kiln put` on a running server's directory are
//! refused, naming the server's process, and the server goes on unharmed.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::{kiln, request, text};

#[test]
fn a_running_servers_data_directory_is_refused_to_every_other_process() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let port = common::free_port();
    let mut server = common::spawn_serve(dir.path(), port);
    let holder = format!("process {}", server.id());

    let second_port = common::free_port().to_string();
    let o = kiln(&[
        "serve",
        "--data-dir",
        d,
        "--bind",
        &format!("127.0.0.1:{second_port}"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("in use by") && err.contains(&holder), "{err}");
    assert!(
        !err.contains("kiln serving"),
        "a server that did not start must not say it serves: {err}"
    );

    // A backup to restore from: taken over HTTP from the running server.
    let url = format!("http://127.0.0.1:{port}");
    let backup = dir.path().join("b.kbk");
    let (status, made) = request(port, "PUT", "/dbs/shop", "");
    assert_eq!(status, 201, "{made}");
    let o = kiln(&[
        "backup",
        "--url",
        &url,
        "--db",
        "shop",
        "--out",
        backup.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = kiln(&[
        "restore",
        "--data-dir",
        d,
        "--db",
        "copy",
        backup.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&holder) && err.contains("--url"),
        "the refusal names the holder and points to --url: {err}"
    );
    assert!(
        !dir.path().join("databases/copy").exists(),
        "nothing restored behind the server's back"
    );
    let o = kiln(&["put", "--data-dir", d, "shop", "a", "{}"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    // The server is unharmed: the database it made is still there.
    let (_, listed) = request(port, "GET", "/dbs", "");
    assert!(listed.contains("shop"), "{listed}");
    server.kill().unwrap();
    server.wait().unwrap();

    // Once it is gone (even by SIGKILL: the kernel drops the lock) the directory
    // is free again.
    let o = kiln(&[
        "restore",
        "--data-dir",
        d,
        "--db",
        "copy",
        backup.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}
