//! `kiln bench`: workloads of shared/BENCHMARKS.md run against Kiln, beside the raw
//! disk measured in the same run. This module is the parent: it checks the workload
//! list, measures the raw disk, runs each workload's variants (`stats::measure`: the
//! median of `--runs`) and prints their rows (`report`); the workloads live in the
//! modules it dispatches to, which never import from it.

use crate::attachbench;
use crate::backupbench::{self, BackupTool};
use crate::clusterbench::{self, CatchUpScale, ClusterLoad};
use crate::rawdisk;
use crate::recoverybench::{self, W7Case};
use crate::report::{self, RawFigures};
use crate::run::{BenchResult, Run, UsageError};
use crate::serverbench::{self, ServerLoad};
use crate::stats::{measure, median};
use crate::storagebench;
use crate::streambench;
use crate::subbench;
use crate::workload;
use crate::{aggbench, querybench, searchbench};
use kiln_storage::Options;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Comma-separated workload ids: W1, W2, W3, W4, W6, W7 (recovery after kill -9),
    /// W8, W8I (W8 with two indexes), W8C (W8 with a backup chain active), W9, W10, W11,
    /// W12, W13, W14 (backup and restore of a generated database, and W8 during a
    /// backup; not part of the default set: it writes several times --w14-gib), W15
    /// (W8 against the leader of a three-node cluster beside W8 on one node, and
    /// kill -9 of the leader timed to the next acknowledged write), W15C (a stopped
    /// follower's catch-up from a snapshot and from the log, against the disk's
    /// sequential write), W16 (full-text search over the man pages: the index's build
    /// and queries against tantivy used directly), W17 (aggregations: a reduce index's
    /// build, grouped queries, its update lag), W18 (data subscriptions: delivery to one
    /// worker with batches acknowledged, live-write delivery latency), W19 (a large
    /// attachment's upload and download through `kiln serve` against the disk's
    /// sequential write and read, and the server's memory during each).
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
    /// Encrypt at rest everything this run makes: the environments of W1-W6 and the
    /// servers of the server workloads (which read KILN_ENCRYPTION_KEY_FILE too).
    /// The file holds the master key (`kiln encryption new-key`). Compare a run
    /// with it to one without, in the same sitting, for the cost of encryption.
    #[arg(long, env = "KILN_ENCRYPTION_KEY_FILE", value_name = "FILE")]
    encryption_key_file: Option<std::path::PathBuf>,
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
    /// W6 commits in total (default: 20,000 as docs/benchmarks.md has it; 4,000 with
    /// --quick). A longer run shows the sustained rate, data-file write-back included.
    #[arg(long)]
    w6_commits: Option<u64>,
    /// W10 documents (default: 1,000,000 as docs/benchmarks.md has it; 100,000 with
    /// --quick; 3,000,000 shows whether the rate holds).
    #[arg(long)]
    w10_docs: Option<u64>,
    /// W12 documents (default: 1,000,000; 100,000 with --quick).
    #[arg(long)]
    w12_docs: Option<u64>,
    /// W13 documents of the bulk insert (default: 3,000,000; 300,000 with --quick).
    #[arg(long)]
    w13_docs: Option<u64>,
    /// W16 documents: man pages (default: 20,000, at most 128 MB of text; 2,000 with
    /// --quick).
    #[arg(long)]
    w16_docs: Option<u64>,
    /// W18 documents delivered to a data subscription's worker (default: 1,000,000;
    /// 100,000 with --quick).
    #[arg(long)]
    w18_docs: Option<u64>,
    /// W19 attachment size in MiB (default: 1,024; 64 with --quick).
    #[arg(long)]
    w19_mib: Option<u64>,
    /// W17 orders (default: 1,000,000; 100,000 with --quick).
    #[arg(long)]
    w17_docs: Option<u64>,
    /// W14: GiB of generated ~1 KiB documents (default: 4; 0.25 with --quick).
    #[arg(long)]
    w14_gib: Option<f64>,
    /// W15 PUTs in all, to the cluster's leader and to the single node beside it
    /// (default: 50,000; 6,400 with --quick).
    #[arg(long)]
    w15_requests: Option<u64>,
    /// W15 kills of the cluster's leader (default: 20; 5 with --quick; 0 skips the
    /// failover part).
    #[arg(long)]
    w15_failovers: Option<usize>,
    /// W15C: MiB of ~1 KiB documents written while a follower is down, for its
    /// catch-up from a snapshot (default: 256; 8 with --quick; the goal is
    /// for 1024). The cluster takes about 20 times this on disk.
    #[arg(long)]
    w15c_mib: Option<u64>,
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

