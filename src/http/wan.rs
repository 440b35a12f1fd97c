//! WAN federation on the HTTP API: `?dc=` sends a request to a server of
//! that datacenter (`federation::Federation::forward`, over the Raft
//! port's transport), where its own router answers it as if asked there;
//! `/v1/catalog/datacenters`, `/v1/agent/members?wan`, and the federation
//! states. In a secondary, a write of what is replicated from the primary
//! (ACL policies, roles, global tokens, config entries, intentions) goes to
//! the primary the same way, as Consul's servers forward it: it comes back
//! here through replication (`leader::replication`).
//!
//! A registration's or deregistration's body `Datacenter` counts as well,
//! read before `?dc=`, as Consul's handlers do. This is a middleware
//! outside the leader forwarding; a datacenter it does not know is
//! `500 No path to datacenter`. What goes to the primary: ACL policies,
//! roles, non-`Local` tokens, the bootstrap, auth methods and binding
//! rules, config entries and intentions, `?dc` dropped; so do a login
//! through a `global` method and a logout of a global token (a gRPC login
//! through such a method is refused in a secondary, as Consul's). Also
//! `/v1/internal/federation-states` and `federation-state/:dc` (one).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use crate::error::{Error, Result};
use crate::federation::{Federation, Forwarded, ReplicationPull};
use crate::raft::wan::{WanRequest, WanResponse};
use crate::request::{MAX_BODY, Params, forward_timeout};

/// The headers a forwarded request carries: its body's type and the
/// caller's identity (the other datacenter checks the token).
const SENT_HEADERS: &[&str] = &["content-type", "x-consul-token", "authorization"];

/// Paths answered only where they are asked: this server's own agent and
/// status, and what does not fit a request and its answer in frames
/// (streams, snapshots).
fn local_only(path: &str) -> bool {
    path.starts_with("/v1/agent/")
        || path == "/v1/internal/stream"
        || path.starts_with("/v1/internal/proxycfg/")
        || path.starts_with("/v1/internal/dataplane/")
        || path == "/v1/snapshot"
        || path.starts_with("/v1/internal/agent/")
        || path.starts_with("/v1/internal/event/")
        // Servers' own paths: a client's `?dc=` never reaches them.
        || path == crate::endpoint::query::EXECUTE_REMOTE
        || path == crate::connect::SIGN_INTERMEDIATE_PATH
}

/// The datacenter `?dc=` names, if another than this one.
fn other_dc(s: &App, query: Option<&str>) -> Option<String> {
    let p = Params::parse(query);
    p.get("dc")
        .filter(|dc| !dc.is_empty() && *dc != s.datacenter())
        .map(str::to_string)
}

/// The catalog's register and deregister, which name their datacenter in
/// the body as well.
fn names_dc_in_body(method: &Method, path: &str) -> bool {
    *method == Method::PUT && matches!(path, "/v1/catalog/register" | "/v1/catalog/deregister")
}

