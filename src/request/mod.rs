//! Request plumbing shared by every HTTP router (the servers' and the
//! client agents'): query parameters and read options, JSON bodies, the
//! layers every request passes (tracing, panics, body limits, tenancy), and
//! `?filter`/`?node-meta`/`?tag` row matching. It knows nothing of a
//! server or an agent: both routers build on it.
//!
//! - Here: `Params`, `QueryOptions` and `?wait`, the metrics response,
//!   path-segment encoding (`enc`), `forward_timeout` (how long a request
//!   passed on to another server waits), and `NamedRoutes::named`: a route
//!   ending in a name or ID takes the rest of the path (IDs may hold `/`),
//!   and its nameless twin answers Consul's 400 (`Missing service name`).
//! - `serve`: hyper HTTP/1.1 per connection within the HTTP limits
//!   (connection cap and per-client-IP cap, header-read and idle timeouts,
//!   a least body rate), and the blocking places with each caller's share
//!   of them (`Blocking`, `Caller`); `serve_tls` the same over TLS, the
//!   handshake after admission and within the header-read timeout.
//! - `authz`: the `Authz` extractor. The token is resolved by the router's
//!   `Resolver`, or taken resolved from the extensions where an async
//!   layer did it; it keeps the token and the ACL generation, so a
//!   blocking query can resolve it again.
//! - `json` (every request body's decoder: struct fields in any letter
//!   case at every depth, as Go's decoder), `error` (the one table from
//!   `error::Error` to a status and Consul's body), `list_filter`
//!   (`?filter`, `?node-meta`, `?tag`).
//! - `ui`: the web UI's static files at `/ui/`, under `--ui`, `--dev` or
//!   `ui_config`: the files of `ui/` compiled in with `include_bytes!`, or
//!   `--ui-dir`'s directory with no path out of it.

pub mod authz;
pub mod error;
pub mod json;
pub mod list_filter;
pub mod serve;
pub mod ui;

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any};
use rand::Rng;

use crate::error::{Error, Result};

/// Routes whose path ends in a name (or ID), as Consul's handlers take
/// everything after a prefix.
pub trait NamedRoutes {
    /// `<prefix>{*name}` served by `route`, and `<prefix>` with no name
    /// refused with Consul's 400 `missing` (e.g. "Missing service name").
    type State;
    fn named(self, prefix: &str, missing: &'static str, route: MethodRouter<Self::State>) -> Self;
}

impl<S: Clone + Send + Sync + 'static> NamedRoutes for Router<S> {
    type State = S;
    fn named(self, prefix: &str, missing: &'static str, route: MethodRouter<S>) -> Self {
        self.route(prefix, any(move || async move { Error::bad(missing) }))
            .route(&format!("{prefix}{{*name}}"), route)
    }
}

/// Consul's `limits.rpc_client_timeout`: how long a request passed on to
/// a server (a follower's to the leader, an agent's to its server) waits
/// for the answer, unless it is a blocking read.
pub const RPC_CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound of a passed-on snapshot (hundreds of MB either way) or event
/// stream, and the HTTP clients' default.
pub const LONG_FORWARD: Duration = Duration::from_secs(11 * 60);

/// How long a request passed on to another server may wait for its
/// answer: `RPC_CLIENT_TIMEOUT`, a blocking read its wait and Consul's
/// jitter (1/16) more, a snapshot or a stream `LONG_FORWARD`. So a
/// server that stops answering mid-request holds its caller a minute.
pub fn forward_timeout(method: &axum::http::Method, path: &str, p: &Params) -> Duration {
    use axum::http::Method;
    if path == "/v1/snapshot" || path == "/v1/internal/stream" {
        LONG_FORWARD
    } else if matches!(*method, Method::GET | Method::HEAD) && p.has("index") {
        // A bad `wait` is answered 400 at once.
        let wait = wait_of(p).unwrap_or_default();
        wait + wait / 16 + RPC_CLIENT_TIMEOUT
    } else {
        RPC_CLIENT_TIMEOUT
    }
}

/// `uri` with its `?wait` set to `wait` (whole milliseconds), every other
/// parameter kept: what is left of a blocking read's wait when it is asked
/// again of another server.
pub fn with_wait(uri: &axum::http::Uri, wait: Duration) -> axum::http::Uri {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        if k != "wait" {
            q.append_pair(&k, &v);
        }
    }
    q.append_pair("wait", &format!("{}ms", wait.as_millis()));
    let path_and_query = format!("{}?{}", uri.path(), q.finish());
    let mut parts = uri.clone().into_parts();
    match path_and_query.parse() {
        Ok(pq) => parts.path_and_query = Some(pq),
        Err(_) => return uri.clone(),
    }
    axum::http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

/// Request bodies above this are refused before they are read.
pub const MAX_BODY: usize = 4 << 20;

