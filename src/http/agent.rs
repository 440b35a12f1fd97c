//! The server's own `/v1/agent` views: itself, the cluster's members and its
//! metrics (the endpoints about its node's services and checks are the
//! agent's, `agent::api::server_routes`).

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::{App, json_filtered, keep};
use crate::error::Result;
use crate::request::authz::Authz;
use crate::structs::agent::Member;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/agent/self", get(agent_self))
        .route("/v1/agent/members", get(members))
        .route("/v1/agent/metrics", get(metrics))
        .route("/v1/agent/metrics/stream", get(metrics_stream))
}

fn member_json(s: &App, name: &str, addr: &str) -> Member {
    let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "8301"));
    Member::server(name, host, port, s.datacenter())
}

async fn agent_self(
    State(s): State<App>, a: Authz,
    fed: Option<axum::Extension<std::sync::Arc<crate::federation::Federation>>>,
) -> Result<Response> {
    a.require(a.agent_read(s.node_name()), "agent:read", s.node_name())?;
    // The server's own agent (absent only while starting, and in the
    // simulation) owns the node's identity and configuration.
    let agent = s.agent();
    let config = match agent {
        Some(a) => crate::agent::api::self_config(a),
        None => json!({
            "Datacenter": s.datacenter(),
            "PrimaryDatacenter": s.config().primary(),
            "NodeName": s.node_name(),
            "NodeID": format!("{:016x}", s.cluster().id),
            "Server": true,
            "Revision": "cairn",
            "Version": crate::structs::agent::CONSUL_VERSION,
            "VersionMetadata": crate::structs::agent::VERSION_METADATA,
        }),
    };
    let mut debug = agent.map(|a| crate::agent::api::debug_config(a));
    if let Some(d) = debug.as_mut() {
        // Whether this server enforces ACLs (a client agent has no say).
        d["ACLsEnabled"] = json!(s.acl().enabled());
    }
    Ok(axum::Json(json!({
        "Config": config,
        "DebugConfig": debug,
        "Member": member_json(&s, s.node_name(), &s.config().advertised_raft().to_string()),
        "Meta": agent.map(|a| crate::agent::api::node_meta(a)),
        "xDS": agent.map(|a| crate::agent::api::xds_config(a)),
        "Coord": s.coordinate().lock().coordinate(),
        "Stats": server_stats(&s, agent.map(|a| &**a), fed.as_deref().map(|f| &**f)),
    }))
    .into_response())
}

/// A server's `Stats`: its agent's sections (when it has one), `consul`
/// and `raft`, as the strings Consul gives them.
fn server_stats(
    s: &App, agent: Option<&crate::agent::Agent>, fed: Option<&crate::federation::Federation>,
) -> serde_json::Map<String, serde_json::Value> {
    let m = s.cluster().metrics();
    let mut stats = agent.map(crate::agent::api::stats).unwrap_or_default();
    let known = fed.map_or(1, |f| f.datacenters().len().max(1));
    let leader = s
        .cluster()
        .leader()
        .map(|(_, n)| n.raft_addr)
        .unwrap_or_default();
    stats.insert(
        "consul".into(),
        json!({
            "acl": if s.acl().enabled() { "enabled" } else { "disabled" },
            "bootstrap": (s.config().bootstrap_expect == 1).to_string(),
            "known_datacenters": known.to_string(),
            "leader": s.cluster().is_leader().to_string(),
            "leader_addr": leader,
            "server": "true",
        }),
    );
    stats.insert(
        "raft".into(),
        json!({
            "state": format!("{:?}", m.state),
            "term": m.current_term.to_string(),
            "last_log_index": m.last_log_index.unwrap_or(0).to_string(),
            "applied_index": m.last_applied.map(|l| l.index).unwrap_or(0).to_string(),
            "num_peers": s.cluster().members().len().saturating_sub(1).to_string(),
        }),
    );
    stats
}

async fn members(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery,
    fed: Option<axum::Extension<std::sync::Arc<crate::federation::Federation>>>,
) -> Response {
    if crate::request::Params::parse(q.as_deref()).has("wan") {
        return wan_members(&s, &a, fed.as_deref().map(|f| &**f));
    }
    let servers = super::liveness::server_names(&s);
    let mut list: Vec<Member> = s
        .cluster()
        .members()
        .into_iter()
        .map(|(_, n, _)| member_json(&s, &n.name, &n.raft_addr))
        .collect();
    list.extend(super::liveness::agent_members(
        &s.state(),
        s.datacenter(),
        &servers,
    ));
    let filtered = keep(&mut list, |m| a.node_read(&m.name));
    json_filtered(&s, s.state().index, &list, filtered)
}

