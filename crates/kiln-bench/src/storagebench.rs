//! The storage workloads of shared/BENCHMARKS.md run against Kiln in-process: W1
//! (one 16 KiB value per durable transaction, against the raw disk measured around
//! the run), W2-W4 (fills of 100-byte values), W6 (concurrent committers through
//! the commit queue). Their keys, values and counts are `workload`'s, which bench/
//! gives its peers too.

use crate::procstat;
use crate::rawdisk;
use crate::run::{progress, BenchResult, Run};
use crate::stats::{self, CpuClock};
use crate::workload::{self, Fill, Puts, Values};
use kiln_storage::{Env, Options};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// A fresh environment in `dir` (whatever was there removed) with the tree `bench`.
fn fresh_env(dir: &Path, opts: &Options) -> BenchResult<Env> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let env = Env::open(dir, opts.clone())?;
    let mut w = env.begin_write()?;
    // `KILN_BENCH_COUNTED_TREE=1`: the tree keeps entry counts in its branches
    // (what an order-statistic tree costs a fill: docs/benchmarks.md, counted trees).
    if std::env::var_os("KILN_BENCH_COUNTED_TREE").is_some_and(|v| v == "1") {
        w.create_counted_tree("bench")?;
    } else {
        w.create_tree("bench")?;
    }
    w.commit()?;
    Ok(env)
}

/// Journal figures per operation, including what the journal would have written
/// without page diffs and without compression.
fn journal_figures(env: &Env, ops: u64) -> Map<String, Value> {
    let s = env.stats();
    let per = |b: u64| b as f64 / ops as f64;
    let mut m = Map::new();
    m.insert("journal_bytes_per_op".into(), json!(per(s.journal_bytes)));
    m.insert(
        "journal_body_bytes_per_op_full_images".into(),
        json!(per(s.journal_body_bytes_full_images)),
    );
    m.insert(
        "journal_body_bytes_per_op_with_diffs".into(),
        json!(per(s.journal_body_bytes_raw)),
    );
    m.insert(
        "journal_body_bytes_per_op_with_diffs_and_lz4".into(),
        json!(per(s.journal_body_bytes_stored)),
    );
    m.insert(
        "journal_referenced_value_bytes_per_op".into(),
        json!(per(s.journal_referenced_value_bytes)),
    );
    m.insert(
        "journal_write_mean_us".into(),
        json!(s.journal_write_latency.mean_us),
    );
    m.insert(
        "journal_write_p50_us".into(),
        json!(s.journal_write_latency.p50_us),
    );
    m.insert(
        "journal_write_p99_us".into(),
        json!(s.journal_write_latency.p99_us),
    );
    m.insert(
        "journal_files_created".into(),
        json!(s.journal_files_created),
    );
    m.insert(
        "journal_files_recycled".into(),
        json!(s.journal_files_recycled),
    );
    m.insert(
        "journal_files_cut_short".into(),
        json!(s.journal_files_cut_short),
    );
    m.insert("journal_switch_waits".into(), json!(s.journal_switch_waits));
    m.insert("write_buffer_freezes".into(), json!(s.write_buffer_freezes));
    m.insert("write_buffer_merges".into(), json!(s.write_buffer_merges));
    m.insert(
        "write_buffer_keys_merged_ahead".into(),
        json!(s.write_buffer_keys_merged_ahead),
    );
    m.insert("data_syncs".into(), json!(s.data_syncs));
    m.insert(
        "data_sync_mean_us".into(),
        json!(s.data_sync_latency.mean_us),
    );
    m.insert("checkpoints".into(), json!(s.checkpoints));
    m.insert("pages_written_back".into(), json!(s.pages_written_back));
    m
}

/// W1's proposed target: a commit costs at most this much beyond the raw 16 KiB
/// durable write measured around the run (docs/design/storage.md §12). 45 us held in the
/// hours of the tenth pass (30-50 us over); in a slower hour of the fourteenth the
/// excess was 62-67 us with the same code path, so the target that holds is 70.
pub const W1_PROPOSED_EXCESS_US: u32 = 70;

