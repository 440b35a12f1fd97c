//! `cairn-load`: the load tool of `make bench`, one HTTP client for cairn and
//! for the peer (etcd's JSON gateway), so both are measured the same way.
//!
//! Every client task owns one keep-alive HTTP/1.1 connection (hyper, no
//! pool) and sends one request at a time. Writes and reads go to the leader
//! of each system, found first. Every loop is bounded in time and in count.
//!
//! Each measuring command prints one line on stdout for the bench script
//! (`key=value` pairs) and a human summary on stderr. `scale` (issue 39's
//! scenario, `scale.rs`) is the exception: it runs many kinds of clients at
//! once, its ADS streams through `ads.rs` (shared with
//! `examples/xds_bench.rs`), and prints one `row=NAME` line per row.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

mod ads;
mod login;
mod rows;
mod scale;

#[derive(Parser)]
#[command(name = "cairn-load", about = "Load generator for cairn and etcd")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum System {
    Cairn,
    Etcd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum ReadMode {
    /// cairn: no parameter (the leader answers from its current state).
    Default,
    /// cairn: `?stale`.
    Stale,
    /// cairn: `?consistent` (leadership confirmed by a quorum first).
    Consistent,
    /// etcd: a linearizable range (read index).
    Linearizable,
    /// etcd: a serializable range (the member's local state).
    Serializable,
}

#[derive(clap::Args, Clone)]
struct Common {
    #[arg(long, value_enum, default_value = "cairn")]
    system: System,
    /// The cluster's HTTP addresses (host:port), comma separated; the
    /// leader is found among them.
    #[arg(long, value_delimiter = ',', required = true)]
    addrs: Vec<String>,
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// A hard cap on requests, whatever the time.
    #[arg(long, default_value_t = 2_000_000)]
    max_ops: u64,
    /// Distinct keys written or read.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    #[arg(long, default_value_t = 256)]
    value_size: usize,
}