/// A body's `Datacenter`, its key in any case (as Go decodes it: py-consul
/// sends `datacenter`); none when the body does not decode (the handler
/// refuses it in its words). Every agent's sync comes through here, so the
/// other fields are skipped, not built into a tree.
fn body_dc(body: &[u8]) -> Option<String> {
    struct Dc(Option<String>);
    impl<'de> serde::Deserialize<'de> for Dc {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Dc, D::Error> {
            d.deserialize_map(Dc(None))
        }
    }
    impl<'de> serde::de::Visitor<'de> for Dc {
        type Value = Dc;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<M: serde::de::MapAccess<'de>>(
            mut self, mut m: M,
        ) -> std::result::Result<Dc, M::Error> {
            while let Some(k) = m.next_key::<String>()? {
                if k.eq_ignore_ascii_case("Datacenter") {
                    self.0 = m.next_value()?;
                } else {
                    m.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok(self)
        }
    }
    let Dc(dc) = serde_json::from_slice(body).ok()?;
    dc.filter(|dc| !dc.is_empty())
}

/// The other datacenter a request is for: `?dc=`, or for a registration or
/// deregistration its body's `Datacenter` first (Consul's handlers read the
/// body's and fall back to `?dc=`), so a client that names it only in the
/// body reaches that datacenter too.
async fn target_dc(s: &App, req: Request) -> Result<(Option<String>, Request)> {
    let from_query = other_dc(s, req.uri().query());
    if !names_dc_in_body(req.method(), req.uri().path()) {
        return Ok((from_query, req));
    }
    let (mut parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| Error::TooLarge(format!("Request body too large or unreadable: {e}")))?;
    let dc = match body_dc(&body) {
        Some(dc) if dc == s.datacenter() => {
            // The body wins over `?dc=` (Consul's order): answered here,
            // so the handler must not see the other datacenter's name.
            if from_query.is_some() {
                parts.uri = without_dc(&parts.uri)?;
            }
            None
        }
        Some(dc) => Some(dc),
        None => from_query,
    };
    Ok((dc, Request::from_parts(parts, Body::from(body))))
}

/// `?dc=<another>` (or a registration's body naming another): the request
/// goes to that datacenter and its answer comes back unchanged. A request
/// that came from another datacenter is never sent on again (no loops): one
/// naming a third is refused.
pub async fn to_datacenter(State(s): State<App>, req: Request, next: Next) -> Response {
    let (dc, req) = match target_dc(&s, req).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let Some(dc) = dc else {
        return match to_primary(&s, req).await {
            Ok(Ok(r)) => r,
            Ok(Err(req)) => next.run(req).await,
            Err(e) => e.into_response(),
        };
    };
    if local_only(req.uri().path()) {
        // Refused by the handler's `Opts` (no path from here).
        return next.run(req).await;
    }
    match send(&s, &dc, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn send(s: &App, dc: &str, req: Request) -> Result<Response> {
    if req.extensions().get::<Forwarded>().is_some() {
        return Err(Error::NoPathToDatacenter);
    }
    let fed = req
        .extensions()
        .get::<Arc<Federation>>()
        .cloned()
        .ok_or(Error::NoPathToDatacenter)?;
    if !fed.knows(dc) {
        return Err(Error::NoPathToDatacenter);
    }
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| Error::TooLarge(format!("Request body too large or unreadable: {e}")))?;
    send_parts(s, &fed, dc, parts, body).await
}

/// A write of what a secondary replicates from the primary goes to the
/// primary (with the caller's token, judged there), `?dc=` dropped; any
/// other request comes back to be answered here. A token marked `Local`
/// (its create body, or the stored token an update, delete or clone names)
/// stays here. Only a secondary sends, and only to its primary, which never
/// sends such a write on: no request travels more than two hops (a `?dc=`
/// from a third datacenter, then this).
async fn to_primary(s: &App, req: Request) -> Result<std::result::Result<Response, Request>> {
    let Some(fed) = req.extensions().get::<Arc<Federation>>().cloned() else {
        return Ok(Err(req));
    };
    if !fed.is_secondary() || !replicated_write(req.method(), req.uri().path()) {
        return Ok(Err(req));
    }
    let (mut parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| Error::TooLarge(format!("Request body too large or unreadable: {e}")))?;
    if stays_local(
        s,
        &parts.headers,
        parts.uri.path(),
        parts.uri.query(),
        &body,
    ) {
        return Ok(Err(Request::from_parts(parts, Body::from(body))));
    }
    parts.uri = without_dc(&parts.uri)?;
    send_parts(s, &fed, fed.primary(), parts, body)
        .await
        .map(Ok)
}

/// The writes of objects the primary owns: ACL policies, roles and tokens
/// (and the bootstrap), auth methods and binding rules, config entries,
/// intentions; and logins and logouts, whose tokens may be global.
fn replicated_write(method: &Method, path: &str) -> bool {
    if matches!(*method, Method::GET | Method::HEAD) {
        return false;
    }
    path == "/v1/acl/bootstrap"
        || path == "/v1/acl/login"
        || path == "/v1/acl/logout"
        || path.starts_with("/v1/acl/oidc/")
        || path == "/v1/acl/auth-method"
        || path.starts_with("/v1/acl/auth-method/")
        || path == "/v1/acl/binding-rule"
        || path.starts_with("/v1/acl/binding-rule/")
        || path == "/v1/acl/token"
        || path.starts_with("/v1/acl/token/")
        || path == "/v1/acl/policy"
        || path.starts_with("/v1/acl/policy/")
        || path == "/v1/acl/role"
        || path.starts_with("/v1/acl/role/")
        || path == "/v1/config"
        || path.starts_with("/v1/config/")
        || path.starts_with("/v1/connect/intentions")
}

/// A token write that is this datacenter's own: a create with `Local: true`,
/// or an update, delete or clone of a local token stored here; a login
/// (or an OIDC step) through a method of local tokens (or one unknown
/// here: refused here),
/// a logout of a local token (or of none).
fn stays_local(
    s: &App, headers: &axum::http::HeaderMap, path: &str, query: Option<&str>, body: &[u8],
) -> bool {
    if path == "/v1/acl/login" || path.starts_with("/v1/acl/oidc/") {
        // Each of these bodies names its method as `AuthMethod`.
        let Ok(b) = crate::request::decode_json::<crate::structs::auth::LoginBody>(body) else {
            return true;
        };
        return s
            .state()
            .acl_auth_methods
            .get(&b.auth_method)
            .is_none_or(|m| !m.global());
    }
    if path == "/v1/acl/logout" {
        let Some(secret) = crate::request::authz::token_of(headers, query) else {
            return true;
        };
        let hash = crate::structs::acl::secret_hash(&secret);
        return crate::state::acl::token_by_secret_hash(&s.state(), &hash).is_none_or(|t| t.local);
    }
    if path == "/v1/acl/token" {
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Local {
            #[serde(rename = "Local")]
            local: bool,
        }
        // A body that does not decode is refused here, by the handler.
        return match crate::request::decode_json::<Local>(body) {
            Ok(b) => b.local,
            Err(_) => true,
        };
    }
    let Some(rest) = path.strip_prefix("/v1/acl/token/") else {
        return false;
    };
    let accessor = rest.strip_suffix("/clone").unwrap_or(rest);
    s.state().acl_tokens.get(accessor).is_some_and(|t| t.local)
}

/// `uri` without its `dc` parameter (the primary answers as its own).
fn without_dc(uri: &axum::http::Uri) -> Result<axum::http::Uri> {
    let mut q = form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        if k != "dc" {
            q.append_pair(&k, &v);
            any = true;
        }
    }
    let pq = if any {
        format!("{}?{}", uri.path(), q.finish())
    } else {
        uri.path().to_string()
    };
    pq.parse().map_err(|e| Error::bad(format!("bad path: {e}")))
}

/// Sends a request's head and body to `dc`, its answer back unchanged.
async fn send_parts(
    s: &App, fed: &Federation, dc: &str, parts: axum::http::request::Parts, body: axum::body::Bytes,
) -> Result<Response> {
    let params = Params::parse(parts.uri.query());
    let timeout = forward_timeout(&parts.method, parts.uri.path(), &params);
    // A place among the requests in flight there, a blocking read within
    // its caller's share (the token, judged there, by its hash; none: the
    // client's IP).
    let secret = crate::request::authz::token_of(&parts.headers, parts.uri.query());
    let ip = parts
        .extensions
        .get::<crate::request::serve::ClientIp>()
        .map(|c| c.0);
    let blocking = params
        .get("index")
        .is_some_and(|i| i.parse::<u64>().is_ok_and(|i| i > 0));
    let _place = fed.forward_place(
        dc,
        crate::request::serve::Caller::of_secret(secret.as_deref(), ip),
        blocking,
    )?;
    let headers = SENT_HEADERS
        .iter()
        .filter_map(|name| {
            let v = parts.headers.get(*name)?.to_str().ok()?;
            Some((name.to_string(), v.to_string()))
        })
        .collect();
    let wan = WanRequest {
        from: s.datacenter().to_owned(),
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into()),
        headers,
        body: body.to_vec(),
    };
    let r = fed.forward(dc, wan, timeout).await?;
    response_of(r)
}

