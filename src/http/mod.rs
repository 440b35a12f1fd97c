//! The servers' Consul-compatible HTTP API: routers per area, and what
//! needs a server — consistency modes, blocking queries, the `X-Consul-*`
//! headers, and forwarding to the leader. Plumbing shared with the client
//! agent's router (parameters, bodies, layers) is in `crate::request`.

pub mod acl;
mod agent;
mod agent_ops;
pub mod catalog;
mod config;
pub mod connect;
pub mod coordinate;
mod dataplane;
mod debug;
pub mod event;
mod gateways;
mod health;
mod intentions;
mod keyring;
mod kv;
pub mod liveness;
mod login;
mod operator;
mod proxycfg;
pub mod query;
mod replication;
pub mod session;
mod snapshot;
mod status;
mod stream;
pub mod ui;
mod virtual_ip;
pub mod wan;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use crate::error::{Error, Result};
use crate::request::authz::FILTERED_HEADER;
use crate::request::{
    MAX_BODY, Params, QueryOptions, forward_timeout, panic_response, refuse_enterprise_tenancy,
    trace_request, wait_of, with_wait,
};
use crate::server::Server;

pub type App = Arc<Server>;

/// The request's query string and its options, checked against this
/// server (`?dc` this datacenter, `?stale` with `?consistent` refused,
/// tenancy refused): the first step of every endpoint that takes them, so a
/// bad query is a 400 before anything is read or written.
pub struct Opts(pub Params, pub QueryOptions);

impl FromRequestParts<App> for Opts {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, s: &App) -> Result<Self> {
        let (p, opts) = QueryOptions::parse(parts.uri.query(), s.datacenter())?;
        Ok(Opts(p, opts))
    }
}

/// The request as an endpoint call (`crate::endpoint`): its parameters,
/// and its token, query options and client, checked as `Opts` checks them.
/// The token is resolved where the call runs, after routing.
pub struct Called(pub Params, pub crate::endpoint::Call);

impl FromRequestParts<App> for Called {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, s: &App) -> Result<Self> {
        let (p, opts) = QueryOptions::parse(parts.uri.query(), s.datacenter())?;
        let token = crate::request::authz::token_of(&parts.headers, parts.uri.query());
        let mut call = crate::endpoint::Call::new(token, opts);
        call.client = parts
            .extensions
            .get::<crate::request::serve::ClientIp>()
            .map(|c| c.0);
        Ok(Called(p, call))
    }
}

/// The `X-Consul-*` headers of an endpoint's answer.
pub fn answer_headers<T>(a: &crate::endpoint::Answer<T>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-consul-index", HeaderValue::from(a.index));
    h.insert(
        "x-consul-knownleader",
        HeaderValue::from_static(if a.known_leader { "true" } else { "false" }),
    );
    h.insert("x-consul-lastcontact", HeaderValue::from(a.last_contact));
    if a.filtered {
        h.insert(FILTERED_HEADER, HeaderValue::from_static("true"));
    }
    h
}

/// An endpoint's answer as JSON with its headers.
pub fn answer_json<T: serde::Serialize>(a: &crate::endpoint::Answer<T>) -> Response {
    let mut resp = axum::Json(&a.value).into_response();
    resp.headers_mut().extend(answer_headers(a));
    resp
}

const FORWARDED: &str = "x-cairn-forwarded";
/// The one write that the leader change it causes must not cut off.
const TRANSFER_LEADER: &str = "/v1/operator/raft/transfer-leader";
/// On a forwarded request: the node of the server that received it (a
/// session's `Node` defaults to it, as Consul's to the receiving agent's).
pub(crate) const ORIGIN_NODE: &str = "x-cairn-origin-node";

pub fn router(server: App) -> Router {
    Router::new()
        .merge(acl::routes())
        .merge(login::routes())
        .merge(keyring::routes())
        .merge(kv::routes())
        .merge(session::routes())
        .merge(snapshot::routes())
        .merge(config::routes())
        .merge(connect::routes())
        .merge(intentions::routes())
        .merge(dataplane::routes())
        .merge(stream::routes())
        .merge(proxycfg::routes())
        .merge(catalog::routes())
        .merge(health::routes())
        .merge(gateways::routes())
        .merge(status::routes())
        .merge(operator::routes())
        .merge(agent::routes())
        .merge(agent_ops::routes())
        .merge(liveness::routes())
        .merge(event::routes())
        .merge(coordinate::routes())
        .merge(query::routes())
        .merge(wan::routes())
        .merge(replication::routes())
        .merge(ui::routes())
        .merge(virtual_ip::routes())
        .merge(debug::routes(server.config()))
        .layer(middleware::from_fn_with_state(
            server.clone(),
            forward_to_leader,
        ))
        // Outside the leader forwarding: another datacenter's request goes
        // there whole, to be forwarded to its leader there.
        .layer(middleware::from_fn_with_state(
            server.clone(),
            wan::to_datacenter,
        ))
        .layer(middleware::from_fn(refuse_enterprise_tenancy))
        .layer(axum::Extension(resolver(&server)))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        .layer(middleware::from_fn(trace_request))
        .with_state(server)
}

