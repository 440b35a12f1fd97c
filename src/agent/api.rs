//! The agent's HTTP API: Consul's `/v1/agent/...` endpoints for the node's
//! own services and checks, answered from the local state; every other
//! `/v1/` request is forwarded to a server and its answer streamed back
//! unchanged (Consul agents forward to servers the same way), so clients
//! pointed at the agent work as if it were a server.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Agent;
use super::define;
use super::local::{Source, Tables};
use super::maintenance;
use super::servers::{self, FORWARDED};
use super::sync;
use crate::error::{Error, Result};
use crate::request::authz::{Authz, token_of};
use crate::request::list_filter::{RowFilter, Rows};
use crate::request::{MAX_BODY, NamedRoutes, Params, decode_json, wait_of};
use crate::structs::agent::{CONSUL_VERSION, ENVOY_VERSIONS, VERSION_METADATA};
use crate::structs::{HEALTH_CRITICAL, HEALTH_PASSING, HEALTH_WARNING, HealthStatus};

type App = Arc<Agent>;

/// The service a local service ID belongs to ("" if none).
fn service_name(a: &Agent, id: &str) -> String {
    a.local
        .with(|t| t.live_service(id).map(|s| s.registered.service.clone()))
        .unwrap_or_default()
}

/// `service:read` on the service of the local service `id`.
fn may_read_service(a: &Agent, z: &Authz, id: &str) -> Result<()> {
    let name = service_name(a, id);
    z.require(z.service_read(&name), "service:read", &name)
}

/// `service:write` on the service of the local service `id`.
fn may_write_service(a: &Agent, z: &Authz, id: &str) -> Result<()> {
    let name = service_name(a, id);
    z.require(z.service_write(&name), "service:write", &name)
}

/// A local check is written with `service:write` on its service, or
/// `node:write` on this node for a node check.
fn authorize_check(a: &Agent, z: &Authz, check_id: &str) -> Result<()> {
    let service = a.local.with(|t| {
        t.live_checks()
            .find(|c| c.check.check_id == check_id)
            .map(|c| c.check.service_id.clone())
    });
    match service.filter(|s| !s.is_empty()) {
        Some(id) => may_write_service(a, z, &id),
        None => z.require(z.node_write(&a.config.node), "node:write", &a.config.node),
    }
}

/// The endpoints about this agent's own node, services and checks: served
/// by `cairn agent` and by every server for its own node.
fn local_routes() -> Router<App> {
    // In the order of Consul's agent API docs: services, checks, the node.
    Router::new()
        .route("/v1/agent/services", get(services))
        .named("/v1/agent/service/", "Missing service ID", get(service))
        .named(
            "/v1/agent/health/service/name/",
            "Missing service Name",
            get(health_by_name),
        )
        .named(
            "/v1/agent/health/service/id/",
            "Missing serviceID",
            get(health_by_id),
        )
        .route("/v1/agent/service/register", put(register_service))
        .named(
            "/v1/agent/service/deregister/",
            "Missing service ID",
            put(deregister_service),
        )
        .named(
            "/v1/agent/service/maintenance/",
            "Missing service ID",
            put(service_maintenance),
        )
        .route("/v1/agent/checks", get(checks))
        .route("/v1/agent/check/register", put(register_check))
        .named(
            "/v1/agent/check/deregister/",
            "Missing check ID",
            put(deregister_check),
        )
        .route("/v1/agent/check/{verb}/{*id}", put(ttl))
        .named("/v1/agent/check/update/", "Missing check ID", put(update))
        .route("/v1/agent/maintenance", put(node_maintenance))
        .route("/v1/agent/version", get(version))
        .route("/v1/event/list", get(super::events::list))
        .merge(super::ops::routes())
}

/// `GET /v1/agent/version`, Consul's shape (no ACL, as Consul's): the
/// Consul release whose API cairn follows, cairn's own as metadata.
async fn version() -> Response {
    axum::Json(json!({
        "SHA": "",
        "BuildDate": "",
        "HumanVersion": format!("{CONSUL_VERSION}+{VERSION_METADATA}"),
        "FIPS": "",
    }))
    .into_response()
}

/// What every agent router is wrapped in (as the server's own routes are).
fn layered(routes: Router) -> Router {
    routes
        .layer(middleware::from_fn(
            crate::request::refuse_enterprise_tenancy,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            crate::request::panic_response,
        ))
        .layer(middleware::from_fn(crate::request::trace_request))
}

