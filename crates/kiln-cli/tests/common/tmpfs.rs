//! A small real file system for disk-full tests: a tmpfs the test mounts (it
//! needs the right to mount; a test without it says so and stops).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of a given size, unmounted on drop.
pub struct Tmpfs {
    point: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size_mib: u64) -> Result<Tmpfs, String> {
        let point = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
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

    pub fn path(&self) -> &Path {
        self.point.path()
    }

    /// Fills the file system but `leave_bytes` with a file (returned, to remove
    /// when space should come back).
    pub fn fill(&self, leave_bytes: u64) -> PathBuf {
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        let mut written = 0u64;
        while f.write_all(&chunk).is_ok() {
            written += chunk.len() as u64;
        }
        f.set_len(written.saturating_sub(leave_bytes)).unwrap();
        f.sync_all().unwrap();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.point.path()).status();
    }
}
