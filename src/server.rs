//! Wires a server's core together: sled, the Raft log and state machine,
//! the transport, cluster formation, the event publisher, the views and
//! proxycfg (its listeners are `process`'s). `ServerConfig::primary` is
//! `--primary-datacenter`, else its own datacenter. The `Server`'s fields
//! are private: the endpoint layer, the adapters, the leader module, the
//! process and the simulation reach it through the handle's methods
//! (`state()`, `watches()`, `datacenter()`, `cluster()`, ...).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::error::{Error, Result};
use crate::raft::cluster::Cluster;
use openraft::RaftLogReader;
use openraft::async_runtime::WatchReceiver;
use openraft::storage::RaftLogStorage;

use crate::raft::encrypt::{KeyAccept, KeyConnect};
use crate::raft::log_store::LogStore;
use crate::raft::network::{self, Accept, Connect, Network, TcpConnect};
use crate::raft::secure::{TlsAccept, TlsConnect};
use crate::raft::state_machine::{SnapshotStore, StateMachine};
use crate::raft::{NodeId, Raft, ServerNode, TypeConfig, raft_config};
use crate::state::{Command, Payload, Persist, Response, SledBackend, Store, WriteBehind};
use crate::stream::Publisher;
use crate::tasks::Tasks;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub node: String,
    pub datacenter: String,
    pub data_dir: PathBuf,
    pub http_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    /// The address peers and the catalog know this server by
    /// (`--advertise`); none: the bound addresses.
    pub advertise: Option<std::net::IpAddr>,
    pub bootstrap_expect: usize,
    pub join: Vec<String>,
    /// The federation's primary datacenter (none: this one).
    pub primary_datacenter: Option<String>,
    /// Raft addresses of servers in other datacenters (`--join-wan`).
    pub join_wan: Vec<String>,
    /// Take a snapshot (and compact the log) after this many entries.
    pub snapshot_threshold: u64,
    /// Raft log segment size (a hidden flag; tests make it small).
    pub log_segment_bytes: u64,
    /// How long deleted objects' index entries (tombstones) are kept.
    pub tombstone_ttl: Duration,
    /// Connection budgets and timeouts of the ports.
    pub limits: Limits,
    /// HTTPS and the Raft transport's mutual TLS (none: plain TCP).
    pub tls: Option<Arc<ServerTls>>,
    /// The Raft transport's shared key (`--encrypt`): peers prove it and
    /// every byte is sealed with it (`raft::encrypt`).
    pub encrypt: Option<crate::raft::encrypt::EncryptKey>,
    /// Serve a non-loopback `raft_addr` with neither TLS nor a key
    /// (`--insecure-raft`): anyone reaching it could join the cluster.
    pub insecure_raft: bool,
    /// A `--dev` server: a playground on loopback, which federates over a
    /// plain transport as the shared test harnesses start it.
    pub dev: bool,
    /// `/debug/pprof/` served with ACLs off too (`--enable-debug`).
    pub enable_debug: bool,
    /// ACLs (off by default).
    pub acl: crate::state::token_resolver::AclConfig,
    /// The token this server's own agent sends (`--acl-agent-token`, else
    /// `--acl-token`; as a client agent's).
    pub agent_tokens: crate::structs::acl::AgentTokens,
    /// What a secondary's replication from the primary sends
    /// (`--acl-replication-token`, `acl.tokens.replication`): with it the
    /// primary checks Consul's permissions; without it the pull is trusted
    /// as a server's, over the authenticated transport.
    pub acl_replication_token: Option<String>,
    /// The configuration files (`--config-file`, `--config-dir`) whose
    /// service and check definitions the server's own agent registers.
    pub config_sources: crate::config_file::Sources,
    /// The web UI (`--ui`, `--ui-dir`; off by default).
    pub ui: crate::request::ui::UiConfig,
    /// Where its own agent takes script checks from (none by default).
    pub script_checks: crate::agent::spec::ScriptChecks,
}

/// A server's TLS: with the three files given, the Raft transport is
/// mutual TLS; HTTPS is served on `https_addr` if set.
#[derive(Debug)]
pub struct ServerTls {
    pub files: crate::tls::Tls,
    pub https_addr: Option<SocketAddr>,
    /// HTTPS clients must present a certificate signed by the CA.
    pub verify_incoming: bool,
    /// No plain HTTP listener (`--http-addr ""`): `http_addr` is then the
    /// HTTPS address, and the server is reached over HTTPS only.
    pub http_off: bool,
    /// The domain of servers' certificate names, `server.<dc>.<domain>`
    /// (`--domain`, without its final dot).
    pub domain: String,
}

/// Take a snapshot (and compact the log) after this many entries, unless
/// told otherwise.
pub const SNAPSHOT_THRESHOLD: u64 = 16_384;

/// `cairn server`'s defaults: `ServerConfig::new` starts from them and the
/// flags show them, so each is written once.
pub const DATACENTER: &str = "dc1";
pub const HTTP_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8500));
pub const RAFT_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8300));
/// How long deleted objects' index entries are kept (Consul's 15 minutes).
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(15 * 60);

