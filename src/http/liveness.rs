//! Node liveness for agents, the servers' side: a lease on the leader,
//! renewed by each agent's heartbeat, instead of gossip.
//!
//! - An agent sends `PUT /v1/internal/agent/heartbeat` (its node
//!   registration) every few seconds; followers forward it to the leader
//!   like any write.
//! - The leader renews the node's lease in memory and, when the node's
//!   `serfHealth` check is not passing (new node, or back from the dead),
//!   registers it passing — a Raft write only on that transition.
//! - The leader's reaper (`leader::liveness`) marks `serfHealth` critical
//!   for nodes whose lease ran out (`leader::liveness::LEASE_TTL`).
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
//! A heartbeat's answer carries the server's coordinate, so a client agent
//! can move its own by the round trip.

use crate::request::authz::Authz;
use tokio::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use serde::Deserialize;

use super::App;
use crate::error::{Error, Result};
use crate::leader::liveness::{ALIVE_OUTPUT, commit, serf_check, serf_status};
use crate::request::decode_json;
use crate::server::Server;
use crate::state::{self, Command};
use crate::structs::agent::{AGENT_META, HeartbeatReply, MEMBER_ALIVE, MEMBER_FAILED, Member};
use crate::structs::validate::validate_register;
use crate::structs::{DeregisterRequest, HEALTH_CRITICAL, HEALTH_PASSING, RegisterRequest};

async fn heartbeat(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    let mut req: RegisterRequest = decode_json(&body)?;
    a.require(a.node_write(&req.node), "node:write", &req.node)?;
    req.service = None;
    req.check = None;
    req.checks.clear();
    validate_register(&mut req, s.datacenter())?;
    let st = s.state();
    let known = st.nodes.contains_key(&req.node);
    s.liveness().renew(&req.node, Instant::now());
    if serf_status(&st, &req.node) != Some(HEALTH_PASSING) {
        tracing::info!(node = %req.node, "agent alive");
        req.skip_node_update = known;
        req.check = Some(serf_check(&req.node, HEALTH_PASSING, ALIVE_OUTPUT));
        commit(&s, Command::Register(Box::new(req))).await?;
    }
    let servers = server_names(&s);
    Ok(axum::Json(HeartbeatReply {
        members: s.liveness().len_except(&servers) + servers.len(),
        known,
        datacenter: s.datacenter().to_owned(),
        primary_datacenter: s.config().primary().to_owned(),
        node: s.node_name().to_owned(),
        coord: Some(s.coordinate().lock().coordinate()),
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
    s.liveness().forget(&req.node);
    tracing::info!(node = %req.node, "agent left");
    commit(
        &s,
        Command::Deregister(DeregisterRequest {
            node: req.node,
            datacenter: s.datacenter().to_owned(),
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

/// The names of the cluster's servers.
pub fn server_names(s: &Server) -> Vec<String> {
    s.cluster()
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
