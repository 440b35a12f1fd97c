//! The web UI's server side on real processes: Consul's
//! `/v1/internal/ui/*` reads (shapes, ACL filtering with default deny,
//! blocking queries) and the static files at `/ui/` (`--ui`, `--dev`,
//! `--ui-dir` and its refusal of paths out of the directory), on a server
//! and on a client agent.

mod common;

use std::time::{Duration, Instant};

use common::acl::{ROOT, as_root, deny_server, token_with_rules, with};
use common::agent::Agent;
use common::{Server, request, try_request};
use serde_json::{Value, json};

fn register(s: &Server, body: Value) {
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
}

/// web (two instances on two nodes, one check passing, one critical, a
/// sidecar whose upstream is api), api (one instance, from Kubernetes).
fn mesh(s: &Server) {
    register(
        s,
        json!({"Node": "n1", "Address": "10.0.0.1",
            "Service": {"ID": "web1", "Service": "web", "Port": 80, "Tags": ["v1"]},
            "Check": {"CheckID": "web1-alive", "Name": "alive", "ServiceID": "web1",
                      "Status": "passing", "Output": "HTTP 200"}}),
    );
    register(
        s,
        json!({"Node": "n2", "Address": "10.0.0.2",
            "Service": {"ID": "web2", "Service": "web", "Port": 80, "Tags": ["v2"]},
            "Check": {"CheckID": "web2-alive", "Name": "alive", "ServiceID": "web2",
                      "Status": "critical", "Output": "connection refused"}}),
    );
    register(
        s,
        json!({"Node": "n1", "Address": "10.0.0.1",
            "Service": {"ID": "web1-sidecar-proxy", "Service": "web-sidecar-proxy",
                "Kind": "connect-proxy", "Port": 21000,
                "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web1",
                          "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9191}]}}}),
    );
    register(
        s,
        json!({"Node": "n3", "Address": "10.0.0.3",
            "Service": {"ID": "api1", "Service": "api", "Port": 8080,
                        "Meta": {"external-source": "kubernetes"}}}),
    );
}

fn by_name<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|s| s["Name"] == name)
}

#[test]
fn services_are_summarized_as_consul_does() {
    let s = Server::dev();
    mesh(&s);
    let list = s.get_json("/v1/internal/ui/services");
    let web = by_name(&list, "web").expect("web listed");
    assert_eq!(web["InstanceCount"], 2, "{web}");
    assert_eq!(web["ChecksPassing"], 1, "{web}");
    assert_eq!(web["ChecksCritical"], 1, "{web}");
    assert_eq!(web["ChecksWarning"], 0, "{web}");
    assert_eq!(web["Tags"], json!(["v1", "v2"]));
    assert_eq!(web["Nodes"], json!(["n1", "n2"]));
    assert_eq!(web["ConnectedWithProxy"], true);
    assert_eq!(web["ConnectedWithGateway"], false);
    assert_eq!(web["Datacenter"], "dc1");
    assert!(
        web.get("Kind").is_none(),
        "a typical service has no Kind: {web}"
    );
    let api = by_name(&list, "api").expect("api listed");
    assert_eq!(api["ExternalSources"], json!(["kubernetes"]));
    assert_eq!(api["ConnectedWithProxy"], false);
    // The sidecar is shown on web's page, not as a service of its own.
    assert!(by_name(&list, "web-sidecar-proxy").is_none(), "{list}");
}

#[test]
fn nodes_node_and_overview() {
    let s = Server::dev();
    mesh(&s);
    let nodes = s.get_json("/v1/internal/ui/nodes");
    let n2 = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["Node"] == "n2")
        .expect("n2");
    assert_eq!(n2["Address"], "10.0.0.2");
    assert_eq!(n2["Services"][0]["Service"], "web");
    assert_eq!(n2["Checks"][0]["Output"], "connection refused");

    let n1 = s.get_json("/v1/internal/ui/node/n1");
    assert_eq!(n1["Node"], "n1");
    assert_eq!(n1["Services"].as_array().unwrap().len(), 2, "{n1}");
    let missing = s.get("/v1/internal/ui/node/nope");
    assert_eq!(missing.status, 404, "{missing:?}");
    assert_eq!(s.get("/v1/internal/ui/node/").status, 400);

    let o = s.get_json("/v1/internal/ui/catalog-overview");
    let web = o["Services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["Name"] == "web")
        .expect("web in the overview");
    assert_eq!(
        (&web["Total"], &web["Passing"], &web["Critical"]),
        (&json!(2), &json!(1), &json!(1))
    );
    let alive = o["Checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["Name"] == "alive")
        .expect("the alive checks");
    assert_eq!(alive["Total"], 2);
    assert!(o["Nodes"][0]["Total"].as_u64().unwrap() >= 3, "{o}");
}

#[test]
fn topology_edges_carry_the_intention_decision() {
    let s = Server::dev();
    mesh(&s);
    let t = s.get_json("/v1/internal/ui/service-topology/web");
    assert_eq!(t["Protocol"], "tcp");
    let up = &t["Upstreams"][0];
    assert_eq!(up["Name"], "api", "{t}");
    assert_eq!(up["Source"], "registration");
    // ACLs off: no intention means allowed.
    assert_eq!(up["Intention"]["Allowed"], true, "{t}");
    assert_eq!(up["Intention"]["HasExact"], false);
    assert_eq!(t["Downstreams"], json!([]));

    // A blocking read of the topology is woken by the intention's write.
    let index = s.get("/v1/internal/ui/service-topology/web").index();
    let addr = s.http_addr;
    let waiter = std::thread::spawn(move || {
        request(
            addr,
            "GET",
            &format!("/v1/internal/ui/service-topology/web?index={index}&wait=30s"),
            None,
        )
    });
    s.wait_parked(1);
    let r = s.put(
        "/v1/config",
        &json!({"Kind": "service-intentions", "Name": "api",
                "Sources": [{"Name": "web", "Action": "deny"}]})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let woken = waiter.join().unwrap();
    assert!(woken.index() > index);
    assert_eq!(woken.json()["Upstreams"][0]["Intention"]["Allowed"], false);
    let t = s.get_json("/v1/internal/ui/service-topology/web");
    let up = &t["Upstreams"][0]["Intention"];
    assert_eq!(
        (&up["Allowed"], &up["HasExact"]),
        (&json!(false), &json!(true))
    );
    let t = s.get_json("/v1/internal/ui/service-topology/api");
    assert_eq!(t["Downstreams"][0]["Name"], "web", "{t}");
    assert_eq!(t["Downstreams"][0]["Intention"]["Allowed"], false);
    assert_eq!(t["Upstreams"], json!([]));
    assert_eq!(s.get("/v1/internal/ui/service-topology/").status, 400);
    assert_eq!(
        s.get_json("/v1/internal/ui/gateway-services-nodes/gw"),
        json!([])
    );
}

#[test]
fn a_blocking_services_read_is_woken_by_a_registration() {
    let s = Server::dev();
    mesh(&s);
    let first = s.get("/v1/internal/ui/services");
    let index = first.index();
    let addr = s.http_addr;
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        request(
            addr,
            "GET",
            &format!("/v1/internal/ui/services?index={index}&wait=30s"),
            None,
        )
    });
    s.wait_parked(1);
    register(
        &s,
        json!({"Node": "n4", "Address": "10.0.0.4",
               "Service": {"Service": "db", "Port": 5432}}),
    );
    let woken = waiter.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "not woken");
    assert!(woken.index() > index);
    assert!(by_name(&woken.json(), "db").is_some(), "{}", woken.body);
    // A wait with nothing changing ends at its deadline with the same index.
    let r = s.get(&format!(
        "/v1/internal/ui/nodes?index={}&wait=1s",
        woken.index()
    ));
    assert_eq!(r.index(), woken.index());
}

