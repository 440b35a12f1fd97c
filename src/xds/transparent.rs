//! A transparent proxy's outbound side, as Consul builds it: the
//! `outbound_listener:127.0.0.1:<port>` (15001) that iptables sends the
//! application's outgoing connections to, its `original_dst` listener
//! filter recovering the address dialed, one filter chain per upstream
//! (registered or inferred from intentions) matching that upstream's
//! virtual IPs (and, with `DialedDirectly`, its instances' addresses) and
//! leading to its chain's route or cluster, and, unless the mesh entry
//! says `MeshDestinationsOnly`, a default chain passing everything else
//! through to the `original-destination` cluster.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::cluster::v3 as cluster;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

use super::resources::{
    CLUSTER, ENDPOINT, Identity, LISTENER, ROUTE, Resource, Resources, http_filter, put,
    route_config, routed_targets, secs, socket, start_cluster, target_assignments, target_clusters,
    tcp_filter,
};
use crate::proxycfg::{Snapshot, TransparentSnapshot, UpstreamSnapshot};
use crate::structs::config_entry::is_http_like;

/// Consul's names.
pub const OUTBOUND_LISTENER: &str = "outbound_listener";
pub const ORIGINAL_DESTINATION: &str = "original-destination";

/// Adds the outbound listener and what its chains lead to (the inferred
/// upstreams' clusters, endpoints and routes; the passthrough cluster).
pub fn generate(snap: &Snapshot, tp: &TransparentSnapshot, id: &Identity, out: &mut Resources) {
    let registered = &snap.service.proxy.upstreams;
    let mut chains = Vec::new();
    // An address matched by two chains would make Envoy refuse the
    // listener: the first upstream (by name) to claim one keeps it.
    let mut claimed = BTreeSet::new();
    for (name, us) in &snap.upstreams {
        let Some(chain) = us.chain.as_deref() else {
            continue;
        };
        // A registered upstream keeps its ID (and its listener, if it has
        // a bind port); an inferred one is named by its service.
        let upstream_id = registered
            .iter()
            .find(|u| &u.destination_name == name)
            .map_or_else(
                || name.clone(),
                |u| super::resources::upstream_id(name, &u.datacenter),
            );
        if tp.inferred.contains(name) {
            add_clusters(us, id, out);
        }
        let addrs: Vec<String> = addresses(us)
            .into_iter()
            .filter(|a| claimed.insert(a.clone()))
            .collect();
        if addrs.is_empty() {
            continue; // nothing to match it by: reached only by a bind port
        }
        let stat = format!(
            "upstream.{}.default.default.{}",
            chain.service_name, chain.datacenter
        );
        let filter = if is_http_like(&chain.protocol) {
            put(
                out,
                ROUTE,
                upstream_id.clone(),
                Resource::of(route_config(&upstream_id, chain)),
            );
            http_filter(&stat, &upstream_id, &chain.protocol)
        } else {
            tcp_filter(&stat, &start_cluster(chain).unwrap_or_default())
        };
        chains.push(listener::FilterChain {
            name: upstream_id,
            filter_chain_match: Some(listener::FilterChainMatch {
                prefix_ranges: addrs.iter().map(|a| cidr(a)).collect(),
                ..Default::default()
            }),
            filters: vec![filter],
            ..Default::default()
        });
    }
    let default_filter_chain = (!tp.mesh_destinations_only).then(|| {
        put(
            out,
            CLUSTER,
            ORIGINAL_DESTINATION.into(),
            Resource::of(original_destination()),
        );
        listener::FilterChain {
            name: ORIGINAL_DESTINATION.into(),
            filters: vec![tcp_filter(
                &format!("upstream.{ORIGINAL_DESTINATION}"),
                ORIGINAL_DESTINATION,
            )],
            ..Default::default()
        }
    });
    if chains.is_empty() && default_filter_chain.is_none() {
        return; // nothing it could do with a connection
    }
    let name = format!(
        "{OUTBOUND_LISTENER}:127.0.0.1:{}",
        tp.outbound_listener_port
    );
    let l = listener::Listener {
        name: name.clone(),
        address: Some(socket("127.0.0.1", u32::from(tp.outbound_listener_port))),
        traffic_direction: core::TrafficDirection::Outbound as i32,
        listener_filters: vec![listener::ListenerFilter {
            name: "envoy.filters.listener.original_dst".into(),
            config_type: Some(listener::listener_filter::ConfigType::TypedConfig(
                pack_any(OriginalDst {}),
            )),
            ..Default::default()
        }],
        filter_chains: chains,
        default_filter_chain,
        ..Default::default()
    };
    put(out, LISTENER, name, Resource::of(l));
}

