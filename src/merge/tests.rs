//! Precedence rules of the resolve and the merge, one at a time. Consul has
//! regressed on these twice (upstream protocol from proxy-defaults beating
//! the upstream's own service-defaults; a registration's mesh gateway mode
//! beating an upstream override), so each rule gets its own test.

use serde_json::{Value, json};

use super::flatten::{UpstreamKey, resolve_service_config};
use super::service::{
    merge_index, merge_service_config, resolve_request_for, watch_keys_for_instances,
};
use super::*;
use crate::config_check::decode_and_validate;
use crate::discovery_chain::MemoryEntries;
use crate::state::{Command, State, apply_command, keys};
use crate::structs::catalog::{NodeService, RegisterRequest};

fn entries(list: &[Value]) -> MemoryEntries {
    let mut m = MemoryEntries::new();
    for e in list {
        m.upsert(decode_and_validate(e).unwrap_or_else(|err| panic!("{e}: {err}")));
    }
    m
}

fn svc(v: Value) -> NodeService {
    serde_json::from_value(v).expect("a NodeService")
}

/// A sidecar for `web` with the given `Proxy` members added.
fn sidecar(extra: Value) -> NodeService {
    let mut proxy = json!({ "DestinationServiceName": "web" });
    proxy
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    svc(json!({
        "Kind": "connect-proxy", "ID": "web-proxy", "Service": "web-proxy",
        "Port": 21000, "Proxy": proxy
    }))
}

fn merged(list: &[Value], s: &NodeService) -> NodeService {
    merge_service_config(
        &resolve_service_config(&entries(list), &resolve_request_for(s)),
        s,
    )
}

fn config(s: &NodeService) -> Value {
    json!(s.proxy.config)
}

fn upstream<'a>(s: &'a NodeService, name: &str) -> &'a crate::structs::catalog::Upstream {
    s.proxy
        .upstreams
        .iter()
        .find(|u| u.destination_name == name)
        .unwrap_or_else(|| panic!("no upstream {name}"))
}

fn up_cfg(s: &NodeService, name: &str) -> Value {
    json!(upstream(s, name).config)
}

fn pd(extra: Value) -> Value {
    let mut e = json!({ "Kind": "proxy-defaults", "Name": "global" });
    e.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    e
}

fn sd(name: &str, extra: Value) -> Value {
    let mut e = json!({ "Kind": "service-defaults", "Name": name });
    e.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    e
}

// ---------------------------------------------------------------------------
// Proxy.Config
// ---------------------------------------------------------------------------

#[test]
fn registration_config_keys_win_and_central_keys_fill_gaps() {
    let s = sidecar(json!({ "Config": { "foo": "local", "bind_port": 21000 } }));
    let m = merged(&[pd(json!({ "Config": { "foo": "bar", "baz": 1 } }))], &s);
    assert_eq!(
        config(&m),
        json!({ "foo": "local", "baz": 1, "bind_port": 21000 })
    );
}

#[test]
fn empty_registration_values_are_filled_like_go_zero_values() {
    // mergo treats "", 0, false and null as unset.
    let s = sidecar(json!({ "Config": { "a": "", "b": 0, "c": false, "d": "kept" } }));
    let m = merged(
        &[pd(
            json!({ "Config": { "a": "x", "b": 2, "c": true, "d": "lost" } }),
        )],
        &s,
    );
    assert_eq!(
        config(&m),
        json!({ "a": "x", "b": 2, "c": true, "d": "kept" })
    );
}

#[test]
fn nested_config_objects_merge_key_by_key() {
    let s = sidecar(json!({ "Config": { "envoy": { "a": 1 } } }));
    let m = merged(
        &[pd(json!({ "Config": { "envoy": { "a": 9, "b": 2 } } }))],
        &s,
    );
    assert_eq!(config(&m), json!({ "envoy": { "a": 1, "b": 2 } }));
}

#[test]
fn service_defaults_protocol_beats_proxy_defaults_protocol() {
    let m = merged(
        &[
            pd(json!({ "Config": { "protocol": "tcp" } })),
            sd("web", json!({ "Protocol": "http" })),
        ],
        &sidecar(json!({})),
    );
    assert_eq!(config(&m), json!({ "protocol": "http" }));
}

