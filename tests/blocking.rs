//! Blocking disk work stays off the async runtime: while a snapshot of a
//! million keys is restored (on every running server), built (on every
//! server, the leader included), read to be sent, and installed (on a
//! voting follower that fell behind the leader's purged log) under write
//! load, heartbeats keep flowing and no election happens.
//!
//! Any of these on an async worker (a restore's commit turning the file
//! into tables, the leader reading the saved snapshot each time it sends
//! it, a chunk decoded byte by byte, the Raft log's I/O waiting behind a
//! segment roll's fsyncs) takes that worker away from the heartbeats for
//! seconds, and a follower's election timer (600–1200 ms) runs out. A
//! follower whose only worker is stuck in an install cannot even run its
//! own election timer (it finds the leader's heartbeats waiting once it is
//! free), so for the install the test also asks that server for its
//! leader all along: an answer that takes seconds is a worker taken away.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;

/// Keys in the state the snapshots hold: a million, as the issue asks.
/// They arrive as one restored snapshot (`PUT /v1/snapshot`, through Raft
/// to every server), whose commit turns the whole file into tables on each
/// server at once: that apply is the first piece of work that must stay
/// off the async workers.
const KEYS: u64 = 1_000_000;
/// Log entries between snapshots: several during the load, so servers
/// build large ones under write load, and the leader has purged the log a
/// stopped follower needs by the time it comes back.
const SNAPSHOT_EVERY: &str = "500";
const DEADLINE: Duration = Duration::from_secs(60);
/// The longest a restore of `KEYS` keys, or the install of their snapshot,
/// may take in a debug build on a busy 2-core machine.
const RESTORE_HOLD: Duration = Duration::from_secs(600);
/// The longest a server may take to answer `/v1/status/leader` while it
/// installs a snapshot: a few election timeouts, for a debug build on a
/// busy machine. An install on its one async worker takes over ten.
const MAX_STALL: Duration = Duration::from_secs(3);

fn term(s: &Server) -> u64 {
    s.metric("cairn_raft_term") as u64
}

/// A snapshot file holding `KEYS` keys, encoded as a server's own.
fn snapshot_of_keys() -> Vec<u8> {
    use cairn::structs::KvEntry;
    let kv = (0..KEYS)
        .map(|i| {
            let key = format!("load/{i:08}");
            let entry = KvEntry {
                lock_index: 0,
                key: key.clone(),
                flags: 0,
                value: b"value".to_vec(),
                session: String::new(),
                create_index: 1,
                modify_index: 1,
            };
            (key, Arc::new(entry))
        })
        .collect();
    let st = cairn::state::State {
        kv,
        index: 1,
        ..Default::default()
    };
    let data = cairn::state::snapshot::encode(&st).unwrap();
    cairn::raft::snapshot_file::to_bytes(&Default::default(), &data)
}

/// How many keys `s` holds, or 0 while it does not answer.
fn entries(s: &Server) -> u64 {
    common::try_request(s.http_addr, "GET", common::METRICS, None)
        .map(|r| common::metric_in(&r.body, "cairn_kv_entries") as u64)
        .unwrap_or(0)
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

    // One follower stops; the state arrives at the other two as one
    // restore, then small writes go on, so the leader snapshots (the whole
    // state, under write load) and purges its log past the stopped one.
    servers[behind].stop(Duration::from_secs(10));
    let started = Instant::now();
    let file = snapshot_of_keys();
    eprintln!(
        "made a {} byte snapshot of {KEYS} keys in {:?}",
        file.len(),
        started.elapsed()
    );
    // A debug build takes a minute or more to turn a million keys into
    // tables (on both running servers at once here).
    let r =
        common::try_request_within(leader_addr, "PUT", "/v1/snapshot", &file, &[], RESTORE_HOLD)
            .expect("the restore to answer");
    assert_eq!(r.status, 200, "restore: {}", r.body);
    for (i, s) in servers.iter().enumerate().filter(|(i, _)| *i != behind) {
        common::eventually(
            RESTORE_HOLD,
            &format!("s{i} to hold the restored keys"),
            || (entries(s) >= KEYS).then_some(()),
        );
    }
    eprintln!("restored {KEYS} keys after {:?}", started.elapsed());
    for i in 0..2 * SNAPSHOT_EVERY.parse::<u64>().unwrap() {
        let r = common::request(leader_addr, "PUT", &format!("/v1/kv/past/{i}"), Some("x"));
        assert_eq!(r.status, 200, "{}", r.body);
    }

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
        RESTORE_HOLD,
        "the restarted follower to install the snapshot",
        || {
            check();
            back.log().contains("installed snapshot").then_some(())
        },
    );
    common::eventually(DEADLINE, "the restarted follower to hold the state", || {
        check();
        (entries(back) >= KEYS).then_some(())
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
