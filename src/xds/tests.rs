//! Resource generation from a snapshot built on a real state: the TLS
//! contexts carry the snapshot's leaf and roots, clusters are named by SNI
//! with the target's SPIFFE SAN, endpoints are the sidecars' ports, and
//! intentions become RBAC.

use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::rbac::v3 as rbac;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetRbac;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, UpstreamTlsContext, common_tls_context::ValidationContextType,
};
use prost::Message;

use super::resources::{CLUSTER, ENDPOINT, LISTENER};
use super::*;
use crate::proxycfg::{Shared, build};
use crate::state::Command;
use crate::structs::connect::{CaRoot, CaRoots, Intention, IssuedCert};
use crate::structs::{NodeService, Upstream};

fn register(w: &mut crate::testing::World, node: &str, addr: &str, svc: NodeService) {
    w.register_passing(node, addr, svc);
}

fn sidecar(id: &str, dest: &str, port: i64, upstream: Option<&str>) -> NodeService {
    let mut s = NodeService {
        kind: "connect-proxy".into(),
        id: id.into(),
        service: format!("{dest}-sidecar-proxy"),
        port,
        ..Default::default()
    };
    s.proxy.destination_service_name = dest.into();
    s.proxy.local_service_port = 8080;
    if let Some(u) = upstream {
        s.proxy.upstreams.push(Upstream {
            destination_name: u.into(),
            local_bind_port: 9191,
            ..Default::default()
        });
    }
    s
}

/// web's sidecar (upstream db) and one db instance with its sidecar, with
/// a CA, a leaf and a deny intention set on the snapshot.
fn snapshot() -> crate::proxycfg::Snapshot {
    snapshot_with(&[])
}

/// One active root, as the built-in CA sets them (its PEM a placeholder).
pub(super) fn test_roots() -> Arc<CaRoots> {
    Arc::new(CaRoots {
        active_root_id: "r1".into(),
        trust_domain: "11111111-2222-3333-4444-555555555555.consul".into(),
        roots: vec![CaRoot {
            id: "r1".into(),
            root_cert: "ROOT-PEM".into(),
            active: true,
            ..Default::default()
        }],
    })
}

fn snapshot_with(entries: &[serde_json::Value]) -> crate::proxycfg::Snapshot {
    let mut w = crate::testing::World::new();
    for entry in entries {
        w.apply(Command::ConfigSet {
            entry: entry.clone(),
            cas: None,
        });
    }
    register(
        &mut w,
        "n3",
        "10.0.0.3",
        sidecar("db-backup-proxy", "db-backup", 21002, None),
    );
    register(
        &mut w,
        "n1",
        "10.0.0.1",
        sidecar("web-proxy", "web", 21000, Some("db")),
    );
    register(
        &mut w,
        "n2",
        "10.0.0.2",
        NodeService {
            id: "db".into(),
            service: "db".into(),
            port: 5432,
            ..Default::default()
        },
    );
    register(
        &mut w,
        "n2",
        "10.0.0.2",
        sidecar("db-proxy", "db", 21001, None),
    );
    let state = w.store.state();
    let key = ("n1".to_string(), "web-proxy".to_string());
    let (mut snap, _) = build(&state, "dc1", &key, &mut Shared::default()).expect("a proxy");
    snap.roots = Some(test_roots());
    snap.leaf = Some(Arc::new(IssuedCert {
        cert_pem: "LEAF-PEM".into(),
        private_key_pem: "LEAF-KEY".into(),
        service: "web".into(),
        ..Default::default()
    }));
    snap.intentions = Arc::new(vec![Intention {
        source_name: "evil".into(),
        destination_name: "web".into(),
        action: Some("deny".into()),
        ..Default::default()
    }]);
    snap.intentions_default_allow = true;
    snap
}

