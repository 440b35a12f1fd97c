//! Blocking disk work stays off the async runtime: while large snapshots
//! are built (on every server, the leader included) and one is installed
//! (on a voting follower that fell behind the leader's purged log) under
//! write load, heartbeats keep flowing and no election happens.
//!
//! A snapshot encoded, written or installed on an async worker, or the
//! Raft log's I/O waiting there behind a segment roll's fsyncs, takes that
//! worker away from the heartbeats for seconds, and a follower's election
//! timer (600–1200 ms) runs out. A follower whose only worker is stuck in
//! an install cannot even run its own election timer (it finds the
//! leader's heartbeats waiting once it is free), so for the install the
//! test also asks that server for its leader all along: an answer that
//! takes seconds is a worker taken away.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;

/// Keys in the state the snapshots hold. The issue asks for a million; the
/// test binary is a debug build on a shared 2-core machine, where loading a
/// million keys takes about six minutes (~3,000 keys/s through 128-op txns)
/// and installing their snapshot over a minute. This many loads and
/// installs in about two minutes, and its snapshot (~14 MB) still takes
/// seconds to build and tens of seconds to install in a debug build, far
/// past an election timeout.
const KEYS: u64 = 160_000;
/// Operations per txn (Consul's limit).
const PER_TXN: u64 = 128;
/// Concurrent loaders.
const LOADERS: u64 = 8;
/// Log entries between snapshots: several during the load, so servers
/// build large ones under write load, and the leader has purged the log a
/// stopped follower needs by the time it comes back.
const SNAPSHOT_EVERY: &str = "500";
const DEADLINE: Duration = Duration::from_secs(60);
/// The longest a server may take to answer `/v1/status/leader` while it
/// installs a snapshot: a few election timeouts, for a debug build on a
/// busy machine. An install on its one async worker takes over ten.
const MAX_STALL: Duration = Duration::from_secs(3);

fn term(s: &Server) -> u64 {
    s.metric("cairn_raft_term") as u64
}

