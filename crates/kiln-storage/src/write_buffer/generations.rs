//! The write buffer: small puts and deletes land here, and in the journal as logical
//! entries (tree, key, value or tombstone), instead of in B-tree pages. They reach the
//! trees later, merged in key order a slice per commit, so that a leaf is copied,
//! journaled and written back once for all the buffered puts that land in it rather
//! than once per put. See docs/design/storage.md, "The write buffer".
//!
//! A generation is an ordered map from (tree id, key) to the versions written by
//! each transaction. A reader at snapshot `s` takes, for a key, the newest version
//! with a transaction id `<= s`, so a generation can keep taking commits while older
//! readers use it. At most two generations are live: the active one that commits
//! write into, and a frozen one being merged into the trees. A snapshot holds both
//! (`Gens`), so a reader's view is its catalog root plus the versions it may see.
//!
//! Keys and values are copied into the generation's arena (`Arena`): chunks of
//! memory that never move and are freed only with the generation. A buffered put
//! then costs no allocation of its own (it cost three: key, value, and their clones
//! when merged; with glibc's allocator a quarter of a random fill's time), and
//! values handed to readers borrow from the arena: a version visible to any reader
//! is never removed or replaced while the generation lives (only the writer's own,
//! uncommitted versions are: see `write` and `undo`), and even those leave their
//! bytes in place.

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Identifies a tree across drops and re-creations (see `TreeInfo::id`).
pub(crate) type TreeId = u64;

/// Bytes a version costs beyond its key and value (map node, vectors, boxes).
const VERSION_OVERHEAD_BYTES: u64 = 64;

/// What a transaction wrote for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    Value(Box<[u8]>),
    Tombstone,
    /// The key was written directly into its tree (a value too large to buffer):
    /// hides older buffered versions, the tree holds the current one.
    InTree,
}

impl Slot {
    pub(crate) fn as_ref(&self) -> SlotRef<'_> {
        match self {
            Slot::Value(v) => SlotRef::Value(v),
            Slot::Tombstone => SlotRef::Tombstone,
            Slot::InTree => SlotRef::InTree,
        }
    }
}

/// A `Slot` whose value is borrowed: what writers hand in and merges take out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotRef<'a> {
    Value(&'a [u8]),
    Tombstone,
    InTree,
}

/// Bytes of an arena chunk; a larger value gets a chunk of its own size.
const ARENA_CHUNK_BYTES: usize = 256 << 10;

/// Where a generation keeps its keys and values: append-only chunks that never
/// move (a `Box<[u8]>`'s bytes stay put when the list of chunks grows).
#[derive(Default)]
struct Arena {
    chunks: Vec<Box<[u8]>>,
    /// Bytes used of the last chunk.
    used: usize,
}

impl Arena {
    fn copy(&mut self, bytes: &[u8]) -> ArenaRef {
        if bytes.is_empty() {
            // An empty value: no chunk needed (a dangling pointer is a valid empty slice).
            return ArenaRef {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            };
        }
        let room = self.chunks.last().map_or(0, |c| c.len() - self.used);
        if room < bytes.len() {
            self.chunks
                .push(vec![0u8; ARENA_CHUNK_BYTES.max(bytes.len())].into_boxed_slice());
            self.used = 0;
        }
        let chunk = self.chunks.last_mut().expect("a chunk was just ensured");
        let dst = chunk
            .get_mut(self.used..self.used + bytes.len())
            .expect("the chunk has room: checked above");
        dst.copy_from_slice(bytes);
        self.used += bytes.len();
        ArenaRef {
            ptr: dst.as_ptr(),
            len: bytes.len() as u32,
        }
    }

    /// Gives back the bytes of `r` if it is the latest copy (nothing else uses
    /// them yet); otherwise they stay as garbage until the arena is dropped.
    fn take_back(&mut self, r: ArenaRef) {
        let Some(chunk) = self.chunks.last() else {
            return;
        };
        let len = r.len as usize;
        if len <= self.used && std::ptr::eq(chunk.as_ptr().wrapping_add(self.used - len), r.ptr) {
            self.used -= len;
        }
    }
}

/// Bytes in a generation's arena.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArenaRef {
    ptr: *const u8,
    len: u32,
}

// SAFETY: an `ArenaRef` points at bytes that are never written again once copied,
// owned by an arena that outlives every map entry holding the reference.
unsafe impl Send for ArenaRef {}
// SAFETY: as for `Send`: shared access only ever reads.
unsafe impl Sync for ArenaRef {}

impl ArenaRef {
    /// SAFETY (for callers): the arena that made this reference must be alive for
    /// `'a` (it lives as long as its generation).
    unsafe fn get<'a>(self) -> &'a [u8] {
        std::slice::from_raw_parts(self.ptr, self.len as usize)
    }
}

/// A version's content as the generation stores it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stored {
    Value(ArenaRef),
    Tombstone,
    InTree,
}

impl Stored {
    /// SAFETY: as `ArenaRef::get`.
    unsafe fn get<'a>(self) -> SlotRef<'a> {
        match self {
            Stored::Value(v) => SlotRef::Value(v.get()),
            Stored::Tombstone => SlotRef::Tombstone,
            Stored::InTree => SlotRef::InTree,
        }
    }
}

