//! Checker (j), on ACL seeds: no xDS stream hands a proxy a service's
//! identity (its leaf certificate and key) the proxy's token may not
//! `service:write`, nor endpoints of a service it may not `service:read`,
//! under the token's rules as its server had applied them; and after a
//! policy change every stream is narrowed again.
//!
//! - `setup`: what the admin writes: a mesh on node `mesh` (a sidecar
//!   `shop-sidecar-proxy` with upstreams `cart` and `ledger`; their
//!   sidecars; a terminating gateway `tgw` linking `stock`, `audit` and
//!   `depot`), and two tokens: the gateway's (`GATEWAY_RULES`: it may be
//!   `stock` and `depot`, never `audit`) and the sidecar's (`SIDECAR_RULES`: it may read
//!   `cart`, never `ledger`). `narrow`: the mid-run updates of both
//!   policies (the gateway may only read `stock`; the sidecar may no
//!   longer read `cart`).
//! - `proxy`: one client per proxy speaks Delta ADS over gRPC (tonic, the
//!   real gRPC port on simulated TCP) to a random server, ACKs every
//!   response, subscribes the clusters' endpoints, hops between servers
//!   during the faults and keeps its last stream from the heal to the
//!   end. Each push is recorded as the leaves it carries (the services
//!   the certificates' SPIFFE IDs name) and the services whose endpoints
//!   it lists (every address of the mesh maps to one service).
//! - `check`: a push must satisfy the rules the token had when the stream
//!   opened: the first ones, or the narrowed ones if its server had
//!   applied the narrowing by then (and not restarted since); what a
//!   stream holds at the end, on a server that applied the narrowing more
//!   than a second before, must satisfy the narrowed ones. The rules are
//!   written out by hand here, not through cairn's rules code. And the
//!   check is not passed by silence: the gateway held `stock`'s leaf and
//!   the sidecar `cart`'s endpoints before the narrowing, and each proxy
//!   ends with a live stream, answered, held to the narrowed rules.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::structs::acl::AclPolicy;
use cairn::xds::resources::{CLUSTER, ENDPOINT, LISTENER};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{Node, address};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::acl::{Access, AclLog, Tokens, token_of, until_acked};
use crate::node::{ApiRequest, Committed, GRPC_PORT, calls, now_us};

const GATEWAY_POLICY_ID: &str = "5e1f0000-0000-4000-8000-0000000000b3";
const SIDECAR_POLICY_ID: &str = "5e1f0000-0000-4000-8000-0000000000b4";

/// The terminating gateway's token: it is the gateway, `depot` and
/// `stock`, and reads the nodes; `audit`, linked too, it may neither be
/// nor read.
pub const GATEWAY_RULES: &str = r#"
service "tgw" { policy = "write" }
service "depot" { policy = "write" }
service "stock" { policy = "write" }
node_prefix "" { policy = "read" }
"#;

/// After the narrowing: `stock` only read, so its identity goes (`depot`
/// stays).
pub const GATEWAY_RULES_NARROWED: &str = r#"
service "tgw" { policy = "write" }
service "depot" { policy = "write" }
service "stock" { policy = "read" }
node_prefix "" { policy = "read" }
"#;

/// The sidecar's token: it is `shop`, reads `cart`; `ledger`, its other
/// upstream, it may not read.
pub const SIDECAR_RULES: &str = r#"
service "shop" { policy = "write" }
service "shop-sidecar-proxy" { policy = "write" }
service "cart" { policy = "read" }
node_prefix "" { policy = "read" }
"#;

/// After the narrowing: `cart` no longer read, so its endpoints go.
pub const SIDECAR_RULES_NARROWED: &str = r#"
service "shop" { policy = "write" }
service "shop-sidecar-proxy" { policy = "write" }
node_prefix "" { policy = "read" }
"#;

/// The two proxies the checker streams for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proxy {
    Gateway,
    Sidecar,
}

impl Proxy {
    pub const ALL: [Proxy; 2] = [Proxy::Gateway, Proxy::Sidecar];

