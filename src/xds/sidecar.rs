//! A sidecar's snapshot turned into its Envoy resources, named as Consul
//! names them: the `public_listener` and the `local_app` cluster for
//! inbound traffic, one listener per upstream on its `LocalBindPort`, per
//! http upstream a route configuration implementing its compiled chain
//! (router matches, splitter weights, resolver targets), one EDS cluster
//! per chain target named by its SNI with upstream mTLS, and the targets'
//! healthy sidecars as endpoints (failover targets at lower priorities);
//! a transparent proxy's outbound listener too (`super::transparent`).

use envoy_types::pb::envoy::config::cluster::v3 as cluster;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::config::route::v3 as route;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;

use super::resources::{
    CLUSTER, ENDPOINT, Identity, LISTENER, ROUTE, Resource, Resources, alpn, common_tls,
    every_type, for_protocol, forward_client_cert, has_tls, hcm_base, http_filter, http2_upstream,
    identity, lb_endpoint, millis, prefix_match, put, routed_targets, secs, socket, start_cluster,
    tcp_filter, to_cluster, transport_socket, typed, upstream_id,
};
use super::share::{AssignmentKey, ByPtr, ClusterKey, Memo, RouteKey, UpstreamKey};
use crate::proxycfg::Snapshot;
use crate::structs::config_entry::is_http_like;

/// Consul's name for the inbound cluster to the application.
pub const LOCAL_APP: &str = "local_app";

/// Every resource of a sidecar's snapshot.
pub fn generate(snap: &Snapshot) -> Resources {
    super::share::with(|memo| generate_with(snap, memo))
}

/// The same, with what the proxies share (its upstreams' clusters,
/// endpoints and routes) taken from `memo`.
fn generate_with(snap: &Snapshot, memo: &mut Memo) -> Resources {
    let id = memo.identity(identity(snap));
    let mut out = every_type();
    let svc = &snap.service;
    let local_addr = if svc.proxy.local_service_address.is_empty() {
        "127.0.0.1".to_string()
    } else {
        svc.proxy.local_service_address.clone()
    };
    let local_port = u32::from(svc.proxy.local_service_port);
    let mut app = local_app(&local_addr, local_port);
    // `local_connect_timeout_ms` of the proxy's config (Consul's; 5 s).
    // Envoy takes no zero connect timeout: 0 leaves the default.
    if let Some(ms) = config_number(snap, "local_connect_timeout_ms").filter(|ms| *ms > 0) {
        app.connect_timeout = millis(ms);
    }
    if matches!(protocol_of(snap).as_str(), "http2" | "grpc") {
        http2_upstream(&mut app);
    }
    put(&mut out, CLUSTER, LOCAL_APP.into(), Resource::of(app));
    let public = public_listener(snap, &id);
    put(
        &mut out,
        LISTENER,
        public.name.clone(),
        Resource::of(public),
    );

    for up in &svc.proxy.upstreams {
        let Some(us) = snap.upstreams.get(&up.destination_name) else {
            continue;
        };
        let Some(shared_chain) = us.chain.as_ref() else {
            continue;
        };
        let chain = &**shared_chain;
        let upstream_id = upstream_id(&up.destination_name, &up.datacenter);
        let upstream = UpstreamKey(us.clone());
        for target in routed_targets(chain) {
            if !us.endpoints.contains_key(&target.id) {
                continue; // a peer, or behind a mesh gateway: not served here
            }
            // Named by the target's name (its SNI), each assignment as
            // its cluster.
            let clusters = memo.cluster(ClusterKey {
                chain: ByPtr(shared_chain.clone()),
                target: target.id.clone(),
                id: ByPtr(id.clone()),
            });
            for (name, c) in clusters.iter() {
                put(&mut out, CLUSTER, name.clone(), c.clone());
            }
            let assignments = memo.assignment(AssignmentKey {
                upstream: upstream.clone(),
                target: target.id.clone(),
            });
            for (name, cla) in assignments.iter() {
                put(&mut out, ENDPOINT, name.clone(), cla.clone());
            }
        }
        let bind = if up.local_bind_address.is_empty() {
            "127.0.0.1"
        } else {
            &up.local_bind_address
        };
        let port = u32::from(up.local_bind_port);
        if port == 0 {
            continue; // no bind port: reached by transparent proxy only
        }
        let name = format!("{upstream_id}:{bind}:{port}");
        let stat = format!(
            "upstream.{}.default.default.{}",
            chain.service_name, chain.datacenter
        );
        let filter = if is_http_like(&chain.protocol) {
            let routes = memo.route(RouteKey {
                name: upstream_id.clone(),
                chain: ByPtr(shared_chain.clone()),
            });
            put(&mut out, ROUTE, upstream_id.clone(), routes);
            http_filter(&stat, &upstream_id, &chain.protocol)
        } else {
            let cluster = start_cluster(chain).unwrap_or_default();
            tcp_filter(&stat, &cluster)
        };
        let l = listener::Listener {
            name: name.clone(),
            address: Some(socket(bind, port)),
            traffic_direction: core::TrafficDirection::Outbound as i32,
            filter_chains: vec![listener::FilterChain {
                filters: vec![filter],
                ..Default::default()
            }],
            ..Default::default()
        };
        put(&mut out, LISTENER, name, Resource::of(l));
    }
    if let Some(tp) = &snap.transparent {
        super::transparent::generate(snap, tp, &id, &mut out);
    }
    out
}