/// A snapshot whose resolver fails db over to dc2, with dc2's one sidecar
/// of db (10.9.0.1:22001) as its target's endpoints, as proxycfg's remote
/// watch would have heard them; and that target.
fn failing_over_to_dc2() -> (
    crate::proxycfg::Snapshot,
    crate::discovery_chain::DiscoveryTarget,
) {
    let mut snap = snapshot_with(&[serde_json::json!({
        "Kind": "service-resolver", "Name": "db",
        "Failover": {"*": {"Datacenters": ["dc2"]}}
    })]);
    let remote: crate::state::catalog::Instance = serde_json::from_value(serde_json::json!({
        "Node": {"Node": "far", "Address": "10.9.0.1", "Datacenter": "dc2"},
        "Service": {"ID": "db-proxy", "Service": "db-sidecar-proxy", "Kind": "connect-proxy",
                    "Port": 22001, "Proxy": {"DestinationServiceName": "db"}},
        "Checks": []
    }))
    .unwrap();
    let up = snap.upstreams.get_mut("db").unwrap();
    let far = up
        .chain
        .as_ref()
        .unwrap()
        .targets
        .values()
        .find(|t| t.datacenter == "dc2")
        .expect("a dc2 target")
        .clone();
    up.endpoints
        .insert(far.id.clone(), Arc::new(vec![Arc::new(remote)]));
    (snap, far)
}

/// The (priority, port) of every endpoint of a load assignment.
fn endpoints(cla: &ClusterLoadAssignment) -> Vec<(u32, u32)> {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    let mut out = Vec::new();
    for tier in &cla.endpoints {
        for e in &tier.lb_endpoints {
            if let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier
                && let Some(address::Address::SocketAddress(s)) =
                    ep.address.as_ref().and_then(|a| a.address.as_ref())
                && let Some(socket_address::PortSpecifier::PortValue(p)) = s.port_specifier
            {
                out.push((tier.priority, p));
            }
        }
    }
    out
}

/// The name of db's cluster (its chain target's SNI), found by its prefix.
fn db_cluster(r: &Resources) -> String {
    r[CLUSTER]
        .keys()
        .find(|n| n.starts_with("db.default.dc1.internal."))
        .expect("db's cluster")
        .clone()
}

/// With failover, the cluster (and assignment) of db's aggregate tier `i`.
fn db_tier(r: &Resources, i: usize) -> String {
    format!("failover-target~{i}~{}", db_cluster(r))
}

fn decode<T: Message + Default>(r: &Resources, ty: &str, name: &str) -> T {
    let res = r[ty]
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {ty}: {:?}", r[ty].keys()));
    T::decode(&*res.any.value).unwrap()
}

