//! The state store: the tables every server holds, written only by the Raft
//! state machine's apply.
//!
//! `State` is an immutable version of all tables built from persistent maps
//! (`imbl`), so a reader takes the current version without a lock (MVCC, as
//! Consul's memdb) while the single writer builds the next one. Every apply
//! reports what it changed (`ChangeSet`): the rows before and after, and the
//! watch keys whose blocking queries must wake.
//!
//! The machinery:
//!
//! - `keys` (`WatchKey`, built only there), `tx` (`Tx`, a write in
//!   progress; each table's file adds its own `put_*`/`remove_*`, so `tx`
//!   knows no table), `apply` (the only writer: a command dispatched to its
//!   table through a `Tx`), `derived` (indexes rebuilt after a load or a
//!   snapshot), `watch` (per-key wake-ups for blocking queries).
//! - `persist`: rows on sled, or in memory for the simulation; a replace is
//!   atomic, a new tree swapped in.
//! - `write_behind`: applied batches merged and written to `persist` every
//!   100 ms by a thread of their own (a 20 ms tick while fewer than 128
//!   rows wait), in atomic write-outs of at most 512 rows and 8 MiB. A
//!   snapshot install's or restore's whole new state is one write-out of
//!   its own. In the simulation, every few batches, without a thread.
//! - `snapshot`: a version encoded and decoded; `export` for
//!   `GET /v1/snapshot`. After the bincode body comes a JSON trailer, so
//!   additions (autopilot's configuration, the prepared queries, ...) need
//!   no new format: a snapshot from before the trailer (the data ends with
//!   the body) still decodes, one cut inside its trailer or with bytes
//!   after it is refused. Every length read from the data is bounded by the
//!   data's own (bincode with a limit), never allocated beyond it.
//! - `restore` (a snapshot restored through Raft: staged chunks, one commit
//!   that swaps the state, indexes raised) and `tombstones` (which index
//!   rows are tombstones, floors, reaping).
//!
//! The tables:
//!
//! - `kv`; `session` (sessions, KV locks, lock-delay, invalidation);
//!   `catalog` (apply and queries; `query_instances`: the instances a
//!   prepared query finds here, by health, meta and tags).
//! - `coordinate`: one per node. `Command::CoordinateBatch` stores at most
//!   640, only those whose node is in the catalog and whose coordinate
//!   checks; in rows and the snapshot trailer; a node's goes with it.
//! - `federation`: one meta row per datacenter, written by
//!   `Command::FederationStateSet`; in the snapshot trailer when present.
//! - `query`: prepared queries, written by `Command::QuerySet` (create, or
//!   with `update` replace) and `QueryDelete`. Names are unique in any case
//!   and never another query's ID. What a query finds is a catalog read
//!   (`catalog::query_instances`), so that `session` (which deletes a
//!   session's queries) ← `query` never reaches back to `catalog`.
//! - `operator`: autopilot's configuration, a meta row written by
//!   `Command::AutopilotSet` with a CAS on its index; Consul's defaults
//!   when unset.
//! - `connect`: the Connect CA, written whole by `Command::CaSet` with a
//!   CAS on the configuration's index. The configuration's `ClusterID`
//!   names the trust domain and the state's cluster id follows it, so a
//!   secondary's becomes the primary's with its roots.
//! - `gateways`: Consul's gateway-services table, computed on read.
//! - `virtual_ip`: transparent proxy's virtual IPs. A service's is assigned
//!   in the apply of its first connect-capable registration (the row shows
//!   it as the `consul-virtual` tagged address), and a service a
//!   terminating gateway's entry names gets one in the apply writing the
//!   entry (`Tx::put_config`); the gateway's instances show it, set with
//!   every write of an instance or of its entry. `fill` puts them into a
//!   chain's compile request.
//! - `events`: user events, a ring of the last 256 fired, in memory only.
//!   Each is timed (`LTime`) by its entry's Raft index, so the same on
//!   every server whatever its ring holds.
//! - `acl`: tokens, the secret sealed beside the hash where a server had a
//!   key (`acl::seal`); policies, roles, auth methods and binding rules (a
//!   method's delete takes its rules and its logins' tokens in the same
//!   apply); the bootstrap mark. `replicate`: the primary's objects in a
//!   secondary, links unchecked, local tokens never deleted, overwritten
//!   or displaced.
//! - `token_resolver`: a secret to its `acl::Authorizer` against one
//!   version. An `ExpirationTime` is judged by the server's clock (the wall
//!   clock; the simulation's its own). The cache holds the rules that apply
//!   here: its policies' and roles' that hold in this datacenter (a
//!   policy's `Datacenters`), and those its and its roles' identities
//!   expand to here (`structs::identity::rules_in`), so an identity costs
//!   nothing per request.

