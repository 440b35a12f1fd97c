//! Node liveness for agents, the servers' side: a lease on the leader,
//! renewed by each agent's heartbeat, instead of gossip.
//!
//! - An agent sends `PUT /v1/internal/agent/heartbeat` (its node
//!   registration) every few seconds; followers forward it to the leader
//!   like any write.
//! - The leader renews the node's lease in memory and, when the node's
//!   `serfHealth` check is not passing (new node, or back from the dead),
//!   registers it passing — a Raft write only on that transition.
//! - The leader's reaper ([`reap`]) marks `serfHealth` critical for nodes
//!   whose lease ran out ([`LEASE_TTL`]).
//! - Leases are soft state. A new leader seeds one for every agent node whose
//!   `serfHealth` is passing, so a node that died with the old leader is
//!   still marked critical one lease later. The catalog (in Raft) holds the
//!   outcome every server agrees on, and `/v1/agent/members` is built from it.
//! - `PUT /v1/internal/agent/leave`: a clean shutdown deregisters the node,
//!   as a Consul client leaving the cluster does.
//!
//! Agent nodes are recognised by their [`AGENT_META`] node meta key (the
//! agent's HTTP address). Steady state costs one small request per agent per
//! heartbeat and no Raft write. The agents' side is `crate::agent::liveness`.

use crate::request::authz::Authz;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use serde::Deserialize;

use super::App;
use crate::error::{Error, Result};
use crate::request::decode_json;
use crate::server::Server;
use crate::state::{self, Command, Response as Applied};
use crate::structs::agent::{
    AGENT_META, CONSUL_SERVICE, CONSUL_VERSION, HeartbeatReply, MEMBER_ALIVE, MEMBER_FAILED,
    Member, SERF_CHECK_ID,
};
use crate::structs::validate::validate_register;
use crate::structs::{
    DeregisterRequest, HEALTH_CRITICAL, HEALTH_PASSING, HealthCheck, HealthStatus, NodeService,
    RegisterRequest,
};

/// A node whose lease is this old is marked critical: four missed
/// heartbeats, so a loaded machine does not flap.
pub const LEASE_TTL: Duration = Duration::from_secs(8);
/// How often the leader looks for expired leases.
const REAP_EVERY: Duration = Duration::from_secs(1);

const ALIVE_OUTPUT: &str = "Agent alive and reachable";
const DEAD_OUTPUT: &str = "Agent not live or unreachable";

fn serf_status(st: &state::State, node: &str) -> Option<HealthStatus> {
    st.checks
        .get(&(node.to_string(), SERF_CHECK_ID.to_string()))
        .map(|c| c.status)
}

fn serf_check(node: &str, status: HealthStatus, output: &str) -> HealthCheck {
    HealthCheck {
        node: node.to_string(),
        check_id: SERF_CHECK_ID.into(),
        name: "Serf Health Status".into(),
        status,
        output: output.into(),
        ..Default::default()
    }
}

fn is_agent_node(st: &state::State, node: &str) -> bool {
    st.nodes
        .get(node)
        .is_some_and(|n| n.meta.contains_key(AGENT_META))
}

/// Agent nodes whose `serfHealth` is passing.
fn live_agent_nodes(st: &state::State) -> impl Iterator<Item = String> + '_ {
    st.nodes
        .values()
        .filter(|n| n.meta.contains_key(AGENT_META))
        .filter(|n| serf_status(st, &n.node) == Some(HEALTH_PASSING))
        .map(|n| n.node.clone())
}