#[test]
fn registration_protocol_beats_service_defaults() {
    let m = merged(
        &[sd("web", json!({ "Protocol": "http" }))],
        &sidecar(json!({ "Config": { "protocol": "grpc" } })),
    );
    assert_eq!(config(&m), json!({ "protocol": "grpc" }));
}

#[test]
fn service_defaults_inbound_fields_land_in_config_when_set() {
    let m = merged(
        &[sd(
            "web",
            json!({
                "BalanceInboundConnections": "exact_balance",
                "MaxInboundConnections": 20,
                "LocalConnectTimeoutMs": 20000,
                "LocalRequestTimeoutMs": 30000
            }),
        )],
        &sidecar(json!({})),
    );
    assert_eq!(
        config(&m),
        json!({
            "balance_inbound_connections": "exact_balance",
            "max_inbound_connections": 20,
            "local_connect_timeout_ms": 20000,
            "local_request_timeout_ms": 30000
        })
    );
    // Zero values say nothing: no Config at all.
    let m = merged(&[sd("web", json!({}))], &sidecar(json!({})));
    assert_eq!(m.proxy.config, None);
}

#[test]
fn service_defaults_of_the_proxy_itself_do_not_apply_to_a_sidecar() {
    // A sidecar is configured by its destination, not by its own name.
    let m = merged(
        &[sd("web-proxy", json!({ "Protocol": "http" }))],
        &sidecar(json!({})),
    );
    assert_eq!(m.proxy.config, None);
}

// ---------------------------------------------------------------------------
// Mode, TransparentProxy, MeshGateway, MutualTLSMode
// ---------------------------------------------------------------------------

#[test]
fn mode_service_defaults_beats_proxy_defaults_and_registration_beats_both() {
    let list = [
        pd(json!({ "Mode": "direct" })),
        sd("web", json!({ "Mode": "transparent" })),
    ];
    assert_eq!(merged(&list, &sidecar(json!({}))).proxy.mode, "transparent");
    assert_eq!(
        merged(&list, &sidecar(json!({ "Mode": "direct" })))
            .proxy
            .mode,
        "direct"
    );
    assert_eq!(merged(&list[..1], &sidecar(json!({}))).proxy.mode, "direct");
}

#[test]
fn transparent_proxy_fields_resolve_one_by_one() {
    let list = [
        pd(json!({ "TransparentProxy": { "OutboundListenerPort": 10101 } })),
        sd(
            "web",
            json!({ "TransparentProxy": { "DialedDirectly": true } }),
        ),
    ];
    let t = merged(&list, &sidecar(json!({})))
        .proxy
        .transparent_proxy
        .clone();
    assert_eq!((t.outbound_listener_port, t.dialed_directly), (10101, true));

    let list = [
        pd(json!({ "TransparentProxy": { "OutboundListenerPort": 10101 } })),
        sd(
            "web",
            json!({ "TransparentProxy": { "OutboundListenerPort": 2020 } }),
        ),
    ];
    let t = merged(&list, &sidecar(json!({})))
        .proxy
        .transparent_proxy
        .clone();
    assert_eq!(t.outbound_listener_port, 2020);

    let reg = sidecar(json!({ "TransparentProxy": { "OutboundListenerPort": 808 } }));
    let t = merged(&list, &reg).proxy.transparent_proxy.clone();
    assert_eq!(t.outbound_listener_port, 808);
}

#[test]
fn proxy_mesh_gateway_service_defaults_beats_proxy_defaults_registration_beats_both() {
    let list = [
        pd(json!({ "MeshGateway": { "Mode": "local" } })),
        sd("web", json!({ "MeshGateway": { "Mode": "none" } })),
    ];
    assert_eq!(
        merged(&list, &sidecar(json!({}))).proxy.mesh_gateway.mode,
        "none"
    );
    let reg = sidecar(json!({ "MeshGateway": { "Mode": "remote" } }));
    assert_eq!(merged(&list, &reg).proxy.mesh_gateway.mode, "remote");
}

#[test]
fn mutual_tls_mode_service_defaults_beats_proxy_defaults() {
    let list = [
        pd(json!({ "MutualTLSMode": "strict" })),
        sd("web", json!({ "MutualTLSMode": "permissive" })),
    ];
    assert_eq!(
        merged(&list, &sidecar(json!({}))).proxy.mutual_tls_mode,
        "permissive"
    );
    assert_eq!(
        merged(&list[..1], &sidecar(json!({})))
            .proxy
            .mutual_tls_mode,
        "strict"
    );
}