pub mod acl;
mod apply;
pub mod catalog;
pub mod config;
pub mod connect;
pub mod coordinate;
mod derived;
pub mod events;
pub mod federation;
pub mod gateways;
pub mod kv;
pub mod operator;
pub mod persist;
pub mod query;
pub mod restore;
pub mod session;
pub mod snapshot;
pub mod token_resolver;
pub mod tombstones;
pub(crate) mod tx;
pub mod virtual_ip;
pub mod watch;
pub mod write_behind;

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::structs::acl::{AclPolicy, AclRole, AclToken};
use crate::structs::config_entry::{ConfigEntry, Kind};
use crate::structs::serde_util::{as_json, raw_bytes};
use crate::structs::{
    DeregisterRequest, HealthCheck, KvEntry, KvOp, KvOutcome, Node, NodeService, RegisterRequest,
    Session, TxnError, TxnOp, TxnResult,
};

pub use apply::{apply_command, apply_payload};
pub use persist::{MemoryBackend, Ops, Persist, SledBackend};
pub use tx::{pair_key, split_pair_key};
pub use watch::Watches;
pub use write_behind::WriteBehind;

/// (node name, service id) or (node name, check id).
pub type NodeKey = (String, String);

/// A command replicated through Raft: the only way state changes. The
/// log holds it in bincode, by variant position: a new one goes last, and
/// `tests/wire_golden.rs` fails on any other change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    Kv(KvOp),
    /// `PUT /v1/txn`: all its operations apply, or none.
    Txn(Vec<TxnOp>),
    Register(#[serde(with = "as_json")] Box<RegisterRequest>),
    Deregister(#[serde(with = "as_json")] DeregisterRequest),
    /// A config entry (Consul JSON), already decoded and validated on its
    /// own by the server that received it; apply decodes it again and
    /// validates the discovery-chain graph against the state it applies to.
    ConfigSet {
        #[serde(with = "as_json")]
        entry: Value,
        cas: Option<u64>,
    },
    ConfigDelete {
        kind: String,
        name: String,
        cas: Option<u64>,
    },
    /// Written once by the server that bootstraps the cluster.
    InitCluster {
        cluster_id: String,
    },
    Noop,
    /// Proposed by the leader: forget the tombstones at or below this
    /// index (see `tombstones`).
    ReapTombstones {
        upto: u64,
    },
    /// A session with its ID (made by the server that received the
    /// request). `server_node`: its node is that server's own.
    SessionCreate {
        #[serde(with = "as_json")]
        session: Session,
        server_node: bool,
    },
    /// Destroys a session (API destroy, TTL expiry) and releases its locks.
    SessionDestroy {
        id: String,
    },
    /// A command that needs the time (lock-delay), stamped by the proposing
    /// server's clock (ms since the epoch); see `state::session`.
    Timed {
        now_ms: u64,
        cmd: Timeable,
    },
    /// Chunk `seq` of a snapshot being restored (see `restore`).
    RestoreChunk {
        id: String,
        seq: u32,
        #[serde(with = "raw_bytes")]
        data: Vec<u8>,
    },
    /// Replaces the whole state with the staged snapshot, checked whole.
    RestoreCommit {
        id: String,
        chunks: u32,
        len: u64,
        crc: u32,
    },
    /// Drops a staged restore (its proposer gave up or lost office).
    RestoreAbort {
        id: String,
    },
    /// ACL writes (`state::acl`). A token carries the hash of its secret,
    /// never the secret: the Raft log holds no secrets either.
    AclTokenSet {
        #[serde(with = "as_json")]
        token: Box<AclToken>,
    },
    AclTokenDelete {
        accessor: String,
    },
    AclPolicySet {
        #[serde(with = "as_json")]
        policy: Box<AclPolicy>,
    },
    AclPolicyDelete {
        id: String,
    },
    AclRoleSet {
        #[serde(with = "as_json")]
        role: Box<AclRole>,
    },
    AclRoleDelete {
        id: String,
    },
    /// `PUT /v1/acl/bootstrap`: refused once done.
    AclBootstrap {
        #[serde(with = "as_json")]
        token: Box<AclToken>,
    },
    /// Proposed by a leader with ACLs on: the built-ins and the initial
    /// management token, if missing.
    AclInit {
        #[serde(with = "as_json")]
        initial_management: Option<Box<AclToken>>,
    },
    /// The Connect CA whole (configuration and roots with their keys), with
    /// the configuration's `ModifyIndex` its proposer read (see
    /// `state::connect::set`).
    CaSet {
        #[serde(with = "as_json")]
        ca: Box<connect::CaState>,
        cas: Option<u64>,
    },
    /// `PUT /v1/acl/bootstrap` once more, after an operator's reset: allowed
    /// only while `reset_index` is the index the last bootstrap reported
    /// (Consul's `acl-bootstrap-reset` file in the leader's data dir).
    AclBootstrapReset {
        #[serde(with = "as_json")]
        token: Box<AclToken>,
        reset_index: u64,
    },
    /// `PUT /v1/event/fire/:name`: a user event, with its ID made by the
    /// server that received it (`state::events`). After the older ones:
    /// older log entries still decode.
    EventFire {
        #[serde(with = "as_json")]
        event: Box<crate::structs::event::UserEvent>,
    },
    /// Autopilot's configuration whole; with `cas`, only while its
    /// `ModifyIndex` is still that (0: never set). Last, as above.
    AutopilotSet {
        #[serde(with = "as_json")]
        config: crate::structs::operator::AutopilotConfig,
        cas: Option<u64>,
    },
    /// Network coordinates gathered by the leader (`state::coordinate`),
    /// applied together. Last, as above.
    CoordinateBatch {
        #[serde(with = "as_json")]
        updates: Vec<crate::coordinate::Update>,
    },
    /// WAN federation: what the primary knows of one datacenter, whole
    /// (`state::federation`). Last, as above.
    FederationStateSet {
        #[serde(with = "as_json")]
        state: Box<crate::structs::federation::FederationState>,
    },
    /// A prepared query whole (`state::query`): created, or with `update`
    /// replacing the one of its ID. Last, as above.
    QuerySet {
        #[serde(with = "as_json")]
        query: Box<crate::structs::query::PreparedQuery>,
        update: bool,
    },
    /// Deletes a prepared query. Last, as above.
    QueryDelete {
        id: String,
    },
    /// Replication from the primary datacenter (`leader::replication`):
    /// the primary's ACL objects that differ here, and the IDs of those it
    /// no longer has, applied together (deletes first). Local tokens are
    /// never touched (`state::acl::replicate`). Last, as above.
    AclReplicate {
        #[serde(with = "as_json")]
        set: Box<crate::structs::replication::AclReplica>,
        delete_tokens: Vec<String>,
        delete_roles: Vec<String>,
        delete_policies: Vec<String>,
    },
    /// The same for config entries (Consul JSON; intentions are
    /// `service-intentions` entries): `(kind, name)` of those gone from the
    /// primary. Last, as above.
    ConfigReplicate {
        #[serde(with = "as_json")]
        set: Vec<Value>,
        delete: Vec<(String, String)>,
    },
    /// `PUT /v1/internal/service-virtual-ip`: a service's manual virtual
    /// IPs whole (`state::virtual_ip`). Last, as above.
    VirtualIpsSet {
        service: String,
        manual: Vec<String>,
    },
    /// WAN federation: the primary forgets a datacenter no server of it
    /// is known any more (`force-leave -wan`, or expired unheard from).
    /// Last, as above.
    FederationStateDelete {
        datacenter: String,
    },
    /// `/v1/acl/auth-method`: an auth method whole (`state::acl`). Last,
    /// as above, with the three below.
    AclAuthMethodSet {
        #[serde(with = "as_json")]
        method: Box<crate::structs::auth::AclAuthMethod>,
    },
    /// Deletes the method, its binding rules and its logins' tokens.
    AclAuthMethodDelete {
        name: String,
    },
    AclBindingRuleSet {
        #[serde(with = "as_json")]
        rule: Box<crate::structs::auth::AclBindingRule>,
    },
    AclBindingRuleDelete {
        id: String,
    },
}

/// What one Raft entry carries. Flat by type: a batch holds single
/// commands, never another batch, so decoding an entry a peer sent cannot
/// recurse however the bytes were crafted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Payload {
    One(Command),
    /// Client writes that arrived together, applied in order at one Raft
    /// index as one change set (see `Server::write`): each answers on its own.
    Batch(Vec<Command>),
}