/// A chunk of keys with the kind of their visible version, and whether more follow.
type KindChunk = (Vec<(Box<[u8]>, Kind)>, bool);

/// What a version is, without its value (counting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Value,
    Tombstone,
    InTree,
}

/// A version as a reader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found<'a> {
    Value(&'a [u8]),
    Deleted,
    /// Look in the tree (the key is not buffered, or was written there).
    InTree,
}

#[derive(Debug)]
struct Version {
    txn_id: u64,
    slot: Stored,
}

/// A key's versions, oldest first. Most keys have one: kept inline in the map's
/// node, it costs no allocation of its own (values live in the arena, so a version
/// moving with its node never moves the bytes a reader borrows).
type Versions = smallvec::SmallVec<[Version; 1]>;

/// The buffer key: tree id (big endian, so one tree's keys are contiguous) + key.
pub(crate) fn buffer_key(tree: TreeId, key: &[u8]) -> Box<[u8]> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&tree.to_be_bytes());
    k.extend_from_slice(key);
    k.into_boxed_slice()
}

/// The first 24 bytes of a buffer key (the tree id and the key's first 16 bytes)
/// as big-endian words, zero-padded: kept inline in the map's nodes so that most
/// comparisons of a search are integer compares that touch no other memory. With
/// the whole key behind a pointer, each comparison was a cache miss: profiles of
/// random puts showed a third of the committing thread's time in the map's searches.
type Head = [u64; 3];

/// Every put and every lookup makes one: each full 8 bytes of the key is read as a
/// word straight away, the last partial word byte by byte with shifts. (A copy of a
/// length known only at run time, `copy_from_slice` or a byte loop into a padded
/// array, becomes a call to `memmove`: W8's profile showed it at 4 % of the commit
/// thread for long keys and at 1.7 % of the server for short ones.)
fn head_of(bytes: &[u8]) -> Head {
    let mut head = [0u64; 3];
    for (i, word) in head.iter_mut().enumerate() {
        let start = i * 8;
        *word = match bytes.get(start..start + 8) {
            Some(full) => u64::from_be_bytes(full.try_into().expect("8 bytes")),
            None => {
                let tail = bytes.get(start..).unwrap_or_default();
                tail.iter()
                    .enumerate()
                    .fold(0, |w, (j, &b)| w | u64::from(b) << (56 - 8 * j))
            }
        };
    }
    head
}

/// A buffer key as the map compares it: by head, then by all its bytes. That is the
/// bytes' own order: heads differ only at a byte where the keys differ or where the
/// shorter one ended (its padding 0 below the other's non-zero byte), and equal
/// heads defer to the bytes (`tie_break`).
struct MapKey {
    head: Head,
    bytes: ArenaRef,
}

/// The order of two keys whose heads are equal. When both fit in a head, the head
/// holds all their bytes, so the shorter is a prefix of the other (its padding
/// zeros matched the other's zeros) and comes first: decided by length, without
/// reading the bytes, which for a map key is a likely cache miss in the arena
/// (every point lookup that finds its key ends here).
#[inline]
fn tie_break(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    const HEAD_BYTES: usize = std::mem::size_of::<Head>();
    if a.len() <= HEAD_BYTES && b.len() <= HEAD_BYTES {
        a.len().cmp(&b.len())
    } else {
        a.cmp(b)
    }
}

impl Ord for MapKey {
    /// Searches use a `MapKey`-shaped probe (`ProbeKey`), so the whole search is
    /// monomorphic and inlined (W9's GETs once spent a tenth of the server's CPU in
    /// this map's searches through a trait object).
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.head.cmp(&other.head).then_with(|| {
            // SAFETY: a map key's bytes live in the arena beside the map; a probe's
            // are borrowed by the `ProbeKey` that holds it.
            unsafe { tie_break(self.bytes.get(), other.bytes.get()) }
        })
    }
}

/// A borrowed key to search with (lookups and range bounds), shaped as a map key so
/// that the map compares it with its own `Ord` and nothing is allocated. It is only
/// ever searched with, never inserted: its bytes are not in the arena.
struct ProbeKey<'a> {
    key: MapKey,
    _bytes: std::marker::PhantomData<&'a [u8]>,
}

fn probe_key(bytes: &[u8]) -> ProbeKey<'_> {
    ProbeKey {
        key: MapKey {
            head: head_of(bytes),
            bytes: ArenaRef {
                ptr: bytes.as_ptr(),
                len: u32::try_from(bytes.len()).expect("buffer keys are far below 4 GiB"),
            },
        },
        _bytes: std::marker::PhantomData,
    }
}

impl PartialOrd for MapKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for MapKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for MapKey {}

/// Runs `f` with the bounds of `tree`'s keys in a generation's map: from its first
/// possible buffer key (included) to the next tree's (excluded; unbounded for the last
/// possible tree id).
fn within_tree<R>(tree: TreeId, f: impl FnOnce(Bound<&MapKey>, Bound<&MapKey>) -> R) -> R {
    let start_key = tree.to_be_bytes();
    let end_key = tree.checked_add(1).map(u64::to_be_bytes);
    let start = probe_key(&start_key);
    let end = end_key.as_ref().map(|e| probe_key(e));
    f(
        Bound::Included(&start.key),
        match &end {
            Some(e) => Bound::Excluded(&e.key),
            None => Bound::Unbounded,
        },
    )
}

