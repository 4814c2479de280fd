//! Replaying the journal on open: page images of transactions after the synced one
//! go into the data file; write-buffer entries from the replay start on are read back
//! into memory.

use super::scan::{self, JournalTail, ScanOutcome};
use crate::header::FileHeader;
use crate::io::Vfs;
use crate::journal::record::Image;
use crate::journal::writer::Durability;
use crate::journal::ReplayStart;
use crate::options::Options;
use crate::page::{self, PageNo};
use crate::store::PageStore;
use crate::write_buffer::Gens;
use crate::{Error, Result};
use std::collections::BTreeSet;
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
    // Replay the journal into the data file: page images of transactions after
    // the synced one; write-buffer entries from the replay start on (it is at or
    // before the synced point: entries stay in the journal until merged).
    let mut state = (header.catalog_root, header.page_count, free);
    let mut replay_start = header.replay_start();
    let start = replay_start.pos;
    let mut gens = crate::write_buffer::Gens::default();
    let mut physical_records = 0u64;
    let mut merged_values_filled = 0u64;
    let mut freed_by: std::collections::BTreeMap<PageNo, u64> = Default::default();
    let verify_image = |bytes: &[u8], no: PageNo, txn_id: u64| {
        page::verify(bytes, no, data_path).map_err(|e| {
            Error::corrupted(
                journal_dir,
                format!("record of txn {txn_id}"),
                format!("page image fails verification: {e}"),
            )
        })
    };
    let outcome = scan::replay(
        vfs,
        journal_dir,
        start,
        replay_start.txn_id,
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
                        verify_image(run.bytes(), *no, rec.header.txn_id)?;
                    }
                }
            }
            Ok(())
        },
        |rec, end| {
            let txn_id = rec.header.txn_id;
            let flags = rec.header.flags;
            if txn_id > header.synced_txn_id {
                physical_records += 1;
                for (no, image) in rec.images {
                    let pages = image.page_count() as u64;
                    let rebuilt = !image.is_self_contained();
                    // A patched image names values the transaction merged from the
                    // frozen generation, rebuilt above from its entries: the replay
                    // start is before the freeze of any generation whose merge is not
                    // synced, and this record's images are replayed only because it
                    // is not (docs/design.md §2.4, "Patched images").
                    let frozen = gens.frozen.as_ref();
                    let run = image.materialize(
                        |source| store.read_page(source),
                        |bkey, dest| match frozen {
                            Some(f) if f.copy_newest_value(bkey, dest) => {
                                merged_values_filled += 1;
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
                        verify_image(run.bytes(), no, txn_id)?;
                    }
                    store.write_raw(no, &run)?;
                    for p in no..no + pages {
                        state.2.remove(&p);
                        freed_by.remove(&p);
                    }
                }
                state.2.extend(rec.freed.iter().copied());
                freed_by.extend(rec.freed.iter().map(|&p| (p, txn_id)));
                state.0 = rec.header.catalog_root;
                state.1 = rec.header.page_count;
            }
            for (bkey, slot) in rec.logical {
                gens.active.write(&bkey, txn_id, slot.as_ref());
            }
            let froze = flags & crate::journal::record::FLAG_FREEZE != 0;
            let merge_done = flags & crate::journal::record::FLAG_MERGE_DONE != 0;
            if merge_done {
                // (A merge that finished before the replay start refers to a
                // generation not read again: nothing to drop.)
                gens.frozen = None;
            }
            if froze {
                if gens.frozen.is_some() {
                    return Err(Error::corrupted(
                        journal_dir,
                        format!("record of txn {txn_id}"),
                        "freezes the write buffer while the previous generation is not merged",
                    ));
                }
                gens.frozen = Some(std::mem::take(&mut gens.active));
            }
            replay_start.note(txn_id, end, froze, merge_done, gens.is_empty());
            Ok(())
        },
    )?;
    let (catalog_root, page_count, free) = state;
    let mut by_txn: std::collections::BTreeMap<u64, Vec<PageNo>> = Default::default();
    for (page, txn) in freed_by {
        by_txn.entry(txn).or_default().push(page);
    }
    if outcome.records_replayed > physical_records {
        tracing::info!(
            records = outcome.records_replayed - physical_records,
            "journal: read buffered entries back from records already in the data file"
        );
    }
    if let JournalTail::Dropped { path, offset, what } = &outcome.tail {
        tracing::warn!(path = %path.display(), offset, what, "journal: discarded an incomplete record at the tail (crash during a commit)");
    }
    Ok(Replayed {
        catalog_root,
        page_count,
        free,
        gens,
        replay_start,
        outcome,
        physical_records,
        merged_values_filled,
        unsynced_frees: by_txn.into_iter().collect(),
    })
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