impl ServerConfig {
    /// A server's settings with every default (`cairn server`'s flags
    /// start from the same): one server on loopback, datacenter `dc1`,
    /// no TLS, no ACLs. Callers change what they need with `..`.
    pub fn new(node: impl Into<String>, data_dir: PathBuf) -> ServerConfig {
        ServerConfig {
            node: node.into(),
            datacenter: DATACENTER.into(),
            data_dir,
            http_addr: HTTP_ADDR,
            raft_addr: RAFT_ADDR,
            advertise: None,
            bootstrap_expect: 0,
            join: Vec::new(),
            primary_datacenter: None,
            join_wan: Vec::new(),
            snapshot_threshold: SNAPSHOT_THRESHOLD,
            log_segment_bytes: crate::raft::log_store::SEGMENT_BYTES,
            tombstone_ttl: TOMBSTONE_TTL,
            limits: Default::default(),
            tls: None,
            encrypt: None,
            insecure_raft: false,
            dev: false,
            enable_debug: false,
            acl: Default::default(),
            agent_tokens: Default::default(),
            acl_replication_token: None,
            config_sources: Default::default(),
            ui: Default::default(),
            script_checks: Default::default(),
        }
    }

    /// The federation's primary datacenter.
    pub fn primary(&self) -> &str {
        self.primary_datacenter
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or(&self.datacenter)
    }

    /// The HTTP base address other servers and this server's agent reach
    /// it on: `host:port` for plain HTTP, `https://host:port` when only
    /// HTTPS is served.
    pub fn advertised_http(&self) -> String {
        // A wildcard address is reached on the advertised one.
        let mut addr = self.http_addr;
        if let Some(ip) = self.advertise
            && addr.ip().is_unspecified()
        {
            addr.set_ip(ip);
        }
        match &self.tls {
            Some(t) if t.http_off => format!("https://{addr}"),
            _ => addr.to_string(),
        }
    }

    /// The Raft address peers (and other datacenters) dial: the bound
    /// port at the advertised address, if one is given.
    pub fn advertised_raft(&self) -> SocketAddr {
        let mut addr = self.raft_addr;
        if let Some(ip) = self.advertise {
            addr.set_ip(ip);
        }
        addr
    }
}

/// What a server's ports accept (ARCHITECTURE.md: invariants).
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub raft_port: network::PortLimits,
    pub http: crate::request::serve::HttpLimits,
    /// sled's page cache, in bytes (default `SLED_CACHE_BYTES`).
    pub sled_cache_bytes: Option<u64>,
}

/// sled's page cache by default. It fills as pages are written or read and
/// is never allocated ahead, so a small state costs what it holds; the cap
/// matters for large states. The state is served from memory (`state`), so
/// sled is read on start and to find the pages a write changes: a cache
/// past the hot pages of those writes only duplicates the state in RSS.
pub const SLED_CACHE_BYTES: u64 = 64 << 20;

pub struct Server {
    config: ServerConfig,
    raft: Raft,
    store: Arc<Store>,
    publisher: Arc<Publisher>,
    cluster: Arc<Cluster>,
    proxycfg: crate::proxycfg::Manager,
    /// Leaf certificates this server signed for its own agent endpoint.
    leaves: crate::connect::Leaves,
    /// Materialized health views for blocking reads.
    views: Arc<crate::stream::view::Views>,
    /// The web UI's services summary as encoded at one catalog index,
    /// shared by every caller while ACLs are off (`http::ui`).
    ui_services: parking_lot::Mutex<Option<(u64, bytes::Bytes)>>,
    http: reqwest::Client,
    /// Set at shutdown: the Raft port stops serving (`network::serve`).
    raft_port_stop: tokio::sync::watch::Sender<bool>,
    /// Client agents' liveness leases (used by the leader).
    liveness: crate::leases::Leases,
    /// This server's own network coordinate (`http::coordinate` probes
    /// the other servers).
    coordinate: parking_lot::Mutex<crate::coordinate::Client>,
    /// Coordinate updates the leader applies in its next batch
    /// (`leader::coordinates`).
    coordinate_updates: crate::coordinate::Pending,
    /// The agent of this server's own node (set once `run` started it).
    agent: std::sync::OnceLock<Arc<crate::agent::Agent>>,
    /// Session TTL timers (used by the leader).
    sessions: crate::session_ttl::Timers,
    /// Token resolution and its cache (`state::token_resolver`).
    acl: Arc<crate::state::token_resolver::Resolver>,
    /// Seals token secrets for reads by `acl:write` (`acl::seal`): from
    /// `--encrypt`, else random for a dev server's life, else none.
    secret_seal: Option<crate::acl::seal::SecretSeal>,
    /// Auth methods' fetched keys (`login`).
    logins: crate::login::Logins,
    /// Set by a graceful leave (`PUT /v1/agent/leave`): the process stops.
    stop: tokio::sync::Notify,
    db: Option<sled::Db>,
    proposals: mpsc::UnboundedSender<Proposal>,
    /// What client writes accepted and not yet answered may hold: the
    /// channel above is bounded by these, not by its own capacity.
    queue_writes: Arc<Semaphore>,
    queue_bytes: Arc<Semaphore>,
    /// Blocking queries waiting at once (`Limits::http.max_blocking`),
    /// shared with the server's own agent.
    blocking: crate::request::serve::Blocking,
    /// Its critical background tasks; the run loop waits on their failure.
    tasks: Tasks,
    /// The term whose leader duties run here (`crate::leader`), if any.
    duties: crate::tasks::DutyTerm,
}

