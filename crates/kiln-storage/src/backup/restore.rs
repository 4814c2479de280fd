//! Restoring a container into a new environment: built in a staging directory
//! beside the target, synced, then moved into place.

use super::*;

#[derive(Clone, Default)]
pub struct RestoreOptions {
    /// Options of the new environment.
    pub storage: Options,
    /// Where the environment is built before it is renamed to the target (must be
    /// on the same filesystem). Default: a hidden directory next to the target.
    pub staging_dir: Option<PathBuf>,
}

fn fs_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BackupError + 'a {
    move |source| BackupError::Fs {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn sync_dir(vfs: &dyn Vfs, dir: &Path) -> BackupResult<()> {
    vfs.sync_dir(dir).map_err(fs_err("syncing directory", dir))
}

/// Restores a backup into a new environment at `target`, which must not exist; a
/// sealed backup is opened with `opts.storage.encryption`, the new environment's
/// master key (see `restore_into_with_files`).
/// Every checksum is verified while the environment is written into a staging
/// directory; only a fully verified, synced and closed environment is renamed to
/// `target`. On any failure the staging directory is removed; a crash leaves only
/// the staging directory (a hidden `.name.restore-*` next to the target, or the
/// caller's `staging_dir`), never `target`. Every file operation goes through
/// `opts.storage.vfs`, so a simulated disk can fail or cut any step.
pub fn restore_from<R: Read>(
    input: R,
    target: &Path,
    opts: RestoreOptions,
    progress: impl FnMut(u64),
) -> BackupResult<BackupSummary> {
    let vfs = opts.storage.vfs.clone();
    if vfs.exists(target) {
        return Err(BackupError::TargetExists(target.to_path_buf()));
    }
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let staging = match opts.staging_dir.clone() {
        Some(s) => s,
        None => default_staging_dir(target, &parent),
    };
    if vfs.exists(&staging) {
        return Err(BackupError::TargetExists(staging));
    }
    let result = restore_staged(input, &staging, opts.storage, progress);
    let result = result.and_then(|sum| {
        if vfs.exists(target) {
            return Err(BackupError::TargetExists(target.to_path_buf()));
        }
        vfs.rename(&staging, target)
            .map_err(fs_err("renaming into place", target))?;
        // A failed restore leaves nothing, even here: the target is complete, but
        // its name may not survive a power cut, and the caller is told it failed.
        if let Err(e) = sync_dir(vfs.as_ref(), &parent) {
            let _ = vfs.remove_dir_all(target);
            return Err(e);
        }
        Ok(sum)
    });
    if result.is_err() && vfs.exists(&staging) {
        let _ = vfs.remove_dir_all(&staging);
    }
    result
}

/// A hidden `.name.restore-<pid>-<nanos>` beside the target: on the same file
/// system (so the final rename is atomic) and never the name of an earlier attempt.
fn default_staging_dir(target: &Path, parent: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kiln".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    parent.join(format!(".{name}.restore-{}-{nanos}", std::process::id()))
}

/// The options a restore builds its environment with: it is synced and closed
/// before it is put into place, so its journal need not be synced commit by commit.
pub fn staging_options(mut storage: Options) -> Options {
    storage.journal_dir = None;
    storage.durability = crate::Durability::Buffered {
        sync_interval_ms: 1000,
    };
    storage
}

fn restore_staged<R: Read>(
    input: R,
    staging: &Path,
    storage: Options,
    progress: impl FnMut(u64),
) -> BackupResult<BackupSummary> {
    let vfs = storage.vfs.clone();
    let env = Env::open(staging, staging_options(storage))?;
    // A bare environment's trees are restored uncounted (their counts are not in
    // the container; see `restore_into`).
    let sum = restore_into(&env, input, false, &|_| false, progress)?;
    env.sync()?;
    env.close()?;
    sync_dir(vfs.as_ref(), staging)?;
    Ok(sum)
}

/// Writes every tree and entry of one container into `env` (an environment the
/// caller opened, normally empty and in a staging place), committing every
/// ~32 MiB. See `read_container` for `stop_at_trailer`. The caller syncs, closes
/// and puts the environment into place. A tree named so that `counted(name)` is
/// created counted (`WriteTxn::create_counted_tree`): the container does not say
/// (a tree's counts are derived data, and whether it keeps them is its role, which
/// the caller knows), so a backup of any build restores with the caller's choice.
pub fn restore_into<R: Read>(
    env: &Env,
    input: R,
    stop_at_trailer: bool,
    counted: &dyn Fn(&str) -> bool,
    progress: impl FnMut(u64),
) -> BackupResult<BackupSummary> {
    restore_into_with_files(
        env,
        input,
        stop_at_trailer,
        counted,
        progress,
        |_, _| Ok(()),
    )
}

/// `restore_into`, handing the container's extra files (`Item::File`,
/// `Item::FileData`, `Item::FileEnd`) to `files` as they are read: the caller
/// writes them where they belong (the engine only checks their bytes).
///
/// A sealed backup is opened with `env`'s own master key: it restores only into an
/// encrypted environment, whose key must be the one the backup is sealed under
/// (into an environment without encryption it is refused, naming the key it needs).
pub fn restore_into_with_files<R: Read>(
    env: &Env,
    input: R,
    stop_at_trailer: bool,
    counted: &dyn Fn(&str) -> bool,
    progress: impl FnMut(u64),
    files: impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<BackupSummary> {
    let master = env.begin_read()?.master_key().cloned();
    let input = KeyedInput {
        input,
        key: master.as_ref(),
    };
    restore_into_keyed(env, input, stop_at_trailer, counted, progress, files)
}

/// A backup to read, and the master key a sealed one opens with.
pub struct KeyedInput<'k, R> {
    pub input: R,
    pub key: Option<&'k MasterKey>,
}

/// `restore_into_with_files` of a backup sealed under `input.key` (a master key
/// other than the environment's own: a backup of another data directory, or made
/// before a change of master key); the environment keeps its own key.
pub fn restore_into_keyed<R: Read>(
    env: &Env,
    input: KeyedInput<'_, R>,
    stop_at_trailer: bool,
    counted: &dyn Fn(&str) -> bool,
    progress: impl FnMut(u64),
    mut files: impl FnMut(&BackupSummary, Item<'_>) -> BackupResult<()>,
) -> BackupResult<BackupSummary> {
    let KeyedInput { input, key } = input;
    let mut txn: Option<crate::WriteTxn<'_>> = None;
    let mut tree = String::new();
    let mut pending = 0u64;
    let sum = read_container_with_key(input, key, stop_at_trailer, progress, |sum, item| {
        match item {
            Item::Header | Item::EndTree => {}
            Item::File { .. } | Item::FileData(_) | Item::FileEnd => files(sum, item)?,
            Item::Tree(name) => {
                let w = match txn.as_mut() {
                    Some(w) => w,
                    None => txn.insert(env.begin_write()?),
                };
                if counted(name) {
                    w.create_counted_tree(name)?;
                } else {
                    w.create_tree(name)?;
                }
                tree = name.to_string();
            }
            Item::Entry(k, v) => {
                let w = match txn.as_mut() {
                    Some(w) => w,
                    None => txn.insert(env.begin_write()?),
                };
                w.put(&tree, k, v)?;
                pending += (k.len() + v.len()) as u64;
                if pending >= RESTORE_TXN_BYTES {
                    if let Some(w) = txn.take() {
                        w.commit()?;
                    }
                    pending = 0;
                }
            }
        }
        Ok(())
    })?;
    if let Some(w) = txn.take() {
        w.commit()?;
    }
    Ok(sum)
}
