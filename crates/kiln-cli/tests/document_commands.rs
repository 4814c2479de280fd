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
