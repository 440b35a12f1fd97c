//! `GET /v1/internal/stream`: a topic key's events as newline-delimited
//! JSON — a snapshot, `{"EndOfSnapshot":true,"Index":N}`, then each change
//! as it commits. Any server answers from its own state.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::{App, Called};
use crate::error::{Error, Result};
use crate::stream::{Item, Topic};

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

async fn stream(State(s): State<App>, Called(p, call): Called) -> Result<Response> {
    let topic_name = p
        .get("topic")
        .ok_or_else(|| Error::bad("Missing topic parameter"))?;
    let topic = Topic::parse(topic_name)
        .ok_or_else(|| Error::bad(format!("Unknown topic {topic_name:?}")))?;
    let key = p.get("key").unwrap_or("");
    let index = p.u64("index")?.unwrap_or(0);
    // Open as long as the caller keeps it: the body holds the
    // subscription and its blocking place.
    let sub = crate::endpoint::stream::subscribe(&s, &call, topic, key, index)?;
    // One chunk per batch: an index's events are written together. A
    // token that stops resolving ends the stream with an error line.
    let body = futures_util::stream::unfold(Some(sub), |sub| async move {
        let mut sub = sub?;
        let items = match sub.sub.next_batch().await {
            Ok(items) => items,
            Err(e) => return Some((Ok(error_line(&e)), None)),
        };
        let key_index = sub.sub.snapshot_key_index();
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
        Body::from_stream(body),
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
