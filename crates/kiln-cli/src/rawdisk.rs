//! What the disk itself does: durable O_DIRECT|O_DSYNC writes into a preallocated,
//! already-written file — the physical floor under a journal commit.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

#[repr(C, align(4096))]
struct Block([u8; 4096]);

pub struct RawDiskResult {
    /// Total time / writes: comparable with a workload's ms per commit.
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// False when O_DIRECT was refused and pwrite+fdatasync was measured instead.
    pub direct_io: bool,
}

/// Times `writes` sequential durable `write_size`-byte writes into a file in `dir`
/// that was zero-filled first.
pub fn durable_writes(
    dir: &Path,
    write_size: usize,
    writes: usize,
) -> std::io::Result<RawDiskResult> {
    let path = dir.join(format!("rawdisk-{}.kiln-tmp", std::process::id()));
    let file_len = (write_size * writes) as u64;
    {
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        let zeros = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < file_len {
            let n = zeros.len().min((file_len - off) as usize);
            f.write_all_at(&zeros[..n], off)?;
            off += n as u64;
        }
        f.sync_all()?;
    }
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&path);
    let (file, is_direct) = match direct {
        Ok(f) => (f, true),
        Err(_) => (OpenOptions::new().write(true).open(&path)?, false),
    };
    let mut buf: Vec<Block> = (0..write_size.div_ceil(4096))
        .map(|_| Block([0xA5; 4096]))
        .collect();
    // SAFETY: Block is repr(C) around bytes; the Vec is contiguous.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 4096) };
    let mut lat = Vec::with_capacity(writes);
    for i in 0..writes {
        bytes[0] = i as u8;
        let t = Instant::now();
        file.write_all_at(&bytes[..write_size], (i * write_size) as u64)?;
        if !is_direct {
            file.sync_data()?;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    let mean_ms = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    lat.sort_by(f64::total_cmp);
    let q = |f: f64| {
        lat.get(((lat.len() as f64 * f) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    Ok(RawDiskResult {
        mean_ms,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        direct_io: is_direct,
    })
}
