//! `kiln bench`: workloads of shared/BENCHMARKS.md run against Kiln, beside the raw
//! disk measured in the same run.

use crate::httpbench;
use crate::rawdisk;
use crate::recoverybench::W7Case;
use crate::serverbench::{self, doc_1k, fresh_server, fresh_server_with, ServerLoad};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_storage::{Env, Options};
use rand::{rngs::SmallRng, Rng, RngCore, SeedableRng};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Comma-separated workload ids: W1, W2, W3, W4, W6, W7 (recovery after kill -9),
    /// W8, W8I (W8 with two indexes), W8C (W8 with a backup chain active), W9, W10, W11,
    /// W12, W13, W14 (backup and restore of a generated database, and W8 during a
    /// backup; not part of the default set: it writes several times --w14-gib).
    #[arg(long, default_value = "W1,W4")]
    workloads: String,
    /// Directory to run in (a fresh subdirectory per run, removed afterwards).
    #[arg(long, default_value = "./kiln-bench")]
    dir: PathBuf,
    /// One JSON object per line on stdout.
    #[arg(long)]
    json: bool,
    /// About a tenth of the full scale, for smoke runs.
    #[arg(long)]
    quick: bool,
    /// Runs per workload (the median is reported); workloads over 10 s run once.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Thread counts for W6.
    #[arg(long, default_value = "1,8,64")]
    threads: String,
    /// Client connections for W8 and W9 (and Redis's clients beside them).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// W8 requests in all (default: 200,000, a few seconds at the rates seen;
    /// 6,400 with --quick); Redis gets as many SETs.
    #[arg(long)]
    w8_requests: Option<u64>,
    /// W9 GETs in all (default: 128,000; 12,800 with --quick); Redis gets as many.
    /// A longer run gives steadier figures and time to profile the server.
    #[arg(long)]
    w9_requests: Option<u64>,
    /// An extra flag for the `kiln serve` of the server workloads (repeat for more;
    /// `--serve-flag=--hyper-only` compares hyper with the server's own HTTP/1.1 loop).
    #[arg(long = "serve-flag", allow_hyphen_values = true)]
    serve_flags: Vec<String>,
    /// Skip the Redis peer of W8 and W9.
    #[arg(long, conflicts_with = "redis_only")]
    no_redis: bool,
    /// (internal) W7's child: write a case's data, then wait to be killed.
    #[arg(long, hide = true)]
    w7_child: Option<String>,
    /// W8 and W9 against Redis alone (the comparative benchmark in bench/ runs each
    /// side as a job of its own).
    #[arg(long)]
    redis_only: bool,
    /// W6 commits in total (default: 20,000 as BENCHMARKS.md defines it; 4,000 with
    /// --quick). A longer run shows the sustained rate, data-file write-back included.
    #[arg(long)]
    w6_commits: Option<u64>,
    /// W10 documents (default: 1,000,000 as BENCHMARKS.md defines it; 100,000 with
    /// --quick; 3,000,000 shows whether the rate holds).
    #[arg(long)]
    w10_docs: Option<u64>,
    /// W12 documents (default: 1,000,000; 100,000 with --quick).
    #[arg(long)]
    w12_docs: Option<u64>,
    /// W13 documents of the bulk insert (default: 3,000,000; 300,000 with --quick).
    #[arg(long)]
    w13_docs: Option<u64>,
    /// W14: GiB of generated ~1 KiB documents (default: 4; 0.25 with --quick).
    #[arg(long)]
    w14_gib: Option<f64>,
    /// W11 idle WebSocket subscribers (default: 10,000; 1,000 with --quick), bounded
    /// by the open-file limit.
    #[arg(long)]
    w11_connections: Option<usize>,
    /// The engine's write-back window in MiB for the environments of W1-W6
    /// (default: the engine's own, `Options::write_back_window_bytes`).
    #[arg(long)]
    write_back_window_mib: Option<u64>,
    /// The engine's write buffer in MiB for the environments of W1-W6; 0 turns it
    /// off (default: the engine's own, `Options::write_buffer_bytes`).
    #[arg(long)]
    write_buffer_mib: Option<u64>,
}

/// A workload variant: its label and how to run it once.
type Variant<'a> = (String, Box<dyn Fn() -> BenchResult<Run> + 'a>);

