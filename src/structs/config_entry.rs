//! The config entry kinds (the five of the discovery chain,
//! `service-intentions`, and the mesh-wide and gateway kinds of
//! [`gateway`]) with Consul's (1.15+) field sets and HTTP JSON shape.
//!
//! The structs (de)serialize with Consul's CamelCase keys. Deserializing them
//! directly is strict about types but not about key spelling or unknown keys:
//! use `crate::config_check::decode_entry` for request bodies, which accepts
//! snake_case, refuses unknown keys and then lands here. Serializing a
//! [`ConfigEntry`] prunes empty members the way Consul's `omitempty` does,
//! except inside free-form maps (`Config`, `Meta`, header maps, ...).

pub mod shape;

pub use super::duration::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The config entry kinds served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    ProxyDefaults,
    ServiceDefaults,
    ServiceRouter,
    ServiceSplitter,
    ServiceResolver,
    ServiceIntentions,
    Mesh,
    IngressGateway,
    TerminatingGateway,
    ExportedServices,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::ProxyDefaults,
        Kind::ServiceDefaults,
        Kind::ServiceRouter,
        Kind::ServiceSplitter,
        Kind::ServiceResolver,
        Kind::ServiceIntentions,
        Kind::Mesh,
        Kind::IngressGateway,
        Kind::TerminatingGateway,
        Kind::ExportedServices,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ProxyDefaults => "proxy-defaults",
            Kind::ServiceDefaults => "service-defaults",
            Kind::ServiceRouter => "service-router",
            Kind::ServiceSplitter => "service-splitter",
            Kind::ServiceResolver => "service-resolver",
            Kind::ServiceIntentions => "service-intentions",
            Kind::Mesh => "mesh",
            Kind::IngressGateway => "ingress-gateway",
            Kind::TerminatingGateway => "terminating-gateway",
            Kind::ExportedServices => "exported-services",
        }
    }

    /// The kinds that make up a discovery chain's graph.
    pub fn is_chain_graph(self) -> bool {
        matches!(
            self,
            Kind::ServiceRouter | Kind::ServiceSplitter | Kind::ServiceResolver
        )
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = String;

    /// Kind names match case-insensitively ("Service-Router" is accepted).
    fn from_str(s: &str) -> Result<Self, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("invalid config entry kind: {s}"))
    }
}

/// Name of the only proxy-defaults entry.
pub const PROXY_CONFIG_GLOBAL: &str = "global";

/// Whether a protocol is one of the L7 ones (Consul's `IsProtocolHTTPLike`):
/// routers, splitters, HTTP filters and L7 intentions apply only to these.
pub fn is_http_like(protocol: &str) -> bool {
    matches!(protocol, "http" | "http2" | "grpc")
}

/// One config entry of any served kind.
// Entries are stored and passed whole; boxing the bigger kinds would only
// add an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigEntry {
    ProxyDefaults(ProxyConfigEntry),
    ServiceDefaults(ServiceConfigEntry),
    ServiceRouter(ServiceRouterConfigEntry),
    ServiceSplitter(ServiceSplitterConfigEntry),
    ServiceResolver(ServiceResolverConfigEntry),
    ServiceIntentions(ServiceIntentionsConfigEntry),
    Mesh(MeshConfigEntry),
    IngressGateway(IngressGatewayConfigEntry),
    TerminatingGateway(TerminatingGatewayConfigEntry),
    ExportedServices(ExportedServicesConfigEntry),
}

macro_rules! each_kind {
    ($self:expr, $e:ident => $body:expr) => {
        match $self {
            ConfigEntry::ProxyDefaults($e) => $body,
            ConfigEntry::ServiceDefaults($e) => $body,
            ConfigEntry::ServiceRouter($e) => $body,
            ConfigEntry::ServiceSplitter($e) => $body,
            ConfigEntry::ServiceResolver($e) => $body,
            ConfigEntry::ServiceIntentions($e) => $body,
            ConfigEntry::Mesh($e) => $body,
            ConfigEntry::IngressGateway($e) => $body,
            ConfigEntry::TerminatingGateway($e) => $body,
            ConfigEntry::ExportedServices($e) => $body,
        }
    };
}

