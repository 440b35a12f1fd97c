//! WAN federation: this datacenter's servers and those of the others
//! learn of each other without gossip, and a request for another
//! datacenter (`?dc=`, DNS `<name>.service.<dc>.consul`) is answered there.
//!
//! Every server greets, every `ROUND` (2 s), one server of each datacenter it
//! knows (and each `--join-wan` address no known server has), over the
//! Raft port's transport (`raft::wan`: the same TLS or `--encrypt`, the same
//! frame caps). A greeting and its answer carry what each side knows: its
//! datacenter and primary, itself, and every datacenter's servers, so a
//! server that greets one datacenter learns all of them. What is known is
//! bounded (64 datacenters, 16 servers each), and a greeting naming another
//! primary, or this server's own datacenter, is refused. A greeting's round
//! trip is the datacenter's measured RTT (`/v1/catalog/datacenters` lists
//! the nearest first); no answer for 10 s shows its servers failed
//! (`members -wan`). A datacenter that comes back after a partition
//! answers the next round's greeting; a server is forgotten by
//! `force-leave -wan node.dc` (on every server of this datacenter,
//! `endpoint::agent`) or once unheard from for `RECONNECT_TIMEOUT_WAN`
//! (72 h, Consul's), a datacenter with its last server (and the primary's
//! leader deletes its state), and is taken in again only from its own
//! greeting, never from another's word.
//!
//! On the primary's leader what is known is written into the Raft state
//! as federation states (`state::federation`, one row per datacenter,
//! Consul's model), so a primary that restarts knows where the others are
//! even without `--join-wan`; secondaries learn them from the primary's
//! answers. That write is a leader duty (`leader::federation`), made only
//! once another datacenter is known: a lone datacenter writes nothing.
//!
//! Replication from the primary is made of leader duties of the
//! secondaries too: ACLs and config entries (`leader::replication`), and
//! the Connect CA's roots with an intermediate the primary signs
//! (`leader::connect_ca`, [`Federation::sign_intermediate`]). They ask the
//! primary through [`Federation::ask_primary`] (a GET marked as a server's
//! pull, `ReplicationPull` on the receiving side, with the replication
//! token if any; `sign_intermediate` POSTs the CSR the same way, with no
//! token) and keep their progress here ([`Replication`]: `Replicated::Acl`,
//! `Config`, `Ca`), for `/v1/acl/replication` and the `cairn_replication_*`
//! gauges.
//!
//! A forwarded request is an HTTP request in a frame (`WanRequest`) on a
//! channel (`raft::channel`) to one server of the datacenter, opened once
//! and shared by every request in flight there (as Consul's yamux streams
//! share one connection), so that a thousand parked `?dc=` reads hold one
//! of the remote's Raft connections. It is answered by the receiving
//! server's own router in process (the handler is set by process
//! assembly: this room knows no HTTP router), marked as forwarded so that
//! it is never forwarded again. `forward` tries the datacenter's servers
//! heard from most recently first, within `request::forward_timeout`; a
//! request from a datacenter this server does not know is refused.
//!
//! Two other rooms reach other datacenters through it, each handed it by
//! process assembly: DNS, as its `Remote` (`<name>.service|node.<dc>.consul`),
//! and proxycfg, as its `Fetcher` (`MeshReads`: other datacenters'
//! instances of chain targets, read with the server's own agent token,
//! which that datacenter judges).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

// tokio's clock, not std's: contact times and round trips are then the
// simulation's (turmoil pauses and steps tokio's time), as the Raft
// transport's timeouts are; in a process it reads the same monotonic clock.
use tokio::time::Instant;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::raft::channel::{BUSY, Channel, Channels};
use crate::raft::network::{Conn, Dial, Reply, Request, TOO_LARGE_PREFIX, decode, open_channel};
use crate::raft::wan::{
    Wan, WanDatacenter, WanFuture, WanHello, WanRequest, WanResponse, WanServer,
};
use crate::request::serve::Caller;
use crate::server::Server;
use crate::shares::{Share, Shares};
use crate::state::Command;
use crate::structs::federation::FederationState;

/// How often each server greets the other datacenters.
pub const ROUND: Duration = Duration::from_secs(2);
/// A greeting's time limit.
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);
/// What one server remembers at most (anyone past the transport's
/// authentication may greet): datacenters, and servers of each.
const MAX_DATACENTERS: usize = 64;
const MAX_SERVERS: usize = 16;
/// Clients' requests in flight to one datacenter at once (`?dc=`, DNS for
/// it, a prepared query's failover), all on one channel per remote server
/// (whose receiver takes `raft::channel::MAX_IN_FLIGHT`); this server's
/// replication pulls and CA requests are counted apart.
const FORWARD_MAX: usize = 256;
/// A server not heard from for this long is shown failed (`members -wan`).
const FAILED_AFTER: Duration = Duration::from_secs(10);
/// A server not heard from for this long is forgotten, and a datacenter
/// with it when none is left (Consul's `reconnect_timeout_wan` default).
const RECONNECT_TIMEOUT_WAN: Duration = Duration::from_secs(72 * 3600);
/// The federation states are written again at least this often on the
/// primary (their `UpdatedAt` says they are current).
const STATE_REFRESH: Duration = Duration::from_secs(60);

