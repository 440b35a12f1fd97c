//! The gRPC port (`--grpc-addr`, default 127.0.0.1:8502; TLS with the
//! server's certificate when the TLS files are given): Envoy's ADS, Delta
//! and state-of-the-world (`xds::Ads`, fed by this server's proxycfg
//! snapshots; proxyless gRPC clients on the latter) and
//! consul-dataplane's own services from Consul's public protos:
//! `hashicorp.consul.dataplane.DataplaneService` (the same bootstrap
//! parameters as the HTTP endpoint, `http::dataplane`) and
//! `hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers`
//! and `hashicorp.consul.acl.ACLService` (`Login`, `Logout`: the HTTP
//! layer's, `http::login`).
//!
//! The dataplane's messages are few and small: written here as prost
//! messages rather than generated (no protoc in the build).

use std::convert::Infallible;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use axum::http;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as PbValue, value::Kind};
use futures_util::Stream;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use super::App;
use crate::proxycfg::{ProxyKey, Snapshot};

/// xDS streams open at once by default; past it RESOURCE_EXHAUSTED.
pub const MAX_STREAMS: usize = 16_384;

/// Connections open at once by default; past it a new one is closed at
/// once. An Envoy or a dataplane holds one; thousands of them fit.
pub const MAX_CONNS: usize = 4_096;

/// Connections one client IP may hold open at once: a quarter of the cap,
/// so that one host cannot take every connection (an Envoy or dataplane
/// needs one; the benchmarks' load tools a few dozen).
fn max_conns_per_ip(max_conns: usize) -> usize {
    (max_conns / 4).max(1)
}

/// HTTP/2 streams one connection may have open at once (its
/// `SETTINGS_MAX_CONCURRENT_STREAMS`), so one client cannot take every
/// xDS slot and task by itself; the benchmarks multiplex ~600 per
/// connection.
pub const MAX_STREAMS_PER_CONN: u32 = 1_024;

/// Where the gRPC port listens and its bounds.
#[derive(Debug, Clone)]
pub struct GrpcConfig {
    pub addr: SocketAddr,
    pub xds: crate::xds::Limits,
    /// Connections open at once (`--grpc-max-conns`).
    pub max_conns: usize,
}

/// Bound before anything else starts, so a taken port refuses the start.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on --grpc-addr {addr}"))
}

/// Serves the gRPC port until `stop` is notified.
pub async fn serve(
    s: App, listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>, config: GrpcConfig,
    stop: Arc<tokio::sync::Notify>,
) {
    let GrpcConfig { xds, max_conns, .. } = config;
    tracing::info!(addr = ?listener.local_addr().ok(), tls = tls.is_some(), "gRPC (xDS, dataplane) listening");
    let router = routes(&s, xds);
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONN));
    let slots = Slots {
        all: Arc::new(tokio::sync::Semaphore::new(max_conns.max(1))),
        per_ip: Arc::default(),
        max_per_ip: max_conns_per_ip(max_conns),
    };
    let shutdown = async move { stop.notified().await };
    let result = match tls {
        None => {
            let incoming = accept(listener, slots, |tcp| async move { Ok(tcp) });
            server
                .serve_with_incoming_shutdown(router, incoming, shutdown)
                .await
        }
        Some(cfg) => {
            // gRPC needs HTTP/2 chosen by ALPN.
            let mut cfg = (*cfg).clone();
            cfg.alpn_protocols = vec![b"h2".to_vec()];
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
            let incoming = accept(listener, slots, move |tcp| {
                let acceptor = acceptor.clone();
                async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                    {
                        Ok(Ok(tls)) => Ok(tls),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(std::io::Error::other("TLS handshake timed out")),
                    }
                }
            });
            server
                .serve_with_incoming_shutdown(router, incoming, shutdown)
                .await
        }
    };
    if let Err(e) = result {
        tracing::error!("gRPC server stopped: {e}");
    }
}

/// The port's services (ADS, the dataplane's, server discovery), streams
/// within `xds`: what `serve` serves, for a listener of the caller's own
/// (the simulation's hosts serve them over simulated TCP).
pub fn routes(s: &App, xds: crate::xds::Limits) -> tonic::service::Routes {
    let ads = crate::xds::Ads::service(Arc::new(Catalog(s.clone())), xds);
    tonic::service::Routes::new(ads)
        .add_service(Service::<Dataplane>::new(s.clone()))
        .add_service(Service::<ServerDiscovery>::new(s.clone()))
        .add_service(Service::<AclService>::new(s.clone()))
        .prepare()
}

