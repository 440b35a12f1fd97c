//! Envoy's Aggregated Discovery Service, incremental variant, over gRPC:
//! one task per stream turns the proxy's snapshot into resources and runs
//! the Delta protocol (`delta::Session`) between the proxy's requests and
//! the snapshot's rebuilds. State-of-the-world ADS (`sotw`, which Consul
//! does not serve) is served beside it from the same snapshots, with the
//! same checks and bounds, for xDS clients that speak only it: gRPC's
//! proxyless client among them.
//!
//! The proxy is found through a `Source` (the server's catalog and its
//! proxycfg manager): this module reads no state itself.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures_util::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

use super::Resources;
use super::delta::{Reply, Session};
use crate::proxycfg::{ProxyKey, Snapshot};

/// Where streams find their proxies.
pub trait Source: Send + Sync + 'static {
    /// The proxy a stream's node names: its service ID, and its node's
    /// name when the proxy said (`None`: any node with that service ID).
    fn locate(&self, service_id: &str, node: Option<&str>) -> Option<ProxyKey>;
    /// The proxy's snapshot and its rebuilds.
    fn snapshot(&self, key: &ProxyKey) -> Option<watch::Receiver<Option<Arc<Snapshot>>>>;
    /// Who the stream's token (gRPC metadata `x-consul-token`) is, checked
    /// as the stream opens, before it takes a slot: a secret that names no
    /// token is refused (PERMISSION_DENIED).
    fn identify(&self, token: Option<&str>) -> Result<Caller, Status>;
    /// May the token receive the config of proxy `proxy_id`, whose
    /// destination is `service` (`None`: no such proxy)? Consul asks
    /// `service:write` on it: the config carries the service's leaf key.
    /// An unknown proxy is refused as a forbidden one is, so a token learns
    /// nothing of proxies it may not watch; `Ok` for it means the caller
    /// may hear NOT_FOUND.
    fn authorize(
        &self, token: Option<&str>, proxy_id: &str, service: Option<&str>,
    ) -> Result<(), Status>;
    /// Moves whenever a token, policy or role changes: a stream checks its
    /// token again then, and ends when it no longer passes.
    fn acl_changes(&self) -> watch::Receiver<u64>;
    /// When the token expires (its `ExpirationTime`; none: never), which
    /// changes no ACL: the stream checks it again then.
    fn expiry(&self, token: Option<&str>) -> Option<SystemTime>;
    /// A registered service instance that is no proxy (its key and its
    /// service's name): a proxyless gRPC client whose node id names it.
    fn locate_instance(&self, service_id: &str, node: Option<&str>) -> Option<(ProxyKey, String)>;
    /// Serves that client: its snapshot for the services it dials.
    fn proxyless(&self, instance: ProxyKey) -> crate::proxycfg::Proxyless;
    /// May the token read `service` (a proxyless client dials only those)?
    fn may_read(&self, token: Option<&str>, service: &str) -> bool;
}

/// What a stream's token is, for its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A token that resolves (or any caller with ACLs off).
    Token,
    /// No token, or the anonymous one, with ACLs on.
    Anonymous,
}

/// The bounds of the streams of one server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Streams with a token open at once (ACLs off: every stream); past it
    /// RESOURCE_EXHAUSTED.
    pub max_streams: usize,
    /// Streams without one open at once, capped apart: anonymous callers
    /// cannot take the slots proxies need.
    pub max_anonymous: usize,
    /// A stream that sent no first request within this is closed
    /// (DEADLINE_EXCEEDED), so idle streams hold no slot for long.
    pub first_request: Duration,
    /// Resource names one stream may subscribe to or say it holds, over
    /// all types; past it the stream ends (RESOURCE_EXHAUSTED).
    pub max_names: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 16_384,
            max_anonymous: 256,
            first_request: Duration::from_secs(10),
            max_names: 10_000,
        }
    }
}

/// Resource builds running at once. A change every proxy sees (a
/// `proxy-defaults` write) makes thousands of streams rebuild together; on
/// the async workers they would queue every HTTP request behind them (KV
/// writes' p99 rose past 300 ms with 10,000 streams). Built one at a time
/// on a blocking thread, they take one core and leave the rest to serve.
static BUILDS: Semaphore = Semaphore::const_new(1);

/// A proxy's resources from its snapshot, built off the async workers.
async fn build(snapshot: &Arc<Snapshot>) -> Resources {
    build_with(snapshot, super::generate::generate).await
}

