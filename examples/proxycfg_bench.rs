//! The server-side proxycfg benchmark (issue #6), run by `make bench`:
//! `cargo run --release --example proxycfg_bench -- [PROXIES...]`.
//!
//! One real server (sled, Raft with fsync, the publisher, the proxycfg
//! manager) in this process; 500 services with 2 instances each, and N
//! connect proxies each with 3 upstreams. Writes go through `Server::write`
//! (the path an HTTP write takes after decoding); snapshots are observed on
//! the manager's own channels, so the figures are proxycfg's, not HTTP's.
//!
//! (a) one upstream instance deregistered → time until every proxy with
//!     that upstream has a snapshot without it (p50/p99/max over 20 runs);
//! (b) one proxy-defaults change → time until every proxy is rebuilt, and
//!     the latency of KV writes committed meanwhile;
//! (c) RSS per proxy: growth from registering the proxies until every
//!     snapshot is built, divided by N (catalog rows included).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn::proxycfg::{ProxyKey, Snapshot};
use cairn::server::{Server, ServerConfig};
use cairn::state::Command;
use cairn::structs::{DeregisterRequest, KvOp, KvVerb, RegisterRequest};
use serde_json::json;
use tokio::sync::watch;

const SERVICES: usize = 500;
const INSTANCES: usize = 2;
const UPSTREAMS: usize = 3;
/// Proxies per catalog node.
const PER_NODE: usize = 20;
const RUNS_A: usize = 20;

type Rx = watch::Receiver<Option<Arc<Snapshot>>>;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn svc(i: usize) -> String {
    format!("svc-{i:03}")
}

/// The upstreams of proxy `p`: three distinct services other than its own.
fn upstreams_of(p: usize) -> Vec<usize> {
    let own = p % SERVICES;
    (1..=UPSTREAMS)
        .map(|k| (own + k * 97 + p / SERVICES) % SERVICES)
        .map(|u| if u == own { (u + 1) % SERVICES } else { u })
        .collect()
}

fn instance_reg(s: usize, i: usize) -> Command {
    let req: RegisterRequest = serde_json::from_value(json!({
        "Node": format!("app-{i}-{}", s % 50), "Address": format!("10.1.{i}.{}", s % 50),
        "Datacenter": "dc1",
        // Connect-native, so the instance itself is an upstream endpoint
        // (proxies dial only connect-capable instances).
        "Service": {"ID": format!("{}-{i}", svc(s)), "Service": svc(s), "Port": 8080,
                    "Connect": {"Native": true}},
        "Check": {"CheckID": format!("{}-{i}-alive", svc(s)), "Name": "alive",
                  "ServiceID": format!("{}-{i}", svc(s)), "Status": "passing"},
    }))
    .expect("registration");
    Command::Register(Box::new(req))
}

fn proxy_key(p: usize) -> ProxyKey {
    (format!("mesh-{}", p / PER_NODE), format!("proxy-{p}"))
}

fn proxy_reg(p: usize) -> Command {
    let (node, id) = proxy_key(p);
    let ups: Vec<_> = upstreams_of(p)
        .into_iter()
        .enumerate()
        .map(|(k, u)| json!({"DestinationName": svc(u), "LocalBindPort": 9000 + k}))
        .collect();
    let req: RegisterRequest = serde_json::from_value(json!({
        "Node": node, "Address": format!("10.2.{}.{}", p / 60_000, p % 250), "Datacenter": "dc1",
        "Service": {"ID": id, "Service": format!("{}-sidecar-proxy", svc(p % SERVICES)),
                    "Kind": "connect-proxy", "Port": 21000,
                    "Proxy": {"DestinationServiceName": svc(p % SERVICES),
                              "DestinationServiceID": format!("{}-0", svc(p % SERVICES)),
                              "Upstreams": ups}},
    }))
    .expect("registration");
    Command::Register(Box::new(req))
}