#[test]
fn with_default_deny_a_token_sees_only_what_it_may_read() {
    let s = deny_server();
    for reg in [
        json!({"Node": "n1", "Address": "10.0.0.1",
               "Service": {"Service": "web", "Port": 80},
               "Check": {"Name": "alive", "ServiceID": "web", "Status": "passing"}}),
        json!({"Node": "n2", "Address": "10.0.0.2",
               "Service": {"Service": "secret", "Port": 81}}),
    ] {
        as_root(s.http_addr, "PUT", "/v1/catalog/register", &reg);
    }
    // Anonymous: nothing at all, and the answer says it was filtered.
    let anon = s.get("/v1/internal/ui/services");
    assert_eq!(anon.status, 200);
    assert_eq!(anon.json(), json!([]));
    assert_eq!(
        anon.header("x-consul-results-filtered-by-acls"),
        Some("true")
    );
    assert_eq!(s.get_json("/v1/internal/ui/nodes"), json!([]));
    assert_eq!(s.get("/v1/internal/ui/node/n1").status, 404);
    let o = s.get_json("/v1/internal/ui/catalog-overview");
    assert_eq!(o["Services"], json!([]));
    assert_eq!(o["Nodes"], json!([]));

    let (_, secret) = token_with_rules(
        s.http_addr,
        "web-reader",
        "service \"web\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }",
    );
    let r = with(
        s.http_addr,
        "GET",
        "/v1/internal/ui/services",
        None,
        &secret,
    );
    let names: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["Name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["web"], "{}", r.body);
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));
    let n2 = with(s.http_addr, "GET", "/v1/internal/ui/node/n2", None, &secret).json();
    assert_eq!(n2["Services"], json!([]), "secret hidden on its node: {n2}");
    // A topology of a service the token may not read: Consul's 403.
    let t = with(
        s.http_addr,
        "GET",
        "/v1/internal/ui/service-topology/secret",
        None,
        &secret,
    );
    assert_eq!(t.status, 403);
    assert!(t.body.contains("service:read"), "{}", t.body);
    // A gateway's services: service:read on the gateway first, anonymous
    // or a token without it refused before anything is looked up.
    assert_eq!(
        s.get("/v1/internal/ui/gateway-services-nodes/ig").status,
        403
    );
    let g = with(
        s.http_addr,
        "GET",
        "/v1/internal/ui/gateway-services-nodes/ig",
        None,
        &secret,
    );
    assert_eq!(g.status, 403);
    assert!(g.body.contains("service:read"), "{}", g.body);
    let all = with(s.http_addr, "GET", "/v1/internal/ui/services", None, ROOT).json();
    assert_eq!(
        all.as_array().unwrap().len(),
        3,
        "web, secret, consul: {all}"
    );
}

