//! A gateway's snapshot: what its Envoy needs besides a sidecar's roots
//! and leaf. An ingress gateway: its entry and, per linked service, the
//! compiled chain and its targets' endpoints (as a sidecar's upstreams).
//! A terminating gateway: its entry and, per linked service, the
//! service's own instances (outside the mesh), the intentions with it as
//! destination and its leaf (the gateway answers for it). A mesh gateway:
//! every local service's connect-capable endpoints, by service, and every
//! other datacenter's mesh gateways, by datacenter.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::json;

use super::build::{Overrides, Shared, upstream};
use super::snapshot::{GatewaySnapshot, LinkedService, Snapshot, UpstreamSnapshot};
use super::{Dep, ProxyKey};
use crate::discovery_chain::EntryLookup;
use crate::state::catalog::service_instances;
use crate::state::gateways::{gateway_services, read_keys};
use crate::state::{State, keys};
use crate::structs::config_entry::{ConfigEntry, Kind, PROXY_CONFIG_GLOBAL};
use crate::structs::{NodeService, ServiceKind};

/// The snapshot of gateway `registered` (at `key`).
pub fn build(
    state: &State, datacenter: &str, key: &ProxyKey, registered: &Arc<NodeService>,
    shared: &mut Shared,
) -> Option<(Snapshot, BTreeSet<Dep>)> {
    let name = registered.service.clone();
    let mut deps = BTreeSet::new();
    deps.insert(keys::service(&name));
    deps.extend(crate::merge::merge_watch_keys(state, registered));
    let service = crate::merge::merge_node_service(state, registered);
    deps.insert(keys::CONNECT_CA);
    let roots = shared.roots(state);
    let entry = |k: Kind| state.config.get(&(k, name.clone())).map(|e| &**e);

    // The DNS names its leaf carries besides its own (an ingress
    // gateway's hosts, known once its linked services are read).
    let mut dns_sans = Vec::new();

    let mut upstreams = BTreeMap::new();
    let mut gw = GatewaySnapshot {
        kind: registered.kind.as_str().to_string(),
        datacenter: datacenter.to_string(),
        trust_domain: format!("{}.consul", state.cluster_id),
        ingress: None,
        terminating: None,
        services: Vec::new(),
        linked: BTreeMap::new(),
        local: BTreeMap::new(),
        remote: BTreeMap::new(),
    };
    match registered.kind {
        ServiceKind::IngressGateway => {
            deps.extend(read_keys(state, &name));
            if let Some(ConfigEntry::IngressGateway(e)) = entry(Kind::IngressGateway) {
                gw.ingress = Some(e.clone());
                gw.services = gateway_services(state, &name);
                dns_sans = ingress_dns_sans(e, &gw.services, datacenter, shared);
                for g in &gw.services {
                    if upstreams.contains_key(&g.service.name) {
                        continue;
                    }
                    // Its targets in other datacenters go through mesh
                    // gateways as its own (merged) mode says, as Consul's.
                    let us: UpstreamSnapshot = upstream(
                        state,
                        datacenter,
                        datacenter,
                        &g.service.name,
                        &Overrides::mode(&service.proxy.mesh_gateway.mode),
                        true,
                        shared,
                        &mut deps,
                    );
                    upstreams.insert(g.service.name.clone(), us);
                }
            }
        }
        ServiceKind::TerminatingGateway => {
            deps.extend(read_keys(state, &name));
            if let Some(ConfigEntry::TerminatingGateway(e)) = entry(Kind::TerminatingGateway) {
                gw.terminating = Some(e.clone());
                gw.services = gateway_services(state, &name);
                let ixn = Kind::ServiceIntentions.as_str();
                deps.insert(keys::config(ixn, "*"));
                // A linked service's protocol falls back to proxy-defaults'.
                deps.insert(keys::config(
                    Kind::ProxyDefaults.as_str(),
                    PROXY_CONFIG_GLOBAL,
                ));
                let proxy_defaults = state
                    .get(Kind::ProxyDefaults, PROXY_CONFIG_GLOBAL)
                    .and_then(|e| e.as_proxy_defaults());
                for g in &gw.services {
                    let svc = &g.service.name;
                    deps.insert(keys::service(svc));
                    deps.insert(keys::config(ixn, svc));
                    deps.insert(keys::config(Kind::ServiceDefaults.as_str(), svc));
                    let protocol = crate::discovery_chain::service_protocol(
                        state
                            .get(Kind::ServiceDefaults, svc)
                            .and_then(|e| e.as_service_defaults()),
                        proxy_defaults,
                    );
                    // The linked service's own instances (not sidecars):
                    // it is outside the mesh. Unhealthy ones too: they go
                    // out marked unhealthy (a service known only by host
                    // names falls back to one, as Consul's).
                    let instances: Vec<_> = service_instances(state, svc, false)
                        .into_iter()
                        .filter(|i| i.service.kind.is_typical())
                        .map(Arc::new)
                        .collect();
                    gw.linked.insert(
                        svc.clone(),
                        LinkedService {
                            instances: Arc::new(instances),
                            intentions: shared.intentions(state, svc),
                            leaf: shared.leaf(state, datacenter, svc),
                            protocol,
                        },
                    );
                }
            }
        }
        _ => {
            // A mesh gateway passes through to every local service that
            // has connect-capable instances.
            deps.insert(keys::SERVICES);
            let names: Vec<String> = state.connect_names.keys().cloned().collect();
            for svc in names {
                deps.insert(keys::connect(&svc));
                let rows = shared.endpoints_of(state, &svc, "", false, true);
                if !rows.is_empty() {
                    gw.local.insert(svc, rows);
                }
            }
            // And to every other datacenter's mesh gateways, as the
            // federation knows them (none without one).
            if let Some(remote) = shared.remote.clone() {
                deps.insert(keys::REMOTE_DATACENTERS);
                for dc in remote.datacenters() {
                    if dc == datacenter {
                        continue;
                    }
                    let (rows, dep) = remote.gateways(&dc);
                    deps.insert(dep);
                    if let Some(rows) = rows.filter(|r| !r.is_empty()) {
                        gw.remote.insert(dc, rows);
                    }
                }
            }
        }
    }
    let leaf = shared.leaf_with_dns(state, datacenter, &name, &dns_sans);
    let snapshot = Snapshot {
        proxy_id: json!({ "Node": key.0, "ServiceID": key.1 }),
        version: 0,
        index: state.index,
        service,
        upstreams,
        roots,
        leaf,
        intentions: Arc::new(Vec::new()),
        intentions_default_allow: !shared.deny_by_default,
        gateway: Some(Arc::new(gw)),
        transparent: None,
        // Consul applies the mesh's `Incoming` to terminating gateways and
        // its `Outgoing` to ingress gateways (a mesh gateway passes TLS
        // through untouched).
        mesh_tls: match registered.kind {
            ServiceKind::IngressGateway | ServiceKind::TerminatingGateway => {
                shared.mesh_tls(state, &mut deps)
            }
            _ => None,
        },
    };
    Some((snapshot, deps))
}

