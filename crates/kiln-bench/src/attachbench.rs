//! W19: one large attachment uploaded to and downloaded from a `kiln serve` child
//! over loopback, against the disk's own sequential speed measured in the same run.
//!
//! - The disk: `size` bytes written to a file in the run's directory the way the
//!   server writes an upload (4 MiB buffered writes, then fdatasync), timed to the
//!   end of the sync; then the file's pages are dropped from the page cache
//!   (`posix_fadvise(DONTNEED)`, clean after the sync) and it is read back in 1 MiB
//!   reads. Those two are the peers.
//! - Upload: `PUT .../attachments/big` with a Content-Length body sent in 1 MiB
//!   writes, timed from the first byte to the answer (which comes after the blob's
//!   fsync and the document's durable commit).
//! - Download: the blob's pages are dropped from the cache too, then `GET` read to
//!   the end (the server hashes the whole body as it streams it).
//! - The server's resident memory is sampled every 5 ms during each: its peak
//!   there, against its resident memory before, shows that memory stays flat.

use crate::httpbench::ServerProcess;
use crate::procstat;
use crate::run::{BenchResult, Run};
use crate::serverbench::fresh_server;
use serde_json::{json, Map};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const CHUNK: usize = 1 << 20;

/// W19 over a file of `mib` MiB (1,024; 64 with `quick`).
pub fn w19(dir: &Path, quick: bool, mib: Option<u64>) -> BenchResult<Run> {
    let size = mib.unwrap_or(if quick { 64 } else { 1024 }) << 20;
    let block = pattern();
    let server = fresh_server(dir)?;
    let (disk_write, disk_read) = disk_peer(dir, size, &block)?;
    let (status, body) =
        crate::httpbench::blocking_request(server.addr, "PUT", "/dbs/bench/docs/files/1", b"{}")?;
    if status != 201 {
        return Err(format!(
            "creating the document: {status} {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    let rss_before = procstat::status_bytes(server.pid(), "VmRSS:")?;
    let path = "/dbs/bench/docs/files/1/attachments/big";
    let (up_seconds, up_rss) = sampled(&server, || upload(&server, path, size, &block))?;
    let blob = blob_file(dir)?;
    drop_cache(&blob)?;
    let (down_seconds, down_rss) = sampled(&server, || download(&server, path, size))?;
    let mb = size as f64 / 1e6;
    let (up, down) = (mb / up_seconds, mb / down_seconds);
    let mut extra = Map::new();
    extra.insert("size_bytes".into(), size.into());
    extra.insert("upload_mb_per_sec".into(), json!(up));
    extra.insert("download_mb_per_sec".into(), json!(down));
    extra.insert("disk_write_mb_per_sec".into(), json!(disk_write));
    extra.insert("disk_read_mb_per_sec".into(), json!(disk_read));
    extra.insert("upload_ratio_to_disk".into(), json!(up / disk_write));
    extra.insert("download_ratio_to_disk".into(), json!(down / disk_read));
    extra.insert("server_rss_before_bytes".into(), rss_before.into());
    extra.insert("server_peak_rss_upload_bytes".into(), up_rss.into());
    extra.insert("server_peak_rss_download_bytes".into(), down_rss.into());
    Ok(Run {
        ops: 2,
        commits: 1,
        seconds: up_seconds + down_seconds,
        extra,
    })
}

/// 1 MiB of pseudo-random bytes (xorshift), repeated to make the file.
fn pattern() -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..CHUNK)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The disk's sequential write (to the end of the fdatasync) and cold read, MB/s.
fn disk_peer(dir: &Path, size: u64, block: &[u8]) -> BenchResult<(f64, f64)> {
    let path = dir.join("w19-disk-peer");
    let start = Instant::now();
    {
        let file = std::fs::File::create(&path)?;
        let mut w = std::io::BufWriter::with_capacity(4 << 20, file);
        let mut left = size;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            w.write_all(&block[..n])?;
            left -= n as u64;
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_data()?;
    }
    let write = size as f64 / 1e6 / start.elapsed().as_secs_f64();
    drop_cache(&path)?;
    let start = Instant::now();
    let mut f = std::fs::File::open(&path)?;
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let read = got as f64 / 1e6 / start.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok((write, read))
}

/// Drops a file's clean pages from the page cache, so that it is read from the disk.
fn drop_cache(path: &Path) -> BenchResult<()> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path)?;
    // SAFETY: a valid descriptor for the call's duration; advice only.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!("posix_fadvise on {}: error {rc}", path.display()).into());
    }
    Ok(())
}

/// The one blob of the bench database.
fn blob_file(dir: &Path) -> BenchResult<std::path::PathBuf> {
    let root = dir.join("databases/bench/attachments");
    for e in std::fs::read_dir(&root)? {
        let e = e?;
        if e.file_name().len() == 2 {
            if let Some(f) = std::fs::read_dir(e.path())?.next() {
                return Ok(f?.path());
            }
        }
    }
    Err(format!("no blob under {}", root.display()).into())
}

/// Runs `f`, sampling the server's resident memory every 5 ms: the seconds `f`
/// took and the largest sample.
fn sampled(
    server: &ServerProcess,
    f: impl FnOnce() -> BenchResult<f64>,
) -> BenchResult<(f64, u64)> {
    let pid = server.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(rss) = procstat::status_bytes(pid, "VmRSS:") {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
    };
    let result = f();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    Ok((result?, peak.load(Ordering::Relaxed)))
}

/// Raw HTTP on purpose (also in `download`): what is timed is the server's transfer,
/// with no client library's buffering or copies in it.
fn upload(server: &ServerProcess, path: &str, size: u64, block: &[u8]) -> BenchResult<f64> {
    let mut s = TcpStream::connect(server.addr)?;
    let start = Instant::now();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nhost: kiln\r\ncontent-type: application/octet-stream\r\n\
         content-length: {size}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes())?;
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        s.write_all(&block[..n])?;
        left -= n as u64;
    }
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let seconds = start.elapsed().as_secs_f64();
    if !answer.starts_with(b"HTTP/1.1 201") {
        return Err(format!("upload: {}", String::from_utf8_lossy(&answer)).into());
    }
    Ok(seconds)
}

fn download(server: &ServerProcess, path: &str, size: u64) -> BenchResult<f64> {
    let mut s = TcpStream::connect(server.addr)?;
    let start = Instant::now();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: kiln\r\nconnection: close\r\n\r\n"
    )?;
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    let mut head: Vec<u8> = Vec::new();
    let mut body_started = false;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if body_started {
            got += n as u64;
            continue;
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            if !head.starts_with(b"HTTP/1.1 200") {
                return Err(format!("download: {}", String::from_utf8_lossy(&head)).into());
            }
            got += (head.len() - at - 4) as u64;
            body_started = true;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if got != size {
        return Err(format!("download: {got} bytes of {size}").into());
    }
    Ok(seconds)
}
