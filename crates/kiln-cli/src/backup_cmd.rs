//! `kiln backup`, `kiln backup verify`, `kiln backup chain-stop`, `kiln restore`:
//! full and incremental backups of a database, point-in-time restore (see
//! `kiln_storage::backup` for the format and `kiln_docs::backup` for the manifest
//! and the chain).
//!
//! - `kiln backup --url U --db DB --out FILE [--incremental-since PREV] [--chain]`
//!   streams a backup of a running server into FILE, verifying every checksum as
//!   the bytes arrive. A full backup with `--chain` starts a backup chain;
//!   `--incremental-since PREV` takes every write since the backup in file PREV.
//! - `kiln backup --data-dir D ...` does the same on a data directory no server is
//!   running on.
//! - `kiln backup verify FILE...` checks backups without restoring them; several
//!   files must form one chain (a full backup, then its increments in order).
//! - `kiln backup chain-stop --url U --db DB` stops the chain (increments are
//!   refused after it; writes stop paying for the history).
//! - `kiln restore FULL [INC...] --db NAME (--data-dir D | --url U) [--until P]
//!   [--force]` creates database NAME from a full backup and its increments, up to
//!   point P (`etag:E`, `txn:T`, `time:T`), offline or in a running server.
//!
//! The output file is written as `FILE.partial`, synced, and renamed to FILE only
//! once complete and verified.

use crate::client::{path_escape, query_escape, Endpoint};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_docs::BackupChainError;
use kiln_docs::{BackupManifest, BackupReport, ChainReport, RestorePoint, RestoreReport};
use serde_json::Value;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub command: Option<BackupCommand>,
    #[command(flatten)]
    pub target: Target,
    /// Where to write the backup.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// An incremental backup: every write since the backup in this file (the full
    /// backup or the last increment of the same chain).
    #[arg(long)]
    pub incremental_since: Option<PathBuf>,
    /// A full backup that starts a backup chain: increments can follow it, and until
    /// the chain is stopped every write also goes to the chain's history (kept until
    /// the next increment: a chain nobody takes increments of grows without bound).
    /// Without it a full backup costs writers nothing afterwards.
    #[arg(long, conflicts_with = "incremental_since")]
    pub chain: bool,
    /// Store chunks without lz4 compression (offline backups).
    #[arg(long)]
    pub no_compress: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Which database: of a running server or of an offline data directory.
#[derive(clap::Args, Clone)]
pub struct Target {
    /// A running server, e.g. http://127.0.0.1:8080 (or use --data-dir).
    #[arg(long, conflicts_with = "data_dir")]
    pub url: Option<String>,
    /// A data directory no server is running on (or use --url).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The database.
    #[arg(long)]
    pub db: Option<String>,
    /// API key for a server running with --auth.
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub tls: crate::client::TlsArgs,
    /// With --data-dir: the data directory's master key, if it is encrypted.
    #[command(flatten)]
    pub encryption: crate::storage_args::EncryptionArgs,
}

