//! The Consul-compatible HTTP API: routers per area, and the plumbing they
//! share — query parameters, consistency modes, blocking queries, the
//! `X-Consul-*` headers, and forwarding to the leader.

pub(crate) mod catalog;
mod config;
mod dataplane;
mod health;
mod kv;
mod proxycfg;
pub(crate) mod query;
mod session;
mod status;
mod stream;

pub use catalog::validate_register;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures_util::future::select_all;
use rand::Rng;

use crate::error::{Error, Result};
use crate::server::Server;
use crate::state::State as Tables;

pub type App = Arc<Server>;

/// Request bodies above this are refused before they are read.
pub const MAX_BODY: usize = 4 << 20;
const FORWARDED: &str = "x-cairn-forwarded";
/// On a forwarded request: the node of the server that received it (a
/// session's `Node` defaults to it, as Consul's to the receiving agent's).
pub(crate) const ORIGIN_NODE: &str = "x-cairn-origin-node";

pub fn router(server: App) -> Router {
    Router::new()
        .merge(kv::routes())
        .merge(session::routes())
        .merge(config::routes())
        .merge(dataplane::routes())
        .merge(stream::routes())
        .merge(proxycfg::routes())
        .merge(catalog::routes())
        .merge(health::routes())
        .merge(status::routes())
        .merge(crate::agent::liveness::routes())
        .layer(middleware::from_fn_with_state(
            server.clone(),
            forward_to_leader,
        ))
        .layer(middleware::from_fn(refuse_enterprise_tenancy))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        .layer(middleware::from_fn(trace_request))
        .with_state(server)
}

/// Namespaces and admin partitions are Consul Enterprise features: like
/// Consul's open-source edition, refuse a request that names one (rather
/// than answer from the default namespace), so a client configured for
/// them learns at once that they are not there.
pub(crate) async fn refuse_enterprise_tenancy(req: Request, next: Next) -> Response {
    match enterprise_tenancy(&req) {
        Some(reason) => Error::bad(reason).into_response(),
        None => next.run(req).await,
    }
}

fn enterprise_tenancy(req: &Request) -> Option<&'static str> {
    let header = |name: &str| req.headers().get(name).is_some_and(|v| !v.is_empty());
    let params = Params::parse(req.uri().query());
    let param = |name: &str| params.get(name).filter(|v| !v.is_empty());
    if header("x-consul-namespace") {
        return Some(
            r#"Invalid header: "X-Consul-Namespace" - Namespaces are a Consul Enterprise feature"#,
        );
    }
    if param("ns").is_some() {
        return Some(
            r#"Invalid query parameter: "ns" - Namespaces are a Consul Enterprise feature"#,
        );
    }
    let not_default = |v: &str| !v.eq_ignore_ascii_case("default");
    let header_ap = req.headers().get("x-consul-partition");
    if header_ap.is_some_and(|v| v.to_str().map_or(true, |v| !v.is_empty() && not_default(v))) {
        return Some(
            r#"Invalid header: "X-Consul-Partition" - Partitions are a Consul Enterprise feature"#,
        );
    }
    if param("partition").is_some_and(not_default) {
        return Some(
            r#"Invalid query parameter: "partition" - Partitions are a Consul Enterprise feature"#,
        );
    }
    None
}