/// A client write waiting to be proposed, and where its answer goes.
struct Proposal {
    cmd: Command,
    /// Its encoded size.
    bytes: usize,
    done: oneshot::Sender<Result<Response>>,
    /// Its share of the queue budget, given back once it is answered.
    budget: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

/// Batches proposed at once; writes arriving meanwhile wait and go together.
/// Measured with openraft 0.10 (A/B, 1-256 writers): each client write as
/// its own entry costs ~25% more CPU per write at 256 writers; 8 in flight
/// lets 16 writers go nearly unbatched and still batches at 256.
const BATCHES_IN_FLIGHT: usize = 8;
/// The most client writes in one Raft entry.
const MAX_BATCH: usize = 256;
/// The most bytes of client writes (encoded) in one Raft entry; a larger
/// single write goes alone. Keeps an entry, and so an AppendEntries and a
/// frame, small whatever the writes' sizes (256 writes of 500 KiB made
/// one 128 MB entry that no follower would take: the cluster wedged).
pub const BATCH_BYTES: usize = 1 << 20;
/// The largest single write, encoded: one that could never be replicated
/// within the frame limit is refused up front (413). Request bodies stop at
/// 4 MiB (`http::MAX_BODY`), so only re-encoding overhead can reach it.
pub const MAX_COMMAND_BYTES: usize = 6 << 20;
/// Client writes accepted but not yet answered (queued or being
/// committed): past either budget a write answers 429 and changes nothing,
/// rather than queueing without bound and timing out into a 500.
pub const QUEUE_WRITES: usize = 8192;
pub const QUEUE_BYTES: usize = 64 << 20;

/// How long a write waits for a leader before answering `No cluster leader`.
pub const LEADER_HOLD: Duration = Duration::from_secs(7);

fn node_id(db: &sled::Db) -> anyhow::Result<u64> {
    let tree = db.open_tree("server")?;
    if let Some(v) = tree.get("node_id")? {
        let mut b = [0u8; 8];
        b.copy_from_slice(&v);
        return Ok(u64::from_be_bytes(b));
    }
    // Random, kept forever: a server replaced on a fresh data dir is a new server.
    let id = rand::random::<u64>() >> 1;
    tree.insert("node_id", &id.to_be_bytes())?;
    db.flush()?;
    Ok(id)
}

/// What a server is assembled from: its identity, Raft timing, storage and
/// transport. `Server::start` builds these on sled and TCP; the simulation
/// builds them in memory on a simulated network.
pub struct ServerParts<L, A> {
    pub id: NodeId,
    pub raft_config: openraft::Config,
    /// The Raft log and vote.
    pub log: L,
    /// Where the state machine's tables live.
    pub persist: Box<dyn Persist>,
    pub snapshots: SnapshotStore,
    /// Outgoing Raft and formation connections.
    pub connector: Arc<dyn Connect>,
    /// Incoming ones, already bound to `config.raft_addr`.
    pub listener: A,
    /// The sled database to flush on shutdown, if the parts live in one.
    pub sled: Option<sled::Db>,
    /// Sees every applied change set, before it is published (the
    /// simulation records what was committed with it).
    pub tap: Option<crate::stream::Tap>,
    /// The clock commands needing the time are stamped with (lock-delay).
    pub clock: crate::session_ttl::Clock,
}

impl<L, A> ServerParts<L, A> {
    /// The same parts over another transport: `wrap` of this one's.
    fn transport<B>(
        self, wrap: impl FnOnce(Arc<dyn Connect>, A) -> anyhow::Result<(Arc<dyn Connect>, B)>,
    ) -> anyhow::Result<ServerParts<L, B>> {
        let (connector, listener) = wrap(self.connector, self.listener)?;
        Ok(ServerParts {
            id: self.id,
            raft_config: self.raft_config,
            log: self.log,
            persist: self.persist,
            snapshots: self.snapshots,
            connector,
            listener,
            sled: self.sled,
            tap: self.tap,
            clock: self.clock,
        })
    }
}

/// The handle the HTTP layer, the leader module and the process reach a
/// server through: methods, not fields, so that what a server holds and
/// how stays its own business.
impl Server {
    /// The current version of the state: no lock, no Raft.
    pub fn state(&self) -> Arc<crate::state::State> {
        self.store.state()
    }
    /// Blocking queries' wake-ups, per watch key.
    pub fn watches(&self) -> &crate::state::Watches {
        &self.store.watches
    }
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }
    pub fn datacenter(&self) -> &str {
        &self.config.datacenter
    }
    /// This server's node name.
    pub fn node_name(&self) -> &str {
        &self.config.node
    }
    pub fn raft(&self) -> &Raft {
        &self.raft
    }
    /// Membership, formation and leadership (`raft::cluster`).
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }
    pub fn publisher(&self) -> &Arc<Publisher> {
        &self.publisher
    }
    pub fn proxycfg(&self) -> &crate::proxycfg::Manager {
        &self.proxycfg
    }
    pub fn leaves(&self) -> &crate::connect::Leaves {
        &self.leaves
    }
    pub fn views(&self) -> &Arc<crate::stream::view::Views> {
        &self.views
    }
    /// The UI's services summary last encoded, with its catalog index.
    pub fn ui_services(&self) -> &parking_lot::Mutex<Option<(u64, bytes::Bytes)>> {
        &self.ui_services
    }
    /// Checks logins' credentials (`login`).
    /// Asks the process to stop, as SIGTERM does (a graceful leave).
    pub fn request_stop(&self) {
        self.stop.notify_one();
    }

    /// Until a stop is asked for.
    pub async fn stop_requested(&self) {
        self.stop.notified().await
    }

    pub fn logins(&self) -> &crate::login::Logins {
        &self.logins
    }
    /// The HTTP client for calls to other servers.
    pub fn http_client(&self) -> &reqwest::Client {
        &self.http
    }
    pub fn liveness(&self) -> &crate::leases::Leases {
        &self.liveness
    }
    /// This server's own network coordinate.
    pub fn coordinate(&self) -> &parking_lot::Mutex<crate::coordinate::Client> {
        &self.coordinate
    }
    /// Coordinate updates the leader applies in its next batch.
    pub fn coordinate_updates(&self) -> &crate::coordinate::Pending {
        &self.coordinate_updates
    }
    /// The agent of this server's own node, once the process started it.
    pub fn agent(&self) -> Option<&Arc<crate::agent::Agent>> {
        self.agent.get()
    }
    /// Sets the server's own agent (once; later calls change nothing).
    pub fn set_agent(&self, agent: Arc<crate::agent::Agent>) {
        let _ = self.agent.set(agent);
    }
    pub fn sessions(&self) -> &crate::session_ttl::Timers {
        &self.sessions
    }
    /// Token resolution and its cache.
    pub fn acl(&self) -> &Arc<crate::state::token_resolver::Resolver> {
        &self.acl
    }
    /// Seals `secret` into `t` for later reads, where this server has a
    /// seal (`acl::seal`).
    pub fn seal_secret(&self, t: &mut crate::structs::acl::AclToken, secret: &str) {
        if let Some(seal) = &self.secret_seal {
            t.sealed_secret = seal.seal(&t.accessor_id, secret).unwrap_or_default();
        }
    }
    /// The secret sealed in `t`, if this server's seal opens it.
    pub fn open_secret(&self, t: &crate::structs::acl::AclToken) -> Option<String> {
        self.secret_seal
            .as_ref()?
            .open(&t.accessor_id, &t.sealed_secret)
    }
    pub fn blocking(&self) -> &crate::request::serve::Blocking {
        &self.blocking
    }
    pub fn tasks(&self) -> &Tasks {
        &self.tasks
    }
    pub fn duties(&self) -> &crate::tasks::DutyTerm {
        &self.duties
    }
}