// ---------------------------------------------------------------------------
// Expose, AccessLogs, EnvoyExtensions
// ---------------------------------------------------------------------------

#[test]
fn expose_paths_from_service_defaults_replace_proxy_defaults_and_registration_wins() {
    let list = [
        pd(json!({ "Expose": { "Paths": [ { "ListenerPort": 1, "Path": "/pd" } ] } })),
        sd(
            "web",
            json!({ "Expose": { "Checks": true, "Paths": [ { "ListenerPort": 2, "Path": "/sd" } ] } }),
        ),
    ];
    let e = merged(&list, &sidecar(json!({}))).proxy.expose.clone();
    assert!(e.checks);
    assert_eq!(e.paths.len(), 1);
    assert_eq!(e.paths[0].path, "/sd");

    let reg = sidecar(json!({ "Expose": { "Paths": [ { "ListenerPort": 3, "Path": "/own" } ] } }));
    let e = merged(&list, &reg).proxy.expose.clone();
    assert!(e.checks, "checks still come from central config");
    assert_eq!(e.paths[0].path, "/own");
}

#[test]
fn access_logs_come_from_proxy_defaults_and_registration_fields_win() {
    let list = [pd(
        json!({ "AccessLogs": { "Enabled": true, "Type": "file", "Path": "/var/log/a" } }),
    )];
    let l = merged(&list, &sidecar(json!({}))).proxy.access_logs.clone();
    assert!(l.enabled);
    assert_eq!(
        (l.log_type.as_str(), l.path.as_str()),
        ("file", "/var/log/a")
    );

    let reg = sidecar(json!({ "AccessLogs": { "Path": "/mine" } }));
    let l = merged(&list, &reg).proxy.access_logs.clone();
    assert_eq!((l.log_type.as_str(), l.path.as_str()), ("file", "/mine"));
}

#[test]
fn envoy_extensions_are_central_ones_in_order_replacing_the_registrations() {
    let list = [
        pd(
            json!({ "EnvoyExtensions": [ { "Name": "builtin/lua", "Arguments": { "Script": "a" } } ] }),
        ),
        sd(
            "web",
            json!({ "EnvoyExtensions": [ { "Name": "builtin/aws/lambda", "Required": true, "Arguments": { "ARN": "x" } } ] }),
        ),
    ];
    let reg = sidecar(json!({ "EnvoyExtensions": [ { "Name": "mine" } ] }));
    let ext = merged(&list, &reg).proxy.envoy_extensions.clone();
    let names: Vec<&str> = ext.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["builtin/lua", "builtin/aws/lambda"]);
    assert!(ext[1].required);
}

// ---------------------------------------------------------------------------
// Upstream protocol
// ---------------------------------------------------------------------------

fn with_db_and_cache() -> NodeService {
    sidecar(json!({ "Upstreams": [
        { "DestinationName": "db", "LocalBindPort": 9191 },
        { "DestinationName": "cache", "LocalBindPort": 9192 }
    ] }))
}

#[test]
fn upstream_protocol_starts_from_proxy_defaults() {
    let m = merged(
        &[pd(json!({ "Config": { "protocol": "grpc" } }))],
        &with_db_and_cache(),
    );
    assert_eq!(up_cfg(&m, "cache"), json!({ "protocol": "grpc" }));
}

#[test]
fn upstream_own_service_defaults_protocol_beats_proxy_defaults() {
    let m = merged(
        &[
            pd(json!({ "Config": { "protocol": "grpc" } })),
            sd("db", json!({ "Protocol": "http" })),
        ],
        &with_db_and_cache(),
    );
    assert_eq!(up_cfg(&m, "db"), json!({ "protocol": "http" }));
    assert_eq!(up_cfg(&m, "cache"), json!({ "protocol": "grpc" }));
}

#[test]
fn downstream_upstream_defaults_protocol_beats_upstream_service_defaults() {
    let m = merged(
        &[
            sd("db", json!({ "Protocol": "http" })),
            sd(
                "web",
                json!({ "UpstreamConfig": { "Defaults": { "Protocol": "grpc" } } }),
            ),
        ],
        &with_db_and_cache(),
    );
    assert_eq!(up_cfg(&m, "db"), json!({ "protocol": "grpc" }));
}

