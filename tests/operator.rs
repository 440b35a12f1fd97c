//! Operator verbs on a real cluster: `transfer-leader` moves the Raft
//! leadership where it is asked (forwarded from a follower), and is
//! refused to callers without `operator:write`.

mod common;

use std::time::Duration;

use common::acl::{ROOT, acl_started, token_with_rules, with};
use common::{Server, by_raft, cli, eventually};

/// The index of the server every member names as leader.
fn agreed_leader(servers: &[Server]) -> usize {
    eventually(Duration::from_secs(20), "one agreed leader", || {
        let named: Vec<String> = servers
            .iter()
            .map(|s| {
                s.get_json("/v1/status/leader")
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        (!named[0].is_empty() && named.iter().all(|n| *n == named[0]))
            .then(|| by_raft(servers, &named[0]))
    })
}

/// The agreed leader is `want`; the servers' logs otherwise.
fn expect_leader(servers: &[Server], want: usize) {
    let got = agreed_leader(servers);
    if got != want {
        for s in servers {
            eprintln!("==== {}\n{}", s.name(), s.log());
        }
        panic!("server {got} leads, not {want}");
    }
}

#[test]
fn transfer_leader_moves_office_to_the_named_voter() {
    let servers = Server::cluster(3);
    let first = agreed_leader(&servers);
    let follower = (first + 1) % 3;
    let target = (first + 2) % 3;

    // Asked of a follower: forwarded to the leader, which hands over.
    let o = cli(
        &servers[follower].url,
        &[
            "operator",
            "raft",
            "transfer-leader",
            "-id",
            servers[target].name(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    expect_leader(&servers, target);

    // Without -id: any other voter.
    let r = servers[target].put("/v1/operator/raft/transfer-leader", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["Success"], true);
    assert_ne!(agreed_leader(&servers), target);

    // A name that is no voter: 400, leadership stays.
    let now = agreed_leader(&servers);
    let r = servers[now].put("/v1/operator/raft/transfer-leader?id=nope", "");
    assert_eq!(r.status, 400, "{}", r.body);
    expect_leader(&servers, now);
    // Writes still commit on the new leader.
    assert_eq!(servers[follower].put("/v1/kv/after", "x").body, "true");
}

#[test]
fn transfer_leader_needs_operator_write() {
    let s = acl_started(Server::builder().dev(), "deny");
    let path = "/v1/operator/raft/transfer-leader";
    let r = s.put(path, "");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("operator:write"), "{}", r.body);
    let (_, read_only) = token_with_rules(s.http_addr, "op-read", r#"operator = "read""#);
    let r = with(s.http_addr, "PUT", path, None, &read_only);
    assert_eq!(r.status, 403, "{}", r.body);
    // Allowed, but a lone server has no voter to hand over to.
    let r = with(s.http_addr, "PUT", path, None, ROOT);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("no other voter"), "{}", r.body);
}
