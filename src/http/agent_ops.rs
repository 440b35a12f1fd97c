//! A server's cluster endpoints under `/v1/agent`: `PUT
//! /v1/agent/join/:address` (`agent:write`: a server not yet in a cluster
//! asks the server at that Raft address to take it in) and `PUT
//! /v1/agent/force-leave/:node` (`operator:write`: a server node leaves
//! the Raft configuration and the catalog, a client node the catalog;
//! answered by the leader, which the request is forwarded to; with `?wan`
//! a server of another datacenter is forgotten by every server of this
//! one, `crate::endpoint::agent`) and `PUT /v1/agent/leave` (a server's
//! graceful leave, then its process stops).
//!
//! A join is taken only while the server waits to form: Raft cannot merge
//! clusters. On a leave a leader first hands leadership over; then the
//! leader takes the server out of Raft and the catalog
//! (`endpoint::members`), and the process stops. A lone server just stops.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;

use std::sync::Arc;

use super::{App, Called};
use crate::endpoint::agent::{Op, Value};
use crate::error::{Error, Result};
use crate::federation::Federation;
use crate::request::authz::Authz;
use crate::state::Command;
use crate::structs::DeregisterRequest;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/agent/join/{*address}", put(join))
        .route("/v1/agent/force-leave/{*node}", put(force_leave))
        .route("/v1/agent/leave", put(leave))
}

/// Forwarded to the leader (it changes the Raft configuration and the
/// catalog), unlike the rest of `/v1/agent/`.
pub fn leader_only(path: &str) -> bool {
    path.starts_with("/v1/agent/force-leave/")
}

async fn join(State(s): State<App>, a: Authz, Path(address): Path<String>) -> Result<Response> {
    a.require(a.agent_write(s.node_name()), "agent:write", s.node_name())?;
    if s.cluster()
        .members()
        .iter()
        .any(|(_, n, _)| n.raft_addr == address)
    {
        return Ok(StatusCode::OK.into_response());
    }
    // A server with a log of its own cannot take another cluster's: only
    // one still waiting to form joins (Consul's servers merge gossip pools,
    // cairn's Raft cannot merge clusters).
    if s.cluster().is_initialized() {
        return Err(Error::bad(format!(
            "Failed to join {address}: this server is already a member of a cluster"
        )));
    }
    s.cluster()
        .join_via(&address)
        .await
        .map_err(|e| Error::Internal(format!("Failed to join {address}: {e}")))?;
    Ok(StatusCode::OK.into_response())
}

/// `PUT /v1/agent/leave` on a server (`agent:write` on its node): the
/// graceful leave of a rolling restart, as Consul's. A leader first hands
/// leadership to another voter; then the leader takes this server out of
/// the Raft configuration and the catalog (`endpoint::members`), and the
/// process stops. A lone server just stops (no other could take its
/// place; its data dir keeps the cluster).
async fn leave(State(s): State<App>, Called(_, call): Called) -> Result<Response> {
    let node = s.node_name().to_string();
    let a = call.authz(&s)?;
    a.require(a.agent_write(&node), "agent:write", &node)?;
    let others = s
        .cluster()
        .members()
        .iter()
        .any(|(id, _, voter)| *voter && *id != s.cluster().id);
    if others {
        if s.cluster().is_leader() {
            let to = s.cluster().transfer_leader(None).await?;
            tracing::info!(to = %to, "leaving: leadership handed over");
        }
        crate::endpoint::route(
            &s,
            call,
            crate::endpoint::Op::Members(crate::endpoint::members::Op::Leave {
                node: node.clone(),
            }),
        )
        .await?;
    }
    tracing::info!(node = %node, "left the cluster");
    s.request_stop();
    Ok(StatusCode::OK.into_response())
}

async fn force_leave(
    State(s): State<App>, Path(node): Path<String>, Called(p, call): Called,
    fed: Option<axum::Extension<Arc<Federation>>>,
) -> Result<Response> {
    if p.has("wan") {
        return force_leave_wan(&s, fed.as_deref().map(|f| &**f), call, node).await;
    }
    let a = call.authz(&s)?;
    a.require(a.operator_write(), "operator:write", "")?;
    let server = s.cluster().members().iter().any(|(_, n, _)| n.name == node);
    let in_catalog = s.state().nodes.get(&node).is_some();
    if !server && !in_catalog {
        // Consul's 500, in its words (clients read the status).
        return Err(Error::Internal(format!(
            "agent: No node found with name '{node}'"
        )));
    }
    if server {
        if node == s.node_name() {
            return Err(Error::bad(
                "Cannot force-leave the server answering (the leader)",
            ));
        }
        s.cluster().remove_server(&node).await?;
        tracing::info!(node = %node, "server forced to leave the raft configuration");
    }
    s.liveness().forget(&node);
    s.write(Command::Deregister(DeregisterRequest {
        node: node.clone(),
        datacenter: s.datacenter().to_owned(),
        ..Default::default()
    }))
    .await?;
    tracing::info!(node = %node, "node forced to leave");
    Ok(StatusCode::OK.into_response())
}

/// `?wan`: every server of this datacenter forgets `name` (`node.dc`, as
/// `members -wan` lists it), and with its last server its datacenter;
/// `prune` changes nothing more (cairn keeps no "left" members).
async fn force_leave_wan(
    s: &App, fed: Option<&Federation>, call: crate::endpoint::Call, name: String,
) -> Result<Response> {
    let op = Op::ForgetWan { name: name.clone() };
    let answer = crate::endpoint::agent::run(s, fed, call, op).await?;
    match answer.value {
        Value::Forgotten(true) => Ok(StatusCode::OK.into_response()),
        Value::Forgotten(false) => Err(Error::Internal(format!(
            "agent: No node found with name '{name}'"
        ))),
    }
}