/// The commands that need the time. Its own type, not a boxed `Command`:
/// a stamped command never holds another, so decoding an entry a peer sent
/// cannot recurse (as `Payload` is flat).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Timeable {
    Kv(KvOp),
    Txn(Vec<TxnOp>),
    SessionDestroy { id: String },
}

impl From<Timeable> for Command {
    fn from(t: Timeable) -> Command {
        match t {
            Timeable::Kv(op) => Command::Kv(op),
            Timeable::Txn(ops) => Command::Txn(ops),
            Timeable::SessionDestroy { id } => Command::SessionDestroy { id },
        }
    }
}

impl Command {
    /// Refuses a name or ID holding a control character (NUL included): no
    /// Consul client writes one, and they break logs and line-based tools.
    /// (Persisted keys no longer depend on it: `pair_key` is injective.)
    /// Checked for every write before it is proposed.
    pub fn check_names(&self) -> Result<(), String> {
        fn check(what: &str, v: &str) -> Result<(), String> {
            if v.chars().any(char::is_control) {
                return Err(format!(
                    "Invalid {what} {v:?}: names and IDs may not contain control characters"
                ));
            }
            Ok(())
        }
        fn check_health(c: &HealthCheck) -> Result<(), String> {
            check("node name", &c.node)?;
            check("check ID", &c.check_id)?;
            check("service ID", &c.service_id)
        }
        fn check_txn(ops: &[TxnOp]) -> Result<(), String> {
            ops.iter().try_for_each(|op| match op {
                TxnOp::Kv(op) => check("key", &op.key),
                TxnOp::Node { node, .. } => {
                    check("node name", &node.node)?;
                    check("node ID", &node.id)
                }
                TxnOp::Service { node, service, .. } => {
                    check("node name", node)?;
                    check("service ID", &service.id)?;
                    check("service name", &service.service)
                }
                TxnOp::Check { check: c, .. } => check_health(c),
            })
        }
        match self {
            Command::Kv(op) => check("key", &op.key),
            Command::Txn(ops) => check_txn(ops),
            Command::Register(r) => {
                check("node name", &r.node)?;
                if let Some(svc) = &r.service {
                    check("service ID", &svc.id)?;
                    check("service name", &svc.service)?;
                }
                r.check
                    .iter()
                    .chain(r.checks.iter())
                    .try_for_each(check_health)
            }
            Command::Deregister(r) => {
                check("node name", &r.node)?;
                check("service ID", &r.service_id)?;
                check("check ID", &r.check_id)
            }
            Command::ConfigSet { entry, .. } => ["Kind", "Name"]
                .iter()
                .filter_map(|k| entry.get(k).and_then(Value::as_str))
                .try_for_each(|v| check("config entry name", v)),
            Command::ConfigDelete { kind, name, .. } => {
                check("config entry kind", kind)?;
                check("config entry name", name)
            }
            Command::SessionCreate { session, .. } => {
                check("node name", &session.node)?;
                check("session ID", &session.id)
            }
            Command::SessionDestroy { id }
            | Command::Timed {
                cmd: Timeable::SessionDestroy { id },
                ..
            } => check("session ID", id),
            Command::Timed {
                cmd: Timeable::Kv(op),
                ..
            } => check("key", &op.key),
            Command::Timed {
                cmd: Timeable::Txn(ops),
                ..
            } => check_txn(ops),
            Command::RestoreChunk { id, .. }
            | Command::RestoreCommit { id, .. }
            | Command::RestoreAbort { id } => check("snapshot restore ID", id),
            Command::AclTokenSet { token }
            | Command::AclBootstrap { token }
            | Command::AclBootstrapReset { token, .. } => {
                check("token description", &token.description)?;
                check("accessor ID", &token.accessor_id)
            }
            Command::AclPolicySet { policy } => {
                check("policy ID", &policy.id)?;
                check("policy name", &policy.name)
            }
            Command::AclRoleSet { role } => {
                check("role ID", &role.id)?;
                check("role name", &role.name)
            }
            Command::AclAuthMethodSet { method } => check("auth method name", &method.name),
            Command::AclAuthMethodDelete { name } => check("auth method name", name),
            Command::AclBindingRuleSet { rule } => {
                check("binding rule ID", &rule.id)?;
                check("auth method name", &rule.auth_method)
            }
            Command::InitCluster { .. }
            | Command::Noop
            | Command::ReapTombstones { .. }
            | Command::AclTokenDelete { .. }
            | Command::AclPolicyDelete { .. }
            | Command::AclRoleDelete { .. }
            | Command::AclBindingRuleDelete { .. }
            | Command::AclInit { .. }
            | Command::CaSet { .. }
            | Command::AutopilotSet { .. } => Ok(()),
            Command::CoordinateBatch { updates } => {
                updates.iter().try_for_each(|u| check("node name", &u.node))
            }
            Command::EventFire { event } => check("event name", &event.name),
            Command::FederationStateSet { state } => check("datacenter", &state.datacenter),
            Command::FederationStateDelete { datacenter } => check("datacenter", datacenter),
            Command::QuerySet { query, .. } => {
                check("query ID", &query.id)?;
                check("query name", &query.name)
            }
            Command::QueryDelete { id } => check("query ID", id),
            Command::AclReplicate { set, .. } => {
                for t in &set.tokens {
                    check("token description", &t.description)?;
                    check("accessor ID", &t.accessor_id)?;
                }
                for p in &set.policies {
                    check("policy ID", &p.id)?;
                    check("policy name", &p.name)?;
                }
                set.roles.iter().try_for_each(|r| {
                    check("role ID", &r.id)?;
                    check("role name", &r.name)
                })
            }
            Command::ConfigReplicate { set, delete } => {
                for entry in set {
                    ["Kind", "Name"]
                        .iter()
                        .filter_map(|k| entry.get(k).and_then(Value::as_str))
                        .try_for_each(|v| check("config entry name", v))?;
                }
                delete.iter().try_for_each(|(kind, name)| {
                    check("config entry kind", kind)?;
                    check("config entry name", name)
                })
            }
            Command::VirtualIpsSet { service, .. } => check("service name", service),
        }
    }
}

