//! Records the versions of the engines' crates from Cargo.lock, for the results file.

use std::fmt::Write as _;

const CRATES: &[&str] = &[
    "kiln-storage",
    "rusqlite",
    "libsqlite3-sys",
    "heed",
    "lmdb-master-sys",
    "redb",
    "fjall",
    "rocksdb",
    "librocksdb-sys",
    "postgres",
    "tokio-postgres",
];

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let lock_path = std::path::Path::new(&dir).join("Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock_path.display());
    println!("cargo:rerun-if-changed=build.rs");
    let lock = std::fs::read_to_string(&lock_path).unwrap_or_default();
    let mut found: Vec<(String, String)> = Vec::new();
    let mut name: Option<String> = None;
    for line in lock.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            name = None;
        } else if let Some(v) = line.strip_prefix("name = ") {
            name = Some(v.trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("version = ") {
            if let Some(n) = name.take() {
                if CRATES.contains(&n.as_str()) {
                    found.push((n, v.trim_matches('"').to_string()));
                }
            }
        }
    }
    // The RocksDB actually linked: Debian's shared library, not the headers'
    // version that librocksdb-sys carries in its own version string.
    println!("cargo:rerun-if-env-changed=ROCKSDB_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_ROCKSDB").is_some() {
        if let Some(dir) = std::env::var_os("ROCKSDB_LIB_DIR") {
            let so = std::path::Path::new(&dir).join("librocksdb.so");
            if let Ok(real) = std::fs::canonicalize(&so) {
                let name = real.file_name().unwrap_or_default().to_string_lossy();
                if let Some(v) = name.strip_prefix("librocksdb.so.") {
                    found.push(("librocksdb (linked, system)".into(), v.to_string()));
                }
            }
        }
    }
    let mut out = String::from("pub const CRATE_VERSIONS: &[(&str, &str)] = &[\n");
    for (n, v) in &found {
        writeln!(out, "    ({n:?}, {v:?}),").unwrap();
    }
    out.push_str("];\n");
    let out_dir = std::env::var("OUT_DIR").unwrap();
    std::fs::write(std::path::Path::new(&out_dir).join("versions.rs"), out).unwrap();
}
