//! Whether a journal record is worth compressing, decided from what this disk and
//! this CPU measure, not from a fixed ratio.
//!
//! LZ4 costs the committing thread about 2–3 ns per byte; a byte not written saves
//! what the journal's write takes per extra byte. On the disks we measured a durable
//! write costs ~70 us plus well under 1 ns per extra KB-scale byte, so a record that
//! compresses by 16 % (W2's sequential fill) lost ~100 us of CPU to save ~15 us of
//! disk: compression made commits slower. On a slow disk (or a network volume) the
//! same record is worth compressing. So the journal writer measures the marginal
//! cost of a written byte (`JournalWriteCost`), the encoder measures what
//! compressing a byte costs (`Compressor`), and a record is compressed when the
//! sample's ratio says the time saved exceeds the time spent.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Writes up to this size measure the fixed cost of a durable write.
const SMALL_WRITE_BYTES: usize = 8192;
/// Writes from this size on measure the cost per extra byte.
const LARGE_WRITE_BYTES: usize = 32 << 10;
/// Unknown yet.
const UNKNOWN: u64 = u64::MAX;

/// An exponential moving average with weight 1/8 for the new sample.
fn averaged(old: u64, sample: u64) -> u64 {
    if old == UNKNOWN {
        sample
    } else {
        (old.saturating_mul(7).saturating_add(sample)) / 8
    }
}

/// `averaged`, for a figure one thread updates and another reads.
fn ewma(cell: &AtomicU64, sample: u64) {
    cell.store(averaged(cell.load(Relaxed), sample), Relaxed);
}

/// What a durable journal write costs on this disk: a fixed part (small writes) and
/// a part per byte beyond it (large writes). Updated by the journal writer, read by
/// the encoder; both under their own locks, so plain relaxed loads and stores do.
pub(crate) struct JournalWriteCost {
    small_write_ns: AtomicU64,
    marginal_ps_per_byte: AtomicU64,
}

impl Default for JournalWriteCost {
    fn default() -> Self {
        JournalWriteCost {
            small_write_ns: AtomicU64::new(UNKNOWN),
            marginal_ps_per_byte: AtomicU64::new(UNKNOWN),
        }
    }
}

impl JournalWriteCost {
    /// Notes a durable write of `len` bytes that took `elapsed`.
    pub fn observe(&self, len: usize, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX / 2);
        if len <= SMALL_WRITE_BYTES {
            ewma(&self.small_write_ns, ns);
            return;
        }
        let fixed = self.small_write_ns.load(Relaxed);
        if len < LARGE_WRITE_BYTES || fixed == UNKNOWN {
            return;
        }
        let extra_bytes = (len - SMALL_WRITE_BYTES / 2) as u64;
        ewma(
            &self.marginal_ps_per_byte,
            ns.saturating_sub(fixed).saturating_mul(1000) / extra_bytes,
        );
    }

    /// Picoseconds a durable write takes per extra byte, once measured.
    pub fn marginal_ps_per_byte(&self) -> Option<u64> {
        let v = self.marginal_ps_per_byte.load(Relaxed);
        (v != UNKNOWN).then_some(v)
    }
}

/// The encoder's side: LZ4's scratch buffer and its measured cost per byte.
pub(crate) struct Compressor {
    scratch: Vec<u8>,
    /// Off: compress whenever a sample saves at least a fifth (tests and the
    /// simulation, which need the same bytes whatever the timing).
    adaptive: bool,
    /// Moving average; `UNKNOWN` until the first sample. The encoder owns the
    /// compressor (under the writer lock), so no atomic is needed here.
    compress_ps_per_byte: u64,
    /// Records refused in a row (adaptive only), capped at `MAX_BACKOFF_SHIFT`.
    refusals: u32,
    /// Records still to store without even a sample.
    skip_records: u32,
}