    /// Its simulated host.
    pub fn host(self) -> &'static str {
        match self {
            Proxy::Gateway => "gateway",
            Proxy::Sidecar => "sidecar",
        }
    }

    /// Its service ID, the stream's `node.id`.
    fn id(self) -> &'static str {
        match self {
            Proxy::Gateway => "tgw",
            Proxy::Sidecar => "shop-sidecar-proxy",
        }
    }

    fn policy_id(self) -> &'static str {
        match self {
            Proxy::Gateway => GATEWAY_POLICY_ID,
            Proxy::Sidecar => SIDECAR_POLICY_ID,
        }
    }

    fn rules(self, narrowed: bool) -> &'static str {
        match (self, narrowed) {
            (Proxy::Gateway, false) => GATEWAY_RULES,
            (Proxy::Gateway, true) => GATEWAY_RULES_NARROWED,
            (Proxy::Sidecar, false) => SIDECAR_RULES,
            (Proxy::Sidecar, true) => SIDECAR_RULES_NARROWED,
        }
    }

    fn secret(self, t: &Tokens) -> &str {
        match self {
            Proxy::Gateway => &t.gateway,
            Proxy::Sidecar => &t.sidecar,
        }
    }

    fn accessor(self, t: &Tokens) -> &str {
        match self {
            Proxy::Gateway => &t.gateway_accessor,
            Proxy::Sidecar => &t.sidecar_accessor,
        }
    }

    /// The rules above written out by hand: whose leaf it may hold.
    fn may_write(self, narrowed: bool, service: &str) -> bool {
        match self {
            Proxy::Gateway => {
                service == "tgw" || service == "depot" || (service == "stock" && !narrowed)
            }
            Proxy::Sidecar => service == "shop",
        }
    }

    /// And whose endpoints it may be given.
    fn may_read(self, narrowed: bool, service: &str) -> bool {
        match self {
            Proxy::Gateway => ["tgw", "depot", "stock"].contains(&service),
            Proxy::Sidecar => service == "shop" || (service == "cart" && !narrowed),
        }
    }
}

/// The mesh: (service ID, its JSON registration on node `mesh`), every
/// instance at an address of its own (`SERVICE_OF` maps them back).
fn registrations() -> Vec<serde_json::Value> {
    let sidecar = |name: &str, ip: &str, upstreams: serde_json::Value| {
        serde_json::json!({
            "ID": format!("{name}-sidecar-proxy"), "Service": format!("{name}-sidecar-proxy"),
            "Kind": "connect-proxy", "Address": ip, "Port": 21000,
            "Proxy": {
                "DestinationServiceName": name, "DestinationServiceID": name,
                "LocalServicePort": 8080, "Upstreams": upstreams,
            },
        })
    };
    let plain = |name: &str, ip: &str| serde_json::json!({"ID": name, "Service": name, "Address": ip, "Port": 8080});
    let upstreams = serde_json::json!([
        {"DestinationName": "cart", "LocalBindPort": 9191},
        {"DestinationName": "ledger", "LocalBindPort": 9192},
    ]);
    vec![
        plain("shop", "10.9.2.1"),
        sidecar("shop", "10.9.2.1", upstreams),
        plain("cart", "10.9.1.2"),
        sidecar("cart", "10.9.0.2", serde_json::json!([])),
        plain("ledger", "10.9.1.3"),
        sidecar("ledger", "10.9.0.3", serde_json::json!([])),
        plain("stock", "10.9.1.4"),
        plain("audit", "10.9.1.5"),
        plain("depot", "10.9.1.6"),
        serde_json::json!({
            "ID": "tgw", "Service": "tgw", "Kind": "terminating-gateway",
            "Address": "10.9.3.1", "Port": 8443,
        }),
    ]
}

/// Every address the mesh's instances have, and whose it is.
const SERVICE_OF: [(&str, &str); 10] = [
    ("10.9.2.1", "shop"),
    ("10.9.1.2", "cart"),
    ("10.9.0.2", "cart"),
    ("10.9.1.3", "ledger"),
    ("10.9.0.3", "ledger"),
    ("10.9.1.4", "stock"),
    ("10.9.1.5", "audit"),
    ("10.9.1.6", "depot"),
    ("10.9.3.1", "tgw"),
    ("10.9.9.1", "mesh (the node)"),
];

