//! A client agent's streaming backend (Consul's `use_streaming_backend`):
//! blocking `/v1/health/service/:s` and `/v1/health/connect/:s` reads are
//! answered from a view kept here, fed by one subscription to a server's
//! `/v1/internal/stream` per (topic, service, token), shared by every
//! watcher of that service with that token on this agent. So a thousand
//! watchers cost the servers one stream, not a thousand blocking queries.
//!
//! The view is the server's own kind (`stream::view`: the same
//! materializer, waiting and idle dropping, and the same row selection as
//! the server's handler); only its feed differs: NDJSON lines read from a
//! server. The subscription carries the caller's token (else the agent's
//! default), and the server filters every event by it, so a view holds
//! only what that token may read.
//!
//! What is forwarded instead, as before: reads that do not block (no
//! `?index`: Consul, too, asks the servers), `?consistent`, `?near`
//! (sorted by the servers' coordinates), `?merge-central-config`, another
//! `?dc`, any parameter the view does not know, a view the set has no
//! room for, and a subscription the server refuses (a token that may not
//! read the service, or is unknown: the server's own answer to the read
//! says so in its words; the refusal is kept `RETRY_CLOSED` before it is
//! asked again).
//!
//! A subscription that breaks (the server stopped, restarted, fell
//! behind) is taken up again through `Servers`' failover, resuming after
//! the last index it delivered; the server sends a new snapshot when it
//! cannot resume. Watchers keep the last answer meanwhile: they are woken
//! only by a complete answer at a higher index.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Agent;
use super::servers::{STREAM_SUBSCRIPTIONS, VIEW_READS};
use crate::request::QueryOptions;
use crate::state::catalog::Instance;
use crate::stream::Topic;
use crate::stream::view::{Answer, Materializer, Publish, Selection, View, ViewSet, shown_nodes};

/// The parameters a view answers; any other sends the read to a server.
const ANSWERED: &[&str] = &[
    "index",
    "wait",
    "passing",
    "tag",
    "filter",
    "node-meta",
    "stale",
    "cached",
    "token",
    "dc",
];
/// How long a read waits for a new view's first snapshot before it is
/// forwarded instead (no server answers the subscription).
const FIRST_SNAPSHOT: Duration = Duration::from_secs(10);
/// A subscription is taken up again at least this often, so a server that
/// went silent without closing the connection is left in time.
const STREAM_TIMEOUT: Duration = Duration::from_secs(600);
/// Events of one index arrive in one write: after a line, the rest of its
/// index follows at once. An answer is published when a line of a later
/// index comes, or nothing more came within this.
const SETTLE: Duration = Duration::from_millis(10);
/// The longest line read from a stream.
const MAX_LINE: usize = 16 << 20;

/// A view's identity: one subscription each.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    topic: Topic,
    service: String,
    /// The token the subscription carries (none: anonymous).
    token: Option<String>,
}

/// The agent's health views.
pub struct HealthViews {
    set: Arc<ViewSet<Key>>,
}

impl HealthViews {
    pub fn new() -> HealthViews {
        HealthViews {
            set: ViewSet::new(),
        }
    }

    /// Views kept now (a gauge).
    pub fn len(&self) -> usize {
        self.set.len()
    }

    fn get(&self, a: &Arc<Agent>, key: Key) -> Option<Arc<View>> {
        self.set.get_or_start(key.clone(), || {
            let a = a.clone();
            View::spawn(move |tx| feed(a, key, tx))
        })
    }
}

