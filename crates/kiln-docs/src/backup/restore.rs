//! Restoring a full backup plus increments, up to a chosen point, and verifying a
//! chain without restoring it.
//!
//! The full backup is written into a new environment in a staging directory (the
//! engine's `restore_into`); each increment's history entries are then replayed in
//! sequence order as the original writes (`database::replay`: same etags, times and
//! bodies), never splitting one engine transaction of the source: a point inside a
//! transaction restores the whole of it. Every input is read to its end and every
//! checksum checked even past the point. Attachments' blobs (the containers'
//! extra files) are streamed into the staged database's blob store, each checked
//! against its SHA-256 name (`BlobSink`); once replayed, the blobs the restored
//! reference tree does not name are dropped. Only then is the environment synced,
//! closed and renamed into place.

use super::chain::{check_first, check_link};
use super::{manifest_of, BackupKind, BackupManifest, BackupReport, BLOB_FILE_PREFIX};
use crate::attachments::{hash_hex, parse_hash, BlobStore, BlobWriter, Hash};
use crate::changes::ChangeKind;
use crate::data_dir::{sync_dir_in, unique_suffix, DATABASES_DIR, TRASH_DIR};
use crate::database::history;
use crate::database::{replay, ReplayUnit};
use crate::model::schema::{
    CHAIN_CONSUMER, CONSUMERS, HISTORY, META, META_CHAIN, META_INCARNATION,
};
use crate::search::backup::{parse_name, SearchSink, SEARCH_FILE_PREFIX};
use crate::{validate_database_name, DocError, Etag, Result};
use crate::{BackupChainError, DatabaseError, DocumentError};
use kiln_storage::backup::{self, Item};
use kiln_storage::io::Vfs;
use kiln_storage::BackupSummary;
use kiln_storage::{BackupError, Env, MasterKey, WriteTxn};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Replayed writes are committed in transactions of about this many bytes (never
/// splitting a transaction of the source).
const REPLAY_TXN_BYTES: u64 = 32 << 20;

/// Where a restore stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestorePoint {
    /// Everything the backups hold.
    Latest,
    /// Every transaction up to and including the one that wrote this etag.
    Etag(String),
    /// Every transaction up to and including this engine transaction id.
    Txn(u64),
    /// Every transaction before the first one stamped later than this time (ms
    /// since the Unix epoch; a transaction's time is its first write's).
    TimeMs(u64),
}

impl RestorePoint {
    /// Parses `etag:E`, `txn:T`, `time:T` (RFC 3339 or ms since the epoch), or a
    /// bare etag (`17-0a1b2c3d`) or RFC 3339 time.
    pub fn parse(s: &str) -> Result<RestorePoint> {
        let bad = |why: &str| {
            DocError::BackupChain(BackupChainError::RestorePoint(format!("{s:?}: {why}")))
        };
        let time = |t: &str| -> Result<RestorePoint> {
            if let Ok(ms) = t.parse::<u64>() {
                return Ok(RestorePoint::TimeMs(ms));
            }
            let at = humantime::parse_rfc3339_weak(t)
                .map_err(|e| bad(&format!("not an RFC 3339 time or ms since the epoch ({e})")))?;
            let ms = crate::model::time::ms_since_epoch(at).ok_or_else(|| bad("before 1970"))?;
            Ok(RestorePoint::TimeMs(ms))
        };
        if let Some(e) = s.strip_prefix("etag:") {
            Etag::parse(e).map_err(|_| bad("not an etag (sequence-incarnation)"))?;
            Ok(RestorePoint::Etag(e.to_string()))
        } else if let Some(t) = s.strip_prefix("txn:") {
            t.parse()
                .map(RestorePoint::Txn)
                .map_err(|_| bad("not a transaction id"))
        } else if let Some(t) = s.strip_prefix("time:") {
            time(t)
        } else if Etag::parse(s).is_ok() {
            Ok(RestorePoint::Etag(s.to_string()))
        } else if s.contains('T') || s.contains(' ') {
            time(s)
        } else {
            Err(bad("give etag:E, txn:T or time:T (RFC 3339 or ms)"))
        }
    }
}