/// Another datacenter's answer, rebuilt here: its status, its body, its
/// `X-Consul-*` headers and a content type chosen from the few the API
/// answers with; none of its other headers (no cookie, no redirect, no
/// page of its choosing on this server's origin), and a sandbox for a
/// browser that opens it.
fn response_of(r: WanResponse) -> Result<Response> {
    let mut out = Response::builder()
        .status(StatusCode::from_u16(r.status).map_err(|e| Error::Internal(e.to_string()))?);
    let mut content_type = "application/octet-stream";
    for (k, v) in r.headers {
        let k = k.to_ascii_lowercase();
        if k == "content-type" {
            content_type = forwarded_content_type(&v);
        } else if k.starts_with("x-consul-")
            && let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v))
        {
            out = out.header(k, v);
        }
    }
    out.header(axum::http::header::CONTENT_TYPE, content_type)
        .header(axum::http::header::CONTENT_SECURITY_POLICY, "sandbox")
        .body(Body::from(r.body))
        .map_err(|e| Error::Internal(e.to_string()))
}

/// The content type this server gives a forwarded answer: the API's own
/// (JSON, plain text), else bytes.
fn forwarded_content_type(claimed: &str) -> &'static str {
    let essence = claimed.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        "application/json"
    } else if essence.eq_ignore_ascii_case("text/plain") {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    }
}