async fn commit(s: &Server, cmd: Command) -> Result<()> {
    match s.write(cmd).await? {
        Applied::Ok | Applied::Bool(true) => Ok(()),
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

async fn heartbeat(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    let mut req: RegisterRequest = decode_json(&body)?;
    a.require(a.node_write(&req.node), "node:write", &req.node)?;
    req.service = None;
    req.check = None;
    req.checks.clear();
    validate_register(&mut req, &s.config.datacenter)?;
    let st = s.store.state();
    let known = st.nodes.contains_key(&req.node);
    s.liveness.renew(&req.node, Instant::now());
    if serf_status(&st, &req.node) != Some(HEALTH_PASSING) {
        tracing::info!(node = %req.node, "agent alive");
        req.skip_node_update = known;
        req.check = Some(serf_check(&req.node, HEALTH_PASSING, ALIVE_OUTPUT));
        commit(&s, Command::Register(Box::new(req))).await?;
    }
    let servers = server_names(&s);
    Ok(axum::Json(HeartbeatReply {
        members: s.liveness.len_except(&servers) + servers.len(),
        known,
        datacenter: s.config.datacenter.clone(),
    })
    .into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LeaveRequest {
    node: String,
}

async fn leave(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    let req: LeaveRequest = decode_json(&body)?;
    if req.node.is_empty() {
        return Err(Error::bad("Must provide node"));
    }
    a.require(a.node_write(&req.node), "node:write", &req.node)?;
    s.liveness.forget(&req.node);
    tracing::info!(node = %req.node, "agent left");
    commit(
        &s,
        Command::Deregister(DeregisterRequest {
            node: req.node,
            datacenter: s.config.datacenter.clone(),
            ..Default::default()
        }),
    )
    .await?;
    Ok(axum::Json(true).into_response())
}

/// The server's liveness endpoints (writes: answered by the leader).
pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/internal/agent/heartbeat", put(heartbeat))
        .route("/v1/internal/agent/leave", put(leave))
}

/// The leader's duty: mark nodes whose lease ran out critical. Runs for the
/// server's life; does nothing while it does not lead.
pub async fn reap(s: Arc<Server>) {
    let mut tick = tokio::time::interval(REAP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut ticks = 0u64;
    loop {
        tick.tick().await;
        ticks += 1;
        if !s.cluster.is_leader() {
            s.liveness.step_down();
            continue;
        }
        let st = s.store.state();
        let now = Instant::now();
        // Seed at the start of a term in office, and now and then for
        // agent nodes that became live without a heartbeat here.
        if !s.liveness.in_office() || ticks.is_multiple_of(30) {
            s.liveness.seed(live_agent_nodes(&st), now);
        }
        if let Err(e) = register_servers(&s, &st).await {
            tracing::warn!(error = %e, "could not register the servers' consul service");
        }
        for node in s.liveness.expired(now, LEASE_TTL) {
            if !is_agent_node(&st, &node) || serf_status(&st, &node) != Some(HEALTH_PASSING) {
                // Gone, or already marked: nothing to watch until it
                // heartbeats again.
                s.liveness.forget(&node);
                continue;
            }
            if !s.liveness.still_expired(&node, Instant::now(), LEASE_TTL) {
                continue;
            }
            tracing::warn!(node = %node, "agent missed its heartbeats: marking it critical");
            let req = RegisterRequest {
                node: node.clone(),
                datacenter: s.config.datacenter.clone(),
                skip_node_update: true,
                check: Some(serf_check(&node, HEALTH_CRITICAL, DEAD_OUTPUT)),
                ..Default::default()
            };
            if let Err(e) = commit(&s, Command::Register(Box::new(req))).await {
                // Kept: the next tick tries again.
                tracing::warn!(node = %node, error = %e, "could not mark agent critical");
            }
        }
    }
}

/// Every server in the catalog as the `consul` service on its node, at its
/// Raft/RPC port (`consul.service.consul` in DNS), as Consul's leader
/// registers its servers; a server that left the Raft configuration goes.
/// A Raft write only when that differs from the catalog.
async fn register_servers(s: &Server, st: &state::State) -> Result<()> {
    let members = s.cluster.members();
    for (_, m, voter) in &members {
        let (host, port) = m.raft_addr.rsplit_once(':').unwrap_or((&m.raft_addr, "0"));
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let service = NodeService {
            id: CONSUL_SERVICE.into(),
            service: CONSUL_SERVICE.into(),
            port: port.parse().unwrap_or(0),
            meta: [
                ("non_voter", (!voter).to_string()),
                ("raft_version", "3".to_string()),
                ("read_replica", "false".to_string()),
                ("version", CONSUL_VERSION.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            ..Default::default()
        };
        // Compared by what is set here: the catalog fills in defaults
        // (weights...) that a plain comparison would see as a change.
        let key = (m.name.clone(), CONSUL_SERVICE.to_string());
        if st.services.get(&key).is_some_and(|svc| {
            svc.service == service.service && svc.port == service.port && svc.meta == service.meta
        }) {
            continue;
        }
        let known = st.nodes.contains_key(&m.name);
        let req = RegisterRequest {
            node: m.name.clone(),
            address: host.to_string(),
            datacenter: s.config.datacenter.clone(),
            skip_node_update: known,
            service: Some(service),
            ..Default::default()
        };
        commit(s, Command::Register(Box::new(req))).await?;
    }
    let gone = st
        .service_names
        .get(CONSUL_SERVICE)
        .into_iter()
        .flatten()
        .filter(|(node, _)| !members.iter().any(|(_, m, _)| m.name == *node));
    for (node, id) in gone {
        let req = DeregisterRequest {
            node: node.clone(),
            service_id: id.clone(),
            datacenter: s.config.datacenter.clone(),
            ..Default::default()
        };
        commit(s, Command::Deregister(req)).await?;
    }
    Ok(())
}

/// The names of the cluster's servers.
pub fn server_names(s: &Server) -> Vec<String> {
    s.cluster
        .members()
        .into_iter()
        .map(|(_, n, _)| n.name)
        .collect()
}

/// `/v1/agent/members` rows for agent nodes: alive while `serfHealth`
/// passes, failed when it is critical. `servers` are left out: a server's
/// node is an agent node too, but it is listed once, as a server.
pub fn agent_members(st: &state::State, dc: &str, servers: &[String]) -> Vec<Member> {
    st.nodes
        .values()
        .filter(|n| !servers.contains(&n.node))
        .filter_map(|n| {
            let addr = n.meta.get(AGENT_META)?;
            let port = addr
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .unwrap_or(0);
            let status = match serf_status(st, &n.node) {
                Some(HEALTH_CRITICAL) => MEMBER_FAILED,
                _ => MEMBER_ALIVE,
            };
            Some(Member::node(&n.node, &n.address, port, dc, status))
        })
        .collect()
}