/// Commits every command, `clients` at a time.
async fn write_all(server: &Arc<Server>, cmds: Vec<Command>, clients: usize) {
    let queue = Arc::new(std::sync::Mutex::new(cmds));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (server, queue) = (server.clone(), queue.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(cmd) = queue.lock().unwrap().pop() else {
                    return;
                };
                server.write(cmd).await.expect("write");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Waits until every receiver holds a snapshot satisfying `done`; returns
/// when each became so, measured from `t0`.
async fn until_all(
    rxs: Vec<Rx>, t0: Instant, done: impl Fn(&Snapshot) -> bool + Clone + Send + 'static,
) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for mut rx in rxs {
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if rx.borrow_and_update().as_deref().is_some_and(&done) {
                    return t0.elapsed();
                }
                if tokio::time::timeout(Duration::from_secs(60), rx.changed())
                    .await
                    .is_err()
                {
                    panic!("a snapshot was not updated within 60 s");
                }
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out.sort();
    out
}

async fn run(proxies: usize) {
    println!(
        "proxycfg, {proxies} proxies: one server, {SERVICES} services × {INSTANCES} instances, {UPSTREAMS} upstreams per proxy"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let port = |_: ()| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let config = ServerConfig {
        http_addr: port(()),
        raft_addr: port(()),
        bootstrap_expect: 1,
        ..ServerConfig::new("bench", dir.path().to_path_buf())
    };
    let listeners = cairn::process::Listeners::bind(&config, None, None)
        .await
        .expect("listeners");
    let server = cairn::process::server(config, None, None, listeners)
        .await
        .expect("server")
        .server;
    server.await_leader().await.expect("leader");
    while server.state().cluster_id.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let instances: Vec<Command> = (0..SERVICES)
        .flat_map(|s| (0..INSTANCES).map(move |i| instance_reg(s, i)))
        .collect();
    write_all(&server, instances, 64).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_kib();

    let t = Instant::now();
    write_all(&server, (0..proxies).map(proxy_reg).collect(), 64).await;
    let registered = t.elapsed();
    let rxs: Vec<Rx> = loop {
        let all: Option<Vec<Rx>> = (0..proxies)
            .map(|p| server.proxycfg().snapshot(&proxy_key(p)))
            .collect();
        if let Some(all) = all
            && all.iter().all(|rx| rx.borrow().is_some())
        {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let built = t.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_kib();
    let (_, watches) = server.proxycfg().counts();
    println!(
        "  {proxies} proxies: registered in {:.2} s, all snapshots built {:.2} s after the first write; {watches} watches",
        registered.as_secs_f64(),
        built.as_secs_f64()
    );

    // (a) One upstream instance deregistered, RUNS_A times.
    let mut by_upstream: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for p in 0..proxies {
        for u in upstreams_of(p) {
            by_upstream.entry(u).or_default().push(p);
        }
    }
    let mut lat = Vec::new();
    let mut affected_total = 0;
    for run in 0..RUNS_A {
        let s = (run * 37) % SERVICES;
        let affected = by_upstream.get(&s).cloned().unwrap_or_default();
        affected_total += affected.len();
        let rx: Vec<Rx> = affected.iter().map(|p| rxs[*p].clone()).collect();
        let gone = format!("{}-1", svc(s));
        let t0 = Instant::now();
        let waiting = tokio::spawn(until_all(rx, t0, move |snap: &Snapshot| {
            snap.upstreams.values().all(|u| {
                u.endpoints
                    .values()
                    .flat_map(|rows| rows.iter())
                    .all(|e| e.service.id != gone)
            })
        }));
        let node = format!("app-1-{}", s % 50);
        server
            .write(Command::Deregister(DeregisterRequest {
                node,
                service_id: format!("{}-1", svc(s)),
                datacenter: "dc1".into(),
                ..Default::default()
            }))
            .await
            .expect("deregister");
        lat.extend(waiting.await.unwrap());
        server.write(instance_reg(s, 1)).await.expect("re-register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat.sort();
    println!(
        "  (a) {proxies} proxies, one upstream instance deregistered ({RUNS_A} runs, {} proxies affected per run on average): p50 {} ms, p99 {} ms, max {} ms",
        affected_total / RUNS_A,
        ms(percentile(&lat, 0.50)),
        ms(percentile(&lat, 0.99)),
        ms(percentile(&lat, 1.0)),
    );

    // (b) proxy-defaults touching every proxy, with KV writes meanwhile.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (server, stop) = (server.clone(), stop.clone());
        tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let t = Instant::now();
                server
                    .write(Command::Kv(KvOp {
                        verb: KvVerb::Set,
                        key: format!("bench/{}", i % 100),
                        value: vec![b'x'; 256],
                        flags: 0,
                        index: 0,
                        session: String::new(),
                    }))
                    .await
                    .expect("kv write");
                lat.push(t.elapsed());
            }
            lat
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let waiting = tokio::spawn(until_all(rxs.clone(), t0, |snap: &Snapshot| {
        snap.service
            .proxy
            .config
            .as_ref()
            .and_then(|c| c.get("bench"))
            == Some(&json!(1))
    }));
    server
        .write(Command::ConfigSet {
            entry: json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"bench": 1}}),
            cas: None,
        })
        .await
        .expect("proxy-defaults");
    let all = waiting.await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut writes = writer.await.unwrap();
    writes.sort();
    println!(
        "  (b) {proxies} proxies, one proxy-defaults change: all rebuilt in {} ms (p50 {} ms); {} KV writes meanwhile: p50 {} ms, p99 {} ms, max {} ms",
        ms(percentile(&all, 1.0)),
        ms(percentile(&all, 0.5)),
        writes.len(),
        ms(percentile(&writes, 0.50)),
        ms(percentile(&writes, 0.99)),
        ms(percentile(&writes, 1.0)),
    );
    println!(
        "  (c) {proxies} proxies: RSS {} → {} MiB, {:.1} KiB per proxy (its catalog registration included)",
        rss_before / 1024,
        rss_after / 1024,
        (rss_after.saturating_sub(rss_before)) as f64 / proxies as f64
    );
    server.shutdown().await;
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![1_000, 10_000]
    } else {
        counts
    };
    if let [n] = counts[..] {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(run(n));
        return;
    }
    // One process per size, so each RSS figure starts from a fresh heap.
    for n in counts {
        let me = std::env::current_exe().expect("own path");
        let status = std::process::Command::new(me)
            .arg(n.to_string())
            .status()
            .expect("run a size");
        assert!(status.success(), "the {n}-proxy run failed");
    }
}
