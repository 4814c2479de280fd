//! Restoring a full backup plus increments, up to a chosen point, and verifying a
//! chain without restoring it.
//!
//! The full backup is written into a new environment in a staging directory (the
//! engine's `restore_into`); each increment's history entries are then replayed in
//! sequence order as the original writes (`database::replay`: same etags, times and
//! bodies), never splitting one engine transaction of the source: a point inside a
//! transaction restores the whole of it. Every input is read to its end and every
//! checksum checked even past the point. Only then is the environment synced,
//! closed and renamed into place.

use super::chain::{check_first, check_link};
use super::{manifest_of, BackupKind, BackupManifest, BackupReport};
use crate::changes::ChangeKind;
use crate::data_dir::{sync_dir, unique_suffix, DATABASES_DIR, TRASH_DIR};
use crate::database::history;
use crate::database::{replay, ReplayUnit};
use crate::schema::{CHAIN_CONSUMER, CONSUMERS, HISTORY, META, META_CHAIN, META_INCARNATION};
use crate::{validate_database_name, DocError, Etag, Result};
use kiln_storage::backup::{self, Item};
use kiln_storage::{BackupError, Env, WriteTxn};
use serde::{Deserialize, Serialize};
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
        let bad = |why: &str| DocError::RestorePoint(format!("{s:?}: {why}"));
        let time = |t: &str| -> Result<RestorePoint> {
            if let Ok(ms) = t.parse::<u64>() {
                return Ok(RestorePoint::TimeMs(ms));
            }
            let at = humantime::parse_rfc3339_weak(t)
                .map_err(|e| bad(&format!("not an RFC 3339 time or ms since the epoch ({e})")))?;
            let ms = crate::time::ms_since_epoch(at).ok_or_else(|| bad("before 1970"))?;
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
}