/// W1: transactions of one 16 KiB random value under a sequential 8-byte key.
pub fn w1(dir: &Path, opts: &Options, quick: bool) -> BenchResult<Run> {
    let n: u64 = if quick { 4096 } else { workload::W1_COMMITS };
    // The raw disk's speed drifts on a shared machine (its mean over the three
    // samples at the start of `kiln bench` has ranged 0.073-0.106 ms within minutes):
    // a raw sample right before and right after this run is the fairer yardstick.
    let raw_dir = dir.parent().unwrap_or(dir);
    let raw_writes = if quick { 512 } else { 2048 };
    let raw_before = rawdisk::durable_writes(raw_dir, 16 * 1024, raw_writes)?;
    let env = fresh_env(dir, opts)?;
    let mut values = Values::w1();
    let mut value = vec![0u8; workload::W1_VALUE_BYTES];
    let pb = progress(n, "W1");
    let cpu = CpuClock::start();
    let start = Instant::now();
    // Making 16 KiB of random bytes takes ~2 us, which the raw write it is compared
    // with does not pay: it is timed and left out of the commit figures.
    let mut generating = Duration::ZERO;
    for i in 0..n {
        let made = Instant::now();
        values.next(&mut value);
        generating += made.elapsed();
        let mut w = env.begin_write()?;
        w.put("bench", &i.to_be_bytes(), &value)?;
        w.commit()?;
        if i % 256 == 0 {
            pb.set_position(i);
        }
    }
    let seconds = (start.elapsed() - generating).as_secs_f64();
    pb.finish_and_clear();
    let mut extra = journal_figures(&env, n);
    extra.insert(
        "value_generation_ms_excluded".into(),
        json!(generating.as_secs_f64() * 1e3),
    );
    cpu.report(&mut extra, n, "op");
    env.close()?;
    let raw_after = rawdisk::durable_writes(raw_dir, 16 * 1024, raw_writes)?;
    let raw_around_ms = (raw_before.mean_ms + raw_after.mean_ms) / 2.0;
    extra.insert("raw_disk_ms_before_run".into(), json!(raw_before.mean_ms));
    extra.insert("raw_disk_ms_after_run".into(), json!(raw_after.mean_ms));
    let ms_per_commit = seconds * 1e3 / n as f64;
    extra.insert(
        "ratio_to_raw_write_around_run".into(),
        json!(ms_per_commit / raw_around_ms),
    );
    // The target proposed where 1.25x cannot be met on a disk whose every durable
    // write is a write plus a cache flush (docs/design/storage.md §12): what a commit costs
    // beyond the raw write, in microseconds.
    extra.insert(
        "excess_over_raw_write_around_run_us".into(),
        json!((ms_per_commit - raw_around_ms) * 1e3),
    );
    Ok(Run {
        ops: n,
        commits: n,
        seconds,
        extra,
    })
}

