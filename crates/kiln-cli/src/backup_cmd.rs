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
//!
//! ## Encrypted backups
//! A backup of an encrypted database is sealed under the data directory's master
//! key (`kiln_storage::backup`, format version 3). With `--encryption-key-file`
//! every command here reads it fully. Without the key, what needs none is still
//! done: `kiln backup --url` and `kiln backup verify` check a sealed backup's
//! structure (every frame's checksum over its sealed bytes, the frames' order
//! and kinds, the trailer last, the header's checksum:
//! `kiln_storage::backup::verify_sealed_structure`) and say on stderr, and in
//! `--json` (`"encrypted": true, "contents_verified": false`), that its contents
//! were not checked; `kiln restore --url` sends it to the server, which opens it
//! with its own key. Reading a sealed backup's manifest (`--incremental-since`,
//! an offline restore) takes the key.

use crate::client::{path_escape, query_escape, Endpoint};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_docs::BackupChainError;
use kiln_docs::{BackupManifest, BackupReport, ChainReport, RestorePoint, RestoreReport};
use kiln_storage::backup::{self as container, SealedStructure};
use kiln_storage::MasterKey;
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
    /// The master key: with --data-dir, the data directory's (if it is
    /// encrypted); with --url, to verify an encrypted server's backup in full as it
    /// arrives (without it only its structure is checked) and to read an encrypted
    /// --incremental-since backup. The server seals its backups with its own key.
    #[command(flatten)]
    pub encryption: crate::storage_args::EncryptionArgs,
}

