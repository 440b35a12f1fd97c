//! The catalog and health HTTP API against a real `cairn server --dev`:
//! registration semantics, health filters, blocking queries, consistency
//! modes, bad input, and `?filter`.

mod common;

use std::time::{Duration, Instant};

use common::{Server, enc};
use serde_json::{Value, json};

fn register(s: &Server, body: Value) {
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "register {body}: {}", r.body);
    assert_eq!(r.body.trim(), "true");
}

fn deregister(s: &Server, body: Value) {
    let r = s.put("/v1/catalog/deregister", &body.to_string());
    assert_eq!(r.status, 200, "deregister {body}: {}", r.body);
}

/// web on n1 (passing, tags primary+v1), web on n2 (node check critical,
/// tag v1), db on n2; n1 has meta rack=r1.
fn seed(s: &Server) {
    register(
        s,
        json!({
            "Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"rack": "r1"},
            "Service": {"ID": "web1", "Service": "web", "Port": 80, "Tags": ["primary", "v1"],
                        "Meta": {"version": "1"}},
            "Check": {"CheckID": "web1-alive", "Name": "alive", "ServiceID": "web1", "Status": "passing"},
        }),
    );
    register(
        s,
        json!({
            "Node": "n2", "Address": "10.0.0.2", "NodeMeta": {"rack": "r2"},
            "Service": {"ID": "web2", "Service": "web", "Port": 8080, "Tags": ["v1"]},
            "Checks": [
                {"CheckID": "serfHealth", "Name": "Serf", "Status": "critical"},
                {"CheckID": "web2-alive", "Name": "alive", "ServiceID": "web2", "Status": "passing"},
            ],
        }),
    );
    register(
        s,
        json!({
            "Node": "n2", "Address": "10.0.0.2", "NodeMeta": {"rack": "r2"},
            "Service": {"ID": "db", "Service": "db", "Port": 5432, "Tags": ["v1", "pg"]},
        }),
    );
}

/// The dev server's own node, in the catalog from its start with its
/// `serfHealth` and the `consul` service, as a Consul server's.
const OWN: &str = "self";

/// A dev server whose own node and `consul` service are in the catalog
/// already, so that what a test writes is all that changes after.
fn settled() -> Server {
    let s = Server::builder().dev().node(OWN).start();
    s.settle();
    s
}

/// A catalog or health answer without the server's own node and service:
/// what the test wrote.
fn theirs(mut v: Value) -> Value {
    match &mut v {
        Value::Array(rows) => rows.retain(|r| r["Node"] != OWN),
        Value::Object(services) => {
            services.remove("consul");
        }
        _ => {}
    }
    v
}

