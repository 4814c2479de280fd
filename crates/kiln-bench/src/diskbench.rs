//! `kiln disk-bench`: what the disk really does, so a slow or lying disk can be told
//! apart from a slow database. Sequential writes in every journal mode, durable
//! writes of several sizes, and concurrent durable writers, each row with writes/s,
//! MB/s and p50/p99 latency; then random O_DIRECT reads at queue depths 1, 16 and 64
//! (the `randread` module: what a point read past RAM costs); then a few lines of
//! interpretation.

use crate::machine::{self, read_trimmed};
use crate::randread::{self, ReadPlan, ReadRow};
use crate::rawdisk::{
    open_for_writes, preallocate, summarize, timed_writes, AlignedBuf, LatencySummary, Prealloc,
    RawDiskError, WriteFile, WriteMode, WriteRun,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

const KIB: usize = 1024;
const MIB: u64 = 1 << 20;
/// The journal's write size, and the size of the journal-mode and concurrent rows.
const JOURNAL_WRITE: usize = 16 * KIB;
/// Below this p50, a durable 16 KiB write cannot have reached stable media through a
/// real flush (unless the device has a power-loss-protected cache).
const LYING_P50_MS: f64 = 0.020;

#[derive(clap::Args)]
pub struct DiskBenchArgs {
    /// Directory to write in; created if missing (and then removed afterwards).
    #[arg(long, default_value = "./kiln-disk-bench")]
    dir: PathBuf,
    /// One JSON object per row on stdout, then one summary object.
    #[arg(long)]
    json: bool,
    /// 4,096 writes and about 1 s per test instead of 65,536 writes and about 5 s, and
    /// a 256 MiB random-read file instead of 2 GiB.
    #[arg(long)]
    quick: bool,
    /// Only the random-read rows (random 4 and 8 KiB O_DIRECT reads at queue depth 1,
    /// 16 and 64), not the write rows.
    #[arg(long)]
    random_reads_only: bool,
    /// Length of the file the random-read rows read, in bytes: a positive multiple of
    /// 8192 (default 2 GiB, 256 MiB with --quick); larger than the disk's cache.
    #[arg(long, value_name = "BYTES")]
    random_read_file_bytes: Option<u64>,
    /// Count bound of each random-read row, all its threads together (default
    /// 1,048,576; 131,072 with --quick); the time bound usually comes first.
    #[arg(long, hide = true)]
    max_reads_per_test: Option<u64>,
    /// Time bound per test in seconds (overrides the one --quick or the default sets).
    #[arg(long, hide = true)]
    max_seconds_per_test: Option<f64>,
    /// Free space required beyond what the run writes, in bytes (default: 64 MiB plus
    /// a tenth of what it writes).
    #[arg(long, hide = true)]
    margin_bytes: Option<u64>,
}

#[derive(Debug)]
pub enum DiskBenchError {
    /// An I/O error on one of the benchmark's files.
    Io(RawDiskError),
    /// An I/O error on the directory itself.
    Dir {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    NotADirectory(PathBuf),
    NoSpace {
        dir: PathBuf,
        need: u64,
        margin: u64,
        free: u64,
    },
    BadArgument(String),
    Interrupted,
    WriterPanicked,
    ReaderPanicked,
}

impl std::fmt::Display for DiskBenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskBenchError::Io(e) => write!(f, "disk-bench: {e}"),
            DiskBenchError::Dir { op, path, source } => {
                write!(f, "disk-bench: {op} {}: {source}", path.display())
            }
            DiskBenchError::NotADirectory(p) => {
                write!(
                    f,
                    "disk-bench: {} exists and is not a directory",
                    p.display()
                )
            }
            DiskBenchError::NoSpace {
                dir,
                need,
                margin,
                free,
            } => write!(
                f,
                "disk-bench: not enough free space in {}: the run writes {} MiB and wants {} MiB \
                 more as a margin, but only {} MiB are free to this user; free some space or \
                 pass --dir on another file system (--quick writes 384 MiB; \
                 --random-read-file-bytes makes the random-read file smaller)",
                dir.display(),
                need / MIB,
                margin / MIB,
                free / MIB
            ),
            DiskBenchError::BadArgument(s) => write!(f, "disk-bench: {s}"),
            DiskBenchError::Interrupted => {
                write!(f, "disk-bench: interrupted; its files were removed")
            }
            DiskBenchError::WriterPanicked => write!(f, "disk-bench: a writer thread panicked"),
            DiskBenchError::ReaderPanicked => write!(f, "disk-bench: a reader thread panicked"),
        }
    }
}

impl std::error::Error for DiskBenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DiskBenchError::Io(e) => Some(e),
            DiskBenchError::Dir { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<RawDiskError> for DiskBenchError {
    fn from(e: RawDiskError) -> Self {
        if e.source.kind() == std::io::ErrorKind::Interrupted && interrupted() {
            DiskBenchError::Interrupted
        } else {
            DiskBenchError::Io(e)
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, DiskBenchError>;

// ---- Ctrl-C: stop at the next write, so the guard can remove the files ----

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    // A second signal kills the process as usual. signal() is async-signal-safe.
    // SAFETY: restoring the default disposition.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic and calls signal().
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

// ---- the guard that removes what the run made ----

/// Removes the files the run made and the directories it created, on every exit path.
struct Cleanup {
    files: Vec<PathBuf>,
    /// Deepest first.
    dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for f in &self.files {
            match std::fs::remove_file(f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => eprintln!("warning: could not remove {}: {e}", f.display()),
            }
        }
        for d in &self.dirs {
            if let Err(e) = std::fs::remove_dir(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("warning: could not remove directory {}: {e}", d.display());
                }
            }
        }
    }
}

// ---- what to run ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum Test {
    JournalMode,
    SingleStream,
    Concurrent,
    /// A commit that writes a 16 KiB value once, beside a small journal record.
    ValueBesideRecord,
}

/// How the two writes of a `ValueBesideRecord` commit are made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pairing {
    /// The value with O_DIRECT alone, then the record with O_DIRECT|O_DSYNC: the
    /// record's cache flush also persists the value, which completed before it.
    ValueThenRecord,
    /// Both with O_DIRECT|O_DSYNC at once (two threads): each pays its own flush.
    BothAtOnce,
}

