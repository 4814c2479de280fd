//! The server workloads (W8: PUT per request, W9: GET) for `kiln serve` and its peer
//! Redis. Both sides are driven by `kiln bench` (its Redis peer: a throwaway
//! redis-server with `appendfsync always`, loaded by redis-benchmark), one job per
//! engine and run like every other row, so the table gets a Redis column for W8/W9.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const WORKLOADS: &[&str] = &["W8", "W9"];

/// The `kiln` binary: `KILN_BIN`, or the repository's release build (built here with
/// cargo when it is not there yet).
pub fn kiln_binary() -> Result<PathBuf> {
    if let Ok(bin) = std::env::var("KILN_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| anyhow!("bench/ has no parent directory"))?
        .to_path_buf();
    let bin = repo.join("target/release/kiln");
    if !bin.exists() {
        eprintln!(
            "kiln-bench: building the kiln binary for W8/W9 (cargo build --release -p kiln-cli)"
        );
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-p", "kiln-cli", "--bin", "kiln"])
            .current_dir(&repo)
            .status()
            .context("running cargo to build kiln")?;
        if !status.success() {
            bail!("building kiln failed ({status})");
        }
    }
    Ok(bin)
}

/// Whether redis-server and redis-benchmark are installed (None) or why not.
pub fn redis_missing() -> Option<String> {
    for bin in ["redis-server", "redis-benchmark"] {
        let ok = Command::new(bin)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            return Some(format!(
                "skipped: {bin} is not installed (apt-get install -y redis-server)"
            ));
        }
    }
    None
}

/// One run of W8 or W9 for `engine` (kiln or redis), as a child's JSON object.
pub fn run(engine: &str, workload: &str, dir: &Path, quick: bool) -> Result<Value> {
    let bin = kiln_binary()?;
    let mut cmd = Command::new(&bin);
    cmd.args(["bench", "--workloads", workload, "--runs", "1", "--json"])
        .arg("--dir")
        .arg(dir)
        .arg(if engine == "redis" {
            "--redis-only"
        } else {
            "--no-redis"
        });
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {} bench", bin.display()))?;
    if !out.status.success() {
        let last = crate::last_line(&out.stderr);
        bail!(
            "kiln bench {workload} exited with {}: {}",
            out.status,
            last.trim()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    // W9 prints a GET line (and for Kiln a 304 line): the GET is the compared row.
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("kiln bench printed no JSON line"))?;
    let v: Value = serde_json::from_str(line)?;
    let per_sec = v["ops_per_sec"]
        .as_f64()
        .ok_or_else(|| anyhow!("kiln bench's answer has no ops_per_sec: {line}"))?;
    let row = match workload {
        "W8" => "W8 durable writes (PUT / SET)",
        _ => "W9 reads (GET)",
    };
    Ok(json!({
        "seconds": v["seconds"],
        "rows": [{ "row": row, "unit": "requests/s", "value": per_sec, "lower_is_better": false }],
        "extra": v,
    }))
}
