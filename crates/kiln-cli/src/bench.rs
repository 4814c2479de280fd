//! `kiln bench`: workloads of shared/BENCHMARKS.md run against Kiln, beside the raw
//! disk measured in the same run.

use crate::rawdisk;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_storage::{Env, Options};
use rand::{rngs::SmallRng, Rng, RngCore, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Comma-separated workload ids (W1, W4).
    #[arg(long, default_value = "W1,W4")]
    workloads: String,
    /// Directory to run in (a fresh subdirectory per run, removed afterwards).
    #[arg(long, default_value = "./kiln-bench")]
    dir: PathBuf,
    /// One JSON object per line on stdout.
    #[arg(long)]
    json: bool,
    /// About a tenth of the full scale, for smoke runs.
    #[arg(long)]
    quick: bool,
    /// Runs per workload (the median is reported); workloads over 10 s run once.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

const SEED: u64 = 0x4B494C4E;

struct RunResult {
    ops: u64,
    commits: u64,
    seconds: f64,
    journal_bytes: u64,
    journal_p99_us: u64,
    journal_mean_us: f64,
}

fn progress(len: u64, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

fn fresh_env(dir: &Path) -> Result<Env, Box<dyn std::error::Error>> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(Env::open(dir, Options::default())?)
}

/// W1: 65,536 transactions, each one 16 KiB random value under a sequential 8-byte key.
fn w1(dir: &Path, quick: bool) -> Result<RunResult, Box<dyn std::error::Error>> {
    let n: u64 = if quick { 4096 } else { 65_536 };
    let env = fresh_env(dir)?;
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut value = vec![0u8; 16 * 1024];
    let mut w = env.begin_write()?;
    w.create_tree("w1")?;
    w.commit()?;
    let pb = progress(n, "W1");
    let start = Instant::now();
    for i in 0..n {
        rng.fill_bytes(&mut value);
        let mut w = env.begin_write()?;
        w.put("w1", &i.to_be_bytes(), &value)?;
        w.commit()?;
        if i % 256 == 0 {
            pb.set_position(i);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let s = env.stats();
    env.close()?;
    Ok(RunResult {
        ops: n,
        commits: n,
        seconds,
        journal_bytes: s.journal_bytes,
        journal_p99_us: s.journal_write_latency.p99_us,
        journal_mean_us: s.journal_write_latency.mean_us,
    })
}

/// W4: 10,000 durable transactions x 100 random puts (16-byte keys, 100-byte values).
fn w4(dir: &Path, quick: bool) -> Result<RunResult, Box<dyn std::error::Error>> {
    let txns: u64 = if quick { 1000 } else { 10_000 };
    let per_txn = 100;
    let env = fresh_env(dir)?;
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut w = env.begin_write()?;
    w.create_tree("w4")?;
    w.commit()?;
    let mut key = [0u8; 16];
    let mut value = [0u8; 100];
    let pb = progress(txns, "W4");
    let start = Instant::now();
    for t in 0..txns {
        let mut w = env.begin_write()?;
        for _ in 0..per_txn {
            rng.fill(&mut key);
            rng.fill_bytes(&mut value);
            w.put("w4", &key, &value)?;
        }
        w.commit()?;
        if t % 64 == 0 {
            pb.set_position(t);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let s = env.stats();
    env.close()?;
    Ok(RunResult {
        ops: txns * per_txn,
        commits: txns,
        seconds,
        journal_bytes: s.journal_bytes,
        journal_p99_us: s.journal_write_latency.p99_us,
        journal_mean_us: s.journal_write_latency.mean_us,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&args.dir)?;
    let raw_writes = if args.quick { 1024 } else { 4096 };
    let raw: Vec<rawdisk::RawDiskResult> = (0..3)
        .map(|_| rawdisk::durable_writes(&args.dir, 16 * 1024, raw_writes))
        .collect::<Result<_, _>>()?;
    let raw_ms = median(raw.iter().map(|r| r.mean_ms).collect());
    let raw_direct = raw.iter().all(|r| r.direct_io);
    if !args.json {
        println!(
            "raw disk: 16 KiB {} write: {raw_ms:.3} ms/write (mean; p50 {:.3}, p99 {:.3}), dir {}",
            if raw_direct {
                "O_DIRECT|O_DSYNC"
            } else {
                "pwrite+fdatasync (O_DIRECT refused)"
            },
            raw[0].p50_ms,
            raw[0].p99_ms,
            args.dir.display()
        );
        println!(
            "{:<4} {:>6} {:>12} {:>10} {:>12} {:>14} {:>13} {:>13}",
            "wl",
            "runs",
            "ops/s",
            "ms/commit",
            "x raw write",
            "journal B/op",
            "jrnl mean us",
            "jrnl p99 us"
        );
    }
    for wl in args
        .workloads
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
    {
        let f: fn(&Path, bool) -> Result<RunResult, Box<dyn std::error::Error>> =
            match wl.to_ascii_uppercase().as_str() {
                "W1" => w1,
                "W4" => w4,
                other => {
                    return Err(format!(
                        "unknown or not yet implemented workload {other:?} (available: W1, W4)"
                    )
                    .into())
                }
            };
        let run_dir = args.dir.join(format!("{wl}-run"));
        let mut results = Vec::new();
        for i in 0..args.runs.max(1) {
            let r = f(&run_dir, args.quick)?;
            let long = r.seconds > 10.0;
            results.push(r);
            if long && i == 0 {
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&run_dir);
        results.sort_by(|a, b| (a.ops as f64 / a.seconds).total_cmp(&(b.ops as f64 / b.seconds)));
        let m = &results[results.len() / 2];
        let ops_per_sec = m.ops as f64 / m.seconds;
        let ms_per_commit = m.seconds * 1e3 / m.commits as f64;
        let bytes_per_op = m.journal_bytes as f64 / m.ops as f64;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "workload": wl, "runs": results.len(), "ops": m.ops, "commits": m.commits,
                    "seconds": m.seconds, "ops_per_sec": ops_per_sec, "ms_per_commit": ms_per_commit,
                    "raw_disk_ms_per_write": raw_ms, "raw_disk_direct_io": raw_direct,
                    "ratio_to_raw_write": ms_per_commit / raw_ms, "journal_bytes_per_op": bytes_per_op,
                    "journal_write_p99_us": m.journal_p99_us, "journal_write_mean_us": m.journal_mean_us, "quick": args.quick,
                })
            );
        } else {
            println!(
                "{:<4} {:>6} {:>12.0} {:>10.3} {:>12.2} {:>14.0} {:>13.0} {:>13}",
                wl,
                results.len(),
                ops_per_sec,
                ms_per_commit,
                ms_per_commit / raw_ms,
                bytes_per_op,
                m.journal_mean_us,
                m.journal_p99_us
            );
        }
    }
    Ok(())
}
