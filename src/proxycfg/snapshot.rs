//! What a proxy's snapshot holds: its merged registration, per upstream the
//! compiled chain and each target's healthy endpoints, the CA roots, its
//! leaf and intentions, and a gateway's own part; the shapes every builder
//! (`build`, `gateway`) and the remote data source (`remote`) share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::discovery_chain::CompiledDiscoveryChain;
use crate::state::catalog::Instance;
use crate::structs::config_entry::{
    GatewayService, IngressGatewayConfigEntry, MeshTlsConfig, TerminatingGatewayConfigEntry,
};
use crate::structs::connect::{CaRoots, Intention, IssuedCert};
use crate::structs::{HealthCheck, HealthStatus, NodeService};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Snapshot {
    #[serde(rename = "ProxyID")]
    pub proxy_id: Value,
    /// Bumped whenever the content changes.
    pub version: u64,
    /// The state index the content was last built from.
    pub index: u64,
    /// The proxy's registration with central config merged.
    pub service: NodeService,
    pub upstreams: BTreeMap<String, UpstreamSnapshot>,
    /// The current CA roots (`None` until the CA exists).
    pub roots: Option<Arc<CaRoots>>,
    /// This proxy's service leaf (signed on the server; its key never
    /// enters Raft). The debug JSON leaves the private key out: a debug
    /// dump is copied into logs and tickets; the key is for the proxy's
    /// xDS stream (and the leaf endpoint) only.
    #[serde(serialize_with = "leaf_without_key")]
    pub leaf: Option<Arc<IssuedCert>>,
    /// The intentions whose destination is this proxy's service, highest
    /// precedence first.
    pub intentions: Arc<Vec<Intention>>,
    /// The decision when no intention matches.
    pub intentions_default_allow: bool,
    /// A gateway's own part: its entry and what it links (`None` for a
    /// sidecar).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Arc<GatewaySnapshot>>,
    /// A transparent proxy's own part (`None`: not transparent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transparent: Option<Arc<TransparentSnapshot>>,
    /// The mesh entry's `TLS` (its `Incoming` for the mTLS a sidecar or
    /// terminating gateway accepts, its `Outgoing` for what a sidecar or
    /// ingress gateway dials with); `None` without one.
    #[serde(rename = "MeshTLS", skip_serializing_if = "Option::is_none")]
    pub mesh_tls: Option<Arc<MeshTlsConfig>>,
}

/// What a transparent proxy (`Mode: transparent`) adds to a sidecar's
/// snapshot: its outbound listener, and the upstreams its intentions allow
/// beside those it registered (in `Snapshot::upstreams` with them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TransparentSnapshot {
    /// `TransparentProxy.OutboundListenerPort`, 15001 when unset.
    pub outbound_listener_port: u16,
    /// The upstreams inferred from intentions.
    pub inferred: BTreeSet<String>,
    /// The mesh entry's `TransparentProxy.MeshDestinationsOnly`: no
    /// passthrough to destinations outside the mesh.
    pub mesh_destinations_only: bool,
}

/// Healthy connect-capable instances of one chain target (`{Node, Service,
/// Checks}`): its sidecar proxies and connect-native instances.
pub type Endpoints = Arc<Vec<Arc<Instance>>>;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct UpstreamSnapshot {
    pub chain: Option<Arc<CompiledDiscoveryChain>>,
    /// Chain compile error, if the upstream's chain does not compile.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// target ID → healthy endpoints.
    pub endpoints: BTreeMap<String, Endpoints>,
    /// target ID → the mesh gateways its traffic goes through (a target in
    /// another datacenter in mode `local` or `remote`); its `endpoints`
    /// are still its own instances there, whose health decides whether the
    /// gateways carry it at all.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gateways: BTreeMap<String, ViaGateways>,
}

/// The mesh gateways a target is reached through.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ViaGateways {
    /// "local" (this datacenter's gateways) or "remote" (the target's).
    pub mode: String,
    /// The gateways' datacenter.
    pub datacenter: String,
    /// Dialled at their WAN address (another datacenter's), else their LAN
    /// one.
    pub wan: bool,
    /// The healthy gateways.
    pub instances: Endpoints,
}

impl Snapshot {
    /// A snapshot of `service` with its upstreams and nothing else: no CA,
    /// no intentions (allowed by default), not a gateway, not transparent,
    /// no mesh TLS (a proxyless gRPC client's).
    pub fn bare(
        proxy_id: Value, index: u64, service: NodeService,
        upstreams: BTreeMap<String, UpstreamSnapshot>,
    ) -> Snapshot {
        Snapshot {
            proxy_id,
            version: 0,
            index,
            service,
            upstreams,
            roots: None,
            leaf: None,
            intentions: Arc::default(),
            intentions_default_allow: true,
            gateway: None,
            transparent: None,
            mesh_tls: None,
        }
    }

    /// Equal apart from version and index. Every rebuild asks it (a global
    /// change: of every proxy), so shared parts (one `Arc`) are taken as
    /// equal without comparing what they hold: the endpoint lists' deep
    /// comparison was an eighth of a 10,000-proxy change's CPU.
    pub fn same_content(&self, other: &Snapshot) -> bool {
        self.service == other.service
            && self.upstreams.len() == other.upstreams.len()
            && self
                .upstreams
                .iter()
                .zip(&other.upstreams)
                .all(|((ka, a), (kb, b))| ka == kb && a.same(b))
            && same_opt(&self.roots, &other.roots)
            && same_opt(&self.leaf, &other.leaf)
            && same(&self.intentions, &other.intentions)
            && self.intentions_default_allow == other.intentions_default_allow
            && same_opt(&self.gateway, &other.gateway)
            && same_opt(&self.transparent, &other.transparent)
            && same_opt(&self.mesh_tls, &other.mesh_tls)
    }
}

