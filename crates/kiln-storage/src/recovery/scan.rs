//! Reading the journal back on open.
//!
//! Decision table for the block at the expected position (TigerBeetle-style: each
//! combination maps to one action, and the code follows the table):
//!
//! | header parses | checksum | txn id / chain       | action                                  |
//! |---------------|----------|----------------------|-----------------------------------------|
//! | yes           | ok       | expected, chain ok   | replay it, move on                      |
//! | yes           | ok       | lower id             | stale record of an older cycle: end     |
//! | yes           | ok       | other / chain broken | not our history: end, scan for a gap    |
//! | yes           | bad      | any                  | torn or corrupt record: end, scan       |
//! | nearly (*)    | -        | -                    | damaged header: end, scan               |
//! | no            | -        | -                    | zeros or old bytes of a recycled file:  |
//! |               |          |                      | clean end (the gap scan still runs)     |
//!
//! (*) magic and version within a few bit errors of ours: a flipped bit in the
//! header of the last acknowledged record is reported, not taken for a clean end.
//!
//! Before declaring the end we also try the start of the next file, because the
//! writer moves to a new file when a record does not fit in the current one.
//! "Scan" looks at every 4 KiB boundary after the end, in this file and later ones,
//! for a valid record with a higher transaction id: one means transactions were lost
//! in the middle, and open fails unless explicitly allowed.

use crate::crypt::Cipher;
use crate::io::{OpenMode, Vfs, VfsFile, DIRECT_IO_ALIGN};
use crate::journal::record::{self, DecodedRecord, RecordHeader, RECORD_HEADER};
use crate::journal::{file_path, list_files, writer::JournalPos};
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// What recovery found at the end of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalTail {
    /// Zeros, a stale record of an older cycle, or the end of the files.
    Clean,
    /// A record or block that failed validation was discarded.
    Dropped {
        path: PathBuf,
        offset: u64,
        what: String,
    },
}

#[derive(Debug)]
pub struct ScanOutcome {
    pub records_replayed: u64,
    pub last_txn_id: u64,
    pub end: JournalPos,
    pub tail: JournalTail,
    /// Valid records past a hole, found and (only if allowed) neutralized.
    pub gap_records_discarded: u64,
}

enum Probe {
    Valid(Box<DecodedRecord>, u64),
    Clean,
    Bad(String),
}

/// Where the journal is read from: its directory, through which file system, and
/// the cipher its records are sealed under (an encrypted environment's).
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub vfs: &'a dyn Vfs,
    pub dir: &'a Path,
    pub cipher: Option<&'a Cipher>,
}

type OpenJournalFile = (PathBuf, Box<dyn VfsFile>, u64);

