//! `GET /v1/internal/proxycfg/:id` end to end against a real server: a
//! registered proxy's snapshot carries its upstream's chain and healthy
//! endpoints (the upstream's sidecars, never its application port), a blocking read wakes within a second of a splitter, a failing
//! check or a new instance, and deregistering tears every watch down.

mod common;

use std::time::{Duration, Instant};

use common::{Resp, Server};
use serde_json::{Value, json};

const DB: &str = "db.default.default.dc1";

fn register(s: &Server, body: Value) {
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "register {body}: {}", r.body);
}

/// A `db` instance on its application port and its sidecar proxy on
/// `SIDECAR_PORT` (with the parent's meta, as an agent copies it), both
/// with a check in `status`.
fn db_instance(s: &Server, node: &str, id: &str, version: &str, status: &str) {
    register(
        s,
        json!({"Node": node, "Address": "10.0.0.1",
               "Service": {"ID": id, "Service": "db", "Port": 5432, "Meta": {"version": version}},
               "Check": {"CheckID": format!("{id}-alive"), "Name": "alive", "ServiceID": id,
                         "Status": status}}),
    );
    let proxy = format!("{id}-sidecar-proxy");
    register(
        s,
        json!({"Node": node, "Address": "10.0.0.1",
               "Service": {"ID": proxy, "Service": "db-sidecar-proxy", "Kind": "connect-proxy",
                           "Port": SIDECAR_PORT, "Meta": {"version": version},
                           "Proxy": {"DestinationServiceName": "db", "DestinationServiceID": id,
                                     "LocalServicePort": 5432}},
               "Check": {"CheckID": format!("{proxy}-alive"), "Name": "alive",
                         "ServiceID": proxy, "Status": status}}),
    );
}

const SIDECAR_PORT: u16 = 21001;

/// `web`'s sidecar on node n2, with `db` as its upstream.
fn web_proxy(s: &Server) {
    register(
        s,
        json!({"Node": "n2", "Address": "10.0.0.2",
               "Service": {"ID": "web-proxy", "Service": "web-proxy", "Kind": "connect-proxy",
                           "Port": 21000, "Proxy": {"DestinationServiceName": "web",
                           "Upstreams": [{"DestinationName": "db", "LocalBindPort": 9191}]}}}),
    );
}

/// The service IDs of a target's endpoints; every endpoint must be a
/// sidecar on its proxy port, never the application's own port.
fn endpoint_ids(snap: &Value, target: &str) -> Vec<String> {
    snap["Upstreams"]["db"]["Endpoints"][target]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    assert_eq!(r["Service"]["Kind"], "connect-proxy", "{r}");
                    assert_eq!(r["Service"]["Port"], SIDECAR_PORT, "{r}");
                    r["Service"]["ID"].as_str().unwrap().to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A blocking read past `index`, which must answer within one second of
/// `change` and satisfy `pred`.
fn after_change(
    s: &Server, index: u64, change: impl FnOnce(), pred: impl Fn(&Value) -> bool,
) -> Resp {
    let addr = s.http_addr;
    let path = format!("/v1/internal/proxycfg/web-proxy?node=n2&index={index}&wait=20s");
    let waiting = std::thread::spawn(move || common::request(addr, "GET", &path, None));
    s.wait_parked(1);
    let t = Instant::now();
    change();
    let mut r = waiting.join().unwrap();
    // Several commits may be needed (a splitter needs its resolver); follow
    // the versions until the snapshot shows the whole change.
    while !pred(&r.json()) {
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "not within 1 s: {}",
            r.body
        );
        r = s.get(&format!(
            "/v1/internal/proxycfg/web-proxy?node=n2&index={}&wait=2s",
            r.index()
        ));
    }
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "updated after {:?}",
        t.elapsed()
    );
    assert!(r.index() > index, "version {} after {index}", r.index());
    r
}

fn gauge(s: &Server, name: &str) -> u64 {
    s.metric(name) as u64
}

