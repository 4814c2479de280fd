//! `kiln kv`: raw key-value access to one storage environment, below the document
//! layer (for inspecting a database's trees or using the engine on its own).

use clap::Subcommand;
use kiln_storage::Env;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum KvCommand {
    /// Store a value (creates the environment and the tree if needed).
    Put {
        /// The storage environment's directory.
        #[arg(long, default_value = "./kiln-kv")]
        dir: PathBuf,
        /// The tree (a named key space).
        tree: String,
        /// The key.
        key: String,
        /// The value, as text.
        value: String,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
    },
    /// Print a value.
    Get {
        /// The storage environment's directory.
        #[arg(long, default_value = "./kiln-kv")]
        dir: PathBuf,
        /// The tree (a named key space).
        tree: String,
        /// The key.
        key: String,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
    },
    /// List keys and values of a tree in order (or in reverse).
    Scan {
        /// The storage environment's directory.
        #[arg(long, default_value = "./kiln-kv")]
        dir: PathBuf,
        /// The tree (a named key space).
        tree: String,
        /// Start at the first key >= this one.
        #[arg(long)]
        from: Option<String>,
        /// From the last key down.
        #[arg(long)]
        reverse: bool,
        /// Entries at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        encryption: crate::storage_args::EncryptionArgs,
    },
}

pub fn run(cmd: KvCommand) -> crate::AnyResult<ExitCode> {
    match cmd {
        KvCommand::Put {
            dir,
            tree,
            key,
            value,
            encryption,
        } => {
            let env = Env::open(&dir, encryption.storage_options()?)?;
            let mut w = env.begin_write()?;
            w.ensure_tree(&tree)?;
            w.put(&tree, key.as_bytes(), value.as_bytes())?;
            let txn = w.commit()?;
            env.close()?;
            println!("committed txn {txn}");
        }
        KvCommand::Get {
            dir,
            tree,
            key,
            encryption,
        } => {
            crate::inspect_cmd::require_env(&dir)?;
            let env = Env::open(&dir, encryption.storage_options()?)?;
            let r = env.begin_read()?;
            match r.get(&tree, key.as_bytes())? {
                Some(v) => println!("{}", String::from_utf8_lossy(v)),
                None => {
                    eprintln!("not found: {key:?} in tree {tree:?}");
                    return Ok(ExitCode::from(crate::exit::NOT_FOUND));
                }
            }
        }
        KvCommand::Scan {
            dir,
            tree,
            from,
            reverse,
            limit,
            encryption,
        } => {
            crate::inspect_cmd::require_env(&dir)?;
            let env = Env::open(&dir, encryption.storage_options()?)?;
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
    }
    Ok(ExitCode::SUCCESS)
}
