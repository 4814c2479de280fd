//! `kiln backup`, `kiln backup verify`, `kiln restore`: full backups of a database
//! (see `kiln_storage::backup` for the format and `kiln_docs::backup` for the
//! manifest).
//!
//! - `kiln backup --url U --db DB --out FILE [--api-key K]` streams
//!   `GET /dbs/{db}/backup` of a running server into FILE, verifying every checksum
//!   as the bytes arrive.
//! - `kiln backup --data-dir D --db DB --out FILE` backs up a database of a data
//!   directory no server is running on.
//! - `kiln restore FILE --data-dir D --db NAME [--force]` creates database NAME in
//!   the (offline) data directory D from a backup.
//! - `kiln backup verify FILE` checks a backup without restoring it.
//!
//! The output file is written as `FILE.partial`, synced, and renamed to FILE only
//! once complete and verified.

use crate::client::{path_escape, Endpoint};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_docs::BackupReport;
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
    /// A running server, e.g. http://127.0.0.1:8080 (or use --data-dir).
    #[arg(long, conflicts_with = "data_dir")]
    pub url: Option<String>,
    /// A data directory no server is running on (or use --url).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The database.
    #[arg(long)]
    pub db: Option<String>,
    /// Where to write the backup.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// API key for a server running with --auth.
    #[arg(long)]
    pub api_key: Option<String>,
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

#[derive(clap::Subcommand)]
pub enum BackupCommand {
    /// Check a backup file (every checksum, count and the chunk order) without
    /// restoring it.
    Verify {
        file: PathBuf,
        #[arg(long, short)]
        quiet: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The backup file.
    pub file: PathBuf,
    /// The data directory (no server may be running on it).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The name of the database to create.
    #[arg(long)]
    pub db: String,
    /// Replace an existing database of that name (only once the restore succeeded).
    #[arg(long)]
    pub force: bool,
    #[arg(long, short)]
    pub quiet: bool,
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

fn summary(what: &str, r: &BackupReport, secs: f64, extra: &[(&str, String)], json: bool) {
    let mb_s = r.file_bytes as f64 / 1e6 / secs.max(1e-9);
    if json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        v["operation"] = what.into();
        v["seconds"] = secs.into();
        v["mb_per_s"] = mb_s.into();
        for (k, val) in extra {
            v[*k] = val.clone().into();
        }
        println!("{v}");
    } else {
        println!(
            "{what}: database {} at etag {} (txn {}), {} documents, {} entries in {} trees, \
             {} data bytes, {} file bytes, {:.2} s ({:.1} MB/s), Kiln {}",
            r.manifest.database,
            r.manifest.etag.as_deref().unwrap_or("(none)"),
            r.manifest.txn_id,
            r.manifest.documents,
            r.entries,
            r.trees,
            r.data_bytes,
            r.file_bytes,
            secs,
            mb_s,
            r.manifest.kiln_version
        );
        for (k, val) in extra {
            println!("  {k}: {val}");
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

fn partial_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Syncs the finished `.partial` file and renames it to `out`.
fn finish_file(file: File, partial: &Path, out: &Path) -> AnyResult<()> {
    file.sync_all()?;
    drop(file);
    std::fs::rename(partial, out)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

pub fn backup(a: BackupArgs) -> AnyResult<ExitCode> {
    if let Some(BackupCommand::Verify { file, quiet, json }) = a.command {
        return verify(&file, quiet, json);
    }
    let db = a.db.ok_or("--db is required")?;
    let out = a.out.ok_or("--out is required")?;
    let partial = partial_path(&out);
    let started = Instant::now();
    let result = (|| -> AnyResult<(BackupReport, File)> {
        let file = File::create(&partial)?;
        if let Some(url) = &a.url {
            let ep = Endpoint::parse(url, a.api_key.clone())?;
            let resp = ep.get_stream(&format!("/dbs/{}/backup", path_escape(&db)))?;
            let pb = bar(a.quiet, None);
            let tee = Tee {
                inner: resp.body,
                out: BufWriter::with_capacity(1 << 20, &file),
            };
            // Verified as it arrives: a truncated or damaged stream is refused.
            let mut tee = tee;
            let report = kiln_docs::verify_backup(&mut tee, |n| pb.set_position(n))?;
            tee.out.flush()?;
            drop(tee);
            pb.finish_and_clear();
            Ok((report, file))
        } else if let Some(dir) = &a.data_dir {
            let store = kiln_docs::DocStore::open(dir, kiln_docs::DocsOptions::default())?;
            let database = store.database(&db)?;
            let pb = bar(a.quiet, None);
            let opts = kiln_storage::BackupOptions {
                compress: !a.no_compress,
            };
            let report = {
                let mut w = BufWriter::with_capacity(1 << 20, &file);
                let r = database.backup_to(&mut w, opts, |n| pb.set_position(n))?;
                w.flush()?;
                r
            };
            pb.finish_and_clear();
            drop(database);
            store.close()?;
            Ok((report, file))
        } else {
            Err("give --url (a running server) or --data-dir (offline)".into())
        }
    })();
    match result {
        Ok((report, file)) => {
            finish_file(file, &partial, &out)?;
            let secs = started.elapsed().as_secs_f64();
            summary(
                "backup",
                &report,
                secs,
                &[("file", out.display().to_string())],
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

fn verify(file: &Path, quiet: bool, json: bool) -> AnyResult<ExitCode> {
    let f = File::open(file)?;
    let len = f.metadata()?.len();
    let pb = bar(quiet, Some(len));
    let started = Instant::now();
    let r = kiln_docs::verify_backup(BufReader::with_capacity(1 << 20, f), |n| pb.set_position(n));
    pb.finish_and_clear();
    let r = r?;
    summary(
        "verified",
        &r,
        started.elapsed().as_secs_f64(),
        &[("file", file.display().to_string())],
        json,
    );
    Ok(ExitCode::SUCCESS)
}

pub fn restore(a: RestoreArgs) -> AnyResult<ExitCode> {
    let f = File::open(&a.file)?;
    let len = f.metadata()?.len();
    let pb = bar(a.quiet, Some(len));
    let started = Instant::now();
    let r = kiln_docs::restore_database(
        BufReader::with_capacity(1 << 20, f),
        &a.data_dir,
        &a.db,
        kiln_docs::DocsOptions::default().storage,
        a.force,
        |n| pb.set_position(n),
    );
    pb.finish_and_clear();
    let r = r?;
    summary(
        "restored",
        &r,
        started.elapsed().as_secs_f64(),
        &[
            ("restored_as", a.db.clone()),
            ("data_dir", a.data_dir.display().to_string()),
        ],
        a.json,
    );
    Ok(ExitCode::SUCCESS)
}