/// What the admin writes for the checker (once the workload's tokens
/// exist).
pub fn setup(t: &Tokens) -> Vec<ApiRequest> {
    let mut writes = Vec::new();
    for p in Proxy::ALL {
        writes.push(calls::new_policy(policy(p, false)));
        writes.push(calls::new_token(token_of(
            p.accessor(t),
            p.secret(t),
            p.host(),
            p.policy_id(),
            p.host(),
        )));
    }
    for service in registrations() {
        let req = serde_json::json!({"Node": "mesh", "Address": "10.9.9.1", "Service": service});
        match serde_json::from_value(req) {
            Ok(r) => writes.push(calls::register(r)),
            Err(e) => panic!("the mesh's registration does not decode: {e}"),
        }
    }
    writes.push(calls::config_set(serde_json::json!({
        "Kind": "terminating-gateway", "Name": "tgw",
        "Services": [{"Name": "stock"}, {"Name": "audit"}, {"Name": "depot"}],
    })));
    writes
}

/// The mid-run updates of both proxies' policies.
pub fn narrow() -> Vec<ApiRequest> {
    Proxy::ALL
        .iter()
        .map(|&p| calls::update_policy(policy(p, true)))
        .collect()
}

fn policy(p: Proxy, narrowed: bool) -> AclPolicy {
    AclPolicy {
        id: p.policy_id().into(),
        name: p.host().into(),
        rules: p.rules(narrowed).into(),
        ..Default::default()
    }
}

/// One response a proxy took in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Push {
    pub proxy: Proxy,
    /// The proxy's stream (counted from 1) and the server it asked.
    pub stream: u64,
    pub server: usize,
    /// When the client opened that stream, and took this in (µs).
    pub opened: u64,
    pub at: u64,
    pub type_url: String,
    /// Whose leaves the pushed resources carry; whose endpoints they list.
    pub leaves: BTreeSet<String>,
    pub endpoints: BTreeSet<String>,
    /// What the checker could not place.
    pub unknown: Vec<String>,
}

/// How one stream ended, and what it held then.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamEnd {
    pub proxy: Proxy,
    pub stream: u64,
    pub server: usize,
    pub opened: u64,
    pub ended: u64,
    /// Open until the client's last moment (the run's end).
    pub live: bool,
    /// Why it ended otherwise.
    pub error: Option<String>,
    pub leaves: BTreeSet<String>,
    pub endpoints: BTreeSet<String>,
    /// Responses it took in.
    pub responses: usize,
}

/// What the admin and the proxies did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MeshRecord {
    /// When the mesh and its tokens were acknowledged.
    pub ready: Option<u64>,
    /// When both narrowings were acknowledged.
    pub narrowed: Option<u64>,
    pub pushes: Vec<Push>,
    pub streams: Vec<StreamEnd>,
}

impl MeshRecord {
    /// Both proxies have been given what the narrowing takes away.
    fn seen_before_narrowing(&self) -> bool {
        let leaf = |p: &Push| p.proxy == Proxy::Gateway && p.leaves.contains("stock");
        let endpoints = |p: &Push| p.proxy == Proxy::Sidecar && p.endpoints.contains("cart");
        self.pushes.iter().any(leaf) && self.pushes.iter().any(endpoints)
    }
}

pub type MeshLog = Arc<Mutex<MeshRecord>>;