impl Pairing {
    fn id(self) -> &'static str {
        match self {
            Pairing::ValueThenRecord => "value_then_record",
            Pairing::BothAtOnce => "both_at_once",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Pairing::ValueThenRecord => "value, then record",
            Pairing::BothAtOnce => "value || record",
        }
    }
}

/// The journal record beside a value written in place: a 4 KiB block.
const RECORD_BESIDE_VALUE: usize = 4 * KIB;

impl Test {
    fn id(self) -> &'static str {
        match self {
            Test::JournalMode => "journal_mode",
            Test::SingleStream => "single_stream",
            Test::Concurrent => "concurrent",
            Test::ValueBesideRecord => "value_beside_record",
        }
    }
}

#[derive(Clone, Copy)]
struct Spec {
    test: Test,
    mode: WriteMode,
    size: usize,
    writers: usize,
    /// Into the fallocated (unwritten) file instead of the zero-filled one.
    fresh: bool,
    /// For `ValueBesideRecord` rows: how the value and the record are written.
    pairing: Option<Pairing>,
}

fn specs() -> Vec<Spec> {
    let mut v = Vec::new();
    for mode in WriteMode::ALL {
        v.push(Spec {
            test: Test::JournalMode,
            mode,
            size: JOURNAL_WRITE,
            writers: 1,
            fresh: false,
            pairing: None,
        });
    }
    for size in [4 * KIB, 16 * KIB, 64 * KIB, 1024 * KIB] {
        v.push(Spec {
            test: Test::SingleStream,
            mode: WriteMode::DirectDsync,
            size,
            writers: 1,
            fresh: false,
            pairing: None,
        });
    }
    v.push(Spec {
        test: Test::SingleStream,
        mode: WriteMode::DirectDsync,
        size: JOURNAL_WRITE,
        writers: 1,
        fresh: true,
        pairing: None,
    });
    for writers in [1, 4, 8] {
        v.push(Spec {
            test: Test::Concurrent,
            mode: WriteMode::DirectDsync,
            size: JOURNAL_WRITE,
            writers,
            fresh: false,
            pairing: None,
        });
    }
    for pairing in [Pairing::ValueThenRecord, Pairing::BothAtOnce] {
        v.push(Spec {
            test: Test::ValueBesideRecord,
            mode: WriteMode::DirectDsync,
            size: JOURNAL_WRITE,
            writers: 1,
            fresh: false,
            pairing: Some(pairing),
        });
    }
    v
}

struct Plan {
    /// Write count bound per row (split between the writers of a concurrent row).
    n: u64,
    max_time: Duration,
    /// `max_time` as given, in seconds, for the reports.
    max_seconds: f64,
    /// Length of each of the two files: n 16 KiB writes never wrap around.
    file_len: u64,
    /// The write rows run (not `--random-reads-only`).
    writes: bool,
    /// The random-read rows, which always run.
    reads: ReadPlan,
}

struct Row {
    spec: Spec,
    /// What was measured: `spec.mode`, or its buffered stand-in if O_DIRECT was refused.
    measured: WriteMode,
    direct_io: bool,
    direct_io_refused: bool,
    prealloc: Prealloc,
    writes: u64,
    max_writes: u64,
    time_bounded: bool,
    seconds: f64,
    lat: LatencySummary,
    /// The untimed fsync after a non-durable row: the cost it deferred.
    settle_sync_ms: f64,
}

impl Row {
    fn writes_per_sec(&self) -> f64 {
        self.writes as f64 / self.seconds.max(1e-9)
    }
    fn mb_per_sec(&self) -> f64 {
        self.writes_per_sec() * self.spec.size as f64 / 1e6
    }
    fn json(&self) -> Value {
        json!({
            "test": self.spec.test.id(),
            "mode": self.spec.mode.label(),
            "pairing": self.spec.pairing.map(Pairing::id),
            "measured_mode": self.measured.label(),
            "durable": self.measured.durable(),
            "write_size_bytes": self.spec.size,
            "writers": self.spec.writers,
            "prealloc": self.prealloc.label(),
            "writes": self.writes,
            "max_writes": self.max_writes,
            "time_bounded": self.time_bounded,
            "seconds": self.seconds,
            "writes_per_sec": self.writes_per_sec(),
            "mb_per_sec": self.mb_per_sec(),
            "mean_ms": self.lat.mean_ms,
            "p50_ms": self.lat.p50_ms,
            "p99_ms": self.lat.p99_ms,
            "max_ms": self.lat.max_ms,
            "direct_io": self.direct_io,
            "direct_io_refused": self.direct_io_refused,
            "settle_sync_ms": self.settle_sync_ms,
        })
    }
}

// ---- the run ----

pub fn run(args: DiskBenchArgs) -> Result<()> {
    let started = Instant::now();
    let plan = Plan::from_args(&args)?;
    let dir = &args.dir;
    if dir.exists() && !dir.is_dir() {
        return Err(DiskBenchError::NotADirectory(dir.clone()));
    }
    let free = check_free_space(dir, &plan, args.margin_bytes)?;

    catch_signals();
    let (cleanup, facts, files) = make_test_dir(dir)?;
    if !args.json {
        print_header(dir, &facts, &plan, free);
    }
    let rows = if plan.writes {
        let main_prealloc = zero_fill(&files.main, &plan)?;
        let rows = run_rows(&files, main_prealloc, &plan, args.json)?;
        // Not needed any more: the random-read file need not sit beside it.
        let _ = std::fs::remove_file(&files.main);
        rows
    } else {
        Vec::new()
    };
    let read_rows = randread::run_rows(&files.random, &plan.reads, args.json)?;

    let summary = Summary {
        dir,
        quick: args.quick,
        random_reads_only: args.random_reads_only,
        plan: &plan,
        free_bytes_before: free,
        notes: interpret(&rows, &read_rows, &facts),
        read_rows: &read_rows,
        facts: &facts,
        started,
    };
    if args.json {
        summary.print_json();
    } else {
        summary.print_text(&rows);
    }
    drop(cleanup);
    Ok(())
}

