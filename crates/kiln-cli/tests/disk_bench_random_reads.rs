//! `kiln disk-bench --random-reads-only`: random 4 and 8 KiB O_DIRECT reads at queue
//! depth 1, 16 and 64 over a file of incompressible data; one JSON row each plus the
//! summary's `random_read_*` fields, the file removed afterwards; a file length that is
//! 0 or not a multiple of 8 KiB is refused as a usage error. (That every offset read
//! is aligned and inside the file is the unit test of kiln-bench's `OffsetGen`; a
//! read past the end would fail the run here.)
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use serde_json::Value;
use std::path::Path;
use std::process::Output;

mod common;
use common::{kiln, text};

const FILE_BYTES: u64 = 4 << 20;

/// A short random-reads-only run in `dir`, `json` or the table.
fn random_reads(dir: &Path, json: bool) -> Output {
    let bytes = FILE_BYTES.to_string();
    let mut args = vec![
        "disk-bench",
        "--random-reads-only",
        "--quick",
        "--dir",
        dir.to_str().unwrap(),
        "--random-read-file-bytes",
        &bytes,
        "--max-seconds-per-test",
        "0.1",
    ];
    if json {
        args.push("--json");
    }
    let o = kiln(&args);
    assert!(o.status.success(), "{}", text(&o));
    o
}

fn check_row(r: &Value) {
    for f in [
        "reads",
        "seconds",
        "reads_per_sec",
        "mb_per_sec",
        "p50_ms",
        "p99_ms",
    ] {
        assert!(r[f].as_f64().unwrap() > 0.0, "{f}: {r}");
    }
    assert!(r["p50_ms"].as_f64() <= r["p99_ms"].as_f64(), "{r}");
    assert!(r["reads"].as_u64() <= r["max_reads"].as_u64(), "{r}");
    assert_eq!(r["file_bytes"], FILE_BYTES, "{r}");
    assert!(r["direct_io"].is_boolean(), "{r}");
    if r["direct_io_refused"] == true {
        assert_eq!(r["direct_io"], false, "{r}");
    }
}

#[test]
fn random_reads_only_json_has_six_rows_and_the_summary_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("not-yet-there");
    let o = random_reads(&dir, true);
    let out: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert_eq!(out.len(), 7, "{out:?}");
    let (rows, s) = (&out[..6], &out[6]);
    assert_eq!(s["test"], "summary", "{s}");
    let mut seen = Vec::new();
    for r in rows {
        assert_eq!(r["test"], "random_read", "{r}");
        check_row(r);
        seen.push((
            r["read_size_bytes"].as_u64().unwrap(),
            r["queue_depth"].as_u64().unwrap(),
        ));
    }
    let want: Vec<(u64, u64)> = [4096, 8192]
        .into_iter()
        .flat_map(|s| [1, 16, 64].map(|q| (s, q)))
        .collect();
    assert_eq!(seen, want);

    assert_eq!(s["random_reads_only"], true, "{s}");
    assert_eq!(s["random_read_file_bytes"], FILE_BYTES, "{s}");
    assert_eq!(s["page_size_bytes"], 8192, "{s}");
    let per_sec = s["random_read_per_sec"].as_object().unwrap();
    assert_eq!(per_sec.len(), 6, "{s}");
    for (key, size, depth) in [
        ("4k_qd16", 4096, 16),
        ("8k_qd16", 8192, 16),
        ("8k_qd64", 8192, 64),
    ] {
        let row = rows
            .iter()
            .find(|r| r["read_size_bytes"] == size && r["queue_depth"] == depth)
            .unwrap();
        assert_eq!(per_sec[key], row["reads_per_sec"], "{key}: {s}");
    }
    assert_eq!(s["random_read_4k_qd16_per_sec"], per_sec["4k_qd16"], "{s}");
    assert_eq!(s["random_read_8k_qd16_per_sec"], per_sec["8k_qd16"], "{s}");
    let notes: Vec<&str> = s["interpretation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|l| l.contains("at 16 concurrent readers")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|l| l.starts_with("random 4 KiB reads/s")),
        "{notes:?}"
    );

    assert!(!dir.exists(), "the directory it created should be gone");
}

#[test]
fn random_reads_only_table_prints_the_rows_and_the_point_read_line() {
    let tmp = tempfile::tempdir().unwrap();
    let o = random_reads(tmp.path(), false);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("random reads: pread at uniformly random offsets"),
        "{out}"
    );
    assert!(
        out.contains("a point read past RAM costs at least one random read"),
        "{out}"
    );
    assert!(!out.contains("journal modes"), "no write rows: {out}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "{out}");
}

#[test]
fn a_random_read_file_of_zero_or_not_whole_pages_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    for bad in ["0", "12345", "4096"] {
        let o = kiln(&[
            "disk-bench",
            "--random-reads-only",
            "--dir",
            dir.to_str().unwrap(),
            "--random-read-file-bytes",
            bad,
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--random-read-file-bytes must be a positive multiple of 8192"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(o.stdout.is_empty(), "{}", text(&o));
        assert!(!dir.exists());
    }
}
