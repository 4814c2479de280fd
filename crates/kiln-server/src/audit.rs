//! `--audit-log FILE`: one JSON line per security-relevant event — a failed
//! authentication, a denied request, a change of keys or certificates, and the
//! audited routes of `route_table.rs` (databases created and deleted, backups,
//! restores, revisions purged, indexes defined, the cluster's membership) — with
//! who (key id and name, or certificate thumbprint), what, when, and the request.
//!
//! A line is written (one `write`, so lines never interleave) before the answer
//! leaves; lines of events that change something are also synced to the disk
//! then. Only refusals are on the data path (documents are not audited), and a
//! refusal costs one `write`. When the file would grow past `max_bytes` it is
//! renamed `FILE.1` (`FILE.1` to `FILE.2`, ..., keeping [`ROTATED_FILES_KEPT`]).
//! A line that cannot be written is reported in the server's log, once per
//! failure streak, and the request goes on: an audit log on a full disk must not
//! stop the database.

use crate::auth::ApiKeyRecord;
use parking_lot::Mutex;
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How many rotated files (`FILE.1` ... `FILE.N`) are kept.
pub const ROTATED_FILES_KEPT: u32 = 5;

/// The default size at which the file rotates.
pub const DEFAULT_AUDIT_LOG_MAX_BYTES: u64 = 64 << 20;

/// Whether an event changed something (synced before the answer) or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The request was answered with a success.
    Done,
    /// It was answered with an error (it changed nothing, or not as asked).
    Failed,
    /// Authentication or permission refused it.
    Refused,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Failed => "failed",
            Outcome::Refused => "refused",
        }
    }

    pub fn of_status(status: u16) -> Outcome {
        if status < 400 {
            Outcome::Done
        } else {
            Outcome::Failed
        }
    }
}

/// The request an event came with.
#[derive(Clone, Debug, Default)]
pub struct RequestFacts {
    pub method: String,
    pub path: String,
    pub request_id: String,
    pub peer: Option<std::net::SocketAddr>,
}

/// One event, as a line of the log.
pub struct Event<'a> {
    pub event: &'a str,
    pub outcome: Outcome,
    /// The key or certificate the request came with; None without one.
    pub who: Option<&'a ApiKeyRecord>,
    pub database: Option<&'a str>,
    pub request: Option<&'a RequestFacts>,
    pub status: Option<u16>,
    /// Why it was refused, or what changed (keys).
    pub detail: Option<serde_json::Value>,
}

impl Event<'_> {
    fn line(&self, now_ms: u64) -> Vec<u8> {
        let who = match self.who {
            None => json!(null),
            Some(k) => match &k.certificate_sha256 {
                Some(thumbprint) => {
                    json!({"key_id": k.id, "name": k.name, "certificate_sha256": thumbprint})
                }
                None => json!({"key_id": k.id, "name": k.name}),
            },
        };
        let mut line = json!({
            "time": kiln_docs::format_rfc3339_ms(now_ms),
            "event": self.event,
            "outcome": self.outcome.as_str(),
            "who": who,
        });
        let obj = line.as_object_mut().map(|o| {
            if let Some(db) = self.database {
                o.insert("database".into(), json!(db));
            }
            if let Some(r) = self.request {
                o.insert("method".into(), json!(r.method));
                o.insert("path".into(), json!(r.path));
                o.insert("request_id".into(), json!(r.request_id));
                if let Some(peer) = r.peer {
                    o.insert("peer".into(), json!(peer.to_string()));
                }
            }
            if let Some(status) = self.status {
                o.insert("status".into(), json!(status));
            }
            if let Some(detail) = &self.detail {
                o.insert("detail".into(), detail.clone());
            }
        });
        debug_assert!(obj.is_some());
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

#[derive(Debug, thiserror::Error)]
#[error("audit log {path}: {source}", path = path.display())]
pub struct AuditError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

struct Sink {
    file: File,
    bytes: u64,
    /// A write failed and was reported; the next success says so.
    failing: bool,
}

pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
    sink: Mutex<Sink>,
}

fn open_append(path: &Path) -> Result<File, AuditError> {
    let mut opts = OpenOptions::new();
    opts.append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path).map_err(|source| AuditError {
        path: path.to_path_buf(),
        source,
    })
}

