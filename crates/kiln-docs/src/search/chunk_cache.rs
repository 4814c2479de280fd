//! The decrypted chunks of an encrypted database's full-text index files, kept
//! for the queries after: a term's postings and a phrase's positions are read
//! again by the next query that names them, and decrypting them each time made
//! encrypted searches 1.3-1.8x slower at the median (W16). Shared by the files of
//! one index, bounded in bytes, evicted in CLOCK order (a chunk read since the
//! hand last passed gets another turn). Files are written once, so an entry never
//! goes stale; it is keyed by the open file's number (drawn per open) and the
//! chunk's index. Plaintext is wiped when its last holder drops it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A decrypted chunk, wiped when the last reference goes.
pub(crate) struct Plaintext(pub Box<[u8]>);

impl std::ops::Deref for Plaintext {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

// SAFETY: the bytes are a boxed slice on the heap, never reallocated or moved
// while the `Plaintext` lives, so their address is stable across moves of it.
unsafe impl stable_deref_trait::StableDeref for Plaintext {}

impl Drop for Plaintext {
    fn drop(&mut self) {
        crate::sealed_file::wipe(&mut self.0);
    }
}

/// A shared chunk handed to tantivy without a copy.
pub(crate) struct SharedPlaintext(pub Arc<Plaintext>);

impl std::ops::Deref for SharedPlaintext {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

// SAFETY: the bytes are a boxed slice inside an `Arc`: their address does not
// change while any clone of it lives, however the `SharedPlaintext` moves.
unsafe impl stable_deref_trait::StableDeref for SharedPlaintext {}

/// (open file number, chunk index).
type Key = (u64, u64);

pub(crate) struct ChunkCache {
    capacity_bytes: usize,
    bytes: usize,
    entries: HashMap<Key, (Arc<Plaintext>, bool)>,
    /// The CLOCK's hand goes front to back.
    order: VecDeque<Key>,
}

impl ChunkCache {
    pub fn new(capacity_bytes: usize) -> ChunkCache {
        ChunkCache {
            capacity_bytes,
            bytes: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn get(&mut self, key: Key) -> Option<Arc<Plaintext>> {
        let (chunk, referenced) = self.entries.get_mut(&key)?;
        *referenced = true;
        Some(chunk.clone())
    }

    pub fn insert(&mut self, key: Key, chunk: Arc<Plaintext>) {
        let len = chunk.len();
        if len > self.capacity_bytes || self.entries.contains_key(&key) {
            return;
        }
        while self.bytes + len > self.capacity_bytes {
            let Some(victim) = self.order.pop_front() else {
                break;
            };
            match self.entries.get_mut(&victim) {
                Some((_, referenced)) if *referenced => {
                    *referenced = false;
                    self.order.push_back(victim);
                }
                Some(_) => {
                    if let Some((gone, _)) = self.entries.remove(&victim) {
                        self.bytes -= gone.len();
                    }
                }
                None => {}
            }
        }
        self.bytes += len;
        self.entries.insert(key, (chunk, false));
        self.order.push_back(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: usize, byte: u8) -> Arc<Plaintext> {
        Arc::new(Plaintext(vec![byte; n].into_boxed_slice()))
    }

    #[test]
    fn stays_within_its_bytes_and_keeps_what_is_read_again() {
        let mut c = ChunkCache::new(300);
        c.insert((1, 0), chunk(100, 1));
        c.insert((1, 1), chunk(100, 2));
        c.insert((1, 2), chunk(100, 3));
        assert!(c.get((1, 0)).is_some()); // read again: kept over the others
        c.insert((2, 0), chunk(100, 4));
        assert!(c.bytes <= 300);
        assert_eq!(c.get((1, 0)).unwrap()[0], 1);
        assert!(
            c.get((1, 1)).is_none(),
            "the oldest unread chunk goes first"
        );
        assert_eq!(c.get((2, 0)).unwrap()[0], 4);
        c.insert((3, 0), chunk(400, 5)); // larger than the whole cache: not kept
        assert!(c.get((3, 0)).is_none());
    }
}
