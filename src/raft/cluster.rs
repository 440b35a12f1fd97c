//! Cluster formation and membership, as the contract says:
//!
//! - `--bootstrap-expect N`: servers greet the `--join` addresses (and every
//!   server that greets them) until N know each other; the one with the
//!   lowest id then initializes Raft with all N. Nobody else ever does.
//! - A server whose Raft store was used before never bootstraps: it rejoins
//!   with what its data dir holds.
//! - A server started with `--join` and no `--bootstrap-expect` asks a member
//!   to add it; the leader adds it as a learner, waits for it to catch up,
//!   then makes it a voter.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use openraft::ChangeMembers;
use openraft::async_runtime::WatchReceiver;
use parking_lot::Mutex;

use super::network::{Conn, Connect, Dial, Formation, Hello, Reply, Request};
use super::{NodeId, Raft, ServerNode};

pub struct Cluster {
    pub id: NodeId,
    pub me: ServerNode,
    pub raft: Raft,
    expect: usize,
    joins: Vec<String>,
    /// Servers that greeted us or answered our greeting.
    known: Mutex<BTreeMap<NodeId, ServerNode>>,
    /// How formation messages reach other servers (TCP, or simulated).
    connector: Arc<dyn Connect>,
    /// When this server started, and when (ms after it) the leader last
    /// spoke to it: per server, so servers sharing a process (the
    /// simulation) stay apart.
    started: tokio::time::Instant,
    last_contact_ms: AtomicU64,
    /// Since when each server has been healthy (autopilot's `StableSince`).
    stability: super::autopilot::Stability,
    /// Who answers the WAN frames, once process assembly set it.
    pub wan: std::sync::OnceLock<Arc<dyn super::wan::Wan>>,
    /// Who answers endpoint calls from this datacenter's other servers,
    /// once process assembly set it (`crate::endpoint`).
    pub calls: std::sync::OnceLock<Arc<dyn super::channel::Calls>>,
    /// This server's channels to the others (a follower's to its leader).
    channels: super::channel::Channels,
    /// The leader this server asked to be taken back by, while no leader
    /// speaks to it (`stay_member`).
    awaited: Mutex<Option<NodeId>>,
}

const RPC_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `PUT /v1/agent/join` keeps asking.
const JOIN_FOR: Duration = Duration::from_secs(30);

/// How long a join waits for its server to catch up before answering that
/// it has not yet (within the joiner's 60 s RPC timeout; it asks again).
const CATCH_UP: Duration = Duration::from_secs(20);

/// A server that has heard from no leader for this long asks whether the
/// cluster goes on without it (`stay_member`): several election timeouts,
/// so that an election or a short partition never sends it.
const REJOIN_AFTER: Duration = Duration::from_secs(5);

/// How recently a quorum must have answered a leader for it to judge
/// others dead (heartbeats go every 150 ms).
const QUORUM_FRESH: Duration = Duration::from_secs(2);

/// How often it looks.
const REJOIN_CHECK: Duration = Duration::from_secs(1);

/// Servers remembered from greetings while forming (a cluster forms from a
/// handful; anything past this greeting us is ignored).
const MAX_KNOWN: usize = 64;

