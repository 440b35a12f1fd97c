//! The ingress gateway benchmark (issue 38, "Performance"), run by `make
//! bench` (`scripts/bench.sh`, part `xds`) against a real `cairn server`:
//! `cargo run --release --example ingress_bench -- --http A --grpc B --services N`.
//!
//! It makes every service http (`proxy-defaults`), registers N services
//! (an application instance and its sidecar each) and one ingress
//! gateway, opens one Delta ADS stream as the gateway (behaving as Envoy:
//! wildcard CDS and LDS, EDS and RDS for the names those carry, every push
//! decoded and ACKed), then writes the gateway's `ingress-gateway` entry:
//! one http listener serving all N services. Timed from that write until
//! the stream holds N clusters, their endpoints, the listener and its
//! route configuration with a virtual host per service; then the same for
//! rewrites of the entry that change every service's request headers.
//!
//! Rows, one `key=value` line each on stdout (progress on stderr):
//! - `ingress`: the first entry write → the gateway holds it all;
//!   `update_*`: each rewrite → the gateway holds the new routes.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter::ConfigType};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
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
use tonic::transport::Endpoint;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str = "envoy.filters.network.http_connection_manager";
const GATEWAY: &str = "ingress";
const GATEWAY_NODE: &str = "ingress-node";
const PORT: u16 = 8080;
/// Services (application and sidecar) per catalog node.
const PER_NODE: usize = 20;

