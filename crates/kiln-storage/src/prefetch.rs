//! Reading ahead the leaves a batch of keys will touch, past RAM.
//!
//! The data file is read through a map advised random access (`io/os.rs`), so each
//! page a lookup needs and memory lacks is one synchronous fault: a merge slice of
//! 2,000 keys into a tree larger than memory waited for ~2,000 reads one after the
//! other while holding the writer lock (`examples/past_ram_fill.rs`: 3.5 major
//! faults and 12 KiB read per put at 2M entries in a 512 MiB cgroup). Given the keys
//! first, their leaves are found through the branches (which stay cached: a few
//! hundredths of the tree) and asked for all at once (`MADV_WILLNEED`), so the disk
//! serves them at the queue depth it can, and the merge then finds them in memory.
//!
//! In memory that would be pure cost (a descent and a system call per leaf), so it
//! is done only while the thread that merges has seen major faults lately
//! ([`FaultWindow`]).

use crate::btree::{self, PageSource};
use crate::page::{self, hdr, PageNo};
use crate::{ReadAhead, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How long a major fault keeps the read-ahead on. Read-ahead that works makes the
/// faults it prevents disappear, so the window closes now and then and the next
/// slice tells again whether memory still lacks the leaves.
const WINDOW_MS: u64 = 10_000;

/// Major page faults of the calling thread so far (the thread's own, so that other
/// threads' reads do not count).
pub(crate) fn thread_major_faults() -> u64 {
    // SAFETY: zeroed out-parameter of a plain syscall.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid out-parameter.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0;
    }
    u64::try_from(ru.ru_majflt).unwrap_or(0)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether batches read their leaves ahead: open for [`WINDOW_MS`] after a batch
/// whose thread took major faults.
pub(crate) struct FaultWindow {
    mode: ReadAhead,
    open_until_ms: AtomicU64,
    /// Batches that read ahead (for the statistics).
    batches: AtomicU64,
}

impl FaultWindow {
    pub fn new(mode: ReadAhead) -> Self {
        FaultWindow {
            mode,
            open_until_ms: AtomicU64::new(0),
            batches: AtomicU64::new(0),
        }
    }

    pub fn is_open(&self) -> bool {
        match self.mode {
            ReadAhead::Always => true,
            ReadAhead::Never => false,
            ReadAhead::WhileFaulting => self.open_until_ms.load(Ordering::Relaxed) > now_ms(),
        }
    }

    /// After a batch: `faults_before` is [`thread_major_faults`] taken before it.
    pub fn note_batch(&self, faults_before: u64) {
        if thread_major_faults() > faults_before {
            self.open_until_ms
                .store(now_ms().saturating_add(WINDOW_MS), Ordering::Relaxed);
        }
    }

    pub fn count_batch(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
}

/// Asks for the leaves of `keys` in the tree at `root` ahead, then for the
/// neighbours of those that a key's cell will overflow (a leaf that overflows is
/// spread over a neighbour, `place_overflow`, which reads both neighbours): two
/// rounds of reads issued together instead of one fault after another. `keys`
/// gives each key with the bytes its cell adds (0 for a delete). `skip` tells pages
/// not to ask for (a write transaction's own dirty pages, which are not in the
/// file). The first key's descent reads its leaf (to learn the tree's depth); the
/// rest read branches, then the leaves asked for in the first round.
pub(crate) fn leaves_ahead<'k, S: PageSource + ?Sized>(
    src: &S,
    root: PageNo,
    keys: impl Iterator<Item = (&'k [u8], usize)>,
    skip: impl Fn(PageNo) -> bool,
) -> Result<usize> {
    let mut places = Vec::new();
    let mut depth = None;
    for (key, adds) in keys {
        let depth = match depth {
            Some(d) => d,
            None => *depth.insert(btree::depth(src, root)?),
        };
        if let Some(place) = btree::leaf_at_depth(src, root, key, depth)? {
            if !skip(place.leaf) {
                places.push((place, adds));
            }
        }
    }
    let mut asked = ask_for(src, places.iter().map(|(p, _)| p.leaf));
    let mut neighbours = Vec::new();
    // Only leaves a cell is added to can overflow: lookups and deletes (0) are not
    // read here, where each read would wait for its page before the next is looked at.
    for (place, adds) in places.iter().filter(|(_, adds)| *adds > 0) {
        let p = btree::node(src, place.leaf)?;
        if page::free_space(p) + hdr::fragmented(p) < adds + 2 {
            neighbours.extend([place.left, place.right].into_iter().flatten());
        }
    }
    asked += ask_for(src, neighbours.into_iter().filter(|&no| !skip(no)));
    Ok(asked)
}

/// Asks for `pages` ahead, sorted and coalesced into runs; returns how many.
fn ask_for<S: PageSource + ?Sized>(src: &S, pages: impl Iterator<Item = PageNo>) -> usize {
    let mut pages: Vec<PageNo> = pages.collect();
    pages.sort_unstable();
    pages.dedup();
    let mut runs: Vec<(PageNo, u64)> = Vec::new();
    for &no in &pages {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == no => *len += 1,
            _ => runs.push((no, 1)),
        }
    }
    if !runs.is_empty() {
        src.prefetch(&runs);
    }
    pages.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Env, Options};
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// `leaf_at_depth` names the leaf a lookup ends in, and its neighbours are the
    /// leaves just before and after it in key order, at every depth a tree takes.
    #[test]
    fn the_leaf_found_through_the_branches_holds_the_key_and_its_neighbours_border_it() {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options {
            write_buffer_bytes: 0,
            ..Options::default()
        };
        let env = Env::open(dir.path(), opts).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let mut keys = Vec::new();
        for _ in 0..6 {
            let mut w = env.begin_write().unwrap();
            w.ensure_tree("t").unwrap();
            for _ in 0..5_000 {
                let key: [u8; 12] = rng.gen();
                w.put("t", &key, &[0x5a; 120]).unwrap();
                keys.push(key);
            }
            w.commit().unwrap();
            let r = env.begin_read().unwrap();
            let root = r.tree("t").unwrap().root;
            let depth = btree::depth(&r, root).unwrap();
            assert!(depth >= 2, "a tree of {} entries has branches", keys.len());
            for key in keys.iter().step_by(17) {
                let place = btree::leaf_at_depth(&r, root, key, depth).unwrap().unwrap();
                let leaf = btree::node(&r, place.leaf).unwrap();
                assert_eq!(hdr::kind(leaf), page::KIND_LEAF);
                assert!(page::search(leaf, key).is_ok(), "the key is in its leaf");
                if let Some(left) = place.left {
                    let l = btree::node(&r, left).unwrap();
                    let last = page::cell_key(l, hdr::count(l) - 1);
                    assert!(last < &key[..], "the left neighbour ends below the key");
                }
                if let Some(right) = place.right {
                    let p = btree::node(&r, right).unwrap();
                    assert!(
                        page::cell_key(p, 0) > &key[..],
                        "the right neighbour starts above"
                    );
                }
            }
        }
        drop(env);
    }
}
