//! ACLs on what a registration creates or replaces (issue 33): a token
//! that may write one service may not register a sidecar or a proxy of
//! another, nor rename another service's instance through the catalog or a
//! txn; and a discovery-chain config entry needs read on every service it
//! sends traffic to.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::acl::{ROOT, deny_server, token_with_rules, with};
use common::agent::Agent;
use common::{Resp, eventually};
use serde_json::{Value, json};

/// Writes "web" (and every node), but not "db".
const WEB_ONLY: &str = "service \"web\" { policy = \"write\" }\n\
                        node_prefix \"\" { policy = \"write\" }";
/// Writes "web", "db" and every node.
const WEB_AND_DB: &str = "service \"web\" { policy = \"write\" }\n\
                          service \"db\" { policy = \"write\" }\n\
                          node_prefix \"\" { policy = \"write\" }";

fn assert_denied_on(r: &Resp, service: &str) {
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.starts_with("Permission denied"), "{}", r.body);
    let want = format!("'service:write' on \"{service}\"");
    assert!(r.body.contains(&want), "want {want}: {}", r.body);
}

/// The IDs of the instances `/v1/health/connect/db` lists (read as ROOT).
fn connect_db_ids(addr: SocketAddr) -> Vec<String> {
    let r = with(addr, "GET", "/v1/health/connect/db", None, ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Service"]["ID"].as_str().unwrap().to_string())
        .collect()
}

/// The service IDs `/v1/catalog/service/<name>` lists (read as ROOT).
fn catalog_ids(addr: SocketAddr, name: &str) -> Vec<String> {
    let r = with(
        addr,
        "GET",
        &format!("/v1/catalog/service/{name}"),
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ServiceID"].as_str().unwrap().to_string())
        .collect()
}

/// A sidecar named `db`, and a connect proxy for `db`, registered through
/// an agent's API with a token that may write only `web`: refused, on the
/// server's own agent and on a client agent alike; nothing is registered.
/// With write on `db` too both go through and are discovered as db's.
#[test]
fn an_agent_refuses_a_sidecar_or_proxy_for_a_service_the_token_may_not_write() {
    let s = deny_server();
    let web = token_with_rules(s.http_addr, "web-only", WEB_ONLY).1;
    let both = token_with_rules(s.http_addr, "web-and-db", WEB_AND_DB).1;
    let agent_token = token_with_rules(
        s.http_addr,
        "agent",
        "node_prefix \"\" { policy = \"write\" }\nservice_prefix \"\" { policy = \"write\" }",
    )
    .1;
    let mut ag = Agent::builder("reg-agent", &s.url)
        .arg("--acl-agent-token")
        .arg(&agent_token)
        .start();
    let register = "/v1/agent/service/register";
    let sidecar = r#"{"Name": "web", "ID": "web-1", "Port": 80,
                      "Connect": {"SidecarService": {"Name": "db"}}}"#;
    let proxy = r#"{"Kind": "connect-proxy", "Name": "web", "ID": "web-proxy", "Port": 21000,
                    "Proxy": {"DestinationServiceName": "db"}}"#;

    for at in [s.http_addr, ag.http_addr] {
        assert_denied_on(&with(at, "PUT", register, Some(sidecar), &web), "db");
        assert_denied_on(&with(at, "PUT", register, Some(proxy), &web), "db");
        let listed = with(at, "GET", "/v1/agent/services", None, ROOT).json();
        assert_eq!(listed, json!({}), "nothing registered on {at}");
    }
    assert!(connect_db_ids(s.http_addr).is_empty());
    assert!(catalog_ids(s.http_addr, "db").is_empty());

    // One permission more and both are accepted.
    for at in [s.http_addr, ag.http_addr] {
        let r = with(at, "PUT", register, Some(sidecar), &both);
        assert_eq!(r.status, 200, "{}", r.body);
        let r = with(at, "PUT", register, Some(proxy), &both);
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // The proxies are db's connect instances, the sidecars db's instances.
    eventually(
        Duration::from_secs(15),
        "db's proxies in the catalog",
        || {
            (connect_db_ids(s.http_addr).len() == 2 && catalog_ids(s.http_addr, "db").len() == 2)
                .then_some(())
        },
    );
    ag.stop();
}

/// Replacing an instance the token may not write: an agent's local
/// service `db-1` re-registered under the name `web` is refused.
#[test]
fn an_agent_refuses_to_rename_a_local_service_the_token_may_not_write() {
    let s = deny_server();
    let web = token_with_rules(s.http_addr, "web-only", WEB_ONLY).1;
    let register = "/v1/agent/service/register";
    let r = with(
        s.http_addr,
        "PUT",
        register,
        Some(r#"{"Name": "db", "ID": "db-1", "Port": 5432}"#),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let rename = r#"{"Name": "web", "ID": "db-1", "Port": 80}"#;
    assert_denied_on(
        &with(s.http_addr, "PUT", register, Some(rename), &web),
        "db",
    );
    let r = with(s.http_addr, "GET", "/v1/agent/service/db-1", None, ROOT);
    assert_eq!(r.json()["Service"], "db", "{}", r.body);
}

/// `PUT /v1/catalog/register` on db's node with db's instance ID and the
/// name `web`: refused for a token that writes web and every node but not
/// db; db-1 is still db's. A proxy for db likewise. With write on db too
/// the rename is allowed (Consul's rule).
#[test]
fn a_catalog_registration_may_not_rename_or_proxy_a_service_the_token_may_not_write() {
    let s = deny_server();
    let a = s.http_addr;
    let web = token_with_rules(a, "web-only", WEB_ONLY).1;
    let both = token_with_rules(a, "web-and-db", WEB_AND_DB).1;
    let reg = |body: Value, token: &str| {
        with(
            a,
            "PUT",
            "/v1/catalog/register",
            Some(&body.to_string()),
            token,
        )
    };
    let db = json!({"Node": "db-node", "Address": "10.0.0.5",
                    "Service": {"ID": "db-1", "Service": "db", "Port": 5432}});
    assert_eq!(reg(db, ROOT).status, 200);
    let db_ids = || catalog_ids(a, "db");

    let rename = json!({"Node": "db-node", "Address": "10.0.0.5",
                        "Service": {"ID": "db-1", "Service": "web", "Port": 80}});
    assert_denied_on(&reg(rename.clone(), &web), "db");
    assert_eq!(db_ids(), ["db-1"]);
    let proxy = json!({"Node": "web-node", "Address": "10.0.0.6",
                       "Service": {"ID": "web-proxy", "Service": "web", "Kind": "connect-proxy",
                                   "Port": 21000, "Proxy": {"DestinationServiceName": "db"}}});
    assert_denied_on(&reg(proxy.clone(), &web), "db");
    assert!(connect_db_ids(a).is_empty());

    // The same through a txn: a set over db-1, a delete of db-1 that
    // names web, a check on db-1 that names web.
    let txn = |ops: Value| with(a, "PUT", "/v1/txn", Some(&ops.to_string()), &web);
    let r = txn(json!([{"Service": {"Verb": "set", "Node": "db-node",
                                    "Service": {"ID": "db-1", "Service": "web", "Port": 80}}}]));
    assert_denied_on(&r, "db");
    let r = txn(json!([{"Service": {"Verb": "delete", "Node": "db-node",
                                    "Service": {"ID": "db-1", "Service": "web"}}}]));
    assert_denied_on(&r, "db");
    // A critical check on db-1 that names web would take db out of
    // health answers and DNS.
    let r = txn(json!([{"Check": {"Verb": "set", "Check": {
        "Node": "db-node", "CheckID": "down", "Name": "down", "Status": "critical",
        "ServiceID": "db-1", "ServiceName": "web"}}}]));
    assert_denied_on(&r, "db");
    assert_eq!(db_ids(), ["db-1"]);
    let r = with(a, "GET", "/v1/health/checks/db", None, ROOT);
    assert_eq!(r.json(), json!([]), "{}", r.body);

    // One permission more: both go through.
    assert_eq!(reg(proxy, &both).status, 200);
    assert_eq!(connect_db_ids(a), ["web-proxy"]);
    let r = reg(rename, &both);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(db_ids().is_empty());
    let r = with(a, "GET", "/v1/catalog/service/web", None, ROOT);
    assert!(r.body.contains("\"db-1\""), "{}", r.body);
}

/// A discovery-chain entry for web that sends traffic to db (a router's
/// destination, a split, a resolver's redirect or failover target) needs
/// `service:read` on db besides `service:write` on web: refused without
/// it, nothing written; accepted with it. A delete needs write on web.
#[test]
fn a_discovery_chain_entry_needs_read_on_every_service_it_routes_to() {
    let s = deny_server();
    let a = s.http_addr;
    let put =
        |entry: &Value, token: &str| with(a, "PUT", "/v1/config", Some(&entry.to_string()), token);
    for name in ["web", "db"] {
        let defaults = json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"});
        assert_eq!(put(&defaults, ROOT).status, 200);
    }
    let web = token_with_rules(a, "web-only", "service \"web\" { policy = \"write\" }").1;
    let web_db = token_with_rules(
        a,
        "web-reads-db",
        "service \"web\" { policy = \"write\" }\nservice \"db\" { policy = \"read\" }",
    )
    .1;
    let db_reader = token_with_rules(a, "db-reader", "service \"db\" { policy = \"read\" }").1;
    let entries = [
        json!({"Kind": "service-router", "Name": "web", "Routes": [
            {"Match": {"HTTP": {"PathPrefix": "/db"}}, "Destination": {"Service": "db"}}]}),
        json!({"Kind": "service-splitter", "Name": "web", "Splits": [
            {"Weight": 50, "Service": "web"}, {"Weight": 50, "Service": "db"}]}),
        json!({"Kind": "service-resolver", "Name": "web", "Redirect": {"Service": "db"}}),
        json!({"Kind": "service-resolver", "Name": "web",
               "Failover": {"*": {"Targets": [{"Service": "db"}]}}}),
    ];
    for entry in &entries {
        let kind = entry["Kind"].as_str().unwrap();
        let r = put(entry, &web);
        assert_eq!(r.status, 403, "{entry}: {}", r.body);
        assert!(
            r.body.contains("'service:read' on \"db\""),
            "{entry}: {}",
            r.body
        );
        let path = format!("/v1/config/{kind}/web");
        assert_eq!(with(a, "GET", &path, None, ROOT).status, 404, "{entry}");
        let r = put(entry, &web_db);
        assert_eq!(r.status, 200, "{entry}: {}", r.body);
        // Deleting needs write on web: db's reader may not.
        assert_eq!(with(a, "DELETE", &path, None, &db_reader).status, 403);
        let r = with(a, "DELETE", &path, None, &web_db);
        assert_eq!(r.status, 200, "{entry}: {}", r.body);
    }
}