/// W2/W3/W4: durable transactions of `per_txn` puts (16-byte keys, 100-byte values),
/// keys sequential (W2) or random (W3, W4); a tenth of the transactions with `quick`.
pub fn fill(dir: &Path, opts: &Options, label: &str, fill: Fill, quick: bool) -> BenchResult<Run> {
    let Fill { per_txn, .. } = fill;
    let txns = if quick { fill.txns / 10 } else { fill.txns };
    let env = fresh_env(dir, opts)?;
    let mut puts = Puts::fill(fill.sequential);
    let mut key = [0u8; workload::KEY_BYTES];
    let mut value = [0u8; workload::VALUE_BYTES];
    let pb = progress(txns, label);
    let cpu = CpuClock::start();
    let start = Instant::now();
    let mut n = 0u64;
    for t in 0..txns {
        let mut w = env.begin_write()?;
        for _ in 0..per_txn {
            puts.next(&mut key, &mut value);
            n += 1;
            w.put("bench", &key, &value)?;
        }
        w.commit()?;
        if t % 16 == 0 {
            pb.set_position(t);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let mut extra = journal_figures(&env, n);
    cpu.report(&mut extra, n, "op");
    // Counting is what the write buffer makes dear (a tree lookup per buffered key
    // of the tree): time it with the buffer as the workload left it.
    let count_start = Instant::now();
    let entries = env.begin_read()?.tree_len("bench")?;
    extra.insert(
        "tree_len_ms".into(),
        json!(count_start.elapsed().as_secs_f64() * 1e3),
    );
    extra.insert(
        "write_buffer_bytes_at_end".into(),
        json!(env.stats().write_buffer_bytes),
    );
    extra.insert("entries".into(), json!(entries));
    // Work the run left behind (the write buffer's last merge, the write-back and its
    // sync) is paid at close: timed too, so that a setting that only defers work
    // (a larger write buffer) shows as such.
    let close_start = Instant::now();
    env.close()?;
    let close_seconds = close_start.elapsed().as_secs_f64();
    extra.insert("close_ms".into(), json!(close_seconds * 1e3));
    extra.insert(
        "ops_per_sec_including_close".into(),
        json!(n as f64 / (seconds + close_seconds)),
    );
    Ok(Run {
        ops: n,
        commits: txns,
        seconds,
        extra,
    })
}

/// W6: `threads` threads each committing transactions of one random put through the
/// commit queue, 20,000 commits in total unless `commits` says otherwise, each durable.
pub fn w6(
    dir: &Path,
    opts: &Options,
    quick: bool,
    threads: u64,
    commits: Option<u64>,
) -> BenchResult<Run> {
    let total: u64 = commits.unwrap_or(if quick { 4_000 } else { workload::W6_COMMITS });
    let per_thread = total / threads;
    let env = fresh_env(dir, opts)?;
    let pb = progress(per_thread * threads, &format!("W6 T={threads}"));
    let cpu_start = procstat::process_cpu_seconds();
    let start = Instant::now();
    let latencies: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let env = &env;
                let pb = &pb;
                s.spawn(move || -> Result<Vec<u32>, kiln_storage::Error> {
                    let mut puts = Puts::w6_thread(t);
                    let mut lat = Vec::with_capacity(per_thread as usize);
                    for i in 0..per_thread {
                        let mut key = [0u8; workload::KEY_BYTES];
                        let mut value = [0u8; workload::VALUE_BYTES];
                        puts.next(&mut key, &mut value);
                        let begin = Instant::now();
                        env.submit(move |txn| txn.put("bench", &key, &value))?;
                        lat.push(begin.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        if i % 64 == 0 {
                            pb.inc(64);
                        }
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect::<Result<_, _>>()
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = procstat::process_cpu_seconds() - cpu_start;
    pb.finish_and_clear();
    let mut all: Vec<u32> = latencies.into_iter().flatten().collect();
    all.sort_unstable();
    let q = |f: f64| stats::quantile(&all, f);
    let commits = all.len() as u64;
    let qs = env.queue_stats();
    let mut extra = journal_figures(&env, commits);
    extra.insert("threads".into(), json!(threads));
    extra.insert("commits_per_sec".into(), json!(commits as f64 / seconds));
    // All of this process's threads: the submitters, the flusher, the kernel work.
    extra.insert(
        "cpu_us_per_commit".into(),
        json!(cpu_seconds * 1e6 / commits.max(1) as f64),
    );
    extra.insert("p50_us".into(), json!(q(0.50)));
    extra.insert("p99_us".into(), json!(q(0.99)));
    extra.insert("avg_group_size".into(), json!(qs.avg_group_units()));
    extra.insert("max_group_size".into(), json!(qs.max_group_units));
    extra.insert("groups".into(), json!(qs.groups));
    env.close()?;
    Ok(Run {
        ops: commits,
        commits,
        seconds,
        extra,
    })
}
