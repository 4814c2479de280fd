//! `kiln`: the command-line tool.

mod backup_cmd;
mod backupbench;
mod bench;
mod client;
mod diskbench;
mod docs_cmd;
mod export_cmd;
mod httpbench;
mod import_cmd;
mod kv;
mod procstat;
mod query_cmd;
mod querybench;
mod rawdisk;
mod recoverybench;
mod redisbench;
mod serve_cmd;
mod serverbench;
mod storage_args;
mod streambench;

use clap::{Parser, Subcommand};
use kiln_storage::{Env, Options};
use std::path::PathBuf;
use std::process::ExitCode;

// glibc's allocator showed up at ~10% of the server's CPU under load (many small,
// short-lived allocations across threads); mimalloc handles that pattern better.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (not named by libmimalloc-sys).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// How long freed memory stays mapped before mimalloc returns it to the OS. The
/// default (10 ms) is shorter than the engine's page turnover (commit -> write-back
/// -> free takes one write-back window): every commit then touched freshly mapped
/// memory, and its page faults (2 MiB zeroed at a time with transparent huge pages)
/// cost more than the commit's own work (W1 put+commit CPU: ~55 us -> ~26 us).
const ALLOCATOR_PURGE_DELAY_MS: std::os::raw::c_long = 10_000;

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
    /// Run the document server (HTTP/HTTPS) on a data directory (created if needed).
    Serve(serve_cmd::ServeArgs),
    /// Manage API keys (hashed at rest in <data-dir>/api-keys.json).
    #[command(subcommand)]
    ApiKey(serve_cmd::ApiKeyCommand),
    /// Write a JSON document (creates the database if needed). An id ending in `/`
    /// gets a generated id under that prefix.
    Put {
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        database: String,
        id: String,
        json: String,
        /// For the database this creates, if it does.
        #[command(flatten)]
        storage: storage_args::StorageArgs,
    },
    /// Print a document.
    Get {
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        database: String,
        id: String,
    },
    /// List documents of a database by id prefix.
    List {
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        database: String,
        #[arg(long, default_value = "")]
        prefix: String,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Stream documents into a database of a running server (NDJSON, JSON arrays,
    /// directories or .tar/.tar.gz of .json files) through its bulk endpoint;
    /// `--resume` continues an interrupted import.
    Import(import_cmd::ImportArgs),
    /// Write a database of a running server as NDJSON bulk lines that `kiln import`
    /// reads back.
    Export(export_cmd::ExportArgs),
    /// Full backup of a database (`--url` of a running server, or `--data-dir`
    /// offline) into one file; `kiln backup verify FILE` checks a backup.
    Backup(backup_cmd::BackupArgs),
    /// Create a database in an (offline) data directory from a backup.
    Restore(backup_cmd::RestoreArgs),
    /// Run a query against a server: `kiln query --url U --db DB "from users where ..."`.
    Query(query_cmd::QueryArgs),
    /// Raw key-value access to one storage environment (no documents).
    #[command(subcommand)]
    Kv(kv::KvCommand),
    /// Walk every tree and page of a storage environment, or of every database of a
    /// data directory; exit code 1 if anything is wrong.
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
    // SAFETY: sets a plain integer option; mimalloc reads options on use.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS) };
    // No transparent huge pages for this process. mimalloc v3 asks for them on its
    // arenas, and then the first touch of each fresh 2 MiB region zeroes all of it:
    // with 64 committing threads (each with its own heap) that zeroing took ~30% of
    // the CPU and W6 at 64 threads fell from ~42,000 to ~16,000 commits/s.
    // SAFETY: a process-wide flag with no pointers involved; failure only keeps THP.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
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
        Command::Serve(args) => serve_cmd::serve(args)?,
        Command::ApiKey(cmd) => serve_cmd::api_key(cmd)?,
        Command::Put {
            data_dir,
            database,
            id,
            json,
            storage,
        } => return docs_cmd::put(&data_dir, &database, &id, &json, &storage),
        Command::Get {
            data_dir,
            database,
            id,
        } => return docs_cmd::get(&data_dir, &database, &id),
        Command::List {
            data_dir,
            database,
            prefix,
            limit,
        } => return docs_cmd::list(&data_dir, &database, &prefix, limit),
        Command::Import(args) => return import_cmd::run(args),
        Command::Export(args) => return export_cmd::run(args),
        Command::Backup(args) => return backup_cmd::backup(args),
        Command::Restore(args) => return backup_cmd::restore(args),
        Command::Kv(cmd) => return kv::run(cmd),
        Command::Query(args) => return query_cmd::run(args),
        Command::Check { dir, json } => {
            if let Some(databases) = docs_cmd::database_dirs(&dir)? {
                return check_all(&databases, json);
            }
            require_env(&dir)?;
            if !check_env(&dir, json)? {
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

/// Checks every database of a document data directory.
fn check_all(databases: &[PathBuf], json: bool) -> AnyResult<ExitCode> {
    let mut clean = true;
    for dir in databases {
        if !json {
            println!("database {}:", dir.display());
        }
        clean &= check_env(dir, json)?;
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Checks one environment and prints the report; false if it found problems.
fn check_env(dir: &std::path::Path, json: bool) -> AnyResult<bool> {
    {
        {
            let env = Env::open(dir, Options::default())?;
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
            Ok(report.is_clean())
        }
    }
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
    let mut v = serde_json::json!({
        "last_txn_id": s.last_txn_id, "synced_txn_id": s.synced_txn_id,
        "commits": s.commits, "aborts": s.aborts,
        "journal_writes": s.journal_writes, "journal_bytes": s.journal_bytes,
        "journal_write_latency": lat(&s.journal_write_latency),
        "journal_files": s.journal_files, "journal_files_created": s.journal_files_created, "journal_files_recycled": s.journal_files_recycled,
        "journal_switch_waits": s.journal_switch_waits,
        "write_buffer_bytes": s.write_buffer_bytes, "write_buffer_freezes": s.write_buffer_freezes, "write_buffer_merges": s.write_buffer_merges, "write_buffer_keys_merged_ahead": s.write_buffer_keys_merged_ahead,
        "journal_direct_io_fallback": s.journal_direct_io_fallback, "journal_direct_io": s.journal_direct_io,
        "data_syncs": s.data_syncs, "data_sync_latency": lat(&s.data_sync_latency),
        "buffered_journal_sync_latency": lat(&s.buffered_journal_sync_latency),
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
    // (Beside the literal above, which is at the macro's recursion limit.)
    v["journal_files_cut_short"] = s.journal_files_cut_short.into();
    v["journal_referenced_value_bytes"] = s.journal_referenced_value_bytes.into();
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