/// One txn setting keys `from..from + PER_TXN`.
fn txn_body(from: u64) -> String {
    let ops: Vec<String> = (from..from + PER_TXN)
        .map(|i| format!(r#"{{"KV":{{"Verb":"set","Key":"load/{i:08}","Value":"dmFsdWU="}}}}"#))
        .collect();
    format!("[{}]", ops.join(","))
}

/// Sets keys `from..to` through `addr`, in txns from concurrent clients.
fn load(addr: SocketAddr, from: u64, to: u64) {
    let next = Arc::new(AtomicU64::new(from));
    let loaders: Vec<_> = (0..LOADERS)
        .map(|_| {
            let next = next.clone();
            std::thread::spawn(move || {
                loop {
                    let at = next.fetch_add(PER_TXN, Ordering::Relaxed);
                    if at >= to {
                        return;
                    }
                    let r = common::request(addr, "PUT", "/v1/txn", Some(&txn_body(at)));
                    assert_eq!(r.status, 200, "txn at {at}: {}", r.body);
                }
            })
        })
        .collect();
    for l in loaders {
        l.join().unwrap();
    }
}

/// Server `i` of three on the given Raft ports, its data in `dir`.
fn member(i: usize, raft: &[u16], http: u16, dir: &std::path::Path) -> Server {
    let mut b = Server::builder()
        .node(&format!("s{i}"))
        .data_dir(dir)
        .http_port(http)
        .raft_port(raft[i])
        .bootstrap_expect(3)
        .arg("--raft-snapshot-threshold")
        .arg(SNAPSHOT_EVERY)
        .no_wait();
    for (j, p) in raft.iter().enumerate() {
        if j != i {
            b = b.join(format!("127.0.0.1:{p}"));
        }
    }
    b.start()
}

#[test]
fn large_snapshots_built_and_installed_under_write_load_cause_no_election() {
    // One async worker per server: what a server has left when its other
    // workers are busy (and all a 1-core host has). With two, work blocking
    // one of them for seconds goes unnoticed: the other runs the heartbeats.
    // Servers inherit the variable (tokio reads it).
    // SAFETY: this file's only test sets it before starting any thread.
    unsafe { std::env::set_var("TOKIO_WORKER_THREADS", "1") };
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let raft: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let http: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let mut servers: Vec<Server> = (0..3)
        .map(|i| member(i, &raft, http[i], dirs[i].path()))
        .collect();
    for s in &servers {
        s.wait_for_leader(DEADLINE);
    }
    // The term every server agrees on once formed (forming may take more
    // than one round).
    let start_term = common::eventually(DEADLINE, "one term on every server", || {
        let t: Vec<u64> = servers.iter().map(term).collect();
        (t.iter().all(|x| *x == t[0]) && t[0] > 0).then_some(t[0])
    });
    let leader = servers
        .iter()
        .position(|s| s.metric("cairn_raft_is_leader") == 1.0)
        .expect("a leader");
    let leader_addr = servers[leader].http_addr;
    let behind = (leader + 1) % 3;

    // Half the state with every server up; the other half while one
    // follower is stopped, so the leader snapshots and purges past it.
    let started = Instant::now();
    load(leader_addr, 0, KEYS / 2);
    servers[behind].stop(Duration::from_secs(10));
    load(leader_addr, KEYS / 2, KEYS);
    eprintln!("loaded {KEYS} keys in {:?}", started.elapsed());

    // Small writes keep coming while the follower restarts, is sent the
    // snapshot and installs it.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    // A write refused (a leader lost mid-commit answers 500) ends the test
    // at once, with why.
    let refused = Arc::new(Mutex::new(None::<String>));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (stop, acked, refused) = (stop.clone(), acked.clone(), refused.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let path = format!("/v1/kv/small/{w}/{i}");
                    let r = common::request(leader_addr, "PUT", &path, Some("x"));
                    if r.status != 200 {
                        *refused.lock().unwrap() = Some(format!("{path}: {} {}", r.status, r.body));
                        return;
                    }
                    acked.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    let check = || {
        if let Some(why) = refused.lock().unwrap().clone() {
            panic!("a small write failed during the snapshots: {why}");
        }
    };
    // The restarted follower is asked for its leader every 20 ms from its
    // start to the end: the slowest answer is how long its worker was away.
    let back_addr: std::net::SocketAddr = format!("127.0.0.1:{}", http[behind]).parse().unwrap();
    let slowest = Arc::new(Mutex::new(Duration::ZERO));
    let prober = {
        let (stop, slowest) = (stop.clone(), slowest.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                // Refused while it starts: not an answer.
                if common::try_request(back_addr, "GET", "/v1/status/leader", None).is_ok() {
                    let took = asked.elapsed();
                    let mut s = slowest.lock().unwrap();
                    *s = (*s).max(took);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    servers[behind] = member(behind, &raft, http[behind], dirs[behind].path());
    let back = &servers[behind];
    common::eventually(
        Duration::from_secs(120),
        "the restarted follower to install the snapshot",
        || {
            check();
            back.log().contains("installed snapshot").then_some(())
        },
    );
    common::eventually(DEADLINE, "the restarted follower to hold the state", || {
        check();
        (back.metric("cairn_kv_entries") as u64 >= KEYS).then_some(())
    });
    // Writes go on past the install: the cluster is still committing.
    let before = acked.load(Ordering::Relaxed);
    common::eventually(DEADLINE, "writes after the install", || {
        check();
        (acked.load(Ordering::Relaxed) >= before + 20).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    prober.join().unwrap();
    check();
    let slowest = *slowest.lock().unwrap();
    eprintln!("slowest answer of the installing follower: {slowest:?}");
    eprintln!(
        "installed and caught up after {:?}, {} small writes",
        started.elapsed(),
        acked.load(Ordering::Relaxed)
    );
    for s in &servers {
        for l in s.log().lines().filter(|l| l.contains(" snapshot")) {
            eprintln!("{:?}: {l}", s.node);
        }
    }
    assert!(
        servers[leader].log().contains("built snapshot"),
        "{}",
        servers[leader].log()
    );
    assert!(
        slowest < MAX_STALL,
        "the follower took {slowest:?} to answer while it installed the snapshot: \
         its async worker was blocked; log:\n{}",
        servers[behind].log()
    );
    for s in &servers {
        assert_eq!(
            term(s),
            start_term,
            "{:?} saw an election during the snapshots; log:\n{}",
            s.node,
            s.log()
        );
    }
}
