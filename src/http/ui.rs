//! Consul's `/v1/internal/ui/*` endpoints, the reads its web UI (and
//! cairn's, `ui/`) is built on: services summarized with their health,
//! nodes with their services and checks, a catalog overview, a service's
//! topology with the intention decision of each edge, a gateway's services
//! and the intentions into them.
//!
//! Every one is a blocking read on the catalog's watch keys, and filtered
//! by the caller's token as the catalog and health reads are: a service
//! without `service:read`, a node without `node:read` is left out (and the
//! answer marked filtered). The static assets are `request::ui`'s.
//!
//! A topology's upstreams and downstreams come from proxy registrations,
//! each edge with `connect::intentions`' decision; a gateway's services
//! from its entry's links (`state::gateways`). With ACLs off every caller
//! sees the same services summary, so it is encoded once per catalog index
//! and shared by every read at that index (`Server::ui_services`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use serde_json::Value;

use super::{App, Opts, Watch, blocking, json_filtered, meta_headers};
use crate::connect::intentions;
use crate::discovery_chain::EntryLookup;
use crate::error::{Error, Result};
use crate::request::NamedRoutes;
use crate::request::authz::Authz;
use crate::state::catalog::{Instance, instance_of, node_checks, node_services};
use crate::state::{self, keys};
use crate::structs::config_entry::Kind;
use crate::structs::{HealthCheck, HealthStatus, Node, NodeService, ServiceKind};

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/internal/ui/services", get(services))
        .route("/v1/internal/ui/nodes", get(nodes))
        .named("/v1/internal/ui/node/", "Missing node name", get(node))
        .route("/v1/internal/ui/catalog-overview", get(overview))
        .named(
            "/v1/internal/ui/service-topology/",
            "Missing service name",
            get(topology),
        )
        .named(
            "/v1/internal/ui/gateway-services-nodes/",
            "Missing gateway name",
            get(gateway_services),
        )
        .named(
            "/v1/internal/ui/gateway-intentions/",
            "Missing gateway name",
            get(gateway_intentions),
        )
}

/// What every summary depends on: instances, their checks, their nodes.
fn catalog_keys() -> Vec<state::WatchKey> {
    vec![keys::SERVICES, keys::CHECKS, keys::NODES]
}

/// Consul's `ServiceSummary`: one service's instances at a glance.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Summary {
    #[serde(skip_serializing_if = "str::is_empty")]
    kind: String,
    name: String,
    datacenter: String,
    tags: Vec<String>,
    nodes: Vec<String>,
    external_sources: Vec<String>,
    instance_count: usize,
    checks_passing: usize,
    checks_warning: usize,
    checks_critical: usize,
    gateway_config: BTreeMap<String, Value>,
    transparent_proxy: bool,
    connect_native: bool,
    connected_with_proxy: bool,
    connected_with_gateway: bool,
    #[serde(skip)]
    tag_set: BTreeSet<String>,
    #[serde(skip)]
    node_set: BTreeSet<String>,
    #[serde(skip)]
    source_set: BTreeSet<String>,
}

impl Summary {
    fn add(&mut self, i: &Instance) {
        let mut counts = CheckCounts::default();
        i.checks.iter().for_each(|c| counts.count(c.status));
        self.add_parts(&i.node.node, &i.service, counts);
    }

    /// One instance: its node's name, its service, its checks counted.
    fn add_parts(&mut self, node: &str, svc: &NodeService, counts: CheckCounts) {
        self.kind = svc.kind.as_str().to_string();
        self.instance_count += 1;
        self.tag_set.extend(svc.tags.iter().cloned());
        self.node_set.insert(node.to_string());
        if let Some(src) = svc.meta.get("external-source") {
            self.source_set.insert(src.clone());
        }
        self.transparent_proxy |= svc.proxy.mode == "transparent";
        self.connect_native |= svc.connect.get("Native") == Some(&Value::Bool(true));
        self.checks_passing += counts.passing;
        self.checks_warning += counts.warning;
        self.checks_critical += counts.critical;
    }

    fn finish(mut self) -> Self {
        self.tags = std::mem::take(&mut self.tag_set).into_iter().collect();
        self.nodes = std::mem::take(&mut self.node_set).into_iter().collect();
        self.external_sources = std::mem::take(&mut self.source_set).into_iter().collect();
        self
    }
}

/// Checks by status: an instance's own plus its node's.
#[derive(Debug, Default, Clone, Copy)]
struct CheckCounts {
    passing: usize,
    warning: usize,
    critical: usize,
}