impl Reader<'_> {
    /// The journal file `seq` (path, open file, length), or `None` if it does not exist.
    fn open(&self, seq: u64) -> Result<Option<OpenJournalFile>> {
        let path = file_path(self.dir, seq);
        if !self.vfs.exists(&path) {
            return Ok(None);
        }
        let file = self
            .vfs
            .open(&path, OpenMode::default())
            .map_err(|e| Error::io(&path, None, "open journal file", e))?;
        let len = file
            .len()
            .map_err(|e| Error::io(&path, None, "stat journal file", e))?;
        Ok(Some((path, file, len)))
    }

    /// Reads the header block at `offset` (None if past the end of the file).
    fn header_block(
        &self,
        file: &dyn VfsFile,
        path: &Path,
        len: u64,
        offset: u64,
    ) -> Result<Option<Vec<u8>>> {
        if offset + DIRECT_IO_ALIGN as u64 > len {
            return Ok(None);
        }
        let mut block = vec![0u8; DIRECT_IO_ALIGN];
        file.read_exact_at(&mut block, offset)
            .map_err(|e| Error::io(path, Some(offset), "read journal", e))?;
        Ok(Some(block))
    }

    /// Reads and checks the whole record whose header is `h`; `None` if it does not
    /// fit in the file or fails its checksum.
    fn full_record(
        &self,
        file: &dyn VfsFile,
        path: &Path,
        len: u64,
        offset: u64,
        h: &RecordHeader,
    ) -> Result<Option<Vec<u8>>> {
        let total = RECORD_HEADER as u64 + h.body_len as u64;
        if offset + total > len {
            return Ok(None);
        }
        let mut buf = vec![0u8; total as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io(path, Some(offset), "read journal record", e))?;
        Ok(record::checksum_ok(h, &buf).then_some(buf))
    }

    fn probe(&self, seq: u64, offset: u64, expected: u64, chain: u32) -> Result<Probe> {
        let Some((path, file, len)) = self.open(seq)? else {
            return Ok(Probe::Clean);
        };
        let Some(block) = self.header_block(file.as_ref(), &path, len, offset)? else {
            return Ok(Probe::Clean);
        };
        // No record header: zeros, or old bytes of a recycled file. Nothing says a
        // record was ever started here (a commit whose first block never landed was not
        // acknowledged); the gap scan still catches valid records beyond this point.
        let Some(h) = record::parse_header(&block) else {
            if record::resembles_header(&block) {
                return Ok(Probe::Bad(
                    "record header damaged (its magic or version bytes differ in a few bits)"
                        .to_string(),
                ));
            }
            return Ok(Probe::Clean);
        };
        let Some(buf) = self.full_record(file.as_ref(), &path, len, offset, &h)? else {
            return Ok(Probe::Bad(format!(
                "record for txn {} failed its checksum (torn or corrupt write)",
                h.txn_id
            )));
        };
        if h.txn_id < expected {
            return Ok(Probe::Clean);
        }
        if h.txn_id != expected || h.prev_checksum != chain {
            return Ok(Probe::Bad(format!(
                "record for txn {} does not continue the chain (expected txn {expected})",
                h.txn_id
            )));
        }
        let rec = record::decode_body(&h, &buf, self.cipher)
            .map_err(|e| Error::undecodable_record(&path, offset, h.txn_id, e))?;
        Ok(Probe::Valid(Box::new(rec), h.padded_len()))
    }

    /// Finds valid records with txn id >= `expected` after the end position. Reads in
    /// 1 MiB chunks: this runs on every open.
    // Bounds: `n <= chunk.len()` and `block + DIRECT_IO_ALIGN <= n`, from the loop bounds.
    #[allow(clippy::indexing_slicing)]
    fn scan_for_gap(&self, from: JournalPos, expected: u64) -> Result<Vec<(u64, PathBuf, u64)>> {
        const CHUNK: u64 = 1 << 20;
        let mut found = Vec::new();
        let seqs = list_files(self.vfs, self.dir)?;
        let mut chunk = vec![0u8; CHUNK as usize];
        for seq in seqs.into_iter().filter(|s| *s >= from.file_seq) {
            let Some((path, file, len)) = self.open(seq)? else {
                continue;
            };
            let mut chunk_start = if seq == from.file_seq { from.offset } else { 0 };
            while chunk_start + DIRECT_IO_ALIGN as u64 <= len {
                let n = CHUNK.min(len - chunk_start) as usize / DIRECT_IO_ALIGN * DIRECT_IO_ALIGN;
                file.read_exact_at(&mut chunk[..n], chunk_start)
                    .map_err(|e| Error::io(&path, Some(chunk_start), "scan journal", e))?;
                for block in (0..n).step_by(DIRECT_IO_ALIGN) {
                    let Some(h) = record::parse_header(&chunk[block..block + DIRECT_IO_ALIGN])
                    else {
                        continue;
                    };
                    let offset = chunk_start + block as u64;
                    if h.txn_id >= expected
                        && self
                            .full_record(file.as_ref(), &path, len, offset, &h)?
                            .is_some()
                    {
                        found.push((h.txn_id, path.clone(), offset));
                    }
                }
                chunk_start += n as u64;
            }
        }
        Ok(found)
    }
}

/// Records waiting between the reader and `apply`. One is enough to keep both
/// threads busy, and bounds replay's memory at three records (one being read, one
/// waiting, one being applied): a record may hold a transaction of a GiB or more.
const READ_AHEAD_RECORDS: usize = 1;