impl Cluster {
    /// Milliseconds since the leader last spoke to this server.
    pub fn since_leader_contact(&self) -> u64 {
        let now = self.started.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_contact_ms.load(Ordering::Relaxed))
    }

    pub fn new(
        id: NodeId, me: ServerNode, raft: Raft, expect: usize, joins: Vec<String>,
        connector: Arc<dyn Connect>,
    ) -> Self {
        Cluster {
            id,
            me,
            raft,
            expect,
            joins,
            known: Mutex::new(BTreeMap::new()),
            connector,
            started: tokio::time::Instant::now(),
            last_contact_ms: AtomicU64::new(0),
            stability: Default::default(),
            wan: Default::default(),
            calls: Default::default(),
            channels: Default::default(),
            awaited: Mutex::new(None),
        }
    }

    /// The channel of endpoint calls to the server at `addr` (this
    /// datacenter's leader), opened on first use and again after it closed.
    pub async fn channel_to(&self, addr: &str) -> std::io::Result<Arc<super::channel::Channel>> {
        self.channels
            .to(addr, || {
                super::network::open_channel(
                    &*self.connector,
                    addr,
                    &Dial::Local,
                    &Request::Channel,
                )
            })
            .await
    }

    /// How this server reaches others' Raft ports (TLS or `--encrypt` as
    /// configured): WAN federation's frames go the same way.
    pub fn connector(&self) -> Arc<dyn Connect> {
        self.connector.clone()
    }

    /// What Raft reports now (leader, term, indexes, membership).
    pub fn metrics(&self) -> openraft::RaftMetrics<super::TypeConfig> {
        self.raft.metrics().borrow_watched().clone()
    }

    /// The servers' health as autopilot judges it (see `autopilot`).
    pub fn health(
        &self, config: &crate::structs::operator::AutopilotConfig,
    ) -> crate::structs::operator::OperatorHealth {
        super::autopilot::health(
            &self.metrics(),
            self.members(),
            self.id,
            config,
            &self.stability,
        )
    }

    /// How long this leader has heard nothing from each member: (id,
    /// voter, silence). A member it has never heard from is silent since
    /// the caller first saw it in the membership (`seen`, kept by the
    /// caller across calls; members gone are dropped from it), so that a
    /// new leader or a new learner is given its full time. `None` unless
    /// this server leads with a quorum's recent answer: a leader cut off
    /// from the others (perhaps deposed already) judges nobody.
    pub fn silences(
        &self, seen: &mut std::collections::HashMap<NodeId, tokio::time::Instant>,
    ) -> Option<Vec<(NodeId, bool, Duration)>> {
        use openraft::Instant as _;
        let m = self.metrics();
        if m.current_leader != Some(self.id)
            || m.last_quorum_acked
                .as_ref()
                .is_none_or(|t| t.elapsed() > QUORUM_FRESH)
        {
            return None;
        }
        let heard = m.heartbeat.as_ref()?;
        let now = tokio::time::Instant::now();
        let members = self.members();
        seen.retain(|id, _| members.iter().any(|(m, _, _)| m == id));
        Some(
            members
                .into_iter()
                .map(|(id, _, voter)| {
                    let known_for = now - *seen.entry(id).or_insert(now);
                    let silent = if id == self.id {
                        Duration::ZERO
                    } else {
                        heard
                            .get(&id)
                            .cloned()
                            .flatten()
                            .map_or(known_for, |t| t.elapsed().min(known_for))
                    };
                    (id, voter, silent)
                })
                .collect(),
        )
    }

    /// The servers in the current membership (voters and learners).
    pub fn members(&self) -> Vec<(NodeId, ServerNode, bool)> {
        let m = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .clone();
        let voters: BTreeSet<NodeId> = m.membership().voter_ids().collect();
        m.membership()
            .nodes()
            .map(|(id, n)| (*id, n.clone(), voters.contains(id)))
            .collect()
    }

    pub fn is_initialized(&self) -> bool {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .next()
            .is_some()
    }

    /// The leader as this server knows it.
    pub fn leader(&self) -> Option<(NodeId, ServerNode)> {
        // Borrowed, not cloned: every read answer asks (X-Consul-KnownLeader).
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let id = m.current_leader?;
        let node = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, node))
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().current_leader == Some(self.id)
    }

    /// Leads, and has applied an entry of its own term: everything
    /// committed before its election is applied too, so what it reads is
    /// never older than a write acknowledged before (a restarted server
    /// re-applies the rows it had not yet written: `state::write_behind`).
    ///
    /// And holds its lease: a quorum acknowledged one of its messages sent
    /// within `LEADER_LEASE`. A leader cut off from its followers keeps
    /// believing it leads until it hears of a newer term (openraft does not
    /// step it down), while the others elect a new one after an election
    /// timeout; without the lease it would answer default-mode reads from
    /// a state older than writes the new leader acknowledged, for as long
    /// as the partition lasts. Past the lease it answers none (reads wait
    /// for the lease back, else `500 No cluster leader`, and clients ask
    /// another server), as Consul's leader steps down when its lease ends.
    pub fn is_ready_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        m.current_leader == Some(self.id)
            && m.last_applied.as_ref().map(|l| l.leader_id.term) == Some(m.current_term)
            && self.holds_lease(&m)
    }

    /// A quorum acknowledged this leader recently enough that no other can
    /// have been elected since: the followers that acknowledged a message
    /// sent at `t` start no election before `t` + the least election
    /// timeout, and `LEADER_LEASE` ends before that, with room for clocks
    /// that run apart. A lone voter is its own quorum.
    fn holds_lease(&self, m: &openraft::RaftMetrics<super::TypeConfig>) -> bool {
        if cfg!(feature = "bug-stale-read") {
            // BUG (deliberate, with `Server::linearize`'s): no lease, the
            // local belief in leadership trusted.
            return true;
        }
        let mut voters = m.membership_config.membership().voter_ids();
        if voters.next() == Some(self.id) && voters.next().is_none() {
            return true;
        }
        m.last_quorum_acked
            .as_ref()
            .is_some_and(|t| openraft::Instant::elapsed(&t.into_inner()) < super::LEADER_LEASE)
    }

    /// The term this server leads in, once it has applied an entry of it
    /// (Consul's barrier before `establishLeadership`): until then its
    /// state may lack entries the previous leader committed, and a duty
    /// taking office from it (session expiry arming every TTL) would miss
    /// them for the whole term.
    pub fn leading_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let applied_own = m.last_applied.as_ref().map(|l| l.leader_id.term) == Some(m.current_term);
        (m.current_leader == Some(self.id) && applied_own).then_some(m.current_term)
    }

    fn hello_msg(&self) -> Hello {
        Hello {
            id: self.id,
            node: self.me.clone(),
            initialized: self.is_initialized(),
            leader: self.leader(),
        }
    }

    /// Forms or joins the cluster, then keeps this server a member for
    /// the rest of its life (`stay_member`).
    pub async fn form(self: Arc<Self>, store_was_used: bool) {
        if store_was_used {
            tracing::info!("raft state found in data dir: rejoining, never bootstrapping");
        } else {
            self.first_formation().await;
        }
        self.stay_member(store_was_used).await;
    }

    /// Forms or joins the cluster; returns once this server is a member.
    async fn first_formation(&self) {
        let expect = if self.expect == 0 && self.joins.is_empty() {
            1
        } else {
            self.expect
        };
        let mut attempt: u64 = 0;
        loop {
            if self.is_initialized() {
                return;
            }
            attempt += 1;
            let mut formed_peer = None;
            for addr in &self.joins {
                let mut conn = Conn::new(self.connector.clone(), addr.clone());
                let reply = conn
                    .call(&Request::Hello(self.hello_msg()), RPC_TIMEOUT)
                    .await;
                if let Ok(Reply::Hello(h)) = reply
                    && h.id != self.id
                {
                    if h.initialized {
                        formed_peer = Some(h.node.raft_addr.clone());
                    }
                    self.known.lock().insert(h.id, h.node);
                }
            }
            if let Some(addr) = formed_peer {
                // A cluster exists. A server of its bootstrap hears so before
                // the leader's first entries reach it: give those a moment.
                if self.expect == 0 || attempt > 10 {
                    match self.ask_to_join(&addr).await {
                        Ok(()) => {
                            tracing::info!(via = %addr, "joined the cluster");
                            return;
                        }
                        Err(e) => tracing::info!(via = %addr, error = %e, "join not done yet"),
                    }
                }
            } else if expect > 0 {
                let mut members = self.known.lock().clone();
                members.insert(self.id, self.me.clone());
                if members.len() >= expect {
                    let lowest = *members.keys().next().expect("not empty");
                    if lowest == self.id {
                        tracing::info!(servers = members.len(), "bootstrapping the cluster");
                        match self.raft.initialize(members).await {
                            Ok(()) => return,
                            Err(e) => tracing::warn!(error = %e, "bootstrap failed"),
                        }
                    }
                } else if attempt % 10 == 1 {
                    tracing::info!(
                        found = members.len(),
                        expect,
                        "waiting for servers to bootstrap"
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A server removed from the membership while it was down or cut off
    /// (`remove-peer`, `force-leave`, autopilot's cleanup) hears from no
    /// leader again: the leader replicates only to members, and members
    /// refuse Raft messages from a non-member (`network`), so it would
    /// campaign forever, its term rising, and nobody listening. So, while
    /// no leader speaks to it (or, leading, no quorum answers it), it greets
    /// the servers it knows, and:
    ///
    /// - while one of them names another leader, it keeps quiet (no
    ///   elections of its own: they can win nothing, and each term they
    ///   raise would depose, once back, the leader that took it back);
    ///   after `REJOIN_AFTER` of that it asks to join again. The leader
    ///   decides: a member is answered at once and nothing changes; a
    ///   non-member goes through the same checks as any joiner (the
    ///   transport's TLS or key, a learner promoted once caught up);
    /// - once a leader speaks to it, or nobody names one, it may campaign.
    ///
    /// A server restarted on its data dir starts quiet and greets at once,
    /// so a removed one never raises its term, and a cluster restarted
    /// whole elects as soon as its servers find no leader.
    async fn stay_member(&self, restarted: bool) {
        let mut quiet = restarted;
        let mut asked_promotion = tokio::time::Instant::now();
        if quiet {
            self.raft.runtime_config().elect(false);
        }
        loop {
            let heard = self.heard_from_leader();
            let elsewhere = if heard {
                None
            } else {
                self.led_elsewhere().await
            };
            if elsewhere.is_some() != quiet {
                quiet = elsewhere.is_some();
                if quiet {
                    tracing::info!("another server leads: this one starts no election");
                } else {
                    tracing::info!("this server may start elections again");
                }
                self.raft.runtime_config().elect(!quiet);
            }
            // Awaited until it is a member here too (its entries brought
            // the membership naming it), or nobody names a leader.
            let awaited = *self.awaited.lock();
            if let Some(l) = awaited
                && elsewhere.is_none()
                && (!heard || self.members().iter().any(|(m, _, _)| *m == l))
            {
                *self.awaited.lock() = None;
            }
            if let Some((addr, leader)) = elsewhere
                && self.since_leader_contact() >= REJOIN_AFTER.as_millis() as u64
            {
                // Its entries are taken even if that leader joined after
                // the membership this server knows.
                *self.awaited.lock() = Some(leader);
                tracing::info!(via = %addr, "no word from a leader: asking to join again");
                match self.ask_to_join(&addr).await {
                    Ok(()) => tracing::info!(via = %addr, "member of the cluster again"),
                    Err(e) => tracing::info!(via = %addr, error = %e, "rejoin not done yet"),
                }
            }
            // Left a learner by a leader that lost office before it could
            // promote it (the joiner's own old term can depose it): asks
            // the leader now in office, which promotes it once caught up.
            if heard
                && asked_promotion.elapsed() >= REJOIN_AFTER
                && let Some(addr) = self.leader_if_learner()
            {
                asked_promotion = tokio::time::Instant::now();
                tracing::info!(via = %addr, "a learner here: asking the leader to promote this server");
                if let Err(e) = self.ask_to_join(&addr).await {
                    tracing::info!(via = %addr, error = %e, "not promoted yet");
                }
            }
            tokio::time::sleep(REJOIN_CHECK).await;
        }
    }

    /// The leader's Raft address, if it leads and this server is a learner
    /// in the membership it replicated here.
    fn leader_if_learner(&self) -> Option<String> {
        let members = self.members();
        let learner = members
            .iter()
            .any(|(id, _, voter)| *id == self.id && !voter);
        let (leader, node) = self.leader()?;
        (learner && leader != self.id).then_some(node.raft_addr)
    }

    /// The first server this one knows that belongs to a cluster led by
    /// another server: its address, and the leader it names.
    async fn led_elsewhere(&self) -> Option<(String, NodeId)> {
        for addr in self.peer_addrs() {
            let mut conn = Conn::new(self.connector.clone(), addr.clone());
            if let Ok(Reply::Hello(h)) = conn
                .call(&Request::Hello(self.hello_msg()), RPC_TIMEOUT)
                .await
                && h.id != self.id
                && h.initialized
                && let Some((leader, _)) = h.leader
                && leader != self.id
            {
                return Some((addr, leader));
            }
        }
        None
    }

    /// Whether a leader spoke to this server within `REJOIN_AFTER` (ever,
    /// since it started), or, leading, a quorum answered it as recently.
    fn heard_from_leader(&self) -> bool {
        use openraft::Instant as _;
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        if m.current_leader == Some(self.id) {
            m.last_quorum_acked
                .as_ref()
                .is_some_and(|t| t.elapsed() < REJOIN_AFTER)
        } else {
            self.last_contact_ms.load(Ordering::Relaxed) > 0
                && self.since_leader_contact() < REJOIN_AFTER.as_millis() as u64
        }
    }

    /// The Raft addresses of the other servers this one knows: the
    /// membership in its log and its `--join` addresses.
    fn peer_addrs(&self) -> BTreeSet<String> {
        let mut addrs: BTreeSet<String> = self
            .members()
            .into_iter()
            .filter(|(id, _, _)| *id != self.id)
            .map(|(_, n, _)| n.raft_addr)
            .collect();
        addrs.extend(self.joins.iter().cloned());
        addrs.remove(&self.me.raft_addr);
        addrs
    }

    /// `PUT /v1/agent/join/:address`: asks the server at `addr` (a Raft
    /// address) to take this one in, as `--join` does.
    /// Asks the server at `addr` to add this one, again while it answers
    /// that the join is not done yet (a leader being elected, this server
    /// still catching up), for up to `JOIN_FOR`; the last answer otherwise.
    pub async fn join_via(&self, addr: &str) -> Result<(), String> {
        let deadline = Instant::now() + JOIN_FOR;
        loop {
            match self.ask_to_join(addr).await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::info!(via = %addr, error = %e, "join not done yet");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }

    async fn ask_to_join(&self, addr: &str) -> Result<(), String> {
        let mut conn = Conn::new(self.connector.clone(), addr.to_string());
        match conn
            .call(
                &Request::Join(self.id, self.me.clone()),
                Duration::from_secs(60),
            )
            .await
        {
            Ok(Reply::Join(r)) => r,
            Ok(_) => Err("unexpected reply".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Adds a server: learner first, voter once it has caught up.
    ///
    /// A learner counts toward no quorum, so one that never answers (a
    /// server that died while joining, or a forged `Join`) costs nothing
    /// and can always be removed. It is promoted only once replication to
    /// it has matched the leader's log as it was when this join began: it
    /// answered, and it has the log. (openraft's own catch-up check, a
    /// lag under `replication_lag_threshold`, takes a node that never
    /// answered for caught up while the log is short, and a voter that
    /// never answers wedges the joint configuration that adds it.) Not
    /// caught up within `CATCH_UP`: it stays a learner, and the joiner,
    /// told so, asks again.
    async fn add_server(&self, id: NodeId, node: ServerNode) -> Result<(), String> {
        match self.members().into_iter().find(|(m, _, _)| *m == id) {
            Some((_, _, true)) => return Ok(()),
            Some((_, known, false)) if known == node => {}
            _ => {
                tracing::info!(id, name = %node.name, "adding server as learner");
                self.raft
                    .add_learner(id, node, false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        let target = self.metrics().last_log_index.unwrap_or(0);
        let matched = |m: &openraft::RaftMetrics<super::TypeConfig>| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map(|l| l.index)
        };
        let settled = self
            .raft
            .wait(Some(CATCH_UP))
            .metrics(
                // Caught up, removed meanwhile, or no longer leading.
                |m| {
                    matched(m).is_some_and(|i| i >= target)
                        || m.membership_config.membership().get_node(&id).is_none()
                        || m.replication.is_none()
                },
                "joining server caught up",
            )
            .await;
        let m = self.metrics();
        if m.replication.is_none() {
            return Err("leadership lost while the server joined: ask again".into());
        }
        if m.membership_config.membership().get_node(&id).is_none() {
            return Err(format!("server {id} was removed while it joined"));
        }
        if settled.is_err() || matched(&m).is_none_or(|i| i < target) {
            return Err(format!(
                "server {id} has not caught up with the leader's log within {CATCH_UP:?}: \
                 it stays a non-voter until it does"
            ));
        }
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await?;
        tracing::info!(id, "server promoted to voter");
        Ok(())
    }

    /// Removes a server by name, numeric id or Raft address: a voter
    /// leaves the voters and the membership, a learner the membership.
    pub async fn remove_server(&self, who: &str) -> Result<(), crate::error::Error> {
        let (id, voter) = self
            .members()
            .into_iter()
            .find(|(id, n, _)| n.name == who || id.to_string() == who || n.raft_addr == who)
            .map(|(id, _, voter)| (id, voter))
            .ok_or_else(|| {
                crate::error::Error::NotFound(format!("no raft peer with id {who:?}"))
            })?;
        self.remove_id(id, voter).await
    }

    /// Removes the server `id`: from the voters and the membership if it
    /// is a voter, from the membership if a learner.
    pub async fn remove_id(&self, id: NodeId, voter: bool) -> Result<(), crate::error::Error> {
        let ids = BTreeSet::from([id]);
        let change = if voter {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        self.change(change)
            .await
            .map_err(crate::error::Error::Internal)
    }

    /// Hands leadership to the voter `to` (name, numeric id or Raft
    /// address), or to any other voter: Consul's `transfer-leader`. Waits
    /// (bounded) until another server leads; its name.
    pub async fn transfer_leader(&self, to: Option<&str>) -> Result<String, crate::error::Error> {
        use crate::error::Error;
        if !self.is_leader() {
            return Err(Error::Internal("this server is not the leader".into()));
        }
        let voters: Vec<(NodeId, ServerNode)> = self
            .members()
            .into_iter()
            .filter(|(id, _, voter)| *voter && *id != self.id)
            .map(|(id, n, _)| (id, n))
            .collect();
        let target = match to.filter(|t| !t.is_empty()) {
            Some(who) => voters
                .iter()
                .find(|(id, n, ..)| n.name == who || id.to_string() == who || n.raft_addr == who)
                .cloned()
                .ok_or_else(|| {
                    Error::bad(format!(
                        "cannot find a voter to transfer leadership to: {who:?}"
                    ))
                })?,
            None => voters
                .first()
                .cloned()
                .ok_or_else(|| Error::bad("no other voter to transfer leadership to"))?,
        };
        self.raft
            .trigger()
            .transfer_leader(target.0)
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        let mut metrics = self.raft.metrics();
        let moved = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let leader = metrics.borrow_watched().current_leader;
                if leader.is_some_and(|l| l != self.id) {
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if moved.is_err() {
            return Err(Error::Internal(format!(
                "leadership did not move to {} within 10 s",
                target.1.name
            )));
        }
        tracing::info!(to = %target.1.name, "raft: leadership transferred");
        Ok(target.1.name)
    }

    /// Changes membership, waiting out a change still in progress (joint
    /// consensus allows one at a time) for a bounded time.
    async fn change(&self, change: ChangeMembers<NodeId, ServerNode>) -> Result<(), String> {
        use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match self.raft.change_membership(change.clone(), false).await {
                Ok(_) => return Ok(()),
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(_),
                ))) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

impl Formation for Cluster {
    fn wan(&self) -> Option<Arc<dyn super::wan::Wan>> {
        self.wan.get().cloned()
    }

    fn calls(&self) -> Option<Arc<dyn super::channel::Calls>> {
        self.calls.get().cloned()
    }

    fn leader_contact(&self) {
        // Never 0, which means "no leader yet" (`heard_from_leader`).
        let now = (self.started.elapsed().as_millis() as u64).max(1);
        self.last_contact_ms.store(now, Ordering::Relaxed);
    }

    fn awaits_leader(&self, id: NodeId) -> bool {
        *self.awaited.lock() == Some(id)
    }

    async fn hello(&self, from: Hello) -> Hello {
        // Bookkeeping only while forming, and bounded: anyone can greet.
        if from.id != self.id && !self.is_initialized() {
            let mut known = self.known.lock();
            if known.len() < MAX_KNOWN || known.contains_key(&from.id) {
                known.insert(from.id, from.node);
            }
        }
        self.hello_msg()
    }

    async fn join(&self, id: NodeId, node: ServerNode) -> Result<(), String> {
        if self.is_leader() {
            return self.add_server(id, node).await;
        }
        match self.leader() {
            Some((lid, leader)) if lid != self.id => {
                self.ask_forward(&leader.raft_addr, id, node).await
            }
            _ => Err("No cluster leader".into()),
        }
    }
}

impl Cluster {
    async fn ask_forward(&self, addr: &str, id: NodeId, node: ServerNode) -> Result<(), String> {
        let mut conn = Conn::new(self.connector.clone(), addr.to_string());
        match conn
            .call(&Request::Join(id, node), Duration::from_secs(60))
            .await
        {
            Ok(Reply::Join(r)) => r,
            Ok(_) => Err("unexpected reply".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}