impl CheckCounts {
    fn count(&mut self, status: HealthStatus) {
        match status {
            HealthStatus::Passing => self.passing += 1,
            HealthStatus::Warning => self.warning += 1,
            _ => self.critical += 1,
        }
    }

    fn plus(self, o: CheckCounts) -> CheckCounts {
        CheckCounts {
            passing: self.passing + o.passing,
            warning: self.warning + o.warning,
            critical: self.critical + o.critical,
        }
    }
}

/// An instance the token may see: its service and its node readable.
fn visible(a: &Authz, i: &Instance) -> bool {
    a.service_read(&i.service.service) && a.node_read(&i.node.node)
}

/// The instances of `name` the token may read; whether it hid any.
fn instances(st: &state::State, a: &Authz, name: &str) -> (Vec<Instance>, bool) {
    let mut hidden = false;
    let mut out = Vec::new();
    for k in st.service_names.get(name).into_iter().flatten() {
        let Some(i) = st.services.get(k).and_then(|s| instance_of(st, &k.0, s)) else {
            continue;
        };
        if visible(a, &i) {
            out.push(i);
        } else {
            hidden = true;
        }
    }
    (out, hidden)
}

/// A service's summary over `found` (none when empty).
fn summarize(name: &str, dc: &str, found: &[Instance]) -> Option<Summary> {
    let mut sum = Summary {
        name: name.to_string(),
        datacenter: dc.to_string(),
        ..Default::default()
    };
    found.iter().for_each(|i| sum.add(i));
    (sum.instance_count > 0).then(|| sum.finish())
}

/// Every service the token may read, summarized. Sidecar proxies are
/// folded into the service they front (`ConnectedWithProxy`), as Consul's
/// list shows them only on the service's own page.
fn all_summaries(st: &state::State, a: &Authz, dc: &str) -> (Vec<Summary>, bool) {
    // Every check counted once, by instance and by node (a node's own
    // checks count for each of its instances): gathering each instance's
    // checks apart would scan its node's checks once per instance.
    let mut own: HashMap<(&str, &str), CheckCounts> = HashMap::new();
    let mut of_node: HashMap<&str, CheckCounts> = HashMap::new();
    for ((node, _), c) in st.checks.iter() {
        let counts = if c.service_id.is_empty() {
            of_node.entry(node).or_default()
        } else {
            own.entry((node, &c.service_id)).or_default()
        };
        counts.count(c.status);
    }
    let mut hidden = false;
    let mut out: BTreeMap<String, Summary> = BTreeMap::new();
    let mut proxied = BTreeSet::new();
    for (name, keys) in st.service_names.iter() {
        let mut sum = Summary {
            name: name.clone(),
            datacenter: dc.to_string(),
            ..Default::default()
        };
        for key in keys {
            let (node, id) = key;
            let Some(svc) = st.services.get(key) else {
                continue;
            };
            if !st.nodes.contains_key(node) {
                continue;
            }
            if !(a.service_read(&svc.service) && a.node_read(node)) {
                hidden = true;
                continue;
            }
            let dest = &svc.proxy.destination_service_name;
            if svc.kind == ServiceKind::ConnectProxy && !dest.is_empty() {
                proxied.insert(dest.clone());
            }
            let at = |m: Option<&CheckCounts>| m.copied().unwrap_or_default();
            let counts =
                at(own.get(&(node.as_str(), id.as_str()))).plus(at(of_node.get(node.as_str())));
            sum.add_parts(node, svc, counts);
        }
        if sum.instance_count > 0 {
            out.insert(name.clone(), sum.finish());
        }
    }
    for dest in &proxied {
        if let Some(sum) = out.get_mut(dest) {
            sum.connected_with_proxy = true;
        }
    }
    // A sidecar is listed apart only when what it fronts is not there.
    out.retain(|_, sum| {
        sum.kind != ServiceKind::ConnectProxy.as_str() || !sidecar_of_listed(st, sum, &proxied)
    });
    (out.into_values().collect(), hidden)
}

fn sidecar_of_listed(st: &state::State, sum: &Summary, listed: &BTreeSet<String>) -> bool {
    st.service_names
        .get(&sum.name)
        .into_iter()
        .flatten()
        .filter_map(|k| st.services.get(k))
        .all(|svc| {
            let dest = &svc.proxy.destination_service_name;
            !dest.is_empty() && listed.contains(dest) && st.service_names.contains_key(dest)
        })
}

/// What a services read found: the summaries, or their encoding at the
/// same catalog index from an earlier read.
enum Services {
    Fresh(Vec<Summary>, bool),
    Encoded(Bytes),
}

