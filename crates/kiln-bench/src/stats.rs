//! Statistics of runs and latencies, CPU time around a workload, and the repeated
//! runs of `kiln bench` (the median run reported).

use crate::procstat;
use crate::run::{BenchResult, Run};
use serde_json::{json, Map, Value};

/// The median (the upper one of an even count); NaN for none.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The value at quantile `q` (0..=1) of sorted values: the one at index
/// `floor(len * q)`, the last for `q` = 1; None for no values.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[((sorted.len() as f64 * q) as usize).min(last)])
}

/// CPU time spent during a workload: the committing thread's alone (the part that
/// bounds a single-writer workload) and the whole process's (flusher included).
/// Unlike throughput, these barely move when the shared machine is busy.
pub struct CpuClock {
    thread_start: f64,
    process_start: f64,
}

impl CpuClock {
    pub fn start() -> Self {
        CpuClock {
            thread_start: procstat::thread_cpu_seconds(),
            process_start: procstat::process_cpu_seconds(),
        }
    }

    /// Adds `writer_cpu_us_per_<unit>` and `process_cpu_us_per_<unit>` to `extra`.
    pub fn report(&self, extra: &mut Map<String, Value>, ops: u64, unit: &str) {
        let per_op = |seconds: f64| json!(seconds * 1e6 / ops.max(1) as f64);
        let thread = procstat::thread_cpu_seconds() - self.thread_start;
        let process = procstat::process_cpu_seconds() - self.process_start;
        extra.insert(format!("writer_cpu_us_per_{unit}"), per_op(thread));
        extra.insert(format!("process_cpu_us_per_{unit}"), per_op(process));
    }
}

/// Runs a workload `runs` times (once if a run takes over 10 s) and returns the
/// median run by throughput, with the number of runs made.
pub fn measure(runs: usize, mut f: impl FnMut() -> BenchResult<Run>) -> BenchResult<(Run, usize)> {
    let mut results = Vec::new();
    for i in 0..runs.max(1) {
        // Each run's peak memory is its own (in-process workloads: this process; the
        // server workloads add their server's).
        procstat::reset_own_peak_rss();
        let mut r = f()?;
        if let Ok(peak) = procstat::peak_rss_bytes(std::process::id()) {
            r.extra
                .insert("bench_process_peak_rss_bytes".into(), json!(peak));
        }
        let long = r.seconds > 10.0;
        results.push(r);
        if long && i == 0 {
            break;
        }
    }
    let n = results.len();
    results.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
    Ok((results.swap_remove(n / 2), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_upper_middle() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn quantile_is_floor_of_len_times_q() {
        let v: Vec<u32> = (0..100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(99));
        assert_eq!(quantile(&[7u32], 0.99), Some(7));
        assert_eq!(quantile::<u32>(&[], 0.5), None);
    }
}
