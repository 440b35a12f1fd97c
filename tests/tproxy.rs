//! Transparent proxy on real processes: the virtual IPs the servers assign
//! each connect-capable service (shown as the instances' `consul-virtual`
//! tagged address and the chain's `AutoVirtualIPs`, freed with the last
//! instance, kept across a restart), manual ones through
//! `PUT /v1/internal/service-virtual-ip`, `Proxy.Mode` checked at
//! registration, and all of it under ACLs with default deny.

mod common;

use std::time::Duration;

use common::Server;
use common::acl::{ROOT, as_root, deny_server, token_with_rules, with};
use serde_json::{Value, json};

fn register(s: &Server, node: &str, body: Value) -> common::Resp {
    let req = json!({"Node": node, "Address": "10.0.0.1", "Service": body});
    s.put("/v1/catalog/register", &req.to_string())
}

fn sidecar(name: &str) -> Value {
    json!({"ID": format!("{name}-proxy"), "Service": format!("{name}-sidecar-proxy"),
           "Kind": "connect-proxy", "Port": 21000,
           "Proxy": {"DestinationServiceName": name, "Mode": "transparent"}})
}

fn register_ok(s: &Server, node: &str, body: Value) {
    let r = register(s, node, body);
    assert_eq!(r.status, 200, "{}", r.body);
}

/// The chain's `AutoVirtualIPs` (empty when it has none).
fn auto_vips(s: &Server, service: &str) -> Vec<String> {
    let chain = s.get_json(&format!("/v1/discovery-chain/{service}"));
    chain["Chain"]["AutoVirtualIPs"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Each instance's `consul-virtual` tagged address, in node order.
fn tagged(s: &Server, service: &str) -> Vec<Value> {
    s.get_json(&format!("/v1/catalog/service/{service}"))
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["ServiceTaggedAddresses"]["consul-virtual"].clone())
        .collect()
}

/// The first connect-capable instance gets its service the next address
/// from 240.0.0.1, shown on every instance (with the instance's port) and
/// in the chain; a plain instance shows none; it stays while an instance
/// is left and goes with the last; the next service gets the freed top
/// address.
#[test]
fn virtual_ips_are_assigned_shown_and_freed() {
    let s = Server::dev();
    register_ok(
        &s,
        "n1",
        json!({"ID": "web", "Service": "web", "Port": 8080}),
    );
    assert!(auto_vips(&s, "web").is_empty(), "no VIP without a sidecar");
    assert_eq!(tagged(&s, "web"), [Value::Null]);
    register_ok(&s, "n1", sidecar("web"));
    register_ok(&s, "n22", sidecar("web"));
    register_ok(&s, "n1", sidecar("api"));
    assert_eq!(auto_vips(&s, "web"), ["240.0.0.1"]);
    assert_eq!(auto_vips(&s, "api"), ["240.0.0.2"]);
    let vip = json!({"Address": "240.0.0.1", "Port": 21000});
    assert_eq!(tagged(&s, "web-sidecar-proxy"), [vip.clone(), vip]);
    assert_eq!(tagged(&s, "web"), [Value::Null], "the app shows none");

    let dereg = |node: &str, id: &str| {
        let body = json!({"Node": node, "ServiceID": id}).to_string();
        assert_eq!(s.put("/v1/catalog/deregister", &body).status, 200);
    };
    dereg("n1", "web-proxy");
    assert_eq!(auto_vips(&s, "web"), ["240.0.0.1"], "one instance left");
    dereg("n22", "web-proxy");
    assert!(auto_vips(&s, "web").is_empty(), "freed with the last");
    dereg("n1", "api-proxy");
    register_ok(&s, "n1", sidecar("db"));
    assert_eq!(auto_vips(&s, "db"), ["240.0.0.1"]);
}

/// Manual virtual IPs: set on a service that has VIPs (in its chain),
/// taken from another service that held one, `Found: false` (nothing
/// written) for a service without any; a bad address or more than 8 are a
/// 400 that changes nothing.
#[test]
fn manual_virtual_ips() {
    let s = Server::dev();
    register_ok(&s, "n1", sidecar("web"));
    register_ok(&s, "n1", sidecar("api"));
    let set = |service: &str, ips: Value| {
        s.put(
            "/v1/internal/service-virtual-ip",
            &json!({"Service": service, "ManualVIPs": ips}).to_string(),
        )
    };
    let r = set("web", json!(["10.1.1.1", "10.1.1.2"]));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"Found": true, "UnassignedFrom": []}));
    let r = set("api", json!(["10.1.1.2"]));
    assert_eq!(
        r.json(),
        json!({"Found": true, "UnassignedFrom": [{"ServiceName": {"Name": "web"}, "Peer": ""}]})
    );
    let chain = s.get_json("/v1/discovery-chain/web");
    assert_eq!(chain["Chain"]["ManualVirtualIPs"], json!(["10.1.1.1"]));
    assert_eq!(chain["Chain"]["AutoVirtualIPs"], json!(["240.0.0.1"]));

    assert_eq!(
        set("nope", json!(["10.1.1.9"])).json(),
        json!({"Found": false, "UnassignedFrom": []})
    );
    let r = set("web", json!(["10.1.1.300"]));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("is not a valid IPv4 address"), "{}", r.body);
    let r = set("web", json!(["::1"]));
    assert_eq!(r.status, 400);
    let nine: Vec<String> = (1..=9).map(|i| format!("10.2.0.{i}")).collect();
    let r = set("web", json!(nine));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("more than 8"), "{}", r.body);
    let r = s.put("/v1/internal/service-virtual-ip", "{");
    assert_eq!(r.status, 400);
    let chain = s.get_json("/v1/discovery-chain/web");
    assert_eq!(chain["Chain"]["ManualVirtualIPs"], json!(["10.1.1.1"]));
}

