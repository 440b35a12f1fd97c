//! Envoy's Aggregated Discovery Service, incremental variant, over gRPC:
//! one task per stream turns the proxy's snapshot into resources and runs
//! the Delta protocol (`delta::Session`) between the proxy's requests and
//! the snapshot's rebuilds. State-of-the-world ADS answers UNIMPLEMENTED,
//! as Consul's.
//!
//! The proxy is found through a `Source` (the server's catalog and its
//! proxycfg manager): this room reads no state itself.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures_util::Stream;
use tokio::sync::{Semaphore, mpsc, watch};
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
    /// May the stream's token (gRPC metadata `x-consul-token`) receive the
    /// config of the proxy for `service` (its destination)? Consul asks
    /// `service:write` on it: the config carries the service's leaf key.
    fn authorize(&self, token: Option<&str>, service: &str) -> Result<(), Status>;
}

/// Resource builds running at once. A change every proxy sees (a
/// `proxy-defaults` write) makes thousands of streams rebuild together; on
/// the async workers they would queue every HTTP request behind them (KV
/// writes' p99 rose past 300 ms with 10,000 streams). Built one at a time
/// on a blocking thread, they take one core and leave the rest to serve.
static BUILDS: Semaphore = Semaphore::const_new(1);

/// A proxy's resources from its snapshot, built off the async workers.
async fn build(snapshot: &Arc<Snapshot>) -> Resources {
    let _turn = BUILDS
        .acquire()
        .await
        .expect("the build semaphore is never closed");
    let snapshot = snapshot.clone();
    match tokio::task::spawn_blocking(move || super::resources::generate(&snapshot)).await {
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
    streams: Arc<Semaphore>,
}

impl Ads {
    /// The service, with at most `max_streams` streams at once.
    pub fn service(
        source: Arc<dyn Source>, max_streams: usize,
    ) -> AggregatedDiscoveryServiceServer<Ads> {
        AggregatedDiscoveryServiceServer::new(Ads {
            source,
            streams: Arc::new(Semaphore::new(max_streams)),
        })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
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
        &self, _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "state-of-the-world ADS is not served: use the incremental (Delta) variant",
        ))
    }

    async fn delta_aggregated_resources(
        &self, request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted("too many xDS streams on this server; retry later")
        })?;
        let token = request
            .metadata()
            .get(TOKEN_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let source = self.source.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(status) = run_stream(source, token.as_deref(), inbound, &tx).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(receiver_stream(rx)))
    }
}

/// The gRPC metadata a token travels in (Consul's).
pub const TOKEN_METADATA: &str = "x-consul-token";

/// The node's metadata key consul-dataplane names the proxy's node with.
const NODE_NAME_META: &str = "node_name";

async fn run_stream(
    source: Arc<dyn Source>, token: Option<&str>, mut inbound: Streaming<DeltaDiscoveryRequest>,
    tx: &mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) -> Result<(), Status> {
    let Some(first) = inbound.message().await? else {
        return Ok(());
    };
    let node = first.node.clone().unwrap_or_default();
    if node.id.is_empty() {
        return Err(Status::invalid_argument(
            "the first request's node.id must be the proxy's service ID",
        ));
    }
    let node_name = node
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get(NODE_NAME_META))
        .and_then(|v| match &v.kind {
            Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .filter(|s| !s.is_empty());
    let mut rx = first_snapshot(&*source, &node.id, node_name.as_deref()).await?;
    let service = rx
        .borrow()
        .as_ref()
        .map(|s| s.service.proxy.destination_service_name.clone())
        .unwrap_or_default();
    source.authorize(token, &service)?;
    let proxy = node.id.clone();
    let mut session = Session::new();
    let mut current = rx.borrow_and_update().clone();
    if let Some(s) = &current {
        session.set_resources(build(s).await);
    }
    log_reply(&proxy, session.on_request(&first));
    loop {
        while let Some(push) = session.next_push() {
            tracing::debug!(proxy = %proxy, type_url = %push.type_url, resources = push.resources.len(), removed = push.removed_resources.len(), "xds: push");
            if tx.send(Ok(push)).await.is_err() {
                return Ok(()); // the proxy went away
            }
        }
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(req)) => log_reply(&proxy, session.on_request(&req)),
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
                    Some(s) => session.set_resources(build(s).await),
                }
                current = next;
            }
        }
    }
}

fn gone(proxy: &str) -> Status {
    Status::not_found(format!("proxy {proxy:?} was deregistered"))
}

fn log_reply(proxy: &str, reply: Reply) {
    match reply {
        Reply::Nack { type_url, error } => {
            tracing::warn!(proxy = %proxy, %type_url, %error, "xds: the proxy rejected a push (NACK); it keeps its last accepted version");
        }
        Reply::Unknown { type_url } => {
            tracing::debug!(proxy = %proxy, %type_url, "xds: a type this server does not serve");
        }
        Reply::Ack { .. } | Reply::None => {}
    }
}

/// The proxy's snapshot, waiting a little for one registered a moment ago.
async fn first_snapshot(
    source: &dyn Source, service_id: &str, node: Option<&str>,
) -> Result<watch::Receiver<Option<Arc<Snapshot>>>, Status> {
    let until = tokio::time::Instant::now() + FIRST_SNAPSHOT;
    loop {
        if let Some(key) = source.locate(service_id, node)
            && let Some(rx) = source.snapshot(&key)
            && rx.borrow().is_some()
        {
            return Ok(rx);
        }
        if tokio::time::Instant::now() >= until {
            return Err(Status::not_found(format!(
                "no connect proxy with service ID {service_id:?}{} is registered",
                node.map(|n| format!(" on node {n:?}")).unwrap_or_default()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