/// Why a request could not be asked of another datacenter.
#[derive(Debug, thiserror::Error)]
pub enum FederationError {
    /// Consul's words for a datacenter it has no server of.
    #[error("No path to datacenter")]
    NoPath,
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Unreachable(String),
    /// Past the requests in flight one datacenter, or one caller, takes.
    #[error("{0}")]
    Busy(String),
}

impl From<FederationError> for crate::error::Error {
    fn from(e: FederationError) -> Self {
        use crate::error::Error;
        match e {
            FederationError::NoPath => Error::NoPathToDatacenter,
            FederationError::TooLarge(m) => Error::TooLarge(m),
            FederationError::Unreachable(m) => Error::Internal(m),
            FederationError::Busy(m) => Error::Busy(m),
        }
    }
}

/// Marks a request that came from another datacenter (an extension set by
/// the handler, never a header a client could send): it is answered here,
/// never forwarded again.
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub from: String,
}

/// Marks a request that is a replication pull of another datacenter's
/// server (an extension set from the frame's own mark, never from a
/// client's header): the servers trust each other through the transport's
/// authentication, so with no token it needs none.
#[derive(Debug, Clone)]
pub struct ReplicationPull;

/// Answers a forwarded request (this server's HTTP router, in process).
pub type Handler = Arc<dyn Fn(WanRequest) -> BoxFuture<'static, WanResponse> + Send + Sync>;

/// A client's request's place among those forwarded to a datacenter.
pub struct ForwardPlace {
    _all: Share<String>,
    _caller: Option<Share<(String, Caller)>>,
}

/// A server of another datacenter, as this one knows it.
#[derive(Debug, Clone)]
struct Known {
    name: String,
    /// When it was first heard of (first-hand or not).
    learned: Instant,
    /// When it last answered or greeted us.
    contact: Option<Instant>,
    /// Its greeting's round trip (smoothed), when we measured one.
    rtt: Option<Duration>,
}

/// A server of any datacenter, for `members -wan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WanMember {
    pub name: String,
    pub datacenter: String,
    pub raft_addr: String,
    pub alive: bool,
}

pub struct Federation {
    server: Arc<Server>,
    datacenter: String,
    primary: String,
    join_wan: Vec<String>,
    /// Other datacenters: their servers by Raft address.
    known: Mutex<BTreeMap<String, BTreeMap<String, Known>>>,
    /// Servers forgotten (`force-leave -wan`), by Raft address, and when:
    /// taken in again only from their own greeting. Locked after `known`.
    forgotten: Mutex<BTreeMap<String, Instant>>,
    handler: OnceLock<Handler>,
    /// Clients' requests in flight to each datacenter, and each caller's
    /// blocking reads among them.
    forwarding: Arc<Shares<String>>,
    forwarding_callers: Arc<Shares<(String, Caller)>>,
    /// Channels to other datacenters' servers, by Raft address, that the
    /// requests forwarded there travel on.
    channels: Channels,
    /// Round-robin position per datacenter (which server is greeted).
    turn: Mutex<BTreeMap<String, usize>>,
    /// What this server's replication from the primary did last (only a
    /// secondary's leader runs it).
    replication: Replication,
    /// The other datacenters' names, as `known` holds them (proxycfg's
    /// mesh gateways follow it).
    others: tokio::sync::watch::Sender<Vec<String>>,
}

/// What is replicated from the primary, each by a duty of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicated {
    /// ACL policies, roles and global tokens, together.
    Acl,
    /// Config entries of every kind (intentions among them).
    Config,
    /// The Connect CA: the primary's roots and this datacenter's
    /// intermediate signed by the active one (`leader::connect_ca`).
    Ca,
}

impl Replicated {
    pub const ALL: [Replicated; 3] = [Replicated::Acl, Replicated::Config, Replicated::Ca];

    /// Its name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Replicated::Acl => "acl",
            Replicated::Config => "config_entries",
            Replicated::Ca => "connect_ca",
        }
    }
}

/// One replication's progress, as its duty last reported it.
#[derive(Debug, Clone, Default)]
pub struct ReplicationState {
    /// Its duty runs (this server leads a secondary).
    pub running: bool,
    /// The primary's index of what was last applied here.
    pub index: u64,
    pub last_success: Option<SystemTime>,
    pub last_error: Option<SystemTime>,
    pub last_error_message: String,
}

/// Every replication's progress on this server.
#[derive(Debug, Default)]
pub struct Replication {
    acl: Mutex<ReplicationState>,
    config: Mutex<ReplicationState>,
    ca: Mutex<ReplicationState>,
}

impl Replication {
    pub fn get(&self, what: Replicated) -> ReplicationState {
        self.slot(what).lock().clone()
    }

    pub fn update(&self, what: Replicated, f: impl FnOnce(&mut ReplicationState)) {
        f(&mut self.slot(what).lock())
    }

    fn slot(&self, what: Replicated) -> &Mutex<ReplicationState> {
        match what {
            Replicated::Acl => &self.acl,
            Replicated::Config => &self.config,
            Replicated::Ca => &self.ca,
        }
    }
}