/// How this server's handlers resolve tokens (`request::authz`).
pub fn resolver(server: &App) -> crate::request::authz::Resolver {
    crate::request::authz::Resolver(server.clone())
}

/// Endpoints any server answers itself, whatever the mode (those on the
/// endpoint layer route themselves: `crate::endpoint::route`).
fn always_local(method: &Method, path: &str) -> bool {
    // Config entries' and prepared queries' writes (their reads are still
    // forwarded here).
    let endpoint_write = (method == Method::PUT && path == "/v1/config")
        || (method == Method::DELETE && path.starts_with("/v1/config/"))
        || (method == Method::POST && path == "/v1/query")
        || (matches!(*method, Method::PUT | Method::DELETE) && path.starts_with("/v1/query/"));
    endpoint_write
        || path == "/v1/kv"
        || path.starts_with("/v1/kv/")
        || path.starts_with("/v1/session/")
        || matches!(
            path,
            "/v1/acl/login"
                | "/v1/acl/logout"
                | "/v1/acl/oidc/auth-url"
                | "/v1/acl/oidc/callback"
                | "/v1/catalog/register"
                | "/v1/catalog/deregister"
        )
        || (path.starts_with("/v1/agent/") && !agent_ops::leader_only(path))
        || path.starts_with("/v1/status/")
        || path == "/v1/internal/stream"
        || path.starts_with("/v1/internal/proxycfg/")
        // Another datacenter's failover: a read of this server's state.
        || path == crate::endpoint::query::EXECUTE_REMOTE
        // A secondary's intermediate, signed from this server's state (its
        // mark is the WAN frame's, which a hop to the leader would lose).
        || path == crate::connect::SIGN_INTERMEDIATE_PATH
}

/// Writes, and reads that are not `?stale`, are answered by the leader: a
/// follower passes them on and returns the leader's answer unchanged.
async fn forward_to_leader(State(s): State<App>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    let stale = read && Params::parse(req.uri().query()).has("stale");
    if always_local(req.method(), path) || stale || s.cluster().is_ready_leader() {
        return next.run(req).await;
    }
    if req.headers().contains_key(FORWARDED) {
        // Sent here as to the leader: answered here once ready; deposed
        // meanwhile, not at all (the sender's client asks again).
        return match s.await_ready_leader().await {
            Ok(true) => next.run(req).await,
            Ok(false) => Error::NoLeader.into_response(),
            Err(e) => e.into_response(),
        };
    }
    let (mut parts, body) = req.into_parts();
    let params = Params::parse(parts.uri.query());
    // A txn of reads only may be answered here with `?stale` (Consul's
    // fast path); which it is, only its body says.
    let stale_txn = parts.uri.path() == "/v1/txn" && params.has("stale");
    let mut timeout = forward_timeout(&parts.method, parts.uri.path(), &params);
    // A blocking read answers within its caller's wait, whatever happens to
    // leaders meanwhile: asked again of the next one, it waits what is left.
    let wait_ends = (read && params.has("index"))
        .then(|| tokio::time::Instant::now() + wait_of(&params).unwrap_or_default());
    if snapshot::is_upload(&parts) {
        return forward_upload(&s, parts, body, timeout, next).await;
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return Error::TooLarge(format!("Request body too large or unreadable: {e}"))
                .into_response();
        }
    };
    if stale_txn && kv::read_only(&body, s.datacenter()) {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    }
    // Retry while a new leader is being elected, within the hold time.
    let mut deadline = tokio::time::Instant::now() + crate::server::LEADER_HOLD;
    let mut asked = false;
    loop {
        let leader = s.await_leader().await;
        // Asked again (a leader lost, an election waited out): a blocking
        // read waits only what is left of its caller's wait.
        if let (true, Some(ends)) = (asked, wait_ends) {
            let left = ends.saturating_duration_since(tokio::time::Instant::now());
            parts.uri = with_wait(&parts.uri, left);
            let params = Params::parse(parts.uri.query());
            timeout = forward_timeout(&parts.method, parts.uri.path(), &params);
        }
        asked = true;
        match leader {
            Ok((id, _)) if id == s.cluster().id => match s.await_ready_leader().await {
                Ok(true) => return next.run(Request::from_parts(parts, Body::from(body))).await,
                // Deposed while it waited: the next leader is asked.
                Ok(false) => continue,
                Err(e) => return e.into_response(),
            },
            // Moving the leadership is this request's purpose: the change
            // it causes does not cut it off (sent once, never retried).
            Ok((_, leader)) if parts.uri.path() == TRANSFER_LEADER => {
                return match proxy(&s, &leader.http_addr, &parts, body, timeout).await {
                    Ok(r) => r,
                    Err(e) => e.into_response(),
                };
            }
            Ok((id, leader)) => match s
                .while_leads(
                    id,
                    proxy(&s, &leader.http_addr, &parts, body.clone(), timeout),
                )
                .await
            {
                Ok(r) => return r,
                Err(Error::NoLeader) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                // A read changes nothing: the next leader is asked, within
                // a hold time of its own.
                Err(Error::LeadershipLost) if read => {
                    deadline = tokio::time::Instant::now() + crate::server::LEADER_HOLD;
                }
                Err(e) => return e.into_response(),
            },
            Err(e) => return e.into_response(),
        }
    }
}