/// A server restarted from its data dir shows the same addresses, and
/// gives the next service a new one.
#[test]
fn virtual_ips_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::durable("s1", dir.path()).start();
    register_ok(&s, "n1", sidecar("web"));
    register_ok(&s, "n1", sidecar("api"));
    let before = (auto_vips(&s, "web"), auto_vips(&s, "api"));
    s.restart();
    s.wait_for_leader(Duration::from_secs(30));
    assert_eq!((auto_vips(&s, "web"), auto_vips(&s, "api")), before);
    register_ok(&s, "n1", sidecar("db"));
    assert_eq!(auto_vips(&s, "db"), ["240.0.0.3"]);
}

/// `Proxy.Mode` is one of "", direct, transparent, and the outbound port
/// a port, at registration as in central config: a 400 in Consul's words
/// that stores nothing.
#[test]
fn a_bad_mode_or_outbound_port_is_refused() {
    let s = Server::dev();
    let mut bad = sidecar("web");
    bad["Proxy"]["Mode"] = json!("sideways");
    let r = register(&s, "n1", bad);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("Invalid proxy mode"), "{}", r.body);
    let mut bad = sidecar("web");
    bad["Proxy"]["TransparentProxy"] = json!({"OutboundListenerPort": 70000});
    let r = register(&s, "n1", bad);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("OutboundListenerPort"), "{}", r.body);
    assert_eq!(
        s.get_json("/v1/catalog/service/web-sidecar-proxy"),
        json!([])
    );
    assert!(auto_vips(&s, "web").is_empty());
    let r = s.put(
        "/v1/config",
        &json!({"Kind": "service-defaults", "Name": "web",
                "TransparentProxy": {"OutboundListenerPort": -1}})
        .to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.body);
}

