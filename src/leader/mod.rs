//! The leader's duties, in Consul's shape (`leader.go`): one task watches
//! Raft for leadership changes; when this server takes office for a term,
//! [`establish`] starts every duty of [`DUTIES`] in one set, and when it
//! loses office (or another term begins) [`revoke`] aborts them all, waits
//! until they have stopped, and clears the leader's soft state (session
//! timers, agent leases). No duty checks leadership itself: it runs only
//! while its term lasts.
//!
//! A duty that panics stops the server, named (`tasks::Tasks`), as any
//! critical task does; a duty may also finish once its work for the term
//! is done (the cluster id, ACL init).
//!
//! The duties:
//!
//! - `cluster`: the cluster id, the first CA root (none in a secondary),
//!   a half-staged restore dropped.
//! - `acl`: the built-ins and the initial management token.
//! - `session_expiry`: session TTL expiry.
//! - `liveness`: the agent lease reaper, the servers' `consul` service.
//! - `tombstones`: tombstone reaping.
//! - `token_expiry`: tokens past their `ExpirationTime` deleted every 5 s,
//!   256 a round (a secondary only its local ones).
//! - `coordinates`: the queued coordinate updates applied as one
//!   `Command::CoordinateBatch` every 5 s.
//! - `autopilot`: with `CleanupDeadServers`, dead servers removed within
//!   Consul's quorum rule, each logged and counted in
//!   `cairn_autopilot_dead_servers_removed_total`.
//! - `federation`: the primary's federation states, once another
//!   datacenter is known.
//! - `connect_ca`: a secondary's CA. A new intermediate is made after a
//!   rotation in the primary, a key type or size configured here, or at
//!   half its life. Failures are retried after `replication::Backoff`'s
//!   pause; progress is kept as `Replicated::Ca`.
//! - `replication`: a secondary's pulls from the primary, with the
//!   replication token of the server's own agent
//!   (`PUT /v1/agent/token/replication`, `acl.tokens.replication`), else
//!   `--acl-replication-token`, read for each pull. The pulls are `?stale`:
//!   a server's pull is trusted only where it arrives, never passed on to
//!   that datacenter's leader, and an answer older than what the term
//!   applied is never applied. Local tokens are never touched; nothing is
//!   written when nothing differs. `Backoff`'s pause doubles per failure
//!   and ends at once when a datacenter becomes newly known
//!   (`Federation::watch_others`: the primary's first answer).

mod acl;
mod autopilot;
mod cluster;
mod connect_ca;
mod coordinates;
mod federation;
pub mod liveness;
mod replication;
mod session_expiry;
mod token_expiry;
mod tombstones;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use tokio::task::{Id, JoinSet};

use crate::federation::{Federation, Replicated};
use crate::server::Server;

type DutyFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a duty is started with: the server, its WAN federation (none in
/// the simulation, which runs no HTTP front), and the term.
#[derive(Clone)]
pub struct Term {
    pub server: Arc<Server>,
    pub federation: Option<Arc<Federation>>,
    pub term: u64,
}

/// A leader duty: its task name (what `CAIRN_FAULT_TASK` and a crash
/// report name) and what starts it for a term.
pub struct Duty {
    pub name: &'static str,
    pub start: fn(Term) -> DutyFuture,
}

/// Every duty a leader runs, each started afresh for each term it leads.
pub const DUTIES: &[Duty] = &[
    Duty::new("cluster id and CA root", |t| {
        Box::pin(cluster::establish(t.server))
    }),
    Duty::new("ACL init", |t| Box::pin(acl::init(t.server, t.federation))),
    Duty::new("session TTL expiry", |t| {
        Box::pin(session_expiry::expire(t.server, t.term))
    }),
    Duty::new("agent lease reaper", |t| Box::pin(liveness::reap(t.server))),
    Duty::new("tombstone reaper", |t| Box::pin(tombstones::reap(t.server))),
    Duty::new("expired ACL token reaper", |t| {
        Box::pin(token_expiry::reap(t.server))
    }),
    Duty::new("coordinate batches", |t| {
        Box::pin(coordinates::apply(t.server))
    }),
    Duty::new("autopilot dead-server cleanup", |t| {
        Box::pin(autopilot::cleanup(t.server))
    }),
    Duty::new("federation states", |t| {
        Box::pin(federation::write_states(t.federation))
    }),
    Duty::new("ACL replication", |t| {
        Box::pin(replication::run(t.server, t.federation, Replicated::Acl))
    }),
    Duty::new("config entry replication", |t| {
        Box::pin(replication::run(t.server, t.federation, Replicated::Config))
    }),
    Duty::new("connect CA from the primary", |t| {
        Box::pin(connect_ca::run(t.server, t.federation))
    }),
];

impl Duty {
    const fn new(name: &'static str, start: fn(Term) -> DutyFuture) -> Duty {
        Duty { name, start }
    }
}

/// The duties of one term in office.
pub struct Office {
    term: u64,
    duties: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

/// Watches Raft for leadership changes, for the server's life: the one
/// place that decides whether leader duties run here.
pub async fn run(s: Arc<Server>, federation: Option<Arc<Federation>>) {
    // The full metrics: `current_leader` and the term are read from them,
    // so this wakes whenever they may have changed.
    let mut metrics = s.raft().metrics();
    let mut office: Option<Office> = None;
    loop {
        let leading = s.cluster().leading_term();
        if office.as_ref().map(|o| o.term) != leading {
            if let Some(o) = office.take() {
                revoke(&s, o).await;
            }
            office = leading.map(|term| establish(&s, federation.clone(), term));
        }
        let duty_ended = async {
            match office.as_mut() {
                Some(o) => o.duties.join_next_with_id().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = metrics.changed() => {
                if changed.is_err() {
                    // Raft stopped: so does everything it led.
                    if let Some(o) = office.take() {
                        revoke(&s, o).await;
                    }
                    return std::future::pending().await;
                }
            }
            Some(ended) = duty_ended => {
                if let (Err(e), Some(o)) = (ended, office.as_ref()) {
                    let name = o.names.get(&e.id()).copied().unwrap_or("leader duty");
                    s.tasks().report_panic(name, e);
                }
            }
        }
    }
}

/// Takes office for `term`: starts every duty.
pub fn establish(s: &Arc<Server>, federation: Option<Arc<Federation>>, term: u64) -> Office {
    tracing::info!(term, "leadership established: starting the leader duties");
    let mut duties = JoinSet::new();
    let mut names = HashMap::new();
    let t = Term {
        server: s.clone(),
        federation,
        term,
    };
    for d in DUTIES {
        let task = crate::tasks::fault(d.name, (d.start)(t.clone()));
        let h = duties.spawn(task);
        names.insert(h.id(), d.name);
    }
    s.duties().set(Some(term));
    Office {
        term,
        duties,
        names,
    }
}

/// Leaves office: stops every duty (returning once none runs) and drops
/// the leader's soft state, which means nothing to a follower and must be
/// rebuilt by the next term in office.
pub async fn revoke(s: &Server, mut o: Office) {
    tracing::info!(term = o.term, "leadership lost: stopping the leader duties");
    o.duties.abort_all();
    while let Some(ended) = o.duties.join_next_with_id().await {
        if let Err(e) = ended
            && e.is_panic()
        {
            let name = o.names.get(&e.id()).copied().unwrap_or("leader duty");
            s.tasks().report_panic(name, e);
        }
    }
    s.sessions().step_down();
    s.liveness().step_down();
    s.duties().set(None);
}