/// A snapshot's resources by `generate`, built off the async workers.
pub(super) async fn build_with(
    snapshot: &Arc<Snapshot>, generate: fn(&Snapshot) -> Resources,
) -> Resources {
    let _turn = BUILDS
        .acquire()
        .await
        .expect("the build semaphore is never closed");
    let snapshot = snapshot.clone();
    match tokio::task::spawn_blocking(move || generate(&snapshot)).await {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// How long a stream waits for its proxy's first snapshot (a proxy
/// registered a moment ago) before ending with NOT_FOUND.
const FIRST_SNAPSHOT: Duration = Duration::from_secs(2);

/// The largest message either way (Consul's gRPC default is 4 MiB; a
/// proxy's whole config in one response can be larger).
pub const MAX_MESSAGE: usize = 16 << 20;

pub struct Ads {
    source: Arc<dyn Source>,
    limits: Limits,
    streams: Arc<Semaphore>,
    anonymous: Arc<Semaphore>,
}

impl Ads {
    /// The service, its streams within `limits`.
    pub fn service(
        source: Arc<dyn Source>, limits: Limits,
    ) -> AggregatedDiscoveryServiceServer<Ads> {
        AggregatedDiscoveryServiceServer::new(Ads {
            source,
            streams: Arc::new(Semaphore::new(limits.max_streams)),
            anonymous: Arc::new(Semaphore::new(limits.max_anonymous)),
            limits,
        })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
    }

    /// A new stream's token (gRPC metadata) and its slot: checked before
    /// the stream reads anything.
    fn admit(
        &self, metadata: &tonic::metadata::MetadataMap,
    ) -> Result<(Option<String>, OwnedSemaphorePermit), Status> {
        let token = metadata
            .get(TOKEN_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let pool = match self.source.identify(token.as_deref())? {
            Caller::Token => &self.streams,
            Caller::Anonymous => &self.anonymous,
        };
        let permit = pool.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted("too many xDS streams on this server; retry later")
        })?;
        Ok((token, permit))
    }
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn receiver_stream<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> Out<T> {
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self, request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (token, permit) = self.admit(request.metadata())?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let (source, limits) = (self.source.clone(), self.limits.clone());
        let pools = super::sotw::Pools {
            streams: self.streams.clone(),
        };
        tokio::spawn(async move {
            let run = super::sotw::run(source, &limits, token, permit, pools, inbound, &tx);
            if let Err(status) = run.await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(receiver_stream(rx)))
    }

    async fn delta_aggregated_resources(
        &self, request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (token, permit) = self.admit(request.metadata())?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let (source, limits) = (self.source.clone(), self.limits.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(status) = run_stream(source, &limits, token.as_deref(), inbound, &tx).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(receiver_stream(rx)))
    }
}

/// The gRPC metadata a token travels in (Consul's).
pub const TOKEN_METADATA: &str = "x-consul-token";

/// The node's metadata key consul-dataplane names the proxy's node with.
pub(super) const NODE_NAME_META: &str = "node_name";

/// A string in the node's metadata (`None`: absent or empty).
pub(super) fn node_meta(
    node: &envoy_types::pb::envoy::config::core::v3::Node, key: &str,
) -> Option<String> {
    node.metadata
        .as_ref()
        .and_then(|m| m.fields.get(key))
        .and_then(|v| match &v.kind {
            Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .filter(|s| !s.is_empty())
}

async fn run_stream(
    source: Arc<dyn Source>, limits: &Limits, token: Option<&str>,
    mut inbound: Streaming<DeltaDiscoveryRequest>,
    tx: &mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) -> Result<(), Status> {
    let first = tokio::time::timeout(limits.first_request, inbound.message())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "no first request within {} s",
                limits.first_request.as_secs_f64()
            ))
        })?;
    let Some(first) = first? else {
        return Ok(());
    };
    let node = first.node.clone().unwrap_or_default();
    if node.id.is_empty() {
        return Err(Status::invalid_argument(
            "the first request's node.id must be the proxy's service ID",
        ));
    }
    let node_name = node_meta(&node, NODE_NAME_META);
    let proxy = node.id.clone();
    // Watched before the first check, so a change after it is not missed.
    let mut acl = source.acl_changes();
    acl.borrow_and_update();
    let Some(mut rx) = first_snapshot(&*source, &proxy, node_name.as_deref()).await else {
        // An unknown proxy: refused as a forbidden one would be, unless
        // the token may know.
        source.authorize(token, &proxy, None)?;
        return Err(Status::not_found(format!(
            "no connect proxy with service ID {proxy:?}{} is registered",
            node_name
                .as_deref()
                .map(|n| format!(" on node {n:?}"))
                .unwrap_or_default()
        )));
    };
    let mut current = rx.borrow_and_update().clone();
    source.authorize(token, &proxy, destination(&current))?;
    let mut expires = source.expiry(token);
    let mut session = Session::new();
    if let Some(s) = &current {
        session.set_resources(build(s).await);
    }
    on_request(&proxy, &mut session, &first, limits)?;
    loop {
        while let Some(push) = session.next_push() {
            tracing::debug!(proxy = %proxy, type_url = %push.type_url, resources = push.resources.len(), removed = push.removed_resources.len(), "xds: push");
            if tx.send(Ok(push)).await.is_err() {
                return Ok(()); // the proxy went away
            }
        }
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(req)) => on_request(&proxy, &mut session, &req, limits)?,
                Ok(None) => return Ok(()),
                Err(status) => {
                    tracing::debug!(proxy = %proxy, %status, "xds: stream ended");
                    return Ok(());
                }
            },
            changed = rx.changed() => {
                if changed.is_err() {
                    return Err(gone(&proxy));
                }
                let next = rx.borrow_and_update().clone();
                match &next {
                    None => return Err(gone(&proxy)),
                    Some(s) if current.as_ref().is_some_and(|c| c.version == s.version) => {}
                    Some(s) => {
                        // Its destination may have changed with it.
                        source.authorize(token, &proxy, destination(&next))?;
                        session.set_resources(build(s).await);
                    }
                }
                current = next;
            }
            changed = acl.changed() => {
                if changed.is_err() {
                    return Err(Status::unavailable("the server is stopping"));
                }
                acl.borrow_and_update();
                // A token deleted or narrowed gets nothing more: not the
                // next leaf key either.
                source.authorize(token, &proxy, destination(&current))?;
                expires = source.expiry(token);
            }
            () = until(expires) => {
                // Expired: refused now (else its expiry was changed).
                source.authorize(token, &proxy, destination(&current))?;
                expires = source.expiry(token);
            }
        }
    }
}