/// A Raft port others can reach, open to anyone: a `Join` frame from
/// anywhere would make its sender a member.
#[derive(Debug, thiserror::Error)]
#[error(
    "--raft-addr {0} is not a loopback address and the Raft port has neither TLS nor --encrypt: \
     anyone reaching it could join the cluster (give --encrypt \"$(cairn keygen)\" or the --tls-* files, \
     or --insecure-raft to run it unprotected)"
)]
pub struct UnprotectedRaft(pub SocketAddr);

/// WAN federation asked for on a transport that proves nothing.
#[derive(Debug, thiserror::Error)]
#[error(
    "WAN federation (--join-wan, --primary-datacenter) needs an authenticated Raft transport: \
     anyone reaching a plain Raft port could claim a datacenter and be sent its tokens (give \
     --encrypt \"$(cairn keygen)\" or the --tls-* files to every server of every datacenter, \
     or --insecure-raft to accept that)"
)]
pub struct UnauthenticatedWan;

impl ServerConfig {
    /// Whether WAN frames are served: only where the transport
    /// authenticates its peers (`--encrypt`, mutual TLS), or where the
    /// operator said a plain one will do (`--insecure-raft`, `--dev`).
    /// Otherwise a greeting could declare a datacenter for good, a
    /// replication pull read every token's hash and a CSR be signed by the
    /// mesh root.
    pub fn serves_wan(&self) -> bool {
        self.tls.is_some() || self.encrypt.is_some() || self.insecure_raft || self.dev
    }

    /// Refuses federation flags this server could not serve safely.
    pub fn check_wan_protection(&self) -> std::result::Result<(), UnauthenticatedWan> {
        let federates = !self.join_wan.is_empty() || self.primary() != self.datacenter;
        if federates && !self.serves_wan() {
            return Err(UnauthenticatedWan);
        }
        Ok(())
    }

    /// Refuses an unprotected Raft port beyond loopback, unless told to.
    pub fn check_raft_protection(&self) -> std::result::Result<(), UnprotectedRaft> {
        let protected = self.tls.is_some() || self.encrypt.is_some();
        if protected || self.insecure_raft || self.raft_addr.ip().is_loopback() {
            return Ok(());
        }
        Err(UnprotectedRaft(self.raft_addr))
    }
}