/// `cairn agent`'s whole HTTP API. Its own endpoints check the caller's
/// token, resolved through the servers (`agent::acl`, before the handler
/// runs); what it forwards is checked by the server that answers (with
/// the caller's token, or its `--acl-token`).
pub fn router(agent: App) -> Router {
    layered(
        local_routes()
            .route("/v1/agent/self", get(agent_self))
            .route("/v1/agent/metrics", get(metrics))
            .route("/v1/agent/metrics/stream", get(metrics_stream))
            .route("/v1/agent/leave", put(leave))
            .route("/v1/agent/join/{*address}", put(super::ops::join))
            .route(
                "/v1/agent/connect/ca/leaf/{*service}",
                get(super::connect::leaf),
            )
            .route_layer(middleware::from_fn_with_state(agent.clone(), resolve_token))
            // Read from views, else forwarded: the server that answers
            // checks the token (`health_view`).
            .route("/v1/health/service/{*name}", get(instances::<false>))
            .route("/v1/health/connect/{*name}", get(instances::<true>))
            // Profiles of this process, never passed on to a server's.
            .route(
                "/debug/{*profile}",
                axum::routing::any(crate::request::no_route),
            )
            .fallback(forward)
            .with_state(agent),
    )
}

/// Resolves the caller's token (none: the agent's `--acl-token`, as
/// Consul's agents default it) before one of the agent's own endpoints
/// runs; its `Authz` extractor takes the answer from the extensions.
async fn resolve_token(State(a): State<App>, mut req: Request, next: Next) -> Response {
    let token = token_of(req.headers(), req.uri().query()).or_else(|| a.default_token());
    match super::acl::authz_of(&a, token).await {
        Ok(authz) => {
            req.extensions_mut().insert(authz);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// A server's agent endpoints, merged into the server's router. The server
/// answers `/v1/agent/self`, `/metrics` and `/members` itself (with this
/// agent's part in them); there is no `leave`: a server leaves the cluster
/// through `operator raft remove-peer`.
pub fn server_routes(agent: App) -> Router {
    layered(local_routes().with_state(agent))
}

fn ok() -> Response {
    StatusCode::OK.into_response()
}

/// Consul's `/v1/agent/self` `Config` block: what clients read to learn
/// where they are (`Server` tells a client agent from a server).
/// `SessionTTLMin` in nanoseconds is the old place Patroni still reads.
pub fn self_config(a: &Agent) -> Value {
    let dc = a.datacenter();
    json!({
        "Datacenter": dc,
        "PrimaryDatacenter": a.primary_datacenter(),
        "NodeName": a.config.node,
        "NodeID": a.node_id,
        "Server": a.config.in_server,
        "Revision": "cairn",
        "Version": CONSUL_VERSION,
        "VersionMetadata": VERSION_METADATA,
        "SessionTTLMin": SESSION_TTL_MIN.as_nanos() as u64,
    })
}

/// The sections of `/v1/agent/self`'s `Stats` every agent has (`agent`,
/// `build`, `runtime`), as the strings Consul gives them; a server adds
/// `consul` and `raft`.
pub fn stats(a: &Agent) -> Map<String, Value> {
    let (services, checks, ttls, monitors) = a.local.with(|t| {
        let specs = || t.live_checks().filter_map(|c| c.spec.as_ref());
        let ttls = specs().filter(|s| s.is_ttl()).count();
        let monitors = specs().filter(|s| s.is_script()).count();
        (
            t.live_services().count(),
            t.live_checks().count(),
            ttls,
            monitors,
        )
    });
    // Go's names for the platform, which tools compare against.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut m = Map::new();
    m.insert(
        "agent".into(),
        json!({
            "check_monitors": monitors.to_string(),
            "check_ttls": ttls.to_string(),
            "checks": checks.to_string(),
            "services": services.to_string(),
        }),
    );
    m.insert(
        "build".into(),
        json!({
            "prerelease": "",
            "revision": "cairn",
            "version": CONSUL_VERSION,
            "version_metadata": VERSION_METADATA,
        }),
    );
    m.insert(
        "runtime".into(),
        json!({
            "arch": arch,
            "os": std::env::consts::OS,
            "cpu_count": cpus.to_string(),
            "max_procs": cpus.to_string(),
        }),
    );
    m
}

/// Consul's `xDS` block of `/v1/agent/self`: where proxies find the xDS
/// server and which Envoy releases it serves; none (null) where no gRPC
/// port is served (a client agent).
pub fn xds_config(a: &Agent) -> Value {
    let (plain, tls) = (a.config.ports.grpc, a.config.ports.grpc_tls);
    let Some(port) = plain.or(tls) else {
        return Value::Null;
    };
    let port_or_off = |p: Option<u16>| p.map_or(-1, i64::from);
    json!({
        "SupportedProxies": {"envoy": ENVOY_VERSIONS},
        "Port": port,
        "Ports": {"Plaintext": port_or_off(plain), "TLS": port_or_off(tls)},
    })
}

/// Consul's minimum session TTL (its `session_ttl_min` default).
const SESSION_TTL_MIN: Duration = Duration::from_secs(10);

/// Consul's `DebugConfig` block: the running configuration, read by
/// clients for ports and limits (Nomad and `consul connect envoy` take
/// `GRPCPort`/`GRPCTLSPort` for Connect, Patroni `SessionTTLMin`).
/// Durations are Go strings, as Consul writes them; a port that is not
/// served is -1, Consul's "disabled".
pub fn debug_config(a: &Agent) -> Value {
    let port = |p: Option<u16>| p.map_or(-1, i64::from);
    let dc = a.datacenter();
    let ttl_min = crate::structs::duration::Duration(SESSION_TTL_MIN.as_nanos() as i64);
    json!({
        "Datacenter": dc,
        "PrimaryDatacenter": a.primary_datacenter(),
        "NodeName": a.config.node,
        "NodeID": a.node_id,
        "ServerMode": a.config.in_server,
        "Revision": "cairn",
        "Version": CONSUL_VERSION,
        "VersionMetadata": VERSION_METADATA,
        "ClientAddrs": [a.config.http_addr.ip().to_string()],
        // With HTTP off, `http_addr` is the HTTPS listener's.
        "HTTPPort": if a.config.tls.as_ref().is_some_and(|t| t.http_off) {
            -1
        } else {
            i64::from(a.config.http_addr.port())
        },
        "HTTPSPort": port(a.config.ports.https),
        "GRPCPort": port(a.config.ports.grpc),
        "GRPCTLSPort": port(a.config.ports.grpc_tls),
        "DNSPort": port(a.config.ports.dns),
        "SessionTTLMin": ttl_min.to_string(),
        // A server says whether it enforces ACLs (`http::agent`).
        "ACLsEnabled": false,
        "DataDir": a.config.data_dir.display().to_string(),
    })
}

/// This agent's node meta, as `/v1/agent/self` shows it.
pub fn node_meta(a: &Agent) -> Value {
    json!(a.local.with(|t| t.node.meta.clone()))
}

/// This agent's counters (anti-entropy, heartbeats, forwarding).
pub static COUNTERS: &[&crate::metrics::Counter] = servers::ALL;

/// This agent's gauges (a server adds its own).
pub fn metric_gauges(a: &Agent) -> [(&'static str, &'static str, f64); 4] {
    let (services, checks) = a
        .local
        .with(|t| (t.live_services().count(), t.live_checks().count()));
    [
        (
            "cairn_agent_services",
            "services registered on this agent",
            services as f64,
        ),
        (
            "cairn_agent_checks",
            "checks registered on this agent",
            checks as f64,
        ),
        (
            "cairn_agent_cluster_size",
            "live agents plus servers, as the last heartbeat said",
            a.cluster_size() as f64,
        ),
        (
            "cairn_agent_health_views",
            "health views kept by the streaming backend (one stream each)",
            a.health_views.len() as f64,
        ),
    ]
}

async fn agent_self(State(a): State<App>, z: Authz) -> Result<Response> {
    let node = &a.config.node;
    z.require(z.agent_read(node), "agent:read", node)?;
    let dc = a.datacenter();
    Ok(axum::Json(json!({
        "Config": self_config(&a),
        "DebugConfig": debug_config(&a),
        "Member": crate::structs::agent::Member::node(
            &a.config.node,
            &a.config.http_addr.ip().to_string(),
            a.config.http_addr.port(),
            &dc,
            crate::structs::agent::MEMBER_ALIVE,
        ),
        "Meta": node_meta(&a),
        "xDS": xds_config(&a),
        "Coord": a.coordinate.lock().coordinate(),
        "Stats": client_stats(&a),
    }))
    .into_response())
}

/// A client agent's `Stats`: the common sections and its `consul` one.
fn client_stats(a: &Agent) -> Map<String, Value> {
    let mut m = stats(a);
    m.insert(
        "consul".into(),
        json!({
            "known_servers": a.servers.known().to_string(),
            "server": "false",
        }),
    );
    m
}

async fn metrics(State(a): State<App>, z: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    let node = &a.config.node;
    z.require(z.agent_read(node), "agent:read", node)?;
    Ok(crate::request::metrics_response(
        q.as_deref(),
        servers::ALL,
        &metric_gauges(&a),
    ))
}

async fn metrics_stream(State(a): State<App>, z: Authz) -> Result<Response> {
    let node = &a.config.node;
    z.require(z.agent_read(node), "agent:read", node)?;
    Ok(crate::request::metrics_stream(move || {
        let gauges = metric_gauges(&a);
        crate::metrics::render_json(servers::ALL, &gauges, std::time::SystemTime::now())
    }))
}

async fn leave(State(a): State<App>, z: Authz) -> Result<Response> {
    let node = &a.config.node;
    z.require(z.agent_write(node), "agent:write", node)?;
    a.leave.notify_one();
    Ok(ok())
}

/// A service as `/v1/agent/services` shows it.
fn service_view(t: &Tables, id: &str, dc: &str) -> Option<Map<String, Value>> {
    let s = t.live_service(id)?;
    let Ok(Value::Object(mut m)) = serde_json::to_value(&s.effective) else {
        return None;
    };
    m.remove("CreateIndex");
    m.remove("ModifyIndex");
    // As Consul's (`omitempty` pointers): a plain service has neither.
    for k in ["Connect", "Proxy"] {
        if m.get(k)
            .is_some_and(|v| v.as_object().is_some_and(|o| o.is_empty()))
        {
            m.remove(k);
        }
    }
    m.insert("Datacenter".into(), dc.into());
    Some(m)
}

async fn services(State(a): State<App>, z: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let filter = RowFilter::from_params(&p, Rows::NodeServices)?;
    let dc = a.datacenter();
    let all: Map<String, Value> = a.local.with(|t| {
        t.live_services()
            .filter(|s| z.service_read(&s.registered.service))
            .filter_map(|s| {
                let id = &s.registered.id;
                Some((id.clone(), Value::Object(service_view(t, id, &dc)?)))
            })
            .collect()
    });
    Ok(filtered(all, filter))
}

/// A map answer (`/v1/agent/services`, `/checks`) keeping the values
/// `?filter` lets through.
fn filtered(all: Map<String, Value>, filter: Option<RowFilter>) -> Response {
    let out: Map<String, Value> = all
        .into_iter()
        .filter(|(_, v)| filter.as_ref().is_none_or(|f| f.matches(v)))
        .collect();
    axum::Json(out).into_response()
}

fn content_hash(v: &Map<String, Value>) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(v).unwrap_or_default().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// One service with central config merged, with `ContentHash`; blocks
/// while `?hash=` still matches (Consul's hash-based blocking).
async fn service(
    State(a): State<App>, mut z: Authz, Path(id): Path<String>, RawQuery(q): RawQuery,
) -> Result<Response> {
    may_read_service(&a, &z, &id)?;
    let p = Params::parse(q.as_deref());
    let wait = wait_of(&p)?;
    let want = p.get("hash").filter(|h| !h.is_empty()).map(String::from);
    // A read that may wait holds a place among the blocking queries.
    let _permit = match want {
        Some(_) => Some(a.config.blocking.permit()?),
        None => None,
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let mut changes = a.local.version.subscribe();
        let dc = a.datacenter();
        let view = a
            .local
            .with(|t| service_view(t, &id, &dc))
            .ok_or_else(|| Error::NotFound(format!("unknown service ID: {id}")))?;
        let hash = content_hash(&view);
        let expired = tokio::time::Instant::now() >= deadline;
        if want.as_deref() != Some(hash.as_str()) || expired {
            let mut view = view;
            view.insert("ContentHash".into(), hash.clone().into());
            let mut resp = axum::Json(view).into_response();
            if let Ok(h) = HeaderValue::from_str(&hash) {
                resp.headers_mut().insert("x-consul-contenthash", h);
            }
            return Ok(resp);
        }
        let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
        // As Consul, the token is resolved again each round (within the
        // cache's TTL): one deleted or narrowed while this waited gets no
        // more answers.
        z = super::acl::authz_of(&a, z.token().map(str::to_string)).await?;
        may_read_service(&a, &z, &id)?;
    }
}

/// A service's aggregated local health, as `/v1/agent/health/service/...`
/// shows it: the worst of its checks (passing when it has none).
fn health_entry(t: &Tables, id: &str, dc: &str) -> Option<(HealthStatus, Value)> {
    let service = service_view(t, id, dc)?;
    let checks: Vec<crate::structs::HealthCheck> = t
        .live_checks()
        .filter(|c| c.check.service_id == id)
        .map(|c| t.expected_check(&c.check))
        .collect();
    let status = checks.iter().fold(HEALTH_PASSING, |w, c| w.worse(c.status));
    let entry = json!({"AggregatedStatus": status, "Service": service, "Checks": checks});
    Some((status, entry))
}

/// Consul's codes for an aggregated status: 200 passing, 429 warning, 503
/// critical; the body is the JSON, or the status alone with `?format=text`
/// or `Accept: text/plain`.
fn health_response(p: &Params, headers: &HeaderMap, status: HealthStatus, body: Value) -> Response {
    let code = match status {
        HealthStatus::Passing => StatusCode::OK,
        HealthStatus::Warning => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let text = p.get("format") == Some("text")
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/plain"));
    if text {
        (code, status.to_string()).into_response()
    } else {
        (code, axum::Json(body)).into_response()
    }
}

async fn health_by_id(
    State(a): State<App>, z: Authz, Path(id): Path<String>, RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    may_read_service(&a, &z, &id)?;
    let p = Params::parse(q.as_deref());
    let dc = a.datacenter();
    let (status, entry) = a
        .local
        .with(|t| health_entry(t, &id, &dc))
        .ok_or_else(|| Error::NotFound(format!("ServiceId {id} not found")))?;
    Ok(health_response(&p, &headers, status, entry))
}

/// Every instance of the service on this agent, and the worst status.
async fn health_by_name(
    State(a): State<App>, z: Authz, Path(name): Path<String>, RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    z.require(z.service_read(&name), "service:read", &name)?;
    let p = Params::parse(q.as_deref());
    let dc = a.datacenter();
    let entries: Vec<(HealthStatus, Value)> = a.local.with(|t| {
        t.live_services()
            .filter(|s| s.registered.service == name)
            .filter_map(|s| health_entry(t, &s.registered.id, &dc))
            .collect()
    });
    if entries.is_empty() {
        return Err(Error::NotFound(format!("ServiceName {name} Not Found")));
    }
    let status = entries.iter().fold(HEALTH_PASSING, |w, (s, _)| w.worse(*s));
    let body = Value::Array(entries.into_iter().map(|(_, e)| e).collect());
    Ok(health_response(&p, &headers, status, body))
}

async fn checks(State(a): State<App>, z: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let filter = RowFilter::from_params(&p, Rows::Checks)?;
    let all: Map<String, Value> = a.local.with(|t| {
        t.live_checks()
            .filter(|c| {
                if c.check.service_name.is_empty() {
                    z.node_read(&a.config.node)
                } else {
                    z.service_read(&c.check.service_name)
                }
            })
            .filter_map(|c| {
                let v = serde_json::to_value(t.expected_check(&c.check)).ok()?;
                Some((c.check.check_id.clone(), v))
            })
            .collect()
    });
    Ok(filtered(all, filter))
}

async fn register_service(
    State(a): State<App>, z: Authz, RawQuery(q): RawQuery, body: Bytes,
) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let def = define::service(decode_json(&body)?, &a.config.node)?;
    // Checked here, with the caller's token: the agent syncs the catalog
    // with its own. Every instance the definition creates (the service,
    // its sidecar) by the catalog's rule, over what it replaces locally.
    let sidecar = def.sidecar.as_ref().map(|sc| &sc.service);
    for svc in std::iter::once(&def.service).chain(sidecar) {
        let replaced = a.local.with(|t| {
            t.live_service(&svc.id)
                .map(|s| s.registered.service.clone())
        });
        svc.authorize_write(&z, replaced.as_deref())?;
    }
    let replace = p.flag("replace-existing-checks");
    a.register_service(def, Source::Api, replace).await?;
    sync::pushed(&a).await;
    Ok(ok())
}

async fn deregister_service(
    State(a): State<App>, z: Authz, Path(id): Path<String>,
) -> Result<Response> {
    may_write_service(&a, &z, &id)?;
    a.deregister_service(&id).await?;
    sync::pushed(&a).await;
    Ok(ok())
}

async fn register_check(State(a): State<App>, z: Authz, body: Bytes) -> Result<Response> {
    let check = define::check(decode_json(&body)?)?;
    if check.0.service_id.is_empty() {
        z.require(z.node_write(&a.config.node), "node:write", &a.config.node)?;
    } else {
        may_write_service(&a, &z, &check.0.service_id)?;
    }
    a.register_check(check, Source::Api).await?;
    sync::pushed(&a).await;
    Ok(ok())
}

async fn deregister_check(
    State(a): State<App>, z: Authz, Path(id): Path<String>,
) -> Result<Response> {
    authorize_check(&a, &z, &id)?;
    a.deregister_check(&id).await?;
    sync::pushed(&a).await;
    Ok(ok())
}

/// `PUT /v1/agent/check/pass|warn|fail/:id?note=`.
async fn ttl(
    State(a): State<App>, z: Authz, Path((verb, id)): Path<(String, String)>, RawQuery(q): RawQuery,
) -> Result<Response> {
    authorize_check(&a, &z, &id)?;
    let status = match verb.as_str() {
        "pass" => HEALTH_PASSING,
        "warn" => HEALTH_WARNING,
        "fail" => HEALTH_CRITICAL,
        _ => {
            return Err(Error::NotFound(format!(
                "no such path: /v1/agent/check/{verb}"
            )));
        }
    };
    let p = Params::parse(q.as_deref());
    a.update_ttl(&id, status, p.get("note").unwrap_or(""))
        .await?;
    sync::pushed(&a).await;
    Ok(ok())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CheckUpdate {
    #[serde(default)]
    status: String,
    #[serde(default)]
    output: String,
}

async fn update(
    State(a): State<App>, z: Authz, Path(id): Path<String>, body: Bytes,
) -> Result<Response> {
    authorize_check(&a, &z, &id)?;
    let u: CheckUpdate = decode_json(&body)?;
    let status = HealthStatus::settable(&u.status).map_err(|e| {
        Error::bad(format!(
            "Invalid status {:?}: must be passing, warning or critical",
            e.0
        ))
    })?;
    a.update_ttl(&id, status, &u.output).await?;
    sync::pushed(&a).await;
    Ok(ok())
}

/// `PUT /v1/agent/maintenance?enable=&reason=`.
async fn node_maintenance(
    State(a): State<App>, z: Authz, RawQuery(q): RawQuery,
) -> Result<Response> {
    z.require(z.node_write(&a.config.node), "node:write", &a.config.node)?;
    let p = Params::parse(q.as_deref());
    let enable = maintenance::parse_enable(p.get("enable"))?;
    a.node_maintenance(enable, p.get("reason").unwrap_or(""))
        .await?;
    sync::pushed(&a).await;
    Ok(ok())
}

/// `PUT /v1/agent/service/maintenance/:id?enable=&reason=`.
async fn service_maintenance(
    State(a): State<App>, z: Authz, Path(id): Path<String>, RawQuery(q): RawQuery,
) -> Result<Response> {
    may_write_service(&a, &z, &id)?;
    let p = Params::parse(q.as_deref());
    let enable = maintenance::parse_enable(p.get("enable"))?;
    a.service_maintenance(&id, enable, p.get("reason").unwrap_or(""))
        .await?;
    sync::pushed(&a).await;
    Ok(ok())
}

/// Who a forwarded request acts as: the token it carries in a header
/// (moved to `X-Consul-Token`), else in `?token=` (left in the path), else
/// the agent's `--acl-token`.
fn forwarded_identity(
    a: &Agent, parts: &axum::http::request::Parts, path: &str,
) -> (String, Option<String>) {
    let in_query = crate::request::Params::parse(parts.uri.query()).has("token");
    let token = crate::request::authz::token_of(&parts.headers, None);
    match token {
        Some(t) => (path.to_string(), Some(t)),
        None if in_query => (path.to_string(), None),
        None => (path.to_string(), a.default_token()),
    }
}

/// `?near=_agent` means this agent's node, not the server's that answers:
/// named before the request goes on.
fn near_this_agent(path: &str, node: &str) -> String {
    let Some((route, query)) = path.split_once('?') else {
        return path.to_string();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|kv| match kv {
            "near=_agent" => format!("near={}", crate::request::enc(node)),
            other => other.to_string(),
        })
        .collect();
    format!("{route}?{}", query.join("&"))
}

/// `GET /v1/health/service/:s` (`CONNECT` false) and
/// `/v1/health/connect/:s` (true) on a client agent: from a view when it
/// can, else forwarded.
pub(super) async fn instances<const CONNECT: bool>(
    State(a): State<App>, Path(name): Path<String>, req: Request,
) -> Response {
    // Read off the request first: its body is not `Sync`, so the request
    // is not held across the wait.
    let query = req.uri().query().map(String::from);
    let token = token_of(req.headers(), query.as_deref()).or_else(|| a.default_token());
    match super::health_view::from_view(&a, CONNECT, &name, query.as_deref(), token).await {
        Some(Ok(resp)) => resp,
        Some(Err(e)) => e.into_response(),
        None => forward(State(a), req).await,
    }
}

/// Any other request: to a server, and its answer back as it streams.
pub(super) async fn forward(State(a): State<App>, req: Request) -> Response {
    match forward_inner(&a, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn forward_inner(a: &Agent, req: Request) -> Result<Response> {
    let (parts, body) = req.into_parts();
    let p = parts.uri.path();
    // `/v1/agent/...` is about this agent: only the member list (the
    // servers know every member) is a server's to answer.
    if !p.starts_with("/v1/") || (p.starts_with("/v1/agent/") && p != "/v1/agent/members") {
        return Err(Error::NotFound(format!(
            "no such path on a client agent: {p}"
        )));
    }
    FORWARDED.inc();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| Error::bad(format!("Request body too large or unreadable: {e}")))?;
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = if parts.method == Method::PUT && parts.uri.path() == "/v1/session/create" {
        session_on_this_node(&body, &a.config.node)?
    } else {
        body
    };
    let body = (!body.is_empty() || ct.is_some()).then_some((body, ct));
    let path = &near_this_agent(path, &a.config.node);
    // The caller's token (any carrier; `?token=` travels in the path), or
    // this agent's default token for a request that carries none.
    let (path, token) = forwarded_identity(a, &parts, path);
    let resp = a
        .servers
        .send_as(
            parts.method.clone(),
            &path,
            body,
            crate::request::forward_timeout(
                &parts.method,
                parts.uri.path(),
                &Params::parse(parts.uri.query()),
            ),
            token.as_deref(),
        )
        .await?;
    let mut builder = Response::builder().status(resp.status().as_u16());
    for (k, v) in resp.headers() {
        let name = k.as_str();
        if !matches!(
            name,
            "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "date"
        ) {
            builder = builder.header(name, v.as_bytes());
        }
    }
    // Streamed: `/v1/internal/stream` answers for as long as it is read.
    let stream = futures_util::stream::unfold(Some(resp), |resp| async move {
        let mut resp = resp?;
        match resp.chunk().await {
            Ok(Some(bytes)) => Some((Ok::<Bytes, std::io::Error>(bytes), Some(resp))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    });
    builder
        .body(Body::from_stream(stream))
        .map_err(|e| Error::Internal(e.to_string()))
}

/// A session created through an agent belongs to the agent's node unless the
/// body names another, as Consul's agent fills in its own `NodeName`; the
/// server would otherwise take its own node.
fn session_on_this_node(body: &Bytes, node: &str) -> Result<Bytes> {
    let mut v: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        decode_json(body)?
    };
    let Some(obj) = v.as_object_mut() else {
        return Ok(body.clone());
    };
    let named = obj
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("node") && v.as_str().is_some_and(|n| !n.is_empty()));
    if !named {
        obj.retain(|k, _| !k.eq_ignore_ascii_case("node"));
        obj.insert("Node".into(), node.into());
    }
    Ok(Bytes::from(
        serde_json::to_vec(&v).expect("JSON value serializes"),
    ))
}
