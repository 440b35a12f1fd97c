//! A secondary started before its primary, with real processes: its ACL
//! replication fails (`No path to datacenter`) with a growing pause until
//! the primary answers a greeting; then the first pull goes at once, not
//! after the pause grown meanwhile (seconds, which once made the first
//! token made in the primary take 3 s to reach the secondary).

mod common;

use std::time::{Duration, Instant};

use common::acl::{ROOT, with};
use common::{Server, eventually, free_port};

const WAIT: Duration = Duration::from_secs(30);

fn replicated_index(s: &Server) -> u64 {
    let r = with(s.http_addr, "GET", "/v1/acl/replication", None, ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["ReplicatedIndex"].as_u64().unwrap()
}

#[test]
fn replication_starts_as_soon_as_the_primary_is_known() {
    let dc1_raft = free_port();
    let dc2 = Server::builder()
        .node("b0")
        .datacenter("dc2")
        .primary("dc1")
        .join_wan(format!("127.0.0.1:{dc1_raft}"))
        .acl("deny", ROOT)
        .start();
    // Five failed pulls: the next one is 8 s after the fifth.
    eventually(WAIT, "five failed pulls", || {
        let failures = dc2
            .log()
            .matches(r#"replication from the primary failed what="acl""#)
            .count();
        (failures >= 5).then_some(())
    });
    assert_eq!(replicated_index(&dc2), 0);

    let dc1 = Server::builder()
        .node("a0")
        .datacenter("dc1")
        .raft_port(dc1_raft)
        .acl("deny", ROOT)
        .start();
    let datacenters = |s: &Server| -> Vec<String> {
        let r = with(s.http_addr, "GET", "/v1/catalog/datacenters", None, ROOT);
        serde_json::from_str(&r.body).unwrap()
    };
    eventually(WAIT, "dc2 to know dc1", || {
        (datacenters(&dc2).len() == 2).then_some(())
    });
    let known = Instant::now();
    eventually(WAIT, "dc2's first pull", || {
        (replicated_index(&dc2) > 0).then_some(())
    });
    let took = known.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "the first pull came {took:?} after dc1 was known"
    );
    assert_eq!(datacenters(&dc1).len(), 2);
}