/// Consul's rule for a datacenter name.
pub fn valid_datacenter(dc: &str) -> bool {
    !dc.is_empty()
        && dc.len() <= 64
        && dc
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Federation {
    pub fn new(server: Arc<Server>) -> Arc<Self> {
        let fed = Arc::new(Federation {
            datacenter: server.datacenter().to_owned(),
            primary: server.config().primary().to_string(),
            join_wan: server.config().join_wan.clone(),
            server,
            known: Mutex::default(),
            forgotten: Mutex::default(),
            handler: OnceLock::new(),
            forwarding: Arc::default(),
            forwarding_callers: Arc::default(),
            channels: Channels::default(),
            turn: Mutex::default(),
            replication: Replication::default(),
            others: tokio::sync::watch::Sender::new(Vec::new()),
        });
        // What the primary's Raft state holds (a restarted primary, or a
        // follower that became its leader): known, not yet contacted.
        fed.learn_from_state();
        fed
    }

    /// Answers the WAN frames on the Raft port from now on, forwarded
    /// requests with `handler`.
    pub fn serve(self: &Arc<Self>, handler: Handler) {
        let _ = self.handler.set(handler);
        let _ = self.server.cluster().wan.set(self.clone());
        self.server
            .tasks()
            .spawn("wan federation", self.clone().run());
    }

    pub fn datacenter(&self) -> &str {
        &self.datacenter
    }

    /// Whether this server federates (`serve` was called: its transport
    /// authenticates its peers). Until then it sends nothing to another
    /// datacenter, a token least of all.
    fn serving(&self) -> bool {
        self.handler.get().is_some()
    }

    /// The federation's primary datacenter.
    pub fn primary(&self) -> &str {
        &self.primary
    }

    /// This datacenter is a secondary: it replicates from the primary and
    /// sends it the writes of what it replicates.
    pub fn is_secondary(&self) -> bool {
        self.primary != self.datacenter
    }

    /// The other datacenters' names, followed: a datacenter newly known
    /// (the primary's first answer) wakes replication waiting on a failure.
    pub fn watch_others(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        self.others.subscribe()
    }

    /// Whether any other datacenter is known.
    pub fn knows_others(&self) -> bool {
        !self.known.lock().is_empty()
    }

    /// Whether another datacenter is known, or its state still stored
    /// here (forgotten, not yet deleted): the primary's states to write.
    pub fn has_others(&self) -> bool {
        self.knows_others()
            || self
                .server
                .state()
                .federation
                .keys()
                .any(|dc| *dc != self.datacenter)
    }

    /// The progress of replication from the primary on this server.
    pub fn replication(&self) -> &Replication {
        &self.replication
    }

    /// Greets the other datacenters every round, for good.
    async fn run(self: Arc<Self>) {
        loop {
            self.round().await;
            self.learn_from_state();
            self.expire();
            tokio::time::sleep(ROUND).await;
        }
    }

    /// A replication pull: a GET of `path_and_query` answered by the
    /// primary (any of its servers, through the transport that
    /// authenticated them), marked as this server's own
    /// (`structs::replication::REPLICATION_HEADER`) and carrying the
    /// replication token if one is configured.
    pub async fn ask_primary(
        &self, path_and_query: String, token: Option<&str>, timeout: Duration,
    ) -> Result<WanResponse, FederationError> {
        self.to_primary("GET", path_and_query, Vec::new(), token, timeout)
            .await
    }

    /// A secondary's intermediate CSR (PEM), sent to the primary to be
    /// signed by its active root (`connect::SIGN_INTERMEDIATE_PATH`), with
    /// the mark of this server's own requests and no token: the primary
    /// answers it for the transport's authentication alone, as Consul's
    /// servers trust each other's RPC.
    pub async fn sign_intermediate(
        &self, csr_pem: &str, timeout: Duration,
    ) -> Result<WanResponse, FederationError> {
        let body = serde_json::json!({ "CSR": csr_pem })
            .to_string()
            .into_bytes();
        let path = crate::connect::SIGN_INTERMEDIATE_PATH.to_string();
        self.to_primary("POST", path, body, None, timeout).await
    }

    async fn to_primary(
        &self, method: &str, path_and_query: String, body: Vec<u8>, token: Option<&str>,
        timeout: Duration,
    ) -> Result<WanResponse, FederationError> {
        let mut headers = vec![(
            crate::structs::replication::REPLICATION_HEADER.to_string(),
            "1".to_string(),
        )];
        if let Some(t) = token {
            headers.push(("x-consul-token".to_string(), t.to_string()));
        }
        let req = WanRequest {
            from: self.datacenter.clone(),
            method: method.into(),
            path_and_query,
            headers,
            body,
        };
        self.forward(&self.primary, req, timeout).await
    }

    /// One greeting to one server of each known datacenter, and to each
    /// `--join-wan` address no known server has, all at once.
    async fn round(self: &Arc<Self>) {
        let mut targets: Vec<(String, Dial)> = Vec::new();
        {
            let known = self.known.lock();
            let mut turn = self.turn.lock();
            for (dc, servers) in known.iter() {
                if servers.is_empty() {
                    continue;
                }
                let t = turn.entry(dc.clone()).or_default();
                *t = t.wrapping_add(1);
                let addr = servers.keys().nth(*t % servers.len()).expect("non-empty");
                targets.push((addr.clone(), Dial::Datacenter(dc.clone())));
            }
            for addr in &self.join_wan {
                if !known.values().any(|s| s.contains_key(addr)) {
                    targets.push((addr.clone(), Dial::AnyDatacenter));
                }
            }
        }
        let greet = targets.into_iter().map(|(addr, dial)| {
            let me = self.clone();
            async move { me.greet(&addr, dial).await }
        });
        futures_util::future::join_all(greet).await;
    }

    /// Greets the server at `addr`, of the datacenter `dial` names if it
    /// is known.
    async fn greet(&self, addr: &str, dial: Dial) {
        let mut conn = Conn::to(self.server.cluster().connector(), addr, dial);
        let started = Instant::now();
        match conn
            .call(&Request::WanHello(self.hello()), HELLO_TIMEOUT)
            .await
        {
            // With TLS, the answer speaks for the datacenter the server's
            // certificate proved, or for none (a `--join-wan` address was
            // dialed taking any server's certificate).
            Ok(Reply::WanHello(Ok(h)))
                if conn.certified().is_some_and(|c| !c.serves(&h.datacenter)) =>
            {
                crate::metrics::RAFT_FRAMES_REFUSED.inc();
                tracing::warn!(
                    %addr,
                    datacenter = %h.datacenter,
                    certified = ?conn.certified().map(|c| c.datacenters),
                    "wan greeting's answer refused: its certificate is for another datacenter"
                );
            }
            Ok(Reply::WanHello(Ok(h))) => {
                let rtt = started.elapsed();
                if let Err(e) = self.learn(&h, Some(rtt)) {
                    tracing::warn!(%addr, error = %e, "wan greeting's answer refused");
                }
            }
            Ok(Reply::WanHello(Err(e))) => {
                tracing::warn!(%addr, error = %e, "wan greeting refused")
            }
            Ok(_) => tracing::warn!(%addr, "wan greeting: unexpected reply"),
            // An address the operator gave (`--join-wan`) that does not
            // answer is said as Consul's retry-join says it: a TLS or key
            // mismatch is otherwise silent. Known servers' silences are a
            // partition's, shown by `members -wan`.
            Err(e) if self.join_wan.iter().any(|j| j == addr) => {
                tracing::warn!(%addr, error = %e, "wan join failed")
            }
            Err(e) => tracing::debug!(%addr, error = %e, "wan greeting failed"),
        }
    }

    /// This datacenter's servers (the Raft membership).
    fn local_servers(&self) -> Vec<WanServer> {
        self.server
            .cluster()
            .members()
            .into_iter()
            .map(|(_, n, _)| WanServer {
                name: n.name,
                raft_addr: n.raft_addr,
            })
            .take(MAX_SERVERS)
            .collect()
    }

    /// What this server says of itself and of the federation.
    fn hello(&self) -> WanHello {
        let mut known = vec![WanDatacenter {
            datacenter: self.datacenter.clone(),
            servers: self.local_servers(),
        }];
        known.extend(self.known.lock().iter().map(|(dc, servers)| {
            WanDatacenter {
                datacenter: dc.clone(),
                servers: servers
                    .iter()
                    .map(|(addr, k)| WanServer {
                        name: k.name.clone(),
                        raft_addr: addr.clone(),
                    })
                    .collect(),
            }
        }));
        WanHello {
            datacenter: self.datacenter.clone(),
            primary: self.primary.clone(),
            server: WanServer {
                name: self.server.node_name().to_owned(),
                raft_addr: self.server.config().advertised_raft().to_string(),
            },
            known,
        }
    }

    /// Takes in a greeting (or an answer to ours, with its round trip): its
    /// sender as heard from now, the datacenters it knows as known.
    fn learn(&self, h: &WanHello, rtt: Option<Duration>) -> Result<(), String> {
        if !valid_datacenter(&h.datacenter) {
            return Err(format!("invalid datacenter name {:?}", h.datacenter));
        }
        if h.datacenter == self.datacenter {
            return Err(format!(
                "server {} is of this datacenter ({}): not a WAN peer",
                h.server.name, h.datacenter
            ));
        }
        if h.primary != self.primary {
            return Err(format!(
                "primary datacenter mismatch: {} says {:?}, this server {:?}",
                h.datacenter, h.primary, self.primary
            ));
        }
        let mut known = self.known.lock();
        // The sender first: a list full of others never crowds it out.
        let Some(servers) = admit(&mut known, &h.datacenter) else {
            return Err("too many datacenters known".into());
        };
        if servers.len() >= MAX_SERVERS && !servers.contains_key(&h.server.raft_addr) {
            return Err("too many servers known in its datacenter".into());
        }
        // Heard from itself: alive, so back if it was forgotten (as a
        // server Consul force-left rejoins while it runs).
        self.forgotten.lock().remove(&h.server.raft_addr);
        let k = servers
            .entry(h.server.raft_addr.clone())
            .or_insert_with(|| Known::new(&h.server.name));
        k.name = h.server.name.clone();
        k.contact = Some(Instant::now());
        if let Some(rtt) = rtt {
            // Smoothed: one slow greeting does not reorder the list.
            k.rtt = Some(match k.rtt {
                Some(old) => (old * 3 + rtt) / 4,
                None => rtt,
            });
        }
        let forgotten = self.forgotten.lock();
        for dc in h.known.iter().take(MAX_DATACENTERS) {
            if dc.datacenter == self.datacenter || !valid_datacenter(&dc.datacenter) {
                continue;
            }
            learn_servers(&mut known, &forgotten, &dc.datacenter, &dc.servers);
        }
        self.publish_others(&known);
        Ok(())
    }

    /// Forgets the server `name` of datacenter `dc` (`force-leave -wan`)
    /// and, with its last server, the datacenter; not learned again from
    /// others' word or the primary's states for `RECONNECT_TIMEOUT_WAN`,
    /// only from its own greeting. False: no such server known.
    pub fn forget(&self, name: &str, dc: &str) -> bool {
        let mut known = self.known.lock();
        let Some(servers) = known.get_mut(dc) else {
            return false;
        };
        let addrs: Vec<String> = servers
            .iter()
            .filter(|(_, k)| k.name == name)
            .map(|(a, _)| a.clone())
            .collect();
        if addrs.is_empty() {
            return false;
        }
        let mut forgotten = self.forgotten.lock();
        for a in addrs {
            servers.remove(&a);
            forgotten.insert(a, Instant::now());
        }
        if servers.is_empty() {
            known.remove(dc);
        }
        tracing::info!(server = %name, datacenter = %dc, "wan server forgotten (force-leave)");
        self.publish_others(&known);
        true
    }

    /// Forgets the servers not heard from (nor, never heard from, heard
    /// of) for `RECONNECT_TIMEOUT_WAN`, and the datacenters left with
    /// none, as Consul reaps WAN members failed that long.
    fn expire(&self) {
        let now = Instant::now();
        let mut known = self.known.lock();
        let gone = expire_known(&mut known, now, RECONNECT_TIMEOUT_WAN);
        let mut forgotten = self.forgotten.lock();
        forgotten.retain(|_, at| now.duration_since(*at) < RECONNECT_TIMEOUT_WAN);
        // Forgotten as if force-left: the primary's states (until its
        // leader deletes them) and others' word bring them back no more.
        for (dc, addr, name) in &gone {
            tracing::info!(server = %name, datacenter = %dc, "wan server expired: not heard from");
            forgotten.insert(addr.clone(), now);
        }
        if !gone.is_empty() {
            self.publish_others(&known);
        }
    }

    /// Tells the followers of the other datacenters' names when they
    /// change.
    fn publish_others(&self, known: &BTreeMap<String, BTreeMap<String, Known>>) {
        self.others.send_if_modified(|names| {
            let now: Vec<String> = known.keys().cloned().collect();
            let changed = *names != now;
            *names = now;
            changed
        });
    }

    /// The federation states of the Raft state (the primary's; a secondary
    /// holds none yet), taken in as known.
    fn learn_from_state(&self) {
        let st = self.server.state();
        let mut known = self.known.lock();
        let forgotten = self.forgotten.lock();
        for fs in st.federation.values() {
            if fs.datacenter != self.datacenter {
                learn_servers(&mut known, &forgotten, &fs.datacenter, &fs.servers);
            }
        }
        self.publish_others(&known);
    }

    /// On the primary's leader (a duty, `leader::federation`): every
    /// datacenter's servers as federation states in Raft, written when they
    /// change (and every `STATE_REFRESH`, so `UpdatedAt` stays current).
    pub async fn write_states(&self, written: &mut Option<(Vec<FederationState>, Instant)>) {
        let mut now: Vec<FederationState> =
            vec![FederationState::new(&self.datacenter, self.local_servers())];
        now.extend(self.known.lock().iter().map(|(dc, servers)| {
            FederationState::new(
                dc,
                servers
                    .iter()
                    .map(|(addr, k)| WanServer {
                        name: k.name.clone(),
                        raft_addr: addr.clone(),
                    })
                    .collect(),
            )
        }));
        let current = |w: &Option<(Vec<FederationState>, Instant)>| {
            w.as_ref()
                .is_some_and(|(s, at)| same_servers(s, &now) && at.elapsed() < STATE_REFRESH)
        };
        if current(written) {
            return;
        }
        let stored: Vec<FederationState> = self
            .server
            .state()
            .federation
            .values()
            .map(|f| (**f).clone())
            .collect();
        if written.is_none() && same_servers(&stored, &now) {
            *written = Some((now, Instant::now()));
            return;
        }
        // Datacenters forgotten (force-left, or expired) leave the state.
        for old in stored
            .iter()
            .filter(|o| !now.iter().any(|n| n.datacenter == o.datacenter))
        {
            let forget = Command::FederationStateDelete {
                datacenter: old.datacenter.clone(),
            };
            if let Err(e) = self.server.write(forget).await {
                tracing::warn!(error = %e, "federation state not deleted");
                return;
            }
        }
        let updated_at = crate::structs::federation::now_rfc3339();
        for mut fs in now.iter().cloned() {
            fs.updated_at = updated_at.clone();
            if let Err(e) = self
                .server
                .write(Command::FederationStateSet {
                    state: Box::new(fs),
                })
                .await
            {
                tracing::warn!(error = %e, "federation state not written");
                return;
            }
        }
        *written = Some((now, Instant::now()));
    }

    /// Every known datacenter, this one first, then the others nearest
    /// first by measured round trip (never measured: last, by name).
    pub fn datacenters(&self) -> Vec<String> {
        let others: Vec<(String, Option<Duration>)> = self
            .known
            .lock()
            .iter()
            .map(|(dc, servers)| (dc.clone(), servers.values().filter_map(|k| k.rtt).min()))
            .collect();
        nearest_first(&self.datacenter, others)
    }

    /// The servers of every datacenter (`members -wan`): this one's from
    /// its membership (alive), the others' alive while they answer.
    pub fn members(&self) -> Vec<WanMember> {
        let mut out: Vec<WanMember> = self
            .local_servers()
            .into_iter()
            .map(|s| WanMember {
                name: s.name,
                datacenter: self.datacenter.clone(),
                raft_addr: s.raft_addr,
                alive: true,
            })
            .collect();
        for (dc, servers) in self.known.lock().iter() {
            for (addr, k) in servers {
                out.push(WanMember {
                    name: k.name.clone(),
                    datacenter: dc.clone(),
                    raft_addr: addr.clone(),
                    alive: k.contact.is_some_and(|c| c.elapsed() < FAILED_AFTER),
                });
            }
        }
        out
    }

    /// Asks `dc` to answer `req` (any of its servers, those heard from
    /// most recently first), within `timeout`, on this server's channel to
    /// it: every request in flight to one remote server shares one
    /// connection there.
    pub async fn forward(
        &self, dc: &str, mut req: WanRequest, timeout: Duration,
    ) -> Result<WanResponse, FederationError> {
        if !self.serving() {
            return Err(FederationError::NoPath);
        }
        let mut servers: Vec<(Option<Instant>, String)> = {
            let known = self.known.lock();
            let Some(servers) = known.get(dc) else {
                return Err(FederationError::NoPath);
            };
            servers
                .iter()
                .map(|(a, k)| (k.contact, a.clone()))
                .collect()
        };
        if servers.is_empty() {
            return Err(FederationError::NoPath);
        }
        servers.sort_by_key(|(contact, _)| std::cmp::Reverse(*contact));
        req.from = self.datacenter.clone();
        let read = matches!(req.method.as_str(), "GET" | "HEAD");
        let body =
            bincode::serialize(&req).map_err(|e| FederationError::Unreachable(e.to_string()))?;
        drop(req);
        let mut last = String::new();
        for (_, addr) in servers {
            crate::metrics::WAN_FORWARDED.inc();
            let asked = match self.channel_to(dc, &addr).await {
                Ok(channel) => channel.call(body.clone(), timeout).await,
                Err(e) => Err(e),
            };
            match asked {
                // Answered, or refused by the remote (its router's refusal,
                // or the channel's: busy, an answer over the frame limit).
                Ok(answer) => {
                    let answer = answer.and_then(|bytes| {
                        decode::<Result<WanResponse, String>>(&bytes)
                            .unwrap_or_else(|e| Err(format!("undecodable answer: {e}")))
                    });
                    return answer.map_err(|e| refused(dc, &addr, e));
                }
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    return Err(FederationError::TooLarge(e.to_string()));
                }
                // Its time is up (a blocking read's wait included).
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(FederationError::Unreachable(format!(
                        "no answer from datacenter {dc} ({addr}) within {} s",
                        timeout.as_secs()
                    )));
                }
                // A read changes nothing: the next server is asked. A write
                // only when it never reached this one (no connection, or
                // never sent on it): one cut off after it was sent may have
                // acted.
                Err(e)
                    if read
                        || matches!(
                            e.kind(),
                            std::io::ErrorKind::ConnectionRefused
                                | std::io::ErrorKind::NotConnected
                        ) =>
                {
                    last = format!("{addr}: {e}")
                }
                Err(e) => {
                    return Err(FederationError::Unreachable(format!(
                        "datacenter {dc} ({addr}): {e}; the write may or may not have been applied"
                    )));
                }
            }
        }
        Err(FederationError::Unreachable(format!(
            "no server of datacenter {dc} reachable (last: {last})"
        )))
    }

    /// The channel of forwarded requests to `addr`, a server of `dc`,
    /// opened on first use and again after it closed.
    async fn channel_to(&self, dc: &str, addr: &str) -> std::io::Result<Arc<Channel>> {
        let connector = self.server.cluster().connector();
        let first = Request::WanChannel {
            from: self.datacenter.clone(),
        };
        let dial = Dial::Datacenter(dc.to_string());
        self.channels
            .to(addr, || async move {
                open_channel(&*connector, addr, &dial, &first).await
            })
            .await
    }

    /// A place for one client's request to `dc`, held while it is asked
    /// there: at most `FORWARD_MAX` to a datacenter, and of those a
    /// caller's blocking reads within its share (`Caller::share`), so
    /// that anonymous callers cannot take every place. None left: 429.
    pub fn forward_place(
        &self, dc: &str, caller: Caller, blocking: bool,
    ) -> Result<ForwardPlace, FederationError> {
        let busy = |what: &str| {
            crate::metrics::BLOCKING_REFUSED_BUSY.inc();
            FederationError::Busy(format!(
                "Too many {what} requests to datacenter {dc} (max {FORWARD_MAX}): try again later"
            ))
        };
        let caller = if blocking {
            let max = caller.share(FORWARD_MAX);
            Some(
                self.forwarding_callers
                    .take((dc.to_string(), caller), max)
                    .ok_or_else(|| busy("of this caller's blocking"))?,
            )
        } else {
            None
        };
        let all = self
            .forwarding
            .take(dc.to_string(), FORWARD_MAX)
            .ok_or_else(|| busy("forwarded"))?;
        Ok(ForwardPlace {
            _all: all,
            _caller: caller,
        })
    }

    /// Whether `dc` is a datacenter this server knows (other than its own).
    pub fn knows(&self, dc: &str) -> bool {
        self.known.lock().contains_key(dc)
    }
}