/// The inbound side: the proxy's own port, mTLS with the leaf (client
/// certificates required), the intentions' RBAC, then the application.
fn public_listener(snap: &Snapshot, id: &Identity) -> listener::Listener {
    let svc = &snap.service;
    // As Consul: `bind_address`/`bind_port` from the proxy's config, else
    // the proxy's own address (all addresses when it has none) and port.
    let config = svc.proxy.config.as_deref();
    let bind = config
        .and_then(|c| c.get("bind_address"))
        .and_then(|v| v.as_str())
        .filter(|a| !a.is_empty())
        .unwrap_or(if svc.address.is_empty() {
            "0.0.0.0"
        } else {
            &svc.address
        });
    let port = config_number(snap, "bind_port")
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| u32::try_from(svc.port).unwrap_or(0));
    let protocol = protocol_of(snap);
    let http = is_http_like(&protocol);
    let mut filters = Vec::new();
    let filter = if http {
        let mut hcm = hcm_base("public_listener");
        // `local_request_timeout_ms`: how long the application may take.
        let mut local_route = to_cluster(LOCAL_APP);
        if let Some(ms) = config_number(snap, "local_request_timeout_ms") {
            local_route.timeout = millis(ms);
        }
        hcm.route_specifier = Some(hcm::http_connection_manager::RouteSpecifier::RouteConfig(
            route::RouteConfiguration {
                name: "public_listener".into(),
                virtual_hosts: vec![route::VirtualHost {
                    name: "public_listener".into(),
                    domains: vec!["*".into()],
                    routes: vec![route::Route {
                        r#match: Some(prefix_match("/")),
                        action: Some(route::route::Action::Route(local_route)),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
        ));
        hcm.http_filters.insert(0, super::rbac::http_filter(snap));
        forward_client_cert(&mut hcm);
        for_protocol(&mut hcm, &protocol);
        typed("envoy.filters.network.http_connection_manager", hcm)
    } else {
        filters.push(super::rbac::network_filter(snap));
        tcp_filter("public_listener", LOCAL_APP)
    };
    filters.push(filter);
    let transport = has_tls(id).then(|| {
        let mut common = common_tls(id, Vec::new(), &id.incoming);
        common.alpn_protocols = alpn(&protocol);
        transport_socket(tls::DownstreamTlsContext {
            common_tls_context: Some(common),
            require_client_certificate: Some(envoy_types::pb::google::protobuf::BoolValue {
                value: true,
            }),
            ..Default::default()
        })
    });
    listener::Listener {
        name: format!("public_listener:{bind}:{port}"),
        address: Some(socket(bind, port)),
        traffic_direction: core::TrafficDirection::Inbound as i32,
        filter_chains: vec![listener::FilterChain {
            filters,
            transport_socket: transport.flatten(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A number of the proxy's config; none when unset or not a number.
fn config_number(snap: &Snapshot, key: &str) -> Option<u64> {
    let v = snap.service.proxy.config.as_ref()?.get(key)?;
    crate::structs::serde_util::loose_u64(v)
}

/// The proxy's own protocol (`Proxy.Config.protocol`, central config
/// merged), tcp by default.
pub(crate) fn protocol_of(snap: &Snapshot) -> String {
    snap.service
        .proxy
        .config
        .as_ref()
        .and_then(|c| c.get("protocol"))
        .and_then(|p| p.as_str())
        .unwrap_or("tcp")
        .to_string()
}

fn local_app(addr: &str, port: u32) -> cluster::Cluster {
    cluster::Cluster {
        name: LOCAL_APP.into(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Static as i32,
        )),
        connect_timeout: secs(5),
        load_assignment: Some(endpoint::ClusterLoadAssignment {
            cluster_name: LOCAL_APP.into(),
            endpoints: vec![endpoint::LocalityLbEndpoints {
                lb_endpoints: vec![lb_endpoint(addr, port)],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use prost::Message;

    use super::*;
    use crate::proxycfg::{Shared, build};
    use crate::state::Command;
    use crate::structs::{NodeService, Upstream};
    use tls::tls_parameters::TlsProtocol;

    fn tls_params_of<T: Message + Default>(ts: &Option<core::TransportSocket>) -> T {
        let Some(ConfigType::TypedConfig(any)) = ts.as_ref().and_then(|t| t.config_type.clone())
        else {
            panic!("no TLS")
        };
        T::decode(&*any.value).unwrap()
    }

    /// The mesh entry's `TLS.Incoming` shapes the public listener's mTLS,
    /// its `TLS.Outgoing` every upstream cluster's; without the entry,
    /// Envoy's defaults.
    #[test]
    fn the_mesh_entrys_tls_reaches_the_public_listener_and_the_upstreams() {
        let mut w = crate::testing::World::with_ca();
        let proxy = |dest: &str, port: i64, up: Option<&str>| {
            let mut s = NodeService {
                kind: "connect-proxy".into(),
                id: format!("{dest}-proxy"),
                service: format!("{dest}-sidecar-proxy"),
                port,
                ..Default::default()
            };
            s.proxy.destination_service_name = dest.into();
            s.proxy.local_service_port = 8080;
            s.proxy.upstreams = up
                .map(|u| Upstream {
                    destination_name: u.into(),
                    local_bind_port: 9191,
                    ..Default::default()
                })
                .into_iter()
                .collect();
            s
        };
        w.register_passing("n1", "10.0.0.1", proxy("web", 21000, Some("db")));
        w.register_passing("n2", "10.0.0.2", proxy("db", 21001, None));
        // One `Shared`, as the manager's: the leaf is signed once.
        let shared = std::cell::RefCell::new(Shared::default());
        let snapshot = |w: &crate::testing::World| {
            let key = ("n1".to_string(), "web-proxy".to_string());
            build(&w.store.state(), "dc1", &key, &mut shared.borrow_mut())
                .unwrap()
                .0
        };
        let generated = |w: &crate::testing::World| generate(&snapshot(w));
        let before = snapshot(&w);
        let params = |out: &super::super::resources::Resources| {
            let l = listener::Listener::decode(
                &*out[LISTENER]["public_listener:0.0.0.0:21000"].any.value,
            )
            .unwrap();
            let down: tls::DownstreamTlsContext =
                tls_params_of(&l.filter_chains[0].transport_socket);
            let (_, c) = out[CLUSTER]
                .iter()
                .find(|(n, _)| n.starts_with("db.default.dc1.internal."))
                .expect("db's cluster");
            let c = cluster::Cluster::decode(&*c.any.value).unwrap();
            let up: tls::UpstreamTlsContext = tls_params_of(&c.transport_socket);
            (
                down.common_tls_context.unwrap().tls_params.unwrap(),
                up.common_tls_context.unwrap().tls_params.unwrap(),
            )
        };
        let (down, up) = params(&generated(&w));
        assert_eq!(down, tls::TlsParameters::default());
        assert_eq!(up, tls::TlsParameters::default());

        let entry = crate::config_check::decode_and_validate(&serde_json::json!({
            "Kind": "mesh", "Name": "mesh", "TLS": {
                "Incoming": {"TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "TLSv1_2",
                             "CipherSuites": ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"]},
                "Outgoing": {"TLSMinVersion": "TLSv1_3"}}}))
        .unwrap()
        .to_json();
        w.apply(Command::ConfigSet { entry, cas: None });
        // A proxy already served gets the change: its snapshot differs.
        let after = snapshot(&w);
        assert!(!before.same_content(&after));
        // Read once per change: every build shares it.
        let shared_tls = |s: &crate::proxycfg::Snapshot| s.mesh_tls.clone().expect("mesh TLS");
        assert!(std::sync::Arc::ptr_eq(
            &shared_tls(&after),
            &shared_tls(&snapshot(&w))
        ));
        let (down, up) = params(&generated(&w));
        assert_eq!(
            down.tls_minimum_protocol_version,
            TlsProtocol::TlSv12 as i32
        );
        assert_eq!(
            down.tls_maximum_protocol_version,
            TlsProtocol::TlSv12 as i32
        );
        assert_eq!(down.cipher_suites, ["ECDHE-ECDSA-AES256-GCM-SHA384"]);
        assert_eq!(up.tls_minimum_protocol_version, TlsProtocol::TlSv13 as i32);
        assert_eq!(up.tls_maximum_protocol_version, TlsProtocol::TlsAuto as i32);
        assert!(up.cipher_suites.is_empty());
    }
}