fn probe_bound(b: Bound<&[u8]>) -> Bound<ProbeKey<'_>> {
    match b {
        Bound::Included(k) => Bound::Included(probe_key(k)),
        Bound::Excluded(k) => Bound::Excluded(probe_key(k)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

pub(crate) fn split_buffer_key(k: &[u8]) -> (TreeId, &[u8]) {
    let (id, key) = k
        .split_at_checked(8)
        .expect("buffer keys start with a tree id");
    let id = u64::from_be_bytes(id.try_into().expect("8 bytes"));
    (id, key)
}

fn visible(versions: &[Version], upto_txn: u64) -> Option<Stored> {
    versions
        .iter()
        .rev()
        .find(|v| v.txn_id <= upto_txn)
        .map(|v| v.slot)
}

/// A version as a reader sees it, borrowed for as long as the reader holds the
/// generation alive.
///
/// SAFETY (for callers): `slot` must come from a generation that `'a` keeps alive:
/// the arena holding its bytes is freed only with the generation, and nothing
/// overwrites bytes once copied there.
unsafe fn found<'a>(slot: Stored) -> Found<'a> {
    match slot.get() {
        SlotRef::Value(v) => Found::Value(v),
        SlotRef::Tombstone => Found::Deleted,
        SlotRef::InTree => Found::InTree,
    }
}

#[derive(Default)]
struct Inner {
    map: BTreeMap<MapKey, Versions>,
    /// Declared after `map`, so dropped after it: map keys point into it.
    arena: Arena,
}

#[derive(Default)]
pub(crate) struct Generation {
    inner: RwLock<Inner>,
    /// Memory held: arena bytes (including those of replaced or undone versions,
    /// which stay until the generation is dropped) plus the map's overhead.
    bytes: AtomicU64,
    versions: AtomicU64,
    /// Set by the first in-tree version written (see `has_had_in_tree_versions`).
    in_tree_written: std::sync::atomic::AtomicBool,
}

impl Generation {
    /// Memory the generation holds, approximately.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.versions.load(Relaxed) == 0
    }

    /// SAFETY (for callers): `'a` must not outlive this generation (see `found`).
    unsafe fn lookup<'a>(&self, bkey: &[u8], upto_txn: u64) -> Option<Found<'a>> {
        let inner = self.inner.read();
        inner
            .map
            .get(&probe_key(bkey).key)
            .and_then(|vs| visible(vs, upto_txn))
            .map(|slot| found(slot))
    }

    pub fn contains(&self, bkey: &[u8]) -> bool {
        self.inner.read().map.contains_key(&probe_key(bkey).key)
    }

    /// For each key, whether it holds a version. One read lock for all of them.
    pub fn holds_each<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Vec<bool> {
        let inner = self.inner.read();
        keys.map(|bkey| inner.map.contains_key(&probe_key(bkey).key))
            .collect()
    }

    /// Whether an in-tree version was ever written here (undone ones included).
    pub fn has_had_in_tree_versions(&self) -> bool {
        self.in_tree_written.load(Relaxed)
    }

    /// Writes the version of transaction `txn_id` (the writer's, not yet visible to
    /// anyone else), replacing its earlier one. Returns that earlier one, for undo.
    pub fn write(&self, bkey: &[u8], txn_id: u64, slot: SlotRef<'_>) -> Option<Stored> {
        let mut guard = self.inner.write();
        let Inner { map, arena } = &mut *guard;
        let stored = match slot {
            SlotRef::Value(v) => {
                self.bytes.fetch_add(v.len() as u64, Relaxed);
                Stored::Value(arena.copy(v))
            }
            SlotRef::Tombstone => Stored::Tombstone,
            SlotRef::InTree => {
                self.in_tree_written.store(true, Relaxed);
                Stored::InTree
            }
        };
        // One search of the map, not two (a lookup, then an insert for a new key,
        // was a sixth of a random put): the key is copied into the arena first and
        // the copy taken back if the key turns out to be there already.
        let copied = arena.copy(bkey);
        let key = MapKey {
            head: head_of(bkey),
            bytes: copied,
        };
        match map.entry(key) {
            std::collections::btree_map::Entry::Occupied(mut e) => {
                arena.take_back(copied);
                let vs = e.get_mut();
                if let Some(last) = vs.last_mut() {
                    assert!(
                        last.txn_id <= txn_id,
                        "write buffer: txn {txn_id} writes under a newer version of txn {}",
                        last.txn_id
                    );
                    if last.txn_id == txn_id {
                        return Some(std::mem::replace(&mut last.slot, stored));
                    }
                }
                vs.push(Version {
                    txn_id,
                    slot: stored,
                });
            }
            std::collections::btree_map::Entry::Vacant(e) => {
                self.bytes.fetch_add(bkey.len() as u64, Relaxed);
                e.insert(smallvec::smallvec![Version {
                    txn_id,
                    slot: stored
                }]);
            }
        }
        self.bytes.fetch_add(VERSION_OVERHEAD_BYTES, Relaxed);
        self.versions.fetch_add(1, Relaxed);
        None
    }

    /// Undoes one `write` of transaction `txn_id`: restores the version it replaced,
    /// or removes the version it added. (Its bytes stay in the arena, and counted,
    /// until the generation is dropped.)
    pub fn undo(&self, bkey: &[u8], txn_id: u64, previous: Option<Stored>) {
        let mut inner = self.inner.write();
        let Some(vs) = inner.map.get_mut(&probe_key(bkey).key) else {
            panic!("write buffer: undo of a key that holds no version");
        };
        let last = vs.last_mut().expect("a buffered key has versions");
        assert_eq!(
            last.txn_id, txn_id,
            "write buffer: undo of another transaction's version"
        );
        match previous {
            Some(prev) => last.slot = prev,
            None => {
                vs.pop().expect("checked above");
                self.bytes.fetch_sub(VERSION_OVERHEAD_BYTES, Relaxed);
                self.versions.fetch_sub(1, Relaxed);
                if vs.is_empty() {
                    inner.map.remove(&probe_key(bkey).key);
                }
            }
        }
    }

    /// The nearest key of `tree` from `from` on, forward or backward (`None` = from
    /// the start or the end; `inclusive` says whether `from` itself counts), with a
    /// version visible at `upto_txn`.
    pub fn step<'a>(
        &self,
        tree: TreeId,
        from: Option<&[u8]>,
        inclusive: bool,
        forward: bool,
        upto_txn: u64,
    ) -> Option<(&'a [u8], Found<'a>)> {
        let from_key = from.map(|k| buffer_key(tree, k));
        let from_probe = from_key.as_deref().map(probe_key);
        let at: Option<Bound<&MapKey>> = from_probe.as_ref().map(|p| {
            if inclusive {
                Bound::Included(&p.key)
            } else {
                Bound::Excluded(&p.key)
            }
        });
        let inner = self.inner.read();
        let map = &inner.map;
        let hit = |(k, vs): (&MapKey, &Versions)| {
            visible(vs, upto_txn).map(|slot| {
                // SAFETY: the caller holds this generation alive for `'a` (it came
                // from a snapshot's `Gens`), so its arena outlives the borrow.
                unsafe { (k.bytes.get().get(8..).unwrap_or_default(), found(slot)) }
            })
        };
        within_tree(tree, |start, end| {
            let (lo, hi) = match (at, forward) {
                (Some(at), true) => (at, end),
                (Some(at), false) => (start, at),
                (None, _) => (start, end),
            };
            let range = map.range((lo, hi));
            if forward {
                range.filter_map(hit).next()
            } else {
                range.rev().filter_map(hit).next()
            }
        })
    }

    /// Up to `limit` keys of `tree` from `from` to `until` (buffer keys; unbounded:
    /// the tree's first or last) that have a version visible at `upto_txn`, with its
    /// kind; and whether the limit was reached (more may follow).
    fn visible_kinds(
        &self,
        tree: TreeId,
        from: Bound<&[u8]>,
        until: Bound<&[u8]>,
        upto_txn: u64,
        limit: usize,
    ) -> KindChunk {
        let (from_probe, until_probe) = (probe_bound(from), probe_bound(until));
        let inner = self.inner.read();
        let map = &inner.map;
        let out: Vec<(Box<[u8]>, Kind)> = within_tree(tree, |start, end| {
            let lo = match &from_probe {
                Bound::Included(p) => Bound::Included(&p.key),
                Bound::Excluded(p) => Bound::Excluded(&p.key),
                Bound::Unbounded => start,
            };
            let hi = match &until_probe {
                Bound::Included(p) => Bound::Included(&p.key),
                Bound::Excluded(p) => Bound::Excluded(&p.key),
                Bound::Unbounded => end,
            };
            // An empty range (lo above hi) would make `range` panic.
            let empty = match (lo, hi) {
                (
                    Bound::Included(a) | Bound::Excluded(a),
                    Bound::Included(b) | Bound::Excluded(b),
                ) => {
                    a > b
                        || (a == b
                            && !(matches!(lo, Bound::Included(_))
                                && matches!(hi, Bound::Included(_))))
                }
                _ => false,
            };
            if empty {
                return Vec::new();
            }
            map.range((lo, hi))
                .filter_map(|(k, vs)| {
                    visible(vs, upto_txn).map(|slot| {
                        let kind = match slot {
                            Stored::Value(_) => Kind::Value,
                            Stored::Tombstone => Kind::Tombstone,
                            Stored::InTree => Kind::InTree,
                        };
                        // SAFETY: the map's keys live in the arena beside it, and
                        // the read lock keeps the map (and so the arena) alive.
                        (Box::from(unsafe { k.bytes.get() }), kind)
                    })
                })
                .take(limit)
                .collect()
        });
        let full = out.len() == limit;
        (out, full)
    }

    /// Up to `limit` keys from `after` (exclusive) on, each with its newest version:
    /// a slice of a frozen generation to merge, borrowed from it (nothing copied).
    pub fn newest_from(&self, after: Option<&[u8]>, limit: usize) -> Vec<(&[u8], SlotRef<'_>)> {
        let inner = self.inner.read();
        let after = after.map(probe_key);
        let lo: Bound<&MapKey> = match &after {
            Some(p) => Bound::Excluded(&p.key),
            None => Bound::Unbounded,
        };
        inner
            .map
            .range((lo, Bound::Unbounded))
            .take(limit)
            .map(|(k, vs)| {
                let slot = vs.last().expect("versions").slot;
                // SAFETY: the borrow is bound to `&self`, and the arena lives as long
                // as the generation.
                unsafe { (k.bytes.get(), slot.get()) }
            })
            .collect()
    }
}