#[test]
fn a_proxy_snapshot_follows_its_upstream_and_is_torn_down() {
    let s = Server::dev();
    db_instance(&s, "n1", "db1", "v1", "passing");
    web_proxy(&s);
    let r = s.get("/v1/internal/proxycfg/web-proxy?node=n2");
    assert_eq!(r.status, 200, "{}", r.body);
    let snap = r.json();
    assert_eq!(
        snap["ProxyID"],
        json!({"Node": "n2", "ServiceID": "web-proxy"})
    );
    assert_eq!(snap["Service"]["Proxy"]["DestinationServiceName"], "web");
    assert_eq!(snap["Upstreams"]["db"]["Chain"]["ServiceName"], "db");
    assert_eq!(endpoint_ids(&snap, DB), ["db1-sidecar-proxy"]);
    assert_eq!(snap["Version"].as_u64(), Some(r.index()));

    // A new instance.
    let r = after_change(
        &s,
        r.index(),
        || db_instance(&s, "n3", "db2", "v2", "passing"),
        |snap| endpoint_ids(snap, DB) == ["db1-sidecar-proxy", "db2-sidecar-proxy"],
    );
    // A failing check.
    let r = after_change(
        &s,
        r.index(),
        || db_instance(&s, "n1", "db1", "v1", "critical"),
        |snap| endpoint_ids(snap, DB) == ["db2-sidecar-proxy"],
    );
    // A splitter (with the protocol and subsets it needs).
    let r = after_change(
        &s,
        r.index(),
        || {
            for entry in [
                json!({"Kind": "service-defaults", "Name": "db", "Protocol": "http"}),
                json!({"Kind": "service-resolver", "Name": "db", "Subsets": {
                    "v1": {"Filter": "Service.Meta.version == v1"},
                    "v2": {"Filter": "Service.Meta.version == v2"}}}),
                json!({"Kind": "service-splitter", "Name": "db", "Splits": [
                    {"Weight": 50, "ServiceSubset": "v1"}, {"Weight": 50, "ServiceSubset": "v2"}]}),
            ] {
                let w = s.put("/v1/config", &entry.to_string());
                assert_eq!(w.status, 200, "{}", w.body);
            }
        },
        |snap| {
            snap["Upstreams"]["db"]["Chain"]["StartNode"]
                .as_str()
                .is_some_and(|n| n.starts_with("splitter:"))
        },
    );
    let snap = r.json();
    assert_eq!(
        endpoint_ids(&snap, "v2.db.default.default.dc1"),
        ["db2-sidecar-proxy"]
    );
    assert!(endpoint_ids(&snap, "v1.db.default.default.dc1").is_empty());
    // web's proxy and db's two sidecars.
    assert_eq!(gauge(&s, "cairn_proxycfg_proxies"), 3);
    assert!(gauge(&s, "cairn_proxycfg_watches") > 0);

    // Deregistering the proxy: the blocking reader is told, and no watch
    // is left behind.
    let addr = s.http_addr;
    let path = format!(
        "/v1/internal/proxycfg/web-proxy?node=n2&index={}&wait=20s",
        r.index()
    );
    let waiting = std::thread::spawn(move || common::request(addr, "GET", &path, None));
    s.wait_parked(1);
    let d = s.put(
        "/v1/catalog/deregister",
        &json!({"Node": "n2", "ServiceID": "web-proxy"}).to_string(),
    );
    assert_eq!(d.status, 200);
    assert_eq!(waiting.join().unwrap().status, 404);
    for (node, id) in [("n1", "db1-sidecar-proxy"), ("n3", "db2-sidecar-proxy")] {
        let d = s.put(
            "/v1/catalog/deregister",
            &json!({"Node": node, "ServiceID": id}).to_string(),
        );
        assert_eq!(d.status, 200);
    }
    common::eventually(Duration::from_secs(10), "every watch dropped", || {
        (gauge(&s, "cairn_proxycfg_proxies") == 0 && gauge(&s, "cairn_proxycfg_watches") == 0)
            .then_some(())
    });
    assert_eq!(
        s.get("/v1/internal/proxycfg/web-proxy?node=n2&wait=100ms")
            .status,
        404
    );
}

/// A subset filter naming a selector the health rows lack is accepted (as
/// Consul checks only its syntax) and leaves that subset empty, never a 500.
#[test]
fn a_subset_filter_with_an_unknown_selector_matches_nothing() {
    let s = Server::dev();
    db_instance(&s, "n1", "db1", "v1", "passing");
    web_proxy(&s);
    let resolver = json!({"Kind": "service-resolver", "Name": "db", "DefaultSubset": "prod",
        "Subsets": {"prod": {"Filter": "ServiceMeta.env == prod"},
                    "v1": {"Filter": "Service.Meta.version == v1"}}});
    let w = s.put("/v1/config", &resolver.to_string());
    assert_eq!(w.status, 200, "{}", w.body);
    let chain = s.get("/v1/discovery-chain/db");
    assert_eq!(chain.status, 200, "{}", chain.body);
    common::eventually(
        Duration::from_secs(10),
        "the resolver in the snapshot",
        || {
            let r = s.get("/v1/internal/proxycfg/web-proxy?node=n2");
            assert_eq!(r.status, 200, "{}", r.body);
            let snap = r.json();
            snap["Upstreams"]["db"]["Endpoints"]
                .get("prod.db.default.default.dc1")
                .is_some()
                .then_some(snap)
        },
    );
    let snap = s.get("/v1/internal/proxycfg/web-proxy?node=n2").json();
    assert!(endpoint_ids(&snap, "prod.db.default.default.dc1").is_empty());

    // A well-formed subset of the same resolver still selects.
    let resolver = json!({"Kind": "service-resolver", "Name": "db", "DefaultSubset": "v1",
        "Subsets": {"prod": {"Filter": "ServiceMeta.env == prod"},
                    "v1": {"Filter": "Service.Meta.version == v1"}}});
    let w = s.put("/v1/config", &resolver.to_string());
    assert_eq!(w.status, 200, "{}", w.body);
    common::eventually(Duration::from_secs(10), "the v1 subset's sidecar", || {
        let snap = s.get("/v1/internal/proxycfg/web-proxy?node=n2").json();
        (endpoint_ids(&snap, "v1.db.default.default.dc1") == ["db1-sidecar-proxy"]).then_some(())
    });
}

#[test]
fn bad_proxycfg_requests() {
    let s = Server::dev();
    let r = s.get("/v1/internal/proxycfg/web-proxy");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("node"), "{}", r.body);
    let r = s.get("/v1/internal/proxycfg/nope?node=n1&wait=100ms");
    assert_eq!(r.status, 404, "{}", r.body);
    let r = s.get("/v1/internal/proxycfg/nope?node=n1&index=x");
    assert_eq!(r.status, 400, "{}", r.body);
}
