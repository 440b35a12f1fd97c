//! `cairn-load scale`: issue 39's scenario, every kind of load at once
//! against a three-server cluster the bench script started.
//!
//! - `--agents` client agents, each holding its lease as cairn's agent does
//!   (`PUT /v1/internal/agent/heartbeat` with its node registration every
//!   `--heartbeat-secs`, the agent's `HEARTBEAT_EVERY`) and 10 instances of
//!   `svc-0000..` with a TTL check. A TTL check kept passing stays on the
//!   agent (it syncs a check only when its status changes), so it costs the
//!   servers nothing until the churn or a row turns it.
//! - `--streams` sidecars (one per instance of a spread-out set, with three
//!   upstreams among the other sidecars' services), each holding one Delta
//!   ADS stream (`ads`, the client `examples/xds_bench.rs` uses too), over
//!   `--grpc-conns` HTTP/2 connections per server.
//! - `--watchers` blocking `/v1/health/service/:s?passing&index=` readers
//!   spread over the services and servers, one connection and one request in
//!   flight each, re-issued on every answer.
//! - `--churn` instance changes per second (a check failing, passing again,
//!   the instance removed, registered again), never on a sidecar's instance.
//!
//! Agents share `--conns` keep-alive HTTP/1.1 connections. Every client
//! that loses its server moves to the next one. Rows, one `row=NAME
//! key=value ...` line each on stdout (progress on stderr): `setup`,
//! `steady`, `critical`, `global` (one per protocol), `restart`,
//! `leader_kill`, `tool`. A wait that runs out prints its row with
//! `timeout=1` and what was missing; the scenario goes on.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint};

use crate::ads::{self, Shared, Stream, ms, pct, rss_kib, spread, until_all};
use crate::{Conn, Op, System, find_leader, send_batches};

/// The gauge of blocking queries parked on a server.
const PARKED: &str = "cairn_blocking_queries_parked";
/// Instances each agent registers.
const PER_AGENT: usize = 10;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The servers' HTTP addresses, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    addrs: Vec<String>,
    /// Their gRPC (xDS) addresses, in the same order.
    #[arg(long, value_delimiter = ',', required = true)]
    grpc: Vec<String>,
    /// Their process ids, in the same order (CPU, RSS, and the restart and
    /// leader-kill rows, which signal them).
    #[arg(long, value_delimiter = ',', required = true)]
    pids: Vec<u32>,
    /// Client agents simulated, 10 instances each.
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Services the instances are spread over (`svc-0000..`).
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Blocking health watchers.
    #[arg(long, default_value_t = 2000)]
    watchers: usize,
    /// Sidecars, one Delta ADS stream each.
    #[arg(long, default_value_t = 2000)]
    streams: usize,
    /// Instance changes per second while the rows run.
    #[arg(long, default_value_t = 50.0)]
    churn: f64,
    /// Keep-alive connections the agents' heartbeats share.
    #[arg(long, default_value_t = 64)]
    conns: usize,
    /// HTTP/2 connections per server the streams share.
    #[arg(long, default_value_t = 4)]
    grpc_conns: usize,
    /// The agents' heartbeat interval (cairn's agent: 2 s).
    #[arg(long, default_value_t = 2.0)]
    heartbeat_secs: f64,
    /// The steady row's window.
    #[arg(long, default_value_t = 30.0)]
    steady_secs: f64,
    /// Critical-check runs of the `critical` row.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// A watcher's `wait` (its query answers at the latest then).
    #[arg(long, default_value_t = 60)]
    wait_secs: u64,
    /// How long any one wait of a row may take.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
}

// ---------------------------------------------------------------- the estate

/// Names and shapes, all derived from numbers.
#[derive(Clone, Copy)]
struct Estate {
    agents: usize,
    services: usize,
    streams: usize,
}