/// The mesh's admin: writes `setup` once the workload's tokens exist,
/// then narrows both policies at `narrow_at` (drawn by the run), or later
/// once both proxies hold what it takes away, at the latest at `cap`.
pub async fn admin(
    access: Access, servers: Vec<IpAddr>, narrow_at: Duration, cap: Duration, until: Duration,
    log: MeshLog, acl_log: AclLog,
) -> turmoil::Result {
    let Some(t) = access.tokens().cloned() else {
        return Ok(());
    };
    access.workload().await;
    for cmd in setup(&t) {
        if !until_acked(&servers, cmd, until, &acl_log).await {
            return Ok(());
        }
    }
    log.lock().unwrap().ready = Some(now_us());
    loop {
        let now = turmoil::sim_elapsed().unwrap_or_default();
        if now >= cap || (now >= narrow_at && log.lock().unwrap().seen_before_narrowing()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for cmd in narrow() {
        if !until_acked(&servers, cmd, until, &acl_log).await {
            return Ok(());
        }
    }
    log.lock().unwrap().narrowed = Some(now_us());
    Ok(())
}

/// A proxy's client: streams until `until`, hopping to another random
/// server every 0.5-3 s until `settle`, then keeping its stream (or, if
/// one fails, the next) to the end.
pub async fn proxy(
    p: Proxy, access: Access, seed: u64, servers: Vec<IpAddr>, settle: Duration, until: Duration,
    log: MeshLog,
) -> turmoil::Result {
    let Some(t) = access.tokens().cloned() else {
        return Ok(());
    };
    let elapsed = || turmoil::sim_elapsed().unwrap_or_default();
    while log.lock().unwrap().ready.is_none() {
        if elapsed() >= until {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x3E5_0000 ^ p as u64);
    let mut n = 0;
    while elapsed() < until {
        n += 1;
        let server = rng.gen_range(0..servers.len());
        let now = elapsed();
        let deadline = if now < settle {
            (now + Duration::from_millis(rng.gen_range(500..3000))).min(until)
        } else {
            until
        };
        let s = Stream {
            proxy: p,
            n,
            server,
            opened: now_us(),
        };
        let last = deadline == until;
        let end = s
            .run(p.secret(&t), servers[server], deadline, last, &log)
            .await;
        let failed = end.error.is_some();
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("{} ms: mesh: {end:?}", now_us() / 1000);
        }
        log.lock().unwrap().streams.push(end);
        if failed {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await;
        }
    }
    Ok(())
}

struct Stream {
    proxy: Proxy,
    n: u64,
    server: usize,
    opened: u64,
}

/// What a stream holds: per resource type and name, the bytes; and how
/// many responses it took in.
#[derive(Default)]
struct Held {
    resources: BTreeMap<(String, String), Vec<u8>>,
    responses: usize,
}

impl Stream {
    /// One stream until `deadline` (or its failure); `last`: the run's end.
    async fn run(
        &self, token: &str, ip: IpAddr, deadline: Duration, last: bool, log: &MeshLog,
    ) -> StreamEnd {
        let mut held = Held::default();
        let error = self.follow(token, ip, deadline, log, &mut held).await.err();
        let resources = held.resources.iter();
        let (leaves, endpoints, _) = placed(resources.map(|((t, _), v)| (t.as_str(), &v[..])));
        StreamEnd {
            proxy: self.proxy,
            stream: self.n,
            server: self.server,
            opened: self.opened,
            ended: now_us(),
            live: error.is_none() && last,
            error,
            leaves,
            endpoints,
            responses: held.responses,
        }
    }

    async fn follow(
        &self, token: &str, ip: IpAddr, deadline: Duration, log: &MeshLog, held: &mut Held,
    ) -> Result<(), String> {
        let left = || deadline.saturating_sub(turmoil::sim_elapsed().unwrap_or_default());
        let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| async move {
            let s = turmoil::net::TcpStream::connect((ip, GRPC_PORT)).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
        });
        let endpoint = tonic::transport::Endpoint::from_static("http://cairn.sim")
            .connect_timeout(Duration::from_secs(1))
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(1))
            .keep_alive_while_idle(true);
        let channel = tokio::time::timeout(left(), endpoint.connect_with_connector(connector))
            .await
            .map_err(|_| "connect: deadline".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let (tx, rx) = tokio::sync::mpsc::channel::<DeltaDiscoveryRequest>(16);
        let node = Node {
            id: self.proxy.id().into(),
            cluster: self.proxy.id().into(),
            ..Default::default()
        };
        for (i, ty) in [CLUSTER, LISTENER].into_iter().enumerate() {
            let req = DeltaDiscoveryRequest {
                node: (i == 0).then(|| node.clone()),
                type_url: ty.into(),
                ..Default::default()
            };
            let _ = tx.try_send(req);
        }
        let requests =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        let mut req = tonic::Request::new(requests);
        let value = token.parse().map_err(|e| format!("token: {e}"))?;
        req.metadata_mut().insert(cairn::xds::TOKEN_METADATA, value);
        let opened = tokio::time::timeout(left(), client.delta_aggregated_resources(req));
        let mut responses = opened
            .await
            .map_err(|_| "open: deadline".to_string())?
            .map_err(|s| format!("open: {s}"))?
            .into_inner();
        let mut subscribed = BTreeSet::new();
        loop {
            let msg = match tokio::time::timeout(left(), responses.message()).await {
                Err(_) => return Ok(()), // its time on this server is up
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => return Err("closed by the server".into()),
                Ok(Err(s)) => return Err(format!("{s}")),
            };
            self.took_in(&msg, log, held);
            let ack = DeltaDiscoveryRequest {
                type_url: msg.type_url.clone(),
                response_nonce: msg.nonce.clone(),
                ..Default::default()
            };
            let _ = tx.send(ack).await;
            if msg.type_url == CLUSTER {
                let eds: BTreeSet<String> = held
                    .resources
                    .iter()
                    .filter(|((t, _), _)| t == CLUSTER)
                    .filter_map(|(_, v)| Cluster::decode(&v[..]).ok())
                    .filter_map(|c| {
                        let eds = c.eds_cluster_config?;
                        Some(if eds.service_name.is_empty() {
                            c.name
                        } else {
                            eds.service_name
                        })
                    })
                    .collect();
                let new: Vec<String> = eds.difference(&subscribed).cloned().collect();
                if !new.is_empty() {
                    subscribed.extend(new.iter().cloned());
                    let sub = DeltaDiscoveryRequest {
                        type_url: ENDPOINT.into(),
                        resource_names_subscribe: new,
                        ..Default::default()
                    };
                    let _ = tx.send(sub).await;
                }
            }
        }
    }

    /// Applies one response to what the stream holds, and records it.
    fn took_in(&self, msg: &DeltaDiscoveryResponse, log: &MeshLog, held: &mut Held) {
        held.responses += 1;
        for name in &msg.removed_resources {
            held.resources.remove(&(msg.type_url.clone(), name.clone()));
        }
        let mut pushed = Vec::new();
        for r in &msg.resources {
            let bytes = r
                .resource
                .as_ref()
                .map(|a| a.value.clone())
                .unwrap_or_default();
            (held.resources).insert((msg.type_url.clone(), r.name.clone()), bytes.clone());
            pushed.push(bytes);
        }
        let (leaves, endpoints, unknown) =
            placed(pushed.iter().map(|b| (msg.type_url.as_str(), &b[..])));
        let push = Push {
            proxy: self.proxy,
            stream: self.n,
            server: self.server,
            opened: self.opened,
            at: now_us(),
            type_url: msg.type_url.clone(),
            leaves,
            endpoints,
            unknown,
        };
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("{} ms: mesh: {push:?}", now_us() / 1000);
        }
        log.lock().unwrap().pushes.push(push);
    }
}

