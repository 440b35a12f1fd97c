//! Ready-made [`Schema`]s for the row types of Consul's filterable
//! catalog, health and agent endpoints.
//!
//! They mirror the Go structs Consul hands to `bexpr.CreateFilter`
//! (`structs.Node`, `ServiceNode`, `NodeService`, `HealthCheck`,
//! `CheckServiceNode`), field for field, with the fields Consul hides from
//! filtering left out: `RaftIndex` (so `CreateIndex`/`ModifyIndex` are *not*
//! valid selectors, matching Consul), enterprise metadata, `Locality`,
//! `SidecarService`. Health-check definition durations are left out too:
//! Go filters them as integers while the JSON carries strings like `"10s"`.
//!
//! Field names are the JSON names, which for these types are the Go names.

use super::schema::Schema;
use super::schema::Schema::{Bool, Int, List, Map, Opaque, Struct, Uint};

const STRING: Schema = Schema::String;
const STRING_MAP: Schema = Map(&STRING);
const STRING_LIST: Schema = List(&STRING);
/// Go `map[string]interface{}`: keys can be tested, values cannot.
const OPAQUE_MAP: Schema = Map(&Opaque);

/// `structs.Weights`.
pub const WEIGHTS: Schema = Struct(&[("Passing", Int), ("Warning", Int)]);

/// `structs.ServiceAddress` (values of `TaggedAddresses` on services).
pub const SERVICE_ADDRESS: Schema = Struct(&[("Address", STRING), ("Port", Int)]);

/// `structs.MeshGatewayConfig`.
pub const MESH_GATEWAY_CONFIG: Schema = Struct(&[("Mode", STRING)]);

/// `structs.TransparentProxyConfig`.
pub const TRANSPARENT_PROXY_CONFIG: Schema =
    Struct(&[("OutboundListenerPort", Int), ("DialedDirectly", Bool)]);

/// `structs.ExposePath`.
pub const EXPOSE_PATH: Schema = Struct(&[
    ("ListenerPort", Int),
    ("Path", STRING),
    ("LocalPathPort", Int),
    ("Protocol", STRING),
    ("ParsedFromCheck", Bool),
]);

/// `structs.ExposeConfig`.
pub const EXPOSE_CONFIG: Schema = Struct(&[("Checks", Bool), ("Paths", List(&EXPOSE_PATH))]);

/// `structs.AccessLogsConfig`.
pub const ACCESS_LOGS_CONFIG: Schema = Struct(&[
    ("Enabled", Bool),
    ("DisableListenerLogs", Bool),
    ("Type", STRING),
    ("Path", STRING),
    ("JSONFormat", STRING),
    ("TextFormat", STRING),
]);

/// `structs.EnvoyExtension`.
pub const ENVOY_EXTENSION: Schema = Struct(&[
    ("Name", STRING),
    ("Required", Bool),
    ("Arguments", OPAQUE_MAP),
    ("ConsulVersion", STRING),
    ("EnvoyVersion", STRING),
]);

/// `structs.Upstream`.
pub const UPSTREAM: Schema = Struct(&[
    ("DestinationType", STRING),
    ("DestinationNamespace", STRING),
    ("DestinationPartition", STRING),
    ("DestinationPeer", STRING),
    ("DestinationName", STRING),
    ("Datacenter", STRING),
    ("LocalBindAddress", STRING),
    ("LocalBindPort", Int),
    ("LocalBindSocketPath", STRING),
    ("LocalBindSocketMode", STRING),
    ("Config", OPAQUE_MAP),
    ("MeshGateway", MESH_GATEWAY_CONFIG),
]);

/// `structs.ConnectProxyConfig` (`ServiceProxy` / `Service.Proxy`).
pub const CONNECT_PROXY_CONFIG: Schema = Struct(&[
    ("DestinationServiceName", STRING),
    ("DestinationServiceID", STRING),
    ("LocalServiceAddress", STRING),
    ("LocalServicePort", Int),
    ("LocalServiceSocketPath", STRING),
    ("Mode", STRING),
    ("Config", OPAQUE_MAP),
    ("Upstreams", List(&UPSTREAM)),
    ("MeshGateway", MESH_GATEWAY_CONFIG),
    ("Expose", EXPOSE_CONFIG),
    ("TransparentProxy", TRANSPARENT_PROXY_CONFIG),
    ("AccessLogs", ACCESS_LOGS_CONFIG),
    ("EnvoyExtensions", List(&ENVOY_EXTENSION)),
    ("MutualTLSMode", STRING),
]);

/// `structs.ServiceConnect` (`SidecarService` is hidden from bexpr).
pub const SERVICE_CONNECT: Schema = Struct(&[("Native", Bool)]);

/// `structs.Node`.
pub const NODE: Schema = Struct(&[
    ("ID", STRING),
    ("Node", STRING),
    ("Address", STRING),
    ("Datacenter", STRING),
    ("Partition", STRING),
    ("PeerName", STRING),
    ("TaggedAddresses", STRING_MAP),
    ("Meta", STRING_MAP),
]);

