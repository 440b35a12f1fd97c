//! `/v1/operator/autopilot`: its configuration (kept in the Raft state)
//! and the servers' health as the leader sees it; `/v1/operator/usage`,
//! what the catalog holds, per datacenter (`/v1/operator/utilization` is
//! Enterprise's, answered as Consul CE answers it).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};

use super::{App, json_at};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::{NamedRoutes, Params, decode_json};
use crate::state::{Command, Response as Applied, keys, operator};
use crate::structs::operator::AutopilotConfig;

pub fn routes() -> Router<App> {
    Router::new()
        .route(
            "/v1/operator/autopilot/configuration",
            get(get_config).put(put_config),
        )
        .route("/v1/operator/autopilot/health", get(health))
        .route("/v1/operator/autopilot/state", get(state))
        .route("/v1/operator/usage", get(usage))
        .route("/v1/operator/utilization", get(utilization))
        .route("/v1/operator/features", get(feature_gates))
        .named(
            "/v1/operator/feature/",
            "feature gate name is required",
            get(feature_gate).put(set_feature_gate),
        )
}

/// `GET /v1/operator/features` (operator:read): Consul's feature gates,
/// which stage a feature in across a cluster's servers. cairn gates none
/// of its features, so the list is empty, and every name is unknown.
async fn feature_gates(State(s): State<App>, a: Authz) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    Ok(json_at(&s, s.state().index, &Vec::<Value>::new()))
}

fn no_feature_gate(name: &str) -> Error {
    Error::NotFound(format!("feature gate {name:?} not found"))
}

/// `GET /v1/operator/feature/:name` (operator:read).
async fn feature_gate(
    a: Authz, axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    Err(no_feature_gate(&name))
}

/// `PUT /v1/operator/feature/:name` (operator:write), `{"Enabled": bool}`.
async fn set_feature_gate(
    a: Authz, axum::extract::Path(name): axum::extract::Path<String>, body: Bytes,
) -> Result<Response> {
    a.require(a.operator_write(), "operator:write", "")?;
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    #[allow(dead_code)] // Decoded to refuse a malformed body first, as Consul does.
    struct Setting {
        enabled: bool,
    }
    let bad = |e: serde_json::Error| Error::bad(format!("error parsing feature gate setting: {e}"));
    crate::request::json::from_value::<Setting>(serde_json::from_slice(&body).map_err(bad)?)
        .map_err(bad)?;
    Err(no_feature_gate(&name))
}

/// `GET /v1/operator/utilization`: Consul Enterprise's license reporting
/// bundle; Consul CE answers this, before any ACL check.
async fn utilization() -> Error {
    Error::NotFound("operator utilization requires Consul Enterprise".into())
}

/// This datacenter's row of `/v1/operator/usage`, in Consul's shape:
/// service names, instances, connect instances by kind, the billable ones
/// (typical instances, the servers' own `consul` left out) and nodes.
fn usage_here(st: &crate::state::State) -> Value {
    use crate::structs::ServiceKind;
    // Every kind Consul lists, at 0 when none runs.
    let mut connect: std::collections::BTreeMap<&str, u64> = [
        ServiceKind::ConnectProxy,
        ServiceKind::MeshGateway,
        ServiceKind::TerminatingGateway,
        ServiceKind::IngressGateway,
        ServiceKind::ApiGateway,
    ]
    .iter()
    .map(|k| (k.as_str(), 0))
    .chain([("connect-native", 0)])
    .collect();
    let mut billable = 0u64;
    for svc in st.services.values() {
        let kind = match svc.kind {
            ServiceKind::Typical => {
                billable += u64::from(svc.service != "consul");
                let native = svc.connect.get("Native").and_then(Value::as_bool) == Some(true);
                native.then_some("connect-native")
            }
            ref k => Some(k.as_str()),
        };
        if let Some(n) = kind.and_then(|k| connect.get_mut(k)) {
            *n += 1;
        }
    }
    json!({
        "Services": st.service_names.len(),
        "ServiceInstances": st.services.len(),
        "ConnectServiceInstances": connect,
        "BillableServiceInstances": billable,
        "Nodes": st.nodes.len(),
    })
}