/// The DNS names an ingress gateway's leaf carries when it serves TLS with
/// the built-in CA (on the gateway or on any listener), as Consul's
/// `generateIngressDNSSANs`: the wildcard of `<service>.ingress.<domain>`
/// (and with the datacenter) once any service is linked, and every
/// linked service's `Hosts`, so that a client checking the name accepts it
/// on every host the listeners serve.
fn ingress_dns_sans(
    e: &crate::structs::config_entry::IngressGatewayConfigEntry,
    services: &[crate::structs::config_entry::GatewayService], datacenter: &str, shared: &Shared,
) -> Vec<String> {
    let tls = e.tls.enabled
        || e.listeners
            .iter()
            .any(|l| l.tls.as_ref().is_some_and(|t| t.enabled));
    if !tls || services.is_empty() {
        return Vec::new();
    }
    let domain = if shared.dns_domain.is_empty() {
        "consul"
    } else {
        &shared.dns_domain
    };
    let mut sans = vec![
        format!("*.ingress.{domain}"),
        format!("*.ingress.{datacenter}.{domain}"),
    ];
    let hosts: BTreeSet<&str> = services
        .iter()
        .flat_map(|g| g.hosts.iter().map(String::as_str))
        // `*` (allowed on a listener without TLS) is no DNS name.
        .filter(|h| *h != crate::structs::config_entry::WILDCARD)
        .collect();
    sans.extend(hosts.into_iter().map(str::to_string));
    sans
}
