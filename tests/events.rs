//! User events (`/v1/event/fire`, `/v1/event/list`) against real servers
//! and client agents: delivery through the servers to every agent whose
//! node, services and tags match, the agents' rings, blocking lists,
//! Consul's limits and the ACL checks.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use common::acl::{ROOT, deny_server, token_with_rules, with};
use common::agent::Agent;
use common::{Server, eventually, request};
use serde_json::Value;

/// The names of the events `addr`'s agent lists (`query` appended).
fn names(addr: SocketAddr, query: &str) -> Vec<String> {
    let r = request(addr, "GET", &format!("/v1/event/list{query}"), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Name"].as_str().unwrap().to_string())
        .collect()
}

fn fire(addr: SocketAddr, name: &str, query: &str, payload: &str) -> common::Resp {
    request(
        addr,
        "PUT",
        &format!("/v1/event/fire/{name}{query}"),
        Some(payload),
    )
}

/// Waits until the agent at `agent` follows the servers' events (an agent
/// receives only what is fired after it first reached a server): probes
/// fired through `server` until one arrives.
fn following(server: SocketAddr, agent: SocketAddr) {
    eventually(
        Duration::from_secs(30),
        "the agent following events",
        || {
            assert_eq!(fire(server, "probe", "", "").status, 200);
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                if !names(agent, "?name=probe").is_empty() {
                    return Some(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            None
        },
    );
}

/// Waits for event `name` at the agent; the agent's list then.
fn arrives(agent: SocketAddr, name: &str) -> Vec<String> {
    eventually(Duration::from_secs(10), name, || {
        let all = names(agent, "");
        all.iter().any(|n| n == name).then_some(all)
    })
}

fn register(agent: &Agent, body: &str) {
    let r = agent.put("/v1/agent/service/register", body);
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn events_reach_the_agents_their_filters_match() {
    let servers = Server::cluster(3);
    let web = Agent::builder("web-node", &servers[1].url).start();
    let db = Agent::builder("db-node", &servers[2].url).start();
    register(
        &web,
        r#"{"Name":"web","ID":"web-1","Tags":["v2","primary"]}"#,
    );
    register(&db, r#"{"Name":"db","Tags":["v1"]}"#);
    for a in [&web, &db] {
        following(servers[0].http_addr, a.http_addr);
    }
    following(servers[0].http_addr, servers[0].http_addr);

    // Fired on a server (followers forward it), for web's tagged service.
    let r = fire(
        servers[2].http_addr,
        "deploy",
        "?service=web&tag=v2",
        "v2.1",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let fired = r.json();
    assert_eq!(fired["Name"], "deploy");
    assert_eq!(fired["ServiceFilter"], "web");
    assert_eq!(fired["TagFilter"], "v2");
    assert_eq!(fired["NodeFilter"], "");
    assert_eq!(fired["Version"], 1);
    assert_eq!(fired["Payload"], "djIuMQ==");
    let id = fired["ID"].as_str().unwrap().to_string();
    // One for db's node only, fired through a client agent.
    let r = fire(db.http_addr, "restart", "?node=^db-", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["Payload"].is_null());
    // A tag no service has: for no one.
    assert_eq!(
        fire(servers[0].http_addr, "nobody", "?service=web&tag=v9", "").status,
        200
    );
    // And one for all, after the others: once it is in, they were handled.
    assert_eq!(fire(servers[1].http_addr, "all", "", "x").status, 200);

    let at_web = arrives(web.http_addr, "all");
    assert!(at_web.contains(&"deploy".to_string()), "{at_web:?}");
    assert!(!at_web.contains(&"restart".to_string()), "{at_web:?}");
    assert!(!at_web.contains(&"nobody".to_string()), "{at_web:?}");
    let at_db = arrives(db.http_addr, "all");
    assert!(at_db.contains(&"restart".to_string()), "{at_db:?}");
    assert!(!at_db.contains(&"deploy".to_string()), "{at_db:?}");
    // A server's own agent (no services): only what has no service filter.
    let at_s0 = arrives(servers[0].http_addr, "all");
    assert!(!at_s0.contains(&"deploy".to_string()), "{at_s0:?}");
    assert!(!at_s0.contains(&"restart".to_string()), "{at_s0:?}");

    // The event as listed: Consul's JSON, its LTime set.
    let listed = web.get_json("/v1/event/list?name=deploy");
    let e = &listed.as_array().unwrap()[0];
    assert_eq!(e["ID"], id.as_str());
    let payload = base64::engine::general_purpose::STANDARD
        .decode(e["Payload"].as_str().unwrap())
        .unwrap();
    assert_eq!(payload, b"v2.1");
    assert!(e["LTime"].as_u64().unwrap() > 0, "{e}");
}

#[test]
fn list_by_name_and_blocking_on_a_fire() {
    let s = Server::dev();
    following(s.http_addr, s.http_addr);
    assert_eq!(fire(s.http_addr, "a", "", "1").status, 200);
    assert_eq!(fire(s.http_addr, "b", "", "2").status, 200);
    arrives(s.http_addr, "b");
    assert_eq!(names(s.http_addr, "?name=a"), ["a"]);
    assert_eq!(names(s.http_addr, "?name=zzz"), Vec::<String>::new());

    // The index is Consul's: derived from the last event's ID.
    let r = s.get("/v1/event/list?name=a");
    let list = r.json();
    let id = list[0]["ID"].as_str().unwrap().replace('-', "");
    let lo = u64::from_str_radix(&id[..16], 16).unwrap();
    let hi = u64::from_str_radix(&id[16..], 16).unwrap();
    assert_eq!(r.index(), lo ^ hi);

    // Nothing of that name fired: it waits its wait out, same index.
    let started = Instant::now();
    let same = s.get(&format!(
        "/v1/event/list?name=a&index={}&wait=1s",
        r.index()
    ));
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(same.index(), r.index());

    // A fire of that name wakes it well before its wait.
    let (addr, index) = (s.http_addr, r.index());
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let r = request(
            addr,
            "GET",
            &format!("/v1/event/list?name=a&index={index}&wait=30s"),
            None,
        );
        (started.elapsed(), r)
    });
    assert_eq!(fire(s.http_addr, "a", "", "3").status, 200);
    let (took, woke) = waiter.join().unwrap();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_ne!(woke.index(), index);
    let list = woke.json();
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    assert_eq!(list[1]["Payload"], "Mw==");
}

/// py-consul's own tests fire and list at once, as scripts do: an event
/// fired through an agent is in that agent's list read right after the
/// fire, with no wait (a server's own agent, and a client agent).
#[test]
fn a_list_right_after_a_fire_holds_it() {
    let s = Server::dev();
    let agent = Agent::builder("web-node", &s.url).start();
    for (at, addr) in [("server", s.http_addr), ("agent", agent.http_addr)] {
        following(s.http_addr, addr);
        for n in 0..20 {
            let name = format!("{at}-{n}");
            assert_eq!(fire(addr, &name, "", "").status, 200);
            assert_eq!(names(addr, &format!("?name={name}")), [name.as_str()]);
        }
    }
}

#[test]
fn an_agent_keeps_the_last_256() {
    let s = Server::dev();
    following(s.http_addr, s.http_addr);
    for i in 0..300 {
        let r = fire(s.http_addr, "r", "", &i.to_string());
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let list: Value = eventually(Duration::from_secs(10), "the last fire", || {
        let l = s.get_json("/v1/event/list?name=r");
        let last = l.as_array().unwrap().last()?["Payload"].clone();
        (last == "Mjk5").then_some(l) // "299"
    });
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 256);
    // The oldest kept is the 45th: 0..=43 fell out.
    assert_eq!(list[0]["Payload"], "NDQ="); // "44"
    let all = s.get_json("/v1/event/list");
    assert_eq!(all.as_array().unwrap().len(), 256);
}

#[test]
fn bad_fires_are_refused_and_change_nothing() {
    let s = Server::dev();
    following(s.http_addr, s.http_addr);
    // Consul's limit: name and payload together at most 512 bytes.
    let r = fire(s.http_addr, "x", "", &"p".repeat(512));
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(
        r.body.contains("exceeds configured limit of 512 bytes"),
        "{}",
        r.body
    );
    // A large body is refused the same way (one past the HTTP body cap
    // is refused before it is read: `limits`).
    let r = fire(s.http_addr, "x", "", &"p".repeat(1 << 20));
    assert_eq!(r.status, 413, "{}", r.body);
    let r = fire(s.http_addr, "x", "?tag=v1", "");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body
            .contains("Cannot provide tag filter without service filter")
    );
    let r = fire(s.http_addr, "x", "?node=%28", "");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Invalid node filter"), "{}", r.body);
    let r = request(s.http_addr, "PUT", "/v1/event/fire/", Some(""));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Missing name"), "{}", r.body);
    // The largest allowed goes through.
    let r = fire(s.http_addr, "x", "", &"p".repeat(511));
    assert_eq!(r.status, 200, "{}", r.body);
    // Only that one was fired (besides the probes).
    let after = arrives(s.http_addr, "x");
    let fired: Vec<&String> = after.iter().filter(|n| *n != "probe").collect();
    assert_eq!(fired, ["x"], "{after:?}");
    let x = s.get_json("/v1/event/list?name=x");
    assert_eq!(
        x[0]["Payload"].as_str().unwrap().len(),
        684,
        "511 bytes in base64"
    );
}

#[test]
fn acl_fire_needs_event_write_and_lists_are_filtered() {
    let s = deny_server();
    let addr = s.http_addr;
    let fire_as = |name: &str, token: &str| {
        with(
            addr,
            "PUT",
            &format!("/v1/event/fire/{name}"),
            Some("p"),
            token,
        )
    };
    let list_as =
        |q: &str, token: &str| with(addr, "GET", &format!("/v1/event/list{q}"), None, token);
    let (_, reader) =
        token_with_rules(addr, "deploy-read", r#"event "deploy" { policy = "read" }"#);
    let (_, writer) = token_with_rules(
        addr,
        "deploy-write",
        r#"event_prefix "deploy" { policy = "write" }"#,
    );

    // Anonymous: nothing fired, nothing read of the ring agents follow.
    let r = request(addr, "PUT", "/v1/event/fire/deploy", Some("p"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("Permission denied"), "{}", r.body);
    let r = request(addr, "GET", "/v1/internal/event/ring?node=x", None);
    assert_eq!(r.status, 403, "{}", r.body);
    // One permission short: read is not write.
    assert_eq!(fire_as("deploy", &reader).status, 403);
    // Write on `deploy*` only.
    assert_eq!(fire_as("other", &writer).status, 403);

    eventually(
        Duration::from_secs(30),
        "the agent following events",
        || {
            assert_eq!(fire_as("deploy", ROOT).status, 200);
            std::thread::sleep(Duration::from_millis(200));
            let r = list_as("?name=deploy", ROOT);
            (r.status == 200 && !r.json().as_array().unwrap().is_empty()).then_some(())
        },
    );
    assert_eq!(fire_as("deploy", &writer).status, 200);
    assert_eq!(fire_as("other", ROOT).status, 200);
    eventually(Duration::from_secs(10), "other", || {
        let r = list_as("?name=other", ROOT);
        (!r.json().as_array().unwrap().is_empty()).then_some(())
    });

    // The reader sees `deploy`, not `other`, and is told rows were dropped.
    let r = list_as("", &reader);
    assert_eq!(r.status, 200, "{}", r.body);
    let seen: Vec<Value> = r.json().as_array().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|e| e["Name"] == "deploy"), "{seen:?}");
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));
    // Anonymous sees nothing.
    let r = request(addr, "GET", "/v1/event/list", None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), serde_json::json!([]));
}

