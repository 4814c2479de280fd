//! Opening an environment up to the point where its threads start, as the steps of
//! docs/design/storage.md §6.1, one function each: `validate_and_lock` (1),
//! `create_or_read_header` (2), `open_data_file` and `replay_while_syncing` (3 and 4),
//! `SyncAtOpen::decide`, `allocator_after_replay` and `settle_synced_point` (5),
//! `open_journal` and `share_state` (6). `open` runs them in that order.

use super::create::{create_environment, load_header};
use super::{replay, JournalTail, RecoveryReport, DATA_FILE, LOCK_FILE};
use crate::alloc::Allocator;
use crate::crypt;
use crate::error::Latch;
use crate::flusher::{self, Applied, Backlog, FlushQueue};
use crate::header::{self, FileHeader};
use crate::io::OpenMode;
use crate::journal::writer::{JournalFiles, JournalPos, JournalWriter, RecordEncoder};
use crate::journal::ReplayStart;
use crate::options::Options;
use crate::page::PageNo;
use crate::seals::Seals;
use crate::shared::{JournalStage, Readers, Shared, Snapshot, WriterState};
use crate::stats::EngineCounters;
use crate::store::PageStore;
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// An environment opened and recovered, its threads not started yet.
pub(crate) struct Opened {
    pub shared: Arc<Shared>,
    /// Held while the environment is open.
    pub lock: Box<dyn Send + Sync>,
    /// The header as of the replayed state: where the flusher starts.
    pub header: FileHeader,
    pub free: BTreeSet<PageNo>,
    pub replay_start: ReplayStart,
    pub report: RecoveryReport,
    /// The replayed state, when it is left for the flusher's first checkpoint to
    /// sync (`SyncAtOpen::Deferred`).
    pub unsynced_replay: Option<Box<Applied>>,
}

pub(crate) fn open(dir: &Path, opts: Options) -> Result<Opened> {
    // design/storage.md §6.1, step 1.
    let (paths, lock) = validate_and_lock(dir, &opts)?;
    let counters = Arc::new(EngineCounters::default());
    // Encrypted or not; a new environment's key and seal file come before its data file.
    let seals = open_encryption(&paths, &opts)?;
    // Step 2.
    let header = create_or_read_header(&paths, &opts, &counters)?;
    // Steps 3 and 4 (the data file's fsync runs beside the replay).
    let store = open_data_file(&paths, &opts, seals)?;
    let replayed = replay_while_syncing(&paths, &header, &store, &opts)?;
    counters
        .records_replayed_on_open
        .store(replayed.physical_records, Relaxed);
    // Step 5: what becomes of the replayed state; the allocator that goes with it.
    let sync = SyncAtOpen::decide(&replayed);
    let report = recovery_report(&replayed);
    let replayed_header = header_at_replay_end(&header, &replayed);
    let replay::Replayed {
        catalog_root,
        page_count,
        free,
        gens,
        replay_start,
        outcome,
        unsynced_frees,
        ..
    } = replayed;
    let alloc = allocator_after_replay(page_count, &free, unsynced_frees, sync);
    let synced_txn_id = match sync {
        SyncAtOpen::Deferred => header.synced_txn_id,
        SyncAtOpen::Nothing | SyncAtOpen::Now => outcome.last_txn_id,
    };
    // Step 6: the journal writer at the replay end, the shared state.
    let journal = open_journal(&paths, &opts, &counters, outcome.end, outcome.last_txn_id)?;
    let journal_kept_bytes = journal.1.end().bytes_since(replay_start.pos);
    let recovered = Recovered {
        snap: Snapshot {
            txn_id: outcome.last_txn_id,
            catalog_root,
            page_count,
            gens,
        },
        alloc,
        synced_txn_id,
        end: outcome.end,
        journal_kept_bytes,
    };
    let shared = share_state(paths, opts, store, counters, journal, recovered);
    // Step 5: the replayed state becomes the synced point (now, or at the flusher's
    // first checkpoint).
    let (header, unsynced_replay) =
        settle_synced_point(&shared, header, replayed_header, &free, sync)?;
    // Step 6: journal files below the header's (and its replay start's) are recyclable.
    shared
        .journal_files
        .release_below(header.journal_file_seq.min(header.replay_from_file_seq));
    Ok(Opened {
        shared,
        lock,
        header,
        free,
        replay_start,
        report,
        unsynced_replay,
    })
}

/// Where an environment's files are.
struct EnvPaths {
    dir: PathBuf,
    journal_dir: PathBuf,
    data_path: PathBuf,
}

