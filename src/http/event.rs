//! User events on the servers: `PUT /v1/event/fire/:name` commits the
//! event through Raft into the state's ring (`state::events`), and
//! `/v1/internal/event/ring` is what agents follow it by (a blocking read
//! of the whole ring, `?stale` on any server). `GET /v1/event/list` is an
//! agent's endpoint (`agent::events`): what that agent received.
//!
//! A fire is checked first (Consul's 512-byte limit on name and payload, a
//! 413; filters that compile), then proposed as `Command::EventFire`. The
//! ring takes `node:write` on the asking node, checked again on every
//! version it reads; every agent holds a read of it for good, so it takes
//! no place among the callers' blocking queries and is not counted as
//! parked.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::routing::put;

use super::{App, Opts, json_at, recheck};
use crate::error::{Error, Result};
use crate::request::NamedRoutes;
use crate::request::authz::Authz;
use crate::state::{Command, Response as Applied, keys};
use crate::structs::event::{EventError, RING_PATH, UserEvent, VERSION};

pub fn routes() -> Router<App> {
    Router::new()
        .named("/v1/event/fire/", "Missing name", put(fire))
        .route(RING_PATH, get(ring))
}

/// Needs `event:write` on the name (checked first: a caller without it
/// learns nothing of the event's validity); the body is the payload, the
/// filters `?node=`, `?service=`, `?tag=` are Go regexps as Consul's.
async fn fire(
    State(s): State<App>, a: Authz, Path(name): Path<String>, Opts(p, _): Opts, body: Bytes,
) -> Result<Response> {
    a.require(a.event_write(&name), "event:write", &name)?;
    let event = UserEvent {
        // Made here, so that apply stays deterministic.
        id: uuid::Uuid::new_v4().to_string(),
        name,
        payload: (!body.is_empty()).then(|| body.to_vec()),
        node_filter: p.get("node").unwrap_or_default().to_string(),
        service_filter: p.get("service").unwrap_or_default().to_string(),
        tag_filter: p.get("tag").unwrap_or_default().to_string(),
        version: VERSION,
        ltime: 0,
    };
    event.validate().map_err(|e| match e {
        EventError::TooLarge => Error::TooLarge(e.to_string()),
        e => Error::BadRequest(e.to_string()),
    })?;
    match s
        .write(Command::EventFire {
            event: Box::new(event.clone()),
        })
        .await?
    {
        // As Consul's, the answer is the event sent, its LTime not yet known.
        Applied::Ok => Ok(axum::Json(event).into_response()),
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// The ring, oldest first (`?after=LTIME`: only what is newer), blocking
/// on any fire. Only agents read
/// it, for their node (`?node=`): it takes `node:write` on that node, as
/// the agents' heartbeats do, since it shows every event unfiltered.
///
/// Every agent holds one of these for good, as it holds its heartbeats: it
/// takes no place among the callers' blocking queries (a server with
/// `--http-max-blocking-queries 1` still serves one) and is not counted as
/// parked; its connection counts among the HTTP connections.
async fn ring(State(s): State<App>, mut a: Authz, Opts(p, opts): Opts) -> Result<Response> {
    let node = p.get("node").unwrap_or_default().to_string();
    if node.is_empty() {
        return Err(Error::bad("Must provide node"));
    }
    // Only the events after the newest the agent has (its first read takes
    // the whole ring): a fire sends each agent what is new, not 256 events.
    let after = p.u64("after")?.unwrap_or(0);
    let read = |a: &mut Authz| -> Result<(u64, Vec<UserEvent>)> {
        let st = s.state();
        // Again on every version: a token deleted meanwhile ends the read.
        recheck(&s, a, &st)?;
        a.require(a.node_write(&node), "node:write", &node)?;
        let events = st
            .events
            .iter()
            .filter(|e| e.ltime > after)
            .map(|e| (**e).clone())
            .collect();
        Ok((st.index_of([&keys::EVENTS]), events))
    };
    // Subscribed before the first read, so a fire in between is not missed.
    let mut fired = s.watches().subscribe(&keys::EVENTS);
    let deadline = opts.deadline();
    loop {
        let (index, events) = read(&mut a)?;
        if opts.index == 0 || index > opts.index || tokio::time::Instant::now() >= deadline {
            return Ok(json_at(&s, index, &events));
        }
        let _ = tokio::time::timeout_at(deadline, fired.changed()).await;
    }
}
