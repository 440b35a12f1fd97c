//! `/v1/session`: create, destroy, renew (writes, answered by the leader),
//! info, node and list (blocking reads).

use std::sync::Arc;
use tokio::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::json;

use super::{App, Opts, Watch, blocking, json_at};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::{NamedRoutes, QueryOptions, decode_json};
use crate::server::Server;
use crate::state::{Command, Response as Applied, Timeable, keys};
use crate::structs::{Session, SessionRequest};

/// Consul's node health check, the default a session is bound to.
const SERF_CHECK: &str = "serfHealth";

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

async fn create(
    State(s): State<App>, a: Authz, _: Opts, headers: HeaderMap, body: Bytes,
) -> Result<Response> {
    let req: SessionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        SessionRequest::default()
    } else {
        // Go's decoder matches field names in any case (py-consul sends
        // `lockdelay`, `ttl`...): `decode_json` does too.
        decode_json(&body)?
    };
    let no_checks = req.no_checks();
    // Made here, before proposing, so that apply stays deterministic.
    let id = uuid::Uuid::new_v4().to_string();
    let mut session = req
        .into_session(id.clone(), &receiving_node(&s, &headers))
        .map_err(Error::BadRequest)?;
    a.require(
        a.session_write(&session.node),
        "session:write",
        &session.node,
    )?;
    if no_checks
        && s.store()
            .state()
            .checks
            .contains_key(&(session.node.clone(), SERF_CHECK.to_string()))
    {
        session.node_checks.push(SERF_CHECK.to_string());
    }
    let ttl = session.ttl();
    let server_node = session.node == receiving_node(&s, &headers);
    match s
        .write(Command::SessionCreate {
            session,
            server_node,
        })
        .await?
    {
        Applied::Ok => {
            s.sessions().arm(&id, ttl, Instant::now());
            Ok(axum::Json(json!({ "ID": id })).into_response())
        }
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// Destroying or renewing a session takes `session:write` on its node.
pub fn authorize_session(s: &Server, a: &Authz, id: &str) -> Result<()> {
    match s.state().sessions.get(id) {
        Some(x) => a.require(a.session_write(&x.node), "session:write", &x.node),
        None => Ok(()),
    }
}

async fn destroy(
    State(s): State<App>, a: Authz, Path(id): Path<String>, _: Opts,
) -> Result<Response> {
    authorize_session(&s, &a, &id)?;
    // Destroying what is not there changes nothing: no Raft entry (an
    // anonymous caller could otherwise grow the log at will), and the
    // answer Consul gives.
    if !s.state().sessions.contains_key(&id) {
        return Ok(axum::Json(true).into_response());
    }
    match s
        .write(
            s.sessions()
                .timed(Timeable::SessionDestroy { id: id.clone() }),
        )
        .await?
    {
        Applied::Bool(ok) => {
            s.sessions().disarm(&id);
            Ok(axum::Json(ok).into_response())
        }
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// Resets the session's TTL timer on the leader (no Raft write, as Consul).
async fn renew(
    State(s): State<App>, a: Authz, Path(id): Path<String>, _: Opts,
) -> Result<Response> {
    authorize_session(&s, &a, &id)?;
    let (index, session) = renew_session(&s, &id).await?;
    Ok(json_at(&s, index, &[&*session]))
}

/// Renews `id` on this server, which must lead: leadership is confirmed
/// with a quorum first (Consul trusts its local belief here). A leader cut
/// off from the others could otherwise answer a renewal while the new
/// leader's timer (armed when it took office) runs out, and the client
/// would go on believing it holds its locks after they were handed on. A
/// renewal confirmed at time t resets a timer that cannot expire before
/// t + 2×TTL on this leader or any later one. Returns the session and the
/// index of its last change.
pub async fn renew_session(s: &Server, id: &str) -> Result<(u64, Arc<Session>)> {
    s.linearize().await?;
    let st = s.state();
    let Some(session) = st.sessions.get(id) else {
        return Err(Error::NotFound(format!("Session id '{id}' not found")));
    };
    if !s.sessions().arm(id, session.ttl(), Instant::now()) {
        // Its TTL ran out and its destroy is under way.
        return Err(Error::NotFound(format!("Session id '{id}' not found")));
    }
    Ok((st.index_of([&keys::session(id)]), session.clone()))
}

/// Sessions the token may read (`session:read` on their node).
async fn read(
    s: &App, a: &mut Authz, opts: QueryOptions, key: crate::state::WatchKey,
    pick: impl Fn(&crate::state::State) -> Vec<Session>,
) -> Result<Response> {
    let watch = Watch::Keys(vec![key.clone()]);
    let (index, mut sessions) =
        blocking(s, &opts, a, watch, |st, _| (st.index_of([&key]), pick(st))).await?;
    let filtered = super::keep(&mut sessions, |x| a.session_read(&x.node));
    Ok(super::json_filtered(s, index, &sessions, filtered))
}

async fn info(
    State(s): State<App>, mut a: Authz, Path(id): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    read(&s, &mut a, opts, keys::session(&id), |st| {
        st.sessions
            .get(&id)
            .map(|x| (**x).clone())
            .into_iter()
            .collect()
    })
    .await
}

async fn node(
    State(s): State<App>, mut a: Authz, Path(node): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    read(&s, &mut a, opts, keys::node_sessions(&node), |st| {
        crate::state::session::node_sessions(st, &node)
            .into_iter()
            .map(|x| (*x).clone())
            .collect()
    })
    .await
}

async fn list(State(s): State<App>, mut a: Authz, Opts(_, opts): Opts) -> Result<Response> {
    read(&s, &mut a, opts, keys::SESSIONS, |st| {
        st.sessions.values().map(|x| (**x).clone()).collect()
    })
    .await
}
