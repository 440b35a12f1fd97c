//! Raft: openraft's type configuration (`TypeConfig`, openraft 0.10), the
//! log store, the state machine adapter, the TCP transport and cluster
//! formation.
//!
//! From the bottom up:
//!
//! - `stream`: the byte streams below every transport (`PeerStream`,
//!   `Connect`, `Accept`, `Dial`, TCP's). `network` and `secure` both build
//!   on it, so neither imports the other's types.
//! - `secure` (mutual TLS; `certified`: which datacenter's server the peer
//!   proved to be) and `encrypt` (`--encrypt KEY`: a challenge–response on
//!   the key, then ChaCha20-Poly1305 records; outside TLS when both are on)
//!   wrap those streams, so the frame code never changes.
//! - `frame`: the framing every message uses, `[len u32 BE][bincode]`, at
//!   most `MAX_FRAME` bytes, decoding bounded by the bytes received.
//! - `network`: the TCP transport: bincode frames, Raft's RPCs, snapshots
//!   in chunks, the formation RPCs, `open_channel` (a connection made a
//!   channel). Both sides check the wire version (`WIRE_VERSION`, 6) first:
//!   6 sends forwarded WAN requests only on channels
//!   (`Request::WanChannel`) and adds `Command::FederationStateDelete`.
//! - `channel`: a connection that sent `Request::Channel` first carries
//!   many calls at once, each tagged with an id and answered in any order.
//!   One `Channel` per peer (`Channels`, `Cluster::channel_to`), opened on
//!   use and again after it closed. The receiver runs each call as a task
//!   of the connection's own, all aborted when it closes; a `Cancel` frame
//!   aborts one. At most `MAX_IN_FLIGHT` calls and `MAX_IN_FLIGHT_BYTES`
//!   per channel: past it, `BUSY`. A `Request::Channel` is taken only from
//!   a server of this datacenter (with TLS, by its certificate); its bytes
//!   are the endpoint layer's, answered by the `Calls` process assembly
//!   sets on the `Cluster`. A `Request::WanChannel` is taken only where WAN
//!   frames are served, with TLS only from a server certified for the
//!   datacenter it names. Each whole frame keeps the connection among the
//!   port's most recently active: at a cap the least recently active one
//!   is closed.
//! - `wan`: the WAN frames' shapes (`WanHello`, `WanRequest`/`WanResponse`)
//!   and the `Wan` trait that answers them, set on the `Cluster` by process
//!   assembly. Greetings are frames; forwarded requests are calls on a
//!   channel opened with `Request::WanChannel { from }` (`WanCalls`): the
//!   request's datacenter is the channel's, which the transport
//!   authenticated. An answer over the frame cap is refused whole, a 413 to
//!   the asker.
//! - `log_store`: the Raft log in append-only segment files with group
//!   commit, the vote in sled; recovery. The newest entries stay decoded in
//!   a tail, so appends and replication's reads never wait for a thread;
//!   file I/O runs on its writer thread or on blocking threads.
//! - `state_machine`: streaming apply; a snapshot built, sent, received and
//!   installed a chunk at a time, the install atomic.
//! - `snapshot_file`: the snapshot file's format (framing, atomic save,
//!   received files); its `inspect` returns its own `Contents`, which
//!   `main` turns into the CLI's `Inspection`.
//! - `snapshot_archive`: `/v1/snapshot`'s envelope (Consul's gzipped tar of
//!   `meta.json`, `state.bin`, `SHA256SUMS`); reading inflates at most
//!   `MAX_STATE` bytes.
//! - `inspect`: what `cairn debug data-dir` reports.
//! - `cluster`: bootstrap-expect, a join as a learner promoted to voter
//!   only once replication to it matched the log, the removal of a voter
//!   or a learner. `stay_member`: a server no leader speaks to greets its
//!   peers, starts no election while one of them names another leader, and
//!   after 5 s asks to join again. So a removed server that comes back
//!   rejoins: it takes entries from the leader its peers named even if its
//!   own stale membership does not know it (`Formation::awaits_leader`:
//!   appends and snapshots only, never votes). It also keeps the silence
//!   of each member as the leader sees it, for autopilot's cleanup.
//! - `autopilot`: the servers' health as the leader sees it (thresholds
//!   never under two heartbeats), and which dead servers the cleanup
//!   removes.
//! - `runtime`: tokio, with a random source the simulation seeds.

// openraft's StorageError is large and not ours to shrink.
#![allow(clippy::result_large_err)]

pub mod autopilot;
pub mod channel;
pub mod cluster;
pub mod encrypt;
pub mod frame;
pub mod inspect;
pub mod log_store;
pub mod network;
pub mod runtime;
pub mod secure;
pub mod snapshot_archive;
pub mod snapshot_file;
pub mod state_machine;
pub mod stream;
pub mod wan;

use openraft::OptionalSend;
use serde::{Deserialize, Serialize};

use crate::state::{Command, Payload, Response};

/// A server as Raft membership records it: enough to reach its Raft port and
/// to forward HTTP requests to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNode {
    pub name: String,
    pub raft_addr: String,
    pub http_addr: String,
}