/// A terminating gateway's intentions: those into each service it links,
/// the `*` destination's once, `service:read` on the gateway first, each
/// intention shown only with `intention:read` on its destination.
#[test]
fn a_gateways_intentions_are_those_into_its_services() {
    let s = deny_server();
    for entry in [
        json!({"Kind": "terminating-gateway", "Name": "tgw",
               "Services": [{"Name": "web"}, {"Name": "secret"}]}),
        json!({"Kind": "service-intentions", "Name": "web",
               "Sources": [{"Name": "frontend", "Action": "allow"}]}),
        json!({"Kind": "service-intentions", "Name": "secret",
               "Sources": [{"Name": "frontend", "Action": "deny"}]}),
        json!({"Kind": "service-intentions", "Name": "*",
               "Sources": [{"Name": "admin", "Action": "allow"}]}),
        json!({"Kind": "service-intentions", "Name": "other",
               "Sources": [{"Name": "frontend", "Action": "allow"}]}),
    ] {
        as_root(s.http_addr, "PUT", "/v1/config", &entry);
    }
    let path = "/v1/internal/ui/gateway-intentions/tgw";
    let pairs = |v: &Value| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let name = |k: &str| i[k].as_str().unwrap().to_string();
                (name("SourceName"), name("DestinationName"))
            })
            .collect();
        out.sort();
        out
    };
    let r = with(s.http_addr, "GET", path, None, ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    let want = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        pairs(&r.json()),
        want(&[("admin", "*"), ("frontend", "secret"), ("frontend", "web")])
    );
    assert!(r.json()[0]["Action"].is_string(), "{}", r.body);
    // Anonymous, and a token that may read the intentions but not the
    // gateway: refused before anything is looked up.
    assert_eq!(s.get(path).status, 403);
    let (_, no_gw) = token_with_rules(
        s.http_addr,
        "no-gateway",
        "service_prefix \"\" {\n  policy = \"deny\"\n  intentions = \"read\"\n}",
    );
    let r = with(s.http_addr, "GET", path, None, &no_gw);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("service:read"), "{}", r.body);
    // The gateway and web's intentions: secret's filtered, and said; the
    // `*` destination's are readable with any service's (Consul's
    // `IntentionRead("*")`).
    let (_, web) = token_with_rules(
        s.http_addr,
        "gateway-web",
        "service \"tgw\" { policy = \"read\" }\nservice \"web\" {\n  policy = \"read\"\n  intentions = \"read\"\n}",
    );
    let r = with(s.http_addr, "GET", path, None, &web);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        pairs(&r.json()),
        want(&[("admin", "*"), ("frontend", "web")])
    );
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));
    // A gateway that links nothing, and none named.
    let r = with(
        s.http_addr,
        "GET",
        "/v1/internal/ui/gateway-intentions/nogw",
        None,
        ROOT,
    );
    assert_eq!((r.status, r.json()), (200, json!([])));
    let r = with(
        s.http_addr,
        "GET",
        "/v1/internal/ui/gateway-intentions/",
        None,
        ROOT,
    );
    assert_eq!((r.status, r.body.as_str()), (400, "Missing gateway name"));
}

