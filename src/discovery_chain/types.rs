//! The compiled discovery chain and its JSON, exactly as Consul's
//! `CompiledDiscoveryChain` (the value under `Chain` in
//! `/v1/discovery-chain/:service` answers).

use crate::structs::config_entry::shape::{self, Shape};
use crate::structs::config_entry::{
    Duration, EnvoyExtension, FailoverPolicy, LoadBalancer, MeshGatewayConfig,
    ServiceResolverSubset, ServiceRoute, ServiceSplit, TransparentProxyConfig,
};
use serde::{Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct CompiledDiscoveryChain {
    pub service_name: String,
    pub namespace: String,
    pub partition: String,
    pub datacenter: String,
    /// Non-empty when request overrides changed the result.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub customization_hash: String,
    /// No router, splitter or resolver shaped this chain.
    #[serde(skip_serializing_if = "is_false")]
    pub default: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub service_meta: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub envoy_extensions: Vec<EnvoyExtension>,
    pub start_node: String,
    pub nodes: BTreeMap<String, DiscoveryGraphNode>,
    pub targets: BTreeMap<String, DiscoveryTarget>,
    /// The virtual IPs the servers assigned the service (transparent
    /// proxies match its traffic by them).
    #[serde(rename = "AutoVirtualIPs", skip_serializing_if = "Vec::is_empty")]
    pub auto_virtual_ips: Vec<String>,
    #[serde(rename = "ManualVirtualIPs", skip_serializing_if = "Vec::is_empty")]
    pub manual_virtual_ips: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeType {
    Router,
    Splitter,
    Resolver,
}

impl NodeType {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeType::Router => "router",
            NodeType::Splitter => "splitter",
            NodeType::Resolver => "resolver",
        }
    }
}

/// A node of the chain; its key in `Nodes` is `"<type>:<name>"`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiscoveryGraphNode {
    #[serde(rename = "Type")]
    pub node_type: NodeType,
    pub name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<DiscoveryRoute>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<DiscoverySplit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolver: Option<DiscoveryResolver>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_load_balancer"
    )]
    pub load_balancer: Option<LoadBalancer>,
}

impl DiscoveryGraphNode {
    pub fn key(&self) -> String {
        node_key(self.node_type, &self.name)
    }
}

pub fn node_key(t: NodeType, name: &str) -> String {
    format!("{}:{name}", t.as_str())
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiscoveryRoute {
    #[serde(serialize_with = "serialize_route")]
    pub definition: ServiceRoute,
    pub next_node: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiscoverySplit {
    #[serde(serialize_with = "serialize_split")]
    pub definition: ServiceSplit,
    /// The effective weight once nested splitters are flattened.
    pub weight: f32,
    pub next_node: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiscoveryResolver {
    #[serde(skip_serializing_if = "is_false")]
    pub default: bool,
    pub connect_timeout: Duration,
    /// Consul writes this one as integer nanoseconds.
    #[serde(
        skip_serializing_if = "Duration::is_zero_ref",
        serialize_with = "serialize_nanos"
    )]
    pub request_timeout: Duration,
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<DiscoveryFailover>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiscoveryFailover {
    pub targets: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<FailoverPolicy>,
}

/// Where and how to find the instances of one service (subset) in one
/// datacenter; `Name` becomes the Envoy cluster name.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiscoveryTarget {
    #[serde(rename = "ID")]
    pub id: String,
    pub service: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub service_subset: String,
    pub namespace: String,
    pub partition: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub datacenter: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub peer: String,
    pub mesh_gateway: MeshGatewayConfig,
    pub subset: ServiceResolverSubset,
    pub transparent_proxy: TransparentProxyConfig,
    pub connect_timeout: Duration,
    #[serde(skip_serializing_if = "is_false")]
    pub external: bool,
    #[serde(rename = "SNI", skip_serializing_if = "String::is_empty")]
    pub sni: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
}

fn serialize_nanos<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_i64(d.nanos())
}

fn pruned<T: Serialize, S: Serializer>(v: &T, shape: &Shape, s: S) -> Result<S::Ok, S::Error> {
    let raw = serde_json::to_value(v).map_err(serde::ser::Error::custom)?;
    shape::prune(raw, shape).serialize(s)
}

fn serialize_route<S: Serializer>(r: &ServiceRoute, s: S) -> Result<S::Ok, S::Error> {
    pruned(r, &shape::ROUTE, s)
}

fn serialize_split<S: Serializer>(r: &ServiceSplit, s: S) -> Result<S::Ok, S::Error> {
    pruned(r, &shape::SPLIT, s)
}

/// Inside the compiled chain Consul writes a cookie TTL as integer
/// nanoseconds (it has no string form there).
fn serialize_load_balancer<S: Serializer>(
    lb: &Option<LoadBalancer>, s: S,
) -> Result<S::Ok, S::Error> {
    let raw = serde_json::to_value(lb).map_err(serde::ser::Error::custom)?;
    let mut v = shape::prune(raw, &shape::LOAD_BALANCER);
    if let Some(Value::Array(policies)) = v.get_mut("HashPolicies") {
        for p in policies {
            if let Some(ttl) = p.pointer_mut("/CookieConfig/TTL")
                && let Some(Ok(d)) = ttl.as_str().map(Duration::parse)
            {
                *ttl = d.nanos().into();
            }
        }
    }
    v.serialize(s)
}
