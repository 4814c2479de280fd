//! Walking an index's entries for a page: key ranges in either direction, runs of
//! equal first values re-sorted by id, and counting a range without loading it.

use super::eval::eval;
use super::parse::Query;
use super::plan::Range;
use super::{load, load_document, QueryResult};
use crate::index::value::encoded_len;
use crate::{DocError, Document, Result};
use crate::{DocumentError, QueryError};
use kiln_storage::{Cursor, Entry, ReadTxn};
use std::collections::HashSet;

/// The ranges of an index a stream walks, in the defined order.
pub(super) struct RangeWalk<'s> {
    pub(super) tree: &'s str,
    pub(super) ranges: &'s [Range],
    pub(super) desc: bool,
    /// A compound index: runs of equal first values are read whole (`next_in_order`).
    pub(super) grouped: bool,
    pub(super) resume_key: Option<&'s [u8]>,
}

impl RangeWalk<'_> {
    /// Hands every entry of the ranges to `page` until it stops the walk (a full
    /// page whose total is known already) or the ranges end.
    pub(super) fn run(
        &self,
        page: &mut StreamPage<'_, '_, '_>,
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<()> {
        let desc = self.desc;
        let mut group: Vec<Entry<'_>> = Vec::new();
        let mut c = page.r.cursor(self.tree)?;
        let order: Vec<&Range> = if desc {
            self.ranges.iter().rev().collect()
        } else {
            self.ranges.iter().collect()
        };
        for (lo, hi) in order {
            let inside = |k: &[u8]| {
                if desc {
                    k >= lo.as_slice()
                } else {
                    hi.as_ref().is_none_or(|h| k < h.as_slice())
                }
            };
            let mut item = range_start(&mut c, lo, hi.as_deref(), desc, self.resume_key)?;
            loop {
                if page.counted && page.covered && docs.len() >= page.q.limit {
                    return Ok(());
                }
                let Some(first) = item.filter(|(k, _)| inside(k)) else {
                    break;
                };
                item = next_in_order(&mut c, first, &inside, desc, self.grouped, &mut group)?;
                out.entries_read += group.len() as u64;
                for &(k, id) in &group {
                    if page.take(k, id, out, docs)? == Walk::Stop {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether a stream walks on.
#[derive(PartialEq, Eq)]
pub(super) enum Walk {
    On,
    Stop,
}

/// A page being filled from an index stream: each entry is a match to skip (the
/// offset), to put on the page, or only to count (the total).
pub(super) struct StreamPage<'q, 'r, 't> {
    pub(super) q: &'q Query,
    pub(super) r: &'r ReadTxn<'t>,
    /// The index answers the whole where: an entry is a match without loading its
    /// document (but a stale index's document is checked before it goes on the page).
    pub(super) covered: bool,
    /// The total is known already (`count_range`): stop once the page is full.
    pub(super) counted: bool,
    pub(super) max_scan: usize,
    /// Matches before the continuation point.
    pub(super) before: u64,
    pub(super) matches: u64,
    /// The last entry put on the page, and its match number.
    pub(super) last: Option<(Vec<u8>, u64)>,
    /// Ids already taken, for a multi-valued index (one entry per array element).
    pub(super) seen: Option<HashSet<Vec<u8>>>,
    /// The index's top-level fields: all that a covered where reads of a document.
    pub(super) index_keys: Vec<&'q str>,
}

impl StreamPage<'_, '_, '_> {
    pub(super) fn take(
        &mut self,
        k: &[u8],
        id: &[u8],
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<Walk> {
        if let Some(seen) = self.seen.as_mut() {
            if !seen.insert(id.to_vec()) {
                return Ok(Walk::On);
            }
        }
        let q = self.q;
        let page_full = docs.len() >= q.limit;
        let skipping = self.matches < q.offset as u64;
        if self.covered {
            if page_full && self.counted {
                return Ok(Walk::Stop);
            }
            if !skipping && !page_full {
                self.load_onto_page(k, id, out, docs)?;
            } else if skipping {
                out.skipped += 1;
            }
            self.matches += 1;
            return Ok(Walk::On);
        }
        if out.documents_loaded as usize >= self.max_scan {
            return Err(DocError::Query(QueryError::TooExpensive(format!(
                "the query would load more than {} documents to check \
                 its where; put its most selective field first in an index, or \
                 narrow it",
                self.max_scan
            ))));
        }
        let id = String::from_utf8_lossy(id).into_owned();
        if let Some((d, v)) = load(self.r, &id, out)? {
            if q.filter.as_ref().is_none_or(|f| eval(f, &v)) {
                if skipping {
                    out.skipped += 1;
                } else if !page_full {
                    docs.push(d);
                    self.last = Some((k.to_vec(), self.before + self.matches + 1));
                }
                self.matches += 1;
            }
        }
        Ok(Walk::On)
    }

    /// A covered match's document onto the page, unless it changed since a stale
    /// index listed it.
    pub(super) fn load_onto_page(
        &mut self,
        k: &[u8],
        id: &[u8],
        out: &mut QueryResult,
        docs: &mut Vec<Document>,
    ) -> Result<()> {
        let id = String::from_utf8_lossy(id).into_owned();
        let Some(d) = load_document(self.r, &id, out)? else {
            return Ok(());
        };
        // Covered: the where is one conjunct on the index's own fields, so only those
        // are parsed to check it (the rest of the JSON is skipped, not built).
        let still_matches = match &self.q.filter {
            None => true,
            Some(f) => {
                let fields =
                    crate::index::def::parse_fields(&d.json, &self.index_keys).map_err(|why| {
                        DocError::Document(DocumentError::Corrupt {
                            id: id.clone(),
                            why: format!("stored JSON does not parse: {why}"),
                        })
                    })?;
                eval(f, &fields)
            }
        };
        if still_matches {
            docs.push(d);
            self.last = Some((k.to_vec(), self.before + self.matches + 1));
        }
        Ok(())
    }
}

/// Reads the next entries in the defined order into `group`, starting with
/// `first`: that one entry, or for a compound index (`grouped`) the whole run of
/// entries with its first value, sorted by id. Returns the entry after them.
pub(super) fn next_in_order<'t>(
    c: &mut Cursor<'t>,
    first: Entry<'t>,
    inside: &impl Fn(&[u8]) -> bool,
    desc: bool,
    grouped: bool,
    group: &mut Vec<Entry<'t>>,
) -> Result<Option<Entry<'t>>> {
    group.clear();
    group.push(first);
    let mut item = if desc { c.prev()? } else { c.next()? };
    if grouped {
        let k = first.0;
        let head = &k[..encoded_len(k).unwrap_or(k.len())];
        while let Some(e) = item.filter(|(k, _)| inside(k) && k.starts_with(head)) {
            group.push(e);
            item = if desc { c.prev()? } else { c.next()? };
        }
        group.sort_by(|a, b| if desc { b.1.cmp(a.1) } else { a.1.cmp(b.1) });
    }
    Ok(item)
}

/// The first entry of the range `[lo, hi)` to walk up from, or with `desc` the
/// last one to walk back from; past the continuation point `resume` when that lies
/// within the range.
pub(super) fn range_start<'t>(
    c: &mut Cursor<'t>,
    lo: &[u8],
    hi: Option<&[u8]>,
    desc: bool,
    resume: Option<&[u8]>,
) -> Result<Option<Entry<'t>>> {
    if desc {
        // The exclusive end to walk back from.
        let end = match (resume, hi) {
            (Some(k), Some(h)) => Some(if k < h { k } else { h }),
            (Some(k), None) => Some(k),
            (None, h) => h,
        };
        Ok(match end {
            Some(h) => {
                let mut it = c.seek_for_prev(h)?;
                if it.is_some_and(|(k, _)| k >= h) {
                    it = c.prev()?;
                }
                it
            }
            None => c.last()?,
        })
    } else {
        Ok(match resume {
            Some(k) if k >= lo => {
                let mut it = c.seek(k)?;
                if it.is_some_and(|(x, _)| x == k) {
                    it = c.next()?;
                }
                it
            }
            _ => c.seek(lo)?,
        })
    }
}

/// How `run_stream` walks an index.
pub(super) struct Stream<'a> {
    pub(super) tree: &'a str,
    pub(super) ranges: &'a [Range],
    pub(super) covered: bool,
    pub(super) desc: bool,
    pub(super) entries: u64,
    pub(super) max_scan: usize,
    /// Continue after this entry; the matches before it.
    pub(super) resume: Option<(u64, Vec<u8>)>,
}

