//! `kiln`: the command-line tool.

mod bench;
mod diskbench;
mod rawdisk;

use clap::{Parser, Subcommand};
use kiln_storage::{Env, Options};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Kiln: a durable transactional storage engine and document database"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Store a value (creates the environment and the tree if needed).
    Put {
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        tree: String,
        key: String,
        value: String,
    },
    /// Print a value.
    Get {
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        tree: String,
        key: String,
    },
    /// List keys and values of a tree in order (or in reverse).
    Scan {
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        tree: String,
        /// Start at the first key >= this one.
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        reverse: bool,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Walk every tree and page; exit code 1 if anything is wrong.
    Check {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the engine's figures for an environment.
    Stats {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Run benchmark workloads from shared/BENCHMARKS.md against Kiln and the raw disk.
    Bench(bench::BenchArgs),
    /// Measure what the disk itself does: sequential writes in every journal mode,
    /// durable writes by size, concurrent durable writers; tells a slow or lying disk
    /// from a slow database.
    DiskBench(diskbench::DiskBenchArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn run(cmd: Command) -> AnyResult<ExitCode> {
    match cmd {
        Command::Put {
            data_dir,
            tree,
            key,
            value,
        } => {
            let env = Env::open(&data_dir, Options::default())?;
            let mut w = env.begin_write()?;
            w.ensure_tree(&tree)?;
            w.put(&tree, key.as_bytes(), value.as_bytes())?;
            let txn = w.commit()?;
            env.close()?;
            println!("committed txn {txn}");
        }
        Command::Get {
            data_dir,
            tree,
            key,
        } => {
            let env = Env::open(&data_dir, Options::default())?;
            let r = env.begin_read()?;
            match r.get(&tree, key.as_bytes())? {
                Some(v) => println!("{}", String::from_utf8_lossy(v)),
                None => {
                    eprintln!("not found: {key:?} in tree {tree:?}");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        Command::Scan {
            data_dir,
            tree,
            from,
            reverse,
            limit,
        } => {
            let env = Env::open(&data_dir, Options::default())?;
            let r = env.begin_read()?;
            let mut c = r.cursor(&tree)?;
            let mut e = match (&from, reverse) {
                (Some(k), false) => c.seek(k.as_bytes())?,
                (Some(k), true) => c.seek_for_prev(k.as_bytes())?,
                (None, false) => c.first()?,
                (None, true) => c.last()?,
            };
            let mut n = 0;
            while let Some((k, v)) = e {
                if n == limit {
                    break;
                }
                println!(
                    "{}\t{}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                );
                n += 1;
                e = if reverse { c.prev()? } else { c.next()? };
            }
        }
        Command::Check { dir, json } => {
            require_env(&dir)?;
            let env = Env::open(&dir, Options::default())?;
            let report = env.check()?;
            if json {
                let problems: Vec<_> = report
                    .problems
                    .iter()
                    .map(|p| serde_json::json!({"file": p.file, "page": p.page, "what": p.what}))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"txn_id": report.txn_id, "trees": report.trees, "entries": report.entries, "pages_total": report.pages_total, "pages_reachable": report.pages_reachable, "pages_free": report.pages_free, "problems": problems})
                );
            } else {
                println!(
                    "checked txn {}: {} trees, {} entries, {} pages ({} reachable, {} free)",
                    report.txn_id,
                    report.trees,
                    report.entries,
                    report.pages_total,
                    report.pages_reachable,
                    report.pages_free
                );
                for p in &report.problems {
                    println!("PROBLEM {p}");
                }
                println!(
                    "{}",
                    if report.is_clean() {
                        "ok: no problems found"
                    } else {
                        "FAILED"
                    }
                );
            }
            if !report.is_clean() {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Stats { dir, json } => {
            require_env(&dir)?;
            let env = Env::open(&dir, Options::default())?;
            print_stats(&env.stats(), json);
        }
        Command::Bench(args) => bench::run(args)?,
        Command::DiskBench(args) => diskbench::run(args)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn require_env(dir: &std::path::Path) -> AnyResult<()> {
    if !dir.join(kiln_storage::DATA_FILE).exists() {
        return Err(format!(
            "{} holds no Kiln environment (no {})",
            dir.display(),
            kiln_storage::DATA_FILE
        )
        .into());
    }
    Ok(())
}

fn print_stats(s: &kiln_storage::Stats, json: bool) {
    let lat = |l: &kiln_storage::LatencySummary| serde_json::json!({"count": l.count, "mean_us": l.mean_us, "p50_us": l.p50_us, "p99_us": l.p99_us, "max_us": l.max_us});
    let v = serde_json::json!({
        "last_txn_id": s.last_txn_id, "synced_txn_id": s.synced_txn_id,
        "commits": s.commits, "aborts": s.aborts,
        "journal_writes": s.journal_writes, "journal_bytes": s.journal_bytes,
        "journal_write_latency": lat(&s.journal_write_latency),
        "journal_files": s.journal_files, "journal_files_created": s.journal_files_created, "journal_files_recycled": s.journal_files_recycled,
        "journal_direct_io_fallback": s.journal_direct_io_fallback, "journal_direct_io": s.journal_direct_io,
        "data_syncs": s.data_syncs, "data_sync_latency": lat(&s.data_sync_latency),
        "pages_written_back": s.pages_written_back, "checkpoints": s.checkpoints,
        "records_replayed_on_open": s.records_replayed_on_open,
        "pages_total": s.pages_total, "pages_in_use": s.pages_in_use, "pages_free": s.pages_free, "pages_pending_free": s.pages_pending_free,
        "pages_unflushed": s.pages_unflushed, "readers_open": s.readers_open, "data_file_bytes": s.data_file_bytes,
        "journal_body_bytes_full_images": s.journal_body_bytes_full_images,
        "journal_body_bytes_with_diffs": s.journal_body_bytes_raw,
        "journal_body_bytes_stored": s.journal_body_bytes_stored,
        "commit_queue": {
            "units_committed": s.commit_queue.units_committed, "units_failed": s.commit_queue.units_failed,
            "groups": s.commit_queue.groups, "avg_group_units": s.commit_queue.avg_group_units(),
            "max_group_units": s.commit_queue.max_group_units, "overloaded_rejections": s.commit_queue.overloaded_rejections,
        },
    });
    if json {
        println!("{v}");
        return;
    }
    if let serde_json::Value::Object(m) = v {
        for (k, val) in m {
            println!("{k:<28} {val}");
        }
    }
}
