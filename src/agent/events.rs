//! User events as an agent receives them: it follows the servers' ring
//! (`http::event::RING_PATH`, a blocking read with `?stale`), keeps the
//! events meant for it (`UserEvent::is_for`: its node, its services and
//! their tags) in a ring of its own of the last `event::RING`, as a Consul
//! agent keeps what gossip brought, and answers `GET /v1/event/list` from
//! it; a list that does not block first reads what the servers hold now,
//! so a list right after a fire through this agent has it. Like a Consul
//! agent that joins, it receives only events fired after it first reached
//! a server (no replay of older ones).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use super::Agent;
use crate::error::Result;
use crate::request::authz::Authz;
use crate::request::{Params, enc, wait_of};
use crate::structs::event::{RING, UserEvent, list_index};

/// How long one read of the servers' ring waits there.
const WAIT: &str = "5m";
/// Our side's limit: the wait plus the server's jitter and some slack.
const TIMEOUT: Duration = Duration::from_secs(5 * 60 + 30);

/// The events this agent received, oldest first, and a counter that moves
/// with each (what a blocking list waits on).
pub struct Events {
    ring: Mutex<Ring>,
    received: tokio::sync::watch::Sender<u64>,
}

struct Ring {
    events: VecDeque<UserEvent>,
    /// The newest LTime taken in; none until the first answer (whose
    /// events, fired before this agent was there, are not delivered).
    seen: Option<u64>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(RING),
                seen: None,
            }),
            received: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Events {
    /// Takes in a read of the servers' ring: the events newer than any
    /// taken before and meant for this agent (`mine`). The follower and a
    /// list's catch-up both read the ring; each event is kept once.
    fn take(&self, events: Vec<UserEvent>, mine: impl Fn(&UserEvent) -> bool) {
        let newest = events.iter().map(|e| e.ltime).max().unwrap_or(0);
        // Matched before the lock: `mine` reads the agent's services.
        let mine: Vec<UserEvent> = events.into_iter().filter(|e| mine(e)).collect();
        let Ok(mut r) = self.ring.lock() else { return };
        let mut pushed = 0u64;
        if let Some(seen) = r.seen {
            for e in mine.into_iter().filter(|e| e.ltime > seen) {
                if r.events.len() == RING {
                    r.events.pop_front();
                }
                r.events.push_back(e);
                pushed += 1;
            }
        }
        r.seen = Some(r.seen.unwrap_or(0).max(newest));
        drop(r);
        if pushed > 0 {
            self.received.send_modify(|n| *n += pushed);
        }
    }

    /// The newest LTime taken in (none before the first read).
    fn seen(&self) -> Option<u64> {
        self.ring.lock().ok().and_then(|r| r.seen)
    }

    fn list(&self) -> Vec<UserEvent> {
        self.ring
            .lock()
            .map(|r| r.events.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Whether this agent is to receive `e`.
fn is_for_me(a: &Agent, e: &UserEvent) -> bool {
    a.local.with(|t| {
        e.is_for(
            &a.config.node,
            t.live_services().map(|s| {
                let r = &s.registered;
                (r.id.as_str(), r.service.as_str(), r.tags.as_slice())
            }),
        )
    })
}

/// The ring's path for this agent: every event after `after`, blocking
/// while the ring's index is `index` (0: at once).
fn ring_path(a: &Agent, index: u64, after: Option<u64>) -> String {
    let mut path = format!(
        "{}?node={}&stale&index={index}&wait={WAIT}",
        crate::structs::event::RING_PATH,
        enc(&a.config.node)
    );
    if let Some(after) = after {
        path.push_str(&format!("&after={after}"));
    }
    path
}

/// Follows the servers' ring for as long as the agent runs.
pub async fn follow(a: Arc<Agent>) {
    let mut index = 0u64;
    let mut failures = 0u32;
    loop {
        let path = ring_path(&a, index, a.events.seen());
        match a.servers.get::<Vec<UserEvent>>(&path, TIMEOUT).await {
            Ok((events, new_index)) => {
                failures = 0;
                // Another server, or one restarted: start its index over.
                index = if new_index < index { 0 } else { new_index };
                a.events.take(events, |e| is_for_me(&a, e));
            }
            Err(e) => {
                failures += 1;
                let wait = super::retry_wait(failures);
                tracing::warn!(error = %e, retry_in = ?wait, "following user events failed");
                index = 0;
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Before a list answers at once: what the server holds now, so that an
/// event fired through this agent is in the list read right after the fire
/// (the follower's blocking read would bring it a moment later). A server
/// that does not answer within `CATCH_UP` leaves the list as it is.
async fn catch_up(a: &Agent) {
    let Some(seen) = a.events.seen() else { return };
    let path = ring_path(a, 0, Some(seen));
    if let Ok((events, _)) = a.servers.get::<Vec<UserEvent>>(&path, CATCH_UP).await {
        a.events.take(events, |e| is_for_me(a, e));
    }
}

/// How long a list waits for its catch-up read.
const CATCH_UP: Duration = Duration::from_secs(1);

/// `GET /v1/event/list`: the events this agent received, oldest first,
/// `?name=` only those of that name, only those the token may
/// `event:read`. Its index is Consul's (from the last event's ID, not
/// monotonic): a blocking list waits while the index equals `?index`.
pub async fn list(
    State(a): State<Arc<Agent>>, mut z: Authz, RawQuery(q): RawQuery,
) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let name = p.get("name").unwrap_or_default().to_string();
    let want = p.u64("index")?.filter(|i| *i > 0);
    let wait = wait_of(&p)?;
    let _permit = match want {
        Some(_) => Some(a.config.blocking.permit()?),
        None => None,
    };
    let deadline = tokio::time::Instant::now() + wait;
    if want.is_none() {
        catch_up(&a).await;
    }
    let mut changes = a.events.received.subscribe();
    loop {
        changes.borrow_and_update();
        let mut events = a.events.list();
        events.retain(|e| name.is_empty() || e.name == name);
        let before = events.len();
        events.retain(|e| z.event_read(&e.name));
        let filtered = events.len() != before;
        let index = list_index(&events);
        let expired = tokio::time::Instant::now() >= deadline;
        if want != Some(index) || expired {
            let mut resp = axum::Json(events).into_response();
            let h = resp.headers_mut();
            h.insert("x-consul-index", HeaderValue::from(index));
            if filtered {
                h.insert(
                    "x-consul-results-filtered-by-acls",
                    HeaderValue::from_static("true"),
                );
            }
            return Ok(resp);
        }
        let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
        // The token again (the agent's cache keeps it its TTL): one deleted
        // or narrowed while this waited reads with what it has now.
        z = super::acl::authz_of(&a, z.token().map(str::to_string)).await?;
    }
}