/// The number of entries in `[lo, hi)`. A counted index tree (every index made
/// since counted trees) answers in O(log n): two descents summing the counts its
/// branches keep, whatever the range's size. An older, uncounted one is walked:
/// the range and its complement (the entries below `lo` and from `hi`) a step at a
/// time each, stopping when either ends: the range's size, or `entries` less the
/// complement's, so twice the smaller of the two.
pub(super) fn count_range(
    r: &ReadTxn<'_>,
    tree: &str,
    lo: &[u8],
    hi: Option<&[u8]>,
    entries: u64,
    out: &mut QueryResult,
) -> Result<u64> {
    if r.tree_is_counted(tree)? {
        let hi = hi.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        return Ok(r.count_range(tree, std::ops::Bound::Included(lo), hi)?);
    }
    let mut inside = r.cursor(tree)?;
    let mut below = r.cursor(tree)?;
    let mut above = r.cursor(tree)?;
    let mut it_in = inside.seek(lo)?;
    let mut it_below = below.first()?;
    let mut it_above = match hi {
        Some(h) => above.seek(h)?,
        None => None,
    };
    let (mut n_in, mut n_out) = (0u64, 0u64);
    loop {
        match it_in {
            Some((k, _)) if hi.is_none_or(|h| k < h) => {
                n_in += 1;
                it_in = inside.next()?;
            }
            _ => {
                out.entries_read += n_in + n_out;
                return Ok(n_in);
            }
        }
        if let Some((k, _)) = it_below {
            if k < lo {
                n_out += 1;
                it_below = below.next()?;
                continue;
            }
            it_below = None;
        }
        if it_above.is_some() {
            n_out += 1;
            it_above = above.next()?;
            continue;
        }
        out.entries_read += n_in + n_out;
        return Ok(entries.saturating_sub(n_out));
    }
}