#[test]
fn tls_contexts_carry_the_leaf_and_the_roots() {
    let r = generate(&snapshot());
    let l: Listener = decode(&r, LISTENER, "public_listener:0.0.0.0:21000");
    let ts = l.filter_chains[0].transport_socket.as_ref().expect("TLS");
    let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
        any,
    )) = &ts.config_type
    else {
        panic!("no TLS config")
    };
    let ctx = DownstreamTlsContext::decode(&*any.value).unwrap();
    assert_eq!(ctx.require_client_certificate.map(|b| b.value), Some(true));
    let common = ctx.common_tls_context.unwrap();
    let cert = &common.tls_certificates[0];
    let inline = |d: &Option<envoy_types::pb::envoy::config::core::v3::DataSource>| match d
        .as_ref()
        .and_then(|d| d.specifier.clone())
    {
        Some(envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(s)) => {
            s
        }
        other => panic!("not inline: {other:?}"),
    };
    assert_eq!(inline(&cert.certificate_chain), "LEAF-PEM");
    assert_eq!(inline(&cert.private_key), "LEAF-KEY");
    let Some(ValidationContextType::ValidationContext(v)) = common.validation_context_type else {
        panic!("no validation context")
    };
    assert_eq!(inline(&v.trusted_ca), "ROOT-PEM\n");

    // Named by the chain target's SNI (its trust domain is the test
    // state's, which has no cluster ID).
    let sni = db_cluster(&r);
    let c: Cluster = decode(&r, CLUSTER, &sni);
    let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
        any,
    )) = c.transport_socket.unwrap().config_type
    else {
        panic!("no upstream TLS")
    };
    let up = UpstreamTlsContext::decode(&*any.value).unwrap();
    assert_eq!(up.sni, sni);
    let Some(ValidationContextType::ValidationContext(v)) =
        up.common_tls_context.unwrap().validation_context_type
    else {
        panic!("no validation context")
    };
    let san = v.match_typed_subject_alt_names[0].matcher.clone().unwrap();
    assert_eq!(
        san.match_pattern,
        Some(
            envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(
                "spiffe://11111111-2222-3333-4444-555555555555.consul/ns/default/dc/dc1/svc/db"
                    .into()
            )
        )
    );

    // The sidecar's port, never the application's 5432.
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &sni);
    let ports: Vec<u32> = cla.endpoints[0]
        .lb_endpoints
        .iter()
        .filter_map(|e| match &e.host_identifier {
            Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                match ep.address.as_ref()?.address.as_ref()? {
                    envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(s) => match s.port_specifier {
                        Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => Some(p),
                        _ => None,
                    },
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    assert_eq!(ports, [21001]);
}

#[test]
fn a_deny_intention_is_an_rbac_deny_policy_on_the_public_listener() {
    let r = generate(&snapshot());
    let l: Listener = decode(&r, LISTENER, "public_listener:0.0.0.0:21000");
    let f = &l.filter_chains[0].filters[0];
    assert_eq!(f.name, "envoy.filters.network.rbac");
    let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        &f.config_type
    else {
        panic!("no RBAC config")
    };
    let rules = NetRbac::decode(&*any.value).unwrap().rules.unwrap();
    assert_eq!(rules.action, rbac::rbac::Action::Deny as i32);
    assert_eq!(rules.policies.len(), 1);
}

#[test]
fn versions_follow_content_only() {
    // Several intentions: their RBAC must encode the same way every time.
    let mut many = snapshot();
    many.intentions = Arc::new(
        ["a", "b", "c", "d", "e"]
            .iter()
            .map(|s| Intention {
                source_name: s.to_string(),
                destination_name: "web".into(),
                action: Some("deny".into()),
                ..Default::default()
            })
            .collect(),
    );
    let name = "public_listener:0.0.0.0:21000";
    for _ in 0..8 {
        assert_eq!(
            generate(&many)[LISTENER][name].version,
            generate(&many)[LISTENER][name].version
        );
    }
    let a = generate(&snapshot());
    let b = generate(&snapshot());
    assert_eq!(a, b, "the same snapshot gives the same versions");
    let mut changed = snapshot();
    changed.leaf = Some(Arc::new(IssuedCert {
        cert_pem: "NEW-LEAF".into(),
        ..Default::default()
    }));
    let c = generate(&changed);
    let name = "public_listener:0.0.0.0:21000";
    assert_ne!(a[LISTENER][name].version, c[LISTENER][name].version);
    assert_eq!(a[ENDPOINT], c[ENDPOINT], "endpoints did not change");
}

#[test]
fn a_resolver_sets_timeout_load_balancer_and_failover_tiers() {
    let r = generate(&snapshot_with(&[serde_json::json!({
        "Kind": "service-resolver", "Name": "db", "ConnectTimeout": "3s",
        "LoadBalancer": {"Policy": "least_request", "LeastRequestConfig": {"ChoiceCount": 3}},
        "Failover": {"*": {"Service": "db-backup"}}
    })]));
    use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, LbPolicy};
    use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
    // As Consul's: an aggregate cluster over one cluster per tier, db's
    // sidecar first, the failover target's next.
    let name = db_cluster(&r);
    let agg: Cluster = decode(&r, CLUSTER, &name);
    assert_eq!(agg.connect_timeout.map(|d| d.seconds), Some(3));
    assert_eq!(agg.lb_policy, LbPolicy::ClusterProvided as i32);
    let Some(ClusterDiscoveryType::ClusterType(custom)) = agg.cluster_discovery_type else {
        panic!("not an aggregate: {agg:?}")
    };
    assert_eq!(custom.name, "envoy.clusters.aggregate");
    let tiers = ClusterConfig::decode(&*custom.typed_config.unwrap().value).unwrap();
    assert_eq!(tiers.clusters, [db_tier(&r, 0), db_tier(&r, 1)]);
    for (i, port) in [(0, 21001), (1, 21002)] {
        let c: Cluster = decode(&r, CLUSTER, &db_tier(&r, i));
        assert_eq!(c.connect_timeout.map(|d| d.seconds), Some(3));
        assert_eq!(c.lb_policy, LbPolicy::LeastRequest as i32);
        let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, i));
        assert_eq!(endpoints(&cla), [(0, port)]);
    }
}

