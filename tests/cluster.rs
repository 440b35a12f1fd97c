//! A cluster of real `cairn` processes on loopback: formation, forwarding,
//! failover without losing acknowledged writes, catch-up by snapshot,
//! restarts, joining and removing servers.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::asynch::*;
use common::{Server, by_raft, cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forms_forwards_fails_over_and_keeps_acknowledged_writes() {
    let mut procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    let follower = (li + 1) % 3;

    // A write sent to a follower is forwarded and readable everywhere.
    assert_eq!(
        put(&c, &procs[follower], "greeting", "hello").await,
        Ok(true)
    );
    for p in &procs {
        let v = eventually(Duration::from_secs(5), "replicated value", || async {
            get_raw(&c, p, "greeting", "stale").await
        })
        .await;
        assert_eq!(v, "hello");
    }
    // Default and consistent reads on a follower are answered by the leader.
    assert_eq!(
        get_raw(&c, &procs[follower], "greeting", "")
            .await
            .as_deref(),
        Some("hello")
    );
    assert_eq!(
        get_raw(&c, &procs[follower], "greeting", "consistent")
            .await
            .as_deref(),
        Some("hello")
    );

    // Writers keep going through the survivors while the leader is killed.
    let acked: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let targets: Vec<String> = http_addrs(&all_but(&procs, li));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (acked, stop, target) = (acked.clone(), stop.clone(), targets[w % 2].clone());
        writers.push(tokio::spawn(async move {
            let c = client();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("w{w}/k{n}");
                let value = format!("v{n}");
                let r = c
                    .put(format!("http://{target}/v1/kv/{key}"))
                    .body(value.clone())
                    .send()
                    .await;
                if let Ok(r) = r
                    && r.status().is_success()
                    && r.text().await.unwrap_or_default().trim() == "true"
                {
                    acked.lock().unwrap().insert(key, value);
                }
                n += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed_at = Instant::now();
    procs[li].kill();
    let survivors: Vec<&Server> = all_but(&procs, li);
    let new_leader = eventually(Duration::from_secs(20), "a new leader", || async {
        let l = agreed_leader(&c, &survivors).await;
        (l != leader).then_some(l)
    })
    .await;
    assert_ne!(new_leader, leader);
    let failover = killed_at.elapsed();
    assert!(
        failover < Duration::from_secs(10),
        "failover took {failover:?}"
    );
    // Writes go on under the new leader.
    assert_eq!(put(&c, survivors[0], "after", "failover").await, Ok(true));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 20,
        "too few writes acknowledged: {}",
        acked.len()
    );

    // Every acknowledged write is there, on every survivor (a follower may
    // apply the last commits a heartbeat after the leader answered).
    for p in &survivors {
        let have = eventually(
            Duration::from_secs(10),
            "survivor has every acked write",
            || async {
                let t = kv_tree(&c, p, "w").await?;
                acked.iter().all(|(k, v)| t.get(k) == Some(v)).then_some(t)
            },
        )
        .await;
        for (k, v) in &acked {
            assert_eq!(
                have.get(k),
                Some(v),
                "acknowledged write {k} lost on {}",
                p.name()
            );
        }
    }

    // The killed server restarts on its data dir and catches up.
    procs[li].restart();
    let (want_k, want_v) = acked.iter().next_back().unwrap();
    let got = eventually(
        Duration::from_secs(15),
        "restarted server catches up",
        || async {
            let v = get_raw(&c, &procs[li], want_k, "stale").await?;
            let after = get_raw(&c, &procs[li], "after", "stale").await?;
            Some((v, after))
        },
    )
    .await;
    assert_eq!((&got.0, got.1.as_str()), (want_v, "failover"));
    assert!(
        !procs[li].log().contains("bootstrapping the cluster")
            || procs[li].log().matches("bootstrapping the cluster").count() <= 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_behind_server_is_caught_up_by_snapshot() {
    let mut procs = cluster(3, &["--raft-snapshot-threshold", "50"]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    let lagger = (li + 1) % 3;
    let lagger_last = procs[lagger].metric("cairn_raft_last_log_index");
    procs[lagger].kill();
    for i in 0..300 {
        assert_eq!(
            put(&c, &procs[li], &format!("snap/{i:03}"), &format!("{i}")).await,
            Ok(true)
        );
    }
    // The leader purges only while no replication to the stopped server is
    // in flight (openraft retries it with backoff): far behind means its
    // log is purged past what the lagger holds, which is waited for.
    eventually(
        Duration::from_secs(30),
        "the leader purged its log past the lagger's",
        || async { (procs[li].metric("cairn_raft_last_purged_index") > lagger_last).then_some(()) },
    )
    .await;
    procs[lagger].restart();
    eventually(
        Duration::from_secs(20),
        "lagging server has every key",
        || async {
            let r = c
                .get(procs[lagger].at("/v1/kv/snap/?keys&stale"))
                .send()
                .await
                .ok()?;
            let keys: Vec<String> = r.json().await.ok()?;
            (keys.len() == 300).then_some(())
        },
    )
    .await;
    // The install is logged just after its state becomes readable (the
    // line follows a hop back from a blocking thread): waited for, not
    // read at once.
    eventually(
        Duration::from_secs(10),
        "the lagging server was caught up by a snapshot",
        || async {
            procs[lagger]
                .log()
                .contains("installed snapshot")
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_stop_and_restart_keeps_state_and_identity() {
    let mut procs = cluster(3, &[]);
    let c = client();
    cluster_leader(&c, &procs).await;
    for i in 0..20 {
        assert_eq!(
            put(&c, &procs[i % 3], &format!("keep/{i}"), "x").await,
            Ok(true)
        );
    }
    let roots = |p: &Server| {
        let (c, url) = (c.clone(), p.at("/v1/connect/ca/roots"));
        async move {
            let r = c.get(url).send().await.ok()?;
            let v: serde_json::Value = r.json().await.ok()?;
            v["TrustDomain"].as_str().map(String::from)
        }
    };
    let domain = eventually(Duration::from_secs(5), "trust domain", || roots(&procs[0])).await;
    for p in procs.iter_mut() {
        let name = p.name().to_string();
        let status = p.stop(Duration::from_secs(10));
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} did not stop cleanly on SIGTERM: {status:?}"
        );
    }
    for p in procs.iter_mut() {
        p.restart();
    }
    cluster_leader(&c, &procs).await;
    let keys: Vec<String> = eventually(Duration::from_secs(10), "keys after restart", || async {
        let r = c.get(procs[1].at("/v1/kv/keep/?keys")).send().await.ok()?;
        let k: Vec<String> = r.json().await.ok()?;
        (k.len() == 20).then_some(k)
    })
    .await;
    assert_eq!(keys.len(), 20);
    assert_eq!(
        roots(&procs[2]).await.as_deref(),
        Some(domain.as_str()),
        "cluster id must survive"
    );
    for p in &procs {
        assert_eq!(
            p.log().matches("bootstrapping the cluster").count(),
            usize::from(p.log().contains("bootstrapping the cluster")),
            "a restarted server must never bootstrap again"
        );
        assert!(p.log().contains("never bootstrapping"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_server_joins_and_a_peer_is_removed() {
    let procs = cluster(3, &[]);
    let c = client();
    cluster_leader(&c, &procs).await;
    assert_eq!(put(&c, &procs[0], "before-join", "1").await, Ok(true));
    let fourth = Server::builder()
        .node("s3")
        .join(procs[1].raft_addr)
        .no_wait()
        .start();
    let peers = eventually(Duration::from_secs(20), "four voters", || async {
        let r = c.get(procs[0].at("/v1/status/peers")).send().await.ok()?;
        let p: Vec<String> = r.json().await.ok()?;
        (p.len() == 4).then_some(p)
    })
    .await;
    assert!(peers.contains(&fourth.raft_addr.to_string()));
    let v = eventually(
        Duration::from_secs(10),
        "the new server catches up",
        || async { get_raw(&c, &fourth, "before-join", "stale").await },
    )
    .await;
    assert_eq!(v, "1");

    let r = c
        .delete(procs[2].at("/v1/operator/raft/peer?id=s3"))
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success(),
        "remove-peer: {}",
        r.text().await.unwrap()
    );
    eventually(Duration::from_secs(10), "three voters again", || async {
        let r = c
            .get(procs[0].at("/v1/operator/raft/configuration"))
            .send()
            .await
            .ok()?;
        let v: serde_json::Value = r.json().await.ok()?;
        let servers = v["Servers"].as_array()?.clone();
        (servers.len() == 3 && servers.iter().all(|s| s["Node"] != "s3")).then_some(())
    })
    .await;
    let r = c
        .delete(procs[0].at("/v1/operator/raft/peer?id=nobody"))
        .send()
        .await
        .unwrap();
    // Consul's 500 and words for a peer its configuration lacks.
    assert_eq!(r.status(), 500);
    assert_eq!(
        r.text().await.unwrap().trim(),
        r#"id "nobody" was not found in the Raft configuration"#
    );
    let r = c
        .delete(procs[0].at("/v1/operator/raft/peer"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_writes_answer_no_cluster_leader() {
    let mut procs = cluster(3, &[]);
    let c = client();
    cluster_leader(&c, &procs).await;
    procs[0].kill();
    procs[1].kill();
    // The survivor may still believe in an old leader for a moment; within
    // the bounded hold time it must answer 500 "No cluster leader".
    let started = Instant::now();
    let r = c
        .put(procs[2].at("/v1/kv/lonely"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    assert!(r.text().await.unwrap().contains("No cluster leader"));
    assert!(started.elapsed() < Duration::from_secs(16));
    // And nothing was stored.
    let r = c
        .get(procs[2].at("/v1/kv/lonely?stale"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// Right after formation (every server names a leader and the configuration
/// lists three voters) every server answers the CA roots with the cluster's
/// trust domain: the first leader's write of the cluster id is waited for,
/// never reported as "No cluster leader". Several fresh clusters, polled
/// tightly, to catch the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ca_roots_answer_as_soon_as_a_cluster_has_formed() {
    let c = client();
    for round in 0..6 {
        let procs = cluster(3, &[]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut formed = true;
            for p in &procs {
                formed &= leader_of(&c, p).await.is_some();
            }
            if formed {
                let conf: serde_json::Value =
                    get_json(&c, procs[0].at("/v1/operator/raft/configuration?stale")).await;
                let voters = conf["Servers"]
                    .as_array()
                    .map_or(0, |s| s.iter().filter(|s| s["Voter"] == true).count());
                if voters == 3 {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no cluster formed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut domains = Vec::new();
        for p in &procs {
            for mode in ["", "?stale"] {
                let r = c
                    .get(p.at(&format!("/v1/connect/ca/roots{mode}")))
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                let body = r.text().await.unwrap();
                assert_eq!(status, 200, "round {round}, {} {mode}: {body}", p.name());
                let roots: serde_json::Value = serde_json::from_str(&body).unwrap();
                domains.push(roots["TrustDomain"].as_str().unwrap().to_string());
            }
        }
        assert!(domains[0].len() > ".consul".len() && domains[0].ends_with(".consul"));
        assert!(domains.iter().all(|d| *d == domains[0]), "{domains:?}");
    }
}

/// A follower's blocking reads of the KV store go to the leader over one
/// channel on the Raft port: more of them than the leader takes Raft
/// connections from one IP (128) wait at once, none is cut off, and one
/// write wakes every one with the new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_followers_parked_reads_share_one_channel_to_the_leader() {
    let procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let follower = (by_raft(&procs, &leader) + 1) % 3;
    let f = &procs[follower];
    assert_eq!(put(&c, f, "watched", "before").await, Ok(true));
    let r = c
        .get(format!("http://{}/v1/kv/watched", f.http_addr))
        .send()
        .await
        .unwrap();
    let index = consul_index(&r);
    const READERS: usize = 150;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let (c, addr) = (c.clone(), f.http_addr);
        readers.push(tokio::spawn(async move {
            let url = format!("http://{addr}/v1/kv/watched?raw&index={index}&wait=60s");
            let r = c.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }));
    }
    // Parked at the leader, not at the follower that forwarded them.
    let l = &procs[by_raft(&procs, &leader)];
    wait_parked(&c, l, READERS as u64).await;
    assert_eq!(put(&c, &procs[0], "watched", "after").await, Ok(true));
    for r in readers {
        assert_eq!(r.await.unwrap(), (200, "after".to_string()));
    }
    let metrics = send_text(c.get(format!("http://{}{}", f.http_addr, common::METRICS))).await;
    assert!(common::metric_in(&metrics, "cairn_endpoint_forwarded_total") >= READERS as f64);
    // Not over HTTP (the servers' own agents' writes are, for now).
    assert!(common::metric_in(&metrics, "cairn_http_forwarded_total") < READERS as f64);
}