impl Generation {
    /// Copies the value of `bkey`'s newest version into `dest`: false unless that
    /// version is a value of exactly `dest.len()` bytes (replay of a patched page
    /// image, which names a value this generation held when it was merged).
    pub fn copy_newest_value(&self, bkey: &[u8], dest: &mut [u8]) -> bool {
        let inner = self.inner.read();
        let Some(newest) = inner.map.get(&probe_key(bkey).key).and_then(|vs| vs.last()) else {
            return false;
        };
        match newest.slot {
            Stored::Value(v) => {
                // SAFETY: the read lock is held and the arena lives as long as `self`.
                let v = unsafe { v.get() };
                if v.len() != dest.len() {
                    return false;
                }
                dest.copy_from_slice(v);
                true
            }
            Stored::Tombstone | Stored::InTree => false,
        }
    }
}

/// The values a transaction merged from the frozen generation, by key, so that its
/// journal record can name a value by its buffer key instead of repeating its bytes
/// (`journal::record::MergedValueSource`; docs/design/storage.md §2.4, "Patched images").
#[derive(Default)]
pub(crate) struct MergedValues {
    /// The generation the references point into, kept alive by this.
    frozen: Option<Arc<Generation>>,
    /// By the hash of the key (without its tree id): buffer key and value. A key
    /// with the same hash as another replaces it; it only loses the chance to be
    /// named, since `merged_as` compares the bytes.
    by_key: crate::fasthash::FastMap<u64, (ArenaRef, ArenaRef)>,
}

