//! A Delta ADS stream opened as Envoy opens one, for the tests that read
//! what cairn's xDS server sends a proxy.

use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{Struct, Value as PbValue, value::Kind};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

/// One Delta ADS stream: what it sends, what it gets.
pub struct Delta {
    pub requests: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    pub responses: Streaming<DeltaDiscoveryResponse>,
}

/// Envoy's node for proxy `id` registered on catalog node `node` (named in
/// the `node_name` metadata, as consul-dataplane names it).
pub fn envoy_node(id: &str, node: &str) -> Node {
    let mut meta = Struct::default();
    meta.fields.insert(
        "node_name".into(),
        PbValue {
            kind: Some(Kind::StringValue(node.into())),
        },
    );
    Node {
        id: id.into(),
        cluster: id.into(),
        metadata: Some(meta),
        ..Default::default()
    }
}

/// A first request of `node` for `type_url`, subscribing to `names`
/// (none: the wildcard).
pub fn first(node: &Node, type_url: &str, names: Vec<String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(node.clone()),
        type_url: type_url.into(),
        resource_names_subscribe: names,
        ..Default::default()
    }
}

/// Opens a stream to the gRPC port at `addr`, its token (if any) in
/// `x-consul-token`, with `requests` sent first. A refusal (the token, the
/// proxy) is the `Err`.
pub async fn open(
    addr: SocketAddr, token: Option<&str>, requests: Vec<DeltaDiscoveryRequest>,
) -> Result<Delta, Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    for r in requests {
        tx.send(r).unwrap();
    }
    let mut req = tonic::Request::new(outbound);
    if let Some(t) = token {
        req.metadata_mut()
            .insert("x-consul-token", t.parse().unwrap());
    }
    let responses = AggregatedDiscoveryServiceClient::new(channel)
        .delta_aggregated_resources(req)
        .await?
        .into_inner();
    Ok(Delta {
        requests: tx,
        responses,
    })
}
