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
use crate::stream::{Item, Topic};
use crate::structs::config_entry::Kind;

pub fn routes() -> Router<App> {
    Router::new().route("/v1/internal/stream", get(stream))
}

fn line(item: Item) -> Bytes {
    match item {
        Item::Event(e) => e.line.clone(),
        Item::EndOfSnapshot(index) => {
            Bytes::from(format!("{{\"EndOfSnapshot\":true,\"Index\":{index}}}\n"))
        }
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
    // A subscription is to one key (or prefix): checked once, up front.
    match topic {
        Topic::Kv => a.require(a.key_read(key), "key:read", key)?,
        Topic::Config(Kind::ProxyDefaults) => {}
        _ => a.require(a.service_read(key), "service:read", key)?,
    }
    let index = p.u64("index")?.unwrap_or(0);
    // Open as long as the caller keeps it: a place among the blocking
    // queries, held by the body.
    let permit = s.blocking_permit()?;
    let sub = s.publisher.subscribe(s.store.clone(), topic, key, index);
    // One chunk per batch: an index's events are written together.
    let body = futures_util::stream::unfold(sub, |mut sub| async move {
        let items = sub.next_batch().await;
        let chunk = if items.len() == 1 {
            line(items.into_iter().next().expect("one item"))
        } else {
            let mut buf = bytes::BytesMut::new();
            for item in items {
                buf.extend_from_slice(&line(item));
            }
            buf.freeze()
        };
        Some((Ok::<_, std::convert::Infallible>(chunk), sub))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(futures_util::StreamExt::inspect(body, move |_| {
            let _held = &permit;
        })),
    )
        .into_response())
}
