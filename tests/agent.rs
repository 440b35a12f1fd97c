//! The client agent against a real server: services registered on agents
//! reach the catalog and stay as the agents say (anti-entropy), checks
//! drive health, a killed agent's node turns critical, tag override, state
//! kept across agent and server restarts, config-dir definitions, central
//! config merged into an agent's proxy, sidecars expanded from
//! `Connect.SidecarService` (API and config dir), check thresholds, the
//! local health endpoints, and bad input refused.
//!
//! Every wait polls with a generous deadline (the machine may be loaded);
//! nothing sleeps a fixed time.

mod common;

use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{Server, eventually};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn put_ok(a: &Agent, path: &str, body: Value) {
    let r = a.put(path, &body.to_string());
    assert_eq!(r.status, 200, "PUT {path} {body}: {}", r.body);
}

/// The catalog's instances of `service`: (node, service JSON).
/// A service definition registered on agent `a` (`/v1/agent/service/register`).
fn register(a: &Agent, def: Value) {
    put_ok(a, "/v1/agent/service/register", def);
}

/// `web` (port 80, with a passing TTL check) registered on agent `a`.
fn register_web(a: &Agent) {
    register(
        a,
        json!({"Name": "web", "Port": 80, "Check": {"TTL": "10m", "Status": "passing"}}),
    );
}

fn instances(s: &Server, service: &str) -> Vec<(String, Value)> {
    s.get_json(&format!("/v1/catalog/service/{service}"))
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["Node"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

/// A check's status on a node, as the catalog has it.
fn check_status(s: &Server, node: &str, check: &str) -> Option<String> {
    s.get_json(&format!("/v1/health/node/{node}"))
        .as_array()?
        .iter()
        .find(|c| c["CheckID"] == check)
        .map(|c| c["Status"].as_str().unwrap_or("").to_string())
}

/// The catalog's index: the last write to its nodes, services or checks
/// (coordinates, which agents also send, are not the catalog's).
fn catalog_index(s: &Server) -> u64 {
    [
        "/v1/catalog/nodes",
        "/v1/catalog/services",
        "/v1/health/state/any",
    ]
    .iter()
    .map(|p| s.get(p).index())
    .max()
    .unwrap_or(0)
}

/// Waits until the agent has completed `n` more full syncs.
fn wait_full_syncs(a: &Agent, n: f64) {
    let start = a.metric("cairn_agent_full_syncs_total");
    eventually(DEADLINE, "full syncs", || {
        (a.metric("cairn_agent_full_syncs_total") >= start + n).then_some(())
    });
}

#[test]
fn agent_services_reach_the_catalog_and_drift_is_undone() {
    let s = Server::dev();
    let a1 = Agent::builder("a1", &s.url).start();
    let a2 = Agent::builder("a2", &s.url).start();
    register(
        &a1,
        json!({"Name": "web", "Port": 80, "Tags": ["v1"], "Check": {"TTL": "1m", "Status": "passing"}}),
    );
    register(&a2, json!({"name": "db", "port": 5432}));

    eventually(DEADLINE, "web and db in the catalog", || {
        let web = instances(&s, "web");
        let db = instances(&s, "db");
        (web.len() == 1 && web[0].0 == "a1" && db.len() == 1 && db[0].0 == "a2").then_some(())
    });
    let web = &instances(&s, "web")[0].1;
    assert_eq!(web["ServiceTags"], json!(["v1"]));
    assert_eq!(web["ServicePort"], 80);
    assert_eq!(
        check_status(&s, "a1", "service:web").as_deref(),
        Some("passing")
    );

    // Steady state: full syncs find nothing to write.
    wait_full_syncs(&a1, 1.0);
    let before = catalog_index(&s);
    wait_full_syncs(&a1, 3.0);
    wait_full_syncs(&a2, 1.0);
    assert_eq!(
        catalog_index(&s),
        before,
        "an idle agent wrote to the catalog"
    );

    // Deleted from the catalog behind the agent's back: restored.
    let r = s.put(
        "/v1/catalog/deregister",
        r#"{"Node": "a1", "ServiceID": "web"}"#,
    );
    assert_eq!(r.status, 200);
    assert!(instances(&s, "web").is_empty());
    eventually(DEADLINE, "web restored", || {
        let ok = instances(&s, "web").len() == 1
            && check_status(&s, "a1", "service:web").as_deref() == Some("passing");
        ok.then_some(())
    });

    // Registered on the agent's node behind its back: removed.
    let r = s.put(
        "/v1/catalog/register",
        r#"{"Node": "a1", "Address": "127.0.0.1", "Service": {"Service": "stranger"},
            "Check": {"CheckID": "odd", "Status": "passing"}}"#,
    );
    assert_eq!(r.status, 200);
    eventually(DEADLINE, "stranger and odd check removed", || {
        let gone = instances(&s, "stranger").is_empty()
            && check_status(&s, "a1", "odd").is_none()
            && check_status(&s, "a1", "serfHealth").as_deref() == Some("passing");
        gone.then_some(())
    });

    // Reads and writes of other endpoints go through the agent to a server.
    let services = a1.get_json("/v1/catalog/services");
    assert!(
        services.get("web").is_some() && services.get("db").is_some(),
        "{services}"
    );
    assert_eq!(a1.put("/v1/kv/via-agent", "hi").body.trim(), "true");
    assert_eq!(s.get("/v1/kv/via-agent?raw").body, "hi");
    let members = a1.get_json("/v1/agent/members");
    let alive: Vec<&str> = members
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["Status"] == 1 && m["Tags"]["role"] == "node")
        .map(|m| m["Name"].as_str().unwrap())
        .collect();
    assert_eq!(alive.len(), 2, "{members}");

    // Deregistered on the agent: gone from the catalog.
    put_ok(&a2, "/v1/agent/service/deregister/db", json!({}));
    eventually(DEADLINE, "db deregistered", || {
        instances(&s, "db").is_empty().then_some(())
    });
    assert_eq!(a2.get("/v1/agent/service/db").status, 404);
}

#[test]
fn failing_checks_turn_the_service_critical() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    let closed = common::free_port();
    register(
        &a,
        json!({"Name": "web", "Port": 80, "Checks": [
            {"CheckID": "ttl", "TTL": "5m", "Status": "passing"},
            {"CheckID": "http", "HTTP": format!("{}/v1/status/leader", s.url), "Interval": "1s"},
            {"CheckID": "tcp", "TCP": s.http_addr.to_string(), "Interval": "1s"},
        ]}),
    );
    eventually(DEADLINE, "web passing", || {
        let rows = s.get_json("/v1/health/service/web?passing");
        (rows.as_array().unwrap().len() == 1).then_some(())
    });

    // A failing TTL check: the catalog shows it critical almost at once.
    let t0 = Instant::now();
    put_ok(&a, "/v1/agent/check/fail/ttl?note=boom", json!({}));
    eventually(DEADLINE, "web critical", || {
        let rows = s.get_json("/v1/health/service/web");
        let checks = rows[0]["Checks"].as_array()?.clone();
        checks
            .iter()
            .any(|c| c["CheckID"] == "ttl" && c["Status"] == "critical" && c["Output"] == "boom")
            .then_some(())
    });
    eprintln!("check failure reached the catalog in {:?}", t0.elapsed());
    assert_eq!(s.get_json("/v1/health/service/web?passing"), json!([]));
    let checks = a.get_json("/v1/agent/checks");
    assert_eq!(checks["ttl"]["Status"], "critical");
    assert_eq!(checks["http"]["Status"], "passing");
    assert_eq!(checks["tcp"]["Status"], "passing");
    put_ok(&a, "/v1/agent/check/pass/ttl", json!({}));
    eventually(DEADLINE, "web passing again", || {
        (s.get_json("/v1/health/service/web?passing")
            .as_array()?
            .len()
            == 1)
            .then_some(())
    });

    // HTTP and TCP checks against a closed port; a TTL that runs out.
    put_ok(
        &a,
        "/v1/agent/check/register",
        json!({"Name": "dead-http", "ServiceID": "web", "HTTP": format!("http://127.0.0.1:{closed}/"),
               "Interval": "1s", "Timeout": "1s", "Status": "passing"}),
    );
    put_ok(
        &a,
        "/v1/agent/check/register",
        json!({"ID": "dead-tcp", "Name": "dead tcp", "TCP": format!("127.0.0.1:{closed}"),
               "Interval": "1s", "Status": "passing"}),
    );
    put_ok(
        &a,
        "/v1/agent/check/register",
        json!({"Name": "short-ttl", "TTL": "1s", "Status": "passing"}),
    );
    eventually(DEADLINE, "the three checks critical in the catalog", || {
        let all = ["dead-http", "dead-tcp", "short-ttl"]
            .iter()
            .all(|c| check_status(&s, "a1", c).as_deref() == Some("critical"));
        all.then_some(())
    });
    let checks = a.get_json("/v1/agent/checks");
    assert_eq!(checks["short-ttl"]["Output"], "TTL expired");
    assert!(
        checks["dead-tcp"]["Output"]
            .as_str()
            .unwrap()
            .contains("dial tcp")
    );
    assert_eq!(checks["dead-http"]["ServiceName"], "web");

    // TTL endpoints on checks that are not TTL, or unknown.
    assert_eq!(a.put("/v1/agent/check/pass/http", "").status, 400);
    assert_eq!(a.put("/v1/agent/check/pass/nope", "").status, 404);
    let r = a.put("/v1/agent/check/update/ttl", r#"{"Status": "fine"}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    put_ok(
        &a,
        "/v1/agent/check/update/ttl",
        json!({"Status": "warning", "Output": "meh"}),
    );
    assert_eq!(a.get_json("/v1/agent/checks")["ttl"]["Status"], "warning");
    put_ok(&a, "/v1/agent/check/deregister/dead-tcp", json!({}));
    eventually(DEADLINE, "dead-tcp gone", || {
        check_status(&s, "a1", "dead-tcp").is_none().then_some(())
    });
}