async fn services(State(s): State<App>, mut a: Authz, Opts(_, opts): Opts) -> Result<Response> {
    let dc = s.datacenter().to_owned();
    let watch = catalog_keys();
    // With ACLs off every caller sees the same summaries: they are made
    // and encoded once per catalog index (50,000 instances take ~100 ms),
    // and every other read at that index, blocking or not, shares them.
    let shared = !s.acl().enabled();
    let (index, found) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, a| {
        let index = st.index_of(watch.iter());
        if shared
            && let Some((at, body)) = &*s.ui_services().lock()
            && *at == index
        {
            return (index, Services::Encoded(body.clone()));
        }
        let (list, hidden) = all_summaries(st, a, &dc);
        (index, Services::Fresh(list, hidden))
    })
    .await?;
    let body = match found {
        Services::Fresh(list, hidden) if !shared => {
            return Ok(json_filtered(&s, index, &list, hidden));
        }
        Services::Fresh(list, _) => {
            let body =
                Bytes::from(serde_json::to_vec(&list).map_err(|e| Error::Internal(e.to_string()))?);
            *s.ui_services().lock() = Some((index, body.clone()));
            body
        }
        Services::Encoded(body) => body,
    };
    let mut resp = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    resp.headers_mut().extend(meta_headers(&s, index));
    Ok(resp)
}

/// Consul's `NodeInfo`: a node with its services and checks.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct NodeInfo {
    #[serde(rename = "ID")]
    id: String,
    node: String,
    address: String,
    datacenter: String,
    tagged_addresses: BTreeMap<String, String>,
    meta: BTreeMap<String, String>,
    services: Vec<NodeService>,
    checks: Vec<HealthCheck>,
}

/// One node as the token may see it (none if it may not read the node);
/// whether anything was hidden.
fn node_info(st: &state::State, a: &Authz, n: &Node, dc: &str) -> (Option<NodeInfo>, bool) {
    if !a.node_read(&n.node) {
        return (None, true);
    }
    let mut hidden = false;
    let mut services = Vec::new();
    for svc in node_services(st, &n.node) {
        if a.service_read(&svc.service) {
            services.push(svc.clone());
        } else {
            hidden = true;
        }
    }
    let mut checks = Vec::new();
    for c in node_checks(st, &n.node) {
        if c.service_name.is_empty() || a.service_read(&c.service_name) {
            checks.push(c.clone());
        } else {
            hidden = true;
        }
    }
    let info = NodeInfo {
        id: n.id.clone(),
        node: n.node.clone(),
        address: n.address.clone(),
        datacenter: if n.datacenter.is_empty() {
            dc.to_string()
        } else {
            n.datacenter.clone()
        },
        tagged_addresses: n.tagged_addresses.clone().into_iter().collect(),
        meta: n.meta.clone().into_iter().collect(),
        services,
        checks,
    };
    (Some(info), hidden)
}

async fn nodes(State(s): State<App>, mut a: Authz, Opts(_, opts): Opts) -> Result<Response> {
    let dc = s.datacenter().to_owned();
    let watch = catalog_keys();
    let (index, (list, hidden)) =
        blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, a| {
            let mut hidden = false;
            let mut list = Vec::new();
            for n in st.nodes.values() {
                let (info, h) = node_info(st, a, n, &dc);
                hidden |= h;
                list.extend(info);
            }
            (st.index_of(watch.iter()), (list, hidden))
        })
        .await?;
    Ok(json_filtered(&s, index, &list, hidden))
}

/// One node; a node unknown or unreadable is a 404 with no body, as
/// Consul answers.
async fn node(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    let dc = s.datacenter().to_owned();
    let key = keys::node(&name);
    let (index, (info, hidden)) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, a| {
            let found = st.nodes.get(&name).map(|n| node_info(st, a, n, &dc));
            (st.index_of([&key]), found.unwrap_or((None, false)))
        },
    )
    .await?;
    match info {
        Some(info) => Ok(json_filtered(&s, index, &info, hidden)),
        None => {
            let mut resp = StatusCode::NOT_FOUND.into_response();
            resp.headers_mut().extend(super::meta_headers(&s, index));
            Ok(resp)
        }
    }
}

/// Consul's `HealthSummary`: how many of a group pass, warn, fail.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
struct HealthSummary {
    name: String,
    total: usize,
    passing: usize,
    warning: usize,
    critical: usize,
}

impl HealthSummary {
    fn count(&mut self, status: HealthStatus) {
        self.total += 1;
        match status {
            HealthStatus::Passing => self.passing += 1,
            HealthStatus::Warning => self.warning += 1,
            _ => self.critical += 1,
        }
    }
}

