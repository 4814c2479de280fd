//! What a process crash leaves behind, taken from a running environment, and the
//! options that keep everything since the test began in the journal to replay.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_storage::Options;
use std::path::Path;

/// Small journal files and data-file growth steps, and no checkpoint on its own
/// (neither by time nor by bytes): a crash copy taken at any point replays every
/// commit since the environment was opened from the journal.
pub fn without_checkpoints() -> Options {
    Options {
        journal_file_size_bytes: 1 << 20,
        data_grow_step_bytes: 1 << 20,
        sync_interval_ms: 3_600_000,
        sync_after_bytes: 1 << 40,
        ..Options::default()
    }
}

/// Copies an open environment's files: what a process crash leaves behind (the page
/// cache survives a kill -9).
pub fn crash_copy(from: &Path, to: &Path) {
    for entry in walk(from) {
        let rel = entry.strip_prefix(from).unwrap();
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        // A journal file being prepared may be renamed while we copy: skip it.
        match std::fs::copy(&entry, &dest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("copy {entry:?}: {e}"),
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if !p.ends_with("kiln.lock") {
            out.push(p);
        }
    }
    out
}
