//! The xDS benchmark (issue 19, "Performance"), run by `make bench`
//! (`scripts/bench.sh`, part `xds`) against a real `cairn server`:
//! `cargo run --release --example xds_bench -- --http A --grpc B --pid P --streams N`.
//!
//! It registers N connect proxies (sidecars of N/20 services, each with
//! upstreams to three other services, and their application instances)
//! through `/v1/catalog/register`, then opens one Delta ADS stream per
//! proxy over a few multiplexed HTTP/2 connections and behaves as Envoy
//! does: wildcard CDS and LDS, then EDS and RDS for the names those
//! carry; every push decoded and ACKed; per stream the time each resource
//! arrived is recorded. A separate binary of the main crate rather than a
//! load-tool mode: tonic's client and Envoy's types are already here, and
//! the load tool stays a plain HTTP/1 client.
//!
//! Rows, one `key=value` line each on stdout (progress on stderr):
//! - `initial`: every stream holds its clusters, listeners, endpoints and
//!   routes (time from opening the streams);
//! - `eds`: one upstream sidecar deregistered → every stream with that
//!   upstream holds endpoints without it (p50/p99/max over all runs);
//! - `defaults`: one `proxy-defaults` write (protocol tcp ↔ http) → every
//!   stream holds the rewritten public listener, with KV PUT latency of
//!   concurrent writers meanwhile;
//! - `memory`: server RSS before and after the streams connected.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::{Node, address, socket_address};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter::ConfigType};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use futures_util::StreamExt;
use parking_lot::Mutex;
use prost::Message;
use serde_json::json;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str = "envoy.filters.network.http_connection_manager";
/// Proxies (and their applications) per catalog node.
const PER_NODE: usize = 20;

#[derive(Parser, Debug)]
struct Args {
    /// The server's HTTP address.
    #[arg(long, default_value = "127.0.0.1:8500")]
    http: String,
    /// The server's gRPC (xDS) address.
    #[arg(long, default_value = "127.0.0.1:8502")]
    grpc: String,
    /// The server's process id, for its RSS (no memory row without it).
    #[arg(long)]
    pid: Option<u32>,
    /// Proxies registered, one ADS stream each.
    #[arg(long, default_value_t = 500)]
    streams: usize,
    /// Services the proxies front (default: one per 20 proxies, at least 4).
    #[arg(long)]
    services: Option<usize>,
    /// HTTP/2 connections the streams are multiplexed over.
    #[arg(long, default_value_t = 16)]
    conns: usize,
    /// Deregistrations measured in the `eds` row.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Concurrent KV writers during the `defaults` row.
    #[arg(long, default_value_t = 4)]
    kv_clients: usize,
    /// How long any one wait may take before the row fails, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

/// The mesh the proxies form: proxy `p` fronts service `p % services` on
/// node `p / PER_NODE` and has three upstreams among the other services.
#[derive(Clone, Copy)]
struct Mesh {
    services: usize,
}

impl Mesh {
    fn service_of(&self, p: usize) -> usize {
        p % self.services
    }
    fn upstreams(&self, p: usize) -> Vec<usize> {
        let own = self.service_of(p);
        let mut ups: Vec<usize> = Vec::new();
        let mut k = 1 + p / self.services;
        while ups.len() < 3.min(self.services - 1) {
            let u = (own + k * 7) % self.services;
            if u != own && !ups.contains(&u) {
                ups.push(u);
            }
            k += 1;
        }
        ups
    }
}

fn svc(s: usize) -> String {
    format!("svc-{s:04}")
}
fn node(p: usize) -> String {
    format!("mesh-{:05}", p / PER_NODE)
}
fn proxy_id(p: usize) -> String {
    format!("proxy-{p}")
}
fn node_addr(p: usize) -> String {
    let n = p / PER_NODE;
    format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255)
}
fn proxy_port(p: usize) -> usize {
    21000 + p % PER_NODE
}
/// The endpoint an upstream's EDS lists for proxy `p`.
fn endpoint_of(p: usize) -> String {
    format!("{}:{}", node_addr(p), proxy_port(p))
}

