//! Opening an environment up to the point where its threads start: lock the
//! directory, create the environment or read its header, replay the journal, build
//! the shared state, and make the replayed state the synced point.

use super::create::{create_environment, load_header};
use super::{replay, JournalTail, RecoveryReport, DATA_FILE, LOCK_FILE};
use crate::alloc::Allocator;
use crate::error::Latch;
use crate::flusher::{self, Applied, Backlog, FlushQueue};
use crate::header::{self, FileHeader};
use crate::io::OpenMode;
use crate::journal::writer::{JournalFiles, JournalWriter, RecordEncoder};
use crate::journal::ReplayStart;
use crate::options::Options;
use crate::page::PageNo;
use crate::shared::{JournalStage, Readers, Shared, Snapshot, WriterState};
use crate::stats::EngineCounters;
use crate::store::PageStore;
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;
use std::path::Path;
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
    /// sync (see `defer_sync` in `open`).
    pub unsynced_replay: Option<Box<Applied>>,
}

pub(crate) fn open(dir: &Path, opts: Options) -> Result<Opened> {
    let dir = dir.to_path_buf();
    opts.validate()?;
    let vfs = opts.vfs.clone();
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
        return Err(Error::InvalidOption(
            "journal_dir must not be the data directory itself".into(),
        ));
    }
    let lock_path = dir.join(LOCK_FILE);
    let lock = vfs
        .lock_exclusive(&lock_path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Error::Locked { path: dir.clone() },
            _ => Error::io(&lock_path, None, "lock environment", e),
        })?;
    let data_path = dir.join(DATA_FILE);
    let counters = Arc::new(EngineCounters::default());
    let header = if vfs.exists(&data_path) {
        if !vfs.exists(&journal_dir) {
            return Err(Error::corrupted(
                &journal_dir,
                "journal directory",
                "missing while the data file exists (is the journal volume mounted?)",
            ));
        }
        // As for the journal's files (`JournalFiles::open`): a data file created by a
        // process whose directory sync failed has a name only until a power cut.
        vfs.sync_dir(&dir)
            .map_err(|e| Error::io(&dir, None, "fsync data directory at open", e))?;
        load_header(vfs.as_ref(), &data_path)?
    } else {
        create_environment(
            vfs.clone(),
            &dir,
            &journal_dir,
            &data_path,
            &opts,
            counters.clone(),
        )?
    };
    let data_file = vfs
        .open(
            &data_path,
            OpenMode {
                write: true,
                ..Default::default()
            },
        )
        .map_err(|e| Error::io(&data_path, None, "open data file", e))?;
    let store = PageStore::open(&data_path, data_file, opts.data_grow_step_bytes)?;
    // What we read may be only in the OS's cache: a header whose fsync failed before
    // a process restart is visible but not durable, and trusting it (reusing the
    // pages its transactions freed, skipping their replay) would leave the journal
    // unable to rebuild them after a later power loss. Make it durable before open
    // returns, or fail. The sync runs beside the replay (after a kill -9 it took
    // 50-100 ms of the disk's time, on a data file grown by fallocate, that the
    // journal's reading does not need). That is safe because the replay writes only
    // page images of records after this header, whose writer allocated them from
    // pages freed by transactions it had *synced* (`alloc/mod.rs`: a freed page is
    // reused only after the header covering its freeing transaction was fsynced):
    // none is a diff source that a replay from an older durable header would read,
    // and writing them again is idempotent. Nothing else acts on the header before
    // the sync returns (design.md §6.1, step 3).
    let replayed = std::thread::scope(|scope| {
        let header_sync = std::thread::Builder::new()
            .name("kiln-open-sync".into())
            .spawn_scoped(scope, || store.sync());
        let replayed = header::read_freelist(vfs.as_ref(), &dir, &header).and_then(|free| {
            // Replay the journal into the data file (recovery/replay.rs).
            replay::replay(
                vfs.as_ref(),
                &journal_dir,
                &data_path,
                &header,
                &store,
                free.into_iter().collect::<BTreeSet<PageNo>>(),
                &opts,
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
    })?;
    counters
        .records_replayed_on_open
        .store(replayed.physical_records, Relaxed);
    let replay::Replayed {
        catalog_root,
        page_count,
        free,
        gens,
        replay_start,
        outcome,
        physical_records,
        merged_values_filled,
        unsynced_frees,
    } = replayed;
    // The replayed page images are in the data file, not yet synced. Syncing them
    // here made a reopen after 1 GiB of journal wait ~1 s for the disk. Instead the
    // header on disk stays as it is (a second crash replays the same records again:
    // page images are idempotent) and the flusher's first checkpoint syncs them in
    // the background, as it would have after the commits themselves. Until then the
    // pages those records freed stay pending (`alloc/mod.rs`): a second replay may read
    // their old bytes. A torn tail or a hole keeps the sync at open, so that the
    // header moves past what was discarded before anything is written after it.
    let defer_sync = physical_records > 0
        && outcome.tail == JournalTail::Clean
        && outcome.gap_records_discarded == 0;
    let mut alloc = Allocator::new(page_count, free.iter().copied());
    let synced_txn_id = if defer_sync {
        for (txn, pages) in unsynced_frees {
            for p in &pages {
                alloc.free.remove(p);
            }
            alloc.add_pending(txn, pages);
        }
        header.synced_txn_id
    } else {
        outcome.last_txn_id
    };
    let on_disk_header = header.clone();
    let journal_files = Arc::new(JournalFiles::open(
        vfs.clone(),
        &journal_dir,
        crate::journal::FileSizes::of(&opts),
        counters.clone(),
        outcome.end.file_seq,
    )?);

    let mut shared_header = FileHeader {
        sequence: header.sequence,
        synced_txn_id: outcome.last_txn_id,
        catalog_root,
        page_count,
        journal_file_seq: outcome.end.file_seq,
        journal_offset: outcome.end.offset,
        journal_chain_checksum: outcome.end.chain_checksum,
        ..FileHeader::default()
    };
    shared_header.set_replay_start(&replay_start);
    let journal = JournalWriter::open(
        vfs.clone(),
        journal_files.clone(),
        counters.clone(),
        outcome.end,
        opts.journal_direct_io,
        opts.durability,
    )?;
    let snap = Snapshot {
        txn_id: outcome.last_txn_id,
        catalog_root,
        page_count,
        gens,
    };
    let shared = Arc::new(Shared {
        dir: dir.clone(),
        opts: opts.clone(),
        vfs: vfs.clone(),
        store: Arc::new(store),
        counters: counters.clone(),
        journal_files,
        synced_txn_id: Arc::new(AtomicU64::new(synced_txn_id)),
        readers: Arc::new(Readers::new(snap.clone())),
        writer: Mutex::new(WriterState {
            encoder: RecordEncoder::new(
                outcome.end.chain_checksum,
                opts.journal_compression
                    .then_some(opts.journal_compression_adaptive),
                counters.clone(),
            ),
            alloc,
            latest: snap.clone(),
            merge_cursor: None,
            journal_end: journal.end(),
            merge_jobs: None,
            last_txn_buffer_writes: 0,
        }),
        merge_ahead_pending: Mutex::new(None),
        writer_waiters: Default::default(),
        journal: Mutex::new(JournalStage {
            writer: journal,
            last_txn: outcome.last_txn_id,
        }),
        journal_turn: Condvar::new(),
        alloc_summary: Mutex::new((0, 0, page_count)),
        latch: Arc::new(Latch::default()),
        flush_queue: Arc::new(FlushQueue::new(opts.write_back_window_bytes)),
        backlog: Arc::new(Backlog::default()),
    });
    shared.note_alloc(&shared.writer.lock().alloc);
    // Make the replayed state the synced point, so the journal before it is free
    // (now, or at the flusher's first checkpoint: see `defer_sync`).
    let mut unsynced_replay = None;
    let header = if defer_sync {
        unsynced_replay = Some(Box::new(Applied {
            txn_id: outcome.last_txn_id,
            catalog_root,
            page_count,
            pages: Vec::new(),
            freed: Vec::new(),
            end: outcome.end,
            froze: false,
            merge_done: false,
            buffer_empty: false,
        }));
        on_disk_header
    } else if physical_records > 0 || outcome.tail != JournalTail::Clean {
        shared.store.sync()?;
        let freelist = header::encode_freelist(free.iter().copied());
        let h = FileHeader {
            sequence: header.sequence + 1,
            freelist_checksum: crc32c::crc32c(&freelist),
            freelist_len: freelist.len() as u64,
            ..shared_header
        };
        flusher::write_header(&shared.flusher_handle(), &h, &freelist)?;
        h
    } else {
        FileHeader {
            freelist_checksum: header.freelist_checksum,
            freelist_len: header.freelist_len,
            ..shared_header
        }
    };
    shared
        .journal_files
        .release_below(header.journal_file_seq.min(header.replay_from_file_seq));
    let report = RecoveryReport {
        synced_txn_id: outcome.last_txn_id - physical_records,
        records_replayed: physical_records,
        merged_values_filled,
        last_txn_id: outcome.last_txn_id,
        tail: outcome.tail.clone(),
        gap_records_discarded: outcome.gap_records_discarded,
    };
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