/// After `n` refusals in a row the next `2^n - 1` records are stored without a
/// sample, at most 63: a stream of incompressible values (W1's random 16 KiB) paid
/// ~1.5 us of LZ4 per commit for samples that always said no, and a stream that turns
/// compressible is noticed within 64 records.
const MAX_BACKOFF_SHIFT: u32 = 6;

/// What the sample of a record says.
pub(crate) enum Verdict {
    /// Not worth it: store the body as it is.
    Store,
    /// Compress the whole body.
    Compress,
}

impl Compressor {
    pub fn new(adaptive: bool) -> Self {
        Compressor {
            scratch: Vec::new(),
            adaptive,
            compress_ps_per_byte: UNKNOWN,
            refusals: 0,
            skip_records: 0,
        }
    }

    /// Whether this record is stored without a sample (adaptive mode, backing off
    /// after refusals; see `MAX_BACKOFF_SHIFT`). Not adaptive, every record is tried:
    /// tests and the simulation need the same bytes whatever came before.
    pub fn skips_this_record(&mut self) -> bool {
        if !self.adaptive || self.skip_records == 0 {
            return false;
        }
        self.skip_records -= 1;
        true
    }

    /// Notes whether the record just tried was compressed.
    pub fn note_outcome(&mut self, compressed: bool) {
        if !self.adaptive {
            return;
        }
        if compressed {
            self.refusals = 0;
        } else {
            self.refusals = (self.refusals + 1).min(MAX_BACKOFF_SHIFT);
            self.skip_records = (1 << self.refusals) - 1;
        }
    }

    /// LZ4 output of the last `compress` (valid up to the length it returned).
    pub fn output(&self) -> &[u8] {
        &self.scratch
    }

    /// LZ4-compresses `input` into the scratch buffer (grown once to the worst
    /// case, then reused); the compressed length, or `None` if LZ4 refused.
    pub fn compress(&mut self, input: &[u8]) -> Option<usize> {
        let need = lz4_flex::block::get_maximum_output_size(input.len());
        if self.scratch.len() < need {
            self.scratch.resize(need, 0);
        }
        lz4_flex::block::compress_into(input, &mut self.scratch).ok()
    }

    /// Whether even a body that vanished entirely would save less disk time than
    /// compressing it costs: then not even a sample is taken.
    pub fn hopeless(&self, disk: &JournalWriteCost) -> bool {
        if !self.adaptive {
            return false;
        }
        match (disk.marginal_ps_per_byte(), self.cost_ps_per_byte()) {
            (Some(disk_ps), Some(cpu_ps)) => disk_ps < cpu_ps,
            _ => false,
        }
    }

    fn cost_ps_per_byte(&self) -> Option<u64> {
        (self.compress_ps_per_byte != UNKNOWN).then_some(self.compress_ps_per_byte)
    }

