//! The harness shared by the kill -9 tests: the test binary runs itself as a child
//! (an `#[ignore]`d helper test, started with `--ignored --exact <name>`) that commits
//! and prints "ACK ..." per acknowledged commit; the parent kills it with SIGKILL at a
//! random moment and collects what was acknowledged.
//!
//! A cycle cannot pass without testing anything: the child must acknowledge at least
//! one commit within the timeout (KILN_CRASH_ACK_TIMEOUT_SECS, default 10), must still
//! be running when it is killed, and must die of the SIGKILL; otherwise the parent
//! fails, saying which cycle and showing the end of the child's stderr.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use rand::Rng;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

/// SIGKILL's number (9 on every Unix; the tests do not depend on libc).
const SIGKILL: i32 = 9;

/// Cycles and seed from KILN_CRASH_CYCLES / KILN_CRASH_SEED (the seed is printed so a
/// failing run can be repeated).
pub fn cycles_and_seed(label: &str, default_cycles: usize) -> (usize, u64) {
    let cycles = std::env::var("KILN_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cycles);
    assert!(cycles > 0, "{label}: KILN_CRASH_CYCLES must be at least 1");
    let seed = std::env::var("KILN_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{label}: {cycles} cycles, seed {seed} (rerun with KILN_CRASH_SEED={seed})");
    (cycles, seed)
}

/// For a child entry point: the directory its parent passed in `env_var`. Run on its
/// own (without the parent), the child fails instead of passing without testing.
pub fn child_dir(env_var: &str, parent: &str) -> String {
    match std::env::var(env_var) {
        Ok(dir) => dir,
        Err(_) => panic!(
            "this is the child process of the kill -9 test `{parent}` and does nothing on its \
             own: {env_var} is not set. Run the parent test instead (it starts this one with \
             `--ignored --exact`)."
        ),
    }
}

fn ack_timeout() -> Duration {
    let secs = std::env::var("KILN_CRASH_ACK_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(secs)
}

/// Kills and reaps `child`, then panics with `why` and the end of its stderr.
fn fail(
    child: &mut Child,
    stderr: std::thread::JoinHandle<String>,
    cycle: usize,
    why: String,
) -> ! {
    let _ = child.kill();
    let _ = child.wait();
    let err = stderr.join().unwrap_or_default();
    panic!("cycle {cycle}: {why}\n--- end of the child's stderr ---\n{err}");
}

/// Runs the `#[ignore]`d test `entry` of this binary as a child with `env_var` set to
/// `dir`, waits for its first acknowledgement, lets it run a random while longer, kills
/// it with SIGKILL, and returns the text after "ACK " of every line it printed (never
/// empty: a child that acknowledges nothing, or exits by itself, fails the cycle).
pub fn run_child_and_kill(
    cycle: usize,
    entry: &str,
    env_var: &str,
    dir: &Path,
    rng: &mut impl Rng,
) -> Vec<String> {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            entry,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env_var, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn crash child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut stderr_pipe = child.stderr.take().expect("child stderr");
    // The last 4 KiB of stderr, for failure messages (read all the time, so that the
    // child never blocks on a full pipe).
    let stderr = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = stderr_pipe.read_to_end(&mut all);
        let from = all.len().saturating_sub(4096);
        String::from_utf8_lossy(&all[from..]).into_owned()
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(ack) = line.strip_prefix("ACK ") {
                let _ = tx.send(ack.to_string());
            }
        }
    });
    let timeout = ack_timeout();
    let first = match rx.recv_timeout(timeout) {
        Ok(first) => first,
        Err(RecvTimeoutError::Timeout) => fail(
            &mut child,
            stderr,
            cycle,
            format!("the child acknowledged nothing in {} s", timeout.as_secs()),
        ),
        Err(RecvTimeoutError::Disconnected) => {
            let status = child.wait().expect("reap the child");
            fail(
                &mut child,
                stderr,
                cycle,
                format!("the child closed its output and exited ({status}) before acknowledging anything"),
            )
        }
    };
    std::thread::sleep(Duration::from_millis(rng.gen_range(0..150)));
    if let Some(status) = child.try_wait().expect("poll the child") {
        fail(
            &mut child,
            stderr,
            cycle,
            format!("the child exited by itself ({status}) before it was killed"),
        );
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    if status.signal() != Some(SIGKILL) {
        let err = stderr.join().unwrap_or_default();
        panic!(
            "cycle {cycle}: the child was not killed by SIGKILL but exited ({status})\n\
             --- end of the child's stderr ---\n{err}"
        );
    }
    reader.join().expect("ack reader");
    let _ = stderr.join();
    std::iter::once(first).chain(rx.try_iter()).collect()
}
