//! The write buffer (docs/design/storage.md, "The write buffer"): small puts and deletes are
//! kept in memory as versioned entries and reach the trees later, merged in key order
//! a slice per commit.
//!
//! - `generations`: the versioned maps (active and frozen generation) and lookups;
//! - `merge`: merging the frozen generation into the trees, a slice per commit;
//! - `cursor`: the public cursor, a tree's entries merged with buffered versions.

mod cursor;
mod generations;
mod merge;

pub use cursor::Cursor;
pub use generations::Slot;
pub(crate) use generations::{
    buffer_key, split_buffer_key, Found, Generation, Gens, MergedValues, SlotRef, Stored, TreeId,
};
pub(crate) use merge::{Superseded, TreeNames};
