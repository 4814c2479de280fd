//! `kiln`: the command-line tool.

mod api_key_cmd;
mod attachments_cmd;
mod backup_blobs;
mod backup_cmd;
#[cfg(feature = "bench")]
mod bench_cmd;
mod client;
mod cluster_cmd;
mod docs_cmd;
mod encryption_cmd;
mod exit;
mod export_cmd;
mod import_cmd;
mod inspect_cmd;
mod kv;
mod query_cmd;
mod revisions_cmd;
mod serve_cmd;
mod storage_args;
mod subscriptions_cmd;

use clap::{Parser, Subcommand};
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
    /// Manage API keys (hashed at rest in <data-dir>/api-keys.json): offline in a
    /// data directory, or through a running server (--url; a cluster's keys on
    /// every node).
    #[command(subcommand)]
    ApiKey(api_key_cmd::ApiKeyCommand),
    /// Write a JSON document (creates the database if needed). An id ending in `/`
    /// gets a generated id under that prefix. Offline: the data directory must not
    /// be in use by a server.
    Put {
        /// The data directory (as given to `kiln serve`).
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        /// The database's name.
        database: String,
        /// The document's id, e.g. users/ada; a prefix ending in `/` (users/) gets a
        /// generated id under it.
        id: String,
        /// The document: JSON text, `-` to read it from standard input, or
        /// `@FILE` to read it from a file.
        json: String,
        /// For the database this creates, if it does.
        #[command(flatten)]
        storage: storage_args::StorageArgs,
    },
    /// Print a document (exit code 4 if there is none). Offline, as `kiln put`.
    Get {
        /// The data directory (as given to `kiln serve`).
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        /// The database's name.
        database: String,
        /// The document's id.
        id: String,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
    },
    /// List documents of a database by id prefix, one JSON document per line; the
    /// id to continue after is printed on stderr when there are more. Offline, as
    /// `kiln put`.
    List {
        /// The data directory (as given to `kiln serve`).
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        /// The database's name.
        database: String,
        /// Only ids that start with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Start after this id (the one a previous page ended with).
        #[arg(long)]
        start_after: Option<String>,
        /// Documents at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
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
    /// Create a database from a full backup and its increments (up to a point in
    /// time): in a data directory no server is running on (`--data-dir`), or in a
    /// running server (`--url`).
    Restore(backup_cmd::RestoreArgs),
    /// A cluster's members: status, add a learner, promote it, remove a node.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Document revisions on a server: list a document's, revert to one, purge
    /// them, show or set which collections keep them.
    #[command(subcommand)]
    Revisions(revisions_cmd::RevisionsCommand),
    /// Data subscriptions on a server: list them with their positions, print one
    /// (`get`), create one (a name and `from <collection> [where ...]`), delete one.
    #[command(subcommand)]
    Subscriptions(subscriptions_cmd::SubscriptionsCommand),
    /// A document's attachments on a server: put a file (streamed), get one to a
    /// file or standard output, list them, delete one.
    #[command(subcommand)]
    Attachments(attachments_cmd::AttachmentsCommand),
    /// Run a query against a server: `kiln query --url U --db DB "from users where ..."`.
    Query(query_cmd::QueryArgs),
    /// Raw key-value access to one storage environment (no documents).
    #[command(subcommand)]
    Kv(kv::KvCommand),
    /// Encryption at rest: make a master key, show which databases are encrypted,
    /// change the master key (docs/operations.md, "Security").
    #[command(subcommand)]
    Encryption(encryption_cmd::EncryptionCommand),
    /// Walk every tree and page of a storage environment, or of every database of a
    /// data directory; exit code 1 if anything is wrong.
    Check {
        /// A data directory (every database in it) or one database's directory.
        dir: PathBuf,
        /// One JSON object per database, on one line each.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
    },
    /// Print the engine's figures for a database (or every database of a data
    /// directory). Counters such as `commits` count since this open; `last_txn_id`
    /// is the database's whole history.
    Stats {
        /// A data directory (every database in it) or one database's directory.
        dir: PathBuf,
        /// One JSON object per database, on one line each.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
    },
    /// Run the benchmark workloads (docs/benchmarks.md) against Kiln and the raw disk.
    #[cfg(feature = "bench")]
    Bench(kiln_bench::BenchArgs),
    /// Measure what the disk itself does: sequential writes in every journal mode,
    /// durable writes by size, concurrent durable writers, random reads at queue depth
    /// 1, 16 and 64; tells a slow or lying disk from a slow database.
    #[cfg(feature = "bench")]
    DiskBench(kiln_bench::DiskBenchArgs),
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
    let cli = Cli::parse();
    // Kept to the end of main: dropping it sends the last spans.
    let _traces = match init_logging(&cli.command) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if !matches!(cli.command, Command::Serve(_)) {
        // Not for the server: a client going away is no reason to stop.
        end_quietly_when_stdout_closes();
    }
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::of(e.as_ref()))
        }
    }
}

