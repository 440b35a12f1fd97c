//! Faults against real processes with sled underneath: SIGKILL during heavy
//! writes, a leader frozen (SIGSTOP) past its election timeout then thawed,
//! and restart loops. After each: no acknowledged write is lost, every
//! server agrees, and no server refuses to start from its data dir. And a
//! request forwarded to a leader that freezes ends with its leadership.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::asynch::*;
use common::{Server, by_raft, cluster};

type Acked = Arc<Mutex<BTreeMap<String, String>>>;

/// Writers that spread puts over the servers' HTTP addresses and record
/// every write answered `true`.
struct Load {
    acked: Acked,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addrs: Vec<String>, writers: usize, prefix: &str) -> Load {
        let acked: Acked = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..writers)
            .map(|w| {
                let (acked, stop, addrs, prefix) = (
                    acked.clone(),
                    stop.clone(),
                    addrs.clone(),
                    prefix.to_string(),
                );
                tokio::spawn(async move {
                    let c = cairn::tls::http_client()
                        .timeout(Duration::from_secs(10))
                        .build()
                        .unwrap();
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("{prefix}/w{w}/{n:06}");
                        let addr = &addrs[(w + n) % addrs.len()];
                        let r = c
                            .put(format!("http://{addr}/v1/kv/{key}"))
                            .body(format!("v{n}"))
                            .send()
                            .await;
                        if let Ok(r) = r
                            && r.status().is_success()
                            && r.text().await.unwrap_or_default().trim() == "true"
                        {
                            acked.lock().unwrap().insert(key, format!("v{n}"));
                        } else {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        n += 1;
                    }
                })
            })
            .collect();
        Load { acked, stop, tasks }
    }

    async fn finish(self) -> BTreeMap<String, String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.acked.lock().unwrap().clone()
    }
}