    /// Compresses `samples` (windows of a body), timing it, and decides for the
    /// whole body: compress if the sampled saving, at the disk's measured cost per
    /// byte, is worth more than compressing costs (or, without measurements yet or
    /// when not adaptive, if the samples shrink by a fifth).
    pub fn judge<'a>(
        &mut self,
        samples: impl Iterator<Item = &'a [u8]>,
        disk: &JournalWriteCost,
    ) -> Verdict {
        let start = Instant::now();
        let (mut input, mut packed) = (0usize, 0usize);
        for s in samples {
            let Some(n) = self.compress(s) else {
                return Verdict::Store;
            };
            input += s.len();
            packed += n;
        }
        if input == 0 {
            return Verdict::Store;
        }
        let ps = u64::try_from(start.elapsed().as_nanos())
            .unwrap_or(u64::MAX / 2)
            .saturating_mul(1000)
            / input as u64;
        self.compress_ps_per_byte = averaged(self.compress_ps_per_byte, ps);
        let saved_per_thousand = 1000u64.saturating_sub(packed as u64 * 1000 / input as u64);
        let cheap_rule = saved_per_thousand >= 200;
        if !self.adaptive {
            return if cheap_rule {
                Verdict::Compress
            } else {
                Verdict::Store
            };
        }
        match (disk.marginal_ps_per_byte(), self.cost_ps_per_byte()) {
            // Per body byte: saved disk time vs. compression time.
            (Some(disk_ps), Some(cpu_ps))
                if saved_per_thousand >= 100 && disk_ps * saved_per_thousand > cpu_ps * 1000 =>
            {
                Verdict::Compress
            }
            (Some(_), Some(_)) => Verdict::Store,
            _ if cheap_rule => Verdict::Compress,
            _ => Verdict::Store,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(small_us: u64, large_bytes: usize, large_us: u64) -> JournalWriteCost {
        let d = JournalWriteCost::default();
        for _ in 0..32 {
            d.observe(4096, Duration::from_micros(small_us));
            d.observe(large_bytes, Duration::from_micros(large_us));
        }
        d
    }

    #[test]
    fn the_disk_cost_per_byte_is_what_large_writes_add_to_small_ones() {
        // 70 us fixed, 1 MiB in 1,118.6 us: ~1 ns (1,000 ps) per extra byte.
        let d = disk(70, 1 << 20, 70 + 1_046);
        let ps = d.marginal_ps_per_byte().unwrap();
        assert!((950..=1050).contains(&ps), "{ps} ps per byte");
        assert_eq!(JournalWriteCost::default().marginal_ps_per_byte(), None);
    }

    #[test]
    fn compresses_on_a_slow_disk_and_not_on_a_fast_one() {
        // Text compresses well (far more than a fifth).
        let body: Vec<u8> = b"{\"name\":\"kiln\",\"tags\":[1,2,3]} "
            .iter()
            .copied()
            .cycle()
            .take(4096)
            .collect();
        let slow = disk(5_000, 1 << 20, 5_000 + 100_000); // ~100 ns per byte
        let fast = disk(70, 1 << 20, 70); // no cost per byte at all
        let mut c = Compressor::new(true);
        assert!(matches!(
            c.judge(std::iter::once(&body[..]), &slow),
            Verdict::Compress
        ));
        assert!(matches!(
            c.judge(std::iter::once(&body[..]), &fast),
            Verdict::Store
        ));
        assert!(c.hopeless(&fast));
        assert!(!c.hopeless(&slow));
        // Not adaptive: the fixed rule, whatever the disk.
        let mut fixed = Compressor::new(false);
        assert!(matches!(
            fixed.judge(std::iter::once(&body[..]), &fast),
            Verdict::Compress
        ));
        assert!(!fixed.hopeless(&fast));
    }

    #[test]
    fn refusals_in_a_row_back_off_to_one_sample_in_64_and_a_success_resets() {
        let mut c = Compressor::new(true);
        let sampled_after = |c: &mut Compressor, refusals: u32| {
            for _ in 0..refusals {
                assert!(!c.skips_this_record());
                c.note_outcome(false);
                while c.skips_this_record() {}
            }
        };
        sampled_after(&mut c, 10);
        // Ten refusals in: 63 records skipped, then a sample.
        c.note_outcome(false);
        let skipped = std::iter::from_fn(|| c.skips_this_record().then_some(())).count();
        assert_eq!(skipped, 63);
        c.note_outcome(true);
        assert!(
            !c.skips_this_record(),
            "a compressed record resets the backoff"
        );
        c.note_outcome(false);
        assert!(c.skips_this_record());
        assert!(!c.skips_this_record(), "one refusal skips one record");

        let mut fixed = Compressor::new(false);
        for _ in 0..100 {
            fixed.note_outcome(false);
            assert!(
                !fixed.skips_this_record(),
                "not adaptive: every record is tried"
            );
        }
    }

    #[test]
    fn random_bytes_are_never_worth_it() {
        let mut noise = vec![0u8; 4096];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut noise);
        let slow = disk(5_000, 1 << 20, 105_000);
        let mut c = Compressor::new(true);
        assert!(matches!(
            c.judge(std::iter::once(&noise[..]), &slow),
            Verdict::Store
        ));
    }
}