/// What a remote server's refusal means to the caller: its channel full
/// (the same datacenter's other servers are asked no differently, so the
/// caller is told at once: 429), something over the frame limit (413), or
/// anything else.
fn refused(dc: &str, addr: &str, e: String) -> FederationError {
    if e == BUSY {
        FederationError::Busy(format!("Datacenter {dc} ({addr}) is {e}: try again later"))
    } else if e.starts_with(TOO_LARGE_PREFIX) {
        FederationError::TooLarge(e)
    } else {
        FederationError::Unreachable(e)
    }
}

/// `own` first, then the others by their nearest server's round trip,
/// those never measured last (by name).
fn nearest_first(own: &str, mut others: Vec<(String, Option<Duration>)>) -> Vec<String> {
    others.sort_by(|(a, ra), (b, rb)| (ra.is_none(), *ra, a).cmp(&(rb.is_none(), *rb, b)));
    std::iter::once(own.to_string())
        .chain(others.into_iter().map(|(dc, _)| dc))
        .collect()
}

/// The entry of `dc`, made if there is room for another datacenter.
fn admit<'a>(
    known: &'a mut BTreeMap<String, BTreeMap<String, Known>>, dc: &str,
) -> Option<&'a mut BTreeMap<String, Known>> {
    if !known.contains_key(dc) && known.len() >= MAX_DATACENTERS {
        return None;
    }
    Some(known.entry(dc.to_string()).or_default())
}

