//! Replaying the journal on open: page images of transactions after the synced one
//! go into the data file; write-buffer entries from the replay start on are read back
//! into memory.

use super::scan::{self, JournalTail, ScanOutcome};
use crate::header::FileHeader;
use crate::io::Vfs;
use crate::journal::logical::LogicalEntry;
use crate::journal::record::{DecodedRecord, Image, RecordHeader, FLAG_FREEZE, FLAG_MERGE_DONE};
use crate::journal::writer::Durability;
use crate::journal::writer::JournalPos;
use crate::journal::ReplayStart;
use crate::options::Options;
use crate::page::{self, PageNo};
use crate::store::PageStore;
use crate::write_buffer::Gens;
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The state the journal rebuilt: what the environment opens with.
pub(crate) struct Replayed {
    pub catalog_root: PageNo,
    pub page_count: u64,
    pub free: BTreeSet<PageNo>,
    pub gens: Gens,
    pub replay_start: ReplayStart,
    pub outcome: ScanOutcome,
    /// Records whose page images were applied (those after the synced point).
    pub physical_records: u64,
    /// Values those images named by buffer key, filled from the frozen generation.
    pub merged_values_filled: u64,
    /// Pages freed by those records (and not written again by a later one), by
    /// freeing transaction, oldest first: free in the replayed state, but not
    /// reusable until that state is synced (`alloc/mod.rs`), since until then a second
    /// replay may need their old bytes.
    pub unsynced_frees: Vec<(u64, Vec<PageNo>)>,
}

/// Replays the journal from the header's replay start into `store` (page images of
/// transactions after the synced one) and into a fresh write buffer (logical
/// entries: they stay in the journal until merged, so the replay start is at or
/// before the synced point).
pub(crate) fn replay(
    vfs: &dyn Vfs,
    journal_dir: &Path,
    data_path: &Path,
    header: &FileHeader,
    store: &PageStore,
    free: BTreeSet<PageNo>,
    opts: &Options,
) -> Result<Replayed> {
    let mut rebuild = Rebuild {
        journal_dir,
        data_path,
        store,
        synced_txn_id: header.synced_txn_id,
        catalog_root: header.catalog_root,
        page_count: header.page_count,
        free,
        freed_by: BTreeMap::new(),
        gens: Gens::default(),
        replay_start: header.replay_start(),
        last_txn_id: header.replay_from_txn_id,
        physical_records: 0,
        merged_values_filled: 0,
    };
    let start = rebuild.replay_start;
    let journal = scan::Reader {
        vfs,
        dir: journal_dir,
        cipher: store.cipher(),
    };
    let outcome = scan::replay(
        journal,
        start.pos,
        start.txn_id,
        // After a power loss in buffered mode, records missing in the middle are the
        // documented cost of that mode, not a surprise.
        opts.open_despite_journal_gap || opts.durability != Durability::Immediate,
        // Full page images need nothing but their own bytes to be verified: the
        // journal's reader thread does it, beside the writing of pages here.
        |rec| {
            if rec.header.txn_id <= header.synced_txn_id {
                return Ok(());
            }
            for (no, image) in &rec.images {
                // (A bare run has no header to verify: the record's checksum covered
                // its bytes, and the leaf cell's checksum covers them from here on.)
                if let Image::Full(run) = image {
                    if !run.is_bare() {
                        verify_image(journal_dir, data_path, run.bytes(), *no, rec.header.txn_id)?;
                    }
                }
            }
            Ok(())
        },
        |rec, end| rebuild.apply(rec, end),
    )?;
    Ok(rebuild.finish(outcome))
}

/// A page image read back from the journal must pass the checks of a page read
/// from the data file.
fn verify_image(
    journal_dir: &Path,
    data_path: &Path,
    bytes: &[u8],
    no: PageNo,
    txn_id: u64,
) -> Result<()> {
    page::verify(bytes, no, data_path).map_err(|e| {
        Error::corrupted(
            journal_dir,
            format!("record of txn {txn_id}"),
            format!("page image fails verification: {e}"),
        )
    })
}

/// The state the replay rebuilds, record by record.
struct Rebuild<'a> {
    journal_dir: &'a Path,
    data_path: &'a Path,
    store: &'a PageStore,
    /// Records of transactions up to this one are in the data file already: only
    /// their write-buffer entries are read back.
    synced_txn_id: u64,
    catalog_root: PageNo,
    page_count: u64,
    free: BTreeSet<PageNo>,
    /// The transaction that freed each page freed by a replayed record (and not
    /// written again by a later one).
    freed_by: BTreeMap<PageNo, u64>,
    gens: Gens,
    replay_start: ReplayStart,
    /// The last record's transaction (the replay start's before the first).
    last_txn_id: u64,
    physical_records: u64,
    merged_values_filled: u64,
}

