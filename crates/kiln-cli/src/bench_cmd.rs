//! `kiln bench` and `kiln disk-bench`: the workloads live in the kiln-bench crate.
//! What this adds: the part of W14 that only kiln-cli has (`kiln backup`'s and `kiln
//! restore`'s own code), and the exit code 2 of a bad command line.

use crate::backup_cmd::{finish_file, open_all, stream_checked_backup_to, Checked};
use crate::client::Endpoint;
use crate::{AnyResult, UsageError};
use kiln_bench::diskbench::{self, DiskBenchError};
use kiln_bench::{BackupFigures, BackupTool, BenchArgs, BenchResult, DiskBenchArgs};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub fn bench(args: BenchArgs) -> AnyResult<()> {
    let tool = BackupTool {
        http_backup,
        open_backup,
    };
    kiln_bench::bench::run(args, Some(tool)).map_err(|e| {
        match e.downcast::<kiln_bench::UsageError>() {
            Ok(usage) => UsageError(usage.0).into(),
            Err(e) => e,
        }
    })
}

pub fn disk_bench(args: DiskBenchArgs) -> AnyResult<()> {
    diskbench::run(args).map_err(|e| match e {
        DiskBenchError::BadArgument(_) => UsageError(e.to_string()).into(),
        e => e.into(),
    })
}

/// A full backup of `bench` without a chain over HTTP into `out` (written as
/// `out.partial`, verified, synced, renamed: `kiln backup` without `--chain`).
fn http_backup(addr: SocketAddr, out: &Path) -> BenchResult<BackupFigures> {
    let ep = Endpoint::parse(&format!("http://{addr}"), None, &Default::default())?;
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let file = File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    // An encrypted run's backups are sealed: checked with its master key.
    let key = kiln_bench::querybench::ENCRYPTION.get();
    let report = match stream_checked_backup_to(&ep, "/dbs/bench/backup", &file, key, |_| {})? {
        Checked::Contents(report) => report,
        Checked::Structure(_) => return Err("a sealed backup read without its key".into()),
    };
    finish_file(file, &partial, out)?;
    Ok(BackupFigures {
        data_bytes: report.data_bytes,
        file_bytes: report.file_bytes,
        documents: report.manifest.documents,
    })
}

/// A backup file as `kiln restore` reads it.
fn open_backup(file: &Path) -> BenchResult<kiln_docs::RestoreSource<'static>> {
    let (source, _) = open_all(std::slice::from_ref(&file.to_path_buf()))?;
    Ok(source)
}
