//! `kiln disk-bench`'s random-read rows: past RAM a point GET costs at least one
//! random read, so the rate of random reads at a given concurrency bounds the GETs/s
//! a database can answer from a disk at that concurrency.
//!
//! A file of incompressible data (every block written, none zeros: a thin-provisioned
//! virtual disk answers reads of never-written or zero blocks without its media) is
//! written with O_DIRECT and synced; then, for each read size (4 KiB, and 8 KiB, Kiln's
//! page) and queue depth (1, 16, 64), N threads each keep one O_DIRECT `pread`
//! outstanding at uniformly random offsets, aligned to the read size. If O_DIRECT is
//! refused, the reads are buffered, after POSIX_FADV_DONTNEED, and the rows say so.

use crate::diskbench::{bar, interrupted, watch_threads, DiskBenchError, Progress, Result, Shared};
use crate::rawdisk::{open_for_reads, summarize, write_incompressible, AlignedBuf};
use crate::rawdisk::{LatencySummary, RawDiskError, ReadFile};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const KIB: usize = 1024;
const MIB: u64 = 1 << 20;
/// The read sizes of the rows: a 4 KiB block, and Kiln's page.
pub const READ_SIZES: [usize; 2] = [4 * KIB, 8 * KIB];
/// The queue depths of the rows: N threads, each with one read outstanding.
pub const QUEUE_DEPTHS: [usize; 3] = [1, 16, 64];
/// Kiln's page (kiln-storage's `PAGE_SIZE`): what a point read past RAM reads at least.
pub const PAGE_SIZE: usize = kiln_storage::PAGE_SIZE;
const _: () = assert!(PAGE_SIZE == READ_SIZES[1]);
/// The queue depth of the line on point reads past RAM.
const POINT_READ_DEPTH: usize = 16;
/// The file's length must be a multiple of this (the largest read size).
pub const FILE_GRANULE: u64 = 8 * KIB as u64;
/// The file read: larger than a device's or a host's cache is likely to hold.
pub const DEFAULT_FILE_BYTES: u64 = 2 << 30;
pub const QUICK_FILE_BYTES: u64 = 256 * MIB;
/// The count bound of a row (all its threads together), besides the time bound.
pub const DEFAULT_MAX_READS: u64 = 1 << 20;
pub const QUICK_MAX_READS: u64 = 1 << 17;
/// The size of each write that fills the file.
const FILL_CHUNK: usize = 1 << 20;
/// Below this p50, a random 4 KiB read did not come from flash media.
const CACHED_P50_MS: f64 = 0.020;

/// The bounds of the random-read rows.
pub(crate) struct ReadPlan {
    pub file_len: u64,
    /// Count bound per row, split between its threads.
    pub max_reads: u64,
    pub max_time: Duration,
}

impl ReadPlan {
    /// The plan from the command line's values (or the defaults of a --quick or a full
    /// run); a file length that is 0 or not a multiple of 8 KiB is refused.
    pub fn new(
        file_bytes: Option<u64>,
        max_reads: Option<u64>,
        quick: bool,
        max_time: Duration,
    ) -> Result<ReadPlan> {
        let file_len = file_bytes.unwrap_or(if quick {
            QUICK_FILE_BYTES
        } else {
            DEFAULT_FILE_BYTES
        });
        if file_len == 0 || !file_len.is_multiple_of(FILE_GRANULE) {
            return Err(DiskBenchError::BadArgument(format!(
                "--random-read-file-bytes must be a positive multiple of {FILE_GRANULE} \
                 (8 KiB, the largest read), not {file_len}"
            )));
        }
        let max_reads = max_reads.unwrap_or(if quick {
            QUICK_MAX_READS
        } else {
            DEFAULT_MAX_READS
        });
        if max_reads == 0 {
            return Err(DiskBenchError::BadArgument(
                "--max-reads-per-test must be at least 1".to_string(),
            ));
        }
        Ok(ReadPlan {
            file_len,
            max_reads,
            max_time,
        })
    }
}

/// Uniformly random offsets of `size`-byte reads in a `file_len`-byte file: each a
/// multiple of `size` (so aligned for O_DIRECT), each read wholly inside the file.
/// SplitMix64, seeded, so that a row reads the same offsets in every run.
pub struct OffsetGen {
    state: u64,
    slots: u64,
    size: u64,
}

