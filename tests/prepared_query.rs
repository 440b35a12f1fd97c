//! Prepared queries against real processes: `/v1/query` create, list,
//! read, update and delete with Consul's refusals; execute with tags,
//! `OnlyPassing`, `?near` and `?limit`; templates (a name prefix, and a
//! regexp with its captures); failover to another datacenter (two
//! single-server datacenters joined with `--join-wan`); ACLs with default
//! deny; DNS `<name>.query.consul`.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::acl::{ROOT, deny_server, token_with_rules, with};
use common::{Server, eventually};
use hickory_proto::rr::RecordType;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// Registers `service` (ID `id`) on `node` at `addr` with one check in
/// `status`.
fn register(s: &Server, node: &str, addr: &str, id: &str, tags: &[&str], status: &str) {
    let body = json!({
        "Node": node, "Address": addr,
        "Service": {"Service": "web", "ID": id, "Port": 80, "Tags": tags},
        "Check": {"CheckID": format!("{id}-check"), "Name": "check", "Status": status,
                  "ServiceID": id},
    });
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/catalog/register",
        Some(&body.to_string()),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Creates a query (must succeed); its ID.
fn create(s: &Server, q: &Value) -> String {
    let r = with(s.http_addr, "POST", "/v1/query", Some(&q.to_string()), ROOT);
    assert_eq!(r.status, 200, "{q}: {}", r.body);
    r.json()["ID"].as_str().unwrap().to_string()
}

fn execute(s: &Server, id_or_name: &str, params: &str) -> Value {
    let r = with(
        s.http_addr,
        "GET",
        &format!("/v1/query/{id_or_name}/execute{params}"),
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{id_or_name}: {}", r.body);
    r.json()
}

/// The nodes of an execute's answer, in its order.
fn nodes(answer: &Value) -> Vec<String> {
    answer["Nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["Node"]["Node"].as_str().unwrap().to_string())
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// CRUD, Consul's shapes and its refusals; a query bound to a session
/// goes with it.
#[test]
fn create_list_read_update_delete_and_refusals() {
    let s = Server::dev();
    let addr = s.http_addr;
    let q = json!({"Name": "web-q", "Token": "secret-x",
                   "Service": {"Service": "web", "Tags": ["v1"], "OnlyPassing": true},
                   "DNS": {"TTL": "10s"}});
    let id = create(&s, &q);
    let list = s.get_json("/v1/query");
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    let got = &s.get_json(&format!("/v1/query/{id}"))[0];
    assert_eq!(got["ID"], id.as_str());
    assert_eq!(got["Name"], "web-q");
    assert_eq!(got["Service"]["Tags"], json!(["v1"]));
    assert_eq!(got["DNS"]["TTL"], "10s");
    // ACLs off: everything is allowed, the token shown as stored.
    assert_eq!(got["Token"], "secret-x");
    let created = got["CreateIndex"].as_u64().unwrap();
    assert!(created > 0);

    // Update: the path's ID, the body's definition.
    let upd = json!({"Name": "web-q", "Service": {"Service": "web", "Tags": ["v2"]}});
    let r = with(
        addr,
        "PUT",
        &format!("/v1/query/{id}"),
        Some(&upd.to_string()),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let got = &s.get_json(&format!("/v1/query/{id}"))[0];
    assert_eq!(got["Service"]["Tags"], json!(["v2"]));
    assert_eq!(got["CreateIndex"].as_u64(), Some(created));
    assert!(got["ModifyIndex"].as_u64().unwrap() > created);

    // Refusals, in Consul's words, changing nothing.
    let refused = |body: Value, words: &str| {
        let r = with(addr, "POST", "/v1/query", Some(&body.to_string()), ROOT);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(words), "{body}: {}", r.body);
    };
    refused(json!({"Name": "x"}), "Must provide a Service name to query");
    refused(
        json!({"Name": "x", "Service": {"Service": "web", "Failover": {"NearestN": -1}}}),
        "Bad NearestN '-1', must be >= 0",
    );
    refused(
        json!({"Name": "x", "Service": {"Service": "web",
               "Failover": {"NearestN": 1, "Targets": [{"Datacenter": "dc2"}]}}}),
        "Targets cannot be populated with NearestN or Datacenters",
    );
    refused(
        json!({"Name": "x", "Template": {"Type": "name_prefix_match", "Regexp": "(("},
               "Service": {"Service": "web"}}),
        "Bad Regexp",
    );
    refused(
        json!({"Name": "x", "Template": {"Type": "glob"}, "Service": {"Service": "web"}}),
        "Bad Template.Type 'glob'",
    );
    refused(
        json!({"Name": "x", "Template": {"Type": "name_prefix_match"},
               "Service": {"Service": "${nope}"}}),
        "Bad format '${nope}' in Service.Service",
    );
    refused(
        json!({"Name": "WEB-Q", "Service": {"Service": "db"}}),
        "aliases an existing query name",
    );
    refused(
        json!({"Service": {"Service": "db"}}),
        "Must be bound to a session",
    );
    refused(
        json!({"Name": "x", "Service": {"Service": "web"}, "DNS": {"TTL": "soon"}}),
        "Bad DNS TTL 'soon'",
    );
    refused(
        json!({"Name": "x", "Token": "<hidden>", "Service": {"Service": "web"}}),
        "redacted token",
    );
    refused(
        json!({"Name": "x", "Session": "6f1c2a4e-0000-4000-8000-00000000dead",
               "Service": {"Service": "web"}}),
        "invalid session",
    );
    let r = with(addr, "POST", "/v1/query", Some("{not json"), ROOT);
    assert_eq!(r.status, 400, "{}", r.body);
    // A body past the limit is refused whole.
    let huge = format!(
        r#"{{"Name":"big","Service":{{"Service":"web","Tags":["{}"]}}}}"#,
        "x".repeat(5 << 20)
    );
    let r = with(addr, "POST", "/v1/query", Some(&huge), ROOT);
    assert_eq!(r.status, 413, "{}", &r.body[..r.body.len().min(200)]);
    assert_eq!(s.get_json("/v1/query").as_array().unwrap().len(), 1);

    // Execute and explain are reads only.
    let r = with(
        addr,
        "PUT",
        &format!("/v1/query/{id}/execute"),
        Some("{}"),
        ROOT,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Method PUT not allowed"), "{}", r.body);
    assert_eq!(with(addr, "GET", "/v1/query/", None, ROOT).status, 400);

    // Unknown IDs.
    let ghost = "6f1c2a4e-0000-4000-8000-0000000000ff";
    assert_eq!(s.get(&format!("/v1/query/{ghost}")).status, 404);
    assert_eq!(s.get(&format!("/v1/query/{ghost}/execute")).status, 404);
    assert_eq!(s.get("/v1/query/nothing-by-that-name/explain").status, 404);
    let r = with(
        addr,
        "PUT",
        &format!("/v1/query/{ghost}"),
        Some(&upd.to_string()),
        ROOT,
    );
    assert_eq!(r.status, 404, "{}", r.body);

    // An unnamed query bound to a session; destroying the session deletes it.
    s.settle();
    let sess = s.put("/v1/session/create", "{}").json()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let bound = create(&s, &json!({"Session": sess, "Service": {"Service": "web"}}));
    assert_eq!(s.get(&format!("/v1/query/{bound}")).status, 200);
    let r = s.put(&format!("/v1/session/destroy/{sess}"), "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.get(&format!("/v1/query/{bound}")).status, 404);

    let r = with(addr, "DELETE", &format!("/v1/query/{id}"), None, ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.get_json("/v1/query"), json!([]));
    assert_eq!(s.get(&format!("/v1/query/{id}")).status, 404);
}

fn coord(x: f64) -> Value {
    json!({"Vec": [x, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "Error": 0.2,
           "Adjustment": 0.0, "Height": 0.0001})
}

/// Health, tags (with `!tag`), node meta, `?limit`, and the `Near` sort.
#[test]
fn execute_filters_sorts_and_limits() {
    let s = Server::dev();
    register(&s, "a", "10.0.0.1", "web-a", &["v1"], "passing");
    register(&s, "b", "10.0.0.2", "web-b", &["v1", "canary"], "passing");
    register(&s, "c", "10.0.0.3", "web-c", &["v1"], "warning");
    register(&s, "d", "10.0.0.4", "web-d", &["V1"], "critical");
    register(&s, "e", "10.0.0.5", "web-e", &["v2"], "passing");

    let all = create(&s, &json!({"Name": "all", "Service": {"Service": "web"}}));
    let r = execute(&s, &all, "");
    assert_eq!(r["Service"], "web");
    assert_eq!(r["Datacenter"], "dc1");
    assert_eq!(r["Failovers"], 0);
    assert!(r["DNS"].is_object(), "{r}");
    // Critical is always dropped; warning kept without OnlyPassing.
    assert_eq!(sorted(nodes(&r)), ["a", "b", "c", "e"]);
    // By name too, in any case.
    assert_eq!(sorted(nodes(&execute(&s, "ALL", ""))), ["a", "b", "c", "e"]);

    let v1 = create(
        &s,
        &json!({"Name": "v1", "Service": {"Service": "web", "Tags": ["v1", "!canary"],
                "OnlyPassing": true}}),
    );
    assert_eq!(nodes(&execute(&s, &v1, "")), ["a"]);
    // IgnoreCheckIDs lets a critical check not count.
    let ignore = create(
        &s,
        &json!({"Name": "ign", "Service": {"Service": "web", "Tags": ["v1"],
                "IgnoreCheckIDs": ["web-d-check"]}}),
    );
    assert_eq!(
        sorted(nodes(&execute(&s, &ignore, ""))),
        ["a", "b", "c", "d"]
    );
    // ?limit cuts the answer.
    assert_eq!(nodes(&execute(&s, &all, "?limit=2")).len(), 2);
    assert_eq!(
        s.get(&format!("/v1/query/{all}/execute?limit=x")).status,
        400
    );

    // ?connect: the connect-capable instances (a's sidecar) instead.
    let proxy = json!({"Node": "a", "Address": "10.0.0.1",
        "Service": {"Kind": "connect-proxy", "Service": "web-sidecar-proxy", "ID": "web-proxy-a",
                    "Port": 21000, "Proxy": {"DestinationServiceName": "web"}}});
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/catalog/register",
        Some(&proxy.to_string()),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = execute(&s, &all, "?connect=true");
    assert_eq!(nodes(&r), ["a"]);
    assert_eq!(r["Nodes"][0]["Service"]["ID"], "web-proxy-a", "{r}");

    // Coordinates: a at 0, b at 0.01, c at 0.5, e at 1 (d critical).
    for (n, x) in [("a", 0.0), ("b", 0.01), ("c", 0.5), ("e", 1.0)] {
        let r = s.put(
            "/v1/coordinate/update",
            &json!({"Node": n, "Coord": coord(x)}).to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    eventually(WAIT, "the coordinates", || {
        (s.get_json("/v1/coordinate/nodes").as_array()?.len() >= 4).then_some(())
    });
    // The answer is shuffled, then sorted: asked several times, always
    // nearest first.
    for _ in 0..5 {
        assert_eq!(nodes(&execute(&s, &all, "?near=a")), ["a", "b", "c", "e"]);
        assert_eq!(nodes(&execute(&s, &all, "?near=e")), ["e", "c", "b", "a"]);
    }
    // The query's own Near, and `?near` overriding it.
    let near_e = create(
        &s,
        &json!({"Name": "near-e", "Service": {"Service": "web", "Near": "e"}}),
    );
    for _ in 0..3 {
        assert_eq!(nodes(&execute(&s, &near_e, "")), ["e", "c", "b", "a"]);
        assert_eq!(
            nodes(&execute(&s, &near_e, "?near=b")),
            ["b", "a", "c", "e"]
        );
        assert_eq!(nodes(&execute(&s, &near_e, "?near=e&limit=1")), ["e"]);
    }
}

/// Templates: the longest name prefix wins, a catch-all with an empty
/// name, and a regexp's captures; `explain` shows the rendered query.
#[test]
fn templates_render_for_the_name_executed() {
    let s = Server::dev();
    register(&s, "a", "10.0.0.1", "web-a", &["primary"], "passing");
    register(&s, "b", "10.0.0.2", "web-b", &["replica"], "passing");
    create(
        &s,
        &json!({"Name": "", "Template": {"Type": "name_prefix_match"},
                "Service": {"Service": "${name.full}"}}),
    );
    create(
        &s,
        &json!({"Name": "geo-", "Template": {"Type": "name_prefix_match"},
                "Service": {"Service": "${name.suffix}"}}),
    );
    create(
        &s,
        &json!({"Name": "geo-db-", "Template": {"Type": "name_prefix_match",
                "Regexp": "^geo-db-(.+?)-(primary|replica)$", "RemoveEmptyTags": true},
                "Service": {"Service": "${match(1)}", "Tags": ["${match(2)}", "${match(9)}"]}}),
    );
    // The catch-all: the whole name is the service.
    assert_eq!(sorted(nodes(&execute(&s, "web", ""))), ["a", "b"]);
    // `geo-`: the suffix.
    assert_eq!(sorted(nodes(&execute(&s, "geo-web", ""))), ["a", "b"]);
    // `geo-db-` is longer: the regexp's captures.
    assert_eq!(nodes(&execute(&s, "geo-db-web-replica", "")), ["b"]);
    let ex = s.get_json("/v1/query/geo-db-web-primary/explain");
    assert_eq!(ex["Query"]["Service"]["Service"], "web", "{ex}");
    assert_eq!(ex["Query"]["Service"]["Tags"], json!(["primary"]), "{ex}");
    assert_eq!(ex["Query"]["Name"], "geo-db-");
    // Only one catch-all template.
    let r = s.put_post(
        json!({"Name": "", "Template": {"Type": "name_prefix_match"},
                              "Service": {"Service": "x"}}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body
            .contains("a query template with an empty name already exists"),
        "{}",
        r.body
    );
}

trait PostQuery {
    fn put_post(&self, body: Value) -> common::Resp;
}

impl PostQuery for Server {
    fn put_post(&self, body: Value) -> common::Resp {
        with(
            self.http_addr,
            "POST",
            "/v1/query",
            Some(&body.to_string()),
            ROOT,
        )
    }
}

/// ACLs with default deny: writes need `query:write` on the name, reads
/// are filtered by `query:read` with the stored token hidden, and execute
/// shows what the token (the stored one, else the caller's) may read.
#[test]
fn acls_as_consul_checks_them() {
    let s = deny_server();
    let addr = s.http_addr;
    register(&s, "a", "10.0.0.1", "web-a", &[], "passing");
    let q = json!({"Name": "app-web", "Service": {"Service": "web"}});
    // Anonymous: refused.
    let r = common::request(addr, "POST", "/v1/query", Some(&q.to_string()));
    assert_eq!(r.status, 403, "{}", r.body);
    // Read but no write: refused.
    let (_, reader) = token_with_rules(addr, "qr", r#"query_prefix "" { policy = "read" }"#);
    let r = with(addr, "POST", "/v1/query", Some(&q.to_string()), &reader);
    assert_eq!(r.status, 403, "{}", r.body);
    // Write on the `app-` prefix: that name, no other.
    let (_, writer) = token_with_rules(addr, "qw", r#"query_prefix "app-" { policy = "write" }"#);
    let r = with(addr, "POST", "/v1/query", Some(&q.to_string()), &writer);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["ID"].as_str().unwrap().to_string();
    let other = json!({"Name": "other", "Service": {"Service": "web"}});
    let r = with(addr, "POST", "/v1/query", Some(&other.to_string()), &writer);
    assert_eq!(r.status, 403, "{}", r.body);
    // Nor rename it out of the prefix, nor take one over into it.
    let r = with(
        addr,
        "PUT",
        &format!("/v1/query/{id}"),
        Some(&other.to_string()),
        &writer,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let other_id = create(&s, &other);
    let r = with(
        addr,
        "PUT",
        &format!("/v1/query/{other_id}"),
        Some(&json!({"Name": "app-2", "Service": {"Service": "web"}}).to_string()),
        &writer,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = with(
        addr,
        "DELETE",
        &format!("/v1/query/{other_id}"),
        None,
        &writer,
    );
    assert_eq!(r.status, 403, "{}", r.body);

    // A query with a stored token: hidden from all but acl:write.
    let (_, svc_reader) = token_with_rules(
        addr,
        "sr",
        r#"service_prefix "" { policy = "read" }
           node_prefix "" { policy = "read" }"#,
    );
    let stored = create(
        &s,
        &json!({"Name": "app-stored", "Token": svc_reader, "Service": {"Service": "web"}}),
    );
    let list = with(addr, "GET", "/v1/query", None, &reader);
    assert_eq!(list.status, 200);
    let rows = list.json();
    assert_eq!(rows.as_array().unwrap().len(), 3, "{rows}");
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ID"] == stored.as_str())
        .unwrap();
    assert_eq!(row["Token"], "<hidden>");
    let root_view = with(addr, "GET", &format!("/v1/query/{stored}"), None, ROOT).json();
    assert_eq!(root_view[0]["Token"], svc_reader.as_str());
    // Anonymous sees none of them, and is told the list was filtered.
    let anon = common::request(addr, "GET", "/v1/query", None);
    assert_eq!((anon.status, anon.json()), (200, json!([])));
    assert_eq!(
        anon.header("x-consul-results-filtered-by-acls"),
        Some("true")
    );
    let r = common::request(addr, "GET", &format!("/v1/query/{id}"), None);
    assert_eq!(r.status, 403, "{}", r.body);
    let r = common::request(addr, "GET", &format!("/v1/query/{id}/explain"), None);
    assert_eq!(r.status, 403, "{}", r.body);

    // Execute without service:read: nothing; with it: the instance.
    let r = with(
        addr,
        "GET",
        &format!("/v1/query/{id}/execute"),
        None,
        &reader,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(nodes(&r.json()), Vec::<String>::new());
    let r = with(
        addr,
        "GET",
        &format!("/v1/query/{id}/execute"),
        None,
        &svc_reader,
    );
    assert_eq!(nodes(&r.json()), ["a"]);
    // The stored token reads for whoever executes.
    let r = common::request(addr, "GET", &format!("/v1/query/{stored}/execute"), None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(nodes(&r.json()), ["a"]);
    // The server-to-server path is not for clients.
    let r = with(
        addr,
        "POST",
        "/v1/internal/query/execute-remote",
        Some(&json!({"Query": q, "Limit": 0, "Connect": false}).to_string()),
        ROOT,
    );
    assert_eq!(r.status, 403, "{}", r.body);
}

/// One DNS query over UDP: (response code, [(type, ttl, data)]).
fn dns(addr: SocketAddr, name: &str, qtype: &str) -> (String, Vec<(String, u32, String)>) {
    let t = match qtype {
        "SRV" => RecordType::SRV,
        _ => RecordType::A,
    };
    let (code, records) = common::dns::ask(addr, name, t);
    let rows = records
        .iter()
        .map(|a| (a.record_type().to_string(), a.ttl, a.data.to_string()))
        .collect();
    (format!("{code:?}"), rows)
}

/// `<name>.query.consul`: A and SRV records of the query's answer, with
/// its DNS TTL; templates by name; NXDOMAIN for no query.
#[test]
fn dns_answers_query_lookups() {
    let s = Server::dev();
    register(&s, "a", "10.0.0.1", "web-a", &["v1"], "passing");
    register(&s, "b", "10.0.0.2", "web-b", &["v2"], "passing");
    register(&s, "c", "10.0.0.3", "web-c", &["v1"], "critical");
    create(
        &s,
        &json!({"Name": "web-v1", "Service": {"Service": "web", "Tags": ["v1"]},
                "DNS": {"TTL": "30s"}}),
    );
    create(
        &s,
        &json!({"Name": "tpl-", "Template": {"Type": "name_prefix_match"},
                "Service": {"Service": "${name.suffix}"}}),
    );
    let (code, rows) = dns(s.dns_addr, "web-v1.query.consul.", "A");
    assert_eq!(code, "NoError");
    assert_eq!(rows, [("A".to_string(), 30, "10.0.0.1".to_string())]);
    let (_, rows) = dns(s.dns_addr, "web-v1.query.dc1.consul.", "SRV");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, "SRV");
    assert_eq!(rows[0].1, 30);
    assert!(rows[0].2.ends_with("80 a.node.dc1.consul."), "{rows:?}");
    // A template, with the service's default TTL (0).
    let (_, rows) = dns(s.dns_addr, "tpl-web.query.consul.", "A");
    let mut ips: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    ips.sort();
    assert_eq!(ips, ["10.0.0.1", "10.0.0.2"]);
    assert!(rows.iter().all(|r| r.1 == 0));
    let (code, rows) = dns(s.dns_addr, "nothing.query.consul.", "A");
    assert_eq!((code.as_str(), rows.len()), ("NXDomain", 0));
}

/// A client agent answers `<name>.query.consul` from its server's execute
/// (cut to its DNS token), and forwards the HTTP endpoints.
#[test]
fn a_client_agent_answers_query_lookups() {
    let s = Server::dev();
    let a = common::agent::Agent::builder("qa1", &s.url).start();
    register(&s, "n1", "10.0.0.1", "web-1", &[], "passing");
    register(&s, "n2", "10.0.0.2", "web-2", &[], "critical");
    let id = create(
        &s,
        &json!({"Name": "agent-q", "Service": {"Service": "web"}, "DNS": {"TTL": "7s"}}),
    );
    let (code, rows) = dns(a.dns_addr, "agent-q.query.consul.", "A");
    assert_eq!(code, "NoError");
    assert_eq!(rows, [("A".to_string(), 7, "10.0.0.1".to_string())]);
    let (code, _) = dns(a.dns_addr, "missing-q.query.consul.", "A");
    assert_eq!(code, "NXDomain");
    // Its HTTP API forwards the query endpoints.
    let r = a.get(&format!("/v1/query/{id}/execute"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(nodes(&r.json()), ["n1"]);
}

/// The datacenters a server lists.
fn datacenters(s: &Server) -> Vec<String> {
    s.get_json("/v1/catalog/datacenters")
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

/// Local instances all critical: the query runs in the other datacenter
/// (which does not know it: the definition goes along), with `Datacenter`
/// and `Failovers` set; the same through DNS; and `?dc=` and
/// `<name>.query.<dc>.consul` run a query of the other datacenter there.
#[test]
fn failover_to_another_datacenter() {
    let tmp = tempfile::tempdir().unwrap();
    let dc2 = Server::durable("b0", tmp.path().join("b0"))
        .datacenter("dc2")
        .primary("dc1")
        .start();
    let dc1 = Server::durable("a0", tmp.path().join("a0"))
        .datacenter("dc1")
        .join_wan(dc2.raft_addr)
        .start();
    eventually(WAIT, "the two datacenters to know each other", || {
        (datacenters(&dc1) == ["dc1", "dc2"] && datacenters(&dc2) == ["dc2", "dc1"]).then_some(())
    });
    register(&dc1, "l1", "10.1.0.1", "web-1", &[], "critical");
    register(&dc2, "r1", "10.2.0.1", "web-1", &[], "passing");

    let by_list = create(
        &dc1,
        &json!({"Name": "web-dcs", "Service": {"Service": "web",
                "Failover": {"Datacenters": ["dc-unknown", "dc2"]}}, "DNS": {"TTL": "5s"}}),
    );
    let r = execute(&dc1, &by_list, "");
    assert_eq!(r["Datacenter"], "dc2", "{r}");
    assert_eq!(r["Failovers"], 1, "{r}");
    assert_eq!(nodes(&r), ["r1"]);
    assert_eq!(r["Nodes"][0]["Node"]["Datacenter"], "dc2", "{r}");
    for q in [
        json!({"Name": "web-near", "Service": {"Service": "web", "Failover": {"NearestN": 3}}}),
        json!({"Name": "web-tgt", "Service": {"Service": "web",
               "Failover": {"Targets": [{"Datacenter": "dc2"}]}}}),
    ] {
        create(&dc1, &q);
        let r = execute(&dc1, q["Name"].as_str().unwrap(), "");
        assert_eq!(
            (r["Datacenter"].as_str(), r["Failovers"].as_u64()),
            (Some("dc2"), Some(1)),
            "{r}"
        );
        assert_eq!(nodes(&r), ["r1"]);
    }
    // Without failover: nothing, here.
    create(
        &dc1,
        &json!({"Name": "web-local", "Service": {"Service": "web"}}),
    );
    let r = execute(&dc1, "web-local", "");
    assert_eq!(
        (r["Datacenter"].as_str(), r["Failovers"].as_u64()),
        (Some("dc1"), Some(0))
    );
    assert_eq!(nodes(&r), Vec::<String>::new());
    // Through DNS: dc2's instance, with the query's TTL.
    let (code, rows) = dns(dc1.dns_addr, "web-dcs.query.consul.", "A");
    assert_eq!(code, "NoError");
    assert_eq!(rows, [("A".to_string(), 5, "10.2.0.1".to_string())]);
    // Healthy again here: the local instance, no failover.
    register(&dc1, "l1", "10.1.0.1", "web-1", &[], "passing");
    let r = execute(&dc1, &by_list, "");
    assert_eq!(
        (r["Datacenter"].as_str(), r["Failovers"].as_u64()),
        (Some("dc1"), Some(0))
    );
    assert_eq!(nodes(&r), ["l1"]);

    // The servers' failover path is theirs: a client's `?dc=` does not
    // reach it in the other datacenter.
    let body = json!({"Query": {"Name": "x", "Service": {"Service": "web"}},
                      "Limit": 0, "Connect": false});
    let r = with(
        dc1.http_addr,
        "POST",
        "/v1/internal/query/execute-remote?dc=dc2",
        Some(&body.to_string()),
        ROOT,
    );
    assert_eq!(r.status, 403, "{}", r.body);

    // A query of dc2, run there by name from dc1 (HTTP `?dc=` and DNS).
    create(
        &dc2,
        &json!({"Name": "remote-web", "Service": {"Service": "web"}}),
    );
    let r = execute(&dc1, "remote-web", "?dc=dc2");
    assert_eq!(
        (r["Datacenter"].as_str(), nodes(&r)),
        (Some("dc2"), vec!["r1".to_string()])
    );
    let (_, rows) = dns(dc1.dns_addr, "remote-web.query.dc2.consul.", "A");
    assert_eq!(
        rows.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
        ["10.2.0.1"]
    );
}