impl Server {
    /// Opens the data dir, starts Raft and its transport (on `raft`, bound
    /// to `--raft-addr` by `process::Listeners::bind`), and begins forming
    /// or rejoining the cluster.
    pub async fn start(
        config: ServerConfig, raft: tokio::net::TcpListener,
    ) -> anyhow::Result<Arc<Server>> {
        config.check_raft_protection()?;
        config.check_wan_protection()?;
        std::fs::create_dir_all(&config.data_dir)?;
        let db_dir = config.data_dir.join("db");
        let db = sled::Config::new()
            .path(&db_dir)
            .cache_capacity(config.limits.sled_cache_bytes.unwrap_or(SLED_CACHE_BYTES))
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let rows_ok = config.data_dir.join(crate::state::persist::ROWS_OK);
        if !rows_ok.exists() && SledBackend::format_in(&db, &db_dir)?.is_some() {
            tracing::warn!(
                "{}: the state's rows are not vouched for (a storage fault stopped the last run, \
                 or they predate {}): rebuilding them from the snapshot and the Raft log",
                db_dir.display(),
                crate::state::persist::ROWS_OK
            );
            SledBackend::discard(&db)?;
        }
        let parts = ServerParts {
            id: node_id(&db)?,
            raft_config: raft_config(config.snapshot_threshold),
            log: LogStore::open(
                &db,
                &db_dir,
                &config.data_dir.join("raft-log"),
                config.log_segment_bytes,
            )?,
            persist: Box::new(WriteBehind::new(
                Box::new(SledBackend::new(&db, &db_dir)?),
                Some(config.data_dir.clone()),
            )?),
            snapshots: SnapshotStore::Dir(config.data_dir.join("snapshots")),
            connector: Arc::new(TcpConnect),
            listener: raft,
            sled: Some(db),
            clock: crate::session_ttl::wall_clock_ms,
            tap: None,
        };
        let server = match config.encrypt.clone() {
            None => Self::start_tls(config, parts).await?,
            Some(key) => {
                // The key outermost: a stranger without it reaches neither
                // the TLS parser nor the frame decoder.
                let parts = parts.transport(|connector, listener| {
                    let connector: Arc<dyn Connect> =
                        Arc::new(KeyConnect::new(connector, key.clone()));
                    Ok((connector, KeyAccept::new(listener, key)))
                })?;
                Self::start_tls(config, parts).await?
            }
        };
        // The rows loaded: vouched for until a storage fault.
        if !rows_ok.exists() {
            crate::disk::write_atomic_parts(&rows_ok, &[b"the state's rows are whole\n"])?;
        }
        Ok(server)
    }

    /// Puts mutual TLS on the Raft transport if the config has it, then
    /// assembles.
    async fn start_tls<L, A>(
        config: ServerConfig, parts: ServerParts<L, A>,
    ) -> anyhow::Result<Arc<Server>>
    where
        L: RaftLogStorage<TypeConfig>,
        A: Accept,
    {
        match config.tls.clone() {
            None => Self::assemble(config, parts).await,
            Some(tls) => {
                // Mutual TLS on the Raft port, both ways: the frame code
                // sees only streams whose peer proved a server certificate
                // of the CA.
                let parts = parts.transport(|connector, listener| {
                    let connector: Arc<dyn Connect> = Arc::new(TlsConnect::new(
                        connector,
                        &tls.files,
                        &config.datacenter,
                        &tls.domain,
                    )?);
                    let server = tls.files.raft_server(&tls.domain)?;
                    Ok((
                        connector,
                        TlsAccept::new(listener, server, &config.datacenter, &tls.domain),
                    ))
                })?;
                Self::assemble(config, parts).await
            }
        }
    }