/// Step 1: checks the options, creates the data directory and takes `kiln.lock`.
fn validate_and_lock(dir: &Path, opts: &Options) -> Result<(EnvPaths, Box<dyn Send + Sync>)> {
    let dir = dir.to_path_buf();
    opts.validate()?;
    let vfs = &opts.vfs;
    let journal_dir = opts
        .journal_dir
        .clone()
        .unwrap_or_else(|| dir.join("journal"));
    vfs.create_dir_all(&dir)
        .map_err(|e| Error::io(&dir, None, "create data directory", e))?;
    let same = |a: &Path, b: &Path| {
        a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    };
    if same(&journal_dir, &dir) {
        return Err(Error::InvalidOption(format!(
            "journal_dir {} must not be the data directory itself",
            journal_dir.display()
        )));
    }
    let lock_path = dir.join(LOCK_FILE);
    let lock = vfs
        .lock_exclusive(&lock_path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Error::Locked { path: dir.clone() },
            _ => Error::io(&lock_path, None, "lock environment", e),
        })?;
    let data_path = dir.join(DATA_FILE);
    let paths = EnvPaths {
        dir,
        journal_dir,
        data_path,
    };
    Ok((paths, lock))
}

/// Step 2: creates the environment if it has no data file (`recovery/create.rs`),
/// else reads the newest valid copy of its file header.
fn create_or_read_header(
    paths: &EnvPaths,
    opts: &Options,
    counters: &Arc<EngineCounters>,
) -> Result<FileHeader> {
    let EnvPaths {
        dir,
        journal_dir,
        data_path,
    } = paths;
    let vfs = &opts.vfs;
    if !vfs.exists(data_path) {
        return create_environment(
            vfs.clone(),
            dir,
            journal_dir,
            data_path,
            opts,
            counters.clone(),
        );
    }
    if !vfs.exists(journal_dir) {
        return Err(Error::corrupted(
            journal_dir,
            "journal directory",
            "missing while the data file exists (is the journal volume mounted?)",
        ));
    }
    // As for the journal's files (`JournalFiles::open`): a data file created by a
    // process whose directory sync failed has a name only until a power cut.
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(dir, None, "fsync data directory at open", e))?;
    load_header(vfs.as_ref(), data_path)
}

/// The environment's data key and seal file if it is encrypted (`crypt.rs`), made
/// for a new environment given a master key.
fn open_encryption(paths: &EnvPaths, opts: &Options) -> Result<Option<Seals>> {
    let vfs = opts.vfs.as_ref();
    let data_exists = vfs.exists(&paths.data_path);
    let Some(cipher) =
        crypt::open_data_key(vfs, &paths.dir, data_exists, opts.encryption.as_ref())?
    else {
        return Ok(None);
    };
    let seals = if data_exists {
        Seals::open(vfs, &paths.dir, cipher)?
    } else {
        Seals::create(vfs, &paths.dir, cipher)?
    };
    Ok(Some(seals))
}

/// Step 3, first half: opens and maps the data file.
fn open_data_file(paths: &EnvPaths, opts: &Options, seals: Option<Seals>) -> Result<PageStore> {
    let data_path = &paths.data_path;
    let data_file = opts
        .vfs
        .open(
            data_path,
            OpenMode {
                write: true,
                ..Default::default()
            },
        )
        .map_err(|e| Error::io(data_path, None, "open data file", e))?;
    PageStore::open(
        data_path,
        data_file,
        opts.data_grow_step_bytes,
        opts.read_ahead,
        seals,
        opts.decrypted_cache_bytes,
    )
}

