//! Cost of `?merge-central-config`: `/v1/health/connect/web` for 100 proxy
//! instances with 10 upstreams each, merged and unmerged, against one real
//! server. Prints requests/s and latency percentiles for each.
//!
//! Run it on a release build (the figures are meaningless otherwise):
//! `cargo test --release --test merge_bench -- --ignored --nocapture`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const PROXIES: usize = 100;
const UPSTREAMS: usize = 10;
const CONCURRENCY: usize = 4;
const RUN: Duration = Duration::from_secs(5);

async fn put(c: &reqwest::Client, p: &Proc, path: &str, body: &Value) -> u16 {
    c.put(p.url(path))
        .json(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Requests `url` from `CONCURRENCY` clients for `RUN`; (req/s, p50, p99).
async fn load(c: &reqwest::Client, url: String) -> (f64, Duration, Duration) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while started.elapsed() < RUN {
                let t = Instant::now();
                let r = c.get(&url).send().await.unwrap();
                assert!(r.status().is_success());
                let _ = r.bytes().await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort();
    let pct = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    (all.len() as f64 / secs, pct(0.50), pct(0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run on a release build with --ignored"]
async fn health_connect_merge_cost() {
    let p = Proc::dev();
    let c = client();
    eventually(Duration::from_secs(20), "a leader", || async {
        leader_of(&c, &p).await
    })
    .await;

    let mut entries = vec![
        json!({ "Kind": "proxy-defaults", "Name": "global", "Mode": "direct",
                "MeshGateway": { "Mode": "local" },
                "Config": { "protocol": "tcp", "handshake_timeout_ms": 1000 } }),
        json!({ "Kind": "service-defaults", "Name": "web", "Protocol": "http",
                "UpstreamConfig": {
                    "Defaults": { "ConnectTimeoutMs": 500, "Limits": { "MaxConnections": 512 } },
                    "Overrides": [ { "Name": "up-0", "Protocol": "grpc" } ] } }),
    ];
    for u in 0..UPSTREAMS {
        entries.push(
            json!({ "Kind": "service-defaults", "Name": format!("up-{u}"), "Protocol": "http" }),
        );
    }
    for e in &entries {
        assert_eq!(put(&c, &p, "/v1/config", e).await, 200);
    }
    let upstreams: Vec<Value> = (0..UPSTREAMS)
        .map(|u| json!({ "DestinationName": format!("up-{u}"), "LocalBindPort": 9000 + u }))
        .collect();
    for i in 0..PROXIES {
        let reg = json!({
            "Node": format!("node-{i}"), "Address": format!("10.0.{}.{}", i / 250, i % 250 + 1),
            "Service": { "Kind": "connect-proxy", "ID": "web-proxy", "Service": "web-proxy",
                         "Port": 21000,
                         "Proxy": { "DestinationServiceName": "web", "Upstreams": upstreams } }
        });
        let status = put(&c, &p, "/v1/catalog/register", &reg).await;
        if i == 0 && (status == 404 || status == 405) {
            eprintln!("no /v1/catalog/register on this build ({status}); benchmark skipped");
            return;
        }
        assert_eq!(status, 200);
    }

    let plain = p.url("/v1/health/connect/web");
    let merged = p.url("/v1/health/connect/web?merge-central-config");
    let rows: Vec<Value> = c.get(&merged).send().await.unwrap().json().await.unwrap();
    assert_eq!(rows.len(), PROXIES);
    assert_eq!(
        rows[0]["Service"]["Proxy"]["Upstreams"][0]["Config"]["protocol"], "grpc",
        "the read is really merged"
    );
    // Warm both paths up before measuring.
    load(&c, plain.clone()).await;
    let (rps_p, p50_p, p99_p) = load(&c, plain).await;
    let (rps_m, p50_m, p99_m) = load(&c, merged).await;
    eprintln!(
        "health/connect/web, {PROXIES} proxies x {UPSTREAMS} upstreams, {CONCURRENCY} clients, {RUN:?} each"
    );
    eprintln!("  unmerged: {rps_p:8.0} req/s  p50 {p50_p:?}  p99 {p99_p:?}");
    eprintln!("  merged:   {rps_m:8.0} req/s  p50 {p50_m:?}  p99 {p99_m:?}");
    eprintln!(
        "  merged/unmerged: throughput x{:.2}, p99 x{:.2}",
        rps_p / rps_m,
        p99_m.as_secs_f64() / p99_p.as_secs_f64()
    );
}