impl Rebuild<'_> {
    /// Applies one record, which ends at `end`: its page images if it is after the
    /// synced point, its write-buffer entries in any case.
    fn apply(&mut self, rec: DecodedRecord, end: JournalPos) -> Result<()> {
        let DecodedRecord {
            header,
            freed,
            images,
            logical,
        } = rec;
        // The scan hands over only the record of the next transaction.
        assert_eq!(
            header.txn_id,
            self.last_txn_id + 1,
            "replay was handed txn {} after txn {}: records must come in transaction order",
            header.txn_id,
            self.last_txn_id
        );
        self.last_txn_id = header.txn_id;
        if header.txn_id > self.synced_txn_id {
            self.apply_pages(&header, images, freed, end)?;
        }
        self.apply_buffer_entries(&header, logical, end)
    }

    /// Writes a record's page images into the data file (materializing diffs and
    /// patched images first), and takes its freed pages, catalog root and page count.
    fn apply_pages(
        &mut self,
        header: &RecordHeader,
        images: Vec<(PageNo, Image)>,
        freed: Vec<PageNo>,
        end: JournalPos,
    ) -> Result<()> {
        let txn_id = header.txn_id;
        self.physical_records += 1;
        for (no, image) in images {
            let pages = image.page_count() as u64;
            let rebuilt = !image.is_self_contained();
            // A patched image names values the transaction merged from the frozen
            // generation, rebuilt above from its entries: the replay start is before
            // the freeze of any generation whose merge is not synced, and this
            // record's images are replayed only because it is not (docs/design/storage.md
            // §2.4, "Patched images").
            let frozen = self.gens.frozen.as_ref();
            let filled = &mut self.merged_values_filled;
            let journal_dir = self.journal_dir;
            let store = self.store;
            let run = image.materialize(
                |source| store.read_page(source),
                |bkey, dest| match frozen {
                    Some(f) if f.copy_newest_value(bkey, dest) => {
                        *filled += 1;
                        Ok(())
                    }
                    _ => Err(Error::corrupted(
                        journal_dir,
                        format!("record of txn {txn_id}"),
                        format!(
                            "page image of page {no} names a merged value ({} bytes, buffer key {}) that the write buffer's frozen generation does not hold: the journal records before this one are damaged or missing; restore the environment from a backup",
                            dest.len(),
                            hex_prefix(bkey)
                        ),
                    )),
                },
            )?;
            if rebuilt {
                verify_image(self.journal_dir, self.data_path, run.bytes(), no, txn_id)?;
            }
            self.store.write_raw(no, &run, header.page_count)?;
            for p in no..no + pages {
                self.free.remove(&p);
                self.freed_by.remove(&p);
            }
        }
        self.free.extend(freed.iter().copied());
        self.freed_by.extend(freed.iter().map(|&p| (p, txn_id)));
        self.catalog_root = header.catalog_root;
        self.page_count = header.page_count;
        // A free page is never referenced: a catalog root left free would be handed
        // out and overwritten. (The record's checksum held: the journal says so.)
        if self.catalog_root != 0 && self.free.contains(&self.catalog_root) {
            return Err(Error::corrupted(
                crate::journal::file_path(self.journal_dir, end.file_seq),
                format!("offset {}", end.offset.saturating_sub(header.padded_len())),
                format!(
                    "the record of txn {txn_id} leaves its catalog root, page {}, free \
                     (the free-page snapshot or an earlier record frees it, and no record writes it again)",
                    self.catalog_root
                ),
            ));
        }
        Ok(())
    }

    /// Reads a record's write-buffer entries back into the active generation, freezes
    /// it or drops the merged one as the record's flags say, and follows the replay
    /// start past the record.
    fn apply_buffer_entries(
        &mut self,
        header: &RecordHeader,
        logical: Vec<LogicalEntry>,
        end: JournalPos,
    ) -> Result<()> {
        let txn_id = header.txn_id;
        let gens = &mut self.gens;
        for (bkey, slot) in logical {
            gens.active.write(&bkey, txn_id, slot.as_ref());
        }
        let froze = header.flags & FLAG_FREEZE != 0;
        let merge_done = header.flags & FLAG_MERGE_DONE != 0;
        if merge_done {
            // (A merge that finished before the replay start refers to a
            // generation not read again: nothing to drop.)
            gens.frozen = None;
        }
        if froze {
            if gens.frozen.is_some() {
                return Err(Error::corrupted(
                    self.journal_dir,
                    format!("record of txn {txn_id}"),
                    "freezes the write buffer while the previous generation is not merged",
                ));
            }
            gens.frozen = Some(std::mem::take(&mut gens.active));
        }
        self.replay_start
            .note(txn_id, end, froze, merge_done, gens.is_empty());
        Ok(())
    }

    /// The rebuilt state, once the scan found the journal's end.
    fn finish(self, outcome: ScanOutcome) -> Replayed {
        let (start, end) = (self.replay_start, outcome.end);
        assert!(
            start.txn_id <= outcome.last_txn_id
                && (start.pos.file_seq, start.pos.offset) <= (end.file_seq, end.offset),
            "replay ended after txn {} (journal file {} offset {}) with its replay start past that, \
             after txn {} (file {} offset {})",
            outcome.last_txn_id,
            end.file_seq,
            end.offset,
            start.txn_id,
            start.pos.file_seq,
            start.pos.offset
        );
        let mut by_txn: BTreeMap<u64, Vec<PageNo>> = BTreeMap::new();
        for (page, txn) in self.freed_by {
            by_txn.entry(txn).or_default().push(page);
        }
        if outcome.records_replayed > self.physical_records {
            tracing::info!(
                records = outcome.records_replayed - self.physical_records,
                "journal: read buffered entries back from records already in the data file"
            );
        }
        if let JournalTail::Dropped { path, offset, what } = &outcome.tail {
            tracing::warn!(path = %path.display(), offset, what, "journal: discarded an incomplete record at the tail (crash during a commit)");
        }
        Replayed {
            catalog_root: self.catalog_root,
            page_count: self.page_count,
            free: self.free,
            gens: self.gens,
            replay_start: self.replay_start,
            outcome,
            physical_records: self.physical_records,
            merged_values_filled: self.merged_values_filled,
            unsynced_frees: by_txn.into_iter().collect(),
        }
    }
}