/// Whose leaves and endpoints `resources` (type, bytes) carry, and what
/// could not be placed.
fn placed<'a>(
    resources: impl Iterator<Item = (&'a str, &'a [u8])>,
) -> (BTreeSet<String>, BTreeSet<String>, Vec<String>) {
    let (mut leaves, mut endpoints, mut unknown) = (BTreeSet::new(), BTreeSet::new(), Vec::new());
    for (ty, bytes) in resources {
        leaves_in(bytes, &mut leaves, &mut unknown);
        let assignments: Vec<ClusterLoadAssignment> = match ty {
            t if t == ENDPOINT => ClusterLoadAssignment::decode(bytes)
                .ok()
                .into_iter()
                .collect(),
            t if t == CLUSTER => Cluster::decode(bytes)
                .ok()
                .and_then(|c| c.load_assignment)
                .into_iter()
                .collect(),
            _ => Vec::new(),
        };
        for cla in &assignments {
            for e in cla.endpoints.iter().flat_map(|t| &t.lb_endpoints) {
                let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    continue;
                };
                let Some(address::Address::SocketAddress(s)) =
                    ep.address.as_ref().and_then(|a| a.address.as_ref())
                else {
                    continue;
                };
                match SERVICE_OF.iter().find(|(ip, _)| *ip == s.address) {
                    Some((_, service)) => {
                        endpoints.insert(service.to_string());
                    }
                    // Loopback (the local app) and the like are no one's.
                    None if !s.address.starts_with("10.9.") => {}
                    None => unknown.push(format!("an endpoint at {}", s.address)),
                }
            }
        }
    }
    (leaves, endpoints, unknown)
}