    /// Starts a server's core from its parts: Raft, the transport's accept
    /// loop, cluster formation, the write proposer, the publisher and
    /// proxycfg. The leader's duties are `crate::leader`'s, started with
    /// the rest of a process by `crate::process`.
    pub async fn assemble<L, A>(
        config: ServerConfig, parts: ServerParts<L, A>,
    ) -> anyhow::Result<Arc<Server>>
    where
        L: RaftLogStorage<TypeConfig>,
        A: Accept,
    {
        let ServerParts {
            id,
            raft_config,
            mut log,
            persist,
            snapshots,
            connector,
            listener,
            sled,
            tap,
            clock,
        } = parts;
        // A store that ever held a vote or an entry belongs to a cluster: it
        // rejoins and never bootstraps.
        let used = log.get_log_reader().await.read_vote().await?.is_some()
            || log.get_log_state().await?.last_log_id.is_some();
        if let SnapshotStore::Dir(dir) = &snapshots {
            std::fs::create_dir_all(dir)?;
            crate::raft::snapshot_file::clear_incoming(dir);
        }
        let store = Arc::new(Store::open(persist)?);
        // Events start after the state loaded from disk.
        let mut publisher = Publisher::new(store.state().index);
        publisher.tap = tap;
        let publisher = Arc::new(publisher);
        let sm = StateMachine::with_snapshots(store.clone(), publisher.clone(), snapshots.clone())?;
        let raft = Raft::new(
            id,
            Arc::new(raft_config.validate()?),
            Network::new(connector.clone()),
            log,
            sm,
        )
        .await?;

        let me = ServerNode {
            name: config.node.clone(),
            raft_addr: config.advertised_raft().to_string(),
            http_addr: config.advertised_http(),
        };
        let cluster = Arc::new(Cluster::new(
            id,
            me,
            raft.clone(),
            config.bootstrap_expect,
            config.join.clone(),
            connector,
        ));
        let tasks = Tasks::default();
        let (raft_port_stop, _) = tokio::sync::watch::channel(false);
        tasks.spawn(
            "raft transport",
            network::serve(
                listener,
                raft.clone(),
                cluster.clone(),
                config.limits.raft_port.clone(),
                snapshots.clone(),
                raft_port_stop.subscribe(),
            ),
        );
        tasks.spawn_once("cluster formation", cluster.clone().form(used));
        tracing::info!(node = %config.node, id, raft = %config.raft_addr, "server started");

        let (proposals, queue) = mpsc::unbounded_channel();
        tasks.spawn(
            "write proposer",
            propose_batches(raft.clone(), cluster.id, queue),
        );
        if let Some(h) = publisher.take_task() {
            tasks.watch("event publisher", h);
        }
        // reqwest's TLS has no provider of its own here (ring, not aws-lc).
        let mut http = crate::tls::http_client()
            .pool_max_idle_per_host(256)
            .timeout(crate::request::LONG_FORWARD);
        if let Some(tls) = &config.tls {
            // Forwarding to a leader that serves HTTPS only.
            http = http.tls_backend_preconfigured(tls.files.client()?);
        }
        let http = http.build()?;
        let proxycfg = crate::proxycfg::Manager::start(
            store.clone(),
            &publisher,
            &config.datacenter,
            crate::connect::intentions::default_allow(&config.acl),
        );
        for (name, h) in proxycfg.take_tasks() {
            tasks.watch(name, h);
        }
        let views = crate::stream::view::Views::new(store.clone(), publisher.clone());
        let blocking = crate::request::serve::Blocking::new(config.limits.http.max_blocking);
        let acl = Arc::new(crate::state::token_resolver::Resolver::new(
            config.acl.clone(),
            &config.datacenter,
            clock,
        ));
        let secret_seal = match &config.encrypt {
            Some(k) => Some(crate::acl::seal::SecretSeal::new(
                &k.subkey(b"cairn acl token secrets"),
            )),
            None if config.dev => crate::acl::seal::SecretSeal::random(),
            None => None,
        };
        Ok(Arc::new(Server {
            acl,
            secret_seal,
            logins: Default::default(),
            stop: tokio::sync::Notify::new(),
            proxycfg,
            leaves: Default::default(),
            views,
            ui_services: parking_lot::Mutex::new(None),
            config,
            raft,
            store,
            publisher,
            cluster,
            http,
            raft_port_stop,
            liveness: Default::default(),
            coordinate: Default::default(),
            coordinate_updates: crate::coordinate::Pending::new(
                crate::state::coordinate::MAX_BATCH,
            ),
            agent: std::sync::OnceLock::new(),
            sessions: crate::session_ttl::Timers::new(clock),
            db: sled,
            proposals,
            queue_writes: Arc::new(Semaphore::new(QUEUE_WRITES)),
            queue_bytes: Arc::new(Semaphore::new(QUEUE_BYTES)),
            blocking,
            tasks,
            duties: Default::default(),
        }))
    }

    /// Commits a command through Raft and returns what the state machine
    /// answered. Only the leader can; waits up to `LEADER_HOLD` for one.
    ///
    /// Writes that arrive while `BATCHES_IN_FLIGHT` earlier batches are
    /// being committed are proposed together as one `Payload::Batch` entry.
    /// openraft 0.10 already group-commits entries (one append and one fsync
    /// for all it has queued), so this only saves the per-entry costs
    /// (encoding, log records, apply and publish per entry): ~25% of the CPU
    /// per write at 256 writers. A lone writer is proposed at once.
    pub async fn write(&self, cmd: Command) -> Result<Response> {
        #[cfg(feature = "bug-ack-before-commit")]
        if let Some(r) = self.bug_ack_before_commit(&cmd).await {
            return r;
        }
        cmd.check_names().map_err(Error::BadRequest)?;
        let bytes = bincode::serialized_size(&cmd)
            .map_err(|e| Error::Internal(format!("encoding a write: {e}")))?
            as usize;
        if bytes > MAX_COMMAND_BYTES {
            return Err(Error::TooLarge(format!(
                "Write too large: {bytes} bytes encoded, max size: {MAX_COMMAND_BYTES} bytes"
            )));
        }
        let busy = |_| {
            crate::metrics::WRITES_REFUSED_BUSY.inc();
            Error::Busy(format!(
                "Too many writes in flight on this server (max {QUEUE_WRITES} writes, \
                 {QUEUE_BYTES} bytes): try again later"
            ))
        };
        let budget = (
            self.queue_writes
                .clone()
                .try_acquire_owned()
                .map_err(busy)?,
            self.queue_bytes
                .clone()
                .try_acquire_many_owned(bytes.max(1) as u32)
                .map_err(busy)?,
        );
        let (done, answer) = oneshot::channel();
        self.proposals
            .send(Proposal {
                cmd,
                bytes,
                done,
                budget,
            })
            .map_err(|_| Error::Internal("server shutting down".into()))?;
        answer
            .await
            .map_err(|_| Error::Internal("server shutting down".into()))?
    }