impl Plan {
    /// The bounds `--quick` and `--max-seconds-per-test` set.
    fn from_args(args: &DiskBenchArgs) -> Result<Plan> {
        let secs = args
            .max_seconds_per_test
            .unwrap_or(if args.quick { 1.0 } else { 5.0 });
        if !(secs.is_finite() && secs > 0.0) {
            return Err(DiskBenchError::BadArgument(format!(
                "--max-seconds-per-test must be a positive number of seconds, not {secs}"
            )));
        }
        let n: u64 = if args.quick { 4096 } else { 65_536 };
        let max_time = Duration::from_secs_f64(secs);
        Ok(Plan {
            n,
            max_time,
            max_seconds: secs,
            file_len: n * JOURNAL_WRITE as u64,
            writes: !args.random_reads_only,
            reads: ReadPlan::new(
                args.random_read_file_bytes,
                args.max_reads_per_test,
                args.quick,
                max_time,
            )?,
        })
    }
}

/// Refuses before making anything if the file system cannot take the test files (the
/// two of the write rows, the random-read file) and a margin; returns the free bytes.
fn check_free_space(dir: &Path, plan: &Plan, margin_bytes: Option<u64>) -> Result<u64> {
    let writes = if plan.writes { 2 * plan.file_len } else { 0 };
    let need = writes.saturating_add(plan.reads.file_len);
    let margin = margin_bytes.unwrap_or(64 * MIB + need / 10);
    let existing = nearest_existing(dir);
    let free = free_bytes(&existing)?;
    if free < need.saturating_add(margin) {
        return Err(DiskBenchError::NoSpace {
            dir: existing,
            need,
            margin,
            free,
        });
    }
    Ok(free)
}

/// The two test files (named after the process, so that two runs in one directory
/// do not collide).
struct TestFiles {
    /// Zero-filled once, then overwritten by every row but the fallocated one.
    main: PathBuf,
    /// Fallocated afresh for the fallocated row, and removed after it.
    fresh: PathBuf,
    /// Written with incompressible data for the random-read rows, removed after them.
    random: PathBuf,
}

/// Creates `dir` (and its missing parents) and names the test files, with the guard
/// that removes all of them whatever happens next; reads the machine's facts once
/// the directory exists.
fn make_test_dir(dir: &Path) -> Result<(Cleanup, Facts, TestFiles)> {
    let mut cleanup = Cleanup {
        files: Vec::new(),
        dirs: missing_ancestors(dir),
    };
    std::fs::create_dir_all(dir).map_err(|source| DiskBenchError::Dir {
        op: "create directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let facts = machine_facts(dir);
    let pid = std::process::id();
    let files = TestFiles {
        main: dir.join(format!("disk-bench-{pid}-written.kiln-tmp")),
        fresh: dir.join(format!("disk-bench-{pid}-fallocated.kiln-tmp")),
        random: dir.join(format!("disk-bench-{pid}-random-read.kiln-tmp")),
    };
    cleanup.files.push(files.main.clone());
    cleanup.files.push(files.fresh.clone());
    cleanup.files.push(files.random.clone());
    Ok((cleanup, facts, files))
}

/// Zero-fills the main test file (with a progress bar; Ctrl-C stops it).
fn zero_fill(main: &Path, plan: &Plan) -> Result<Prealloc> {
    let pb = bar(plan.file_len, "prepare", "zero-filling the test file");
    let prealloc = preallocate(main, plan.file_len, Prealloc::ZeroFilled, &mut |b| {
        pb.set_position(b);
        !interrupted()
    })?;
    pb.finish_and_clear();
    Ok(prealloc)
}

/// Every row of [`specs`], each printed (or its JSON object) as soon as measured,
/// under its section's title.
fn run_rows(
    files: &TestFiles,
    main_prealloc: Prealloc,
    plan: &Plan,
    as_json: bool,
) -> Result<Vec<Row>> {
    let specs = specs();
    let mut rows: Vec<Row> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        if interrupted() {
            return Err(DiskBenchError::Interrupted);
        }
        let label = format!("{}/{}", i + 1, specs.len());
        if !as_json && (i == 0 || specs[i - 1].test != spec.test) {
            print_section(spec.test, plan);
        }
        let row = measure_row(*spec, files, main_prealloc, plan, &label)?;
        if as_json {
            println!("{}", row.json());
        } else {
            print_row(&row);
        }
        rows.push(row);
    }
    Ok(rows)
}

/// One row, by the kind of test its spec asks for.
fn measure_row(
    spec: Spec,
    files: &TestFiles,
    main_prealloc: Prealloc,
    plan: &Plan,
    label: &str,
) -> Result<Row> {
    let main = &files.main;
    if spec.fresh {
        let p = preallocate(
            &files.fresh,
            plan.file_len,
            Prealloc::Fallocated,
            &mut |_| true,
        )?;
        let row = single_row(spec, &files.fresh, p, plan, label)?;
        let _ = std::fs::remove_file(&files.fresh);
        Ok(row)
    } else if spec.test == Test::Concurrent {
        concurrent_row(spec, main, main_prealloc, plan, label)
    } else if let Some(pairing) = spec.pairing {
        value_beside_record_row(spec, pairing, main, main_prealloc, plan, label)
    } else {
        single_row(spec, main, main_prealloc, plan, label)
    }
}

/// What the run prints after its rows.
struct Summary<'a> {
    dir: &'a Path,
    quick: bool,
    random_reads_only: bool,
    plan: &'a Plan,
    read_rows: &'a [ReadRow],
    free_bytes_before: u64,
    facts: &'a Facts,
    notes: Notes,
    started: Instant,
}