impl ConfigEntry {
    pub fn kind(&self) -> Kind {
        match self {
            ConfigEntry::ProxyDefaults(_) => Kind::ProxyDefaults,
            ConfigEntry::ServiceDefaults(_) => Kind::ServiceDefaults,
            ConfigEntry::ServiceRouter(_) => Kind::ServiceRouter,
            ConfigEntry::ServiceSplitter(_) => Kind::ServiceSplitter,
            ConfigEntry::ServiceResolver(_) => Kind::ServiceResolver,
            ConfigEntry::ServiceIntentions(_) => Kind::ServiceIntentions,
            ConfigEntry::Mesh(_) => Kind::Mesh,
            ConfigEntry::IngressGateway(_) => Kind::IngressGateway,
            ConfigEntry::TerminatingGateway(_) => Kind::TerminatingGateway,
            ConfigEntry::ExportedServices(_) => Kind::ExportedServices,
        }
    }

    pub fn name(&self) -> &str {
        each_kind!(self, e => &e.name)
    }

    /// The other services a discovery-chain entry sends its service's
    /// traffic to (Consul's `ListRelatedServices`): router destinations,
    /// splits, a resolver's redirect and failover services and targets.
    /// Sorted, once each; empty for the other kinds.
    pub fn related_services(&self) -> Vec<&str> {
        let mut out: Vec<&str> = match self {
            ConfigEntry::ServiceRouter(e) => e
                .routes
                .iter()
                .filter_map(|r| r.destination.as_ref())
                .map(|d| d.service.as_str())
                .collect(),
            ConfigEntry::ServiceSplitter(e) => {
                e.splits.iter().map(|s| s.service.as_str()).collect()
            }
            ConfigEntry::ServiceResolver(e) => {
                let failover = e.failover.values().flat_map(|f| {
                    std::iter::once(f.service.as_str())
                        .chain(f.targets.iter().map(|t| t.service.as_str()))
                });
                e.redirect
                    .iter()
                    .map(|r| r.service.as_str())
                    .chain(failover)
                    .collect()
            }
            _ => Vec::new(),
        };
        out.retain(|s| !s.is_empty() && *s != self.name());
        out.sort_unstable();
        out.dedup();
        out
    }

    pub fn meta(&self) -> &BTreeMap<String, String> {
        each_kind!(self, e => &e.meta)
    }

    pub fn create_index(&self) -> u64 {
        each_kind!(self, e => e.create_index)
    }

    pub fn modify_index(&self) -> u64 {
        each_kind!(self, e => e.modify_index)
    }

    /// Sets the Raft indexes the store assigned to this entry.
    pub fn set_indexes(&mut self, create: u64, modify: u64) {
        each_kind!(self, e => { e.create_index = create; e.modify_index = modify; })
    }

    /// The entry as Consul's HTTP JSON (Kind, Name, non-empty fields,
    /// CreateIndex, ModifyIndex).
    pub fn to_json(&self) -> Value {
        let raw = each_kind!(self, e => serde_json::to_value(e))
            .expect("config entries always serialize");
        let mut v = shape::prune(raw, shape::for_kind(self.kind()));
        // The indexes are part of every answer, zero or not.
        if let Value::Object(m) = &mut v {
            m.insert("CreateIndex".into(), self.create_index().into());
            m.insert("ModifyIndex".into(), self.modify_index().into());
        }
        v
    }