pub(crate) fn panic_response(_: Box<dyn std::any::Any + Send>) -> Response {
    tracing::error!("handler panicked");
    (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
}

pub(crate) async fn trace_request(req: Request, next: Next) -> Response {
    use tracing::Instrument;
    crate::metrics::HTTP_REQUESTS.inc();
    let span = tracing::debug_span!("http", method = %req.method(), path = %req.uri().path());
    async move {
        let resp = bad_input_is_400(next.run(req).await);
        tracing::debug!(status = resp.status().as_u16(), "answered");
        resp
    }
    .instrument(span)
    .await
}

/// The contract answers every kind of bad input with 400 and a one-line
/// reason; axum's extractors answer some with 413/415/422.
fn bad_input_is_400(resp: Response) -> Response {
    match resp.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Error::bad(format!(
            "Request body too large, max size: {MAX_BODY} bytes"
        ))
        .into_response(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE | StatusCode::UNPROCESSABLE_ENTITY => {
            Error::bad("Request decode failed: malformed body").into_response()
        }
        _ => resp,
    }
}

/// Endpoints any server answers itself, whatever the mode.
fn always_local(path: &str) -> bool {
    path.starts_with("/v1/agent/")
        || path.starts_with("/v1/status/")
        || path == "/v1/internal/stream"
        || path.starts_with("/v1/internal/proxycfg/")
}

/// Writes, and reads that are not `?stale`, are answered by the leader: a
/// follower passes them on and returns the leader's answer unchanged.
async fn forward_to_leader(State(s): State<App>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    let stale = read && Params::parse(req.uri().query()).has("stale");
    if always_local(path) || stale || s.cluster.is_leader() || req.headers().contains_key(FORWARDED)
    {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return Error::bad(format!("Request body too large or unreadable: {e}"))
                .into_response();
        }
    };
    // Retry while a new leader is being elected, within the hold time.
    let deadline = tokio::time::Instant::now() + crate::server::LEADER_HOLD;
    loop {
        match s.await_leader().await {
            Ok((id, _)) if id == s.cluster.id => {
                return next.run(Request::from_parts(parts, Body::from(body))).await;
            }
            Ok((_, leader)) => match proxy(&s, &leader.http_addr, &parts, body.clone()).await {
                Ok(r) => return r,
                Err(Error::NoLeader) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => return e.into_response(),
            },
            Err(e) => return e.into_response(),
        }
    }
}

/// Sends a request on to the leader; an error means it could not be reached.
async fn proxy(
    s: &Server,
    addr: &str,
    parts: &axum::http::request::Parts,
    body: axum::body::Bytes,
) -> Result<Response> {
    crate::metrics::HTTP_FORWARDED.inc();
    let url = format!(
        "http://{addr}{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let mut out = s
        .http
        .request(parts.method.clone(), &url)
        .header(FORWARDED, "1")
        .header(ORIGIN_NODE, s.config.node.as_str())
        .body(body);
    if let Some(ct) = parts.headers.get("content-type") {
        out = out.header("content-type", ct);
    }
    // Only a request that never reached the leader may be retried: one that
    // did could have committed.
    let resp = out.send().await.map_err(|e| {
        if e.is_connect() {
            Error::NoLeader
        } else {
            Error::LeadershipLost
        }
    })?;
    let mut builder = Response::builder().status(resp.status());
    for (k, v) in resp.headers() {
        let name = k.as_str();
        if name.starts_with("x-consul-") || name == "content-type" {
            builder = builder.header(k, v);
        }
    }
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
    builder
        .body(Body::from(bytes))
        .map_err(|e| Error::Internal(e.to_string()))
}

/// Query parameters as Consul reads them: flags without values, repeats.
#[derive(Debug, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(q: Option<&str>) -> Self {
        let q = q.unwrap_or("");
        Params(
            form_urlencoded(q)
                .into_iter()
                .filter(|(k, _)| !k.is_empty())
                .collect(),
        )
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    pub fn has(&self, k: &str) -> bool {
        self.0.iter().any(|(n, _)| n == k)
    }

    pub fn all(&self, k: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn u64(&self, k: &str) -> Result<Option<u64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| Error::bad(format!("Invalid {k} parameter: {v:?} is not a number"))),
        }
    }
}

