//! Cross-datacenter failover in the mesh with real processes: dc1 (the
//! primary) and dc2 joined with `--join-wan`; a dc1 sidecar whose upstream
//! `api` fails over (or is redirected) to dc2 gets, in its server-side
//! proxycfg snapshot (what its xDS endpoints are built from), the healthy
//! sidecars of `api` in dc2 at their own addresses, kept live by one
//! watcher per target, and kept when dc2 goes out of reach.

mod common;

use std::time::Duration;

use common::{Server, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const LOCAL: &str = "api.default.default.dc1";
const REMOTE: &str = "api.default.default.dc2";

fn register(s: &Server, body: Value) {
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "register {body}: {}", r.body);
}

/// An `api` instance and its sidecar on `port` at `addr`, both with a
/// check in `status`.
fn api_instance(s: &Server, node: &str, addr: &str, port: u16, status: &str) {
    let id = format!("api-{node}");
    register(
        s,
        json!({"Node": node, "Address": addr,
               "Service": {"ID": id, "Service": "api", "Port": 8080},
               "Check": {"CheckID": format!("{id}-alive"), "Name": "alive", "ServiceID": id,
                         "Status": status}}),
    );
    let proxy = format!("{id}-sidecar-proxy");
    register(
        s,
        json!({"Node": node, "Address": addr,
               "Service": {"ID": proxy, "Service": "api-sidecar-proxy", "Kind": "connect-proxy",
                           "Port": port,
                           "Proxy": {"DestinationServiceName": "api", "DestinationServiceID": id,
                                     "LocalServicePort": 8080}},
               "Check": {"CheckID": format!("{proxy}-alive"), "Name": "alive",
                         "ServiceID": proxy, "Status": status}}),
    );
}

