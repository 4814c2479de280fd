//! Kiln's benchmarks: the workloads of shared/BENCHMARKS.md run against Kiln
//! (`kiln bench`), the raw disk measured on its own (`kiln disk-bench`), and what the
//! comparative benchmark in bench/ shares with them (the storage workloads' keys,
//! values and sizes, the statistics, the machine facts).
//!
//! The modules form a tree: [`bench`] parses the workload list and dispatches to the
//! workload modules (`storagebench`, `recoverybench`, `serverbench`, `streambench`,
//! `querybench`, `aggbench`, `searchbench`, `backupbench`, `clusterbench`), which build on leaf modules that
//! import nothing of this crate's above them: [`run`] (what a run returns),
//! [`workload`] (the seed and the generated data), [`ycsb`] (the YCSB core
//! workloads' keys, records and distributions), [`stats`] (medians, quantiles,
//! CPU time), [`procstat`], [`machine`], [`rawdisk`]. [`diskbench`] (with
//! [`randread`], its random-read rows) is `kiln disk-bench`. [`report`] prints `kiln
//! bench`'s rows.
//!
//! The workloads that need a server start the `kiln` binary ([`kiln_exe`]: the
//! running executable, since they run inside `kiln bench`).

#[cfg(feature = "documents")]
pub mod aggbench;
#[cfg(feature = "documents")]
pub mod attachbench;
#[cfg(feature = "documents")]
pub mod backupbench;
#[cfg(feature = "documents")]
pub mod bench;
#[cfg(feature = "documents")]
pub mod clusterbench;
pub mod corpus;
pub mod diskbench;
#[cfg(feature = "documents")]
pub mod httpbench;
pub mod machine;
pub mod procstat;
#[cfg(feature = "documents")]
pub mod querybench;
pub mod randread;
pub mod rawdisk;
pub mod recoverybench;
#[cfg(feature = "documents")]
pub mod redisbench;
#[cfg(feature = "documents")]
pub mod report;
pub mod run;
#[cfg(feature = "documents")]
pub mod searchbench;
#[cfg(feature = "documents")]
pub mod serverbench;
pub mod stats;
pub mod storagebench;
#[cfg(feature = "documents")]
pub mod streambench;
#[cfg(feature = "documents")]
pub mod subbench;
pub mod workload;
pub mod ycsb;

#[cfg(feature = "documents")]
pub use backupbench::{BackupFigures, BackupTool};
#[cfg(feature = "documents")]
pub use bench::BenchArgs;
pub use diskbench::DiskBenchArgs;
pub use run::{BenchResult, Run, UsageError};

/// The `kiln` binary the server workloads start (`kiln serve`) and W7 re-executes
/// (`kiln bench --w7-child`): the running executable, as these workloads run inside
/// `kiln bench`.
pub fn kiln_exe() -> std::io::Result<std::path::PathBuf> {
    std::env::current_exe()
}