    pub fn as_service_defaults(&self) -> Option<&ServiceConfigEntry> {
        match self {
            ConfigEntry::ServiceDefaults(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_proxy_defaults(&self) -> Option<&ProxyConfigEntry> {
        match self {
            ConfigEntry::ProxyDefaults(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_router(&self) -> Option<&ServiceRouterConfigEntry> {
        match self {
            ConfigEntry::ServiceRouter(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_splitter(&self) -> Option<&ServiceSplitterConfigEntry> {
        match self {
            ConfigEntry::ServiceSplitter(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_intentions(&self) -> Option<&ServiceIntentionsConfigEntry> {
        match self {
            ConfigEntry::ServiceIntentions(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_ingress_gateway(&self) -> Option<&IngressGatewayConfigEntry> {
        match self {
            ConfigEntry::IngressGateway(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_terminating_gateway(&self) -> Option<&TerminatingGatewayConfigEntry> {
        match self {
            ConfigEntry::TerminatingGateway(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_mesh(&self) -> Option<&MeshConfigEntry> {
        match self {
            ConfigEntry::Mesh(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_resolver(&self) -> Option<&ServiceResolverConfigEntry> {
        match self {
            ConfigEntry::ServiceResolver(e) => Some(e),
            _ => None,
        }
    }
}

impl Serialize for ConfigEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

// ---------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------

/// Declares a kind's entry: the fields every kind has (Kind, Name,
/// Namespace, Partition first; Meta and the Raft indexes last, in Consul's
/// order) around the kind's own, so the envelope `ConfigEntry`'s accessors
/// read is written once.
macro_rules! config_entry {
    (
        $(#[$doc:meta])*
        pub struct $name:ident { $($(#[$attr:meta])* pub $field:ident: $ty:ty,)* }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase", default)]
        pub struct $name {
            pub kind: String,
            pub name: String,
            pub namespace: String,
            pub partition: String,
            $($(#[$attr])* pub $field: $ty,)*
            pub meta: BTreeMap<String, String>,
            pub create_index: u64,
            pub modify_index: u64,
        }
    };
}

pub mod gateway;
pub use gateway::*;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MeshGatewayConfig {
    /// "", "none", "local" or "remote".
    pub mode: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TransparentProxyConfig {
    pub outbound_listener_port: i64,
    pub dialed_directly: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExposeConfig {
    pub checks: bool,
    pub paths: Vec<ExposePath>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExposePath {
    pub listener_port: i64,
    pub path: String,
    pub local_path_port: i64,
    pub protocol: String,
    pub parsed_from_check: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AccessLogsConfig {
    pub enabled: bool,
    pub disable_listener_logs: bool,
    /// "", "file", "stdout" or "stderr".
    #[serde(rename = "Type")]
    pub log_type: String,
    pub path: String,
    #[serde(rename = "JSONFormat")]
    pub json_format: String,
    pub text_format: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EnvoyExtension {
    pub name: String,
    pub required: bool,
    /// Free-form: keys kept verbatim.
    pub arguments: Map<String, Value>,
    pub consul_version: String,
    pub envoy_version: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct FailoverPolicy {
    /// "", "default" or "order-by-locality".
    pub mode: String,
    pub regions: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PrioritizeByLocality {
    pub mode: String,
}

// ---------------------------------------------------------------------------
// proxy-defaults
// ---------------------------------------------------------------------------

// Fields in the order of Consul's API struct (`api.ProxyConfigEntry`).
config_entry! {
    pub struct ProxyConfigEntry {
        pub mode: String,
        pub transparent_proxy: TransparentProxyConfig,
        #[serde(rename = "MutualTLSMode")]
        pub mutual_tls_mode: String,
        /// Opaque proxy configuration (e.g. `protocol`); keys kept verbatim.
        pub config: Map<String, Value>,
        pub mesh_gateway: MeshGatewayConfig,
        pub expose: ExposeConfig,
        pub access_logs: Option<AccessLogsConfig>,
        pub envoy_extensions: Vec<EnvoyExtension>,
        pub failover_policy: Option<FailoverPolicy>,
        pub prioritize_by_locality: Option<PrioritizeByLocality>,
    }
}

impl ProxyConfigEntry {
    /// The `protocol` key of `Config`, read leniently as Consul does (the
    /// key in any case, scalars of any type).
    pub fn config_protocol(&self) -> Option<String> {
        let v = self.config.get("protocol").or_else(|| {
            self.config
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("protocol"))
                .map(|(_, v)| v)
        })?;
        match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(if *b { "1" } else { "0" }.to_string()),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// service-defaults
// ---------------------------------------------------------------------------

config_entry! {
    pub struct ServiceConfigEntry {
        pub protocol: String,
        pub mode: String,
        pub transparent_proxy: TransparentProxyConfig,
        #[serde(rename = "MutualTLSMode")]
        pub mutual_tls_mode: String,
        pub mesh_gateway: MeshGatewayConfig,
        pub expose: ExposeConfig,
        #[serde(rename = "ExternalSNI")]
        pub external_sni: String,
        pub upstream_config: Option<UpstreamConfiguration>,
        pub destination: Option<DestinationConfig>,
        pub rate_limits: Option<RateLimits>,
        pub max_inbound_connections: i64,
        pub local_connect_timeout_ms: i64,
        pub local_request_timeout_ms: i64,
        pub balance_inbound_connections: String,
        pub envoy_extensions: Vec<EnvoyExtension>,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UpstreamConfiguration {
    pub overrides: Vec<UpstreamConfig>,
    pub defaults: Option<UpstreamConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UpstreamConfig {
    pub name: String,
    pub namespace: String,
    pub partition: String,
    pub peer: String,
    #[serde(rename = "EnvoyListenerJSON")]
    pub envoy_listener_json: String,
    #[serde(rename = "EnvoyClusterJSON")]
    pub envoy_cluster_json: String,
    pub protocol: String,
    pub connect_timeout_ms: i64,
    pub limits: Option<UpstreamLimits>,
    pub passive_health_check: Option<PassiveHealthCheck>,
    pub mesh_gateway: MeshGatewayConfig,
    pub balance_outbound_connections: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UpstreamLimits {
    pub max_connections: Option<i64>,
    pub max_pending_requests: Option<i64>,
    pub max_concurrent_requests: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PassiveHealthCheck {
    pub interval: Duration,
    pub max_failures: u32,
    #[serde(rename = "EnforcingConsecutive5xx")]
    pub enforcing_consecutive_5xx: Option<u32>,
    pub max_ejection_percent: Option<u32>,
    pub base_ejection_time: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DestinationConfig {
    pub addresses: Vec<String>,
    pub port: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RateLimits {
    pub instance_level: InstanceLevelRateLimits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InstanceLevelRateLimits {
    pub requests_per_second: f64,
    pub requests_max_burst: i64,
    pub routes: Vec<InstanceLevelRouteRateLimits>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InstanceLevelRouteRateLimits {
    pub path_exact: String,
    pub path_prefix: String,
    pub path_regex: String,
    pub requests_per_second: f64,
    pub requests_max_burst: i64,
}

// ---------------------------------------------------------------------------
// service-router
// ---------------------------------------------------------------------------

config_entry! {
    pub struct ServiceRouterConfigEntry {
        pub routes: Vec<ServiceRoute>,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRoute {
    #[serde(rename = "Match")]
    pub match_: Option<ServiceRouteMatch>,
    pub destination: Option<ServiceRouteDestination>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceRouteMatch {
    #[serde(rename = "HTTP")]
    pub http: Option<ServiceRouteHttpMatch>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRouteHttpMatch {
    pub path_exact: String,
    pub path_prefix: String,
    pub path_regex: String,
    pub header: Vec<ServiceRouteHttpMatchHeader>,
    pub query_param: Vec<ServiceRouteHttpMatchQueryParam>,
    pub methods: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRouteHttpMatchHeader {
    pub name: String,
    pub present: bool,
    pub exact: String,
    pub prefix: String,
    pub suffix: String,
    pub regex: String,
    pub invert: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRouteHttpMatchQueryParam {
    pub name: String,
    pub present: bool,
    pub exact: String,
    pub regex: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRouteDestination {
    pub service: String,
    pub service_subset: String,
    pub namespace: String,
    pub partition: String,
    pub prefix_rewrite: String,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    pub num_retries: u32,
    pub retry_on_connect_failure: bool,
    pub retry_on: Vec<String>,
    pub retry_on_status_codes: Vec<u32>,
    pub request_headers: Option<HttpHeaderModifiers>,
    pub response_headers: Option<HttpHeaderModifiers>,
}

/// Header edits applied by the proxy; `Add`/`Set` keys are header names,
/// kept verbatim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HttpHeaderModifiers {
    pub add: BTreeMap<String, String>,
    pub set: BTreeMap<String, String>,
    pub remove: Vec<String>,
}

impl HttpHeaderModifiers {
    pub fn is_zero(m: &Option<Self>) -> bool {
        m.as_ref()
            .is_none_or(|m| m.add.is_empty() && m.set.is_empty() && m.remove.is_empty())
    }

    /// `overrides` merged over `base`: later Add/Set win, Removes are unioned.
    pub fn merge(base: &Option<Self>, overrides: &Option<Self>) -> Option<Self> {
        if Self::is_zero(base) {
            return overrides.clone();
        }
        let mut merged = base.clone().unwrap_or_default();
        if let Some(o) = overrides {
            merged.add.extend(o.add.clone());
            merged.set.extend(o.set.clone());
            for r in &o.remove {
                if !merged.remove.contains(r) {
                    merged.remove.push(r.clone());
                }
            }
        }
        Some(merged)
    }
}

// ---------------------------------------------------------------------------
// service-splitter
// ---------------------------------------------------------------------------

config_entry! {
    pub struct ServiceSplitterConfigEntry {
        pub splits: Vec<ServiceSplit>,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceSplit {
    pub weight: f32,
    pub service: String,
    pub service_subset: String,
    pub namespace: String,
    pub partition: String,
    pub request_headers: Option<HttpHeaderModifiers>,
    pub response_headers: Option<HttpHeaderModifiers>,
}

impl ServiceSplit {
    /// This split with a parent split's header edits folded in, as if a
    /// request passed through the parent first (requests) and last
    /// (responses). Used when nested splitters are flattened.
    pub fn merge_parent(&self, parent: &ServiceSplit) -> ServiceSplit {
        ServiceSplit {
            request_headers: HttpHeaderModifiers::merge(
                &parent.request_headers,
                &self.request_headers,
            ),
            response_headers: HttpHeaderModifiers::merge(
                &self.response_headers,
                &parent.response_headers,
            ),
            ..self.clone()
        }
    }
}

/// Rounds a split weight to the smallest representable unit, 0.01%.
pub fn normalize_split_weight(w: f32) -> f32 {
    scale_weight(w) as f32 / 100.0
}

/// A weight in units of 0.01%.
pub fn scale_weight(w: f32) -> i64 {
    (f64::from(w * 100.0)).round() as i64
}

// ---------------------------------------------------------------------------
// service-resolver
// ---------------------------------------------------------------------------

config_entry! {
    pub struct ServiceResolverConfigEntry {
        pub default_subset: String,
        pub subsets: BTreeMap<String, ServiceResolverSubset>,
        pub redirect: Option<ServiceResolverRedirect>,
        pub failover: BTreeMap<String, ServiceResolverFailover>,
        pub connect_timeout: Duration,
        pub request_timeout: Duration,
        pub load_balancer: Option<LoadBalancer>,
    }
}

impl ServiceResolverConfigEntry {
    pub fn subset_exists(&self, name: &str) -> bool {
        name.is_empty() || self.subsets.contains_key(name)
    }

    /// True when the entry changes nothing about plain resolution.
    pub fn is_default(&self) -> bool {
        self.default_subset.is_empty()
            && self.subsets.is_empty()
            && self.redirect.is_none()
            && self.failover.is_empty()
            && self.connect_timeout.is_zero()
            && self.request_timeout.is_zero()
            && self.load_balancer.is_none()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceResolverSubset {
    pub filter: String,
    pub only_passing: bool,
}

/// A service (or subset, namespace, partition, datacenter or peer) that
/// requests are sent to instead: a resolver's `Redirect`, or one of its
/// failover `Targets`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceResolverRedirect {
    pub service: String,
    pub service_subset: String,
    pub namespace: String,
    pub partition: String,
    pub datacenter: String,
    pub peer: String,
}

impl ServiceResolverRedirect {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceResolverFailover {
    pub service: String,
    pub service_subset: String,
    pub namespace: String,
    pub datacenters: Vec<String>,
    pub targets: Vec<ServiceResolverFailoverTarget>,
    pub policy: Option<FailoverPolicy>,
}

impl ServiceResolverFailover {
    /// True when it names nothing to fail over to: a policy alone is not enough.
    pub fn is_empty(&self) -> bool {
        let policy_only = Self {
            policy: self.policy.clone(),
            ..Self::default()
        };
        *self == policy_only
    }
}

/// Where a failover goes: the same fields, in Consul's JSON, as a redirect.
pub type ServiceResolverFailoverTarget = ServiceResolverRedirect;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct LoadBalancer {
    pub policy: String,
    pub ring_hash_config: Option<RingHashConfig>,
    pub least_request_config: Option<LeastRequestConfig>,
    pub hash_policies: Vec<HashPolicy>,
}

impl LoadBalancer {
    pub fn is_hash_based(&self) -> bool {
        matches!(self.policy.as_str(), "maglev" | "ring_hash")
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RingHashConfig {
    pub minimum_ring_size: u64,
    pub maximum_ring_size: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct LeastRequestConfig {
    pub choice_count: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HashPolicy {
    pub field: String,
    pub field_value: String,
    pub cookie_config: Option<CookieConfig>,
    #[serde(rename = "SourceIP")]
    pub source_ip: bool,
    pub terminal: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CookieConfig {
    pub session: bool,
    #[serde(rename = "TTL")]
    pub ttl: Duration,
    pub path: String,
}

// ---------------------------------------------------------------------------
// service-intentions
// ---------------------------------------------------------------------------

config_entry! {
    /// `service-intentions`: who may reach the service `Name` (or every
    /// service, `*`), one source each.
    pub struct ServiceIntentionsConfigEntry {
        pub sources: Vec<SourceIntention>,
    }
}

/// One source of a `service-intentions` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SourceIntention {
    pub name: String,
    pub peer: String,
    pub namespace: String,
    pub partition: String,
    /// "allow" or "deny"; empty when `Permissions` decide.
    pub action: String,
    pub permissions: Vec<super::connect::IntentionPermission>,
    /// Computed (Consul's precedence of the source/destination pair).
    pub precedence: i32,
    /// "consul".
    #[serde(rename = "Type")]
    pub type_: String,
    pub description: String,
    /// Set only for intentions made through the legacy API.
    #[serde(rename = "LegacyID")]
    pub legacy_id: String,
    pub legacy_meta: BTreeMap<String, String>,
    pub legacy_create_time: Option<String>,
    pub legacy_update_time: Option<String>,
}
