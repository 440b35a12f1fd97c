//! Network coordinates against real processes: agents' and servers'
//! coordinates computed from their RTTs (Vivaldi), Consul's
//! `/v1/coordinate` endpoints with their ACL filtering and refusals,
//! `?near` sorting on the catalog and health reads, and `cairn rtt`.

mod common;

use std::time::Duration;

use common::acl::{ROOT, deny_server, token_with_rules, with};
use common::agent::Agent;
use common::{Server, bin, eventually};
use serde_json::{Value, json};

/// Long enough for a heartbeat, the agent's first update and the
/// leader's batch (5 s), with room on a loaded machine.
const WAIT: Duration = Duration::from_secs(60);

fn coord(x: f64) -> Value {
    json!({"Vec": [x, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "Error": 0.2, "Adjustment": 0.0, "Height": 0.0001})
}

fn nodes_with_coords(rows: &Value) -> Vec<String> {
    let mut names: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["Node"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Waits until `node` has a coordinate the server shows.
fn wait_coord(s: &Server, node: &str) {
    eventually(WAIT, &format!("a coordinate for {node}"), || {
        (s.get(&format!("/v1/coordinate/node/{node}")).status == 200).then_some(())
    });
}

/// The node of each row, in the answer's order.
fn order(rows: &Value, node_of: &dyn Fn(&Value) -> String) -> Vec<String> {
    rows.as_array().unwrap().iter().map(node_of).collect()
}

/// `far` comes after every node with a coordinate, `none` (no coordinate)
/// after everything else.
fn assert_far_last(seq: &[String], what: &str) {
    let pos = |n: &str| seq.iter().rposition(|x| x == n);
    let first = |n: &str| seq.iter().position(|x| x == n);
    let (far, none) = (pos("0-far").unwrap(), pos("0-none").unwrap());
    let far_first = first("0-far").unwrap();
    let none_first = first("0-none").unwrap();
    for (i, n) in seq.iter().enumerate() {
        if n != "0-far" && n != "0-none" {
            assert!(i < far_first, "{what}: {n} after the far node: {seq:?}");
        }
    }
    assert!(
        far < none_first,
        "{what}: no coordinate must be last: {seq:?}"
    );
    assert_eq!(none, seq.len() - 1, "{what}: {seq:?}");
}

#[test]
fn agents_and_servers_get_coordinates_and_near_sorts_by_them() {
    let s = Server::builder().dev().node("srv").start();
    let a = Agent::builder("a", &s.url).start();
    let b = Agent::builder("b", &s.url).start();
    for n in ["srv", "a", "b"] {
        wait_coord(&s, n);
    }
    let rows = s.get_json("/v1/coordinate/nodes");
    assert_eq!(nodes_with_coords(&rows), ["a", "b", "srv"]);
    for r in rows.as_array().unwrap() {
        let c = &r["Coord"];
        assert_eq!(c["Vec"].as_array().unwrap().len(), 8, "{r}");
        for k in ["Error", "Adjustment", "Height"] {
            assert!(c[k].is_f64(), "{k} in {r}");
        }
        assert!(r.get("Segment").is_some(), "{r}");
    }
    // The heartbeats moved the agents' coordinates off the origin.
    let a_row = &s.get_json("/v1/coordinate/node/a")[0];
    assert!(a_row["Coord"]["Error"].as_f64().unwrap() < 1.5, "{a_row}");
    assert_eq!(s.get("/v1/coordinate/node/x").status, 404);
    // Forwarded by a client agent like the other reads.
    assert_eq!(
        nodes_with_coords(&a.get_json("/v1/coordinate/nodes")),
        ["a", "b", "srv"]
    );

    let dcs = s.get_json("/v1/coordinate/datacenters");
    assert_eq!(dcs[0]["Datacenter"], "dc1", "{dcs}");
    assert_eq!(dcs[0]["AreaID"], "wan", "{dcs}");
    assert_eq!(dcs[0]["Coordinates"][0]["Node"], "srv", "{dcs}");
    assert_eq!(
        dcs[0]["Coordinates"][0]["Coord"]["Vec"]
            .as_array()
            .unwrap()
            .len(),
        8
    );

    // "web" on both agents, and on two catalog nodes named to sort first:
    // one put far away by hand, one with no coordinate.
    for ag in [&a, &b] {
        let r = ag.put(
            "/v1/agent/service/register",
            r#"{"Name":"web","Port":80,"Check":{"TTL":"30s","Status":"passing"}}"#,
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    for n in ["0-far", "0-none"] {
        let body = json!({
            "Node": n, "Address": "10.0.0.9",
            "Service": {"Service": "web", "Port": 80},
            "Check": {"CheckID": "web-check", "Name": "web", "ServiceID": "web", "Status": "passing"},
        });
        let r = s.put("/v1/catalog/register", &body.to_string());
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let far = json!({"Node": "0-far", "Coord": coord(1.0)});
    let r = s.put("/v1/coordinate/update", &far.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    wait_coord(&s, "0-far");
    eventually(WAIT, "web on both agents", || {
        (s.get_json("/v1/catalog/service/web").as_array()?.len() == 4).then_some(())
    });

    let node = |r: &Value| r["Node"].as_str().unwrap().to_string();
    let nested = |r: &Value| r["Node"]["Node"].as_str().unwrap().to_string();
    let unsorted = order(&s.get_json("/v1/catalog/nodes"), &node);
    assert_eq!(
        unsorted[0], "0-far",
        "names sort the far node first without ?near"
    );
    for (path, f) in [
        ("/v1/catalog/nodes", &node as &dyn Fn(&Value) -> String),
        ("/v1/catalog/service/web", &node),
        ("/v1/health/service/web", &nested),
        ("/v1/health/checks/web", &node),
        ("/v1/health/state/any", &node),
    ] {
        for near in ["a", "b", "srv"] {
            let seq = order(&s.get_json(&format!("{path}?near={near}")), f);
            assert_far_last(&seq, &format!("{path}?near={near}"));
        }
        // `_agent` on a client agent is that agent's node.
        let seq = order(&a.get_json(&format!("{path}?near=_agent")), f);
        assert_far_last(&seq, &format!("{path}?near=_agent on a"));
        let seq = order(&s.get_json(&format!("{path}?near=_agent")), f);
        assert_far_last(&seq, &format!("{path}?near=_agent on the server"));
    }
    // Seen from the far node, it is the nearest.
    let seq = order(&s.get_json("/v1/catalog/nodes?near=0-far"), &node);
    assert_eq!(seq[0], "0-far", "{seq:?}");
    assert_eq!(seq.last().unwrap(), "0-none", "{seq:?}");

    // `cairn rtt`.
    let rtt = |args: &[&str]| {
        std::process::Command::new(bin())
            .arg("rtt")
            .args(args)
            .env("CAIRN_HTTP_ADDR", s.http_addr.to_string())
            .output()
            .unwrap()
    };
    let out = rtt(&["a", "b"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let re_ok = |t: &str, x: &str, y: &str, kind: &str| {
        let rest = t
            .trim()
            .strip_prefix(&format!("Estimated {x} <-> {y} rtt: "))
            .unwrap_or_else(|| panic!("{t}"));
        let (ms, tail) = rest.split_once(" ms ").unwrap_or_else(|| panic!("{t}"));
        assert_eq!(tail, format!("(using {kind} coordinates)"), "{t}");
        let (_, frac) = ms.split_once('.').unwrap_or_else(|| panic!("{t}"));
        assert_eq!(frac.len(), 3, "{t}");
        ms.parse::<f64>().unwrap()
    };
    re_ok(&text, "a", "b", "LAN");
    // To the far node: about the second put there by hand.
    let out = rtt(&["0-far"]);
    let ms = re_ok(&String::from_utf8_lossy(&out.stdout), "0-far", "srv", "LAN");
    assert!((900.0..1100.0).contains(&ms), "{ms}");
    let out = rtt(&["-wan", "srv.dc1"]);
    re_ok(
        &String::from_utf8_lossy(&out.stdout),
        "srv.dc1",
        "srv.dc1",
        "WAN",
    );
    let out = rtt(&["ghost", "a"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        r#"Could not find a coordinate for node "ghost""#
    );
    drop((a, b));
}

#[test]
fn servers_get_coordinates_from_probing_each_other() {
    let servers = Server::cluster(3);
    let s = &servers[0];
    let dc = eventually(WAIT, "three server coordinates", || {
        let dcs = s.get_json("/v1/coordinate/datacenters");
        let list = dcs[0]["Coordinates"].as_array()?.clone();
        // Followers' coordinates reach the state only through the
        // leader's probes of them.
        (list.len() == 3).then_some(list)
    });
    let names: Vec<&str> = dc.iter().map(|c| c["Node"].as_str().unwrap()).collect();
    assert_eq!(names, ["s0", "s1", "s2"]);
}

/// A server lists its own coordinate under its catalog name from its first
/// answer (Consul's comes from serf, not the state), and an update for
/// that name lands as a node's update does (py-consul's coordinate test).
#[test]
fn a_server_lists_its_own_coordinate_from_the_start() {
    let s = Server::builder().dev().node("srv").start();
    let dcs = s.get_json("/v1/coordinate/datacenters");
    assert_eq!(dcs[0]["Coordinates"][0]["Node"], "srv", "{dcs}");
    assert_eq!(
        dcs[0]["Coordinates"][0]["Coord"]["Vec"]
            .as_array()
            .unwrap()
            .len(),
        8,
        "{dcs}"
    );
    let r = s.put(
        "/v1/coordinate/update",
        &json!({"Node": "srv", "Coord": coord(0.25)}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let row = eventually(WAIT, "the update stored", || {
        let r = s.get("/v1/coordinate/node/srv");
        let rows: Value = serde_json::from_str(&r.body).ok()?;
        let row = rows.get(0)?.clone();
        (row["Coord"]["Vec"][0] == 0.25).then_some(row)
    });
    assert_eq!(row["Coord"]["Error"], 0.2, "{row}");
}

#[test]
fn bad_updates_are_refused_and_store_nothing() {
    let s = Server::builder().dev().node("srv").start();
    for n in ["n", "m"] {
        let r = s.put(
            "/v1/catalog/register",
            &json!({"Node": n, "Address": "10.0.0.1"}).to_string(),
        );
        assert_eq!(r.status, 200);
    }
    let mut short = coord(0.1);
    short["Vec"].as_array_mut().unwrap().pop();
    let mut huge = coord(0.1);
    huge["Vec"][2] = json!(1e300);
    let mut negative = coord(0.1);
    negative["Height"] = json!(-1.0);
    for (body, want) in [
        (json!({"Node": "n", "Coord": short}).to_string(), "rejected bad coordinate"),
        (json!({"Node": "n", "Coord": huge}).to_string(), "rejected bad coordinate"),
        (json!({"Node": "n", "Coord": negative}).to_string(), "rejected bad coordinate"),
        (json!({"Node": "", "Coord": coord(0.1)}).to_string(), "Must provide node"),
        (
            r#"{"Node":"n","Coord":{"Vec":[NaN,0,0,0,0,0,0,0],"Error":1,"Adjustment":0,"Height":0}}"#
                .to_string(),
            "Request decode failed",
        ),
        (r#"{"Node":"n","Coord":"#.to_string(), "Request decode failed"),
    ] {
        let r = s.put("/v1/coordinate/update", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(want), "{body}: {}", r.body);
    }
    let big = json!({"Node": "n", "Coord": coord(0.1), "Pad": "x".repeat(20_000)});
    let r = s.put("/v1/coordinate/update", &big.to_string());
    assert_eq!(r.status, 413, "{}", r.body);
    // A good update after them: once it is stored, any of them would be.
    let r = s.put(
        "/v1/coordinate/update",
        &json!({"Node": "m", "Coord": coord(0.1)}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    wait_coord(&s, "m");
    assert_eq!(s.get("/v1/coordinate/node/n").status, 404);
    // Updates for a node the catalog does not know are dropped, and a
    // deregistered node's coordinate goes with it.
    let r = s.put(
        "/v1/coordinate/update",
        &json!({"Node": "ghost", "Coord": coord(0.1)}).to_string(),
    );
    assert_eq!(r.status, 200);
    let r = s.put("/v1/catalog/deregister", r#"{"Node":"m"}"#);
    assert_eq!(r.status, 200);
    eventually(WAIT, "m's coordinate gone", || {
        (s.get("/v1/coordinate/node/m").status == 404).then_some(())
    });
    assert!(!nodes_with_coords(&s.get_json("/v1/coordinate/nodes")).contains(&"ghost".into()));
}

#[test]
fn acls_filter_coordinates_and_guard_updates() {
    let s = deny_server();
    let addr = s.http_addr;
    for n in ["n1", "n2"] {
        let body = json!({"Node": n, "Address": "10.0.0.1"}).to_string();
        assert_eq!(
            with(addr, "PUT", "/v1/catalog/register", Some(&body), ROOT).status,
            200
        );
        let body = json!({"Node": n, "Coord": coord(0.01)}).to_string();
        let r = with(addr, "PUT", "/v1/coordinate/update", Some(&body), ROOT);
        assert_eq!(r.status, 200, "{}", r.body);
    }
    eventually(WAIT, "both coordinates", || {
        let r = with(addr, "GET", "/v1/coordinate/nodes", None, ROOT);
        let names = nodes_with_coords(&r.json());
        (names.contains(&"n1".into()) && names.contains(&"n2".into())).then_some(())
    });
    // Anonymous: nothing, and told so.
    let r = s.get("/v1/coordinate/nodes");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!([]));
    assert_eq!(r.header("X-Consul-Results-Filtered-By-ACLs"), Some("true"));
    assert_eq!(s.get("/v1/coordinate/node/n1").status, 404);
    let body = json!({"Node": "n1", "Coord": coord(0.5)}).to_string();
    assert_eq!(s.put("/v1/coordinate/update", &body).status, 403);

    // node:read on n1 only.
    let (_, reader) = token_with_rules(addr, "read-n1", r#"node "n1" { policy = "read" }"#);
    let r = with(addr, "GET", "/v1/coordinate/nodes", None, &reader);
    assert_eq!(nodes_with_coords(&r.json()), ["n1"]);
    assert_eq!(
        with(addr, "GET", "/v1/coordinate/node/n1", None, &reader).status,
        200
    );
    assert_eq!(
        with(addr, "GET", "/v1/coordinate/node/n2", None, &reader).status,
        404
    );
    let r = with(addr, "PUT", "/v1/coordinate/update", Some(&body), &reader);
    assert_eq!(r.status, 403, "read is one permission short: {}", r.body);

    // node:write on n1: its own update, not n2's.
    let (_, writer) = token_with_rules(addr, "write-n1", r#"node "n1" { policy = "write" }"#);
    let r = with(addr, "PUT", "/v1/coordinate/update", Some(&body), &writer);
    assert_eq!(r.status, 200, "{}", r.body);
    let other = json!({"Node": "n2", "Coord": coord(0.5)}).to_string();
    let r = with(addr, "PUT", "/v1/coordinate/update", Some(&other), &writer);
    assert_eq!(r.status, 403, "{}", r.body);
    eventually(WAIT, "n1 moved", || {
        let r = with(addr, "GET", "/v1/coordinate/node/n1", None, &reader);
        (r.json()[0]["Coord"]["Vec"][0] == json!(0.5)).then_some(())
    });
    let r = with(addr, "GET", "/v1/coordinate/node/n2", None, ROOT);
    assert_eq!(r.json()[0]["Coord"]["Vec"][0], json!(0.01), "n2 unchanged");
}

#[test]
fn a_blocking_nodes_read_wakes_on_an_update() {
    let s = Server::builder().dev().node("srv").start();
    let r = s.put(
        "/v1/catalog/register",
        &json!({"Node": "n", "Address": "10.0.0.1"}).to_string(),
    );
    assert_eq!(r.status, 200);
    wait_coord(&s, "srv");
    let first = s.get("/v1/coordinate/nodes");
    let index = first.index();
    assert!(index > 0);
    assert_eq!(nodes_with_coords(&first.json()), ["srv"]);
    let parked = s.parked();
    let (url, path) = (
        s.http_addr,
        format!("/v1/coordinate/nodes?index={index}&wait=30s"),
    );
    let waiter = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        (common::request(url, "GET", &path, None), started.elapsed())
    });
    s.wait_parked(parked + 1);
    let r = s.put(
        "/v1/coordinate/update",
        &json!({"Node": "n", "Coord": coord(0.1)}).to_string(),
    );
    assert_eq!(r.status, 200);
    let (woke, took) = waiter.join().unwrap();
    assert_eq!(woke.status, 200);
    assert!(woke.index() > index, "{} !> {index}", woke.index());
    assert_eq!(nodes_with_coords(&woke.json()), ["n", "srv"]);
    assert!(
        took < Duration::from_secs(20),
        "woke by the update, not the wait: {took:?}"
    );
}