/// An inferred upstream's clusters and endpoints: one per chain target
/// served here (a registered upstream's are the sidecar generator's).
fn add_clusters(us: &UpstreamSnapshot, id: &Identity, out: &mut Resources) {
    let Some(chain) = us.chain.as_deref() else {
        return;
    };
    for target in routed_targets(chain) {
        if !us.endpoints.contains_key(&target.id) {
            continue;
        }
        for c in target_clusters(chain, target, id) {
            put(out, CLUSTER, c.name.clone(), Resource::of(c));
        }
        for cla in target_assignments(chain, us, &target.id) {
            put(out, ENDPOINT, cla.cluster_name.clone(), Resource::of(cla));
        }
    }
}

/// The addresses an upstream is dialed at: its virtual IPs, and with
/// `DialedDirectly` its targets' instances' own addresses; sorted, IPv4
/// and IPv6 only.
fn addresses(us: &UpstreamSnapshot) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(chain) = us.chain.as_deref() else {
        return out;
    };
    out.extend(chain.auto_virtual_ips.iter().cloned());
    out.extend(chain.manual_virtual_ips.iter().cloned());
    for target in chain.targets.values() {
        if !target.transparent_proxy.dialed_directly {
            continue;
        }
        for i in us
            .endpoints
            .get(&target.id)
            .into_iter()
            .flat_map(|e| e.iter())
        {
            let addr = if i.service.address.is_empty() {
                &i.node.address
            } else {
                &i.service.address
            };
            out.insert(addr.clone());
        }
    }
    out.retain(|a| a.parse::<std::net::IpAddr>().is_ok());
    out
}

fn cidr(addr: &str) -> core::CidrRange {
    let len = if addr.contains(':') { 128 } else { 32 };
    core::CidrRange {
        address_prefix: addr.to_string(),
        prefix_len: Some(UInt32Value { value: len }),
    }
}