/// What one stream holds, as Envoy would: resources by type and name, and
/// when each arrived.
#[derive(Default)]
struct StreamState {
    /// EDS cluster name → the name its endpoints are subscribed under.
    clusters: HashMap<String, Option<String>>,
    /// Listener → the route configuration it names (RDS), if any.
    listeners: HashMap<String, Option<String>>,
    eds_subs: BTreeSet<String>,
    rds_subs: BTreeSet<String>,
    /// Endpoints per load assignment ("ip:port"), and when it arrived.
    eds: HashMap<String, (Instant, Vec<String>)>,
    rds: BTreeSet<String>,
    cds_at: Option<Instant>,
    lds_at: Option<Instant>,
    /// Whether the public listener is HTTP, and since when.
    public_http: Option<(bool, Instant)>,
    /// When it first held every resource it subscribed to.
    complete_at: Option<Instant>,
    error: Option<String>,
    ended: bool,
}

impl StreamState {
    fn complete(&self) -> bool {
        self.cds_at.is_some()
            && self.lds_at.is_some()
            && self.eds_subs.iter().all(|n| self.eds.contains_key(n))
            && self.rds_subs.iter().all(|n| self.rds.contains(n))
    }
}

struct Stream {
    proxy: usize,
    state: Mutex<StreamState>,
    /// Set before its proxy is deregistered: its end is expected.
    retiring: AtomicBool,
}

/// Counters every stream shares.
#[derive(Default)]
struct Shared {
    pushes: AtomicU64,
    /// Milliseconds since `epoch` of the last push any stream received.
    last_push_ms: AtomicU64,
    retries: AtomicUsize,
    errors: AtomicUsize,
}

fn decode<M: Message + Default>(any: &Option<envoy_types::pb::google::protobuf::Any>) -> Option<M> {
    M::decode(any.as_ref()?.value.as_slice()).ok()
}

/// Takes in one push; returns the subscription changes Envoy would send
/// before its ACK.
fn on_push(
    st: &mut StreamState, resp: &DeltaDiscoveryResponse, now: Instant,
) -> Vec<DeltaDiscoveryRequest> {
    let mut out = Vec::new();
    match resp.type_url.as_str() {
        CDS => {
            for r in &resp.resources {
                let Some(c) = decode::<Cluster>(&r.resource) else {
                    continue;
                };
                let eds = matches!(
                    c.cluster_discovery_type,
                    Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32
                );
                let name = eds.then(|| {
                    c.eds_cluster_config
                        .as_ref()
                        .map(|e| e.service_name.clone())
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| r.name.clone())
                });
                st.clusters.insert(r.name.clone(), name);
            }
            for n in &resp.removed_resources {
                st.clusters.remove(n);
            }
            st.cds_at = Some(now);
            let want: BTreeSet<String> = st.clusters.values().flatten().cloned().collect();
            out.extend(resubscribe(EDS, &mut st.eds_subs, want));
            st.eds.retain(|n, _| st.eds_subs.contains(n));
        }
        LDS => {
            for r in &resp.resources {
                let Some(l) = decode::<Listener>(&r.resource) else {
                    continue;
                };
                let mut rds = None;
                let mut http = false;
                for f in l.filter_chains.iter().flat_map(|fc| fc.filters.iter()) {
                    if f.name != HCM {
                        continue;
                    }
                    http = true;
                    if let Some(ConfigType::TypedConfig(any)) = &f.config_type
                        && let Ok(m) = HttpConnectionManager::decode(any.value.as_slice())
                        && let Some(RouteSpecifier::Rds(r)) = m.route_specifier
                    {
                        rds = Some(r.route_config_name);
                    }
                }
                if r.name.starts_with("public_listener:") {
                    st.public_http = Some((http, now));
                }
                st.listeners.insert(r.name.clone(), rds);
            }
            for n in &resp.removed_resources {
                st.listeners.remove(n);
            }
            st.lds_at = Some(now);
            let want: BTreeSet<String> = st.listeners.values().flatten().cloned().collect();
            out.extend(resubscribe(RDS, &mut st.rds_subs, want));
            st.rds.retain(|n| st.rds_subs.contains(n));
        }
        EDS => {
            for r in &resp.resources {
                let Some(cla) = decode::<ClusterLoadAssignment>(&r.resource) else {
                    continue;
                };
                let hosts = cla
                    .endpoints
                    .iter()
                    .flat_map(|le| le.lb_endpoints.iter())
                    .filter_map(|e| match &e.host_identifier {
                        Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
                        _ => None,
                    })
                    .filter_map(|a| match &a.address {
                        Some(address::Address::SocketAddress(s)) => Some(format!(
                            "{}:{}",
                            s.address,
                            match s.port_specifier {
                                Some(socket_address::PortSpecifier::PortValue(p)) => p,
                                _ => 0,
                            }
                        )),
                        _ => None,
                    })
                    .collect();
                st.eds.insert(r.name.clone(), (now, hosts));
            }
            for n in &resp.removed_resources {
                st.eds.remove(n);
            }
        }
        RDS => {
            st.rds.extend(resp.resources.iter().map(|r| r.name.clone()));
            for n in &resp.removed_resources {
                st.rds.remove(n);
            }
        }
        _ => {}
    }
    if st.complete_at.is_none() && st.complete() {
        st.complete_at = Some(now);
    }
    out
}