/// Returns at `at` (a moment after, so the token is past it), never for
/// `None`.
pub(super) async fn until(at: Option<SystemTime>) {
    match at {
        Some(at) => {
            let left = at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            tokio::time::sleep(left + Duration::from_millis(10)).await;
        }
        None => std::future::pending().await,
    }
}

/// The service a proxy's config is for (its leaf's): a sidecar's
/// destination, a gateway's own name.
pub(super) fn destination(snap: &Option<Arc<Snapshot>>) -> Option<&str> {
    snap.as_ref().map(|s| {
        if s.gateway.is_some() {
            s.service.service.as_str()
        } else {
            s.service.proxy.destination_service_name.as_str()
        }
    })
}

/// Takes in one request; a stream subscribed to too many names ends.
fn on_request(
    proxy: &str, session: &mut Session, req: &DeltaDiscoveryRequest, limits: &Limits,
) -> Result<(), Status> {
    log_reply(proxy, session.on_request(req));
    let names = session.names();
    if names > limits.max_names {
        return Err(Status::resource_exhausted(format!(
            "{names} resource names subscribed on one stream: at most {} are served",
            limits.max_names
        )));
    }
    Ok(())
}

pub(super) fn gone(proxy: &str) -> Status {
    Status::not_found(format!("proxy {proxy:?} was deregistered"))
}

fn log_reply(proxy: &str, reply: Reply) {
    match reply {
        Reply::Nack { type_url, error } => {
            crate::metrics::XDS_NACKS.inc();
            tracing::warn!(proxy = %proxy, %type_url, %error, "xds: the proxy rejected a push (NACK); it keeps its last accepted version");
        }
        Reply::Unknown { type_url } => {
            tracing::debug!(proxy = %proxy, %type_url, "xds: a type this server does not serve");
        }
        Reply::Ack { .. } | Reply::None => {}
    }
}

/// The proxy's snapshot, waiting a little for one registered a moment ago
/// (`None`: no such proxy).
pub(super) async fn first_snapshot(
    source: &dyn Source, service_id: &str, node: Option<&str>,
) -> Option<watch::Receiver<Option<Arc<Snapshot>>>> {
    let until = tokio::time::Instant::now() + FIRST_SNAPSHOT;
    loop {
        if let Some(key) = source.locate(service_id, node)
            && let Some(rx) = source.snapshot(&key)
            && rx.borrow().is_some()
        {
            return Some(rx);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
