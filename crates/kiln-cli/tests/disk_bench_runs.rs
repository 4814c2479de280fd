//! `kiln disk-bench --quick --json` measures every mode, prints one JSON row for each
//! plus a summary, and leaves nothing behind; it refuses to start without free space.
//! (The random-read rows, here with a small file, have their own tests in
//! disk_bench_random_reads.rs.)
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use serde_json::Value;
use std::path::Path;

mod common;
use common::{kiln, text};

fn quick_json(dir: &Path, seconds: &str) -> Vec<Value> {
    let o = kiln(&[
        "disk-bench",
        "--quick",
        "--json",
        "--dir",
        dir.to_str().unwrap(),
        "--max-seconds-per-test",
        seconds,
        "--random-read-file-bytes",
        "8388608",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn quick_json_run_reports_every_mode_and_removes_what_it_made() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("not-yet-there");
    let out = quick_json(&dir, "0.2");

    let (summary, rows): (Vec<&Value>, Vec<&Value>) =
        out.iter().partition(|v| v["test"] == "summary");
    let (read_rows, rows): (Vec<&Value>, Vec<&Value>) =
        rows.into_iter().partition(|v| v["test"] == "random_read");
    assert_eq!(read_rows.len(), 6, "{read_rows:?}");
    assert!(
        out[..rows.len()].iter().all(|r| r["test"] != "random_read"),
        "writes first"
    );
    assert_eq!(summary.len(), 1, "{out:?}");
    assert_eq!(out.last().unwrap()["test"], "summary");
    let s = summary[0];
    assert!(s["cores"].as_u64().unwrap() >= 1, "{s}");
    assert!(!s["kernel"].as_str().unwrap().is_empty(), "{s}");
    assert!(s["fs_type"].is_string(), "{s}");
    assert!(!s["interpretation"].as_array().unwrap().is_empty(), "{s}");

    let has = |test: &str, mode: &str, size: u64, writers: u64, prealloc: &str| {
        rows.iter().any(|r| {
            r["test"] == test
                && r["mode"] == mode
                && r["write_size_bytes"] == size
                && r["writers"] == writers
                && r["prealloc"] == prealloc
        })
    };
    for mode in [
        "buffered",
        "buffered+fsync",
        "buffered+fdatasync",
        "O_DSYNC",
        "O_DIRECT",
        "O_DIRECT|O_DSYNC",
    ] {
        assert!(
            has("journal_mode", mode, 16384, 1, "zero-filled"),
            "{mode}: {rows:?}"
        );
    }
    for size in [4096, 16384, 65536, 1 << 20] {
        assert!(
            has("single_stream", "O_DIRECT|O_DSYNC", size, 1, "zero-filled"),
            "{size}: {rows:?}"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r["test"] == "single_stream" && r["prealloc"] != "zero-filled"),
        "{rows:?}"
    );
    for writers in [1, 4, 8] {
        assert!(
            has(
                "concurrent",
                "O_DIRECT|O_DSYNC",
                16384,
                writers,
                "zero-filled"
            ),
            "{writers}: {rows:?}"
        );
    }
    for pairing in ["value_then_record", "both_at_once"] {
        assert!(
            rows.iter().any(|r| r["test"] == "value_beside_record"
                && r["pairing"] == pairing
                && r["write_size_bytes"] == 16384
                && r["durable"] == true),
            "{pairing}: {rows:?}"
        );
    }
    assert!(
        s["interpretation"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("beside a 4 KiB record")),
        "{s}"
    );
    assert_eq!(rows.len(), 6 + 5 + 3 + 2, "{rows:?}");
    for r in &rows {
        for f in [
            "writes",
            "seconds",
            "writes_per_sec",
            "mb_per_sec",
            "p50_ms",
            "p99_ms",
        ] {
            assert!(r[f].as_f64().unwrap() > 0.0, "{f}: {r}");
        }
        assert!(r["p50_ms"].as_f64() <= r["p99_ms"].as_f64(), "{r}");
        assert!(r["writes"].as_u64() <= r["max_writes"].as_u64(), "{r}");
        assert!(r["direct_io"].is_boolean(), "{r}");
        if r["direct_io_refused"] == true {
            assert_eq!(r["direct_io"], false, "{r}");
        }
    }

    assert!(!dir.exists(), "the directory it created should be gone");
    assert!(names(tmp.path()).is_empty(), "{:?}", names(tmp.path()));
}

#[test]
fn an_existing_directory_is_kept_with_only_what_was_there() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("keep.txt"), b"mine").unwrap();
    let out = quick_json(tmp.path(), "0.05");
    assert_eq!(out.len(), 6 + 5 + 3 + 2 + 6 + 1);
    assert_eq!(names(tmp.path()), ["keep.txt"]);
}

#[test]
fn refuses_to_run_without_room_and_makes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let o = kiln(&[
        "disk-bench",
        "--quick",
        "--dir",
        dir.to_str().unwrap(),
        "--margin-bytes",
        &u64::MAX.to_string(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not enough free space"), "{err}");
    assert!(err.contains(tmp.path().to_str().unwrap()), "{err}");
    assert!(o.stdout.is_empty(), "{}", text(&o));
    assert!(!dir.exists());
}
