//! A gateway's snapshot turned into Envoy resources, named as Consul
//! names them.
//!
//! - Ingress: per listener of its entry, a listener `<protocol>:<addr>:<port>`;
//!   an http-like one runs an HTTP connection manager whose routes (RDS,
//!   named by the port) hold a virtual host per linked service (its
//!   `Hosts`, else `<service>.ingress.*`) routing through the service's
//!   compiled discovery chain; a tcp one proxies to its one service's
//!   start target. TLS (when enabled) with the built-in CA's leaf.
//!   Clusters and endpoints are the chains' targets, as a sidecar's.
//! - Terminating: one listener, a filter chain per linked service matched
//!   by the service's SNI, presenting the service's leaf and enforcing its
//!   intentions (RBAC), proxying to a cluster of the service's own
//!   instances (with TLS origination when its `CAFile` is set).
//! - Mesh: one listener that reads the SNI (`tls_inspector`) and passes
//!   each local service's connections through, still encrypted, to its
//!   sidecars, and every other datacenter's (`*.<dc>.internal.<trust
//!   domain>`) to a cluster `<dc>.internal.<trust domain>` of that
//!   datacenter's mesh gateways at their WAN addresses.

use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3 as cluster;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::config::route::v3 as route;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::resources::{
    CLUSTER, ENDPOINT, Identity, LISTENER, ROUTE, Resource, Resources, ads, common_tls, every_type,
    has_tls, header_changes, http_filter, http2_upstream, identity, inline, lb_endpoint,
    prefix_match, put, rds_hcm, route_config, routed_targets, secs, socket, start_cluster,
    target_assignments, target_clusters, tcp_filter, to_cluster, transport_socket, typed,
};
use crate::discovery_chain::service_sni;
use crate::proxycfg::{GatewaySnapshot, Snapshot, gateway_address, healthy};
use crate::state::catalog::Instance;
use crate::structs::config_entry::is_http_like;
use crate::structs::config_entry::{
    GatewayTlsConfig, GatewayTlsSdsConfig, IngressGatewayConfigEntry, IngressListener,
    IngressService, IngressServiceConfig, WILDCARD,
};

/// Every resource of a gateway's snapshot.
pub fn generate(snap: &Snapshot, gw: &GatewaySnapshot) -> Resources {
    let mut out = every_type();
    match gw.kind.as_str() {
        "ingress-gateway" => ingress(snap, gw, &mut out),
        "terminating-gateway" => terminating(snap, gw, &mut out),
        _ => mesh(snap, gw, &mut out),
    }
    out
}

/// The address the gateway's listeners bind: its registered address, or
/// every address.
fn bind_address(snap: &Snapshot) -> &str {
    if snap.service.address.is_empty() {
        "0.0.0.0"
    } else {
        &snap.service.address
    }
}

fn tls_inspector() -> listener::ListenerFilter {
    listener::ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".into(),
        config_type: Some(listener::listener_filter::ConfigType::TypedConfig(
            pack_any(TlsInspector::default()),
        )),
        ..Default::default()
    }
}

/// A terminating or mesh gateway's one listener, on its own port: the
/// connection's SNI (read by `tls_inspector`) picks its filter chain; last,
/// as Consul's, a chain that matches any other name and proxies to the
/// cluster the SNI names (`sni_cluster`). Every cluster a gateway has is
/// some chain's exact name, so that one only resets the connection: the
/// listener is there, for health checks, with no service yet.
fn sni_listener(
    snap: &Snapshot, mut chains: Vec<listener::FilterChain>, stat: &str, out: &mut Resources,
) {
    use envoy_types::pb::envoy::extensions::filters::network::sni_cluster::v3::SniCluster;
    chains.push(listener::FilterChain {
        filters: vec![
            typed("envoy.filters.network.sni_cluster", SniCluster::default()),
            tcp_filter(stat, ""),
        ],
        ..Default::default()
    });
    let bind = bind_address(snap);
    let port = u32::try_from(snap.service.port).unwrap_or(0);
    let name = format!("default:{bind}:{port}");
    let l = listener::Listener {
        name: name.clone(),
        address: Some(socket(bind, port)),
        traffic_direction: core::TrafficDirection::Inbound as i32,
        listener_filters: vec![tls_inspector()],
        filter_chains: chains,
        ..Default::default()
    };
    put(out, LISTENER, name, Resource::of(l));
}

// ---------------------------------------------------------------------------
// ingress
// ---------------------------------------------------------------------------

fn ingress(snap: &Snapshot, gw: &GatewaySnapshot, out: &mut Resources) {
    let Some(entry) = &gw.ingress else {
        return; // no entry: nothing to serve yet
    };
    let id = identity(snap);
    let bind = bind_address(snap).to_string();
    let mut served = std::collections::BTreeSet::new();
    for l in &entry.listeners {
        let port = u32::try_from(l.port).unwrap_or(0);
        let tls = listener_tls(entry, l);
        // The linked services of this listener whose chain compiled with
        // the listener's protocol (a `*` also reaches services of others:
        // those are left out, as Consul leaves them).
        let linked: Vec<(&str, &crate::discovery_chain::CompiledDiscoveryChain)> = gw
            .services
            .iter()
            .filter(|g| g.port == l.port)
            .filter_map(|g| {
                let chain = snap.upstreams.get(&g.service.name)?.chain.as_deref()?;
                (chain.protocol == l.protocol || !g.from_wildcard)
                    .then_some((g.service.name.as_str(), chain))
            })
            .collect();
        served.extend(linked.iter().map(|(svc, _)| svc.to_string()));
        // As Consul's: an http-like listener is named by its protocol, a
        // tcp one (one service) by its service.
        let mut name = format!("{}:{bind}:{port}", l.protocol);
        let filter_chains = if is_http_like(&l.protocol) {
            http_ingress_chains(l, port, &linked, &tls, &id, out)
        } else {
            let Some((svc, chain)) = linked.first() else {
                continue; // its service's chain does not compile: no listener
            };
            name = format!("{svc}:{bind}:{port}");
            let cluster = start_cluster(chain).unwrap_or_default();
            vec![listener::FilterChain {
                filters: vec![tcp_filter(&format!("ingress_upstream_{svc}"), &cluster)],
                transport_socket: downstream_tls(&tls, &id, &l.protocol),
                ..Default::default()
            }]
        };
        // A chain picked by SNI needs the SNI read first.
        let listener_filters = if filter_chains.iter().any(|c| c.filter_chain_match.is_some()) {
            vec![tls_inspector()]
        } else {
            Vec::new()
        };
        let listener = listener::Listener {
            name: name.clone(),
            address: Some(socket(&bind, port)),
            traffic_direction: core::TrafficDirection::Outbound as i32,
            listener_filters,
            filter_chains,
            ..Default::default()
        };
        put(out, LISTENER, name, Resource::of(listener));
    }
    // The chain targets of every service a listener serves, once each,
    // with the service's limits (else the entry's `Defaults`).
    for (svc, us) in &snap.upstreams {
        let Some(chain) = us.chain.as_deref().filter(|_| served.contains(svc)) else {
            continue;
        };
        let own = entry
            .listeners
            .iter()
            .flat_map(|l| &l.services)
            .find(|s| s.name == *svc);
        for target in routed_targets(chain) {
            if !us.endpoints.contains_key(&target.id) {
                continue;
            }
            for mut c in target_clusters(chain, target, &id) {
                apply_limits(&mut c, own, entry.defaults.as_ref());
                put(out, CLUSTER, c.name.clone(), Resource::of(c));
            }
            for cla in target_assignments(chain, us, &target.id) {
                put(out, ENDPOINT, cla.cluster_name.clone(), Resource::of(cla));
            }
        }
    }
}