impl OffsetGen {
    /// `file_len` must be at least `size`.
    pub fn new(seed: u64, file_len: u64, size: usize) -> OffsetGen {
        OffsetGen {
            state: seed,
            slots: (file_len / size as u64).max(1),
            size: size as u64,
        }
    }

    pub fn next_offset(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Multiply-shift: a slot in 0..slots, uniform to within slots / 2^64.
        let slot = ((u128::from(z) * u128::from(self.slots)) >> 64) as u64;
        slot * self.size
    }
}

/// One random-read row.
pub(crate) struct ReadRow {
    pub size: usize,
    pub queue_depth: usize,
    pub reads: u64,
    pub max_reads: u64,
    pub time_bounded: bool,
    pub seconds: f64,
    pub lat: LatencySummary,
    pub direct_io: bool,
    pub direct_io_refused: bool,
    pub file_len: u64,
}

impl ReadRow {
    pub fn reads_per_sec(&self) -> f64 {
        self.reads as f64 / self.seconds.max(1e-9)
    }
    pub fn mb_per_sec(&self) -> f64 {
        self.reads_per_sec() * self.size as f64 / 1e6
    }
    pub fn json(&self) -> Value {
        json!({
            "test": "random_read",
            "read_size_bytes": self.size,
            "queue_depth": self.queue_depth,
            "file_bytes": self.file_len,
            "reads": self.reads,
            "max_reads": self.max_reads,
            "time_bounded": self.time_bounded,
            "seconds": self.seconds,
            "reads_per_sec": self.reads_per_sec(),
            "mb_per_sec": self.mb_per_sec(),
            "mean_ms": self.lat.mean_ms,
            "p50_ms": self.lat.p50_ms,
            "p99_ms": self.lat.p99_ms,
            "max_ms": self.lat.max_ms,
            "direct_io": self.direct_io,
            "direct_io_refused": self.direct_io_refused,
        })
    }
}

/// The rows' (read size, queue depth), in the order they run.
fn specs() -> Vec<(usize, usize)> {
    READ_SIZES
        .iter()
        .flat_map(|&s| QUEUE_DEPTHS.iter().map(move |&q| (s, q)))
        .collect()
}

/// Writes the file at `path`, then measures every row, each printed (or its JSON
/// object) as soon as measured; removes the file when done (the caller's guard
/// removes it on the other exit paths).
pub(crate) fn run_rows(path: &Path, plan: &ReadPlan, as_json: bool) -> Result<Vec<ReadRow>> {
    let direct_fill = fill(path, plan)?;
    if !as_json {
        print_section(plan, direct_fill);
    }
    let specs = specs();
    let mut rows = Vec::with_capacity(specs.len());
    for (i, &(size, depth)) in specs.iter().enumerate() {
        if interrupted() {
            return Err(DiskBenchError::Interrupted);
        }
        let label = format!("{}/{}", i + 1, specs.len());
        let row = measure_row(path, size, depth, plan, &label)?;
        if as_json {
            println!("{}", row.json());
        } else {
            print_row(&row);
        }
        rows.push(row);
    }
    let _ = std::fs::remove_file(path);
    Ok(rows)
}

/// Writes the file (with a progress bar; Ctrl-C stops it); whether with O_DIRECT.
fn fill(path: &Path, plan: &ReadPlan) -> Result<bool> {
    let pb = bar(
        plan.file_len,
        "prepare",
        "writing the random-read file (incompressible data, O_DIRECT)",
    );
    let direct = write_incompressible(path, plan.file_len, FILL_CHUNK, &mut |b| {
        pb.set_position(b);
        !interrupted()
    })?;
    pb.finish_and_clear();
    Ok(direct)
}

/// A reader adds its reads to `Shared::count` (for the progress bar) in steps of this.
const COUNT_STEP: u64 = 64;

/// What one reader thread did.
struct ReaderRun {
    reads: u64,
    latencies_ms: Vec<f64>,
    stopped_early: bool,
    finished: Instant,
}