#[derive(clap::Subcommand)]
pub enum BackupCommand {
    /// Check backup files (every checksum, count and the chunk order) without
    /// restoring them; several files must form one chain: the full backup, then
    /// its increments in order.
    Verify {
        /// The full backup, then its increments in order.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop the database's backup chain: increments are refused after it and the
    /// history it kept is removed.
    ChainStop {
        #[command(flatten)]
        target: Target,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The full backup, then its increments in order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The data directory (no server may be running on it), or use --url.
    #[arg(long, conflicts_with = "url")]
    pub data_dir: Option<PathBuf>,
    /// A running server: the database is created there.
    #[arg(long)]
    pub url: Option<String>,
    /// API key for a server running with --auth.
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub tls: crate::client::TlsArgs,
    /// The name of the database to create.
    #[arg(long)]
    pub db: String,
    /// Stop at this point: etag:E (every transaction up to the one that wrote E),
    /// txn:T, time:T (RFC 3339 or ms since the epoch). Default: all of it.
    #[arg(long)]
    pub until: Option<String>,
    /// Replace an existing database of that name (only once the restore succeeded).
    #[arg(long)]
    pub force: bool,
    /// The restored database's storage (offline restores; a server restores with
    /// its own).
    #[command(flatten)]
    pub storage: crate::storage_args::StorageArgs,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

fn bar(quiet: bool, total: Option<u64>) -> ProgressBar {
    if quiet || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let template = if total.is_some() {
        "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}"
    } else {
        "{spinner} {bytes} {binary_bytes_per_sec} {elapsed} {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style);
    }
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

/// A report as one JSON line, with the operation, its time and rate added.
fn print_json(
    report: &impl serde::Serialize,
    what: &str,
    secs: f64,
    mb_s: f64,
    extra: &[(&str, Value)],
) {
    let mut v = serde_json::to_value(report).unwrap_or_default();
    v["operation"] = what.into();
    v["seconds"] = secs.into();
    v["mb_per_s"] = mb_s.into();
    // An extra replaces the report's field of the same name with its own JSON
    // type: a count stays a number (`attachment_blobs`), a path a string.
    for (k, val) in extra {
        v[*k] = val.clone();
    }
    println!("{v}");
}

fn summary(what: &str, r: &BackupReport, secs: f64, extra: &[(&str, Value)], json: bool) {
    let mb_s = r.file_bytes as f64 / 1e6 / secs.max(1e-9);
    if json {
        print_json(r, what, secs, mb_s, extra);
    } else {
        println!("{what}: {}", describe(r));
        println!(
            "  {} documents, {} entries in {} trees, {} data bytes, {} file bytes, {:.2} s \
             ({:.1} MB/s), Kiln {}",
            r.manifest.documents,
            r.entries,
            r.trees,
            r.data_bytes,
            r.file_bytes,
            secs,
            mb_s,
            r.manifest.kiln_version
        );
        print_extra(extra);
    }
}

fn describe(r: &BackupReport) -> String {
    let m = &r.manifest;
    let chain = match &m.chain_id {
        Some(c) => format!(", chain {c}"),
        None => ", no chain".into(),
    };
    match m.kind {
        kiln_docs::BackupKind::Full => format!(
            "full backup of database {} at etag {} (txn {}){chain}",
            m.database,
            m.etag.as_deref().unwrap_or("(none)"),
            m.txn_id
        ),
        kiln_docs::BackupKind::Incremental => format!(
            "incremental backup of database {}: {} writes after etag {} up to etag {} (txn {}){chain}",
            m.database,
            r.entries,
            m.base_etag.as_deref().unwrap_or("0"),
            m.etag.as_deref().unwrap_or("(none)"),
            m.txn_id
        ),
    }
}

fn chain_summary(what: &str, r: &ChainReport, secs: f64, extra: &[(&str, Value)], json: bool) {
    let mb_s = r.bytes_read as f64 / 1e6 / secs.max(1e-9);
    if json {
        print_json(r, what, secs, mb_s, extra);
        return;
    }
    let writes = if what == "restored" {
        format!(
            "{} writes replayed, {} after the point",
            r.writes_replayed, r.writes_skipped
        )
    } else {
        format!("{} writes in the increments", r.writes_replayed)
    };
    println!(
        "{what}: {} backups, {writes}; {} etag {} (txn {}, {}); {} bytes in {:.2} s ({:.1} MB/s)",
        r.backups.len(),
        if what == "restored" {
            "reached"
        } else {
            "ends at"
        },
        r.reached.etag.as_deref().unwrap_or("(none)"),
        r.reached.txn,
        r.reached.at.as_deref().unwrap_or("time unknown"),
        r.bytes_read,
        secs,
        mb_s
    );
    for b in &r.backups {
        println!("  {}", describe(b));
    }
    print_extra(extra);
}

/// The extras of a summary as text lines (a string without its quotes).
fn print_extra(extra: &[(&str, Value)]) {
    for (k, val) in extra {
        match val {
            Value::String(s) => println!("  {k}: {s}"),
            other => println!("  {k}: {other}"),
        }
    }
}

/// Reads through `inner`, copying every byte to `out`.
struct Tee<R, W> {
    inner: R,
    out: W,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out.write_all(buf.get(..n).unwrap_or_default())?;
        Ok(n)
    }
}

/// `GET path` (a backup of a running server) written to `file`, every checksum
/// verified as the bytes arrive: a truncated or damaged stream is refused. The file
/// is flushed, not synced (see [`finish_file`]).
pub(crate) fn stream_backup_to(
    ep: &Endpoint,
    path: &str,
    file: &File,
    progress: impl FnMut(u64),
) -> AnyResult<BackupReport> {
    let resp = ep.get_stream(path)?;
    let mut tee = Tee {
        inner: resp.body,
        out: BufWriter::with_capacity(1 << 20, file),
    };
    let report = kiln_docs::verify_backup(&mut tee, progress)?;
    tee.out.flush()?;
    Ok(report)
}

fn partial_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Syncs the finished `.partial` file and renames it to `out`.
pub(crate) fn finish_file(file: File, partial: &Path, out: &Path) -> AnyResult<()> {
    file.sync_all()?;
    drop(file);
    std::fs::rename(partial, out)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn read_manifest_file(path: &Path) -> AnyResult<BackupManifest> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    kiln_docs::read_manifest(BufReader::new(f))
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

pub fn backup(a: BackupArgs) -> AnyResult<ExitCode> {
    match a.command {
        Some(BackupCommand::Verify { files, quiet, json }) => return verify(&files, quiet, json),
        Some(BackupCommand::ChainStop { target, json }) => return chain_stop(&target, json),
        None => {}
    }
    let db = a.target.db.clone().ok_or("--db is required")?;
    let out = a.out.clone().ok_or("--out is required")?;
    let since = read_incremental_base(a.incremental_since.as_deref(), &db)?;
    let partial = partial_path(&out);
    let started = Instant::now();
    let taking = TakeBackup {
        args: &a,
        db,
        since,
    };
    match write_backup(&taking, &partial) {
        Ok((report, file)) => {
            finish_file(file, &partial, &out)?;
            // The attachments' bytes are inside the backup (its extra files).
            let blobs = report.attachment_blobs;
            let secs = started.elapsed().as_secs_f64();
            summary(
                "backup",
                &report,
                secs,
                &[
                    ("file", out.display().to_string().into()),
                    ("attachment_blobs", blobs.into()),
                ],
                a.json,
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// The manifest in the `--incremental-since` file: the base of an incremental
/// backup.
fn read_incremental_base(path: Option<&Path>, db: &str) -> AnyResult<Option<BackupManifest>> {
    let since = path.map(read_manifest_file).transpose()?;
    if let Some(m) = &since {
        if m.database != db {
            eprintln!(
                "note: --incremental-since is a backup of database {:?}, backing up {db:?}",
                m.database
            );
        }
    }
    Ok(since)
}

/// The backup `kiln backup` takes.
struct TakeBackup<'a> {
    args: &'a BackupArgs,
    db: String,
    /// An incremental backup's base (`None`: a full backup).
    since: Option<BackupManifest>,
}

/// Writes the backup into the file `partial`, from a running server (`--url`) or
/// offline (`--data-dir`). The file is created first: on failure the caller removes
/// it, whatever failed.
fn write_backup(taking: &TakeBackup, partial: &Path) -> AnyResult<(BackupReport, File)> {
    let file = File::create(partial)?;
    let target = &taking.args.target;
    if let Some(url) = &target.url {
        let report = backup_from_server(taking, url, &file)?;
        Ok((report, file))
    } else if let Some(dir) = &target.data_dir {
        let report = backup_offline(taking, dir, &file)?;
        Ok((report, file))
    } else {
        Err(
            crate::UsageError("give --url (a running server) or --data-dir (offline)".into())
                .into(),
        )
    }
}

/// Streams the backup from the server at `url` into `file`, verifying it as it
/// arrives.
fn backup_from_server(taking: &TakeBackup, url: &str, file: &File) -> AnyResult<BackupReport> {
    let target = &taking.args.target;
    let ep = Endpoint::parse(url, target.api_key.clone(), &target.tls)?;
    let path = backup_request_path(&taking.db, taking.since.as_ref(), taking.args.chain)?;
    let pb = bar(taking.args.quiet, None);
    let report = stream_backup_to(&ep, &path, file, |n| pb.set_position(n))?;
    pb.finish_and_clear();
    Ok(report)
}

/// The path and query of `GET /dbs/{db}/backup` for a full backup (starting a
/// chain or not) or an increment after `since`.
fn backup_request_path(db: &str, since: Option<&BackupManifest>, chain: bool) -> AnyResult<String> {
    let mut path = format!("/dbs/{}/backup", path_escape(db));
    match since {
        Some(m) => {
            path.push_str(&format!(
                "?since_chain={}&since_backup={}&since_etag={}",
                query_escape(m.chain_id.as_deref().unwrap_or("")),
                query_escape(m.backup_id.as_deref().unwrap_or("")),
                query_escape(m.etag.as_deref().unwrap_or(""))
            ));
            if m.chain_id.is_none() {
                return Err(kiln_docs::DocError::BackupChain(
                    BackupChainError::IncrementNotPossible(
                        "the base backup is not part of a chain (taken without --chain \
                     or by an older Kiln): take a full backup with --chain"
                            .into(),
                    ),
                )
                .into());
            }
        }
        None if chain => path.push_str("?chain=true"),
        None => {}
    }
    Ok(path)
}

/// Writes the backup of the database in `dir` (no server may be running on it)
/// into `file`, then closes the store.
fn backup_offline(taking: &TakeBackup, dir: &Path, file: &File) -> AnyResult<BackupReport> {
    let a = taking.args;
    let store = crate::docs_cmd::open_existing(dir, &taking.args.target.encryption)?;
    let database = store.database(&taking.db)?;
    let pb = bar(a.quiet, None);
    let opts = kiln_storage::BackupOptions {
        compress: !a.no_compress,
    };
    let report = {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let r = match &taking.since {
            Some(m) => database.backup_incremental_to(&mut w, m, opts, |n| pb.set_position(n))?,
            None => database.backup_full_to(&mut w, opts, a.chain, |n| pb.set_position(n))?,
        };
        w.flush()?;
        r
    };
    pb.finish_and_clear();
    drop(database);
    store.close()?;
    Ok(report)
}

fn chain_stop(t: &Target, json: bool) -> AnyResult<ExitCode> {
    let db = t.db.clone().ok_or("--db is required")?;
    let stopped = if let Some(url) = &t.url {
        let ep = Endpoint::parse(url, t.api_key.clone(), &t.tls)?;
        let body = ep.request(
            "DELETE",
            &format!("/dbs/{}/backup/chain", path_escape(&db)),
            b"",
        )?;
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        v["stopped"].as_bool().unwrap_or(false)
    } else if let Some(dir) = &t.data_dir {
        let store = crate::docs_cmd::open_existing(dir, &t.encryption)?;
        let stopped = store.database(&db)?.stop_backup_chain()?;
        store.close()?;
        stopped
    } else {
        return Err(crate::UsageError(
            "give --url (a running server) or --data-dir (offline)".into(),
        )
        .into());
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"database": db, "stopped": stopped})
        );
    } else if stopped {
        println!("backup chain of database {db} stopped");
    } else {
        println!("database {db} had no backup chain");
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens the files, with their total size.
pub(crate) fn open_all(files: &[PathBuf]) -> AnyResult<(kiln_docs::RestoreSource<'static>, u64)> {
    let mut total = 0;
    let mut v: Vec<(String, Box<dyn Read>)> = Vec::new();
    for p in files {
        let f = File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        total += f.metadata()?.len();
        v.push((
            p.display().to_string(),
            Box::new(BufReader::with_capacity(1 << 20, f)),
        ));
    }
    Ok((kiln_docs::RestoreSource::Files(v), total))
}

/// The manifests of the files checked as one chain (headers only: fails fast).
fn precheck(files: &[PathBuf]) -> AnyResult<()> {
    let mut ms = Vec::new();
    for p in files {
        ms.push((p.display().to_string(), read_manifest_file(p)?));
    }
    kiln_docs::check_chain(&ms)?;
    Ok(())
}

fn verify(files: &[PathBuf], quiet: bool, json: bool) -> AnyResult<ExitCode> {
    let started = Instant::now();
    // A `.partial` file is never a backup, whatever its bytes: its writer stopped
    // before the rename that says it finished (killed while syncing it, the bytes may
    // all be there, but nothing says they were checked and made durable).
    if let Some(partial) = files
        .iter()
        .find(|f| f.to_string_lossy().ends_with(".partial"))
    {
        return Err(format!(
            "{}: an unfinished backup (its writer stopped before renaming it); run the backup again",
            partial.display()
        )
        .into());
    }
    if let [file] = files {
        let f = File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let len = f
            .metadata()
            .map_err(|e| format!("{}: {e}", file.display()))?
            .len();
        let pb = bar(quiet, Some(len));
        let r =
            kiln_docs::verify_backup(BufReader::with_capacity(1 << 20, f), |n| pb.set_position(n));
        pb.finish_and_clear();
        let r = r.map_err(|e| format!("{}: {e}", file.display()))?;
        summary(
            "verified",
            &r,
            started.elapsed().as_secs_f64(),
            &[("file", file.display().to_string().into())],
            json,
        );
        return Ok(ExitCode::SUCCESS);
    }
    precheck(files)?;
    let (source, total) = open_all(files)?;
    let pb = bar(quiet, Some(total));
    let r = kiln_docs::verify_chain(source, |n| pb.set_position(n));
    pb.finish_and_clear();
    chain_summary(
        "verified chain",
        &r?,
        started.elapsed().as_secs_f64(),
        &[],
        json,
    );
    Ok(ExitCode::SUCCESS)
}

pub fn restore(a: RestoreArgs) -> AnyResult<ExitCode> {
    let point = match a.until.as_deref() {
        Some(u) => RestorePoint::parse(u)?,
        None => RestorePoint::Latest,
    };
    let offline_dir = restore_target(&a)?;
    precheck(&a.files)?;
    let started = Instant::now();
    let report: RestoreReport = match (offline_dir, &a.url) {
        (Some(dir), _) => restore_offline(&a, dir, point)?,
        (None, Some(url)) => restore_remote(&a, url)?,
        (None, None) => unreachable!("checked above: one of --url and --data-dir"),
    };
    let chain = ChainReport {
        backups: report.backups,
        reached: report.reached,
        writes_replayed: report.writes_replayed,
        writes_skipped: report.writes_skipped,
        bytes_read: report.bytes_read,
    };
    // The attachments' bytes came inside the backups; backups of older Kilns have
    // them beside their files instead (`backup_blobs.rs`).
    let carried: u64 = chain.backups.iter().map(|b| b.attachment_blobs).sum();
    let beside = restore_blobs_beside(&a, offline_dir)?;
    let mut extra = vec![
        ("restored_as", a.db.clone().into()),
        ("attachment_blobs", (carried + beside).into()),
    ];
    match (&a.url, &a.data_dir) {
        (Some(u), _) => extra.push(("server", u.clone().into())),
        (_, Some(d)) => extra.push(("data_dir", d.display().to_string().into())),
        _ => {}
    }
    chain_summary(
        "restored",
        &chain,
        started.elapsed().as_secs_f64(),
        &extra,
        a.json,
    );
    Ok(ExitCode::SUCCESS)
}

/// Where a restore goes: the data directory of an offline restore, or `None` for
/// the server at `--url`. Checked before the backups are read (a usage error,
/// exit code 2).
fn restore_target(a: &RestoreArgs) -> AnyResult<Option<&PathBuf>> {
    let offline_dir = match (&a.url, &a.data_dir) {
        (Some(_), _) => None,
        (None, Some(dir)) => Some(dir),
        (None, None) => {
            return Err(crate::UsageError(
                "give --data-dir (offline) or --url (a running server)".into(),
            )
            .into())
        }
    };
    if offline_dir.is_none() && a.storage.any_given() {
        return Err(crate::UsageError(
            "--journal-file-size-mib is for offline restores (--data-dir): \
                    a server restores with its own storage options"
                .into(),
        )
        .into());
    }
    Ok(offline_dir)
}

/// Restores the files into the data directory `dir` (no server runs on it).
fn restore_offline(a: &RestoreArgs, dir: &Path, point: RestorePoint) -> AnyResult<RestoreReport> {
    let (source, total) = open_all(&a.files)?;
    let pb = bar(a.quiet, Some(total));
    let storage = a.storage.docs_options()?.storage;
    let r = kiln_docs::restore_database(source, dir, &a.db, storage, a.force, point, |n| {
        pb.set_position(n)
    });
    pb.finish_and_clear();
    Ok(r?)
}

/// Restores the attachments' blobs kept beside the backup files (backups of older
/// Kilns), offline into `offline_dir` or to the server; how many.
fn restore_blobs_beside(a: &RestoreArgs, offline_dir: Option<&PathBuf>) -> AnyResult<u64> {
    Ok(match (offline_dir, &a.url) {
        (Some(dir), _) => {
            let options = a.storage.docs_options()?;
            crate::backup_blobs::restore_offline(dir, &a.db, &a.files, options)?
        }
        (None, Some(url)) => {
            let ep = Endpoint::parse(url, a.api_key.clone(), &a.tls)?;
            crate::backup_blobs::restore_to_server(&ep, &a.db, &a.files)?
        }
        (None, None) => 0,
    })
}

/// Sends the files back to back to `POST /dbs/{db}/restore`.
fn restore_remote(a: &RestoreArgs, url: &str) -> AnyResult<RestoreReport> {
    let ep = Endpoint::parse(url, a.api_key.clone(), &a.tls)?;
    let mut path = format!("/dbs/{}/restore?force={}", path_escape(&a.db), a.force);
    if let Some(u) = &a.until {
        path.push_str(&format!("&until={}", query_escape(u)));
    }
    let total: u64 = a
        .files
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let pb = bar(a.quiet, Some(total));
    let (mut w, upload) = ep.start_upload(&path)?;
    let mut sent = 0u64;
    let mut send_error = None;
    'files: for p in &a.files {
        let mut f = File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            if let Err(e) = w.chunk(&buf[..n]) {
                // The server may have answered (and stopped reading) already.
                send_error = Some(e);
                break 'files;
            }
            sent += n as u64;
            pb.set_position(sent);
        }
    }
    if send_error.is_none() {
        if let Err(e) = w.finish() {
            send_error = Some(e);
        }
    }
    pb.set_message("the server verifies and opens the database");
    let resp = upload.response();
    pb.finish_and_clear();
    let mut resp = match (resp, send_error) {
        (Ok(r), _) => r,
        (Err(e), Some(se)) => return Err(format!("sending the backups: {se} ({e})").into()),
        (Err(e), None) => return Err(e.into()),
    };
    let mut body = Vec::new();
    resp.body.read_to_end(&mut body)?;
    if !(200..300).contains(&resp.status) {
        return Err(crate::client::ClientError::status(resp.status, &body)
            .during("the restore")
            .into());
    }
    Ok(serde_json::from_slice(&body)?)
}
