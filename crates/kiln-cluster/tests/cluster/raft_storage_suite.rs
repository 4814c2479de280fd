//! openraft's own test suite for storage implementations, run against Kiln's log
//! store (a kiln-storage environment) and state machine (a document store).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_cluster::log_store::LogStore;
use kiln_cluster::state_machine::StateMachine;
use kiln_cluster::{StorageError, TypeConfig};
use kiln_docs::{DocStore, DocsOptions};
use openraft::testing::{StoreBuilder, Suite};
use std::sync::Arc;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().unwrap();
        let mut docs = DocsOptions::default();
        docs.storage.journal_file_size_bytes = 1 << 20;
        docs.storage.data_grow_step_bytes = 1 << 20;
        let store = Arc::new(DocStore::open(dir.path().join("data"), docs.clone()).unwrap());
        let log = LogStore::open(&dir.path().join("raft"), docs.storage.clone()).unwrap();
        let machine = StateMachine::open(store, &log, &dir.path().join("snapshots"), None, None)?;
        Ok((dir, log, machine))
    }
}

#[test]
#[ignore = "slow tier: about 12 s (.ci/run runs it)"]
fn openraft_storage_suite_passes() {
    Suite::test_all(Builder).unwrap();
}