/// openraft logs entries through `Display`: the command's kind is enough.
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Command::Kv(_) => "kv",
            Command::Txn(_) => "txn",
            Command::Register(_) => "register",
            Command::Deregister(_) => "deregister",
            Command::ConfigSet { .. } => "config-set",
            Command::ConfigDelete { .. } => "config-delete",
            Command::InitCluster { .. } => "init-cluster",
            Command::Noop => "noop",
            Command::ReapTombstones { .. } => "reap-tombstones",
            Command::SessionCreate { .. } => "session-create",
            Command::SessionDestroy { .. } => "session-destroy",
            Command::RestoreChunk { .. } => "restore-chunk",
            Command::RestoreCommit { .. } => "restore-commit",
            Command::RestoreAbort { .. } => "restore-abort",
            Command::AclTokenSet { .. } => "acl-token-set",
            Command::AclTokenDelete { .. } => "acl-token-delete",
            Command::AclPolicySet { .. } => "acl-policy-set",
            Command::AclPolicyDelete { .. } => "acl-policy-delete",
            Command::AclRoleSet { .. } => "acl-role-set",
            Command::AclRoleDelete { .. } => "acl-role-delete",
            Command::AclAuthMethodSet { .. } => "acl-auth-method-set",
            Command::AclAuthMethodDelete { .. } => "acl-auth-method-delete",
            Command::AclBindingRuleSet { .. } => "acl-binding-rule-set",
            Command::AclBindingRuleDelete { .. } => "acl-binding-rule-delete",
            Command::AclBootstrap { .. } | Command::AclBootstrapReset { .. } => "acl-bootstrap",
            Command::AclInit { .. } => "acl-init",
            Command::CaSet { .. } => "ca-set",
            Command::EventFire { .. } => "event-fire",
            Command::AutopilotSet { .. } => "autopilot-set",
            Command::CoordinateBatch { .. } => "coordinate-batch",
            Command::FederationStateSet { .. } => "federation-state-set",
            Command::FederationStateDelete { .. } => "federation-state-delete",
            Command::QuerySet { .. } => "query-set",
            Command::QueryDelete { .. } => "query-delete",
            Command::AclReplicate { .. } => "acl-replicate",
            Command::ConfigReplicate { .. } => "config-replicate",
            Command::VirtualIpsSet { .. } => "virtual-ips-set",
            Command::Timed { cmd, .. } => match cmd {
                crate::state::Timeable::Kv(_) => "timed-kv",
                crate::state::Timeable::Txn(_) => "timed-txn",
                crate::state::Timeable::SessionDestroy { .. } => "timed-session-destroy",
            },
        };
        f.write_str(kind)
    }
}

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::One(c) => c.fmt(f),
            Payload::Batch(b) => write!(f, "batch of {}", b.len()),
        }
    }
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Payload,
        R = Response,
        NodeId = u64,
        Node = ServerNode,
        AsyncRuntime = runtime::Runtime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// What `RaftLogStorage::append` is given, its bounds named once for both
/// log stores (the disk's and the simulation's).
pub trait Entries: IntoIterator<Item = Entry, IntoIter: OptionalSend> + OptionalSend {}
impl<I: IntoIterator<Item = Entry, IntoIter: OptionalSend> + OptionalSend> Entries for I {}
pub type Membership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot's bytes (bincode of a state version), whole in memory.
pub use state_machine::SnapshotData;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// The error storage traits return: openraft 0.10 takes plain I/O errors.
pub type StorageError = std::io::Error;

/// Wraps any I/O or decoding failure, saying what was being done.
pub(crate) fn io_err(what: &str, e: impl std::fmt::Display) -> StorageError {
    std::io::Error::other(format!("{what}: {e}"))
}

/// How often the leader heartbeats each follower, in milliseconds.
pub const HEARTBEAT_MS: u64 = 150;
/// How long a leader answers default-mode reads after a quorum last
/// acknowledged it (`Cluster::is_ready_leader`): 100 ms short of the
/// least election timeout (600 ms), as Consul's 500 ms lease is half its
/// election timeout.
pub const LEADER_LEASE: std::time::Duration = std::time::Duration::from_millis(500);

/// The Raft timing used by every server: elections within ~1s of a leader
/// loss, heartbeats well inside that.
pub fn raft_config(snapshot_threshold: u64) -> openraft::Config {
    openraft::Config {
        cluster_name: "cairn".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: 600,
        election_timeout_max: 1200,
        max_payload_entries: 512,
        // Covers sending the snapshot and installing it on the receiver:
        // seconds for a million entries.
        install_snapshot_timeout: 30_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_threshold),
        max_in_snapshot_log_to_keep: (snapshot_threshold / 10).min(1_000),
        purge_batch_size: (snapshot_threshold / 4).clamp(1, 1024),
        // openraft 0.10 lets a restarted leader resume leading without an
        // election by default; its docs warn that this is unsafe when the
        // state machine is not flushed by apply and the committed id is not
        // persisted, which is cairn's case (the log is the durable record).
        enable_leader_restore: Some(false),
        ..Default::default()
    }
}

#[cfg(test)]
mod storage_suite {
    //! openraft's own conformance suite, run against the sled log store and
    //! the state machine on sled.

    use std::sync::Arc;

    use openraft::testing::log::{StoreBuilder, Suite};

    use super::TypeConfig;
    use super::log_store::LogStore;
    use super::state_machine::StateMachine;

    type StorageError = openraft::StorageError<TypeConfig>;
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
            let log = LogStore::open(
                &db,
                &dir.path().join("db"),
                &dir.path().join("log"),
                super::log_store::SEGMENT_BYTES,
            )
            .expect("log store");
            let store = Arc::new(
                Store::open(Box::new(
                    SledBackend::new(&db, &dir.path().join("db")).expect("tree"),
                ))
                .expect("store"),
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sled_store_passes_openraft_suite() -> Result<(), StorageError> {
        Suite::test_all(SledBuilder).await?;
        Ok(())
    }
}
