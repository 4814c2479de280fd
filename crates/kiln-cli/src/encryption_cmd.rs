//! `kiln encryption`: make a master key, see which databases of a data directory
//! are encrypted and under which key, and change the master key (offline: only the
//! wrapped data keys are rewritten, never the data).

use crate::AnyResult;
use clap::Subcommand;
use kiln_storage::crypt::{self, MasterKey};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum EncryptionCommand {
    /// Write a new random master key (64 hexadecimal digits) to a file made readable
    /// by its owner only (`-` prints it); an existing file is never overwritten.
    NewKey {
        /// Where to write the key.
        #[arg(long)]
        out: PathBuf,
    },
    /// List every storage environment of a data directory (databases, a cluster
    /// node's log) with whether it is encrypted and the fingerprint of the master
    /// key that wraps its data key; with --encryption-key-file, whether that key
    /// opens each.
    Status {
        /// The data directory (as given to `kiln serve`).
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
        /// One JSON object per environment, on one line each.
        #[arg(long)]
        json: bool,
    },
    /// Change the master key of every encrypted environment of a data directory no
    /// server is running on: each data key is unwrapped with the current key and
    /// wrapped again with the new one (a rename per environment; the data is not
    /// touched). Run again after an interruption: environments already under the
    /// new key are skipped. Backups made before keep needing the old key.
    RotateKey {
        /// The data directory (as given to `kiln serve`).
        #[arg(long, default_value = "./kiln-data")]
        data_dir: PathBuf,
        /// The current master key's file.
        #[arg(long, value_name = "FILE")]
        encryption_key_file: PathBuf,
        /// The new master key's file (`kiln encryption new-key` makes one).
        #[arg(long, value_name = "FILE")]
        new_key_file: PathBuf,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: EncryptionCommand) -> AnyResult<ExitCode> {
    match cmd {
        EncryptionCommand::NewKey { out } => new_key(&out),
        EncryptionCommand::Status {
            data_dir,
            encryption,
            json,
        } => status(&data_dir, encryption.master_key()?.as_ref(), json),
        EncryptionCommand::RotateKey {
            data_dir,
            encryption_key_file,
            new_key_file,
            json,
        } => rotate(&data_dir, &encryption_key_file, &new_key_file, json),
    }
}

fn new_key(out: &Path) -> AnyResult<ExitCode> {
    let key = MasterKey::generate();
    if out == Path::new("-") {
        println!("{}", key.to_hex().as_str());
        return Ok(ExitCode::SUCCESS);
    }
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| format!("cannot create key file {}: {e}", out.display()))?;
    writeln!(file, "{}", key.to_hex().as_str())?;
    file.sync_all()?;
    eprintln!(
        "wrote master key {} to {} (keep a copy somewhere safe: without it the data cannot be read)",
        key.fingerprint(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Every storage environment under `dir` (a directory holding a data file), found
/// by walking it; `trash/` (databases being removed or built) included.
fn environments(dir: &Path) -> AnyResult<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Err(crate::exit::NotFound(format!(
            "the data directory {} does not exist",
            dir.display()
        ))
        .into());
    }
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if d.join(kiln_storage::DATA_FILE).exists() {
            found.push(d.clone());
        }
        for entry in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

fn status(dir: &Path, key: Option<&MasterKey>, json: bool) -> AnyResult<ExitCode> {
    let mut all_open = true;
    for env in environments(dir)? {
        let name = env.strip_prefix(dir).unwrap_or(&env).display().to_string();
        let wrapped_by = crypt::wrapped_by(&env)?;
        let opens = match (key, &wrapped_by) {
            (Some(k), Some(_)) => Some(crypt::check_master_key(&env, k).is_ok()),
            _ => None,
        };
        all_open &= opens != Some(false);
        if json {
            println!(
                "{}",
                serde_json::json!({"environment": name, "encrypted": wrapped_by.is_some(),
                    "wrapped_by": wrapped_by, "key_opens": opens})
            );
        } else {
            let what = match (&wrapped_by, opens) {
                (None, _) => "not encrypted".to_string(),
                (Some(f), None) => format!("encrypted, master key {f}"),
                (Some(f), Some(true)) => format!("encrypted, master key {f} (the key given)"),
                (Some(f), Some(false)) => format!("encrypted, master key {f}: NOT the key given"),
            };
            println!("{name}: {what}");
        }
    }
    Ok(if all_open {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn rotate(dir: &Path, old_file: &Path, new_file: &Path, json: bool) -> AnyResult<ExitCode> {
    let old = MasterKey::read_file(old_file)?;
    let new = MasterKey::read_file(new_file)?;
    if old.fingerprint() == new.fingerprint() {
        return Err(crate::UsageError("the new key is the current key".into()).into());
    }
    // No server (nor another command) may have the directory open meanwhile.
    let _lock = kiln_docs::DataDirLock::acquire(dir, "kiln encryption rotate-key")?;
    let (mut rotated, mut already, mut plain) = (0u64, 0u64, 0u64);
    for env in environments(dir)? {
        match crypt::wrapped_by(&env)? {
            None => plain += 1,
            Some(f) if f == new.fingerprint() && crypt::check_master_key(&env, &new).is_ok() => {
                already += 1
            }
            Some(_) => {
                crypt::rotate_master_key(&env, &old, &new)
                    .map_err(|e| format!("{}: {e}", env.display()))?;
                rotated += 1;
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"rotated": rotated, "already_under_new_key": already,
                "not_encrypted": plain, "new_key": new.fingerprint()})
        );
    } else {
        println!(
            "{rotated} environments now under master key {} ({already} already were; {plain} not encrypted)",
            new.fingerprint()
        );
    }
    Ok(ExitCode::SUCCESS)
}