#[test]
fn the_ui_is_served_with_ui_and_dev_and_not_without() {
    let dev = Server::dev();
    let root = dev.get("/");
    assert_eq!(root.status, 302, "{root:?}");
    assert_eq!(dev.get("/ui").status, 308);
    assert_eq!(root.header("location"), Some("/ui/"));
    let index = dev.get("/ui/");
    assert_eq!(index.status, 200);
    assert!(
        index
            .header("content-type")
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        index.body.contains("<script type=\"module\""),
        "{}",
        index.body
    );
    let js = dev.get("/ui/js/app.js");
    assert_eq!(js.status, 200);
    assert!(
        js.header("content-type")
            .unwrap()
            .starts_with("text/javascript")
    );
    let css = dev.get("/ui/style.css");
    assert!(css.header("content-type").unwrap().starts_with("text/css"));
    assert_eq!(dev.get("/ui/nope.js").status, 404);

    let plain = Server::builder().bootstrap_expect(1).start();
    assert_eq!(plain.get("/ui/").status, 404);
    assert_eq!(plain.get("/").status, 404);
    let on = Server::builder().bootstrap_expect(1).arg("--ui").start();
    assert_eq!(on.get("/ui/").status, 200);
}

#[test]
fn ui_dir_serves_a_directory_and_nothing_outside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ui");
    std::fs::create_dir_all(dir.join("assets")).unwrap();
    std::fs::write(dir.join("index.html"), "<p>other ui</p>").unwrap();
    std::fs::write(dir.join("assets/x.css"), "p{}").unwrap();
    std::fs::write(tmp.path().join("secret.txt"), "TOP SECRET").unwrap();
    let s = Server::builder()
        .bootstrap_expect(1)
        .arg("--ui-dir")
        .arg(dir.to_str().unwrap())
        .start();
    assert_eq!(s.get("/ui/").body, "<p>other ui</p>");
    let css = s.get("/ui/assets/x.css");
    assert_eq!((css.status, css.body.as_str()), (200, "p{}"));
    for path in [
        "/ui/../secret.txt",
        "/ui/%2e%2e/secret.txt",
        "/ui/..%2fsecret.txt",
        "/ui/assets/..%2f..%2fsecret.txt",
        "/ui/%2fetc%2fpasswd",
        "/ui/..%5csecret.txt",
    ] {
        let r = try_request(s.http_addr, "GET", path, None).unwrap();
        assert!(!r.body.contains("TOP SECRET"), "{path}: {r:?}");
        assert!(r.status == 404 || r.status == 400, "{path}: {r:?}");
    }
}