#[derive(clap::Subcommand)]
pub enum BackupCommand {
    /// Check backup files (every checksum, count and the chunk order) without
    /// restoring them; several files must form one chain: the full backup, then
    /// its increments in order. An encrypted backup is checked in full with its
    /// master key (--encryption-key-file); without it, only its structure.
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
        /// The master key of encrypted backups: their contents are checked with it.
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
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
    /// its own). The master key (--encryption-key-file) opens encrypted backups and
    /// encrypts the restored database; with --url it only lets this side read the
    /// backups' manifests for its pre-check (the server opens them with its own).
    #[command(flatten)]
    pub storage: crate::storage_args::StorageArgs,
    /// The master key the backups were sealed under, when it is not the data
    /// directory's own (--encryption-key-file): backups of another data directory,
    /// or made before `kiln encryption rotate-key`. Offline restores only.
    #[arg(long, value_name = "FILE", conflicts_with = "url")]
    pub backup_key_file: Option<PathBuf>,
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

/// Whether a backup is encrypted and, for one this side checked, that its contents
/// were verified: JSON fields (the fingerprint is the report's own field), or a
/// text line for an encrypted one.
fn crypt_extras(r: &BackupReport, checked_here: bool, json: bool) -> Vec<(&'static str, Value)> {
    let fingerprint = r.encryption_key_fingerprint.as_deref();
    if json {
        let mut v = vec![("encrypted", fingerprint.is_some().into())];
        if checked_here {
            v.push(("contents_verified", true.into()));
        }
        return v;
    }
    match fingerprint {
        Some(fp) => {
            let verified = if checked_here {
                "; its contents verified with it"
            } else {
                ""
            };
            vec![(
                "encrypted",
                format!("sealed under master key {fp}{verified}").into(),
            )]
        }
        None => Vec::new(),
    }
}

/// The line on stderr for a sealed backup checked without its key.
fn note_structure_only(label: &str, s: &SealedStructure) {
    eprintln!(
        "note: {label} is encrypted under master key {}: its contents were not checked \
         without the key, only its structure (every frame's checksum, their order, the \
         trailer last, the header); give --encryption-key-file to verify its contents",
        s.key_fingerprint
    );
}

/// A sealed backup's structure as JSON: what its header and frame headers say in
/// clear, and that its contents were not verified.
fn structure_json(s: &SealedStructure) -> Value {
    serde_json::json!({
        "encrypted": true,
        "contents_verified": false,
        "encryption_key_fingerprint": s.key_fingerprint,
        "format_version": s.format_version,
        "txn_id": s.txn_id,
        "chunks": s.frames,
        "trees": s.trees,
        "extra_files": s.files,
        "file_bytes": s.file_bytes,
    })
}

/// The summary of a sealed backup checked without its key (`what`: the operation);
/// the note on stderr first.
fn structure_summary(
    what: &str,
    label: &str,
    s: &SealedStructure,
    secs: f64,
    extra: &[(&str, Value)],
    json: bool,
) {
    note_structure_only(label, s);
    let mb_s = s.file_bytes as f64 / 1e6 / secs.max(1e-9);
    if json {
        let mut v = structure_json(s);
        v["operation"] = what.into();
        v["seconds"] = secs.into();
        v["mb_per_s"] = mb_s.into();
        for (k, val) in extra {
            v[*k] = val.clone();
        }
        println!("{v}");
        return;
    }
    println!(
        "{what} (structure only): encrypted backup sealed under master key {} at txn {}; \
         its contents were NOT verified (no key)",
        s.key_fingerprint, s.txn_id
    );
    println!(
        "  {} frames ({} trees, {} extra files), {} file bytes, {:.2} s ({:.1} MB/s)",
        s.frames, s.trees, s.files, s.file_bytes, secs, mb_s
    );
    print_extra(extra);
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

/// `GET path` (a backup of a running server) written to `file`, checked with
/// [`check_backup`] as the bytes arrive: in full (every checksum; a sealed one with
/// `key`), or (sealed, no `key`) its structure. A truncated or damaged stream is
/// refused. The file is flushed, not synced (see [`finish_file`]).
pub(crate) fn stream_checked_backup_to(
    ep: &Endpoint,
    path: &str,
    file: &File,
    key: Option<&MasterKey>,
    progress: impl FnMut(u64),
) -> AnyResult<Checked> {
    download(ep, path, file, |input| check_backup(input, key, progress))
}

/// `GET path` copied into `file` as `check` reads it (to its end), then flushed.
fn download<T>(
    ep: &Endpoint,
    path: &str,
    file: &File,
    check: impl FnOnce(&mut dyn Read) -> AnyResult<T>,
) -> AnyResult<T> {
    let resp = ep.get_stream(path)?;
    let mut tee = Tee {
        inner: resp.body,
        out: BufWriter::with_capacity(1 << 20, file),
    };
    let checked = check(&mut tee)?;
    tee.out.flush()?;
    Ok(checked)
}

/// What this side knows of a backup it checked or wrote.
pub(crate) enum Checked {
    /// Read in full (a backup in clear, or a sealed one with its key: every
    /// checksum, count and seal, the manifest), or written here.
    Contents(Box<BackupReport>),
    /// A sealed backup read without its key: its structure only.
    Structure(SealedStructure),
}

/// A reader whose first bytes were read ahead, giving them back first.
type Peeked<R> = io::Chain<io::Cursor<Vec<u8>>, R>;

/// A backup's first bytes read ahead (`HEADER_PEEK_BYTES`, fewer if it is
/// shorter) to tell a sealed backup from one in clear; the reader returned gives
/// them back, then the rest.
fn peek_sealed<R: Read>(mut input: R) -> io::Result<(bool, Peeked<R>)> {
    let mut start = vec![0u8; container::HEADER_PEEK_BYTES];
    let mut got = 0;
    while let Some(rest) = start.get_mut(got..).filter(|r| !r.is_empty()) {
        match input.read(rest) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    start.truncate(got);
    let sealed = container::header_is_sealed(&start);
    Ok((sealed, io::Cursor::new(start).chain(input)))
}

/// Whether the backup file `path` is sealed (its header says so).
fn file_is_sealed(path: &Path) -> AnyResult<bool> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (sealed, _) = peek_sealed(f).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(sealed)
}

/// Checks one backup to its end: in full if it is in clear or `key` is given
/// (`kiln_docs::verify_backup_with_key`); a sealed one without a key, its
/// structure only (`verify_sealed_structure`, which needs no key).
fn check_backup<R: Read>(
    input: R,
    key: Option<&MasterKey>,
    progress: impl FnMut(u64),
) -> AnyResult<Checked> {
    let (sealed, input) = peek_sealed(input)?;
    Ok(match (sealed, key) {
        (true, None) => Checked::Structure(
            container::verify_sealed_structure(input, progress)
                .map_err(kiln_docs::DocError::from)?,
        ),
        _ => Checked::Contents(Box::new(kiln_docs::verify_backup_with_key(
            input, key, progress,
        )?)),
    })
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

/// The manifest of the backup file `path`; a sealed one's takes `key` (without
/// it: an error naming the key it is sealed under and asking for it).
fn read_manifest_file(path: &Path, key: Option<&MasterKey>) -> AnyResult<BackupManifest> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    kiln_docs::read_manifest_with_key(BufReader::new(f), key)
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

pub fn backup(a: BackupArgs) -> AnyResult<ExitCode> {
    match a.command {
        Some(BackupCommand::Verify {
            files,
            quiet,
            json,
            encryption,
        }) => return verify(&files, quiet, json, &encryption),
        Some(BackupCommand::ChainStop { target, json }) => return chain_stop(&target, json),
        None => {}
    }
    let db = a.target.db.clone().ok_or("--db is required")?;
    let out = a.out.clone().ok_or("--out is required")?;
    // The key reads an encrypted --incremental-since backup and checks a server's
    // backup in full; offline, the data directory is opened with it
    // (`backup_offline`).
    let key = match (&a.target.url, &a.incremental_since) {
        (None, None) => None,
        _ => a.target.encryption.master_key()?,
    };
    let since = read_incremental_base(a.incremental_since.as_deref(), &db, key.as_ref())?;
    let partial = partial_path(&out);
    let started = Instant::now();
    let taking = TakeBackup {
        args: &a,
        db,
        since,
        key,
    };
    match write_backup(&taking, &partial) {
        Ok((checked, file)) => {
            finish_file(file, &partial, &out)?;
            let secs = started.elapsed().as_secs_f64();
            let file = ("file", out.display().to_string().into());
            match checked {
                Checked::Contents(report) => {
                    // The attachments' bytes are inside the backup (its extra files).
                    let blobs = report.attachment_blobs;
                    let mut extra = vec![file, ("attachment_blobs", blobs.into())];
                    let downloaded = a.target.url.is_some();
                    extra.extend(crypt_extras(&report, downloaded, a.json));
                    summary("backup", &report, secs, &extra, a.json);
                }
                Checked::Structure(s) => {
                    let database = ("database", taking.db.clone().into());
                    let label = format!("the backup {}", out.display());
                    structure_summary("backup", &label, &s, secs, &[database, file], a.json);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// The manifest in the `--incremental-since` file: the base of an incremental
/// backup. An encrypted one's is read with `key`; without it, an error asking for
/// `--encryption-key-file`.
fn read_incremental_base(
    path: Option<&Path>,
    db: &str,
    key: Option<&MasterKey>,
) -> AnyResult<Option<BackupManifest>> {
    let Some(path) = path else {
        return Ok(None);
    };
    // A sealed one without the key: the error names the key and asks for it.
    let since = read_manifest_file(path, key).map_err(|e| format!("--incremental-since {e}"))?;
    if since.database != db {
        eprintln!(
            "note: --incremental-since is a backup of database {:?}, backing up {db:?}",
            since.database
        );
    }
    Ok(Some(since))
}

/// The backup `kiln backup` takes.
struct TakeBackup<'a> {
    args: &'a BackupArgs,
    db: String,
    /// An incremental backup's base (`None`: a full backup).
    since: Option<BackupManifest>,
    /// The master key given (`--url`: the backup is checked in full with it).
    key: Option<MasterKey>,
}

/// Writes the backup into the file `partial`, from a running server (`--url`) or
/// offline (`--data-dir`). The file is created first: on failure the caller removes
/// it, whatever failed.
fn write_backup(taking: &TakeBackup, partial: &Path) -> AnyResult<(Checked, File)> {
    let file = File::create(partial)?;
    let target = &taking.args.target;
    if let Some(url) = &target.url {
        let checked = backup_from_server(taking, url, &file)?;
        Ok((checked, file))
    } else if let Some(dir) = &target.data_dir {
        let report = backup_offline(taking, dir, &file)?;
        Ok((Checked::Contents(Box::new(report)), file))
    } else {
        Err(
            crate::UsageError("give --url (a running server) or --data-dir (offline)".into())
                .into(),
        )
    }
}

/// Streams the backup from the server at `url` into `file`, verifying it as it
/// arrives: in full, or (an encrypted server's, no key given) its structure.
fn backup_from_server(taking: &TakeBackup, url: &str, file: &File) -> AnyResult<Checked> {
    let target = &taking.args.target;
    let ep = Endpoint::parse(url, target.api_key.clone(), &target.tls)?;
    let path = backup_request_path(&taking.db, taking.since.as_ref(), taking.args.chain)?;
    let pb = bar(taking.args.quiet, None);
    let key = taking.key.as_ref();
    let checked = stream_checked_backup_to(&ep, &path, file, key, |n| pb.set_position(n))?;
    pb.finish_and_clear();
    Ok(checked)
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

/// The manifests of the files checked as one chain (headers only: fails fast); a
/// sealed backup's manifest is read with `key`. For a restore into a server
/// (`remote`), sealed backups without a key are left to the server, which opens
/// them with its own key and checks everything.
fn precheck(files: &[PathBuf], key: Option<&MasterKey>, remote: bool) -> AnyResult<()> {
    if remote && key.is_none() {
        for p in files {
            if file_is_sealed(p)? {
                return Ok(());
            }
        }
    }
    let mut ms = Vec::new();
    for p in files {
        ms.push((p.display().to_string(), read_manifest_file(p, key)?));
    }
    kiln_docs::check_chain(&ms)?;
    Ok(())
}

fn verify(
    files: &[PathBuf],
    quiet: bool,
    json: bool,
    encryption: &crate::storage_args::EncryptionArgs,
) -> AnyResult<ExitCode> {
    let started = Instant::now();
    refuse_partial(files)?;
    let key = encryption.master_key()?;
    if let [file] = files {
        verify_one(file, key.as_ref(), quiet, json, started)?;
        return Ok(ExitCode::SUCCESS);
    }
    if key.is_none() {
        for p in files {
            if file_is_sealed(p)? {
                return verify_each_without_key(files, quiet, json);
            }
        }
    }
    precheck(files, key.as_ref(), false)?;
    let (source, total) = open_all(files)?;
    let pb = bar(quiet, Some(total));
    let r = kiln_docs::verify_chain_with_key(source, key.as_ref(), |n| pb.set_position(n));
    pb.finish_and_clear();
    let r = r?;
    let encrypted = r
        .backups
        .iter()
        .any(|b| b.encryption_key_fingerprint.is_some());
    let extra: Vec<(&str, Value)> = match json {
        true => vec![
            ("encrypted", encrypted.into()),
            ("contents_verified", true.into()),
        ],
        false => Vec::new(),
    };
    chain_summary(
        "verified chain",
        &r,
        started.elapsed().as_secs_f64(),
        &extra,
        json,
    );
    Ok(ExitCode::SUCCESS)
}

/// A `.partial` file is never a backup, whatever its bytes: its writer stopped
/// before the rename that says it finished (killed while syncing it, the bytes may
/// all be there, but nothing says they were checked and made durable).
fn refuse_partial(files: &[PathBuf]) -> AnyResult<()> {
    match files
        .iter()
        .find(|f| f.to_string_lossy().ends_with(".partial"))
    {
        Some(partial) => Err(format!(
            "{}: an unfinished backup (its writer stopped before renaming it); run the backup again",
            partial.display()
        )
        .into()),
        None => Ok(()),
    }
}

/// `kiln backup verify` of one file: its contents, or without the key of a
/// sealed one, its structure.
fn verify_one(
    file: &Path,
    key: Option<&kiln_storage::MasterKey>,
    quiet: bool,
    json: bool,
    started: Instant,
) -> AnyResult<()> {
    let f = File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let len = f
        .metadata()
        .map_err(|e| format!("{}: {e}", file.display()))?
        .len();
    let pb = bar(quiet, Some(len));
    let input = BufReader::with_capacity(1 << 20, f);
    let r = check_backup(input, key, |n| pb.set_position(n));
    pb.finish_and_clear();
    let r = r.map_err(|e| format!("{}: {e}", file.display()))?;
    let secs = started.elapsed().as_secs_f64();
    let name = ("file", file.display().to_string().into());
    match r {
        Checked::Contents(r) => {
            let mut extra = vec![name];
            extra.extend(crypt_extras(&r, true, json));
            summary("verified", &r, secs, &extra, json);
        }
        Checked::Structure(s) => {
            let label = format!("the backup {}", file.display());
            structure_summary("verified", &label, &s, secs, &[name], json);
        }
    }
    Ok(())
}

/// `kiln backup verify` of several files, some sealed, without a key: each file
/// checked on its own (a sealed one, its structure), the links between them not
/// (they are in the sealed manifests).
fn verify_each_without_key(files: &[PathBuf], quiet: bool, json: bool) -> AnyResult<ExitCode> {
    let started = Instant::now();
    let total: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let pb = bar(quiet, Some(total));
    let mut done = 0u64;
    let mut checked = Vec::new();
    for p in files {
        let f = File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let input = BufReader::with_capacity(1 << 20, f);
        let r = check_backup(input, None, |n| pb.set_position(done + n));
        let r = r.map_err(|e| format!("{}: {e}", p.display()))?;
        done += std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        checked.push((p.as_path(), r));
    }
    pb.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    for (p, r) in &checked {
        if let Checked::Structure(s) = r {
            note_structure_only(&format!("the backup {}", p.display()), s);
        }
    }
    eprintln!(
        "note: the links between the backups (one chain, in order, without gaps) were not \
         checked: they are in the encrypted manifests"
    );
    if json {
        print_each_json(&checked, secs);
    } else {
        print_each_text(&checked, secs);
    }
    Ok(ExitCode::SUCCESS)
}

/// [`verify_each_without_key`]'s answer as JSON.
fn print_each_json(checked: &[(&Path, Checked)], secs: f64) {
    let backups: Vec<Value> = checked
        .iter()
        .map(|(p, r)| {
            let mut v = match r {
                Checked::Contents(r) => {
                    let mut v = serde_json::to_value(r).unwrap_or_default();
                    v["encrypted"] = r.encryption_key_fingerprint.is_some().into();
                    v["contents_verified"] = true.into();
                    v
                }
                Checked::Structure(s) => structure_json(s),
            };
            v["file"] = p.display().to_string().into();
            v
        })
        .collect();
    let v = serde_json::json!({
        "operation": "verified each",
        "encrypted": true,
        "contents_verified": false,
        "chain_verified": false,
        "backups": backups,
        "seconds": secs,
    });
    println!("{v}");
}

/// [`verify_each_without_key`]'s answer as text.
fn print_each_text(checked: &[(&Path, Checked)], secs: f64) {
    println!(
        "verified each (structure only): {} backups; the encrypted ones' contents and the \
         chain's links were NOT verified (no key), {secs:.2} s",
        checked.len()
    );
    for (p, r) in checked {
        match r {
            Checked::Contents(r) => println!("  {}: {}", p.display(), describe(r)),
            Checked::Structure(s) => println!(
                "  {}: encrypted (master key {}), txn {}, {} frames: structure only",
                p.display(),
                s.key_fingerprint,
                s.txn_id,
                s.frames
            ),
        }
    }
}

pub fn restore(a: RestoreArgs) -> AnyResult<ExitCode> {
    let point = match a.until.as_deref() {
        Some(u) => RestorePoint::parse(u)?,
        None => RestorePoint::Latest,
    };
    let offline_dir = restore_target(&a)?;
    let key = match &a.backup_key_file {
        Some(path) => Some(MasterKey::read_file(path)?),
        None => a.storage.encryption.master_key()?,
    };
    precheck(&a.files, key.as_ref(), offline_dir.is_none())?;
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
    // The master key is no storage option: with --url it only lets the pre-check
    // here read the backups' manifests.
    let mut storage = a.storage.clone();
    storage.encryption = Default::default();
    if offline_dir.is_none() && storage.any_given() {
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
    let backup_key = match &a.backup_key_file {
        Some(path) => Some(MasterKey::read_file(path)?),
        None => storage.encryption.clone(),
    };
    let target = kiln_docs::RestoreTarget {
        data_dir: dir,
        name: &a.db,
        storage,
        force: a.force,
    };
    let r = kiln_docs::restore_database_with_backup_key(source, target, backup_key, point, |n| {
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

/// Sends the files back to back to `POST /dbs/{db}/restore` (of a cluster's
/// leader, whichever node `url` names: the body is not sent twice).
fn restore_remote(a: &RestoreArgs, url: &str) -> AnyResult<RestoreReport> {
    let ep = crate::cluster_cmd::leader_or_self(&crate::client::ServerArgs {
        url: url.to_string(),
        api_key: a.api_key.clone(),
        tls: a.tls.clone(),
    })?;
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