    /// BUG (deliberate): a leader answers a KV write as done once it has
    /// proposed it, if the commit takes more than a few milliseconds.
    #[cfg(feature = "bug-ack-before-commit")]
    async fn bug_ack_before_commit(&self, cmd: &Command) -> Option<Result<Response>> {
        if !matches!(cmd, Command::Kv(_)) || !self.cluster.is_leader() {
            return None;
        }
        let raft = self.raft.clone();
        let proposed = Payload::One(cmd.clone());
        let mut commit = tokio::spawn(async move { raft.client_write(proposed).await });
        match tokio::time::timeout(Duration::from_millis(20), &mut commit).await {
            Ok(Ok(Ok(r))) => Some(Ok(r.data)),
            Ok(_) => None,
            Err(_) => Some(Ok(Response::Kv(crate::structs::KvOutcome::Done(true)))),
        }
    }

    /// A place among the blocking queries waiting at once, held while one
    /// waits; none left: 429, as Consul's limiter answers. With ACLs on,
    /// within the share of the caller `a` (its token, or the anonymous
    /// token from its IP), so that no caller takes every place.
    pub fn blocking_permit(
        &self, a: &crate::request::authz::Authz,
    ) -> Result<crate::request::serve::Place> {
        let caller = self.acl().enabled().then(|| a.caller());
        self.blocking.permit_for(caller)
    }

    /// Waits until this server knows a leader, up to `LEADER_HOLD`.
    pub async fn await_leader(&self) -> Result<(u64, ServerNode)> {
        self.await_raft(|| self.cluster.leader()).await
    }

    /// Waits (up to `LEADER_HOLD`) until this server, if it leads, has
    /// applied an entry of its term and holds its lease
    /// (`Cluster::is_ready_leader`), as Consul's leader waits on a barrier
    /// before it serves. `true`: it may answer as the leader now; `false`:
    /// it does not lead (any more). A leader cut off from its quorum waits
    /// here until it hears of the newer term; its state is then older than
    /// the new leader's, so what it was asked must go there, never be
    /// answered here.
    pub async fn await_ready_leader(&self) -> Result<bool> {
        self.await_raft(|| {
            if self.cluster.is_ready_leader() {
                Some(true)
            } else {
                (!self.cluster.is_leader()).then_some(false)
            }
        })
        .await
    }

    /// Runs `f`, a request forwarded to `leader`, while this server still
    /// sees `leader` lead: once it sees another leader, or none (an
    /// election began), `f` is dropped and the answer is `LeadershipLost`
    /// (it may or may not have committed). A leader cut off mid-request
    /// then holds its caller for an election, not for the forward's timeout.
    pub async fn while_leads<T>(
        &self, leader: u64, f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut metrics = self.raft.metrics();
        let moved = async move {
            while metrics.borrow_watched().current_leader == Some(leader) {
                if metrics.changed().await.is_err() {
                    // Raft stopped: the server is shutting down; the
                    // forward's own timeout ends it.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            biased;
            r = f => r,
            () = moved => Err(Error::LeadershipLost),
        }
    }

    /// Checks `ready` each time Raft's metrics change, until it answers,
    /// for up to `LEADER_HOLD` (then `No cluster leader`).
    async fn await_raft<T>(&self, ready: impl Fn() -> Option<T>) -> Result<T> {
        let deadline = tokio::time::Instant::now() + LEADER_HOLD;
        let mut metrics = self.raft.metrics();
        loop {
            if let Some(t) = ready() {
                return Ok(t);
            }
            // Past the deadline, or Raft stopped (a failed log fsync: its
            // metrics never change again, and waiting on them would spin).
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(Error::NoLeader),
            }
        }
    }

    /// The cluster id, which the first leader writes right after its
    /// election: a read that comes in between waits for it (up to
    /// `LEADER_HOLD`), so a server that reports a leader never answers as if
    /// there were none.
    pub async fn cluster_id(&self) -> Result<String> {
        let deadline = tokio::time::Instant::now() + LEADER_HOLD;
        let mut changed = self.store.watches.subscribe(&crate::state::keys::CLUSTER);
        loop {
            let id = &self.store.state().cluster_id;
            if !id.is_empty() {
                return Ok(id.clone());
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(Error::NoLeader),
            }
        }
    }

    /// Confirms leadership with a quorum and waits for this server to apply
    /// everything committed before (`?consistent`).
    pub async fn linearize(&self) -> Result<()> {
        #[cfg(feature = "bug-stale-read")]
        if self.cluster.is_leader() {
            // BUG (deliberate): trusts the local belief in leadership.
            return Ok(());
        }
        // Boxed: openraft's read-index future is ~4 KB, and inline it
        // would make every read's future (and the HTTP handler's that
        // holds it) that large, copied on each move even when no
        // `?consistent` read is made.
        let confirmed = Box::pin(
            self.raft
                .ensure_linearizable(openraft::ReadPolicy::ReadIndex),
        );
        match tokio::time::timeout(LEADER_HOLD, confirmed).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::LeadershipLost),
            Err(_) => Err(Error::NoLeader),
        }
    }

    /// Waits until Raft stops on its own (not by `shutdown`): a storage
    /// error it cannot continue past, or a panic of its core. Returns why.
    pub async fn raft_failed(&self) -> String {
        // Raft's core holds the metrics' senders until it ends, reporting
        // why in the full metrics first. Waiting on the server metrics
        // (they change with the role, not with every write) keeps this
        // task, on the process's main thread, from waking per write.
        let mut server = self.raft.server_metrics();
        loop {
            if let Err(e) = &self.raft.metrics().borrow_watched().running_state
                && !matches!(e, openraft::error::Fatal::Stopped)
            {
                return e.to_string();
            }
            if server.changed().await.is_err() {
                return match &self.raft.metrics().borrow_watched().running_state {
                    Err(e) if !matches!(e, openraft::error::Fatal::Stopped) => e.to_string(),
                    // The core's task ended without saying why: it panicked.
                    _ => "raft core stopped".into(),
                };
            }
        }
    }

    /// Stops Raft, writes the state's waiting rows and flushes sled.
    pub async fn shutdown(&self) {
        let started = std::time::Instant::now();
        let ms = |t: std::time::Instant| t.elapsed().as_millis() as u64;
        // The port first: no peer's request reaches a stopping Raft.
        self.raft_port_stop.send_replace(true);
        let _ = self.raft.shutdown().await;
        tracing::info!(elapsed_ms = ms(started), "raft stopped");
        let rows = std::time::Instant::now();
        if let Err(e) = self.store.persist().flush() {
            tracing::error!("{e:#}");
        }
        let synced = std::time::Instant::now();
        if let Some(db) = &self.db {
            let _ = db.flush_async().await;
        }
        tracing::info!(
            rows_ms = synced.duration_since(rows).as_millis() as u64,
            sync_ms = ms(synced),
            elapsed_ms = ms(started),
            "server stopped"
        );
    }
}