#[test]
fn cli_event_fires() {
    let s = Server::dev();
    following(s.http_addr, s.http_addr);
    let out = common::cli(
        &s.url,
        &["event", "-name", "cli-ev", "-node", ".*", "hello"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(printed.starts_with("Event ID: "), "{printed}");
    arrives(s.http_addr, "cli-ev");
    let e = &s.get_json("/v1/event/list?name=cli-ev")[0];
    assert_eq!(e["ID"], printed.trim().trim_start_matches("Event ID: "));
    assert_eq!(e["NodeFilter"], ".*");
    assert_eq!(e["Payload"], "aGVsbG8=");
    let out = common::cli(&s.url, &["event", "-name", "x", "-tag", "v1"]);
    assert!(!out.status.success());
}

/// A client agent follows the servers' ring with its own token, which
/// needs `node:write` on its node (as its heartbeats do): one with
/// `node:read` only is refused the ring and receives nothing, and the
/// servers show no event to an anonymous reader of the ring.
#[test]
fn acl_an_agent_follows_with_node_write_on_its_node() {
    let s = deny_server();
    let writer = token_with_rules(
        s.http_addr,
        "ev-agent",
        r#"node "ev-agent" { policy = "write" }"#,
    )
    .1;
    let reader = token_with_rules(
        s.http_addr,
        "ev-short",
        r#"node "ev-short" { policy = "read" }"#,
    )
    .1;
    let good = Agent::builder("ev-agent", &s.url)
        .arg("--acl-agent-token")
        .arg(&writer)
        .start();
    let short = Agent::builder("ev-short", &s.url)
        .arg("--acl-agent-token")
        .arg(&reader)
        .start();
    let list_as_root = |at: SocketAddr| {
        let r = with(at, "GET", "/v1/event/list", None, ROOT);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["Name"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    eventually(
        Duration::from_secs(30),
        "the agent following events",
        || {
            assert_eq!(
                with(s.http_addr, "PUT", "/v1/event/fire/probe", Some(""), ROOT).status,
                200
            );
            std::thread::sleep(Duration::from_millis(300));
            (!list_as_root(good.http_addr).is_empty()).then_some(())
        },
    );
    // The ring as the short token reads it: refused.
    let r = with(
        s.http_addr,
        "GET",
        "/v1/internal/event/ring?node=ev-short",
        None,
        &reader,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // A marker for everyone, once the good agent has it (the short one
    // has been trying as long): the short one has nothing.
    eventually(Duration::from_secs(10), "the marker", || {
        let r = with(s.http_addr, "PUT", "/v1/event/fire/marker", Some(""), ROOT);
        assert_eq!(r.status, 200);
        std::thread::sleep(Duration::from_millis(500));
        list_as_root(good.http_addr)
            .contains(&"marker".to_string())
            .then_some(())
    });
    assert!(list_as_root(short.http_addr).is_empty());
    assert!(
        short.log().contains("following user events failed"),
        "{}",
        short.log()
    );
}
