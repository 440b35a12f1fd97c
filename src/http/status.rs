//! `/v1/status` and `/v1/operator/raft`: the cluster's leader and members.
//! A transfer-leader a follower forwards is not cut off by the leader
//! change it causes: moving the leadership is its purpose.

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde_json::{Value, json};

use super::{App, json_at};
use crate::error::{Error, Result};
use crate::request::Params;
use crate::request::authz::Authz;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/status/leader", get(leader))
        .route("/v1/status/peers", get(peers))
        .route("/v1/operator/raft/configuration", get(configuration))
        .route("/v1/operator/raft/peer", delete(remove_peer))
        .route(
            super::TRANSFER_LEADER,
            post(transfer_leader).put(transfer_leader),
        )
}

async fn leader(State(s): State<App>) -> Response {
    let addr = s
        .cluster()
        .leader()
        .map(|(_, n)| n.raft_addr)
        .unwrap_or_default();
    axum::Json(addr).into_response()
}

async fn peers(State(s): State<App>) -> Response {
    let list: Vec<String> = s
        .cluster()
        .members()
        .into_iter()
        .filter(|(_, _, voter)| *voter)
        .map(|(_, n, _)| n.raft_addr)
        .collect();
    axum::Json(list).into_response()
}

async fn configuration(State(s): State<App>, a: Authz) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let leader = s.cluster().leader().map(|(id, _)| id);
    let m = s.cluster().metrics();
    let servers: Vec<Value> = s
        .cluster()
        .members()
        .into_iter()
        .map(|(id, n, voter)| {
            json!({
                "ID": n.name,
                "Node": n.name,
                "Address": n.raft_addr,
                "Leader": Some(id) == leader,
                "ProtocolVersion": "3",
                "Voter": voter,
                "LastIndex": if id == s.cluster().id { m.last_log_index.unwrap_or(0) } else { 0 },
            })
        })
        .collect();
    let index = m.membership_config.log_id().map(|l| l.index).unwrap_or(1);
    Ok(json_at(
        &s,
        index,
        &json!({ "Servers": servers, "Index": index }),
    ))
}

async fn remove_peer(State(s): State<App>, a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    a.require(a.operator_write(), "operator:write", "")?;
    let p = Params::parse(q.as_deref());
    let (by, who) = ["id", "address"]
        .into_iter()
        .find_map(|k| p.get(k).filter(|v| !v.is_empty()).map(|v| (k, v)))
        .ok_or_else(|| Error::bad("Must specify either ?id with the server's ID or ?address with IP:port of peer to remove"))?;
    // Consul's answer to a peer its configuration lacks: a 500 with its
    // words (clients read the status).
    s.cluster().remove_server(who).await.map_err(|e| match e {
        Error::NotFound(_) => Error::Internal(format!(
            "{by} {who:?} was not found in the Raft configuration"
        )),
        e => e,
    })?;
    Ok(axum::Json(Value::Null).into_response())
}

/// `POST /v1/operator/raft/transfer-leader[?id=]`: the leader hands office
/// to that voter (or any other); a follower forwards it to the leader.
async fn transfer_leader(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery,
) -> Result<Response> {
    a.require(a.operator_write(), "operator:write", "")?;
    let p = Params::parse(q.as_deref());
    s.cluster().transfer_leader(p.get("id")).await?;
    Ok(axum::Json(json!({ "Success": true })).into_response())
}