/// The services whose leaf certificates `bytes` carry (PEM blocks, their
/// SPIFFE IDs' `/svc/<name>`), CA certificates left aside.
fn leaves_in(bytes: &[u8], leaves: &mut BTreeSet<String>, unknown: &mut Vec<String>) {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    let mut at = 0;
    while let Some(i) = find(&bytes[at..], BEGIN) {
        let start = at + i;
        at = start + BEGIN.len();
        let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(&bytes[start..]) else {
            unknown.push("a certificate that does not parse as PEM".into());
            continue;
        };
        let Ok(cert) = pem.parse_x509() else {
            unknown.push("a PEM block that is no certificate".into());
            continue;
        };
        if cert.is_ca() {
            continue;
        }
        let uris: Vec<String> = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        match uris.iter().find_map(|u| u.rsplit_once("/svc/")) {
            Some((_, service)) => {
                leaves.insert(service.to_string());
            }
            None => unknown.push(format!("a leaf with no service in its URIs {uris:?}")),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What checker (j) saw in one run.
#[derive(Debug, Clone, Default)]
pub struct MeshStats {
    pub pushes: usize,
    pub streams: usize,
    /// Pushes held to the narrowed rules (their server had applied them
    /// when the stream opened).
    pub strict_pushes: usize,
    /// Streams whose final holdings were held to the narrowed rules.
    pub ends_checked: usize,
    pub failures: Vec<String>,
}

/// The index at which `p`'s policy became the narrowed one.
fn narrowing_index(truth: &Committed, p: Proxy) -> Option<u64> {
    let key = cairn::state::acl::policy_key(p.policy_id());
    let narrowed = p.rules(true);
    truth
        .acl_rows
        .get(&key)?
        .iter()
        .find(|(_, rules)| rules.as_deref() == Some(narrowed))
        .map(|(&i, _)| i)
}

/// Server `s` held `index`'s change of `key` at `at`, in the life it was
/// in then: its state had it once assembled, or it applied it since.
fn applied_before(truth: &Committed, key: &str, index: u64, s: usize, at: u64) -> bool {
    let server = format!("s{}", s + 1);
    let Some(&(began, restored)) = truth
        .starts
        .get(&server)
        .and_then(|lives| lives.iter().rev().find(|(b, _)| *b <= at))
    else {
        return false;
    };
    restored >= index
        || truth
            .acl_applied_at
            .get(&(key.to_string(), index, server.clone()))
            .is_some_and(|times| times.iter().any(|&t| t >= began && t < at))
        || truth.installs.get(&server).is_some_and(|installs| {
            installs
                .iter()
                .any(|&(t, i)| i >= index && t >= began && t < at)
        })
}

/// Checker (j) on a finished run.
pub fn check(log: &MeshRecord, truth: &Committed, end: u64) -> MeshStats {
    let mut stats = MeshStats {
        pushes: log.pushes.len(),
        streams: log.streams.len(),
        ..Default::default()
    };
    let fail = |stats: &mut MeshStats, f: String| stats.failures.push(f);
    if log.ready.is_none() {
        fail(
            &mut stats,
            "mesh: the mesh's setup was never acknowledged".into(),
        );
        return stats;
    }
    if log.narrowed.is_none() {
        fail(
            &mut stats,
            "mesh: the narrowing was never acknowledged".into(),
        );
    }
    let narrowing: BTreeMap<Proxy, u64> = Proxy::ALL
        .iter()
        .filter_map(|&p| narrowing_index(truth, p).map(|i| (p, i)))
        .collect();
    let strict_at = |p: Proxy, server: usize, at: u64| {
        narrowing.get(&p).is_some_and(|&i| {
            applied_before(
                truth,
                &cairn::state::acl::policy_key(p.policy_id()),
                i,
                server,
                at,
            )
        })
    };
    let violations =
        |p: Proxy, narrowed: bool, leaves: &BTreeSet<String>, eps: &BTreeSet<String>| {
            let mut v: Vec<String> = leaves
                .iter()
                .filter(|s| !p.may_write(narrowed, s))
                .map(|s| format!("{s}'s leaf"))
                .collect();
            v.extend(
                eps.iter()
                    .filter(|s| !p.may_read(narrowed, s))
                    .map(|s| format!("{s}'s endpoints")),
            );
            v
        };
    for push in &log.pushes {
        for u in &push.unknown {
            fail(
                &mut stats,
                format!("mesh: {u} the checker cannot place: {push:?}"),
            );
        }
        let strict = strict_at(push.proxy, push.server, push.opened);
        stats.strict_pushes += strict as usize;
        let v = violations(push.proxy, strict, &push.leaves, &push.endpoints);
        if !v.is_empty() {
            fail(
                &mut stats,
                format!(
                    "mesh: s{} gave the {:?}'s stream {} (opened at {} µs{}) {}, which its token may not have: {push:?}",
                    push.server + 1,
                    push.proxy,
                    push.stream,
                    push.opened,
                    if strict {
                        ", after its server applied the narrowing"
                    } else {
                        ""
                    },
                    v.join(", ")
                ),
            );
        }
    }
    // What a stream still open at the end holds: narrowed, once its server
    // applied the narrowing more than a second before.
    for s in log.streams.iter().filter(|s| s.live) {
        let checked = strict_at(s.proxy, s.server, end.saturating_sub(1_000_000));
        stats.ends_checked += checked as usize;
        let v = violations(s.proxy, checked, &s.leaves, &s.endpoints);
        if !v.is_empty() {
            fail(
                &mut stats,
                format!(
                    "mesh: the {:?}'s stream {} on s{} still held {} at the end{}: {s:?}",
                    s.proxy,
                    s.stream,
                    s.server + 1,
                    v.join(", "),
                    if checked {
                        ", more than a second after its server applied the narrowing"
                    } else {
                        ""
                    },
                ),
            );
        }
    }
    // Not passed by silence.
    let seen =
        |p: Proxy, f: &dyn Fn(&Push) -> bool| log.pushes.iter().any(|x| x.proxy == p && f(x));
    if !seen(Proxy::Gateway, &|x| x.leaves.contains("stock")) {
        fail(
            &mut stats,
            "mesh: no progress: the gateway never held stock's leaf".into(),
        );
    }
    if !seen(Proxy::Sidecar, &|x| x.endpoints.contains("cart")) {
        fail(
            &mut stats,
            "mesh: no progress: the sidecar never held cart's endpoints".into(),
        );
    }
    for p in Proxy::ALL {
        let ended = |s: &&StreamEnd| s.proxy == p && s.live && s.responses > 0;
        let Some(last) = log.streams.iter().rev().find(ended) else {
            fail(
                &mut stats,
                format!("mesh: no progress: the {p:?} ended with no live stream answered"),
            );
            continue;
        };
        if !strict_at(p, last.server, end.saturating_sub(1_000_000)) {
            fail(
                &mut stats,
                format!(
                    "mesh: no progress: the {p:?}'s last stream (on s{}) was not held to the narrowed rules",
                    last.server + 1
                ),
            );
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(proxy: Proxy, server: usize, opened: u64, leaves: &[&str], eps: &[&str]) -> Push {
        Push {
            proxy,
            stream: 1,
            server,
            opened,
            at: opened + 1000,
            type_url: LISTENER.into(),
            leaves: leaves.iter().map(|s| s.to_string()).collect(),
            endpoints: eps.iter().map(|s| s.to_string()).collect(),
            unknown: Vec::new(),
        }
    }

    /// A run in which both policies narrowed at index 50, applied by s1 at
    /// 5 s; s2 restarted at 6 s from state before it and never applied it.
    fn truth() -> Committed {
        let mut t = Committed::default();
        for p in Proxy::ALL {
            let key = cairn::state::acl::policy_key(p.policy_id());
            let rows = t.acl_rows.entry(key.clone()).or_default();
            rows.insert(10, Some(p.rules(false).into()));
            rows.insert(50, Some(p.rules(true).into()));
            t.acl_applied_at
                .insert((key.clone(), 50, "s1".into()), vec![5_000_000]);
            t.acl_applied_at
                .insert((key, 50, "s2".into()), vec![5_500_000]);
        }
        t.starts.insert("s1".into(), vec![(0, 0)]);
        t.starts.insert("s2".into(), vec![(0, 0), (6_000_000, 40)]);
        t
    }

    fn record(pushes: Vec<Push>, ends: Vec<StreamEnd>) -> MeshRecord {
        let mut all = vec![
            push(Proxy::Gateway, 0, 1_000_000, &["stock", "tgw"], &["stock"]),
            push(Proxy::Sidecar, 0, 1_000_000, &["shop"], &["cart"]),
        ];
        all.extend(pushes);
        let end = |proxy| StreamEnd {
            proxy,
            stream: 2,
            server: 0,
            opened: 9_000_000,
            ended: 20_000_000,
            live: true,
            error: None,
            leaves: BTreeSet::new(),
            endpoints: BTreeSet::new(),
            responses: 2,
        };
        let mut streams = vec![end(Proxy::Gateway), end(Proxy::Sidecar)];
        streams.extend(ends);
        MeshRecord {
            ready: Some(500_000),
            narrowed: Some(5_000_000),
            pushes: all,
            streams,
        }
    }

    #[test]
    fn a_faithful_run_passes() {
        let s = check(&record(Vec::new(), Vec::new()), &truth(), 20_000_000);
        assert!(s.failures.is_empty(), "{:?}", s.failures);
        assert_eq!(s.ends_checked, 2);
    }

    #[test]
    fn a_leaf_or_endpoints_never_allowed_fail() {
        let r = record(
            vec![push(Proxy::Gateway, 1, 2_000_000, &["audit"], &[])],
            Vec::new(),
        );
        assert_eq!(check(&r, &truth(), 20_000_000).failures.len(), 1);
        let r = record(
            vec![push(Proxy::Sidecar, 1, 2_000_000, &[], &["ledger"])],
            Vec::new(),
        );
        assert_eq!(check(&r, &truth(), 20_000_000).failures.len(), 1);
    }

    #[test]
    fn after_its_server_applied_the_narrowing_a_stream_gets_only_the_narrowed_view() {
        // Opened on s1 after its apply: stock's leaf is one too many.
        let r = record(
            vec![push(Proxy::Gateway, 0, 5_100_000, &["stock"], &[])],
            Vec::new(),
        );
        assert_eq!(check(&r, &truth(), 20_000_000).failures.len(), 1);
        // On s2 after its restart from state before the narrowing: allowed.
        let r = record(
            vec![push(Proxy::Gateway, 1, 6_100_000, &["stock"], &[])],
            Vec::new(),
        );
        let s = check(&r, &truth(), 20_000_000);
        assert!(s.failures.is_empty(), "{:?}", s.failures);
    }

    #[test]
    fn a_stream_still_holding_what_the_narrowing_took_at_the_end_fails() {
        let mut r = record(Vec::new(), Vec::new());
        r.streams[1].endpoints.insert("cart".into());
        assert_eq!(check(&r, &truth(), 20_000_000).failures.len(), 1);
    }
}