#[test]
fn grpc_targets_are_reached_over_http2() {
    let r = generate(&snapshot_with(&[serde_json::json!({
        "Kind": "service-defaults", "Name": "db", "Protocol": "grpc"
    })]));
    let name = db_cluster(&r);
    let c: Cluster = decode(&r, CLUSTER, &name);
    let opts = &c.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
        HttpProtocolOptions, http_protocol_options as o,
    };
    let opts = HttpProtocolOptions::decode(&*opts.value).unwrap();
    assert!(matches!(
        opts.upstream_protocol_options,
        Some(o::UpstreamProtocolOptions::ExplicitHttpConfig(
            o::ExplicitHttpConfig {
                protocol_config: Some(
                    o::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(_)
                )
            }
        ))
    ));
    // A tcp service's cluster has no HTTP options.
    let plain = generate(&snapshot());
    let name = db_cluster(&plain);
    let c: Cluster = decode(&plain, CLUSTER, &name);
    assert!(c.typed_extension_protocol_options.is_empty());
}

/// A resolver failing over to another datacenter: the remote target is
/// the aggregate's second tier, a cluster of its own (SNI and SPIFFE ID of
/// that datacenter) over its instances as proxycfg heard them (their own
/// addresses); the first tier accepts only dc1's identity.
#[test]
fn a_failover_to_another_datacenter_serves_its_instances() {
    let (snap, far) = failing_over_to_dc2();
    let r = generate(&snap);

    let sans = |c: &Cluster| -> Vec<String> {
        let Some(
            envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
                any,
            ),
        ) = c.transport_socket.clone().unwrap().config_type
        else {
            panic!("no upstream TLS")
        };
        let up = UpstreamTlsContext::decode(&*any.value).unwrap();
        let Some(ValidationContextType::ValidationContext(v)) =
            up.common_tls_context.unwrap().validation_context_type
        else {
            panic!("no validation context")
        };
        v.match_typed_subject_alt_names
            .iter()
            .map(|m| match m.matcher.clone().unwrap().match_pattern {
                Some(
                    envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(
                        s,
                    ),
                ) => s,
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>()
    };
    let td = "11111111-2222-3333-4444-555555555555.consul";
    assert!(
        far.sni.starts_with("db.default.dc2.internal."),
        "{}",
        far.sni
    );
    let c: Cluster = decode(&r, CLUSTER, &db_tier(&r, 1));
    assert_eq!(
        sans(&c),
        [format!("spiffe://{td}/ns/default/dc/dc2/svc/db")]
    );
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 1));
    assert_eq!(endpoints(&cla), [(0, 22001)]);
    assert!(
        !r[CLUSTER].contains_key(&far.sni),
        "a failover target has no cluster of its own"
    );

    // The local target: its own sidecar, its own identity.
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 0));
    assert_eq!(endpoints(&cla), [(0, 21001)]);
    let c: Cluster = decode(&r, CLUSTER, &db_tier(&r, 0));
    assert_eq!(
        sans(&c),
        [format!("spiffe://{td}/ns/default/dc/dc1/svc/db")]
    );
}