/// The inputs of a restore: a full backup, then its increments in order.
pub enum RestoreSource<'a> {
    /// One reader per backup file, each with a label for errors (its file name).
    Files(Vec<(String, Box<dyn Read + 'a>)>),
    /// Backups back to back in one stream (the server's restore endpoint).
    Stream(Box<dyn Read + 'a>),
}

/// The exact point a restore reached.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReachedPoint {
    /// The last etag in the restored database.
    pub etag: Option<String>,
    /// The source's engine transaction the state is at (for the full backup alone:
    /// its snapshot's).
    pub txn: u64,
    /// Time of the last write restored (ms since the epoch), when known.
    pub at_ms: Option<u64>,
    pub at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreReport {
    pub restored_as: String,
    /// The full backup, then each increment read.
    pub backups: Vec<BackupReport>,
    pub reached: ReachedPoint,
    /// Writes of the increments replayed (those past the point are not).
    pub writes_replayed: u64,
    /// Writes of the increments read but after the point.
    pub writes_skipped: u64,
    /// Bytes read from all inputs.
    pub bytes_read: u64,
}

/// What a chain of inputs was found to hold (a verify or a restore).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChainReport {
    pub backups: Vec<BackupReport>,
    pub reached: ReachedPoint,
    pub writes_replayed: u64,
    pub writes_skipped: u64,
    pub bytes_read: u64,
}

/// A reader that can tell whether another byte follows (for a stream of backups).
struct Peek<R> {
    inner: R,
    peeked: Option<u8>,
}

impl<R: Read> Peek<R> {
    fn at_end(&mut self) -> std::io::Result<bool> {
        if self.peeked.is_some() {
            return Ok(false);
        }
        let mut b = [0u8; 1];
        loop {
            match self.inner.read(&mut b) {
                Ok(0) => return Ok(true),
                Ok(_) => {
                    self.peeked = Some(b[0]);
                    return Ok(false);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl<R: Read> Read for Peek<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(b) = self.peeked.take() {
            buf[0] = b;
            return Ok(1);
        }
        self.inner.read(buf)
    }
}

/// Decides, entry by entry in history order, which writes a restore takes: a
/// prefix of the history that never ends inside a transaction of the source.
struct Stopper {
    point: RestorePoint,
    /// The etag sequence of an `Etag` point.
    point_seq: Option<u64>,
    /// The transaction of the last entry taken.
    last_txn: Option<u64>,
    stopped: bool,
}

impl Stopper {
    fn take(&mut self, e: &history::HistoryEntry<'_>) -> bool {
        if self.stopped {
            return false;
        }
        // The rest of a transaction already begun is always taken.
        let same_txn = self.last_txn == Some(e.txn);
        let take = match &self.point {
            RestorePoint::Latest => true,
            RestorePoint::Etag(_) => same_txn || e.sequence <= self.point_seq.unwrap_or(u64::MAX),
            RestorePoint::Txn(t) => e.txn <= *t,
            // A transaction's time is its first write's.
            RestorePoint::TimeMs(t) => same_txn || e.at_ms <= *t,
        };
        if take {
            self.last_txn = Some(e.txn);
        } else {
            self.stopped = true;
        }
        take
    }
}

/// The replay state of one restore.
struct Replay<'e> {
    env: &'e Env,
    txn: Option<WriteTxn<'e>>,
    unit: ReplayUnit,
    pending: u64,
}

impl<'e> Replay<'e> {
    /// Replays into `env`, where the full backup was just restored.
    fn start(env: &'e Env) -> Result<Replay<'e>> {
        // A full backup made before expiration existed has no expiration trees:
        // they are built from its documents before the replay keeps them up.
        crate::expiration::upgrade::add_expiration_index(env, "(being restored)")?;
        Ok(Replay {
            env,
            txn: None,
            unit: ReplayUnit::for_replay(restored_incarnation(env)?),
            pending: 0,
        })
    }

    fn apply(&mut self, e: &history::HistoryEntry<'_>, boundary: bool) -> Result<()> {
        if boundary && self.pending >= REPLAY_TXN_BYTES {
            self.commit()?;
        }
        let w = match self.txn.as_mut() {
            Some(w) => w,
            None => self.txn.insert(self.env.begin_write()?),
        };
        replay(w, &mut self.unit, e)?;
        self.pending += (e.id.len() + e.record.len() + 32) as u64;
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        if let Some(mut w) = self.txn.take() {
            self.unit.finish(&mut w)?;
            w.commit()?;
        }
        self.pending = 0;
        Ok(())
    }

    /// Commits the rest; the restored database starts without a backup chain.
    fn finish(mut self) -> Result<()> {
        self.commit()?;
        let mut w = self.env.begin_write()?;
        w.delete(META, META_CHAIN)?;
        w.delete(CONSUMERS, CHAIN_CONSUMER.as_bytes())?;
        w.drop_tree(HISTORY)?;
        w.ensure_tree(HISTORY)?;
        w.commit()?;
        Ok(())
    }
}

/// The incarnation of the database the full backup restored into `env`.
fn restored_incarnation(env: &Env) -> Result<u32> {
    let r = env.begin_read()?;
    let raw = r.get(META, META_INCARNATION)?.ok_or_else(|| {
        DocError::Document(DocumentError::Corrupt {
            id: "(restored meta)".into(),
            why: "no incarnation".into(),
        })
    })?;
    Ok(u32::from_be_bytes(raw.try_into().map_err(|_| {
        DocError::Document(DocumentError::Corrupt {
            id: "(restored meta)".into(),
            why: "incarnation of the wrong size".into(),
        })
    })?))
}

/// Reads every input in order; with `env`, restores the full backup into it and
/// replays the increments up to `point`. `check_links`: the inputs must be one
/// chain (off only to verify a single increment on its own). `encryption` opens
/// sealed inputs (a restore: the target's own master key, with which the engine
/// also reads the full backup).
pub(crate) fn process(
    source: RestoreSource<'_>,
    target: Option<(&Env, &Path)>,
    point: RestorePoint,
    check_links: bool,
    encryption: Option<&MasterKey>,
    mut progress: impl FnMut(u64),
) -> Result<ChainReport> {
    let mut inputs = Inputs::new(source);
    // The target's own store: an encrypted target seals each blob with its key.
    let blobs = match target {
        Some((env, dir)) => Some(BlobStore::open(dir, env)?),
        None => None,
    };
    let mut chain = ChainReader::new(target.map(|t| t.0), point, check_links);
    chain.key = encryption.cloned();
    chain.blobs.store = blobs;
    if let Some((env, dir)) = target {
        chain
            .blobs
            .search
            .set_db_dir(dir, crate::search::key_of(env));
    }
    while let Some(mut input) = inputs.next(chain.out.bytes_read)? {
        chain.read(&mut input, &mut progress)?;
    }
    chain.finish()
}

/// The inputs of a restore, one at a time.
struct Inputs<'a> {
    files: VecDeque<(String, Box<dyn Read + 'a>)>,
    stream: Option<Peek<Box<dyn Read + 'a>>>,
    /// The file being read.
    current: Option<(String, Box<dyn Read + 'a>)>,
    /// Inputs begun (the next one's number, 1-based, less one).
    begun: usize,
}

/// One backup of the inputs.
struct Input<'i> {
    /// Its place among the inputs, from 1 (the full backup).
    n: usize,
    /// How errors name it.
    label: String,
    reader: &'i mut dyn Read,
    /// In a stream, a backup ends at its trailer: another may follow.
    stop_at_trailer: bool,
}

impl<'a> Inputs<'a> {
    fn new(source: RestoreSource<'a>) -> Inputs<'a> {
        let (files, stream) = match source {
            RestoreSource::Files(f) => (f.into(), None),
            RestoreSource::Stream(s) => (
                VecDeque::new(),
                Some(Peek {
                    inner: s,
                    peeked: None,
                }),
            ),
        };
        Inputs {
            files,
            stream,
            current: None,
            begun: 0,
        }
    }

    /// The next backup, if there is one; `offset` (the bytes read so far) names
    /// where a stream failed.
    fn next(&mut self, offset: u64) -> Result<Option<Input<'_>>> {
        self.begun += 1;
        let n = self.begun;
        if let Some(s) = self.stream.as_mut() {
            let at_end = s.at_end().map_err(|e| {
                DocError::Backup(BackupError::Io {
                    op: "reading",
                    offset,
                    source: e,
                })
            })?;
            return Ok((!at_end).then(|| Input {
                n,
                label: format!("backup {n} of the stream"),
                reader: s,
                stop_at_trailer: true,
            }));
        }
        self.current = self.files.pop_front();
        Ok(self.current.as_mut().map(|(label, r)| Input {
            n,
            label: label.clone(),
            reader: &mut **r,
            stop_at_trailer: false,
        }))
    }
}

/// An error of this layer raised inside the engine's reader (whose sink can only
/// return the engine's errors): the reader is stopped with `BackupError::Stopped`
/// and the error kept here, to be returned as it was.
#[derive(Default)]
struct Sink {
    failed: Option<DocError>,
}

impl Sink {
    fn stop(&mut self, e: DocError) -> BackupError {
        let msg = e.to_string();
        self.failed = Some(e);
        BackupError::Stopped(msg)
    }

    /// What the reader gave: an error stopped in the sink as it was, an engine
    /// error naming the input.
    fn finish(
        self,
        read: std::result::Result<BackupSummary, BackupError>,
        input: &Input<'_>,
    ) -> Result<BackupSummary> {
        match (read, self.failed) {
            (Ok(sum), _) => Ok(sum),
            (Err(BackupError::Stopped(_)), Some(failed)) => Err(failed),
            (Err(e), _) => Err(name_input(e, input.n, &input.label)),
        }
    }
}

/// Receives a backup's attachment blobs (its extra files, `attachments/<sha256>`):
/// with a store (a restore), each is streamed into it; without (a verify), only
/// hashed. Each must hash to its name; a blob that does not fails the restore,
/// naming it and the offset of its first frame.
#[derive(Default)]
struct BlobSink {
    store: Option<BlobStore>,
    current: Option<OpenBlob>,
    /// Full-text index files (`search/<id>/<file>`) go there instead.
    search: SearchSink,
}

struct OpenBlob {
    hash: Hash,
    /// Byte offset of its first frame in the input.
    start: u64,
    writer: Option<BlobWriter>,
    hasher: Sha256,
}

impl BlobSink {
    fn item(&mut self, input: &Input<'_>, sum: &BackupSummary, item: Item<'_>) -> Result<()> {
        let (n, label) = (input.n, input.label.as_str());
        match item {
            Item::File { name, .. } if name.starts_with(SEARCH_FILE_PREFIX) => {
                self.begin_search_file(n, label, name)?
            }
            Item::FileData(bytes) if self.search.is_open() => self.search.data(bytes)?,
            Item::FileEnd if self.search.is_open() => self.search.end()?,
            Item::File { name, .. } => self.begin_blob(n, label, sum, name)?,
            Item::FileData(bytes) => {
                let b = self.open()?;
                match b.writer.as_mut() {
                    Some(w) => w.write(bytes)?,
                    None => b.hasher.update(bytes),
                }
            }
            Item::FileEnd => self.end_blob(n, label)?,
            Item::Header | Item::Tree(_) | Item::Entry(..) | Item::EndTree => {}
        }
        Ok(())
    }

    /// A full-text index file of input `n` begins: it goes to the search sink,
    /// which skips it unless it is of the full backup and well named.
    fn begin_search_file(&mut self, n: usize, label: &str, name: &str) -> Result<()> {
        let (id, file, skip) = match parse_name(name) {
            Some(Ok((id, file))) => (id, file, n != 1),
            Some(Err(why)) => {
                tracing::warn!(input = label, file = %why,
                    "a full-text index file in the backup is misnamed; skipped");
                (0, "", true)
            }
            None => (0, "", true),
        };
        // Only a full backup's commits are placed (increments carry none).
        self.search.begin(id, file, skip)
    }

    /// An attachment blob begins (`attachments/<sha256>`, else the backup is
    /// corrupt): streamed into the store, or only hashed.
    fn begin_blob(&mut self, n: usize, label: &str, sum: &BackupSummary, name: &str) -> Result<()> {
        let hash = name
            .strip_prefix(BLOB_FILE_PREFIX)
            .and_then(|h| parse_hash(h).ok())
            .ok_or_else(|| {
                corrupt(
                    n,
                    label,
                    format!("frame {}", sum.frame),
                    sum.frame_offset,
                    format!(
                        "extra file {name:?} is no attachment blob (this Kiln knows only {BLOB_FILE_PREFIX}<sha256>)"
                    ),
                )
            })?;
        let writer = match &self.store {
            Some(s) => Some(s.writer()?),
            None => None,
        };
        self.current = Some(OpenBlob {
            hash,
            start: sum.frame_offset,
            writer,
            hasher: Sha256::new(),
        });
        Ok(())
    }

    /// The open attachment blob ends: it must hash to its name; placed in the
    /// store, if there is one.
    fn end_blob(&mut self, n: usize, label: &str) -> Result<()> {
        let b = self.current.take().ok_or_else(not_open)?;
        let (got, staged) = match b.writer {
            Some(w) => {
                let staged = w.finish()?;
                (staged.hash, Some(staged))
            }
            None => (b.hasher.finalize().into(), None),
        };
        if got != b.hash {
            return Err(corrupt(
                n,
                label,
                format!("attachment blob {}", hash_hex(&b.hash)),
                b.start,
                format!(
                    "its bytes hash to {}, not to its name (SHA-256)",
                    hash_hex(&got)
                ),
            ));
        }
        if let (Some(store), Some(staged)) = (&self.store, staged) {
            store.place(staged)?;
        }
        Ok(())
    }

    fn open(&mut self) -> Result<&mut OpenBlob> {
        self.current.as_mut().ok_or_else(not_open)
    }
}

fn not_open() -> DocError {
    DocError::Internal("a backup's file bytes outside a file".into())
}

/// A chain of backups being read (and, with an environment, restored).
struct ChainReader<'e> {
    env: Option<&'e Env>,
    /// Where the blobs go (a restore) or are only checked (a verify).
    blobs: BlobSink,
    check_links: bool,
    /// The master key sealed inputs are opened with.
    key: Option<MasterKey>,
    out: ChainReport,
    /// Set once the full backup is restored into `env`.
    replayer: Option<Replay<'e>>,
    /// The etag sequence of the last write of the state.
    at_seq: u64,
    /// Holds the restore point.
    stopper: Stopper,
}

impl<'e> ChainReader<'e> {
    fn new(env: Option<&'e Env>, point: RestorePoint, check_links: bool) -> ChainReader<'e> {
        ChainReader {
            env,
            blobs: BlobSink::default(),
            check_links,
            key: None,
            out: ChainReport {
                backups: Vec::new(),
                reached: ReachedPoint {
                    etag: None,
                    txn: 0,
                    at_ms: None,
                    at: None,
                },
                writes_replayed: 0,
                writes_skipped: 0,
                bytes_read: 0,
            },
            replayer: None,
            at_seq: 0,
            stopper: Stopper {
                point,
                point_seq: None,
                last_txn: None,
                stopped: false,
            },
        }
    }

    /// Reads one input to its end (checking every checksum), restores or replays
    /// it, and adds its report.
    fn read(&mut self, input: &mut Input<'_>, progress: &mut impl FnMut(u64)) -> Result<()> {
        let base_bytes = self.out.bytes_read;
        let mut on_bytes = |b: u64| progress(base_bytes + b);
        let sum = if input.n == 1 {
            self.read_full(input, &mut on_bytes)?
        } else {
            self.read_increment(input, &mut on_bytes)?
        };
        self.out.bytes_read += sum.file_bytes;
        let manifest = manifest_of(&sum)?;
        if input.n == 1 {
            self.start_after_full(&manifest)?;
        }
        let search = std::mem::take(&mut self.blobs.search.shipped);
        self.out
            .backups
            .push(BackupReport::new(manifest, &sum, search));
        Ok(())
    }

    /// The full backup: restored into the environment, or only read.
    fn read_full(
        &mut self,
        input: &mut Input<'_>,
        on_bytes: impl FnMut(u64),
    ) -> Result<BackupSummary> {
        let check = |sum: &BackupSummary| -> Result<BackupManifest> {
            let m = manifest_of(sum)?;
            if self.check_links {
                check_first(&m, &input.label)?;
            }
            Ok(m)
        };
        let mut sink = Sink::default();
        match self.env {
            Some(env) => {
                // The image only goes to the staging environment; its manifest is
                // checked once it is read.
                // Index entries trees are counted (as `index::create_trees` makes
                // them), whichever build wrote the backup.
                let blobs = &mut self.blobs;
                let inp = Input {
                    n: input.n,
                    label: input.label.clone(),
                    reader: &mut std::io::empty(),
                    stop_at_trailer: input.stop_at_trailer,
                };
                let keyed = backup::KeyedInput {
                    input: &mut *input.reader,
                    key: self.key.as_ref(),
                };
                let read = backup::restore_into_keyed(
                    env,
                    keyed,
                    input.stop_at_trailer,
                    &crate::model::schema::is_entries_tree,
                    on_bytes,
                    |sum, item| blobs.item(&inp, sum, item).map_err(|e| sink.stop(e)),
                );
                let sum = sink.finish(read, input)?;
                check(&sum)?;
                Ok(sum)
            }
            None => {
                let blobs = &mut self.blobs;
                let inp = Input {
                    n: input.n,
                    label: input.label.clone(),
                    reader: &mut std::io::empty(),
                    stop_at_trailer: input.stop_at_trailer,
                };
                let read = backup::read_container_with_key(
                    &mut *input.reader,
                    self.key.as_ref(),
                    input.stop_at_trailer,
                    on_bytes,
                    |sum, item| {
                        match item {
                            Item::Header => {
                                check(sum).map_err(|e| sink.stop(e))?;
                            }
                            Item::File { .. } | Item::FileData(_) | Item::FileEnd => {
                                blobs.item(&inp, sum, item).map_err(|e| sink.stop(e))?
                            }
                            _ => {}
                        }
                        Ok(())
                    },
                );
                sink.finish(read, input)
            }
        }
    }

    /// An increment: its history entries checked, and replayed up to the point.
    fn read_increment(
        &mut self,
        input: &mut Input<'_>,
        on_bytes: impl FnMut(u64),
    ) -> Result<BackupSummary> {
        let prev = self
            .out
            .backups
            .last()
            .map(|b| b.manifest.clone())
            .ok_or_else(|| DocError::Internal("no backup before an increment".into()))?;
        let mut inc = Increment {
            n: input.n,
            label: &input.label,
            range: (0, 0),
            prev_seq: 0,
        };
        let mut sink = Sink::default();
        let mut blobs = std::mem::take(&mut self.blobs);
        let inp = Input {
            n: input.n,
            label: input.label.clone(),
            reader: &mut std::io::empty(),
            stop_at_trailer: input.stop_at_trailer,
        };
        let key = self.key.clone();
        let read = backup::read_container_with_key(
            &mut *input.reader,
            key.as_ref(),
            input.stop_at_trailer,
            on_bytes,
            |sum, item| {
                let step = match item {
                    Item::File { .. } | Item::FileData(_) | Item::FileEnd => {
                        blobs.item(&inp, sum, item)
                    }
                    Item::Header => {
                        manifest_of(sum).and_then(|m| inc.start(m, &prev, self.check_links))
                    }
                    Item::Tree(name) => inc.check_tree(sum, name),
                    Item::EndTree => Ok(()),
                    Item::Entry(k, v) => inc.check_entry(sum, k, v).and_then(|e| self.take(&e)),
                };
                step.map_err(|e| sink.stop(e))
            },
        );
        self.blobs = blobs;
        let sum = sink.finish(read, input)?;
        inc.check_complete(&sum)?;
        Ok(sum)
    }

    /// A write of an increment, checked: replayed if the point takes it.
    fn take(&mut self, e: &history::HistoryEntry<'_>) -> Result<()> {
        let boundary = self.stopper.last_txn != Some(e.txn);
        if !self.stopper.take(e) {
            self.out.writes_skipped += 1;
            return Ok(());
        }
        if let Some(rp) = self.replayer.as_mut() {
            rp.apply(e, boundary)?;
        }
        self.out.writes_replayed += 1;
        self.at_seq = e.sequence;
        self.out.reached.txn = e.txn;
        self.out.reached.at_ms = Some(e.at_ms);
        Ok(())
    }

    /// The state is the full backup's: the point must not be inside it; the
    /// increments are replayed from here.
    fn start_after_full(&mut self, full: &BackupManifest) -> Result<()> {
        self.at_seq = full.end_sequence()?;
        self.out.reached.txn = full.txn_id;
        self.out.reached.at_ms = full.last_write_ms;
        self.stopper.point_seq = point_after_full(&self.stopper.point, full, self.at_seq)?;
        if let Some(env) = self.env {
            self.replayer = Some(Replay::start(env)?);
        }
        Ok(())
    }

    /// After the last input: the point reached, and the replay committed.
    fn finish(mut self) -> Result<ChainReport> {
        let full = self.out.backups.first().ok_or_else(|| {
            DocError::BackupChain(BackupChainError::RestorePoint("no backup given".into()))
        })?;
        if let (RestorePoint::Etag(e), Some(want)) = (&self.stopper.point, self.stopper.point_seq) {
            let last = self.out.backups.last().map(|b| &b.manifest);
            if last
                .map(BackupManifest::end_sequence)
                .transpose()?
                .is_some_and(|end| want > end)
            {
                return Err(DocError::BackupChain(BackupChainError::RestorePoint(
                    format!(
                        "etag {e} is after the last backup given (it ends at etag {})",
                        last.and_then(|m| m.etag.as_deref()).unwrap_or("0")
                    ),
                )));
            }
        }
        let incarnation = full.manifest.incarnation.or_else(|| {
            full.manifest
                .etag
                .as_deref()
                .and_then(|e| Etag::parse(e).ok())
                .map(|e| e.incarnation)
        });
        self.out.reached.etag = match (self.at_seq, incarnation) {
            (0, _) => None,
            (s, Some(i)) => Some(
                Etag {
                    incarnation: i,
                    sequence: s,
                }
                .to_string(),
            ),
            (s, None) => Some(s.to_string()),
        };
        self.out.reached.at = self.out.reached.at_ms.map(crate::format_rfc3339_ms);
        if let Some(rp) = self.replayer {
            rp.finish()?;
        }
        Ok(self.out)
    }
}

/// Checks that `point` is not inside the full backup (whose state ends at etag
/// sequence `at_seq`); the etag sequence of an `Etag` point.
fn point_after_full(
    point: &RestorePoint,
    full: &BackupManifest,
    at_seq: u64,
) -> Result<Option<u64>> {
    match point {
        RestorePoint::Latest => Ok(None),
        RestorePoint::Etag(e) => {
            let want = Etag::parse(e)?;
            if full.incarnation.is_some_and(|i| i != want.incarnation) {
                return Err(DocError::BackupChain(BackupChainError::RestorePoint(
                    format!(
                        "etag {e} is not of this database (incarnation {})",
                        super::incarnation_text(full.incarnation)
                    ),
                )));
            }
            if want.sequence < at_seq {
                return Err(DocError::BackupChain(BackupChainError::RestorePoint(
                    format!(
                        "etag {e} is before the full backup's point (etag {}): use an older full \
                     backup",
                        full.etag.as_deref().unwrap_or("0")
                    ),
                )));
            }
            Ok(Some(want.sequence))
        }
        RestorePoint::Txn(t) if *t < full.txn_id => Err(DocError::BackupChain(
            BackupChainError::RestorePoint(format!(
                "transaction {t} is before the full backup's snapshot (transaction {}): use an \
             older full backup",
                full.txn_id
            )),
        )),
        RestorePoint::Txn(_) => Ok(None),
        RestorePoint::TimeMs(t) if full.last_write_ms.is_some_and(|w| w > *t) => Err(
            DocError::BackupChain(BackupChainError::RestorePoint(format!(
                "time {} is before the full backup's last write ({}): use an older full backup",
                crate::format_rfc3339_ms(*t),
                crate::format_rfc3339_ms(full.last_write_ms.unwrap_or(0))
            ))),
        ),
        RestorePoint::TimeMs(_) => Ok(None),
    }
}

/// What is known of the increment being read, checked item by item.
struct Increment<'l> {
    n: usize,
    label: &'l str,
    /// The etag sequences it holds, (base, end], from its manifest.
    range: (u64, u64),
    /// The sequence of the last entry read (the base before the first).
    prev_seq: u64,
}

impl Increment<'_> {
    /// Its header: an increment, following `prev` when links are checked.
    fn start(&mut self, m: BackupManifest, prev: &BackupManifest, check_links: bool) -> Result<()> {
        if check_links {
            check_link(prev, &m, self.n, self.label)?;
        } else if m.kind != BackupKind::Incremental {
            return Err(DocError::Internal("not an increment".into()));
        }
        self.range = (m.base_sequence()?, m.end_sequence()?);
        self.prev_seq = self.range.0;
        Ok(())
    }

    /// An increment holds the history tree alone.
    fn check_tree(&self, sum: &BackupSummary, name: &str) -> Result<()> {
        if name == HISTORY {
            return Ok(());
        }
        Err(corrupt(
            self.n,
            self.label,
            format!("frame {}", sum.frame),
            sum.frame_offset,
            format!("unexpected tree {name:?} in an increment"),
        ))
    }

    /// Decodes a history entry and checks that it is the next write of the
    /// increment (in its range, linked to the one before) and, for a put, that its
    /// record decodes (so that a verify catches it too).
    fn check_entry<'v>(
        &mut self,
        sum: &BackupSummary,
        k: &[u8],
        v: &'v [u8],
    ) -> Result<history::HistoryEntry<'v>> {
        let (n, label, (base, end), prev_seq) = (self.n, self.label, self.range, self.prev_seq);
        let at = |what: String| {
            DocError::Backup(BackupError::Corrupt {
                part: format!("input {n} ({label}), frame {} (its history)", sum.frame),
                offset: sum.frame_offset,
                what,
            })
        };
        let e = history::decode(k, v).map_err(|malformed| at(malformed.to_string()))?;
        if e.sequence <= prev_seq || e.sequence > end {
            return Err(at(format!(
                "history entry {} out of order or outside the increment ({base}, {end}] \
                 (after {prev_seq})",
                e.sequence
            )));
        }
        if e.prev != prev_seq {
            return Err(at(format!(
                "a write is missing: history entry {} follows the write at {}, the entry \
                 before it is at {prev_seq}",
                e.sequence, e.prev
            )));
        }
        self.prev_seq = e.sequence;
        if let ChangeKind::Put = e.kind {
            crate::model::record::decode(e.id, e.record).map_err(|x| at(x.to_string()))?;
        }
        Ok(e)
    }

    /// Every write of the increment is there, the last one included.
    fn check_complete(&self, sum: &BackupSummary) -> Result<()> {
        if self.prev_seq == self.range.1 {
            return Ok(());
        }
        Err(corrupt(
            self.n,
            self.label,
            "its end (the trailer read)".into(),
            sum.file_bytes,
            format!(
                "its writes end at sequence {}, its manifest says {}",
                self.prev_seq, self.range.1
            ),
        ))
    }
}