#[test]
fn killed_agent_turns_critical_and_a_restart_keeps_its_services() {
    let s = Server::dev();
    let mut a1 = Agent::builder("a1", &s.url).start();
    let _a2 = Agent::builder("a2", &s.url).start();
    register_web(&a1);
    eventually(DEADLINE, "both nodes alive, web in the catalog", || {
        let ok = check_status(&s, "a1", "serfHealth").as_deref() == Some("passing")
            && check_status(&s, "a2", "serfHealth").as_deref() == Some("passing")
            && instances(&s, "web").len() == 1;
        ok.then_some(())
    });

    a1.kill();
    let t0 = Instant::now();
    eventually(DEADLINE, "a1 critical", || {
        (check_status(&s, "a1", "serfHealth").as_deref() == Some("critical")).then_some(())
    });
    eprintln!("killed agent's node critical after {:?}", t0.elapsed());
    assert_eq!(s.get_json("/v1/health/service/web?passing"), json!([]));
    assert_eq!(
        check_status(&s, "a2", "serfHealth").as_deref(),
        Some("passing")
    );
    let members = s.get_json("/v1/agent/members");
    let status = |name: &str| {
        members
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["Name"] == name)
            .map(|m| m["Status"].clone())
    };
    assert_eq!(status("a1"), Some(json!(4)), "{members}");
    assert_eq!(status("a2"), Some(json!(1)), "{members}");

    // Restarted on its data dir: it still has web, and comes back alive.
    a1.restart();
    let services = a1.get_json("/v1/agent/services");
    assert_eq!(services["web"]["Port"], 80, "{services}");
    assert_eq!(
        a1.get_json("/v1/agent/checks")["service:web"]["Status"],
        "passing"
    );
    eventually(DEADLINE, "a1 alive again", || {
        let ok = check_status(&s, "a1", "serfHealth").as_deref() == Some("passing")
            && s.get_json("/v1/health/service/web?passing")
                .as_array()?
                .len()
                == 1;
        ok.then_some(())
    });

    // A clean stop leaves the cluster: the node is deregistered.
    assert!(a1.stop().is_some_and(|st| st.success()));
    eventually(DEADLINE, "a1 gone", || {
        let nodes = s.get_json("/v1/catalog/nodes");
        let gone = !nodes.as_array()?.iter().any(|n| n["Node"] == "a1");
        gone.then_some(())
    });
}

#[test]
fn tag_override_keeps_catalog_tags() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    register(
        &a,
        json!({"Name": "redis", "Port": 6379, "Tags": ["v1"], "EnableTagOverride": true}),
    );
    register(&a, json!({"Name": "plain", "Port": 7000, "Tags": ["v1"]}));
    eventually(DEADLINE, "both in the catalog", || {
        (instances(&s, "redis").len() == 1 && instances(&s, "plain").len() == 1).then_some(())
    });
    // An outside tool retags both (and moves redis's port).
    for (svc, port) in [("redis", 6380), ("plain", 7000)] {
        let r = s.put(
            "/v1/catalog/register",
            &json!({"Node": "a1", "SkipNodeUpdate": true,
                    "Service": {"Service": svc, "ID": svc, "Port": port, "Tags": ["primary"],
                                "EnableTagOverride": svc == "redis"}})
            .to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    eventually(DEADLINE, "plain's tags and redis's port reverted", || {
        let plain = &instances(&s, "plain")[0].1;
        let redis = &instances(&s, "redis")[0].1;
        (plain["ServiceTags"] == json!(["v1"]) && redis["ServicePort"] == 6379).then_some(())
    });
    let redis = &instances(&s, "redis")[0].1;
    assert_eq!(redis["ServiceTags"], json!(["primary"]));
    assert_eq!(
        a.get_json("/v1/agent/service/redis")["Tags"],
        json!(["primary"])
    );
    // And it stays so over further syncs.
    wait_full_syncs(&a, 2.0);
    assert_eq!(
        instances(&s, "redis")[0].1["ServiceTags"],
        json!(["primary"])
    );
}

#[test]
fn a_server_that_lost_its_state_gets_the_agents_services_back() {
    let mut s = Server::dev();
    let port = s.http_addr.port();
    let a = Agent::builder("a1", &s.url).start();
    register_web(&a);
    eventually(DEADLINE, "web in the catalog", || {
        (instances(&s, "web").len() == 1).then_some(())
    });

    // A fresh server (empty data dir) on the same address.
    s.kill();
    let s = Server::builder().dev().http_port(port).start();
    assert!(instances(&s, "web").is_empty());
    eventually(DEADLINE, "web re-synced into the new server", || {
        let ok = instances(&s, "web").len() == 1
            && check_status(&s, "a1", "service:web").as_deref() == Some("passing")
            && check_status(&s, "a1", "serfHealth").as_deref() == Some("passing");
        ok.then_some(())
    });
}

#[test]
fn config_dir_definitions_are_loaded() {
    let s = Server::dev();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("web.json"),
        r#"{"service": {"name": "web", "port": 8080, "tags": ["from-file"],
             "check": {"id": "web-ttl", "ttl": "10m", "status": "passing"}}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("cache.hcl"),
        "service {\n  name = \"cache\"\n  port = 6379\n}\n",
    )
    .unwrap();
    let mut a = Agent::builder("a1", &s.url).config_dir(dir.path()).start();
    let services = a.get_json("/v1/agent/services");
    assert_eq!(services["web"]["Tags"], json!(["from-file"]), "{services}");
    assert_eq!(services["cache"]["Port"], 6379);
    eventually(DEADLINE, "both in the catalog", || {
        let ok = instances(&s, "web").len() == 1
            && instances(&s, "cache").len() == 1
            && check_status(&s, "a1", "web-ttl").as_deref() == Some("passing");
        ok.then_some(())
    });

    // A definition removed from the directory is gone after a restart.
    std::fs::remove_file(dir.path().join("cache.hcl")).unwrap();
    a.restart();
    assert!(a.get_json("/v1/agent/services").get("cache").is_none());
    eventually(DEADLINE, "cache deregistered", || {
        instances(&s, "cache").is_empty().then_some(())
    });

    // An invalid definition stops the agent with a reason naming the file.
    std::fs::write(dir.path().join("bad.json"), r#"{"service": {"port": 1}}"#).unwrap();
    let (status, log) = Agent::builder("a2", &s.url)
        .config_dir(dir.path())
        .start_and_wait_exit(DEADLINE);
    assert!(status.is_some_and(|st| !st.success()), "{log}");
    assert!(log.contains("bad.json"), "{log}");
}

