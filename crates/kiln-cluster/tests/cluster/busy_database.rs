//! A delete from the log on a node where a request still holds the database past
//! `delete_wait_ms`: the state machine waits for it and deletes, as every other
//! node does, instead of answering `database_busy` and keeping a database the
//! others no longer have.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_cluster::log_store::LogStore;
use kiln_cluster::state_machine::StateMachine;
use kiln_cluster::{Answer, Command, TypeConfig};
use kiln_docs::{DocStore, DocsOptions};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn entry(index: u64, command: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(command),
    }
}

#[test]
fn a_delete_waits_out_a_request_that_holds_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let mut docs = DocsOptions::default();
    docs.storage.journal_file_size_bytes = 1 << 20;
    docs.storage.data_grow_step_bytes = 1 << 20;
    // Far shorter than the request below holds the database.
    docs.delete_wait_ms = 50;
    let store = Arc::new(DocStore::open(dir.path().join("data"), docs.clone()).unwrap());
    let log = LogStore::open(&dir.path().join("raft"), docs.storage.clone()).unwrap();
    let mut machine = StateMachine::open(
        store.clone(),
        &log,
        &dir.path().join("snapshots"),
        None,
        None,
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let create = Command::CreateDatabase {
            name: "shop".into(),
            incarnation: 7,
        };
        machine.apply(vec![entry(1, create)]).await.unwrap();
        // A request holding the database for 600 ms.
        let held = store.database("shop").unwrap();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            drop(held);
        });
        let started = Instant::now();
        let delete = Command::DeleteDatabase {
            name: "shop".into(),
        };
        let answers = machine.apply(vec![entry(2, delete)]).await.unwrap();
        holder.join().unwrap();
        assert!(
            matches!(answers.as_slice(), [Answer::DatabaseDeleted { .. }]),
            "{answers:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(500));
        assert!(
            store.database("shop").is_err(),
            "the database is still here"
        );
    });
}