/// Under default deny: an anonymous caller reads no chain (403) and no
/// instance (an empty list), sets no manual IP; a token with
/// `service:read` on web reads web's VIPs but cannot set them (one
/// permission short), one with `service:write` can.
#[test]
fn acls_guard_virtual_ips() {
    let s = deny_server();
    let a = s.http_addr;
    for svc in ["web", "api"] {
        let body = json!({"Node": "n1", "Address": "10.0.0.1", "Service": sidecar(svc)});
        as_root(a, "PUT", "/v1/catalog/register", &body);
    }
    let anon = |method: &str, path: &str, body: Option<&str>| with(a, method, path, body, "");
    assert_eq!(anon("GET", "/v1/discovery-chain/web", None).status, 403);
    let r = anon("GET", "/v1/catalog/service/web-sidecar-proxy", None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!([]));
    let manual = json!({"Service": "web", "ManualVIPs": ["10.1.1.1"]}).to_string();
    let r = anon("PUT", "/v1/internal/service-virtual-ip", Some(&manual));
    assert_eq!(r.status, 403, "{}", r.body);

    let (_, reader) = token_with_rules(
        a,
        "web-read",
        "service \"web\" { policy = \"read\" }\n\
         service \"web-sidecar-proxy\" { policy = \"read\" }\n\
         node_prefix \"\" { policy = \"read\" }",
    );
    let chain = with(a, "GET", "/v1/discovery-chain/web", None, &reader).json();
    assert_eq!(chain["Chain"]["AutoVirtualIPs"], json!(["240.0.0.1"]));
    let rows = with(
        a,
        "GET",
        "/v1/catalog/service/web-sidecar-proxy",
        None,
        &reader,
    )
    .json();
    assert_eq!(
        rows[0]["ServiceTaggedAddresses"]["consul-virtual"]["Address"],
        "240.0.0.1"
    );
    assert_eq!(
        with(a, "GET", "/v1/discovery-chain/api", None, &reader).status,
        403
    );
    let r = with(
        a,
        "PUT",
        "/v1/internal/service-virtual-ip",
        Some(&manual),
        &reader,
    );
    assert_eq!(r.status, 403, "{}", r.body);

    let (_, writer) = token_with_rules(a, "web-write", r#"service "web" { policy = "write" }"#);
    let r = with(
        a,
        "PUT",
        "/v1/internal/service-virtual-ip",
        Some(&manual),
        &writer,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let chain = with(a, "GET", "/v1/discovery-chain/web", None, ROOT).json();
    assert_eq!(chain["Chain"]["ManualVirtualIPs"], json!(["10.1.1.1"]));
}

/// A terminating gateway's instance shows the virtual IP of each service
/// its entry links by name as `consul-virtual:<service>` (no port), the
/// address that service's chain names: set when the entry is written
/// (the gateway's row changes, so a blocking read of it returns), kept
/// when the gateway re-registers, changed with the entry's links.
#[test]
fn a_terminating_gateway_shows_its_services_virtual_ips() {
    let s = Server::dev();
    let gateway = json!({"ID": "tg", "Service": "tg", "Kind": "terminating-gateway", "Port": 8443});
    register_ok(&s, "n1", gateway.clone());
    let tags = |s: &Server| -> Value {
        let rows = s.get_json("/v1/catalog/service/tg");
        rows[0]["ServiceTaggedAddresses"].clone()
    };
    assert_eq!(tags(&s), Value::Null, "none before the entry");
    let before = s.get("/v1/catalog/service/tg").index();
    let entry = |services: &[&str]| {
        let e = json!({"Kind": "terminating-gateway", "Name": "tg",
            "Services": services.iter().map(|n| json!({"Name": n})).collect::<Vec<_>>()});
        assert_eq!(s.put("/v1/config", &e.to_string()).status, 200);
    };
    entry(&["billing", "ledger"]);
    let woken = s.get(&format!("/v1/catalog/service/tg?index={before}&wait=5s"));
    assert!(woken.index() > before, "the gateway's row changed");
    let billing = auto_vips(&s, "billing");
    assert_eq!(billing.len(), 1);
    let want = json!({
        "consul-virtual:billing": {"Address": billing[0], "Port": 0},
        "consul-virtual:ledger": {"Address": auto_vips(&s, "ledger")[0], "Port": 0},
    });
    assert_eq!(tags(&s), want);
    register_ok(&s, "n1", gateway);
    assert_eq!(tags(&s), want, "kept when the gateway registers again");
    entry(&["ledger"]);
    assert_eq!(
        tags(&s),
        json!({"consul-virtual:ledger": want["consul-virtual:ledger"]})
    );
}
