//! W14 (issue 18): backup and restore of a generated database against the disk's
//! sequential speed measured in the same run, and W8 while a backup runs.
//!
//! 1. The disk: a file written sequentially (4 MiB writes, then fdatasync, timed
//!    together) and read back after `posix_fadvise(DONTNEED)` dropped it from the
//!    page cache.
//! 2. A database of `--w14-gib` GiB of ~1 KiB documents, streamed to the bulk
//!    endpoint of a `kiln serve` child (W10's generator).
//! 3. A full backup over HTTP without a chain (`kiln backup` without `--chain`: verified
//!    as it arrives, written, synced), timed; the file is dropped from the page
//!    cache and restored offline (`kiln_docs::restore_database`, what `kiln restore
//!    --data-dir` calls), timed; then the first read of the restored database, its
//!    files dropped from the page cache first: (a) in-process, `DocStore::open` +
//!    `database` + one `get`; (b) a `kiln serve` child started on it until its first
//!    GET of a document answers (its /health is polled every 50 ms).
//! 4. W8 (new 1 KiB documents, PUT per request) on the server holding the data,
//!    without a backup, then while a second full backup streams (started on a
//!    thread just before); the share of W8's time the backup overlapped is reported.

use crate::httpbench::{self, ServerProcess};
use crate::rawdisk;
use crate::run::{BenchResult, Run};
use crate::serverbench::{fresh_server, w8_load, ServerLoad};
use crate::streambench;
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The payload of W14's documents: NDJSON lines of ~1 KiB (a document ~1,000 bytes).
const PAYLOAD: usize = 880;
/// Bytes of a generated NDJSON line, for the document count of a size.
const LINE_BYTES: f64 = 1024.0;
const MB: f64 = 1e6;

/// Drops a file's pages from the page cache (they must be clean: written back).
fn drop_from_cache(path: &Path) -> BenchResult<()> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.sync_all()
        .map_err(|e| format!("syncing {}: {e}", path.display()))?;
    // SAFETY: an open descriptor; offset 0 and length 0 mean the whole file.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!("posix_fadvise(DONTNEED) on {}: error {rc}", path.display()).into());
    }
    Ok(())
}

