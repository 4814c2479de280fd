//! The data of the storage workloads W1-W6 of shared/BENCHMARKS.md, shared by
//! `kiln bench` and the comparative benchmark in bench/ so that every engine gets
//! the same operations: the seed, the key and value sizes, how keys and values are
//! generated, and the full-scale counts.

use rand::{rngs::SmallRng, Rng, RngCore, SeedableRng};

/// The seed of every generated key and value.
pub const SEED: u64 = 0x4B494C4E;
/// Keys of W2-W6.
pub const KEY_BYTES: usize = 16;
/// Values of W2-W6.
pub const VALUE_BYTES: usize = 100;
/// W1's value, one per transaction.
pub const W1_VALUE_BYTES: usize = 16 * 1024;
/// W1's transactions at full scale.
pub const W1_COMMITS: u64 = 65_536;
/// W6's commits at full scale, all threads together.
pub const W6_COMMITS: u64 = 20_000;

/// A fill workload: `txns` durable transactions of `per_txn` puts.
#[derive(Debug, Clone, Copy)]
pub struct Fill {
    pub txns: u64,
    pub per_txn: u64,
    /// Keys in order (big-endian counter in the last 8 bytes) or random.
    pub sequential: bool,
}

/// W2: sequential keys, 1,000 transactions of 1,000 puts.
pub const W2: Fill = Fill {
    txns: 1000,
    per_txn: 1000,
    sequential: true,
};
/// W3: random keys, 1,000 transactions of 1,000 puts.
pub const W3: Fill = Fill {
    txns: 1000,
    per_txn: 1000,
    sequential: false,
};
/// W4: random keys, 10,000 transactions of 100 puts.
pub const W4: Fill = Fill {
    txns: 10_000,
    per_txn: 100,
    sequential: false,
};

/// The keys and values of W2-W4 (and of W6's threads), one put after another.
pub struct Puts {
    rng: SmallRng,
    n: u64,
    sequential: bool,
}

impl Puts {
    /// A fill's puts (W2, W3, W4; W5's data is W3's).
    pub fn fill(sequential: bool) -> Puts {
        Puts {
            rng: SmallRng::seed_from_u64(SEED),
            n: 0,
            sequential,
        }
    }

    /// The puts of W6's thread `thread` (from 0): random keys, a seed per thread.
    pub fn w6_thread(thread: u64) -> Puts {
        Puts {
            rng: SmallRng::seed_from_u64(SEED + thread),
            n: 0,
            sequential: false,
        }
    }

    /// The next put's key and value.
    pub fn next(&mut self, key: &mut [u8; KEY_BYTES], value: &mut [u8; VALUE_BYTES]) {
        if self.sequential {
            *key = [0; KEY_BYTES];
            key[8..].copy_from_slice(&self.n.to_be_bytes());
        } else {
            self.rng.fill(key);
        }
        self.n += 1;
        self.rng.fill_bytes(value);
    }
}

/// W1's values: random bytes, one value after another (its keys are the
/// transaction's number, 8 bytes big-endian).
pub struct Values {
    rng: SmallRng,
}

impl Values {
    pub fn w1() -> Values {
        Values {
            rng: SmallRng::seed_from_u64(SEED),
        }
    }

    /// Fills `value` with the next value (W1: `W1_VALUE_BYTES` long).
    pub fn next(&mut self, value: &mut [u8]) {
        self.rng.fill_bytes(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequence `kiln bench` and bench/ generated inline before this module:
    /// figures stay comparable with earlier runs.
    #[test]
    fn puts_are_the_inline_sequence() {
        for sequential in [true, false] {
            let mut rng = SmallRng::seed_from_u64(SEED);
            let mut puts = Puts::fill(sequential);
            let (mut key, mut value) = ([0u8; 16], [0u8; 100]);
            let (mut k2, mut v2) = ([0u8; 16], [0u8; 100]);
            for n in 0u64..1000 {
                if sequential {
                    key[8..].copy_from_slice(&n.to_be_bytes());
                } else {
                    rng.fill(&mut key);
                }
                rng.fill_bytes(&mut value);
                puts.next(&mut k2, &mut v2);
                assert_eq!((key, value), (k2, v2));
            }
        }
        let mut rng = SmallRng::seed_from_u64(SEED + 3);
        let mut puts = Puts::w6_thread(3);
        let (mut key, mut value) = ([0u8; 16], [0u8; 100]);
        let (mut k2, mut v2) = ([0u8; 16], [0u8; 100]);
        rng.fill(&mut key);
        rng.fill_bytes(&mut value);
        puts.next(&mut k2, &mut v2);
        assert_eq!((key, value), (k2, v2));
    }

    #[test]
    fn w1_values_are_the_inline_sequence() {
        let mut rng = SmallRng::seed_from_u64(SEED);
        let mut values = Values::w1();
        let (mut a, mut b) = (vec![0u8; W1_VALUE_BYTES], vec![0u8; W1_VALUE_BYTES]);
        for _ in 0..4 {
            rng.fill_bytes(&mut a);
            values.next(&mut b);
            assert_eq!(a, b);
        }
    }
}
