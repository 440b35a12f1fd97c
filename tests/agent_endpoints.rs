//! The agent's operational endpoints against real processes: host, reload,
//! monitor, token, join, force-leave, with ACLs (anonymous and a token one
//! permission short are refused).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::acl::{ROOT, deny_server, token_with_rules, with};
use common::agent::Agent;
use common::{Server, eventually, request};
use serde_json::json;

/// Opens a streamed GET and returns the reader once the answer's head
/// arrived (the server listens from then on), with its status.
fn open_stream(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("X-Consul-Token: {t}\r\n"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let code = status.split_whitespace().nth(1).unwrap().parse().unwrap();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        if l == "\r\n" || l.is_empty() {
            break;
        }
    }
    (code, r)
}

/// Reads the chunked body until a line holding `needle`; that line.
fn line_with(r: &mut BufReader<TcpStream>, needle: &str) -> String {
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap() == 0 {
            panic!("stream ended before a line with {needle:?}");
        }
        if l.contains(needle) {
            return l.trim().to_string();
        }
    }
}

#[test]
fn each_endpoint_refuses_anonymous_and_a_token_one_permission_short() {
    let s = deny_server();
    let a = s.http_addr;
    let (_, agent_write) = token_with_rules(a, "aw", r#"agent_prefix "" { policy = "write" }"#);
    let (_, agent_read) = token_with_rules(a, "ar", r#"agent_prefix "" { policy = "read" }"#);
    let (_, op_read) = token_with_rules(a, "or", r#"operator = "read""#);
    let (_, op_write) = token_with_rules(a, "ow", r#"operator = "write""#);
    let (_, acl_read) = token_with_rules(a, "acr", r#"acl = "read""#);
    // (method, path, body, a token one permission short, one that suffices)
    let cases = [
        ("GET", "/v1/agent/host", None, &agent_write, &op_read),
        ("PUT", "/v1/agent/reload", None, &agent_read, &agent_write),
        (
            "PUT",
            "/v1/agent/token/default",
            Some(r#"{"Token": ""}"#),
            &acl_read,
            &ROOT.to_string(),
        ),
        (
            "PUT",
            "/v1/agent/force-leave/nobody",
            None,
            &op_read,
            &op_write,
        ),
        (
            "PUT",
            "/v1/agent/join/127.0.0.1:1",
            None,
            &agent_read,
            &agent_write,
        ),
    ];
    for (method, path, body, short, enough) in cases {
        let anon = request(a, method, path, body);
        assert_eq!(anon.status, 403, "anonymous {method} {path}: {}", anon.body);
        let r = with(a, method, path, body, short);
        assert_eq!(r.status, 403, "short {method} {path}: {}", r.body);
        assert!(r.body.contains("Permission denied"), "{}", r.body);
        let r = with(a, method, path, body, enough);
        assert_ne!(r.status, 403, "allowed {method} {path}: {}", r.body);
    }
    let (code, _) = open_stream(a, "/v1/agent/monitor", None);
    assert_eq!(code, 403);
    let (code, _) = open_stream(a, "/v1/agent/monitor", Some(&op_write));
    assert_eq!(code, 403);
    let (code, _) = open_stream(a, "/v1/agent/monitor", Some(&agent_read));
    assert_eq!(code, 200);
    // What the allowed calls answered.
    let host = with(a, "GET", "/v1/agent/host", None, &op_read).json();
    assert!(host["Memory"]["total"].as_u64().unwrap() > 0, "{host}");
    assert!(!host["CPU"].as_array().unwrap().is_empty());
    assert!(!host["Host"]["hostname"].as_str().unwrap().is_empty());
    assert!(host["Disk"]["total"].as_u64().unwrap() > 0);
    assert!(host["Errors"].is_null());
    let r = with(
        a,
        "PUT",
        "/v1/agent/token/nope",
        Some(r#"{"Token":"x"}"#),
        ROOT,
    );
    assert_eq!(
        (r.status, r.body.trim()),
        (404, r#"Token "nope" is unknown"#)
    );
    // Consul's 500 and words for a node it never saw.
    let r = with(a, "PUT", "/v1/agent/force-leave/nobody", None, &op_write);
    assert_eq!(
        (r.status, r.body.trim()),
        (500, "agent: No node found with name 'nobody'")
    );
    // A server already in a cluster cannot take another's.
    let r = with(a, "PUT", "/v1/agent/join/127.0.0.1:1", None, &agent_write);
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn monitor_streams_lines_logged_after_connecting_at_the_level_asked() {
    // stderr shows warnings only; the monitor asked for info gets info.
    let s = Server::builder().dev().env("RUST_LOG", "warn").start();
    let (code, mut text) = open_stream(s.http_addr, "/v1/agent/monitor?loglevel=info", None);
    assert_eq!(code, 200);
    let (_, mut json) = open_stream(
        s.http_addr,
        "/v1/agent/monitor?loglevel=debug&logjson",
        None,
    );
    let r = request(
        s.http_addr,
        "PUT",
        "/v1/agent/service/register",
        Some(r#"{"Name": "monitored-web", "Port": 80}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let line = line_with(&mut text, "monitored-web");
    assert!(
        line.contains("[INFO]") && line.contains("service registered"),
        "{line}"
    );
    let line = line_with(&mut json, "monitored-web");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["@level"], "info", "{line}");
    assert_eq!(v["service"], "monitored-web");
    // Not on stderr (warn): only the monitor asked for it.
    assert!(!s.log().contains("monitored-web"));
    let r = request(s.http_addr, "GET", "/v1/agent/monitor?loglevel=loud", None);
    assert_eq!((r.status, r.body.trim()), (400, "Unknown log level: loud"));
}

#[test]
fn monitor_reader_that_stops_reading_does_not_hold_the_server() {
    let s = Server::dev();
    // A reader that never reads: its lines are dropped, the server goes on.
    let (code, stuck) = open_stream(s.http_addr, "/v1/agent/monitor?loglevel=trace", None);
    assert_eq!(code, 200);
    for i in 0..300 {
        let body = json!({"Name": format!("flood-{i}"), "Port": 80}).to_string();
        let r = request(
            s.http_addr,
            "PUT",
            "/v1/agent/service/register",
            Some(&body),
        );
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        request(s.http_addr, "GET", "/v1/agent/self", None).status,
        200
    );
    drop(stuck);
    let (_, mut r) = open_stream(s.http_addr, "/v1/agent/monitor", None);
    request(
        s.http_addr,
        "PUT",
        "/v1/agent/service/register",
        Some(r#"{"Name": "after-flood", "Port": 80}"#),
    );
    line_with(&mut r, "after-flood");
}

#[test]
fn reload_syncs_the_config_dirs_services_and_leaves_api_ones_alone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("web.hcl"),
        "service {\n  name = \"web\"\n  port = 80\n}\n",
    )
    .unwrap();
    let s = Server::builder()
        .dev()
        .arg("--config-dir")
        .arg(dir.path().to_str().unwrap())
        .start();
    let services = |s: &Server| s.get_json("/v1/agent/services");
    assert!(services(&s).get("web").is_some(), "{}", services(&s));
    let r = request(
        s.http_addr,
        "PUT",
        "/v1/agent/service/register",
        Some(r#"{"Name": "manual", "Port": 1}"#),
    );
    assert_eq!(r.status, 200);
    std::fs::remove_file(dir.path().join("web.hcl")).unwrap();
    std::fs::write(
        dir.path().join("api.json"),
        r#"{"service": {"name": "api", "port": 9000, "check": {"ttl": "30s"}}}"#,
    )
    .unwrap();
    let r = request(s.http_addr, "PUT", "/v1/agent/reload", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let now = services(&s);
    assert!(now.get("api").is_some(), "{now}");
    assert!(now.get("web").is_none(), "{now}");
    assert!(now.get("manual").is_some(), "{now}");
    // The catalog follows (reload waits for the push).
    let cat = s.get_json("/v1/catalog/services");
    assert!(
        cat.get("api").is_some() && cat.get("web").is_none(),
        "{cat}"
    );
    // A file that does not read changes nothing.
    std::fs::write(dir.path().join("bad.json"), r#"{"service": {"port": 1}}"#).unwrap();
    let r = request(s.http_addr, "PUT", "/v1/agent/reload", None);
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(r.body.contains("bad.json"), "{}", r.body);
    assert!(services(&s).get("api").is_some());
}

#[test]
fn a_token_set_on_an_agent_is_used_for_requests_without_one() {
    let s = deny_server();
    let (_, reader) = token_with_rules(s.http_addr, "kr", r#"key "k" { policy = "read" }"#);
    common::acl::as_root(s.http_addr, "PUT", "/v1/kv/k", &json!("v"));
    let agent = Agent::builder("tok-agent", &s.url)
        .arg("--acl-agent-token")
        .arg(ROOT)
        .start();
    let r = request(agent.http_addr, "GET", "/v1/kv/k", None);
    assert_eq!(r.status, 403, "{}", r.body);
    let body = json!({ "Token": reader }).to_string();
    let r = request(
        agent.http_addr,
        "PUT",
        "/v1/agent/token/default",
        Some(&body),
    );
    assert_eq!(r.status, 403, "anonymous may not set it: {}", r.body);
    // Consul's legacy name for the default token.
    let r = with(
        agent.http_addr,
        "PUT",
        "/v1/agent/token/acl_token",
        Some(&body),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request(agent.http_addr, "GET", "/v1/kv/k", None);
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Consul answers a token write with ACLs off 401 `ACL support disabled`:
/// a 200 would tell the operator a token is in force when nothing checks it.
#[test]
fn setting_a_token_with_acls_off_is_refused_on_a_server_and_a_client_agent() {
    let s = Server::dev();
    let agent = Agent::builder("noacl-agent", &s.url).start();
    let body = r#"{"Token": "x"}"#;
    for addr in [s.http_addr, agent.http_addr] {
        let r = request(addr, "PUT", "/v1/agent/token/default", Some(body));
        assert_eq!(
            (r.status, r.body.trim()),
            (401, "ACL support disabled"),
            "{addr}"
        );
    }
}

#[test]
fn force_leave_removes_a_failed_server_and_a_client_node() {
    let mut servers = Server::cluster(3);
    let leader = servers
        .iter()
        .position(|s| s.get_json("/v1/agent/self")["Stats"]["raft"]["state"] == "Leader")
        .unwrap_or(0);
    let victim = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let name = servers[victim].name().to_string();
    servers[victim].kill();
    // Asked of a follower: forwarded to the leader.
    let r = request(
        servers[other].http_addr,
        "PUT",
        &format!("/v1/agent/force-leave/{name}?prune"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let peers = servers[leader].get_json("/v1/operator/raft/configuration");
    let names: Vec<&str> = peers["Servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Node"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{peers}");
    assert!(!names.contains(&name.as_str()));
    eventually(
        Duration::from_secs(10),
        "the node out of the catalog",
        || {
            servers[leader]
                .get_json(&format!("/v1/catalog/node/{name}"))
                .is_null()
                .then_some(())
        },
    );
    // A client node: deregistered.
    let reg = json!({"Node": "client-1", "Address": "10.0.0.9"}).to_string();
    let r = request(
        servers[leader].http_addr,
        "PUT",
        "/v1/catalog/register",
        Some(&reg),
    );
    assert_eq!(r.status, 200);
    let r = request(
        servers[leader].http_addr,
        "PUT",
        "/v1/agent/force-leave/client-1",
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        servers[leader]
            .get_json("/v1/catalog/node/client-1")
            .is_null()
    );
}

#[test]
fn a_server_waiting_to_form_joins_through_the_api() {
    let first = Server::builder().node("j0").bootstrap_expect(1).start();
    let second = Server::builder()
        .node("j1")
        .bootstrap_expect(2)
        .no_wait()
        .start();
    let path = format!("/v1/agent/join/{}", first.raft_addr);
    let r = request(second.http_addr, "PUT", &path, None);
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(Duration::from_secs(30), "two servers", || {
        let c = first.get_json("/v1/operator/raft/configuration");
        (c["Servers"].as_array().map_or(0, |a| a.len()) == 2).then_some(())
    });
    second.wait_for_leader(Duration::from_secs(30));
}

#[test]
fn a_client_agent_joins_another_server_with_its_recovery_token() {
    let mut first = deny_server();
    let second = Server::dev();
    let agent = Agent::builder("join-agent", &first.url)
        .arg("--acl-agent-token")
        .arg(ROOT)
        .start();
    let r = with(
        agent.http_addr,
        "PUT",
        "/v1/agent/token/agent_recovery",
        Some(r#"{"Token": "recover-me"}"#),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    first.kill();
    let join = format!("/v1/agent/join/{}", second.http_addr);
    // With its servers gone no new token resolves, but the recovery token.
    let r = with(agent.http_addr, "PUT", &join, None, "never-seen");
    assert_eq!(r.status, 500, "{}", r.body);
    let r = with(agent.http_addr, "PUT", &join, None, "recover-me");
    assert_eq!(r.status, 200, "{}", r.body);
    // Its forwards now reach that server.
    let r = request(agent.http_addr, "GET", "/v1/status/leader", None);
    assert_eq!(r.status, 200, "{}", r.body);
    // Nothing answers there: refused.
    let r = with(
        agent.http_addr,
        "PUT",
        "/v1/agent/join/127.0.0.1:1",
        None,
        "recover-me",
    );
    assert_eq!(r.status, 500, "{}", r.body);
}

#[test]
fn cli_verbs_reach_the_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::builder()
        .dev()
        .arg("--config-dir")
        .arg(dir.path().to_str().unwrap())
        .start();
    std::fs::write(
        dir.path().join("a.hcl"),
        "service {\n name = \"cli-svc\"\n}\n",
    )
    .unwrap();
    let out = common::cli(&s.url, &["reload"]);
    assert!(out.status.success(), "{out:?}");
    assert!(s.get_json("/v1/agent/services").get("cli-svc").is_some());
    let out = common::cli(&s.url, &["info"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("raft:") && text.contains("\tstate = Leader"),
        "{text}"
    );
    let out = common::cli(&s.url, &["acl", "set-agent-token", "nope", "x"]);
    assert!(!out.status.success());
    let out = common::cli(&s.url, &["force-leave", "nobody"]);
    assert!(!out.status.success());
}

/// The status and A records of one UDP query for `name`.
fn dns_a(addr: SocketAddr, name: &str) -> (String, Vec<String>) {
    let (code, records) = common::dns::ask(addr, name, hickory_proto::rr::RecordType::A);
    (common::dns::status(code), common::dns::addresses(&records))
}

#[test]
fn a_dns_token_set_on_an_agent_answers_its_dns() {
    let s = deny_server();
    let reg = json!({"Node": "db-node", "Address": "10.0.0.7",
                     "Service": {"Service": "db", "Port": 5432}});
    common::acl::as_root(s.http_addr, "PUT", "/v1/catalog/register", &reg);
    let (_, dns) = token_with_rules(
        s.http_addr,
        "dns",
        r#"service "db" { policy = "read" }
node "db-node" { policy = "read" }"#,
    );
    let agent = Agent::builder("dns-tok-agent", &s.url)
        .arg("--acl-agent-token")
        .arg(ROOT)
        .start();
    let (status, _) = dns_a(agent.dns_addr, "db.service.consul");
    assert_eq!(status, "NXDOMAIN", "anonymous may not read db");
    let body = json!({ "Token": dns }).to_string();
    let r = with(
        agent.http_addr,
        "PUT",
        "/v1/agent/token/dns",
        Some(&body),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        dns_a(agent.dns_addr, "db.service.consul"),
        ("NOERROR".to_string(), vec!["10.0.0.7".to_string()])
    );
    // The CLI's name for the recovery token is taken too.
    let r = with(
        agent.http_addr,
        "PUT",
        "/v1/agent/token/recovery",
        Some(r#"{"Token": "r"}"#),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

/// `/v1/agent/metrics/stream` (agent:read, as Consul's): the metrics
/// summary of `/v1/agent/metrics` as JSON lines, the first at once.
#[test]
fn metrics_stream_sends_the_metrics_summary_as_json_lines() {
    let s = deny_server();
    let a = s.http_addr;
    let (_, agent_read) = token_with_rules(a, "ar", r#"agent_prefix "" { policy = "read" }"#);
    let (_, op_write) = token_with_rules(a, "ow", r#"operator = "write""#);
    let (code, _) = open_stream(a, "/v1/agent/metrics/stream", None);
    assert_eq!(code, 403);
    let (code, _) = open_stream(a, "/v1/agent/metrics/stream", Some(&op_write));
    assert_eq!(code, 403);
    let (code, mut lines) = open_stream(a, "/v1/agent/metrics/stream", Some(&agent_read));
    assert_eq!(code, 200);
    let line = line_with(&mut lines, "\"Counters\"");
    let m: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(
        m["Timestamp"].as_str().unwrap().ends_with(" +0000 UTC"),
        "{m}"
    );
    // A metric of a kind by its name.
    let named = |kind: &str, name: &str| {
        let all = m[kind].as_array().unwrap();
        all.iter().find(|x| x["Name"] == name).cloned().expect(name)
    };
    let requests = named("Counters", "cairn_http_requests_total");
    assert!(requests["Count"].as_u64().unwrap() > 0, "{requests}");
    assert_eq!(named("Gauges", "cairn_raft_is_leader")["Value"], 1.0);
}

/// `/debug/pprof/` as Consul serves it: not at all with ACLs off unless
/// `--enable-debug` (on with `--dev`); with ACLs on, behind operator:read.
/// (tests/node/pprof.test.js reads a profile with a pprof decoder.)
#[test]
fn profiles_are_served_with_enable_debug_or_behind_operator_read() {
    let plain = Server::builder().bootstrap_expect(1).start();

    let r = plain.get("/debug/pprof/cmdline");
    assert_eq!(r.status, 404, "{}", r.body);
    let debug = Server::builder()
        .bootstrap_expect(1)
        .arg("--enable-debug")
        .start();

    let r = debug.get("/debug/pprof/cmdline");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.split('\0').any(|a| a == "--enable-debug"),
        "{}",
        r.body
    );

    let s = deny_server();
    let a = s.http_addr;
    let (_, op_read) = token_with_rules(a, "or", r#"operator = "read""#);
    let (_, agent_write) = token_with_rules(a, "aw", r#"agent_prefix "" { policy = "write" }"#);
    for path in [
        "/debug/pprof/",
        "/debug/pprof/cmdline",
        "/debug/pprof/goroutine",
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/heap",
    ] {
        assert_eq!(
            request(a, "GET", path, None).status,
            403,
            "anonymous {path}"
        );
        assert_eq!(
            with(a, "GET", path, None, &agent_write).status,
            403,
            "short {path}"
        );
    }
    let r = with(a, "GET", "/debug/pprof/goroutine", None, &op_read);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("tokio-rt-worker"), "{}", r.body);
    let r = with(a, "GET", "/debug/pprof/profile?seconds=1", None, &op_read);
    assert_eq!(r.status, 200, "{}", r.body.len());
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let r = with(
        a,
        "GET",
        "/debug/pprof/profile?seconds=100000",
        None,
        &op_read,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let r = with(a, "GET", "/debug/pprof/heap", None, &op_read);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(
        r.body.starts_with("Unknown profile: the allocator"),
        "{}",
        r.body
    );
}
