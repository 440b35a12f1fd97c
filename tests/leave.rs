//! A server's graceful leave (`PUT /v1/agent/leave`, the step of a rolling
//! restart), with real processes on loopback: the leader hands leadership
//! over, leaves the Raft configuration and the catalog (its `consul`
//! service with it) and exits, while a writer on the other servers keeps
//! committing; a lone server just stops; a token without `agent:write` on
//! the node is refused and nothing leaves.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::acl::{ROOT, token_with_rules, with};
use common::{Server, agreed_leader, cluster, eventually, request};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn a_leader_that_leaves_hands_over_and_the_cluster_keeps_committing() {
    let mut servers = cluster(3, &[]);
    let li = agreed_leader(&servers);
    let others: Vec<std::net::SocketAddr> = (0..3)
        .filter(|&i| i != li)
        .map(|i| servers[i].http_addr)
        .collect();
    let leaving = servers[li].name().to_string();

    // A writer on the two servers that stay: each write retried until
    // acknowledged; the times of the acknowledgements kept.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let writer = {
        let (stop, acked, others) = (stop.clone(), acked.clone(), others.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let path = format!("/v1/kv/leave/{n}");
                let deadline = Instant::now() + WAIT;
                loop {
                    let addr = others[(n as usize) % others.len()];
                    let r = common::try_request(addr, "PUT", &path, Some("v"));
                    if r.is_ok_and(|r| r.status == 200) {
                        acked.lock().unwrap().push(Instant::now());
                        break;
                    }
                    assert!(Instant::now() < deadline, "write {n} never acknowledged");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            n
        })
    };
    eventually(WAIT, "the writer's first writes", || {
        (acked.lock().unwrap().len() > 20).then_some(())
    });

    let started = Instant::now();
    let r = request(servers[li].http_addr, "PUT", "/v1/agent/leave", None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        servers[li].wait_exit(WAIT).is_some(),
        "the server that left is still running"
    );
    let left_after = started.elapsed();
    // The writer goes on a while past the exit.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    let times = acked.lock().unwrap().clone();
    assert_eq!(times.len() as u64, written, "every write was acknowledged");
    let longest = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    assert!(
        longest < Duration::from_secs(3),
        "writes stalled {longest:?} during the leave (which took {left_after:?})"
    );

    // Two servers, neither the one that left, in Raft and in the catalog.
    let s = &servers[(li + 1) % 3];
    eventually(WAIT, "the raft configuration without it", || {
        let conf = s.get_json("/v1/operator/raft/configuration");
        let names: Vec<String> = conf["Servers"]
            .as_array()?
            .iter()
            .filter_map(|x| x["Node"].as_str().map(str::to_string))
            .collect();
        (names.len() == 2 && !names.contains(&leaving)).then_some(())
    });
    let nodes = s.get_json("/v1/catalog/nodes");
    assert!(
        !nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["Node"] == leaving.as_str()),
        "{nodes}"
    );
    let consul = s.get_json("/v1/catalog/service/consul");
    assert_eq!(consul.as_array().unwrap().len(), 2, "{consul}");
    assert!(
        common::try_request(others[0], "PUT", "/v1/kv/after", Some("v"))
            .is_ok_and(|r| r.status == 200)
    );
    servers.remove(li);
}

#[test]
fn a_lone_server_stops_and_a_token_without_agent_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::durable("solo", dir.path())
        .acl("deny", ROOT)
        .start();
    assert_eq!(s.put("/v1/agent/leave", "").status, 403);
    let (_, other) = token_with_rules(
        s.http_addr,
        "other-node",
        r#"agent "elsewhere" { policy = "write" }"#,
    );
    let r = with(s.http_addr, "PUT", "/v1/agent/leave", None, &other);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(s.is_running());
    let (_, mine) = token_with_rules(
        s.http_addr,
        "this-node",
        r#"agent "solo" { policy = "write" }"#,
    );
    let r = with(s.http_addr, "PUT", "/v1/agent/leave", None, &mine);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        s.wait_exit(WAIT).is_some(),
        "the lone server is still running"
    );
}
