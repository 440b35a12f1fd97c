//! DNS under ACLs (issue 33): answers show what the DNS token may read
//! (`--acl-token`, else the anonymous token), on servers and client agents
//! alike; a name it may not read is NXDOMAIN, as one that does not exist;
//! ACL changes are in force at the next query. Queries over UDP, built
//! with hickory-proto (no client tool needed).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::acl::{ROOT, as_root, with};
use common::agent::Agent;
use common::{Server, eventually};
use hickory_proto::rr::RecordType;
use serde_json::json;

/// The secret of the DNS token the tests create.
const DNS_SECRET: &str = "6f1c2a4e-0000-4000-8000-0000000000d5";
const ANONYMOUS_ID: &str = "00000000-0000-0000-0000-000000000002";

/// The status (`NOERROR`, `NXDOMAIN`, …) and the A records of one UDP
/// query for `name`, in dig's words (`status:`).
fn query(addr: SocketAddr, name: &str) -> (String, Vec<String>) {
    let (code, records) = common::dns::ask(addr, name, RecordType::A);
    (common::dns::status(code), common::dns::addresses(&records))
}

fn acl_server(default: &str, extra: &[&str]) -> Server {
    let mut b = Server::builder().dev().acl(default, ROOT);
    for a in extra {
        b = b.arg(a);
    }
    let s = b.start();
    eventually(Duration::from_secs(10), "the management token", || {
        (with(s.http_addr, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    s
}

/// Creates the policy `name` with `rules`; its ID.
fn policy(s: &Server, name: &str, rules: &str) -> String {
    let body = json!({ "Name": name, "Rules": rules }).to_string();
    let r = with(s.http_addr, "PUT", "/v1/acl/policy", Some(&body), ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["ID"].as_str().unwrap().to_string()
}

/// db on node db-node (10.0.0.5), passing; web on web-node (10.0.0.6).
fn register_db_and_web(s: &Server) {
    for (node, addr, svc) in [
        ("db-node", "10.0.0.5", "db"),
        ("web-node", "10.0.0.6", "web"),
    ] {
        let body = json!({"Node": node, "Address": addr,
                          "Service": {"ID": format!("{svc}-1"), "Service": svc, "Port": 80}});
        as_root(s.http_addr, "PUT", "/v1/catalog/register", &body);
    }
}

const READ_DB: &str =
    "service \"db\" { policy = \"read\" }\nnode \"db-node\" { policy = \"read\" }";

/// Default deny, no `--acl-token`: the anonymous token reads nothing, so
/// db and its node are NXDOMAIN like a name that does not exist. Rights
/// given to the anonymous token are in force at the next query: service
/// read alone still hides db (its node is not readable), with node read
/// it answers; web stays hidden.
#[test]
fn anonymous_dns_under_default_deny_sees_only_what_the_anonymous_token_may_read() {
    let s = acl_server("deny", &[]);
    register_db_and_web(&s);
    let d = s.dns_addr;
    let nx = ("NXDOMAIN".to_string(), Vec::new());
    assert_eq!(query(d, "db.service.consul"), nx);
    assert_eq!(query(d, "db-node.node.consul"), nx);
    assert_eq!(query(d, "no-such.service.consul"), nx);

    let id = policy(&s, "dns-db", "service \"db\" { policy = \"read\" }");
    let body = json!({ "Policies": [{ "ID": id }] }).to_string();
    let path = format!("/v1/acl/token/{ANONYMOUS_ID}");
    let r = with(s.http_addr, "PUT", &path, Some(&body), ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        query(d, "db.service.consul"),
        nx,
        "db's node is not readable"
    );

    let body = json!({ "Name": "dns-db", "Rules": READ_DB }).to_string();
    let r = with(
        s.http_addr,
        "PUT",
        &format!("/v1/acl/policy/{id}"),
        Some(&body),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let ok = ("NOERROR".to_string(), vec!["10.0.0.5".to_string()]);
    assert_eq!(query(d, "db.service.consul"), ok);
    assert_eq!(query(d, "db-node.node.consul"), ok);
    assert_eq!(query(d, "web.service.consul"), nx);
    assert_eq!(query(d, "web-node.node.consul"), nx);
}

/// With `--acl-token` the server's DNS reads with that token: refused
/// (SERVFAIL) while it names no token, answering once it exists with read
/// on db; web, which it may not read, is NXDOMAIN. A client agent with
/// the same `--acl-token` answers the same; one without answers as the
/// anonymous token.
#[test]
fn dns_reads_with_the_acl_token_on_servers_and_client_agents() {
    let s = acl_server("deny", &["--acl-token", DNS_SECRET]);
    register_db_and_web(&s);
    let d = s.dns_addr;
    assert_eq!(
        query(d, "db.service.consul").0,
        "SERVFAIL",
        "no such token yet"
    );

    let id = policy(&s, "dns-db", READ_DB);
    let body = json!({ "SecretID": DNS_SECRET, "Policies": [{ "ID": id }] }).to_string();
    let r = with(s.http_addr, "PUT", "/v1/acl/token", Some(&body), ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    let ok = ("NOERROR".to_string(), vec!["10.0.0.5".to_string()]);
    let nx = ("NXDOMAIN".to_string(), Vec::new());
    assert_eq!(query(d, "db.service.consul"), ok);
    assert_eq!(query(d, "db-node.node.consul"), ok);
    assert_eq!(query(d, "web.service.consul"), nx);

    let agent_rules =
        "node_prefix \"\" { policy = \"write\" }\nservice_prefix \"\" { policy = \"write\" }";
    let agent_policy = policy(&s, "agent", agent_rules);
    let body = json!({ "Policies": [{ "ID": agent_policy }] }).to_string();
    let r = with(s.http_addr, "PUT", "/v1/acl/token", Some(&body), ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    let agent_token = r.json()["SecretID"].as_str().unwrap().to_string();
    let mut with_token = Agent::builder("dns-agent-1", &s.url)
        .arg("--acl-agent-token")
        .arg(&agent_token)
        .arg("--acl-token")
        .arg(DNS_SECRET)
        .start();
    let mut anonymous = Agent::builder("dns-agent-2", &s.url)
        .arg("--acl-agent-token")
        .arg(&agent_token)
        .start();
    assert_eq!(query(with_token.dns_addr, "db.service.consul"), ok);
    assert_eq!(query(with_token.dns_addr, "db-node.node.consul"), ok);
    assert_eq!(query(with_token.dns_addr, "web.service.consul"), nx);
    assert_eq!(query(anonymous.dns_addr, "db.service.consul"), nx);
    assert_eq!(query(anonymous.dns_addr, "db-node.node.consul"), nx);
    with_token.stop();
    anonymous.stop();
}

/// Default allow: the anonymous token reads everything, as before.
#[test]
fn dns_under_default_allow_answers_as_before() {
    let s = acl_server("allow", &[]);
    register_db_and_web(&s);
    let ok = ("NOERROR".to_string(), vec!["10.0.0.5".to_string()]);
    assert_eq!(query(s.dns_addr, "db.service.consul"), ok);
    assert_eq!(query(s.dns_addr, "db-node.node.consul"), ok);
}