/// Reads every input in order; with `env`, restores the full backup into it and
/// replays the increments up to `point`. `check_links`: the inputs must be one
/// chain (off only to verify a single increment on its own).
pub(crate) fn process(
    source: RestoreSource<'_>,
    env: Option<&Env>,
    point: RestorePoint,
    check_links: bool,
    mut progress: impl FnMut(u64),
) -> Result<ChainReport> {
    let mut files: std::collections::VecDeque<(String, Box<dyn Read + '_>)> =
        std::collections::VecDeque::new();
    let mut stream = None;
    match source {
        RestoreSource::Files(f) => files.extend(f),
        RestoreSource::Stream(s) => {
            stream = Some(Peek {
                inner: s,
                peeked: None,
            })
        }
    }
    let mut out = ChainReport {
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
    };
    let mut replayer: Option<Replay<'_>> = None;
    // Where the state is: (etag sequence, source txn, time) of the last write.
    let mut at_seq = 0u64;
    let mut stopper = Stopper {
        point: point.clone(),
        point_seq: None,
        last_txn: None,
        stopped: false,
    };
    let mut n = 0usize;
    let mut current: Option<(String, Box<dyn Read + '_>)>;
    loop {
        n += 1;
        let (label, rd, stop_at_trailer): (String, &mut dyn Read, bool) = match stream.as_mut() {
            Some(s) => {
                if s.at_end().map_err(|e| {
                    DocError::Backup(BackupError::Io {
                        op: "reading",
                        offset: out.bytes_read,
                        source: e,
                    })
                })? {
                    break;
                }
                (
                    format!("backup {n} of the stream"),
                    s as &mut dyn Read,
                    true,
                )
            }
            None => {
                current = files.pop_front();
                match current.as_mut() {
                    Some((label, r)) => (label.clone(), &mut **r as &mut dyn Read, false),
                    None => break,
                }
            }
        };
        let base_bytes = out.bytes_read;
        let prog = &mut progress;
        let mut on_bytes = |b: u64| prog(base_bytes + b);
        // Errors of this layer raised inside the reader's sink.
        let mut failed: Option<DocError> = None;
        let stop = |e: DocError, failed: &mut Option<DocError>| {
            let msg = e.to_string();
            *failed = Some(e);
            BackupError::Stopped(msg)
        };
        let result = if n == 1 {
            let check = |sum: &kiln_storage::BackupSummary| -> Result<BackupManifest> {
                let m = manifest_of(sum)?;
                if check_links {
                    check_first(&m, &label)?;
                }
                Ok(m)
            };
            match env {
                Some(env) => {
                    // The image only goes to the staging environment; its manifest
                    // is checked once it is read.
                    let r = backup::restore_into(env, rd, stop_at_trailer, &mut on_bytes);
                    r.and_then(|sum| {
                        check(&sum).map_err(|e| stop(e, &mut failed))?;
                        Ok(sum)
                    })
                }
                None => backup::read_container(rd, stop_at_trailer, &mut on_bytes, |sum, item| {
                    if let Item::Header = item {
                        check(sum).map_err(|e| stop(e, &mut failed))?;
                    }
                    Ok(())
                }),
            }
        } else {
            let prev = out
                .backups
                .last()
                .map(|b| b.manifest.clone())
                .ok_or_else(|| DocError::Internal("no backup before an increment".into()))?;
            let mut manifest: Option<BackupManifest> = None;
            let mut prev_seq = 0u64;
            let mut range = (0u64, 0u64);
            let mut entries = 0u64;
            let r = backup::read_container(rd, stop_at_trailer, &mut on_bytes, |sum, item| {
                let mut step = || -> Result<()> {
                    match item {
                        Item::Header => {
                            let m = manifest_of(sum)?;
                            if check_links {
                                check_link(&prev, &m, n, &label)?;
                            } else if m.kind != BackupKind::Incremental {
                                return Err(DocError::Internal("not an increment".into()));
                            }
                            range = (m.base_sequence()?, m.end_sequence()?);
                            prev_seq = range.0;
                            manifest = Some(m);
                        }
                        Item::Tree(name) if name == HISTORY => {}
                        Item::Tree(name) => {
                            return Err(corrupt(
                                n,
                                &label,
                                format!("frame {}", sum.frame),
                                sum.frame_offset,
                                format!("unexpected tree {name:?} in an increment"),
                            ))
                        }
                        Item::EndTree => {}
                        Item::Entry(k, v) => {
                            let at = |what: String| {
                                DocError::Backup(BackupError::Corrupt {
                                    part: format!(
                                        "input {n} ({label}), frame {} (its history)",
                                        sum.frame
                                    ),
                                    offset: sum.frame_offset,
                                    what,
                                })
                            };
                            let e = history::decode(k, v).map_err(at)?;
                            if e.sequence <= prev_seq || e.sequence > range.1 {
                                return Err(at(format!(
                                    "history entry {} out of order or outside the increment \
                                         ({}, {}] (after {prev_seq})",
                                    e.sequence, range.0, range.1
                                )));
                            }
                            if e.prev != prev_seq {
                                return Err(at(format!(
                                    "a write is missing: history entry {} follows the \
                                         write at {}, the entry before it is at {prev_seq}",
                                    e.sequence, e.prev
                                )));
                            }
                            prev_seq = e.sequence;
                            entries += 1;
                            if let ChangeKind::Put = e.kind {
                                // Checked here too so a verify catches it.
                                crate::record::decode(e.id, e.record)
                                    .map_err(|x| at(x.to_string()))?;
                            }
                            let boundary = stopper.last_txn != Some(e.txn);
                            if !stopper.take(&e) {
                                out.writes_skipped += 1;
                                return Ok(());
                            }
                            if let Some(rp) = replayer.as_mut() {
                                rp.apply(&e, boundary)?;
                            }
                            out.writes_replayed += 1;
                            at_seq = e.sequence;
                            out.reached.txn = e.txn;
                            out.reached.at_ms = Some(e.at_ms);
                        }
                    }
                    Ok(())
                };
                step().map_err(|e| stop(e, &mut failed))
            });
            r.and_then(|sum| {
                // Every write of the increment is there, the last one included.
                if prev_seq != range.1 {
                    return Err(stop(
                        corrupt(
                            n,
                            &label,
                            "its end (the trailer read)".into(),
                            sum.file_bytes,
                            format!(
                                "its writes end at sequence {prev_seq}, its manifest says {}",
                                range.1
                            ),
                        ),
                        &mut failed,
                    ));
                }
                Ok(sum)
            })
        };
        let sum = match result {
            Ok(sum) => sum,
            Err(BackupError::Stopped(_)) if failed.is_some() => {
                return Err(failed.unwrap_or(DocError::Internal("lost error".into())))
            }
            Err(e) => return Err(name_input(e, n, &label)),
        };
        out.bytes_read += sum.file_bytes;
        let manifest = manifest_of(&sum)?;
        if n == 1 {
            at_seq = manifest.end_sequence()?;
            out.reached.txn = manifest.txn_id;
            out.reached.at_ms = manifest.last_write_ms;
            // The point must not be inside the full backup.
            match &point {
                RestorePoint::Latest => {}
                RestorePoint::Etag(e) => {
                    let want = Etag::parse(e)?;
                    if manifest.incarnation.is_some_and(|i| i != want.incarnation) {
                        return Err(DocError::RestorePoint(format!(
                            "etag {e} is not of this database (incarnation {})",
                            super::incarnation_text(manifest.incarnation)
                        )));
                    }
                    if want.sequence < at_seq {
                        return Err(DocError::RestorePoint(format!(
                            "etag {e} is before the full backup's point (etag {}): use an \
                             older full backup",
                            manifest.etag.as_deref().unwrap_or("0")
                        )));
                    }
                    stopper.point_seq = Some(want.sequence);
                }
                RestorePoint::Txn(t) if *t < manifest.txn_id => {
                    return Err(DocError::RestorePoint(format!(
                        "transaction {t} is before the full backup's snapshot (transaction {}): \
                         use an older full backup",
                        manifest.txn_id
                    )));
                }
                RestorePoint::Txn(_) => {}
                RestorePoint::TimeMs(t) => {
                    if manifest.last_write_ms.is_some_and(|w| w > *t) {
                        return Err(DocError::RestorePoint(format!(
                            "time {} is before the full backup's last write ({}): use an \
                             older full backup",
                            crate::format_rfc3339_ms(*t),
                            crate::format_rfc3339_ms(manifest.last_write_ms.unwrap_or(0))
                        )));
                    }
                }
            }
            if let Some(env) = env {
                let incarnation = {
                    let r = env.begin_read()?;
                    let raw =
                        r.get(META, META_INCARNATION)?
                            .ok_or_else(|| DocError::CorruptRecord {
                                id: "(restored meta)".into(),
                                why: "no incarnation".into(),
                            })?;
                    u32::from_be_bytes(raw.try_into().map_err(|_| DocError::CorruptRecord {
                        id: "(restored meta)".into(),
                        why: "incarnation of the wrong size".into(),
                    })?)
                };
                replayer = Some(Replay {
                    env,
                    txn: None,
                    unit: ReplayUnit::for_replay(incarnation),
                    pending: 0,
                });
            }
        }
        out.backups.push(BackupReport::new(manifest, &sum));
    }
    let full = out
        .backups
        .first()
        .ok_or_else(|| DocError::RestorePoint("no backup given".into()))?;
    if let (RestorePoint::Etag(e), Some(want)) = (&point, stopper.point_seq) {
        let end = out
            .backups
            .last()
            .map(|b| b.manifest.end_sequence())
            .transpose()?;
        if end.is_some_and(|end| want > end) {
            return Err(DocError::RestorePoint(format!(
                "etag {e} is after the last backup given (it ends at etag {})",
                out.backups
                    .last()
                    .and_then(|b| b.manifest.etag.clone())
                    .unwrap_or_else(|| "0".into())
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
    out.reached.etag = match (at_seq, incarnation) {
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
    out.reached.at = out.reached.at_ms.map(crate::format_rfc3339_ms);
    if let Some(mut rp) = replayer {
        rp.commit()?;
        // The restored database starts without a backup chain.
        let mut w = rp.env.begin_write()?;
        w.delete(META, META_CHAIN)?;
        w.delete(CONSUMERS, CHAIN_CONSUMER.as_bytes())?;
        w.drop_tree(HISTORY)?;
        w.ensure_tree(HISTORY)?;
        w.commit()?;
    }
    Ok(out)
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
        other => DocError::Backup(other),
    }
}

/// Checks backups without restoring them: every checksum, and that they form one
/// chain (a full backup, then its increments in order, without gaps).
pub fn verify_chain(source: RestoreSource<'_>, progress: impl FnMut(u64)) -> Result<ChainReport> {
    process(source, None, RestorePoint::Latest, true, progress)
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
    if staging.exists() {
        return Err(DocError::Backup(BackupError::TargetExists(
            staging.to_path_buf(),
        )));
    }
    let result = (|| {
        let env = Env::open(staging, backup::staging_options(storage))?;
        let report = process(source, Some(&env), point, true, progress);
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                let _ = env.close();
                return Err(e);
            }
        };
        env.sync()?;
        env.close()?;
        sync_dir(staging)?;
        Ok(report)
    })();
    if result.is_err() && staging.exists() {
        let _ = std::fs::remove_dir_all(staging);
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
    validate_database_name(name)?;
    // A server running on the directory would never see the restored database
    // (it lists its databases once, at start): refuse, as a second server is.
    let _lock = crate::DataDirLock::acquire(data_dir, &crate::data_dir_lock::this_process())?;
    let dbs = data_dir.join(DATABASES_DIR);
    let trash = data_dir.join(TRASH_DIR);
    for d in [&dbs, &trash] {
        std::fs::create_dir_all(d).map_err(|e| DocError::io(d, e))?;
    }
    let target = dbs.join(name);
    if target.exists() && !force {
        return Err(DocError::DatabaseExists(name.to_string()));
    }
    let suffix = unique_suffix();
    let built: PathBuf = trash.join(format!("restoring-{name}-{suffix}"));
    let report = build(source, &built, storage, point, progress)?;
    put_in_place(&built, &target, &trash, name, &suffix)?;
    Ok(RestoreReport::new(name, report))
}

/// Renames a built database to `target` (replacing what is there: the old one goes
/// to trash first, so a crash between leaves no `target` and the complete new one
/// in trash: re-run the restore).
pub(crate) fn put_in_place(
    built: &Path,
    target: &Path,
    trash: &Path,
    name: &str,
    suffix: &str,
) -> Result<()> {
    let dbs = target.parent().unwrap_or(Path::new("."));
    if target.exists() {
        let old = trash.join(format!("replaced-{name}-{suffix}"));
        std::fs::rename(target, &old).map_err(|e| DocError::io(target, e))?;
        std::fs::rename(built, target).map_err(|e| DocError::io(target, e))?;
        sync_dir(dbs)?;
        std::fs::remove_dir_all(&old).map_err(|e| DocError::io(&old, e))?;
    } else {
        std::fs::rename(built, target).map_err(|e| DocError::io(target, e))?;
        sync_dir(dbs)?;
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