fn key_hash(key: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = crate::fasthash::FastHasher::default();
    h.write(key);
    h.finish()
}

impl MergedValues {
    /// Notes that this transaction merged `value` for `bkey`, as the newest version of
    /// `frozen` holds them. Values too short to be worth naming are not noted.
    ///
    /// SAFETY (for callers): `bkey` and `value` must be borrowed from `frozen` (from
    /// `Generation::newest_from`): they are kept as pointers into its arena, which
    /// the `Arc` kept here holds alive and which nobody writes again.
    pub unsafe fn note(&mut self, frozen: &Arc<Generation>, bkey: &[u8], value: &[u8]) {
        if value.len() < crate::journal::record::MIN_REFERENCED_VALUE {
            return;
        }
        if !self.frozen.as_ref().is_some_and(|f| Arc::ptr_eq(f, frozen)) {
            self.by_key.clear();
            self.frozen = Some(frozen.clone());
        }
        let (_, key) = split_buffer_key(bkey);
        let arena_ref = |b: &[u8]| ArenaRef {
            ptr: b.as_ptr(),
            len: b.len() as u32,
        };
        self.by_key
            .insert(key_hash(key), (arena_ref(bkey), arena_ref(value)));
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Takes over what `other` noted (the merge thread's side of this transaction).
    pub fn absorb(&mut self, other: MergedValues) {
        let same = match (&self.frozen, &other.frozen) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if same {
            self.by_key.extend(other.by_key);
        } else if !other.by_key.is_empty() {
            *self = other;
        }
    }
}

impl crate::journal::record::MergedValueSource for MergedValues {
    fn merged_as(&self, key: &[u8], value: &[u8]) -> Option<&[u8]> {
        let (bkey, merged) = self.by_key.get(&key_hash(key))?;
        // SAFETY: `note`'s contract: both point into the arena of `self.frozen`,
        // alive while `self` is.
        let (bkey, merged) = unsafe { (bkey.get(), merged.get()) };
        (split_buffer_key(bkey).1 == key && merged == value).then_some(bkey)
    }
}

/// The generations a snapshot reads through: `active` first, then `frozen`.
#[derive(Clone, Default)]
pub(crate) struct Gens {
    pub active: Arc<Generation>,
    pub frozen: Option<Arc<Generation>>,
}

impl std::fmt::Debug for Gens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gens {{ active: {} bytes, frozen: {:?} }}",
            self.active.bytes(),
            self.frozen.as_ref().map(|g| g.bytes())
        )
    }
}

impl PartialEq for Gens {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.active, &other.active)
            && match (&self.frozen, &other.frozen) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}
impl Eq for Gens {}

