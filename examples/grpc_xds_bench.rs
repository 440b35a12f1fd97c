//! The proxyless gRPC xDS benchmark (issue 38, "Performance"), run by
//! `make bench` (`scripts/bench.sh`, part `xds`) against a real `cairn
//! server`: `cargo run --release --example grpc_xds_bench -- --http A
//! --grpc B --clients N`.
//!
//! It registers a service `target` (three instances) and N client
//! instances, then opens one state-of-the-world ADS stream per client over
//! a few multiplexed HTTP/2 connections and behaves as gRPC's xDS client
//! does: the listener `target` by name, then the route it names, the
//! clusters the route names and their endpoints; every response decoded
//! and ACKed.
//!
//! Rows, one `key=value` line each on stdout (progress on stderr):
//! - `initial`: every client holds the target's endpoints;
//! - `eds`: one target instance's check turns critical → every client's
//!   endpoints are without it (p50/p99/max over all clients and runs),
//!   then passing again → with it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{Node, address, socket_address};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
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
const TARGET: &str = "target";

#[derive(Parser, Debug)]
struct Args {
    /// The server's HTTP address.
    #[arg(long, default_value = "127.0.0.1:8500")]
    http: String,
    /// The server's gRPC (xDS) address.
    #[arg(long, default_value = "127.0.0.1:8502")]
    grpc: String,
    /// Proxyless clients registered, one SotW stream each.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Instances of the target service.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// HTTP/2 connections the streams are multiplexed over.
    #[arg(long, default_value_t = 16)]
    conns: usize,
    /// Check flips measured in the `eds` row.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// How long any one wait may take before the row fails, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

fn instance_addr(i: usize) -> String {
    format!("10.38.0.{}:{}", 1 + i, 9000 + i)
}

/// What one client holds: the target's endpoints and when they last changed.
#[derive(Default)]
struct Held {
    endpoints: Option<(Instant, BTreeSet<String>)>,
    error: Option<String>,
}

/// One client's stream, as gRPC's xDS client runs it.
async fn client(ch: Channel, id: String, held: Arc<Mutex<Held>>) {
    let (tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
    let node = Node {
        id: id.clone(),
        ..Default::default()
    };
    let request = |type_url: &str, names: &BTreeSet<String>, r: Option<&DiscoveryResponse>| {
        DiscoveryRequest {
            node: Some(node.clone()),
            type_url: type_url.to_string(),
            resource_names: names.iter().cloned().collect(),
            version_info: r.map(|r| r.version_info.clone()).unwrap_or_default(),
            response_nonce: r.map(|r| r.nonce.clone()).unwrap_or_default(),
            ..Default::default()
        }
    };
    let mut names = [
        BTreeSet::from([TARGET.to_string()]),
        BTreeSet::new(),
        BTreeSet::new(),
        BTreeSet::new(),
    ];
    let _ = tx.send(request(LDS, &names[0], None));
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut ads = AggregatedDiscoveryServiceClient::new(ch)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let mut inbound = match ads.stream_aggregated_resources(outbound).await {
        Ok(r) => r.into_inner(),
        Err(e) => {
            held.lock().error = Some(e.to_string());
            return;
        }
    };
    loop {
        let resp = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                held.lock().error = Some(e.to_string());
                return;
            }
        };
        // What the response names next: (the type to subscribe, its names).
        let mut next: Option<(usize, &str, BTreeSet<String>)> = None;
        match resp.type_url.as_str() {
            LDS => {
                let mut routes = BTreeSet::new();
                for a in &resp.resources {
                    let Ok(l) = Listener::decode(a.value.as_slice()) else {
                        continue;
                    };
                    let Some(api) = l.api_listener.and_then(|a| a.api_listener) else {
                        continue;
                    };
                    if let Ok(hcm) = HttpConnectionManager::decode(api.value.as_slice())
                        && let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier
                    {
                        routes.insert(rds.route_config_name);
                    }
                }
                next = Some((1, RDS, routes));
            }
            RDS => {
                let mut clusters = BTreeSet::new();
                for a in &resp.resources {
                    let Ok(rc) = RouteConfiguration::decode(a.value.as_slice()) else {
                        continue;
                    };
                    for r in rc.virtual_hosts.iter().flat_map(|v| &v.routes) {
                        let Some(route::Action::Route(action)) = &r.action else {
                            continue;
                        };
                        match &action.cluster_specifier {
                            Some(route_action::ClusterSpecifier::Cluster(c)) => {
                                clusters.insert(c.clone());
                            }
                            Some(route_action::ClusterSpecifier::WeightedClusters(w)) => {
                                clusters.extend(w.clusters.iter().map(|c| c.name.clone()));
                            }
                            _ => {}
                        }
                    }
                }
                next = Some((2, CDS, clusters));
            }
            CDS => {
                let eds = resp
                    .resources
                    .iter()
                    .filter_map(|a| Cluster::decode(a.value.as_slice()).ok())
                    .map(|c| {
                        c.eds_cluster_config
                            .map(|e| e.service_name)
                            .filter(|s| !s.is_empty())
                            .unwrap_or(c.name)
                    })
                    .collect();
                next = Some((3, EDS, eds));
            }
            EDS => {
                let mut set = BTreeSet::new();
                for a in &resp.resources {
                    let Ok(cla) = ClusterLoadAssignment::decode(a.value.as_slice()) else {
                        continue;
                    };
                    for e in cla.endpoints.iter().flat_map(|l| &l.lb_endpoints) {
                        if let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier
                            && let Some(address::Address::SocketAddress(sa)) =
                                ep.address.as_ref().and_then(|a| a.address.as_ref())
                            && let Some(socket_address::PortSpecifier::PortValue(p)) =
                                sa.port_specifier
                        {
                            set.insert(format!("{}:{p}", sa.address));
                        }
                    }
                }
                held.lock().endpoints = Some((Instant::now(), set));
            }
            _ => {}
        }
        let i = [LDS, RDS, CDS, EDS]
            .iter()
            .position(|t| *t == resp.type_url)
            .unwrap_or(0);
        let _ = tx.send(request(&resp.type_url, &names[i], Some(&resp)));
        if let Some((k, ty, want)) = next
            && want != names[k]
        {
            names[k] = want;
            let _ = tx.send(request(ty, &names[k], None));
        }
    }
}

