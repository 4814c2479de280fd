//! What one run of a workload returns, and the progress bar the workloads draw.

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

pub type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A command line that cannot be right whatever the state of the machine (an
/// unknown workload, a bad setting), told apart from a failed run: `kiln` exits
/// with code 2 for it, as for clap's own errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// One run of a workload: its operation count, time, and figures to report.
pub struct Run {
    pub ops: u64,
    pub commits: u64,
    pub seconds: f64,
    pub extra: Map<String, Value>,
}

impl Run {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.seconds
    }
}

/// A workload's progress bar, labelled with the workload.
pub fn progress(len: u64, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}
