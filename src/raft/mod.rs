//! Raft: openraft's type configuration, the sled log store, the state
//! machine adapter, the TCP transport and cluster formation.

// openraft's StorageError is large and not ours to shrink.
#![allow(clippy::result_large_err)]

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
pub fn raft_config(snapshot_threshold: u64) -> openraft::Config {
    openraft::Config {
        cluster_name: "cairn".into(),
        heartbeat_interval: 150,
        election_timeout_min: 600,
        election_timeout_max: 1200,
        max_payload_entries: 512,
        // Covers sending a snapshot chunk and, for the last, installing the
        // whole snapshot on the receiver: seconds for a million entries.
        install_snapshot_timeout: 30_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_threshold),
        max_in_snapshot_log_to_keep: (snapshot_threshold / 10).min(1_000),
        purge_batch_size: (snapshot_threshold / 4).clamp(1, 1024),
        ..Default::default()
    }
}

#[cfg(test)]
mod storage_suite {
    //! openraft's own conformance suite, run against the sled log store and
    //! the state machine on sled.

    use std::sync::Arc;

    use openraft::testing::{StoreBuilder, Suite};

    use super::log_store::LogStore;
    use super::state_machine::StateMachine;
    use super::{StorageError, TypeConfig};
    use crate::state::{SledBackend, Store};
    use crate::stream::Publisher;

    struct SledBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for SledBuilder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
            let dir = tempfile::tempdir().expect("tempdir");
            let db = sled::Config::new()
                .path(dir.path().join("db"))
                .open()
                .expect("sled");
            let log = LogStore::new(&db, &dir.path().join("db")).expect("log store");
            let store = Arc::new(
                Store::open(Box::new(SledBackend::new(&db).expect("tree"))).expect("store"),
            );
            let sm = StateMachine::new(
                store,
                Arc::new(Publisher::default()),
                dir.path().join("snap"),
            )
            .expect("state machine");
            Ok((dir, log, sm))
        }
    }

    #[test]
    fn sled_store_passes_openraft_suite() -> Result<(), StorageError> {
        Suite::test_all(SledBuilder)?;
        Ok(())
    }
}
