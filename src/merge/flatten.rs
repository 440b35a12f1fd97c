//! Flattening central config for one proxy (Consul's server-side
//! `ComputeResolvedServiceConfig`): a pure function of the config entries and
//! what the registration asks about.
//!
//! Precedence, lowest first (each later source overwrites the earlier ones
//! where it says something):
//!
//! - Proxy-level fields (`Config`, `Mode`, `TransparentProxy`, `MeshGateway`,
//!   `Expose`, `MutualTLSMode`): proxy-defaults, then the destination's
//!   service-defaults. Service-defaults writes `protocol`,
//!   `balance_inbound_connections`, `max_inbound_connections`,
//!   `local_connect_timeout_ms` and `local_request_timeout_ms` into `Config`.
//!   (The registration's own values win over all of this, but that is the
//!   merge's business, not this function's.)
//! - An upstream's `protocol`: proxy-defaults `Config.protocol`, then the
//!   upstream's own service-defaults `Protocol`, then the downstream's
//!   `UpstreamConfig.Defaults`, then its `UpstreamConfig.Overrides`.
//! - An upstream's mesh gateway mode: proxy-defaults, service-defaults,
//!   `UpstreamConfig.Defaults`, the registration's `Proxy.MeshGateway`,
//!   `UpstreamConfig.Overrides` (and, in the merge, the upstream's own
//!   `MeshGateway` above all).
//!
//! Config entries are read through [`EntryLookup`], so this works on a
//! `State` version as well as on an in-memory set.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::discovery_chain::EntryLookup;
use crate::structs::catalog::{
    AccessLogsConfig, EnvoyExtension, ExposeConfig, ExposePath, TransparentProxyConfig,
};
use crate::structs::config_entry::{
    self as ce, DestinationConfig, Kind, PROXY_CONFIG_GLOBAL, ProxyConfigEntry, ServiceConfigEntry,
    UpstreamConfig,
};

pub const MODE_TRANSPARENT: &str = "transparent";

/// The synthetic upstream that carries defaults for upstreams nobody
/// registered (transparent proxies dial services they never declared).
pub const WILDCARD: &str = "*";

/// An upstream as central config keys it: a service name, and the cluster
/// peer it lives in ("" for the local cluster).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpstreamKey {
    pub peer: String,
    pub name: String,
}

impl UpstreamKey {
    pub fn local(name: &str) -> Self {
        UpstreamKey {
            peer: String::new(),
            name: name.to_string(),
        }
    }

    pub fn wildcard() -> Self {
        Self::local(WILDCARD)
    }
}

/// What the registration contributes to the resolution (Consul's
/// `ServiceConfigRequest`). Instances with equal requests resolve alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ResolveRequest {
    /// The service whose service-defaults apply: a sidecar's destination,
    /// a gateway's own name.
    pub name: String,
    /// The registration's `Proxy.Mode` ("" when unset).
    pub mode: String,
    /// The registration's `Proxy.MeshGateway.Mode` ("" when unset).
    pub mesh_gateway: String,
    /// The registration's upstreams of destination type `service`.
    pub upstreams: Vec<UpstreamKey>,
}

/// Central config flattened for one proxy (Consul's `ServiceConfigResponse`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResolvedServiceConfig {
    /// Opaque proxy config (`Proxy.Config`).
    pub proxy_config: Map<String, Value>,
    pub mode: String,
    pub transparent_proxy: TransparentProxyConfig,
    pub mesh_gateway: String,
    pub expose: ExposeConfig,
    pub access_logs: AccessLogsConfig,
    pub mutual_tls_mode: String,
    /// proxy-defaults' extensions, then service-defaults'.
    pub envoy_extensions: Vec<EnvoyExtension>,
    pub meta: BTreeMap<String, String>,
    pub destination: Option<DestinationConfig>,
    /// Opaque config per upstream, keys as Consul writes them (`protocol`,
    /// `connect_timeout_ms`, `mesh_gateway`, `limits`, ...). The wildcard
    /// upstream `*` holds the defaults for undeclared upstreams.
    pub upstream_configs: BTreeMap<UpstreamKey, Map<String, Value>>,
}

/// The proxy-defaults entry that applies (there is only `global`).
pub fn proxy_defaults(entries: &(impl EntryLookup + ?Sized)) -> Option<&ProxyConfigEntry> {
    entries
        .get(Kind::ProxyDefaults, PROXY_CONFIG_GLOBAL)?
        .as_proxy_defaults()
}

