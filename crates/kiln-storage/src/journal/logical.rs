//! The write buffer's entries in a journal record ("logical" entries: tree, key,
//! value or tombstone), as opposed to page images. Encoded by the transaction as it
//! writes (`LogicalLog`), decoded on replay (`decode_entries`).

use super::decode_error::{take, DecodeError, EntryProblem};
use crate::page::{self, read_u16, read_u32};
use crate::write_buffer::{Slot, SlotRef, TreeId};

/// `key_len u16 | kind u8 | value_len u32`.
const LOGICAL_ENTRY_HEADER: usize = 7;

/// A transaction's write-buffer entries in their journal encoding, appended as the
/// transaction writes (so a commit copies bytes rather than searching the buffer
/// again for each key's final version). Every write is an entry, in order: a key
/// written twice appears twice, and replay applies both, the later replacing the
/// earlier. Entry: `key_len u16 | kind u8 (0 value, 1 tombstone, 2 in tree) |
/// value_len u32 | buffer key (tree id BE ++ key) | value`.
#[derive(Debug, Default)]
pub struct LogicalLog {
    bytes: Vec<u8>,
    count: u32,
}

impl LogicalLog {
    /// Appends an entry; returns its offset (for `buffer_key` and `truncate`).
    pub(crate) fn push(&mut self, tree: TreeId, key: &[u8], slot: SlotRef<'_>) -> usize {
        let (kind, value): (u8, &[u8]) = match slot {
            SlotRef::Value(v) => (0, v),
            SlotRef::Tombstone => (1, &[]),
            SlotRef::InTree => (2, &[]),
        };
        let at = self.bytes.len();
        self.bytes
            .extend_from_slice(&((8 + key.len()) as u16).to_le_bytes());
        self.bytes.push(kind);
        self.bytes
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&tree.to_be_bytes());
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
        self.count += 1;
        at
    }

    /// The buffer key of the entry at `at`.
    // Bounds: `at` is an offset `push` returned for this log, whose entry holds a key of the stated length.
    #[allow(clippy::indexing_slicing)]
    pub fn buffer_key(&self, at: usize) -> &[u8] {
        let len = read_u16(&self.bytes, at) as usize;
        &self.bytes[at + LOGICAL_ENTRY_HEADER..at + LOGICAL_ENTRY_HEADER + len]
    }

    /// Drops the entry at `at` and all after it; `count` entries remain.
    pub fn truncate(&mut self, at: usize, count: usize) {
        self.bytes.truncate(at);
        self.count = count as u32;
    }

    pub fn clear(&mut self) {
        self.truncate(0, 0);
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Entries, as the record header of the entry section states them.
    pub(super) fn count(&self) -> u32 {
        self.count
    }

    /// The entries' encoded bytes (after the count in a record body).
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Encoded size in a record body (0 when there are no entries).
    pub fn encoded_len(&self) -> usize {
        if self.is_empty() {
            0
        } else {
            4 + self.bytes.len()
        }
    }
}

/// One decoded write-buffer entry: its buffer key and what it holds.
pub(crate) type LogicalEntry = (Box<[u8]>, Slot);

/// Decodes the entry section of a record body at `*at` (count, then entries).
pub(super) fn decode_entries(
    body: &[u8],
    at: &mut usize,
) -> Result<Vec<LogicalEntry>, DecodeError> {
    let mut logical = Vec::new();
    let count = read_u32(take(body, at, 4, "buffer entry count")?, 0) as usize;
    for index in 0..count {
        let entry_at = *at;
        let bad = |problem| DecodeError::Entry {
            index,
            at: entry_at,
            problem,
        };
        let eh = take(body, at, LOGICAL_ENTRY_HEADER, "buffer entry header")?;
        let (klen, vlen) = (read_u16(eh, 0) as usize, read_u32(eh, 3) as usize);
        // Byte 2: the low byte of the little-endian u16 there.
        let kind = read_u16(eh, 2) as u8;
        if !(9..=8 + page::MAX_KEY_SIZE).contains(&klen) {
            return Err(bad(EntryProblem::KeyLength { len: klen }));
        }
        let key: Box<[u8]> = take(body, at, klen, "buffer entry key")?.into();
        let slot = match (kind, vlen) {
            (0, _) => Slot::Value(take(body, at, vlen, "buffer entry value")?.into()),
            (1, 0) => Slot::Tombstone,
            (2, 0) => Slot::InTree,
            _ => {
                return Err(bad(EntryProblem::Kind {
                    kind,
                    value_len: vlen,
                }))
            }
        };
        logical.push((key, slot));
    }
    Ok(logical)
}