#[test]
fn upstream_override_protocol_beats_defaults() {
    let m = merged(
        &[
            sd("db", json!({ "Protocol": "http" })),
            sd(
                "web",
                json!({ "UpstreamConfig": {
                    "Defaults": { "Protocol": "http2" },
                    "Overrides": [ { "Name": "db", "Protocol": "grpc" } ]
                } }),
            ),
        ],
        &with_db_and_cache(),
    );
    assert_eq!(up_cfg(&m, "db"), json!({ "protocol": "grpc" }));
    assert_eq!(up_cfg(&m, "cache"), json!({ "protocol": "http2" }));
}

#[test]
fn registered_upstream_config_beats_every_central_value() {
    let s = sidecar(json!({ "Upstreams": [
        { "DestinationName": "db", "LocalBindPort": 9191, "Config": { "protocol": "tcp", "connect_timeout_ms": 5 } }
    ] }));
    let m = merged(
        &[sd(
            "web",
            json!({ "UpstreamConfig": { "Overrides": [
                { "Name": "db", "Protocol": "grpc", "ConnectTimeoutMs": 100, "Limits": { "MaxConnections": 3 } }
            ] } }),
        )],
        &s,
    );
    assert_eq!(
        up_cfg(&m, "db"),
        json!({ "protocol": "tcp", "connect_timeout_ms": 5, "limits": { "MaxConnections": 3 } })
    );
}

#[test]
fn proxy_defaults_protocol_is_not_a_wildcard_default() {
    // Consul once put it there, making it beat the upstream's own
    // service-defaults for undeclared upstreams of transparent proxies.
    let r = resolve_service_config(
        &entries(&[pd(
            json!({ "Mode": "transparent", "Config": { "protocol": "http" } }),
        )]),
        &resolve_request_for(&sidecar(json!({}))),
    );
    assert_eq!(r.upstream_configs.get(&UpstreamKey::wildcard()), None);
}

#[test]
fn passive_health_check_durations_are_go_nanoseconds() {
    let m = merged(
        &[sd(
            "web",
            json!({ "UpstreamConfig": { "Defaults": {
                "PassiveHealthCheck": { "Interval": "10s", "MaxFailures": 3 }
            } } }),
        )],
        &with_db_and_cache(),
    );
    assert_eq!(
        up_cfg(&m, "db")["passive_health_check"],
        json!({ "Interval": 10_000_000_000_i64, "MaxFailures": 3 })
    );
}

// ---------------------------------------------------------------------------
// Upstream mesh gateway mode
// ---------------------------------------------------------------------------

fn one_upstream(extra_proxy: Value, upstream_extra: Value) -> NodeService {
    let mut up = json!({ "DestinationName": "db", "LocalBindPort": 9000 });
    up.as_object_mut()
        .unwrap()
        .extend(upstream_extra.as_object().unwrap().clone());
    let mut p = extra_proxy;
    p.as_object_mut()
        .unwrap()
        .insert("Upstreams".into(), json!([up]));
    sidecar(p)
}

fn db_mode(list: &[Value], s: &NodeService) -> String {
    upstream(&merged(list, s), "db").mesh_gateway.mode.clone()
}

#[test]
fn upstream_mesh_gateway_layers_in_order() {
    let reg = one_upstream(json!({}), json!({}));
    let mut list = vec![pd(json!({ "MeshGateway": { "Mode": "local" } }))];
    assert_eq!(db_mode(&list, &reg), "local", "1: proxy-defaults");

    list.push(sd("web", json!({ "MeshGateway": { "Mode": "none" } })));
    assert_eq!(db_mode(&list, &reg), "none", "2: service-defaults");

    list[1] = sd(
        "web",
        json!({ "MeshGateway": { "Mode": "none" },
                "UpstreamConfig": { "Defaults": { "MeshGateway": { "Mode": "remote" } } } }),
    );
    assert_eq!(db_mode(&list, &reg), "remote", "3: upstream defaults");

    let reg = one_upstream(json!({ "MeshGateway": { "Mode": "local" } }), json!({}));
    assert_eq!(
        db_mode(&list, &reg),
        "local",
        "4: registration's proxy mode"
    );

    list[1] = sd(
        "web",
        json!({ "MeshGateway": { "Mode": "none" },
                "UpstreamConfig": {
                    "Defaults": { "MeshGateway": { "Mode": "remote" } },
                    "Overrides": [ { "Name": "db", "MeshGateway": { "Mode": "none" } } ] } }),
    );
    assert_eq!(db_mode(&list, &reg), "none", "5: upstream override");

    let reg = one_upstream(
        json!({ "MeshGateway": { "Mode": "local" } }),
        json!({ "MeshGateway": { "Mode": "remote" } }),
    );
    assert_eq!(db_mode(&list, &reg), "remote", "6: the upstream's own mode");
}