/// Query parameters as Consul reads them: flags without values, repeats.
#[derive(Debug, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(q: Option<&str>) -> Self {
        let q = q.unwrap_or("");
        Params(
            form_urlencoded::parse(q.as_bytes())
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    pub fn has(&self, k: &str) -> bool {
        self.0.iter().any(|(n, _)| n == k)
    }

    /// A flag as Consul reads one: given, and not `false` or `0`
    /// (`?global`, `?global=true` and `?global=1` all set it).
    pub fn flag(&self, k: &str) -> bool {
        self.has(k) && !matches!(self.get(k), Some("false" | "0"))
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

/// How a read wants to be answered.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct QueryOptions {
    pub index: u64,
    pub wait: Duration,
    pub consistent: bool,
    pub stale: bool,
}

const DEFAULT_WAIT: Duration = Duration::from_secs(300);
const MAX_WAIT: Duration = Duration::from_secs(600);

/// `?wait` as Consul reads it: a Go duration, 5 min by default, at most 10.
pub fn wait_of(p: &Params) -> Result<Duration> {
    Ok(match p.get("wait") {
        None | Some("") => DEFAULT_WAIT,
        Some(w) => {
            let d = crate::structs::duration::Duration::parse(w)
                .map_err(|e| Error::bad(format!("Invalid wait time: {e}")))?;
            Duration::from_nanos(d.nanos().max(0) as u64)
        }
    }
    .min(MAX_WAIT))
}

impl QueryOptions {
    /// A request's query string read whole: its parameters and the query
    /// options they make (a `?dc` other than `dc` refused).
    pub fn parse(q: Option<&str>, dc: &str) -> Result<(Params, Self)> {
        let p = Params::parse(q);
        let opts = Self::from(&p, dc)?;
        Ok((p, opts))
    }

    pub fn from(p: &Params, dc: &str) -> Result<Self> {
        if let Some(want) = p.get("dc")
            && !want.is_empty()
            && want != dc
        {
            // Another datacenter's requests were sent there before this
            // (`http::wan`): this one has no path to it.
            return Err(Error::NoPathToDatacenter);
        }
        let stale = p.has("stale");
        let consistent = p.has("consistent");
        if stale && consistent {
            return Err(Error::bad(
                "Cannot specify ?stale with ?consistent, conflicting semantics.",
            ));
        }
        Ok(QueryOptions {
            index: p.u64("index")?.unwrap_or(0),
            wait: wait_of(p)?,
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
        let wait = self.wait + Duration::from_millis(crate::random::rng().gen_range(0..=jitter));
        tokio::time::Instant::now() + wait
    }
}

/// Percent-encodes one path segment or query value (everything but
/// RFC 3986's unreserved characters), for requests this process sends.
pub fn enc(s: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, RESERVED).to_string()
}

/// Whether a `/v1/agent/metrics` request asked for Prometheus text.
fn wants_prometheus(query: Option<&str>) -> bool {
    Params::parse(query).get("format") == Some("prometheus")
}

/// `/v1/agent/metrics` (servers' and agents'): Consul's JSON form unless
/// `?format=prometheus`.
pub fn metrics_response(
    query: Option<&str>, counters: &[&crate::metrics::Counter], gauges: &[(&str, &str, f64)],
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if wants_prometheus(query) {
        (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            crate::metrics::render_with(counters, gauges),
        )
            .into_response()
    } else {
        axum::Json(crate::metrics::render_json(
            counters,
            gauges,
            std::time::SystemTime::now(),
        ))
        .into_response()
    }
}

/// How often `/v1/agent/metrics/stream` sends a summary (Consul's in-memory
/// sink's interval).
pub const METRICS_STREAM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// `/v1/agent/metrics/stream`'s answer: `summary()` as one JSON line now
/// and one per [`METRICS_STREAM_INTERVAL`], until the caller hangs up.
pub fn metrics_stream(
    summary: impl Fn() -> serde_json::Value + Send + Sync + 'static,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut every = tokio::time::interval(METRICS_STREAM_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let summary = std::sync::Arc::new(summary);
    let lines = futures_util::stream::unfold(every, move |mut every| {
        let summary = summary.clone();
        async move {
            every.tick().await;
            let mut line = summary().to_string();
            line.push('\n');
            let line = axum::body::Bytes::from(line);
            Some((Ok::<_, std::convert::Infallible>(line), every))
        }
    });
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// Decodes a JSON body, its keys matched to struct fields in any letter
/// case as Consul's (`json::from_value`), answering 400 with the reason on
/// failure.
pub fn decode_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    let bad = |e: serde_json::Error| Error::bad(format!("Request decode failed: {e}"));
    json::from_value(serde_json::from_slice(body).map_err(bad)?).map_err(bad)
}

/// Namespaces and admin partitions are Consul Enterprise features: like
/// Consul's open-source edition, refuse a request that names one (rather
/// than answer from the default namespace), so a client configured for
/// them learns at once that they are not there.
pub async fn refuse_enterprise_tenancy(req: Request, next: Next) -> Response {
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

pub fn panic_response(_: Box<dyn std::any::Any + Send>) -> Response {
    tracing::error!("handler panicked");
    (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
}

pub async fn trace_request(req: Request, next: Next) -> Response {
    use tracing::Instrument;
    crate::metrics::HTTP_REQUESTS.inc();
    let span = tracing::debug_span!("http", method = %req.method(), path = %req.uri().path());
    async move {
        let mut resp = bad_input_is_400(next.run(req).await);
        nosniff(&mut resp);
        tracing::debug!(status = resp.status().as_u16(), "answered");
        resp
    }
    .instrument(span)
    .await
}

/// No answer is to be read as another type than it says (a value written
/// by one user must never run as a page on the UI's origin).
fn nosniff(resp: &mut Response) {
    resp.headers_mut().insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
}

/// A path no endpoint serves: Consul's answer (its index handler's 404 and
/// words), counted, so that an operator sees clients calling an endpoint
/// this server lacks (`cairn_http_unrouted_total`). Outside the routes'
/// layers, so it counts and marks its answer itself.
pub async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    crate::metrics::HTTP_REQUESTS.inc();
    crate::metrics::HTTP_ERRORS.inc();
    crate::metrics::HTTP_UNROUTED.inc();
    tracing::debug!(%method, path = uri.path(), "no endpoint serves this path");
    let why = if uri.path().contains("/v1/") {
        "Invalid URL path: not a recognized HTTP API endpoint\n"
    } else {
        "Invalid URL path: if attempting to use the HTTP API, ensure the path starts with '/v1/'\n"
    };
    let mut resp = (StatusCode::NOT_FOUND, why).into_response();
    nosniff(&mut resp);
    resp
}

/// The contract answers every kind of bad input with 400 and a one-line
/// reason; axum's extractors answer some with 415/422. (A body over
/// `MAX_BODY` keeps axum's 413 and its one-line reason, as the contract and
/// Consul answer it.)
fn bad_input_is_400(resp: Response) -> Response {
    match resp.status() {
        StatusCode::UNSUPPORTED_MEDIA_TYPE | StatusCode::UNPROCESSABLE_ENTITY => {
            Error::bad("Request decode failed: malformed body").into_response()
        }
        _ => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_format() {
        assert!(wants_prometheus(Some("format=prometheus")));
        assert!(!wants_prometheus(Some("format=json")));
        assert!(!wants_prometheus(None));
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(enc("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(enc("web-1_x.y~z"), "web-1_x.y~z");
        assert_eq!(enc("ü"), "%C3%BC");
    }

    #[test]
    fn query_strings_are_decoded() {
        let p = Params::parse(Some("a=1&flag&b=x%20y+z&=skipped&a=2"));
        assert_eq!(p.get("a"), Some("1"));
        assert_eq!(p.all("a"), ["1", "2"]);
        assert!(p.has("flag"));
        assert_eq!(p.get("b"), Some("x y z"));
        assert!(!p.has(""));
    }

    fn timeout_of(method: axum::http::Method, uri: &str) -> Duration {
        let uri: axum::http::Uri = uri.parse().unwrap();
        forward_timeout(&method, uri.path(), &Params::parse(uri.query()))
    }

    #[test]
    fn a_forward_waits_a_minute_a_blocking_read_its_wait_more() {
        let min = Duration::from_secs(60);
        assert_eq!(timeout_of(axum::http::Method::PUT, "/v1/kv/a"), min);
        assert_eq!(timeout_of(axum::http::Method::GET, "/v1/kv/a?wait=1m"), min);
        let wait = Duration::from_secs(160);
        assert_eq!(
            timeout_of(axum::http::Method::GET, "/v1/kv/a?index=7&wait=160s"),
            wait + wait / 16 + min
        );
        // Consul's default wait (5 min) and its cap (10 min).
        let five = Duration::from_secs(300);
        assert_eq!(
            timeout_of(axum::http::Method::GET, "/v1/kv/a?index=7"),
            five + five / 16 + min
        );
        let ten = Duration::from_secs(600);
        assert_eq!(
            timeout_of(axum::http::Method::GET, "/v1/kv/a?index=7&wait=1h"),
            ten + ten / 16 + min
        );
        assert_eq!(
            timeout_of(axum::http::Method::PUT, "/v1/snapshot"),
            LONG_FORWARD
        );
        assert_eq!(
            timeout_of(axum::http::Method::GET, "/v1/internal/stream?topic=KV"),
            LONG_FORWARD
        );
    }
}