#[derive(Parser, Debug)]
struct Args {
    /// The server's HTTP address.
    #[arg(long, default_value = "127.0.0.1:8500")]
    http: String,
    /// The server's gRPC (xDS) address.
    #[arg(long, default_value = "127.0.0.1:8502")]
    grpc: String,
    /// Services the gateway's listener serves.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Rewrites of the entry measured after the first write.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// How long any one wait may take, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

fn svc(s: usize) -> String {
    format!("svc-{s:04}")
}

/// What the gateway's stream holds, as Envoy would.
#[derive(Default)]
struct Held {
    clusters: BTreeSet<String>,
    eds_subs: BTreeSet<String>,
    eds: BTreeSet<String>,
    /// Listener → the route configuration it names.
    listeners: HashMap<String, Option<String>>,
    rds_subs: BTreeSet<String>,
    /// Route configuration → its virtual hosts and the request header
    /// every one of them adds (the rewrite's mark), if they all agree.
    rds: HashMap<String, (usize, Option<String>)>,
    /// When anything last arrived.
    last: Option<Instant>,
    error: Option<String>,
}

impl Held {
    /// Everything of an entry with `n` services whose hosts all carry
    /// `mark` (`None`: no header), held.
    fn complete(&self, n: usize, mark: Option<&str>) -> bool {
        self.clusters.len() >= n
            && self.eds_subs.iter().all(|c| self.eds.contains(c))
            && self.listeners.values().flatten().count() == 1
            && self.rds_subs.iter().all(|r| {
                self.rds
                    .get(r)
                    .is_some_and(|(hosts, m)| *hosts == n && m.as_deref() == mark)
            })
            && !self.rds_subs.is_empty()
    }
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

/// Takes in one push; returns the subscription changes Envoy would send.
fn on_push(held: &mut Held, resp: &DeltaDiscoveryResponse) -> Vec<DeltaDiscoveryRequest> {
    let mut out = Vec::new();
    match resp.type_url.as_str() {
        CDS => {
            held.clusters
                .extend(resp.resources.iter().map(|r| r.name.clone()));
            for n in &resp.removed_resources {
                held.clusters.remove(n);
            }
            let want = held.clusters.clone();
            out.extend(resubscribe(EDS, &mut held.eds_subs, want));
            held.eds.retain(|n| held.eds_subs.contains(n));
        }
        EDS => {
            held.eds
                .extend(resp.resources.iter().map(|r| r.name.clone()));
            for n in &resp.removed_resources {
                held.eds.remove(n);
            }
        }
        LDS => {
            for r in &resp.resources {
                let Some(l) = r
                    .resource
                    .as_ref()
                    .and_then(|a| Listener::decode(a.value.as_slice()).ok())
                else {
                    continue;
                };
                let rds = l
                    .filter_chains
                    .iter()
                    .flat_map(|fc| fc.filters.iter())
                    .filter(|f| f.name == HCM)
                    .find_map(|f| match &f.config_type {
                        Some(ConfigType::TypedConfig(any)) => {
                            match HttpConnectionManager::decode(any.value.as_slice())
                                .ok()?
                                .route_specifier
                            {
                                Some(RouteSpecifier::Rds(r)) => Some(r.route_config_name),
                                _ => None,
                            }
                        }
                        _ => None,
                    });
                held.listeners.insert(r.name.clone(), rds);
            }
            for n in &resp.removed_resources {
                held.listeners.remove(n);
            }
            let want = held.listeners.values().flatten().cloned().collect();
            out.extend(resubscribe(RDS, &mut held.rds_subs, want));
        }
        RDS => {
            for r in &resp.resources {
                let Some(rc) = r
                    .resource
                    .as_ref()
                    .and_then(|a| RouteConfiguration::decode(a.value.as_slice()).ok())
                else {
                    continue;
                };
                let marks: BTreeSet<Option<String>> = rc
                    .virtual_hosts
                    .iter()
                    .map(|v| {
                        v.request_headers_to_add
                            .iter()
                            .find_map(|h| h.header.as_ref().filter(|h| h.key == "x-bench"))
                            .map(|h| h.value.clone())
                    })
                    .collect();
                let mark = (marks.len() == 1)
                    .then(|| marks.into_iter().next().flatten())
                    .flatten();
                held.rds
                    .insert(r.name.clone(), (rc.virtual_hosts.len(), mark));
            }
            for n in &resp.removed_resources {
                held.rds.remove(n);
            }
        }
        _ => {}
    }
    held.last = Some(Instant::now());
    out
}

/// The gateway's stream, until the server ends it.
async fn stream(grpc: String, held: Arc<Mutex<Held>>) -> Result<()> {
    let channel = Endpoint::from_shared(format!("http://{grpc}"))?
        .tcp_nodelay(true)
        .initial_connection_window_size(Some(64 << 20))
        .initial_stream_window_size(Some(16 << 20))
        .connect()
        .await
        .with_context(|| format!("gRPC {grpc}"))?;
    let (tx, rx) = mpsc::unbounded_channel::<DeltaDiscoveryRequest>();
    let node = Node {
        id: GATEWAY.into(),
        cluster: GATEWAY.into(),
        metadata: Some(Struct {
            fields: [(
                "node_name".to_string(),
                Value {
                    kind: Some(Kind::StringValue(GATEWAY_NODE.into())),
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
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(256 << 20);
    let mut inbound = client
        .delta_aggregated_resources(outbound)
        .await?
        .into_inner();
    while let Some(resp) = inbound.message().await? {
        let subs = on_push(&mut held.lock(), &resp);
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

async fn put(
    client: &reqwest::Client, base: &str, path: &str, body: serde_json::Value,
) -> Result<()> {
    let r = client
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

/// The gateway's entry: one http listener serving every service, each
/// adding header `x-bench: mark` when a mark is given.
fn entry(n: usize, mark: Option<&str>) -> serde_json::Value {
    let services: Vec<_> = (0..n)
        .map(|s| match mark {
            Some(m) => json!({"Name": svc(s), "RequestHeaders": {"Add": {"x-bench": m}}}),
            None => json!({"Name": svc(s)}),
        })
        .collect();
    json!({"Kind": "ingress-gateway", "Name": GATEWAY,
           "Listeners": [{"Port": PORT, "Protocol": "http", "Services": services}]})
}

/// Waits until the stream holds the entry (`n` services, `mark`).
async fn until_held(
    held: &Mutex<Held>, n: usize, mark: Option<&str>, timeout: Duration,
) -> Result<Instant> {
    let until = Instant::now() + timeout;
    loop {
        {
            let h = held.lock();
            if let Some(e) = &h.error {
                bail!("the gateway's stream ended: {e}");
            }
            if h.complete(n, mark) {
                return Ok(h.last.unwrap_or_else(Instant::now));
            }
        }
        if Instant::now() > until {
            let h = held.lock();
            bail!(
                "after {timeout:?} the gateway holds {} clusters, {} of {} endpoints, routes {:?}",
                h.clusters.len(),
                h.eds.len(),
                h.eds_subs.len(),
                h.rds
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.services;
    let timeout = Duration::from_secs(args.timeout);
    let client = cairn::tls::http_client()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()?;
    let base = format!("http://{}", args.http);
    eprintln!(
        "ingress bench: one gateway, {n} http services, on {}",
        args.grpc
    );

    put(
        &client,
        &base,
        "/v1/config",
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
    )
    .await?;
    let t = Instant::now();
    let bodies = (0..n).flat_map(|s| {
        let node = format!("ing-{:04}", s / PER_NODE);
        let addr = format!("10.1.{}.{}", (s / PER_NODE) / 256, (s / PER_NODE) % 256);
        let port = 21000 + s % PER_NODE;
        [
            json!({"Node": node, "Address": addr,
                   "Service": {"ID": format!("app-{s}"), "Service": svc(s), "Port": 8000 + s % PER_NODE}}),
            json!({"Node": node, "Address": addr,
                   "Service": {"ID": format!("proxy-{s}"), "Service": format!("{}-sidecar-proxy", svc(s)),
                               "Kind": "connect-proxy", "Port": port,
                               "Proxy": {"DestinationServiceName": svc(s), "LocalServicePort": 8000 + s % PER_NODE}}}),
        ]
    });
    let results: Vec<Result<()>> = futures_util::stream::iter(bodies)
        .map(|b| put(&client, &base, "/v1/catalog/register", b))
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect::<Result<()>>()?;
    put(&client, &base, "/v1/catalog/register",
        json!({"Node": GATEWAY_NODE, "Address": "10.9.9.9",
               "Service": {"ID": GATEWAY, "Service": GATEWAY, "Kind": "ingress-gateway", "Port": 8443}})).await?;
    eprintln!(
        "  registered {n} services with sidecars and the gateway in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let held = Arc::new(Mutex::new(Held::default()));
    let h = held.clone();
    let grpc = args.grpc.clone();
    tokio::spawn(async move {
        // A stream opened before the gateway's snapshot is built is
        // refused: open it again, as Envoy would.
        loop {
            match stream(grpc.clone(), h.clone()).await {
                Err(e) if h.lock().last.is_none() => {
                    eprintln!("  gateway stream refused ({e}), retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    h.lock().error = Some(e.to_string());
                    return;
                }
                Ok(()) => {
                    h.lock().error = Some("closed by the server".into());
                    return;
                }
            }
        }
    });
    // Let the sidecars' and the gateway's snapshots settle first.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let t0 = Instant::now();
    put(&client, &base, "/v1/config", entry(n, None)).await?;
    let ack = t0.elapsed();
    let done = until_held(&held, n, None, timeout).await?;
    let (clusters, eds) = {
        let h = held.lock();
        (h.clusters.len(), h.eds.len())
    };
    println!(
        "row=ingress services={n} write_ms={:.1} secs={:.3} clusters={clusters} endpoints={eds}",
        ack.as_secs_f64() * 1e3,
        done.duration_since(t0).as_secs_f64()
    );
    let mut times = Vec::new();
    for run in 0..args.runs {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mark = format!("run-{run}");
        let t0 = Instant::now();
        put(&client, &base, "/v1/config", entry(n, Some(&mark))).await?;
        let done = until_held(&held, n, Some(&mark), timeout).await?;
        times.push(done.duration_since(t0).as_secs_f64());
    }
    if !times.is_empty() {
        let max = times.iter().cloned().fold(0.0, f64::max);
        let all: Vec<String> = times.iter().map(|t| format!("{:.0}", t * 1e3)).collect();
        println!(
            "row=ingress_update services={n} runs={} max_ms={:.1} each_ms={}",
            times.len(),
            max * 1e3,
            all.join(",")
        );
    }
    Ok(())
}