#[test]
fn upstream_defaults_mesh_gateway_does_not_change_the_proxy_level_mode() {
    let m = merged(
        &[sd(
            "web",
            json!({ "MeshGateway": { "Mode": "none" },
                    "UpstreamConfig": { "Defaults": { "MeshGateway": { "Mode": "remote" } } } }),
        )],
        &one_upstream(json!({}), json!({})),
    );
    assert_eq!(m.proxy.mesh_gateway.mode, "none");
    assert_eq!(upstream(&m, "db").mesh_gateway.mode, "remote");
}

#[test]
fn merged_upstream_config_keeps_no_mesh_gateway_key() {
    let m = merged(
        &[pd(json!({ "MeshGateway": { "Mode": "local" } }))],
        &one_upstream(json!({}), json!({})),
    );
    assert_eq!(upstream(&m, "db").config, None);
    assert_eq!(upstream(&m, "db").mesh_gateway.mode, "local");
}

// ---------------------------------------------------------------------------
// Which upstreams are touched
// ---------------------------------------------------------------------------

#[test]
fn prepared_query_upstreams_are_left_alone() {
    let s = sidecar(json!({ "Upstreams": [
        { "DestinationType": "prepared_query", "DestinationName": "geo", "LocalBindPort": 1 }
    ] }));
    let m = merged(
        &[sd(
            "web",
            json!({ "UpstreamConfig": { "Defaults": { "ConnectTimeoutMs": 7 } } }),
        )],
        &s,
    );
    assert_eq!(m.proxy.upstreams, s.proxy.upstreams);
}

#[test]
fn without_upstreams_or_transparent_mode_there_is_no_upstream_config() {
    let r = resolve_service_config(
        &entries(&[
            pd(json!({ "MeshGateway": { "Mode": "local" } })),
            sd(
                "web",
                json!({ "UpstreamConfig": { "Defaults": { "ConnectTimeoutMs": 7 } } }),
            ),
        ]),
        &resolve_request_for(&sidecar(json!({}))),
    );
    assert!(r.upstream_configs.is_empty());
}

#[test]
fn transparent_mode_adds_wildcard_and_override_upstreams() {
    let list = [sd(
        "web",
        json!({ "Mode": "transparent",
                "UpstreamConfig": {
                    "Defaults": { "ConnectTimeoutMs": 7 },
                    "Overrides": [ { "Name": "zap", "Protocol": "grpc" } ] } }),
    )];
    let m = merged(
        &list,
        &sidecar(json!({ "Upstreams": [ { "DestinationName": "zip", "LocalBindPort": 8080 } ] })),
    );
    let names: Vec<&str> = m
        .proxy
        .upstreams
        .iter()
        .map(|u| u.destination_name.as_str())
        .collect();
    assert_eq!(
        names,
        ["zip", "*", "zap"],
        "declared first, then central, sorted"
    );
    let zap = upstream(&m, "zap");
    assert!(zap.centrally_configured);
    assert_eq!(zap.local_bind_port, 0);
    assert_eq!(zap.destination_namespace, "default");
    assert_eq!(
        up_cfg(&m, "zap"),
        json!({ "protocol": "grpc", "connect_timeout_ms": 7 })
    );
    assert_eq!(up_cfg(&m, "*"), json!({ "connect_timeout_ms": 7 }));
    assert!(!upstream(&m, "zip").centrally_configured);

    // Same central config, direct mode by registration: nothing is added.
    let m = merged(&list, &sidecar(json!({ "Mode": "direct" })));
    assert!(m.proxy.upstreams.is_empty());
}

// ---------------------------------------------------------------------------
// Peers
// ---------------------------------------------------------------------------