impl Summary<'_> {
    /// `--json`: one object with the run's bounds, the interpretation, the random
    /// reads' rates (`random_read_*`) and the machine's facts.
    fn print_json(&self) {
        let mut summary = json!({
            "test": "summary",
            "dir": self.dir.display().to_string(),
            "quick": self.quick,
            "random_reads_only": self.random_reads_only,
            "max_writes_per_test": self.plan.n,
            "max_seconds_per_test": self.plan.max_seconds,
            "file_bytes": self.plan.file_len,
            "free_bytes_before": self.free_bytes_before,
            "lying_disk_suspected": self.notes.lying,
            "memory_backed": memory_backed(self.facts),
            "interpretation": self.notes.lines,
            "elapsed_seconds": self.started.elapsed().as_secs_f64(),
        });
        if let (Value::Object(s), Value::Object(f)) = (&mut summary, self.facts.json()) {
            s.extend(randread::summary_fields(self.read_rows, &self.plan.reads));
            s.extend(f);
        }
        println!("{summary}");
    }

    /// The footnotes of the table's marks (`*`, `!`), then the interpretation.
    fn print_text(&self, rows: &[Row]) {
        if rows.iter().any(|r| r.time_bounded) {
            println!(
                "\n* stopped at the time bound ({} s) before {} writes",
                self.plan.max_seconds, self.plan.n
            );
        }
        if rows.iter().any(|r| r.direct_io_refused) {
            println!(
                "! O_DIRECT refused by the file system: measured with buffered writes \
                 (plus fdatasync after each write where the mode is durable)"
            );
        }
        randread::print_footnotes(self.read_rows, &self.plan.reads, self.plan.max_seconds);
        println!("\ninterpretation:");
        for l in &self.notes.lines {
            println!("  {l}");
        }
        println!(
            "(done in {:.0} s; its files are removed)",
            self.started.elapsed().as_secs_f64()
        );
    }
}

pub(crate) fn bar(len: u64, prefix: &str, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>7} [{bar:30}] {msg} {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(prefix.to_string());
    pb.set_message(msg.to_string());
    pb
}

fn row_message(spec: &Spec) -> String {
    format!(
        "{} {} {} KiB x{}{}",
        spec.test.id(),
        spec.mode.label(),
        spec.size / KIB,
        spec.writers,
        if spec.fresh { " fallocated" } else { "" }
    )
}

/// What the threads of a concurrent row share: the barrier they start at (with the
/// thread that watches them), the operations done so far (for the progress bar;
/// randread's readers add theirs in steps) and the flag that asks them to stop.
pub(crate) struct Shared {
    pub barrier: Barrier,
    pub count: AtomicU64,
    pub stop: AtomicBool,
}

impl Shared {
    /// For `threads` threads and their watcher.
    pub(crate) fn new(threads: usize) -> Shared {
        Shared {
            barrier: Barrier::new(threads + 1),
            count: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }
}

/// What a concurrent row's progress bar follows: operations done out of `total`,
/// or the time bound, whichever comes first.
pub(crate) struct Progress<'a> {
    pub bar: &'a ProgressBar,
    pub done: &'a AtomicU64,
    pub total: u64,
    pub max_time: Duration,
}

/// Starts a concurrent row's threads together (`barrier`, which they wait on too),
/// follows them on the progress bar until all are done, asking them to `stop` on
/// Ctrl-C; returns when they started and what each returned.
pub(crate) fn watch_threads<T>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, T>>,
    barrier: &Barrier,
    stop: &AtomicBool,
    progress: &Progress<'_>,
) -> (Instant, Vec<std::thread::Result<T>>) {
    barrier.wait();
    let start = Instant::now();
    while !handles.iter().all(|h| h.is_finished()) {
        if interrupted() {
            stop.store(true, Ordering::Relaxed);
        }
        let done = progress.done.load(Ordering::Relaxed);
        progress
            .bar
            .set_position(permille(done, progress.total, start, progress.max_time));
        std::thread::sleep(Duration::from_millis(50));
    }
    let results = handles.into_iter().map(|h| h.join()).collect();
    (start, results)
}

/// Progress toward whichever bound comes first, in thousandths.
pub(crate) fn permille(done: u64, max: u64, start: Instant, max_time: Duration) -> u64 {
    let by_count = done as f64 / max.max(1) as f64;
    let by_time = start.elapsed().as_secs_f64() / max_time.as_secs_f64();
    (by_count.max(by_time).min(1.0) * 1000.0) as u64
}

fn single_row(
    spec: Spec,
    path: &Path,
    prealloc: Prealloc,
    plan: &Plan,
    label: &str,
) -> Result<Row> {
    let wf = open_for_writes(path, spec.mode)?;
    let mut buf = AlignedBuf::new(spec.size);
    let pb = bar(1000, label, &row_message(&spec));
    let start = Instant::now();
    let mut run = timed_writes(
        &wf,
        &mut buf,
        0,
        plan.file_len,
        plan.n,
        plan.max_time,
        &mut |w| {
            if w % 64 == 0 {
                pb.set_position(permille(w, plan.n, start, plan.max_time));
            }
            !interrupted()
        },
    )?;
    pb.finish_and_clear();
    if interrupted() {
        return Err(DiskBenchError::Interrupted);
    }
    let t = Instant::now();
    wf.sync_all()?;
    let settle_sync_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(Row {
        spec,
        measured: wf.mode,
        direct_io: wf.direct_io,
        direct_io_refused: wf.direct_io_refused,
        prealloc,
        writes: run.writes,
        max_writes: plan.n,
        time_bounded: run.stopped_early,
        seconds: run.seconds,
        lat: summarize(&mut run.latencies_ms),
        settle_sync_ms,
    })
}

/// `spec.writers` threads, each writing its own region of the zero-filled file
/// through its own descriptor; writes/s is the total over the wall time.
fn concurrent_row(
    spec: Spec,
    path: &Path,
    prealloc: Prealloc,
    plan: &Plan,
    label: &str,
) -> Result<Row> {
    let writers = spec.writers.max(1);
    let per_writer = (plan.n / writers as u64).max(1);
    let size = spec.size as u64;
    let region = (plan.file_len / writers as u64) / size * size;
    // Open every descriptor before any thread waits on the barrier.
    let files = (0..writers)
        .map(|_| open_for_writes(path, spec.mode))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let shared = Shared::new(writers);
    let pb = bar(1000, label, &row_message(&spec));
    let (start, results) = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, wf)| {
                let shared = &shared;
                let at = i as u64 * region;
                s.spawn(move || {
                    region_writer(wf, spec.size, (at, region), per_writer, plan, shared)
                })
            })
            .collect();
        let progress = Progress {
            bar: &pb,
            done: &shared.count,
            total: per_writer * writers as u64,
            max_time: plan.max_time,
        };
        watch_threads(handles, &shared.barrier, &shared.stop, &progress)
    });
    pb.finish_and_clear();
    if interrupted() {
        return Err(DiskBenchError::Interrupted);
    }
    let mut merged = merge_writers(start, results)?;
    let t = Instant::now();
    files[0].sync_all()?;
    let settle_sync_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(Row {
        spec,
        measured: files[0].mode,
        direct_io: files[0].direct_io,
        direct_io_refused: files[0].direct_io_refused,
        prealloc,
        writes: merged.writes,
        max_writes: per_writer * writers as u64,
        time_bounded: merged.time_bounded,
        seconds: (merged.end - start).as_secs_f64(),
        lat: summarize(&mut merged.latencies_ms),
        settle_sync_ms,
    })
}

