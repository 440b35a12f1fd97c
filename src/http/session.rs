//! `/v1/session`: create, destroy, renew (writes, answered by the leader),
//! info, node and list (blocking reads), over `endpoint::session`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::json;

use super::{App, Called, answer_json};
use crate::endpoint;
use crate::error::Result;
use crate::request::{NamedRoutes, decode_json};
use crate::structs::SessionRequest;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/session/create", put(create))
        .named("/v1/session/destroy/", "Missing session", put(destroy))
        .named("/v1/session/renew/", "Missing session", put(renew))
        .named("/v1/session/info/", "Missing session", get(info))
        .named("/v1/session/node/", "Missing node name", get(node))
        .route("/v1/session/list", get(list))
}

/// The node of the server that received the request (this one, or the
/// follower that forwarded it here).
pub(crate) fn receiving_node(s: &App, headers: &HeaderMap) -> String {
    let forwarded = headers.contains_key(super::FORWARDED);
    headers
        .get(super::ORIGIN_NODE)
        .and_then(|v| v.to_str().ok())
        .filter(|n| forwarded && !n.is_empty())
        .unwrap_or(s.node_name())
        .to_string()
}

async fn create(State(s): State<App>, Called(_, call): Called, body: Bytes) -> Result<Response> {
    let req: SessionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        SessionRequest::default()
    } else {
        // Go's decoder matches field names in any case (py-consul sends
        // `lockdelay`, `ttl`...): `decode_json` does too.
        decode_json(&body)?
    };
    let id = endpoint::session::create(&s, call, req).await?;
    Ok(axum::Json(json!({ "ID": id })).into_response())
}

async fn destroy(
    State(s): State<App>, Path(id): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    Ok(axum::Json(endpoint::session::destroy(&s, call, id).await?).into_response())
}

/// Resets the session's TTL timer on the leader (no Raft write, as Consul).
async fn renew(
    State(s): State<App>, Path(id): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    Ok(answer_json(&endpoint::session::renew(&s, call, id).await?))
}

async fn info(
    State(s): State<App>, Path(id): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    Ok(answer_json(&endpoint::session::info(&s, call, id).await?))
}

async fn node(
    State(s): State<App>, Path(node): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    Ok(answer_json(&endpoint::session::node(&s, call, node).await?))
}

async fn list(State(s): State<App>, Called(_, call): Called) -> Result<Response> {
    Ok(answer_json(&endpoint::session::list(&s, call).await?))
}