impl UpstreamSnapshot {
    /// `==`, without comparing what one shared `Arc` holds with itself.
    pub fn same(&self, other: &UpstreamSnapshot) -> bool {
        let UpstreamSnapshot {
            chain,
            error,
            endpoints,
            gateways,
        } = self;
        same_opt(chain, &other.chain)
            && *error == other.error
            && endpoints.len() == other.endpoints.len()
            && endpoints
                .iter()
                .zip(&other.endpoints)
                .all(|((ka, a), (kb, b))| ka == kb && same(a, b))
            && *gateways == other.gateways
    }
}

/// Equal: the same allocation, or equal content.
fn same<T: PartialEq + ?Sized>(a: &Arc<T>, b: &Arc<T>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

fn same_opt<T: PartialEq + ?Sized>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same(a, b),
        (None, None) => true,
        _ => false,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct GatewaySnapshot {
    /// "ingress-gateway", "terminating-gateway" or "mesh-gateway".
    pub kind: String,
    /// The datacenter and trust domain its services' SNI names are in.
    pub datacenter: String,
    pub trust_domain: String,
    /// An ingress gateway's entry (`None`: none written yet, nothing served).
    pub ingress: Option<IngressGatewayConfigEntry>,
    /// A terminating gateway's entry.
    pub terminating: Option<TerminatingGatewayConfigEntry>,
    /// The services the entry links, as `/v1/catalog/gateway-services`.
    pub services: Vec<GatewayService>,
    /// Terminating: per linked service, what the gateway serves it with.
    pub linked: BTreeMap<String, LinkedService>,
    /// Mesh gateway: per local service, its connect-capable endpoints.
    pub local: BTreeMap<String, Endpoints>,
    /// Mesh gateway: per other datacenter, its healthy mesh gateways (those
    /// with none heard yet are left out).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub remote: BTreeMap<String, Endpoints>,
}

/// Where a gateway is dialled from this datacenter: in another datacenter
/// (`wan`) its service's `wan` tagged address (and port), else its service
/// address, else its node's `wan` tagged address, else its node's address;
/// here its service address, else its `lan` tagged one, else its node's
/// (Consul's `BestAddress`).
pub fn gateway_address(i: &Instance, wan: bool) -> (&str, i64) {
    let svc = &i.service;
    let tagged = |k: &str| {
        svc.tagged_addresses
            .get(k)
            .filter(|a| !a.address.is_empty())
    };
    if wan && let Some(a) = tagged("wan") {
        let port = if a.port != 0 {
            i64::from(a.port)
        } else {
            svc.port
        };
        return (&a.address, port);
    }
    if !svc.address.is_empty() {
        return (&svc.address, svc.port);
    }
    if !wan && let Some(a) = tagged("lan") {
        let port = if a.port != 0 {
            i64::from(a.port)
        } else {
            svc.port
        };
        return (&a.address, port);
    }
    let node = &i.node;
    if wan && let Some(a) = node.tagged_addresses.get("wan").filter(|a| !a.is_empty()) {
        return (a, svc.port);
    }
    (&node.address, svc.port)
}

/// A terminating gateway's view of one linked service.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct LinkedService {
    /// Its instances, unhealthy ones too (their checks say which): the
    /// addresses outside the mesh it is dialed at.
    pub instances: Endpoints,
    /// Who may reach it, highest precedence first.
    pub intentions: Arc<Vec<Intention>>,
    /// Its leaf: the gateway presents it to the mesh as the service.
    #[serde(skip)]
    pub leaf: Option<Arc<IssuedCert>>,
    /// The protocol it speaks (its service-defaults', else
    /// proxy-defaults', else tcp): http-like ones get L7 intentions.
    pub protocol: String,
}

/// As Consul serves endpoints: never critical (or in maintenance); with
/// OnlyPassing, warning is out too.
pub fn healthy(checks: &[Arc<HealthCheck>], only_passing: bool) -> bool {
    checks.iter().all(|c| match c.status {
        HealthStatus::Passing => true,
        HealthStatus::Critical | HealthStatus::Maintenance => false,
        HealthStatus::Warning => !only_passing,
    })
}

fn leaf_without_key<S: serde::Serializer>(
    leaf: &Option<Arc<IssuedCert>>, ser: S,
) -> Result<S::Ok, S::Error> {
    let shown = leaf.as_deref().map(|l| IssuedCert {
        private_key_pem: String::new(),
        ..l.clone()
    });
    shown.serialize(ser)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(endpoints: Endpoints) -> UpstreamSnapshot {
        UpstreamSnapshot {
            chain: None,
            error: String::new(),
            endpoints: [("db".to_string(), endpoints)].into(),
            gateways: BTreeMap::new(),
        }
    }

    fn instance(address: &str) -> Arc<Instance> {
        Arc::new(Instance {
            node: Arc::new(crate::structs::Node {
                address: address.into(),
                ..Default::default()
            }),
            service: Arc::default(),
            checks: Vec::new(),
        })
    }

    #[test]
    fn shared_or_equal_parts_are_the_same_and_different_ones_not() {
        let rows: Endpoints = Arc::new(vec![instance("10.0.0.1")]);
        let a = upstream(rows.clone());
        assert!(a.same(&upstream(rows.clone())), "one Arc");
        let copy: Endpoints = Arc::new((*rows).clone());
        assert!(a.same(&upstream(copy)), "equal content, another Arc");
        let moved: Endpoints = Arc::new(vec![instance("10.0.0.9")]);
        assert!(!a.same(&upstream(moved)), "different content");
        assert!(!a.same(&upstream(Arc::default())), "fewer endpoints");
    }
}
