//! The JSON shape of each config entry kind: which members are structured
//! (their keys are known, matched leniently on input and pruned when empty
//! on output) and which are free-form maps whose keys are kept verbatim.
//!
//! Decoding (`crate::config_check::decode`) and serialization
//! ([`super::ConfigEntry::to_json`]) both walk these tables, so the two stay
//! in step with the structs in `super`.

use super::Kind;
use serde_json::Value;

/// A JSON value's shape.
#[derive(Debug)]
pub enum Shape {
    /// A scalar or a free-form value: kept exactly as given.
    Any,
    /// An object with known members, by their canonical (CamelCase) key.
    Obj(&'static [(&'static str, Shape)]),
    /// A list of values of one shape.
    List(&'static Shape),
    /// An object with user-chosen keys (kept verbatim) and values of one shape.
    Map(&'static Shape),
}

use Shape::{Any, List, Map, Obj};

/// A whole entry's shape: the members every kind has (Kind, Name,
/// Namespace, Partition first; Meta and the Raft indexes last, in Consul's
/// order) around the kind's own, so the envelope is written once.
macro_rules! entry {
    ($($member:expr,)*) => {
        Obj(&[
            ("Kind", Any),
            ("Name", Any),
            ("Namespace", Any),
            ("Partition", Any),
            $($member,)*
            ("Meta", Any),
            ("CreateIndex", Any),
            ("ModifyIndex", Any),
        ])
    };
}

const MESH_GATEWAY: Shape = Obj(&[("Mode", Any)]);
const TRANSPARENT_PROXY: Shape = Obj(&[("OutboundListenerPort", Any), ("DialedDirectly", Any)]);
const EXPOSE_PATH: Shape = Obj(&[
    ("ListenerPort", Any),
    ("Path", Any),
    ("LocalPathPort", Any),
    ("Protocol", Any),
    ("ParsedFromCheck", Any),
]);
const EXPOSE: Shape = Obj(&[("Checks", Any), ("Paths", List(&EXPOSE_PATH))]);
const ACCESS_LOGS: Shape = Obj(&[
    ("Enabled", Any),
    ("DisableListenerLogs", Any),
    ("Type", Any),
    ("Path", Any),
    ("JSONFormat", Any),
    ("TextFormat", Any),
]);
const ENVOY_EXTENSION: Shape = Obj(&[
    ("Name", Any),
    ("Required", Any),
    ("Arguments", Any),
    ("ConsulVersion", Any),
    ("EnvoyVersion", Any),
]);
const FAILOVER_POLICY: Shape = Obj(&[("Mode", Any), ("Regions", Any)]);
const PRIORITIZE_BY_LOCALITY: Shape = Obj(&[("Mode", Any)]);

const PROXY_DEFAULTS: Shape = entry!(
    ("Config", Any),
    ("Mode", Any),
    ("TransparentProxy", TRANSPARENT_PROXY),
    ("MutualTLSMode", Any),
    ("MeshGateway", MESH_GATEWAY),
    ("Expose", EXPOSE),
    ("AccessLogs", ACCESS_LOGS),
    ("EnvoyExtensions", List(&ENVOY_EXTENSION)),
    ("FailoverPolicy", FAILOVER_POLICY),
    ("PrioritizeByLocality", PRIORITIZE_BY_LOCALITY),
);

const UPSTREAM_LIMITS: Shape = Obj(&[
    ("MaxConnections", Any),
    ("MaxPendingRequests", Any),
    ("MaxConcurrentRequests", Any),
]);
const PASSIVE_HEALTH_CHECK: Shape = Obj(&[
    ("Interval", Any),
    ("MaxFailures", Any),
    ("EnforcingConsecutive5xx", Any),
    ("MaxEjectionPercent", Any),
    ("BaseEjectionTime", Any),
]);
const UPSTREAM_CONFIG: Shape = Obj(&[
    ("Name", Any),
    ("Namespace", Any),
    ("Partition", Any),
    ("Peer", Any),
    ("EnvoyListenerJSON", Any),
    ("EnvoyClusterJSON", Any),
    ("Protocol", Any),
    ("ConnectTimeoutMs", Any),
    ("Limits", UPSTREAM_LIMITS),
    ("PassiveHealthCheck", PASSIVE_HEALTH_CHECK),
    ("MeshGateway", MESH_GATEWAY),
    ("BalanceOutboundConnections", Any),
]);
const UPSTREAM_CONFIGURATION: Shape = Obj(&[
    ("Overrides", List(&UPSTREAM_CONFIG)),
    ("Defaults", UPSTREAM_CONFIG),
]);
const DESTINATION: Shape = Obj(&[("Addresses", Any), ("Port", Any)]);
const ROUTE_RATE_LIMITS: Shape = Obj(&[
    ("PathExact", Any),
    ("PathPrefix", Any),
    ("PathRegex", Any),
    ("RequestsPerSecond", Any),
    ("RequestsMaxBurst", Any),
]);
const RATE_LIMITS: Shape = Obj(&[(
    "InstanceLevel",
    Obj(&[
        ("RequestsPerSecond", Any),
        ("RequestsMaxBurst", Any),
        ("Routes", List(&ROUTE_RATE_LIMITS)),
    ]),
)]);

const SERVICE_DEFAULTS: Shape = entry!(
    ("Protocol", Any),
    ("Mode", Any),
    ("TransparentProxy", TRANSPARENT_PROXY),
    ("MutualTLSMode", Any),
    ("MeshGateway", MESH_GATEWAY),
    ("Expose", EXPOSE),
    ("ExternalSNI", Any),
    ("UpstreamConfig", UPSTREAM_CONFIGURATION),
    ("Destination", DESTINATION),
    ("RateLimits", RATE_LIMITS),
    ("MaxInboundConnections", Any),
    ("LocalConnectTimeoutMs", Any),
    ("LocalRequestTimeoutMs", Any),
    ("BalanceInboundConnections", Any),
    ("EnvoyExtensions", List(&ENVOY_EXTENSION)),
);

/// Add/Set are maps of header names: verbatim.
const HEADER_MODIFIERS: Shape = Obj(&[("Add", Any), ("Set", Any), ("Remove", Any)]);
const HEADER_MATCH: Shape = Obj(&[
    ("Name", Any),
    ("Present", Any),
    ("Exact", Any),
    ("Prefix", Any),
    ("Suffix", Any),
    ("Regex", Any),
    ("Invert", Any),
]);
const QUERY_PARAM_MATCH: Shape = Obj(&[
    ("Name", Any),
    ("Present", Any),
    ("Exact", Any),
    ("Regex", Any),
]);
const HTTP_MATCH: Shape = Obj(&[
    ("PathExact", Any),
    ("PathPrefix", Any),
    ("PathRegex", Any),
    ("Header", List(&HEADER_MATCH)),
    ("QueryParam", List(&QUERY_PARAM_MATCH)),
    ("Methods", Any),
]);
const ROUTE_DESTINATION: Shape = Obj(&[
    ("Service", Any),
    ("ServiceSubset", Any),
    ("Namespace", Any),
    ("Partition", Any),
    ("PrefixRewrite", Any),
    ("RequestTimeout", Any),
    ("IdleTimeout", Any),
    ("NumRetries", Any),
    ("RetryOnConnectFailure", Any),
    ("RetryOn", Any),
    ("RetryOnStatusCodes", Any),
    ("RequestHeaders", HEADER_MODIFIERS),
    ("ResponseHeaders", HEADER_MODIFIERS),
]);
/// One route of a service-router.
pub const ROUTE: Shape = Obj(&[
    ("Match", Obj(&[("HTTP", HTTP_MATCH)])),
    ("Destination", ROUTE_DESTINATION),
]);

const SERVICE_ROUTER: Shape = entry!(("Routes", List(&ROUTE)),);

/// One split of a service-splitter.
pub const SPLIT: Shape = Obj(&[
    ("Weight", Any),
    ("Service", Any),
    ("ServiceSubset", Any),
    ("Namespace", Any),
    ("Partition", Any),
    ("RequestHeaders", HEADER_MODIFIERS),
    ("ResponseHeaders", HEADER_MODIFIERS),
]);

const SERVICE_SPLITTER: Shape = entry!(("Splits", List(&SPLIT)),);

const SUBSET: Shape = Obj(&[("Filter", Any), ("OnlyPassing", Any)]);
const REDIRECT: Shape = Obj(&[
    ("Service", Any),
    ("ServiceSubset", Any),
    ("Namespace", Any),
    ("Partition", Any),
    ("Datacenter", Any),
    ("Peer", Any),
]);
const FAILOVER_TARGET: Shape = Obj(&[
    ("Service", Any),
    ("ServiceSubset", Any),
    ("Partition", Any),
    ("Namespace", Any),
    ("Datacenter", Any),
    ("Peer", Any),
]);
const FAILOVER: Shape = Obj(&[
    ("Service", Any),
    ("ServiceSubset", Any),
    ("Namespace", Any),
    ("Datacenters", Any),
    ("Targets", List(&FAILOVER_TARGET)),
    ("Policy", FAILOVER_POLICY),
]);
/// A service-resolver's LoadBalancer.
pub const LOAD_BALANCER: Shape = Obj(&[
    ("Policy", Any),
    (
        "RingHashConfig",
        Obj(&[("MinimumRingSize", Any), ("MaximumRingSize", Any)]),
    ),
    ("LeastRequestConfig", Obj(&[("ChoiceCount", Any)])),
    (
        "HashPolicies",
        List(&Obj(&[
            ("Field", Any),
            ("FieldValue", Any),
            (
                "CookieConfig",
                Obj(&[("Session", Any), ("TTL", Any), ("Path", Any)]),
            ),
            ("SourceIP", Any),
            ("Terminal", Any),
        ])),
    ),
]);

const SERVICE_RESOLVER: Shape = entry!(
    ("DefaultSubset", Any),
    ("Subsets", Map(&SUBSET)),
    ("Redirect", REDIRECT),
    ("Failover", Map(&FAILOVER)),
    ("ConnectTimeout", Any),
    ("RequestTimeout", Any),
    ("LoadBalancer", LOAD_BALANCER),
);

/// Consul's `IntentionHTTPHeaderPermission` has the members of a route's
/// header match.
const INTENTION_HEADER: Shape = HEADER_MATCH;
const INTENTION_PERMISSION: Shape = Obj(&[
    ("Action", Any),
    (
        "HTTP",
        Obj(&[
            ("PathExact", Any),
            ("PathPrefix", Any),
            ("PathRegex", Any),
            ("Header", List(&INTENTION_HEADER)),
            ("Methods", Any),
        ]),
    ),
]);
const SOURCE_INTENTION: Shape = Obj(&[
    ("Name", Any),
    ("Peer", Any),
    ("Namespace", Any),
    ("Partition", Any),
    ("SamenessGroup", Any),
    ("Action", Any),
    ("Permissions", List(&INTENTION_PERMISSION)),
    ("Precedence", Any),
    ("Type", Any),
    ("Description", Any),
    ("LegacyID", Any),
    ("LegacyMeta", Any),
    ("LegacyCreateTime", Any),
    ("LegacyUpdateTime", Any),
]);
const SERVICE_INTENTIONS: Shape = entry!(("Sources", List(&SOURCE_INTENTION)),);

// The mesh-wide and gateway kinds (`super::gateway`).
const MESH_DIRECTIONAL_TLS: Shape = Obj(&[
    ("TLSMinVersion", Any),
    ("TLSMaxVersion", Any),
    ("CipherSuites", Any),
]);
const MESH: Shape = entry!(
    ("TransparentProxy", Obj(&[("MeshDestinationsOnly", Any)])),
    ("AllowEnablingPermissiveMutualTLS", Any),
    (
        "TLS",
        Obj(&[
            ("Incoming", MESH_DIRECTIONAL_TLS),
            ("Outgoing", MESH_DIRECTIONAL_TLS)
        ])
    ),
    ("HTTP", Obj(&[("SanitizeXForwardedClientCert", Any)])),
    ("Peering", Obj(&[("PeerThroughMeshGateways", Any)])),
);
const GATEWAY_SDS: Shape = Obj(&[("ClusterName", Any), ("CertResource", Any)]);
const GATEWAY_TLS: Shape = Obj(&[
    ("Enabled", Any),
    ("TLSMinVersion", Any),
    ("TLSMaxVersion", Any),
    ("CipherSuites", Any),
    ("SDS", GATEWAY_SDS),
]);
const INGRESS_SERVICE: Shape = Obj(&[
    ("Name", Any),
    ("Hosts", Any),
    ("Namespace", Any),
    ("Partition", Any),
    ("TLS", Obj(&[("SDS", GATEWAY_SDS)])),
    ("RequestHeaders", HEADER_MODIFIERS),
    ("ResponseHeaders", HEADER_MODIFIERS),
    ("MaxConnections", Any),
    ("MaxPendingRequests", Any),
    ("MaxConcurrentRequests", Any),
    ("PassiveHealthCheck", PASSIVE_HEALTH_CHECK),
]);
const INGRESS_LISTENER: Shape = Obj(&[
    ("Port", Any),
    ("Protocol", Any),
    ("TLS", GATEWAY_TLS),
    ("Services", List(&INGRESS_SERVICE)),
]);
const INGRESS_GATEWAY: Shape = entry!(
    ("TLS", GATEWAY_TLS),
    ("Listeners", List(&INGRESS_LISTENER)),
    (
        "Defaults",
        Obj(&[
            ("MaxConnections", Any),
            ("MaxPendingRequests", Any),
            ("MaxConcurrentRequests", Any),
            ("PassiveHealthCheck", PASSIVE_HEALTH_CHECK)
        ])
    ),
);
const LINKED_SERVICE: Shape = Obj(&[
    ("Name", Any),
    ("Namespace", Any),
    ("Partition", Any),
    ("CAFile", Any),
    ("CertFile", Any),
    ("KeyFile", Any),
    ("SNI", Any),
    ("DisableAutoHostRewrite", Any),
]);
const TERMINATING_GATEWAY: Shape = entry!(("Services", List(&LINKED_SERVICE)),);
const SERVICE_CONSUMER: Shape = Obj(&[("Partition", Any), ("Peer", Any), ("SamenessGroup", Any)]);
const EXPORTED_SERVICE: Shape = Obj(&[
    ("Name", Any),
    ("Namespace", Any),
    ("Consumers", List(&SERVICE_CONSUMER)),
]);
const EXPORTED_SERVICES: Shape = entry!(("Services", List(&EXPORTED_SERVICE)),);

/// The shape of a whole entry of `kind`.
pub fn for_kind(kind: Kind) -> &'static Shape {
    match kind {
        Kind::ProxyDefaults => &PROXY_DEFAULTS,
        Kind::ServiceDefaults => &SERVICE_DEFAULTS,
        Kind::ServiceRouter => &SERVICE_ROUTER,
        Kind::ServiceSplitter => &SERVICE_SPLITTER,
        Kind::ServiceResolver => &SERVICE_RESOLVER,
        Kind::ServiceIntentions => &SERVICE_INTENTIONS,
        Kind::Mesh => &MESH,
        Kind::IngressGateway => &INGRESS_GATEWAY,
        Kind::TerminatingGateway => &TERMINATING_GATEWAY,
        Kind::ExportedServices => &EXPORTED_SERVICES,
    }
}

/// The values Consul's `omitempty` leaves out (and the conformance
/// comparison ignores): null, "", false, 0, {} and [].
pub fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Drops empty members of structured objects, recursively; free-form
/// values and map keys are left alone (a subset `{}` still defines a subset).
pub fn prune(v: Value, shape: &Shape) -> Value {
    match (v, shape) {
        (Value::Object(m), Obj(fields)) => Value::Object(
            m.into_iter()
                .filter_map(|(k, x)| {
                    let x = match fields.iter().find(|(name, _)| *name == k) {
                        Some((_, s)) => prune(x, s),
                        None => x,
                    };
                    (!is_empty(&x)).then_some((k, x))
                })
                .collect(),
        ),
        (Value::Object(m), Map(s)) => {
            Value::Object(m.into_iter().map(|(k, x)| (k, prune(x, s))).collect())
        }
        (Value::Array(a), List(s)) => Value::Array(a.into_iter().map(|x| prune(x, s)).collect()),
        (v, _) => v,
    }
}
