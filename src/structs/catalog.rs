//! Catalog types: nodes, services (including connect proxies) and checks,
//! in the JSON shapes of Consul's catalog, health and agent endpoints.
//!
//! These travel through Raft inside JSON strings (see `serde_util::as_json`),
//! so they may skip empty fields the way Consul's `omitempty` does.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, LazyLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::health::{HealthStatus, ServiceKind};
use super::serde_util::{is_default, null_default};
use crate::acl::{Authorizer, Denied};

pub type Meta = BTreeMap<String, String>;

/// A node of the catalog.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Node {
    #[serde(rename = "ID")]
    pub id: String,
    pub node: String,
    pub address: String,
    pub datacenter: String,
    #[serde(deserialize_with = "null_default")]
    pub tagged_addresses: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_default")]
    pub meta: Meta,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The tagged address under which the servers show a service's virtual IP
/// (transparent proxy), as Consul's `TaggedAddressVirtualIP`.
pub const TAGGED_VIRTUAL_IP: &str = "consul-virtual";

/// The tagged address under which a terminating gateway's instance shows
/// the virtual IP of a service it links (Consul's
/// `ServiceGatewayVirtualIPTag`): `consul-virtual:<service>`.
pub fn gateway_virtual_ip_tag(service: &str) -> String {
    format!("{TAGGED_VIRTUAL_IP}:{service}")
}

/// Whether `key` is a tagged address the servers set on a service row (a
/// virtual IP), never sent by an agent.
pub fn is_server_tagged_address(key: &str) -> bool {
    key.strip_prefix(TAGGED_VIRTUAL_IP)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
}

/// An address and port, as in `TaggedAddresses` of a service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceAddress {
    pub address: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Weights {
    pub passing: i64,
    pub warning: i64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            passing: 1,
            warning: 1,
        }
    }
}

/// `MeshGateway` of a proxy or upstream: `{}` or `{"Mode":"local"}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MeshGatewayConfig {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

/// One upstream of a connect proxy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Upstream {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_type: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_partition: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_peer: String,
    pub destination_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub datacenter: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_bind_address: String,
    #[serde(skip_serializing_if = "is_default")]
    pub local_bind_port: u16,
    /// Opaque; shared (`Arc`) because a merged read hands the same central
    /// config to every instance that declares this upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Arc<Map<String, Value>>>,
    #[serde(skip_serializing_if = "is_default")]
    pub mesh_gateway: MeshGatewayConfig,
    #[serde(skip_serializing_if = "is_default")]
    pub centrally_configured: bool,
    /// Fields cairn does not interpret, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `Proxy.TransparentProxy`. Go would show an unset one as `{}`; we leave
/// empty structs out (as the conformance cases expect), like empty fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TransparentProxyConfig {
    #[serde(skip_serializing_if = "is_default")]
    pub outbound_listener_port: i64,
    #[serde(skip_serializing_if = "is_default")]
    pub dialed_directly: bool,
}

/// `Proxy.Expose`: paths the proxy exposes without mTLS (e.g. health checks).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExposeConfig {
    #[serde(skip_serializing_if = "is_default")]
    pub checks: bool,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub paths: Vec<ExposePath>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExposePath {
    #[serde(skip_serializing_if = "is_default")]
    pub listener_port: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(skip_serializing_if = "is_default")]
    pub local_path_port: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    #[serde(skip_serializing_if = "is_default")]
    pub parsed_from_check: bool,
}

/// `Proxy.AccessLogs`, as proxy-defaults sets them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AccessLogsConfig {
    #[serde(skip_serializing_if = "is_default")]
    pub enabled: bool,
    #[serde(skip_serializing_if = "is_default")]
    pub disable_listener_logs: bool,
    /// "", "file", "stdout" or "stderr".
    #[serde(rename = "Type", skip_serializing_if = "String::is_empty")]
    pub log_type: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(rename = "JSONFormat", skip_serializing_if = "String::is_empty")]
    pub json_format: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub text_format: String,
}

/// One of `Proxy.EnvoyExtensions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EnvoyExtension {
    pub name: String,
    #[serde(skip_serializing_if = "is_default")]
    pub required: bool,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub arguments: Map<String, Value>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub consul_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub envoy_version: String,
}