/// The workloads `kiln bench` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    W1,
    W2,
    W3,
    W4,
    W6,
    W7,
    W8,
    W8I,
    W8C,
    W9,
    W10,
    W11,
    W12,
    W13,
    W14,
    W15,
    W15C,
    W16,
    W17,
    W18,
    W19,
}

impl Workload {
    /// Every workload, in the order the error for an unknown one lists them.
    const ALL: [Workload; 21] = [
        Workload::W1,
        Workload::W2,
        Workload::W3,
        Workload::W4,
        Workload::W6,
        Workload::W7,
        Workload::W8,
        Workload::W8I,
        Workload::W8C,
        Workload::W9,
        Workload::W10,
        Workload::W11,
        Workload::W12,
        Workload::W13,
        Workload::W14,
        Workload::W15,
        Workload::W15C,
        Workload::W16,
        Workload::W17,
        Workload::W18,
        Workload::W19,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::W1 => "W1",
            Workload::W2 => "W2",
            Workload::W3 => "W3",
            Workload::W4 => "W4",
            Workload::W6 => "W6",
            Workload::W7 => "W7",
            Workload::W8 => "W8",
            Workload::W8I => "W8I",
            Workload::W8C => "W8C",
            Workload::W9 => "W9",
            Workload::W10 => "W10",
            Workload::W11 => "W11",
            Workload::W12 => "W12",
            Workload::W13 => "W13",
            Workload::W14 => "W14",
            Workload::W15 => "W15",
            Workload::W15C => "W15C",
            Workload::W16 => "W16",
            Workload::W17 => "W17",
            Workload::W18 => "W18",
            Workload::W19 => "W19",
        }
    }
}

/// The workloads of `--workloads` (comma-separated, any case, empty entries
/// skipped), all checked before anything runs: an unknown one is an error that
/// lists the known ones.
fn parse_workloads(list: &str) -> BenchResult<Vec<Workload>> {
    list.split(',')
        .map(|w| w.trim().to_ascii_uppercase())
        .filter(|w| !w.is_empty())
        .map(|w| {
            Workload::ALL
                .into_iter()
                .find(|k| k.name() == w)
                .ok_or_else(|| {
                    let known: Vec<&str> = Workload::ALL.iter().map(|k| k.name()).collect();
                    UsageError(format!(
                        "unknown workload {w:?} (available: {})",
                        known.join(", ")
                    ))
                    .into()
                })
        })
        .collect()
}

/// A workload variant: its label and how to run it once.
type Variant<'a> = (String, Box<dyn Fn() -> BenchResult<Run> + 'a>);

/// What the workloads run with: the arguments, resolved.
struct Plan<'a> {
    args: &'a BenchArgs,
    /// Each run's directory (removed after it).
    run_dir: PathBuf,
    /// The environments of W1-W6.
    options: Options,
    /// W6's thread counts.
    threads: Vec<u64>,
    /// The server workloads' scale and peer.
    load: ServerLoad,
    w14_gib: f64,
    backup_tool: Option<BackupTool>,
    /// W15's scale.
    cluster: ClusterLoad,
    /// W15C's scale.
    catch_up: CatchUpScale,
}