/// One writer thread of a concurrent row: waits for the others, then writes
/// `size` bytes at a time to its region (start, length) until `max_writes`, the
/// time bound, an error elsewhere or Ctrl-C; what it did and when it finished.
fn region_writer(
    wf: &WriteFile,
    size: usize,
    (region_start, region_len): (u64, u64),
    max_writes: u64,
    plan: &Plan,
    shared: &Shared,
) -> (std::result::Result<WriteRun, RawDiskError>, Instant) {
    let mut buf = AlignedBuf::new(size);
    shared.barrier.wait();
    let r = timed_writes(
        wf,
        &mut buf,
        region_start,
        region_len,
        max_writes,
        plan.max_time,
        &mut |_| {
            shared.count.fetch_add(1, Ordering::Relaxed);
            !shared.stop.load(Ordering::Relaxed)
        },
    );
    if r.is_err() {
        shared.stop.store(true, Ordering::Relaxed);
    }
    (r, Instant::now())
}

/// What the writers of a concurrent row did together.
struct MergedWrites {
    writes: u64,
    time_bounded: bool,
    latencies_ms: Vec<f64>,
    /// When the last of them finished.
    end: Instant,
}

type JoinedWriter = std::thread::Result<(std::result::Result<WriteRun, RawDiskError>, Instant)>;

/// The writers' runs added up: writes, latencies, the last end (`start` if none).
fn merge_writers(start: Instant, results: Vec<JoinedWriter>) -> Result<MergedWrites> {
    let mut merged = MergedWrites {
        writes: 0,
        time_bounded: false,
        latencies_ms: Vec::new(),
        end: start,
    };
    for r in results {
        let (run, finished) = r.map_err(|_| DiskBenchError::WriterPanicked)?;
        let run = run?;
        merged.writes += run.writes;
        merged.time_bounded |= run.stopped_early;
        merged.latencies_ms.extend(run.latencies_ms);
        merged.end = merged.end.max(finished);
    }
    Ok(merged)
}

/// Commits of one 16 KiB value written in place plus a 4 KiB record, as a design
/// that writes a large value once (not in the journal, then again at write-back)
/// would make them; a commit's latency is from the first write's start until both
/// are done. The value goes to the first half of the zero-filled file, the record
/// to the second.
fn value_beside_record_row(
    spec: Spec,
    pairing: Pairing,
    path: &Path,
    prealloc: Prealloc,
    plan: &Plan,
    label: &str,
) -> Result<Row> {
    let value_mode = match pairing {
        Pairing::ValueThenRecord => WriteMode::Direct,
        Pairing::BothAtOnce => WriteMode::DirectDsync,
    };
    let value_file = open_for_writes(path, value_mode)?;
    let record_file = open_for_writes(path, WriteMode::DirectDsync)?;
    let layout = ValueBesideRecordLayout::new(plan.file_len, spec.size);
    let mut value = AlignedBuf::new(spec.size);
    let record = AlignedBuf::new(RECORD_BESIDE_VALUE);
    let pb = bar(1000, label, &row_message(&spec));
    let mut commits = Commits::with_room_for(plan.n);
    let handoff = RecordHandoff::new();
    let start = Instant::now();
    let timing = CommitTiming {
        plan,
        start,
        pb: &pb,
    };
    match pairing {
        Pairing::ValueThenRecord => commits.run(&mut value, &layout, &timing, |v, at, i| {
            value_file
                .write_at(v, at)
                .and_then(|()| record_file.write_at(record.bytes(), layout.record_offset(i)))
        })?,
        Pairing::BothAtOnce => std::thread::scope(|s| -> Result<()> {
            let writer = s.spawn(|| handoff.write_records(&record_file, &record, &layout));
            let outcome = commits.run(&mut value, &layout, &timing, |v, at, _| {
                handoff.write_value_beside_record(&value_file, v, at)
            });
            handoff.stop_writer();
            writer.join().map_err(|_| DiskBenchError::WriterPanicked)?;
            outcome
        })?,
    }
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    if interrupted() {
        return Err(DiskBenchError::Interrupted);
    }
    Ok(Row {
        spec,
        measured: record_file.mode,
        direct_io: value_file.direct_io && record_file.direct_io,
        direct_io_refused: value_file.direct_io_refused || record_file.direct_io_refused,
        prealloc,
        writes: commits.count,
        max_writes: plan.n,
        time_bounded: commits.time_bounded,
        seconds,
        lat: summarize(&mut commits.latencies_ms),
        settle_sync_ms: 0.0,
    })
}

/// Where a `ValueBesideRecord` row writes: commit i's value to slot i of the first
/// half of the file, its record to slot i of the second half, each wrapping around.
struct ValueBesideRecordLayout {
    value_bytes: u64,
    value_slots: u64,
    half: u64,
    record_slots: u64,
}

impl ValueBesideRecordLayout {
    fn new(file_len: u64, value_bytes: usize) -> Self {
        let half = file_len / 2;
        ValueBesideRecordLayout {
            value_bytes: value_bytes as u64,
            value_slots: (half / value_bytes as u64).max(1),
            half,
            record_slots: (half / RECORD_BESIDE_VALUE as u64).max(1),
        }
    }
    fn value_offset(&self, commit: u64) -> u64 {
        (commit % self.value_slots) * self.value_bytes
    }
    fn record_offset(&self, commit: u64) -> u64 {
        self.half + (commit % self.record_slots) * RECORD_BESIDE_VALUE as u64
    }
}

/// The bounds and the progress bar of a row of commits.
struct CommitTiming<'a> {
    plan: &'a Plan,
    start: Instant,
    pb: &'a ProgressBar,
}

/// What a row of commits measured.
struct Commits {
    count: u64,
    latencies_ms: Vec<f64>,
    time_bounded: bool,
}

