//! The mesh-wide and gateway kinds: `mesh`, `ingress-gateway`,
//! `terminating-gateway` and `exported-services`, with Consul's (1.15+)
//! field sets. Declared here (inside `config_entry`, so they share its
//! envelope macro) and re-exported from it.

use super::{HttpHeaderModifiers, PassiveHealthCheck};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Name of the only `mesh` entry.
pub const MESH_CONFIG_NAME: &str = "mesh";

/// Name of the only `exported-services` entry of the (only) partition.
pub const EXPORTED_SERVICES_NAME: &str = "default";

/// The service name that stands for every service.
pub const WILDCARD: &str = "*";

// ---------------------------------------------------------------------------
// mesh
// ---------------------------------------------------------------------------

config_entry! {
    pub struct MeshConfigEntry {
        pub transparent_proxy: MeshTransparentProxyConfig,
        #[serde(rename = "AllowEnablingPermissiveMutualTLS")]
        pub allow_enabling_permissive_mutual_tls: bool,
        #[serde(rename = "TLS")]
        pub tls: Option<MeshTlsConfig>,
        #[serde(rename = "HTTP")]
        pub http: Option<MeshHttpConfig>,
        pub peering: Option<PeeringMeshConfig>,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MeshTransparentProxyConfig {
    pub mesh_destinations_only: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MeshTlsConfig {
    pub incoming: Option<MeshDirectionalTlsConfig>,
    pub outgoing: Option<MeshDirectionalTlsConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MeshDirectionalTlsConfig {
    #[serde(rename = "TLSMinVersion")]
    pub tls_min_version: String,
    #[serde(rename = "TLSMaxVersion")]
    pub tls_max_version: String,
    #[serde(rename = "CipherSuites")]
    pub cipher_suites: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MeshHttpConfig {
    pub sanitize_x_forwarded_client_cert: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PeeringMeshConfig {
    pub peer_through_mesh_gateways: bool,
}

// ---------------------------------------------------------------------------
// ingress-gateway
// ---------------------------------------------------------------------------

config_entry! {
    pub struct IngressGatewayConfigEntry {
        #[serde(rename = "TLS")]
        pub tls: GatewayTlsConfig,
        pub listeners: Vec<IngressListener>,
        pub defaults: Option<IngressServiceConfig>,
    }
}

/// TLS served to the gateway's downstreams: the built-in CA's leaf when
/// `Enabled`, or certificates fetched over SDS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayTlsConfig {
    #[serde(rename = "Enabled")]
    pub enabled: bool,
    #[serde(rename = "TLSMinVersion")]
    pub tls_min_version: String,
    #[serde(rename = "TLSMaxVersion")]
    pub tls_max_version: String,
    #[serde(rename = "CipherSuites")]
    pub cipher_suites: Vec<String>,
    #[serde(rename = "SDS")]
    pub sds: Option<GatewayTlsSdsConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct GatewayTlsSdsConfig {
    pub cluster_name: String,
    pub cert_resource: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct GatewayServiceTlsConfig {
    #[serde(rename = "SDS")]
    pub sds: Option<GatewayTlsSdsConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IngressServiceConfig {
    pub max_connections: u32,
    pub max_pending_requests: u32,
    pub max_concurrent_requests: u32,
    pub passive_health_check: Option<PassiveHealthCheck>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IngressListener {
    pub port: i64,
    /// tcp (the default), http, http2 or grpc.
    pub protocol: String,
    #[serde(rename = "TLS")]
    pub tls: Option<GatewayTlsConfig>,
    pub services: Vec<IngressService>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IngressService {
    pub name: String,
    pub hosts: Vec<String>,
    pub namespace: String,
    pub partition: String,
    #[serde(rename = "TLS")]
    pub tls: Option<GatewayServiceTlsConfig>,
    pub request_headers: Option<HttpHeaderModifiers>,
    pub response_headers: Option<HttpHeaderModifiers>,
    pub max_connections: u32,
    pub max_pending_requests: u32,
    pub max_concurrent_requests: u32,
    pub passive_health_check: Option<PassiveHealthCheck>,
}

// ---------------------------------------------------------------------------
// terminating-gateway
// ---------------------------------------------------------------------------

config_entry! {
    pub struct TerminatingGatewayConfigEntry {
        pub services: Vec<LinkedService>,
    }
}

/// A service outside the mesh the gateway sends mesh traffic to, with the
/// TLS it originates (none without `CAFile`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkedService {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Namespace")]
    pub namespace: String,
    #[serde(rename = "Partition")]
    pub partition: String,
    #[serde(rename = "CAFile")]
    pub ca_file: String,
    #[serde(rename = "CertFile")]
    pub cert_file: String,
    #[serde(rename = "KeyFile")]
    pub key_file: String,
    #[serde(rename = "SNI")]
    pub sni: String,
    #[serde(rename = "DisableAutoHostRewrite")]
    pub disable_auto_host_rewrite: bool,
}

// ---------------------------------------------------------------------------
// exported-services
// ---------------------------------------------------------------------------

config_entry! {
    /// Which services this partition offers to peers, partitions and
    /// sameness groups (ready for peering: stored and validated only).
    pub struct ExportedServicesConfigEntry {
        pub services: Vec<ExportedService>,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExportedService {
    pub name: String,
    pub namespace: String,
    pub consumers: Vec<ServiceConsumer>,
}

/// Exactly one of the three.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceConsumer {
    pub partition: String,
    pub peer: String,
    pub sameness_group: String,
}

// ---------------------------------------------------------------------------
// The services a gateway fronts (`/v1/catalog/gateway-services/:gateway`)
// ---------------------------------------------------------------------------

/// A service's or gateway's name, as Consul's `ServiceName` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceNameRef {
    pub name: String,
}

/// One service linked to a gateway by the gateway's config entry
/// (Consul's `GatewayService`): for an ingress gateway, the listener it
/// is served on; for a terminating gateway, the TLS it is dialed with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GatewayService {
    pub gateway: ServiceNameRef,
    pub service: ServiceNameRef,
    /// "ingress-gateway" or "terminating-gateway".
    pub gateway_kind: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub port: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(rename = "CAFile", skip_serializing_if = "String::is_empty")]
    pub ca_file: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cert_file: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub key_file: String,
    #[serde(rename = "SNI", skip_serializing_if = "String::is_empty")]
    pub sni: String,
    /// Linked by a `*` in the entry rather than by name.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub from_wildcard: bool,
    pub create_index: u64,
    pub modify_index: u64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}