#[test]
fn overrides_match_peered_upstreams_by_name_until_one_names_a_peer() {
    let s = sidecar(json!({ "Upstreams": [
        { "DestinationName": "zap", "LocalBindPort": 1 },
        { "DestinationName": "zap", "DestinationPeer": "p", "LocalBindPort": 2 }
    ] }));
    let legacy = [sd(
        "web",
        json!({ "UpstreamConfig": { "Overrides": [ { "Name": "zap", "ConnectTimeoutMs": 2222 } ] } }),
    )];
    let m = merged(&legacy, &s);
    assert_eq!(
        json!(m.proxy.upstreams[1].config),
        json!({ "connect_timeout_ms": 2222 })
    );

    let distinct = [sd(
        "web",
        json!({ "UpstreamConfig": { "Overrides": [
            { "Name": "zap", "ConnectTimeoutMs": 2222 },
            { "Name": "zap", "Peer": "p", "ConnectTimeoutMs": 3333 }
        ] } }),
    )];
    let m = merged(&distinct, &s);
    assert_eq!(
        json!(m.proxy.upstreams[0].config),
        json!({ "connect_timeout_ms": 2222 })
    );
    assert_eq!(
        json!(m.proxy.upstreams[1].config),
        json!({ "connect_timeout_ms": 3333 })
    );
}

#[test]
fn peered_upstreams_keep_their_registered_protocol() {
    let s = sidecar(json!({ "Upstreams": [
        { "DestinationName": "zap", "DestinationPeer": "p", "LocalBindPort": 1, "Config": { "protocol": "tcp" } },
        { "DestinationName": "zup", "DestinationPeer": "p", "LocalBindPort": 2 }
    ] }));
    let m = merged(
        &[
            pd(json!({ "Config": { "protocol": "http" } })),
            sd(
                "web",
                json!({ "UpstreamConfig": { "Overrides": [
                    { "Name": "zap", "Peer": "p", "Protocol": "grpc" },
                    { "Name": "zup", "Peer": "p", "Protocol": "grpc", "ConnectTimeoutMs": 9 }
                ] } }),
            ),
        ],
        &s,
    );
    assert_eq!(
        json!(m.proxy.upstreams[0].config),
        json!({ "protocol": "tcp" })
    );
    assert_eq!(
        json!(m.proxy.upstreams[1].config),
        json!({ "connect_timeout_ms": 9 })
    );
}

// ---------------------------------------------------------------------------
// Kinds, and the store
// ---------------------------------------------------------------------------

fn state_with(list: &[Value], regs: &[Value]) -> State {
    let mut st = State::default();
    let mut index = 1;
    for e in list {
        let (r, _) = apply_command(
            &mut st,
            index,
            &Command::ConfigSet {
                entry: e.clone(),
                cas: None,
            },
        );
        assert_eq!(r, crate::state::Response::Bool(true), "{e}");
        index += 1;
    }
    for r in regs {
        let req: RegisterRequest = serde_json::from_value(r.clone()).unwrap();
        apply_command(&mut st, index, &Command::Register(Box::new(req)));
        index += 1;
    }
    st
}

#[test]
fn gateways_are_configured_by_their_own_name_and_typical_services_not_at_all() {
    let st = state_with(
        &[
            pd(json!({ "Config": { "foo": "baz", "connect_timeout_ms": 5000 } })),
            sd("mesh-gateway", json!({ "Protocol": "http" })),
            sd("web", json!({ "Protocol": "http" })),
        ],
        &[],
    );
    let gw = svc(
        json!({ "Kind": "mesh-gateway", "ID": "mesh-gateway", "Service": "mesh-gateway",
                         "Port": 8443, "Proxy": { "Config": { "foo": "bar" } } }),
    );
    let m = merge_node_service(&st, &gw);
    assert_eq!(
        config(&m),
        json!({ "foo": "bar", "connect_timeout_ms": 5000, "protocol": "http" })
    );
    let web = svc(json!({ "ID": "web", "Service": "web", "Port": 80 }));
    assert_eq!(merge_node_service(&st, &web), web);
}

