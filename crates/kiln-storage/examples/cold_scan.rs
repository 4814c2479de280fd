//! How a cold forward scan reads the data file, whose map is advised random
//! access: a cursor over every entry (it asks for the leaves ahead of it) against
//! the same entries read by point gets in key order (nothing asks ahead), each
//! after the data file was dropped from the page cache.
//!
//! `cargo run --release -p kiln-storage --example cold_scan -- DIR [ENTRIES]`
//! (default 1,000,000 entries of 1 KiB values: about 1.3 GB of data file).

use kiln_storage::{Env, Options, DATA_FILE};
use std::os::unix::io::AsRawFd;
use std::time::Instant;

fn drop_cache(path: &std::path::Path) {
    let f = std::fs::File::open(path).expect("data file");
    f.sync_all().expect("sync");
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: cold_scan DIR [ENTRIES]")?);
    let entries: u64 = args.next().map_or(Ok(1_000_000), |s| s.parse())?;
    let value = vec![0x5au8; 1024];
    if !dir.join(DATA_FILE).exists() {
        let env = Env::open(&dir, Options::default())?;
        let mut w = env.begin_write()?;
        w.create_tree("t")?;
        for i in 0..entries {
            w.put("t", format!("key{i:012}").as_bytes(), &value)?;
            if i % 50_000 == 49_999 {
                w.commit()?;
                w = env.begin_write()?;
            }
        }
        w.commit()?;
        env.sync()?;
        env.close()?;
    }
    let data = dir.join(DATA_FILE);
    for round in 0..2 {
        drop_cache(&data);
        let env = Env::open(&dir, Options::default())?;
        let r = env.begin_read()?;
        let t = Instant::now();
        let mut c = r.cursor("t")?;
        let mut n = 0u64;
        let mut item = c.first()?;
        while let Some((_, v)) = item {
            n += v.len() as u64;
            item = c.next()?;
        }
        let scan = t.elapsed().as_secs_f64();
        drop(c);
        drop(r);
        env.close()?;
        drop_cache(&data);
        let env = Env::open(&dir, Options::default())?;
        let r = env.begin_read()?;
        let t = Instant::now();
        let mut m = 0u64;
        for i in 0..entries {
            m += r
                .get("t", format!("key{i:012}").as_bytes())?
                .map_or(0, |v| v.len() as u64);
        }
        let gets = t.elapsed().as_secs_f64();
        assert_eq!(n, m);
        println!(
            "round {round}: {:.0} MB of values: cold cursor scan {scan:.2} s ({:.0} MB/s), \
             cold gets in key order {gets:.2} s ({:.0} MB/s)",
            n as f64 / 1e6,
            n as f64 / 1e6 / scan,
            m as f64 / 1e6 / gets
        );
        drop(r);
        env.close()?;
    }
    Ok(())
}