/// Replays records after `start` (the position after the record of `start_txn_id`)
/// through `apply`, in order, with the position where each ends.
///
/// Reading and checking the journal runs on a thread of its own, a record ahead
/// of `apply` (which writes their pages into the data file): after 1 GiB of
/// journal, open spent 0.9 s of CPU, most of it in the kernel copying the journal in
/// and the pages out, one after the other. The order of records is unchanged, and
/// nothing is applied past a record that failed: the reader stops at the end it
/// finds, as before. `check` runs on the reader's thread, on each record before it is
/// handed over (work that needs no state: verifying page images).
pub(crate) fn replay(
    journal: Reader<'_>,
    start: JournalPos,
    start_txn_id: u64,
    allow_gap: bool,
    check: impl Fn(&DecodedRecord) -> Result<()> + Send,
    mut apply: impl FnMut(DecodedRecord, JournalPos) -> Result<()>,
) -> Result<ScanOutcome> {
    std::thread::scope(|scope| {
        let (records, received) =
            std::sync::mpsc::sync_channel::<(DecodedRecord, JournalPos)>(READ_AHEAD_RECORDS);
        let reader = std::thread::Builder::new()
            .name("kiln-replay-read".into())
            .spawn_scoped(scope, move || {
                read_records(journal, start, start_txn_id, allow_gap, |rec, end| {
                    check(&rec)?;
                    // The receiver is gone only if `apply` failed: stop reading (this
                    // error is dropped; `apply`'s is the one returned).
                    records.send((rec, end)).map_err(|_| {
                        Error::corrupted(
                            journal.dir,
                            "journal",
                            "replay stopped: applying a record failed",
                        )
                    })
                })
            })
            .map_err(|e| Error::io(journal.dir, None, "start the journal reader thread", e))?;
        let mut applied = Ok(());
        for (rec, end) in received.iter() {
            applied = apply(rec, end);
            if applied.is_err() {
                break;
            }
        }
        drop(received);
        let outcome = match reader.join() {
            Ok(outcome) => outcome,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        applied?;
        outcome
    })
}

/// `replay`'s reader: reads, checks and decodes records in order and hands each to
/// `apply`; then looks past the end for a gap.
fn read_records(
    reader: Reader<'_>,
    start: JournalPos,
    start_txn_id: u64,
    allow_gap: bool,
    apply: impl FnMut(DecodedRecord, JournalPos) -> Result<()>,
) -> Result<ScanOutcome> {
    let first = file_path(reader.dir, start.file_seq);
    if !reader.vfs.exists(&first) {
        return Err(Error::corrupted(
            &first,
            "journal",
            format!(
                "missing: recovery starts after txn {start_txn_id} and the journal continues in this file \
                 (is the journal volume mounted? were files deleted?)"
            ),
        ));
    }
    let mut chain = Chain {
        pos: start,
        expected: start_txn_id + 1,
        replayed: 0,
    };
    let tail = reader.follow_chain(&mut chain, apply)?;
    let (tail, gap_records_discarded) = reader.look_past_the_end(&chain, tail, allow_gap)?;
    Ok(ScanOutcome {
        records_replayed: chain.replayed,
        last_txn_id: chain.expected - 1,
        end: chain.pos,
        tail,
        gap_records_discarded,
    })
}

/// How far `read_records` followed the chain of records.
struct Chain {
    /// Where the last record accepted ends (and the chain value it leaves).
    pos: JournalPos,
    /// The transaction whose record must come next.
    expected: u64,
    /// Records accepted.
    replayed: u64,
}

impl Reader<'_> {
    /// Hands every record that continues the chain to `apply`, in order, and returns
    /// what ended it (the decision table in this module's comment).
    fn follow_chain(
        &self,
        chain: &mut Chain,
        mut apply: impl FnMut(DecodedRecord, JournalPos) -> Result<()>,
    ) -> Result<JournalTail> {
        loop {
            let pos = chain.pos;
            // Here, or at the start of the next file: the writer moves on to the next
            // file when a record does not fit in the current one.
            let candidates = [(pos.file_seq, pos.offset), (pos.file_seq + 1, 0)];
            let mut bad = [None, None];
            let mut advanced = false;
            for (i, (seq, offset)) in candidates.into_iter().enumerate() {
                match self.probe(seq, offset, chain.expected, pos.chain_checksum)? {
                    Probe::Valid(rec, len) => {
                        let checksum = rec.header.checksum;
                        chain.pos = JournalPos {
                            file_seq: seq,
                            offset: offset + len,
                            chain_checksum: checksum,
                        };
                        // (The start was checked with the file header; lengths are padded.)
                        assert!(
                            chain.pos.offset.is_multiple_of(DIRECT_IO_ALIGN as u64),
                            "record of txn {} in journal file {seq} ends at offset {}, not on a {DIRECT_IO_ALIGN}-byte boundary",
                            rec.header.txn_id,
                            chain.pos.offset
                        );
                        apply(*rec, chain.pos)?;
                        chain.replayed += 1;
                        chain.expected += 1;
                        advanced = true;
                        break;
                    }
                    Probe::Clean => {}
                    Probe::Bad(what) => {
                        if let Some(b) = bad.get_mut(i) {
                            *b = Some(what);
                        }
                    }
                }
            }
            if advanced {
                continue;
            }
            let [here_bad, next_bad] = bad;
            return Ok(match (here_bad, next_bad) {
                (Some(what), _) => JournalTail::Dropped {
                    path: file_path(self.dir, pos.file_seq),
                    offset: pos.offset,
                    what,
                },
                (None, Some(what)) => JournalTail::Dropped {
                    path: file_path(self.dir, pos.file_seq + 1),
                    offset: 0,
                    what,
                },
                (None, None) => JournalTail::Clean,
            });
        }
    }

    /// Always looks past the end: a lost write in the middle (zeros where a record
    /// was) looks like a clean end, and only the valid records after it reveal the
    /// hole. Fails with `JournalGap` if there is one and it is not allowed; else
    /// neutralizes the records past it. Returns the tail (a clean end before a hole
    /// becomes a dropped one) and how many records were discarded.
    fn look_past_the_end(
        &self,
        chain: &Chain,
        tail: JournalTail,
        allow_gap: bool,
    ) -> Result<(JournalTail, u64)> {
        let (pos, expected) = (chain.pos, chain.expected);
        let found = self.scan_for_gap(pos, expected)?;
        let Some((found_txn, path, offset)) = found.iter().min_by_key(|f| f.0).cloned() else {
            return Ok((tail, 0));
        };
        if !allow_gap {
            return Err(Error::JournalGap {
                last_valid_txn: expected - 1,
                missing_from: expected,
                missing_to: found_txn.saturating_sub(1).max(expected),
                found_txn,
                path,
                offset,
            });
        }
        let discarded = neutralize(self.vfs, &found)?;
        let tail = match tail {
            JournalTail::Clean => JournalTail::Dropped {
                path: file_path(self.dir, pos.file_seq),
                offset: pos.offset,
                what: format!("no record where txn {expected} belongs, but valid later records follow (lost write)"),
            },
            dropped => dropped,
        };
        Ok((tail, discarded))
    }
}