#[test]
fn merging_never_changes_the_stored_registration() {
    let reg = json!({ "Node": "n1", "Address": "127.0.0.1", "Service": {
        "Kind": "connect-proxy", "ID": "web-proxy", "Service": "web-proxy", "Port": 1,
        "Proxy": { "DestinationServiceName": "web",
                   "Upstreams": [ { "DestinationName": "db", "LocalBindPort": 2 } ] } } });
    let st = state_with(
        &[pd(
            json!({ "Mode": "transparent", "Config": { "protocol": "http" } }),
        )],
        &[reg],
    );
    let key = ("n1".to_string(), "web-proxy".to_string());
    let before = (**st.services.get(&key).unwrap()).clone();
    let mut inst = crate::state::catalog::service_instances(&st, "web", true);
    merge_instances(&st, &mut inst);
    assert_eq!(inst[0].service.proxy.mode, "transparent");
    assert_eq!(**st.services.get(&key).unwrap(), before);
    assert_eq!(before.proxy.mode, "");
}

#[test]
fn merging_a_list_equals_merging_each_instance_alone() {
    // merge_instances resolves each distinct question once; instances that
    // differ in destination, mode, mesh gateway or upstreams must not share.
    let proxy = |node: &str, dest: &str, extra: Value| {
        let mut p = json!({ "DestinationServiceName": dest });
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({ "Node": node, "Address": "10.0.0.1", "Service": {
            "Kind": "connect-proxy", "ID": "p", "Service": format!("{dest}-proxy"), "Port": 1,
            "Proxy": p } })
    };
    let regs = [
        proxy(
            "n1",
            "web",
            json!({ "Upstreams": [ { "DestinationName": "db", "LocalBindPort": 1 } ] }),
        ),
        proxy(
            "n2",
            "web",
            json!({ "Upstreams": [ { "DestinationName": "db", "LocalBindPort": 1 } ] }),
        ),
        proxy(
            "n3",
            "web",
            json!({ "Upstreams": [ { "DestinationName": "cache", "LocalBindPort": 1 } ] }),
        ),
        proxy(
            "n4",
            "web",
            json!({ "Upstreams": [ { "DestinationName": "db", "DestinationPeer": "p", "LocalBindPort": 1 } ] }),
        ),
        proxy("n5", "web", json!({ "Mode": "transparent" })),
        proxy(
            "n6",
            "web",
            json!({ "MeshGateway": { "Mode": "remote" },
                                    "Upstreams": [ { "DestinationName": "db", "LocalBindPort": 1 } ] }),
        ),
        proxy(
            "n7",
            "web",
            json!({ "Upstreams": [
            { "DestinationName": "db", "LocalBindPort": 1 },
            { "DestinationType": "prepared_query", "DestinationName": "q", "LocalBindPort": 2 } ] }),
        ),
    ];
    let st = state_with(
        &[
            pd(json!({ "MeshGateway": { "Mode": "local" } })),
            sd("db", json!({ "Protocol": "http" })),
            sd("cache", json!({ "Protocol": "grpc" })),
            sd(
                "web",
                json!({ "UpstreamConfig": { "Defaults": { "ConnectTimeoutMs": 5 } } }),
            ),
        ],
        &regs,
    );
    let mut together = crate::state::catalog::service_instances(&st, "web", true);
    assert_eq!(together.len(), regs.len());
    let alone: Vec<NodeService> = together
        .iter()
        .map(|i| merge_node_service(&st, &i.service))
        .collect();
    // The list's watch keys are the union of each instance's.
    let mut union: Vec<crate::state::WatchKey> = together
        .iter()
        .flat_map(|i| merge_watch_keys(&st, &i.service))
        .collect();
    union.sort();
    union.dedup();
    assert_eq!(watch_keys_for_instances(&st, &together), union);
    merge_instances(&st, &mut together);
    for (t, a) in together.iter().zip(&alone) {
        assert_eq!(*t.service, *a);
    }
    assert_eq!(
        together[2].service.proxy.upstreams[0]
            .config
            .as_ref()
            .unwrap()["protocol"],
        "grpc"
    );
}

#[test]
fn watch_keys_cover_every_entry_the_merge_reads() {
    let st = state_with(
        &[sd(
            "web",
            json!({ "UpstreamConfig": { "Overrides": [
                { "Name": "zap", "ConnectTimeoutMs": 1 },
                { "Name": "zop", "Peer": "p", "ConnectTimeoutMs": 1 }
            ] } }),
        )],
        &[],
    );
    let s = sidecar(json!({ "Upstreams": [
        { "DestinationName": "db", "LocalBindPort": 1 },
        { "DestinationName": "far", "DestinationPeer": "p", "LocalBindPort": 2 },
        { "DestinationType": "prepared_query", "DestinationName": "geo", "LocalBindPort": 3 }
    ] }));
    let sdk = |n: &str| keys::config("service-defaults", n);
    assert_eq!(
        merge_watch_keys(&st, &s),
        vec![
            keys::config("proxy-defaults", "global"),
            sdk("db"),
            sdk("web"),
            sdk("zap"),
        ]
    );
    let typical = svc(json!({ "ID": "web", "Service": "web", "Port": 80 }));
    assert!(merge_watch_keys(&st, &typical).is_empty());
}

