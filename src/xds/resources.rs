//! Envoy resources, named as Consul names them (so dashboards and tooling
//! keep working): the types and the order they go out in, `Resource` (its
//! version a hash of its encoding), the snapshot's mesh `Identity`, and
//! the pieces every generator (`super::sidecar`, `super::gateway`,
//! `super::grpc`) builds with: sockets, TLS contexts, filters, a chain
//! target's cluster and load assignment, a chain's routes.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3 as cluster;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::config::route::v3 as route;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3 as tcp;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use envoy_types::pb::envoy::r#type::matcher::v3 as matcher;
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration, UInt32Value};
use envoy_types::util::pack_any;
use prost::{Message, Name};

use crate::discovery_chain::{
    CompiledDiscoveryChain, DiscoveryGraphNode, DiscoveryTarget, NodeType,
};
use crate::proxycfg::{Snapshot, UpstreamSnapshot, gateway_address};
use crate::structs::config_entry::{
    Duration, HttpHeaderModifiers, ServiceRouteDestination, ServiceRouteHttpMatch,
};

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// The order Envoy needs updates in: a cluster before its endpoints, a
/// listener before its routes (and clusters before the listeners that
/// name them).
pub const ORDER: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];

/// A type URL as the one of `ORDER` it names (`None`: a type this server
/// does not serve).
pub fn known(type_url: &str) -> Option<&'static str> {
    ORDER.iter().copied().find(|t| *t == type_url)
}

/// One encoded resource and its version (a hash of its encoding, so an
/// unchanged resource keeps its version across rebuilds). The encoding is
/// shared: the streams of proxies with the same resource hold one copy
/// (`super::share`).
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub version: String,
    pub any: Arc<Any>,
}

impl Resource {
    pub(crate) fn of<T: Message + Name>(msg: T) -> Resource {
        let any = pack_any(msg);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        any.value.hash(&mut h);
        Resource {
            version: format!("{:016x}", h.finish()),
            any: Arc::new(any),
        }
    }
}

/// type URL → resource name → resource.
pub type Resources = BTreeMap<&'static str, BTreeMap<String, Resource>>;

/// What the mesh's identity gives a proxy: the CA roots it trusts, its own
/// leaf certificate and the trust domain. Without them (no CA yet) the
/// listeners and clusters carry no TLS. Compared and hashed by content,
/// every field (derived): it keys the clusters `super::share` hands every
/// proxy with the same one, so whatever a TLS context reads belongs here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Identity {
    pub roots_pem: String,
    pub leaf: Option<(String, String)>,
    pub trust_domain: String,
    /// The mesh entry's `TLS.Incoming`: the mTLS the proxy accepts.
    pub incoming: tls::TlsParameters,
    /// The mesh entry's `TLS.Outgoing`: the mTLS the proxy dials with.
    pub outgoing: tls::TlsParameters,
}

/// The mesh's trust domain: the roots', else the one in the chain
/// targets' SNI `<svc>.default.<dc>.internal.<trust-domain>`.
pub(crate) fn trust_domain(snap: &Snapshot) -> String {
    snap.roots
        .as_ref()
        .map(|r| r.trust_domain.clone())
        .filter(|t| !t.is_empty())
        .or_else(|| {
            snap.upstreams
                .values()
                .filter_map(|u| u.chain.as_ref())
                .flat_map(|c| c.targets.values())
                .find_map(|t| t.sni.split_once(".internal.").map(|(_, td)| td.to_string()))
        })
        .unwrap_or_default()
}

/// The mesh identity a snapshot carries: every CA root (the active one and
/// those still trusted after a rotation), the proxy's leaf, and the trust
/// domain.
pub fn identity(snap: &Snapshot) -> Identity {
    let trust_domain = trust_domain(snap);
    let mut roots_pem = String::new();
    for root in snap.roots.iter().flat_map(|r| r.roots.iter()) {
        roots_pem.push_str(root.root_cert.trim_end());
        roots_pem.push('\n');
    }
    let mesh = snap.mesh_tls.as_deref();
    let params = |d: Option<&crate::structs::config_entry::MeshDirectionalTlsConfig>| {
        d.map(|d| tls_params(&d.tls_min_version, &d.tls_max_version, &d.cipher_suites))
            .unwrap_or_default()
    };
    Identity {
        roots_pem,
        leaf: snap
            .leaf
            .as_ref()
            .map(|l| (l.cert_pem.clone(), l.private_key_pem.clone())),
        trust_domain,
        incoming: params(mesh.and_then(|m| m.incoming.as_ref())),
        outgoing: params(mesh.and_then(|m| m.outgoing.as_ref())),
    }
}