/// A client that waits out elections and long blocking reads.
fn patient() -> reqwest::Client {
    cairn::tls::http_client()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// The leader the servers other than the frozen `old` agree on.
async fn new_leader_while_frozen(c: &reqwest::Client, survivors: &[&Server], old: &str) -> String {
    eventually(
        Duration::from_secs(15),
        "a new leader while the old one is frozen",
        || async {
            let l = agreed_leader(c, survivors).await;
            (l != old).then_some(l)
        },
    )
    .await
}

/// Every server holds every acknowledged write, and all hold the same.
async fn assert_nothing_lost(
    c: &reqwest::Client, procs: &[Server], prefix: &str, acked: &BTreeMap<String, String>,
) {
    assert!(!acked.is_empty(), "no write was acknowledged at all");
    let trees = eventually(Duration::from_secs(30), "all servers converge", || async {
        let mut trees = Vec::new();
        for p in procs {
            trees.push(kv_tree(c, p, prefix).await?);
        }
        let all_have = trees
            .iter()
            .all(|t| acked.iter().all(|(k, v)| t.get(k) == Some(v)));
        (all_have && trees.windows(2).all(|w| w[0] == w[1])).then_some(trees)
    })
    .await;
    for (p, t) in procs.iter().zip(&trees) {
        for (k, v) in acked {
            assert_eq!(t.get(k), Some(v), "acknowledged {k} lost on {}", p.name());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_heavy_writes_and_restart_loops_lose_nothing() {
    let mut procs = cluster(3, &["--raft-snapshot-threshold", "200"]);
    let c = client();
    cluster_leader(&c, &procs).await;
    let load = Load::start(http_addrs(&procs.iter().collect::<Vec<_>>()), 8, "kill");
    // Kill each server in turn, twice, the current leader among them.
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let victim = if round % 2 == 0 {
            let live: Vec<&Server> = procs.iter().collect();
            let l = agreed_leader(&c, &live).await;
            by_raft(&procs, &l)
        } else {
            round % 3
        };
        procs[victim].kill();
        tokio::time::sleep(Duration::from_millis(700)).await;
        procs[victim].restart();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acked = load.finish().await;
    cluster_leader(&c, &procs).await;
    assert_nothing_lost(&c, &procs, "kill", &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frozen_leader_is_replaced_and_rejoins_when_thawed() {
    let procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    let others: Vec<String> = http_addrs(&all_but(&procs, li));
    let load = Load::start(others, 4, "stop");
    tokio::time::sleep(Duration::from_millis(300)).await;
    procs[li].signal("STOP");
    // Well past the election timeout (600-1200 ms): the others elect anew.
    let survivors: Vec<&Server> = all_but(&procs, li);
    let new_leader = new_leader_while_frozen(&c, &survivors, &leader).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    procs[li].signal("CONT");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let acked = load.finish().await;
    // The thawed server follows the new leader and holds everything.
    let all: Vec<&Server> = procs.iter().collect();
    let agreed = agreed_leader(&c, &all).await;
    assert_ne!(
        agreed, leader,
        "the thawed server must not lead with a stale term"
    );
    let _ = new_leader;
    assert_nothing_lost(&c, &procs, "stop", &acked).await;
}

/// A write a follower forwards to a leader that freezes before answering
/// is answered 500 "leadership lost" as soon as the others elect a new
/// leader (it may or may not have committed), not when a timeout runs out;
/// a read in the same place is asked again of the new leader; the next
/// write through that follower reaches the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_forwarded_to_a_frozen_leader_ends_with_its_leadership() {
    let procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    let follower = all_but(&procs, li)[0];
    let key = follower.at("/v1/kv/frozen");
    // The key exists, so a consistent read of it is forwarded and answered.
    let r = c.put(&key).body("before").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let index = consul_index(&c.get(&key).send().await.unwrap());
    procs[li].signal("STOP");
    // The write and a blocking read sent right after the freeze, before the
    // follower can know: both forwarded to the frozen leader.
    let patient = patient();
    let sent = std::time::Instant::now();
    let read = patient
        .get(follower.at(&format!("/v1/kv/frozen?index={index}&wait=3s")))
        .send();
    let write = patient.put(&key).body("during").send();
    let (read, write) = tokio::join!(read, write);
    let took = sent.elapsed();
    let write = write.unwrap();
    let (status, body) = (write.status(), write.text().await.unwrap());
    assert_eq!(
        (status.as_u16(), body.as_str()),
        (500, "leadership lost while committing log")
    );
    assert!(took < Duration::from_secs(30), "answered after {took:?}");
    let read = read.unwrap();
    assert_eq!(
        read.status(),
        200,
        "the read, asked again of the new leader"
    );
    // The follower forwards the next write to the new leader.
    eventually(
        Duration::from_secs(15),
        "a write through the follower",
        || async {
            let r = c.put(&key).body("after").send().await.ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    procs[li].signal("CONT");
}

/// A blocking read on a follower answers within its wait (and the jitter
/// of 1/16) even when the leader it was forwarded to dies mid-wait: asked
/// again of the new leader, it waits only what is left (Patroni gives up 1 s
/// after its wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocking_read_answers_within_its_wait_when_the_leader_dies_mid_wait() {
    let mut procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    let follower = all_but(&procs, li)[0];
    let key = follower.at("/v1/kv/patient");
    assert_eq!(c.put(&key).body("v").send().await.unwrap().status(), 200);
    let index = consul_index(&c.get(&key).send().await.unwrap());
    let wait = Duration::from_secs(10);
    let patient = patient();
    let sent = std::time::Instant::now();
    let read = tokio::spawn(
        patient
            .get(follower.at(&format!("/v1/kv/patient?index={index}&wait=10s")))
            .send(),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    procs[li].kill();
    let read = read.await.unwrap().unwrap();
    let took = sent.elapsed();
    assert_eq!(read.status(), 200);
    assert!(
        took <= wait + wait / 16 + Duration::from_millis(500),
        "a 10 s wait answered after {took:?}"
    );
}

/// A leader that no quorum acknowledges holds its lease no longer
/// (`raft::LEADER_LEASE`): with both followers frozen it answers no
/// default-mode read from its own state (it waits for the lease back, then
/// `500 No cluster leader`, and a client asks another server), while a
/// `?stale` read is still answered; thawed, it answers again. On the main
/// before this it answered every default read from its state for as long
/// as it was cut off: behind a partition, a state older than the writes a
/// new leader acknowledged (issue 55's partition of real processes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_from_its_quorum_answers_no_default_read() {
    let procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    assert_eq!(put(&c, &procs[li], "lease", "v1").await, Ok(true));
    let followers: Vec<usize> = (0..procs.len()).filter(|&i| i != li).collect();
    for &f in &followers {
        procs[f].signal("STOP");
    }
    // Within the lease (500 ms) it still answers; past it, no more.
    let frozen = std::time::Instant::now();
    eventually(
        Duration::from_secs(5),
        "a default read left unanswered",
        || async {
            let r = c
                .get(procs[li].at("/v1/kv/lease"))
                .timeout(Duration::from_millis(800))
                .send()
                .await;
            (!r.is_ok_and(|r| r.status() == 200)).then_some(())
        },
    )
    .await;
    assert!(
        frozen.elapsed() >= Duration::from_millis(400),
        "{:?}",
        frozen.elapsed()
    );
    let started = std::time::Instant::now();
    let r = c.get(procs[li].at("/v1/kv/lease")).send().await.unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (500, "No cluster leader"),
        "a default read answered by a leader without its quorum after {:?}",
        started.elapsed()
    );
    let stale = c
        .get(procs[li].at("/v1/kv/lease?stale"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        stale.status(),
        200,
        "a ?stale read is any server's to answer"
    );
    for &f in &followers {
        procs[f].signal("CONT");
    }
    eventually(
        Duration::from_secs(20),
        "default reads answered again",
        || async {
            let r = c.get(procs[li].at("/v1/kv/lease")).send().await.ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
}

/// A default read that reaches a leader cut off from its quorum waits for
/// the lease back; when the leader learns instead of the newer term, the
/// read goes to the new leader and sees what it acknowledged, never the
/// deposed leader's older state. Before this the deposed leader answered
/// it itself the moment it stepped down (the simulation's 5-server seed 0:
/// a read held 650 ms across a heal saw a value deleted 800 ms before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_held_by_a_cut_off_leader_is_answered_by_the_new_one() {
    let procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    assert_eq!(put(&c, &procs[li], "held", "old").await, Ok(true));
    procs[li].signal("STOP");
    let survivors = all_but(&procs, li);
    new_leader_while_frozen(&c, &survivors, &leader).await;
    assert_eq!(put(&c, survivors[0], "held", "new").await, Ok(true));
    // Sent while the old leader is frozen: the request waits in its
    // socket's queue and is the first thing it serves when thawed, before
    // the new leader's heartbeats have told it of the newer term.
    let patient = patient();
    let read = tokio::spawn(patient.get(procs[li].at("/v1/kv/held?raw")).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    procs[li].signal("CONT");
    let r = read.await.unwrap().unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, "new"),
        "the deposed leader's read"
    );
}