/// Takes in what another said of `dc`'s servers (a greeting's list, the
/// primary's state), within the bounds, but those forgotten.
fn learn_servers(
    known: &mut BTreeMap<String, BTreeMap<String, Known>>, forgotten: &BTreeMap<String, Instant>,
    dc: &str, said: &[WanServer],
) {
    let said: Vec<&WanServer> = said
        .iter()
        .take(MAX_SERVERS)
        .filter(|s| !forgotten.contains_key(&s.raft_addr))
        .collect();
    if said.is_empty() && !known.contains_key(dc) {
        return;
    }
    let Some(servers) = admit(known, dc) else {
        return;
    };
    for s in said {
        if servers.len() < MAX_SERVERS || servers.contains_key(&s.raft_addr) {
            servers
                .entry(s.raft_addr.clone())
                .or_insert_with(|| Known::new(&s.name));
        }
    }
}

/// Drops the servers last heard from (or, never, first heard of) `timeout`
/// before `now`, then the datacenters left with none; the `(dc, Raft
/// address, name)` of each server dropped.
fn expire_known(
    known: &mut BTreeMap<String, BTreeMap<String, Known>>, now: Instant, timeout: Duration,
) -> Vec<(String, String, String)> {
    let mut gone = Vec::new();
    for (dc, servers) in known.iter_mut() {
        servers.retain(|addr, k| {
            let keep = now.duration_since(k.contact.unwrap_or(k.learned)) < timeout;
            if !keep {
                gone.push((dc.clone(), addr.clone(), k.name.clone()));
            }
            keep
        });
    }
    known.retain(|_, servers| !servers.is_empty());
    gone
}

