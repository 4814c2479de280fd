//! `kiln bench` refuses an unknown workload or a bad setting before it measures or
//! prints anything, or makes its directory: exit code 2, the known workloads named.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::process::{Command, Output};

fn kiln_bench(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("bench")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .expect("run kiln")
}

#[test]
fn an_unknown_workload_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    let o = kiln_bench(&dir, &["--workloads", "W1,W5", "--quick"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(
        err.contains("unknown workload \"W5\" (available: W1, W2, W3, W4, W6, W7, W8,"),
        "{err}"
    );
    assert!(!dir.exists());
}

#[test]
fn a_bad_engine_setting_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    let o = kiln_bench(&dir, &["--workloads", "W1", "--write-back-window-mib", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(err.contains("write_back_window_bytes"), "{err}");
    assert!(!dir.exists());
}