fn corrupt(n: usize, label: &str, part: String, offset: u64, what: String) -> DocError {
    DocError::Backup(BackupError::Corrupt {
        part: format!("input {n} ({label}), {part}"),
        offset,
        what,
    })
}

/// Names the input in an engine error about a backup's bytes.
fn name_input(e: BackupError, n: usize, label: &str) -> DocError {
    match e {
        BackupError::Corrupt { part, offset, what } => DocError::Backup(BackupError::Corrupt {
            part: format!("input {n} ({label}), {part}"),
            offset,
            what,
        }),
        BackupError::Truncated { part, offset } => DocError::Backup(BackupError::Truncated {
            part: format!("input {n} ({label}), {part}"),
            offset,
        }),
        // A sealed input without its key, or with another.
        BackupError::Storage(kiln_storage::Error::Encryption { what, .. }) => {
            DocError::Backup(BackupError::Storage(kiln_storage::Error::Encryption {
                path: PathBuf::from(format!("input {n} ({label})")),
                what,
            }))
        }
        other => DocError::Backup(other),
    }
}

/// Checks backups without restoring them: every checksum, and that they form one
/// chain (a full backup, then its increments in order, without gaps). Encrypted
/// backups are refused: see `verify_chain_with_key`.
pub fn verify_chain(source: RestoreSource<'_>, progress: impl FnMut(u64)) -> Result<ChainReport> {
    verify_chain_with_key(source, None, progress)
}

