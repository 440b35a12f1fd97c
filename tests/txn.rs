//! `PUT /v1/txn` with Consul's node, service and check operations on real
//! servers: each verb, cas failures rolling the whole txn back, bad
//! operations refused before anything is proposed, and read-only txns
//! answered by any server with `?stale`.

mod common;

use std::time::Duration;

use common::{Resp, Server};
use serde_json::{Value, json};

fn txn(s: &Server, ops: Value) -> Resp {
    s.put("/v1/txn", &ops.to_string())
}

fn ok(s: &Server, ops: Value) -> Vec<Value> {
    let r = txn(s, ops);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["Errors"].is_null(), "{v}");
    v["Results"].as_array().cloned().unwrap_or_default()
}

/// A txn rolled back: 409 with Consul's error shape; the failed ops.
fn conflict(s: &Server, ops: Value) -> Vec<(u64, String)> {
    let r = txn(s, ops);
    assert_eq!(r.status, 409, "{}", r.body);
    let v = r.json();
    assert!(v["Results"].is_null(), "{v}");
    v["Errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["OpIndex"].as_u64().unwrap(),
                e["What"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn node_set(name: &str, addr: &str) -> Value {
    json!({"Node": {"Verb": "set", "Node": {"Node": name, "Address": addr}}})
}

#[test]
fn node_operations_follow_consuls_verbs() {
    let s = Server::dev();
    let r = ok(&s, json!([node_set("n1", "10.0.0.1")]));
    assert_eq!(r[0]["Node"]["Node"], "n1");
    assert_eq!(r[0]["Node"]["Address"], "10.0.0.1");
    let m1 = r[0]["Node"]["ModifyIndex"].as_u64().unwrap();
    assert_eq!(
        s.get_json("/v1/catalog/node/n1")["Node"]["Address"],
        "10.0.0.1"
    );

    // cas: 0 means "only if absent"; a stale index fails; the current wins.
    let cas = |index: u64, addr: &str| json!([{"Node": {"Verb": "cas", "Node": {"Node": "n1", "Address": addr, "ModifyIndex": index}}}]);
    let e = conflict(&s, cas(0, "10.0.0.2"));
    assert_eq!(e[0].0, 0);
    assert!(e[0].1.contains("index is stale"), "{e:?}");
    conflict(&s, cas(m1 + 100, "10.0.0.2"));
    let r = ok(&s, cas(m1, "10.0.0.2"));
    let m2 = r[0]["Node"]["ModifyIndex"].as_u64().unwrap();
    assert!(m2 > m1);

    let r = ok(
        &s,
        json!([{"Node": {"Verb": "get", "Node": {"Node": "n1"}}}]),
    );
    assert_eq!(r[0]["Node"]["Address"], "10.0.0.2");
    let e = conflict(
        &s,
        json!([{"Node": {"Verb": "get", "Node": {"Node": "nope"}}}]),
    );
    assert!(e[0].1.contains("doesn't exist"), "{e:?}");

    // delete-cas with a stale index changes nothing; with the current one
    // the node goes (with no result, as Consul).
    let del_cas = |index: u64| json!([{"Node": {"Verb": "delete-cas", "Node": {"Node": "n1", "ModifyIndex": index}}}]);
    conflict(&s, del_cas(m1));
    assert!(!s.get_json("/v1/catalog/node/n1").is_null());
    assert!(ok(&s, del_cas(m2)).is_empty());
    assert!(s.get_json("/v1/catalog/node/n1").is_null());

    ok(&s, json!([node_set("n1", "10.0.0.3")]));
    assert!(
        ok(
            &s,
            json!([{"Node": {"Verb": "delete", "Node": {"Node": "n1"}}}])
        )
        .is_empty()
    );
    assert!(s.get_json("/v1/catalog/node/n1").is_null());
}

#[test]
fn service_and_check_operations_follow_consuls_verbs() {
    let s = Server::dev();
    let r = ok(
        &s,
        json!([
            node_set("n1", "10.0.0.1"),
            {"Service": {"Verb": "set", "Node": "n1",
                         "Service": {"ID": "web-1", "Service": "web", "Port": 80}}},
            {"Check": {"Verb": "set", "Check": {"Node": "n1", "CheckID": "web-alive",
                       "Name": "alive", "ServiceID": "web-1", "Status": "passing"}}},
        ]),
    );
    assert_eq!(r.len(), 3);
    assert_eq!(r[1]["Service"]["ID"], "web-1");
    assert_eq!(r[2]["Check"]["ServiceName"], "web");
    let svc_index = r[1]["Service"]["ModifyIndex"].as_u64().unwrap();
    let check_index = r[2]["Check"]["ModifyIndex"].as_u64().unwrap();
    assert_eq!(
        s.get_json("/v1/health/service/web?passing")
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let r = ok(
        &s,
        json!([
            {"Service": {"Verb": "get", "Node": "n1", "Service": {"ID": "web-1"}}},
            {"Check": {"Verb": "get", "Check": {"Node": "n1", "CheckID": "web-alive"}}},
        ]),
    );
    assert_eq!(r[0]["Service"]["Port"], 80);
    assert_eq!(r[1]["Check"]["Status"], "passing");
    let e = conflict(
        &s,
        json!([{"Service": {"Verb": "get", "Node": "n1", "Service": {"ID": "nope"}}}]),
    );
    assert!(e[0].1.contains("doesn't exist"), "{e:?}");

    // A service on a node that does not exist is refused (409).
    conflict(
        &s,
        json!([{"Service": {"Verb": "set", "Node": "ghost", "Service": {"Service": "web"}}}]),
    );

    // Service cas: stale fails, current moves the port.
    let svc_cas = |index: u64, port: u16| {
        json!([{"Service": {"Verb": "cas", "Node": "n1",
                "Service": {"ID": "web-1", "Service": "web", "Port": port, "ModifyIndex": index}}}])
    };
    conflict(&s, svc_cas(svc_index + 50, 81));
    ok(&s, svc_cas(svc_index, 81));
    assert_eq!(s.get_json("/v1/catalog/service/web")[0]["ServicePort"], 81);

    // Check cas turns it critical: the instance leaves ?passing.
    let r = ok(
        &s,
        json!([{"Check": {"Verb": "cas", "Check": {"Node": "n1", "CheckID": "web-alive",
                "Name": "alive", "ServiceID": "web-1", "Status": "critical",
                "ModifyIndex": check_index}}}]),
    );
    let check_index = r[0]["Check"]["ModifyIndex"].as_u64().unwrap();
    assert!(
        s.get_json("/v1/health/service/web?passing")
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Check delete-cas, then service delete (its checks go with it).
    conflict(
        &s,
        json!([{"Check": {"Verb": "delete-cas", "Check": {"Node": "n1", "CheckID": "web-alive", "ModifyIndex": 1}}}]),
    );
    ok(
        &s,
        json!([{"Check": {"Verb": "delete-cas", "Check": {"Node": "n1", "CheckID": "web-alive",
                "ModifyIndex": check_index}}}]),
    );
    assert!(
        s.get_json("/v1/health/checks/web")
            .as_array()
            .unwrap()
            .is_empty()
    );
    ok(
        &s,
        json!([{"Check": {"Verb": "set", "Check": {"Node": "n1", "CheckID": "c2", "ServiceID": "web-1"}}},
               {"Service": {"Verb": "delete", "Node": "n1", "Service": {"ID": "web-1"}}}]),
    );
    assert!(
        s.get_json("/v1/catalog/service/web")
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(
        s.get_json("/v1/health/node/n1")
            .as_array()
            .unwrap()
            .is_empty()
    );
    let svc = s.get_json("/v1/catalog/node-services/n1");
    assert!(svc["Services"].as_array().unwrap().is_empty(), "{svc}");
    ok(
        &s,
        json!([{"Service": {"Verb": "set", "Node": "n1", "Service": {"ID": "db", "Service": "db"}}}]),
    );
    let svc_index = s.get_json("/v1/catalog/service/db")[0]["ModifyIndex"]
        .as_u64()
        .unwrap();
    ok(
        &s,
        json!([{"Service": {"Verb": "delete-cas", "Node": "n1",
                "Service": {"ID": "db", "ModifyIndex": svc_index}}}]),
    );
    assert!(
        s.get_json("/v1/catalog/service/db")
            .as_array()
            .unwrap()
            .is_empty()
    );
    ok(
        &s,
        json!([{"Check": {"Verb": "set", "Check": {"Node": "n1", "CheckID": "node-ok"}}}]),
    );
    ok(
        &s,
        json!([{"Check": {"Verb": "delete", "Check": {"Node": "n1", "CheckID": "node-ok"}}}]),
    );
    assert!(
        s.get_json("/v1/health/node/n1")
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_failed_cas_rolls_the_whole_txn_back() {
    let s = Server::dev();
    // The server's own node and `consul` service written first: the
    // catalog's index must then move only by this test's writes.
    s.settle();
    ok(&s, json!([node_set("keep", "10.0.0.9")]));
    let index = s.get("/v1/catalog/nodes").index();
    let e = conflict(
        &s,
        json!([
            {"KV": {"Verb": "set", "Key": "txn/k", "Value": "dg=="}},
            node_set("n2", "10.0.0.2"),
            {"Service": {"Verb": "set", "Node": "n2", "Service": {"Service": "api"}}},
            {"Node": {"Verb": "delete", "Node": {"Node": "keep"}}},
            {"Check": {"Verb": "cas", "Check": {"Node": "n2", "CheckID": "c", "ModifyIndex": 99}}},
        ]),
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].0, 4);
    assert_eq!(s.get("/v1/kv/txn/k").status, 404);
    assert!(s.get_json("/v1/catalog/node/n2").is_null());
    assert!(!s.get_json("/v1/catalog/node/keep").is_null());
    assert!(
        s.get_json("/v1/catalog/service/api")
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(s.get("/v1/catalog/nodes").index(), index);
}

#[test]
fn bad_operations_are_refused_and_change_nothing() {
    let s = Server::dev();
    s.settle();
    let index = s.get("/v1/catalog/nodes").index();
    let cases = [
        json!([{"Node": {"Verb": "upsert", "Node": {"Node": "n", "Address": "a"}}}]),
        json!([{"Node": {"Verb": "set", "Node": {"Node": "n"}}}]),
        json!([{"Node": {"Verb": "set", "Node": {"Node": "bad\u{1}name", "Address": "a"}}}]),
        json!([{"Node": {"Verb": "set", "Node": {"Node": "n", "Address": "a", "Datacenter": "dc9"}}}]),
        json!([{"Service": {"Verb": "set", "Node": "n", "Service": {"Port": 80}}}]),
        json!([{"Service": {"Verb": "set", "Node": "n", "Service": {"Service": "w", "Port": 70000}}}]),
        json!([{"Service": {"Verb": "set", "Node": "", "Service": {"Service": "w"}}}]),
        json!([{"Check": {"Verb": "set", "Check": {"Node": "n", "CheckID": "c", "Status": "sad"}}}]),
        json!([{"Check": {"Verb": "set", "Check": {"CheckID": "c"}}}]),
        json!([{"Check": {"Verb": "set", "Check": {"Node": "n", "CheckID": "c\u{0}x"}}}]),
        json!([{"Intention": {"Verb": "set"}}]),
        json!([{"Node": {"Verb": "set", "Node": {"Node": "n", "Address": "a"}},
                "KV": {"Verb": "set", "Key": "k"}}]),
        json!([{"Node": {"Verb": "set", "Node": {"Node": "n", "Address": "a"}, "Extra": 1}}]),
    ];
    for (i, ops) in cases.iter().enumerate() {
        let mut all = vec![node_set("fine", "10.0.0.1")];
        all.extend(ops.as_array().unwrap().iter().cloned());
        let r = txn(&s, Value::Array(all));
        assert_eq!(r.status, 400, "case {i}: {}", r.body);
    }
    let many: Vec<Value> = (0..129)
        .map(|i| node_set(&format!("n{i}"), "10.0.0.1"))
        .collect();
    assert_eq!(txn(&s, Value::Array(many)).status, 413);
    assert!(s.get_json("/v1/catalog/node/fine").is_null());
    assert_eq!(s.get("/v1/catalog/nodes").index(), index);
}

#[test]
fn a_read_only_txn_is_answered_by_a_follower_without_a_leader_with_stale() {
    let mut servers = Server::cluster(3);
    let leader = servers[0].get_json("/v1/status/leader");
    let li = servers
        .iter()
        .position(|s| Value::String(s.raft_addr.to_string()) == leader)
        .unwrap();
    let fi = (li + 1) % 3;
    // A write txn sent with ?stale to a follower is still a write: it
    // goes to the leader.
    let r = servers[fi].put(
        "/v1/txn?stale",
        &json!([node_set("n1", "10.0.0.1"),
                {"KV": {"Verb": "set", "Key": "k", "Value": "dg=="}}])
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let read = json!([
        {"Node": {"Verb": "get", "Node": {"Node": "n1"}}},
        {"KV": {"Verb": "get", "Key": "k"}},
    ])
    .to_string();
    common::eventually(
        Duration::from_secs(10),
        "the follower has the write",
        || (servers[fi].put("/v1/txn?stale", &read).status == 200).then_some(()),
    );
    // With the other two gone there is no leader: only this server's own
    // state can answer, and it does.
    for (i, s) in servers.iter_mut().enumerate() {
        if i != fi {
            s.kill();
        }
    }
    let r = servers[fi].put("/v1/txn?stale", &read);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["Results"][0]["Node"]["Address"], "10.0.0.1");
    assert_eq!(v["Results"][1]["KV"]["Value"], "dg==");
    assert!(r.header("x-consul-knownleader").is_some());
}
