//! Raft: openraft's type configuration, the sled log store, the state
//! machine adapter, the TCP transport and cluster formation.

pub mod cluster;
pub mod log_store;
pub mod network;
pub mod state_machine;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::state::{Command, Response};

/// A server as Raft membership records it: enough to reach its Raft port and
/// to forward HTTP requests to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNode {
    pub name: String,
    pub raft_addr: String,
    pub http_addr: String,
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = ServerNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;

/// Wraps any I/O or decoding failure as an openraft storage error.
pub(crate) fn io_err(
    subject: openraft::ErrorSubject<NodeId>,
    verb: openraft::ErrorVerb,
    e: impl std::fmt::Display,
) -> StorageError {
    let any = openraft::AnyError::error(e.to_string());
    openraft::StorageIOError::new(subject, verb, any).into()
}

/// The Raft timing used by every server: elections within ~1s of a leader
/// loss, heartbeats well inside that.
pub fn raft_config() -> openraft::Config {
    openraft::Config {
        cluster_name: "cairn".into(),
        heartbeat_interval: 150,
        election_timeout_min: 600,
        election_timeout_max: 1200,
        max_payload_entries: 512,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(20_000),
        max_in_snapshot_log_to_keep: 1_000,
        purge_batch_size: 1024,
        ..Default::default()
    }
}
