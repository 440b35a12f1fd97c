//! Three datacenters with real processes on loopback: dc1 (the primary,
//! three servers), dc2 (three) and dc3 (one), joined by `--join-wan` given
//! to dc1's servers only. Every server lists all three, its own first
//! then nearest first; a prepared query failing over to the nearest two
//! datacenters from dc1, where dc1's and dc2's instances are critical,
//! answers dc3's, with `Failovers` counting the datacenters tried.

mod common;

use std::time::Duration;

use common::{Server, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn datacenters(s: &Server) -> Vec<String> {
    serde_json::from_value(s.get_json("/v1/catalog/datacenters")).unwrap()
}

/// `web` on `node` with one check in `status`.
fn register(s: &Server, node: &str, addr: &str, status: &str) {
    let body = json!({
        "Node": node, "Address": addr,
        "Service": {"Service": "web", "ID": "web-1", "Port": 80},
        "Check": {"CheckID": "web-1-check", "Name": "check", "Status": status,
                  "ServiceID": "web-1"},
    });
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn three_datacenters_list_each_other_and_a_query_fails_over_to_the_third() {
    let dc2 = common::cluster(3, &["--datacenter", "dc2", "--primary-datacenter", "dc1"]);
    let dc3 = Server::builder()
        .node("c0")
        .datacenter("dc3")
        .primary("dc1")
        .start();
    let (j2, j3) = (dc2[0].raft_addr.to_string(), dc3.raft_addr.to_string());
    let dc1 = common::cluster(
        3,
        &["--datacenter", "dc1", "--join-wan", &j2, "--join-wan", &j3],
    );
    for s in dc1.iter().chain(&dc2) {
        s.wait_for_leader(WAIT);
    }

    // Every server of every datacenter lists all three, its own first.
    let all: Vec<(&Server, &str)> = dc1
        .iter()
        .map(|s| (s, "dc1"))
        .chain(dc2.iter().map(|s| (s, "dc2")))
        .chain([(&dc3, "dc3")])
        .collect();
    for (s, own) in &all {
        eventually(WAIT, &format!("{} to list the three", s.name()), || {
            let list = datacenters(s);
            let mut sorted = list.clone();
            sorted.sort();
            (sorted == ["dc1", "dc2", "dc3"] && list[0] == *own).then_some(())
        });
    }

    register(&dc1[0], "n1", "10.1.0.1", "critical");
    register(&dc2[0], "n2", "10.2.0.1", "critical");
    register(&dc3, "n3", "10.3.0.1", "passing");
    let q = json!({"Name": "web-near", "Service": {"Service": "web",
                   "Failover": {"NearestN": 2}}});
    let r = common::request(dc1[0].http_addr, "POST", "/v1/query", Some(&q.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);

    // Nearest first: dc3 is tried second when dc2 is the nearer (its
    // `Failovers` is 2), first otherwise; the order is read around the
    // execute and must hold through it.
    let (answer, order) = execute_stable(&dc1[0], |v| v["Datacenter"] == "dc3");
    let dc3_at = order.iter().position(|d| d == "dc3").unwrap() as u64;
    assert_eq!(answer["Failovers"], dc3_at, "{answer} with {order:?}");
    assert_eq!(answer["Nodes"].as_array().unwrap().len(), 1, "{answer}");
    assert_eq!(answer["Nodes"][0]["Node"]["Node"], "n3", "{answer}");
    assert_eq!(answer["Nodes"][0]["Node"]["Datacenter"], "dc3", "{answer}");

    // With dc2's instance healthy again, the nearer of the two answers,
    // the first tried.
    register(&dc2[0], "n2", "10.2.0.1", "passing");
    let (v, order) = execute_stable(&dc1[0], |v| {
        v["Nodes"].as_array().is_some_and(|n| !n.is_empty()) && v["Datacenter"] != "dc1"
    });
    assert_eq!(
        v["Datacenter"].as_str(),
        Some(order[1].as_str()),
        "{v} with {order:?}"
    );
    assert_eq!(v["Failovers"], 1, "{v}");
}

/// Executes `web-near` on `s` until `done` holds of an answer given while
/// the nearest-first order stayed the same; that answer and that order.
fn execute_stable(s: &Server, done: impl Fn(&Value) -> bool) -> (Value, Vec<String>) {
    eventually(WAIT, "the query's answer", || {
        let before = datacenters(s);
        let r = s.get("/v1/query/web-near/execute");
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        (before == datacenters(s) && done(&v)).then_some((v, before))
    })
}
