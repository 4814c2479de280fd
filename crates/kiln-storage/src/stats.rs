//! Counters and latency histograms. When a disk is slow or lies, these say so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const BUCKETS: usize = 100;

/// A log-linear histogram of microseconds: four buckets per power of two, so a
/// quantile is within 25% of the true value, with no locks on the recording path.
pub struct LatencyHistogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

fn bucket_of(us: u64) -> usize {
    if us < 8 {
        return us as usize;
    }
    let log = 63 - us.leading_zeros() as u64; // >= 3
    let sub = (us >> (log - 2)) & 3;
    ((8 + (log - 3) * 4 + sub) as usize).min(BUCKETS - 1)
}

/// Upper bound (exclusive) of a bucket, in microseconds.
fn bucket_upper_us(b: usize) -> u64 {
    if b < 8 {
        return b as u64 + 1;
    }
    let log = (b as u64 - 8) / 4 + 3;
    let sub = (b as u64 - 8) % 4;
    (5 + sub) << (log - 2)
}

impl LatencyHistogram {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        if let Some(b) = self.buckets.get(bucket_of(us)) {
            b.fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.max_us.fetch_max(us, Relaxed);
    }

    pub fn summary(&self) -> LatencySummary {
        let count = self.count.load(Relaxed);
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let quantile = |q: f64| -> u64 {
            if count == 0 {
                return 0;
            }
            let target = ((count as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (b, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= target {
                    return bucket_upper_us(b);
                }
            }
            bucket_upper_us(BUCKETS - 1)
        };
        LatencySummary {
            count,
            mean_us: if count == 0 {
                0.0
            } else {
                self.sum_us.load(Relaxed) as f64 / count as f64
            },
            p50_us: quantile(0.50),
            p99_us: quantile(0.99),
            max_us: self.max_us.load(Relaxed),
        }
    }
}

/// Quantiles are bucket upper bounds (at most 25% above the true value).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

#[derive(Default)]
pub(crate) struct EngineCounters {
    pub write_buffer_freezes: AtomicU64,
    pub write_buffer_merges: AtomicU64,
    pub write_buffer_keys_merged_ahead: AtomicU64,
    pub journal_writes: AtomicU64,
    pub journal_bytes: AtomicU64,
    pub journal_body_bytes_full_images: AtomicU64,
    pub journal_body_bytes_raw: AtomicU64,
    pub journal_body_bytes_stored: AtomicU64,
    pub journal_referenced_value_bytes: AtomicU64,
    pub journal_write_latency: LatencyHistogram,
    /// What a durable journal write costs per byte on this disk (compression's
    /// measure of what a byte saved is worth).
    pub journal_write_cost: crate::journal::compress::JournalWriteCost,
    pub journal_files_created: AtomicU64,
    pub journal_files_recycled: AtomicU64,
    pub journal_files_cut_short: AtomicU64,
    pub journal_switch_waits: AtomicU64,
    pub journal_direct_io_fallback: AtomicBool,
    /// Whether the journal file being written is open with O_DIRECT.
    pub journal_direct_io_active: AtomicBool,
    pub commits: AtomicU64,
    pub aborts: AtomicU64,
    pub data_syncs: AtomicU64,
    pub data_sync_latency: LatencyHistogram,
    /// `Durability::Buffered`: the background journal syncs (count and latency).
    pub buffered_journal_sync_latency: LatencyHistogram,
    pub pages_written_back: AtomicU64,
    pub checkpoints: AtomicU64,
    pub records_replayed_on_open: AtomicU64,
}

/// A point-in-time copy of the engine's figures (`Env::stats`).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub last_txn_id: u64,
    pub synced_txn_id: u64,
    pub commits: u64,
    pub aborts: u64,
    pub journal_writes: u64,
    pub journal_bytes: u64,
    /// Journal record bodies as they would be with full page images (no diffs, no
    /// compression), with diffs, and as stored (diffs, then LZ4 where it pays).
    pub journal_body_bytes_full_images: u64,
    pub journal_body_bytes_raw: u64,
    pub journal_body_bytes_stored: u64,
    /// Bytes of values merged from the write buffer that records named by their
    /// buffer key instead of carrying them again (patched images; already counted
    /// out of the body lengths above).
    pub journal_referenced_value_bytes: u64,
    pub journal_write_latency: LatencySummary,
    pub journal_files: u64,
    pub journal_files_created: u64,
    pub journal_files_recycled: u64,
    /// Files made ahead and cut short because the writer came to wait for them.
    pub journal_files_cut_short: u64,
    /// Switches to the next journal file that found it not ready: the commit making
    /// the switch waited while the file was created (or recycled) and synced.
    pub journal_switch_waits: u64,
    /// True when the journal file system refused O_DIRECT and the journal falls back
    /// to buffered writes followed by fdatasync.
    pub journal_direct_io_fallback: bool,
    /// Whether journal writes currently go out with O_DIRECT (false in buffered
    /// durability mode or after a fallback).
    pub journal_direct_io: bool,
    pub data_syncs: u64,
    pub data_sync_latency: LatencySummary,
    /// `Durability::Buffered`: background journal syncs (count and latency).
    pub buffered_journal_sync_latency: LatencySummary,
    pub pages_written_back: u64,
    pub checkpoints: u64,
    pub records_replayed_on_open: u64,
    pub pages_total: u64,
    pub pages_free: u64,
    pub pages_pending_free: u64,
    pub pages_in_use: u64,
    pub pages_unflushed: u64,
    pub readers_open: u64,
    /// The commit queue (`Env::submit`): units, groups, group sizes, rejections.
    pub commit_queue: QueueStats,
    pub data_file_bytes: u64,
    /// Memory held by the write buffer's generations (as of the last commit).
    pub write_buffer_bytes: u64,
    /// Generations frozen and merged into the trees since open.
    pub write_buffer_freezes: u64,
    pub write_buffer_merges: u64,
    /// Keys of frozen generations the merge thread went past for transactions that
    /// reached their commit (`Options::merge_ahead`).
    pub write_buffer_keys_merged_ahead: u64,
    /// Merge slices and `ReadTxn::read_ahead` calls that asked for their leaves
    /// ahead (`Options::read_ahead`).
    pub batches_read_ahead: u64,
}

/// Figures of the commit queue (`Env::queue_stats`).
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueStats {
    pub units_committed: u64,
    pub units_failed: u64,
    pub groups: u64,
    pub max_group_units: u64,
    pub overloaded_rejections: u64,
}

impl QueueStats {
    pub fn avg_group_units(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.units_committed as f64 / self.groups as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_values() {
        for us in [
            0u64, 1, 7, 8, 9, 15, 16, 100, 117, 1000, 123_456, 10_000_000,
        ] {
            let b = bucket_of(us);
            assert!(
                bucket_upper_us(b) > us,
                "{us} -> bucket {b} upper {}",
                bucket_upper_us(b)
            );
            if b > 0 {
                assert!(bucket_upper_us(b - 1) <= us, "{us}");
            }
        }
    }

    #[test]
    fn quantiles_come_from_recorded_values() {
        let h = LatencyHistogram::default();
        for _ in 0..99 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_micros(5000));
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert!((100..=125).contains(&s.p50_us), "{s:?}");
        assert!((100..=125).contains(&s.p99_us), "{s:?}");
        assert_eq!(s.max_us, 5000);
    }
}
