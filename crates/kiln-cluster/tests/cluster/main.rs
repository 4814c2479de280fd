//! kiln-cluster's integration tests, one module per subject, in one test binary
//! (each file was a binary of its own, linking the document store and openraft
//! again). Run one subject with `cargo test -p kiln-cluster --test cluster --
//! partitions:: --ignored`.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

mod applied_state_rides_the_log;
mod busy_database;
mod partitions;
mod raft_storage_suite;
mod three_nodes_fail_over;