/// `?wan`: the servers of every datacenter (Consul's WAN pool), this
/// one's included; filtered by `node:read` on each server's node.
fn wan_members(s: &App, a: &Authz, fed: Option<&crate::federation::Federation>) -> Response {
    let rows = match fed {
        Some(f) => f.members(),
        None => Vec::new(),
    };
    let mut list: Vec<(String, Member)> = rows
        .into_iter()
        .map(|m| {
            let (host, port) = m
                .raft_addr
                .rsplit_once(':')
                .unwrap_or((&m.raft_addr, "8300"));
            let row = Member::wan_server(&m.name, host, port, &m.datacenter, m.alive);
            (m.name, row)
        })
        .collect();
    let filtered = keep(&mut list, |(node, _)| a.node_read(node));
    let list: Vec<Member> = list.into_iter().map(|(_, m)| m).collect();
    json_filtered(s, s.state().index, &list, filtered)
}

type Fed = Option<axum::Extension<std::sync::Arc<crate::federation::Federation>>>;

async fn metrics(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery, fed: Fed,
) -> Result<Response> {
    a.require(a.agent_read(s.node_name()), "agent:read", s.node_name())?;
    let (counters, gauges) = metric_set(&s, fed.as_deref().map(|f| &**f));
    Ok(crate::request::metrics_response(
        q.as_deref(),
        &counters,
        &gauges,
    ))
}

/// `GET /v1/agent/metrics/stream` (agent:read): the JSON summary of
/// `/v1/agent/metrics`, one per line, now and at the end of every interval.
async fn metrics_stream(State(s): State<App>, a: Authz, fed: Fed) -> Result<Response> {
    a.require(a.agent_read(s.node_name()), "agent:read", s.node_name())?;
    let fed = fed.map(|f| f.0);
    Ok(crate::request::metrics_stream(move || {
        let (counters, gauges) = metric_set(&s, fed.as_deref());
        crate::metrics::render_json(&counters, &gauges, std::time::SystemTime::now())
    }))
}

/// What this server counts and gauges, its own agent's included.
fn metric_set(
    s: &App, fed: Option<&crate::federation::Federation>,
) -> (
    Vec<&'static crate::metrics::Counter>,
    Vec<(&'static str, &'static str, f64)>,
) {
    let m = s.cluster().metrics();
    let st = s.state();
    let gauges = [
        (
            "cairn_raft_term",
            "current Raft term",
            m.current_term as f64,
        ),
        (
            "cairn_raft_last_log_index",
            "last Raft log index",
            m.last_log_index.unwrap_or(0) as f64,
        ),
        (
            "cairn_raft_applied_index",
            "last applied index",
            m.last_applied.map(|l| l.index).unwrap_or(0) as f64,
        ),
        (
            "cairn_raft_last_purged_index",
            "last Raft log index purged (covered by the snapshot)",
            m.purged.as_ref().map(|l| l.index).unwrap_or(0) as f64,
        ),
        (
            "cairn_raft_is_leader",
            "1 on the leader",
            if s.cluster().is_leader() { 1.0 } else { 0.0 },
        ),
        ("cairn_kv_entries", "KV entries", st.kv.len() as f64),
        (
            "cairn_state_tombstones",
            "index entries of deleted objects not yet reaped",
            st.tombstones.len() as f64,
        ),
        (
            "cairn_catalog_nodes",
            "registered nodes",
            st.nodes.len() as f64,
        ),
        (
            "cairn_catalog_services",
            "registered service instances",
            st.services.len() as f64,
        ),
        (
            "cairn_blocking_watch_keys",
            "watch keys with waiting queries",
            s.watches().active() as f64,
        ),
        (
            "cairn_health_views",
            "materialized service health views serving blocking reads",
            s.views().len() as f64,
        ),
        (
            "cairn_proxycfg_proxies",
            "proxies with a server-side proxycfg snapshot",
            s.proxycfg().counts().0 as f64,
        ),
        (
            "cairn_proxycfg_watches",
            "resources watched by proxycfg snapshots",
            s.proxycfg().counts().1 as f64,
        ),
        (
            "cairn_proxycfg_remote_watchers",
            "other datacenters' chain targets followed by proxycfg",
            s.proxycfg().remote_watchers() as f64,
        ),
    ];
    // The server's agent counts and gauges its own work, as on a client.
    let mut all = gauges.to_vec();
    all.extend(super::replication::gauges(fed));
    let mut counters = crate::metrics::ALL.to_vec();
    if let Some(a) = s.agent() {
        all.extend(crate::agent::api::metric_gauges(a));
        counters.extend(crate::agent::api::COUNTERS);
    }
    (counters, all)
}
