//! `kiln put/get/list` on a data directory, `kiln check` over all its databases, and
//! `kiln api-key` round trips.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn put_get_list_check_on_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = kiln(&[
        "put",
        "--data-dir",
        d,
        "--journal-file-size-mib",
        "2",
        "shop",
        "users/ada",
        r#"{"name":"Ada"}"#,
    ]);
    assert!(o.status.success(), "{o:?}");
    // The database it created journals into files of the size asked for.
    let journal_dir = dir.path().join("databases/shop/journal");
    let sizes: Vec<u64> = std::fs::read_dir(&journal_dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .collect();
    assert!(!sizes.is_empty(), "no journal file in {journal_dir:?}");
    assert!(sizes.iter().all(|&len| len == 2 << 20), "{sizes:?}");
    let put: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(put["id"], "users/ada");
    assert_eq!(put["created"], true);
    let o = kiln(&[
        "put",
        "--data-dir",
        d,
        "shop",
        "users/",
        r#"{"name":"Bob"}"#,
    ]);
    let generated: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(generated["id"].as_str().unwrap().starts_with("users/"));

    let o = kiln(&["get", "--data-dir", d, "shop", "users/ada"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["name"], "Ada");
    assert_eq!(doc["@metadata"]["@etag"], put["etag"]);
    let o = kiln(&["get", "--data-dir", d, "shop", "users/nobody"]);
    assert_eq!(o.status.code(), Some(4), "not found");
    let o = kiln(&["get", "--data-dir", d, "nodb", "x"]);
    assert_eq!(o.status.code(), Some(4), "a missing database is not found");

    let o = kiln(&["list", "--data-dir", d, "shop", "--prefix", "users/"]);
    assert_eq!(out(&o).lines().count(), 2, "{}", out(&o));

    let o = kiln(&["put", "--data-dir", d, "shop", "bad", "{not json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a runtime error, not a usage error"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("line 1"),
        "{o:?}"
    );

    let o = kiln(&["check", d]);
    assert!(o.status.success(), "{o:?}");
    assert!(out(&o).contains("database shop:"), "{}", out(&o));
    assert!(out(&o).contains("no problems"), "{}", out(&o));
}

#[test]
fn api_keys_are_created_listed_and_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = kiln(&[
        "api-key",
        "create",
        "--data-dir",
        d,
        "--name",
        "ci",
        "--operator",
    ]);
    assert!(o.status.success(), "{o:?}");
    let key = out(&o).trim().to_string();
    assert!(key.starts_with("kiln_"), "{key}");
    let id = key.split('_').nth(1).unwrap().to_string();
    let listed = out(&kiln(&["api-key", "list", "--data-dir", d]));
    assert!(listed.contains(&id) && listed.contains("ci"), "{listed}");
    assert!(
        !listed.contains(key.rsplit('_').next().unwrap()),
        "secrets are never listed"
    );
    assert!(listed.contains("\tkey\toperator\t"), "{listed}");
    // Grants: a name and a pattern; the list shows them.
    let o = kiln(&[
        "api-key",
        "create",
        "--data-dir",
        d,
        "--name",
        "shop",
        "--db",
        "shop:read_write",
        "--db",
        "reports-*:read",
    ]);
    assert!(o.status.success(), "{o:?}");
    let listed = out(&kiln(&["api-key", "list", "--data-dir", d]));
    assert!(
        listed.contains("shop:read_write, reports-*:read"),
        "{listed}"
    );
    // Neither --operator nor --db, both, or a bad grant: a usage error (2), no key.
    for bad in [
        vec!["--name", "x"],
        vec!["--name", "x", "--operator", "--db", "shop:read"],
        vec!["--name", "x", "--db", "shop:write"],
        vec!["--name", "x", "--db", "Shop:read"],
    ] {
        let mut args = vec!["api-key", "create", "--data-dir", d];
        args.extend(bad.iter().copied());
        let o = kiln(&args);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {o:?}");
        assert!(out(&o).is_empty(), "{bad:?} printed a key");
    }
    assert!(kiln(&["api-key", "revoke", "--data-dir", d, &id])
        .status
        .success());
    assert!(!out(&kiln(&["api-key", "list", "--data-dir", d])).contains(&id));
    assert_eq!(
        kiln(&["api-key", "revoke", "--data-dir", d, &id])
            .status
            .code(),
        Some(1),
        "revoking an unknown key is a runtime error"
    );
}

mod common;

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path);
            }
        }
    }
    found
}