pub fn service_defaults<'a>(
    entries: &'a (impl EntryLookup + ?Sized), name: &str,
) -> Option<&'a ServiceConfigEntry> {
    entries
        .get(Kind::ServiceDefaults, name)?
        .as_service_defaults()
}

/// Flattens central config for the proxy described by `req`.
pub fn resolve_service_config(
    entries: &(impl EntryLookup + ?Sized), req: &ResolveRequest,
) -> ResolvedServiceConfig {
    let mut out = ResolvedServiceConfig::default();
    // Defaults for upstreams with no config of their own; only the mesh
    // gateway mode (and what UpstreamConfig.Defaults says) goes here.
    let mut wildcard = Map::new();
    let mut global_protocol: Option<String> = None;

    let pd = proxy_defaults(entries);
    if let Some(pd) = pd {
        out.proxy_config = pd.config.clone();
        out.mode = pd.mode.clone();
        out.transparent_proxy = tproxy_of(&pd.transparent_proxy);
        out.mesh_gateway = pd.mesh_gateway.mode.clone();
        out.expose = expose_of(&pd.expose);
        out.envoy_extensions = pd.envoy_extensions.iter().map(extension_of).collect();
        out.access_logs = pd
            .access_logs
            .as_ref()
            .map(access_logs_of)
            .unwrap_or_default();
        out.mutual_tls_mode = pd.mutual_tls_mode.clone();
        // A `mesh_gateway` written into the opaque Config counts, but the
        // typed field beats it.
        if let Some(mgw) = pd.config.get("mesh_gateway") {
            wildcard.insert("mesh_gateway".into(), mgw.clone());
        }
        if !pd.mesh_gateway.mode.is_empty() {
            wildcard.insert(
                "mesh_gateway".into(),
                mesh_gateway_value(&pd.mesh_gateway.mode),
            );
        }
        // The global protocol is not a wildcard default: for undeclared
        // upstreams the discovery chain already combines it with the
        // upstream's own service-defaults, and putting it here would make it
        // beat that. It only seeds declared upstreams, below.
        global_protocol = pd.config_protocol();
    }

    let sd = service_defaults(entries, &req.name);
    if let Some(sd) = sd {
        if sd.expose.checks {
            out.expose.checks = true;
        }
        if !sd.expose.paths.is_empty() {
            out.expose.paths = sd.expose.paths.iter().map(expose_path_of).collect();
        }
        if !sd.mesh_gateway.mode.is_empty() {
            out.mesh_gateway = sd.mesh_gateway.mode.clone();
            wildcard.insert(
                "mesh_gateway".into(),
                mesh_gateway_value(&sd.mesh_gateway.mode),
            );
        }
        if sd.transparent_proxy.outbound_listener_port != 0 {
            out.transparent_proxy.outbound_listener_port =
                sd.transparent_proxy.outbound_listener_port;
        }
        if sd.transparent_proxy.dialed_directly {
            out.transparent_proxy.dialed_directly = true;
        }
        if !sd.mode.is_empty() {
            out.mode = sd.mode.clone();
        }
        if !sd.mutual_tls_mode.is_empty() {
            out.mutual_tls_mode = sd.mutual_tls_mode.clone();
        }
        if let Some(d) = &sd.destination {
            out.destination = Some(d.clone());
        }
        let cfg = &mut out.proxy_config;
        if !sd.protocol.is_empty() {
            cfg.insert("protocol".into(), sd.protocol.clone().into());
        }
        if !sd.balance_inbound_connections.is_empty() {
            cfg.insert(
                "balance_inbound_connections".into(),
                sd.balance_inbound_connections.clone().into(),
            );
        }
        if sd.max_inbound_connections > 0 {
            cfg.insert(
                "max_inbound_connections".into(),
                sd.max_inbound_connections.into(),
            );
        }
        if sd.local_connect_timeout_ms > 0 {
            cfg.insert(
                "local_connect_timeout_ms".into(),
                sd.local_connect_timeout_ms.into(),
            );
        }
        if sd.local_request_timeout_ms > 0 {
            cfg.insert(
                "local_request_timeout_ms".into(),
                sd.local_request_timeout_ms.into(),
            );
        }
        out.meta = sd.meta.clone();
        out.envoy_extensions
            .extend(sd.envoy_extensions.iter().map(extension_of));
    }

    // Either the registration or central config can make a proxy
    // transparent; the registration's own mode is not in `out.mode` yet.
    let tproxy = req.mode == MODE_TRANSPARENT || out.mode == MODE_TRANSPARENT;
    // A proxy with no upstreams that is not transparent has nothing to dial:
    // no upstream config at all, not even the wildcard.
    if req.upstreams.is_empty() && !tproxy {
        return out;
    }

    // Upstreams come from the registration and from UpstreamConfig.Overrides
    // (a transparent proxy may dial those without declaring them).
    let mut seen: BTreeSet<UpstreamKey> = req.upstreams.iter().cloned().collect();
    let mut overrides: BTreeMap<UpstreamKey, &UpstreamConfig> = BTreeMap::new();
    let mut defaults: Option<UpstreamConfig> = None;
    if let Some(uc) = sd.and_then(|sd| sd.upstream_config.as_ref()) {
        for o in &uc.overrides {
            if o.name.is_empty() {
                continue; // validation refuses these; never match on ""
            }
            let key = UpstreamKey {
                peer: o.peer.clone(),
                name: o.name.clone(),
            };
            seen.insert(key.clone());
            overrides.insert(key, o);
        }
        if let Some(d) = &uc.defaults {
            let mut d = d.clone();
            if d.mesh_gateway.mode.is_empty() {
                d.mesh_gateway.mode = out.mesh_gateway.clone();
            }
            merge_upstream_config_into(&d, &mut wildcard);
            defaults = Some(d);
        }
    }
    if !req.mesh_gateway.is_empty() {
        wildcard.insert("mesh_gateway".into(), mesh_gateway_value(&req.mesh_gateway));
    }

    // Until overrides name a peer, they match upstreams by name alone, peered
    // ones included (Consul 1.14 behaviour, kept for compatibility).
    let by_name_only = !overrides.keys().any(|k| !k.peer.is_empty());
    let visible = visible_upstream_defaults(req, &overrides, tproxy);

    for up in &seen {
        let mut cfg = Map::new();
        if let Some(p) = &global_protocol {
            cfg.insert("protocol".into(), p.clone().into());
        }
        for (k, v) in &wildcard {
            cfg.insert(k.clone(), v.clone());
        }
        if visible.contains(up.name.as_str())
            && let Some(usd) = service_defaults(entries, &up.name)
            && !usd.protocol.is_empty()
        {
            cfg.insert("protocol".into(), usd.protocol.clone().into());
        }
        if !out.mesh_gateway.is_empty() {
            cfg.insert("mesh_gateway".into(), mesh_gateway_value(&out.mesh_gateway));
        }
        if let Some(d) = &defaults {
            merge_upstream_config_into(d, &mut cfg);
        }
        if !req.mesh_gateway.is_empty() {
            cfg.insert("mesh_gateway".into(), mesh_gateway_value(&req.mesh_gateway));
        }
        if by_name_only
            && !up.peer.is_empty()
            && let Some(o) = overrides.get(&UpstreamKey::local(&up.name))
        {
            merge_upstream_config_into(o, &mut cfg);
        }
        if let Some(o) = overrides.get(up) {
            merge_upstream_config_into(o, &mut cfg);
        }
        if !cfg.is_empty() {
            out.upstream_configs.insert(up.clone(), cfg);
        }
    }
    if defaults.is_some() || !wildcard.is_empty() {
        out.upstream_configs
            .insert(UpstreamKey::wildcard(), wildcard);
    }
    out
}