/// A failover target in another datacenter reached through mesh gateways:
/// its endpoints are the gateways' (their WAN address and port for the
/// other datacenter's, their LAN one for this datacenter's), its cluster
/// keeps the target's SNI and SPIFFE ID (TLS passes through the
/// gateways); with no healthy instance of the target there, its tier is
/// empty, so traffic is not sent to gateways that have nowhere to go.
#[test]
fn a_target_behind_mesh_gateways_has_the_gateways_as_endpoints() {
    let mut snap = snapshot_with(&[serde_json::json!({
        "Kind": "service-resolver", "Name": "db",
        "Failover": {"*": {"Datacenters": ["dc2"]}}
    })]);
    let row = |v: serde_json::Value| -> Arc<crate::state::catalog::Instance> {
        Arc::new(serde_json::from_value(v).unwrap())
    };
    let remote = row(serde_json::json!({
        "Node": {"Node": "far", "Address": "10.9.0.1", "Datacenter": "dc2"},
        "Service": {"ID": "db-proxy", "Service": "db-sidecar-proxy", "Kind": "connect-proxy",
                    "Port": 22001, "Proxy": {"DestinationServiceName": "db"}},
        "Checks": []
    }));
    let gateway = row(serde_json::json!({
        "Node": {"Node": "gw", "Address": "10.2.0.9", "Datacenter": "dc2"},
        "Service": {"ID": "mgw", "Service": "mesh-gateway", "Kind": "mesh-gateway",
                    "Port": 8443, "Address": "10.2.0.9",
                    "TaggedAddresses": {"wan": {"Address": "203.0.113.2", "Port": 443}}},
        "Checks": []
    }));
    let up = snap.upstreams.get_mut("db").unwrap();
    let chain = up.chain.clone().unwrap();
    let far = chain
        .targets
        .values()
        .find(|t| t.datacenter == "dc2")
        .expect("a dc2 target")
        .clone();
    up.endpoints
        .insert(far.id.clone(), Arc::new(vec![remote.clone()]));
    let via = |wan: bool| crate::proxycfg::ViaGateways {
        mode: if wan { "remote" } else { "local" }.into(),
        datacenter: if wan { "dc2" } else { "dc1" }.into(),
        wan,
        instances: Arc::new(vec![gateway.clone()]),
    };
    let addrs = |cla: &ClusterLoadAssignment| -> Vec<(u32, String)> {
        use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
        use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
        let mut out = Vec::new();
        for tier in &cla.endpoints {
            for e in &tier.lb_endpoints {
                if let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier
                    && let Some(address::Address::SocketAddress(s)) =
                        ep.address.as_ref().and_then(|a| a.address.as_ref())
                    && let Some(socket_address::PortSpecifier::PortValue(p)) = s.port_specifier
                {
                    out.push((tier.priority, format!("{}:{p}", s.address)));
                }
            }
        }
        out
    };

    // Mode remote: dc2's gateway at its WAN address, as the failover tier
    // of the local target.
    up.gateways.insert(far.id.clone(), via(true));
    let r = generate(&snap);
    let far_tier = db_tier(&r, 1);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &far_tier);
    assert_eq!(addrs(&cla), [(0, "203.0.113.2:443".to_string())]);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 0));
    assert_eq!(addrs(&cla), [(0, "10.0.0.2:21001".to_string())]);
    let c: Cluster = decode(&r, CLUSTER, &far_tier);
    let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
        any,
    )) = c.transport_socket.clone().unwrap().config_type
    else {
        panic!("no upstream TLS")
    };
    assert_eq!(
        UpstreamTlsContext::decode(&*any.value).unwrap().sni,
        far.sni
    );

    // Mode local: the (same) gateway as a local one, at its LAN address.
    let up = snap.upstreams.get_mut("db").unwrap();
    up.gateways.insert(far.id.clone(), via(false));
    let r = generate(&snap);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &far_tier);
    assert_eq!(addrs(&cla), [(0, "10.2.0.9:8443".to_string())]);

    // As a stream's token sees it: the gateways are kept only where it
    // reads their service (else dc2's target has nowhere to go here).
    let no_gateways = reader(
        r#"service "web" { policy = "write" }
           service "db" { policy = "read" }"#,
        true,
    );
    let cla: ClusterLoadAssignment =
        decode(&generate_for(&snap, &no_gateways), ENDPOINT, &far_tier);
    assert_eq!(addrs(&cla), []);
    let reads_all = reader(r#"service_prefix "" { policy = "read" }"#, true);
    let cla: ClusterLoadAssignment = decode(&generate_for(&snap, &reads_all), ENDPOINT, &far_tier);
    assert_eq!(addrs(&cla), [(0, "10.2.0.9:8443".to_string())]);

    // No healthy instance of the target in dc2: nothing through gateways.
    let up = snap.upstreams.get_mut("db").unwrap();
    up.endpoints.insert(far.id.clone(), Arc::new(Vec::new()));
    let r = generate(&snap);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &far_tier);
    assert_eq!(addrs(&cla), []);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 0));
    assert_eq!(addrs(&cla), [(0, "10.0.0.2:21001".to_string())]);
}

/// A stream's token as the narrowing reads it: `rules` over default deny,
/// in dc1; `global`: not `Local`.
fn reader(rules: &str, global: bool) -> crate::proxycfg::Reader {
    let rules = crate::acl::parse_rules(rules).unwrap();
    crate::proxycfg::Reader {
        authz: Arc::new(crate::acl::Authorizer::new(
            "t",
            &[&rules],
            crate::acl::DefaultPolicy::Deny,
        )),
        datacenter: "dc1".into(),
        global,
    }
}