impl From<Command> for Payload {
    fn from(c: Command) -> Self {
        Payload::One(c)
    }
}

/// What applying a command answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Ok,
    Kv(KvOutcome),
    Txn(Result<Vec<TxnResult>, Vec<TxnError>>),
    /// A precondition failed (cas), answered as `false`.
    Bool(bool),
    /// The command was refused by the state machine (bad input that only the
    /// state can reveal, e.g. a check for an unknown service): a 400.
    Rejected(String),
    /// The answers of a `Payload::Batch`, in its order.
    Batch(Vec<Response>),
    /// What `Command::VirtualIpsSet` did.
    Manual(virtual_ip::ManualOutcome),
}

/// One row of any table, shared with the version that holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    Kv(Arc<KvEntry>),
    Node(Arc<Node>),
    Service(Arc<NodeService>),
    Check(Arc<HealthCheck>),
    Config(Arc<ConfigEntry>),
    Session(Arc<Session>),
    LockDelay(session::LockDelay),
    /// A chunk of a snapshot restore being staged.
    RestoreChunk(Arc<Vec<u8>>),
    Acl(acl::AclRow),
    ConnectCa(Arc<connect::CaState>),
    Autopilot(Arc<crate::structs::operator::AutopilotConfig>),
    Coordinate(Arc<crate::coordinate::Update>),
    Federation(Arc<crate::structs::federation::FederationState>),
    Query(Arc<crate::structs::query::PreparedQuery>),
    VirtualIp(Arc<virtual_ip::ServiceVirtualIp>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Kv,
    Nodes,
    Services,
    Checks,
    Config,
    Sessions,
    LockDelays,
    /// Chunks of a staged snapshot restore: persisted, not shown.
    Restore,
    /// Tokens, policies, roles and the bootstrap mark (`state::acl`).
    Acl,
    /// Tombstones and per-key indexes: persisted, not shown.
    Index,
    /// The Connect CA (one row).
    ConnectCa,
    /// Network coordinates, one per node (`coordinate`).
    Coordinates,
    Meta,
}