impl<'a> Plan<'a> {
    fn new(args: &'a BenchArgs, backup_tool: Option<BackupTool>) -> Plan<'a> {
        let mut options = Options::default();
        if let Some(mib) = args.write_back_window_mib {
            options.write_back_window_bytes = mib << 20;
        }
        if let Some(mib) = args.write_buffer_mib {
            options.write_buffer_bytes = mib << 20;
        }
        let threads = args
            .threads
            .split(',')
            .filter_map(|t| t.trim().parse().ok())
            .filter(|t| *t > 0)
            .collect();
        let mut load = ServerLoad::new(
            args.quick,
            args.connections,
            args.w8_requests,
            !args.no_redis,
        );
        load.redis_only = args.redis_only;
        if let Some(n) = args.w9_requests {
            load.w9_requests = n.max(args.connections as u64);
        }
        Plan {
            args,
            run_dir: args.dir.join("run"),
            options,
            threads,
            load,
            w14_gib: args.w14_gib.unwrap_or(if args.quick { 0.25 } else { 4.0 }),
            backup_tool,
            cluster: ClusterLoad::new(
                args.quick,
                args.connections,
                args.w15_requests,
                args.w15_failovers,
            ),
            catch_up: CatchUpScale::new(args.quick, args.w15c_mib),
        }
    }

    /// The variants of one workload, each a label and a run.
    fn variants(&self, wl: Workload) -> BenchResult<Vec<Variant<'_>>> {
        let dir: &Path = &self.run_dir;
        let opts = &self.options;
        let a = self.args;
        let (quick, load) = (a.quick, self.load);
        let one = |f| one_variant(wl, f);
        Ok(match wl {
            Workload::W1 => one(Box::new(move || storagebench::w1(dir, opts, quick))),
            Workload::W2 => one(Box::new(move || {
                storagebench::fill(dir, opts, "W2", workload::W2, quick)
            })),
            Workload::W3 => one(Box::new(move || {
                storagebench::fill(dir, opts, "W3", workload::W3, quick)
            })),
            Workload::W4 => one(Box::new(move || {
                storagebench::fill(dir, opts, "W4", workload::W4, quick)
            })),
            Workload::W6 => self.w6_variants(),
            Workload::W7 => self.w7_variants(),
            Workload::W8 => one(Box::new(move || serverbench::w8(dir, load, quick))),
            Workload::W9 => self.w9_variants(),
            Workload::W10 => one(Box::new(move || {
                streambench::w10(dir, quick, a.connections, a.w10_docs)
            })),
            Workload::W11 => one(Box::new(move || {
                streambench::w11(dir, quick, a.w11_connections)
            })),
            Workload::W8I => one(Box::new(move || serverbench::w8_indexed(dir, load))),
            Workload::W8C => one(Box::new(move || serverbench::w8_chained(dir, load))),
            Workload::W12 => one(Box::new(move || querybench::w12(dir, quick, a.w12_docs))),
            Workload::W13 => one(Box::new(move || querybench::w13(dir, quick, a.w13_docs))),
            Workload::W16 => one(Box::new(move || searchbench::w16(dir, quick, a.w16_docs))),
            Workload::W17 => one(Box::new(move || aggbench::w17(dir, quick, a.w17_docs))),
            Workload::W18 => one(Box::new(move || subbench::w18(dir, quick, a.w18_docs))),
            Workload::W19 => one(Box::new(move || attachbench::w19(dir, quick, a.w19_mib))),
            Workload::W14 => {
                let tool = self.backup_tool.ok_or(NO_BACKUP_TOOL)?;
                let gib = self.w14_gib;
                one(Box::new(move || backupbench::w14(dir, gib, load, tool)))
            }
            Workload::W15 => {
                let cluster = self.cluster;
                one(Box::new(move || clusterbench::w15(dir, cluster)))
            }
            Workload::W15C => {
                let scale = self.catch_up;
                one(Box::new(move || clusterbench::w15c(dir, scale)))
            }
        })
    }

    /// W6: one variant per thread count.
    fn w6_variants(&self) -> Vec<Variant<'_>> {
        let (dir, opts, a): (&Path, _, _) = (&self.run_dir, &self.options, self.args);
        self.threads
            .iter()
            .map(|&t| -> Variant<'_> {
                (
                    format!("W6 T={t}"),
                    Box::new(move || storagebench::w6(dir, opts, a.quick, t, a.w6_commits)),
                )
            })
            .collect()
    }

    /// W7: one variant per recovery case.
    fn w7_variants(&self) -> Vec<Variant<'_>> {
        let (dir, quick): (&Path, _) = (&self.run_dir, self.args.quick);
        [W7Case::AfterW3, W7Case::Journal]
            .into_iter()
            .map(|case| -> Variant<'_> {
                (
                    format!("W7 {}", case.name()),
                    Box::new(move || recoverybench::w7(dir, case, quick)),
                )
            })
            .collect()
    }

    /// W9: plain GETs and, unless Redis runs alone, GETs answered 304.
    fn w9_variants(&self) -> Vec<Variant<'_>> {
        let (dir, quick, load): (&Path, _, _) = (&self.run_dir, self.args.quick, self.load);
        let mut v: Vec<Variant<'_>> = vec![(
            "W9 GET".to_string(),
            Box::new(move || serverbench::w9(dir, load, quick, false)),
        )];
        // Redis has no conditional GET.
        if !load.redis_only {
            v.push((
                "W9 304".to_string(),
                Box::new(move || serverbench::w9(dir, load, quick, true)),
            ));
        }
        v
    }
}