/// One row: `depth` threads on one descriptor, each reading until its share of the
/// count bound, the time bound, an error elsewhere or Ctrl-C; reads/s is the total
/// over the wall time from the common start to the last thread's end.
fn measure_row(
    path: &Path,
    size: usize,
    depth: usize,
    plan: &ReadPlan,
    label: &str,
) -> Result<ReadRow> {
    let rf = open_for_reads(path)?;
    let per_reader = (plan.max_reads / depth as u64).max(1);
    let shared = Shared::new(depth);
    let pb = bar(
        1000,
        label,
        &format!("random_read {} KiB x{depth}", size / KIB),
    );
    let (start, results) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth)
            .map(|i| {
                let seed = seed(size, depth, i);
                let (rf, shared) = (&rf, &shared);
                s.spawn(move || reader(rf, size, seed, per_reader, plan, shared))
            })
            .collect();
        let progress = Progress {
            bar: &pb,
            done: &shared.count,
            total: per_reader * depth as u64,
            max_time: plan.max_time,
        };
        watch_threads(handles, &shared.barrier, &shared.stop, &progress)
    });
    pb.finish_and_clear();
    if interrupted() {
        return Err(DiskBenchError::Interrupted);
    }
    let mut row = ReadRow {
        size,
        queue_depth: depth,
        reads: 0,
        max_reads: per_reader * depth as u64,
        time_bounded: false,
        seconds: 0.0,
        lat: LatencySummary::default(),
        direct_io: rf.direct_io,
        direct_io_refused: rf.direct_io_refused,
        file_len: plan.file_len,
    };
    combine(&mut row, start, results)?;
    Ok(row)
}

/// A distinct, fixed seed for each thread of each row.
fn seed(size: usize, depth: usize, thread: usize) -> u64 {
    ((size as u64) << 40) ^ ((depth as u64) << 20) ^ thread as u64 ^ 0x6B69_6C6E
}

