//! The harness shared by the kill -9 tests: the test binary runs itself as a child
//! that commits and prints "ACK ..." per acknowledged commit; the parent kills it with
//! SIGKILL at a random moment and collects what was acknowledged.

use rand::Rng;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Cycles and seed from KILN_CRASH_CYCLES / KILN_CRASH_SEED (the seed is printed so a
/// failing run can be repeated).
pub fn cycles_and_seed(label: &str) -> (usize, u64) {
    let cycles = std::env::var("KILN_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let seed = std::env::var("KILN_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{label}: {cycles} cycles, seed {seed} (rerun with KILN_CRASH_SEED={seed})");
    (cycles, seed)
}

/// Runs the test `entry` of this binary as a child with `env_var` set to `dir`, waits
/// for its first acknowledgement, lets it run a random while longer, kills it with
/// SIGKILL, and returns the text after "ACK " of every line it printed.
pub fn run_child_and_kill(
    entry: &str,
    env_var: &str,
    dir: &Path,
    rng: &mut impl Rng,
) -> Vec<String> {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .env(env_var, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn crash child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(ack) = line.strip_prefix("ACK ") {
                let _ = tx.send(ack.to_string());
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(rng.gen_range(0..150)));
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
    reader.join().expect("ack reader");
    first.into_iter().chain(rx.try_iter()).collect()
}