fn form_urlencoded(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

/// Decodes `%XX` and `+`; a malformed escape is kept as written.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How a read wants to be answered.
pub struct QueryOptions {
    pub index: u64,
    pub wait: Duration,
    pub consistent: bool,
    pub stale: bool,
}

const DEFAULT_WAIT: Duration = Duration::from_secs(300);
const MAX_WAIT: Duration = Duration::from_secs(600);

impl QueryOptions {
    pub fn from(p: &Params, dc: &str) -> Result<Self> {
        if let Some(want) = p.get("dc")
            && !want.is_empty()
            && want != dc
        {
            return Err(Error::bad(format!("No path to datacenter {want:?}")));
        }
        let stale = p.has("stale");
        let consistent = p.has("consistent");
        if stale && consistent {
            return Err(Error::bad(
                "Cannot specify ?stale with ?consistent, conflicting semantics.",
            ));
        }
        let wait = match p.get("wait") {
            None | Some("") => DEFAULT_WAIT,
            Some(w) => {
                let d = crate::structs::duration::Duration::parse(w)
                    .map_err(|e| Error::bad(format!("Invalid wait time: {e}")))?;
                Duration::from_nanos(d.nanos().max(0) as u64)
            }
        };
        Ok(QueryOptions {
            index: p.u64("index")?.unwrap_or(0),
            wait: wait.min(MAX_WAIT),
            consistent,
            stale,
        })
    }
}

impl QueryOptions {
    /// When a blocking query started now gives up: `?wait`, jittered by up
    /// to 1/16 as Consul does, so watchers do not all return at once.
    pub fn deadline(&self) -> tokio::time::Instant {
        let jitter = self.wait.as_millis() as u64 / 16;
        let wait = self.wait + Duration::from_millis(rand::thread_rng().gen_range(0..=jitter));
        tokio::time::Instant::now() + wait
    }
}

/// What a blocking query waits on.
pub enum Watch {
    Keys(Vec<String>),
    Prefix(String),
}

/// Runs a read, blocking while its index is not past `?index`.
///
/// Subscribes before reading so a change in between is never missed; wakes
/// only when a watched key changes (or the wait runs out).
pub async fn blocking<T>(
    s: &Server,
    opts: &QueryOptions,
    watch: Watch,
    read: impl Fn(&Tables) -> (u64, T),
) -> Result<(u64, T)> {
    if opts.consistent {
        s.linearize().await?;
    }
    if opts.index == 0 {
        return Ok(read(&s.store.state()));
    }
    crate::metrics::BLOCKING_QUERIES.inc();
    let deadline = opts.deadline();
    // Subscribed once: a receiver that woke keeps its place, so a wake that
    // does not move the index waits on the same channels (10,000 watchers
    // of one key woken at once do not queue on the watch map's lock again).
    let mut rxs: Vec<_> = match &watch {
        Watch::Keys(keys) => keys.iter().map(|k| s.store.watches.subscribe(k)).collect(),
        Watch::Prefix(p) => vec![s.store.watches.subscribe_prefix(p)],
    };
    loop {
        let (index, value) = read(&s.store.state());
        if index > opts.index || tokio::time::Instant::now() >= deadline {
            return Ok((index, value));
        }
        let changed = select_all(rxs.iter_mut().map(|r| Box::pin(r.changed())));
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            return Ok(read(&s.store.state()));
        }
    }
}

/// The `X-Consul-*` headers of a read answered at `index`.
pub fn meta_headers(s: &Server, index: u64) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-consul-index", HeaderValue::from(index.max(1)));
    let known = s.cluster.leader().is_some();
    h.insert(
        "x-consul-knownleader",
        HeaderValue::from_static(if known { "true" } else { "false" }),
    );
    let contact = if s.cluster.is_leader() {
        0
    } else {
        crate::raft::cluster::since_leader_contact()
    };
    h.insert("x-consul-lastcontact", HeaderValue::from(contact));
    h
}

/// A JSON answer with the read headers.
pub fn json_at<T: serde::Serialize>(s: &Server, index: u64, value: &T) -> Response {
    let mut resp = axum::Json(value).into_response();
    resp.headers_mut().extend(meta_headers(s, index));
    resp
}

/// Decodes a JSON body, answering 400 with the reason on failure.
pub fn decode_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| Error::bad(format!("Request decode failed: {e}")))
}