/// Every regular file under `dir`.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) -> BenchResult<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry?;
        let t = entry.file_type()?;
        if t.is_dir() {
            files_under(&entry.path(), out)?;
        } else if t.is_file() {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// Bytes allocated on disk by a database's files (under `dir`) but its journal (its
/// files are preallocated, and a backup does not read them): what a backup reads.
fn disk_bytes(dir: &Path) -> BenchResult<u64> {
    let mut files = Vec::new();
    files_under(dir, &mut files)?;
    let mut total = 0;
    for f in files {
        if f.strip_prefix(dir).is_ok_and(|p| p.starts_with("journal")) {
            continue;
        }
        total += std::fs::metadata(&f)
            .map_err(|e| format!("{}: {e}", f.display()))?
            .blocks()
            * 512;
    }
    Ok(total)
}

/// Every file under `dir`: {relative path: [apparent bytes, allocated bytes]}.
fn file_sizes(dir: &Path) -> BenchResult<Value> {
    let mut files = Vec::new();
    files_under(dir, &mut files)?;
    let mut m = Map::new();
    for f in files {
        let md = std::fs::metadata(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let name = f.strip_prefix(dir).unwrap_or(&f).display().to_string();
        m.insert(name, json!([md.len(), md.blocks() * 512]));
    }
    Ok(Value::Object(m))
}

fn drop_dir_from_cache(dir: &Path) -> BenchResult<()> {
    let mut files = Vec::new();
    files_under(dir, &mut files)?;
    for f in files {
        drop_from_cache(&f)?;
    }
    Ok(())
}

/// The disk's sequential speed in MB/s.
struct SeqDisk {
    write: f64,
    /// Buffered, after DONTNEED: how a backup file is read by a restore.
    read: f64,
    /// With O_DIRECT (None if the file system refuses it): a cross-check.
    read_direct: Option<f64>,
}

/// Reads `path` to its end in `buf`-sized reads: bytes read.
fn read_through(f: &mut File, buf: &mut [u8], path: &Path) -> BenchResult<u64> {
    let mut read = 0u64;
    loop {
        let n = f
            .read(buf)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            return Ok(read);
        }
        read += n as u64;
    }
}

/// Sequential write (4 MiB writes + fdatasync, timed together) and read (after
/// DONTNEED; then again with O_DIRECT) of a file of `bytes`.
fn sequential_disk(path: &Path, bytes: u64) -> BenchResult<SeqDisk> {
    let _cleanup = rawdisk::RemoveOnDrop(path.to_path_buf());
    let block = 4usize << 20;
    // Not zeros, not compressible: a file system that compresses would flatter it.
    let mut buf = rawdisk::AlignedBuf::new(block);
    let blocks = bytes.div_ceil(block as u64);
    let mut f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let start = Instant::now();
    for i in 0..blocks {
        buf.bytes_mut()[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(buf.bytes())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    f.sync_data()
        .map_err(|e| format!("syncing {}: {e}", path.display()))?;
    let write_s = start.elapsed().as_secs_f64();
    drop(f);
    let total = blocks * block as u64;
    let mb_s = |s: f64| total as f64 / MB / s.max(1e-9);

    drop_from_cache(path)?;
    let mut f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let start = Instant::now();
    let read = read_through(&mut f, buf.bytes_mut(), path)?;
    let read_s = start.elapsed().as_secs_f64();
    if read != total {
        return Err(format!("read {read} of the {total} bytes written").into());
    }
    drop(f);

    drop_from_cache(path)?;
    let read_direct = {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(mut f) => {
                let start = Instant::now();
                let read = read_through(&mut f, buf.bytes_mut(), path)?;
                let s = start.elapsed().as_secs_f64();
                (read == total).then(|| mb_s(s))
            }
            Err(_) => None,
        }
    };
    Ok(SeqDisk {
        write: mb_s(write_s),
        read: mb_s(read_s),
        read_direct,
    })
}

/// `kiln backup`'s and `kiln restore`'s own code, which W14 measures: it lives in
/// kiln-cli, which this crate cannot depend on, so `kiln bench` hands it in.
#[derive(Clone, Copy)]
pub struct BackupTool {
    /// A full backup without a chain of database `bench` of the server at the
    /// address into the file (written as `FILE.partial`, verified as it arrives,
    /// synced, renamed: `kiln backup --url` without `--chain`).
    pub http_backup: fn(SocketAddr, &Path) -> BenchResult<BackupFigures>,
    /// A backup file opened as `kiln restore` reads it.
    pub open_backup: fn(&Path) -> BenchResult<kiln_docs::RestoreSource<'static>>,
}

/// What a full backup reported.
pub struct BackupFigures {
    pub data_bytes: u64,
    pub file_bytes: u64,
    pub documents: u64,
}

/// What one full backup over HTTP took.
struct HttpBackup {
    figures: BackupFigures,
    started: Instant,
    finished: Instant,
}

impl HttpBackup {
    fn seconds(&self) -> f64 {
        (self.finished - self.started).as_secs_f64()
    }
}

/// A full backup of `bench` without a chain over HTTP into `out`, timed.
fn http_backup(tool: BackupTool, addr: SocketAddr, out: &Path) -> BenchResult<HttpBackup> {
    let started = Instant::now();
    let figures = (tool.http_backup)(addr, out)?;
    let finished = Instant::now();
    Ok(HttpBackup {
        figures,
        started,
        finished,
    })
}

/// W14: see the module's documentation. `gib` is the generated data's size.
pub fn w14(dir: &Path, gib: f64, load: ServerLoad, tool: BackupTool) -> BenchResult<Run> {
    let workload_start = Instant::now();
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let mut extra = Map::new();

    // 1. The disk.
    let slower_disk_mb_s = measure_sequential_disk(dir, gib, &mut extra)?;

    // 2. The data.
    let documents = ((gib * (1u64 << 30) as f64) / LINE_BYTES).max(1.0) as u64;
    let data_dir = dir.join("data");
    let server = generate_data(&data_dir, documents, &mut extra)?;
    let setup = BackupSetup {
        tool,
        server: &server,
        db_dir: data_dir.join("databases").join("bench"),
        documents,
        slower_disk_mb_s,
    };

    // 3. Backup, restore, first read.
    let full = dir.join("full.kbak");
    let backup = backup_over_http(&setup, &full, &mut extra)?;
    let restored = dir.join("restored");
    restore_offline(&setup, &full, &restored, &backup, &mut extra)?;
    let probe = format!("items/{:09}", documents / 2);
    first_read_in_process(&restored, &probe, &mut extra)?;
    first_read_from_server(&restored, &probe, &mut extra)?;
    std::fs::remove_dir_all(&restored)?;

    // 4. W8 without, then during a backup.
    let w8 = w8_without_then_during_backup(&setup, load, &dir.join("during.kbak"))?;
    w8.insert_figures(&mut extra);
    drop(server);
    std::fs::remove_dir_all(dir)?;
    extra.insert(
        "workload_seconds".into(),
        json!(workload_start.elapsed().as_secs_f64()),
    );
    Ok(Run {
        ops: documents,
        commits: 1,
        seconds: backup.seconds(),
        extra,
    })
}

/// What W14's steps after the data's generation share.
struct BackupSetup<'a> {
    tool: BackupTool,
    /// The server holding the generated data.
    server: &'a ServerProcess,
    /// The database's files, under the server's data directory.
    db_dir: PathBuf,
    documents: u64,
    /// The slower of the disk's sequential write and read, in MB/s: what the
    /// backup's and the restore's speeds are held against (goal >= 0.7x of it).
    slower_disk_mb_s: f64,
}

/// Step 1: the disk's sequential speeds, on a file of 1 GiB, or of the data's size
/// if smaller (64 MiB at least). Returns the slower of write and read, in MB/s.
fn measure_sequential_disk(
    dir: &Path,
    gib: f64,
    extra: &mut Map<String, Value>,
) -> BenchResult<f64> {
    let disk_file_bytes = ((gib * (1u64 << 30) as f64) as u64).clamp(64 << 20, 1 << 30);
    let disk = sequential_disk(&dir.join("seq.bin"), disk_file_bytes)?;
    extra.insert("disk_file_bytes".into(), json!(disk_file_bytes));
    extra.insert("disk_seq_write_mb_per_s".into(), json!(disk.write));
    extra.insert("disk_seq_read_mb_per_s".into(), json!(disk.read));
    extra.insert(
        "disk_seq_read_direct_mb_per_s".into(),
        json!(disk.read_direct),
    );
    Ok(disk.write.min(disk.read))
}

/// Step 2: a server on `data_dir` holding `documents` generated documents of
/// ~1 KiB, streamed to its bulk endpoint.
fn generate_data(
    data_dir: &Path,
    documents: u64,
    extra: &mut Map<String, Value>,
) -> BenchResult<ServerProcess> {
    let server = fresh_server(data_dir)?;
    let bulk = streambench::bulk_insert_sized(&server, documents, PAYLOAD, "W14 data")?;
    extra.insert("documents".into(), json!(documents));
    extra.insert(
        "generate_docs_per_sec".into(),
        json!(documents as f64 / bulk.seconds),
    );
    Ok(server)
}

/// Step 3a: a full backup over HTTP into `full`, timed, against the database's size
/// on disk and the disk's speed.
fn backup_over_http(
    setup: &BackupSetup<'_>,
    full: &Path,
    extra: &mut Map<String, Value>,
) -> BenchResult<HttpBackup> {
    // Best effort: pages the server has mapped stay in the page cache.
    drop_dir_from_cache(&setup.db_dir)?;
    let b = http_backup(setup.tool, setup.server.addr, full)?;
    if b.figures.documents != setup.documents {
        return Err(format!(
            "the backup holds {} of {} documents",
            b.figures.documents, setup.documents
        )
        .into());
    }
    let database_bytes = disk_bytes(&setup.db_dir)?;
    let backup_s = b.seconds();
    extra.insert("database_disk_bytes".into(), json!(database_bytes));
    extra.insert("database_files".into(), file_sizes(&setup.db_dir)?);
    extra.insert("backup_data_bytes".into(), json!(b.figures.data_bytes));
    extra.insert("backup_file_bytes".into(), json!(b.figures.file_bytes));
    extra.insert("backup_seconds".into(), json!(backup_s));
    let backup_db_mb_s = database_bytes as f64 / MB / backup_s;
    let backup_data_mb_s = b.figures.data_bytes as f64 / MB / backup_s;
    let backup_file_mb_s = b.figures.file_bytes as f64 / MB / backup_s;
    extra.insert("backup_database_mb_per_s".into(), json!(backup_db_mb_s));
    extra.insert("backup_data_mb_per_s".into(), json!(backup_data_mb_s));
    extra.insert("backup_file_mb_per_s".into(), json!(backup_file_mb_s));
    extra.insert(
        "backup_ratio_to_slower_disk".into(),
        json!(backup_db_mb_s / setup.slower_disk_mb_s),
    );
    extra.insert(
        "backup_data_ratio_to_slower_disk".into(),
        json!(backup_data_mb_s / setup.slower_disk_mb_s),
    );
    Ok(b)
}

/// Step 3b: the backup file, dropped from the page cache, restored offline into
/// `restored` as `kiln restore --data-dir` does, timed; the file is removed after.
fn restore_offline(
    setup: &BackupSetup<'_>,
    full: &Path,
    restored: &Path,
    backup: &HttpBackup,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    drop_from_cache(full)?;
    let start = Instant::now();
    let source = (setup.tool.open_backup)(full)?;
    let report = kiln_docs::restore_database(
        source,
        restored,
        "bench",
        crate::querybench::docs_options().storage,
        false,
        kiln_docs::RestorePoint::Latest,
        |_| {},
    )?;
    let restore_s = start.elapsed().as_secs_f64();
    std::fs::remove_file(full).map_err(|e| format!("{}: {e}", full.display()))?;
    let restored_db_dir = restored.join("databases").join("bench");
    let restored_bytes = disk_bytes(&restored_db_dir)?;
    extra.insert("restored_files".into(), file_sizes(&restored_db_dir)?);
    let restore_db_mb_s = restored_bytes as f64 / MB / restore_s;
    let restore_file_mb_s = report.bytes_read as f64 / MB / restore_s;
    extra.insert("restore_seconds".into(), json!(restore_s));
    extra.insert("restored_disk_bytes".into(), json!(restored_bytes));
    extra.insert("restore_database_mb_per_s".into(), json!(restore_db_mb_s));
    extra.insert("restore_file_mb_per_s".into(), json!(restore_file_mb_s));
    let restore_data_mb_s = backup.figures.data_bytes as f64 / MB / restore_s;
    extra.insert("restore_data_mb_per_s".into(), json!(restore_data_mb_s));
    extra.insert(
        "restore_data_ratio_to_slower_disk".into(),
        json!(restore_data_mb_s / setup.slower_disk_mb_s),
    );
    extra.insert(
        "restore_ratio_to_slower_disk".into(),
        json!(restore_db_mb_s / setup.slower_disk_mb_s),
    );
    Ok(())
}

/// Step 3c: the restored database's first read in-process (open, database, one
/// get), its files dropped from the page cache first so that the read meets the disk.
fn first_read_in_process(
    restored: &Path,
    probe: &str,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    drop_dir_from_cache(restored)?;
    let start = Instant::now();
    let store = kiln_docs::DocStore::open(restored, crate::querybench::docs_options())?;
    let db = store.database("bench")?;
    if db.get(probe)?.is_none() {
        return Err(format!("{probe} is missing from the restored database").into());
    }
    extra.insert(
        "first_read_in_process_ms".into(),
        json!(start.elapsed().as_secs_f64() * 1e3),
    );
    drop(db);
    store.close()?;
    Ok(())
}

/// Step 3d: a `kiln serve` child started on the restored database until its first
/// GET of a document answers, its files dropped from the page cache first.
fn first_read_from_server(
    restored: &Path,
    probe: &str,
    extra: &mut Map<String, Value>,
) -> BenchResult<()> {
    drop_dir_from_cache(restored)?;
    let start = Instant::now();
    // The run's serve flags (an encrypted run's key among them).
    let flags: Vec<&str> = crate::serverbench::SERVE_FLAGS
        .get()
        .map(|f| f.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let restored_server = ServerProcess::start_with(restored, &flags)?;
    let (status, body) = httpbench::blocking_request(
        restored_server.addr,
        "GET",
        &format!("/dbs/bench/docs/{probe}"),
        b"",
    )?;
    if status != 200 {
        return Err(format!(
            "GET {probe} of the restored server: {status} {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    extra.insert(
        "first_read_server_ms".into(),
        json!(start.elapsed().as_secs_f64() * 1e3),
    );
    Ok(())
}

/// Step 4's runs: W8 alone, then W8 while a full backup streams.
struct W8BesideBackup {
    plain: Run,
    busy: Run,
    backup: HttpBackup,
    w8_started: Instant,
    w8_finished: Instant,
}

/// Step 4: W8 without a backup, then while a full backup into `during_file` runs
/// on a thread; the file is removed after.
fn w8_without_then_during_backup(
    setup: &BackupSetup<'_>,
    load: ServerLoad,
    during_file: &Path,
) -> BenchResult<W8BesideBackup> {
    let server = setup.server;
    let plain = w8_load(server, load, "w14a", "W8")?;
    let (tool, addr, out) = (setup.tool, server.addr, during_file.to_path_buf());
    let backup_thread =
        std::thread::spawn(move || http_backup(tool, addr, &out).map_err(|e| e.to_string()));
    // Let the backup take its snapshot and start streaming.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let w8_started = Instant::now();
    let busy = w8_load(server, load, "w14b", "W8+bkp")?;
    let w8_finished = Instant::now();
    let backup = backup_thread
        .join()
        .map_err(|_| "the backup thread panicked")??;
    std::fs::remove_file(during_file).map_err(|e| format!("{}: {e}", during_file.display()))?;
    Ok(W8BesideBackup {
        plain,
        busy,
        backup,
        w8_started,
        w8_finished,
    })
}

impl W8BesideBackup {
    /// W8's rates and p99s without and during the backup, and how much of W8's
    /// time the backup overlapped: a backup that ended early slowed less of W8.
    fn insert_figures(&self, extra: &mut Map<String, Value>) {
        let (plain, busy, during) = (&self.plain, &self.busy, &self.backup);
        let overlap_s = (during.finished.min(self.w8_finished))
            .saturating_duration_since(during.started.max(self.w8_started))
            .as_secs_f64();
        let w8_s = (self.w8_finished - self.w8_started).as_secs_f64();
        let rate = |r: &Run| {
            r.extra
                .get("requests_per_sec")
                .cloned()
                .unwrap_or(Value::Null)
        };
        extra.insert("w8_requests".into(), json!(plain.ops));
        extra.insert("w8_without_backup_requests_per_sec".into(), rate(plain));
        extra.insert("w8_during_backup_requests_per_sec".into(), rate(busy));
        extra.insert(
            "w8_ratio_during_backup".into(),
            json!(busy.ops_per_sec() / plain.ops_per_sec()),
        );
        for (k, r) in [("without", plain), ("during", busy)] {
            extra.insert(
                format!("w8_{k}_backup_p99_us"),
                r.extra.get("p99_us").cloned().unwrap_or(Value::Null),
            );
        }
        extra.insert(
            "w8_backup_overlap_fraction".into(),
            json!((overlap_s / w8_s).min(1.0)),
        );
        extra.insert(
            "backup_finished_before_w8".into(),
            json!(during.finished < self.w8_finished),
        );
        extra.insert("backup_during_w8_seconds".into(), json!(during.seconds()));
        extra.insert(
            "backup_during_w8_data_mb_per_s".into(),
            json!(during.figures.data_bytes as f64 / MB / during.seconds()),
        );
    }
}

/// The lines `kiln bench` prints for W14.
pub fn report(label: &str, m: &Run) {
    let f = |k: &str| m.extra.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let gib = |k: &str| f(k) / (1u64 << 30) as f64;
    let slower = f("disk_seq_write_mb_per_s").min(f("disk_seq_read_mb_per_s"));
    println!(
        "         {label}: disk sequential write {:.0} MB/s, read {:.0} MB/s (O_DIRECT {:.0}; slower \
         of write and read {slower:.0}); \
         database {:.2} GiB on disk without its journal ({:.0} documents of ~1 KiB, {:.2} GiB of \
         keys and values; generated at {:.0}/s)",
        f("disk_seq_write_mb_per_s"),
        f("disk_seq_read_mb_per_s"),
        f("disk_seq_read_direct_mb_per_s"),
        gib("database_disk_bytes"),
        f("documents"),
        gib("backup_data_bytes"),
        f("generate_docs_per_sec"),
    );
    println!(
        "         {label}: full backup over HTTP {:.1} s: {:.0} MB/s of the database = {:.2}x the slower \
         disk speed (goal >= 0.7x); {:.0} MB/s of keys and values ({:.2}x), {:.0} MB/s of file \
         ({:.2} GiB, lz4)",
        f("backup_seconds"),
        f("backup_database_mb_per_s"),
        f("backup_ratio_to_slower_disk"),
        f("backup_data_mb_per_s"),
        f("backup_data_ratio_to_slower_disk"),
        f("backup_file_mb_per_s"),
        gib("backup_file_bytes"),
    );
    println!(
        "         {label}: restore (offline, file not cached) {:.1} s: {:.0} MB/s of the restored database \
         = {:.2}x the slower disk speed (goal >= 0.7x); {:.0} MB/s of keys and values ({:.2}x), \
         {:.0} MB/s of file; first read after it (caches dropped): in-process open+get {:.0} ms, \
         `kiln serve` start to first GET {:.0} ms",
        f("restore_seconds"),
        f("restore_database_mb_per_s"),
        f("restore_ratio_to_slower_disk"),
        f("restore_data_mb_per_s"),
        f("restore_data_ratio_to_slower_disk"),
        f("restore_file_mb_per_s"),
        f("first_read_in_process_ms"),
        f("first_read_server_ms"),
    );
    println!(
        "         {label}: W8 {:.0} PUTs/s without a backup, {:.0} during one: {:.2}x (goal >= 0.8x); \
         the backup overlapped {:.0} % of W8's time{} (p99 {:.0} us vs {:.0} us)",
        f("w8_without_backup_requests_per_sec"),
        f("w8_during_backup_requests_per_sec"),
        f("w8_ratio_during_backup"),
        f("w8_backup_overlap_fraction") * 100.0,
        if m.extra.get("backup_finished_before_w8") == Some(&Value::Bool(true)) {
            " (the backup finished first)"
        } else {
            ""
        },
        f("w8_during_backup_p99_us"),
        f("w8_without_backup_p99_us"),
    );
}