async fn put(
    http: &reqwest::Client, base: &str, path: &str, body: serde_json::Value,
) -> Result<()> {
    let r = http
        .put(format!("{base}{path}"))
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

fn target_instance(i: usize, status: &str) -> serde_json::Value {
    let (addr, port) = instance_addr(i)
        .rsplit_once(':')
        .map(|(a, p)| (a.to_string(), p.parse::<u16>().unwrap_or(0)))
        .unwrap_or_default();
    json!({"Node": format!("target-{i}"), "Address": addr,
           "Service": {"ID": format!("target-{i}"), "Service": TARGET, "Port": port},
           "Checks": [{"Node": format!("target-{i}"), "CheckID": format!("target-{i}-alive"),
                       "Name": "alive", "ServiceID": format!("target-{i}"), "Status": status}]})
}

/// Polls until every client's endpoints satisfy `ok`; each one's time.
async fn until_all(
    held: &[Arc<Mutex<Held>>], timeout: Duration, what: &str,
    ok: impl Fn(&BTreeSet<String>) -> bool,
) -> Result<Vec<Instant>> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut times = Vec::with_capacity(held.len());
        for h in held {
            let h = h.lock();
            if let Some(e) = &h.error {
                bail!("a stream failed: {e}");
            }
            match &h.endpoints {
                Some((at, set)) if ok(set) => times.push(*at),
                _ => break,
            }
        }
        if times.len() == held.len() {
            return Ok(times);
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: {} of {} clients within {timeout:?}",
                times.len(),
                held.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn spread(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
    format!(
        "p50_ms={} p99_ms={} max_ms={}",
        ms(pct(&v, 0.5)),
        ms(pct(&v, 0.99)),
        ms(pct(&v, 1.0))
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let timeout = Duration::from_secs(args.timeout);
    let http = cairn::tls::http_client()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()?;
    let base = format!("http://{}", args.http);
    for i in 0..args.instances {
        put(
            &http,
            &base,
            "/v1/catalog/register",
            target_instance(i, "passing"),
        )
        .await?;
    }
    let bodies = (0..args.clients).map(|c| {
        json!({"Node": format!("clients-{:04}", c / 20), "Address": "10.38.1.1",
               "Service": {"ID": format!("client-{c}"), "Service": "client", "Port": 1}})
    });
    let registered: Vec<Result<()>> = futures_util::stream::iter(bodies)
        .map(|b| put(&http, &base, "/v1/catalog/register", b))
        .buffer_unordered(64)
        .collect()
        .await;
    registered.into_iter().collect::<Result<()>>()?;
    eprintln!(
        "registered {} clients and {} instances",
        args.clients, args.instances
    );

    let mut channels = Vec::new();
    for _ in 0..args.conns.max(1) {
        channels.push(
            Endpoint::from_shared(format!("http://{}", args.grpc))?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| format!("gRPC {}", args.grpc))?,
        );
    }
    let held: Vec<Arc<Mutex<Held>>> = (0..args.clients).map(|_| Arc::default()).collect();
    let all: BTreeSet<String> = (0..args.instances).map(instance_addr).collect();
    let start = Instant::now();
    for (c, h) in held.iter().enumerate() {
        let ch = channels[c % channels.len()].clone();
        tokio::spawn(client(ch, format!("client-{c}"), h.clone()));
    }
    until_all(&held, timeout, "initial endpoints", |s| *s == all).await?;
    println!(
        "row=initial clients={} secs={:.2}",
        args.clients,
        start.elapsed().as_secs_f64()
    );

    let mut out = Vec::new();
    let mut back = Vec::new();
    for run in 0..args.runs {
        let victim = run % args.instances;
        let gone = instance_addr(victim);
        let t0 = Instant::now();
        put(
            &http,
            &base,
            "/v1/catalog/register",
            target_instance(victim, "critical"),
        )
        .await?;
        let times = until_all(&held, timeout, "the critical instance gone", |s| {
            !s.contains(&gone) && s.len() == args.instances - 1
        })
        .await?;
        out.extend(times.iter().map(|t| t.saturating_duration_since(t0)));
        let t1 = Instant::now();
        put(
            &http,
            &base,
            "/v1/catalog/register",
            target_instance(victim, "passing"),
        )
        .await?;
        let times = until_all(&held, timeout, "the instance back", |s| *s == all).await?;
        back.extend(times.iter().map(|t| t.saturating_duration_since(t1)));
        eprintln!("run {run}: done");
    }
    println!(
        "row=eds clients={} runs={} {} back_{}",
        args.clients,
        args.runs,
        spread(out),
        spread(back).replace(' ', " back_")
    );
    Ok(())
}