impl Gens {
    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.frozen.is_none()
    }

    pub fn bytes(&self) -> u64 {
        self.active.bytes() + self.frozen.as_ref().map_or(0, |f| f.bytes())
    }

    /// What the buffer says about `key` at `upto_txn`.
    pub fn lookup<'a>(&self, tree: TreeId, key: &[u8], upto_txn: u64) -> Found<'a> {
        if self.is_empty() {
            return Found::InTree;
        }
        self.lookup_bkey(&buffer_key(tree, key), upto_txn)
    }

    /// `lookup` by buffer key.
    pub fn lookup_bkey<'a>(&self, bkey: &[u8], upto_txn: u64) -> Found<'a> {
        if self.is_empty() {
            return Found::InTree;
        }
        // SAFETY: whoever asks holds these generations alive for `'a` (a snapshot's
        // `Gens`, kept by the reader or the transaction for as long as it borrows).
        unsafe {
            if let Some(f) = self.active.lookup(bkey, upto_txn) {
                return f;
            }
            match &self.frozen {
                Some(fz) => fz.lookup(bkey, upto_txn).unwrap_or(Found::InTree),
                None => Found::InTree,
            }
        }
    }

    /// How the buffer changes the number of entries of `tree` for a reader at
    /// `upto_txn`: +1 for each buffered key whose visible version is a value and which
    /// the tree lacks, -1 for each visible tombstone of a key the tree holds
    /// (`in_tree` looks a key up in the reader's tree). Puts do not count as they go
    /// (that took a tree lookup per put, half the time of a random buffered put);
    /// this pays it per buffered key of the tree when a count is asked for. Keys are
    /// taken a chunk at a time, so the map locks are not held across tree lookups
    /// (which may read the disk) and the writer is never held up for long.
    pub fn count_change(
        &self,
        tree: TreeId,
        upto_txn: u64,
        in_tree: impl FnMut(&[u8]) -> crate::Result<bool>,
    ) -> crate::Result<i64> {
        self.count_change_by_chunks(
            tree,
            Bound::Unbounded,
            Bound::Unbounded,
            upto_txn,
            in_tree,
            1024,
        )
    }

    /// `count_change` for the keys inside (`lo`, `hi`) only: what a counted tree's
    /// range count adds for the buffer (a tree lookup per buffered key of the range).
    pub fn count_change_in(
        &self,
        tree: TreeId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        upto_txn: u64,
        in_tree: impl FnMut(&[u8]) -> crate::Result<bool>,
    ) -> crate::Result<i64> {
        if self.is_empty() {
            return Ok(0);
        }
        self.count_change_by_chunks(tree, lo, hi, upto_txn, in_tree, 1024)
    }

    fn count_change_by_chunks(
        &self,
        tree: TreeId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        upto_txn: u64,
        mut in_tree: impl FnMut(&[u8]) -> crate::Result<bool>,
        chunk_keys: usize,
    ) -> crate::Result<i64> {
        let bkey = |b: Bound<&[u8]>| match b {
            Bound::Included(k) => Bound::Included(buffer_key(tree, k)),
            Bound::Excluded(k) => Bound::Excluded(buffer_key(tree, k)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let (lo, hi) = (bkey(lo), bkey(hi));
        let until = hi.as_ref().map(|k| &k[..]);
        let mut change = 0;
        let mut after: Option<Box<[u8]>> = None;
        loop {
            let from = match &after {
                Some(a) => Bound::Excluded(&a[..]),
                None => lo.as_ref().map(|k| &k[..]),
            };
            let chunk = |g: &Generation| g.visible_kinds(tree, from, until, upto_txn, chunk_keys);
            let (mut a, a_full) = chunk(&self.active);
            let (mut f, f_full) = match &self.frozen {
                Some(fz) => chunk(fz),
                None => (Vec::new(), false),
            };
            // Up to where both chunks are complete; beyond it the next round looks.
            let bound = match (a_full, f_full) {
                (false, false) => None,
                (true, false) => a.last().map(|e| e.0.clone()),
                (false, true) => f.last().map(|e| e.0.clone()),
                (true, true) => {
                    let (la, lf) = (&a.last().expect("full").0, &f.last().expect("full").0);
                    Some(if la <= lf { la.clone() } else { lf.clone() })
                }
            };
            if let Some(b) = &bound {
                a.retain(|e| &e.0 <= b);
                f.retain(|e| &e.0 <= b);
            }
            // Merge by key; the active generation's version wins.
            let mut merged: BTreeMap<Box<[u8]>, Kind> = f.into_iter().collect();
            merged.extend(a);
            for (bkey, kind) in &merged {
                let key = bkey.get(8..).unwrap_or_default();
                change += match kind {
                    Kind::Value => i64::from(!in_tree(key)?),
                    Kind::Tombstone => -i64::from(in_tree(key)?),
                    Kind::InTree => 0,
                };
            }
            match bound {
                Some(b) => after = Some(b),
                None => return Ok(change),
            }
        }
    }

    /// True if any generation holds a version of the key (of any transaction).
    pub fn holds(&self, bkey: &[u8]) -> bool {
        self.active.contains(bkey) || self.frozen.as_ref().is_some_and(|f| f.contains(bkey))
    }

    /// The nearest buffered key after/before `from` visible at `upto_txn`, with the
    /// version that wins (the active generation's over the frozen one's).
    pub fn step<'a>(
        &self,
        tree: TreeId,
        from: Option<&[u8]>,
        inclusive: bool,
        forward: bool,
        upto_txn: u64,
    ) -> Option<(&'a [u8], Found<'a>)> {
        let a = self.active.step(tree, from, inclusive, forward, upto_txn);
        let Some(fz) = &self.frozen else {
            return a;
        };
        let f = fz.step(tree, from, inclusive, forward, upto_txn);
        match (a, f) {
            (Some(a), Some(f)) => {
                let a_first = if forward { a.0 <= f.0 } else { a.0 >= f.0 };
                if a_first {
                    Some(a)
                } else {
                    Some(f)
                }
            }
            (a, None) => a,
            (None, f) => f,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
        // Small alphabets and lengths around the 8-byte word boundary, so that equal
        // prefixes, proper prefixes and differences in any word are all common.
        prop::collection::vec(prop::sample::select(vec![0u8, 1, 0x7f, 0x80, 0xff]), 0..34)
    }

    /// (tree, key byte, txn, kind 0 value / 1 tombstone / 2 in tree, into frozen?)
    type Write = (u64, u8, u64, u8, bool);

    /// Values of every size land in the arena and read back unchanged: empty ones,
    /// ones larger than a chunk, and enough small ones to fill several chunks.
    #[test]
    fn arena_values_read_back_across_chunks() {
        let g = Generation::default();
        let value = |i: usize| vec![(i % 251) as u8; (i * 37) % 3000];
        let big = vec![9u8; ARENA_CHUNK_BYTES + 5];
        for i in 0..2000 {
            g.write(
                &buffer_key(1, &(i as u32).to_be_bytes()),
                1,
                SlotRef::Value(&value(i)),
            );
        }
        g.write(&buffer_key(1, b"big"), 1, SlotRef::Value(&big));
        g.write(&buffer_key(1, b""), 1, SlotRef::Value(&[]));
        let gens = Gens {
            active: Arc::new(g),
            frozen: None,
        };
        for i in 0..2000 {
            let key = (i as u32).to_be_bytes();
            assert_eq!(gens.lookup(1, &key, 1), Found::Value(&value(i)[..]));
        }
        assert_eq!(gens.lookup(1, b"big", 1), Found::Value(&big[..]));
        assert_eq!(gens.lookup(1, b"", 1), Found::Value(&[][..]));
        assert_eq!(gens.lookup(1, b"absent", 1), Found::InTree);
        assert!(gens.active.inner.read().arena.chunks.len() > 3);
        // A key written again costs its value only: the key's copy is taken back.
        let used = |g: &Generation| g.inner.read().arena.used;
        let before = used(&gens.active);
        gens.active
            .write(&buffer_key(1, b"big"), 2, SlotRef::Value(b"v2"));
        assert_eq!(used(&gens.active), before + 2);
        assert_eq!(gens.lookup(1, b"big", 2), Found::Value(&b"v2"[..]));
        assert_eq!(gens.lookup(1, b"big", 1), Found::Value(&big[..]));
    }

    /// `MergedValues` names a value only for its key and exact bytes (from any tree:
    /// equal bytes rebuild the same page), forgets a generation it is no longer fed
    /// from, and takes over a side's notes.
    #[test]
    fn merged_values_match_key_and_bytes_and_follow_their_generation() {
        use crate::journal::record::MergedValueSource;
        let value = |b: u8| vec![b; 300];
        let frozen = |entries: &[(u64, &[u8], u8)]| {
            let g = Generation::default();
            for (tree, key, b) in entries {
                g.write(&buffer_key(*tree, key), 1, SlotRef::Value(&value(*b)));
            }
            Arc::new(g)
        };
        // Notes what `newest_from` hands a merge, as `merge_keys` does.
        let note_all = |m: &mut MergedValues, g: &Arc<Generation>| {
            for (bkey, slot) in g.newest_from(None, usize::MAX) {
                if let SlotRef::Value(v) = slot {
                    // SAFETY: both borrowed from `g` (`newest_from`).
                    unsafe { m.note(g, bkey, v) };
                }
            }
        };
        let g1 = frozen(&[(1, b"a", 1), (2, b"b", 2), (1, b"short", 3)]);
        let mut m = MergedValues::default();
        note_all(&mut m, &g1);
        assert_eq!(m.merged_as(b"a", &value(1)), Some(&buffer_key(1, b"a")[..]));
        assert_eq!(m.merged_as(b"a", &value(9)), None, "other bytes");
        assert_eq!(m.merged_as(b"zz", &value(1)), None, "other key");
        // Short values are not worth naming and are not noted.
        let g_short = Generation::default();
        g_short.write(&buffer_key(1, b"s"), 1, SlotRef::Value(&[7u8; 100]));
        let g_short = Arc::new(g_short);
        let mut short = MergedValues::default();
        note_all(&mut short, &g_short);
        assert!(short.is_empty());
        // A side fed from the same generation adds to the notes.
        let mut side = MergedValues::default();
        let g1_more = g1.clone();
        // SAFETY: borrowed from `g1_more` (the same generation as `g1`).
        for (bkey, slot) in g1_more.newest_from(None, usize::MAX) {
            if let SlotRef::Value(v) = slot {
                unsafe { side.note(&g1_more, bkey, v) };
            }
        }
        m.absorb(side);
        assert_eq!(m.merged_as(b"b", &value(2)), Some(&buffer_key(2, b"b")[..]));
        // A note from another generation replaces the old ones, which point into an
        // arena this no longer keeps alive.
        let g2 = frozen(&[(1, b"c", 4)]);
        note_all(&mut m, &g2);
        assert_eq!(m.merged_as(b"a", &value(1)), None);
        assert_eq!(m.merged_as(b"c", &value(4)), Some(&buffer_key(1, b"c")[..]));
        drop(g1);
        // And absorbing a side of another generation takes the side's.
        let mut side = MergedValues::default();
        note_all(&mut side, &frozen(&[(3, b"d", 5)]));
        m.absorb(side);
        assert_eq!(m.merged_as(b"c", &value(4)), None);
        assert_eq!(m.merged_as(b"d", &value(5)), Some(&buffer_key(3, b"d")[..]));
        // The generation's newest value is what replay copies back.
        let g3 = frozen(&[(1, b"e", 6)]);
        g3.write(&buffer_key(1, b"e"), 2, SlotRef::Value(&value(7)));
        let mut dest = vec![0u8; 300];
        assert!(g3.copy_newest_value(&buffer_key(1, b"e"), &mut dest));
        assert_eq!(dest, value(7));
        assert!(
            !g3.copy_newest_value(&buffer_key(1, b"e"), &mut [0u8; 299]),
            "length"
        );
        assert!(
            !g3.copy_newest_value(&buffer_key(2, b"e"), &mut dest),
            "other tree"
        );
        g3.write(&buffer_key(1, b"e"), 3, SlotRef::Tombstone);
        assert!(
            !g3.copy_newest_value(&buffer_key(1, b"e"), &mut dest),
            "tombstone"
        );
    }

    proptest! {
        /// A head is the key's first 24 bytes, zero-padded, as big-endian words,
        /// whichever way it was read (short keys byte by byte, long ones at once);
        /// and heads order keys as their bytes do wherever they differ.
        #[test]
        fn head_is_the_padded_prefix(a in key_bytes(), b in key_bytes()) {
            for k in [&a, &b] {
                let mut padded = k.clone();
                padded.resize(padded.len().max(24), 0);
                let words: Vec<u64> = padded[..24]
                    .chunks(8)
                    .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                prop_assert_eq!(head_of(k).to_vec(), words);
            }
            if head_of(&a) != head_of(&b) {
                prop_assert_eq!(head_of(&a).cmp(&head_of(&b)), a.cmp(&b));
            }
        }

        /// Counting by chunks of any size gives what a key-by-key look at the
        /// buffer gives: frozen and active generations, versions newer than the
        /// reader, keys of neighbouring trees, every kind of version.
        #[test]
        fn count_change_matches_key_by_key(
            writes in prop::collection::vec(
                (1u64..4, 0u8..40, 1u64..30, 0u8..3, any::<bool>()), 0..120),
            in_tree in prop::collection::btree_set(0u8..40, 0..40),
            upto in 0u64..32,
            chunk in 1usize..6,
        ) {
            let mut writes: Vec<Write> = writes;
            // Frozen versions are older than active ones; txn ids rise per key.
            writes.sort_by_key(|w| (!w.4, w.2));
            let gens = Gens { active: Default::default(), frozen: Some(Default::default()) };
            for (tree, key, txn, kind, frozen) in &writes {
                let slot = match kind {
                    0 => Slot::Value(vec![*key].into()),
                    1 => Slot::Tombstone,
                    _ => Slot::InTree,
                };
                let g = if *frozen { gens.frozen.as_ref().unwrap() } else { &gens.active };
                g.write(&buffer_key(*tree, &[*key]), *txn, slot.as_ref());
            }
            let tree = 2;
            let mut expect = 0i64;
            for key in 0u8..40 {
                let t = in_tree.contains(&key);
                expect += match gens.lookup(tree, &[key], upto) {
                    Found::Value(_) => i64::from(!t),
                    Found::Deleted => -i64::from(t),
                    Found::InTree => 0,
                };
            }
            let got = gens
                .count_change_by_chunks(tree, Bound::Unbounded, Bound::Unbounded, upto, |k| Ok(in_tree.contains(&k[0])), chunk)
                .unwrap();
            prop_assert_eq!(got, expect);
        }

        /// The map's word-wise order is exactly the byte order that cursors promise.
        #[test]
        fn map_key_order_is_byte_order(a in key_bytes(), b in key_bytes()) {
            let (ka, kb) = (probe_key(&a), probe_key(&b));
            prop_assert_eq!(ka.key.cmp(&kb.key), a.cmp(&b));
        }

        /// Point lookups and range scans find the same keys in one map.
        #[test]
        fn point_lookups_find_what_was_written(
            keys in prop::collection::btree_set(key_bytes(), 1..60),
            absent in key_bytes(),
        ) {
            let g = Generation::default();
            for (i, k) in keys.iter().enumerate() {
                g.write(k, i as u64 + 1, SlotRef::Value(k));
            }
            for k in &keys {
                prop_assert!(g.contains(k));
                // SAFETY: `g` outlives the borrowed version.
                let found = unsafe { g.lookup(k, u64::MAX) };
                prop_assert!(matches!(found, Some(Found::Value(v)) if v == &k[..]));
            }
            prop_assert_eq!(g.contains(&absent), keys.contains(&absent));
            let scanned = g.inner.read().map.range::<MapKey, _>(..).count();
            prop_assert_eq!(scanned, keys.len());
        }
    }
}