/// Accepted connections, each set up (the TLS handshake) on its own task
/// so that a slow client holds up no other; failed ones are dropped. Each
/// holds one of `slots` until it closes; with none left a new connection
/// is closed at once, before its handshake costs anything.
fn accept<IO, F, Fut>(
    listener: TcpListener, slots: Slots, setup: F,
) -> impl Stream<Item = Result<Admitted<IO>, std::io::Error>> + Send
where
    IO: Send + 'static,
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::io::Result<IO>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<std::io::Result<Admitted<IO>>>(64);
    tokio::spawn(async move {
        let setup = Arc::new(setup);
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("gRPC accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(share) = slots.per_ip.take(peer.ip(), slots.max_per_ip) else {
                crate::metrics::GRPC_CONNS_REFUSED.inc();
                tracing::debug!(%peer, "gRPC connection refused: at the client's connection cap");
                continue;
            };
            let Ok(slot) = slots.all.clone().try_acquire_owned() else {
                crate::metrics::GRPC_CONNS_REFUSED.inc();
                tracing::debug!(%peer, "gRPC connection refused: at the connection cap");
                continue;
            };
            let slot = (slot, share);
            let _ = tcp.set_nodelay(true);
            let (conn_tx, setup) = (tx.clone(), setup.clone());
            tokio::spawn(async move {
                match setup(tcp).await {
                    Ok(io) => {
                        let _ = conn_tx.send(Ok(Admitted { io, _slot: slot })).await;
                    }
                    Err(e) => tracing::debug!(%peer, "gRPC connection refused: {e}"),
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|io| (io, rx)) },
    )
}

/// The gRPC port's connection caps: in all, and per client IP.
#[derive(Clone)]
struct Slots {
    all: Arc<tokio::sync::Semaphore>,
    per_ip: Arc<crate::shares::Shares<std::net::IpAddr>>,
    max_per_ip: usize,
}

/// An admitted connection (plain or TLS), as tonic's server wants its
/// connections, holding its place under the connection caps.
struct Admitted<IO> {
    io: IO,
    _slot: (
        tokio::sync::OwnedSemaphorePermit,
        crate::shares::Share<std::net::IpAddr>,
    ),
}

/// The TCP connection under a stream, for the peer's address.
trait Tcp {
    fn tcp(&self) -> &TcpStream;
}

impl Tcp for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Tcp for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

impl<IO: Tcp> tonic::transport::server::Connected for Admitted<IO> {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.tcp().connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Admitted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Admitted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The server's catalog and proxycfg manager, as the xDS streams see them.
struct Catalog(App);

impl crate::xds::Source for Catalog {
    fn locate(&self, service_id: &str, node: Option<&str>) -> Option<ProxyKey> {
        let st = self.0.state();
        match node {
            Some(n) => {
                let key = (n.to_string(), service_id.to_string());
                st.services.contains_key(&key).then_some(key)
            }
            // A proxy's service ID is unique in practice (the dataplane's
            // node ID is it); the first node holding it is taken.
            None => st
                .services
                .iter()
                .find(|((_, id), svc)| id == service_id && svc.is_xds_proxy())
                .map(|(k, _)| k.clone()),
        }
    }

    fn snapshot(&self, key: &ProxyKey) -> Option<watch::Receiver<Option<Arc<Snapshot>>>> {
        self.0.proxycfg().snapshot(key)
    }

    fn identify(&self, token: Option<&str>) -> Result<crate::xds::Caller, Status> {
        use crate::xds::Caller;
        if !self.0.acl().enabled() {
            return Ok(Caller::Token);
        }
        let authz = self
            .0
            .acl()
            .resolve(&self.0.state(), token)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        Ok(if authz.accessor() == crate::structs::acl::ANONYMOUS_ID {
            Caller::Anonymous
        } else {
            Caller::Token
        })
    }

    fn authorize(
        &self, token: Option<&str>, proxy_id: &str, service: Option<&str>,
    ) -> Result<(), Status> {
        let authz = self
            .0
            .acl()
            .resolve(&self.0.state(), token)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        match super::proxycfg::may_watch(&authz, proxy_id, service) {
            // An unknown proxy the caller may hear of: the stream says so.
            Ok(()) | Err(super::proxycfg::Refused::Unknown) => Ok(()),
            Err(super::proxycfg::Refused::Denied(why)) => Err(Status::permission_denied(why)),
        }
    }

    fn acl_changes(&self) -> watch::Receiver<u64> {
        self.0.watches().subscribe(&crate::state::keys::ACL)
    }

    fn locate_instance(&self, service_id: &str, node: Option<&str>) -> Option<(ProxyKey, String)> {
        let st = self.0.state();
        // Any registration but a proxy's (which takes the sidecar's path)
        // or a gateway's.
        let plain =
            |svc: &crate::structs::NodeService| svc.kind == crate::structs::ServiceKind::Typical;
        match node {
            Some(n) => {
                let key = (n.to_string(), service_id.to_string());
                let svc = st.services.get(&key).filter(|s| plain(s))?;
                Some((key, svc.service.clone()))
            }
            None => st
                .services
                .iter()
                .find(|((_, id), svc)| id == service_id && plain(svc))
                .map(|(k, svc)| (k.clone(), svc.service.clone())),
        }
    }

    fn proxyless(&self, instance: ProxyKey) -> crate::proxycfg::Proxyless {
        self.0.proxycfg().proxyless(instance)
    }

    fn may_read(&self, token: Option<&str>, service: &str) -> bool {
        self.0
            .acl()
            .resolve(&self.0.state(), token)
            .is_ok_and(|a| a.service_read(service))
    }

    fn reader(&self, token: Option<&str>) -> Option<crate::proxycfg::Reader> {
        super::proxycfg::reader(&self.0, token)
    }

    fn expiry(&self, token: Option<&str>) -> Option<std::time::SystemTime> {
        super::acl::token_expiry(&self.0, token)
    }
}

// --- hashicorp.consul.dataplane -------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetSupportedDataplaneFeaturesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DataplaneFeatureSupport {
    #[prost(int32, tag = "1")]
    pub feature_name: i32,
    #[prost(bool, tag = "2")]
    pub supported: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetSupportedDataplaneFeaturesResponse {
    #[prost(message, repeated, tag = "1")]
    pub supported_dataplane_features: Vec<DataplaneFeatureSupport>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetEnvoyBootstrapParamsRequest {
    #[prost(string, tag = "1")]
    pub node_id: String,
    #[prost(string, tag = "2")]
    pub node_name: String,
    #[prost(string, tag = "3")]
    pub service_id: String,
    #[prost(string, tag = "4")]
    pub partition: String,
    #[prost(string, tag = "5")]
    pub namespace: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetEnvoyBootstrapParamsResponse {
    #[prost(int32, tag = "1")]
    pub service_kind: i32,
    #[prost(string, tag = "2")]
    pub service: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(string, tag = "4")]
    pub partition: String,
    #[prost(string, tag = "5")]
    pub datacenter: String,
    #[prost(message, optional, tag = "6")]
    pub config: Option<Struct>,
    #[prost(string, tag = "7")]
    pub node_id: String,
    #[prost(string, tag = "8")]
    pub node_name: String,
    #[prost(string, repeated, tag = "9")]
    pub access_logs: Vec<String>,
    #[prost(string, tag = "10")]
    pub identity: String,
}

/// `DataplaneFeatures`: watch servers, edge certificate management,
/// Envoy bootstrap configuration.
const FEATURES: [i32; 3] = [1, 2, 3];

fn service_kind_number(name: &str) -> i32 {
    match name {
        "SERVICE_KIND_TYPICAL" => 1,
        "SERVICE_KIND_CONNECT_PROXY" => 2,
        "SERVICE_KIND_MESH_GATEWAY" => 3,
        "SERVICE_KIND_TERMINATING_GATEWAY" => 4,
        "SERVICE_KIND_INGRESS_GATEWAY" => 5,
        "SERVICE_KIND_API_GATEWAY" => 6,
        _ => 0,
    }
}

fn to_pb(v: &Value) -> PbValue {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(to_pb).collect(),
        }),
        Value::Object(o) => Kind::StructValue(to_struct(o)),
    };
    PbValue { kind: Some(kind) }
}

