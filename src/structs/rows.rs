//! The rows of Consul's read endpoints that are not one stored type: a
//! service instance flattened with its node (`ServiceNode`), an instance
//! with its node and checks (`CheckServiceNode`), a node with its services.
//! They borrow from the state version, so a large answer copies nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    ConnectProxyConfig, HealthCheck, Locality, Meta, Node, NodeService, ServiceAddress, Weights,
};

/// Consul's `ServiceNode`: one service instance flattened with its node,
/// borrowed from the state version so a large answer copies nothing.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceNodeRow<'a> {
    #[serde(rename = "ID")]
    pub id: &'a str,
    pub node: &'a str,
    pub address: &'a str,
    pub datacenter: &'a str,
    pub tagged_addresses: &'a BTreeMap<String, String>,
    pub node_meta: &'a Meta,
    pub service_kind: &'a str,
    #[serde(rename = "ServiceID")]
    pub service_id: &'a str,
    pub service_name: &'a str,
    pub service_tags: &'a [String],
    pub service_address: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub service_tagged_addresses: &'a BTreeMap<String, ServiceAddress>,
    pub service_weights: &'a Weights,
    pub service_meta: &'a Meta,
    pub service_port: i64,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub service_socket_path: &'a str,
    pub service_enable_tag_override: bool,
    pub service_proxy: &'a ConnectProxyConfig,
    pub service_connect: &'a Map<String, Value>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub service_peer_name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_locality: Option<&'a Locality>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl<'a> ServiceNodeRow<'a> {
    pub fn new(node: &'a Node, svc: &'a NodeService, dc: &'a str) -> Self {
        ServiceNodeRow {
            id: &node.id,
            node: &node.node,
            address: &node.address,
            datacenter: if node.datacenter.is_empty() {
                dc
            } else {
                &node.datacenter
            },
            tagged_addresses: &node.tagged_addresses,
            node_meta: &node.meta,
            service_kind: svc.kind.as_str(),
            service_id: &svc.id,
            service_name: &svc.service,
            service_tags: &svc.tags,
            service_address: &svc.address,
            service_tagged_addresses: &svc.tagged_addresses,
            service_weights: &svc.weights,
            service_meta: &svc.meta,
            service_port: svc.port,
            service_socket_path: &svc.socket_path,
            service_enable_tag_override: svc.enable_tag_override,
            service_proxy: &svc.proxy,
            service_connect: &svc.connect,
            service_peer_name: &svc.peer_name,
            service_locality: svc.locality.as_ref(),
            create_index: svc.create_index,
            modify_index: svc.modify_index,
        }
    }
}

/// `{"Node": .., "Services": ..}`, a struct so the node keeps Consul's
/// field order (a `json!` map would sort it).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeWith<'a, S> {
    pub node: Option<&'a Node>,
    pub services: S,
}

/// One `/v1/health/service` row, borrowed from the state version.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct CheckServiceNode<'a> {
    pub node: &'a Node,
    pub service: &'a NodeService,
    pub checks: &'a [Arc<HealthCheck>],
}
