//! The agent's operational endpoints, served by `cairn agent` and by every
//! server for its own node: `GET /v1/agent/host` (`operator:read`), `PUT
//! /v1/agent/reload` (`agent:write`), `GET /v1/agent/monitor`
//! (`agent:read`), `PUT /v1/agent/token/:kind` (`acl:write`).

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde::Deserialize;

use super::Agent;
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::{Params, decode_json};

type App = Arc<Agent>;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/agent/host", get(host))
        .route("/v1/agent/reload", put(reload))
        .route("/v1/agent/monitor", get(monitor))
        .route("/v1/agent/token/{kind}", put(set_token))
}

/// What the agent recovery token may do: write this agent, read nodes.
pub fn recovery_authorizer(node: &str) -> Arc<crate::acl::authz::Authorizer> {
    let text = format!(
        "agent {} {{ policy = \"write\" }}\nnode_prefix \"\" {{ policy = \"read\" }}\n",
        serde_json::Value::from(node)
    );
    let rules = crate::acl::rules::parse_rules(&text).unwrap_or_default();
    Arc::new(crate::acl::authz::Authorizer::new(
        "agent-recovery",
        &[&rules],
        crate::acl::DefaultPolicy::Deny,
    ))
}

/// A client agent's join: the server at `address` (its HTTP address) is
/// one more it may talk to. A server joins through its own route
/// (`http::agent_ops`).
pub async fn join(State(a): State<App>, z: Authz, Path(address): Path<String>) -> Result<Response> {
    let node = &a.config.node;
    z.require(z.agent_write(node), "agent:write", node)?;
    let url = crate::cli::normalize_addr(&address).map_err(|e| Error::bad(e.0))?;
    if url.starts_with("https://") && a.config.tls.is_none() {
        return Err(Error::bad(format!("{url} needs the agent's TLS CA")));
    }
    // Reachable and a server: its leader's address answers.
    let probe = format!("{url}/v1/status/leader");
    let ok = a
        .servers
        .http
        .get(&probe)
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().is_success())
        .unwrap_or(false);
    if !ok {
        return Err(Error::Internal(format!(
            "Failed to join {address}: no server answers there"
        )));
    }
    if a.servers.add(url.clone()) {
        tracing::info!(server = %url, "joined: server added");
    }
    Ok(axum::http::StatusCode::OK.into_response())
}

async fn host(State(a): State<App>, z: Authz) -> Result<Response> {
    z.require(z.operator_read(), "operator:read", "")?;
    let dir = a.config.data_dir.clone();
    let facts = tokio::task::spawn_blocking(move || super::host::facts(&dir))
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
    Ok(axum::Json(facts).into_response())
}

async fn reload(State(a): State<App>, z: Authz) -> Result<Response> {
    let node = &a.config.node;
    z.require(z.agent_write(node), "agent:write", node)?;
    a.reload().await?;
    Ok(axum::http::StatusCode::OK.into_response())
}

/// Streams log lines at `?loglevel=` (default info), as text or, with
/// `?logjson`, JSON, until the client goes away.
async fn monitor(State(a): State<App>, z: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    let node = &a.config.node;
    z.require(z.agent_read(node), "agent:read", node)?;
    let p = Params::parse(q.as_deref());
    let asked = p.get("loglevel").unwrap_or("info");
    let level = crate::monitor::parse_level(asked)
        .ok_or_else(|| Error::bad(format!("Unknown log level: {asked}")))?;
    let json = p.has("logjson");
    // Listening from here on: the answer's head goes out after this.
    let sub = crate::monitor::subscribe(level);
    let lines = futures_util::stream::unfold(sub, move |mut sub| async move {
        let line = match sub.next().await? {
            crate::monitor::Next::Line(l) if json => format!("{}\n", l.json),
            crate::monitor::Next::Line(l) => format!("{}\n", l.text),
            crate::monitor::Next::Dropped(n) => {
                format!("[WARN] agent: Monitor dropped {n} logs during monitor request\n")
            }
        };
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), sub))
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(lines),
    )
        .into_response())
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TokenBody {
    #[serde(rename = "Token")]
    token: String,
}

/// Consul's token kinds, with their legacy names.
pub fn token_kind(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "default" | "acl_token" => "default",
        "agent" | "acl_agent_token" => "agent",
        // `recovery` is the CLI's name for it.
        "agent_recovery" | "recovery" | "agent_master" | "acl_agent_master_token" => {
            "agent_recovery"
        }
        "dns" => "dns",
        "config_file_service_registration" => "config_file_service_registration",
        "replication" | "acl_replication_token" => "replication",
        _ => return None,
    })
}

/// Sets one of the agent's tokens in memory (as Consul without token
/// persistence): the next request without a token, or the agent's own
/// next call, uses it.
async fn set_token(
    State(a): State<App>, z: Authz, Path(kind): Path<String>, body: Bytes,
) -> Result<Response> {
    z.require(z.acl_write(), "acl:write", "")?;
    // Consul's answer with ACLs off: a token set there would do nothing.
    if z.authorizer().acls_off() {
        return Err(Error::Unauthorized("ACL support disabled".into()));
    }
    let kind =
        token_kind(&kind).ok_or_else(|| Error::NotFound(format!("Token {kind:?} is unknown")))?;
    let body: TokenBody = decode_json(&body)?;
    a.set_token(kind, Some(body.token).filter(|t| !t.is_empty()));
    tracing::info!(kind, "Updated agent's ACL token");
    Ok(axum::http::StatusCode::OK.into_response())
}
