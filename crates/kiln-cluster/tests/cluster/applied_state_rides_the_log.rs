//! The state machine's applied state after document writes is not saved in a
//! commit of its own: the log's next commit carries it (`log_store::Piggyback`).
//! A node that stops before that applies those entries again, as no-ops; a
//! snapshot's commit carries it too, so the applied state on disk never stays
//! behind the log the snapshot lets go.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_cluster::log_store::LogStore;
use kiln_cluster::state_machine::StateMachine;
use kiln_cluster::{Answer, Command, LoggedCondition, LoggedOp, TypeConfig};
use kiln_docs::{DocStore, DocsOptions};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftSnapshotBuilder};
use std::path::Path;
use std::sync::Arc;

fn open(dir: &Path) -> (Arc<DocStore>, LogStore, StateMachine) {
    let mut docs = DocsOptions::default();
    docs.storage.journal_file_size_bytes = 1 << 20;
    docs.storage.data_grow_step_bytes = 1 << 20;
    let store = Arc::new(DocStore::open(dir.join("data"), docs.clone()).unwrap());
    let log = LogStore::open(&dir.join("raft"), docs.storage.clone()).unwrap();
    let machine =
        StateMachine::open(store.clone(), &log, &dir.join("snapshots"), None, None).unwrap();
    (store, log, machine)
}

fn entry(index: u64, command: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(command),
    }
}

fn put(index: u64) -> Entry<TypeConfig> {
    entry(
        index,
        Command::Write {
            database: "shop".into(),
            at_ms: 1_000 + index,
            all_or_none: false,
            ops: vec![LoggedOp::Put {
                id: format!("d{index}"),
                json: format!("{{\"n\":{index}}}"),
                condition: LoggedCondition::None,
            }],
        },
    )
}

async fn applied_index(machine: &mut StateMachine) -> Option<u64> {
    machine.applied_state().await.unwrap().0.map(|l| l.index)
}

#[test]
fn writes_applied_again_after_a_stop_are_no_ops_and_a_snapshot_saves_the_applied_state() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // A database, saved in a commit of its own; then four writes, whose
        // applied state is only left for the log's next append.
        {
            let (_store, _log, mut machine) = open(dir.path());
            let create = Command::CreateDatabase {
                name: "shop".into(),
                incarnation: 7,
            };
            machine.apply(vec![entry(1, create)]).await.unwrap();
            let answers = machine.apply((2..=5).map(put)).await.unwrap();
            assert!(
                answers.iter().all(|a| matches!(a, Answer::Writes(_))),
                "{answers:?}"
            );
            assert_eq!(applied_index(&mut machine).await, Some(5));
        }

        // Stopped before an append carried it: the disk says 1, the database
        // holds all four writes, and applying them again changes nothing.
        {
            let (store, _log, mut machine) = open(dir.path());
            assert_eq!(applied_index(&mut machine).await, Some(1));
            let db = store.database("shop").unwrap();
            let etags: Vec<String> = (2..=5)
                .map(|i| db.get(&format!("d{i}")).unwrap().unwrap().etag.to_string())
                .collect();
            let answers = machine.apply((2..=5).map(put)).await.unwrap();
            assert!(
                answers.iter().all(|a| matches!(a, Answer::AlreadyApplied)),
                "{answers:?}"
            );
            for (i, etag) in (2..=5).zip(&etags) {
                assert_eq!(
                    &db.get(&format!("d{i}")).unwrap().unwrap().etag.to_string(),
                    etag
                );
            }
            // A snapshot's commit carries the applied state (5): the log up to
            // the snapshot may go, and the disk must not say less.
            let mut builder = machine.get_snapshot_builder().await;
            let snapshot = builder.build_snapshot().await.unwrap();
            assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(5));
        }
        let (_store, _log, mut machine) = open(dir.path());
        assert_eq!(applied_index(&mut machine).await, Some(5));
    });
}