#[test]
fn agent_proxies_get_central_config_merged() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    register(
        &a,
        json!({"Kind": "connect-proxy", "Name": "web-proxy", "Port": 21000,
               "Proxy": {"DestinationServiceName": "web",
                         "Upstreams": [{"DestinationName": "db", "LocalBindPort": 9191}]}}),
    );
    let r = s.put(
        "/v1/config",
        r#"{"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(DEADLINE, "proxy-defaults merged", || {
        let svc = a.get_json("/v1/agent/service/web-proxy");
        (svc["Proxy"]["Config"]["protocol"] == "http").then_some(())
    });
    let first = a.get("/v1/agent/service/web-proxy");
    let hash = first.header("x-consul-contenthash").unwrap().to_string();
    assert_eq!(first.json()["ContentHash"], hash.as_str());

    // A change to an entry: a hash-blocking read wakes with it.
    let addr = a.http_addr;
    let path = format!("/v1/agent/service/web-proxy?hash={hash}&wait=20s");
    let waiter = std::thread::spawn(move || common::request(addr, "GET", &path, None));
    let t0 = Instant::now();
    let r = s.put(
        "/v1/config",
        r#"{"Kind": "service-defaults", "Name": "web", "Protocol": "grpc"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let woke = waiter.join().unwrap().json();
    eprintln!(
        "config entry change reached the agent in {:?}",
        t0.elapsed()
    );
    assert_eq!(woke["Proxy"]["Config"]["protocol"], "grpc", "{woke}");
    assert_ne!(woke["ContentHash"], hash.as_str());
    // Anti-entropy writes the merged registration to the catalog too.
    eventually(DEADLINE, "merged proxy in the catalog", || {
        let rows = instances(&s, "web-proxy");
        (rows.first()?.1["ServiceProxy"]["Config"]["protocol"] == "grpc").then_some(())
    });
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    for (path, body, want) in [
        (
            "/v1/agent/service/register",
            "{not json",
            "Request decode failed",
        ),
        ("/v1/agent/service/register", "[1, 2]", "JSON object"),
        ("/v1/agent/service/register", r#"{"Port": 80}"#, "name"),
        (
            "/v1/agent/service/register",
            r#"{"Name": "w", "Port": "eighty"}"#,
            "Request decode failed",
        ),
        (
            "/v1/agent/service/register",
            r#"{"Name": "w", "Port": 99999}"#,
            "port",
        ),
        (
            "/v1/agent/service/register",
            r#"{"Name": "w", "Check": {"Args": ["/bin/true"], "Interval": "1s"}}"#,
            "Scripts are disabled on this agent",
        ),
        (
            "/v1/agent/service/register",
            r#"{"Name": "w", "Check": {"HTTP": "http://x", "Interval": "soon"}}"#,
            "Invalid Interval",
        ),
        (
            "/v1/agent/service/register",
            r#"{"Name": "w", "Connect": {"SidecarService": {"ID": "mine"}}}"#,
            "cannot set its ID",
        ),
        (
            "/v1/agent/service/register",
            r#"{"Name": "w", "Connect": {"SidecarService": {"Kind": "mesh-gateway"}}}"#,
            "cannot set Kind",
        ),
        (
            "/v1/agent/service/register",
            r#"{"Name": "w", "Check": {"TCP": "x:1", "Interval": "1s",
                "FailuresBeforeWarning": 3, "FailuresBeforeCritical": 1}}"#,
            "FailuresBeforeWarning",
        ),
        (
            "/v1/agent/check/register",
            r#"{"TTL": "1s"}"#,
            "Missing check name",
        ),
        (
            "/v1/agent/check/register",
            r#"{"Name": "serfHealth", "TTL": "1s"}"#,
            "reserved",
        ),
    ] {
        let r = a.put(path, body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        assert!(r.body.contains(want), "{path} {body}: {}", r.body);
        assert_eq!(r.body.trim().lines().count(), 1, "one line: {}", r.body);
    }
    assert_eq!(a.put("/v1/agent/service/deregister/nope", "").status, 404);
    assert_eq!(a.put("/v1/agent/check/deregister/nope", "").status, 404);
    // A check for a service the agent lacks: Consul's 404, its words.
    let r = a.put(
        "/v1/agent/check/register",
        r#"{"Name": "c", "TTL": "1s", "ServiceID": "nope"}"#,
    );
    assert_eq!(
        (r.status, r.body.trim()),
        (404, r#"ServiceID "nope" does not exist"#)
    );
    assert_eq!(a.get("/v1/agent/service/nope").status, 404);
    assert_eq!(
        a.get("/v1/agent/services?filter=Nope%20%3D%3D%201").status,
        400
    );
    // An agent route that does not exist (host is served now).
    assert_eq!(a.get("/v1/agent/no-such-route").status, 404);
    assert_eq!(a.get("/v1/agent/health/service/id/nope").status, 404);
    assert_eq!(a.get("/v1/agent/health/service/name/nope").status, 404);
    let r = a.get("/v1/agent/health/service/id/");
    assert_eq!((r.status, r.body.as_str()), (400, "Missing serviceID"));
    let r = a.get("/v1/agent/health/service/name/");
    assert_eq!((r.status, r.body.as_str()), (400, "Missing service Name"));
    assert_eq!(a.get_json("/v1/agent/services"), json!({}));
    assert_eq!(a.get_json("/v1/agent/checks"), json!({}));
    // The agent is still fine, and registers good input.
    put_ok(&a, "/v1/agent/service/register", json!({"Name": "ok"}));
    let filtered = a.get_json("/v1/agent/services?filter=Service%20%3D%3D%20ok");
    assert!(filtered.get("ok").is_some(), "{filtered}");
    // A plain service has no Connect and no Proxy, as Consul shows it.
    for view in [filtered["ok"].clone(), a.get_json("/v1/agent/service/ok")] {
        let o = view.as_object().unwrap();
        assert!(
            !o.contains_key("Connect") && !o.contains_key("Proxy"),
            "{view}"
        );
    }
}

#[test]
fn cli_services_commands_talk_to_the_agent() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api.hcl");
    std::fs::write(&file, "service {\n  name = \"api\"\n  port = 9000\n}\n").unwrap();
    let out = common::cli(&a.url, &["services", "register", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(a.get_json("/v1/agent/services")["api"]["Port"], 9000);
    // Owned by the agent, so anti-entropy keeps it.
    eventually(DEADLINE, "api in the catalog", || {
        (instances(&s, "api").len() == 1).then_some(())
    });
    wait_full_syncs(&a, 2.0);
    assert_eq!(instances(&s, "api").len(), 1);
    let out = common::cli(&a.url, &["services", "deregister", "api"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(DEADLINE, "api gone", || {
        instances(&s, "api").is_empty().then_some(())
    });
}

/// Leases survive a leader change: a new leader gives live agents a grace
/// period, then marks the ones that died (even with the old leader).
#[test]
fn liveness_survives_a_leader_change() {
    let mut servers = Server::cluster(3);
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let agent = |name: &str| {
        let mut b = Agent::builder(name, &urls[0]);
        for u in &urls[1..] {
            b = b.server(u);
        }
        b.start()
    };
    let a1 = agent("a1");
    let mut a2 = agent("a2");
    put_ok(&a1, "/v1/agent/service/register", json!({"Name": "web"}));
    eventually(DEADLINE, "both agents alive", || {
        let ok = ["a1", "a2"]
            .iter()
            .all(|n| check_status(&servers[0], n, "serfHealth").as_deref() == Some("passing"));
        ok.then_some(())
    });

    // The leader and an agent die together.
    let leader = servers[0].get_json("/v1/status/leader");
    let li = servers
        .iter()
        .position(|s| json!(s.raft_addr.to_string()) == leader)
        .expect("a leader among the servers");
    servers[li].kill();
    a2.kill();
    let survivor = &servers[(li + 1) % 3];
    eventually(DEADLINE, "a2 critical under the new leader", || {
        (check_status(survivor, "a2", "serfHealth").as_deref() == Some("critical")).then_some(())
    });
    assert_eq!(
        check_status(survivor, "a1", "serfHealth").as_deref(),
        Some("passing")
    );
    // a1 keeps syncing through the surviving servers.
    put_ok(&a1, "/v1/agent/service/register", json!({"Name": "api"}));
    eventually(DEADLINE, "api in the catalog", || {
        (instances(survivor, "api").len() == 1).then_some(())
    });
}

/// A connect proxy instance of `parent` in the catalog with the given ID.
fn proxy_of(s: &Server, parent: &str, id: &str) -> Option<Value> {
    s.get_json(&format!("/v1/catalog/connect/{parent}"))
        .as_array()?
        .iter()
        .find(|r| r["ServiceID"] == id)
        .cloned()
}

/// A check's status in the `/v1/health/connect/:parent` entry of proxy `id`.
fn connect_check(s: &Server, parent: &str, id: &str, check: &str) -> Option<String> {
    let rows = s.get_json(&format!("/v1/health/connect/{parent}"));
    let row = rows
        .as_array()?
        .iter()
        .find(|r| r["Service"]["ID"] == id)?
        .clone();
    row["Checks"]
        .as_array()?
        .iter()
        .find(|c| c["CheckID"] == check)
        .map(|c| c["Status"].as_str().unwrap_or("").to_string())
}

#[test]
fn sidecar_services_from_a_config_dir_and_the_api_become_connect_proxies() {
    let s = Server::dev();
    let dir = tempfile::tempdir().unwrap();
    // Consul's HCL for a sidecar: nested blocks, one upstream block.
    std::fs::write(
        dir.path().join("a-pay.hcl"),
        include_str!("fixtures/pay-sidecar.hcl"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b-shop.json"),
        r#"{"service": {"name": "shop", "port": 7100, "connect": {"sidecar_service": {}}}}"#,
    )
    .unwrap();
    let mut a = Agent::builder("a1", &s.url).config_dir(dir.path()).start();
    let local = a.get_json("/v1/agent/services");
    assert_eq!(local["pay-sidecar-proxy"]["Port"], 21000, "{local}");
    assert_eq!(local["shop-sidecar-proxy"]["Port"], 21001, "{local}");
    assert_eq!(local["pay-sidecar-proxy"]["Kind"], "connect-proxy");

    register(
        &a,
        json!({"Name": "web", "Port": 8080, "Tags": ["v1"], "Meta": {"team": "a"},
               "Check": {"CheckID": "web-ttl", "TTL": "10m", "Status": "passing"},
               "Connect": {"SidecarService": {"Proxy": {
                   "Upstreams": [{"DestinationName": "db", "LocalBindPort": 9292}]}}}}),
    );
    let web_proxy = eventually(DEADLINE, "web's sidecar in the catalog", || {
        proxy_of(&s, "web", "web-sidecar-proxy")
    });
    assert_eq!(web_proxy["ServiceKind"], "connect-proxy");
    assert_eq!(web_proxy["ServiceName"], "web-sidecar-proxy");
    assert_eq!(web_proxy["ServicePort"], 21002);
    assert_eq!(web_proxy["ServiceTags"], json!(["v1"]));
    assert_eq!(web_proxy["ServiceMeta"], json!({"team": "a"}));
    let p = &web_proxy["ServiceProxy"];
    assert_eq!(p["DestinationServiceName"], "web");
    assert_eq!(p["DestinationServiceID"], "web");
    assert_eq!(p["LocalServiceAddress"], "127.0.0.1");
    assert_eq!(p["LocalServicePort"], 8080);
    assert_eq!(p["Upstreams"][0]["DestinationName"], "db");
    assert_eq!(p["Upstreams"][0]["LocalBindPort"], 9292);
    let pay_proxy = eventually(DEADLINE, "pay's sidecar in the catalog", || {
        proxy_of(&s, "pay", "pay-sidecar-proxy")
    });
    assert_eq!(pay_proxy["ServiceProxy"]["LocalServicePort"], 7000);
    assert_eq!(
        pay_proxy["ServiceProxy"]["Upstreams"][0]["LocalBindPort"],
        9191
    );

    // Consul's default checks: a TCP check on the proxy's port, and an
    // alias of the parent, which follows web's health.
    let checks = a.get_json("/v1/agent/checks");
    let tcp = &checks["service:web-sidecar-proxy:1"];
    assert_eq!(tcp["Name"], "Connect Sidecar Listening");
    assert_eq!(tcp["Definition"]["TCP"], "127.0.0.1:21002", "{tcp}");
    let alias_in_catalog = |want: &str| {
        eventually(
            DEADLINE,
            &format!("the alias check {want} in the catalog"),
            || {
                let st = connect_check(
                    &s,
                    "web",
                    "web-sidecar-proxy",
                    "service:web-sidecar-proxy:2",
                );
                (st.as_deref() == Some(want)).then_some(())
            },
        )
    };
    alias_in_catalog("passing");
    put_ok(&a, "/v1/agent/check/fail/web-ttl", json!({}));
    alias_in_catalog("critical");
    put_ok(&a, "/v1/agent/check/pass/web-ttl", json!({}));
    assert_eq!(
        a.get_json("/v1/agent/checks")["service:web-sidecar-proxy:2"]["Status"],
        "passing",
        "an alias follows at once"
    );

    // Central config is merged into a sidecar like into any agent proxy.
    let r = s.put(
        "/v1/config",
        r#"{"Kind": "service-defaults", "Name": "web", "Protocol": "http"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(DEADLINE, "service-defaults merged into the sidecar", || {
        let svc = a.get_json("/v1/agent/service/web-sidecar-proxy");
        (svc["Proxy"]["Config"]["protocol"] == "http").then_some(())
    });

    // Deregistering the parent deregisters its sidecar.
    put_ok(&a, "/v1/agent/service/deregister/web", json!({}));
    assert!(
        a.get_json("/v1/agent/services")
            .get("web-sidecar-proxy")
            .is_none()
    );
    eventually(
        DEADLINE,
        "web and its sidecar gone from the catalog",
        || {
            let gone =
                instances(&s, "web").is_empty() && instances(&s, "web-sidecar-proxy").is_empty();
            gone.then_some(())
        },
    );

    // A restart without pay's file: pay and its sidecar go, shop's sidecar
    // keeps its port (the lowest free one would now be 21000).
    std::fs::remove_file(dir.path().join("a-pay.hcl")).unwrap();
    a.restart();
    let local = a.get_json("/v1/agent/services");
    assert!(local.get("pay-sidecar-proxy").is_none(), "{local}");
    assert_eq!(local["shop-sidecar-proxy"]["Port"], 21001, "{local}");
    eventually(DEADLINE, "pay's sidecar gone from the catalog", || {
        instances(&s, "pay-sidecar-proxy").is_empty().then_some(())
    });
}

#[test]
fn threshold_checks_flip_only_after_n_results_and_local_health_follows() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    // Nothing listens there yet.
    let port = common::free_port();
    let t0 = Instant::now();
    register(
        &a,
        json!({"Name": "db", "Port": port, "Check": {
            "CheckID": "db-tcp", "TCP": format!("127.0.0.1:{port}"), "Interval": "1s",
            "Status": "passing", "SuccessBeforePassing": 2, "FailuresBeforeCritical": 3}}),
    );
    assert_eq!(a.get("/v1/agent/health/service/id/db").status, 200);
    let status = || a.get_json("/v1/agent/checks")["db-tcp"]["Status"].clone();
    eventually(DEADLINE, "db-tcp critical", || {
        (status() == "critical").then_some(())
    });
    // The third failure comes two intervals after the first, at the
    // earliest (without the threshold, the first turns it critical).
    let took = t0.elapsed();
    eprintln!("three failures took {took:?}");
    assert!(
        took >= Duration::from_millis(1900),
        "critical after {took:?}"
    );
    let r = a.get("/v1/agent/health/service/id/db?format=text");
    assert_eq!((r.status, r.body.trim()), (503, "critical"));
    let by_name = a.get("/v1/agent/health/service/name/db");
    assert_eq!(by_name.status, 503);
    assert_eq!(by_name.json()[0]["AggregatedStatus"], "critical");
    assert_eq!(by_name.json()[0]["Service"]["ID"], "db");
    eventually(DEADLINE, "critical in the catalog", || {
        (check_status(&s, "a1", "db-tcp").as_deref() == Some("critical")).then_some(())
    });

    // Listening now: two successes in a row to pass.
    let _listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind the port");
    let t1 = Instant::now();
    eventually(DEADLINE, "db-tcp passing", || {
        (status() == "passing").then_some(())
    });
    let took = t1.elapsed();
    eprintln!("two successes took {took:?}");
    assert!(took >= Duration::from_millis(900), "passing after {took:?}");
    let r = a.get("/v1/agent/health/service/id/db");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["AggregatedStatus"], "passing");
    assert_eq!(r.json()["Checks"][0]["CheckID"], "db-tcp");
    assert!(
        r.json()["Checks"][0]["Definition"]
            .get("SuccessBeforePassing")
            .is_none(),
        "thresholds stay on the agent"
    );

    // A warning is 429.
    put_ok(
        &a,
        "/v1/agent/check/register",
        json!({"Name": "db-ttl", "ServiceID": "db", "TTL": "10m", "Status": "warning"}),
    );
    let r = a.get("/v1/agent/health/service/name/db?format=text");
    assert_eq!((r.status, r.body.trim()), (429, "warning"));
}

/// Whether `service` has an instance on `node` in `/v1/health/service`
/// with `?passing`.
fn passing_on(s: &Server, service: &str, node: &str) -> bool {
    s.get_json(&format!("/v1/health/service/{service}?passing"))
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["Node"]["Node"] == node)
}

/// Every server is the agent of its own node: the agent API registers on
/// it, answering once the catalog has the change, TTL checks flip health,
/// and the node gets a `serfHealth` check as an agent's does.
#[test]
fn a_server_is_the_agent_of_its_own_node() {
    let s = Server::builder().dev().node("srv").start();
    // From its start, the server's node is in the catalog with a passing
    // serfHealth, and the server is the `consul` service at its Raft
    // port, as in Consul (Patroni's sessions name `serfHealth`).
    common::eventually(Duration::from_secs(10), "the server's own node", || {
        let checks = s.get_json("/v1/health/node/srv");
        let consul = s.get_json("/v1/catalog/service/consul");
        (checks[0]["CheckID"] == "serfHealth"
            && checks[0]["Status"] == "passing"
            && consul[0]["Node"] == "srv"
            && consul[0]["ServicePort"] == s.raft_addr.port())
        .then_some(())
    });
    let r = s.put(
        "/v1/agent/service/register",
        &json!({"Name": "web", "ID": "web-1", "Port": 8080, "Tags": ["v1"],
                "Check": {"CheckID": "web-ttl", "TTL": "10m"}})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // In the catalog as soon as the write answered (no waiting).
    let rows = instances(&s, "web");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, "srv");
    assert_eq!(rows[0].1["ServicePort"], 8080);
    assert_eq!(rows[0].1["Address"], "127.0.0.1");
    // A TTL check starts critical: not passing until the client says so.
    assert!(!passing_on(&s, "web", "srv"));
    let r = s.put("/v1/agent/check/pass/web-ttl?note=ok", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(passing_on(&s, "web", "srv"));
    let r = s.put(
        "/v1/agent/check/update/web-ttl",
        r#"{"Status": "critical", "Output": "down"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!passing_on(&s, "web", "srv"));
    assert_eq!(
        check_status(&s, "srv", "web-ttl").as_deref(),
        Some("critical")
    );
    eventually(DEADLINE, "the server's node alive", || {
        (check_status(&s, "srv", "serfHealth").as_deref() == Some("passing")).then_some(())
    });

    // The agent's own views.
    let services = s.get_json("/v1/agent/services");
    assert_eq!(services["web-1"]["Service"], "web");
    assert_eq!(services["web-1"]["Datacenter"], "dc1");
    assert_eq!(s.get_json("/v1/agent/service/web-1")["Tags"], json!(["v1"]));
    assert_eq!(s.get_json("/v1/agent/checks")["web-ttl"]["Output"], "down");
    assert_eq!(s.get("/v1/agent/health/service/id/web-1").status, 503);
    // A node check through the agent, and away again.
    let r = s.put(
        "/v1/agent/check/register",
        r#"{"Name": "disk", "TTL": "10m", "Status": "passing"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(check_status(&s, "srv", "disk").as_deref(), Some("passing"));
    assert_eq!(s.put("/v1/agent/check/deregister/disk", "").status, 200);
    assert_eq!(check_status(&s, "srv", "disk"), None);
    // The server lists itself once, as a server.
    let members = s.get_json("/v1/agent/members");
    assert_eq!(members.as_array().unwrap().len(), 1, "{members}");
    assert_eq!(members[0]["Tags"]["role"], "consul");

    assert_eq!(s.put("/v1/agent/service/deregister/web-1", "").status, 200);
    assert!(instances(&s, "web").is_empty());
    assert_eq!(s.put("/v1/agent/service/deregister/web-1", "").status, 404);
}

/// A service's `Locality` (region and zone) is kept as given: through a
/// client agent to the catalog and back, in the agent's, catalog's and
/// health views, and on a catalog registration; a plain service has none.
#[test]
fn a_services_locality_is_stored_and_returned() {
    let s = Server::builder().dev().node("srv").start();
    let a = Agent::builder("a1", &s.url).start();
    let here = json!({"Region": "us-west-1", "Zone": "us-west-1a"});
    register(&a, json!({"Name": "web", "Port": 80, "Locality": here}));
    register(&a, json!({"Name": "db", "Port": 5432}));
    assert_eq!(a.get_json("/v1/agent/service/web")["Locality"], here);
    assert!(
        a.get_json("/v1/agent/services")["db"]
            .get("Locality")
            .is_none()
    );
    let rows = eventually(DEADLINE, "web in the catalog", || {
        let rows = instances(&s, "web");
        (!rows.is_empty()).then_some(rows)
    });
    assert_eq!(rows[0].1["ServiceLocality"], here, "{:?}", rows[0]);
    let health = s.get_json("/v1/health/service/web");
    assert_eq!(health[0]["Service"]["Locality"], here, "{health}");
    // In sync: anti-entropy does not keep rewriting it.
    wait_full_syncs(&a, 2.0);
    assert_eq!(
        instances(&s, "web")[0].1["ModifyIndex"],
        rows[0].1["ModifyIndex"]
    );
    let db = eventually(DEADLINE, "db in the catalog", || instances(&s, "db").pop());
    assert!(db.1.get("ServiceLocality").is_none(), "{:?}", db);

    let zone = json!({"Zone": "b"});
    let r = s.put(
        "/v1/catalog/register",
        &json!({"Node": "n1", "Address": "10.0.0.9",
                "Service": {"Service": "api", "Locality": zone}})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(instances(&s, "api")[0].1["ServiceLocality"], zone);
    let node = s.get_json("/v1/catalog/node/n1");
    assert_eq!(node["Services"]["api"]["Locality"], zone, "{node}");
}

/// `/v1/agent/self` carries what clients read (Consul's `Config` and
/// `DebugConfig` fields), on a server and on a client agent.
#[test]
fn agent_self_tells_clients_what_they_read() {
    let s = Server::builder().dev().node("srv").start();
    let me = s.get_json("/v1/agent/self");
    let config = &me["Config"];
    assert_eq!(config["Datacenter"], "dc1");
    assert_eq!(config["NodeName"], "srv");
    assert_eq!(config["Server"], true);
    // Nomad constrains every task with a Consul service to
    // `${attr.consul.version} >= 1.7.0`: a Consul semver, cairn's own
    // version beside it.
    let version: Vec<u64> = config["Version"]
        .as_str()
        .unwrap()
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        version.len() == 3 && version >= vec![1, 7, 0],
        "{version:?}"
    );
    assert_eq!(
        config["VersionMetadata"],
        concat!("cairn-", env!("CARGO_PKG_VERSION"))
    );
    // Nomad picks the Envoy image from xDS.SupportedProxies.
    assert_eq!(me["xDS"]["Port"], s.grpc_addr.port());
    assert!(
        !me["xDS"]["SupportedProxies"]["envoy"][0]
            .as_str()
            .unwrap()
            .is_empty()
    );
    let id = config["NodeID"].as_str().unwrap();
    assert!(uuid_like(id), "{id}");
    // Patroni reads Config.SessionTTLMin in nanoseconds; Nomad and
    // `consul connect envoy` read DebugConfig.GRPCPort for xDS (plain
    // gRPC here; GRPCTLSPort with TLS; -1: none).
    assert_eq!(config["SessionTTLMin"], 10_000_000_000u64);
    let debug = &me["DebugConfig"];
    assert_eq!(debug["GRPCPort"], s.grpc_addr.port());
    assert_eq!(debug["GRPCTLSPort"], -1);
    assert_eq!(debug["HTTPSPort"], -1);
    assert_eq!(debug["SessionTTLMin"], "10s");
    assert_eq!(debug["HTTPPort"], s.http_addr.port());
    assert_eq!(debug["ServerMode"], true);
    assert_eq!(debug["NodeName"], "srv");
    assert_eq!(debug["ACLsEnabled"], false);
    // `consul info` and py-consul read Stats as strings, and the agent's
    // coordinate beside them; leader_addr is what /v1/status/leader says.
    assert_eq!(me["Coord"]["Vec"].as_array().map(Vec::len), Some(8), "{me}");
    let stats = &me["Stats"];
    assert_eq!(stats["consul"]["server"], "true", "{stats}");
    assert_eq!(stats["consul"]["leader"], "true", "{stats}");
    assert_eq!(stats["consul"]["acl"], "disabled", "{stats}");
    assert_eq!(stats["consul"]["known_datacenters"], "1", "{stats}");
    assert_eq!(
        stats["consul"]["leader_addr"],
        s.get_json("/v1/status/leader")
    );
    assert_eq!(stats["raft"]["state"], "Leader", "{stats}");
    assert_eq!(stats["agent"]["services"], "0", "{stats}");
    assert_eq!(stats["build"]["version"], config["Version"], "{stats}");
    assert!(stats["runtime"]["os"].is_string(), "{stats}");
    // The node registers with the same ID.
    let r = s.put("/v1/agent/service/register", r#"{"Name": "x"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(instances(&s, "x")[0].1["ID"], id);

    let a = Agent::builder("a1", &s.url).start();
    let me = a.get_json("/v1/agent/self");
    assert_eq!(me["Config"]["Server"], false);
    assert_eq!(me["Config"]["NodeName"], "a1");
    assert_eq!(me["DebugConfig"]["ServerMode"], false);
    assert_eq!(me["DebugConfig"]["HTTPPort"], a.http_addr.port());
    assert_eq!(
        me["DebugConfig"]["GRPCPort"], -1,
        "a client agent serves no xDS"
    );
    assert_eq!(me["xDS"], serde_json::Value::Null);
    assert_eq!(me["Config"]["Version"], config["Version"]);
    assert_eq!(me["Stats"]["consul"]["server"], "false", "{me}");
    assert_eq!(me["Stats"]["consul"]["known_servers"], "1", "{me}");
    assert_eq!(me["Coord"]["Vec"].as_array().map(Vec::len), Some(8), "{me}");
}

fn uuid_like(s: &str) -> bool {
    let parts: Vec<usize> = s.split('-').map(str::len).collect();
    parts == [8, 4, 4, 4, 12] && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// `/v1/agent/metrics` answers Consul's JSON form, and Prometheus text with
/// `?format=prometheus`, on a server and on a client agent.
#[test]
fn agent_metrics_json_and_prometheus() {
    let s = Server::dev();
    let r = s.get("/v1/agent/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    let m = r.json();
    assert!(
        m["Timestamp"].as_str().unwrap().ends_with(" +0000 UTC"),
        "{m}"
    );
    assert!(m["Points"].is_array() && m["Samples"].is_array(), "{m}");
    let gauge = |name: &str| {
        m["Gauges"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["Name"] == name)
            .map(|g| g["Value"].as_f64().unwrap())
    };
    assert_eq!(gauge("cairn_raft_is_leader"), Some(1.0));
    assert_eq!(gauge("cairn_agent_services"), Some(0.0));
    let requests = m["Counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["Name"] == "cairn_http_requests_total")
        .expect("request counter");
    assert!(requests["Count"].as_u64().unwrap() > 0, "{requests}");

    let r = s.get("/v1/agent/metrics?format=prometheus");
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    assert!(
        r.body
            .contains("# TYPE cairn_raft_is_leader gauge\ncairn_raft_is_leader 1")
    );

    let a = Agent::builder("a1", &s.url).start();
    let m = a.get_json("/v1/agent/metrics");
    assert!(
        m["Counters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["Name"] == "cairn_agent_heartbeats_total"),
        "{m}"
    );
    assert!(
        a.get("/v1/agent/metrics?format=prometheus")
            .body
            .contains("# TYPE cairn_agent_heartbeats counter\n")
    );
}

/// Maintenance mode as Consul: on a server (node-wide) and on a client
/// agent (one service), through the HTTP API and `cairn maint`; health
/// drops the instances while it is on, and gets them back after.
#[test]
fn maintenance_mode_on_servers_and_agents() {
    let s = Server::builder().dev().node("srv").start();
    let a = Agent::builder("a1", &s.url).start();
    let passing = json!({"Name": "web", "Check": {"TTL": "10m", "Status": "passing"}});
    let r = s.put("/v1/agent/service/register", &passing.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    put_ok(&a, "/v1/agent/service/register", passing);
    eventually(DEADLINE, "web passing on both nodes", || {
        (passing_on(&s, "web", "srv") && passing_on(&s, "web", "a1")).then_some(())
    });

    // The server's node in maintenance: its instance drops, a1's stays.
    let r = s.put(
        "/v1/agent/maintenance?enable=true&reason=kernel+upgrade",
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!passing_on(&s, "web", "srv"));
    assert!(passing_on(&s, "web", "a1"));
    let checks = s.get_json("/v1/health/node/srv");
    let maint = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["CheckID"] == "_node_maintenance")
        .expect("maintenance check");
    assert_eq!(maint["Status"], "critical");
    assert_eq!(maint["Notes"], "kernel upgrade");
    assert_eq!(maint["Name"], "Node Maintenance Mode");
    assert_eq!(s.put("/v1/agent/maintenance?enable=false", "").status, 200);
    assert!(passing_on(&s, "web", "srv"));
    assert_eq!(check_status(&s, "srv", "_node_maintenance"), None);

    // One service on the client agent, by the CLI.
    let o = common::cli(
        &a.url,
        &["maint", "-enable", "-service", "web", "-reason", "deploy"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "Service maintenance is now enabled for \"web\""
    );
    assert!(!passing_on(&s, "web", "a1"));
    assert!(passing_on(&s, "web", "srv"));
    let check = &a.get_json("/v1/agent/checks")["_service_maintenance:web"];
    assert_eq!(check["Status"], "critical");
    assert_eq!(check["Notes"], "deploy");
    assert_eq!(check["ServiceID"], "web");
    let o = common::cli(&a.url, &["maint"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("ID:     web"));
    let o = common::cli(&a.url, &["maint", "-disable", "-service", "web"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(passing_on(&s, "web", "a1"));

    // The node-wide form by the CLI, against the server.
    let o = common::cli(&s.url, &["maint", "-enable"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!passing_on(&s, "web", "srv"));
    let o = common::cli(&s.url, &["maint", "-disable"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(passing_on(&s, "web", "srv"));

    // Refused: no enable, a bad one, an unknown service (nothing changes).
    let r = a.put("/v1/agent/service/maintenance/web", "");
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Missing value for enable")
    );
    assert_eq!(s.put("/v1/agent/maintenance?enable=maybe", "").status, 400);
    let r = s.put("/v1/agent/service/maintenance/?enable=true", "");
    assert_eq!((r.status, r.body.as_str()), (400, "Missing service ID"));
    let r = s.put("/v1/agent/service/maintenance/nope?enable=true", "");
    assert_eq!(r.status, 404, "{}", r.body);
    let o = common::cli(&a.url, &["maint", "-enable", "-service", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(passing_on(&s, "web", "srv") && passing_on(&s, "web", "a1"));
}

/// A server's agent-registered services, and its maintenance mode, are
/// kept in its data dir: a restarted server has them in its agent and
/// keeps them in the catalog.
#[test]
fn a_restarted_server_keeps_its_agent_services() {
    let dir = tempfile::tempdir().unwrap();
    let builder = Server::durable("srv", dir.path());
    let mut s = builder.clone().start();
    let r = s.put(
        "/v1/agent/service/register",
        r#"{"Name": "web", "ID": "web-1", "Check": {"TTL": "10m", "Status": "passing"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.put("/v1/agent/maintenance?enable=true", "").status, 200);
    let id = s.get_json("/v1/agent/self")["Config"]["NodeID"].clone();
    s.stop(Duration::from_secs(10));

    let s = builder.start();
    assert_eq!(s.get_json("/v1/agent/services")["web-1"]["Service"], "web");
    assert_eq!(s.get_json("/v1/agent/self")["Config"]["NodeID"], id);
    assert_eq!(
        s.get_json("/v1/agent/checks")["_node_maintenance"]["Status"],
        "critical"
    );
    // After the restarted agent's full sync the catalog still has them.
    eventually(DEADLINE, "a full sync after the restart", || {
        let m = s.get_json("/v1/agent/metrics");
        let synced =
            m["Counters"].as_array().unwrap().iter().any(|c| {
                c["Name"] == "cairn_agent_full_syncs_total" && c["Count"].as_u64() >= Some(1)
            });
        synced.then_some(())
    });
    assert_eq!(instances(&s, "web").len(), 1);
    assert_eq!(
        check_status(&s, "srv", "_node_maintenance").as_deref(),
        Some("critical")
    );
    assert_eq!(s.put("/v1/agent/maintenance?enable=false", "").status, 200);
    assert!(passing_on(&s, "web", "srv"));
}

/// In a cluster, a follower is the agent of its own node too: its agent
/// writes reach the leader's catalog through the usual forwarding, its
/// maintenance mode drops its instance, and a killed follower's node turns
/// critical as any agent's does.
#[test]
fn a_follower_server_is_an_agent_too() {
    let mut servers = Server::cluster(3);
    let leader = servers[0].get_json("/v1/status/leader");
    let li = servers
        .iter()
        .position(|s| json!(s.raft_addr.to_string()) == leader)
        .expect("a leader among the servers");
    let fi = (li + 1) % 3;
    let follower = format!("s{fi}");
    let body = json!({"Name": "web", "Check": {"TTL": "10m", "Status": "passing"}});
    let r = servers[fi].put("/v1/agent/service/register", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    // Answered once the leader has it.
    assert_eq!(instances(&servers[li], "web")[0].0, follower);
    eventually(DEADLINE, "the follower's node alive", || {
        (check_status(&servers[li], &follower, "serfHealth").as_deref() == Some("passing"))
            .then_some(())
    });
    assert!(passing_on(&servers[li], "web", &follower));
    // Three servers, each listed once.
    let members = servers[li].get_json("/v1/agent/members");
    assert_eq!(members.as_array().unwrap().len(), 3, "{members}");

    let r = servers[fi].put("/v1/agent/maintenance?enable=true", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!passing_on(&servers[li], "web", &follower));
    let r = servers[fi].put("/v1/agent/maintenance?enable=false", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(passing_on(&servers[li], "web", &follower));

    servers[fi].kill();
    eventually(DEADLINE, "the killed follower's node critical", || {
        (check_status(&servers[li], &follower, "serfHealth").as_deref() == Some("critical"))
            .then_some(())
    });
    assert!(!passing_on(&servers[li], "web", &follower));
}

#[test]
fn a_session_made_through_an_agent_belongs_to_the_agents_node() {
    let s = Server::builder().dev().node("sess-server").start();
    let a = Agent::builder("sess-agent", &s.url).start();
    eventually(DEADLINE, "the agent's node is live", || {
        (check_status(&s, "sess-agent", "serfHealth").as_deref() == Some("passing")).then_some(())
    });

    // A session created through the agent with `body`, as the server has it.
    let create = |body: &str| {
        let r = a.put("/v1/session/create", body);
        assert_eq!(r.status, 200, "{}", r.body);
        let id = r.json()["ID"].as_str().unwrap().to_string();
        s.get_json(&format!("/v1/session/info/{id}"))
    };

    // No body at all, as `consul lock` and py-consul may send.
    let info = create("");
    assert_eq!(info[0]["Node"], "sess-agent", "{info}");
    // Its node's liveness guards it, as the agent's own session should be.
    assert_eq!(info[0]["NodeChecks"], json!(["serfHealth"]), "{info}");

    // A body naming another node (any key case) keeps that node.
    let info = create(&json!({"node": "sess-server"}).to_string());
    assert_eq!(info[0]["Node"], "sess-server", "{info}");

    // Bad JSON is still the server's 400, not a panic or a default.
    assert_eq!(a.put("/v1/session/create", "{nope").status, 400);
}

/// A server restarted with nothing registered on its node keeps its node
/// alive: its agent heartbeats from the start, so `serfHealth` passes and
/// a session bound to it (Patroni's `checks: [serfHealth]`) can be made.
#[test]
fn a_restarted_server_with_no_services_keeps_its_serf_health_passing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::durable("lonely", dir.path()).start();
    let r = s.put("/v1/agent/service/register", r#"{"Name": "x"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.put("/v1/agent/service/deregister/x", "").status, 200);
    s.restart();
    s.wait_for_leader(DEADLINE);
    // Its agent heartbeats again after the restart (the lease that keeps
    // serfHealth passing), and the session takes the check.
    eventually(DEADLINE, "a heartbeat after the restart", || {
        (s.metric("cairn_agent_heartbeats_total") >= 1.0).then_some(())
    });
    let r = s.put(
        "/v1/session/create",
        r#"{"Name": "patroni", "Checks": ["serfHealth"], "TTL": "30s"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let checks = s.get_json("/v1/health/node/lonely");
    assert_eq!(checks[0]["CheckID"], "serfHealth");
    assert_eq!(checks[0]["Status"], "passing");
}

/// Request bodies' keys match in any letter case, as Go's decoder does in
/// Consul: python-consul sends `enabletagoverride`, others `name`, `port`.
#[test]
fn an_agent_registration_with_keys_in_any_case_is_taken_whole() {
    let s = Server::builder().dev().node("srv").start();
    let r = s.put(
        "/v1/agent/service/register",
        r#"{"name": "web", "id": "web-1", "port": 8080, "tags": ["a"], "enabletagoverride": true,
            "META": {"Owner": "team"}, "weights": {"passing": 3, "warning": 1}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let svc = s.get_json("/v1/agent/service/web-1");
    assert_eq!(svc["EnableTagOverride"], true, "{svc}");
    assert_eq!(svc["Port"], 8080);
    assert_eq!(svc["Weights"]["Passing"], 3);
    assert_eq!(svc["Meta"]["Owner"], "team");
    // Sessions and ACL bodies too: one decoder for every body.
    let r = s.put(
        "/v1/session/create",
        r#"{"name": "s", "lockdelay": "7s", "behavior": "delete"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["ID"].as_str().unwrap().to_string();
    let info = s.get_json(&format!("/v1/session/info/{id}"));
    assert_eq!(info[0]["LockDelay"], 7_000_000_000u64, "{info}");
    assert_eq!(info[0]["Behavior"], "delete");
}

/// IDs with `/` (Patroni registers `scope/name`): the rest of the path is
/// the ID, on every agent route that ends in one, as Consul's.
#[test]
fn service_and_check_ids_may_contain_slashes() {
    let s = Server::builder().dev().node("srv").start();
    let r = s.put(
        "/v1/agent/service/register",
        r#"{"Name": "pg", "ID": "scope/node1", "Port": 5432,
            "Check": {"CheckID": "scope/node1/ttl", "TTL": "30s"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let svc = s.get("/v1/agent/service/scope/node1");
    assert_eq!(svc.status, 200, "{}", svc.body);
    assert_eq!(svc.json()["ID"], "scope/node1");
    let r = s.put("/v1/agent/check/pass/scope/node1/ttl", "");
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.put(
        "/v1/agent/check/update/scope/node1/ttl",
        r#"{"Status": "warning"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        s.get_json("/v1/agent/checks")["scope/node1/ttl"]["Status"],
        "warning"
    );
    assert_eq!(s.get("/v1/agent/service/").status, 400);
    let r = s.put("/v1/agent/service/deregister/scope/node1", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.get("/v1/agent/service/scope/node1").status, 404);
    assert_eq!(
        s.put("/v1/agent/check/deregister/scope/node1/ttl", "")
            .status,
        404
    );
}

/// A client agent of a secondary datacenter reports the federation's
/// primary in `/v1/agent/self`, as its servers know it (it reported its
/// own datacenter before).
#[test]
fn a_client_agent_reports_the_primary_datacenter_its_servers_know() {
    let s = Server::builder()
        .dev()
        .datacenter("dc2")
        .primary("dc1")
        .start();
    let me = s.get_json("/v1/agent/self");
    assert_eq!(me["Config"]["PrimaryDatacenter"], "dc1", "{me}");
    let a = Agent::builder("a2", &s.url).start();
    eventually(DEADLINE, "the agent told its datacenters", || {
        let me = a.get_json("/v1/agent/self");
        (me["Config"]["Datacenter"] == "dc2" && me["Config"]["PrimaryDatacenter"] == "dc1")
            .then_some(())
    });
    assert_eq!(
        a.get_json("/v1/agent/self")["DebugConfig"]["PrimaryDatacenter"],
        "dc1"
    );
}

/// Script checks (`Args`) as Consul runs them, and only where allowed:
/// refused by default, from the API only with `enable_script_checks`, from
/// the configuration files with `enable_local_script_checks` too; the exit
/// code is the status (0 passing, 1 warning, else critical), the output
/// (stdout and stderr) the check's, a script past its timeout critical.
#[test]
fn script_checks_run_only_where_enabled() {
    let script =
        |cmd: &str| json!({"Args": ["/bin/sh", "-c", cmd], "Interval": "1s", "Timeout": "2s"});
    let with_id = |id: &str, cmd: &str| {
        let mut c = script(cmd);
        c["Name"] = json!(id);
        c.to_string()
    };
    let off = Server::builder().dev().node("srv").start();
    let r = off.put("/v1/agent/check/register", &with_id("s", "exit 0"));
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            400,
            "Scripts are disabled on this agent; to enable, configure 'enable_script_checks' or 'enable_local_script_checks' to true"
        )
    );
    let svc = json!({"Name": "web", "Check": script("exit 0")}).to_string();
    assert_eq!(off.put("/v1/agent/service/register", &svc).status, 400);
    assert_eq!(off.get_json("/v1/agent/checks"), json!({}));
    assert!(off.get_json("/v1/agent/services").get("web").is_none());
    drop(off);

    let s = Server::builder()
        .dev()
        .node("srv")
        .arg("--enable-script-checks")
        .start();
    for (id, cmd) in [
        ("ok", "echo fine; exit 0"),
        ("warn", "echo careful >&2; exit 1"),
        ("bad", "echo broken; exit 2"),
        ("slow", "sleep 30"),
    ] {
        let r = s.put("/v1/agent/check/register", &with_id(id, cmd));
        assert_eq!(r.status, 200, "{id}: {}", r.body);
    }
    let checks = eventually(DEADLINE, "every script check run", || {
        let c = s.get_json("/v1/agent/checks");
        let ran = c["ok"]["Status"] == "passing"
            && c["warn"]["Status"] == "warning"
            && c["bad"]["Status"] == "critical"
            && c["bad"]["Output"] == "broken\n"
            && c["slow"]["Output"]
                .as_str()
                .is_some_and(|o| o.contains("Timed out"));
        ran.then_some(c)
    });
    assert_eq!(checks["ok"]["Output"], "fine\n");
    assert_eq!(checks["warn"]["Output"], "careful\n");
    assert_eq!(checks["slow"]["Status"], "critical");
    // The catalog has them as the agent does.
    assert_eq!(check_status(&s, "srv", "warn").as_deref(), Some("warning"));
    let self_stats = s.get_json("/v1/agent/self");
    assert_eq!(self_stats["Stats"]["agent"]["check_monitors"], "4");
    drop(s);

    // Enabled with ACLs: registering one still needs node:write (service
    // write for a service's): anonymous and a node:read token are refused.
    let s = common::acl::acl_started(
        Server::builder()
            .dev()
            .node("srv")
            .arg("--enable-script-checks"),
        "deny",
    );
    let (_, reader) = common::acl::token_with_rules(
        s.http_addr,
        "n-read",
        r#"node_prefix "" { policy = "read" }"#,
    );
    for token in ["", reader.as_str()] {
        let r = common::acl::with(
            s.http_addr,
            "PUT",
            "/v1/agent/check/register",
            Some(&with_id("x", "touch /tmp/never")),
            token,
        );
        assert_eq!(r.status, 403, "as {token:?}: {}", r.body);
    }
    let checks = common::acl::with(
        s.http_addr,
        "GET",
        "/v1/agent/checks",
        None,
        common::acl::ROOT,
    );
    assert_eq!(checks.json(), json!({}));
    drop(s);

    // Local only: the files' scripts run, the API's are refused.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.json"),
        json!({"check": {"id": "from-file", "name": "from-file", "args": ["/bin/sh", "-c", "exit 1"], "interval": "1s"}}).to_string(),
    )
    .unwrap();
    let s = Server::builder()
        .dev()
        .node("srv")
        .arg("--enable-local-script-checks")
        .arg("--config-dir")
        .arg(dir.path().to_str().unwrap())
        .start();
    let r = s.put("/v1/agent/check/register", &with_id("api", "exit 0"));
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            400,
            "Scripts are disabled on this agent from remote calls; to enable, configure 'enable_script_checks' to true"
        )
    );
    eventually(DEADLINE, "the file's script check run", || {
        (s.get_json("/v1/agent/checks")["from-file"]["Status"] == "warning").then_some(())
    });
}

/// An agent may start unjoined (Consul's): with no server ever reached it
/// answers `/v1/agent/self` and `/v1/agent/join` itself, and nothing a
/// server would judge; joined later it syncs. Once it has seen servers
/// with ACLs on it remembers that in its data dir: restarted with them out
/// of reach, it no longer answers anonymous callers as an unjoined agent.
#[test]
fn an_unjoined_agent_answers_for_itself_and_joins_later() {
    let nowhere = format!("http://127.0.0.1:{}", common::free_port());
    let mut agent = Agent::builder("late", &nowhere).start();
    let me = agent.get("/v1/agent/self");
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!(me.json()["Config"]["NodeName"], "late");
    let r = agent.put("/v1/agent/service/register", r#"{"Name": "web"}"#);
    assert_eq!(
        r.status, 403,
        "no server to judge a registration: {}",
        r.body
    );

    // A server with ACLs on (default deny), joined afterwards.
    let s = common::acl::deny_server();
    let r = agent.put(&format!("/v1/agent/join/{}", s.http_addr), "");
    assert_eq!(r.status, 200, "{}", r.body);
    // It asks the servers now: anonymous is refused by their rules.
    eventually(
        Duration::from_secs(30),
        "the servers' ACLs in force",
        || (agent.get("/v1/agent/self").status == 403).then_some(()),
    );
    // Restarted with the server gone: what it learnt holds.
    drop(s);
    agent.restart();
    let r = agent.get("/v1/agent/self");
    assert_ne!(r.status, 200, "{}", r.body);
}
