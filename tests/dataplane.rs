//! The agentless dataplane bootstrap endpoint against a real dev server:
//! answers for a sidecar and a gateway with central config merged in, the
//! 400/404 cases, and a blocking read woken by a config entry write.

mod common;

use std::time::{Duration, Instant};

use common::{Server, request};
use serde_json::{Value, json};

const PATH: &str = "/v1/internal/dataplane/bootstrap-params";

fn put_ok(s: &Server, path: &str, body: Value) {
    let r = s.put(path, &body.to_string());
    assert_eq!(r.status, 200, "PUT {path} {body}: {}", r.body);
    assert_eq!(r.body.trim(), "true");
}

#[test]
fn bootstrap_params_merge_central_config() {
    let s = Server::dev();

    // Bad requests and unknown nodes need nothing registered.
    let r = s.get(&format!("{PATH}/web-proxy"));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Node ID or name required"), "{}", r.body);
    let r = s.get(&format!("{PATH}/web-proxy?node=nope"));
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("Node not found"), "{}", r.body);

    put_ok(
        &s,
        "/v1/config",
        json!({ "Kind": "proxy-defaults", "Name": "global",
                "Config": { "protocol": "tcp", "handshake_timeout_ms": 1000 },
                "AccessLogs": { "Enabled": true, "Type": "file", "Path": "/tmp/envoy.log" } }),
    );
    put_ok(
        &s,
        "/v1/config",
        json!({ "Kind": "service-defaults", "Name": "web", "Protocol": "http",
                "LocalConnectTimeoutMs": 2000 }),
    );
    put_ok(
        &s,
        "/v1/catalog/register",
        json!({
            "Node": "n1", "ID": "11111111-2222-3333-4444-555555555555", "Address": "10.0.0.1",
            "Service": { "Kind": "connect-proxy", "ID": "web-proxy-1", "Service": "web-proxy",
                         "Port": 21000,
                         "Proxy": { "DestinationServiceName": "web",
                                    "Config": { "handshake_timeout_ms": 5 } } }
        }),
    );
    put_ok(
        &s,
        "/v1/catalog/register",
        json!({
            "Node": "n1", "Address": "10.0.0.1",
            "Service": { "Kind": "mesh-gateway", "ID": "mgw", "Service": "mesh-gateway",
                         "Port": 8443, "Proxy": { "Config": { "foo": "bar" } } }
        }),
    );

    // The sidecar: named after its destination, Config merged.
    let r = s.get(&format!("{PATH}/web-proxy-1?node=n1"));
    assert_eq!(r.status, 200, "{}", r.body);
    let index = r.index();
    let v = r.json();
    assert_eq!(v["ServiceKind"], "SERVICE_KIND_CONNECT_PROXY");
    assert_eq!(v["Kind"], "connect-proxy");
    assert_eq!(v["Service"], "web");
    assert_eq!(v["Identity"], "web");
    assert_eq!(v["NodeName"], "n1");
    assert_eq!(v["NodeId"], "11111111-2222-3333-4444-555555555555");
    assert_eq!(v["Datacenter"], "dc1");
    assert_eq!(v["Namespace"], "default");
    assert_eq!(v["Partition"], "default");
    assert_eq!(
        v["Config"],
        json!({ "protocol": "http", "handshake_timeout_ms": 5, "local_connect_timeout_ms": 2000 })
    );
    let logs = v["AccessLogs"].as_array().unwrap();
    assert_eq!(logs.len(), 1);
    let log: Value = serde_json::from_str(logs[0].as_str().unwrap()).unwrap();
    assert_eq!(log["typedConfig"]["path"], "/tmp/envoy.log");

    // The same by node ID.
    let r = s.get(&format!(
        "{PATH}/web-proxy-1?node-id=11111111-2222-3333-4444-555555555555"
    ));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["Service"], "web");

    // A gateway is named by itself and keeps its own Config keys.
    let r = s.get(&format!("{PATH}/mgw?node=n1"));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["ServiceKind"], "SERVICE_KIND_MESH_GATEWAY");
    assert_eq!(v["Service"], "mesh-gateway");
    assert_eq!(
        v["Config"],
        json!({ "foo": "bar", "protocol": "tcp", "handshake_timeout_ms": 1000 })
    );

    // Unknown proxy on a known node.
    let r = s.get(&format!("{PATH}/nope?node=n1"));
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("Service not found"), "{}", r.body);

    // A blocking read wakes when service-defaults/web changes.
    let addr = s.http_addr;
    let path = format!("{PATH}/web-proxy-1?node=n1&index={index}&wait=10s");
    let started = Instant::now();
    let waiter = std::thread::spawn(move || request(addr, "GET", &path, None));
    s.wait_parked(1);
    put_ok(
        &s,
        "/v1/config",
        json!({ "Kind": "service-defaults", "Name": "web", "Protocol": "grpc" }),
    );
    let r = waiter.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "woke on the write"
    );
    assert!(r.index() > index, "{} > {index}", r.index());
    assert_eq!(r.json()["Config"]["protocol"], "grpc");

    // An unrelated write does not wake it.
    let index = r.index();
    let path = format!("{PATH}/web-proxy-1?node=n1&index={index}&wait=1s");
    let waiter = std::thread::spawn(move || request(addr, "GET", &path, None));
    s.wait_parked(1);
    put_ok(
        &s,
        "/v1/config",
        json!({ "Kind": "service-defaults", "Name": "other", "Protocol": "grpc" }),
    );
    let r = waiter.join().unwrap();
    assert_eq!(r.index(), index, "timed out, not woken");
}
