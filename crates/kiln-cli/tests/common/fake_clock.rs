//! Wall clocks that disagree and jump: each `kiln serve` node under libfaketime
//! (`LD_PRELOAD`), its offset read from a file the test rewrites. Timers and
//! timeouts keep the real monotonic clock: only the wall clock (what a leader
//! stamps into its entries) moves.
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Each node's clock offset, in seconds, is one of these.
pub const OFFSETS_S: [i64; 3] = [-10, 0, 10];

/// Where Debian's `faketime` package puts the library, if it is installed.
pub fn faketime_library() -> Option<PathBuf> {
    let lib = std::fs::read_dir("/usr/lib").ok()?.find_map(|entry| {
        let path = entry.ok()?.path().join("faketime/libfaketime.so.1");
        path.exists().then_some(path)
    });
    lib.or_else(|| {
        let path = PathBuf::from("/usr/lib/faketime/libfaketime.so.1");
        path.exists().then_some(path)
    })
}

/// The library, or `None` after saying why the test stops (and failing when
/// KILN_REQUIRE_FAKETIME is set: CI installs it).
pub fn faketime_or_skip() -> Option<PathBuf> {
    let lib = faketime_library();
    if lib.is_none() {
        let why = "libfaketime is not installed (Debian: apt-get install faketime)";
        assert!(std::env::var_os("KILN_REQUIRE_FAKETIME").is_none(), "{why}");
        println!("skipped: {why}");
    }
    lib
}

/// The file node `id`'s libfaketime reads its offset from.
fn clock_file(root: &Path, id: u64) -> PathBuf {
    root.join(format!("clock{id}"))
}

/// The environment of each of the nodes 1 to 3: under libfaketime, its offset
/// (0 to begin with) in its own file under `root`.
pub fn fake_clocks(root: &Path, lib: &Path) -> BTreeMap<u64, Vec<(String, String)>> {
    (1..=3u64)
        .map(|id| {
            std::fs::write(clock_file(root, id), "+0\n").unwrap();
            let vars = [
                ("LD_PRELOAD", lib.to_str().unwrap().to_string()),
                (
                    "FAKETIME_TIMESTAMP_FILE",
                    clock_file(root, id).to_str().unwrap().to_string(),
                ),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
                // The offset file is read again after a second.
                ("FAKETIME_CACHE_DURATION", "1".to_string()),
            ];
            let vars = vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            (id, vars)
        })
        .collect()
}

/// Sets the nodes' clocks for step `step` (each node a different offset of
/// [`OFFSETS_S`], all three changing at every step: jumps of 10 or 20 s, back
/// too), and waits until libfaketime has read them (it caches the file for a
/// second). The offsets set.
pub fn jump_clocks(root: &Path, step: u64) -> BTreeMap<u64, i64> {
    let offsets: BTreeMap<u64, i64> = (1..=3u64)
        .map(|id| (id, OFFSETS_S[((step + id) % 3) as usize]))
        .collect();
    for (id, offset) in &offsets {
        std::fs::write(clock_file(root, *id), format!("{offset:+}\n")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1_200));
    offsets
}

/// The real time (the test's own clock is not faked), in ms since the epoch.
pub fn real_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