#[derive(Subcommand)]
enum Cmd {
    /// Prints the leader's HTTP address.
    Leader {
        #[arg(long, value_enum, default_value = "cairn")]
        system: System,
        #[arg(long, value_delimiter = ',', required = true)]
        addrs: Vec<String>,
    },
    /// Writes 16-byte keys with fixed-size values.
    Write(Common),
    /// Writes every key once, then reads random keys.
    Read {
        #[command(flatten)]
        common: Common,
        #[arg(long, value_enum)]
        mode: ReadMode,
    },
    /// Registers service instances (`PUT /v1/catalog/register`).
    Register {
        #[command(flatten)]
        common: Common,
        /// Register exactly this many instances (as fast as possible)
        /// instead of running for `--seconds`.
        #[arg(long)]
        count: Option<u64>,
        /// Instances per node.
        #[arg(long, default_value_t = 100)]
        per_node: u64,
        /// Number of the first instance (runs that must not re-register
        /// an earlier run's instances start past them).
        #[arg(long, default_value_t = 0)]
        start: u64,
        /// Distinct service names the instances share (`web-0`..).
        #[arg(long, default_value_t = 100)]
        services: u64,
        /// Give each instance a passing service check.
        #[arg(long)]
        checks: bool,
    },
    /// GETs `--path` from `--clients` connections at the leader.
    Get {
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        path: String,
    },
    /// Prints the PEM public key `login` signs its JWT with.
    JwtKey,
    /// Prints a JWT `login` would send (valid for an hour).
    Jwt,
    /// Logs in through a `jwt` auth method (`POST /v1/acl/login`) that
    /// trusts `jwt-key`'s key.
    Login {
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        method: String,
    },
    /// Loads KV entries through `PUT /v1/txn`, `batch` sets per transaction.
    Fill {
        #[arg(long, value_delimiter = ',', required = true)]
        addrs: Vec<String>,
        #[arg(long)]
        entries: u64,
        #[arg(long, default_value_t = 0)]
        start: u64,
        #[arg(long, default_value_t = 128)]
        batch: u64,
        #[arg(long, default_value_t = 16)]
        clients: usize,
        #[arg(long, default_value_t = 64)]
        value_size: usize,
        #[arg(long, default_value_t = 600.0)]
        timeout: f64,
    },
    /// Blocking queries on one KV key, then one write: how long until every
    /// watcher has returned.
    Watch {
        #[arg(long, value_delimiter = ',', required = true)]
        addrs: Vec<String>,
        #[arg(long, default_value_t = 10_000)]
        watchers: usize,
        #[arg(long, default_value = "bench/watched-key")]
        key: String,
        /// Connections opened at once while setting up.
        #[arg(long, default_value_t = 256)]
        connect_parallel: usize,
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
    },
    /// Small writes (`--clients`, `--value-size`) measured while other
    /// connections write large values without pause (cairn only).
    Burst {
        #[command(flatten)]
        common: Common,
        /// Connections writing large values.
        #[arg(long, default_value_t = 8)]
        burst_clients: usize,
        /// Bytes of each large value (500 KiB; Consul's limit is 512 KiB).
        #[arg(long, default_value_t = 500 << 10)]
        burst_bytes: usize,
        /// Keys the large values go to, overwritten in turn (the state
        /// stays small; the log and snapshots carry the bytes).
        #[arg(long, default_value_t = 16)]
        burst_keys: u64,
    },
    /// Reads every key under a prefix of `--keys` keys (cairn `?recurse`,
    /// etcd a prefix range), after writing them.
    Recurse {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value = "recurse/")]
        prefix: String,
    },
    /// Transactions of `--ops` puts (cairn `/v1/txn`, etcd `/v3/kv/txn`).
    Txn {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 128)]
        ops: u64,
        /// Write exactly this many fresh keys (`fill/<n>`) instead of
        /// running for `--seconds`.
        #[arg(long)]
        count: Option<u64>,
        #[arg(long, default_value_t = 0)]
        start: u64,
    },
    /// Issue 39's scenario: agents, watchers, ADS streams and churn at once
    /// against three servers (see `scale.rs`).
    Scale(scale::Args),
    /// Polls `path` on `addr` until it answers 200; prints the seconds taken.
    Wait {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        path: String,
        #[arg(long, default_value_t = 120.0)]
        timeout: f64,
    },
}

// ---------------------------------------------------------------- HTTP

/// One keep-alive HTTP/1.1 connection.
/// `CAIRN_LOAD_TOKEN`: an ACL token every request to cairn carries (the
/// bench's ACL rows).
fn acl_token() -> Option<&'static str> {
    static TOKEN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    TOKEN
        .get_or_init(|| {
            std::env::var("CAIRN_LOAD_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
        })
        .as_deref()
}

struct Conn {
    addr: String,
    send: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    fn new(addr: &str) -> Self {
        Conn {
            addr: addr.to_string(),
            send: None,
        }
    }

    async fn connect(&mut self) -> Result<()> {
        let stream = TcpStream::connect(&self.addr)
            .await
            .with_context(|| format!("connect {}", self.addr))?;
        stream.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.send = Some(send);
        Ok(())
    }

    /// Sends one request; reconnects first if the last one failed.
    async fn call(
        &mut self, method: Method, path: &str, body: Bytes,
    ) -> Result<(StatusCode, hyper::HeaderMap, Bytes)> {
        if self.send.is_none() {
            self.connect().await?;
        }
        let r = self.call_once(method, path, body).await;
        if r.is_err() {
            self.send = None;
        }
        r
    }

    async fn call_once(
        &mut self, method: Method, path: &str, body: Bytes,
    ) -> Result<(StatusCode, hyper::HeaderMap, Bytes)> {
        let send = self.send.as_mut().expect("connected");
        send.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.addr);
        if !body.is_empty() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(t) = acl_token() {
            req = req.header("x-consul-token", t);
        }
        let resp = send.send_request(req.body(Full::new(body))?).await?;
        let status = resp.status();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok((status, parts.headers, bytes))
    }
}