impl Estate {
    fn instances(&self) -> usize {
        self.agents * PER_AGENT
    }
    fn service_of(&self, i: usize) -> usize {
        i % self.services
    }
    /// The instance sidecar `j` fronts: a stride prime to the count
    /// spreads the sidecars over agents and services alike.
    fn sidecar_instance(&self, j: usize) -> usize {
        let n = self.instances();
        let mut stride = 7919 % n.max(1);
        while gcd(stride, n) != 1 {
            stride += 1;
        }
        (j * stride) % n
    }
    fn sidecar_service(&self, j: usize) -> usize {
        self.service_of(self.sidecar_instance(j))
    }
    /// Three upstreams among the other sidecars' services.
    fn upstreams(&self, j: usize) -> Vec<usize> {
        let own = self.sidecar_service(j);
        let mut ups = Vec::new();
        for m in 1..self.streams.max(1) * 2 {
            if ups.len() == 3 {
                break;
            }
            let u = self.sidecar_service((j + 7 * m) % self.streams);
            if u != own && !ups.contains(&u) {
                ups.push(u);
            }
        }
        ups
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn svc(s: usize) -> String {
    format!("svc-{s:04}")
}
fn agent_node(a: usize) -> String {
    format!("agent-{a:05}")
}
fn agent_addr(a: usize) -> String {
    format!("10.{}.{}.{}", (a >> 16) & 255, (a >> 8) & 255, a & 255)
}
fn inst_id(i: usize) -> String {
    format!("inst-{i:08}")
}
fn sidecar_id(i: usize) -> String {
    format!("inst-{i:08}-sidecar-proxy")
}
fn inst_port(i: usize) -> usize {
    20000 + i % PER_AGENT
}
fn sidecar_port(i: usize) -> usize {
    21000 + i % PER_AGENT
}

/// The node registration an agent heartbeats with (its node, address and
/// the agent meta key the servers recognise agents by).
fn heartbeat_op(a: usize) -> Op {
    let body = json!({
        "Node": agent_node(a),
        "Address": agent_addr(a),
        "NodeMeta": {"cairn-agent": format!("{}:8500", agent_addr(a))},
    });
    Op {
        method: Method::PUT,
        path: "/v1/internal/agent/heartbeat".into(),
        body: Bytes::from(body.to_string()),
    }
}

/// An agent's sync of one instance with its TTL check (the node is the
/// heartbeat's: left as it is).
fn register_op(i: usize, e: Estate) -> Op {
    let a = i / PER_AGENT;
    let id = inst_id(i);
    let body = json!({
        "Node": agent_node(a), "Address": agent_addr(a), "SkipNodeUpdate": true,
        "Service": {"ID": id, "Service": svc(e.service_of(i)), "Port": inst_port(i)},
        "Check": {"CheckID": format!("service:{id}"), "Name": "ttl", "ServiceID": id, "Status": "passing"},
    });
    put("/v1/catalog/register", body)
}

/// A sidecar and its alias check on its application's health, as the agent
/// registers `Connect.SidecarService`.
fn sidecar_op(j: usize, e: Estate) -> Op {
    let i = e.sidecar_instance(j);
    let a = i / PER_AGENT;
    let s = svc(e.service_of(i));
    let id = sidecar_id(i);
    let ups: Vec<Value> = e
        .upstreams(j)
        .into_iter()
        .enumerate()
        .map(|(k, u)| json!({"DestinationName": svc(u), "LocalBindPort": 9000 + k}))
        .collect();
    let body = json!({
        "Node": agent_node(a), "Address": agent_addr(a), "SkipNodeUpdate": true,
        "Service": {"ID": id, "Service": format!("{s}-sidecar-proxy"), "Kind": "connect-proxy",
                    "Port": sidecar_port(i),
                    "Proxy": {"DestinationServiceName": s, "DestinationServiceID": inst_id(i),
                              "LocalServiceAddress": "127.0.0.1", "LocalServicePort": inst_port(i),
                              "Upstreams": ups}},
        "Check": {"CheckID": format!("service:{id}:alias"), "Name": "alias", "ServiceID": id, "Status": "passing"},
    });
    put("/v1/catalog/register", body)
}

/// A check's new status, synced alone as the agent does.
fn check_op(i: usize, sidecar: bool, status: &str) -> Op {
    let a = i / PER_AGENT;
    let (sid, cid) = if sidecar {
        (sidecar_id(i), format!("service:{}:alias", sidecar_id(i)))
    } else {
        (inst_id(i), format!("service:{}", inst_id(i)))
    };
    put(
        "/v1/catalog/register",
        json!({"Node": agent_node(a), "Address": agent_addr(a), "SkipNodeUpdate": true,
               "Check": {"CheckID": cid, "Name": if sidecar { "alias" } else { "ttl" },
                         "ServiceID": sid, "Status": status}}),
    )
}

fn put(path: &str, body: Value) -> Op {
    Op {
        method: Method::PUT,
        path: path.into(),
        body: Bytes::from(body.to_string()),
    }
}

fn index_of(h: &HeaderMap) -> u64 {
    h.get("x-consul-index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------- clients

/// What every load task shares.
struct World {
    addrs: Vec<String>,
    estate: Estate,
    /// Heartbeat latencies (µs, from the time each was due) while recording.
    recording: AtomicBool,
    heartbeat_us: Mutex<Vec<u32>>,
    heartbeats: AtomicU64,
    heartbeat_errors: AtomicU64,
    churn_ops: AtomicU64,
    churn_errors: AtomicU64,
    answers: AtomicU64,
    watch_errors: AtomicU64,
    /// Stops the churn (the last rows run without it).
    churning: AtomicBool,
}

/// Sends `op` on `conn`; on a failure moves `conn` to the next server.
async fn call_rotating(
    w: &World, conn: &mut Conn, at: &mut usize, op: &Op, timeout: Duration,
) -> Result<(StatusCode, HeaderMap, Bytes)> {
    let r = tokio::time::timeout(
        timeout,
        conn.call(op.method.clone(), &op.path, op.body.clone()),
    )
    .await
    .map_err(|_| anyhow!("timed out"))
    .and_then(|r| r);
    let failed = match &r {
        Ok((s, _, _)) => s.is_server_error(),
        Err(_) => true,
    };
    if failed {
        *at = (*at + 1) % w.addrs.len();
        *conn = Conn::new(&w.addrs[*at]);
    }
    r
}

/// One heartbeat connection: agents `c, c + conns, ...`, each renewed once
/// per interval at its own offset within it. A round that starts late
/// starts when it can: an agent never sends the heartbeats it missed.
async fn heartbeat_loop(w: Arc<World>, c: usize, conns: usize, every: Duration) {
    let agents: Vec<usize> = (c..w.estate.agents).step_by(conns).collect();
    if agents.is_empty() {
        return;
    }
    let mut at = c % w.addrs.len();
    let mut conn = Conn::new(&w.addrs[at]);
    let mut planned = tokio::time::Instant::now() + every.mul_f64(c as f64 / conns as f64);
    let gap = every / agents.len() as u32;
    loop {
        let round = planned.max(tokio::time::Instant::now());
        for (k, a) in agents.iter().enumerate() {
            let due = round + gap * k as u32;
            tokio::time::sleep_until(due).await;
            let op = heartbeat_op(*a);
            let r = call_rotating(&w, &mut conn, &mut at, &op, Duration::from_secs(10)).await;
            match r {
                Ok((s, _, _)) if s.is_success() => {
                    w.heartbeats.fetch_add(1, Ordering::Relaxed);
                    if w.recording.load(Ordering::Relaxed) {
                        let us = due.elapsed().as_micros().min(u32::MAX as u128) as u32;
                        w.heartbeat_us.lock().push(us);
                    }
                }
                _ => {
                    w.heartbeat_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        planned = round + every;
    }
}

/// The churn: `workers` connections, each taking groups of four changes
/// to one instance (critical, passing, removed, registered), one change per
/// tick.
async fn churn_loop(
    w: Arc<World>, worker: usize, workers: usize, rate: f64, protected: Arc<HashSet<usize>>,
) {
    let mut at = worker % w.addrs.len();
    let mut conn = Conn::new(&w.addrs[at]);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(workers as f64 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let n = w.estate.instances();
    let mut g = worker as u64;
    loop {
        let i = churn_instance(g, n, &protected);
        g += workers as u64;
        let a = i / PER_AGENT;
        let ops = [
            check_op(i, false, "critical"),
            check_op(i, false, "passing"),
            put(
                "/v1/catalog/deregister",
                json!({"Node": agent_node(a), "ServiceID": inst_id(i)}),
            ),
            register_op(i, w.estate),
        ];
        for op in ops {
            tick.tick().await;
            while !w.churning.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            match call_rotating(&w, &mut conn, &mut at, &op, Duration::from_secs(10)).await {
                Ok((s, _, _)) if s.is_success() => w.churn_ops.fetch_add(1, Ordering::Relaxed),
                _ => w.churn_errors.fetch_add(1, Ordering::Relaxed),
            };
        }
    }
}

/// The instance the churn's group `g` changes: spread out, and never one
/// a sidecar fronts (the rows watch those).
fn churn_instance(g: u64, n: usize, protected: &HashSet<usize>) -> usize {
    let mut x = g.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    loop {
        let i = ((x ^ (x >> 29)) % n as u64) as usize;
        if !protected.contains(&i) {
            return i;
        }
        x = x.wrapping_add(1);
    }
}

/// A watcher's last answer.
#[derive(Clone, Copy)]
struct Answer {
    sent: Instant,
    at: Instant,
    /// Bit v: whether victim v's instance was in it.
    present: u64,
}

struct Watcher {
    service: usize,
    /// Victims (their instance IDs quoted, as the JSON has them) of this
    /// watcher's service, by victim number.
    needles: Vec<(usize, String)>,
    last: Mutex<Option<Answer>>,
}

/// One watcher: a blocking health read, re-issued on every answer; after
/// an error (its server gone) a plain read first, as a client that lost
/// its place does.
async fn watch_loop(w: Arc<World>, me: Arc<Watcher>, start_at: usize, wait: u64) {
    let mut at = start_at % w.addrs.len();
    let mut conn = Conn::new(&w.addrs[at]);
    let mut index = 0u64;
    let name = svc(me.service);
    loop {
        let path = if index == 0 {
            format!("/v1/health/service/{name}?passing")
        } else {
            format!("/v1/health/service/{name}?passing&index={index}&wait={wait}s")
        };
        let op = Op {
            method: Method::GET,
            path,
            body: Bytes::new(),
        };
        let sent = Instant::now();
        let r = call_rotating(&w, &mut conn, &mut at, &op, Duration::from_secs(wait + 15)).await;
        match r {
            Ok((s, h, body)) if s.is_success() => {
                let now = Instant::now();
                w.answers.fetch_add(1, Ordering::Relaxed);
                let mut present = 0u64;
                for (v, needle) in &me.needles {
                    if contains(&body, needle.as_bytes()) {
                        present |= 1 << v;
                    }
                }
                *me.last.lock() = Some(Answer {
                    sent,
                    at: now,
                    present,
                });
                let i = index_of(&h);
                // An index that went back means a fresh start (Consul's
                // clients reset to 0 then).
                index = if i < index { 0 } else { i };
            }
            _ => {
                w.watch_errors.fetch_add(1, Ordering::Relaxed);
                index = 0;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A stream for as long as the scenario runs: when its server goes, the
/// next server's connection, after a second (Envoy's backoff).
async fn stream_loop(
    channels: Arc<Vec<Channel>>, first: usize, s: Arc<Stream>, shared: Arc<Shared>, epoch: Instant,
) {
    let mut k = first;
    loop {
        ads::run_stream(
            channels[k % channels.len()].clone(),
            s.clone(),
            shared.clone(),
            epoch,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        k += 1;
    }
}

// ---------------------------------------------------------------- figures

/// utime + stime of a process, in seconds.
fn cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz.max(1.0))
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// CPU used between two readings, as a percentage of all the cores.
fn cpu_pct(a: Option<f64>, b: Option<f64>, secs: f64) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.1}", (b - a) / secs / cores() * 100.0),
        _ => "?".into(),
    }
}

fn secs_since(t0: Instant, t: Instant) -> Duration {
    t.saturating_duration_since(t0)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s[s.rfind(')')? + 2..].starts_with('Z')).map(|z| !z))
        .unwrap_or(false)
}

fn sigkill(pid: u32) -> Result<()> {
    // SAFETY: a plain syscall on a pid the caller was handed.
    if unsafe { libc::kill(pid as i32, libc::SIGKILL) } != 0 {
        bail!("kill {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// How a server was started: its argv, directory and stderr, read before
/// it is killed, so the same server can be started again.
struct Relaunch {
    argv: Vec<String>,
    cwd: PathBuf,
    stderr: Option<PathBuf>,
}

fn relaunch_of(pid: u32) -> Result<Relaunch> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let argv: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if argv.is_empty() {
        bail!("no command line for {pid}");
    }
    Ok(Relaunch {
        argv,
        cwd: std::fs::read_link(format!("/proc/{pid}/cwd"))?,
        stderr: std::fs::read_link(format!("/proc/{pid}/fd/2"))
            .ok()
            .filter(|p| p.is_file()),
    })
}

fn launch(r: &Relaunch) -> Result<std::process::Child> {
    let err = match &r.stderr {
        Some(p) => std::process::Stdio::from(std::fs::OpenOptions::new().append(true).open(p)?),
        None => std::process::Stdio::null(),
    };
    std::process::Command::new(&r.argv[0])
        .args(&r.argv[1..])
        .current_dir(&r.cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()
        .with_context(|| format!("restart {}", r.argv[0]))
}

/// Polls `f` every 20 ms until it is true; the seconds taken, or None.
async fn poll_until<F, Fut>(timeout: Duration, mut f: F) -> Option<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if f().await {
            return Some(t0.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// `poll_until` for a condition on what the load tasks recorded.
async fn wait_for(timeout: Duration, cond: impl Fn() -> bool) -> Option<f64> {
    poll_until(timeout, || std::future::ready(cond())).await
}

async fn get(addr: &str, path: &str) -> Option<(StatusCode, HeaderMap, Bytes)> {
    let mut c = Conn::new(addr);
    tokio::time::timeout(
        Duration::from_secs(2),
        c.call(Method::GET, path, Bytes::new()),
    )
    .await
    .ok()?
    .ok()
}

fn fmt_secs(s: Option<f64>) -> String {
    s.map_or("timeout".into(), |s| format!("{s:.2}"))
}

// ---------------------------------------------------------------- the scenario

pub async fn cmd_scale(args: Args) -> Result<()> {
    let n = args.addrs.len();
    if n == 0 || args.grpc.len() != n || args.pids.len() != n {
        bail!("--addrs, --grpc and --pids must name the same servers");
    }
    if args.agents == 0 || args.services == 0 || args.churn <= 0.0 {
        bail!("--agents, --services and --churn must be positive");
    }
    let tool0 = cpu_secs("self");
    let run_t0 = Instant::now();
    let timeout = Duration::from_secs_f64(args.timeout);
    let e = Estate {
        agents: args.agents,
        services: args.services,
        streams: args.streams.min(args.agents * PER_AGENT),
    };
    let w = Arc::new(World {
        addrs: args.addrs.clone(),
        estate: e,
        recording: AtomicBool::new(false),
        heartbeat_us: Mutex::new(Vec::new()),
        heartbeats: AtomicU64::new(0),
        heartbeat_errors: AtomicU64::new(0),
        churn_ops: AtomicU64::new(0),
        churn_errors: AtomicU64::new(0),
        answers: AtomicU64::new(0),
        watch_errors: AtomicU64::new(0),
        churning: AtomicBool::new(false),
    });
    let leader = find_leader(System::Cairn, &args.addrs).await?;
    eprintln!(
        "scale: {} agents × {PER_AGENT} instances of {} services, {} watchers, {} streams, churn {}/s; leader {leader}",
        e.agents, e.services, args.watchers, e.streams, args.churn
    );

    // -- setup: leases first (they run out after 8 s), then the instances.
    let t = Instant::now();
    send_batches(
        &leader,
        64,
        e.agents as u64,
        Some(Instant::now() + timeout),
        |a| heartbeat_op(a as usize),
    )
    .await
    .context("first heartbeats")?;
    let every = Duration::from_secs_f64(args.heartbeat_secs);
    for c in 0..args.conns.max(1) {
        tokio::spawn(heartbeat_loop(w.clone(), c, args.conns.max(1), every));
    }
    let instances = e.instances() as u64;
    let deadline = Some(Instant::now() + timeout * 10);
    send_batches(&leader, 64, instances, deadline, move |i| {
        register_op(i as usize, e)
    })
    .await
    .context("registering the instances")?;
    send_batches(&leader, 64, e.streams as u64, deadline, move |j| {
        sidecar_op(j as usize, e)
    })
    .await
    .context("registering the sidecars")?;
    let register_secs = t.elapsed().as_secs_f64();
    eprintln!(
        "  {} leases, {instances} instances and {} sidecars registered in {register_secs:.1} s",
        e.agents, e.streams
    );

    // The critical row's victims: sidecars whose service has watchers and
    // is an upstream of some stream, spread over the list.
    let watched = |s: usize| args.watchers >= e.services || s < args.watchers;
    let upstream_of: HashSet<usize> = (0..e.streams).flat_map(|j| e.upstreams(j)).collect();
    let mut victims: Vec<usize> = Vec::new();
    let mut seen = HashSet::new();
    for k in 0..e.streams {
        let j = (k * 131) % e.streams.max(1);
        let s = e.sidecar_service(j);
        if watched(s) && upstream_of.contains(&s) && seen.insert(s) {
            victims.push(j);
        }
        if victims.len() == args.runs.min(64) {
            break;
        }
    }

    // -- watchers, one connection each, opened 256 at a time.
    let t = Instant::now();
    let watchers: Vec<Arc<Watcher>> = (0..args.watchers)
        .map(|k| {
            let service = k % e.services;
            let needles = victims
                .iter()
                .enumerate()
                .filter(|(_, j)| e.sidecar_service(**j) == service)
                .map(|(v, j)| (v, format!("\"{}\"", inst_id(e.sidecar_instance(*j)))))
                .collect();
            Arc::new(Watcher {
                service,
                needles,
                last: Mutex::new(None),
            })
        })
        .collect();
    for (k, me) in watchers.iter().enumerate() {
        tokio::spawn(watch_loop(w.clone(), me.clone(), k, args.wait_secs));
        if k % 256 == 255 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let watchers_ok = wait_for(timeout, || watchers.iter().all(|x| x.last.lock().is_some()))
        .await
        .map(|_| t.elapsed().as_secs_f64());

    // -- streams, spread over every server's connections.
    let epoch = Instant::now();
    let shared = Arc::new(Shared::default());
    let mut chans = Vec::new();
    for _ in 0..args.grpc_conns.max(1) {
        for g in &args.grpc {
            chans.push(
                Endpoint::from_shared(format!("http://{g}"))?
                    .tcp_nodelay(true)
                    .initial_connection_window_size(Some(64 << 20))
                    .initial_stream_window_size(Some(4 << 20))
                    .connect_lazy(),
            );
        }
    }
    let chans = Arc::new(chans);
    let streams: Vec<Arc<Stream>> = (0..e.streams)
        .map(|j| {
            let i = e.sidecar_instance(j);
            Stream::new(j, sidecar_id(i), agent_node(i / PER_AGENT))
        })
        .collect();
    let t_streams = Instant::now();
    for s in &streams {
        tokio::spawn(stream_loop(
            chans.clone(),
            s.proxy,
            s.clone(),
            shared.clone(),
            epoch,
        ));
    }
    let streams_ok = until_all(&streams, timeout, "initial resources", |_, st| {
        st.complete_at
    })
    .await
    .ok()
    .and_then(|v| v.into_iter().max())
    .map(|m| secs_since(t_streams, m).as_secs_f64());
    println!(
        "row=setup agents={} instances={instances} services={} sidecars={} register_secs={register_secs:.1} watchers={} watchers_secs={} streams_secs={} stream_retries={}",
        e.agents,
        e.services,
        e.streams,
        args.watchers,
        fmt_secs(watchers_ok),
        fmt_secs(streams_ok),
        shared.retries.load(Ordering::Relaxed),
    );

    // -- steady state, the churn on.
    let protected: Arc<HashSet<usize>> =
        Arc::new((0..e.streams).map(|j| e.sidecar_instance(j)).collect());
    // Each worker changes its instance at 2.5/s, so a slow write delays
    // only its own next change.
    let churn_workers = ((args.churn / 2.5).ceil() as usize).clamp(1, 64);
    for k in 0..churn_workers {
        tokio::spawn(churn_loop(
            w.clone(),
            k,
            churn_workers,
            args.churn,
            protected.clone(),
        ));
    }
    w.churning.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let leader = find_leader(System::Cairn, &args.addrs).await?;
    let li = args.addrs.iter().position(|a| *a == leader).unwrap_or(0);
    let pids: Vec<String> = args.pids.iter().map(|p| p.to_string()).collect();
    let before: Vec<Option<f64>> = pids.iter().map(|p| cpu_secs(p)).collect();
    let tool_before = cpu_secs("self");
    let counts = |w: &World| {
        [
            w.heartbeats.load(Ordering::Relaxed),
            w.churn_ops.load(Ordering::Relaxed),
            w.answers.load(Ordering::Relaxed),
            shared.pushes.load(Ordering::Relaxed),
            w.heartbeat_errors.load(Ordering::Relaxed),
            w.churn_errors.load(Ordering::Relaxed),
            w.watch_errors.load(Ordering::Relaxed),
        ]
    };
    let c0 = counts(&w);
    w.recording.store(true, Ordering::Relaxed);
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.steady_secs)).await;
    let secs = t.elapsed().as_secs_f64();
    w.recording.store(false, Ordering::Relaxed);
    let c1 = counts(&w);
    let after: Vec<Option<f64>> = pids.iter().map(|p| cpu_secs(p)).collect();
    let tool_after = cpu_secs("self");
    let mut hb = std::mem::take(&mut *w.heartbeat_us.lock());
    hb.sort_unstable();
    let hb_ms = |p: f64| crate::Stats::percentile_ms(&hb, p);
    let follower_cpu: Vec<String> = (0..n)
        .filter(|k| *k != li)
        .map(|k| cpu_pct(before[k], after[k], secs))
        .collect();
    let follower_rss: Vec<String> = (0..n)
        .filter(|k| *k != li)
        .map(|k| rss_kib(args.pids[k]).map_or("?".into(), |r| (r / 1024).to_string()))
        .collect();
    println!(
        "row=steady secs={secs:.1} cores={} leader_cpu_pct={} follower_cpu_pct={} leader_rss_mib={} follower_rss_mib={} heartbeat_p50_ms={:.1} heartbeat_p99_ms={:.1} heartbeats_s={:.0} churn_s={:.1} answers_s={:.1} pushes_s={:.1} tool_cpu_pct={} heartbeat_errors={} churn_errors={} watch_errors={}",
        cores(),
        cpu_pct(before[li], after[li], secs),
        follower_cpu.join("/"),
        rss_kib(args.pids[li]).map_or("?".into(), |r| (r / 1024).to_string()),
        follower_rss.join("/"),
        hb_ms(0.5),
        hb_ms(0.99),
        (c1[0] - c0[0]) as f64 / secs,
        (c1[1] - c0[1]) as f64 / secs,
        (c1[2] - c0[2]) as f64 / secs,
        (c1[3] - c0[3]) as f64 / secs,
        cpu_pct(tool_before, tool_after, secs),
        c1[4] - c0[4],
        c1[5] - c0[5],
        c1[6] - c0[6],
    );

    // -- one instance's check critical, watched and upstream.
    let mut conn = Conn::new(&leader);
    let mut watch_times = Vec::new();
    let mut stream_times = Vec::new();
    let mut timeouts = 0;
    let (mut n_watchers, mut n_streams) = (0, 0);
    for (v, &j) in victims.iter().enumerate() {
        let i = e.sidecar_instance(j);
        let s = e.sidecar_service(j);
        let mine: Vec<Arc<Watcher>> = watchers
            .iter()
            .filter(|x| x.service == s)
            .cloned()
            .collect();
        let prefix = format!("{}.", svc(s));
        let endpoint = format!("{}:{}", agent_addr(i / PER_AGENT), sidecar_port(i));
        let ups: Vec<Arc<Stream>> = ads::live(&streams)
            .into_iter()
            .filter(|x| e.upstreams(x.proxy).contains(&s))
            .collect();
        // Everyone holds the victim first.
        let ready = wait_for(timeout, || {
            mine.iter()
                .all(|x| x.last.lock().is_some_and(|a| a.present & (1 << v) != 0))
        })
        .await
        .is_some()
            && until_all(&ups, timeout, "the victim in EDS", |_, st| {
                st.eds
                    .iter()
                    .find(|(name, (_, hosts))| {
                        name.starts_with(&prefix) && hosts.contains(&endpoint)
                    })
                    .map(|(_, (t, _))| *t)
            })
            .await
            .is_ok();
        if !ready {
            timeouts += 1;
            eprintln!(
                "  critical: {} never held by all its watchers and streams",
                inst_id(i)
            );
            continue;
        }
        let t0 = Instant::now();
        // The agent syncs the check, then the sidecar's alias of it.
        for op in [
            check_op(i, false, "critical"),
            check_op(i, true, "critical"),
        ] {
            let (st, _, b) = conn.call(op.method, &op.path, op.body).await?;
            if !st.is_success() {
                bail!("critical: {st}: {}", String::from_utf8_lossy(&b));
            }
        }
        let ack = t0.elapsed();
        let wt = wait_for(timeout, || {
            mine.iter().all(|x| {
                x.last
                    .lock()
                    .is_some_and(|a| a.at >= t0 && a.present & (1 << v) == 0)
            })
        })
        .await;
        let st = until_all(&ups, timeout, "EDS without the victim", |_, st| {
            let (_, (t, hosts)) = st.eds.iter().find(|(name, _)| name.starts_with(&prefix))?;
            (*t >= t0 && !hosts.contains(&endpoint)).then_some(*t)
        })
        .await;
        match (wt, st) {
            (Some(_), Ok(times)) => {
                let wts: Vec<Duration> = mine
                    .iter()
                    .filter_map(|x| *x.last.lock())
                    .map(|a| secs_since(t0, a.at))
                    .collect();
                let sts: Vec<Duration> = times.iter().map(|t| secs_since(t0, *t)).collect();
                eprintln!(
                    "  {} critical (acked in {} ms): {} watchers {}, {} streams {}",
                    inst_id(i),
                    ms(ack),
                    wts.len(),
                    spread(wts.clone()),
                    sts.len(),
                    spread(sts.clone())
                );
                n_watchers += wts.len();
                n_streams += sts.len();
                watch_times.extend(wts);
                stream_times.extend(sts);
            }
            _ => {
                timeouts += 1;
                eprintln!(
                    "  critical: {} not seen by all within {timeout:?}",
                    inst_id(i)
                );
            }
        }
        for op in [check_op(i, false, "passing"), check_op(i, true, "passing")] {
            conn.call(op.method, &op.path, op.body).await?;
        }
    }
    let both: Vec<Duration> = watch_times.iter().chain(&stream_times).copied().collect();
    println!(
        "row=critical runs={} watchers={n_watchers} streams={n_streams} {} watch_p99_ms={} stream_p99_ms={} timeouts={timeouts}",
        victims.len(),
        spread(both),
        ms(pct(&sorted(watch_times), 0.99)),
        ms(pct(&sorted(stream_times), 0.99)),
    );

    // -- a global change every stream sees.
    for protocol in ["http", "tcp"] {
        ads::settle(&shared, epoch, Duration::from_millis(500), timeout).await;
        let targets = ads::live(&streams);
        let t0 = Instant::now();
        let op = put(
            "/v1/config",
            json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": protocol}}),
        );
        let (st, _, b) = conn.call(op.method, &op.path, op.body).await?;
        if !st.is_success() {
            bail!("proxy-defaults: {st}: {}", String::from_utf8_lossy(&b));
        }
        let want = protocol == "http";
        match until_all(
            &targets,
            timeout,
            "the rewritten public listener",
            |_, st| {
                st.public_http
                    .and_then(|(h, t)| (h == want && t >= t0).then_some(t))
            },
        )
        .await
        {
            Ok(done) => println!(
                "row=global protocol={protocol} streams={} {}",
                targets.len(),
                spread(done.iter().map(|t| secs_since(t0, *t)).collect())
            ),
            Err(err) => println!(
                "row=global protocol={protocol} streams={} timeout=1 error={}",
                targets.len(),
                err.to_string().replace(' ', "_")
            ),
        }
    }

    // -- a follower killed and started again under the load.
    let leader = find_leader(System::Cairn, &args.addrs).await?;
    let li = args.addrs.iter().position(|a| *a == leader).unwrap_or(0);
    let fi = (li + 1) % n;
    let mut children = Vec::new();
    // The servers' processes now (the restarted one is this tool's child).
    let mut pids = args.pids.clone();
    if n > 1 {
        let fpid = pids[fi];
        let how = relaunch_of(fpid)?;
        sigkill(fpid)?;
        let t_kill = Instant::now();
        let gone = wait_for(timeout, || !alive(fpid)).await;
        // Its ports free again once its sockets are closed.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t0 = Instant::now();
        let child = launch(&how)?;
        pids[fi] = child.id();
        children.push(child);
        let addr = args.addrs[fi].clone();
        let leader_secs = poll_until(timeout, || {
            let addr = addr.clone();
            async move {
                matches!(get(&addr, "/v1/status/leader").await,
                    Some((s, _, b)) if s.is_success() && b.len() > 2)
            }
        })
        .await;
        let t_leader = t0.elapsed();
        let stale = poll_until(timeout, || {
            let (addr, leader) = (addr.clone(), leader.clone());
            async move {
                let Some((_, h, _)) = get(&leader, "/v1/catalog/services").await else {
                    return false;
                };
                let want = index_of(&h);
                matches!(get(&addr, "/v1/catalog/services?stale").await,
                    Some((s, h, _)) if s.is_success() && index_of(&h) >= want)
            }
        })
        .await;
        // Both from the start of the restarted process.
        let stale_secs = stale.map(|_| t0.elapsed().as_secs_f64());
        let leader_secs = leader_secs.map(|_| t_leader.as_secs_f64());
        println!(
            "row=restart server={addr} down_secs={:.2} leader_secs={} stale_secs={}",
            gone.map_or(0.0, |_| secs_since(t_kill, t0).as_secs_f64()),
            fmt_secs(leader_secs),
            fmt_secs(stale_secs),
        );
        // Every stream and watcher back before the leader goes.
        let _ = until_all(&streams, timeout, "streams back", |_, st| st.complete_at).await;
    }

    // -- the leader SIGKILLed: writes commit again, every watcher answered
    // by the new leader.
    if n > 2 {
        let leader = find_leader(System::Cairn, &args.addrs).await?;
        let li = args.addrs.iter().position(|a| *a == leader).unwrap_or(0);
        let rest: Vec<String> = (0..n)
            .filter(|k| *k != li)
            .map(|k| args.addrs[k].clone())
            .collect();
        let mut parked_before = Vec::new();
        for a in &rest {
            parked_before.push((a.clone(), crate::metric(a, PARKED).await.unwrap_or(0)));
        }
        sigkill(pids[li])?;
        let t0 = Instant::now();
        let turn = AtomicUsize::new(0);
        let write_secs = poll_until(timeout, || {
            let addr = rest[turn.fetch_add(1, Ordering::Relaxed) % rest.len()].clone();
            async move {
                let mut c = Conn::new(&addr);
                let r = tokio::time::timeout(
                    Duration::from_secs(2),
                    c.call(Method::PUT, "/v1/kv/scale/probe", Bytes::from_static(b"x")),
                )
                .await;
                matches!(r, Ok(Ok((s, _, _))) if s.is_success())
            }
        })
        .await;
        let t_write = t0.elapsed();
        // Every watcher held by the new leader again: the followers ask
        // the new leader again the queries they were forwarding (their
        // clients see nothing), and the watchers that were the old
        // leader's own reconnect, read, and park again; counted by the new
        // leader's parked gauge, beyond what it held before.
        let new_leader = find_leader(System::Cairn, &rest).await.ok();
        let held_secs = match &new_leader {
            Some(nl) => {
                let base = parked_before
                    .iter()
                    .find(|(a, _)| a == nl)
                    .map_or(0, |(_, p)| *p);
                let want = base + watchers.len() as u64;
                poll_until(timeout, || {
                    let nl = nl.clone();
                    async move { crate::metric(&nl, PARKED).await.is_ok_and(|p| p >= want) }
                })
                .await
                .map(|_| t0.elapsed().as_secs_f64())
            }
            None => None,
        };
        // The watchers that lost their query: answered again.
        let answered: Vec<Duration> = watchers
            .iter()
            .filter_map(|x| *x.last.lock())
            .filter(|a| a.sent >= t0)
            .map(|a| secs_since(t0, a.at))
            .collect();
        println!(
            "row=leader_kill old={leader} new={} write_secs={} held_secs={} reissued={} of={} {}",
            new_leader.as_deref().unwrap_or("none"),
            fmt_secs(write_secs.map(|_| t_write.as_secs_f64())),
            fmt_secs(held_secs),
            answered.len(),
            watchers.len(),
            spread(answered),
        );
    }

    let total = run_t0.elapsed().as_secs_f64();
    println!(
        "row=tool secs={total:.0} cpu_pct={} heartbeats={} heartbeat_errors={} churn_ops={} churn_errors={} answers={} watch_errors={} pushes={} stream_errors={}",
        cpu_pct(tool0, cpu_secs("self"), total),
        w.heartbeats.load(Ordering::Relaxed),
        w.heartbeat_errors.load(Ordering::Relaxed),
        w.churn_ops.load(Ordering::Relaxed),
        w.churn_errors.load(Ordering::Relaxed),
        w.answers.load(Ordering::Relaxed),
        w.watch_errors.load(Ordering::Relaxed),
        shared.pushes.load(Ordering::Relaxed),
        shared.errors.load(Ordering::Relaxed),
    );
    // The server this tool started again is its own to stop.
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    Ok(())
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estate() -> Estate {
        Estate {
            agents: 500,
            services: 1000,
            streams: 200,
        }
    }

    #[test]
    fn sidecars_front_distinct_instances_of_distinct_services() {
        let e = estate();
        let inst: HashSet<usize> = (0..e.streams).map(|j| e.sidecar_instance(j)).collect();
        assert_eq!(inst.len(), e.streams);
        assert!(inst.iter().all(|i| *i < e.instances()));
        let svcs: HashSet<usize> = (0..e.streams).map(|j| e.sidecar_service(j)).collect();
        assert_eq!(
            svcs.len(),
            e.streams,
            "the sidecars spread over the services"
        );
        // And over agents: no agent holds most of them.
        let agents: HashSet<usize> = inst.iter().map(|i| i / PER_AGENT).collect();
        assert!(agents.len() > e.streams / 2, "{} agents", agents.len());
    }

    #[test]
    fn upstreams_are_three_other_sidecar_services() {
        let e = estate();
        let svcs: HashSet<usize> = (0..e.streams).map(|j| e.sidecar_service(j)).collect();
        for j in 0..e.streams {
            let ups = e.upstreams(j);
            assert_eq!(ups.len(), 3, "sidecar {j}");
            assert!(!ups.contains(&e.sidecar_service(j)));
            assert_eq!(ups.iter().collect::<HashSet<_>>().len(), 3);
            assert!(ups.iter().all(|u| svcs.contains(u)));
        }
    }

    #[test]
    fn the_churn_never_touches_a_sidecars_instance() {
        let e = estate();
        let protected: HashSet<usize> = (0..e.streams).map(|j| e.sidecar_instance(j)).collect();
        let picked: HashSet<usize> = (0..2000)
            .map(|g| churn_instance(g, e.instances(), &protected))
            .collect();
        assert!(picked.is_disjoint(&protected));
        assert!(picked.len() > 1000, "spread: {} distinct", picked.len());
    }

    #[test]
    fn cpu_time_of_a_process_is_read_from_proc() {
        // Spinning moves it (however busy the machine: bounded by time).
        let a = cpu_secs("self").expect("own stat");
        let t = Instant::now();
        let mut x = 0u64;
        let mut b = a;
        while b - a < 0.05 && t.elapsed() < Duration::from_secs(20) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            b = cpu_secs("self").expect("own stat");
        }
        assert!(b - a >= 0.05, "{a} → {b}");
        assert!(b - a <= t.elapsed().as_secs_f64() * cores() + 0.02);
        assert!(cpu_secs("0").is_none());
    }

    #[test]
    fn a_process_is_relaunched_as_it_was_started() {
        let me = relaunch_of(std::process::id()).expect("own cmdline");
        assert_eq!(
            std::fs::canonicalize(&me.argv[0]).ok(),
            std::env::current_exe().ok()
        );
        assert_eq!(me.cwd, std::env::current_dir().unwrap());
        assert!(alive(std::process::id()));
    }

    #[test]
    fn a_watcher_finds_a_victim_only_by_its_whole_id() {
        let body = br#"[{"Service":{"ID":"inst-00000120","Service":"svc-0120"}}]"#;
        assert!(contains(body, format!("\"{}\"", inst_id(120)).as_bytes()));
        assert!(!contains(body, format!("\"{}\"", inst_id(12)).as_bytes()));
    }
}