/// `web`'s sidecar `id` on node n9 in dc1, with `api` as its upstream.
fn web_proxy(s: &Server, id: &str) {
    register(
        s,
        json!({"Node": "n9", "Address": "10.1.0.9",
               "Service": {"ID": id, "Service": "web-sidecar-proxy", "Kind": "connect-proxy",
                           "Port": 21000, "Proxy": {"DestinationServiceName": "web",
                           "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9191}]}}}),
    );
}

fn snapshot(s: &Server, id: &str) -> Value {
    let r = s.get(&format!("/v1/internal/proxycfg/{id}?node=n9"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// A target's endpoints in the snapshot as `address:port` (None: the
/// target has no endpoint list at all).
fn endpoints(snap: &Value, target: &str) -> Option<Vec<String>> {
    let rows = snap["Upstreams"]["api"]["Endpoints"]
        .get(target)?
        .as_array()?;
    let mut out: Vec<String> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["Service"]["Kind"], "connect-proxy", "{r}");
            let addr = r["Service"]["Address"]
                .as_str()
                .filter(|a| !a.is_empty())
                .or(r["Node"]["Address"].as_str())
                .unwrap();
            format!("{addr}:{}", r["Service"]["Port"])
        })
        .collect();
    out.sort();
    Some(out)
}

/// Waits until proxy `id`'s endpoints for `target` are `want`.
fn wait_endpoints(s: &Server, id: &str, target: &str, want: &[&str]) -> Value {
    eventually(
        WAIT,
        &format!("{id}'s {target} endpoints to be {want:?}"),
        || {
            let snap = snapshot(s, id);
            (endpoints(&snap, target).as_deref()
                == Some(&want.iter().map(|w| w.to_string()).collect::<Vec<_>>()[..]))
            .then_some(snap)
        },
    )
}

fn config(s: &Server, entry: Value) {
    let r = s.put("/v1/config", &entry.to_string());
    assert_eq!((r.status, r.body.trim()), (200, "true"), "{entry}");
}

fn remote_watchers(s: &Server) -> f64 {
    s.metric("cairn_proxycfg_remote_watchers")
}

/// Failover to dc2 when dc1's instances go critical and back when they
/// recover; dc2's instance changes reach dc1's proxy; one watcher serves
/// every proxy and stops with the last; a redirect gives dc2's directly;
/// dc2 out of reach leaves its last endpoints in place.
#[test]
fn a_resolver_fails_over_to_another_datacenters_instances() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dc2 = Server::durable("b0", tmp.path().join("b0"))
        .datacenter("dc2")
        .primary("dc1")
        .start();
    let join = dc2.raft_addr.to_string();
    let dc1 = Server::durable("a0", tmp.path().join("a0"))
        .datacenter("dc1")
        .join_wan(&join)
        .start();
    eventually(WAIT, "dc1 to know dc2", || {
        let v = dc1.get_json("/v1/catalog/datacenters");
        (v == json!(["dc1", "dc2"])).then_some(())
    });

    api_instance(&dc1, "n1", "10.1.0.1", 21001, "passing");
    api_instance(&dc2, "far1", "10.2.0.1", 22001, "passing");
    api_instance(&dc2, "far2", "10.2.0.2", 22002, "passing");
    config(
        &dc1,
        json!({"Kind": "service-resolver", "Name": "api",
               "Failover": {"*": {"Datacenters": ["dc2"]}}}),
    );
    web_proxy(&dc1, "web-proxy");

    // dc1's own sidecar first; dc2's, at their addresses, as the failover
    // tier (what the xDS endpoints put at the next priority).
    wait_endpoints(&dc1, "web-proxy", LOCAL, &["10.1.0.1:21001"]);
    wait_endpoints(
        &dc1,
        "web-proxy",
        REMOTE,
        &["10.2.0.1:22001", "10.2.0.2:22002"],
    );
    assert_eq!(remote_watchers(&dc1), 1.0);

    // dc1's api goes critical: only dc2's remain, so traffic moves there.
    api_instance(&dc1, "n1", "10.1.0.1", 21001, "critical");
    let snap = wait_endpoints(&dc1, "web-proxy", LOCAL, &[]);
    assert_eq!(
        endpoints(&snap, REMOTE).unwrap(),
        ["10.2.0.1:22001", "10.2.0.2:22002"]
    );
    // And back when it recovers.
    api_instance(&dc1, "n1", "10.1.0.1", 21001, "passing");
    wait_endpoints(&dc1, "web-proxy", LOCAL, &["10.1.0.1:21001"]);

    // An instance of dc2 going critical there leaves dc1's proxy.
    api_instance(&dc2, "far2", "10.2.0.2", 22002, "critical");
    wait_endpoints(&dc1, "web-proxy", REMOTE, &["10.2.0.1:22001"]);
    api_instance(&dc2, "far2", "10.2.0.2", 22002, "passing");
    wait_endpoints(
        &dc1,
        "web-proxy",
        REMOTE,
        &["10.2.0.1:22001", "10.2.0.2:22002"],
    );

    // A second proxy with the same upstream shares the one watcher.
    web_proxy(&dc1, "web-proxy-2");
    wait_endpoints(
        &dc1,
        "web-proxy-2",
        REMOTE,
        &["10.2.0.1:22001", "10.2.0.2:22002"],
    );
    assert_eq!(remote_watchers(&dc1), 1.0);

    // A redirect to dc2: dc2's instances directly, no dc1 target.
    config(
        &dc1,
        json!({"Kind": "service-resolver", "Name": "api",
               "Redirect": {"Datacenter": "dc2"}}),
    );
    let snap = eventually(WAIT, "the redirect to reach the snapshot", || {
        let snap = snapshot(&dc1, "web-proxy");
        (endpoints(&snap, LOCAL).is_none()).then_some(snap)
    });
    assert_eq!(
        endpoints(&snap, REMOTE).unwrap(),
        ["10.2.0.1:22001", "10.2.0.2:22002"],
        "{snap}"
    );
    let targets: Vec<&String> = snap["Upstreams"]["api"]["Chain"]["Targets"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(targets, [REMOTE]);

    // dc2 out of reach: its last endpoints stay (Consul serves its cache),
    // and the failing reads are logged.
    dc2.stop(WAIT);
    eventually(WAIT, "the unreachable datacenter to be logged", || {
        dc1.log()
            .contains("could not read the instances of another datacenter")
            .then_some(())
    });
    let snap = snapshot(&dc1, "web-proxy");
    assert_eq!(
        endpoints(&snap, REMOTE).unwrap(),
        ["10.2.0.1:22001", "10.2.0.2:22002"]
    );

    // The last proxy reading it gone, the watcher stops.
    for id in ["web-proxy", "web-proxy-2"] {
        let r = dc1.put(
            "/v1/catalog/deregister",
            &json!({"Node": "n9", "ServiceID": id}).to_string(),
        );
        assert_eq!(r.status, 200);
    }
    eventually(WAIT, "the remote watcher to stop", || {
        (remote_watchers(&dc1) == 0.0).then_some(())
    });
}
