//! W7 of shared/BENCHMARKS.md: recovery. A child process (this binary, `kiln bench
//! --w7-child`) writes, says it is done, and is killed with SIGKILL at once: no
//! close, no checkpoint, the write buffer full, the journal not yet written back.
//! The parent then times `Env::open` on the same directory and the first read.
//!
//! Two cases: after W3 (1,000 durable transactions of 1,000 random 100-byte puts:
//! a full write buffer), and after 1 GiB of journal with the data-file write-back
//! held back (16 KiB values; `max_unflushed_bytes` 2 GiB, windows of 1 GiB, syncs
//! due after an hour or 4 GiB).

use crate::run::{BenchResult, Run};
use crate::workload::{self, Puts, Values};
use kiln_storage::{Env, Options};
use serde_json::{json, Map};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// What the child writes before it is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum W7Case {
    /// W3's writes: small random puts, in the write buffer.
    AfterW3,
    /// Large values, the journal held from being written back.
    Journal,
}

impl W7Case {
    pub fn name(self) -> &'static str {
        match self {
            W7Case::AfterW3 => "after-w3",
            W7Case::Journal => "journal",
        }
    }

    pub fn parse(s: &str) -> Option<W7Case> {
        [W7Case::AfterW3, W7Case::Journal]
            .into_iter()
            .find(|c| c.name() == s)
    }

    fn options(self) -> Options {
        let mut o = Options::default();
        if self == W7Case::Journal {
            // Hold the write-back: the whole journal stays to be replayed.
            o.max_unflushed_bytes = 2 << 30;
            o.write_back_window_bytes = 1 << 30;
            o.sync_interval_ms = 3_600_000;
            o.sync_after_bytes = 4 << 30;
        }
        o
    }
}

/// The bytes the `Journal` case writes.
fn journal_case_bytes(quick: bool) -> u64 {
    if quick {
        128 << 20
    } else {
        1 << 30
    }
}

/// The child: writes the case's data durably into `dir`, prints `READY`, waits
/// to be killed.
pub fn child(case: W7Case, dir: &Path, quick: bool) -> BenchResult<()> {
    let env = Env::open(dir, case.options())?;
    let mut w = env.begin_write()?;
    w.create_tree("bench")?;
    w.commit()?;
    match case {
        W7Case::AfterW3 => {
            let fill = workload::W3;
            let txns = if quick { fill.txns / 10 } else { fill.txns };
            let mut puts = Puts::fill(fill.sequential);
            let mut key = [0u8; workload::KEY_BYTES];
            let mut value = [0u8; workload::VALUE_BYTES];
            for _ in 0..txns {
                let mut w = env.begin_write()?;
                for _ in 0..fill.per_txn {
                    puts.next(&mut key, &mut value);
                    w.put("bench", &key, &value)?;
                }
                w.commit()?;
            }
        }
        W7Case::Journal => {
            let mut values = Values::w1();
            let mut value = vec![0u8; 16 << 10];
            let puts = journal_case_bytes(quick) / value.len() as u64;
            for chunk in 0..puts.div_ceil(64) {
                let mut w = env.begin_write()?;
                for i in chunk * 64..((chunk + 1) * 64).min(puts) {
                    values.next(&mut value);
                    w.put("bench", &i.to_be_bytes(), &value)?;
                }
                w.commit()?;
            }
        }
    }
    println!("READY {}", env.stats().journal_bytes);
    // Killed here: never closed, nothing checkpointed after the last commit. Should
    // the parent die first, its end of stdin closes and the child leaves (without
    // closing the environment either), instead of lingering.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(1);
}

/// The parent: runs the child, kills it with SIGKILL once it said READY, times the
/// reopen and the first read.
pub fn w7(dir: &Path, case: W7Case, quick: bool) -> BenchResult<Run> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let mut cmd = Command::new(crate::kiln_exe()?);
    cmd.args(["bench", "--w7-child", case.name(), "--dir"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if quick {
        cmd.arg("--quick");
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or("the W7 child has no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    let status = child.wait()?;
    let journal_written: u64 = line
        .strip_prefix("READY ")
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("the W7 child did not finish its writes ({status}): {line:?}"))?;
    let on_disk = dir_bytes(&dir.join("journal"));
    let start = Instant::now();
    let env = Env::open(dir, case.options())?;
    let open_ms = start.elapsed().as_secs_f64() * 1e3;
    let read = env.begin_read()?;
    let first_key = read
        .cursor("bench")?
        .first()?
        .map(|(k, _)| k.to_vec())
        .ok_or("the reopened environment lost its data")?;
    let first_read_ms = start.elapsed().as_secs_f64() * 1e3;
    let entries = read.tree_len("bench")?;
    drop(read);
    let s = env.stats();
    env.close()?;
    let mut extra = Map::new();
    extra.insert("case".into(), json!(case.name()));
    extra.insert("open_ms".into(), json!(open_ms));
    extra.insert("first_read_ms".into(), json!(first_read_ms));
    extra.insert("journal_bytes_written".into(), json!(journal_written));
    extra.insert("journal_bytes_on_disk".into(), json!(on_disk));
    extra.insert(
        "records_replayed_on_open".into(),
        json!(s.records_replayed_on_open),
    );
    extra.insert("entries_after_reopen".into(), json!(entries));
    extra.insert("first_key_len".into(), json!(first_key.len()));
    Ok(Run {
        ops: 1,
        commits: 1,
        seconds: first_read_ms / 1e3,
        extra,
    })
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