/// The worst of some checks' statuses (passing when there are none).
fn worst<'a>(checks: impl Iterator<Item = &'a HealthCheck>) -> HealthStatus {
    checks.fold(HealthStatus::Passing, |w, c| w.worse(c.status))
}

/// `/v1/internal/ui/catalog-overview`: nodes (one group), services (by
/// name: each instance by its worst check) and checks (by name).
async fn overview(State(s): State<App>, mut a: Authz, Opts(_, opts): Opts) -> Result<Response> {
    let watch = catalog_keys();
    let (index, body) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, a| {
        let mut nodes = HealthSummary::default();
        for n in st.nodes.values().filter(|n| a.node_read(&n.node)) {
            nodes.count(worst(
                node_checks(st, &n.node).filter(|c| c.service_id.is_empty()),
            ));
        }
        let mut services: BTreeMap<&str, HealthSummary> = BTreeMap::new();
        for name in st.service_names.keys() {
            for i in instances(st, a, name).0 {
                services
                    .entry(name)
                    .or_insert_with(|| HealthSummary {
                        name: name.clone(),
                        ..Default::default()
                    })
                    .count(worst(i.checks.iter().map(|c| &**c)));
            }
        }
        let mut checks: BTreeMap<&str, HealthSummary> = BTreeMap::new();
        for c in st.checks.values() {
            let readable = a.node_read(&c.node)
                && (c.service_name.is_empty() || a.service_read(&c.service_name));
            if readable {
                checks
                    .entry(&c.name)
                    .or_insert_with(|| HealthSummary {
                        name: c.name.clone(),
                        ..Default::default()
                    })
                    .count(c.status);
            }
        }
        let body = serde_json::json!({
            "Nodes": if nodes.total > 0 { vec![nodes] } else { vec![] },
            "Services": services.into_values().collect::<Vec<_>>(),
            "Checks": checks.into_values().collect::<Vec<_>>(),
        });
        (st.index_of(watch.iter()), body)
    })
    .await?;
    Ok(json_filtered(&s, index, &body, false))
}

/// The intention decision on one edge, as Consul's `IntentionDecisionSummary`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Decision {
    default_allow: bool,
    allowed: bool,
    has_permissions: bool,
    external_source: String,
    has_exact: bool,
}

fn decide(st: &state::State, source: &str, destination: &str, default_allow: bool) -> Decision {
    let matched = intentions::matching(st, source, destination);
    let (allowed, _) = intentions::authorize(st, source, destination, default_allow);
    Decision {
        default_allow,
        allowed,
        has_permissions: matched.as_ref().is_some_and(|i| !i.permissions.is_empty()),
        external_source: matched
            .as_ref()
            .and_then(|i| i.meta.get("external-source").cloned())
            .unwrap_or_default(),
        has_exact: matched
            .as_ref()
            .is_some_and(|i| i.source_name == source && i.destination_name == destination),
    }
}

/// One neighbour in a topology: its summary, why it is one, the edge's
/// intention decision.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Edge {
    #[serde(flatten)]
    summary: Summary,
    source: &'static str,
    intention: Decision,
}

/// The protocol a service speaks, as its discovery chain says.
fn protocol(st: &state::State, name: &str) -> String {
    crate::discovery_chain::service_protocol(
        st.get(Kind::ServiceDefaults, name)
            .and_then(|e| e.as_service_defaults()),
        st.get(Kind::ProxyDefaults, "global")
            .and_then(|e| e.as_proxy_defaults()),
    )
}

/// The services the proxies of `name` list as upstreams, and the services
/// whose proxies list `name`: the edges of its topology (from
/// registrations: Consul adds transparent proxies' edges from intentions,
/// which cairn's proxies do not use).
fn edges(st: &state::State, name: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut up, mut down) = (BTreeSet::new(), BTreeSet::new());
    for svc in st.services.values() {
        if svc.kind != ServiceKind::ConnectProxy {
            continue;
        }
        let from = &svc.proxy.destination_service_name;
        for u in &svc.proxy.upstreams {
            if u.destination_type == "prepared_query" || u.destination_name.is_empty() {
                continue;
            }
            if from == name {
                up.insert(u.destination_name.clone());
            }
            if u.destination_name == name && !from.is_empty() {
                down.insert(from.clone());
            }
        }
    }
    (up, down)
}