async fn get_json(addr: &str, method: Method, path: &str, body: Value) -> Result<Value> {
    let mut c = Conn::new(addr);
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let (status, _, bytes) = c.call(method, path, body).await?;
    if !status.is_success() {
        bail!("{addr}{path}: {status}");
    }
    Ok(serde_json::from_slice(&bytes)?)
}

/// The leader's HTTP address, asked of every member.
async fn find_leader(system: System, addrs: &[String]) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for a in addrs {
            let found = match system {
                System::Cairn => get_json(a, Method::GET, "/v1/agent/self", Value::Null)
                    .await
                    .map(|v| v["Stats"]["raft"]["state"] == "Leader"),
                // The gateway writes uint64 as strings; both are the
                // member's own id and its leader's.
                System::Etcd => get_json(a, Method::POST, "/v3/maintenance/status", json!({}))
                    .await
                    .map(|v| {
                        let me = &v["header"]["member_id"];
                        !me.is_null() && *me == v["leader"]
                    }),
            };
            if let Ok(true) = found {
                return Ok(a.clone());
            }
        }
        if Instant::now() > deadline {
            bail!("no leader among {addrs:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------- workloads

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// 16 bytes: `bench/` and a zero-padded number.
fn bench_key(i: u64) -> String {
    format!("bench/{i:010}")
}

fn value_of(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

/// One request of a workload, ready to send.
struct Op {
    method: Method,
    path: String,
    body: Bytes,
}

fn write_op(system: System, key: &str, value: &[u8]) -> Op {
    match system {
        System::Cairn => Op {
            method: Method::PUT,
            path: format!("/v1/kv/{key}"),
            body: Bytes::copy_from_slice(value),
        },
        System::Etcd => Op {
            method: Method::POST,
            path: "/v3/kv/put".into(),
            body: Bytes::from(
                json!({ "key": b64(key.as_bytes()), "value": b64(value) }).to_string(),
            ),
        },
    }
}

fn read_op(system: System, mode: ReadMode, key: &str) -> Result<Op> {
    Ok(match (system, mode) {
        (System::Cairn, ReadMode::Default) => Op {
            method: Method::GET,
            path: format!("/v1/kv/{key}"),
            body: Bytes::new(),
        },
        (System::Cairn, ReadMode::Stale) => Op {
            method: Method::GET,
            path: format!("/v1/kv/{key}?stale"),
            body: Bytes::new(),
        },
        (System::Cairn, ReadMode::Consistent) => Op {
            method: Method::GET,
            path: format!("/v1/kv/{key}?consistent"),
            body: Bytes::new(),
        },
        (System::Etcd, ReadMode::Linearizable | ReadMode::Serializable) => Op {
            method: Method::POST,
            path: "/v3/kv/range".into(),
            body: Bytes::from(
                json!({
                    "key": b64(key.as_bytes()),
                    "serializable": mode == ReadMode::Serializable,
                })
                .to_string(),
            ),
        },
        (s, m) => bail!("{m:?} reads are not a mode of {s:?}"),
    })
}

/// What `register` registers beside the instance numbers.
#[derive(Clone, Copy)]
struct Shape {
    per_node: u64,
    services: u64,
    checks: bool,
}

fn register_op(i: u64, shape: Shape) -> Op {
    let node = i / shape.per_node.max(1);
    let id = format!("web-{i:08}");
    let mut body = json!({
        "Node": format!("bench-node-{node:06}"),
        "Address": "127.0.0.1",
        "Service": {
            "ID": id,
            "Service": format!("web-{}", i % shape.services.max(1)),
            "Port": 8080,
            "Tags": ["bench"],
        },
    });
    if shape.checks {
        body["Check"] = json!({"CheckID": format!("{id}-alive"), "Name": "alive", "ServiceID": id, "Status": "passing"});
    }
    Op {
        method: Method::PUT,
        path: "/v1/catalog/register".into(),
        body: Bytes::from(body.to_string()),
    }
}

/// What one run measured.
#[derive(Default)]
struct Stats {
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    /// Latencies of the requests of the measured window, in microseconds.
    lat_us: Vec<u32>,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.ok += o.ok;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.lat_us.extend(o.lat_us);
    }

    fn percentile_ms(sorted: &[u32], p: f64) -> f64 {
        if sorted.is_empty() {
            return f64::NAN;
        }
        let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
        sorted[i] as f64 / 1000.0
    }
}

/// Runs `clients` tasks, each on its own connection, each sending what
/// `next(client, n)` builds until the window closes or `max_ops` is spent;
/// prints what it measured.
async fn run_load(
    addr: &str, c: &Common, next: Arc<dyn Fn(usize, u64) -> Op + Send + Sync>, label: &str,
) -> Result<()> {
    let (all, measured) = measure_load(addr, c, next).await?;
    let tput = all.ok as f64 / measured;
    let p50 = Stats::percentile_ms(&all.lat_us, 0.50);
    let p99 = Stats::percentile_ms(&all.lat_us, 0.99);
    println!(
        "tput={tput:.0} p50_ms={p50:.2} p99_ms={p99:.2} ok={} errors={} leader={addr}",
        all.ok, all.errors
    );
    eprintln!(
        "{label}: {} clients at {addr} (leader): {tput:.0}/s, p50 {p50:.2} ms, p99 {p99:.2} ms, {} ok, {} errors over {measured:.1}s",
        c.clients, all.ok, all.errors
    );
    if let Some(e) = all.first_error {
        eprintln!("{label}: first error: {e}");
    }
    Ok(())
}

/// What `run_load` runs: the merged stats (latencies sorted) and the
/// measured seconds.
async fn measure_load(
    addr: &str, c: &Common, next: Arc<dyn Fn(usize, u64) -> Op + Send + Sync>,
) -> Result<(Stats, f64)> {
    // Connect everyone before the clock starts.
    let mut conns = Vec::with_capacity(c.clients);
    for _ in 0..c.clients {
        let mut conn = Conn::new(addr);
        conn.connect().await?;
        conns.push(conn);
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(c.warmup);
    let end = measure_from + Duration::from_secs_f64(c.seconds);
    let budget = Arc::new(AtomicU64::new(c.max_ops));
    let mut tasks = Vec::new();
    for (id, mut conn) in conns.into_iter().enumerate() {
        let next = next.clone();
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            let mut st = Stats::default();
            let mut n = 0u64;
            loop {
                let now = Instant::now();
                let spent = budget
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
                    .is_err();
                if now >= end || spent {
                    break;
                }
                let op = next(id, n);
                n += 1;
                let t0 = Instant::now();
                let r = conn.call(op.method, &op.path, op.body).await;
                let t1 = Instant::now();
                let counted = t0 >= measure_from && t1 <= end;
                let failure = match r {
                    Ok((s, _, _)) if s.is_success() => None,
                    Ok((s, _, b)) => Some(format!("{s}: {}", String::from_utf8_lossy(&b))),
                    Err(e) => Some(format!("{e:#}")),
                };
                match failure {
                    None if counted => {
                        st.ok += 1;
                        st.lat_us
                            .push((t1 - t0).as_micros().min(u32::MAX as u128) as u32);
                    }
                    None => {}
                    Some(e) => {
                        st.errors += 1;
                        st.first_error.get_or_insert(e);
                        // Don't spin on a dead server.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            st
        }));
    }
    let mut all = Stats::default();
    for t in tasks {
        all.merge(t.await?);
    }
    let measured = (Instant::now().min(end) - measure_from.min(Instant::now()))
        .as_secs_f64()
        .max(1e-9);
    all.lat_us.sort_unstable();
    Ok((all, measured))
}

/// Small writes (`c`) measured while `big_clients` other connections write
/// `big_bytes` values to `big_keys` keys (`burst/N`) without pause, from
/// the start of the warm-up to the end of the window. Prints the small
/// writes' figures and the burst's acknowledged MB/s.
async fn cmd_burst(c: Common, big_clients: usize, big_bytes: usize, big_keys: u64) -> Result<()> {
    let leader = find_leader(System::Cairn, &c.addrs).await?;
    let value = Bytes::from(value_of(big_bytes));
    let stop = Arc::new(AtomicBool::new(false));
    let measure_from = Instant::now() + Duration::from_secs_f64(c.warmup);
    let mut big = Vec::new();
    for b in 0..big_clients {
        let (leader, value, stop) = (leader.clone(), value.clone(), stop.clone());
        big.push(tokio::spawn(async move {
            let mut conn = Conn::new(&leader);
            let (mut acked, mut errors, mut first_error) = (0u64, 0u64, None);
            let mut n = b as u64;
            while !stop.load(Ordering::Relaxed) {
                let path = format!("/v1/kv/burst/{}", n % big_keys.max(1));
                n += big_clients as u64;
                let t0 = Instant::now();
                match conn.call(Method::PUT, &path, value.clone()).await {
                    Ok((s, _, _)) if s.is_success() => {
                        // Counted in the window, as the small writes are.
                        if t0 >= measure_from && !stop.load(Ordering::Relaxed) {
                            acked += 1;
                        }
                    }
                    r => {
                        errors += 1;
                        first_error.get_or_insert_with(|| match r {
                            Ok((s, _, b)) => format!("{s}: {}", String::from_utf8_lossy(&b)),
                            Err(e) => format!("{e:#}"),
                        });
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (acked, errors, first_error)
        }));
    }
    let pick = key_picker(c.keys);
    let small_value = value_of(c.value_size);
    let next = Arc::new(move |client, n| write_op(System::Cairn, &pick(client, n), &small_value));
    let (all, measured) = measure_load(&leader, &c, next).await?;
    stop.store(true, Ordering::Relaxed);
    let (mut acked, mut errors, mut first_error) = (0u64, 0u64, None);
    for t in big {
        let (a, e, f) = t.await?;
        acked += a;
        errors += e;
        first_error = first_error.or(f);
    }
    let mb_s = (acked * big_bytes as u64) as f64 / measured / 1e6;
    let p50 = Stats::percentile_ms(&all.lat_us, 0.50);
    let p99 = Stats::percentile_ms(&all.lat_us, 0.99);
    let tput = all.ok as f64 / measured;
    println!(
        "tput={tput:.0} p50_ms={p50:.2} p99_ms={p99:.2} ok={} errors={} burst_mb_s={mb_s:.1} burst_ok={acked} burst_errors={errors} leader={leader}",
        all.ok, all.errors
    );
    eprintln!(
        "burst: {} small writers {tput:.0}/s, p50 {p50:.2} ms, p99 {p99:.2} ms ({} errors) while {big_clients} write {big_bytes} B values: {mb_s:.1} MB/s ({acked} acked, {errors} errors) over {measured:.1}s",
        c.clients, all.errors
    );
    for e in [all.first_error, first_error].into_iter().flatten() {
        eprintln!("burst: first error: {e}");
    }
    Ok(())
}

/// Writes every key once (so reads find them), 64 at a time.
async fn populate(system: System, addr: &str, keys: u64, value: &[u8]) -> Result<()> {
    let value = Arc::new(value.to_vec());
    let mut tasks = Vec::new();
    let workers = 64.min(keys.max(1));
    for w in 0..workers {
        let (addr, value) = (addr.to_string(), value.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(&addr);
            let mut i = w;
            while i < keys {
                let op = write_op(system, &bench_key(i), &value);
                let (s, _, b) = conn.call(op.method, &op.path, op.body).await?;
                if !s.is_success() {
                    bail!("populate: {s}: {}", String::from_utf8_lossy(&b));
                }
                i += workers;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn key_picker(keys: u64) -> impl Fn(usize, u64) -> String {
    // A cheap per-request spread over the key space (no shared RNG).
    move |client, n| {
        let x = (client as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(n.wrapping_mul(0xBF58_476D_1CE4_E5B9));
        bench_key((x ^ (x >> 31)) % keys.max(1))
    }
}

async fn cmd_write(c: Common) -> Result<()> {
    let leader = find_leader(c.system, &c.addrs).await?;
    let value = value_of(c.value_size);
    let pick = key_picker(c.keys);
    let system = c.system;
    let next = Arc::new(move |client, n| write_op(system, &pick(client, n), &value));
    run_load(&leader, &c, next, &format!("{system:?} write")).await
}

async fn cmd_read(c: Common, mode: ReadMode) -> Result<()> {
    read_op(c.system, mode, "probe")?;
    let leader = find_leader(c.system, &c.addrs).await?;
    populate(c.system, &leader, c.keys, &value_of(c.value_size)).await?;
    let pick = key_picker(c.keys);
    let system = c.system;
    let next = Arc::new(move |client, n| {
        read_op(system, mode, &pick(client, n)).expect("mode checked above")
    });
    run_load(&leader, &c, next, &format!("{system:?} read {mode:?}")).await
}

async fn cmd_register(c: Common, count: Option<u64>, shape: Shape, start: u64) -> Result<()> {
    let leader = find_leader(System::Cairn, &c.addrs).await?;
    let mut probe = Conn::new(&leader);
    let op = register_op(
        u64::MAX / 2,
        Shape {
            per_node: 1,
            ..shape
        },
    );
    let (s, _, _) = probe.call(op.method, &op.path, op.body).await?;
    if s == StatusCode::NOT_FOUND || s == StatusCode::METHOD_NOT_ALLOWED {
        println!("na=1 status={}", s.as_u16());
        eprintln!("register: n/a (catalog API not merged: {s})");
        return Ok(());
    }
    let _ = probe
        .call(
            Method::PUT,
            "/v1/catalog/deregister",
            Bytes::from(json!({"Node": format!("bench-node-{:06}", u64::MAX / 2)}).to_string()),
        )
        .await;
    let counter = Arc::new(AtomicU64::new(start));
    let next = Arc::new(move |_, _| register_op(counter.fetch_add(1, Ordering::Relaxed), shape));
    match count {
        None => run_load(&leader, &c, next, "register").await,
        Some(total) => {
            let c = Common {
                max_ops: total,
                warmup: 0.0,
                seconds: 600.0,
                ..c
            };
            run_load(&leader, &c, next, "register (fill)").await
        }
    }
}

/// Sends batches `0..batches` once each (`make(b)` builds batch `b`) from
/// `clients` connections that take the next batch from one counter, each
/// retried a few times (a busy leader answers 429): the fill commands' one
/// loop. Returns the seconds it took.
async fn send_batches(
    leader: &str, clients: usize, batches: u64, deadline: Option<Instant>,
    make: impl Fn(u64) -> Op + Send + Sync + 'static,
) -> Result<f64> {
    let make = Arc::new(make);
    let next_batch = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (leader, make, next_batch) = (leader.to_string(), make.clone(), next_batch.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(&leader);
            loop {
                let b = next_batch.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    return Ok::<_, anyhow::Error>(());
                }
                if deadline.is_some_and(|d| Instant::now() > d) {
                    bail!("timed out");
                }
                let op = make(b);
                let mut tries = 0;
                loop {
                    match conn
                        .call(op.method.clone(), &op.path, op.body.clone())
                        .await
                    {
                        Ok((s, _, _)) if s.is_success() => break,
                        Ok((s, _, b)) if tries > 5 => {
                            bail!("{s}: {}", String::from_utf8_lossy(&b))
                        }
                        Err(e) if tries > 5 => return Err(e),
                        _ => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(t0.elapsed().as_secs_f64())
}

async fn cmd_fill(
    addrs: Vec<String>, entries: u64, start: u64, batch: u64, clients: usize, value_size: usize,
    timeout: f64,
) -> Result<()> {
    let leader = find_leader(System::Cairn, &addrs).await?;
    let value = b64(&value_of(value_size));
    let batches = entries.div_ceil(batch.max(1));
    let deadline = Instant::now() + Duration::from_secs_f64(timeout);
    let secs = send_batches(&leader, clients, batches, Some(deadline), move |b| {
        let from = start + b * batch;
        let to = (start + (b + 1) * batch).min(start + entries);
        let ops: Vec<Value> = (from..to)
            .map(|i| json!({"KV": {"Verb": "set", "Key": format!("fill/{i:011}"), "Value": value}}))
            .collect();
        Op {
            method: Method::PUT,
            path: "/v1/txn".into(),
            body: Bytes::from(Value::Array(ops).to_string()),
        }
    })
    .await
    .map_err(|e| anyhow!("fill: {e}"))?;
    println!(
        "secs={secs:.2} entries={entries} rate={:.0}",
        entries as f64 / secs
    );
    eprintln!(
        "fill: {entries} entries in {batches} txns of {batch} at {leader}: {secs:.1}s ({:.0} entries/s)",
        entries as f64 / secs
    );
    Ok(())
}

/// The value of a counter in cairn's Prometheus text.
async fn metric(addr: &str, name: &str) -> Result<u64> {
    let mut c = Conn::new(addr);
    let (_, _, body) = c
        .call(
            Method::GET,
            "/v1/agent/metrics?format=prometheus",
            Bytes::new(),
        )
        .await?;
    let text = String::from_utf8_lossy(&body);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| anyhow!("metric {name} not found"))
}

async fn cmd_watch(
    addrs: Vec<String>, watchers: usize, key: String, connect_parallel: usize, timeout: f64,
) -> Result<()> {
    let leader = find_leader(System::Cairn, &addrs).await?;
    let mut writer = Conn::new(&leader);
    let path = format!("/v1/kv/{key}");
    let (s, _, _) = writer
        .call(Method::PUT, &path, Bytes::from_static(b"before"))
        .await?;
    if !s.is_success() {
        bail!("watch: first write: {s}");
    }
    let (_, headers, _) = writer.call(Method::GET, &path, Bytes::new()).await?;
    let index: u64 = headers
        .get("x-consul-index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("watch: no X-Consul-Index"))?;
    let started_before = metric(&leader, "cairn_blocking_queries_total").await?;

    // Connect in waves, then every watcher sends its blocking query.
    let deadline = Instant::now() + Duration::from_secs_f64(timeout);
    let gate = Arc::new(tokio::sync::Semaphore::new(connect_parallel));
    let failed = Arc::new(AtomicBool::new(false));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Result<Instant>>();
    let t_setup = Instant::now();
    for _ in 0..watchers {
        let (leader, gate, done_tx, failed) = (
            leader.clone(),
            gate.clone(),
            done_tx.clone(),
            failed.clone(),
        );
        let path = format!("{path}?index={index}&wait=120s");
        tokio::spawn(async move {
            let mut conn = Conn::new(&leader);
            {
                let _permit = gate.acquire().await;
                if let Err(e) = conn.connect().await {
                    failed.store(true, Ordering::Relaxed);
                    let _ = done_tx.send(Err(e));
                    return;
                }
            }
            let r = tokio::time::timeout_at(
                deadline.into(),
                conn.call(Method::GET, &path, Bytes::new()),
            )
            .await;
            let now = Instant::now();
            let _ = done_tx.send(match r {
                Ok(Ok((s, _, _))) if s.is_success() => Ok(now),
                Ok(Ok((s, _, _))) => Err(anyhow!("watcher answered {s}")),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(anyhow!("watcher timed out")),
            });
        });
    }
    drop(done_tx);
    // Every watcher is parked once the server has counted its query.
    loop {
        let n = metric(&leader, "cairn_blocking_queries_total").await? - started_before;
        if n >= watchers as u64 {
            break;
        }
        if failed.load(Ordering::Relaxed) || Instant::now() > deadline {
            bail!("watch: only {n} of {watchers} watchers parked");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let setup = t_setup.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let t0 = Instant::now();
    let (s, _, _) = writer
        .call(Method::PUT, &path, Bytes::from_static(b"after"))
        .await?;
    let write_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if !s.is_success() {
        bail!("watch: the write answered {s}");
    }
    let mut lat_us = Vec::with_capacity(watchers);
    let mut errors = 0;
    let mut first_error = None;
    while let Some(r) = done_rx.recv().await {
        match r {
            Ok(at) => lat_us.push(at.saturating_duration_since(t0).as_micros() as u32),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    lat_us.sort_unstable();
    let p50 = Stats::percentile_ms(&lat_us, 0.50);
    let p99 = Stats::percentile_ms(&lat_us, 0.99);
    let max = lat_us.last().map_or(f64::NAN, |m| *m as f64 / 1000.0);
    println!(
        "p50_ms={p50:.1} p99_ms={p99:.1} max_ms={max:.1} woken={} errors={errors} write_ms={write_ms:.1}",
        lat_us.len()
    );
    eprintln!(
        "watch: {watchers} watchers on {key} at {leader} (one connection each, parked in {setup:.1}s); \
         after one write (acknowledged in {write_ms:.1} ms): {} woken, p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms, {errors} errors",
        lat_us.len()
    );
    if let Some(e) = first_error {
        eprintln!("watch: first error: {e:#}");
    }
    Ok(())
}

async fn cmd_wait(addr: String, path: String, timeout: f64) -> Result<()> {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(timeout);
    loop {
        let mut c = Conn::new(&addr);
        if let Ok((s, _, _)) = c.call(Method::GET, &path, Bytes::new()).await
            && s.is_success()
        {
            let secs = t0.elapsed().as_secs_f64();
            println!("secs={secs:.2}");
            eprintln!("wait: {addr}{path} answered after {secs:.2}s");
            return Ok(());
        }
        if Instant::now() > deadline {
            println!("secs=timeout");
            bail!("wait: {addr}{path} not answering after {timeout}s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Leader { system, addrs } => {
                println!("{}", find_leader(system, &addrs).await?);
                Ok(())
            }
            Cmd::Write(c) => cmd_write(c).await,
            Cmd::Read { common, mode } => cmd_read(common, mode).await,
            Cmd::Register {
                common,
                count,
                per_node,
                start,
                services,
                checks,
            } => {
                let shape = Shape {
                    per_node,
                    services,
                    checks,
                };
                cmd_register(common, count, shape, start).await
            }
            Cmd::Get { common, path } => rows::cmd_get(common, path).await,
            Cmd::JwtKey => {
                println!("{}", login::public_pem()?);
                Ok(())
            }
            Cmd::Jwt => {
                println!("{}", login::jwt()?);
                Ok(())
            }
            Cmd::Login { common, method } => login::cmd_login(common, method).await,
            Cmd::Fill {
                addrs,
                entries,
                start,
                batch,
                clients,
                value_size,
                timeout,
            } => cmd_fill(addrs, entries, start, batch, clients, value_size, timeout).await,
            Cmd::Watch {
                addrs,
                watchers,
                key,
                connect_parallel,
                timeout,
            } => cmd_watch(addrs, watchers, key, connect_parallel, timeout).await,
            Cmd::Recurse { common, prefix } => rows::cmd_recurse(common, prefix).await,
            Cmd::Txn {
                common,
                ops,
                count,
                start,
            } => rows::cmd_txn(common, ops, count, start).await,
            Cmd::Wait {
                addr,
                path,
                timeout,
            } => cmd_wait(addr, path, timeout).await,
            Cmd::Scale(args) => scale::cmd_scale(args).await,
            Cmd::Burst {
                common,
                burst_clients,
                burst_bytes,
                burst_keys,
            } => cmd_burst(common, burst_clients, burst_bytes, burst_keys).await,
        }
    })
}