/// `verify_chain`, opening encrypted backups with `encryption`, the master key
/// they are sealed under.
pub fn verify_chain_with_key(
    source: RestoreSource<'_>,
    encryption: Option<&MasterKey>,
    progress: impl FnMut(u64),
) -> Result<ChainReport> {
    process(
        source,
        None,
        RestorePoint::Latest,
        true,
        encryption,
        progress,
    )
}

/// Builds the restored environment in `staging` (which must not exist): the full
/// backup, the increments up to `point`; synced and closed on success, removed on
/// failure.
pub(crate) fn build(
    source: RestoreSource<'_>,
    staging: &Path,
    storage: kiln_storage::Options,
    point: RestorePoint,
    progress: impl FnMut(u64),
) -> Result<ChainReport> {
    // Sealed backups open with the master key the restored database gets.
    let key = storage.encryption.clone();
    build_keyed(source, staging, storage, key, point, progress)
}

/// `build`, opening sealed backups with `backup_key` (the master key they were
/// sealed under) rather than the restored database's own.
fn build_keyed(
    source: RestoreSource<'_>,
    staging: &Path,
    storage: kiln_storage::Options,
    key: Option<MasterKey>,
    point: RestorePoint,
    progress: impl FnMut(u64),
) -> Result<ChainReport> {
    let vfs = storage.vfs.clone();
    if vfs.exists(staging) {
        return Err(DocError::Backup(BackupError::TargetExists(
            staging.to_path_buf(),
        )));
    }
    let result = (|| {
        let env = Env::open(staging, backup::staging_options(storage))?;
        let target = Some((&env, staging));
        let key = key.as_ref();
        let report = process(source, target, point, true, key, progress).and_then(|r| {
            // Blobs the restored state does not name (carried for writes past
            // the point, or freed by a replayed write) go now, not at the first
            // open: `kiln check` of the restored directory is clean.
            BlobStore::open(staging, &env)?.gc(&env, crate::model::time::now_ms())?;
            // Full-text index files that do not check out go too (rebuilt at open).
            crate::search::backup::check_restored(staging, crate::search::key_of(&env).as_ref())?;
            Ok(r)
        });
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                let _ = env.close();
                return Err(e);
            }
        };
        env.sync()?;
        env.close()?;
        sync_dir_in(vfs.as_ref(), staging)?;
        Ok(report)
    })();
    if result.is_err() && vfs.exists(staging) {
        let _ = vfs.remove_dir_all(staging);
    }
    result
}