fn names(v: &Value, field: &str) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            field
                .split('.')
                .fold(r, |v, f| &v[f])
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn catalog_reads_have_consul_shapes() {
    let s = settled();
    seed(&s);

    let nodes = theirs(s.get_json("/v1/catalog/nodes"));
    assert_eq!(names(&nodes, "Node"), ["n1", "n2"]);
    let n1 = &nodes[0];
    for k in
        "ID Node Address Datacenter TaggedAddresses Meta CreateIndex ModifyIndex".split_whitespace()
    {
        assert!(n1.get(k).is_some(), "node lacks {k}: {n1}");
    }
    assert_eq!(n1["Datacenter"], "dc1");
    assert_eq!(n1["Meta"]["rack"], "r1");

    let services = s.get_json("/v1/catalog/services");
    assert_eq!(services["consul"], json!([]));
    assert_eq!(
        theirs(services),
        json!({"db": ["pg", "v1"], "web": ["primary", "v1"]})
    );

    let r = s.get("/v1/catalog/service/web");
    assert_eq!(r.status, 200);
    assert!(r.index() >= 1);
    assert_eq!(r.header("x-consul-knownleader"), Some("true"));
    assert!(r.header("x-consul-lastcontact").is_some());
    let rows = r.json();
    assert_eq!(names(&rows, "ServiceID"), ["web1", "web2"]);
    let row = &rows[0];
    assert_eq!(row["Node"], "n1");
    assert_eq!(row["Address"], "10.0.0.1");
    assert_eq!(row["ServiceName"], "web");
    assert_eq!(row["ServicePort"], 80);
    assert_eq!(row["ServiceTags"], json!(["primary", "v1"]));
    assert_eq!(row["ServiceMeta"], json!({"version": "1"}));
    assert_eq!(row["NodeMeta"], json!({"rack": "r1"}));
    assert_eq!(row["ServiceWeights"], json!({"Passing": 1, "Warning": 1}));
    assert_eq!(row["ServiceKind"], "");
    assert_eq!(row["ServiceEnableTagOverride"], false);
    assert!(row["ServiceProxy"].is_object() && row["ServiceConnect"].is_object());
    assert!(row["CreateIndex"].as_u64().unwrap() > 0);

    // ?tag: all given tags must match.
    let rows = s.get_json("/v1/catalog/service/web?tag=v1&tag=primary");
    assert_eq!(names(&rows, "ServiceID"), ["web1"]);
    let rows = s.get_json("/v1/catalog/service/web?node-meta=rack:r2");
    assert_eq!(names(&rows, "ServiceID"), ["web2"]);
    assert_eq!(s.get_json("/v1/catalog/service/nope"), json!([]));

    let node = s.get_json("/v1/catalog/node/n2");
    assert_eq!(node["Node"]["Node"], "n2");
    let mut ids: Vec<&String> = node["Services"].as_object().unwrap().keys().collect();
    ids.sort();
    assert_eq!(ids, ["db", "web2"]);
    assert_eq!(node["Services"]["db"]["Port"], 5432);
    assert_eq!(s.get_json("/v1/catalog/node/unknown"), Value::Null);

    let list = s.get_json("/v1/catalog/node-services/n2");
    assert_eq!(list["Node"]["Address"], "10.0.0.2");
    assert_eq!(names(&list["Services"], "ID"), ["db", "web2"]);
    assert_eq!(
        s.get_json("/v1/catalog/node-services/unknown"),
        json!({"Node": null, "Services": []})
    );
}

#[test]
fn unicode_names_round_trip() {
    let s = Server::dev();
    register(
        &s,
        json!({
            "Node": "узел-1", "Address": "10.0.0.9",
            "Service": {"Service": "wéb-服务", "Port": 1, "Tags": ["ünï"]},
        }),
    );
    let rows = s.get_json(&format!("/v1/catalog/service/{}", enc("wéb-服务")));
    assert_eq!(rows[0]["Node"], "узел-1");
    assert_eq!(rows[0]["ServiceTags"], json!(["ünï"]));
    let node = s.get_json(&format!("/v1/catalog/node/{}", enc("узел-1")));
    assert!(node["Services"].get("wéb-服务").is_some());
    let health = s.get_json(&format!("/v1/health/service/{}", enc("wéb-服务")));
    assert_eq!(health[0]["Node"]["Node"], "узел-1");
}