/// `Proxy` of a connect-proxy (or gateway) service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ConnectProxyConfig {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_service_name: String,
    #[serde(
        rename = "DestinationServiceID",
        skip_serializing_if = "String::is_empty"
    )]
    pub destination_service_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_service_address: String,
    #[serde(skip_serializing_if = "is_default")]
    pub local_service_port: u16,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// Opaque; shared (`Arc`) for the same reason as `Upstream::config`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Arc<Map<String, Value>>>,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub upstreams: Vec<Upstream>,
    #[serde(skip_serializing_if = "is_default")]
    pub mesh_gateway: MeshGatewayConfig,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub expose: ExposeConfig,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub transparent_proxy: TransparentProxyConfig,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub access_logs: AccessLogsConfig,
    #[serde(rename = "MutualTLSMode", skip_serializing_if = "String::is_empty")]
    pub mutual_tls_mode: String,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub envoy_extensions: Vec<EnvoyExtension>,
    /// Fields cairn does not interpret, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A service's `Proxy` block, allocated only when it is not empty. Most
/// services are not proxies, and the block inline (384 bytes) was about a
/// fifth of a registered instance's memory. Reads see an empty block; a
/// mutable borrow allocates one. It serializes exactly as the block.
#[derive(Clone, Default)]
pub struct ProxyBlock(Option<Box<ConnectProxyConfig>>);

static EMPTY_PROXY: LazyLock<ConnectProxyConfig> = LazyLock::new(ConnectProxyConfig::default);

impl Deref for ProxyBlock {
    type Target = ConnectProxyConfig;
    fn deref(&self) -> &ConnectProxyConfig {
        self.0.as_deref().unwrap_or(&EMPTY_PROXY)
    }
}

impl DerefMut for ProxyBlock {
    fn deref_mut(&mut self) -> &mut ConnectProxyConfig {
        self.0.get_or_insert_with(Default::default)
    }
}

impl From<ConnectProxyConfig> for ProxyBlock {
    fn from(p: ConnectProxyConfig) -> Self {
        ProxyBlock((p != *EMPTY_PROXY).then(|| Box::new(p)))
    }
}

impl PartialEq for ProxyBlock {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for ProxyBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl Serialize for ProxyBlock {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for ProxyBlock {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ConnectProxyConfig::deserialize(d).map(Into::into)
    }
}

/// Where an instance runs (Consul's `Locality`), stored and returned as
/// given; an empty part is left out, as Consul's `omitempty`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Locality {
    #[serde(
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub region: String,
    #[serde(
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub zone: String,
}

/// A service instance on a node (Consul's `NodeService`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeService {
    #[serde(skip_serializing_if = "ServiceKind::is_typical")]
    pub kind: ServiceKind,
    #[serde(rename = "ID")]
    pub id: String,
    pub service: String,
    #[serde(deserialize_with = "null_default")]
    pub tags: Vec<String>,
    pub address: String,
    #[serde(skip_serializing_if = "is_default", deserialize_with = "null_default")]
    pub tagged_addresses: BTreeMap<String, ServiceAddress>,
    #[serde(deserialize_with = "null_default")]
    pub meta: Meta,
    pub port: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    #[serde(deserialize_with = "null_default")]
    pub weights: Weights,
    pub enable_tag_override: bool,
    #[serde(deserialize_with = "null_default")]
    pub proxy: ProxyBlock,
    #[serde(deserialize_with = "null_default")]
    pub connect: Map<String, Value>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub peer_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locality: Option<Locality>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl NodeService {
    pub fn is_connect_proxy(&self) -> bool {
        self.kind == ServiceKind::ConnectProxy
    }

    /// The gateways served over xDS (ingress, terminating, mesh).
    pub fn is_gateway(&self) -> bool {
        matches!(
            self.kind,
            ServiceKind::IngressGateway
                | ServiceKind::TerminatingGateway
                | ServiceKind::MeshGateway
        )
    }

    /// Whether this instance is an Envoy configured by the xDS server: a
    /// sidecar proxy or a gateway.
    pub fn is_xds_proxy(&self) -> bool {
        self.is_connect_proxy() || self.is_gateway()
    }

    /// Gateways and proxies get central config merged into them.
    pub fn is_mesh_kind(&self) -> bool {
        !self.kind.is_typical()
    }

    /// Consul's rule for writing this instance, the same on a server's
    /// catalog (and txn) and when an agent accepts a registration:
    /// `service:write` on its name; on a connect proxy's destination too
    /// (the proxy is discovered as an instance of it); and on `replaced`,
    /// the name of the instance with the same node and ID it overwrites
    /// (else a rename takes over another service's instance). The first
    /// refusal is the answer.
    pub fn authorize_write(
        &self, authz: &Authorizer, replaced: Option<&str>,
    ) -> Result<(), Denied> {
        let mut names = vec![self.service.as_str()];
        if self.is_connect_proxy() {
            names.push(&self.proxy.destination_service_name);
        }
        names.extend(replaced);
        match names.into_iter().find(|n| !authz.service_write(n)) {
            Some(n) => Err(authz.deny("service:write", n)),
            None => Ok(()),
        }
    }
}