fn to_struct(m: &serde_json::Map<String, Value>) -> Struct {
    Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), to_pb(v))).collect(),
    }
}

fn bootstrap(
    s: &App, token: Option<&str>, req: GetEnvoyBootstrapParamsRequest,
) -> Result<GetEnvoyBootstrapParamsResponse, Status> {
    if req.service_id.is_empty() {
        return Err(Status::invalid_argument("service_id is required"));
    }
    for (what, v) in [("partition", &req.partition), ("namespace", &req.namespace)] {
        if !v.is_empty() && v != "default" {
            return Err(Status::invalid_argument(format!(
                "{what} {v:?}: only the default {what} exists (Consul open source)"
            )));
        }
    }
    let st = s.state();
    // Consul's order: the token first (a secret that names no token is
    // UNAUTHENTICATED), before any lookup, so it learns nothing of what is
    // registered; then NOT_FOUND; then whether it may read the service.
    let authz = s
        .acl()
        .resolve(&st, token)
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    let node = if !req.node_name.is_empty() {
        st.nodes.get(&req.node_name).map(|n| &**n)
    } else if !req.node_id.is_empty() {
        st.nodes
            .values()
            .find(|n| n.id.eq_ignore_ascii_case(&req.node_id))
            .map(|n| &**n)
    } else {
        return Err(Status::invalid_argument("node_id or node_name is required"));
    }
    .ok_or_else(|| Status::not_found("node not found"))?;
    let svc = st
        .services
        .get(&(node.node.clone(), req.service_id.clone()))
        .ok_or_else(|| {
            Status::not_found(format!(
                "service {:?} not found on node {:?}",
                req.service_id, node.node
            ))
        })?;
    // Consul's: the caller may read the service it asks about.
    if !authz.service_read(&svc.service) {
        return Err(Status::permission_denied(
            authz.deny("service:read", &svc.service).to_string(),
        ));
    }
    let p = super::dataplane::bootstrap_params_for(&st, node, svc, s.datacenter());
    Ok(GetEnvoyBootstrapParamsResponse {
        service_kind: service_kind_number(p.service_kind),
        service: p.service,
        namespace: p.namespace,
        partition: p.partition,
        datacenter: p.datacenter,
        config: Some(to_struct(&p.config)),
        node_id: p.node_id,
        node_name: p.node_name,
        access_logs: p.access_logs,
        identity: p.identity,
    })
}