/// One changed row.
#[derive(Debug, Clone)]
pub struct Change {
    pub table: Table,
    /// The row's key in its table (for services and checks their node and
    /// ID, for config entries kind and name, as `pair_key`).
    pub key: String,
    pub before: Option<Row>,
    pub after: Option<Row>,
}

/// All that one applied command changed.
#[derive(Debug, Clone, Default)]
pub struct ChangeSet {
    pub index: u64,
    pub changes: Vec<Change>,
    /// Keys of blocking queries to wake (see `watch`), with their new index.
    pub watch_keys: BTreeSet<WatchKey>,
    /// The whole state was replaced (a snapshot restore): `changes` do not
    /// list it, so it is persisted whole and subscribers start over.
    pub replaced: bool,
}

/// One version of every table.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Raft index of the last applied command.
    pub index: u64,
    pub cluster_id: String,
    /// Keys shared (`Arc<str>`): a write clones the B-tree node it
    /// touches, up to 64 keys, which then costs no allocation each.
    pub kv: OrdMap<Arc<str>, Arc<KvEntry>>,
    pub nodes: OrdMap<String, Arc<Node>>,
    pub services: OrdMap<NodeKey, Arc<NodeService>>,
    /// service name → instances of it.
    pub service_names: OrdMap<String, OrdSet<NodeKey>>,
    /// destination service name → connect proxies for it.
    pub connect_names: OrdMap<String, OrdSet<NodeKey>>,
    pub checks: OrdMap<NodeKey, Arc<HealthCheck>>,
    /// (kind, name) → config entry, with its indexes.
    pub config: OrdMap<(Kind, String), Arc<ConfigEntry>>,
    /// service → services whose router/splitter/resolver refers to it
    /// (with a count of such entries): what a write can affect.
    pub config_refs: OrdMap<String, OrdMap<String, u32>>,
    /// watch key → index of its last change; survives deletes (tombstones)
    /// until reaped; `reaped/<family>` rows hold each family's floor.
    pub indexes: OrdMap<WatchKey, u64>,
    /// The object keys among `indexes` whose object is gone, with their
    /// index (derived: see `tombstones`).
    pub tombstones: OrdMap<WatchKey, u64>,
    pub sessions: OrdMap<String, Arc<Session>>,
    /// node → its sessions' ids (derived).
    pub node_sessions: OrdMap<String, OrdSet<String>>,
    /// session id → the keys it has locked (derived).
    pub session_keys: OrdMap<String, OrdSet<String>>,
    /// KV key → its lock-delay after its session was invalidated.
    pub lock_delays: OrdMap<String, session::LockDelay>,
    /// The time of the `Command::Timed` being applied, `None` outside one.
    pub now_ms: Option<u64>,
    /// A snapshot restore being staged (see `restore`).
    pub restore: Option<Staged>,
    /// ACL tokens by accessor ID (see `acl`).
    pub acl_tokens: OrdMap<String, Arc<AclToken>>,
    /// Hex SHA-256 of a token's secret → its accessor (derived).
    pub acl_secrets: OrdMap<String, String>,
    pub acl_policies: OrdMap<String, Arc<AclPolicy>>,
    pub acl_roles: OrdMap<String, Arc<AclRole>>,
    /// Auth methods by name, binding rules by ID (`acl`).
    pub acl_auth_methods: OrdMap<String, Arc<crate::structs::auth::AclAuthMethod>>,
    pub acl_binding_rules: OrdMap<String, Arc<crate::structs::auth::AclBindingRule>>,
    /// The index `PUT /v1/acl/bootstrap` succeeded at; 0: not yet.
    pub acl_bootstrapped: u64,
    /// The Connect CA, once the first leader made it.
    pub connect_ca: Option<Arc<connect::CaState>>,
    /// Autopilot's configuration, once an operator set it (else defaults).
    pub autopilot: Option<Arc<crate::structs::operator::AutopilotConfig>>,
    /// WAN federation states by datacenter (the primary's; `federation`).
    pub federation: OrdMap<String, Arc<crate::structs::federation::FederationState>>,
    /// The last user events fired, oldest first (in memory only: see
    /// `events`).
    pub events: imbl::Vector<Arc<crate::structs::event::UserEvent>>,
    /// node → its network coordinate (`coordinate`).
    pub coordinates: OrdMap<String, Arc<crate::coordinate::Update>>,
    /// Prepared queries by ID (`query`).
    pub queries: OrdMap<String, Arc<crate::structs::query::PreparedQuery>>,
    /// service → its virtual IPs (`virtual_ip`).
    pub virtual_ips: OrdMap<String, Arc<virtual_ip::ServiceVirtualIp>>,
    /// An assigned virtual IP → its service (derived).
    pub virtual_ip_owners: OrdMap<u32, String>,
}

