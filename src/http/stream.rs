//! `GET /v1/internal/stream`: a topic key's events as newline-delimited
//! JSON — a snapshot, `{"EndOfSnapshot":true,"Index":N}`, then each change
//! as it commits. Any server answers from its own state.

use crate::request::authz::Authz;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::App;
use crate::error::{Error, Result};
use crate::request::Params;
use crate::stream::{Item, Reader, Topic};

pub fn routes() -> Router<App> {
    Router::new().route("/v1/internal/stream", get(stream))
}

/// An item's line; the end of a snapshot also says the key's own index
/// (`KeyIndex`: for one service's health its last change, what a health
/// read reports and a client agent's view answers at).
fn line(item: Item, key_index: u64) -> Bytes {
    match item {
        Item::Event(e) => e.line.clone(),
        Item::EndOfSnapshot(index) => Bytes::from(format!(
            "{{\"EndOfSnapshot\":true,\"Index\":{index},\"KeyIndex\":{key_index}}}\n"
        )),
        Item::NewSnapshotToFollow => Bytes::from_static(b"{\"NewSnapshotToFollow\":true}\n"),
    }
}

async fn stream(State(s): State<App>, a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let topic_name = p
        .get("topic")
        .ok_or_else(|| Error::bad("Missing topic parameter"))?;
    let topic = Topic::parse(topic_name)
        .ok_or_else(|| Error::bad(format!("Unknown topic {topic_name:?}")))?;
    let key = p.get("key").unwrap_or("");
    // The key (or prefix) subscribed to is checked up front; every event
    // is then filtered by the token as it is delivered (`stream::Reader`):
    // a prefix may hold keys the token may not read, a service instances
    // on nodes it may not read.
    match topic {
        Topic::Kv => a.require(a.key_read(key), "key:read", key)?,
        Topic::Config(kind) => {
            let permission = crate::config_check::read_permission(kind);
            let readable = crate::config_check::readable(&a, kind, key);
            a.require(readable, permission, key)?
        }
        // Any valid token (Consul): the extractor refused unknown ones.
        Topic::CaRoots => {}
        Topic::ServiceHealth | Topic::ServiceHealthConnect => {
            a.require(a.service_read(key), "service:read", key)?
        }
    }
    let index = p.u64("index")?.unwrap_or(0);
    // Open as long as the caller keeps it: a place among the blocking
    // queries, held by the body.
    let permit = (
        s.blocking_permit(&a)?,
        crate::metrics::STREAM_SUBSCRIPTIONS.hold(),
    );
    let mut sub = s
        .publisher()
        .subscribe(s.store().clone(), topic, key, index);
    // ACLs off: nothing to filter, nothing to check again.
    if s.acl().enabled() {
        sub = sub.read_as(Reader::new(a, super::resolver(&s)));
    }
    // One chunk per batch: an index's events are written together. A
    // token that stops resolving ends the stream with an error line.
    let body = futures_util::stream::unfold(Some(sub), |sub| async move {
        let mut sub = sub?;
        let items = match sub.next_batch().await {
            Ok(items) => items,
            Err(e) => return Some((Ok(error_line(&e)), None)),
        };
        let key_index = sub.snapshot_key_index();
        let chunk = if items.len() == 1 {
            line(items.into_iter().next().expect("one item"), key_index)
        } else {
            let mut buf = bytes::BytesMut::new();
            for item in items {
                buf.extend_from_slice(&line(item, key_index));
            }
            buf.freeze()
        };
        Some((Ok::<_, std::convert::Infallible>(chunk), Some(sub)))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(futures_util::StreamExt::inspect(body, move |_| {
            let _held = &permit;
        })),
    )
        .into_response())
}

/// The last line of a stream its token no longer allows:
/// `{"Error":"ACL not found"}`.
fn error_line(e: &Error) -> Bytes {
    let mut line = serde_json::to_vec(&serde_json::json!({ "Error": e.to_string() }))
        .expect("a string serializes");
    line.push(b'\n');
    Bytes::from(line)
}