/// The first bytes of a buffer key in hex, for an error message.
fn hex_prefix(bkey: &[u8]) -> String {
    let shown: String = bkey.iter().take(24).map(|b| format!("{b:02x}")).collect();
    if bkey.len() > 24 {
        format!("{shown}...")
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use crate::io::{OpenMode, OsVfs, Vfs};
    use crate::journal::record::{self, LogicalLog, RecordInput};
    use crate::page::PageRun;
    use crate::{Env, Error, Options};

    /// A record whose checksum and chain hold but that frees its own catalog root
    /// (only a bug in the writer, or a forger, makes one): open fails naming the
    /// journal file, the record's offset and the page, and hands nothing out.
    #[test]
    fn a_record_leaving_its_catalog_root_free_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(Env::open(dir.path(), Options::default()).unwrap());
        let header =
            super::super::create::load_header(&OsVfs, &dir.path().join(crate::DATA_FILE)).unwrap();
        let log = LogicalLog::default();
        let input = RecordInput {
            txn_id: header.synced_txn_id + 1,
            nonce: 1,
            prev_checksum: header.journal_chain_checksum,
            catalog_root: 5,
            page_count: 6,
            freed: &[5],
            pages: &[],
            logical: &log,
            buffer_flags: 0,
            merged: None,
        };
        let mut buf = PageRun::scratch(1);
        let enc = record::encode(&input, &mut buf, None, None);
        let journal =
            crate::journal::file_path(&dir.path().join("journal"), header.journal_file_seq);
        let file = OsVfs
            .open(
                &journal,
                OpenMode {
                    write: true,
                    ..Default::default()
                },
            )
            .unwrap();
        file.write_all_at(&buf.bytes()[..enc.padded_len], header.journal_offset)
            .unwrap();
        drop(file);
        match Env::open(dir.path(), Options::default()) {
            Err(e @ Error::Corrupted { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&journal.display().to_string())
                        && msg.contains(&format!("offset {}", header.journal_offset))
                        && msg.contains("leaves its catalog root, page 5, free"),
                    "{msg}"
                );
            }
            Err(e) => panic!("expected Corrupted, got {e}"),
            Ok(_) => panic!("opened with its catalog root free"),
        }
    }
}