impl State {
    /// The index a blocking query on these watch keys reports: the latest
    /// change to any of them, never 0 (Consul clients treat 0 as "no index").
    pub fn index_of<'a>(&self, keys: impl IntoIterator<Item = &'a WatchKey>) -> u64 {
        keys.into_iter()
            .map(|k| match self.indexes.get(k) {
                Some(i) => *i,
                // Never written, or its tombstone reaped: the floor keeps
                // the index from going backwards across a reap.
                None => tombstones::floor(self, k),
            })
            .max()
            .unwrap_or(0)
            .max(1)
    }

    /// The latest change under a watch-key prefix (e.g. `kv/foo/`).
    pub fn index_of_prefix(&self, prefix: &WatchKey) -> u64 {
        let mut max = tombstones::floor(self, prefix).max(1);
        for (k, v) in self.indexes.range(prefix.clone()..) {
            if !k.starts_with(prefix.as_str()) {
                break;
            }
            max = max.max(*v);
        }
        max
    }
}

/// A restore being staged: its id and the chunks applied so far.
#[derive(Clone, PartialEq, Default)]
pub struct Staged {
    pub id: String,
    pub chunks: imbl::Vector<Arc<Vec<u8>>>,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged")
            .field("id", &self.id)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

pub mod keys;
pub use keys::WatchKey;

/// The store a server reads: the current version, the watches, and the
/// persistence of every applied change.
pub struct Store {
    current: ArcSwap<State>,
    pub watches: Watches,
    persist: Box<dyn Persist>,
}

impl Store {
    /// Opens the store, loading what the backend holds.
    pub fn open(persist: Box<dyn Persist>) -> anyhow::Result<Self> {
        persist::check_format(&*persist)?;
        let state = persist::load_state(&*persist)?;
        Ok(Store {
            current: ArcSwap::from_pointee(state),
            watches: Watches::default(),
            persist,
        })
    }