/// A health check (Consul's `HealthCheck`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HealthCheck {
    pub node: String,
    #[serde(rename = "CheckID")]
    pub check_id: String,
    pub name: String,
    pub status: HealthStatus,
    pub notes: String,
    pub output: String,
    #[serde(rename = "ServiceID")]
    pub service_id: String,
    pub service_name: String,
    #[serde(deserialize_with = "null_default")]
    pub service_tags: Vec<String>,
    #[serde(rename = "Type")]
    pub check_type: String,
    pub interval: String,
    pub timeout: String,
    pub exposed_port: i64,
    #[serde(deserialize_with = "null_default")]
    pub definition: Map<String, Value>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `PUT /v1/catalog/register`, its fields in the order of Consul's struct.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RegisterRequest {
    pub datacenter: String,
    #[serde(rename = "ID")]
    pub id: String,
    pub node: String,
    pub address: String,
    #[serde(deserialize_with = "null_default")]
    pub tagged_addresses: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_default")]
    pub node_meta: Meta,
    pub service: Option<NodeService>,
    pub check: Option<HealthCheck>,
    #[serde(deserialize_with = "null_default")]
    pub checks: Vec<HealthCheck>,
    pub skip_node_update: bool,
}

/// `PUT /v1/catalog/deregister`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DeregisterRequest {
    pub node: String,
    pub datacenter: String,
    #[serde(rename = "ServiceID")]
    pub service_id: String,
    #[serde(rename = "CheckID")]
    pub check_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writing_an_instance_needs_write_on_every_name_it_takes_or_replaces() {
        let rules = crate::acl::parse_rules("service \"web\" { policy = \"write\" }").unwrap();
        let a = Authorizer::new("t", &[&rules], crate::acl::DefaultPolicy::Deny);
        let svc = |v: Value| -> NodeService { serde_json::from_value(v).unwrap() };
        let web = svc(json!({"ID": "web-1", "Service": "web"}));
        assert_eq!(web.authorize_write(&a, None), Ok(()));
        assert_eq!(web.authorize_write(&a, Some("web")), Ok(()));
        let denied = web.authorize_write(&a, Some("db")).unwrap_err();
        assert_eq!(
            (denied.permission.as_str(), denied.resource.as_str()),
            ("service:write", "db")
        );
        let proxy = svc(json!({"ID": "p", "Service": "web", "Kind": "connect-proxy",
                               "Proxy": {"DestinationServiceName": "db"}}));
        assert_eq!(proxy.authorize_write(&a, None).unwrap_err().resource, "db");
        // A destination means something only on a connect proxy.
        let gateway = svc(json!({"ID": "g", "Service": "web", "Kind": "mesh-gateway"}));
        assert_eq!(gateway.authorize_write(&a, None), Ok(()));
        let other = svc(json!({"ID": "db-1", "Service": "db"}));
        assert_eq!(other.authorize_write(&a, None).unwrap_err().resource, "db");
    }

    #[test]
    fn a_service_that_is_not_a_proxy_holds_no_proxy_block() {
        let svc: NodeService =
            serde_json::from_value(json!({"ID": "web-1", "Service": "web", "Port": 80})).unwrap();
        assert!(svc.proxy.0.is_none(), "no allocation for an empty block");
        let out = serde_json::to_value(&svc).unwrap();
        assert_eq!(
            out["Proxy"],
            serde_json::to_value(ConnectProxyConfig::default()).unwrap()
        );
        let again: NodeService = serde_json::from_value(out).unwrap();
        assert_eq!(again, svc);
    }

    #[test]
    fn a_proxy_block_round_trips_and_a_write_allocates_it() {
        let reg = json!({
            "ID": "web-proxy", "Service": "web-proxy", "Kind": "connect-proxy",
            "Proxy": {"DestinationServiceName": "web", "LocalServicePort": 8080,
                      "Upstreams": [{"DestinationName": "db", "LocalBindPort": 9191}],
                      "Config": {"protocol": "http"}}
        });
        let svc: NodeService = serde_json::from_value(reg).unwrap();
        assert!(svc.proxy.0.is_some());
        assert_eq!(svc.proxy.destination_service_name, "web");
        assert_eq!(svc.proxy.upstreams[0].local_bind_port, 9191);
        let out = serde_json::to_value(&svc).unwrap();
        assert_eq!(out["Proxy"]["Config"]["protocol"], "http");
        assert_eq!(serde_json::from_value::<NodeService>(out).unwrap(), svc);

        let mut plain = NodeService::default();
        plain.proxy.mode = "transparent".into();
        assert!(plain.proxy.0.is_some());
        assert_ne!(plain, NodeService::default());
    }
}