/// TLS versions (Consul's `TLSv1_2` names) and cipher suites as Envoy's
/// parameters; unset ones are Envoy's defaults.
pub(crate) fn tls_params(min: &str, max: &str, suites: &[String]) -> tls::TlsParameters {
    use tls::tls_parameters::TlsProtocol;
    let version = |v: &str| match v {
        "TLSv1_0" => TlsProtocol::TlSv10,
        "TLSv1_1" => TlsProtocol::TlSv11,
        "TLSv1_2" => TlsProtocol::TlSv12,
        "TLSv1_3" => TlsProtocol::TlSv13,
        _ => TlsProtocol::TlsAuto,
    } as i32;
    // Each suite once: a list repeating the few valid ones (an entry may
    // hold thousands) costs every proxy's build one pass, not a resource
    // of that size.
    let mut distinct: Vec<String> = Vec::new();
    for c in suites {
        let c = openssl_suite(c);
        if !distinct.contains(&c) {
            distinct.push(c);
        }
    }
    tls::TlsParameters {
        tls_minimum_protocol_version: version(min),
        tls_maximum_protocol_version: version(max),
        // Envoy (BoringSSL) names suites in OpenSSL's words.
        cipher_suites: distinct,
        ..Default::default()
    }
}

/// A cipher suite's IANA name (Consul's) in OpenSSL's words (Envoy's).
pub(crate) fn openssl_suite(iana: &str) -> String {
    iana.trim_start_matches("TLS_")
        .replace("_WITH_", "_")
        .replace("ECDHE_ECDSA_", "ECDHE-ECDSA-")
        .replace("ECDHE_RSA_", "ECDHE-RSA-")
        .replace("RSA_AES", "AES")
        .replace("AES_128_GCM_SHA256", "AES128-GCM-SHA256")
        .replace("AES_256_GCM_SHA384", "AES256-GCM-SHA384")
        .replace("AES_128_CBC_SHA", "AES128-SHA")
        .replace("AES_256_CBC_SHA", "AES256-SHA")
        .replace("CHACHA20_POLY1305", "CHACHA20-POLY1305")
        // Go's newer name for the ChaCha suites, which Consul takes too.
        .replace("CHACHA20-POLY1305_SHA256", "CHACHA20-POLY1305")
}

/// Every type, each with no resource yet.
pub(crate) fn every_type() -> Resources {
    ORDER.iter().map(|t| (*t, BTreeMap::new())).collect()
}

/// Adds a resource of type `ty` (`out` holds every type: `every_type`).
pub(crate) fn put(out: &mut Resources, ty: &'static str, name: String, r: Resource) {
    out.get_mut(ty).expect("every type").insert(name, r);
}

pub(crate) fn socket(addr: &str, port: u32) -> core::Address {
    core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: addr.to_string(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn duration(d: Duration) -> Option<PbDuration> {
    (d.nanos() > 0).then(|| PbDuration {
        seconds: d.nanos() / 1_000_000_000,
        nanos: (d.nanos() % 1_000_000_000) as i32,
    })
}

/// A setting in milliseconds (the proxy config's `*_ms`; 0 stays 0, which
/// for a route's timeout means none).
pub(crate) fn millis(ms: u64) -> Option<PbDuration> {
    Some(PbDuration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: ((ms % 1000) * 1_000_000) as i32,
    })
}

pub(crate) fn secs(s: i64) -> Option<PbDuration> {
    Some(PbDuration {
        seconds: s,
        nanos: 0,
    })
}

pub(crate) fn inline(s: &str) -> Option<core::DataSource> {
    Some(core::DataSource {
        specifier: Some(core::data_source::Specifier::InlineString(s.to_string())),
        ..Default::default()
    })
}

pub(crate) fn ads() -> Option<core::ConfigSource> {
    Some(core::ConfigSource {
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        resource_api_version: core::ApiVersion::V3 as i32,
        ..Default::default()
    })
}

pub(crate) fn transport_socket<T: Message + Name>(ctx: T) -> Option<core::TransportSocket> {
    Some(core::TransportSocket {
        name: "tls".into(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(pack_any(
            ctx,
        ))),
    })
}

/// The leaf as this proxy's certificate and the roots as what the peer's
/// must chain to, with `params` (the mesh entry's settings for the
/// direction: `id.incoming` or `id.outgoing`).
pub(crate) fn common_tls(
    id: &Identity, sans: Vec<String>, params: &tls::TlsParameters,
) -> tls::CommonTlsContext {
    let validation = tls::CertificateValidationContext {
        trusted_ca: inline(&id.roots_pem),
        match_typed_subject_alt_names: sans
            .iter()
            .map(|uri| tls::SubjectAltNameMatcher {
                san_type: tls::subject_alt_name_matcher::SanType::Uri as i32,
                matcher: Some(exact(uri)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    tls::CommonTlsContext {
        tls_params: Some(params.clone()),
        tls_certificates: id
            .leaf
            .iter()
            .map(|(cert, key)| tls::TlsCertificate {
                certificate_chain: inline(cert),
                private_key: inline(key),
                ..Default::default()
            })
            .collect(),
        validation_context_type: Some(
            tls::common_tls_context::ValidationContextType::ValidationContext(validation),
        ),
        ..Default::default()
    }
}

pub(crate) fn has_tls(id: &Identity) -> bool {
    id.leaf.is_some() && !id.roots_pem.is_empty()
}

fn exact(s: &str) -> matcher::StringMatcher {
    matcher::StringMatcher {
        match_pattern: Some(matcher::string_matcher::MatchPattern::Exact(s.to_string())),
        ..Default::default()
    }
}

fn regex(s: &str) -> matcher::RegexMatcher {
    matcher::RegexMatcher {
        regex: s.to_string(),
        ..Default::default()
    }
}

/// HTTP/2 to the cluster's hosts (gRPC and http2 services), as Consul
/// sets it: Envoy speaks HTTP/1.1 upstream otherwise.
pub(crate) fn http2_upstream(c: &mut cluster::Cluster) {
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
        HttpProtocolOptions, http_protocol_options,
    };
    let options = HttpProtocolOptions {
        upstream_protocol_options: Some(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                            core::Http2ProtocolOptions::default(),
                        ),
                    ),
                },
            ),
        ),
        ..Default::default()
    };
    c.typed_extension_protocol_options.insert(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
        pack_any(options),
    );
}