/// A workload of one variant, labelled with the workload.
fn one_variant<'a>(wl: Workload, f: Box<dyn Fn() -> BenchResult<Run> + 'a>) -> Vec<Variant<'a>> {
    vec![(wl.name().to_string(), f)]
}

const NO_BACKUP_TOOL: &str =
    "W14 measures `kiln backup` and `kiln restore`: run it through `kiln bench`";

/// Three samples of the raw 16 KiB durable write in `dir`: their medians, and the
/// first sample (whose p50 and p99 the header quotes).
fn raw_disk(dir: &Path, quick: bool) -> BenchResult<(RawFigures, rawdisk::RawDiskResult)> {
    let raw_writes = if quick { 1024 } else { 4096 };
    let raw: Vec<rawdisk::RawDiskResult> = (0..3)
        .map(|_| rawdisk::durable_writes(dir, 16 * 1024, raw_writes))
        .collect::<Result<_, _>>()?;
    let figures = RawFigures {
        mean_ms: median(&raw.iter().map(|r| r.mean_ms).collect::<Vec<_>>()),
        p50_ms: median(&raw.iter().map(|r| r.p50_ms).collect::<Vec<_>>()),
        direct_io: raw.iter().all(|r| r.direct_io),
    };
    let first = raw.into_iter().next().expect("three samples");
    Ok((figures, first))
}

/// `kiln bench`. `backup_tool` is `kiln backup`'s and `kiln restore`'s code, for W14
/// (which is refused without it).
pub fn run(args: BenchArgs, backup_tool: Option<BackupTool>) -> BenchResult<()> {
    if let Some(case) = &args.w7_child {
        let case =
            W7Case::parse(case).ok_or_else(|| UsageError(format!("unknown W7 case {case:?}")))?;
        return recoverybench::child(case, &args.dir, args.quick);
    }
    // Refuse a bad workload list or setting before anything runs or prints.
    let workloads = parse_workloads(&args.workloads)?;
    if workloads.contains(&Workload::W14) && backup_tool.is_none() {
        return Err(NO_BACKUP_TOOL.into());
    }
    let mut plan = Plan::new(&args, backup_tool);
    let mut serve_flags = args.serve_flags.clone();
    if let Some(path) = &args.encryption_key_file {
        let key =
            kiln_storage::MasterKey::read_file(path).map_err(|e| UsageError(e.to_string()))?;
        let _ = crate::querybench::ENCRYPTION.set(key.clone());
        plan.options.encryption = Some(key);
        // Servers started below get it on their command line, whether it came as
        // this flag or from the environment (which they would inherit anyway).
        serve_flags.extend([
            "--encryption-key-file".to_string(),
            path.display().to_string(),
        ]);
    }
    plan.options
        .validate()
        .map_err(|e| UsageError(e.to_string()))?;
    std::fs::create_dir_all(&args.dir)?;
    let (raw, first_raw) = raw_disk(&args.dir, args.quick)?;
    if !args.json {
        report::print_header(&raw, &first_raw, &args.dir);
    }
    let _ = serverbench::SERVE_FLAGS.set(serve_flags);
    for wl in workloads {
        for (label, f) in plan.variants(wl)? {
            // W14 is long and writes several times its data: once.
            let runs = if wl == Workload::W14 { 1 } else { args.runs };
            let (m, runs) = measure(runs, &*f)?;
            let _ = std::fs::remove_dir_all(&plan.run_dir);
            if wl == Workload::W15C && !args.json {
                clusterbench::report_catch_up(&label, &m);
            }
            report::report(wl.name(), &label, &m, runs, &raw, args.json, args.quick);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_checked_before_anything_runs() {
        let w = parse_workloads(" w1, W8i,,W14 ").unwrap();
        assert_eq!(w, [Workload::W1, Workload::W8I, Workload::W14]);
        let e = parse_workloads("W1,W5").unwrap_err();
        assert!(e.is::<UsageError>(), "{e}");
        assert_eq!(
            e.to_string(),
            "unknown workload \"W5\" (available: W1, W2, W3, W4, W6, W7, W8, W8I, W8C, W9, \
             W10, W11, W12, W13, W14, W15, W15C, W16, W17, W18, W19)"
        );
    }
}
