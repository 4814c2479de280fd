//! Test values the journal cannot compress (it compresses records): a MiB of journal
//! then takes few commits, and a value read back wrong cannot pass for another.

/// `len` xorshift bytes from `seed`.
pub fn incompressible(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