#[test]
fn deregister_removes_what_it_owns() {
    let s = settled();
    seed(&s);

    // A service takes its checks with it, not the node's.
    deregister(&s, json!({"Node": "n2", "ServiceID": "web2"}));
    let checks = s.get_json("/v1/health/node/n2");
    assert_eq!(names(&checks, "CheckID"), ["serfHealth"]);
    assert_eq!(
        names(&s.get_json("/v1/catalog/service/web"), "Node"),
        ["n1"]
    );

    // A check alone.
    deregister(&s, json!({"Node": "n2", "CheckID": "serfHealth"}));
    assert_eq!(s.get_json("/v1/health/node/n2"), json!([]));
    assert_eq!(
        names(
            &s.get_json("/v1/catalog/node-services/n2")["Services"],
            "ID"
        ),
        ["db"]
    );

    // A node takes everything.
    deregister(&s, json!({"Node": "n1"}));
    assert_eq!(
        names(&theirs(s.get_json("/v1/catalog/nodes")), "Node"),
        ["n2"]
    );
    assert_eq!(s.get_json("/v1/catalog/service/web"), json!([]));
    assert_eq!(s.get_json("/v1/health/node/n1"), json!([]));
    assert_eq!(s.get_json("/v1/health/checks/web"), json!([]));
    assert_eq!(
        theirs(s.get_json("/v1/catalog/services")),
        json!({"db": ["pg", "v1"]})
    );

    // Deregistering what does not exist is not an error.
    deregister(&s, json!({"Node": "ghost"}));
    let r = s.put("/v1/catalog/deregister", r#"{"ServiceID": "x"}"#);
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn skip_node_update_keeps_the_node() {
    let s = Server::dev();
    register(
        &s,
        json!({"Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"k": "v"}}),
    );
    register(
        &s,
        json!({"Node": "n1", "SkipNodeUpdate": true, "Service": {"Service": "api", "Port": 9}}),
    );
    let node = s.get_json("/v1/catalog/node/n1");
    assert_eq!(node["Node"]["Address"], "10.0.0.1");
    assert_eq!(node["Node"]["Meta"], json!({"k": "v"}));
    assert_eq!(node["Services"]["api"]["Port"], 9);
    // Without the node there is nothing to skip to.
    let r = s.put(
        "/v1/catalog/register",
        r#"{"Node": "ghost", "SkipNodeUpdate": true}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn health_endpoints_and_filters() {
    let s = settled();
    seed(&s);

    let all = s.get_json("/v1/health/service/web");
    assert_eq!(names(&all, "Node.Node"), ["n1", "n2"]);
    let row = &all[1];
    assert_eq!(row["Service"]["ID"], "web2");
    // Instance health = node checks + its own checks, not other services'.
    let mut check_ids = names(&row["Checks"], "CheckID");
    check_ids.sort();
    assert_eq!(check_ids, ["serfHealth", "web2-alive"]);
    assert_eq!(row["Node"]["Meta"], json!({"rack": "r2"}));

    // ?passing drops n2 (its node check is critical).
    let passing = s.get_json("/v1/health/service/web?passing");
    assert_eq!(names(&passing, "Node.Node"), ["n1"]);
    assert_eq!(
        names(
            &s.get_json("/v1/health/service/web?passing=false"),
            "Node.Node"
        ),
        ["n1", "n2"]
    );
    assert_eq!(s.get("/v1/health/service/web?passing=perhaps").status, 400);

    // ?tag (all must match), ?node-meta, ?near ignored.
    assert_eq!(
        names(&s.get_json("/v1/health/service/web?tag=v1"), "Node.Node"),
        ["n1", "n2"]
    );
    assert_eq!(
        names(
            &s.get_json("/v1/health/service/web?tag=v1&tag=primary"),
            "Node.Node"
        ),
        ["n1"]
    );
    assert_eq!(
        s.get_json("/v1/health/service/web?tag=v1&tag=nope"),
        json!([])
    );
    assert_eq!(
        names(
            &s.get_json("/v1/health/service/web?node-meta=rack:r2&near=_agent"),
            "Node.Node"
        ),
        ["n2"]
    );

    // Checks of a service's instances only (no node checks).
    let mut ids = names(&s.get_json("/v1/health/checks/web"), "CheckID");
    ids.sort();
    assert_eq!(ids, ["web1-alive", "web2-alive"]);
    assert_eq!(
        names(&s.get_json("/v1/health/node/n2"), "CheckID"),
        ["serfHealth", "web2-alive"]
    );

    // By state.
    assert_eq!(
        names(&s.get_json("/v1/health/state/critical"), "CheckID"),
        ["serfHealth"]
    );
    assert_eq!(
        theirs(s.get_json("/v1/health/state/any"))
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(s.get_json("/v1/health/state/warning"), json!([]));
    assert_eq!(
        s.get_json("/v1/health/state/passing?node-meta=rack:r1")
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let r = s.get("/v1/health/state/bogus");
    assert_eq!(r.status, 400);
    assert!(r.body.contains("bogus"), "{}", r.body);

    // A check turning critical makes the instance fail ?passing.
    register(
        &s,
        json!({"Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"rack": "r1"},
               "Check": {"CheckID": "web1-alive", "Name": "alive", "ServiceID": "web1", "Status": "warning"}}),
    );
    assert_eq!(s.get_json("/v1/health/service/web?passing"), json!([]));
}

#[test]
fn connect_endpoints_list_proxies() {
    let s = Server::dev();
    seed(&s);
    register(
        &s,
        json!({
            "Node": "n1", "Address": "10.0.0.1",
            "Service": {"Kind": "connect-proxy", "ID": "web1-proxy", "Service": "web-sidecar-proxy",
                        "Port": 21000, "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web1"}},
        }),
    );
    let rows = s.get_json("/v1/catalog/connect/web");
    assert_eq!(names(&rows, "ServiceID"), ["web1-proxy"]);
    assert_eq!(rows[0]["ServiceKind"], "connect-proxy");
    assert_eq!(rows[0]["ServiceProxy"]["DestinationServiceName"], "web");
    let health = s.get_json("/v1/health/connect/web");
    assert_eq!(names(&health, "Service.ID"), ["web1-proxy"]);
    assert_eq!(health[0]["Service"]["Kind"], "connect-proxy");
    assert_eq!(s.get_json("/v1/catalog/connect/db"), json!([]));
}

/// Starts a blocking query in a thread; returns how long it took and what
/// it answered.
fn block_on(s: &Server, path: String) -> std::thread::JoinHandle<(Duration, common::Resp)> {
    let addr = s.http_addr;
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = common::request(addr, "GET", &path, None);
        (t.elapsed(), r)
    })
}

#[test]
fn blocking_queries_wake_only_on_their_own_changes() {
    let s = Server::dev();
    seed(&s);
    let endpoints = [
        "/v1/health/service/web",
        "/v1/catalog/service/web",
        "/v1/health/checks/web",
        "/v1/catalog/node/n1",
        "/v1/health/node/n1",
    ];
    let indexes: Vec<u64> = endpoints.iter().map(|e| s.get(e).index()).collect();

    // Unrelated: a new service on another node, and a KV write.
    let waiting: Vec<_> = endpoints
        .iter()
        .zip(&indexes)
        .map(|(e, i)| block_on(&s, format!("{e}?index={i}&wait=1500ms")))
        .collect();
    s.wait_parked(endpoints.len() as u64);
    register(
        &s,
        json!({"Node": "n3", "Address": "10.0.0.3", "Service": {"Service": "cache", "Port": 6379}}),
    );
    assert_eq!(s.put("/v1/kv/some/key", "x").status, 200);
    for (w, e) in waiting.into_iter().zip(endpoints) {
        let (took, r) = w.join().unwrap();
        assert!(
            took >= Duration::from_millis(1400),
            "{e} woke after {took:?} on an unrelated change"
        );
        assert_eq!(r.status, 200);
    }
    for (e, i) in endpoints.iter().zip(&indexes) {
        assert_eq!(
            s.get(e).index(),
            *i,
            "{e} index moved on an unrelated change"
        );
    }

    // Related: a new web instance on n1 wakes every one of them.
    let waiting: Vec<_> = endpoints
        .iter()
        .zip(&indexes)
        .map(|(e, i)| block_on(&s, format!("{e}?index={i}&wait=20s")))
        .collect();
    s.wait_parked(endpoints.len() as u64);
    register(
        &s,
        json!({
            "Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"rack": "r1"},
            "Service": {"ID": "web1b", "Service": "web", "Port": 81},
            "Check": {"CheckID": "web1b-alive", "Name": "alive", "ServiceID": "web1b", "Status": "passing"},
        }),
    );
    for ((w, e), i) in waiting.into_iter().zip(endpoints).zip(&indexes) {
        let (took, r) = w.join().unwrap();
        assert!(
            took < Duration::from_secs(10),
            "{e} did not wake ({took:?})"
        );
        assert!(r.index() > *i, "{e}: index {} not past {i}", r.index());
    }
    let rows = s.get_json("/v1/health/service/web");
    assert_eq!(rows.as_array().unwrap().len(), 3);

    // Catalog-wide lists wake on their tables.
    let i = s.get("/v1/catalog/services").index();
    let w = block_on(&s, format!("/v1/catalog/services?index={i}&wait=20s"));
    s.wait_parked(1);
    register(
        &s,
        json!({"Node": "n4", "Address": "10.0.0.4", "Service": {"Service": "queue"}}),
    );
    let (took, r) = w.join().unwrap();
    assert!(took < Duration::from_secs(10));
    assert!(r.json().get("queue").is_some());

    let i = s.get("/v1/health/state/any").index();
    let w = block_on(&s, format!("/v1/health/state/critical?index={i}&wait=20s"));
    s.wait_parked(1);
    register(
        &s,
        json!({"Node": "n4", "Address": "10.0.0.4", "Check": {"Name": "disk", "Status": "critical"}}),
    );
    let (took, r) = w.join().unwrap();
    assert!(took < Duration::from_secs(10));
    assert_eq!(r.json().as_array().unwrap().len(), 2);

    // Deregistration wakes too.
    let i = s.get("/v1/catalog/nodes").index();
    let w = block_on(&s, format!("/v1/catalog/nodes?index={i}&wait=20s"));
    s.wait_parked(1);
    deregister(&s, json!({"Node": "n4"}));
    let (took, r) = w.join().unwrap();
    assert!(took < Duration::from_secs(10));
    assert!(!names(&r.json(), "Node").contains(&"n4".to_string()));
}

#[test]
fn consistency_modes_and_dc() {
    let s = Server::dev();
    seed(&s);
    for q in ["", "?stale", "?consistent", "?stale=", "?consistent=true"] {
        let r = s.get(&format!("/v1/health/service/web{q}"));
        assert_eq!(r.status, 200, "{q}: {}", r.body);
        assert_eq!(r.json().as_array().unwrap().len(), 2, "{q}");
        assert_eq!(r.header("x-consul-knownleader"), Some("true"));
        assert!(r.index() > 1);
    }
    assert_eq!(s.get("/v1/catalog/nodes?stale&consistent").status, 400);
    assert_eq!(s.get("/v1/catalog/nodes?dc=dc1").status, 200);
    // A datacenter this server has no path to: Consul's 500 and words.
    let r = s.get("/v1/catalog/nodes?dc=elsewhere");
    assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
    // Unknown parameters are ignored.
    assert_eq!(s.get("/v1/catalog/nodes?whatever=1&x").status, 200);
    assert_eq!(s.get("/v1/catalog/service/web?index=abc").status, 400);
}

#[test]
fn bad_input_is_400_and_stores_nothing() {
    let s = settled();
    let before = s.get("/v1/catalog/nodes").index();
    let cases: &[(&str, &str)] = &[
        (r#"{"Address": "10.0.0.1"}"#, "node"),
        (r#"{"Node": "n1"}"#, "address"),
        (
            r#"{"Node": "n1", "Address": "a", "Check": {"Name": "c", "Status": "bogus"}}"#,
            "bogus",
        ),
        (
            r#"{"Node": "n1", "Address": "a", "Checks": [{"Name": "c", "Status": "passing"}, {"Name": "d", "Status": "up"}]}"#,
            "up",
        ),
        (
            r#"{"Node": "n1", "Address": "a", "Service": {"Service": "s", "Port": -1}}"#,
            "port",
        ),
        (
            r#"{"Node": "n1", "Address": "a", "Service": {"Service": "s", "Port": 65536}}"#,
            "port",
        ),
        (
            r#"{"Node": "n1", "Address": "a", "Service": {"Service": "s", "Port": "80"}}"#,
            "decode",
        ),
        (r#"{"Node": ["n1"], "Address": "a"}"#, "decode"),
        (r#"{"Node": "n1", "Address": "a""#, "decode"),
        ("not json", "decode"),
        ("", "decode"),
        (r#"["n1", "10.0.0.1"]"#, "object"),
        (
            r#"{"Node": "n1", "Address": "a", "Service": {"ID": "noname"}}"#,
            "service name",
        ),
        (
            r#"{"Node": "n1", "Address": "a", "Check": {"Name": "c", "ServiceID": "missing"}}"#,
            "missing",
        ),
    ];
    for (body, why) in cases {
        let r = s.put("/v1/catalog/register", body);
        assert_eq!(r.status, 400, "{body} answered {}: {}", r.status, r.body);
        assert!(
            r.body.to_lowercase().contains(&why.to_lowercase()),
            "{body}: reason {:?} does not mention {why:?}",
            r.body
        );
        assert!(!r.body.contains('\n') || r.body.trim().lines().count() == 1);
    }
    // A body naming another datacenter is sent there, as `?dc=` is (the
    // body's first, as Consul's handler reads it): a datacenter this
    // server has no path to is Consul's 500 and words, in either case.
    for body in [
        r#"{"Node": "n1", "Address": "a", "Datacenter": "dc2"}"#,
        r#"{"node": "n1", "address": "a", "datacenter": "dc2"}"#,
    ] {
        let r = s.put("/v1/catalog/register", body);
        assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
    }
    let r = s.put(
        "/v1/catalog/deregister",
        r#"{"Node": "n1", "Datacenter": "dc2"}"#,
    );
    assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
    assert_eq!(theirs(s.get_json("/v1/catalog/nodes")), json!([]));
    assert_eq!(theirs(s.get_json("/v1/catalog/services")), json!({}));
    assert_eq!(theirs(s.get_json("/v1/health/state/any")), json!([]));
    assert_eq!(s.get("/v1/catalog/nodes").index(), before);

    assert_eq!(s.put("/v1/catalog/deregister", "{").status, 400);
    assert_eq!(s.put("/v1/catalog/deregister", "{}").status, 400);
    assert_eq!(s.get("/v1/catalog/service/").status, 400);
    assert_eq!(s.get("/v1/health/service/").status, 400);
    // Malformed filters name the problem.
    let r = s.get(&format!("/v1/catalog/nodes?filter={}", enc("Node ==")));
    assert_eq!(r.status, 400);
    let r = s.get(&format!("/v1/catalog/nodes?filter={}", enc("Bogus == x")));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("Bogus"), "{}", r.body);
}

#[test]
fn filter_expressions_on_list_endpoints() {
    let s = Server::dev();
    seed(&s);
    let f = |path: &str, expr: &str| s.get_json(&format!("{path}?filter={}", enc(expr)));

    assert_eq!(
        names(&f("/v1/catalog/nodes", "Meta.rack == r2"), "Node"),
        ["n2"]
    );
    assert_eq!(
        names(&f("/v1/catalog/nodes", "Node matches \"^n\""), "Node"),
        ["n1", "n2"]
    );
    assert_eq!(
        names(&f("/v1/catalog/service/web", "ServicePort == 8080"), "Node"),
        ["n2"]
    );
    assert_eq!(
        names(
            &f(
                "/v1/catalog/service/web",
                "primary in ServiceTags and NodeMeta.rack == r1"
            ),
            "ServiceID"
        ),
        ["web1"]
    );
    assert_eq!(
        f("/v1/catalog/services", "ServiceName == db"),
        json!({"db": ["pg", "v1"]})
    );
    assert_eq!(
        names(
            &f("/v1/catalog/node-services/n2", "Port == 8080")["Services"],
            "ID"
        ),
        ["web2"]
    );
    let node = f("/v1/catalog/node/n2", "Service == db");
    assert_eq!(node["Services"].as_object().unwrap().len(), 1);
    assert_eq!(
        names(
            &f("/v1/health/service/web", "Checks.Status == critical"),
            "Node.Node"
        ),
        ["n2"]
    );
    assert_eq!(
        names(
            &f("/v1/health/service/web", "Service.Meta.version == \"1\""),
            "Node.Node"
        ),
        ["n1"]
    );
    assert_eq!(
        names(&f("/v1/health/state/any", "ServiceName == web"), "CheckID").len(),
        2
    );
    assert_eq!(
        names(&f("/v1/health/node/n2", "ServiceID == \"\""), "CheckID"),
        ["serfHealth"]
    );
    assert_eq!(
        names(&f("/v1/health/checks/web", "Node == n1"), "CheckID"),
        ["web1-alive"]
    );
    // Selectors are checked against the endpoint's row type.
    let r = s.get(&format!(
        "/v1/health/service/web?filter={}",
        enc("ServicePort == 80")
    ));
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn blocking_health_reads_answer_what_plain_reads_answer() {
    // Blocking health reads come from a materialized view of the service
    // (fed by the event publisher); plain reads from the state. Both must
    // give the same rows and index, with every filter.
    let s = Server::dev();
    seed(&s);
    let queries = [
        "/v1/health/service/web",
        "/v1/health/service/web?passing",
        "/v1/health/service/web?tag=primary",
        "/v1/health/service/web?node-meta=rack:r1",
        "/v1/health/service/web?filter=Service.Port%20%3D%3D%2080",
        "/v1/health/service/db",
        "/v1/health/service/nothing-here",
    ];
    let compare = |when: &str| {
        for q in queries {
            let plain = s.get(q);
            let sep = if q.contains('?') { '&' } else { '?' };
            // Past the plain read's index less one: the view has caught up.
            let since = (plain.index() - 1).max(1);
            let blocking = s.get(&format!("{q}{sep}index={since}&wait=2s"));
            assert_eq!(plain.status, 200, "{q}: {}", plain.body);
            assert_eq!(blocking.status, 200, "{q}: {}", blocking.body);
            assert_eq!(blocking.json(), plain.json(), "{when}: {q}");
            assert_eq!(blocking.index(), plain.index(), "{when}: {q} index");
        }
    };
    compare("after seeding");
    // A node check turning critical, a new instance, and a deregistration.
    register(
        &s,
        json!({"Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"rack": "r1"},
               "Check": {"CheckID": "n1-disk", "Name": "disk", "Status": "critical"}}),
    );
    register(
        &s,
        json!({"Node": "n3", "Address": "10.0.0.3",
               "Service": {"ID": "web3", "Service": "web", "Port": 80, "Tags": ["primary"]}}),
    );
    deregister(&s, json!({"Node": "n2", "ServiceID": "db"}));
    compare("after changes");
    let metrics = s.get("/v1/agent/metrics?format=prometheus").body;
    assert!(
        metrics.contains("cairn_health_views 3"),
        "one view each for web, db and nothing-here:\n{metrics}"
    );
}

/// The check listings (by node, by service, by state) show a token only
/// the checks it may read: `node:read` on the check's node and, for a
/// service's check, `service:read` on the service; hiding any sets
/// `X-Consul-Results-Filtered-By-ACLs`.
#[test]
fn check_listings_show_a_token_only_the_checks_it_may_read() {
    const ROOT: &str = "6f1c2a4e-0000-4000-8000-0000000000c1";
    let s = Server::builder().dev().acl("deny", ROOT).start();
    let with = |token: &str, method: &str, path: &str, body: Option<&str>| {
        common::request_with(
            s.http_addr,
            method,
            path,
            body,
            &[("X-Consul-Token", token)],
        )
    };
    let as_root = |method: &str, path: &str, body: Value| {
        let r = with(ROOT, method, path, Some(&body.to_string()));
        assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
        r.json()
    };
    common::eventually(Duration::from_secs(10), "the management token", || {
        (with(ROOT, "GET", "/v1/acl/token/self", None).status == 200).then_some(())
    });
    as_root(
        "PUT",
        "/v1/catalog/register",
        json!({"Node": "n1", "Address": "10.0.0.1",
               "Service": {"ID": "web", "Service": "web", "Port": 80},
               "Checks": [{"CheckID": "n1-ping", "Name": "ping", "Status": "passing"},
                          {"CheckID": "web-alive", "Name": "alive", "ServiceID": "web",
                           "Status": "passing"}]}),
    );
    as_root(
        "PUT",
        "/v1/catalog/register",
        json!({"Node": "n1", "Address": "10.0.0.1",
               "Service": {"ID": "db", "Service": "db", "Port": 5432},
               "Check": {"CheckID": "db-alive", "Name": "alive", "ServiceID": "db",
                         "Status": "passing"}}),
    );
    let rules = r#"node "n1" { policy = "read" }
service "web" { policy = "read" }"#;
    as_root(
        "PUT",
        "/v1/acl/policy",
        json!({"Name": "web-reader", "Rules": rules}),
    );
    let token = as_root(
        "PUT",
        "/v1/acl/token",
        json!({"Policies": [{"Name": "web-reader"}]}),
    );
    let secret = token["SecretID"].as_str().unwrap();

    // (check IDs shown, filtered header) for a listing read with `token`.
    let read = |token: &str, path: &str| {
        let r = with(token, "GET", path, None);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let mut ids = names(&r.json(), "CheckID");
        ids.sort();
        (
            ids,
            r.header("x-consul-results-filtered-by-acls")
                .map(String::from),
        )
    };
    let hidden = Some("true".to_string());
    // (The server's own node and its serfHealth check are hidden too.)
    for path in ["/v1/health/node/n1", "/v1/health/state/any"] {
        assert_eq!(
            read(secret, path),
            (
                vec!["n1-ping".to_string(), "web-alive".into()],
                hidden.clone()
            ),
            "{path}"
        );
    }
    // The management token sees them all, unmarked.
    assert_eq!(
        read(ROOT, "/v1/health/node/n1"),
        (
            vec!["db-alive".to_string(), "n1-ping".into(), "web-alive".into()],
            None
        )
    );
    assert_eq!(
        read(secret, "/v1/health/checks/web"),
        (vec!["web-alive".to_string()], None)
    );
    assert_eq!(read(secret, "/v1/health/checks/db"), (vec![], hidden));
}

/// A read by name without the name is Consul's 400, naming what is missing.
#[test]
fn reads_without_a_name_are_refused() {
    let s = Server::dev();
    for (path, what) in [
        ("/v1/catalog/service/", "service"),
        ("/v1/catalog/connect/", "service"),
        ("/v1/catalog/node/", "node"),
        ("/v1/catalog/node-services/", "node"),
        ("/v1/health/node/", "node"),
        ("/v1/health/checks/", "service"),
        ("/v1/health/service/", "service"),
        ("/v1/health/connect/", "service"),
    ] {
        let r = s.get(path);
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert_eq!(r.body.trim(), format!("Missing {what} name"), "{path}");
    }
}

/// A registration's body names its datacenter before `?dc=` does (Consul's
/// handlers read the body first): a body naming this datacenter registers
/// here even with `?dc=` naming one this server has no path to, and the
/// query alone still names where the request goes.
#[test]
fn a_bodys_own_datacenter_wins_over_the_query() {
    let s = Server::dev();
    let r = s.put(
        "/v1/catalog/register?dc=dc2",
        r#"{"Node": "here", "Address": "10.1.1.1", "Datacenter": "dc1"}"#,
    );
    assert_eq!((r.status, r.body.as_str()), (200, "true"));
    assert_eq!(
        s.get_json("/v1/catalog/node/here")["Node"]["Address"],
        "10.1.1.1"
    );
    let r = s.put(
        "/v1/catalog/deregister?dc=dc2",
        r#"{"Node": "here", "Datacenter": "dc1"}"#,
    );
    assert_eq!((r.status, r.body.as_str()), (200, "true"));
    assert_eq!(s.get("/v1/catalog/node/here").body, "null");
    let r = s.put(
        "/v1/catalog/register?dc=dc2",
        r#"{"Node": "there", "Address": "10.1.1.2"}"#,
    );
    assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
}

/// `?peer=` selects the instances imported from that peer, and a read
/// without it the local ones only, on the health and catalog reads (a
/// peer cairn has no instances from answers an empty list, as Consul).
#[test]
fn peer_selects_imported_instances_and_local_reads_leave_them_out() {
    let s = Server::dev();
    register(
        &s,
        json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"Service": "web", "ID": "web-local"}}),
    );
    // What peering's replication would store: the peer's name on it.
    register(
        &s,
        json!({"Node": "n2", "Address": "10.0.0.2", "Service": {"Service": "web", "ID": "web-peered", "PeerName": "east"}}),
    );
    // The IDs a read answers, `field` naming the instance's ID in its rows.
    let ids = |path: &str, field: &[&str]| -> Vec<String> {
        s.get_json(path)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let v = field.iter().fold(r, |v, k| &v[*k]);
                v.as_str().unwrap().to_string()
            })
            .collect()
    };
    let health: &[&str] = &["Service", "ID"];
    let catalog: &[&str] = &["ServiceID"];
    assert_eq!(ids("/v1/health/service/web", health), ["web-local"]);
    assert_eq!(
        ids("/v1/health/service/web?peer=east", health),
        ["web-peered"]
    );
    assert!(ids("/v1/health/service/web?peer=nowhere", health).is_empty());
    assert_eq!(ids("/v1/catalog/service/web", catalog), ["web-local"]);
    assert_eq!(
        ids("/v1/catalog/service/web?peer=east", catalog),
        ["web-peered"]
    );
    assert!(ids("/v1/catalog/service/web?peer=nowhere", catalog).is_empty());
}