impl Commits {
    /// Made before the clock starts, so that reserving room for the latencies is
    /// not timed.
    fn with_room_for(max_commits: u64) -> Self {
        Commits {
            count: 0,
            latencies_ms: Vec::with_capacity(max_commits.min(1 << 20) as usize),
            time_bounded: false,
        }
    }

    /// Commits until the plan's count or time bound (or Ctrl-C), each timed:
    /// `write_commit(value, value_offset, commit)` makes commit's writes, its number
    /// stamped into the value first so that no two values are alike.
    fn run(
        &mut self,
        value: &mut AlignedBuf,
        layout: &ValueBesideRecordLayout,
        timing: &CommitTiming<'_>,
        mut write_commit: impl FnMut(&[u8], u64, u64) -> std::result::Result<(), RawDiskError>,
    ) -> Result<()> {
        let plan = timing.plan;
        while self.count < plan.n {
            let stamp = self.count.to_le_bytes();
            value.bytes_mut()[..stamp.len()].copy_from_slice(&stamp);
            let value_offset = layout.value_offset(self.count);
            let t = Instant::now();
            write_commit(value.bytes(), value_offset, self.count)?;
            self.latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
            self.count += 1;
            if self.count.is_multiple_of(64) {
                timing
                    .pb
                    .set_position(permille(self.count, plan.n, timing.start, plan.max_time));
            }
            if self.count < plan.n && (timing.start.elapsed() >= plan.max_time || interrupted()) {
                self.time_bounded = true;
                break;
            }
        }
        Ok(())
    }
}

/// `Pairing::BothAtOnce`: a second thread writes commit i's record while `go` and
/// `done` bracket it. It keeps to the barriers after a failure (kept in `error`)
/// and leaves only on `stop`, so neither side waits forever.
struct RecordHandoff {
    go: Barrier,
    done: Barrier,
    stop: AtomicBool,
    error: Mutex<Option<RawDiskError>>,
}