/// `structs.ServiceNode`: the flat node+service row.
pub const SERVICE_NODE: Schema = Struct(&[
    ("ID", STRING),
    ("Node", STRING),
    ("Address", STRING),
    ("Datacenter", STRING),
    ("TaggedAddresses", STRING_MAP),
    ("NodeMeta", STRING_MAP),
    ("ServiceKind", STRING),
    ("ServiceID", STRING),
    ("ServiceName", STRING),
    ("ServiceTags", STRING_LIST),
    ("ServiceAddress", STRING),
    ("ServiceTaggedAddresses", Map(&SERVICE_ADDRESS)),
    ("ServiceWeights", WEIGHTS),
    ("ServiceMeta", STRING_MAP),
    ("ServicePort", Int),
    ("ServiceSocketPath", STRING),
    ("ServiceEnableTagOverride", Bool),
    ("ServiceProxy", CONNECT_PROXY_CONFIG),
    ("ServiceConnect", SERVICE_CONNECT),
    ("PeerName", STRING),
]);

/// `structs.NodeService`: one service instance without its node.
pub const NODE_SERVICE: Schema = Struct(&[
    ("Kind", STRING),
    ("ID", STRING),
    ("Service", STRING),
    ("Tags", STRING_LIST),
    ("Address", STRING),
    ("TaggedAddresses", Map(&SERVICE_ADDRESS)),
    ("Meta", STRING_MAP),
    ("Port", Int),
    ("SocketPath", STRING),
    ("Weights", WEIGHTS),
    ("EnableTagOverride", Bool),
    ("Proxy", CONNECT_PROXY_CONFIG),
    ("Connect", SERVICE_CONNECT),
    ("PeerName", STRING),
]);

/// `structs.HealthCheckDefinition`, minus the duration fields.
pub const HEALTH_CHECK_DEFINITION: Schema = Struct(&[
    ("HTTP", STRING),
    ("TLSServerName", STRING),
    ("TLSSkipVerify", Bool),
    ("Header", Map(&STRING_LIST)),
    ("Method", STRING),
    ("Body", STRING),
    ("DisableRedirects", Bool),
    ("TCP", STRING),
    ("TCPUseTLS", Bool),
    ("UDP", STRING),
    ("H2PING", STRING),
    ("H2PingUseTLS", Bool),
    ("OSService", STRING),
    ("OutputMaxSize", Uint),
    ("ScriptArgs", STRING_LIST),
    ("DockerContainerID", STRING),
    ("Shell", STRING),
    ("GRPC", STRING),
    ("GRPCUseTLS", Bool),
    ("AliasNode", STRING),
    ("AliasService", STRING),
]);

/// `structs.HealthCheck`.
pub const HEALTH_CHECK: Schema = Struct(&[
    ("Node", STRING),
    ("CheckID", STRING),
    ("Name", STRING),
    ("Status", STRING),
    ("Notes", STRING),
    ("Output", STRING),
    ("ServiceID", STRING),
    ("ServiceName", STRING),
    ("ServiceTags", STRING_LIST),
    ("Type", STRING),
    ("Interval", STRING),
    ("Timeout", STRING),
    ("ExposedPort", Int),
    ("PeerName", STRING),
    ("Definition", HEALTH_CHECK_DEFINITION),
]);

/// `structs.CheckServiceNode`: `{"Node": .., "Service": .., "Checks": [..]}`.
pub const CHECK_SERVICE_NODE: Schema = Struct(&[
    ("Node", NODE),
    ("Service", NODE_SERVICE),
    ("Checks", List(&HEALTH_CHECK)),
]);

/// Rows of `GET /v1/catalog/nodes`.
pub static CATALOG_NODES: Schema = NODE;

/// Rows of `GET /v1/catalog/service/:service`, `/v1/catalog/connect/:service`
/// and (before grouping by name) `/v1/catalog/services`.
pub static CATALOG_SERVICE: Schema = SERVICE_NODE;

/// Services of `GET /v1/catalog/node-services/:node` and
/// `/v1/catalog/node/:node`.
pub static CATALOG_NODE_SERVICES: Schema = NODE_SERVICE;

#[cfg(test)]
/// Values of `GET /v1/agent/services` (Consul's `api.AgentService` has the
/// same filterable fields as `NodeService`).
pub static AGENT_SERVICES: Schema = NODE_SERVICE;

/// Rows of `GET /v1/health/node/:node`, `/v1/health/checks/:service`,
/// `/v1/health/state/:state` and values of `/v1/agent/checks`.
pub static HEALTH_CHECKS: Schema = HEALTH_CHECK;

/// Rows of `GET /v1/health/service/:service`, `/v1/health/connect/:service`
/// and `/v1/health/ingress/:service`; also what discovery-chain resolver
/// subset filters are evaluated against.
pub static HEALTH_SERVICE: Schema = CHECK_SERVICE_NODE;