type BoxFut = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

/// Answers one unary call with `f`.
fn unary<Req, Resp, F>(req: http::Request<Body>, f: F) -> BoxFut
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: Fn(Req) -> Result<Resp, Status> + Clone + Send + Sync + 'static,
{
    Box::pin(async move {
        let svc = tower::service_fn(move |r: Request<Req>| {
            let f = f.clone();
            async move { f(r.into_inner()).map(Response::new) }
        });
        let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
        Ok(grpc.unary(svc, req).await)
    })
}

/// Answers one unary call with the future `f` makes.
fn unary_async<Req, Resp, F, Fut>(req: http::Request<Body>, f: F) -> BoxFut
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: Fn(Req) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    Box::pin(async move {
        let svc = tower::service_fn(move |r: Request<Req>| {
            let f = f.clone();
            async move { f(r.into_inner()).await.map(Response::new) }
        });
        let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
        Ok(grpc.unary(svc, req).await)
    })
}

fn unimplemented() -> BoxFut {
    Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) })
}

/// A service whose messages are written here by hand: its name, and its
/// answer to a call of `method` (the path's last segment).
trait Methods: Clone + Send + Sync + 'static {
    const NAME: &'static str;
    fn call(s: &App, method: &str, req: http::Request<Body>) -> BoxFut;
}

/// The tower plumbing of a `Methods` service: always ready, each call
/// handed to it by method name.
#[derive(Clone)]
struct Service<M>(App, PhantomData<M>);

impl<M: Methods> Service<M> {
    fn new(s: App) -> Self {
        Service(s, PhantomData)
    }
}

impl<M: Methods> NamedService for Service<M> {
    const NAME: &'static str = M::NAME;
}

impl<M: Methods> tower::Service<http::Request<Body>> for Service<M> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> BoxFut {
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        M::call(&self.0, &method, req)
    }
}

#[derive(Clone)]
struct Dataplane;

impl Methods for Dataplane {
    const NAME: &'static str = "hashicorp.consul.dataplane.DataplaneService";

