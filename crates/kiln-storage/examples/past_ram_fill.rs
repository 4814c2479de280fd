//! A random fill that outgrows memory: durable transactions of random 16-byte keys
//! and `VALUE` -byte values, with a line per tenth of the run giving puts/s, the
//! process's major faults and the bytes the kernel read from the device for it over
//! that tenth. Run it inside a memory cgroup smaller than the data file to see what
//! a load past RAM costs and where (faults of the merge into leaves that are no
//! longer cached).
//!
//! `cargo run --release -p kiln-storage --example past_ram_fill -- DIR [ENTRIES] [VALUE] [PER_TXN]`
//! (defaults: 2,000,000 entries of 1,000-byte values, 1,000 puts per commit:
//! about 2.5 GB of data file). `DIR` must not hold a database yet.

#![allow(clippy::unwrap_used)] // a measuring tool: a failure stops it
use kiln_storage::{Env, Options};
use rand::{rngs::SmallRng, RngCore, SeedableRng};
use std::time::Instant;

/// (major faults, bytes read from the device) of this process so far.
fn io_counters() -> (u64, u64) {
    // SAFETY: zeroed out-parameter for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: plain syscall with a valid out-parameter.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let read_bytes = std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| {
                    l.strip_prefix("read_bytes: ")
                        .map(|v| v.trim().parse().ok())
                })
                .flatten()
        })
        .unwrap_or(0);
    (ru.ru_majflt as u64, read_bytes)
}

fn arg(
    args: &mut impl Iterator<Item = String>,
    default: u64,
) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(args.next().map_or(Ok(default), |s| s.parse())?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: past_ram_fill DIR [ENTRIES] [VALUE] [PER_TXN]";
    let dir = std::path::PathBuf::from(args.next().ok_or(usage)?);
    let entries = arg(&mut args, 2_000_000)?;
    let value_bytes = arg(&mut args, 1_000)? as usize;
    let per_txn = arg(&mut args, 1_000)?.max(1);
    let env = Env::open(&dir, Options::default())?;
    let mut w = env.begin_write()?;
    w.ensure_tree("t")?;
    w.commit()?;
    let mut rng = SmallRng::seed_from_u64(42);
    let mut value = vec![0u8; value_bytes];
    let mut key = [0u8; 16];
    let tenth = (entries / 10).max(per_txn);
    let (start, mut mark, mut last) = (Instant::now(), Instant::now(), io_counters());
    let mut done = 0u64;
    while done < entries {
        let mut w = env.begin_write()?;
        for _ in 0..per_txn.min(entries - done) {
            rng.fill_bytes(&mut key);
            rng.fill_bytes(&mut value);
            w.put("t", &key, &value)?;
            done += 1;
        }
        w.commit()?;
        if done % tenth < per_txn || done == entries {
            let now = io_counters();
            let secs = mark.elapsed().as_secs_f64();
            println!(
                "{done:>10} entries: {:>9.0} puts/s, {:>8} major faults, {:>8.1} MB read ({:.1} KiB/put)",
                tenth as f64 / secs,
                now.0 - last.0,
                (now.1 - last.1) as f64 / 1e6,
                (now.1 - last.1) as f64 / 1024.0 / tenth as f64
            );
            (mark, last) = (Instant::now(), now);
        }
    }
    let fill = start.elapsed().as_secs_f64();
    let t = Instant::now();
    env.close()?;
    println!(
        "{entries} entries in {fill:.1} s ({:.0} puts/s), close {:.1} s",
        entries as f64 / fill,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