#[test]
fn a_client_agent_serves_the_ui_and_forwards_the_ui_reads() {
    let s = Server::dev();
    mesh(&s);
    let agent = Agent::builder("agent-ui", &s.url).arg("--ui").start();
    let page = request(agent.http_addr, "GET", "/ui/", None);
    assert_eq!(page.status, 200);
    let list = request(agent.http_addr, "GET", "/v1/internal/ui/services", None);
    assert_eq!(list.status, 200, "{list:?}");
    assert!(by_name(&list.json(), "web").is_some(), "{}", list.body);
}

/// A node's own check (no service) counts for every instance on the node,
/// once per instance, as Consul's summaries count it.
#[test]
fn a_node_check_counts_for_each_instance_on_its_node() {
    let s = Server::dev();
    mesh(&s);
    register(
        &s,
        json!({"Node": "n1", "Address": "10.0.0.1",
            "Service": {"ID": "web1b", "Service": "web", "Port": 81},
            "Check": {"CheckID": "n1-disk", "Name": "disk", "Status": "warning"}}),
    );
    let list = s.get_json("/v1/internal/ui/services");
    let web = by_name(&list, "web").expect("web listed");
    // web1 (passing + node warning), web1b (node warning), web2 (critical).
    assert_eq!(web["InstanceCount"], 3, "{web}");
    assert_eq!(web["ChecksPassing"], 1, "{web}");
    assert_eq!(web["ChecksWarning"], 2, "{web}");
    assert_eq!(web["ChecksCritical"], 1, "{web}");
    let api = by_name(&list, "api").expect("api listed");
    assert_eq!(api["ChecksWarning"], 0, "{api}");
}

/// With ACLs off the summaries are encoded once per catalog index and
/// shared: a repeated read is the same answer, and every catalog change
/// (a new instance, a check's status, a deregistration) is seen at once.
#[test]
fn the_shared_summary_follows_every_catalog_change() {
    let s = Server::dev();
    mesh(&s);
    let first = s.get("/v1/internal/ui/services");
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("content-type"), Some("application/json"));
    let index: u64 = first.header("x-consul-index").unwrap().parse().unwrap();
    let again = s.get("/v1/internal/ui/services");
    assert_eq!(
        (again.body.as_str(), again.header("x-consul-index")),
        (first.body.as_str(), first.header("x-consul-index"))
    );
    let count = |name: &str, field: &str| {
        let list = s.get_json("/v1/internal/ui/services");
        by_name(&list, name).map(|v| v[field].clone())
    };
    register(
        &s,
        json!({"Node": "n4", "Address": "10.0.0.4",
            "Service": {"ID": "api2", "Service": "api", "Port": 8080},
            "Check": {"CheckID": "api2-alive", "Name": "alive", "ServiceID": "api2", "Status": "passing"}}),
    );
    assert_eq!(count("api", "InstanceCount"), Some(json!(2)));
    register(
        &s,
        json!({"Node": "n4", "Address": "10.0.0.4", "SkipNodeUpdate": true,
            "Check": {"CheckID": "api2-alive", "Name": "alive", "ServiceID": "api2", "Status": "critical"}}),
    );
    assert_eq!(count("api", "ChecksCritical"), Some(json!(1)));
    // A blocking read past the shared index is woken by the next change.
    let r = s.put("/v1/catalog/deregister", r#"{"Node": "n4"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let after = s.get(&format!("/v1/internal/ui/services?index={index}&wait=5s"));
    let list: Value = after.json();
    assert_eq!(by_name(&list, "api").unwrap()["InstanceCount"], 1, "{list}");
    assert!(
        after
            .header("x-consul-index")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > index
    );
}