fn resubscribe(
    ty: &str, have: &mut BTreeSet<String>, want: BTreeSet<String>,
) -> Option<DeltaDiscoveryRequest> {
    let new: Vec<String> = want.difference(have).cloned().collect();
    let gone: Vec<String> = have.difference(&want).cloned().collect();
    if new.is_empty() && gone.is_empty() {
        return None;
    }
    *have = want;
    Some(DeltaDiscoveryRequest {
        type_url: ty.into(),
        resource_names_subscribe: new,
        resource_names_unsubscribe: gone,
        ..Default::default()
    })
}

/// One proxy's stream for as long as the server serves it. A refusal
/// before the first push (its snapshot not built yet) is retried after a
/// second, as Envoy's backoff would.
async fn run_stream(channel: Channel, s: Arc<Stream>, shared: Arc<Shared>, epoch: Instant) {
    let mut attempt_ok = false;
    loop {
        match stream_once(channel.clone(), &s, &shared, epoch, &mut attempt_ok).await {
            Ok(()) => {}
            Err(e) if !attempt_ok && !s.retiring.load(Ordering::Relaxed) => {
                shared.retries.fetch_add(1, Ordering::Relaxed);
                tracing_note(&s, &e);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => {
                if !s.retiring.load(Ordering::Relaxed) {
                    shared.errors.fetch_add(1, Ordering::Relaxed);
                    s.state.lock().error = Some(e.to_string());
                }
            }
        }
        s.state.lock().ended = true;
        return;
    }
}

fn tracing_note(s: &Stream, e: &tonic::Status) {
    if s.proxy == 0 {
        eprintln!("  stream of proxy-0 refused ({}), retrying", e.message());
    }
}

async fn stream_once(
    channel: Channel, s: &Stream, shared: &Shared, epoch: Instant, attempt_ok: &mut bool,
) -> Result<(), tonic::Status> {
    *s.state.lock() = StreamState::default();
    let (tx, rx) = mpsc::unbounded_channel::<DeltaDiscoveryRequest>();
    let node = Node {
        id: proxy_id(s.proxy),
        cluster: proxy_id(s.proxy),
        // consul-dataplane names the proxy's node so.
        metadata: Some(Struct {
            fields: [(
                "node_name".to_string(),
                Value {
                    kind: Some(Kind::StringValue(node(s.proxy))),
                },
            )]
            .into(),
        }),
        ..Default::default()
    };
    for ty in [CDS, LDS] {
        let _ = tx.send(DeltaDiscoveryRequest {
            node: Some(node.clone()),
            type_url: ty.into(),
            ..Default::default()
        });
    }
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let mut inbound = client
        .delta_aggregated_resources(outbound)
        .await?
        .into_inner();
    while let Some(resp) = inbound.message().await? {
        let now = Instant::now();
        *attempt_ok = true;
        shared.pushes.fetch_add(1, Ordering::Relaxed);
        shared.last_push_ms.fetch_max(
            now.duration_since(epoch).as_millis() as u64,
            Ordering::Relaxed,
        );
        let subs = on_push(&mut s.state.lock(), &resp, now);
        for r in subs {
            let _ = tx.send(r);
        }
        let _ = tx.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        });
    }
    Ok(())
}