impl RecordHandoff {
    fn new() -> Self {
        RecordHandoff {
            go: Barrier::new(2),
            done: Barrier::new(2),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    /// The record writer's thread: one record per commit until stopped.
    fn write_records(
        &self,
        record_file: &WriteFile,
        record: &AlignedBuf,
        layout: &ValueBesideRecordLayout,
    ) {
        let mut i = 0;
        loop {
            self.go.wait();
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            if let Err(e) = record_file.write_at(record.bytes(), layout.record_offset(i)) {
                self.error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(e);
            }
            self.done.wait();
            i += 1;
        }
    }

    /// One commit on the committing thread: its value written here while the record
    /// writer writes its record; done when both are, failed if either failed.
    fn write_value_beside_record(
        &self,
        value_file: &WriteFile,
        value: &[u8],
        value_offset: u64,
    ) -> std::result::Result<(), RawDiskError> {
        self.go.wait();
        let r = value_file.write_at(value, value_offset);
        self.done.wait();
        r.and_then(|()| {
            let failed = self
                .error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            failed.map_or(Ok(()), Err)
        })
    }

    /// Lets the record writer leave: it is waiting on `go`.
    fn stop_writer(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.go.wait();
    }
}

// ---- the directory and the machine ----

fn nearest_existing(dir: &Path) -> PathBuf {
    let mut p = dir;
    loop {
        if p.as_os_str().is_empty() {
            return PathBuf::from(".");
        }
        if p.exists() {
            return p.to_path_buf();
        }
        match p.parent() {
            Some(q) => p = q,
            None => return PathBuf::from("."),
        }
    }
}

/// The directories `create_dir_all(dir)` would create, deepest first.
fn missing_ancestors(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let mut p = dir;
    while !p.as_os_str().is_empty() && !p.exists() {
        v.push(p.to_path_buf());
        match p.parent() {
            Some(q) => p = q,
            None => break,
        }
    }
    v
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| DiskBenchError::BadArgument(format!("path {} holds a NUL", p.display())))
}

/// Bytes an unprivileged user can still allocate on the file system holding `p`.
fn free_bytes(p: &Path) -> Result<u64> {
    let c = c_path(p)?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(DiskBenchError::Dir {
            op: "statvfs",
            path: p.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[derive(Default)]
struct Facts {
    cores: Option<usize>,
    kernel: Option<String>,
    fs_type: Option<String>,
    fs_magic: Option<u64>,
    mount_point: Option<String>,
    mount_source: Option<String>,
    mount_options: Option<String>,
    block_device: Option<String>,
    write_cache: Option<String>,
    rotational: Option<bool>,
    model: Option<String>,
}

impl Facts {
    fn json(&self) -> Value {
        json!({
            "cores": self.cores,
            "kernel": self.kernel,
            "fs_type": self.fs_type,
            "fs_magic": self.fs_magic.map(|m| format!("{m:#x}")),
            "mount_point": self.mount_point,
            "mount_source": self.mount_source,
            "mount_options": self.mount_options,
            "block_device": self.block_device,
            "write_cache": self.write_cache,
            "rotational": self.rotational,
            "model": self.model,
        })
    }
}

fn fs_name(magic: u64) -> Option<&'static str> {
    Some(match magic {
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0x6573_5546 => "fuse",
        0xCA45_1A4E => "bcachefs",
        0x5346_544E => "ntfs",
        0x4d44 => "vfat",
        _ => return None,
    })
}

/// Cheap facts: cores, kernel, file system, mount options and the block device's
/// write-cache setting; whatever cannot be read is left out.
fn machine_facts(dir: &Path) -> Facts {
    let mut f = Facts {
        cores: machine::cores(),
        kernel: machine::kernel(),
        ..Facts::default()
    };
    if let Ok(c) = c_path(dir) {
        // SAFETY: zeroed out-parameter, NUL-terminated path.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 {
            f.fs_magic = Some((st.f_type as u64) & 0xFFFF_FFFF);
        }
    }
    if let Some(m) = machine::mount_of(dir) {
        f.mount_source = Some(m.source);
        f.mount_point = Some(m.point);
        f.fs_type = Some(m.fs_type);
        f.mount_options = Some(m.options);
    }
    if f.fs_type.is_none() {
        f.fs_type = f.fs_magic.and_then(fs_name).map(str::to_string);
    }
    if let Ok(md) = std::fs::metadata(dir) {
        use std::os::unix::fs::MetadataExt;
        let dev = md.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        if let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) {
            // A partition's queue settings live with its whole disk.
            let disk = if sys.join("queue").exists() {
                Some(sys)
            } else {
                sys.parent()
                    .filter(|p| p.join("queue").exists())
                    .map(Path::to_path_buf)
            };
            if let Some(disk) = disk {
                f.block_device = disk.file_name().map(|n| n.to_string_lossy().into_owned());
                f.write_cache = read_trimmed(disk.join("queue/write_cache"));
                f.rotational = read_trimmed(disk.join("queue/rotational")).map(|r| r == "1");
                f.model = read_trimmed(disk.join("device/model"));
            }
        }
    }
    f
}

// ---- output ----

fn print_header(dir: &Path, f: &Facts, plan: &Plan, free: u64) {
    let or = |o: &Option<String>| o.clone().unwrap_or_else(|| "?".into());
    println!(
        "kiln disk-bench in {} ({} on {}, {}; {} MiB free)",
        dir.display(),
        or(&f.fs_type),
        or(&f.mount_source),
        or(&f.mount_options),
        free / MIB
    );
    println!(
        "machine: {} cores, kernel {}, block device {} (write cache: {}, rotational: {}{})",
        f.cores.map_or("?".into(), |c| c.to_string()),
        or(&f.kernel),
        or(&f.block_device),
        or(&f.write_cache),
        f.rotational.map_or("?", |r| if r { "yes" } else { "no" }),
        f.model
            .as_ref()
            .map_or(String::new(), |m| format!(", model {m}"))
    );
    if !plan.writes {
        return;
    }
    println!(
        "files: {} MiB zero-filled and synced first (every row overwrites already-written \
         blocks, as a recycled journal does), except the 'fallocated' row, which writes into \
         a fresh {} MiB fallocated file (unwritten extents, as a new journal file); each row \
         stops after {} writes or {} s; MB = 10^6 bytes",
        plan.file_len / MIB,
        plan.file_len / MIB,
        plan.n,
        plan.max_time.as_secs_f64()
    );
}

fn print_section(test: Test, plan: &Plan) {
    let title = match test {
        Test::JournalMode => {
            "journal modes: 16 KiB sequential writes (buffered and O_DIRECT alone are not durable)"
                .to_string()
        }
        Test::SingleStream => {
            "single-stream durable writes (O_DIRECT|O_DSYNC), by write size".to_string()
        }
        Test::Concurrent => format!(
            "concurrent durable writers: 16 KiB O_DIRECT|O_DSYNC, each thread its own region \
             and descriptor, {} writes in all at most; writes/s is the total",
            plan.n
        ),
        Test::ValueBesideRecord => "a large value written once: 16 KiB in place plus a 4 KiB \
             journal record per commit; latency until both are durable"
            .to_string(),
    };
    println!("\n{title}");
    println!(
        "  {:<19} {:>8} {:>7} {:<11} {:>8} {:>6} {:>10} {:>9} {:>8} {:>8}",
        "mode",
        "size",
        "writers",
        "prealloc",
        "writes",
        "s",
        "writes/s",
        "MB/s",
        "p50 ms",
        "p99 ms"
    );
}

fn size_label(size: usize) -> String {
    if size >= 1024 * KIB && size.is_multiple_of(1024 * KIB) {
        format!("{} MiB", size / (1024 * KIB))
    } else {
        format!("{} KiB", size / KIB)
    }
}

fn print_row(r: &Row) {
    let mode = format!(
        "{}{}",
        r.spec.pairing.map_or(r.spec.mode.label(), Pairing::label),
        if r.direct_io_refused { "!" } else { "" }
    );
    let writes = format!("{}{}", r.writes, if r.time_bounded { "*" } else { " " });
    let mut line = format!(
        "  {:<19} {:>8} {:>7} {:<11} {:>9} {:>6.2} {:>10.0} {:>9.1} {:>8.3} {:>8.3}",
        mode,
        match r.spec.pairing {
            Some(_) => format!("{}+{}", r.spec.size / KIB, size_label(RECORD_BESIDE_VALUE)),
            None => size_label(r.spec.size),
        },
        r.spec.writers,
        r.prealloc.label(),
        writes,
        r.seconds,
        r.writes_per_sec(),
        r.mb_per_sec(),
        r.lat.p50_ms,
        r.lat.p99_ms
    );
    if !r.measured.durable() {
        line.push_str(&format!("  (then fsync: {:.1} ms)", r.settle_sync_ms));
    }
    println!("{line}");
}

fn memory_backed(f: &Facts) -> bool {
    matches!(f.fs_type.as_deref(), Some("tmpfs" | "ramfs"))
        || f.fs_magic
            .is_some_and(|m| m == 0x0102_1994 || m == 0x8584_58F6)
}

struct Notes {
    lines: Vec<String>,
    lying: bool,
}

/// A few lines on what the rows say about the disk, each from the rows it compares
/// (a line whose rows are missing is left out).
fn interpret(rows: &[Row], read_rows: &[ReadRow], f: &Facts) -> Notes {
    let mut notes = Notes {
        lines: Vec::new(),
        lying: false,
    };
    if let Some(d) = journal_row(rows, Test::JournalMode, WriteMode::DirectDsync, 1, false) {
        let (verdict, lying) = durable_write_verdict(d, f);
        notes.lines.push(verdict);
        notes.lying = lying;
        if let Some(b) = journal_row(rows, Test::JournalMode, WriteMode::Buffered, 1, false) {
            notes.lines.push(durable_vs_buffered(d, b));
        }
    }
    notes.lines.extend(fsync_vs_fdatasync(rows));
    notes.lines.extend(fallocated_vs_written(rows));
    notes.lines.extend(concurrent_writers(rows));
    notes.lines.extend(value_beside_record(rows));
    if rows.iter().any(|r| r.direct_io_refused) {
        notes.lines.push(
            "O_DIRECT was refused here: the figures go through the page cache, and a \
             journal on this file system runs in its fallback mode."
                .to_string(),
        );
    }
    notes
        .lines
        .extend(randread::interpret(read_rows, memory_backed(f)));
    notes
}

/// The row of 16 KiB writes (the journal's size) of a test, mode and writer count.
fn journal_row(
    rows: &[Row],
    test: Test,
    mode: WriteMode,
    writers: usize,
    fresh: bool,
) -> Option<&Row> {
    rows.iter().find(|r| {
        r.spec.test == test
            && r.spec.mode == mode
            && r.spec.size == JOURNAL_WRITE
            && r.spec.writers == writers
            && r.spec.fresh == fresh
    })
}

/// What the durable 16 KiB write's latency says: a memory-backed file system, a
/// disk that may ignore flushes (the `bool`), or the rate one stream of commits
/// can reach.
fn durable_write_verdict(d: &Row, f: &Facts) -> (String, bool) {
    let how = if d.direct_io_refused {
        "pwrite+fdatasync (O_DIRECT refused)"
    } else {
        "O_DIRECT|O_DSYNC"
    };
    let us = d.lat.p50_ms * 1e3;
    if memory_backed(f) {
        let line = format!(
            "{} keeps files in memory: nothing written here survives a power cut or \
             reboot, so the durable rows ({us:.1} us p50 at 16 KiB) measure memory \
             copies, not a disk; run with --dir on the disk that will hold the data.",
            f.fs_type.as_deref().unwrap_or("this file system")
        );
        (line, false)
    } else if d.lat.p50_ms < LYING_P50_MS {
        let line = format!(
            "LYING DISK? a durable 16 KiB {how} write takes {us:.1} us (p50): too fast for a \
             flush to stable media unless the device has a power-loss-protected cache; \
             acknowledged commits may be lost on power failure{}.",
            match f.write_cache.as_deref() {
                Some("write through") =>
                    " (the kernel sees a write-through cache, so it sends no flushes)",
                _ => "",
            }
        );
        (line, true)
    } else {
        let line = format!(
            "a durable 16 KiB {how} write takes {:.3} ms (p50), so one stream of durable \
             commits tops out near {:.0}/s here; not fast enough to show that flushes are \
             ignored{} (only a power-cut test proves they are honoured).",
            d.lat.p50_ms,
            d.writes_per_sec(),
            match f.write_cache.as_deref() {
                Some("write back") => ", and the kernel sends them to a write-back cache",
                Some("write through") => {
                    ", though the kernel sees a write-through cache and sends none"
                }
                _ => "",
            }
        );
        (line, false)
    }
}

/// How far the durable row is from buffered writes: the room a database has between
/// being bound by the disk and being slow itself.
fn durable_vs_buffered(d: &Row, b: &Row) -> String {
    format!(
        "durable vs buffered: {:.0} vs {:.0} writes/s ({:.1}x); a database that is \
         much slower than the durable row is slow itself, one near it is bound by the disk.",
        d.writes_per_sec(),
        b.writes_per_sec(),
        b.writes_per_sec() / d.writes_per_sec().max(1e-9)
    )
}

/// Only when fsync costs clearly more than fdatasync (30 % or more).
fn fsync_vs_fdatasync(rows: &[Row]) -> Option<String> {
    let fs = journal_row(rows, Test::JournalMode, WriteMode::BufferedFsync, 1, false)?;
    let fds = journal_row(
        rows,
        Test::JournalMode,
        WriteMode::BufferedFdatasync,
        1,
        false,
    )?;
    let ratio = fs.lat.p50_ms / fds.lat.p50_ms.max(1e-9);
    (ratio > 1.3).then(|| {
        format!(
            "fsync costs {ratio:.1}x fdatasync per write (metadata flushed too): journals \
             should use fdatasync or O_DSYNC."
        )
    })
}

/// Only when writes into fallocated blocks cost clearly more (30 % or more).
fn fallocated_vs_written(rows: &[Row]) -> Option<String> {
    let fresh = journal_row(rows, Test::SingleStream, WriteMode::DirectDsync, 1, true)?;
    let written = journal_row(rows, Test::SingleStream, WriteMode::DirectDsync, 1, false)?;
    let ratio = fresh.lat.p50_ms / written.lat.p50_ms.max(1e-9);
    (ratio > 1.3).then(|| {
        format!(
            "durable writes into fallocated (unwritten) blocks cost {ratio:.1}x those into \
             already-written ones (each also commits an extent change): reuse zero-filled \
             journal files."
        )
    })
}

/// Whether the disk overlaps concurrent flushes: what decides between group commit
/// and parallel commits.
fn concurrent_writers(rows: &[Row]) -> Option<String> {
    let one = journal_row(rows, Test::Concurrent, WriteMode::DirectDsync, 1, false)?;
    let eight = journal_row(rows, Test::Concurrent, WriteMode::DirectDsync, 8, false)?;
    let scale = eight.writes_per_sec() / one.writes_per_sec().max(1e-9);
    Some(format!(
        "8 concurrent durable writers reach {:.0} writes/s, {scale:.1}x one writer{}.",
        eight.writes_per_sec(),
        if scale < 1.5 {
            ": the disk serialises flushes, so only group commit raises commits/s"
        } else {
            ": the disk overlaps flushes, so parallel commits pay off"
        }
    ))
}

/// Whether writing a large value once, beside a small record, beats carrying it in
/// the journal record (one 16 KiB durable write).
fn value_beside_record(rows: &[Row]) -> Option<String> {
    let paired = |pairing: Pairing| rows.iter().find(|r| r.spec.pairing == Some(pairing));
    let single = journal_row(rows, Test::SingleStream, WriteMode::DirectDsync, 1, false)?;
    let then = paired(Pairing::ValueThenRecord)?;
    let both = paired(Pairing::BothAtOnce)?;
    let best = then.lat.p50_ms.min(both.lat.p50_ms);
    let ratio = best / single.lat.p50_ms.max(1e-9);
    Some(format!(
        "a 16 KiB value written in place beside a 4 KiB record takes {:.3} ms (value, then \
         record) or {:.3} ms (both at once) per commit (p50), {ratio:.2}x one 16 KiB durable \
         write{}",
        then.lat.p50_ms,
        both.lat.p50_ms,
        if ratio > 1.1 {
            ": a second write per commit costs more than carrying the value in the journal \
             record, so large values stay in the journal here"
        } else {
            ": writing large values once, beside a small record, would pay here"
        }
    ))
}