/// `kiln encryption new-key`, then a data directory written with the key: nothing
/// of the document is on disk in clear, the offline commands and the server need the
/// key (a missing or wrong one is a clear error), and `rotate-key` moves every
/// database to a new key without touching the data.
#[test]
fn an_encrypted_data_directory_end_to_end() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = data.to_str().unwrap();
    let key = dir.path().join("master.key");
    let key2 = dir.path().join("new.key");
    let (k, k2) = (key.to_str().unwrap(), key2.to_str().unwrap());
    for path in [k, k2] {
        let o = kiln(&["encryption", "new-key", "--out", path]);
        assert!(o.status.success(), "{o:?}");
    }
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "key file mode {mode:o}");
    // An existing key file is never overwritten.
    assert!(!kiln(&["encryption", "new-key", "--out", k])
        .status
        .success());

    let doc = r#"{"name":"ENCRYPTION-MARKER-7f3a"}"#;
    let o = kiln(&[
        "put",
        "--data-dir",
        d,
        "--encryption-key-file",
        k,
        "shop",
        "users/ada",
        doc,
    ]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        files_containing(&data, b"ENCRYPTION-MARKER-7f3a"),
        Vec::<std::path::PathBuf>::new()
    );

    let get = |key: Option<&str>| {
        let mut args = vec!["get", "--data-dir", d, "shop", "users/ada"];
        if let Some(k) = key {
            args.extend(["--encryption-key-file", k]);
        }
        kiln(&args)
    };
    let o = get(Some(k));
    assert!(
        o.status.success() && out(&o).contains("ENCRYPTION-MARKER-7f3a"),
        "{o:?}"
    );
    let o = get(None);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success() && err.contains("encrypted"), "{err}");
    let o = get(Some(k2));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success() && err.contains("wrong encryption key"),
        "{err}"
    );
    let o = kiln(&["check", d, "--encryption-key-file", k]);
    assert!(o.status.success(), "{o:?}");

    let o = kiln(&[
        "encryption",
        "status",
        "--data-dir",
        d,
        "--encryption-key-file",
        k,
        "--json",
    ]);
    assert!(o.status.success(), "{o:?}");
    let line: serde_json::Value = serde_json::from_str(out(&o).lines().next().unwrap()).unwrap();
    assert_eq!(line["encrypted"], true, "{line}");
    assert_eq!(line["key_opens"], true, "{line}");

    // A backup taken under the first key (sealed under it).
    let backup = dir.path().join("shop.kbak");
    let b = backup.to_str().unwrap();
    let o = kiln(&[
        "backup",
        "--data-dir",
        d,
        "--db",
        "shop",
        "--out",
        b,
        "--encryption-key-file",
        k,
    ]);
    assert!(o.status.success(), "{o:?}");

    // Rotation: the old key stops working, the new one opens the same data; a
    // second run finds nothing left to do.
    let rotate = || {
        kiln(&[
            "encryption",
            "rotate-key",
            "--data-dir",
            d,
            "--encryption-key-file",
            k,
            "--new-key-file",
            k2,
            "--json",
        ])
    };
    let o = rotate();
    assert!(o.status.success(), "{o:?}");
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["rotated"], 1, "{summary}");
    assert!(!get(Some(k)).status.success());
    let o = get(Some(k2));
    assert!(
        o.status.success() && out(&o).contains("ENCRYPTION-MARKER-7f3a"),
        "{o:?}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&rotate().stdout).unwrap();
    assert_eq!(
        (
            summary["rotated"].clone(),
            summary["already_under_new_key"].clone()
        ),
        (0.into(), 1.into()),
        "{summary}"
    );

    // The backup from before the rotation needs its own key to be read: given with
    // --backup-key-file, it restores into the directory under the new key.
    let restore = |extra: &[&str]| {
        let mut args = vec![
            "restore",
            b,
            "--data-dir",
            d,
            "--db",
            "shop3",
            "--encryption-key-file",
            k2,
        ];
        args.extend_from_slice(extra);
        kiln(&args)
    };
    let o = restore(&[]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success() && err.contains("wrong encryption key"),
        "{err}"
    );
    let o = restore(&["--backup-key-file", k]);
    assert!(o.status.success(), "{o:?}");
    let o = kiln(&[
        "get",
        "--data-dir",
        d,
        "shop3",
        "users/ada",
        "--encryption-key-file",
        k2,
    ]);
    assert!(
        o.status.success() && out(&o).contains("ENCRYPTION-MARKER-7f3a"),
        "{o:?}"
    );
    assert_eq!(
        files_containing(&data, b"ENCRYPTION-MARKER-7f3a"),
        Vec::<std::path::PathBuf>::new()
    );

    // The server: without the key it refuses to start, naming the problem; with
    // it, it serves the document.
    let o = kiln(&["serve", "--data-dir", d, "--bind", "127.0.0.1:0"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success() && err.contains("encrypted"), "{err}");
    let port = common::free_port();
    let mut server = common::spawn_serve_with(&data, port, &["--encryption-key-file", k2]);
    let (status, body) = common::request(port, "GET", "/dbs/shop/docs/users/ada", "");
    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("ENCRYPTION-MARKER-7f3a"), "{body}");
}
