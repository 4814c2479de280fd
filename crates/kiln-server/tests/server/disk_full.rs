//! Disk full end to end (issue 15). On a real, small file system (a tmpfs mounted by
//! the test; skipped with a printed reason where mounting is not permitted): PUTs
//! until the disk is full answer 507 `disk_full` naming a file, never 500; once a
//! filler file is deleted, a small PUT succeeds without a restart and every
//! acknowledged document is there. And with an injected failing disk (a tmpfs cannot
//! be made to fail an fsync): a failed journal write latches the database, which the
//! answers (503 `database_failed`, or 507 if it was out of space) and `/health`
//! report as needing a restart.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{client, expect_error, Harness};
use kiln_storage::io::{ForwardFile, ForwardVfs, OpenMode, OsVfs, Vfs, VfsFile};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::io;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// A tmpfs of `size_mb` MiB, unmounted on drop.
struct Tmpfs {
    point: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mb: u64) -> Result<Tmpfs, String> {
        let point = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(point.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs refused ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { point })
    }
    fn path(&self) -> &Path {
        self.point.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.point.path()).status();
    }
}

/// A ~200 KB document that does not compress (the journal compresses records).
fn big_doc(i: u32) -> Value {
    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ u64::from(i);
    let text: String = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    json!({"n": i, "text": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_507_and_writes_resume_once_space_is_back() {
    let fs = match Tmpfs::mount(24) {
        Ok(fs) => fs,
        Err(why) => {
            println!("SKIPPED: needs a small file system made by the test: {why}");
            return;
        }
    };
    // Space to give back later, on the same file system.
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![1u8; 6 << 20]).unwrap();
    let data = tempfile::Builder::new().tempdir_in(fs.path()).unwrap();
    // Write-back keeps up with the writes (as it does at a real pace: a 400 MB disk
    // takes longer to fill than one sync interval), so the journal stays short.
    let h = Harness::start_in(data, |c| {
        c.docs.storage.sync_interval_ms = 20;
        c.docs.storage.sync_after_bytes = 1 << 20;
        c.docs.storage.write_back_window_bytes = 1 << 20;
    })
    .await;
    h.create_db("full").await;

    let mut acked = Vec::new();
    let mut full = None;
    for i in 0..400u32 {
        let r = h.put("full", &format!("doc{i}"), &big_doc(i)).await;
        match r.status().as_u16() {
            200 | 201 => acked.push(i),
            _ => {
                full = Some(r);
                break;
            }
        }
    }
    let r = full.expect("24 MiB should fill up with 400 documents of 200 KB");
    let body = expect_error(r, 507, "disk_full").await;
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains(&fs.path().display().to_string())
            && (message.contains("journal") || message.contains("data.kiln")),
        "the message should name the file: {message}"
    );
    assert!(body.get("needs_restart").is_none(), "{body}");
    assert!(acked.len() > 20, "only {} documents fit", acked.len());
    println!(
        "{} documents of 200 KB acknowledged before: {message}",
        acked.len()
    );
    // Still full: a small write is refused the same way, not with a 500.
    let r = h.put("full", "small", &json!({"a": 1})).await;
    let status = r.status().as_u16();
    if status != 201 {
        expect_error(r, 507, "disk_full").await;
    }
    // Not latched: /health does not ask for a restart.
    let (status, text) = h.get_text("/health").await;
    assert_eq!(status, StatusCode::OK, "{text}");

    std::fs::remove_file(&filler).unwrap();
    // Space is back: a small write succeeds at once, without a restart.
    let r = h.put("full", "after", &json!({"x": 7})).await;
    let status = r.status();
    let text = r.text().await.unwrap();
    assert!(
        status == StatusCode::CREATED,
        "a small PUT after space came back: {status} {text}"
    );
    assert_eq!(h.get_json("full", "after").await["x"], 7);
    for &i in &acked {
        let doc = h.get_json("full", &format!("doc{i}")).await;
        assert_eq!(doc["n"], i, "doc{i}");
        assert_eq!(doc["text"], big_doc(i)["text"], "doc{i}");
    }
    // More big documents fit again too (write-back resumes, the journal recycles).
    for i in 1000..1005u32 {
        h.put_ok("full", &format!("doc{i}"), &big_doc(i)).await;
    }
    let (status, text) = h.get_text("/health").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let dir = h.shutdown().await;
    drop(dir);
}

/// Fails writes to journal records with an OS error while set.
struct FailingJournal {
    error: Arc<AtomicU64>,
}

struct FailingFile {
    inner: Box<dyn VfsFile>,
    journal: bool,
    error: Arc<AtomicU64>,
}

impl ForwardFile for FailingFile {
    fn inner(&self) -> &dyn VfsFile {
        self.inner.as_ref()
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let code = self.error.load(SeqCst) as i32;
        if self.journal && code != 0 {
            return Err(io::Error::from_raw_os_error(code));
        }
        self.inner.write_all_at(buf, offset)
    }
}

impl ForwardVfs for FailingJournal {
    fn inner(&self) -> &dyn Vfs {
        &OsVfs
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        Ok(Box::new(FailingFile {
            inner: OsVfs.open(path, mode)?,
            journal: name.starts_with("journal-") && name.ends_with(".log"),
            error: self.error.clone(),
        }))
    }
}

/// Starts a server whose journal writes fail with `code` once `arm` is called.
async fn latch_with(code: i32) -> (Harness, Value) {
    let error = Arc::new(AtomicU64::new(0));
    let vfs = Arc::new(FailingJournal {
        error: error.clone(),
    });
    let h = Harness::start_with(move |c| c.docs.storage.vfs = vfs).await;
    h.create_db("ok").await;
    h.create_db("bad").await;
    h.put_ok("bad", "before", &json!({"a": 1})).await;
    error.store(code as u64, SeqCst);
    let r = h.put("bad", "during", &json!({"a": 2})).await;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    error.store(0, SeqCst);
    assert_eq!(body["needs_restart"], true, "{status} {body}");
    assert!(
        body["message"].as_str().unwrap().contains("restart"),
        "{body}"
    );
    // Later writes say the same; a write to another database is unaffected.
    let r = h.put("bad", "after", &json!({"a": 3})).await;
    let later: Value = r.json().await.unwrap();
    assert_eq!(later["error"], body["error"], "{later}");
    assert_eq!(later["needs_restart"], true, "{later}");
    // (The "ok" database shares the failing VFS, but its journal is not written.)
    h.put_ok("ok", "x", &json!({"b": 1})).await;
    assert_eq!(h.get_json("bad", "before").await["a"], 1);
    // /health names the database that needs a restart.
    let r = client().get(h.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let health: Value = r.json().await.unwrap();
    assert_eq!(health["status"], "needs_restart", "{health}");
    let listed = health["needs_restart"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{health}");
    assert_eq!(listed[0]["database"], "bad", "{health}");
    assert_eq!(status, body_status(&body), "{body}");
    (
        h,
        json!({"first": body, "health": health, "status": status}),
    )
}

/// Stops a server one of whose databases latched: closing that database reports the
/// latch (its journal is replayed on the next open), so the shutdown's result is an
/// error, which is expected here.
async fn stop_latched(h: Harness) -> tempfile::TempDir {
    let Harness { dir, server, .. } = h;
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), server.shutdown())
        .await
        .expect("shutdown finishes within its grace period");
    assert!(r.is_err(), "closing a latched database should report it");
    dir
}

fn body_status(body: &Value) -> u16 {
    match body["error"].as_str() {
        Some("disk_full") => 507,
        Some("database_failed") => 503,
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_write_latches_and_says_a_restart_is_needed() {
    let (h, seen) = latch_with(libc::EIO).await;
    assert_eq!(seen["status"], 503, "{seen}");
    assert_eq!(seen["first"]["error"], "database_failed", "{seen}");
    assert_eq!(seen["health"]["needs_restart"][0]["kind"], "io_error");
    // A restart reopens the database from its journal: writes work again.
    let dir = stop_latched(h).await;
    let h = Harness::start_in(dir, |_| {}).await;
    h.put_ok("bad", "after-restart", &json!({"a": 4})).await;
    assert_eq!(h.get_json("bad", "before").await["a"], 1);
    let (status, _) = h.get_text("/health").await;
    assert_eq!(status, StatusCode::OK);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_write_out_of_space_latches_as_disk_full() {
    let (h, seen) = latch_with(libc::ENOSPC).await;
    assert_eq!(seen["status"], 507, "{seen}");
    assert_eq!(seen["first"]["error"], "disk_full", "{seen}");
    assert!(
        seen["first"]["message"]
            .as_str()
            .unwrap()
            .contains("journal-"),
        "{seen}"
    );
    assert_eq!(seen["health"]["needs_restart"][0]["kind"], "disk_full");
    stop_latched(h).await;
}