/// Steps 3 and 4: fsyncs the data file on a thread of its own while the free-page
/// snapshot is loaded and the journal replayed into the data file; fails if either
/// fails.
///
/// What we read may be only in the OS's cache: a header whose fsync failed before
/// a process restart is visible but not durable, and trusting it (reusing the
/// pages its transactions freed, skipping their replay) would leave the journal
/// unable to rebuild them after a later power loss. Make it durable before open
/// returns, or fail. The sync runs beside the replay (after a kill -9 it took
/// 50-100 ms of the disk's time, on a data file grown by fallocate, that the
/// journal's reading does not need). That is safe because the replay writes only
/// page images of records after this header, whose writer allocated them from
/// pages freed by transactions it had *synced* (`alloc/mod.rs`: a freed page is
/// reused only after the header covering its freeing transaction was fsynced):
/// none is a diff source that a replay from an older durable header would read,
/// and writing them again is idempotent. Nothing else acts on the header before
/// the sync returns (design/storage.md §6.1, step 3).
fn replay_while_syncing(
    paths: &EnvPaths,
    header: &FileHeader,
    store: &PageStore,
    opts: &Options,
) -> Result<replay::Replayed> {
    let vfs = opts.vfs.as_ref();
    std::thread::scope(|scope| {
        let header_sync = std::thread::Builder::new()
            .name("kiln-open-sync".into())
            .spawn_scoped(scope, || store.sync());
        let replayed = header::read_freelist(vfs, &paths.dir, header).and_then(|free| {
            // Replay the journal into the data file (recovery/replay.rs).
            replay::replay(
                vfs,
                &paths.journal_dir,
                &paths.data_path,
                header,
                store,
                free.into_iter().collect::<BTreeSet<PageNo>>(),
                opts,
            )
        });
        match header_sync {
            Ok(thread) => match thread.join() {
                Ok(synced) => synced?,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            // No thread to spare: sync here, after the replay.
            Err(_) => store.sync()?,
        }
        replayed
    })
}

/// Step 5: what becomes of the replayed state.
///
/// The replayed page images are in the data file, not yet synced. Syncing them
/// here made a reopen after 1 GiB of journal wait ~1 s for the disk. Instead the
/// header on disk stays as it is (a second crash replays the same records again:
/// page images are idempotent) and the flusher's first checkpoint syncs them in
/// the background, as it would have after the commits themselves. Until then the
/// pages those records freed stay pending (`alloc/mod.rs`): a second replay may read
/// their old bytes. A torn tail or a hole keeps the sync at open, so that the
/// header moves past what was discarded before anything is written after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncAtOpen {
    /// Nothing replayed past the synced point, clean tail: the header stays as it is.
    Nothing,
    /// Records replayed, clean tail, no gap: the flusher's first checkpoint syncs them.
    Deferred,
    /// A torn tail or a discarded gap: sync, and write a header at the replay end now.
    Now,
}

impl SyncAtOpen {
    fn decide(replayed: &replay::Replayed) -> Self {
        let outcome = &replayed.outcome;
        let clean = outcome.tail == JournalTail::Clean;
        if replayed.physical_records > 0 && clean && outcome.gap_records_discarded == 0 {
            SyncAtOpen::Deferred
        } else if replayed.physical_records > 0 || !clean {
            SyncAtOpen::Now
        } else {
            SyncAtOpen::Nothing
        }
    }
}

/// What `open_with_report` tells about the replay.
fn recovery_report(replayed: &replay::Replayed) -> RecoveryReport {
    let outcome = &replayed.outcome;
    RecoveryReport {
        synced_txn_id: outcome.last_txn_id - replayed.physical_records,
        records_replayed: replayed.physical_records,
        merged_values_filled: replayed.merged_values_filled,
        last_txn_id: outcome.last_txn_id,
        tail: outcome.tail.clone(),
        gap_records_discarded: outcome.gap_records_discarded,
    }
}

/// The header as of the replayed state, as the header `on_disk` continues (its
/// free-page snapshot fields are set by `settle_synced_point`).
fn header_at_replay_end(on_disk: &FileHeader, replayed: &replay::Replayed) -> FileHeader {
    let end = replayed.outcome.end;
    let mut h = FileHeader {
        sequence: on_disk.sequence,
        synced_txn_id: replayed.outcome.last_txn_id,
        catalog_root: replayed.catalog_root,
        page_count: replayed.page_count,
        journal_file_seq: end.file_seq,
        journal_offset: end.offset,
        journal_chain_checksum: end.chain_checksum,
        ..FileHeader::default()
    };
    h.set_replay_start(&replayed.replay_start);
    h
}

/// Step 5: the allocator of the replayed state. When its sync is deferred, the pages
/// the replayed records freed are pending under their freeing transaction, not free:
/// reusable once that checkpoint passes them.
fn allocator_after_replay(
    page_count: u64,
    free: &BTreeSet<PageNo>,
    unsynced_frees: Vec<(u64, Vec<PageNo>)>,
    sync: SyncAtOpen,
) -> Allocator {
    let mut alloc = Allocator::new(page_count, free.iter().copied());
    if sync == SyncAtOpen::Deferred {
        for (txn, pages) in unsynced_frees {
            for p in &pages {
                alloc.free.remove(p);
            }
            alloc.add_pending(txn, pages);
        }
    }
    alloc
}

/// Step 6: the journal's files (recycled from here on) and its writer, at the replay
/// end (`end`, after the record of `last_txn_id`).
fn open_journal(
    paths: &EnvPaths,
    opts: &Options,
    counters: &Arc<EngineCounters>,
    end: JournalPos,
    last_txn_id: u64,
) -> Result<(Arc<JournalFiles>, JournalWriter)> {
    let journal_files = Arc::new(JournalFiles::open(
        opts.vfs.clone(),
        &paths.journal_dir,
        crate::journal::FileSizes::of(opts),
        counters.clone(),
        end.file_seq,
    )?);
    let writer = JournalWriter::open(
        opts.vfs.clone(),
        journal_files.clone(),
        counters.clone(),
        end,
        last_txn_id,
        opts.journal_direct_io,
        opts.durability,
    )?;
    Ok((journal_files, writer))
}