/// `GET /v1/operator/usage[?global]` (operator:read): this datacenter's
/// usage, and with `?global` every other known datacenter's too, each
/// asked for its own with the caller's token (one that does not answer is
/// left out, as Consul leaves it out).
async fn usage(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery,
    fed: Option<axum::Extension<std::sync::Arc<crate::federation::Federation>>>,
) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let p = Params::parse(q.as_deref());
    let st = s.state();
    let index = st.index_of([&keys::NODES, &keys::SERVICES]);
    let mut all = Map::new();
    all.insert(s.datacenter().to_string(), usage_here(&st));
    if p.flag("global")
        && let Some(fed) = fed
    {
        // Each other datacenter asked at once, for its own row.
        let ask = |dc: String| {
            let req = crate::raft::wan::WanRequest {
                from: s.datacenter().to_string(),
                method: "GET".into(),
                path_and_query: "/v1/operator/usage?stale".into(),
                headers: a
                    .token()
                    .map(|t| ("X-Consul-Token".to_string(), t.to_string()))
                    .into_iter()
                    .collect(),
                body: Vec::new(),
            };
            let fed = fed.clone();
            async move {
                let r = fed
                    .forward(&dc, req, crate::request::RPC_CLIENT_TIMEOUT)
                    .await
                    .ok()
                    .filter(|r| r.status == 200)?;
                let theirs: Value = serde_json::from_slice(&r.body).ok()?;
                let row = theirs["Usage"].get(&dc)?.clone();
                Some((dc, row))
            }
        };
        let others = fed
            .datacenters()
            .into_iter()
            .filter(|dc| dc != s.datacenter())
            .map(ask);
        all.extend(
            futures_util::future::join_all(others)
                .await
                .into_iter()
                .flatten(),
        );
    }
    let known = s.cluster().leader().is_some();
    let body = json!({
        "Usage": all,
        "Index": index,
        "LastContact": 0,
        "KnownLeader": known,
        "ConsistencyLevel": if p.has("stale") { "stale" } else { "leader" },
        "NotModified": false,
        "ResultsFilteredByACLs": false,
    });
    Ok(json_at(&s, index, &body))
}

async fn get_config(State(s): State<App>, a: Authz) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let st = s.state();
    Ok(json_at(
        &s,
        st.index_of([&keys::AUTOPILOT]),
        &operator::autopilot(&st),
    ))
}

/// `PUT ...configuration[?cas=N]`: the whole configuration (omitted keys
/// take Consul's defaults); `true`, or `false` when `cas` no longer
/// matches.
async fn put_config(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery, body: Bytes,
) -> Result<Response> {
    a.require(a.operator_write(), "operator:write", "")?;
    let p = Params::parse(q.as_deref());
    let cas = match p.get("cas") {
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| Error::bad(format!("Invalid cas index {v:?}")))?,
        ),
        None => None,
    };
    let config: AutopilotConfig = decode_json(&body)?;
    for (name, d) in [
        ("LastContactThreshold", config.last_contact_threshold),
        ("ServerStabilizationTime", config.server_stabilization_time),
    ] {
        if d.nanos() < 0 {
            return Err(Error::bad(format!("{name} must not be negative")));
        }
    }
    match s.write(Command::AutopilotSet { config, cas }).await? {
        Applied::Bool(b) => Ok(axum::Json(b).into_response()),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// Consul answers 429 while any server is unhealthy, so a load balancer's
/// check can read the status alone.
async fn health(State(s): State<App>, a: Authz) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let config = operator::autopilot(&s.state());
    let h = s.cluster().health(&config);
    let status = if h.healthy {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    Ok((status, axum::Json(h)).into_response())
}

/// `/v1/operator/autopilot/state`: Consul's newer view of the same, by
/// server ID, with each one's role.
async fn state(State(s): State<App>, a: Authz) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let config = operator::autopilot(&s.state());
    let h = s.cluster().health(&config);
    let mut servers = Map::new();
    let mut voters = Vec::new();
    let mut leader = String::new();
    for sv in &h.servers {
        let status = match (sv.leader, sv.voter) {
            (true, _) => "leader",
            (false, true) => "voter",
            (false, false) => "non-voter",
        };
        if sv.leader {
            leader = sv.id.clone();
        }
        if sv.voter {
            voters.push(sv.id.clone());
        }
        servers.insert(
            sv.id.clone(),
            json!({
                "ID": sv.id,
                "NodeName": sv.name,
                "Address": sv.address,
                "NodeStatus": sv.serf_status,
                "Version": sv.version,
                "LastContact": sv.last_contact,
                "LastTerm": sv.last_term,
                "LastIndex": sv.last_index,
                "Healthy": sv.healthy,
                "StableSince": sv.stable_since,
                "ReadReplica": false,
                "Status": status,
                "Meta": {},
                "NodeType": if sv.voter { "voter" } else { "learner" },
            }),
        );
    }
    let optimistic = h
        .servers
        .iter()
        .filter(|s| s.voter && s.serf_status == "alive")
        .count()
        .saturating_sub(voters.len() / 2 + 1);
    Ok(axum::Json(json!({
        "Healthy": h.healthy,
        "FailureTolerance": h.failure_tolerance,
        "OptimisticFailureTolerance": optimistic,
        "Servers": Value::Object(servers),
        "Leader": leader,
        "Voters": voters,
    }))
    .into_response())
}