#[test]
fn merge_index_moves_when_a_feeding_entry_changes_and_only_then() {
    let s = sidecar(json!({ "Upstreams": [ { "DestinationName": "db", "LocalBindPort": 1 } ] }));
    let mut st = state_with(&[sd("web", json!({ "Protocol": "http" }))], &[]);
    assert_eq!(merge_index(&st, &s), 1, "the first write was at index 1");
    let set = |st: &mut State, i: u64, e: Value| {
        apply_command(
            st,
            i,
            &Command::ConfigSet {
                entry: e,
                cas: None,
            },
        );
    };
    set(&mut st, 10, sd("unrelated", json!({ "Protocol": "http" })));
    assert_eq!(merge_index(&st, &s), 1);
    set(&mut st, 11, sd("db", json!({ "Protocol": "grpc" })));
    assert_eq!(merge_index(&st, &s), 11);
    set(&mut st, 12, pd(json!({ "Config": { "a": 1 } })));
    assert_eq!(merge_index(&st, &s), 12);
    apply_command(
        &mut st,
        13,
        &Command::ConfigDelete {
            kind: "service-defaults".into(),
            name: "db".into(),
            cas: None,
        },
    );
    assert_eq!(merge_index(&st, &s), 13, "a delete moves the index too");
}

/// Function-level cost of merging, beside what serving the rows costs
/// anyway (reading instances, serializing `{Node, Service, Checks}` rows).
/// `cargo test --release --lib merge_cost -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark: run on a release build with --ignored"]
fn merge_cost() {
    use std::time::Instant;
    let ups: Vec<Value> = (0..10)
        .map(|u| json!({ "DestinationName": format!("up-{u}"), "LocalBindPort": 9000 + u }))
        .collect();
    let mut list = vec![
        pd(json!({ "MeshGateway": { "Mode": "local" }, "Config": { "protocol": "tcp" } })),
        sd(
            "web",
            json!({ "Protocol": "http", "UpstreamConfig": {
                "Defaults": { "ConnectTimeoutMs": 500, "Limits": { "MaxConnections": 512 } },
                "Overrides": [ { "Name": "up-0", "Protocol": "grpc" } ] } }),
        ),
    ];
    list.extend((0..10).map(|u| sd(&format!("up-{u}"), json!({ "Protocol": "http" }))));
    let regs: Vec<Value> = (0..100)
        .map(|i| {
            json!({ "Node": format!("n{i}"), "Address": "10.0.0.1", "Service": {
                "Kind": "connect-proxy", "ID": "web-proxy", "Service": "web-proxy", "Port": 1,
                "Proxy": { "DestinationServiceName": "web", "Upstreams": ups } } })
        })
        .collect();
    let st = state_with(&list, &regs);
    let rows = |inst: &[crate::state::catalog::Instance]| {
        let v: Vec<Value> = inst
            .iter()
            .map(|i| json!({ "Node": &*i.node, "Service": &*i.service, "Checks": i.checks }))
            .collect();
        serde_json::to_vec(&v).unwrap().len()
    };
    let n = 300;
    let t = Instant::now();
    for _ in 0..n {
        let inst = crate::state::catalog::service_instances(&st, "web", true);
        std::hint::black_box(rows(&inst));
    }
    let plain = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        let mut inst = crate::state::catalog::service_instances(&st, "web", true);
        merge_instances(&st, &mut inst);
        std::hint::black_box(rows(&inst));
    }
    let merged = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        let mut inst = crate::state::catalog::service_instances(&st, "web", true);
        merge_instances(&st, &mut inst);
        std::hint::black_box(inst);
    }
    let merge_only = t.elapsed() / n;
    eprintln!(
        "100 proxies x 10 upstreams: rows {plain:?}, merged rows {merged:?} (x{:.2}), instances+merge alone {merge_only:?}",
        merged.as_secs_f64() / plain.as_secs_f64()
    );
}