/// A forwarded request as this server's router takes it: marked as
/// forwarded (an extension: no client can claim it).
pub fn request_of(r: WanRequest) -> Result<Request> {
    let method = Method::from_bytes(r.method.as_bytes()).map_err(|e| Error::bad(e.to_string()))?;
    let mut b = axum::http::Request::builder()
        .method(method)
        .uri(&r.path_and_query);
    for (k, v) in &r.headers {
        if SENT_HEADERS.contains(&k.as_str()) {
            b = b.header(k.as_str(), v.as_str());
        }
    }
    // A replication pull's mark is the sending server's (a client's
    // request is never sent on with it): an extension, never a header.
    if r.headers
        .iter()
        .any(|(k, _)| k == crate::structs::replication::REPLICATION_HEADER)
    {
        b = b.extension(ReplicationPull);
    }
    b = b.extension(Forwarded { from: r.from });
    b.body(Body::from(r.body))
        .map_err(|e| Error::bad(e.to_string()))
}

/// An answer to send back: every header but those of the hop.
pub async fn answer_of(resp: Response) -> WanResponse {
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "date"
            )
        })
        .filter_map(|(k, v)| Some((k.to_string(), v.to_str().ok()?.to_string())))
        .collect();
    // The frame cap bounds it further (`raft::network`); past this the
    // answer could never be sent.
    match axum::body::to_bytes(resp.into_body(), crate::raft::network::MAX_FRAME).await {
        Ok(body) => WanResponse {
            status,
            headers,
            body: body.to_vec(),
        },
        Err(e) => WanResponse {
            status: 413,
            headers: Vec::new(),
            body: format!("answer too large for another datacenter: {e}").into_bytes(),
        },
    }
}

pub fn routes() -> axum::Router<App> {
    use crate::request::NamedRoutes;
    axum::Router::new()
        .route(
            "/v1/internal/federation-states",
            axum::routing::get(federation_states),
        )
        .named(
            "/v1/internal/federation-state/",
            "Missing datacenter name",
            axum::routing::get(federation_state),
        )
}