async fn topology(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    a.require(a.service_read(&name), "service:read", &name)?;
    let dc = s.datacenter().to_owned();
    let default_allow = intentions::default_allow(&s.config().acl);
    let mut watch = catalog_keys();
    watch.push(keys::config_kind(Kind::ServiceIntentions.as_str()));
    watch.push(keys::config_kind(Kind::ServiceDefaults.as_str()));
    watch.push(keys::config_kind(Kind::ProxyDefaults.as_str()));
    let (index, (body, hidden)) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, a| {
        let (up, down) = edges(st, &name);
        let mut hidden = false;
        let mut side = |names: BTreeSet<String>, upstream: bool| -> Vec<Edge> {
            let mut out = Vec::new();
            for other in names {
                let (found, h) = instances(st, a, &other);
                hidden |= h || !a.service_read(&other);
                let Some(summary) = summarize(&other, &dc, &found) else {
                    continue;
                };
                let intention = if upstream {
                    decide(st, &name, &other, default_allow)
                } else {
                    decide(st, &other, &name, default_allow)
                };
                out.push(Edge {
                    summary,
                    source: "registration",
                    intention,
                });
            }
            out
        };
        let upstreams = side(up, true);
        let downstreams = side(down, false);
        let body = serde_json::json!({
            "Protocol": protocol(st, &name),
            "TransparentProxy": false,
            "DefaultAllow": default_allow,
            "WildcardIntention": intentions::for_destination(st, "*").iter().any(|i| i.source_name == "*"),
            "Upstreams": upstreams,
            "Downstreams": downstreams,
            "FilteredByACLs": hidden,
        });
        (st.index_of(watch.iter()), (body, hidden))
    })
    .await?;
    Ok(json_filtered(&s, index, &body, hidden))
}

/// The services a gateway fronts (as its config entry links them),
/// summarized: each readable linked service with instances, an ingress
/// gateway's with the addresses it is reached at (`GatewayConfig`), as
/// Consul's UI endpoint answers.
async fn gateway_services(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    a.require(a.service_read(&name), "service:read", &name)?;
    let mut watch = state::gateways::watch_keys(&name);
    watch.extend(catalog_keys());
    let dc = s.datacenter().to_string();
    let (index, (list, hidden)) =
        blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, a| {
            let mut hidden = false;
            let mut out: BTreeMap<String, Summary> = BTreeMap::new();
            for g in state::gateways::gateway_services(st, &name) {
                if !a.service_read(&g.service.name) {
                    hidden = true;
                    continue;
                }
                let (found, h) = instances(st, a, &g.service.name);
                hidden |= h;
                let Some(mut sum) = out
                    .remove(&g.service.name)
                    .or_else(|| summarize(&g.service.name, &dc, &found))
                else {
                    continue;
                };
                if g.gateway_kind == "ingress-gateway" {
                    let hosts = if g.hosts.is_empty() {
                        vec![format!("{}.ingress.*", g.service.name)]
                    } else {
                        g.hosts.clone()
                    };
                    let addrs = sum
                        .gateway_config
                        .entry("Addresses".into())
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(list) = addrs {
                        list.extend(hosts.iter().map(|h| Value::from(format!("{h}:{}", g.port))));
                    }
                }
                out.insert(g.service.name.clone(), sum);
            }
            (
                st.index_of(watch.iter()),
                (out.into_values().collect::<Vec<_>>(), hidden),
            )
        })
        .await?;
    Ok(json_filtered(&s, index, &list, hidden))
}

/// `GET /v1/internal/ui/gateway-intentions/:gw` (Consul's
/// `Internal.GatewayIntentions`): the intentions into the services the
/// gateway links, a `*` destination's among them, each once, in each
/// service's evaluation order. `service:read` on the gateway first; an
/// intention is shown only with `intention:read` on its destination.
async fn gateway_intentions(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    a.require(a.service_read(&name), "service:read", &name)?;
    let mut watch = state::gateways::watch_keys(&name);
    watch.push(keys::config_kind(Kind::ServiceIntentions.as_str()));
    let (index, (list, hidden)) =
        blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, a| {
            let mut seen = BTreeSet::new();
            let mut out = Vec::new();
            for g in state::gateways::gateway_services(st, &name) {
                for i in intentions::for_destination(st, &g.service.name) {
                    // The `*` entry's apply to every service: listed once.
                    let id = (
                        i.source_peer.clone(),
                        i.source_name.clone(),
                        i.destination_name.clone(),
                    );
                    if seen.insert(id) {
                        out.push(i);
                    }
                }
            }
            let hidden = super::keep(&mut out, |i| a.intention_read(&i.destination_name));
            (st.index_of(watch.iter()), (out, hidden))
        })
        .await?;
    Ok(json_filtered(&s, index, &list, hidden))
}