impl AuditLog {
    /// Opens (or creates) the log for appending; fails if it cannot be written.
    pub fn open(path: &Path, max_bytes: u64) -> Result<AuditLog, AuditError> {
        let file = open_append(path)?;
        let bytes = file
            .metadata()
            .map_err(|source| AuditError {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        Ok(AuditLog {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(4096),
            sink: Mutex::new(Sink {
                file,
                bytes,
                failing: false,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event's line (and syncs it when the event changed something).
    pub fn record(&self, event: &Event<'_>) {
        let line = event.line(now_ms());
        let sync = event.outcome == Outcome::Done;
        let mut sink = self.sink.lock();
        let result = self.write_line(&mut sink, &line, sync);
        match result {
            Ok(()) if sink.failing => {
                sink.failing = false;
                tracing::warn!(path = %self.path.display(), "audit log written again");
            }
            Ok(()) => {}
            Err(e) if !sink.failing => {
                sink.failing = true;
                tracing::error!(error = %e, "could not write the audit log (the request goes on)");
            }
            Err(_) => {}
        }
    }

    fn write_line(&self, sink: &mut Sink, line: &[u8], sync: bool) -> Result<(), AuditError> {
        if sink.bytes > 0 && sink.bytes + line.len() as u64 > self.max_bytes {
            self.rotate(sink)?;
        }
        let io = |source| AuditError {
            path: self.path.clone(),
            source,
        };
        sink.file.write_all(line).map_err(io)?;
        sink.bytes += line.len() as u64;
        if sync {
            sink.file.sync_data().map_err(io)?;
        }
        Ok(())
    }

    /// FILE -> FILE.1 -> ... -> FILE.N (the oldest dropped), then a new FILE.
    fn rotate(&self, sink: &mut Sink) -> Result<(), AuditError> {
        let numbered = |n: u32| {
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        let io = |path: PathBuf| move |source| AuditError { path, source };
        sink.file.sync_data().map_err(io(self.path.clone()))?;
        for n in (1..ROTATED_FILES_KEPT).rev() {
            let from = numbered(n);
            if from.exists() {
                std::fs::rename(&from, numbered(n + 1)).map_err(io(from.clone()))?;
            }
        }
        std::fs::rename(&self.path, numbered(1)).map_err(io(self.path.clone()))?;
        sink.file = open_append(&self.path)?;
        sink.bytes = 0;
        Ok(())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What changed between two readings of the key file, as an audit detail (ids,
/// names and clearances; never hashes).
pub fn key_changes(
    before: &[std::sync::Arc<ApiKeyRecord>],
    after: &[std::sync::Arc<ApiKeyRecord>],
) -> Option<serde_json::Value> {
    let describe = |k: &ApiKeyRecord| {
        json!({
            "key_id": k.id,
            "name": k.name,
            "kind": if k.certificate_sha256.is_some() { "certificate" } else { "key" },
            "clearance": k.clearance.to_string(),
        })
    };
    let added: Vec<_> = after
        .iter()
        .filter(|a| !before.iter().any(|b| b == *a))
        .map(|k| describe(k))
        .collect();
    let removed: Vec<_> = before
        .iter()
        .filter(|b| !after.iter().any(|a| a == *b))
        .map(|k| describe(k))
        .collect();
    if added.is_empty() && removed.is_empty() {
        None
    } else {
        Some(json!({"added": added, "removed": removed}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> Event<'_> {
        Event {
            event: name,
            outcome: Outcome::Refused,
            who: None,
            database: Some("shop"),
            request: None,
            status: Some(403),
            detail: None,
        }
    }

    #[test]
    fn lines_are_json_and_the_file_rotates_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, 4096).unwrap();
        for i in 0..200 {
            log.record(&event(&format!("access.denied.{i}")));
        }
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(current.len() <= 4096, "{} bytes", current.len());
        for line in current.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["outcome"], "refused");
            assert_eq!(v["database"], "shop");
            assert!(v["time"].as_str().unwrap().ends_with('Z'));
        }
        let last = current.lines().last().unwrap();
        assert!(last.contains("access.denied.199"), "{last}");
        // Rotated files exist, at most ROTATED_FILES_KEPT of them.
        assert!(dir.path().join("audit.jsonl.1").exists());
        assert!(dir.path().join("audit.jsonl.5").exists());
        assert!(!dir.path().join("audit.jsonl.6").exists());
        let first_rotated = std::fs::read_to_string(dir.path().join("audit.jsonl.1")).unwrap();
        let next_number = |text: &str| -> u32 {
            let line = text.lines().last().unwrap();
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            v["event"]
                .as_str()
                .unwrap()
                .rsplit('.')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        // .1 ends just before the current file starts: nothing lost in between.
        let current_first: serde_json::Value =
            serde_json::from_str(current.lines().next().unwrap()).unwrap();
        let current_first: u32 = current_first["event"]
            .as_str()
            .unwrap()
            .rsplit('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(next_number(&first_rotated) + 1, current_first);
    }
}