pub(crate) const SEED: u64 = 0x4B494C4E;

/// One run of a workload: its operation count, time, and figures to report.
pub(crate) struct Run {
    pub ops: u64,
    pub commits: u64,
    pub seconds: f64,
    pub extra: Map<String, Value>,
}

impl Run {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.seconds
    }
}

pub(crate) fn progress(len: u64, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

fn fresh_env(dir: &Path, opts: &Options) -> BenchResult<Env> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let env = Env::open(dir, opts.clone())?;
    let mut w = env.begin_write()?;
    w.create_tree("bench")?;
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
/// durable write measured around the run (docs/design.md §12). 45 us held in the
/// hours of the tenth pass (30-50 us over); in a slower hour of the fourteenth the
/// excess was 62-67 us with the same code path, so the target that holds is 70.
const W1_PROPOSED_EXCESS_US: u32 = 70;

/// W1: transactions of one 16 KiB random value under a sequential 8-byte key.
fn w1(dir: &Path, opts: &Options, quick: bool) -> BenchResult<Run> {
    let n: u64 = if quick { 4096 } else { 65_536 };
    // The raw disk's speed drifts on a shared machine (its mean over the three
    // samples at the start of `kiln bench` has ranged 0.073-0.106 ms within minutes):
    // a raw sample right before and right after this run is the fairer yardstick.
    let raw_dir = dir.parent().unwrap_or(dir);
    let raw_writes = if quick { 512 } else { 2048 };
    let raw_before = rawdisk::durable_writes(raw_dir, 16 * 1024, raw_writes)?;
    let env = fresh_env(dir, opts)?;
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut value = vec![0u8; 16 * 1024];
    let pb = progress(n, "W1");
    let cpu = CpuClock::start();
    let start = Instant::now();
    // Making 16 KiB of random bytes takes ~2 us, which the raw write it is compared
    // with does not pay: it is timed and left out of the commit figures.
    let mut generating = Duration::ZERO;
    for i in 0..n {
        let made = Instant::now();
        rng.fill_bytes(&mut value);
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
    // write is a write plus a cache flush (docs/design.md §12): what a commit costs
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

/// CPU time spent during a workload: the committing thread's alone (the part that
/// bounds a single-writer workload) and the whole process's (flusher included).
/// Unlike throughput, these barely move when the shared machine is busy.
struct CpuClock {
    thread_start: f64,
    process_start: f64,
}

impl CpuClock {
    fn start() -> Self {
        CpuClock {
            thread_start: httpbench::thread_cpu_seconds(),
            process_start: httpbench::process_cpu_seconds(),
        }
    }
    /// Adds `writer_cpu_us_per_<unit>` and `process_cpu_us_per_<unit>` to `extra`.
    fn report(&self, extra: &mut Map<String, Value>, ops: u64, unit: &str) {
        let per_op = |seconds: f64| json!(seconds * 1e6 / ops.max(1) as f64);
        let thread = httpbench::thread_cpu_seconds() - self.thread_start;
        let process = httpbench::process_cpu_seconds() - self.process_start;
        extra.insert(format!("writer_cpu_us_per_{unit}"), per_op(thread));
        extra.insert(format!("process_cpu_us_per_{unit}"), per_op(process));
    }
}

/// W2/W3/W4: durable transactions of `per_txn` puts (16-byte keys, 100-byte values),
/// keys sequential (W2) or random (W3, W4).
fn fill(
    dir: &Path,
    opts: &Options,
    label: &str,
    txns: u64,
    per_txn: u64,
    sequential: bool,
) -> BenchResult<Run> {
    let env = fresh_env(dir, opts)?;
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut key = [0u8; 16];
    let mut value = [0u8; 100];
    let pb = progress(txns, label);
    let cpu = CpuClock::start();
    let start = Instant::now();
    let mut n = 0u64;
    for t in 0..txns {
        let mut w = env.begin_write()?;
        for _ in 0..per_txn {
            if sequential {
                key[8..].copy_from_slice(&n.to_be_bytes());
            } else {
                rng.fill(&mut key);
            }
            n += 1;
            rng.fill_bytes(&mut value);
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
fn w6(
    dir: &Path,
    opts: &Options,
    quick: bool,
    threads: u64,
    commits: Option<u64>,
) -> BenchResult<Run> {
    let total: u64 = commits.unwrap_or(if quick { 4_000 } else { 20_000 });
    let per_thread = total / threads;
    let env = fresh_env(dir, opts)?;
    let pb = progress(per_thread * threads, &format!("W6 T={threads}"));
    let cpu_start = httpbench::process_cpu_seconds();
    let start = Instant::now();
    let latencies: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let env = &env;
                let pb = &pb;
                s.spawn(move || -> Result<Vec<u32>, kiln_storage::Error> {
                    let mut rng = SmallRng::seed_from_u64(SEED + t);
                    let mut lat = Vec::with_capacity(per_thread as usize);
                    for i in 0..per_thread {
                        let mut key = [0u8; 16];
                        rng.fill(&mut key);
                        let mut value = [0u8; 100];
                        rng.fill_bytes(&mut value);
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
    let cpu_seconds = httpbench::process_cpu_seconds() - cpu_start;
    pb.finish_and_clear();
    let mut all: Vec<u32> = latencies.into_iter().flatten().collect();
    all.sort_unstable();
    let q = |f: f64| all[((all.len() as f64 * f) as usize).min(all.len() - 1)];
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

/// W10: one streaming bulk insert of generated ~300-byte documents, with W8 (PUT
/// per request) measured right before in the same run for the ratio.
fn w10(dir: &Path, quick: bool, connections: usize, documents: Option<u64>) -> BenchResult<Run> {
    let w8 = serverbench::w8_http(dir, quick, connections, None)?;
    let documents = documents.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let server = fresh_server(dir)?;
    let bulk = crate::streambench::bulk_insert(&server, documents)?;
    drop(server);
    let mut extra = bulk.extra;
    let rate = bulk.documents as f64 / bulk.seconds;
    extra.insert("w8_requests_per_sec".into(), json!(w8.ops_per_sec()));
    extra.insert("ratio_to_w8".into(), json!(rate / w8.ops_per_sec()));
    Ok(Run {
        ops: bulk.documents,
        commits: extra["acks"].as_u64().unwrap_or(1).max(1),
        seconds: bulk.seconds,
        extra,
    })
}

/// W11: idle WebSocket subscribers (memory per connection, idle CPU with heartbeats),
/// then PUT-answer-to-notification latency with 64 subscribers under W8-style load.
fn w11(dir: &Path, quick: bool, connections: Option<usize>) -> BenchResult<Run> {
    // Each subscriber is a socket in this process and one in the server.
    let open_files = crate::streambench::raise_open_file_limit();
    let wanted = connections.unwrap_or(if quick { 1_000 } else { 10_000 });
    let idle_connections = wanted.min(open_files.saturating_sub(256) as usize).max(1);
    // --quick shortens the heartbeat so the idle phase sees several in a few seconds.
    let (heartbeat_ms, idle) = if quick {
        (1_000, Duration::from_secs(4))
    } else {
        (5_000, Duration::from_secs(16))
    };
    let hb = heartbeat_ms.to_string();
    let server = fresh_server_with(dir, &["--changes-heartbeat-ms", &hb])?;
    let mut extra = Map::new();
    extra.insert("idle_connections_wanted".into(), json!(wanted));
    extra.insert("open_file_limit".into(), json!(open_files));
    crate::streambench::idle_subscribers(
        &server,
        idle_connections,
        idle,
        heartbeat_ms,
        &mut extra,
    )?;
    let per_connection = if quick { 50 } else { 200 };
    let mut rng = SmallRng::seed_from_u64(SEED);
    let start = Instant::now();
    crate::streambench::notify_latency(
        &server,
        64,
        per_connection,
        doc_1k(&mut rng, 0),
        &mut extra,
    )?;
    let seconds = start.elapsed().as_secs_f64();
    drop(server);
    let ops = extra["live_puts"].as_u64().unwrap_or(0);
    Ok(Run {
        ops,
        commits: ops,
        seconds,
        extra,
    })
}

/// W12: index build and queries over 1,000,000 documents (embedded).
fn w12(dir: &Path, quick: bool, documents: Option<u64>) -> BenchResult<Run> {
    let documents = documents.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let f = crate::querybench::w12(dir, documents)?;
    Ok(Run {
        ops: f.documents,
        commits: 1,
        seconds: f.seconds,
        extra: f.extra,
    })
}

/// W13: index lag, idle and under a bulk insert with 3 indexes (embedded).
fn w13(dir: &Path, quick: bool, documents: Option<u64>) -> BenchResult<Run> {
    let documents = documents.unwrap_or(if quick { 300_000 } else { 3_000_000 });
    let f = crate::querybench::w13(dir, documents, if quick { 50 } else { 200 })?;
    Ok(Run {
        ops: f.documents,
        commits: 1,
        seconds: f.seconds,
        extra: f.extra,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs a workload `runs` times (once if a run takes over 10 s) and returns the
/// median run by throughput.
fn measure(runs: usize, mut f: impl FnMut() -> BenchResult<Run>) -> BenchResult<(Run, usize)> {
    let mut results = Vec::new();
    for i in 0..runs.max(1) {
        // Each run's peak memory is its own (in-process workloads: this process; the
        // server workloads add their server's).
        crate::procstat::reset_own_peak_rss();
        let mut r = f()?;
        if let Ok(peak) = crate::procstat::peak_rss_bytes(std::process::id()) {
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

pub fn run(args: BenchArgs) -> BenchResult<()> {
    if let Some(case) = &args.w7_child {
        let case = W7Case::parse(case).ok_or_else(|| format!("unknown W7 case {case:?}"))?;
        return crate::recoverybench::child(case, &args.dir, args.quick);
    }
    std::fs::create_dir_all(&args.dir)?;
    let mut options = Options::default();
    if let Some(mib) = args.write_back_window_mib {
        options.write_back_window_bytes = mib << 20;
    }
    if let Some(mib) = args.write_buffer_mib {
        options.write_buffer_bytes = mib << 20;
    }
    // Refuse a bad setting before any workload runs.
    options.validate()?;
    let opts = &options;
    let w6_commits = args.w6_commits;
    let raw_writes = if args.quick { 1024 } else { 4096 };
    let raw: Vec<rawdisk::RawDiskResult> = (0..3)
        .map(|_| rawdisk::durable_writes(&args.dir, 16 * 1024, raw_writes))
        .collect::<Result<_, _>>()?;
    let raw_ms = median(raw.iter().map(|r| r.mean_ms).collect());
    let raw_p50_ms = median(raw.iter().map(|r| r.p50_ms).collect());
    let raw_direct = raw.iter().all(|r| r.direct_io);
    if !args.json {
        println!(
            "raw disk: 16 KiB {} write: {raw_ms:.3} ms/write (mean; p50 {:.3}, p99 {:.3}), dir {}",
            if raw_direct {
                "O_DIRECT|O_DSYNC"
            } else {
                "pwrite+fdatasync (O_DIRECT refused)"
            },
            raw[0].p50_ms,
            raw[0].p99_ms,
            args.dir.display()
        );
        println!(
            "{:<8} {:>4} {:>11} {:>10} {:>8} {:>10} {:>28} {:>9} {:>9} {:>7}",
            "workload",
            "runs",
            "ops/s",
            "ms/commit",
            "x raw",
            "jrnl B/op",
            "body B/op full|diff|diff+lz4",
            "p50 us",
            "p99 us",
            "group"
        );
    }
    let run_dir = args.dir.join("run");
    let run_dir = run_dir.as_path();
    let threads: Vec<u64> = args
        .threads
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .filter(|t| *t > 0)
        .collect();
    let quick = args.quick;
    let connections = args.connections;
    let mut load = ServerLoad::new(quick, connections, args.w8_requests, !args.no_redis);
    load.redis_only = args.redis_only;
    let _ = crate::serverbench::SERVE_FLAGS.set(args.serve_flags.clone());
    if let Some(n) = args.w9_requests {
        load.w9_requests = n.max(connections as u64);
    }
    let (w10_docs, w11_connections) = (args.w10_docs, args.w11_connections);
    let (w12_docs, w13_docs) = (args.w12_docs, args.w13_docs);
    let w14_gib = args.w14_gib.unwrap_or(if quick { 0.25 } else { 4.0 });
    let scale = move |full: u64| if quick { full / 10 } else { full };
    for wl in args
        .workloads
        .split(',')
        .map(|w| w.trim().to_ascii_uppercase())
        .filter(|w| !w.is_empty())
    {
        let variants: Vec<Variant<'_>> = match wl.as_str() {
            "W1" => vec![(wl.clone(), Box::new(|| w1(run_dir, opts, args.quick)))],
            "W2" => vec![(
                wl.clone(),
                Box::new(|| fill(run_dir, opts, "W2", scale(1000), 1000, true)),
            )],
            "W3" => vec![(
                wl.clone(),
                Box::new(|| fill(run_dir, opts, "W3", scale(1000), 1000, false)),
            )],
            "W4" => vec![(
                wl.clone(),
                Box::new(|| fill(run_dir, opts, "W4", scale(10_000), 100, false)),
            )],
            "W6" => threads
                .iter()
                .map(|&t| {
                    (
                        format!("W6 T={t}"),
                        Box::new(move || w6(run_dir, opts, quick, t, w6_commits))
                            as Box<dyn Fn() -> BenchResult<Run>>,
                    )
                })
                .collect(),
            "W7" => [W7Case::AfterW3, W7Case::Journal]
                .into_iter()
                .map(|case| {
                    (
                        format!("W7 {}", case.name()),
                        Box::new(move || crate::recoverybench::w7(run_dir, case, quick))
                            as Box<dyn Fn() -> BenchResult<Run>>,
                    )
                })
                .collect(),
            "W8" => vec![(
                wl.clone(),
                Box::new(move || serverbench::w8(run_dir, load, quick)),
            )],
            "W9" => {
                let mut v = vec![(
                    "W9 GET".to_string(),
                    Box::new(move || serverbench::w9(run_dir, load, quick, false))
                        as Box<dyn Fn() -> BenchResult<Run>>,
                )];
                // Redis has no conditional GET.
                if !load.redis_only {
                    v.push((
                        "W9 304".to_string(),
                        Box::new(move || serverbench::w9(run_dir, load, quick, true)),
                    ));
                }
                v
            }
            "W10" => vec![(
                wl.clone(),
                Box::new(move || w10(run_dir, quick, connections, w10_docs)),
            )],
            "W11" => vec![(
                wl.clone(),
                Box::new(move || w11(run_dir, quick, w11_connections)),
            )],
            "W8I" => vec![(
                wl.clone(),
                Box::new(move || serverbench::w8_indexed(run_dir, load)),
            )],
            "W8C" => vec![(
                wl.clone(),
                Box::new(move || serverbench::w8_chained(run_dir, load)),
            )],
            "W12" => vec![(
                wl.clone(),
                Box::new(move || w12(run_dir, quick, w12_docs)),
            )],
            "W13" => vec![(
                wl.clone(),
                Box::new(move || w13(run_dir, quick, w13_docs)),
            )],
            "W14" => vec![(
                wl.clone(),
                Box::new(move || crate::backupbench::w14(run_dir, w14_gib, load)),
            )],
            other => {
                return Err(format!(
                    "unknown workload {other:?} (available: W1, W2, W3, W4, W6, W7, W8, W8I, W8C, W9, W10, W11, W12, W13, W14)"
                )
                .into())
            }
        };
        for (label, f) in variants {
            // W14 is long and writes several times its data: once.
            let runs = if wl == "W14" { 1 } else { args.runs };
            let (m, runs) = measure(runs, &*f)?;
            let _ = std::fs::remove_dir_all(run_dir);
            let raw = RawFigures {
                mean_ms: raw_ms,
                p50_ms: raw_p50_ms,
                direct_io: raw_direct,
            };
            report(&wl, &label, &m, runs, &raw, args.json, args.quick);
        }
    }
    Ok(())
}

/// The raw 16 KiB durable write measured at the start of the run.
struct RawFigures {
    mean_ms: f64,
    p50_ms: f64,
    direct_io: bool,
}

fn report(
    wl: &str,
    label: &str,
    m: &Run,
    runs: usize,
    raw: &RawFigures,
    as_json: bool,
    quick: bool,
) {
    let (raw_ms, raw_direct) = (raw.mean_ms, raw.direct_io);
    let ms_per_commit = m.seconds * 1e3 / m.commits as f64;
    if as_json {
        let mut obj = Map::new();
        obj.insert("workload".into(), json!(wl));
        obj.insert("runs".into(), json!(runs));
        obj.insert("ops".into(), json!(m.ops));
        obj.insert("commits".into(), json!(m.commits));
        obj.insert("seconds".into(), json!(m.seconds));
        obj.insert("ops_per_sec".into(), json!(m.ops_per_sec()));
        obj.insert("ms_per_commit".into(), json!(ms_per_commit));
        obj.insert("raw_disk_ms_per_write".into(), json!(raw_ms));
        obj.insert("raw_disk_p50_ms_per_write".into(), json!(raw.p50_ms));
        obj.insert("raw_disk_direct_io".into(), json!(raw_direct));
        obj.insert("ratio_to_raw_write".into(), json!(ms_per_commit / raw_ms));
        obj.insert("quick".into(), json!(quick));
        obj.extend(m.extra.clone());
        println!("{}", Value::Object(obj));
        return;
    }
    let f = |k: &str| m.extra.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    if let Some(ratio) = m.extra.get("ratio_to_redis").and_then(Value::as_f64) {
        println!(
            "         {label}: {:.0} requests/s vs Redis {} (AOF, appendfsync always) {:.0}/s \
             measured alongside: {ratio:.2}x (target >= 1.0x); Redis p99 {:.0} us, server CPU \
             {:.1} us per request",
            m.ops_per_sec(),
            m.extra["redis_version"].as_str().unwrap_or("?"),
            f("redis_requests_per_sec"),
            f("redis_p99_us"),
            f("redis_server_cpu_us_per_request"),
        );
    }
    if let Some(ratio) = m
        .extra
        .get("ratio_to_raw_write_around_run")
        .and_then(Value::as_f64)
    {
        println!(
            "         {label}: raw 16 KiB durable write {:.3} ms before and {:.3} ms after the \
             run: {ratio:.2}x of their mean (target <= 1.25x), {:.0} us over it (proposed \
             target <= {W1_PROPOSED_EXCESS_US} us)",
            f("raw_disk_ms_before_run"),
            f("raw_disk_ms_after_run"),
            f("excess_over_raw_write_around_run_us"),
        );
    }
    if let Some(open_ms) = m.extra.get("open_ms").and_then(Value::as_f64) {
        println!(
            "         {label}: kill -9 with {:.0} MiB of journal ({} records replayed): open {open_ms:.0} ms, \
             first read {:.0} ms (target <= 1000 ms)",
            f("journal_bytes_written") / (1u64 << 20) as f64,
            f("records_replayed_on_open"),
            f("first_read_ms"),
        );
    }
    if m.extra.contains_key("backup_ratio_to_slower_disk") {
        crate::backupbench::report(label, m);
    }
    if let Some(why) = m.extra.get("redis_skipped").and_then(Value::as_str) {
        println!("         {label}: Redis peer skipped: {why}");
    }
    if let Some(ratio) = m.extra.get("ratio_to_w8").and_then(Value::as_f64) {
        let mib = |k: &str| f(k) / (1u64 << 20) as f64;
        println!(
            "         {label}: {:.0} documents/s in one bulk insert = {ratio:.2}x W8's {:.0} PUTs/s \
             (targets >= 150,000/s, >= 4x); server RSS growth {:.0} MiB (heap {:.0} MiB; \
             target <= 256); rate by tenth, last/first {:.2}",
            m.ops_per_sec(),
            f("w8_requests_per_sec"),
            mib("peak_rss_growth_bytes"),
            mib("peak_rss_anon_growth_bytes"),
            f("last_tenth_to_first")
        );
    }
    if let Some(ratio) = m
        .extra
        .get("ratio_to_w8_without_indexes")
        .and_then(Value::as_f64)
    {
        println!(
            "         {label}: {:.0} PUTs/s with two indexes kept up in the background vs {:.0} \
             without: {ratio:.2}x (goal >= 0.8x)",
            m.ops_per_sec(),
            f("w8_without_indexes_requests_per_sec")
        );
    }
    if m.extra.contains_key("index_build_docs_per_sec") {
        println!(
            "         {label}: {:.0} documents: index build (n, tag) {:.0} docs/s (goal >= 200,000); \
             where n > 0: first page p50 {:.3} ms p99 {:.3} ms (goal p50 <= 1), count {:.3} ms (goal <= 100); \
             where tag = 'x': p50 {:.3} ms, count {:.3} ms; half the index: p50 {:.3} ms, count {:.3} ms; \
             order by n desc limit 20: p50 {:.3} ms",
            f("documents"),
            f("index_build_docs_per_sec"),
            f("first_page_p50_ms"),
            f("first_page_p99_ms"),
            f("count_ms"),
            f("tag_first_page_p50_ms"),
            f("tag_count_ms"),
            f("half_first_page_p50_ms"),
            f("half_count_ms"),
            f("order_desc_first_page_p50_ms"),
        );
    }
    if m.extra.contains_key("lag_p50_ms") {
        println!(
            "         {label}: idle lag ack -> non-stale p50 {:.2} ms p99 {:.2} ms (goal p50 <= 5); \
             bulk insert of {:.0} docs at {:.0}/s with 3 indexes: max lag {:.0} ms, catch-up {:.0} ms \
             after it (goal <= 1000); batch sizes {}",
            f("lag_p50_ms"),
            f("lag_p99_ms"),
            f("flood_documents"),
            f("flood_insert_docs_per_sec"),
            f("flood_max_lag_ms"),
            f("catch_up_ms"),
            m.extra["batch_sizes"]
        );
    }
    if m.extra.contains_key("bytes_per_connection") {
        println!(
            "         {label}: {:.0} idle subscribers: {:.0} bytes each (target <= 16,384), idle CPU \
             {:.2} % of a core with heartbeats every {:.0} ms (target < 2 %); PUT answer -> change \
             at a subscriber: p50 {:.2} ms, p99 {:.2} ms (target p99 <= 5 ms) under {:.0} PUTs/s",
            f("idle_connections"),
            f("bytes_per_connection"),
            f("idle_cpu_percent"),
            f("heartbeat_ms"),
            f("notify_p50_ms"),
            f("notify_p99_ms"),
            f("live_puts_per_sec")
        );
    }
    if let Some(server_us) = m
        .extra
        .get("server_cpu_us_per_request")
        .and_then(Value::as_f64)
    {
        let load_us = f("load_generator_cpu_us_per_request");
        println!(
            "         {label}: CPU per request: server {server_us:.1} us, load generator {load_us:.1} us"
        );
    }
    let peak_mib = |k: &str| {
        m.extra
            .get(k)
            .and_then(Value::as_f64)
            .map(|b| b / (1u64 << 20) as f64)
    };
    match (
        peak_mib("server_peak_rss_bytes"),
        peak_mib("bench_process_peak_rss_bytes"),
    ) {
        (Some(server), _) => println!("         {label}: peak RSS of the server {server:.0} MiB"),
        (None, Some(own)) => println!(
            "         {label}: peak RSS of the benchmark process (engine in-process) {own:.0} MiB"
        ),
        _ => {}
    }
    let opt = |k: &str| {
        m.extra
            .get(k)
            .and_then(Value::as_f64)
            .map_or("-".to_string(), |v| format!("{v:.0}"))
    };
    let group = m
        .extra
        .get("avg_group_size")
        .and_then(Value::as_f64)
        .map_or("-".to_string(), |v| format!("{v:.1}"));
    // HTTP workloads (a request is not a commit of its own) and W7 (one reopen):
    // no per-commit columns.
    let http = m.extra.contains_key("requests_per_sec")
        || m.extra.contains_key("open_ms")
        || m.extra.contains_key("backup_ratio_to_slower_disk");
    let per_commit = |v: f64, digits: usize| {
        if http {
            "-".to_string()
        } else {
            format!("{v:.digits$}")
        }
    };
    println!(
        "{:<8} {:>4} {:>11.0} {:>10} {:>8} {:>10.0} {:>28} {:>9} {:>9} {:>7}",
        label,
        runs,
        m.ops_per_sec(),
        per_commit(ms_per_commit, 3),
        per_commit(ms_per_commit / raw_ms, 2),
        f("journal_bytes_per_op"),
        format!(
            "{:.0}|{:.0}|{:.0}",
            f("journal_body_bytes_per_op_full_images"),
            f("journal_body_bytes_per_op_with_diffs"),
            f("journal_body_bytes_per_op_with_diffs_and_lz4")
        ),
        opt("p50_us"),
        opt("p99_us"),
        group
    );
}