impl Known {
    fn new(name: &str) -> Known {
        Known {
            name: name.to_string(),
            learned: Instant::now(),
            contact: None,
            rtt: None,
        }
    }
}

/// Whether two lists of states name the same datacenters and servers.
fn same_servers(a: &[FederationState], b: &[FederationState]) -> bool {
    let key = |l: &[FederationState]| {
        let mut k: Vec<(String, Vec<String>)> = l
            .iter()
            .map(|f| {
                let mut s: Vec<String> = f.servers.iter().map(|s| s.raft_addr.clone()).collect();
                s.sort();
                (f.datacenter.clone(), s)
            })
            .collect();
        k.sort();
        k
    };
    key(a) == key(b)
}

/// DNS for another datacenter: a GET sent there as `?dc=` sends one.
impl crate::dns::Remote for Federation {
    fn get(
        &self, dc: &str, path_and_query: String, token: Option<String>,
    ) -> crate::dns::RemoteFuture<'_> {
        let dc = dc.to_string();
        Box::pin(async move {
            let req = WanRequest {
                from: self.datacenter.clone(),
                method: "GET".into(),
                path_and_query,
                headers: token
                    .map(|t| vec![("x-consul-token".to_string(), t)])
                    .unwrap_or_default(),
                body: Vec::new(),
            };
            match self.forward(&dc, req, DNS_TIMEOUT).await {
                Ok(r) => Ok(Some((r.status, r.body))),
                Err(FederationError::NoPath) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// proxycfg's reads of other datacenters' instances (chain targets there),
/// with the server's own agent token: that token must read the services
/// (and their nodes) in the other datacenter, which judges it.
pub struct MeshReads {
    pub federation: Arc<Federation>,
    pub token: Option<String>,
}

impl crate::proxycfg::Fetcher for MeshReads {
    fn datacenters(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        self.federation.others.subscribe()
    }

    fn get(
        &self, dc: &str, path_and_query: String, timeout: Duration,
    ) -> crate::proxycfg::FetchFuture<'_> {
        let dc = dc.to_string();
        Box::pin(async move {
            let req = WanRequest {
                from: self.federation.datacenter.clone(),
                method: "GET".into(),
                path_and_query,
                headers: self
                    .token
                    .iter()
                    .map(|t| ("x-consul-token".to_string(), t.clone()))
                    .collect(),
                body: Vec::new(),
            };
            let r = self
                .federation
                .forward(&dc, req, timeout)
                .await
                .map_err(|e| e.to_string())?;
            let index = r
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("x-consul-index"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            Ok(crate::proxycfg::Answer {
                status: r.status,
                index,
                body: r.body,
            })
        })
    }
}

/// Below the DNS listener's own bound on a lookup (as a client agent's
/// DNS reads), so a slow datacenter answers SERVFAIL rather than nothing.
pub const DNS_TIMEOUT: Duration = Duration::from_secs(4);

impl Wan for Federation {
    fn hello(&self, from: WanHello) -> WanFuture<'_, WanHello> {
        Box::pin(async move {
            self.learn(&from, None)?;
            Ok(self.hello())
        })
    }

    fn request(&self, req: WanRequest) -> WanFuture<'_, WanResponse> {
        Box::pin(async move {
            // Only from a datacenter that greeted (or that the primary
            // recorded): a frame from anywhere else is refused.
            if !self.knows(&req.from) {
                return Err(format!("request from unknown datacenter {:?}", req.from));
            }
            let handler = self
                .handler
                .get()
                .ok_or("this server does not answer other datacenters yet")?
                .clone();
            Ok(handler(req).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datacenters_are_listed_own_first_then_nearest() {
        let ms = |n| Some(Duration::from_millis(n));
        let others = vec![
            ("dc2".to_string(), ms(40)),
            ("dc3".to_string(), None),
            ("dc4".to_string(), ms(5)),
            ("dc0".to_string(), None),
        ];
        assert_eq!(
            nearest_first("dc1", others),
            ["dc1", "dc4", "dc2", "dc0", "dc3"]
        );
    }

    #[test]
    fn datacenter_names_are_consuls() {
        assert!(valid_datacenter("dc-1_east"));
        for bad in ["", "dc 1", "dc.1", "dc/1", &"x".repeat(65)] {
            assert!(!valid_datacenter(bad), "{bad:?}");
        }
    }

    /// A server unheard from for the timeout goes (one never heard from
    /// counts from when it was heard of), a datacenter with its last
    /// server; one that answered within it stays. What others say of a
    /// forgotten server is not taken in.
    #[test]
    fn servers_unheard_from_expire_and_forgotten_ones_stay_out() {
        let timeout = Duration::from_secs(3600);
        let mut known: BTreeMap<String, BTreeMap<String, Known>> = BTreeMap::new();
        let none = BTreeMap::new();
        let said = |addr: &str| WanServer {
            name: format!("s-{addr}"),
            raft_addr: addr.into(),
        };
        learn_servers(&mut known, &none, "dc2", &[said("a:1"), said("a:2")]);
        learn_servers(&mut known, &none, "dc3", &[said("b:1")]);
        let heard_of = Instant::now();
        // Half an hour on, dc2's a:1 answers; nobody of dc3 ever does.
        known
            .get_mut("dc2")
            .unwrap()
            .get_mut("a:1")
            .unwrap()
            .contact = Some(heard_of + Duration::from_secs(1800));
        let later = heard_of + Duration::from_secs(3601);
        let gone = expire_known(&mut known, later, timeout);
        assert_eq!(
            gone,
            [
                ("dc2".to_string(), "a:2".to_string(), "s-a:2".to_string()),
                ("dc3".to_string(), "b:1".to_string(), "s-b:1".to_string()),
            ]
        );
        assert_eq!(known.keys().collect::<Vec<_>>(), ["dc2"]);
        assert!(known["dc2"].contains_key("a:1"));
        // Forgotten: another's word brings back neither it nor its
        // datacenter.
        let forgotten = BTreeMap::from([("b:1".to_string(), Instant::now())]);
        learn_servers(&mut known, &forgotten, "dc3", &[said("b:1")]);
        assert!(!known.contains_key("dc3"));
    }
}