/// The read answered from its view; none: forward it.
pub(super) async fn from_view(
    a: &Arc<Agent>, connect: bool, name: &str, q: Option<&str>, token: Option<String>,
) -> Option<crate::error::Result<Response>> {
    if !a.config.streaming_backend {
        return None;
    }
    let known = form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .all(|(k, _)| k.is_empty() || ANSWERED.contains(&k.as_ref()));
    // A malformed parameter is forwarded too: the server answers it in
    // its words.
    let (p, opts) = QueryOptions::parse(q, &a.datacenter()).ok()?;
    if !known || opts.index == 0 || opts.consistent {
        return None;
    }
    let select = Selection::parse(&p).ok()?;
    let key = Key {
        topic: if connect {
            Topic::ServiceHealthConnect
        } else {
            Topic::ServiceHealth
        },
        service: name.to_string(),
        token,
    };
    let _permit = match a.config.blocking.permit() {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    let view = a.health_views.get(a, key)?;
    let deadline = opts.deadline();
    let first = deadline.min(tokio::time::Instant::now() + FIRST_SNAPSHOT);
    let answer = match tokio::time::timeout_at(first, view.wait(0, first)).await {
        Ok(a) if a.index > 0 => view.wait(opts.index, deadline).await,
        // Refused, or no server answered in time.
        _ => return None,
    };
    // A feed that ended leaves its last answer: a watcher still at it is
    // not told that again and again, the server answers it.
    if view.is_closed() && answer.index <= opts.index {
        return None;
    }
    VIEW_READS.inc();
    Some(Ok(respond(a, &select, &answer)))
}

/// The rows of `answer` the read selects, with the read headers: the
/// view's index, and `X-Consul-Query-Backend: streaming` (Consul's).
fn respond(a: &Agent, select: &Selection, answer: &Answer) -> Response {
    let found: Vec<Arc<Instance>> = answer.instances.values().cloned().collect();
    let nodes = shown_nodes(&found, &a.datacenter());
    let mut rows = select.select(&found, &nodes);
    select.filter(&mut rows);
    let mut resp = axum::Json(&rows).into_response();
    let h = resp.headers_mut();
    h.insert("x-consul-index", HeaderValue::from(answer.index.max(1)));
    h.insert("x-consul-knownleader", HeaderValue::from_static("true"));
    h.insert("x-consul-lastcontact", HeaderValue::from_static("0"));
    h.insert(
        "x-consul-query-backend",
        HeaderValue::from_static("streaming"),
    );
    resp
}

/// Why a subscription stopped.
enum Ended {
    /// Refused (403, 404, 400, a stream ending in an error line, a line
    /// that does not read): the view closes, its reads are forwarded.
    Refused(String),
    /// Broken (the server went away, answered 5xx or 429): taken up again.
    Broken(String),
}

/// A view's feed: subscriptions, one after another, for as long as the
/// view lives.
async fn feed(a: Arc<Agent>, key: Key, tx: Publish) {
    let mut m = Materializer::default();
    // The last index delivered: a new subscription resumes after it.
    let mut cursor = 0;
    let mut failures = 0;
    loop {
        let before = cursor;
        match follow(&a, &key, &mut m, &mut cursor, &tx).await {
            Ended::Refused(why) => {
                tracing::debug!(service = %key.service, reason = %why, "health view refused");
                return;
            }
            Ended::Broken(why) => {
                failures = if cursor > before { 1 } else { failures + 1 };
                tracing::info!(service = %key.service, reason = %why, "health view stream broken: subscribing again");
            }
        }
        tokio::time::sleep(super::retry_wait(failures)).await;
    }
}

/// One line of the stream.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Line {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    key_index: Option<u64>,
    #[serde(default)]
    end_of_snapshot: bool,
    #[serde(default)]
    new_snapshot_to_follow: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    payload: Option<Payload>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Payload {
    op: String,
    value: Instance,
}

/// Publishes what `m` holds (if it changed) as a complete index: the
/// cursor moves past it only now, so that a subscription broken inside an
/// index resumes before it and gets it whole again (applying an event
/// twice changes nothing).
fn publish(m: &mut Materializer, tx: &Publish, unpublished: &mut Option<u64>, cursor: &mut u64) {
    if let Some(answer) = m.take_answer() {
        tx.send_replace(Arc::new(answer));
    }
    if let Some(u) = unpublished.take() {
        *cursor = (*cursor).max(u);
    }
}

/// One subscription: its lines applied to `m`, each complete index
/// published, until it ends.
async fn follow(
    a: &Agent, key: &Key, m: &mut Materializer, cursor: &mut u64, tx: &Publish,
) -> Ended {
    let mut path = format!(
        "/v1/internal/stream?topic={}&key={}",
        key.topic.name(),
        crate::request::enc(&key.service)
    );
    if m.in_snapshot() {
        // No snapshot whole yet (or broken inside one): a fresh one, from
        // nothing.
        m.new_snapshot();
    } else if *cursor > 0 {
        path.push_str(&format!("&index={cursor}"));
    }
    let resp = a
        .servers
        .send_as(
            reqwest::Method::GET,
            &path,
            None,
            STREAM_TIMEOUT,
            key.token.as_deref(),
        )
        .await;
    let mut resp = match resp {
        Ok(r) => r,
        Err(e) => return Ended::Broken(e.to_string()),
    };
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        let why = format!("{status}: {}", body.trim());
        return if status.is_client_error() && status.as_u16() != 429 {
            Ended::Refused(why)
        } else {
            Ended::Broken(why)
        };
    }
    STREAM_SUBSCRIPTIONS.inc();
    let mut buf: Vec<u8> = Vec::new();
    // The index of live events applied and not yet published.
    let mut unpublished: Option<u64> = None;
    loop {
        let next = if unpublished.is_some() {
            match tokio::time::timeout(SETTLE, resp.chunk()).await {
                Ok(next) => next,
                Err(_) => {
                    publish(m, tx, &mut unpublished, cursor);
                    continue;
                }
            }
        } else {
            resp.chunk().await
        };
        let chunk: Bytes = match next {
            Ok(Some(c)) => c,
            Ok(None) => return Ended::Broken("the stream ended".into()),
            Err(e) => return Ended::Broken(e.to_string()),
        };
        buf.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(n) = buf[start..].iter().position(|&b| b == b'\n') {
            let raw = &buf[start..start + n];
            start += n + 1;
            if raw.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let line: Line = match serde_json::from_slice(raw) {
                Ok(l) => l,
                Err(e) => return Ended::Refused(format!("unreadable line: {e}")),
            };
            if let Some(e) = line.error {
                return Ended::Refused(e);
            }
            if line.end_of_snapshot {
                m.end_of_snapshot(line.key_index.unwrap_or(line.index), line.index);
                unpublished = Some(line.index);
                publish(m, tx, &mut unpublished, cursor);
            } else if line.new_snapshot_to_follow {
                // What came before is whole: published first.
                publish(m, tx, &mut unpublished, cursor);
                m.new_snapshot();
            } else if let Some(p) = line.payload {
                // A later index: the one before is complete.
                if unpublished.is_some_and(|u| line.index > u) {
                    publish(m, tx, &mut unpublished, cursor);
                }
                m.event(&Arc::new(p.value), p.op == "Deregister", line.index);
                if !m.in_snapshot() {
                    unpublished = Some(line.index);
                }
            }
        }
        buf.drain(..start);
        if buf.len() > MAX_LINE {
            return Ended::Refused(format!("a line over {MAX_LINE} bytes"));
        }
    }
}
