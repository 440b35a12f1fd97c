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
//! arrived is recorded (the client is `load/src/ads.rs`, which the load
//! tool's `scale` scenario shares). A separate binary of the main crate:
//! it registers through the server's own HTTP client.
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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures_util::StreamExt;
use serde_json::json;
use tonic::transport::Endpoint;

// The Envoy-like ADS client, shared with the load tool's `scale` scenario.
#[path = "../load/src/ads.rs"]
mod ads;
use ads::{Shared, Stream, live, ms, pct, rss_kib, run_stream, settle, spread, until_all};

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
        .map(|p| Stream::new(p, proxy_id(p), node(p)))
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