/// `GET /v1/internal/federation-state/:dc`: one datacenter's federation
/// state, blocking on them, `operator:read`; 404 with no body when the
/// primary knows no such datacenter. Consul's shape: the state under
/// `State`, beside its RPC reply's query meta.
async fn federation_state(
    State(s): State<App>, mut a: crate::request::authz::Authz,
    axum::extract::Path(dc): axum::extract::Path<String>, super::Opts(_, opts): super::Opts,
) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let key = crate::state::keys::FEDERATION;
    let (index, found) = super::blocking(
        &s,
        &opts,
        &mut a,
        super::Watch::Keys(vec![key.clone()]),
        |st, _| (st.index_of([&key]), st.federation.get(&dc).cloned()),
    )
    .await?;
    // One query meta for the headers and the body.
    let meta = crate::endpoint::Answer::at(&s, index, false, ());
    let Some(state) = found else {
        let mut resp = axum::http::StatusCode::NOT_FOUND.into_response();
        resp.headers_mut().extend(super::answer_headers(&meta));
        return Ok(resp);
    };
    let body = serde_json::json!({
        "State": &*state,
        "Index": meta.index,
        // Go's `time.Duration`: nanoseconds.
        "LastContact": meta.last_contact * 1_000_000,
        "KnownLeader": meta.known_leader,
        "ConsistencyLevel": "",
        "NotModified": false,
        "Backend": 0,
        "ResultsFilteredByACLs": false,
    });
    let mut resp = axum::Json(body).into_response();
    resp.headers_mut().extend(super::answer_headers(&meta));
    Ok(resp)
}

/// The federation states of the Raft state (the primary's), blocking on
/// them: `operator:read`, as Consul's.
async fn federation_states(
    State(s): State<App>, mut a: crate::request::authz::Authz, super::Opts(_, opts): super::Opts,
) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let key = crate::state::keys::FEDERATION;
    let (index, list) = super::blocking(
        &s,
        &opts,
        &mut a,
        super::Watch::Keys(vec![key.clone()]),
        |st, _| {
            let list: Vec<_> = st.federation.values().map(|f| (**f).clone()).collect();
            (st.index_of([&key]), list)
        },
    )
    .await?;
    Ok(super::json_at(&s, index, &list))
}

/// Every datacenter this server knows, this one first, then nearest first.
pub async fn datacenters(
    State(s): State<App>, fed: Option<axum::Extension<Arc<Federation>>>,
) -> Response {
    let list = match fed {
        Some(f) => f.datacenters(),
        None => vec![s.datacenter().to_owned()],
    };
    axum::Json(list).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_datacenters_answer_is_rebuilt_here() {
        let r = response_of(WanResponse {
            status: 200,
            headers: vec![
                ("Content-Type".into(), "text/html; charset=utf-8".into()),
                ("Set-Cookie".into(), "a=b".into()),
                ("Location".into(), "http://evil/".into()),
                ("X-Consul-Index".into(), "42".into()),
                ("X-Consul-KnownLeader".into(), "true".into()),
            ],
            body: b"<script>alert(1)</script>".to_vec(),
        })
        .unwrap();
        let h = r.headers();
        assert_eq!(h["content-type"], "application/octet-stream");
        assert_eq!(h["content-security-policy"], "sandbox");
        assert_eq!(h["x-consul-index"], "42");
        assert_eq!(h["x-consul-knownleader"], "true");
        assert!(h.get("set-cookie").is_none() && h.get("location").is_none());
        assert_eq!(
            forwarded_content_type("application/json"),
            "application/json"
        );
        assert_eq!(
            forwarded_content_type("Text/Plain; charset=x"),
            "text/plain; charset=utf-8"
        );
    }

    #[test]
    fn a_bodys_datacenter_is_read_in_any_case_and_only_as_a_name() {
        let dc = |b: &str| body_dc(b.as_bytes());
        assert_eq!(
            dc(r#"{"Node": "n", "Datacenter": "dc2"}"#).as_deref(),
            Some("dc2")
        );
        assert_eq!(
            dc(r#"{"datacenter": "dc2", "service": {"x": [1, {"y": null}]}}"#).as_deref(),
            Some("dc2")
        );
        // Named nowhere, empty, null: this datacenter's (or `?dc=`).
        for none in [
            r#"{"Node": "n"}"#,
            r#"{"Datacenter": ""}"#,
            r#"{"Datacenter": null}"#,
        ] {
            assert_eq!(dc(none), None, "{none}");
        }
        // Not a name, not an object, not JSON: left to the handler.
        for bad in [r#"{"Datacenter": 7}"#, r#"["dc2"]"#, "{", ""] {
            assert_eq!(dc(bad), None, "{bad}");
        }
    }
}
