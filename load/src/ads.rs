//! A Delta ADS client that behaves as Envoy does, shared by the xDS
//! benchmark (`examples/xds_bench.rs`, which includes this file) and the
//! load tool's `scale` scenario (`cairn-load scale`): wildcard CDS and LDS,
//! then EDS and RDS for the names those carry; every push decoded and
//! ACKed; per stream what it holds and when each resource arrived. Kept to
//! what both use, so neither copies the other.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
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
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::mpsc;
use tonic::transport::Channel;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str = "envoy.filters.network.http_connection_manager";

/// What one stream holds, as Envoy would: resources by type and name, and
/// when each arrived.
#[derive(Default)]
pub struct StreamState {
    /// EDS cluster name → the name its endpoints are subscribed under.
    pub clusters: HashMap<String, Option<String>>,
    /// Listener → the route configuration it names (RDS), if any.
    pub listeners: HashMap<String, Option<String>>,
    pub eds_subs: BTreeSet<String>,
    pub rds_subs: BTreeSet<String>,
    /// Endpoints per load assignment ("ip:port"), and when it arrived.
    pub eds: HashMap<String, (Instant, Vec<String>)>,
    pub rds: BTreeSet<String>,
    pub cds_at: Option<Instant>,
    pub lds_at: Option<Instant>,
    /// Whether the public listener is HTTP, and since when.
    pub public_http: Option<(bool, Instant)>,
    /// When it first held every resource it subscribed to.
    pub complete_at: Option<Instant>,
    pub error: Option<String>,
    pub ended: bool,
}

impl StreamState {
    pub fn complete(&self) -> bool {
        self.cds_at.is_some()
            && self.lds_at.is_some()
            && self.eds_subs.iter().all(|n| self.eds.contains_key(n))
            && self.rds_subs.iter().all(|n| self.rds.contains(n))
    }
}

pub struct Stream {
    /// The caller's number for the proxy.
    pub proxy: usize,
    /// The proxy's service ID (Envoy's node id) and its catalog node.
    pub id: String,
    pub node: String,
    pub state: Mutex<StreamState>,
    /// Set before its proxy is deregistered: its end is expected.
    pub retiring: AtomicBool,
}

impl Stream {
    pub fn new(proxy: usize, id: String, node: String) -> Arc<Stream> {
        Arc::new(Stream {
            proxy,
            id,
            node,
            state: Mutex::new(StreamState::default()),
            retiring: AtomicBool::new(false),
        })
    }
}

/// Counters every stream shares.
#[derive(Default)]
pub struct Shared {
    pub pushes: AtomicU64,
    /// Milliseconds since `epoch` of the last push any stream received.
    pub last_push_ms: AtomicU64,
    pub retries: AtomicUsize,
    pub errors: AtomicUsize,
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
pub async fn run_stream(channel: Channel, s: Arc<Stream>, shared: Arc<Shared>, epoch: Instant) {
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
        id: s.id.clone(),
        cluster: s.id.clone(),
        // consul-dataplane names the proxy's node so.
        metadata: Some(Struct {
            fields: [(
                "node_name".to_string(),
                Value {
                    kind: Some(Kind::StringValue(s.node.clone())),
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

// ------------------------------------------------------------------ figures

pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

pub fn spread(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "p50_ms={} p99_ms={} max_ms={}",
        ms(pct(&v, 0.5)),
        ms(pct(&v, 0.99)),
        ms(pct(&v, 1.0))
    )
}

/// Polls until `done` gives every stream's time (`Some`), or the timeout.
pub async fn until_all(
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
pub async fn settle(shared: &Shared, epoch: Instant, quiet: Duration, timeout: Duration) {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        let last = epoch + Duration::from_millis(shared.last_push_ms.load(Ordering::Relaxed));
        if last.elapsed() >= quiet {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn live(streams: &[Arc<Stream>]) -> Vec<Arc<Stream>> {
    streams
        .iter()
        .filter(|s| !s.retiring.load(Ordering::Relaxed) && !s.state.lock().ended)
        .cloned()
        .collect()
}
