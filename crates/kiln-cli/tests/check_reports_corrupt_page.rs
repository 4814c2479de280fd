//! `kiln check` exits 0 on a healthy environment and 1 on a damaged one, naming the
//! file and the page; `kiln stats` and the put/get quick start work end to end.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn check_finds_a_flipped_byte_and_names_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for i in 0..20 {
        let o = kiln(&[
            "kv",
            "put",
            "--dir",
            d,
            "users",
            &format!("user{i:03}"),
            &format!("{{\"n\":{i}}}"),
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = kiln(&["kv", "get", "--dir", d, "users", "user007"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "{\"n\":7}");
    let o = kiln(&["check", d]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("no problems"), "{}", text(&o));
    let o = kiln(&["stats", d, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let stats: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(stats["pages_in_use"].as_u64().unwrap() >= 2, "{stats}");

    // Damage the catalog's root page, named by the newer header copy (sequence at
    // offset 16, catalog root at offset 32; see docs/design/storage.md §2).
    let path = dir.path().join("data.kiln");
    let mut bytes = std::fs::read(&path).unwrap();
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let newer = if u64_at(&bytes, 16) > u64_at(&bytes, 8192 + 16) {
        0
    } else {
        8192
    };
    let page = u64_at(&bytes, newer + 32) as usize;
    assert!(page >= 2, "catalog root {page}");
    bytes[page * 8192 + 5000] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let o = kiln(&["check", d]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains(&format!("page {page}")),
        "should name page {page}: {out}"
    );
    assert!(out.contains("data.kiln"), "should name the file: {out}");
    assert!(out.contains("checksum"), "should say what is wrong: {out}");
}

#[test]
fn check_on_a_directory_without_an_environment_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = kiln(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("neither a data directory"),
        "{}",
        text(&o)
    );
}