/// An http-like listener's filter chains and their routes: one chain per
/// service with a certificate of its own over SDS, matched by its hosts
/// (SNI) and routed by a route configuration of its own
/// (`<port>_<service>`), and one for the other services, routed by
/// `<port>`, with the listener's TLS (Consul's
/// `makeSDSOverrideFilterChains`).
fn http_ingress_chains(
    l: &IngressListener, port: u32,
    linked: &[(&str, &crate::discovery_chain::CompiledDiscoveryChain)], tls: &ListenerTls,
    id: &Identity, out: &mut Resources,
) -> Vec<listener::FilterChain> {
    // The routes of `services` under `route_name`, and the filter that
    // reads them.
    let mut routed = |route_name: String, services: &[_]| {
        let rc = ingress_routes(&route_name, l, services);
        let filter = http_filter(
            &format!("ingress_upstream_{port}"),
            &route_name,
            &l.protocol,
        );
        put(out, ROUTE, route_name, Resource::of(rc));
        filter
    };
    let mut chains = Vec::new();
    let mut shared = Vec::new();
    for &(svc, chain) in linked {
        let own = l.services.iter().find(|s| s.name == svc);
        let Some((s, cert)) = own.and_then(|s| Some((s, service_sds(l, s, tls)?))) else {
            shared.push((svc, chain));
            continue;
        };
        chains.push(listener::FilterChain {
            filter_chain_match: Some(listener::FilterChainMatch {
                server_names: s.hosts.clone(),
                ..Default::default()
            }),
            filters: vec![routed(format!("{port}_{svc}"), &[(svc, chain)])],
            transport_socket: serve_tls(tls, &l.protocol, |c| {
                c.tls_certificate_sds_secret_configs = vec![sds_secret(&cert)];
            }),
            ..Default::default()
        });
    }
    if !shared.is_empty() || chains.is_empty() {
        chains.push(listener::FilterChain {
            filters: vec![routed(port.to_string(), &shared)],
            transport_socket: downstream_tls(tls, id, &l.protocol),
            ..Default::default()
        });
    }
    chains
}

/// A listener's TLS as Consul resolves it (`resolveListenerTLSConfig`):
/// the gateway's SDS with the listener's fields over it, the gateway's
/// versions and cipher suites with the listener's set ones over them, and
/// the built-in CA's leaf when TLS is enabled at either level.
struct ListenerTls {
    sds: Option<GatewayTlsSdsConfig>,
    params: GatewayTlsConfig,
    connect: bool,
}

fn listener_tls(entry: &IngressGatewayConfigEntry, l: &IngressListener) -> ListenerTls {
    let mut sds = entry.tls.sds.clone().unwrap_or_default();
    let mut params = GatewayTlsConfig {
        tls_min_version: entry.tls.tls_min_version.clone(),
        tls_max_version: entry.tls.tls_max_version.clone(),
        cipher_suites: entry.tls.cipher_suites.clone(),
        ..Default::default()
    };
    if let Some(t) = &l.tls {
        if let Some(own) = &t.sds {
            if !own.cluster_name.is_empty() {
                sds.cluster_name = own.cluster_name.clone();
            }
            if !own.cert_resource.is_empty() {
                sds.cert_resource = own.cert_resource.clone();
            }
        }
        if !t.tls_min_version.is_empty() {
            params.tls_min_version = t.tls_min_version.clone();
        }
        if !t.tls_max_version.is_empty() {
            params.tls_max_version = t.tls_max_version.clone();
        }
        if !t.cipher_suites.is_empty() {
            params.cipher_suites = t.cipher_suites.clone();
        }
    }
    ListenerTls {
        // Validation lets only both fields or neither through.
        sds: (!sds.cluster_name.is_empty() && !sds.cert_resource.is_empty()).then_some(sds),
        params,
        connect: entry.tls.enabled || l.tls.as_ref().is_some_and(|t| t.enabled),
    }
}

/// A service's own certificate over SDS: its `CertResource`, from its
/// cluster, else the listener's, else the gateway's (the most specific
/// wins); `None` when it names no certificate.
fn service_sds(
    l: &IngressListener, s: &IngressService, tls: &ListenerTls,
) -> Option<GatewayTlsSdsConfig> {
    let own = s.tls.as_ref()?.sds.as_ref()?;
    if own.cert_resource.is_empty() || s.hosts.is_empty() {
        return None;
    }
    let cluster = [
        Some(own.cluster_name.as_str()),
        l.tls
            .as_ref()
            .and_then(|t| t.sds.as_ref())
            .map(|s| s.cluster_name.as_str()),
        tls.sds.as_ref().map(|s| s.cluster_name.as_str()),
    ]
    .into_iter()
    .flatten()
    .find(|c| !c.is_empty())?;
    Some(GatewayTlsSdsConfig {
        cluster_name: cluster.to_string(),
        cert_resource: own.cert_resource.clone(),
    })
}

/// The listener's downstream TLS: the certificate over SDS when one is
/// configured, else the gateway's leaf when TLS is enabled, else none.
fn downstream_tls(t: &ListenerTls, id: &Identity, protocol: &str) -> Option<core::TransportSocket> {
    match &t.sds {
        Some(sds) => serve_tls(t, protocol, |c| {
            c.tls_certificate_sds_secret_configs = vec![sds_secret(sds)];
        }),
        None if t.connect && has_tls(id) => serve_tls(t, protocol, |c| {
            c.tls_certificates = leaf_certificates(id);
        }),
        None => None,
    }
}

/// TLS for clients outside the mesh (not asked for certificates): the
/// listener's versions and cipher suites, ALPN for its protocol, and the
/// certificate `cert` puts in.
fn serve_tls(
    t: &ListenerTls, protocol: &str, cert: impl FnOnce(&mut tls::CommonTlsContext),
) -> Option<core::TransportSocket> {
    let mut common = tls::CommonTlsContext {
        tls_params: Some(tls_params(&t.params)),
        alpn_protocols: alpn(protocol),
        ..Default::default()
    };
    cert(&mut common);
    transport_socket(tls::DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue { value: false }),
        ..Default::default()
    })
}

/// The ALPN a TLS listener offers for its protocol (as Consul's).
fn alpn(protocol: &str) -> Vec<String> {
    match protocol {
        "http2" | "grpc" => vec!["h2".into(), "http/1.1".into()],
        "http" => vec!["http/1.1".into()],
        _ => Vec::new(),
    }
}