/// A snapshot upload on a follower: the caller's token is checked here
/// before a byte of the body is read, and the body goes on to the leader
/// as a stream, never whole in this server's memory. Sent once: a stream
/// cannot be sent again to a next leader.
async fn forward_upload(
    s: &App, parts: axum::http::request::Parts, body: Body, timeout: Duration, next: Next,
) -> Response {
    let allowed = parts
        .extensions
        .get::<crate::request::authz::Resolver>()
        .ok_or_else(|| Error::Internal("no token resolver on this router".into()))
        .and_then(|r| {
            let token = crate::request::authz::token_of(&parts.headers, parts.uri.query());
            crate::request::authz::Authz::resolve(&*r.0, token)
        })
        .and_then(|a| crate::endpoint::snapshot::management(&a));
    if let Err(e) = allowed {
        return e.into_response();
    }
    let (id, leader) = match s.await_leader().await {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    if id == s.cluster().id {
        return match s.await_ready_leader().await {
            Ok(true) => next.run(Request::from_parts(parts, body)).await,
            Ok(false) => Error::NoLeader.into_response(),
            Err(e) => e.into_response(),
        };
    }
    // Streamed as it arrives (a restore is up to hundreds of MiB), in the
    // request's own task: `SyncStream` gives the body the `Sync` reqwest
    // asks of it (it is only ever polled through `&mut`).
    let frames =
        futures_util::TryStreamExt::map_ok(body.into_data_stream(), http_body::Frame::data);
    let upload = reqwest::Body::wrap(http_body_util::StreamBody::new(
        sync_wrapper::SyncStream::new(frames),
    ));
    match s
        .while_leads(id, proxy(s, &leader.http_addr, &parts, upload, timeout))
        .await
    {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Sends a request on to the leader at `addr`, waiting up to `timeout` for
/// its answer; an error says whether the request could have reached it.
async fn proxy(
    s: &Server, addr: &str, parts: &axum::http::request::Parts, body: impl Into<reqwest::Body>,
    timeout: Duration,
) -> Result<Response> {
    crate::metrics::HTTP_FORWARDED.inc();
    // A leader serving HTTPS only advertises `https://host:port`.
    let base = if addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let url = format!(
        "{base}{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let mut out = s
        .http_client()
        .request(parts.method.clone(), &url)
        .header(FORWARDED, "1")
        .header(ORIGIN_NODE, s.node_name())
        .body(body);
    // The caller's identity goes with it: the leader checks the token.
    for name in ["content-type", "x-consul-token", "authorization"] {
        if let Some(v) = parts.headers.get(name) {
            out = out.header(name, v);
        }
    }
    // Only a request that never reached the leader may be retried: one that
    // did could have committed.
    let resp = out.timeout(timeout).send().await.map_err(|e| {
        if e.is_connect() {
            Error::NoLeader
        } else if e.is_timeout() {
            Error::Internal(format!(
                "no answer from the leader within {} s",
                timeout.as_secs()
            ))
        } else {
            Error::LeadershipLost
        }
    })?;
    // Every header the leader set, but those of the hop itself.
    let mut builder = Response::builder().status(resp.status());
    for (k, v) in resp.headers() {
        if !matches!(
            k.as_str(),
            "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "date"
        ) {
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

// Blocking queries are the endpoint layer's; the handlers not yet moved
// onto it call them from here.
pub use crate::endpoint::blocking::{Watch, blocking, recheck};

/// The `X-Consul-*` headers of a read answered here at `index`.
pub fn meta_headers(s: &Server, index: u64) -> HeaderMap {
    answer_headers(&crate::endpoint::Answer::at(s, index, false, ()))
}

/// A JSON answer with the read headers, marked when ACLs dropped rows.
pub fn json_filtered<T: serde::Serialize>(
    s: &Server, index: u64, value: &T, filtered: bool,
) -> Response {
    let mut resp = json_at(s, index, value);
    if filtered {
        mark_filtered(&mut resp);
    }
    resp
}

/// Marks an answer that lost rows the caller may not see (Consul's
/// `X-Consul-Results-Filtered-By-ACLs`).
pub fn mark_filtered(resp: &mut Response) {
    resp.headers_mut()
        .insert(FILTERED_HEADER, HeaderValue::from_static("true"));
}

pub use crate::endpoint::keep;

/// A JSON answer with the read headers.
pub fn json_at<T: serde::Serialize>(s: &Server, index: u64, value: &T) -> Response {
    let mut resp = axum::Json(value).into_response();
    resp.headers_mut().extend(meta_headers(s, index));
    resp
}