    /// The current version; never blocks.
    pub fn state(&self) -> Arc<State> {
        self.current.load_full()
    }

    pub fn persist(&self) -> &dyn Persist {
        &*self.persist
    }

    /// Installs a new version: persists the changes with `meta` rows in one
    /// atomic batch, publishes the version, then wakes the watchers.
    /// A set that replaced the whole state (a restore) is persisted as a
    /// replace of everything, as a snapshot install.
    pub fn commit(&self, next: State, sets: &[ChangeSet], meta: Ops) -> anyhow::Result<()> {
        self.install(next, sets, meta)?;
        self.wake(sets);
        Ok(())
    }

    /// `commit` without waking the watchers (a replace wakes them all):
    /// Raft's apply answers the writers first, then calls `wake`, so that
    /// a write's answer does not queue behind the thousands of blocking
    /// queries it wakes.
    pub fn install(&self, next: State, sets: &[ChangeSet], meta: Ops) -> anyhow::Result<()> {
        if sets.iter().any(|s| s.replaced) {
            return self.replace(next, meta);
        }
        persist::write_changes(&*self.persist, sets, &next, meta)
            .with_context(|| format!("write of state rows to {}", self.persist.location()))?;
        self.current.store(Arc::new(next));
        Ok(())
    }

    /// Wakes the watchers of what `sets` changed.
    pub fn wake(&self, sets: &[ChangeSet]) {
        for set in sets {
            self.watches.notify(&set.watch_keys, set.index);
        }
    }

    /// Replaces everything (snapshot install).
    pub fn replace(&self, next: State, meta: Ops) -> anyhow::Result<()> {
        persist::replace_all(&*self.persist, &next, meta)
            .with_context(|| format!("replacing the state in {}", self.persist.location()))?;
        self.current.store(Arc::new(next));
        self.watches.notify_all();
        Ok(())
    }
}