/// The resources of `snap` as a stream with `reader`'s token serves them.
fn generate_for(snap: &crate::proxycfg::Snapshot, reader: &crate::proxycfg::Reader) -> Resources {
    let hidden = crate::proxycfg::hidden(snap, Some(reader));
    generate(&snap.without(&hidden))
}

/// web's proxy whose token may write web but not read db: db's cluster is
/// served with no endpoints (Consul's health read, ACL-filtered, is empty;
/// the cluster stays), everything else as for a token that reads db.
#[test]
fn an_upstream_the_token_may_not_read_keeps_its_cluster_with_no_endpoints() {
    let snap = snapshot();
    let web_only = reader(r#"service "web" { policy = "write" }"#, true);
    let r = generate_for(&snap, &web_only);
    let name = db_cluster(&r);
    let _: Cluster = decode(&r, CLUSTER, &name);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &name);
    assert_eq!(endpoints(&cla), []);
    assert_eq!(
        r[LISTENER],
        generate(&snap)[LISTENER],
        "listeners unchanged"
    );

    let reads_db = reader(
        r#"service "web" { policy = "write" }
           service "db" { policy = "read" }"#,
        true,
    );
    assert!(crate::proxycfg::hidden(&snap, Some(&reads_db)).is_empty());
    let cla: ClusterLoadAssignment = decode(&generate_for(&snap, &reads_db), ENDPOINT, &name);
    assert_eq!(endpoints(&cla), [(0, 21001)]);
    // ACLs off: nothing hidden.
    assert!(crate::proxycfg::hidden(&snap, None).is_empty());
}

/// A failover to db-backup, a service the token may not read: the failover
/// tier is empty (and its own cluster too), db's own endpoints stay.
#[test]
fn a_failover_target_the_token_may_not_read_has_no_endpoints() {
    let snap = snapshot_with(&[serde_json::json!({
        "Kind": "service-resolver", "Name": "db",
        "Failover": {"*": {"Service": "db-backup"}}
    })]);
    let token = reader(
        r#"service "web" { policy = "write" }
           service "db" { policy = "read" }"#,
        true,
    );
    let r = generate_for(&snap, &token);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 0));
    assert_eq!(endpoints(&cla), [(0, 21001)]);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 1));
    assert_eq!(endpoints(&cla), [], "db-backup's tier");
}

/// A failover target in dc2: a `Local` token is unknown there, so the
/// target gets no endpoints (its cluster stays) even though its rules read
/// every service; a global token with the same rules gets dc2's.
#[test]
fn a_local_token_gets_no_endpoints_in_another_datacenter() {
    let (snap, far) = failing_over_to_dc2();
    let rules = r#"service "web" { policy = "write" }
                   service_prefix "" { policy = "read" }"#;

    let r = generate_for(&snap, &reader(rules, false));
    assert!(far.sni.contains(".dc2."));
    let _: Cluster = decode(&r, CLUSTER, &db_tier(&r, 1));
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 1));
    assert_eq!(endpoints(&cla), []);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 0));
    assert_eq!(endpoints(&cla), [(0, 21001)], "dc1's own stay");

    let global = reader(rules, true);
    assert!(crate::proxycfg::hidden(&snap, Some(&global)).is_empty());
    let r = generate_for(&snap, &global);
    let cla: ClusterLoadAssignment = decode(&r, ENDPOINT, &db_tier(&r, 1));
    assert_eq!(endpoints(&cla), [(0, 22001)]);
}

