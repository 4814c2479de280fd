//! Replication for Kiln: a Raft group ([openraft]) whose log carries the document
//! writes of a [`kiln_docs::DocStore`]. Every node applies the same entries in the
//! same order with the time the leader stamped into them, so every node gives a
//! write the same etag (`Database::apply_logged`).
//!
//! - [`command`]: what the log carries, and what applying it answers.
//! - [`codec`]: the binary, versioned form of log entries and Raft messages
//!   (JSON from older builds still read).
//! - [`log_store`]: the Raft log and vote, in a kiln-storage environment of their
//!   own (a commit is durable when it returns: an append is acknowledged only then).
//! - [`state_machine`]: applies entries to the document store.
//! - [`snapshot`]: snapshots, the databases' backup containers in a file.
//! - [`network`]: Raft's messages over HTTP (`codec` bodies) to the other nodes'
//!   `/cluster/raft/*` routes, which the server mounts.
//! - `uploads`: attachment uploads in progress, written by the log's chunks.
//! - `batcher`: concurrent independent writes merged into one log entry.
//! - [`node`]: one node: starts Raft, forms the cluster, takes writes.

// openraft's StorageError (224 bytes) is what its storage traits return; our
// helpers return it too rather than box it and unbox it at every trait method.
#![allow(clippy::result_large_err)]

pub mod api_keys;
mod batcher;
pub mod codec;
pub mod command;
pub mod disk_wait;
mod handover;
pub mod log_store;
pub mod network;
pub mod node;
pub mod prevote;
pub mod snapshot;
pub mod state_machine;
mod uploads;

pub use api_keys::ApiKeyStore;
pub use command::{Answer, Command, ErrorAnswer, LoggedCondition, LoggedOp, WriteAnswer};
pub use node::{ClusterConfig, ClusterError, ClusterNode, ClusterStatus, MemberStatus};

openraft::declare_raft_types!(
    /// Kiln's Raft types: node ids are numbers, a node is its HTTP address.
    pub TypeConfig:
        D = Command,
        R = Answer,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = snapshot::SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