/// Names whose service-defaults Consul loads for upstreams: the destination's
/// (always read), and — when there are local upstreams or the proxy is
/// transparent — each local upstream's and each local override's. A peered
/// upstream sees a protocol only through a local service of the same name.
fn visible_upstream_defaults<'a>(
    req: &'a ResolveRequest, overrides: &BTreeMap<UpstreamKey, &'a UpstreamConfig>, tproxy: bool,
) -> BTreeSet<&'a str> {
    let mut names: BTreeSet<&str> = BTreeSet::from([req.name.as_str()]);
    let local: Vec<&str> = req
        .upstreams
        .iter()
        .filter(|u| u.peer.is_empty())
        .map(|u| u.name.as_str())
        .collect();
    if local.is_empty() && !tproxy {
        return names;
    }
    names.extend(local);
    names.extend(
        overrides
            .values()
            .filter(|o| o.peer.is_empty())
            .map(|o| o.name.as_str()),
    );
    names
}

/// Writes what an upstream config says into an opaque upstream config map,
/// overwriting; empty fields say nothing.
pub fn merge_upstream_config_into(cfg: &UpstreamConfig, dst: &mut Map<String, Value>) {
    let mut put = |k: &str, v: Value| {
        dst.insert(k.to_string(), v);
    };
    if !cfg.envoy_listener_json.is_empty() {
        put(
            "envoy_listener_json",
            cfg.envoy_listener_json.clone().into(),
        );
    }
    if !cfg.envoy_cluster_json.is_empty() {
        put("envoy_cluster_json", cfg.envoy_cluster_json.clone().into());
    }
    if !cfg.protocol.is_empty() {
        put("protocol", cfg.protocol.clone().into());
    }
    if cfg.connect_timeout_ms != 0 {
        put("connect_timeout_ms", cfg.connect_timeout_ms.into());
    }
    if !cfg.mesh_gateway.mode.is_empty() {
        put("mesh_gateway", mesh_gateway_value(&cfg.mesh_gateway.mode));
    }
    if let Some(l) = &cfg.limits {
        put("limits", limits_value(l));
    }
    if let Some(p) = &cfg.passive_health_check {
        put("passive_health_check", passive_health_check_value(p));
    }
    if !cfg.balance_outbound_connections.is_empty() {
        put(
            "balance_outbound_connections",
            cfg.balance_outbound_connections.clone().into(),
        );
    }
}

