//! `hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers`:
//! the servers a dataplane may dial, again whenever they change.

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use axum::http;
use futures_util::Stream;
use tonic::body::Body;
use tonic::{Request, Response, Status};

use super::{App, BoxFut, Methods, token_of, unimplemented};

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchServersRequest {
    #[prost(bool, tag = "1")]
    pub wan: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchServersResponse {
    #[prost(message, repeated, tag = "1")]
    pub servers: Vec<ServerInfo>,
}

/// Consul's `Server` message.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ServerInfo {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub address: String,
    #[prost(string, tag = "3")]
    pub version: String,
}

/// The servers of the Raft membership: their IP addresses (the dataplane
/// dials its configured gRPC port on them), as Consul answers.
fn servers(s: &App) -> Vec<ServerInfo> {
    s.cluster()
        .members()
        .into_iter()
        .map(|(_, n, _)| ServerInfo {
            id: n.name.clone(),
            address: n
                .raft_addr
                .parse::<SocketAddr>()
                .map(|a| a.ip().to_string())
                .unwrap_or_else(|_| {
                    n.raft_addr
                        .rsplit_once(':')
                        .map(|(h, _)| h.to_string())
                        .unwrap_or_default()
                }),
            version: env!("CARGO_PKG_VERSION").into(),
        })
        .collect()
}

#[derive(Clone)]
pub(super) struct ServerDiscovery;

/// Consul's check of `WatchServers`: with ACLs on, any token that resolves
/// but the anonymous one (an unknown secret: UNAUTHENTICATED; none, or the
/// anonymous token: PERMISSION_DENIED).
fn any_valid_token(s: &App, token: Option<&str>) -> Result<(), Status> {
    if !s.acl().enabled() {
        return Ok(());
    }
    let authz = s
        .acl()
        .resolve(&s.state(), token)
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    if authz.accessor() == crate::structs::acl::ANONYMOUS_ID {
        return Err(Status::permission_denied(
            "An ACL token must be provided (via the `x-consul-token` metadata field) to call this endpoint",
        ));
    }
    Ok(())
}

type ServersStream = Pin<Box<dyn Stream<Item = Result<WatchServersResponse, Status>> + Send>>;

impl Methods for ServerDiscovery {
    const NAME: &'static str = "hashicorp.consul.serverdiscovery.ServerDiscoveryService";

    fn call(s: &App, method: &str, req: http::Request<Body>) -> BoxFut {
        if method != "WatchServers" {
            return unimplemented();
        }
        let s = s.clone();
        let token = token_of(&req);
        Box::pin(async move {
            let svc = tower::service_fn(move |_: Request<WatchServersRequest>| {
                let (s, token) = (s.clone(), token.clone());
                async move {
                    any_valid_token(&s, token.as_deref())?;
                    // The list now, then again whenever the membership
                    // changes (checked once a second: membership changes
                    // are rare and a dataplane only needs them eventually),
                    // the token checked again each time: a deleted one
                    // ends the stream.
                    let stream = futures_util::stream::unfold(
                        Some((s, token, None::<Vec<ServerInfo>>)),
                        |state| async move {
                            let (s, token, last) = state?;
                            let mut first = true;
                            loop {
                                if !first {
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                }
                                first = false;
                                if let Err(status) = any_valid_token(&s, token.as_deref()) {
                                    return Some((Err(status), None));
                                }
                                let now = servers(&s);
                                if last.as_ref() != Some(&now) {
                                    let item = Ok(WatchServersResponse {
                                        servers: now.clone(),
                                    });
                                    return Some((item, Some((s, token, Some(now)))));
                                }
                            }
                        },
                    );
                    Ok::<_, Status>(Response::new(Box::pin(stream) as ServersStream))
                }
            });
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                WatchServersResponse,
                WatchServersRequest,
            >::default());
            Ok(grpc.server_streaming(svc, req).await)
        })
    }
}
