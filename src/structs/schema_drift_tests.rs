//! The filter selector schemas (`filter::schemas`) and the JSON of the
//! structs they filter cannot drift apart: a fully populated value of each
//! filterable row type is serialized, and its keys are compared with the
//! schema's fields, level by level. The only differences allowed are
//! listed here with Consul's reason; a field added to one side alone fails.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::rows::{CheckServiceNode, ServiceNodeRow};
use super::{HealthCheck, Node, NodeService};
use crate::filter::{Schema, schemas};

/// Paths only the schema has, and paths only the JSON has.
fn drift(schema: &Schema, json: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut only_schema = BTreeSet::new();
    let mut only_json = BTreeSet::new();
    walk(schema, json, "", &mut only_schema, &mut only_json);
    (only_schema, only_json)
}

fn walk(
    schema: &Schema, json: &Value, at: &str, only_schema: &mut BTreeSet<String>,
    only_json: &mut BTreeSet<String>,
) {
    let join = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match (schema, json) {
        (Schema::Struct(fields), Value::Object(obj)) => {
            for (name, inner) in fields.iter() {
                match obj.get(*name) {
                    Some(v) => walk(inner, v, &join(name), only_schema, only_json),
                    None => {
                        only_schema.insert(join(name));
                    }
                }
            }
            for k in obj.keys() {
                if !fields.iter().any(|(name, _)| name == k) {
                    only_json.insert(join(k));
                }
            }
        }
        (Schema::Map(inner), Value::Object(obj)) => {
            assert!(!obj.is_empty(), "{at}: populate the map");
            for v in obj.values() {
                walk(inner, v, &join("<any>"), only_schema, only_json);
            }
        }
        (Schema::List(inner), Value::Array(items)) => {
            assert!(!items.is_empty(), "{at}: populate the list");
            for v in items {
                walk(inner, v, at, only_schema, only_json);
            }
        }
        (Schema::Struct(_) | Schema::Map(_) | Schema::List(_), other) => {
            panic!("{at}: the schema has a structure, the JSON {other}")
        }
        _ => {}
    }
}

fn set(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|s| s.to_string()).collect()
}

fn node() -> Node {
    serde_json::from_value(json!({
        "ID": "0b6d4f1e-4a5c-4a1e-9a55-31c5a4b9c7d1", "Node": "n1", "Address": "10.0.0.1",
        "Datacenter": "dc1", "TaggedAddresses": {"lan": "10.0.0.1"}, "Meta": {"rack": "a"},
        "CreateIndex": 3, "ModifyIndex": 4
    }))
    .unwrap()
}

fn service() -> NodeService {
    let upstream = json!({
        "DestinationType": "service", "DestinationNamespace": "default",
        "DestinationPartition": "default", "DestinationPeer": "p", "DestinationName": "db",
        "Datacenter": "dc1", "LocalBindAddress": "127.0.0.1", "LocalBindPort": 9191,
        "Config": {"protocol": "http"}, "MeshGateway": {"Mode": "local"},
        "CentrallyConfigured": true
    });
    serde_json::from_value(json!({
        "Kind": "connect-proxy", "ID": "web-proxy", "Service": "web-proxy", "Tags": ["t"],
        "Address": "10.0.0.2", "TaggedAddresses": {"lan": {"Address": "10.0.0.2", "Port": 1}},
        "Meta": {"v": "1"}, "Port": 21000, "SocketPath": "/s", "Weights": {"Passing": 2, "Warning": 1},
        "EnableTagOverride": true,
        "Proxy": {
            "DestinationServiceName": "web", "DestinationServiceID": "web-1",
            "LocalServiceAddress": "127.0.0.1", "LocalServicePort": 8080, "Mode": "transparent",
            "Config": {"protocol": "http"}, "Upstreams": [upstream],
            "MeshGateway": {"Mode": "local"},
            "Expose": {"Checks": true, "Paths": [{"ListenerPort": 1, "Path": "/h",
                "LocalPathPort": 2, "Protocol": "http", "ParsedFromCheck": true}]},
            "TransparentProxy": {"OutboundListenerPort": 15001, "DialedDirectly": true},
            "AccessLogs": {"Enabled": true, "DisableListenerLogs": true, "Type": "file",
                "Path": "/l", "JSONFormat": "{}", "TextFormat": "t"},
            "EnvoyExtensions": [{"Name": "e", "Required": true, "Arguments": {"a": 1},
                "ConsulVersion": "1", "EnvoyVersion": "1"}],
            "MutualTLSMode": "strict"
        },
        "Connect": {"Native": true}, "PeerName": "p", "CreateIndex": 5, "ModifyIndex": 6
    }))
    .unwrap()
}

fn check() -> HealthCheck {
    let definition: serde_json::Map<String, Value> = crate::definition::DEFINITION_FIELDS
        .iter()
        .map(|f| (f.to_string(), json!("x")))
        .chain([
            ("Header".to_string(), json!({"X-A": ["b"]})),
            ("ScriptArgs".to_string(), json!(["a"])),
            ("Args".to_string(), json!(["a"])),
        ])
        .collect();
    serde_json::from_value(json!({
        "Node": "n1", "CheckID": "c", "Name": "c", "Status": "passing", "Notes": "n",
        "Output": "o", "ServiceID": "web-proxy", "ServiceName": "web-proxy",
        "ServiceTags": ["t"], "Type": "http", "Interval": "10s", "Timeout": "1s",
        "ExposedPort": 1, "Definition": definition, "CreateIndex": 7, "ModifyIndex": 8
    }))
    .unwrap()
}