/// `{"Mode": mode}`, as Consul's `MeshGatewayConfig` marshals.
pub fn mesh_gateway_value(mode: &str) -> Value {
    json!({ "Mode": mode })
}

/// The mesh gateway mode in an opaque upstream config's `mesh_gateway`,
/// read as leniently as Consul's decoder (any key case).
pub fn mesh_gateway_mode_of(cfg: &Map<String, Value>) -> String {
    let Some(Value::Object(m)) = cfg.get("mesh_gateway") else {
        return String::new();
    };
    m.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("mode"))
        .and_then(|(_, v)| v.as_str())
        .unwrap_or_default()
        .to_string()
}

/// `UpstreamLimits` as Go marshals it: unset limits are left out.
fn limits_value(l: &ce::UpstreamLimits) -> Value {
    let mut m = Map::new();
    let fields = [
        ("MaxConnections", l.max_connections),
        ("MaxPendingRequests", l.max_pending_requests),
        ("MaxConcurrentRequests", l.max_concurrent_requests),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            m.insert(k.into(), v.into());
        }
    }
    Value::Object(m)
}

/// `PassiveHealthCheck` as Go marshals it: durations are integer nanoseconds
/// (Go's `time.Duration` has no JSON form of its own), empty fields omitted.
fn passive_health_check_value(p: &ce::PassiveHealthCheck) -> Value {
    let mut m = Map::new();
    if !p.interval.is_zero() {
        m.insert("Interval".into(), p.interval.nanos().into());
    }
    if p.max_failures != 0 {
        m.insert("MaxFailures".into(), p.max_failures.into());
    }
    if let Some(v) = p.enforcing_consecutive_5xx {
        m.insert("EnforcingConsecutive5xx".into(), v.into());
    }
    if let Some(v) = p.max_ejection_percent {
        m.insert("MaxEjectionPercent".into(), v.into());
    }
    if let Some(v) = p.base_ejection_time {
        m.insert("BaseEjectionTime".into(), v.nanos().into());
    }
    Value::Object(m)
}

fn tproxy_of(t: &ce::TransparentProxyConfig) -> TransparentProxyConfig {
    TransparentProxyConfig {
        outbound_listener_port: t.outbound_listener_port,
        dialed_directly: t.dialed_directly,
    }
}

fn expose_path_of(p: &ce::ExposePath) -> ExposePath {
    ExposePath {
        listener_port: p.listener_port,
        path: p.path.clone(),
        local_path_port: p.local_path_port,
        protocol: p.protocol.clone(),
        parsed_from_check: p.parsed_from_check,
    }
}

fn expose_of(e: &ce::ExposeConfig) -> ExposeConfig {
    ExposeConfig {
        checks: e.checks,
        paths: e.paths.iter().map(expose_path_of).collect(),
    }
}

fn access_logs_of(a: &ce::AccessLogsConfig) -> AccessLogsConfig {
    AccessLogsConfig {
        enabled: a.enabled,
        disable_listener_logs: a.disable_listener_logs,
        log_type: a.log_type.clone(),
        path: a.path.clone(),
        json_format: a.json_format.clone(),
        text_format: a.text_format.clone(),
    }
}

/// Only the name, whether it is required and its arguments travel to the
/// proxy; the version constraints are for the server.
fn extension_of(e: &ce::EnvoyExtension) -> EnvoyExtension {
    EnvoyExtension {
        name: e.name.clone(),
        required: e.required,
        arguments: e.arguments.clone(),
        ..Default::default()
    }
}