// ------------------------------------------------------------------ HTTP

struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    async fn put(&self, path: &str, body: serde_json::Value) -> Result<()> {
        let r = self
            .client
            .put(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .with_context(|| format!("PUT {path}"))?;
        if !r.status().is_success() {
            bail!(
                "PUT {path}: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }
}

async fn register(http: &Http, mesh: Mesh, n: usize) -> Result<()> {
    let one = |p: usize| {
        let s = svc(mesh.service_of(p));
        let ups: Vec<_> = mesh
            .upstreams(p)
            .into_iter()
            .enumerate()
            .map(|(k, u)| json!({"DestinationName": svc(u), "LocalBindPort": 9000 + k}))
            .collect();
        let app_port = 8000 + p % PER_NODE;
        [
            json!({"Node": node(p), "Address": node_addr(p),
                   "Service": {"ID": format!("app-{p}"), "Service": s, "Port": app_port}}),
            json!({"Node": node(p), "Address": node_addr(p),
                   "Service": {"ID": proxy_id(p), "Service": format!("{s}-sidecar-proxy"),
                               "Kind": "connect-proxy", "Port": proxy_port(p),
                               "Proxy": {"DestinationServiceName": s, "DestinationServiceID": format!("app-{p}"),
                                         "LocalServiceAddress": "127.0.0.1", "LocalServicePort": app_port,
                                         "Upstreams": ups}},
                   "Checks": [{"Node": node(p), "CheckID": format!("{}-alive", proxy_id(p)), "Name": "alive",
                               "ServiceID": proxy_id(p), "Status": "passing"}]}),
        ]
    };
    let bodies = (0..n).flat_map(one);
    let results: Vec<Result<()>> = futures_util::stream::iter(bodies)
        .map(|b| http.put("/v1/catalog/register", b))
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

// ------------------------------------------------------------------ figures

fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn spread(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "p50_ms={} p99_ms={} max_ms={}",
        ms(pct(&v, 0.5)),
        ms(pct(&v, 0.99)),
        ms(pct(&v, 1.0))
    )
}

/// Polls until `done` gives every stream's time (`Some`), or the timeout.
async fn until_all(
    streams: &[Arc<Stream>], timeout: Duration, what: &str,
    done: impl Fn(&Stream, &StreamState) -> Option<Instant>,
) -> Result<Vec<Instant>> {
    let until = Instant::now() + timeout;
    loop {
        let mut times = Vec::with_capacity(streams.len());
        let mut missing = 0;
        for s in streams {
            match done(s, &s.state.lock()) {
                Some(t) => times.push(t),
                None => missing += 1,
            }
        }
        if missing == 0 {
            return Ok(times);
        }
        if Instant::now() > until {
            bail!(
                "{what}: {missing} of {} streams not there after {timeout:?}",
                streams.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no stream has received a push for `quiet`.
async fn settle(shared: &Shared, epoch: Instant, quiet: Duration, timeout: Duration) {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        let last = epoch + Duration::from_millis(shared.last_push_ms.load(Ordering::Relaxed));
        if last.elapsed() >= quiet {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn live(streams: &[Arc<Stream>]) -> Vec<Arc<Stream>> {
    streams
        .iter()
        .filter(|s| !s.retiring.load(Ordering::Relaxed) && !s.state.lock().ended)
        .cloned()
        .collect()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.streams;
    let mesh = Mesh {
        services: args.services.unwrap_or((n / PER_NODE).max(4)),
    };
    let timeout = Duration::from_secs(args.timeout);
    let http = Arc::new(Http {
        client: cairn::tls::http_client()
            .pool_max_idle_per_host(128)
            .timeout(Duration::from_secs(30))
            .build()?,
        base: format!("http://{}", args.http),
    });
    eprintln!(
        "xds bench: {n} proxies ({} services, 3 upstreams each) on {}, {} HTTP/2 connections",
        mesh.services, args.grpc, args.conns
    );

    let t = Instant::now();
    register(&http, mesh, n).await?;
    eprintln!(
        "  registered {n} proxies and {n} applications in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Snapshots are built as registrations land; a stream opened before its
    // proxy's is refused and retried, so let the builds settle first
    // (and let the RSS baseline include them).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss0 = args.pid.and_then(rss_kib);

    let epoch = Instant::now();
    let shared = Arc::new(Shared::default());
    let mut channels = Vec::new();
    for _ in 0..args.conns.max(1) {
        let ch = Endpoint::from_shared(format!("http://{}", args.grpc))?
            .tcp_nodelay(true)
            .initial_connection_window_size(Some(64 << 20))
            .initial_stream_window_size(Some(4 << 20))
            .connect()
            .await
            .with_context(|| format!("gRPC {}", args.grpc))?;
        channels.push(ch);
    }
    let streams: Vec<Arc<Stream>> = (0..n)
        .map(|p| {
            Arc::new(Stream {
                proxy: p,
                state: Mutex::new(StreamState::default()),
                retiring: AtomicBool::new(false),
            })
        })
        .collect();
    let t0 = Instant::now();
    for s in &streams {
        let ch = channels[s.proxy % channels.len()].clone();
        tokio::spawn(run_stream(ch, s.clone(), shared.clone(), epoch));
    }
    let done = until_all(&streams, timeout, "initial resources", |_, st| {
        st.complete_at
    })
    .await?;
    let all = done
        .iter()
        .max()
        .map_or(Duration::ZERO, |m| m.duration_since(t0));
    println!(
        "row=initial streams={n} secs={:.2} {} retries={} errors={} pushes={}",
        all.as_secs_f64(),
        spread(done.iter().map(|d| d.duration_since(t0)).collect()),
        shared.retries.load(Ordering::Relaxed),
        shared.errors.load(Ordering::Relaxed),
        shared.pushes.load(Ordering::Relaxed)
    );
    settle(&shared, epoch, Duration::from_secs(1), timeout).await;
    if let (Some(pid), Some(r0)) = (args.pid, rss0) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r1 = rss_kib(pid).unwrap_or(0);
        println!(
            "row=memory streams={n} rss0_kib={r0} rss1_kib={r1} per_stream_b={}",
            (r1.saturating_sub(r0) * 1024) / n.max(1) as u64
        );
    }

    // (b) one upstream instance deregistered.
    let mut eds_times = Vec::new();
    let mut affected_total = 0;
    for run in 0..args.runs {
        let victim = (run * 7919 + 13) % n;
        let dead_svc = svc(mesh.service_of(victim));
        let prefix = format!("{dead_svc}.");
        let dead = endpoint_of(victim);
        streams[victim].retiring.store(true, Ordering::Relaxed);
        let affected: Vec<Arc<Stream>> = live(&streams)
            .into_iter()
            .filter(|s| mesh.upstreams(s.proxy).contains(&mesh.service_of(victim)))
            .collect();
        // Every affected stream must hold the victim before it goes.
        until_all(&affected, timeout, "the victim in EDS", |_, st| {
            st.eds
                .iter()
                .find(|(name, (_, hosts))| name.starts_with(&prefix) && hosts.contains(&dead))
                .map(|(_, (t, _))| *t)
        })
        .await?;
        settle(&shared, epoch, Duration::from_millis(500), timeout).await;
        let t0 = Instant::now();
        http.put(
            "/v1/catalog/deregister",
            json!({"Node": node(victim), "ServiceID": proxy_id(victim)}),
        )
        .await?;
        let ack = t0.elapsed();
        let done = until_all(&affected, timeout, "EDS without the victim", |_, st| {
            let (_, (t, hosts)) = st.eds.iter().find(|(name, _)| name.starts_with(&prefix))?;
            (!hosts.contains(&dead)).then_some(*t)
        })
        .await?;
        let times: Vec<Duration> = done
            .iter()
            .map(|d| d.saturating_duration_since(t0))
            .collect();
        eprintln!(
            "  deregistered {} ({dead}), write acked in {}: {} streams, {}",
            proxy_id(victim),
            ms(ack),
            affected.len(),
            spread(times.clone())
        );
        affected_total += affected.len();
        eds_times.extend(times);
    }
    if args.runs > 0 {
        println!(
            "row=eds runs={} affected={affected_total} {}",
            args.runs,
            spread(eds_times)
        );
    }

    // (c) one proxy-defaults write, with KV writers meanwhile.
    for protocol in ["http", "tcp"] {
        settle(&shared, epoch, Duration::from_millis(500), timeout).await;
        let targets = live(&streams);
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for c in 0..args.kv_clients {
            let (http, stop) = (http.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0usize;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let r = http
                        .client
                        .put(format!("{}/v1/kv/xds-bench/{c}-{}", http.base, i % 100))
                        .body("x".repeat(256))
                        .send()
                        .await;
                    match r {
                        Ok(r) if r.status().is_success() => lat.push((t, t.elapsed())),
                        _ => errors += 1,
                    }
                    i += 1;
                }
                (lat, errors)
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t0 = Instant::now();
        http.put(
            "/v1/config",
            json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": protocol}}),
        )
        .await?;
        let ack = t0.elapsed();
        let want_http = protocol == "http";
        let done = until_all(
            &targets,
            timeout,
            "the rewritten public listener",
            |_, st| {
                st.public_http
                    .and_then(|(h, t)| (h == want_http && t >= t0).then_some(t))
            },
        )
        .await?;
        stop.store(true, Ordering::Relaxed);
        let mut kv = Vec::new();
        let mut kv_errors = 0;
        for w in writers {
            let (l, e) = w.await?;
            // Only the writes sent once the config write went out.
            kv.extend(l.into_iter().filter(|(t, _)| *t >= t0).map(|(_, d)| d));
            kv_errors += e;
        }
        kv.sort();
        println!(
            "row=defaults protocol={protocol} streams={} write_ms={} {} kv_writes={} kv_p50_ms={} kv_p99_ms={} kv_max_ms={} kv_errors={kv_errors}",
            targets.len(),
            ms(ack),
            spread(
                done.iter()
                    .map(|d| d.saturating_duration_since(t0))
                    .collect()
            ),
            kv.len(),
            ms(pct(&kv, 0.5)),
            ms(pct(&kv, 0.99)),
            ms(pct(&kv, 1.0)),
        );
    }
    let errors = shared.errors.load(Ordering::Relaxed);
    let ended = live(&streams).len();
    eprintln!(
        "  {} pushes in all; {errors} streams ended with an error; {ended} of {n} streams live at the end",
        shared.pushes.load(Ordering::Relaxed)
    );
    if let Some(s) = streams.iter().find_map(|s| s.state.lock().error.clone()) {
        eprintln!("  first stream error: {s}");
    }
    Ok(())
}
