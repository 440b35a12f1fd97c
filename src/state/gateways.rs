//! The services each gateway fronts, derived from the ingress- and
//! terminating-gateway entries and the catalog (a `*` in an entry links
//! every typical service): Consul's gateway-services table, computed on
//! read from one version of the state.

use super::{State, WatchKey, keys};
use crate::structs::config_entry::{ConfigEntry, GatewayService, Kind, ServiceNameRef, WILDCARD};

/// The watch keys [`gateway_services`] reads for `gateway`: its two
/// possible entries, and the catalog's service list (for `*`).
pub fn watch_keys(gateway: &str) -> Vec<WatchKey> {
    vec![
        keys::config(Kind::IngressGateway.as_str(), gateway),
        keys::config(Kind::TerminatingGateway.as_str(), gateway),
        keys::SERVICES,
    ]
}

/// What [`gateway_services`] read for `gateway` in `st`: its entries, and
/// the catalog's service list only when an entry links `*` (a gateway
/// naming its services is not rebuilt on every registration).
pub fn read_keys(st: &State, gateway: &str) -> Vec<WatchKey> {
    let mut out = watch_keys(gateway);
    let wildcard = |k: Kind| match st.config.get(&(k, gateway.to_string())).map(|e| &**e) {
        Some(ConfigEntry::IngressGateway(e)) => e
            .listeners
            .iter()
            .any(|l| l.services.iter().any(|s| s.name == WILDCARD)),
        Some(ConfigEntry::TerminatingGateway(e)) => e.services.iter().any(|s| s.name == WILDCARD),
        _ => false,
    };
    if !wildcard(Kind::IngressGateway) && !wildcard(Kind::TerminatingGateway) {
        out.retain(|k| *k != keys::SERVICES);
    }
    out
}

/// Typical (non-mesh) services in the catalog, by name, `consul` left
/// out: what a `*` links.
pub fn typical_services(st: &State) -> Vec<String> {
    st.service_names
        .iter()
        .filter(|(name, set)| {
            name.as_str() != "consul"
                && set
                    .iter()
                    .next()
                    .and_then(|k| st.services.get(k))
                    .is_some_and(|s| s.kind.is_typical())
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The services linked to `gateway`, sorted by service name (and port):
/// an explicit link wins over the same service reached through `*`.
pub fn gateway_services(st: &State, gateway: &str) -> Vec<GatewayService> {
    let mut out = Vec::new();
    let entry = |k: Kind| st.config.get(&(k, gateway.to_string())).map(|e| &**e);
    if let Some(ConfigEntry::IngressGateway(e)) = entry(Kind::IngressGateway) {
        let base = row(
            gateway,
            Kind::IngressGateway,
            e.create_index,
            e.modify_index,
        );
        for l in &e.listeners {
            let named: Vec<&str> = l.services.iter().map(|s| s.name.as_str()).collect();
            for s in &l.services {
                let link = |name: &str, from_wildcard: bool| GatewayService {
                    service: ServiceNameRef {
                        name: name.to_string(),
                    },
                    port: l.port,
                    protocol: l.protocol.clone(),
                    hosts: s.hosts.clone(),
                    from_wildcard,
                    ..base.clone()
                };
                out.extend(
                    linked(st, &s.name, &named)
                        .into_iter()
                        .map(|(n, w)| link(&n, w)),
                );
            }
        }
    }
    if let Some(ConfigEntry::TerminatingGateway(e)) = entry(Kind::TerminatingGateway) {
        let base = row(
            gateway,
            Kind::TerminatingGateway,
            e.create_index,
            e.modify_index,
        );
        let named: Vec<&str> = e.services.iter().map(|s| s.name.as_str()).collect();
        for s in &e.services {
            let link = |name: &str, from_wildcard: bool| GatewayService {
                service: ServiceNameRef {
                    name: name.to_string(),
                },
                ca_file: s.ca_file.clone(),
                cert_file: s.cert_file.clone(),
                key_file: s.key_file.clone(),
                sni: s.sni.clone(),
                from_wildcard,
                ..base.clone()
            };
            out.extend(
                linked(st, &s.name, &named)
                    .into_iter()
                    .map(|(n, w)| link(&n, w)),
            );
        }
    }
    out.sort_by(|a, b| (&a.service, a.port).cmp(&(&b.service, b.port)));
    out
}

/// A gateway's row before the service it links: the entry's indexes.
fn row(gateway: &str, kind: Kind, create_index: u64, modify_index: u64) -> GatewayService {
    GatewayService {
        gateway: ServiceNameRef {
            name: gateway.to_string(),
        },
        gateway_kind: kind.as_str().into(),
        create_index,
        modify_index,
        ..Default::default()
    }
}

/// The services an entry's service `name` links, each with whether it came
/// from the wildcard: itself, or for `*` every typical service the entry
/// does not name.
fn linked(st: &State, name: &str, named: &[&str]) -> Vec<(String, bool)> {
    if name != WILDCARD {
        return vec![(name.to_string(), false)];
    }
    typical_services(st)
        .into_iter()
        .filter(|n| !named.contains(&n.as_str()))
        .map(|n| (n, true))
        .collect()
}

/// The ingress gateways (by name) that expose `service`.
pub fn ingress_gateways_for(st: &State, service: &str) -> Vec<String> {
    st.config
        .range((Kind::IngressGateway, String::new())..)
        .take_while(|((k, _), _)| *k == Kind::IngressGateway)
        .filter(|((_, name), _)| {
            gateway_services(st, name)
                .iter()
                .any(|g| g.service.name == service)
        })
        .map(|((_, name), _)| name.clone())
        .collect()
}