/// Zeroes the header blocks of records past a hole, so that the next open does not
/// report the same gap again once the operator has chosen to open anyway.
fn neutralize(vfs: &dyn Vfs, found: &[(u64, PathBuf, u64)]) -> Result<u64> {
    let zeros = vec![0u8; DIRECT_IO_ALIGN];
    for (txn, path, offset) in found {
        tracing::warn!(txn, path = %path.display(), offset, "discarding journal record past a gap");
        let f = vfs
            .open(
                path,
                OpenMode {
                    write: true,
                    ..Default::default()
                },
            )
            .map_err(|e| Error::io(path, None, "open journal file", e))?;
        f.write_all_at(&zeros, *offset)
            .map_err(|e| Error::io(path, Some(*offset), "erase journal record", e))?;
        f.sync_data()
            .map_err(|e| Error::io(path, None, "fdatasync journal", e))?;
    }
    Ok(found.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsVfs;
    use crate::{Env, Options};
    use std::sync::atomic::Ordering::Relaxed;

    /// A journal copied while its environment was open, as a crash leaves it.
    struct Crashed {
        dir: tempfile::TempDir,
        start: JournalPos,
        start_txn: u64,
    }

    impl Crashed {
        fn replay(
            &self,
            check: impl Fn(&DecodedRecord) -> Result<()> + Send,
            apply: impl FnMut(DecodedRecord, JournalPos) -> Result<()>,
        ) -> Result<ScanOutcome> {
            let journal = self.dir.path().join("journal");
            let reader = Reader {
                vfs: &OsVfs,
                dir: &journal,
                cipher: None,
            };
            replay(reader, self.start, self.start_txn, false, check, apply)
        }
    }

    /// A journal of `commits` records (and the tree's creation), crashed.
    fn crashed_journal(commits: u64) -> Crashed {
        let live = tempfile::tempdir().unwrap();
        let opts = Options {
            sync_interval_ms: 3_600_000,
            sync_after_bytes: 1 << 40,
            max_unflushed_bytes: 1 << 32,
            write_buffer_bytes: 0,
            ..Options::default()
        };
        let env = Env::open(live.path(), opts).unwrap();
        let mut w = env.begin_write().unwrap();
        w.create_tree("t").unwrap();
        w.commit().unwrap();
        for i in 0..commits {
            let mut w = env.begin_write().unwrap();
            w.put("t", &i.to_be_bytes(), &[7u8; 3000]).unwrap();
            w.commit().unwrap();
        }
        let copy = tempfile::tempdir().unwrap();
        for name in ["journal", ""] {
            std::fs::create_dir_all(copy.path().join(name)).unwrap();
            for entry in std::fs::read_dir(live.path().join(name)).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_file() {
                    std::fs::copy(entry.path(), copy.path().join(name).join(entry.file_name()))
                        .unwrap();
                }
            }
        }
        drop(env);
        let header =
            crate::recovery::create::load_header(&OsVfs, &copy.path().join(crate::DATA_FILE))
                .unwrap();
        let start = header.replay_start();
        Crashed {
            dir: copy,
            start: start.pos,
            start_txn: start.txn_id,
        }
    }

    #[test]
    fn replay_hands_every_record_over_in_order() {
        let crashed = crashed_journal(40);
        let start_txn = crashed.start_txn;
        let mut seen = Vec::new();
        let outcome = crashed
            .replay(
                |_| Ok(()),
                |rec, _| {
                    seen.push(rec.header.txn_id);
                    Ok(())
                },
            )
            .unwrap();
        assert!(seen.len() >= 40, "{} records replayed", seen.len());
        let expected: Vec<u64> = (start_txn + 1..=outcome.last_txn_id).collect();
        assert_eq!(seen, expected);
        assert_eq!(outcome.records_replayed, seen.len() as u64);
        assert_eq!(outcome.tail, JournalTail::Clean);
    }

    #[test]
    fn a_failed_apply_stops_replay_with_its_own_error() {
        let crashed = crashed_journal(40);
        let mut applied = 0;
        let result = crashed.replay(
            |_| Ok(()),
            |_, _| {
                applied += 1;
                if applied == 3 {
                    return Err(Error::Misuse("apply failed on purpose"));
                }
                Ok(())
            },
        );
        match result {
            Err(Error::Misuse(what)) => assert_eq!(what, "apply failed on purpose"),
            other => panic!("expected the apply error, got {other:?}"),
        }
        assert_eq!(applied, 3, "nothing is applied after the failed record");
    }

    #[test]
    fn a_failed_check_stops_replay_before_that_record() {
        let crashed = crashed_journal(40);
        let start_txn = crashed.start_txn;
        let checked = std::sync::atomic::AtomicU64::new(0);
        let mut applied = Vec::new();
        let result = crashed.replay(
            |rec| {
                checked.fetch_add(1, Relaxed);
                if rec.header.txn_id == start_txn + 5 {
                    return Err(Error::Misuse("check failed on purpose"));
                }
                Ok(())
            },
            |rec, _| {
                applied.push(rec.header.txn_id);
                Ok(())
            },
        );
        match result {
            Err(Error::Misuse(what)) => assert_eq!(what, "check failed on purpose"),
            other => panic!("expected the check's error, got {other:?}"),
        }
        assert_eq!(checked.load(Relaxed), 5);
        let expected: Vec<u64> = (start_txn + 1..start_txn + 5).collect();
        assert_eq!(
            applied, expected,
            "every record before the failed one, and no other"
        );
    }
}