/// A command whose output goes to a pipe that closes (`kiln list | head`) ends
/// quietly, killed by SIGPIPE as other command-line tools are, instead of
/// panicking in println!. SIGPIPE itself stays ignored (Rust's default): with its
/// default disposition, a request body still being sent to a server that refused
/// it and closed (a restore of a damaged backup) killed the client without a word,
/// where it must print the server's answer.
fn end_quietly_when_stdout_closes() {
    let print_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            // SAFETY: restores a signal's default disposition and raises it; no
            // handler and no pointers involved.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
        }
        print_panic(info);
    }));
}

/// Log lines go to stderr: warnings and errors, the cluster's events (a leader
/// elected, a peer unreachable and back), the access log of `kiln serve
/// --access-log`; RUST_LOG overrides. As text (coloured only on a terminal) or as
/// JSON objects (`--log-format json`). openraft's own lines are off by default: it
/// logs an unreachable peer at ERROR at every retry (twenty lines for a follower
/// down ten seconds), which kiln-cluster says once; `RUST_LOG=warn,openraft=warn`
/// brings them back when debugging Raft itself.
///
/// `kiln serve --otlp-endpoint` and `--slow-request-ms` add the trace layers
/// (`kiln_server::telemetry`), each with a filter of its own, so that RUST_LOG
/// never decides which spans are exported. The guard sends the spans still
/// buffered when it is dropped, at exit.
fn init_logging(
    command: &Command,
) -> Result<kiln_server::telemetry::TelemetryGuard, kiln_server::telemetry::TelemetryError> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let (access_log, json, otlp, slow_ms) = match command {
        Command::Serve(a) => (
            a.access_log,
            a.log_format == serve_cmd::LogFormat::Json,
            a.otlp_endpoint.as_deref().map(|url| (url, a.otlp_protocol)),
            a.slow_request_ms,
        ),
        _ => (false, false, None, None),
    };
    let default = if access_log {
        "warn,kiln_cluster=info,openraft=off,kiln::access=info"
    } else {
        "warn,kiln_cluster=info,openraft=off"
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let lines = if json {
        lines.json().with_filter(filter).boxed()
    } else {
        lines.with_filter(filter).boxed()
    };
    let (traces, guard) = kiln_server::telemetry::layers(otlp, slow_ms)?;
    tracing_subscriber::registry()
        .with(lines)
        .with(traces)
        .init();
    Ok(guard)
}

/// A command line that cannot be right whatever the state of the world (two
/// options that exclude each other, a missing choice): exit code 2, as clap's
/// (the exit codes are in [`exit`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn run(cmd: Command) -> AnyResult<ExitCode> {
    match cmd {
        Command::Serve(args) => serve_cmd::serve(args)?,
        Command::ApiKey(cmd) => api_key_cmd::api_key(cmd)?,
        Command::Cluster(cmd) => cluster_cmd::run(cmd)?,
        Command::Revisions(cmd) => revisions_cmd::run(cmd)?,
        Command::Subscriptions(cmd) => subscriptions_cmd::run(cmd)?,
        Command::Attachments(cmd) => attachments_cmd::run(cmd)?,
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
            encryption,
        } => return docs_cmd::get(&data_dir, &database, &id, &encryption),
        Command::List {
            data_dir,
            database,
            prefix,
            start_after,
            limit,
            encryption,
        } => {
            let page = docs_cmd::Page {
                prefix: &prefix,
                start_after: start_after.as_deref(),
                limit,
            };
            return docs_cmd::list(&data_dir, &database, page, &encryption);
        }
        Command::Import(args) => return import_cmd::run(args),
        Command::Export(args) => return export_cmd::run(args),
        Command::Backup(args) => return backup_cmd::backup(args),
        Command::Restore(args) => return backup_cmd::restore(args),
        Command::Kv(cmd) => return kv::run(cmd),
        Command::Encryption(cmd) => return encryption_cmd::run(cmd),
        Command::Query(args) => return query_cmd::run(args),
        Command::Check {
            dir,
            json,
            encryption,
        } => return inspect_cmd::check(&dir, json, &encryption),
        Command::Stats {
            dir,
            json,
            encryption,
        } => return inspect_cmd::stats(&dir, json, &encryption),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench_cmd::bench(args)?,
        #[cfg(feature = "bench")]
        Command::DiskBench(args) => bench_cmd::disk_bench(args)?,
    }
    Ok(ExitCode::SUCCESS)
}
