//! Autopilot's dead-server cleanup on real clusters, and a removed server
//! that comes back: a dead server leaves the Raft configuration once the
//! leader has not heard from it for the dead bound (10 s at the default
//! threshold), never sooner, never when cleanup is off or the rule of
//! quorum forbids it; restarted on its data dir, it asks to join again and
//! is a voter with the writes it missed. And the configuration's ACL and
//! size limits.

mod common;

use std::time::{Duration, Instant};

use common::acl::{ROOT, acl_started, token_with_rules, with};
use common::{Server, agreed_leader, cluster, eventually};

/// The least silence after which the leader calls a server dead (the
/// default `LastContactThreshold`, 200ms, gives the 10 s floor).
const DEAD_AFTER: Duration = Duration::from_secs(10);

/// The Raft configuration as `s` knows it: (node, voter), sorted.
fn configuration(s: &Server) -> Vec<(String, bool)> {
    let c = s.get_json("/v1/operator/raft/configuration?stale");
    let mut v: Vec<(String, bool)> = c["Servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["Node"].as_str().unwrap().to_string(),
                p["Voter"].as_bool().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn set_autopilot(s: &Server, body: &str) {
    let r = s.put("/v1/operator/autopilot/configuration", body);
    assert_eq!(r.body, "true", "{}", r.body);
}

/// Waits until the leader's health calls `name` failed: its silence has
/// passed the dead bound (the cleanup's own test of death).
fn wait_failed(leader: &Server, name: &str) {
    eventually(
        Duration::from_secs(40),
        "the server reported failed",
        || {
            let h = leader.get("/v1/operator/autopilot/health").json();
            h["Servers"]
                .as_array()?
                .iter()
                .any(|s| s["Name"] == name && s["SerfStatus"] == "failed")
                .then_some(())
        },
    );
}

/// Over a couple of cleanup rounds (the duty looks every second), the
/// leader's configuration keeps all of `names`: what "stays" means.
fn stays(leader: &Server, names: &[&str]) {
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let c = configuration(leader);
        for n in names {
            assert!(
                c.iter().any(|(m, voter)| m == n && *voter),
                "{n} was removed: {c:?}\n{}",
                leader.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `s` has `key` = `value` in its own state (`?stale`: no forwarding).
fn has_locally(s: &Server, key: &str, value: &str) -> bool {
    let r = s.get(&format!("/v1/kv/{key}?stale&raw"));
    r.status == 200 && r.body == value
}

#[test]
fn a_dead_server_is_removed_then_rejoins_with_what_it_missed() {
    let mut servers = cluster(3, &[]);
    let leader = agreed_leader(&servers);
    set_autopilot(
        &servers[leader],
        r#"{"CleanupDeadServers": true, "LastContactThreshold": "200ms"}"#,
    );
    let victim = (leader + 1) % 3;
    let name = servers[victim].name().to_string();
    servers[victim].kill();
    let killed = Instant::now();

    let l = &servers[leader];
    eventually(Duration::from_secs(40), "the dead server removed", || {
        let c = configuration(l);
        (c.len() == 2 && c.iter().all(|(n, _)| *n != name)).then_some(())
    });
    // Not before the leader had heard nothing for the dead bound.
    assert!(
        killed.elapsed() >= DEAD_AFTER - Duration::from_millis(500),
        "removed after {:?}",
        killed.elapsed()
    );
    // The configuration shows the removal once committed, a moment before
    // the leader's membership change returns and counts it.
    eventually(Duration::from_secs(10), "the removal counted", || {
        (l.metric("cairn_autopilot_dead_servers_removed_total") == 1.0).then_some(())
    });
    assert!(l.log().contains("autopilot: removed a dead server"));
    // The two left are a quorum of their own: writes commit.
    assert_eq!(l.put("/v1/kv/while-away", "missed").body, "true");

    // Back on its data dir, it asks to join again and is a voter with the
    // write it missed.
    servers[victim].restart();
    eventually(Duration::from_secs(60), "the server a voter again", || {
        let c = configuration(&servers[leader]);
        (c.len() == 3 && c.iter().all(|(_, voter)| *voter)).then_some(())
    });
    let back = &servers[victim];
    eventually(
        Duration::from_secs(20),
        "the missed write replicated",
        || has_locally(back, "while-away", "missed").then_some(()),
    );
    assert!(
        back.log().contains("asking to join again"),
        "{}",
        back.log()
    );
    let leader = agreed_leader(&servers);
    assert_eq!(servers[leader].put("/v1/kv/after", "1").body, "true");
    eventually(Duration::from_secs(20), "a new write replicated", || {
        has_locally(&servers[victim], "after", "1").then_some(())
    });
}

/// A server cut off (frozen) past the dead bound is removed as dead; when
/// it comes back, without a restart, it finds itself out and asks to join
/// again.
#[test]
fn a_frozen_server_removed_as_dead_rejoins_when_thawed() {
    let servers = cluster(3, &[]);
    let leader = agreed_leader(&servers);
    let victim = (leader + 1) % 3;
    let name = servers[victim].name().to_string();
    servers[victim].signal("STOP");
    eventually(Duration::from_secs(40), "the frozen server removed", || {
        let c = configuration(&servers[leader]);
        (c.len() == 2 && c.iter().all(|(n, _)| *n != name)).then_some(())
    });
    assert_eq!(servers[leader].put("/v1/kv/frozen", "1").body, "true");
    servers[victim].signal("CONT");
    eventually(Duration::from_secs(60), "the server a voter again", || {
        let c = configuration(&servers[leader]);
        (c.len() == 3 && c.iter().all(|(_, voter)| *voter)).then_some(())
    });
    eventually(Duration::from_secs(20), "the write it missed", || {
        has_locally(&servers[victim], "frozen", "1").then_some(())
    });
}

/// The server comes back to a cluster now led by a server that joined
/// after it was removed: a leader its own (stale) membership does not
/// know, whose entries it takes all the same, being the leader its peers
/// named when it asked to join again.
#[test]
fn a_removed_server_rejoins_a_leader_it_never_knew() {
    let mut servers = cluster(3, &[]);
    let leader = agreed_leader(&servers);
    let victim = (leader + 1) % 3;
    let name = servers[victim].name().to_string();
    servers[victim].kill();
    eventually(Duration::from_secs(40), "the dead server removed", || {
        let c = configuration(&servers[leader]);
        (c.len() == 2 && c.iter().all(|(n, _)| *n != name)).then_some(())
    });
    let newcomer = Server::builder()
        .node("s3")
        .join(servers[leader].raft_addr)
        .no_wait()
        .start();
    eventually(Duration::from_secs(30), "the newcomer a voter", || {
        configuration(&servers[leader])
            .contains(&("s3".to_string(), true))
            .then_some(())
    });
    let r = servers[leader].put("/v1/operator/raft/transfer-leader?id=s3", "");
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(Duration::from_secs(20), "the newcomer leads", || {
        (newcomer.get("/v1/status/leader").json() == newcomer.raft_addr.to_string()).then_some(())
    });
    assert_eq!(newcomer.put("/v1/kv/new-leader", "1").body, "true");
    servers[victim].restart();
    eventually(Duration::from_secs(60), "the server a voter again", || {
        let c = configuration(&newcomer);
        (c.len() == 4 && c.iter().all(|(_, voter)| *voter)).then_some(())
    });
    eventually(Duration::from_secs(20), "the write it missed", || {
        has_locally(&servers[victim], "new-leader", "1").then_some(())
    });
}

#[test]
fn with_cleanup_off_a_dead_server_stays() {
    let mut servers = cluster(3, &[]);
    let leader = agreed_leader(&servers);
    set_autopilot(&servers[leader], r#"{"CleanupDeadServers": false}"#);
    let victim = (leader + 1) % 3;
    let name = servers[victim].name().to_string();
    servers[victim].kill();
    wait_failed(&servers[leader], &name);
    let all: Vec<String> = servers.iter().map(|s| s.name().to_string()).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    stays(&servers[leader], &all);
    assert_eq!(
        servers[leader].metric("cairn_autopilot_dead_servers_removed_total"),
        0.0
    );
}

/// Consul's rule: dead voters go only if the voters left are at least
/// `MinQuorum`, and only while they are a minority. With `MinQuorum` 3 one
/// dead server of three stays (the leader says why). With two of three
/// dead (`MinQuorum` 0) no quorum is left, and nothing is removed: the
/// leader judges nobody without a quorum's recent answer, the rule would
/// refuse a majority, and Raft could commit no removal anyway (so this
/// half holds even without the first two; the rule itself is unit-tested
/// in `raft::autopilot`).
#[test]
fn dead_servers_stay_when_removing_them_would_break_quorum() {
    let mut servers = cluster(3, &[]);
    let leader = agreed_leader(&servers);
    set_autopilot(
        &servers[leader],
        r#"{"CleanupDeadServers": true, "MinQuorum": 3}"#,
    );
    let first = (leader + 1) % 3;
    let names: Vec<String> = servers.iter().map(|s| s.name().to_string()).collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    servers[first].kill();
    wait_failed(&servers[leader], &names[first]);
    stays(&servers[leader], &all);
    assert!(
        servers[leader].log().contains("dead servers kept"),
        "{}",
        servers[leader].log()
    );

    // Back (still a member), then two of three die with MinQuorum 0.
    servers[first].restart();
    let leader = agreed_leader(&servers);
    set_autopilot(
        &servers[leader],
        r#"{"CleanupDeadServers": true, "MinQuorum": 0}"#,
    );
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    servers[a].kill();
    servers[b].kill();
    // The configuration the leader knows (committed or not) keeps all
    // three past the dead bound.
    let until = Instant::now() + DEAD_AFTER + Duration::from_secs(4);
    while Instant::now() < until {
        let c = configuration(&servers[leader]);
        assert_eq!(c.len(), 3, "{c:?}\n{}", servers[leader].log());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        servers[leader].metric("cairn_autopilot_dead_servers_removed_total"),
        0.0
    );
}

#[test]
fn a_live_server_removed_by_remove_peer_rejoins_after_restart() {
    let mut servers = cluster(3, &[]);
    let leader = agreed_leader(&servers);
    let victim = (leader + 1) % 3;
    let name = servers[victim].name().to_string();
    let r = servers[leader].delete(&format!("/v1/operator/raft/peer?id={name}"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        configuration(&servers[leader])
            .iter()
            .all(|(n, _)| *n != name)
    );
    assert_eq!(servers[leader].put("/v1/kv/gone", "1").body, "true");
    let term_before = term(&servers[leader]);
    servers[victim].restart();
    eventually(Duration::from_secs(60), "the server a voter again", || {
        let c = configuration(&servers[leader]);
        (c.len() == 3 && c.iter().all(|(_, voter)| *voter)).then_some(())
    });
    eventually(Duration::from_secs(20), "the write it missed", || {
        has_locally(&servers[victim], "gone", "1").then_some(())
    });
    // It came back quiet: no election of its own raised its term, so
    // taking it back deposed nobody (a higher term from a learner makes
    // the leader step down).
    assert_eq!(
        term(&servers[leader]),
        term_before,
        "{}",
        servers[victim].log()
    );
    assert_eq!(term(&servers[victim]), term_before);
    assert_eq!(servers[leader].put("/v1/kv/back", "1").body, "true");
}

/// The Raft term `s` is in.
fn term(s: &Server) -> u64 {
    s.get_json("/v1/agent/self")["Stats"]["raft"]["term"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn autopilot_configuration_needs_operator_write_and_a_bounded_body() {
    let s = acl_started(Server::builder().dev(), "deny");
    let path = "/v1/operator/autopilot/configuration";
    let before = with(s.http_addr, "GET", path, None, ROOT).json();
    let body = r#"{"CleanupDeadServers": false}"#;
    // Anonymous, and a token one permission short (operator:read).
    assert_eq!(s.put(path, body).status, 403);
    let (_, read) = token_with_rules(s.http_addr, "op-read", r#"operator = "read""#);
    let r = with(s.http_addr, "PUT", path, Some(body), &read);
    assert_eq!(r.status, 403, "{}", r.body);
    // 5 MiB of JSON, past the 4 MiB body limit: 413, whoever asks.
    let huge = format!(r#"{{"RedundancyZoneTag": "{}"}}"#, "x".repeat(5 << 20));
    let r = with(s.http_addr, "PUT", path, Some(&huge), ROOT);
    assert_eq!(r.status, 413, "{}", &r.body[..r.body.len().min(200)]);
    assert_eq!(with(s.http_addr, "GET", path, None, ROOT).json(), before);
    assert!(s.is_running());
}