/// Takes client writes off the queue and proposes them, what is waiting in
/// one entry (up to `MAX_BATCH` writes and `BATCH_BYTES`), with up to
/// `BATCHES_IN_FLIGHT` entries being committed.
async fn propose_batches(raft: Raft, me: u64, mut queue: mpsc::UnboundedReceiver<Proposal>) {
    let slots = std::sync::Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    // A write taken off the queue that did not fit the batch before: it
    // starts the next one.
    let mut carried: Option<Proposal> = None;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(p) => p,
            None => match queue.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(p) if bytes + p.bytes > BATCH_BYTES => {
                    carried = Some(p);
                    break;
                }
                Ok(p) => {
                    bytes += p.bytes;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if batch.len() == 1 {
                let p = batch.pop().expect("one");
                let r = commit(&raft, me, Payload::One(p.cmd)).await;
                let _ = p.done.send(r);
                return;
            }
            // The budgets are given back once every answer is sent.
            let mut cmds = Vec::with_capacity(batch.len());
            let mut dones = Vec::with_capacity(batch.len());
            let mut budgets = Vec::with_capacity(batch.len());
            for p in batch {
                cmds.push(p.cmd);
                dones.push(p.done);
                budgets.push(p.budget);
            }
            match commit(&raft, me, Payload::Batch(cmds)).await {
                Ok(Response::Batch(rs)) if rs.len() == dones.len() => {
                    for (done, r) in dones.into_iter().zip(rs) {
                        let _ = done.send(Ok(r));
                    }
                }
                Ok(other) => {
                    let e = format!("unexpected answer to a batch: {other:?}");
                    for done in dones {
                        let _ = done.send(Err(Error::Internal(e.clone())));
                    }
                }
                Err(e) => {
                    for done in dones {
                        let _ = done.send(Err(e.clone()));
                    }
                }
            }
            drop(budgets);
        });
    }
}

/// Proposes one entry and waits for its answer, up to `LEADER_HOLD` for a
/// leader (this server: writes reach the leader through the HTTP layer).
async fn commit(raft: &Raft, me: u64, cmd: Payload) -> Result<Response> {
    let deadline = tokio::time::Instant::now() + LEADER_HOLD;
    loop {
        // A leader cut off from its quorum never commits: bound the wait.
        // The entry may still commit later, as in Consul.
        let attempt = tokio::time::timeout_at(deadline, raft.client_write(cmd.clone()));
        match attempt.await {
            Err(_) => return Err(Error::NoLeader),
            Ok(Ok(r)) => return Ok(r.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                if f.leader_id.is_some() && f.leader_id != Some(me) {
                    return Err(Error::LeadershipLost);
                }
            }
            Ok(Err(e)) => return Err(Error::Internal(e.to_string())),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::NoLeader);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The exit status of a server stopped by a storage fault (EX_IOERR).
pub const FAULT_EXIT: i32 = 74;