/// A proxyless client dialing db, whose resolver fails over to db-backup:
/// a token that reads db but not db-backup gets db's instances and an
/// empty db-backup cluster (the failover locality gone), as the stream
/// narrows its snapshot before `grpc::generate`.
#[test]
fn a_proxyless_clients_failover_target_it_may_not_read_has_no_endpoints() {
    let mut w = crate::testing::World::new();
    w.apply(Command::ConfigSet {
        entry: serde_json::json!({
            "Kind": "service-resolver", "Name": "db",
            "Failover": {"*": {"Service": "db-backup"}}
        }),
        cas: None,
    });
    for (node, addr, id, port) in [
        ("n1", "10.0.0.1", "web", 8080),
        ("n2", "10.0.0.2", "db", 5432),
        ("n3", "10.0.0.3", "db-backup", 5433),
    ] {
        let svc = NodeService {
            id: id.into(),
            service: id.into(),
            port,
            ..Default::default()
        };
        register(&mut w, node, addr, svc);
    }
    let key = ("n1".to_string(), "web".to_string());
    let names = ["db".to_string()].into();
    let (snap, _) = crate::proxycfg::build_proxyless(
        &w.store.state(),
        "dc1",
        &key,
        &names,
        &mut Shared::default(),
    )
    .expect("a proxyless snapshot");
    let ports = |r: &Resources, prefix: &str| -> Vec<(u32, u32)> {
        let name = r[ENDPOINT]
            .keys()
            .find(|n| n.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} assignment"))
            .clone();
        endpoints(&decode(r, ENDPOINT, &name))
    };
    let all = grpc::generate(&snap);
    assert_eq!(ports(&all, "db.default.dc1"), [(0, 5432), (1, 5433)]);

    let token = reader(
        r#"service "web" { policy = "write" }
           service "db" { policy = "read" }"#,
        true,
    );
    let hidden = crate::proxycfg::hidden(&snap, Some(&token));
    let r = grpc::generate(&snap.without(&hidden));
    assert_eq!(ports(&r, "db.default.dc1"), [(0, 5432)]);
    assert_eq!(ports(&r, "db-backup.default.dc1"), []);
    assert_eq!(r[LISTENER], all[LISTENER], "the listener stays");
}

/// A ring-hash resolver's `HashPolicies` become the route's: without them
/// Envoy hashes nothing and requests are not sticky.
#[test]
fn a_ring_hash_resolvers_hash_policies_reach_its_route() {
    use envoy_types::pb::envoy::config::route::v3::route::Action;
    use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::PolicySpecifier;
    let snap = snapshot_with(&[serde_json::json!({
        "Kind": "service-resolver", "Name": "db",
        "LoadBalancer": {"Policy": "ring_hash", "HashPolicies": [
            {"Field": "header", "FieldValue": "x-user"},
            {"Field": "cookie", "FieldValue": "sid", "CookieConfig": {"Session": true}},
            {"SourceIP": true, "Terminal": true}
        ]}
    })]);
    let chain = snap.upstreams["db"].chain.as_deref().unwrap();
    let rc = super::resources::route_config("db", chain);
    let Some(Action::Route(a)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!("not a route action: {rc:?}")
    };
    let specs: Vec<_> = a
        .hash_policy
        .iter()
        .map(|h| (h.policy_specifier.clone().unwrap(), h.terminal))
        .collect();
    assert!(matches!(&specs[0], (PolicySpecifier::Header(h), false) if h.header_name == "x-user"));
    assert!(
        matches!(&specs[1], (PolicySpecifier::Cookie(c), false) if c.name == "sid" && c.ttl.is_some_and(|t| t.seconds == 0))
    );
    assert!(matches!(&specs[2], (PolicySpecifier::ConnectionProperties(p), true) if p.source_ip));
}

/// The proxy's `local_connect_timeout_ms` and `local_request_timeout_ms`
/// (Consul's settings for the hop to the application) reach `local_app`
/// and the public listener's route.
#[test]
fn the_proxys_local_timeouts_reach_local_app_and_its_route() {
    use envoy_types::pb::envoy::config::route::v3::route::Action;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager::RouteSpecifier,
    };
    let mut snap = snapshot();
    let cfg = serde_json::json!({"protocol": "http", "local_connect_timeout_ms": 1250,
                                 "local_request_timeout_ms": "3000"});
    snap.service.proxy.config = Some(Arc::new(cfg.as_object().unwrap().clone()));
    let r = generate(&snap);
    let app: Cluster = decode(&r, CLUSTER, "local_app");
    let t = app.connect_timeout.unwrap();
    assert_eq!((t.seconds, t.nanos), (1, 250_000_000));
    let l: Listener = decode(&r, LISTENER, "public_listener:0.0.0.0:21000");
    let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        l.filter_chains[0]
            .filters
            .last()
            .unwrap()
            .config_type
            .clone()
    else {
        panic!("no HCM")
    };
    let hcm = HttpConnectionManager::decode(&*any.value).unwrap();
    let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
        panic!("no inline route")
    };
    let Some(Action::Route(a)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!("not a route action")
    };
    assert_eq!(a.timeout.unwrap().seconds, 3);
}