/// Consul's passthrough cluster: to the address the application dialed.
fn original_destination() -> cluster::Cluster {
    cluster::Cluster {
        name: ORIGINAL_DESTINATION.into(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: cluster::cluster::LbPolicy::ClusterProvided as i32,
        connect_timeout: secs(5),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager::RouteSpecifier,
    };
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier,
    };
    use prost::Message;
    use serde_json::{Value, json};

    use super::*;
    use crate::proxycfg::{Shared, build};
    use crate::state::Command;
    use crate::structs::NodeService;
    use crate::testing::World;

    fn register(w: &mut World, node: &str, addr: &str, svc: NodeService) {
        w.register_passing(node, addr, svc);
    }

    /// `name` and its sidecar on `node`; web's sidecar is a transparent
    /// proxy (its registration's `Mode`) unless `web_mode` says otherwise.
    fn service(w: &mut World, node: &str, addr: &str, name: &str, web_mode: &str) {
        register(
            w,
            node,
            addr,
            NodeService {
                id: name.into(),
                service: name.into(),
                port: 8080,
                ..Default::default()
            },
        );
        let mut s = NodeService {
            kind: "connect-proxy".into(),
            id: format!("{name}-proxy"),
            service: format!("{name}-sidecar-proxy"),
            port: 21000,
            ..Default::default()
        };
        s.proxy.destination_service_name = name.into();
        s.proxy.local_service_port = 8080;
        if name == "web" {
            s.proxy.mode = web_mode.into();
        }
        register(w, node, addr, s);
    }

    fn config(w: &mut World, entry: Value) {
        w.apply(Command::ConfigSet { entry, cas: None });
    }

    /// web (transparent unless `web_mode`), api (http), db and cache (tcp),
    /// the entries given first; web's snapshot (intentions default deny
    /// when `deny`) and its resources.
    fn mesh(entries: &[Value], web_mode: &str, deny: bool) -> (Snapshot, Resources) {
        let mut w = World::new();
        config(
            &mut w,
            json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"}),
        );
        for e in entries {
            config(&mut w, e.clone());
        }
        service(&mut w, "n1", "10.0.0.1", "web", web_mode);
        service(&mut w, "n2", "10.0.0.2", "api", "");
        service(&mut w, "n3", "10.0.0.3", "db", "");
        service(&mut w, "n4", "10.0.0.4", "cache", "");
        let state = w.store.state();
        let mut shared = Shared::default();
        shared.deny_by_default = deny;
        let key = ("n1".to_string(), "web-proxy".to_string());
        let (snap, _) = build(&state, "dc1", &key, &mut shared).expect("a proxy");
        let out = crate::xds::generate(&snap);
        (snap, out)
    }

    fn intentions_web_to(allowed: &[&str]) -> Vec<Value> {
        allowed
            .iter()
            .map(|dest| {
                json!({"Kind": "service-intentions", "Name": dest,
                       "Sources": [{"Name": "web", "Action": "allow"}]})
            })
            .collect()
    }

    fn outbound(out: &Resources) -> Option<Listener> {
        let (_, r) = out[LISTENER]
            .iter()
            .find(|(n, _)| n.starts_with(OUTBOUND_LISTENER))?;
        Some(Listener::decode(&*r.any.value).unwrap())
    }

    /// Each filter chain's name and the addresses it matches.
    fn chains(l: &Listener) -> Vec<(String, Vec<String>)> {
        l.filter_chains
            .iter()
            .map(|fc| {
                let m = fc.filter_chain_match.as_ref().unwrap();
                let addrs = m
                    .prefix_ranges
                    .iter()
                    .map(|r| {
                        assert_eq!(r.prefix_len.as_ref().unwrap().value, 32);
                        r.address_prefix.clone()
                    })
                    .collect();
                (fc.name.clone(), addrs)
            })
            .collect()
    }

    fn vip(snap: &Snapshot, name: &str) -> String {
        let chain = snap.upstreams[name].chain.as_ref().unwrap();
        chain.auto_virtual_ips[0].clone()
    }

    /// Under default deny, a transparent proxy's upstreams are exactly the
    /// services whose intentions allow its service (an L7 permission
    /// counts); the outbound listener on 127.0.0.1:15001 recovers the
    /// original destination and has one chain per upstream matching its
    /// virtual IP, to its route (http) or its cluster (tcp), and passes
    /// anything else through to `original-destination`.
    #[test]
    fn under_default_deny_the_upstreams_are_those_intentions_allow() {
        let mut entries = intentions_web_to(&["db"]);
        entries.push(
            json!({"Kind": "service-intentions", "Name": "api", "Sources": [
            {"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "/v1"}}]}]}),
        );
        entries.push(json!({"Kind": "service-intentions", "Name": "cache",
            "Sources": [{"Name": "web", "Action": "deny"}]}));
        let (snap, out) = mesh(&entries, "transparent", true);
        let tp = snap.transparent.as_deref().expect("transparent");
        assert_eq!(
            tp.inferred.iter().collect::<Vec<_>>(),
            ["api", "db"],
            "cache is denied, web is itself"
        );
        assert_eq!(tp.outbound_listener_port, 15001);
        let l = outbound(&out).expect("an outbound listener");
        assert_eq!(l.name, "outbound_listener:127.0.0.1:15001");
        assert_eq!(l.listener_filters.len(), 1);
        assert_eq!(
            l.listener_filters[0].name,
            "envoy.filters.listener.original_dst"
        );
        assert_eq!(
            chains(&l),
            [
                ("api".to_string(), vec![vip(&snap, "api")]),
                ("db".to_string(), vec![vip(&snap, "db")]),
            ]
        );
        // Virtual IPs come from 240.0.0.0/4, one per service.
        assert!(vip(&snap, "api").starts_with("240.0.0."));
        assert_ne!(vip(&snap, "api"), vip(&snap, "db"));

        let api = &l.filter_chains[0].filters[0];
        let hcm = HttpConnectionManager::decode(&*typed(api)).unwrap();
        let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier else {
            panic!("api's chain routes by RDS");
        };
        assert_eq!(rds.route_config_name, "api");
        assert!(out[ROUTE].contains_key("api"));
        let db = &l.filter_chains[1].filters[0];
        let tcp = TcpProxy::decode(&*typed(db)).unwrap();
        let Some(ClusterSpecifier::Cluster(db_cluster)) = tcp.cluster_specifier else {
            panic!("db's chain is a tcp proxy to its cluster");
        };
        assert!(db_cluster.starts_with("db.default.dc1.internal."));
        assert!(out[CLUSTER].contains_key(&db_cluster));
        assert!(out[ENDPOINT].contains_key(&db_cluster));
        assert!(
            !out[CLUSTER].keys().any(|c| c.starts_with("cache.")),
            "no cluster for a denied service"
        );

        let passthrough = l.default_filter_chain.as_ref().expect("a passthrough");
        let tcp = TcpProxy::decode(&*typed(&passthrough.filters[0])).unwrap();
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster(ORIGINAL_DESTINATION.into()))
        );
        let od = Cluster::decode(&*out[CLUSTER][ORIGINAL_DESTINATION].any.value).unwrap();
        assert_eq!(
            od.cluster_discovery_type,
            Some(cluster::cluster::ClusterDiscoveryType::Type(
                cluster::cluster::DiscoveryType::OriginalDst as i32
            ))
        );
    }

    fn typed(f: &listener::Filter) -> Vec<u8> {
        match &f.config_type {
            Some(listener::filter::ConfigType::TypedConfig(any)) => any.value.clone(),
            _ => panic!("a typed filter"),
        }
    }

    /// Under default allow every other typical service is an upstream; a
    /// deny intention takes one out.
    #[test]
    fn under_default_allow_every_service_but_the_denied() {
        let (snap, _) = mesh(&[], "transparent", false);
        let inferred = &snap.transparent.as_deref().unwrap().inferred;
        assert_eq!(inferred.iter().collect::<Vec<_>>(), ["api", "cache", "db"]);
        let deny = json!({"Kind": "service-intentions", "Name": "cache",
            "Sources": [{"Name": "*", "Action": "deny"}]});
        let (snap, _) = mesh(&[deny], "transparent", false);
        let inferred = &snap.transparent.as_deref().unwrap().inferred;
        assert_eq!(inferred.iter().collect::<Vec<_>>(), ["api", "db"]);
    }

    /// Mode and port from proxy-defaults; `DialedDirectly` (db's
    /// service-defaults) adds db's instance addresses to its chain; the
    /// mesh entry's `MeshDestinationsOnly` drops the passthrough.
    #[test]
    fn central_config_sets_mode_port_dialed_directly_and_passthrough() {
        let mut entries = intentions_web_to(&["db"]);
        entries.push(
            json!({"Kind": "proxy-defaults", "Name": "global", "Mode": "transparent",
            "TransparentProxy": {"OutboundListenerPort": 15555}}),
        );
        entries.push(json!({"Kind": "service-defaults", "Name": "db",
            "TransparentProxy": {"DialedDirectly": true}}));
        entries.push(json!({"Kind": "mesh", "Name": "mesh",
            "TransparentProxy": {"MeshDestinationsOnly": true}}));
        let (snap, out) = mesh(&entries, "", true);
        let l = outbound(&out).expect("transparent by proxy-defaults");
        assert_eq!(l.name, "outbound_listener:127.0.0.1:15555");
        let mut want = vec![vip(&snap, "db"), "10.0.0.3".to_string()];
        want.sort();
        assert_eq!(chains(&l), [("db".to_string(), want)]);
        assert!(l.default_filter_chain.is_none());
        assert!(!out[CLUSTER].contains_key(ORIGINAL_DESTINATION));
    }

    /// A proxy in direct mode has no outbound listener and no inferred
    /// upstreams, whatever the intentions allow.
    #[test]
    fn a_direct_proxy_has_no_outbound_listener() {
        let (snap, out) = mesh(&intentions_web_to(&["db"]), "direct", true);
        assert!(snap.transparent.is_none());
        assert!(snap.upstreams.is_empty());
        assert!(outbound(&out).is_none());
    }
}