/// A certificate Envoy fetches by SDS from the cluster the gateway's
/// bootstrap defines, over gRPC (Consul's shape).
fn sds_secret(sds: &GatewayTlsSdsConfig) -> tls::SdsSecretConfig {
    tls::SdsSecretConfig {
        name: sds.cert_resource.clone(),
        sds_config: Some(core::ConfigSource {
            config_source_specifier: Some(
                core::config_source::ConfigSourceSpecifier::ApiConfigSource(
                    core::ApiConfigSource {
                        api_type: core::api_config_source::ApiType::Grpc as i32,
                        transport_api_version: core::ApiVersion::V3 as i32,
                        grpc_services: vec![core::GrpcService {
                            target_specifier: Some(core::grpc_service::TargetSpecifier::EnvoyGrpc(
                                core::grpc_service::EnvoyGrpc {
                                    cluster_name: sds.cluster_name.clone(),
                                    ..Default::default()
                                },
                            )),
                            timeout: secs(5),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                ),
            ),
            resource_api_version: core::ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

/// An ingress service's connection limits and passive health check, each
/// falling back to the entry's `Defaults`, as circuit breakers and outlier
/// detection on its clusters.
fn apply_limits(
    c: &mut cluster::Cluster, own: Option<&IngressService>, defaults: Option<&IngressServiceConfig>,
) {
    use envoy_types::pb::google::protobuf::UInt32Value;
    let pick = |o: Option<u32>, d: Option<u32>| {
        o.filter(|v| *v > 0)
            .or(d.filter(|v| *v > 0))
            .map(|value| UInt32Value { value })
    };
    let max_connections = pick(
        own.map(|s| s.max_connections),
        defaults.map(|d| d.max_connections),
    );
    let max_pending_requests = pick(
        own.map(|s| s.max_pending_requests),
        defaults.map(|d| d.max_pending_requests),
    );
    let max_requests = pick(
        own.map(|s| s.max_concurrent_requests),
        defaults.map(|d| d.max_concurrent_requests),
    );
    if max_connections.is_some() || max_pending_requests.is_some() || max_requests.is_some() {
        c.circuit_breakers = Some(cluster::CircuitBreakers {
            thresholds: vec![cluster::circuit_breakers::Thresholds {
                max_connections,
                max_pending_requests,
                max_requests,
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    let phc = own
        .and_then(|s| s.passive_health_check.as_ref())
        .or(defaults.and_then(|d| d.passive_health_check.as_ref()));
    if let Some(p) = phc {
        let d = |d: &crate::structs::config_entry::Duration| {
            (d.nanos() > 0).then(|| envoy_types::pb::google::protobuf::Duration {
                seconds: d.nanos() / 1_000_000_000,
                nanos: (d.nanos() % 1_000_000_000) as i32,
            })
        };
        c.outlier_detection = Some(cluster::OutlierDetection {
            consecutive_5xx: (p.max_failures > 0).then_some(UInt32Value {
                value: p.max_failures,
            }),
            interval: d(&p.interval),
            enforcing_consecutive_5xx: p
                .enforcing_consecutive_5xx
                .map(|value| UInt32Value { value }),
            max_ejection_percent: p.max_ejection_percent.map(|value| UInt32Value { value }),
            base_ejection_time: p.base_ejection_time.as_ref().and_then(d),
            ..Default::default()
        });
    }
}

/// A gateway's TLS versions and cipher suites as Envoy's parameters.
fn tls_params(t: &GatewayTlsConfig) -> tls::TlsParameters {
    super::resources::tls_params(&t.tls_min_version, &t.tls_max_version, &t.cipher_suites)
}

fn leaf_certificates(id: &Identity) -> Vec<tls::TlsCertificate> {
    id.leaf
        .iter()
        .map(|(cert, key)| tls::TlsCertificate {
            certificate_chain: inline(cert),
            private_key: inline(key),
            ..Default::default()
        })
        .collect()
}

/// The domains a linked service answers on: its `Hosts`, else Consul's
/// default `<service>.ingress.*`; each without a port also with the
/// listener's (a Host header carries a port that is not well known).
fn ingress_domains(svc: &str, hosts: &[String], port: u32) -> Vec<String> {
    let mut domains = if hosts.is_empty() {
        vec![format!("{svc}.ingress.*")]
    } else {
        hosts.to_vec()
    };
    let with_port: Vec<String> = domains
        .iter()
        .filter(|h| !h.contains(':'))
        .map(|h| format!("{h}:{port}"))
        .collect();
    for h in with_port {
        if !domains.contains(&h) {
            domains.push(h);
        }
    }
    domains
}

/// An http-like listener's routes: one virtual host per linked service,
/// its routes those of the service's chain, with the entry's header edits.
fn ingress_routes(
    name: &str, l: &IngressListener,
    linked: &[(&str, &crate::discovery_chain::CompiledDiscoveryChain)],
) -> route::RouteConfiguration {
    let port = u32::try_from(l.port).unwrap_or(0);
    let mut virtual_hosts = Vec::new();
    for (svc, chain) in linked {
        // The entry's own line for it, else the wildcard's.
        let own = l
            .services
            .iter()
            .find(|s| s.name == *svc)
            .or_else(|| l.services.iter().find(|s| s.name == WILDCARD));
        let hosts = own.map(|s| s.hosts.as_slice()).unwrap_or_default();
        let routes = route_config(svc, chain)
            .virtual_hosts
            .into_iter()
            .next()
            .map(|v| v.routes)
            .unwrap_or_default();
        let mut vh = route::VirtualHost {
            name: svc.to_string(),
            domains: ingress_domains(svc, hosts, port),
            routes,
            ..Default::default()
        };
        if let Some(s) = own {
            (vh.request_headers_to_add, vh.request_headers_to_remove) =
                header_changes(s.request_headers.as_ref());
            (vh.response_headers_to_add, vh.response_headers_to_remove) =
                header_changes(s.response_headers.as_ref());
        }
        virtual_hosts.push(vh);
    }
    route::RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: true }),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// terminating
// ---------------------------------------------------------------------------

fn terminating(snap: &Snapshot, gw: &GatewaySnapshot, out: &mut Resources) {
    if gw.terminating.is_none() {
        return;
    }
    let base = identity(snap);
    let mut chains = Vec::new();
    for g in &gw.services {
        let svc = &g.service.name;
        let Some(linked) = gw.linked.get(svc) else {
            continue;
        };
        let sni = service_sni(svc, "", "", "", &gw.datacenter, &gw.trust_domain);
        // The cluster to the service's own addresses (they are not mesh
        // endpoints), as Consul's: by EDS while every instance has an IP;
        // else Envoy resolves a host name, one (LOGICAL_DNS takes one):
        // the first healthy instance's, else the last unhealthy one's
        // (marked so). Envoy cannot resolve names sent by EDS, and a
        // cluster cannot mix the two.
        let hostnames: Vec<&Arc<Instance>> = linked
            .instances
            .iter()
            .filter(|i| is_host_name(instance_address(i)))
            .collect();
        let mut c = eds_cluster(&sni);
        c.outlier_detection = Some(cluster::OutlierDetection::default());
        if hostnames.is_empty() {
            let rows = linked.instances.iter().map(|i| with_health(i)).collect();
            put(
                out,
                ENDPOINT,
                sni.clone(),
                Resource::of(one_locality(&sni, rows)),
            );
        } else {
            let pick = hostnames
                .iter()
                .find(|i| healthy(&i.checks, false))
                .or(hostnames.last());
            by_dns(&mut c, pick.map(|i| with_health(i)));
        }
        if !g.ca_file.is_empty() {
            c.transport_socket = transport_socket(origination_tls(g));
        }
        let http = is_http_like(&linked.protocol);
        if matches!(linked.protocol.as_str(), "http2" | "grpc") {
            http2_upstream(&mut c);
        }
        put(out, CLUSTER, sni.clone(), Resource::of(c));

        // The chain: the service's leaf to the mesh, its intentions.
        let id = Identity {
            leaf: linked
                .leaf
                .as_ref()
                .map(|l| (l.cert_pem.clone(), l.private_key_pem.clone())),
            ..base.clone()
        };
        let view = Snapshot {
            intentions: linked.intentions.clone(),
            gateway: None,
            ..snap.clone()
        };
        let transport = has_tls(&id).then(|| {
            transport_socket(tls::DownstreamTlsContext {
                common_tls_context: Some(common_tls(&id, Vec::new(), &id.incoming)),
                require_client_certificate: Some(BoolValue { value: true }),
                ..Default::default()
            })
        });
        let stat = format!("terminating_gateway.{svc}");
        let filters = if http {
            // L7: the intentions' HTTP RBAC (paths, methods, headers)
            // ahead of the router, as a sidecar's public listener.
            let routes = terminating_routes(&sni, svc, auto_host_rewrite(gw, svc));
            put(out, ROUTE, sni.clone(), Resource::of(routes));
            let mut m = rds_hcm(&stat, &sni);
            m.http_filters.insert(0, super::rbac::http_filter(&view));
            vec![typed("envoy.filters.network.http_connection_manager", m)]
        } else {
            vec![super::rbac::network_filter(&view), tcp_filter(&stat, &sni)]
        };
        chains.push(listener::FilterChain {
            filter_chain_match: Some(listener::FilterChainMatch {
                server_names: vec![sni.clone()],
                ..Default::default()
            }),
            filters,
            transport_socket: transport.flatten(),
            ..Default::default()
        });
    }
    sni_listener(snap, chains, "terminating_gateway.default", out);
}

/// An http linked service's routes (named by its SNI, as its cluster):
/// everything to its cluster, the Host header rewritten to the upstream's
/// host name unless the entry says not to (Consul's default).
fn terminating_routes(sni: &str, svc: &str, rewrite: bool) -> route::RouteConfiguration {
    let mut action = to_cluster(sni);
    if rewrite {
        action.host_rewrite_specifier = Some(
            route::route_action::HostRewriteSpecifier::AutoHostRewrite(BoolValue { value: true }),
        );
    }
    route::RouteConfiguration {
        name: sni.to_string(),
        virtual_hosts: vec![route::VirtualHost {
            name: svc.to_string(),
            domains: vec!["*".into()],
            routes: vec![route::Route {
                r#match: Some(prefix_match("/")),
                action: Some(route::route::Action::Route(action)),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The entry's line for `svc` (else its `*`) leaves the Host header alone
/// only with `DisableAutoHostRewrite`.
fn auto_host_rewrite(gw: &GatewaySnapshot, svc: &str) -> bool {
    let Some(e) = &gw.terminating else {
        return true;
    };
    let line = e
        .services
        .iter()
        .find(|s| s.name == svc)
        .or_else(|| e.services.iter().find(|s| s.name == WILDCARD));
    !line.is_some_and(|s| s.disable_auto_host_rewrite)
}

/// Instances as the endpoints of cluster `name`, at their own address
/// and port.
fn assignment(name: &str, rows: &[Arc<Instance>]) -> endpoint::ClusterLoadAssignment {
    let rows = rows
        .iter()
        .map(|i| {
            lb_endpoint(
                instance_address(i),
                u32::try_from(i.service.port).unwrap_or(0),
            )
        })
        .collect();
    one_locality(name, rows)
}

/// `name`'s endpoints, in one locality.
fn one_locality(
    name: &str, lb_endpoints: Vec<endpoint::LbEndpoint>,
) -> endpoint::ClusterLoadAssignment {
    endpoint::ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: vec![endpoint::LocalityLbEndpoints {
            lb_endpoints,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// An address Envoy must resolve (not an IP).
fn is_host_name(addr: &str) -> bool {
    addr.parse::<std::net::IpAddr>().is_err()
}

/// Turns an EDS cluster (`eds_cluster`) into one Envoy resolves by DNS, as
/// Consul's for host names: LOGICAL_DNS takes one endpoint (`endpoint`),
/// IPv4 (Consul's refresh rate, 10 s, is a deprecated field: Envoy's 5 s
/// stands). Envoy cannot resolve names sent by EDS.
fn by_dns(c: &mut cluster::Cluster, endpoint: Option<endpoint::LbEndpoint>) {
    c.eds_cluster_config = None;
    c.cluster_discovery_type = Some(cluster::cluster::ClusterDiscoveryType::Type(
        cluster::cluster::DiscoveryType::LogicalDns as i32,
    ));
    c.dns_lookup_family = cluster::cluster::DnsLookupFamily::V4Only as i32;
    c.load_assignment = Some(one_locality(&c.name, endpoint.into_iter().collect()));
}

/// A linked service's instance as an endpoint, its health as Consul's
/// (critical or in maintenance: unhealthy, so Envoy sends it nothing).
fn with_health(i: &Instance) -> endpoint::LbEndpoint {
    let mut e = lb_endpoint(
        instance_address(i),
        u32::try_from(i.service.port).unwrap_or(0),
    );
    e.health_status = if healthy(&i.checks, false) {
        core::HealthStatus::Healthy
    } else {
        core::HealthStatus::Unhealthy
    } as i32;
    e
}

fn instance_address(i: &Instance) -> &str {
    if i.service.address.is_empty() {
        &i.node.address
    } else {
        &i.service.address
    }
}

/// TLS from the gateway to a linked service: its CA to check the
/// server's certificate (and its SNI as the name to expect), and a client
/// certificate when one is configured.
fn origination_tls(g: &crate::structs::config_entry::GatewayService) -> tls::UpstreamTlsContext {
    let file = |f: &str| {
        Some(core::DataSource {
            specifier: Some(core::data_source::Specifier::Filename(f.to_string())),
            ..Default::default()
        })
    };
    let validation = tls::CertificateValidationContext {
        trusted_ca: file(&g.ca_file),
        match_typed_subject_alt_names: if g.sni.is_empty() {
            Vec::new()
        } else {
            vec![tls::SubjectAltNameMatcher {
                san_type: tls::subject_alt_name_matcher::SanType::Dns as i32,
                matcher: Some(
                    envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher {
                        match_pattern: Some(
                            envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(
                                g.sni.clone(),
                            ),
                        ),
                        ..Default::default()
                    },
                ),
                ..Default::default()
            }]
        },
        ..Default::default()
    };
    let certs = if g.cert_file.is_empty() {
        Vec::new()
    } else {
        vec![tls::TlsCertificate {
            certificate_chain: file(&g.cert_file),
            private_key: file(&g.key_file),
            ..Default::default()
        }]
    };
    tls::UpstreamTlsContext {
        common_tls_context: Some(tls::CommonTlsContext {
            tls_params: Some(tls::TlsParameters::default()),
            tls_certificates: certs,
            validation_context_type: Some(
                tls::common_tls_context::ValidationContextType::ValidationContext(validation),
            ),
            ..Default::default()
        }),
        sni: g.sni.clone(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// mesh
// ---------------------------------------------------------------------------

fn mesh(snap: &Snapshot, gw: &GatewaySnapshot, out: &mut Resources) {
    let mut chains = Vec::new();
    for (svc, rows) in &gw.local {
        let sni = service_sni(svc, "", "", "", &gw.datacenter, &gw.trust_domain);
        // Passed through still encrypted: the sidecars terminate mTLS.
        put(out, CLUSTER, sni.clone(), Resource::of(eds_cluster(&sni)));
        put(
            out,
            ENDPOINT,
            sni.clone(),
            Resource::of(assignment(&sni, rows)),
        );
        chains.push(passthrough(
            sni.clone(),
            &format!("mesh_gateway_local.{svc}"),
            &sni,
        ));
    }
    // Another datacenter's services: on to its gateways, still encrypted
    // (Envoy prefers an exact server name to a wildcard, so a local
    // service's chain above is never shadowed).
    for (dc, rows) in &gw.remote {
        let name = format!("{dc}.internal.{}", gw.trust_domain);
        // Gateways known by a host name (a cloud load balancer's): Envoy
        // resolves it, one (LOGICAL_DNS), as Consul's; names sent by EDS
        // it cannot resolve.
        // Each gateway's WAN endpoint, and whether its address is a name.
        let wan = |g: &Arc<Instance>| {
            let (addr, port) = gateway_address(g, true);
            (
                is_host_name(addr),
                lb_endpoint(addr, u32::try_from(port).unwrap_or(0)),
            )
        };
        let hostname = rows
            .iter()
            .map(wan)
            .find_map(|(named, e)| named.then_some(e));
        let mut c = eds_cluster(&name);
        if hostname.is_some() {
            by_dns(&mut c, hostname);
        } else {
            let all = rows.iter().map(|g| wan(g).1).collect();
            put(
                out,
                ENDPOINT,
                name.clone(),
                Resource::of(one_locality(&name, all)),
            );
        }
        put(out, CLUSTER, name.clone(), Resource::of(c));
        chains.push(passthrough(
            format!("*.{name}"),
            &format!("mesh_gateway_remote.{dc}"),
            &name,
        ));
    }
    sni_listener(snap, chains, "mesh_gateway_local.default", out);
}

/// A cluster whose endpoints come by EDS under its own name.
fn eds_cluster(name: &str) -> cluster::Cluster {
    cluster::Cluster {
        name: name.to_string(),
        alt_stat_name: name.to_string(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::cluster::EdsClusterConfig {
            eds_config: ads(),
            service_name: name.to_string(),
        }),
        connect_timeout: secs(5),
        ..Default::default()
    }
}

/// A filter chain for connections whose SNI is `server_name`, proxied
/// (TLS untouched) to `cluster`.
fn passthrough(server_name: String, stat: &str, cluster: &str) -> listener::FilterChain {
    listener::FilterChain {
        filter_chain_match: Some(listener::FilterChainMatch {
            server_names: vec![server_name],
            ..Default::default()
        }),
        filters: vec![tcp_filter(stat, cluster)],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier,
    };
    use prost::Message;

    use super::*;
    use crate::proxycfg::{Shared, build};
    use crate::state::Command;
    use crate::structs::{NodeService, RegisterRequest};

    fn register(w: &mut crate::testing::World, node: &str, addr: &str, svc: NodeService) {
        w.apply(Command::Register(Box::new(RegisterRequest {
            node: node.into(),
            address: addr.into(),
            service: Some(svc),
            ..Default::default()
        })));
    }

    fn svc(kind: &str, id: &str, port: i64) -> NodeService {
        NodeService {
            kind: kind.into(),
            id: id.into(),
            service: id.into(),
            port,
            ..Default::default()
        }
    }

    fn generated(w: &crate::testing::World, node: &str, id: &str) -> Resources {
        let state = w.store.state();
        let key = (node.to_string(), id.to_string());
        let (snap, _) = build(&state, "dc1", &key, &mut Shared::default()).expect("a gateway");
        assert!(snap.gateway.is_some());
        super::generate(&snap, snap.gateway.as_ref().expect("a gateway"))
    }

    #[test]
    fn a_mesh_gateway_passes_each_local_service_through_by_its_sni() {
        let mut w = crate::testing::World::new();
        register(&mut w, "n2", "10.0.0.2", svc("", "db", 5432));
        let mut proxy = svc("connect-proxy", "db-proxy", 21001);
        proxy.service = "db-sidecar-proxy".into();
        proxy.proxy.destination_service_name = "db".into();
        register(&mut w, "n2", "10.0.0.2", proxy);
        register(&mut w, "gw", "10.0.9.9", svc("mesh-gateway", "mgw", 8443));
        let out = generated(&w, "gw", "mgw");
        let td = format!("{}.consul", w.store.state().cluster_id);
        let sni = format!("db.default.dc1.internal.{td}");

        let listeners = &out[LISTENER];
        assert_eq!(
            listeners.keys().collect::<Vec<_>>(),
            ["default:0.0.0.0:8443"]
        );
        let l = Listener::decode(&*listeners["default:0.0.0.0:8443"].any.value).unwrap();
        assert_eq!(
            l.listener_filters[0].name,
            "envoy.filters.listener.tls_inspector"
        );
        // The service's chain, then the `sni_cluster` catch-all.
        assert_eq!(l.filter_chains.len(), 2);
        assert!(l.filter_chains[1].filter_chain_match.is_none());
        assert_eq!(
            l.filter_chains[1].filters[0].name,
            "envoy.filters.network.sni_cluster"
        );
        let fc = &l.filter_chains[0];
        assert_eq!(
            fc.filter_chain_match.as_ref().unwrap().server_names,
            [sni.as_str()]
        );
        // Passed through: no TLS termination at the gateway.
        assert!(fc.transport_socket.is_none());
        let Some(listener::filter::ConfigType::TypedConfig(any)) = &fc.filters[0].config_type
        else {
            panic!("no typed config");
        };
        let tcp = TcpProxy::decode(&*any.value).unwrap();
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster(sni.clone()))
        );
        assert!(out[CLUSTER].contains_key(&sni));
        // db's sidecar, never db's own port.
        let cla = ClusterLoadAssignment::decode(&*out[ENDPOINT][&sni].any.value).unwrap();
        let hosts: Vec<_> = cla.endpoints[0]
            .lb_endpoints
            .iter()
            .map(|e| match &e.host_identifier {
                Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                    match &ep.address.as_ref().unwrap().address {
                        Some(core::address::Address::SocketAddress(a)) => {
                            (a.address.clone(), a.port_specifier.clone())
                        }
                        _ => panic!("not a socket address"),
                    }
                }
                _ => panic!("no endpoint"),
            })
            .collect();
        assert_eq!(
            hosts,
            [(
                "10.0.0.2".to_string(),
                Some(core::socket_address::PortSpecifier::PortValue(21001))
            )]
        );
    }

    /// A mesh gateway of dc1 with no local service, and its gateway part.
    fn lone_mesh_gateway() -> (Snapshot, GatewaySnapshot) {
        let mut w = crate::testing::World::new();
        register(&mut w, "gw", "10.0.9.9", svc("mesh-gateway", "mgw", 8443));
        let state = w.store.state();
        let key = ("gw".to_string(), "mgw".to_string());
        let (snap, _) = build(&state, "dc1", &key, &mut Shared::default()).expect("a gateway");
        let gw = (**snap.gateway.as_ref().unwrap()).clone();
        (snap, gw)
    }

    /// Besides its local services, a mesh gateway passes every other
    /// datacenter's SNIs (`*.<dc>.internal.<td>`) on to a cluster of that
    /// datacenter's gateways at their WAN addresses, still encrypted.
    #[test]
    fn a_mesh_gateway_routes_another_datacenter_to_its_gateways() {
        let (snap, mut gw) = lone_mesh_gateway();
        let far: Instance = serde_json::from_value(serde_json::json!({
            "Node": {"Node": "gw2", "Address": "10.2.0.9", "Datacenter": "dc2",
                     "TaggedAddresses": {"wan": "198.51.100.2"}},
            "Service": {"ID": "mgw2", "Service": "mesh-gateway", "Kind": "mesh-gateway",
                        "Port": 8443},
            "Checks": []
        }))
        .unwrap();
        gw.remote
            .insert("dc2".into(), Arc::new(vec![Arc::new(far)]));
        let out = super::generate(&snap, &gw);
        let td = &gw.trust_domain;
        let name = format!("dc2.internal.{td}");

        let l = Listener::decode(&*out[LISTENER]["default:0.0.0.0:8443"].any.value).unwrap();
        assert_eq!(l.filter_chains.len(), 2, "dc2's chain and the catch-all");
        let fc = &l.filter_chains[0];
        assert_eq!(
            fc.filter_chain_match.as_ref().unwrap().server_names,
            [format!("*.{name}")]
        );
        assert!(fc.transport_socket.is_none(), "passed through");
        let Some(listener::filter::ConfigType::TypedConfig(any)) = &fc.filters[0].config_type
        else {
            panic!("no typed config");
        };
        let tcp = TcpProxy::decode(&*any.value).unwrap();
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster(name.clone()))
        );
        assert!(out[CLUSTER].contains_key(&name));
        // The node's WAN address (the service has none of its own).
        let cla = ClusterLoadAssignment::decode(&*out[ENDPOINT][&name].any.value).unwrap();
        let Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(ep)) =
            &cla.endpoints[0].lb_endpoints[0].host_identifier
        else {
            panic!("no endpoint");
        };
        let Some(core::address::Address::SocketAddress(a)) = &ep.address.as_ref().unwrap().address
        else {
            panic!("not a socket address");
        };
        assert_eq!(
            (a.address.as_str(), a.port_specifier.clone()),
            (
                "198.51.100.2",
                Some(core::socket_address::PortSpecifier::PortValue(8443))
            )
        );
    }

    /// Another datacenter's gateway known by a host name (a load
    /// balancer's): a LOGICAL_DNS cluster Envoy resolves, never a name in
    /// EDS (which Envoy cannot resolve).
    #[test]
    fn a_remote_gateway_with_a_host_name_is_a_dns_cluster() {
        let (snap, mut gw) = lone_mesh_gateway();
        let far: Instance = serde_json::from_value(serde_json::json!({
            "Node": {"Node": "gw2", "Address": "10.2.0.9", "Datacenter": "dc2"},
            "Service": {"ID": "mgw2", "Service": "mesh-gateway", "Kind": "mesh-gateway",
                        "Port": 8443,
                        "TaggedAddresses": {"wan": {"Address": "gw.dc2.example.com", "Port": 443}}},
            "Checks": []
        }))
        .unwrap();
        gw.remote
            .insert("dc2".into(), Arc::new(vec![Arc::new(far)]));
        let out = super::generate(&snap, &gw);
        let name = format!("dc2.internal.{}", gw.trust_domain);
        let c = cluster::Cluster::decode(&*out[CLUSTER][&name].any.value).unwrap();
        assert_eq!(
            c.cluster_discovery_type,
            Some(cluster::cluster::ClusterDiscoveryType::Type(
                cluster::cluster::DiscoveryType::LogicalDns as i32
            ))
        );
        assert!(!out[ENDPOINT].contains_key(&name), "no host name by EDS");
        let Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(ep)) =
            &c.load_assignment.unwrap().endpoints[0].lb_endpoints[0].host_identifier
        else {
            panic!("no endpoint");
        };
        let Some(core::address::Address::SocketAddress(a)) = &ep.address.as_ref().unwrap().address
        else {
            panic!("not a socket address");
        };
        assert_eq!(a.address, "gw.dc2.example.com");
    }

    #[test]
    fn cipher_suites_are_named_as_envoy_names_them() {
        for (iana, openssl) in [
            (
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                "ECDHE-ECDSA-AES128-GCM-SHA256",
            ),
            ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA"),
            (
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
                "ECDHE-RSA-CHACHA20-POLY1305",
            ),
            ("TLS_RSA_WITH_AES_128_GCM_SHA256", "AES128-GCM-SHA256"),
        ] {
            assert_eq!(
                super::super::resources::openssl_suite(iana),
                openssl,
                "{iana}"
            );
        }
    }

    /// A suite repeated (validation lets any number through) is named
    /// once, in the order first given.
    #[test]
    fn repeated_cipher_suites_are_named_once() {
        let mut suites = vec!["TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA".to_string(); 10_000];
        suites.push("TLS_RSA_WITH_AES_128_GCM_SHA256".into());
        suites.push("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA".into());
        let p = super::super::resources::tls_params("TLSv1_2", "", &suites);
        assert_eq!(
            p.cipher_suites,
            ["ECDHE-RSA-AES256-SHA", "AES128-GCM-SHA256"]
        );
    }

    fn config(w: &mut crate::testing::World, entry: serde_json::Value) {
        let entry = crate::config_check::decode_and_validate(&entry)
            .expect("a valid entry")
            .to_json();
        w.apply(Command::ConfigSet { entry, cas: None });
    }

    /// web, api and db (http) and cache (tcp), each with a sidecar; the
    /// built-in CA; an ingress gateway `ig` with `entry`.
    fn ingress_world(entry: serde_json::Value) -> crate::testing::World {
        let mut w = crate::testing::World::with_ca();
        for (name, port) in [
            ("web", 21000),
            ("api", 21001),
            ("db", 21002),
            ("cache", 21003),
        ] {
            if name != "cache" {
                config(
                    &mut w,
                    serde_json::json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"}),
                );
            }
            let mut proxy = svc("connect-proxy", &format!("{name}-proxy"), port);
            proxy.service = format!("{name}-sidecar-proxy");
            proxy.proxy.destination_service_name = name.into();
            register(&mut w, "n1", "10.0.0.1", proxy);
        }
        register(&mut w, "gw", "10.0.9.9", svc("ingress-gateway", "ig", 8443));
        config(&mut w, entry);
        w
    }

    fn downstream(fc: &listener::FilterChain) -> Option<tls::DownstreamTlsContext> {
        let ts = fc.transport_socket.as_ref()?;
        let Some(core::transport_socket::ConfigType::TypedConfig(any)) = &ts.config_type else {
            panic!("no typed config");
        };
        Some(tls::DownstreamTlsContext::decode(&*any.value).unwrap())
    }

    fn rds_name(fc: &listener::FilterChain) -> String {
        use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
            HttpConnectionManager, http_connection_manager::RouteSpecifier,
        };
        let Some(listener::filter::ConfigType::TypedConfig(any)) = &fc.filters[0].config_type
        else {
            panic!("no typed config");
        };
        match HttpConnectionManager::decode(&*any.value)
            .unwrap()
            .route_specifier
        {
            Some(RouteSpecifier::Rds(r)) => r.route_config_name,
            other => panic!("not RDS: {other:?}"),
        }
    }

    /// (secret name, SDS cluster) of a context's SDS certificates.
    fn sds_of(ctx: &tls::DownstreamTlsContext) -> Vec<(String, String)> {
        ctx.common_tls_context
            .as_ref()
            .unwrap()
            .tls_certificate_sds_secret_configs
            .iter()
            .map(|s| {
                let Some(core::config_source::ConfigSourceSpecifier::ApiConfigSource(api)) =
                    &s.sds_config.as_ref().unwrap().config_source_specifier
                else {
                    panic!("not an API config source: {s:?}");
                };
                let Some(core::grpc_service::TargetSpecifier::EnvoyGrpc(g)) =
                    &api.grpc_services[0].target_specifier
                else {
                    panic!("not Envoy gRPC");
                };
                (s.name.clone(), g.cluster_name.clone())
            })
            .collect()
    }

    fn dns_sans(pem: &str) -> Vec<String> {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = p.parse_x509().unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        san.value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect()
    }

    /// With TLS enabled and the built-in CA, the gateway's leaf names the
    /// hosts its listeners serve (`*.ingress.<domain>` for the default
    /// `<svc>.ingress.*` hosts, and every service's `Hosts`) and its
    /// listener presents it; without TLS, the leaf names none of them.
    #[test]
    fn an_ingress_gateways_leaf_names_every_host_it_serves() {
        let entry = |tls: bool| {
            serde_json::json!({"Kind": "ingress-gateway", "Name": "ig",
                "TLS": {"Enabled": tls},
                "Listeners": [{"Port": 8080, "Protocol": "http", "Services": [
                    {"Name": "web", "Hosts": ["web.example.com", "www.example.com"]},
                    {"Name": "api"}]}]})
        };
        let w = ingress_world(entry(true));
        let state = w.store.state();
        let key = ("gw".to_string(), "ig".to_string());
        let (snap, _) = build(&state, "dc1", &key, &mut Shared::default()).unwrap();
        let leaf = snap.leaf.as_ref().expect("a leaf");
        let sans = dns_sans(&leaf.cert_pem);
        for want in [
            "*.ingress.consul",
            "*.ingress.dc1.consul",
            "web.example.com",
            "www.example.com",
        ] {
            assert!(sans.iter().any(|s| s == want), "{want} not in {sans:?}");
        }
        let out = super::generate(&snap, snap.gateway.as_ref().unwrap());
        let l = Listener::decode(&*out[LISTENER]["http:0.0.0.0:8080"].any.value).unwrap();
        let ctx = downstream(&l.filter_chains[0]).expect("TLS");
        let common = ctx.common_tls_context.unwrap();
        assert_eq!(
            common.tls_certificates[0].certificate_chain,
            inline(&leaf.cert_pem)
        );
        assert_eq!(common.alpn_protocols, ["http/1.1"]);
        assert_eq!(
            ctx.require_client_certificate,
            Some(BoolValue { value: false })
        );

        // The domain handed in is the one named.
        let mut shared = Shared::default();
        shared.dns_domain = "example.internal".into();
        let (snap, _) = build(&state, "dc1", &key, &mut shared).unwrap();
        let sans = dns_sans(&snap.leaf.as_ref().unwrap().cert_pem);
        assert!(
            sans.iter().any(|s| s == "*.ingress.dc1.example.internal"),
            "{sans:?}"
        );

        let w = ingress_world(entry(false));
        let state = w.store.state();
        let (snap, _) = build(&state, "dc1", &key, &mut Shared::default()).unwrap();
        let sans = dns_sans(&snap.leaf.as_ref().unwrap().cert_pem);
        assert!(
            !sans
                .iter()
                .any(|s| s.contains("ingress") || s.contains("example")),
            "{sans:?}"
        );
        let out = super::generate(&snap, snap.gateway.as_ref().unwrap());
        let l = Listener::decode(&*out[LISTENER]["http:0.0.0.0:8080"].any.value).unwrap();
        assert!(l.filter_chains[0].transport_socket.is_none());
    }

    /// SDS replaces the leaf: the listener's certificate (the gateway's
    /// cluster, the listener's resource) on the default chain, and a
    /// service with a certificate of its own gets a chain matched by its
    /// hosts (SNI, read by the TLS inspector) with routes of its own.
    #[test]
    fn sds_certificates_are_named_per_listener_and_per_service() {
        let w = ingress_world(serde_json::json!({"Kind": "ingress-gateway", "Name": "ig",
            "TLS": {"SDS": {"ClusterName": "sds-cluster"}, "TLSMinVersion": "TLSv1_2"},
            "Listeners": [
                {"Port": 8443, "Protocol": "http",
                 "TLS": {"SDS": {"CertResource": "default-cert"}},
                 "Services": [
                    {"Name": "web", "Hosts": ["web.example.com"],
                     "TLS": {"SDS": {"ClusterName": "web-sds", "CertResource": "web-cert"}}},
                    {"Name": "api", "Hosts": ["api.example.com"],
                     "TLS": {"SDS": {"CertResource": "api-cert"}}},
                    {"Name": "db", "Hosts": ["db.example.com"]}]},
                {"Port": 9443, "Protocol": "tcp",
                 "TLS": {"SDS": {"ClusterName": "tcp-sds", "CertResource": "tcp-cert"}},
                 "Services": [{"Name": "cache"}]}]}));
        let out = generated(&w, "gw", "ig");
        let l = Listener::decode(&*out[LISTENER]["http:0.0.0.0:8443"].any.value).unwrap();
        assert_eq!(
            l.listener_filters[0].name,
            "envoy.filters.listener.tls_inspector"
        );
        let chains: Vec<_> = l
            .filter_chains
            .iter()
            .map(|fc| {
                let ctx = downstream(fc).expect("TLS on every chain");
                assert!(
                    ctx.common_tls_context
                        .as_ref()
                        .unwrap()
                        .tls_certificates
                        .is_empty(),
                    "no inline leaf with SDS"
                );
                (
                    fc.filter_chain_match
                        .as_ref()
                        .map(|m| m.server_names.clone())
                        .unwrap_or_default(),
                    rds_name(fc),
                    sds_of(&ctx),
                )
            })
            .collect();
        let pair = |a: &str, b: &str| vec![(a.to_string(), b.to_string())];
        assert_eq!(
            chains,
            vec![
                // The most specific cluster wins: the service's own, else
                // the listener's or the gateway's.
                (
                    vec!["api.example.com".to_string()],
                    "8443_api".to_string(),
                    pair("api-cert", "sds-cluster")
                ),
                (
                    vec!["web.example.com".to_string()],
                    "8443_web".to_string(),
                    pair("web-cert", "web-sds")
                ),
                (
                    vec![],
                    "8443".to_string(),
                    pair("default-cert", "sds-cluster")
                ),
            ]
        );
        let hosts = |name: &str| {
            let rc = route::RouteConfiguration::decode(&*out[ROUTE][name].any.value).unwrap();
            rc.virtual_hosts
                .iter()
                .map(|v| (v.name.clone(), v.domains.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            hosts("8443_web"),
            [(
                "web".into(),
                vec!["web.example.com".into(), "web.example.com:8443".into()]
            )]
        );
        assert_eq!(
            hosts("8443"),
            [(
                "db".into(),
                vec!["db.example.com".into(), "db.example.com:8443".into()]
            )]
        );
        // The tcp listener's own certificate, no SNI to read.
        let tcp = Listener::decode(&*out[LISTENER]["cache:0.0.0.0:9443"].any.value).unwrap();
        assert!(tcp.listener_filters.is_empty());
        let ctx = downstream(&tcp.filter_chains[0]).unwrap();
        assert_eq!(sds_of(&ctx), pair("tcp-cert", "tcp-sds"));
        assert!(ctx.common_tls_context.unwrap().alpn_protocols.is_empty());
    }

    /// A linked service that speaks http gets an HTTP filter chain at the
    /// terminating gateway: the intentions' L7 permissions as the HTTP
    /// RBAC filter ahead of the router, its routes to its cluster; a tcp
    /// one keeps the network RBAC and the tcp proxy.
    #[test]
    fn a_terminating_gateway_enforces_l7_intentions_on_http_services() {
        use envoy_types::pb::envoy::config::rbac::v3 as rbac;
        use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
        use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
            HttpConnectionManager, http_filter,
        };
        let mut w = crate::testing::World::with_ca();
        config(
            &mut w,
            serde_json::json!({"Kind": "service-defaults", "Name": "billing", "Protocol": "http"}),
        );
        config(
            &mut w,
            serde_json::json!({"Kind": "service-intentions", "Name": "billing", "Sources": [
                {"Name": "web", "Permissions": [
                    {"Action": "allow", "HTTP": {"PathPrefix": "/v1", "Methods": ["GET"]}},
                    {"Action": "deny", "HTTP": {"PathPrefix": "/"}}]}]}),
        );
        register(&mut w, "n9", "10.0.0.9", svc("", "billing", 443));
        register(&mut w, "n9", "10.0.0.9", svc("", "ledger", 5433));
        register(
            &mut w,
            "gw",
            "10.0.9.9",
            svc("terminating-gateway", "tg", 8444),
        );
        config(
            &mut w,
            serde_json::json!({"Kind": "terminating-gateway", "Name": "tg", "Services": [
                {"Name": "billing"}, {"Name": "ledger", "DisableAutoHostRewrite": true}]}),
        );
        let out = generated(&w, "gw", "tg");
        let td = format!("{}.consul", w.store.state().cluster_id);
        let sni = |s: &str| format!("{s}.default.dc1.internal.{td}");
        let l = Listener::decode(&*out[LISTENER]["default:0.0.0.0:8444"].any.value).unwrap();
        let chain = |s: &str| {
            l.filter_chains
                .iter()
                .find(|fc| fc.filter_chain_match.as_ref().unwrap().server_names == [sni(s)])
                .unwrap_or_else(|| panic!("no chain for {s}"))
        };
        let billing = chain("billing");
        assert_eq!(billing.filters.len(), 1);
        assert_eq!(
            billing.filters[0].name,
            "envoy.filters.network.http_connection_manager"
        );
        assert_eq!(rds_name(billing), sni("billing"));
        let Some(listener::filter::ConfigType::TypedConfig(any)) = &billing.filters[0].config_type
        else {
            panic!("no typed config");
        };
        let hcm = HttpConnectionManager::decode(&*any.value).unwrap();
        let names: Vec<_> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["envoy.filters.http.rbac", "envoy.filters.http.router"]
        );
        let Some(http_filter::ConfigType::TypedConfig(any)) = &hcm.http_filters[0].config_type
        else {
            panic!("no RBAC config");
        };
        let rules = HttpRbac::decode(&*any.value).unwrap().rules.unwrap();
        // Default allow: the deny permission ("/" but not "GET /v1").
        assert_eq!(rules.action, rbac::rbac::Action::Deny as i32);
        assert_eq!(
            rules.policies.keys().collect::<Vec<_>>(),
            ["consul-intentions-layer7-0"]
        );
        let rc =
            route::RouteConfiguration::decode(&*out[ROUTE][&sni("billing")].any.value).unwrap();
        let Some(route::route::Action::Route(a)) = &rc.virtual_hosts[0].routes[0].action else {
            panic!("no route action");
        };
        assert_eq!(
            a.cluster_specifier,
            Some(route::route_action::ClusterSpecifier::Cluster(sni(
                "billing"
            )))
        );
        assert!(matches!(
            a.host_rewrite_specifier,
            Some(route::route_action::HostRewriteSpecifier::AutoHostRewrite(
                BoolValue { value: true }
            ))
        ));
        // ledger speaks tcp: L4 as before, and no routes of its own.
        let ledger = chain("ledger");
        let names: Vec<_> = ledger.filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "envoy.filters.network.rbac",
                "envoy.filters.network.tcp_proxy"
            ]
        );
        assert!(!out[ROUTE].contains_key(&sni("ledger")));
    }

    #[test]
    fn a_gateway_without_its_entry_serves_nothing() {
        let mut w = crate::testing::World::new();
        register(&mut w, "n1", "10.0.0.1", svc("", "web", 80));
        register(&mut w, "gw", "10.0.9.9", svc("ingress-gateway", "ig", 8443));
        register(
            &mut w,
            "gw",
            "10.0.9.9",
            svc("terminating-gateway", "tg", 8444),
        );
        for id in ["ig", "tg"] {
            let out = generated(&w, "gw", id);
            assert!(out.values().all(|m| m.is_empty()), "{id}: {out:?}");
        }
    }
}
