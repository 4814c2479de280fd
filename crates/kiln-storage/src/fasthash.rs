//! A fast hasher for the engine's internal maps (page numbers, tree names).
//!
//! The standard SipHash resists hash flooding by untrusted keys; these keys are page
//! numbers the engine allocates and tree names of a handful of trees, looked up on
//! every page touch and every put. SipHash showed up at a few percent of the CPU
//! under load; a multiply-xorshift for integers and FNV-1a for bytes cost a fraction.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct FastHasher {
    state: u64,
}

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        // FNV-1a, continued from the current state.
        let mut h = self.state ^ 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.state = h;
    }

    fn write_u64(&mut self, x: u64) {
        self.state = (self.state ^ x).wrapping_mul(MULTIPLIER);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }

    fn write_u8(&mut self, x: u8) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits into the low ones the table indexes by.
        self.state ^ (self.state >> 29)
    }
}

pub type FastBuild = BuildHasherDefault<FastHasher>;
pub type FastMap<K, V> = HashMap<K, V, FastBuild>;
pub type FastSet<K> = HashSet<K, FastBuild>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_page_numbers_spread_and_maps_work() {
        let mut m: FastMap<u64, u64> = FastMap::default();
        for i in 0..100_000u64 {
            m.insert(i, i * 2);
        }
        assert!((0..100_000u64).all(|i| m[&i] == i * 2));
        let low_bits: std::collections::BTreeSet<u64> = (0..1024u64)
            .map(|i| {
                let mut h = FastHasher::default();
                h.write_u64(i);
                h.finish() & 1023
            })
            .collect();
        assert!(
            low_bits.len() > 600,
            "{} distinct buckets of 1024",
            low_bits.len()
        );
        let mut s: FastMap<String, u8> = FastMap::default();
        s.insert("docs".into(), 1);
        s.insert("meta".into(), 2);
        assert_eq!(s["docs"], 1);
    }
}