    fn call(s: &App, method: &str, req: http::Request<Body>) -> BoxFut {
        let s = s.clone();
        match method {
            "GetSupportedDataplaneFeatures" => {
                unary(req, |_: GetSupportedDataplaneFeaturesRequest| {
                    Ok(GetSupportedDataplaneFeaturesResponse {
                        supported_dataplane_features: FEATURES
                            .iter()
                            .map(|f| DataplaneFeatureSupport {
                                feature_name: *f,
                                supported: true,
                            })
                            .collect(),
                    })
                })
            }
            "GetEnvoyBootstrapParams" => {
                let token = req
                    .headers()
                    .get(crate::xds::TOKEN_METADATA)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                unary(req, move |r: GetEnvoyBootstrapParamsRequest| {
                    bootstrap(&s, token.as_deref(), r)
                })
            }
            _ => unimplemented(),
        }
    }
}

// --- hashicorp.consul.acl -------------------------------------------------

/// consul-dataplane's `-credential-type=login`: `Login` with the
/// workload's bearer token, `Logout` of the token it got, the same checks
/// and answers as `/v1/acl/login` and `/logout` (`http::login`).
#[derive(Clone)]
struct AclService;

#[derive(Clone, PartialEq, prost::Message)]
pub struct LoginRequest {
    #[prost(string, tag = "1")]
    pub auth_method: String,
    #[prost(string, tag = "2")]
    pub bearer_token: String,
    #[prost(btree_map = "string, string", tag = "3")]
    pub meta: std::collections::BTreeMap<String, String>,
    #[prost(string, tag = "4")]
    pub namespace: String,
    #[prost(string, tag = "5")]
    pub partition: String,
    #[prost(string, tag = "6")]
    pub datacenter: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LoginToken {
    #[prost(string, tag = "1")]
    pub accessor_id: String,
    #[prost(string, tag = "2")]
    pub secret_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LoginResponse {
    #[prost(message, optional, tag = "1")]
    pub token: Option<LoginToken>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LogoutRequest {
    #[prost(string, tag = "1")]
    pub token: String,
    #[prost(string, tag = "2")]
    pub datacenter: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LogoutResponse {}

/// An HTTP layer error as the gRPC status Consul's ACL service answers.
fn acl_status(e: crate::error::Error) -> Status {
    use crate::error::Error;
    match e {
        Error::Forbidden(m) => Status::permission_denied(m),
        Error::BadRequest(m) => Status::invalid_argument(m),
        Error::Busy(m) => Status::resource_exhausted(m),
        Error::Unauthorized(m) => Status::failed_precondition(m),
        other => Status::internal(other.to_string()),
    }
}

/// Only this datacenter (and Consul open source's one tenancy) answers.
fn local_only(s: &App, dc: &str, tenancy: &[&str]) -> Result<(), Status> {
    if !dc.is_empty() && dc != s.datacenter() {
        return Err(Status::invalid_argument(format!(
            "datacenter {dc:?}: log in through that datacenter's servers"
        )));
    }
    if tenancy.iter().any(|t| !t.is_empty() && *t != "default") {
        return Err(Status::invalid_argument(
            "only the default namespace and partition exist (Consul open source)",
        ));
    }
    Ok(())
}

impl Methods for AclService {
    const NAME: &'static str = "hashicorp.consul.acl.ACLService";

    fn call(s: &App, method: &str, req: http::Request<Body>) -> BoxFut {
        let s = s.clone();
        match method {
            "Login" => unary_async(req, move |r: LoginRequest| {
                let s = s.clone();
                async move {
                    local_only(&s, &r.datacenter, &[&r.namespace, &r.partition])?;
                    let body = crate::structs::auth::LoginBody {
                        auth_method: r.auth_method,
                        bearer_token: r.bearer_token,
                        meta: r.meta,
                    };
                    // The port's own per-IP connection cap bounds its callers.
                    let (accessor_id, secret_id) = super::login::login_token(&s, body, None)
                        .await
                        .map_err(acl_status)?;
                    Ok(LoginResponse {
                        token: Some(LoginToken {
                            accessor_id,
                            secret_id,
                        }),
                    })
                }
            }),
            "Logout" => unary_async(req, move |r: LogoutRequest| {
                let s = s.clone();
                async move {
                    local_only(&s, &r.datacenter, &[])?;
                    let token = Some(r.token.as_str()).filter(|t| !t.is_empty());
                    super::login::logout_token(&s, token)
                        .await
                        .map_err(acl_status)?;
                    Ok(LogoutResponse {})
                }
            }),
            _ => unimplemented(),
        }
    }
}

// --- hashicorp.consul.serverdiscovery -------------------------------------

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
struct ServerDiscovery;

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
        let token = req
            .headers()
            .get(crate::xds::TOKEN_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
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