/// Consul hides `RaftIndex` from filters; cairn's JSON carries it.
const RAFT_INDEX: [&str; 2] = ["CreateIndex", "ModifyIndex"];

/// Filterable in Consul, never in cairn's JSON (partitions and peering
/// are enterprise or unsupported; local bind sockets are not modelled).
const NODE_SCHEMA_ONLY: [&str; 2] = ["Partition", "PeerName"];
const PROXY_SCHEMA_ONLY: [&str; 3] = [
    "LocalServiceSocketPath",
    "Upstreams.LocalBindSocketMode",
    "Upstreams.LocalBindSocketPath",
];

fn prefixed(prefix: &str, paths: &[&str]) -> Vec<String> {
    paths.iter().map(|p| format!("{prefix}{p}")).collect()
}

/// In the service JSON, not filterable in Consul: `CentrallyConfigured` is
/// cairn's mark on merged upstreams.
fn proxy_json_only(prefix: &str) -> Vec<String> {
    prefixed(prefix, &["Upstreams.CentrallyConfigured"])
}

/// Definition fields Consul does not filter on: durations (Go filters them
/// as integers, the JSON carries strings), thresholds, `Args` (Consul's
/// JSON name for `ScriptArgs`) and the agent-only ones.
const DEFINITION_JSON_ONLY: [&str; 8] = [
    "Args",
    "DeregisterCriticalServiceAfter",
    "FailuresBeforeCritical",
    "FailuresBeforeWarning",
    "Interval",
    "SuccessBeforePassing",
    "TTL",
    "Timeout",
];

#[test]
fn node_rows_match_their_schema() {
    let (schema_only, json_only) = drift(&schemas::CATALOG_NODES, &json!(node()));
    assert_eq!(schema_only, set(&NODE_SCHEMA_ONLY));
    assert_eq!(json_only, set(&RAFT_INDEX));
}

#[test]
fn node_service_rows_match_their_schema() {
    let (schema_only, json_only) = drift(&schemas::CATALOG_NODE_SERVICES, &json!(service()));
    assert_eq!(
        schema_only,
        prefixed("Proxy.", &PROXY_SCHEMA_ONLY).into_iter().collect()
    );
    let mut want = set(&RAFT_INDEX);
    want.extend(proxy_json_only("Proxy."));
    assert_eq!(json_only, want);
    assert_eq!(
        schemas::AGENT_SERVICES.selectors(),
        schemas::CATALOG_NODE_SERVICES.selectors()
    );
}

#[test]
fn service_node_rows_match_their_schema() {
    let (n, s) = (node(), service());
    let row = json!(ServiceNodeRow::new(&n, &s, "dc1"));
    let (schema_only, json_only) = drift(&schemas::CATALOG_SERVICE, &row);
    let mut want = prefixed("ServiceProxy.", &PROXY_SCHEMA_ONLY);
    // The flat row's `PeerName` is the service's: cairn shows it as
    // `ServicePeerName`, which Consul does not filter on.
    want.push("PeerName".into());
    assert_eq!(schema_only, want.into_iter().collect());
    let mut want = set(&RAFT_INDEX);
    want.extend(proxy_json_only("ServiceProxy."));
    want.insert("ServicePeerName".into());
    assert_eq!(json_only, want);
}

#[test]
fn health_check_rows_match_their_schema() {
    let (schema_only, json_only) = drift(&schemas::HEALTH_CHECKS, &json!(check()));
    assert_eq!(schema_only, set(&["PeerName"]));
    let mut want = set(&RAFT_INDEX);
    want.extend(
        DEFINITION_JSON_ONLY
            .iter()
            .map(|f| format!("Definition.{f}")),
    );
    assert_eq!(json_only, want);
}

#[test]
fn check_service_node_rows_match_their_schema() {
    let (n, s) = (node(), service());
    let checks = [Arc::new(check())];
    let row = json!(CheckServiceNode {
        node: &n,
        service: &s,
        checks: &checks,
    });
    let (schema_only, json_only) = drift(&schemas::HEALTH_SERVICE, &row);
    let mut want: BTreeSet<String> = prefixed("Node.", &NODE_SCHEMA_ONLY).into_iter().collect();
    want.extend(prefixed("Service.Proxy.", &PROXY_SCHEMA_ONLY));
    want.insert("Checks.PeerName".into());
    assert_eq!(schema_only, want);
    let mut want: BTreeSet<String> = ["Node.", "Service.", "Checks."]
        .iter()
        .flat_map(|p| prefixed(p, &RAFT_INDEX))
        .collect();
    want.extend(proxy_json_only("Service.Proxy."));
    want.extend(
        DEFINITION_JSON_ONLY
            .iter()
            .map(|f| format!("Checks.Definition.{f}")),
    );
    assert_eq!(json_only, want);
}