/// One reader thread: waits for the others, then reads until a bound.
fn reader(
    rf: &ReadFile,
    size: usize,
    seed: u64,
    max_reads: u64,
    plan: &ReadPlan,
    shared: &Shared,
) -> std::result::Result<ReaderRun, RawDiskError> {
    let mut buf = AlignedBuf::new(size);
    let mut offsets = OffsetGen::new(seed, plan.file_len, size);
    let mut latencies_ms = Vec::with_capacity(max_reads.min(1 << 20) as usize);
    shared.barrier.wait();
    let start = Instant::now();
    let mut reads = 0;
    let mut stopped_early = false;
    while reads < max_reads {
        let offset = offsets.next_offset();
        let t = Instant::now();
        if let Err(e) = rf.read_at(buf.bytes_mut(), offset) {
            shared.stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
        latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
        reads += 1;
        if reads.is_multiple_of(COUNT_STEP) {
            shared.count.fetch_add(COUNT_STEP, Ordering::Relaxed);
        }
        let out_of_time = start.elapsed() >= plan.max_time;
        if reads < max_reads && (out_of_time || shared.stop.load(Ordering::Relaxed)) {
            stopped_early = true;
            break;
        }
    }
    Ok(ReaderRun {
        reads,
        latencies_ms,
        stopped_early,
        finished: Instant::now(),
    })
}

type Joined = std::thread::Result<std::result::Result<ReaderRun, RawDiskError>>;

/// The threads' runs added up into `row`: reads, latencies, wall time.
fn combine(row: &mut ReadRow, start: Instant, results: Vec<Joined>) -> Result<()> {
    let mut lat = Vec::new();
    let mut end = start;
    for r in results {
        let run = r.map_err(|_| DiskBenchError::ReaderPanicked)??;
        row.reads += run.reads;
        row.time_bounded |= run.stopped_early;
        lat.extend(run.latencies_ms);
        end = end.max(run.finished);
    }
    row.seconds = (end - start).as_secs_f64();
    row.lat = summarize(&mut lat);
    Ok(())
}

// ---- output ----

fn print_section(plan: &ReadPlan, direct_fill: bool) {
    println!(
        "\nrandom reads: pread at uniformly random offsets (aligned to the read size) in a \
         {} MiB file of incompressible data, written with {} and synced first; queue depth \
         N = N threads, each with one O_DIRECT read outstanding; reads/s is the total",
        plan.file_len / MIB,
        if direct_fill {
            "O_DIRECT"
        } else {
            "buffered writes"
        }
    );
    println!(
        "  {:<8} {:>5} {:>10} {:>6} {:>10} {:>9} {:>8} {:>8}",
        "size", "QD", "reads", "s", "reads/s", "MB/s", "p50 ms", "p99 ms"
    );
}

fn print_row(r: &ReadRow) {
    println!(
        "  {:<8} {:>5} {:>10} {:>6.2} {:>10.0} {:>9.1} {:>8.3} {:>8.3}",
        format!(
            "{} KiB{}",
            r.size / KIB,
            if r.direct_io_refused { "!" } else { "" }
        ),
        r.queue_depth,
        format!("{}{}", r.reads, if r.time_bounded { "*" } else { " " }),
        r.seconds,
        r.reads_per_sec(),
        r.mb_per_sec(),
        r.lat.p50_ms,
        r.lat.p99_ms
    );
}

/// The footnotes of the table's marks, printed with the write rows' ones.
pub(crate) fn print_footnotes(rows: &[ReadRow], plan: &ReadPlan, max_seconds: f64) {
    if rows.iter().any(|r| r.time_bounded) {
        println!(
            "* random reads: stopped at the time bound ({max_seconds} s) before {} reads",
            plan.max_reads
        );
    }
    if rows.iter().any(|r| r.direct_io_refused) {
        println!(
            "! O_DIRECT refused for the random reads: buffered pread after \
             POSIX_FADV_DONTNEED, so the figures are the page cache's, not the disk's"
        );
    }
}

fn row_of(rows: &[ReadRow], size: usize, depth: usize) -> Option<&ReadRow> {
    rows.iter()
        .find(|r| r.size == size && r.queue_depth == depth)
}

/// The interpretation's lines on the random reads (a line whose rows are missing is
/// left out). `memory_backed`: the file system keeps files in memory.
pub(crate) fn interpret(rows: &[ReadRow], memory_backed: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let per_depth = |size| {
        QUEUE_DEPTHS
            .iter()
            .map(|&q| row_of(rows, size, q).map(|r| (q, r.reads_per_sec())))
            .collect::<Option<Vec<_>>>()
    };
    if let Some(v) = per_depth(4 * KIB) {
        let list: Vec<String> = v.iter().map(|(q, r)| format!("QD{q} {r:.0}")).collect();
        lines.push(format!("random 4 KiB reads/s: {}.", list.join(", ")));
        lines.extend(depth_scaling(&v));
    }
    lines.extend(cached_reads(rows));
    if let Some(r) = row_of(rows, PAGE_SIZE, POINT_READ_DEPTH) {
        lines.push(format!(
            "a point read past RAM costs at least one random read: at {POINT_READ_DEPTH} \
             concurrent readers this disk allows ~{:.0} reads/s (the {} KiB QD{POINT_READ_DEPTH} \
             row: {} KiB is Kiln's page, PAGE_SIZE), the ceiling of GETs/s past RAM at that \
             concurrency.",
            r.reads_per_sec(),
            PAGE_SIZE / KIB,
            PAGE_SIZE / KIB
        ));
    }
    if rows.iter().any(|r| r.direct_io_refused) {
        lines.push(
            "O_DIRECT was refused for the random reads: they are buffered preads after \
             POSIX_FADV_DONTNEED, so the figures are the page cache's, not the disk's."
                .to_string(),
        );
    } else if memory_backed && !rows.is_empty() {
        lines.push(
            "the random-read file is in memory (this file system keeps files there): the \
             figures are memory's, not a disk's."
                .to_string(),
        );
    }
    lines
}

/// How the 4 KiB rate grows with the queue depth: whether the device overlaps reads.
fn depth_scaling(v: &[(usize, f64)]) -> Option<String> {
    let (&(_, one), &(deep_q, deep)) = (v.first()?, v.last()?);
    let mid = v.iter().find(|(q, _)| *q == POINT_READ_DEPTH)?.1;
    let (s_mid, s_deep) = (mid / one.max(1e-9), deep / one.max(1e-9));
    let verdict = if s_mid < 1.5 {
        "the device does not overlap random reads: more concurrent readers wait in line"
    } else if s_deep < 1.2 * s_mid {
        "the device overlaps random reads up to about 16 at a time, then saturates"
    } else {
        "the device overlaps random reads, and more readers still add throughput"
    };
    Some(format!(
        "by queue depth (4 KiB): QD{POINT_READ_DEPTH} is {s_mid:.1}x QD1, QD{deep_q} \
         {s_deep:.1}x: {verdict}."
    ))
}

/// When a direct 4 KiB read at depth 1 is faster than flash media can answer.
fn cached_reads(rows: &[ReadRow]) -> Option<String> {
    let r = row_of(rows, 4 * KIB, 1).filter(|r| r.direct_io)?;
    (r.lat.p50_ms < CACHED_P50_MS).then(|| {
        format!(
            "a random 4 KiB O_DIRECT read takes {:.1} us (p50): faster than flash media; a \
             cache below the file system (a virtual disk's host page cache, a device \
             cache) answers, so reads past RAM on the real disk may be slower.",
            r.lat.p50_ms * 1e3
        )
    })
}

/// The summary object's random-read fields: the file, each row's reads/s as a map
/// (`4k_qd1`, ..., `8k_qd64`), and the QD16 rates on their own for scripts.
pub(crate) fn summary_fields(rows: &[ReadRow], plan: &ReadPlan) -> Map<String, Value> {
    let key = |r: &ReadRow| format!("{}k_qd{}", r.size / KIB, r.queue_depth);
    let per_sec: Map<String, Value> = rows
        .iter()
        .map(|r| (key(r), json!(r.reads_per_sec())))
        .collect();
    let qd16 = |size| row_of(rows, size, POINT_READ_DEPTH).map(ReadRow::reads_per_sec);
    let mut m = Map::new();
    m.insert("random_read_file_bytes".into(), json!(plan.file_len));
    m.insert("max_reads_per_test".into(), json!(plan.max_reads));
    m.insert(
        "random_read_direct_io".into(),
        json!(!rows.is_empty() && rows.iter().all(|r| r.direct_io)),
    );
    m.insert("random_read_4k_qd16_per_sec".into(), json!(qd16(4 * KIB)));
    m.insert("random_read_8k_qd16_per_sec".into(), json!(qd16(8 * KIB)));
    m.insert("random_read_per_sec".into(), Value::Object(per_sec));
    m.insert("page_size_bytes".into(), json!(PAGE_SIZE));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_aligned_and_every_read_is_inside_the_file() {
        for (file_len, size) in [(8192, 4096), (8192, 8192), (1 << 20, 8192), (40960, 4096)] {
            let mut g = OffsetGen::new(7, file_len, size);
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..10_000 {
                let o = g.next_offset();
                assert_eq!(o % size as u64, 0, "{o}");
                assert!(o + size as u64 <= file_len, "{o} + {size} > {file_len}");
                seen.insert(o);
            }
            let slots = file_len / size as u64;
            if slots <= 1000 {
                assert_eq!(
                    seen.len() as u64,
                    slots,
                    "every slot of {file_len} / {size}"
                );
            }
        }
    }

    #[test]
    fn offsets_are_spread_over_the_whole_file() {
        let file_len = 2u64 << 30;
        let mut g = OffsetGen::new(1, file_len, 4096);
        let mut tenths = [0u32; 10];
        for _ in 0..100_000 {
            tenths[(g.next_offset() * 10 / file_len) as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&n| (9_000..11_000).contains(&n)),
            "{tenths:?}"
        );
    }

    #[test]
    fn a_file_length_of_zero_or_not_whole_pages_is_refused() {
        let t = Duration::from_secs(1);
        for bad in [0, 4096, 12288, 8193] {
            let e = ReadPlan::new(Some(bad), None, false, t)
                .err()
                .expect("refused");
            assert!(matches!(e, DiskBenchError::BadArgument(_)), "{e}");
            assert!(e.to_string().contains("--random-read-file-bytes"), "{e}");
        }
        let p = ReadPlan::new(Some(16384), None, true, t).unwrap();
        assert_eq!((p.file_len, p.max_reads), (16384, QUICK_MAX_READS));
        assert_eq!(
            ReadPlan::new(None, None, false, t).unwrap().file_len,
            DEFAULT_FILE_BYTES
        );
    }

    #[test]
    fn rows_read_a_small_file_at_every_size_and_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("r");
        let plan =
            ReadPlan::new(Some(1 << 20), Some(2_000), true, Duration::from_millis(50)).unwrap();
        let rows = run_rows(&path, &plan, true).unwrap();
        assert_eq!(rows.len(), 6);
        for r in &rows {
            assert!(r.reads > 0 && r.reads <= r.max_reads, "{}", r.json());
            assert!(r.lat.p50_ms <= r.lat.p99_ms, "{}", r.json());
        }
        assert!(!path.exists(), "the file is removed");
        let s = summary_fields(&rows, &plan);
        assert!(s["random_read_8k_qd16_per_sec"].as_f64().unwrap() > 0.0);
        assert_eq!(s["random_read_per_sec"].as_object().unwrap().len(), 6);
        let notes = interpret(&rows, false);
        assert!(
            notes.iter().any(|l| l.contains("at 16 concurrent readers")),
            "{notes:?}"
        );
    }
}