pub(crate) fn typed<T: Message + Name>(name: &str, msg: T) -> listener::Filter {
    listener::Filter {
        name: name.into(),
        config_type: Some(listener::filter::ConfigType::TypedConfig(pack_any(msg))),
    }
}

pub(crate) fn tcp_filter(stat: &str, cluster: &str) -> listener::Filter {
    typed(
        "envoy.filters.network.tcp_proxy",
        tcp::TcpProxy {
            stat_prefix: stat.to_string(),
            cluster_specifier: Some(tcp::tcp_proxy::ClusterSpecifier::Cluster(
                cluster.to_string(),
            )),
            ..Default::default()
        },
    )
}

pub(crate) fn hcm_base(stat: &str) -> hcm::HttpConnectionManager {
    hcm::HttpConnectionManager {
        stat_prefix: stat.to_string(),
        http_filters: vec![hcm::HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack_any(
                Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn named_filter<T: Message + Name>(name: &str, msg: T) -> hcm::HttpFilter {
    hcm::HttpFilter {
        name: name.into(),
        config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack_any(msg))),
        ..Default::default()
    }
}

/// An HTTP connection manager for `protocol`: on gRPC, as Consul's every
/// gRPC listener, per-method stats and the HTTP/1.1 bridge go first (the
/// router stays last, as the bridge needs); HTTP/2 and gRPC accept HTTP/2.
pub(crate) fn for_protocol(m: &mut hcm::HttpConnectionManager, protocol: &str) {
    use envoy_types::pb::envoy::extensions::filters::http::grpc_http1_bridge::v3 as bridge;
    use envoy_types::pb::envoy::extensions::filters::http::grpc_stats::v3 as stats;
    if matches!(protocol, "http2" | "grpc") {
        m.http2_protocol_options = Some(core::Http2ProtocolOptions::default());
    }
    if protocol != "grpc" {
        return;
    }
    let grpc = [
        named_filter(
            "envoy.filters.http.grpc_stats",
            stats::FilterConfig {
                emit_filter_state: true,
                per_method_stat_specifier: Some(
                    stats::filter_config::PerMethodStatSpecifier::StatsForAllMethods(
                        envoy_types::pb::google::protobuf::BoolValue { value: true },
                    ),
                ),
                ..Default::default()
            },
        ),
        named_filter(
            "envoy.filters.http.grpc_http1_bridge",
            bridge::Config::default(),
        ),
    ];
    m.http_filters.splice(0..0, grpc);
}

/// The ALPN protocols a TLS listener offers for `protocol` (none on tcp).
pub(crate) fn alpn(protocol: &str) -> Vec<String> {
    match protocol {
        "http" => vec!["http/1.1".into()],
        "http2" | "grpc" => vec!["h2".into(), "http/1.1".into()],
        _ => Vec::new(),
    }
}

/// The public listener's client details, as Consul's: the caller's
/// certificate forwarded to the application (XFCC, appended to what came
/// in), and its SPIFFE identity's parts as the request's `consul`
/// metadata, for the filters after it.
pub(crate) fn forward_client_cert(m: &mut hcm::HttpConnectionManager) {
    use envoy_types::pb::envoy::extensions::filters::http::header_to_metadata::v3 as h2m;
    m.forward_client_cert_details =
        hcm::http_connection_manager::ForwardClientCertDetails::AppendForward as i32;
    m.set_current_client_cert_details =
        Some(hcm::http_connection_manager::SetCurrentClientCertDetails {
            subject: Some(envoy_types::pb::google::protobuf::BoolValue { value: true }),
            cert: true,
            chain: true,
            dns: true,
            uri: true,
            ..Default::default()
        });
    // The last element of the header is this hop's client (APPEND_FORWARD).
    let part = |key: &str, pattern: &str| h2m::config::Rule {
        header: "x-forwarded-client-cert".into(),
        on_header_present: Some(h2m::config::KeyValuePair {
            metadata_namespace: "consul".into(),
            key: key.into(),
            regex_value_rewrite: Some(matcher::RegexMatchAndSubstitute {
                pattern: Some(regex(&format!(
                    r"^(?:.*,)?[^,]*URI=spiffe://{pattern}(?:[;,/].*)?$"
                ))),
                substitution: r"\1".into(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let rules = vec![
        part("trust-domain", r"([^/;,]+)"),
        part("partition", r"[^/;,]+/ap/([^/;,]+)"),
        part("namespace", r"[^/;,]+(?:/ap/[^/;,]+)?/ns/([^/;,]+)"),
        part(
            "datacenter",
            r"[^/;,]+(?:/ap/[^/;,]+)?/ns/[^/;,]+/dc/([^/;,]+)",
        ),
        part(
            "service",
            r"[^/;,]+(?:/ap/[^/;,]+)?/ns/[^/;,]+/dc/[^/;,]+/svc/([^/;,]+)",
        ),
    ];
    let at = m.http_filters.len().saturating_sub(1);
    m.http_filters.insert(
        at,
        named_filter(
            "envoy.filters.http.header_to_metadata",
            h2m::Config {
                request_rules: rules,
                ..Default::default()
            },
        ),
    );
}

/// An upstream's HTTP connection manager for `protocol`, its routes by
/// RDS over ADS.
pub(crate) fn http_filter(stat: &str, route: &str, protocol: &str) -> listener::Filter {
    let mut m = rds_hcm(stat, route);
    for_protocol(&mut m, protocol);
    typed("envoy.filters.network.http_connection_manager", m)
}

/// An HTTP connection manager whose routes are `route`, by RDS over ADS.
pub(crate) fn rds_hcm(stat: &str, route: &str) -> hcm::HttpConnectionManager {
    let mut m = hcm_base(stat);
    m.route_specifier = Some(hcm::http_connection_manager::RouteSpecifier::Rds(
        hcm::Rds {
            config_source: ads(),
            route_config_name: route.to_string(),
        },
    ));
    m
}

pub(crate) fn lb_endpoint(addr: &str, port: u32) -> endpoint::LbEndpoint {
    endpoint::LbEndpoint {
        host_identifier: Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(
            endpoint::Endpoint {
                address: Some(socket(addr, port)),
                ..Default::default()
            },
        )),
        health_status: core::HealthStatus::Healthy as i32,
        ..Default::default()
    }
}

/// The resolver node a chain node leads to (for a tcp chain: the start).
fn resolver_of<'a>(
    chain: &'a CompiledDiscoveryChain, node: &'a DiscoveryGraphNode,
) -> Option<&'a DiscoveryGraphNode> {
    match node.node_type {
        NodeType::Resolver => Some(node),
        _ => None,
    }
    .or_else(|| {
        let next = node
            .routes
            .first()
            .map(|r| &r.next_node)
            .or(node.splits.first().map(|s| &s.next_node))?;
        resolver_of(chain, chain.nodes.get(next)?)
    })
}

/// The cluster a tcp upstream's traffic goes to: its start resolver's target.
pub(crate) fn start_cluster(chain: &CompiledDiscoveryChain) -> Option<String> {
    let start = chain.nodes.get(&chain.start_node)?;
    let r = resolver_of(chain, start)?.resolver.as_ref()?;
    Some(cluster_name(chain, &r.target))
}

/// A chain target's cluster (and EDS) name: the target's name (its SNI),
/// behind `<hash>~` when an upstream's overrides customized the chain, as
/// Consul's `CustomizeClusterName` (`~`, never in a name, keeps it apart
/// from a subset's).
pub(crate) fn cluster_name(chain: &CompiledDiscoveryChain, target: &str) -> String {
    let name = chain
        .targets
        .get(target)
        .map_or(target, |t| t.name.as_str());
    if chain.customization_hash.is_empty() {
        name.to_string()
    } else {
        format!("{}~{name}", chain.customization_hash)
    }
}

/// The targets a chain routes to: its resolver nodes' (a failover target
/// is reached through its primary's clusters, not on its own).
pub(crate) fn routed_targets(chain: &CompiledDiscoveryChain) -> Vec<&DiscoveryTarget> {
    let mut out: Vec<&DiscoveryTarget> = Vec::new();
    for r in chain.nodes.values().filter_map(|n| n.resolver.as_ref()) {
        if let Some(t) = chain.targets.get(&r.target)
            && !out.iter().any(|o| o.id == t.id)
        {
            out.push(t);
        }
    }
    out
}

/// One chain target's cluster, its failover targets' endpoints at lower
/// priorities of the same cluster (a proxyless client's shape; a proxy's is
/// `target_clusters`).
pub(crate) fn target_cluster(
    chain: &CompiledDiscoveryChain, target: &DiscoveryTarget, id: &Identity,
) -> cluster::Cluster {
    let dialed: Vec<&DiscoveryTarget> = tiers(chain, &target.id)
        .iter()
        .filter_map(|t| chain.targets.get(t))
        .collect();
    chain_cluster(chain, target, cluster_name(chain, &target.id), &dialed, id)
}

/// A target's clusters as Consul's: one EDS cluster named by the target;
/// with failover, an aggregate cluster by that name over one EDS cluster
/// per tier (`failover-target~<i>~<name>`), each dialing its own target
/// with its own SNI and identity, Envoy moving to the next tier when one
/// has no healthy host.
pub(crate) fn target_clusters(
    chain: &CompiledDiscoveryChain, target: &DiscoveryTarget, id: &Identity,
) -> Vec<cluster::Cluster> {
    let tiers = tiers(chain, &target.id);
    if tiers.len() == 1 {
        return vec![chain_cluster(
            chain,
            target,
            cluster_name(chain, &target.id),
            &[target],
            id,
        )];
    }
    use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
    let name = cluster_name(chain, &target.id);
    let mut out = vec![cluster::Cluster {
        name: name.clone(),
        alt_stat_name: name.clone(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::ClusterType(
            cluster::cluster::CustomClusterType {
                name: "envoy.clusters.aggregate".into(),
                typed_config: Some(pack_any(ClusterConfig {
                    clusters: (0..tiers.len()).map(|i| tier_name(&name, i)).collect(),
                })),
            },
        )),
        connect_timeout: connect_timeout(target),
        lb_policy: cluster::cluster::LbPolicy::ClusterProvided as i32,
        ..Default::default()
    }];
    for (i, t) in tiers.iter().enumerate() {
        let Some(dialed) = chain.targets.get(t) else {
            continue;
        };
        out.push(chain_cluster(
            chain,
            target,
            tier_name(&name, i),
            &[dialed],
            id,
        ));
    }
    out
}

/// A target's load assignments, one per cluster of `target_clusters`.
pub(crate) fn target_assignments(
    chain: &CompiledDiscoveryChain, us: &UpstreamSnapshot, target: &str,
) -> Vec<endpoint::ClusterLoadAssignment> {
    let tiers = tiers(chain, target);
    if tiers.len() == 1 {
        return vec![load_assignment(chain, us, target)];
    }
    let name = cluster_name(chain, target);
    tiers
        .iter()
        .enumerate()
        .map(|(i, t)| endpoint::ClusterLoadAssignment {
            cluster_name: tier_name(&name, i),
            endpoints: tier_endpoints(us, t, 0).into_iter().collect(),
            ..Default::default()
        })
        .collect()
}

fn tier_name(cluster: &str, i: usize) -> String {
    format!("failover-target~{i}~{cluster}")
}

/// The connect timeout of `target`'s resolver (Envoy's 5 s when unset).
fn connect_timeout(target: &DiscoveryTarget) -> Option<PbDuration> {
    if target.connect_timeout.nanos() > 0 {
        duration(target.connect_timeout)
    } else {
        secs(5)
    }
}

/// An EDS cluster `name` over ADS with `target`'s resolver settings
/// (connect timeout, load balancer), and mTLS to `dialed`'s sidecars: the
/// first's SNI, every one's SPIFFE identity.
fn chain_cluster(
    chain: &CompiledDiscoveryChain, target: &DiscoveryTarget, name: String,
    dialed: &[&DiscoveryTarget], id: &Identity,
) -> cluster::Cluster {
    let timeout = connect_timeout(target);
    let lb = chain
        .nodes
        .values()
        .find(|n| n.resolver.as_ref().is_some_and(|r| r.target == target.id))
        .and_then(|n| n.load_balancer.as_ref());
    let mut c = cluster::Cluster {
        name: name.clone(),
        alt_stat_name: name.clone(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::cluster::EdsClusterConfig {
            eds_config: ads(),
            service_name: name,
        }),
        connect_timeout: timeout,
        // As Consul's upstream clusters: outlier detection on with Envoy's
        // defaults, and no panic routing (a mostly unhealthy set is not
        // load-balanced over its unhealthy hosts).
        outlier_detection: Some(cluster::OutlierDetection::default()),
        common_lb_config: Some(cluster::cluster::CommonLbConfig {
            healthy_panic_threshold: Some(envoy_types::pb::envoy::r#type::v3::Percent {
                value: 0.0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some(lb) = lb {
        use cluster::cluster::LbPolicy;
        c.lb_policy = match lb.policy.as_str() {
            "least_request" => LbPolicy::LeastRequest,
            "ring_hash" => LbPolicy::RingHash,
            "maglev" => LbPolicy::Maglev,
            "random" => LbPolicy::Random,
            _ => LbPolicy::RoundRobin,
        } as i32;
        if let Some(rh) = &lb.ring_hash_config {
            c.lb_config = Some(cluster::cluster::LbConfig::RingHashLbConfig(
                cluster::cluster::RingHashLbConfig {
                    minimum_ring_size: (rh.minimum_ring_size > 0).then_some(
                        envoy_types::pb::google::protobuf::UInt64Value {
                            value: rh.minimum_ring_size,
                        },
                    ),
                    maximum_ring_size: (rh.maximum_ring_size > 0).then_some(
                        envoy_types::pb::google::protobuf::UInt64Value {
                            value: rh.maximum_ring_size,
                        },
                    ),
                    ..Default::default()
                },
            ));
        }
        if let Some(lr) = &lb.least_request_config {
            c.lb_config = Some(cluster::cluster::LbConfig::LeastRequestLbConfig(
                cluster::cluster::LeastRequestLbConfig {
                    choice_count: (lr.choice_count > 0).then_some(UInt32Value {
                        value: lr.choice_count,
                    }),
                    ..Default::default()
                },
            ));
        }
    }
    if matches!(chain.protocol.as_str(), "http2" | "grpc") {
        http2_upstream(&mut c);
    }
    if has_tls(id) {
        // With failover in one cluster (priorities), its endpoints present
        // their targets' own identities: another service's, or the same
        // service's in another datacenter.
        let sans = dialed
            .iter()
            .map(|t| {
                format!(
                    "spiffe://{}/ns/{}/dc/{}/svc/{}",
                    id.trust_domain, t.namespace, t.datacenter, t.service
                )
            })
            .collect();
        c.transport_socket = transport_socket(tls::UpstreamTlsContext {
            common_tls_context: Some(common_tls(id, sans, &id.outgoing)),
            sni: dialed.first().map_or(&target.sni, |t| &t.sni).clone(),
            ..Default::default()
        });
    }
    c
}

/// A target and its resolver's failover targets, in order.
fn tiers(chain: &CompiledDiscoveryChain, target: &str) -> Vec<String> {
    let mut tiers = vec![target.to_string()];
    if let Some(f) = chain
        .nodes
        .values()
        .filter_map(|n| n.resolver.as_ref())
        .find(|r| r.target == target)
        .and_then(|r| r.failover.as_ref())
    {
        tiers.extend(f.targets.iter().filter(|t| *t != target).cloned());
    }
    tiers
}

/// A target's endpoints: its healthy sidecars (address and proxy port,
/// never the application's), then each failover target's at the next
/// priority (one in another datacenter: its instances there, as proxycfg
/// heard them, or, in mesh gateway mode `local`/`remote`, the gateways
/// carrying it while it has a healthy instance there: Consul too takes the
/// target's health from its own instances, the addresses from the
/// gateways).
pub(crate) fn load_assignment(
    chain: &CompiledDiscoveryChain, us: &UpstreamSnapshot, target: &str,
) -> endpoint::ClusterLoadAssignment {
    let endpoints = tiers(chain, target)
        .iter()
        .enumerate()
        .filter_map(|(priority, t)| tier_endpoints(us, t, priority as u32))
        .collect();
    endpoint::ClusterLoadAssignment {
        cluster_name: cluster_name(chain, target),
        endpoints,
        ..Default::default()
    }
}

/// One target's endpoints at `priority` (none when proxycfg has no list).
fn tier_endpoints(
    us: &UpstreamSnapshot, t: &str, priority: u32,
) -> Option<endpoint::LocalityLbEndpoints> {
    let rows = us.endpoints.get(t)?;
    let lb_endpoints = match us.gateways.get(t) {
        Some(_) if rows.is_empty() => Vec::new(),
        Some(via) => via
            .instances
            .iter()
            .map(|g| {
                let (addr, port) = gateway_address(g, via.wan);
                lb_endpoint(addr, u32::try_from(port).unwrap_or(0))
            })
            .collect(),
        None => rows
            .iter()
            .map(|i| {
                let addr = if i.service.address.is_empty() {
                    &i.node.address
                } else {
                    &i.service.address
                };
                let mut e = lb_endpoint(addr, u32::try_from(i.service.port).unwrap_or(0));
                e.load_balancing_weight = Some(UInt32Value {
                    value: u32::try_from(i.service.weights.passing.max(1)).unwrap_or(1),
                });
                e
            })
            .collect(),
    };
    Some(endpoint::LocalityLbEndpoints {
        priority,
        lb_endpoints,
        ..Default::default()
    })
}

pub(crate) fn prefix_match(p: &str) -> route::RouteMatch {
    route::RouteMatch {
        path_specifier: Some(route::route_match::PathSpecifier::Prefix(p.to_string())),
        ..Default::default()
    }
}

pub(crate) fn to_cluster(name: &str) -> route::RouteAction {
    route::RouteAction {
        cluster_specifier: Some(route::route_action::ClusterSpecifier::Cluster(
            name.to_string(),
        )),
        ..Default::default()
    }
}

/// An http upstream's routes: the router's matches in order (the
/// compiler appends the catch-all), a splitter's weighted clusters, or
/// straight to the resolver's target.
pub(crate) fn route_config(
    name: &str, chain: &CompiledDiscoveryChain,
) -> route::RouteConfiguration {
    let mut routes = Vec::new();
    if let Some(start) = chain.nodes.get(&chain.start_node) {
        match start.node_type {
            NodeType::Router => {
                for r in &start.routes {
                    let m = route_match(r.definition.match_.as_ref().and_then(|m| m.http.as_ref()));
                    let mut action = next_action(chain, &r.next_node);
                    let mut route = route::Route {
                        r#match: Some(m),
                        ..Default::default()
                    };
                    if let Some(d) = &r.definition.destination {
                        destination(&mut action, d);
                        (
                            route.request_headers_to_add,
                            route.request_headers_to_remove,
                        ) = header_changes(d.request_headers.as_ref());
                        (
                            route.response_headers_to_add,
                            route.response_headers_to_remove,
                        ) = header_changes(d.response_headers.as_ref());
                    }
                    route.action = Some(route::route::Action::Route(action));
                    routes.push(route);
                }
            }
            _ => {
                let mut action = next_action(chain, &chain.start_node);
                // A resolver's timeout is its catch-all route's only when
                // no router comes first (a router's routes carry their own).
                if let Some(r) = start.resolver.as_ref()
                    && r.request_timeout.nanos() > 0
                {
                    action.timeout = duration(r.request_timeout);
                }
                routes.push(route::Route {
                    r#match: Some(prefix_match("/")),
                    action: Some(route::route::Action::Route(action)),
                    ..Default::default()
                })
            }
        }
    }
    route::RouteConfiguration {
        name: name.to_string(),
        virtual_hosts: vec![route::VirtualHost {
            name: name.to_string(),
            domains: vec!["*".into()],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Where a route goes: a splitter node's weighted clusters (Consul's
/// weights × 100, so 0.01% steps are kept), or a resolver's target.
fn next_action(chain: &CompiledDiscoveryChain, node: &str) -> route::RouteAction {
    let Some(n) = chain.nodes.get(node) else {
        return to_cluster(node);
    };
    match n.node_type {
        NodeType::Splitter => {
            let clusters = n
                .splits
                .iter()
                .filter_map(|s| {
                    let next = chain.nodes.get(&s.next_node)?;
                    let r = resolver_of(chain, next)?.resolver.as_ref()?;
                    let mut leg = route::weighted_cluster::ClusterWeight {
                        name: cluster_name(chain, &r.target),
                        weight: Some(UInt32Value {
                            value: (s.weight * 100.0).round() as u32,
                        }),
                        ..Default::default()
                    };
                    let d = &s.definition;
                    (leg.request_headers_to_add, leg.request_headers_to_remove) =
                        header_changes(d.request_headers.as_ref());
                    (leg.response_headers_to_add, leg.response_headers_to_remove) =
                        header_changes(d.response_headers.as_ref());
                    Some(leg)
                })
                .filter(|c| c.weight.as_ref().is_some_and(|w| w.value > 0))
                .collect();
            route::RouteAction {
                cluster_specifier: Some(route::route_action::ClusterSpecifier::WeightedClusters(
                    route::WeightedCluster {
                        clusters,
                        ..Default::default()
                    },
                )),
                ..Default::default()
            }
        }
        _ => {
            let resolver = resolver_of(chain, n);
            let target = resolver
                .and_then(|r| r.resolver.as_ref())
                .map(|r| cluster_name(chain, &r.target))
                .unwrap_or_default();
            let mut a = to_cluster(&target);
            if let Some(lb) = resolver.and_then(|r| r.load_balancer.as_ref()) {
                a.hash_policy = hash_policies(lb);
            }
            a
        }
    }
}

/// A hash-based load balancer's `HashPolicies` as the route's, as
/// Consul's: what a ring-hash or maglev cluster hashes a request by (none:
/// Envoy hashes nothing and stickiness is lost).
fn hash_policies(
    lb: &crate::structs::config_entry::LoadBalancer,
) -> Vec<route::route_action::HashPolicy> {
    use route::route_action::hash_policy::{
        ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter,
    };
    if !lb.is_hash_based() {
        return Vec::new();
    }
    lb.hash_policies
        .iter()
        .filter_map(|p| {
            let spec = if p.source_ip {
                PolicySpecifier::ConnectionProperties(ConnectionProperties { source_ip: true })
            } else {
                match p.field.as_str() {
                    "header" => PolicySpecifier::Header(Header {
                        header_name: p.field_value.clone(),
                        ..Default::default()
                    }),
                    "cookie" => {
                        let c = p.cookie_config.as_ref();
                        let ttl = match c {
                            // A zero TTL makes Envoy set a session cookie.
                            Some(c) if c.session => secs(0),
                            Some(c) if c.ttl.nanos() > 0 => duration(c.ttl),
                            _ => None,
                        };
                        PolicySpecifier::Cookie(Cookie {
                            name: p.field_value.clone(),
                            ttl,
                            path: c.map(|c| c.path.clone()).unwrap_or_default(),
                            ..Default::default()
                        })
                    }
                    "query_parameter" => PolicySpecifier::QueryParameter(QueryParameter {
                        name: p.field_value.clone(),
                    }),
                    _ => return None, // refused when the entry was written
                }
            };
            Some(route::route_action::HashPolicy {
                policy_specifier: Some(spec),
                terminal: p.terminal,
            })
        })
        .collect()
}

/// A config entry's header changes as Envoy's two fields: the headers to
/// add (`Add` appends, `Set` overwrites) and the names to remove.
pub(crate) fn header_changes(
    m: Option<&HttpHeaderModifiers>,
) -> (Vec<core::HeaderValueOption>, Vec<String>) {
    let Some(m) = m else {
        return Default::default();
    };
    let opt = |k: &str, v: &str, action: core::header_value_option::HeaderAppendAction| {
        core::HeaderValueOption {
            header: Some(core::HeaderValue {
                key: k.to_string(),
                value: v.to_string(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        }
    };
    use core::header_value_option::HeaderAppendAction as A;
    let add = m
        .add
        .iter()
        .map(|(k, v)| opt(k, v, A::AppendIfExistsOrAdd))
        .chain(
            m.set
                .iter()
                .map(|(k, v)| opt(k, v, A::OverwriteIfExistsOrAdd)),
        )
        .collect();
    (add, m.remove.clone())
}

/// A router destination's timeouts, retries and prefix rewrite.
fn destination(a: &mut route::RouteAction, d: &ServiceRouteDestination) {
    if !d.prefix_rewrite.is_empty() {
        a.prefix_rewrite = d.prefix_rewrite.clone();
    }
    if d.request_timeout.nanos() > 0 {
        a.timeout = duration(d.request_timeout);
    }
    if d.idle_timeout.nanos() > 0 {
        a.idle_timeout = duration(d.idle_timeout);
    }
    let mut on: Vec<String> = d.retry_on.clone();
    if d.retry_on_connect_failure {
        on.push("connect-failure".into());
    }
    if !d.retry_on_status_codes.is_empty() {
        on.push("retriable-status-codes".into());
    }
    if d.num_retries > 0 || !on.is_empty() {
        a.retry_policy = Some(route::RetryPolicy {
            retry_on: on.join(","),
            num_retries: (d.num_retries > 0).then_some(UInt32Value {
                value: d.num_retries,
            }),
            retriable_status_codes: d.retry_on_status_codes.clone(),
            ..Default::default()
        });
    }
}

/// A router's HTTP match: path (exact, prefix or regex), headers, query
/// parameters, methods (a `:method` header regex, as Consul).
fn route_match(m: Option<&ServiceRouteHttpMatch>) -> route::RouteMatch {
    let Some(m) = m else {
        return prefix_match("/");
    };
    let path = if !m.path_exact.is_empty() {
        route::route_match::PathSpecifier::Path(m.path_exact.clone())
    } else if !m.path_prefix.is_empty() {
        route::route_match::PathSpecifier::Prefix(m.path_prefix.clone())
    } else if !m.path_regex.is_empty() {
        route::route_match::PathSpecifier::SafeRegex(regex(&m.path_regex))
    } else {
        route::route_match::PathSpecifier::Prefix("/".into())
    };
    let mut headers: Vec<route::HeaderMatcher> = m
        .header
        .iter()
        .map(|h| {
            use route::header_matcher::HeaderMatchSpecifier as S;
            let spec = if h.present {
                S::PresentMatch(true)
            } else if !h.exact.is_empty() {
                S::StringMatch(exact(&h.exact))
            } else if !h.prefix.is_empty() {
                S::StringMatch(matcher::StringMatcher {
                    match_pattern: Some(matcher::string_matcher::MatchPattern::Prefix(
                        h.prefix.clone(),
                    )),
                    ..Default::default()
                })
            } else if !h.suffix.is_empty() {
                S::StringMatch(matcher::StringMatcher {
                    match_pattern: Some(matcher::string_matcher::MatchPattern::Suffix(
                        h.suffix.clone(),
                    )),
                    ..Default::default()
                })
            } else {
                S::StringMatch(matcher::StringMatcher {
                    match_pattern: Some(matcher::string_matcher::MatchPattern::SafeRegex(regex(
                        &h.regex,
                    ))),
                    ..Default::default()
                })
            };
            route::HeaderMatcher {
                name: h.name.clone(),
                invert_match: h.invert,
                header_match_specifier: Some(spec),
                ..Default::default()
            }
        })
        .collect();
    if !m.methods.is_empty() {
        headers.push(route::HeaderMatcher {
            name: ":method".into(),
            header_match_specifier: Some(route::header_matcher::HeaderMatchSpecifier::StringMatch(
                matcher::StringMatcher {
                    match_pattern: Some(matcher::string_matcher::MatchPattern::SafeRegex(regex(
                        &m.methods.join("|"),
                    ))),
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
    }
    let query_parameters = m
        .query_param
        .iter()
        .map(|q| {
            use route::query_parameter_matcher::QueryParameterMatchSpecifier as Q;
            let spec = if q.present {
                Q::PresentMatch(true)
            } else if !q.regex.is_empty() {
                Q::StringMatch(matcher::StringMatcher {
                    match_pattern: Some(matcher::string_matcher::MatchPattern::SafeRegex(regex(
                        &q.regex,
                    ))),
                    ..Default::default()
                })
            } else {
                Q::StringMatch(exact(&q.exact))
            };
            route::QueryParameterMatcher {
                name: q.name.clone(),
                query_parameter_match_specifier: Some(spec),
            }
        })
        .collect();
    route::RouteMatch {
        path_specifier: Some(path),
        headers,
        query_parameters,
        ..Default::default()
    }
}

/// Consul's upstream ID: the name, with `?dc=` when it names another
/// datacenter.
pub(super) fn upstream_id(name: &str, dc: &str) -> String {
    if dc.is_empty() {
        name.to_string()
    } else {
        format!("{name}?dc={dc}")
    }
}