/// The state recovery rebuilt, as the environment starts from it.
struct Recovered {
    /// The last replayed transaction's state.
    snap: Snapshot,
    alloc: Allocator,
    /// The synced point the flusher starts from (the header's while the replay is
    /// not synced, `SyncAtOpen::Deferred`).
    synced_txn_id: u64,
    /// Where the journal continues: the next record's position and chain value.
    end: JournalPos,
    /// The journal from the replay start to its end: what a write buffer rebuilt
    /// by the replay counts as written since its freeze (a node restarted more
    /// often than the buffer froze would otherwise never freeze, and keep every
    /// journal file).
    journal_kept_bytes: u64,
}

/// Step 6: the state shared by the environment's threads, with a `RecordEncoder` that
/// continues the chain from the replay end with a fresh random nonce.
fn share_state(
    paths: EnvPaths,
    opts: Options,
    store: PageStore,
    counters: Arc<EngineCounters>,
    (journal_files, journal): (Arc<JournalFiles>, JournalWriter),
    recovered: Recovered,
) -> Arc<Shared> {
    let Recovered {
        snap,
        alloc,
        synced_txn_id,
        end,
        journal_kept_bytes,
    } = recovered;
    let page_count = snap.page_count;
    let last_txn = snap.txn_id;
    let cipher = store.cipher_arc();
    let shared = Arc::new(Shared {
        dir: paths.dir,
        vfs: opts.vfs.clone(),
        store: Arc::new(store),
        counters: counters.clone(),
        journal_files,
        synced_txn_id: Arc::new(AtomicU64::new(synced_txn_id)),
        readers: Arc::new(Readers::new(snap.clone())),
        writer: Mutex::new(WriterState {
            encoder: RecordEncoder::new(
                end.chain_checksum,
                opts.journal_compression
                    .then_some(opts.journal_compression_adaptive),
                cipher,
                counters,
            ),
            alloc,
            latest: snap,
            merge_cursor: None,
            journal_end: journal.end(),
            merge_jobs: None,
            last_txn_buffer_writes: 0,
            journal_bytes_since_freeze: journal_kept_bytes,
        }),
        merge_ahead_pending: Mutex::new(None),
        writer_waiters: Default::default(),
        journal: Mutex::new(JournalStage {
            writer: journal,
            last_txn,
        }),
        journal_turn: Condvar::new(),
        alloc_summary: Mutex::new((0, 0, page_count)),
        latch: Arc::new(Latch::default()),
        flush_queue: Arc::new(FlushQueue::new(opts.write_back_window_bytes)),
        backlog: Arc::new(Backlog::default()),
        opts,
    });
    shared.note_alloc(&shared.writer.lock().alloc);
    shared
}

/// Step 5: makes the replayed state the synced point, so the journal before it is
/// free: at the flusher's first checkpoint (`SyncAtOpen::Deferred`: returns the
/// replayed state for it, and the header on disk), or now (`SyncAtOpen::Now`: syncs
/// the data file and writes the header and free-page snapshot at the replay end).
/// Returns the header the flusher starts from.
fn settle_synced_point(
    shared: &Shared,
    on_disk: FileHeader,
    replayed: FileHeader,
    free: &BTreeSet<PageNo>,
    sync: SyncAtOpen,
) -> Result<(FileHeader, Option<Box<Applied>>)> {
    match sync {
        SyncAtOpen::Deferred => {
            let unsynced_replay = Box::new(Applied {
                txn_id: replayed.synced_txn_id,
                catalog_root: replayed.catalog_root,
                page_count: replayed.page_count,
                pages: Vec::new(),
                freed: Vec::new(),
                end: JournalPos {
                    file_seq: replayed.journal_file_seq,
                    offset: replayed.journal_offset,
                    chain_checksum: replayed.journal_chain_checksum,
                },
                froze: false,
                merge_done: false,
                buffer_empty: false,
            });
            Ok((on_disk, Some(unsynced_replay)))
        }
        SyncAtOpen::Now => {
            shared.store.sync()?;
            let freelist = header::encode_freelist(free.iter().copied());
            let h = FileHeader {
                sequence: on_disk.sequence + 1,
                freelist_checksum: crc32c::crc32c(&freelist),
                freelist_len: freelist.len() as u64,
                ..replayed
            };
            flusher::write_header(&shared.flusher_handle(), &h, &freelist)?;
            Ok((h, None))
        }
        SyncAtOpen::Nothing => Ok((
            FileHeader {
                freelist_checksum: on_disk.freelist_checksum,
                freelist_len: on_disk.freelist_len,
                ..replayed
            },
            None,
        )),
    }
}
