//! Storage options the commands that create databases share (`kiln serve`,
//! `kiln restore --data-dir`, `kiln put`), and the encryption key every command
//! that opens a data directory takes (`EncryptionArgs`).

use clap::Args;
use std::path::PathBuf;

/// The largest journal file a command line may ask for. Each database preallocates
/// (and zero-fills) its current journal file and, past half of it, a spare: 4 GiB
/// files would take 8 GiB of disk per database before a single write.
const MAX_JOURNAL_FILE_SIZE_MIB: u64 = 4096;

#[derive(Args, Clone, Debug)]
pub struct StorageArgs {
    /// Size of each journal file of a database (MiB), preallocated and zero-filled
    /// when the file is made; a new database's first file is 4 MiB (or this size if
    /// smaller), reused among the others once recyclable. A database holds
    /// one, plus a spare once the current one is half full. Larger files roll over
    /// less often. Existing files keep the size they were made with. Default: 64.
    #[arg(
        long,
        value_parser = clap::value_parser!(u64).range(1..=MAX_JOURNAL_FILE_SIZE_MIB)
    )]
    pub journal_file_size_mib: Option<u64>,
    /// When merges of buffered writes and batches of writes ask the disk for the
    /// pages they will read, all at once, before they read them: auto while reads
    /// have been waiting on the disk (data larger than memory) in the last 10 s,
    /// always, or never (docs/design/storage.md §13.3). Default: auto.
    #[arg(long, value_enum)]
    pub read_ahead: Option<ReadAheadArg>,
    /// With --encryption-key-file: MiB of decrypted pages each database keeps for
    /// its readers to share (its hot pages are not decrypted again on every read);
    /// past it, a read decrypts the pages it needs. Default: 64.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    pub decrypted_cache_mib: Option<u64>,
    #[command(flatten)]
    pub encryption: EncryptionArgs,
}

/// The master key of an encrypted data directory (docs/operations.md, "Security").
#[derive(Args, Clone, Debug, Default)]
pub struct EncryptionArgs {
    /// File holding the master key (64 hexadecimal digits; `kiln encryption
    /// new-key` makes one). Databases this creates are encrypted at rest (pages,
    /// journal, attachment blobs, backups); existing encrypted ones need it to open.
    /// Keep it off the data directory's disk.
    #[arg(long, env = "KILN_ENCRYPTION_KEY_FILE", value_name = "FILE")]
    pub encryption_key_file: Option<PathBuf>,
}

impl EncryptionArgs {
    /// The master key, read from its file, if one was given. A key file that others
    /// may read is used, with a warning.
    pub fn master_key(&self) -> crate::AnyResult<Option<kiln_storage::MasterKey>> {
        let Some(path) = &self.encryption_key_file else {
            return Ok(None);
        };
        let key = kiln_storage::MasterKey::read_file(path)?;
        warn_if_others_can_read(path);
        Ok(Some(key))
    }

    /// `options` with the master key set (or left as it is without one).
    pub fn apply_to(&self, options: &mut kiln_storage::Options) -> crate::AnyResult<()> {
        if let Some(key) = self.master_key()? {
            options.encryption = Some(key);
        }
        Ok(())
    }

    /// The document store's default options, with the master key.
    pub fn docs_options(&self) -> crate::AnyResult<kiln_docs::DocsOptions> {
        let mut options = kiln_docs::DocsOptions::default();
        self.apply_to(&mut options.storage)?;
        Ok(options)
    }

    /// The storage engine's default options, with the master key.
    pub fn storage_options(&self) -> crate::AnyResult<kiln_storage::Options> {
        let mut options = kiln_storage::Options::default();
        self.apply_to(&mut options)?;
        Ok(options)
    }
}

/// Once per process: a command reads the key file more than once (its checks, then
/// the store it opens), and one warning says it.
fn warn_if_others_can_read(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            WARNED.store(true, std::sync::atomic::Ordering::Relaxed);
            eprintln!(
                "warning: encryption key file {} can be read by other users (mode {:o}): chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadAheadArg {
    Auto,
    Always,
    Never,
}

impl StorageArgs {
    /// Sets what these arguments choose on `options`, leaving the rest as it is;
    /// fails if the encryption key file cannot be read.
    pub fn apply_to(&self, options: &mut kiln_storage::Options) -> crate::AnyResult<()> {
        self.encryption.apply_to(options)?;
        if let Some(mib) = self.decrypted_cache_mib {
            options.decrypted_cache_bytes = mib << 20;
        }
        if let Some(mib) = self.journal_file_size_mib {
            options.journal_file_size_bytes = mib << 20;
        }
        if let Some(mode) = self.read_ahead {
            options.read_ahead = match mode {
                ReadAheadArg::Auto => kiln_storage::ReadAhead::WhileFaulting,
                ReadAheadArg::Always => kiln_storage::ReadAhead::Always,
                ReadAheadArg::Never => kiln_storage::ReadAhead::Never,
            };
        }
        Ok(())
    }

    /// The document store's default options with these applied.
    pub fn docs_options(&self) -> crate::AnyResult<kiln_docs::DocsOptions> {
        let mut options = kiln_docs::DocsOptions::default();
        self.apply_to(&mut options.storage)?;
        Ok(options)
    }

    /// Whether any storage option was given (a command that cannot honour them
    /// refuses rather than ignores them).
    pub fn any_given(&self) -> bool {
        self.journal_file_size_mib.is_some()
            || self.read_ahead.is_some()
            || self.decrypted_cache_mib.is_some()
            || self.encryption.encryption_key_file.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        storage: StorageArgs,
    }

    #[test]
    fn default_is_the_engine_default_and_out_of_range_sizes_are_refused() {
        let cli = Cli::try_parse_from(["kiln"]).unwrap();
        let mut options = kiln_docs::DocsOptions::default().storage;
        let before = options.journal_file_size_bytes;
        cli.storage.apply_to(&mut options).unwrap();
        assert_eq!(options.journal_file_size_bytes, before);
        assert_eq!(before, 64 << 20, "the help text says 64");
        assert!(!cli.storage.any_given());

        let cli = Cli::try_parse_from(["kiln", "--journal-file-size-mib", "4"]).unwrap();
        cli.storage.apply_to(&mut options).unwrap();
        assert_eq!(options.journal_file_size_bytes, 4 << 20);
        assert!(cli.storage.any_given());

        let cli = Cli::try_parse_from(["kiln", "--read-ahead", "always"]).unwrap();
        cli.storage.apply_to(&mut options).unwrap();
        assert_eq!(options.read_ahead, kiln_storage::ReadAhead::Always);
        assert!(Cli::try_parse_from(["kiln", "--read-ahead", "sometimes"]).is_err());

        for bad in ["0", "4097", "-1", "lots", "18446744073709551615"] {
            assert!(
                Cli::try_parse_from(["kiln", "--journal-file-size-mib", bad]).is_err(),
                "{bad} was accepted"
            );
        }
    }
}