/// Restores a full backup and increments up to `point` as database `name` of the
/// (offline) data directory `data_dir`. Refuses an existing database unless
/// `force`; the existing one is replaced only after the restored one is complete
/// and verified.
pub fn restore_database(
    source: RestoreSource<'_>,
    data_dir: &Path,
    name: &str,
    storage: kiln_storage::Options,
    force: bool,
    point: RestorePoint,
    progress: impl FnMut(u64),
) -> Result<RestoreReport> {
    let backup_key = storage.encryption.clone();
    let target = RestoreTarget {
        data_dir,
        name,
        storage,
        force,
    };
    restore_database_with_backup_key(source, target, backup_key, point, progress)
}

/// Where [`restore_database_with_backup_key`] restores to.
pub struct RestoreTarget<'a> {
    pub data_dir: &'a Path,
    pub name: &'a str,
    /// The restored database's storage: with a master key, it is encrypted under it.
    pub storage: kiln_storage::Options,
    /// Replace an existing database of that name.
    pub force: bool,
}

/// [`restore_database`] of backups sealed under `backup_key`, a master key other
/// than the data directory's own (backups of another data directory, or made
/// before `kiln encryption rotate-key`): they are opened with it and the database
/// is written under the target's key (in clear if the target has none: whoever
/// holds the key may read the data anyway).
pub fn restore_database_with_backup_key(
    source: RestoreSource<'_>,
    target: RestoreTarget<'_>,
    backup_key: Option<MasterKey>,
    point: RestorePoint,
    progress: impl FnMut(u64),
) -> Result<RestoreReport> {
    let RestoreTarget {
        data_dir,
        name,
        storage,
        force,
    } = target;
    validate_database_name(name)?;
    // A server running on the directory would never see the restored database
    // (it lists its databases once, at start): refuse, as a second server is.
    let _lock = crate::DataDirLock::acquire(data_dir, &crate::data_dir_lock::this_process())?;
    let dbs = data_dir.join(DATABASES_DIR);
    let trash = data_dir.join(TRASH_DIR);
    let vfs = storage.vfs.clone();
    for d in [&dbs, &trash] {
        vfs.create_dir_all(d).map_err(|e| DocError::io(d, e))?;
    }
    let target = dbs.join(name);
    if vfs.exists(&target) && !force {
        return Err(DocError::Database(DatabaseError::Exists(name.to_string())));
    }
    let suffix = unique_suffix();
    let built: PathBuf = trash.join(format!("restoring-{name}-{suffix}"));
    let report = build_keyed(source, &built, storage, backup_key, point, progress)?;
    put_in_place(vfs.as_ref(), &built, &target, &trash, name, &suffix)?;
    Ok(RestoreReport::new(name, report))
}

