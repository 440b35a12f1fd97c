//! Envoy's Aggregated Discovery Service over gRPC, both variants: Delta
//! (incremental, what Consul serves) and state of the world (SotW, which
//! Consul does not serve, for xDS clients that speak only it: gRPC's
//! proxyless client among them). This is the gRPC service: it admits a
//! stream (its token and its slot within the server's `Limits`) and spawns
//! its task (`stream`), the same for either protocol.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures_util::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};

use super::stream::{self, Caller, Limits, Protocol, Source, TOKEN_METADATA};

/// The largest message either way (Consul's gRPC default is 4 MiB; a
/// proxy's whole config in one response can be larger).
pub const MAX_MESSAGE: usize = 16 << 20;

#[derive(Clone)]
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
        let permit = self.slot(self.source.identify(token.as_deref())?)?;
        Ok((token, permit))
    }

    /// A slot for a caller: a token's, or one of the anonymous ones.
    fn slot(&self, caller: Caller) -> Result<OwnedSemaphorePermit, Status> {
        let pool = match caller {
            Caller::Token => &self.streams,
            Caller::Anonymous => &self.anonymous,
        };
        pool.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted("too many xDS streams on this server; retry later")
        })
    }

    /// Admits a stream and spawns its task; the responses go out as the
    /// task sends them, ending with its status when it fails.
    fn spawn<P: Protocol>(
        &self, request: Request<Streaming<P::Request>>,
    ) -> Result<Response<Out<P::Response>>, Status> {
        let (token, mut permit) = self.admit(request.metadata())?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let ads = self.clone();
        tokio::spawn(async move {
            // The slot is held until the stream's status went out.
            if let Err(status) = ads.run::<P>(token, &mut permit, inbound, &tx).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(receiver_stream(rx)))
    }

    /// One stream in its slot (`permit`). A client that cannot set call
    /// metadata (gRPC's bootstrap cannot) may put its token in its node's
    /// metadata under the same key, and then moves to a token's slot.
    async fn run<P: Protocol>(
        &self, mut token: Option<String>, permit: &mut OwnedSemaphorePermit,
        inbound: Streaming<P::Request>, tx: &mpsc::Sender<Result<P::Response, Status>>,
    ) -> Result<(), Status> {
        let Some(opened) = stream::open::<P>(&self.limits, inbound).await? else {
            return Ok(());
        };
        if P::PROXYLESS
            && token.is_none()
            && let Some(t) = stream::node_meta(&opened.node, TOKEN_METADATA)
        {
            if self.source.identify(Some(&t))? == Caller::Token {
                *permit = self.slot(Caller::Token)?;
            }
            token = Some(t);
        }
        stream::serve(
            self.source.clone(),
            &self.limits,
            token.as_deref(),
            opened,
            tx,
        )
        .await
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
        self.spawn::<super::sotw::Session>(request)
    }

    async fn delta_aggregated_resources(
        &self, request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.spawn::<super::delta::Session>(request)
    }
}