/// Renames a built database to `target` (replacing what is there: the old one goes
/// to trash first, so a crash between leaves no `target` and the complete new one
/// in trash: re-run the restore).
pub(crate) fn put_in_place(
    vfs: &dyn Vfs,
    built: &Path,
    target: &Path,
    trash: &Path,
    name: &str,
    suffix: &str,
) -> Result<()> {
    let dbs = target.parent().unwrap_or(Path::new("."));
    if vfs.exists(target) {
        let old = trash.join(format!("replaced-{name}-{suffix}"));
        vfs.rename(target, &old)
            .map_err(|e| DocError::io(target, e))?;
        vfs.rename(built, target)
            .map_err(|e| DocError::io(target, e))?;
        sync_dir_in(vfs, dbs)?;
        vfs.remove_dir_all(&old)
            .map_err(|e| DocError::io(&old, e))?;
    } else {
        vfs.rename(built, target)
            .map_err(|e| DocError::io(target, e))?;
        sync_dir_in(vfs, dbs)?;
    }
    Ok(())
}

impl RestoreReport {
    pub(crate) fn new(name: &str, r: ChainReport) -> RestoreReport {
        RestoreReport {
            restored_as: name.to_string(),
            backups: r.backups,
            reached: r.reached,
            writes_replayed: r.writes_replayed,
            writes_skipped: r.writes_skipped,
            bytes_read: r.bytes_read,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::ChangeKind;

    /// (sequence, txn, at_ms) entries: three transactions, the middle one of three
    /// writes stamped out of order with its neighbours.
    fn entries() -> Vec<history::HistoryEntry<'static>> {
        [
            (10, 1, 100),
            (11, 2, 90),
            (12, 2, 300),
            (13, 2, 95),
            (14, 3, 200),
        ]
        .into_iter()
        .map(|(sequence, txn, at_ms)| history::HistoryEntry {
            sequence,
            kind: ChangeKind::Delete,
            txn,
            prev: sequence - 1,
            at_ms,
            id: "x",
            record: b"",
        })
        .collect()
    }

    fn taken(point: RestorePoint, point_seq: Option<u64>) -> Vec<u64> {
        let mut s = Stopper {
            point,
            point_seq,
            last_txn: None,
            stopped: false,
        };
        entries()
            .iter()
            .filter(|e| s.take(e))
            .map(|e| e.sequence)
            .collect()
    }

    #[test]
    fn a_point_never_splits_a_transaction_and_takes_a_prefix() {
        let etag = |s| taken(RestorePoint::Etag(String::new()), Some(s));
        assert_eq!(etag(9), Vec::<u64>::new());
        assert_eq!(etag(10), vec![10]);
        // Inside transaction 2: all of it.
        assert_eq!(etag(11), vec![10, 11, 12, 13]);
        assert_eq!(etag(12), vec![10, 11, 12, 13]);
        assert_eq!(etag(14), vec![10, 11, 12, 13, 14]);
        assert_eq!(taken(RestorePoint::Txn(0), None), Vec::<u64>::new());
        assert_eq!(taken(RestorePoint::Txn(2), None), vec![10, 11, 12, 13]);
        // Time: transaction 2 starts at 90 (<= 95): taken whole, although its second
        // write is stamped 300; transaction 3 (200) is after 150.
        assert_eq!(taken(RestorePoint::TimeMs(150), None), vec![10, 11, 12, 13]);
        // Transaction 1 (100) is after 99: nothing, not even the earlier-stamped
        // transaction 2 (a prefix).
        assert_eq!(taken(RestorePoint::TimeMs(99), None), Vec::<u64>::new());
        assert_eq!(taken(RestorePoint::Latest, None).len(), 5);
    }
}
