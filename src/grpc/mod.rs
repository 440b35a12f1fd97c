//! The gRPC port (`--grpc-addr`, default 127.0.0.1:8502; TLS with the
//! server's certificate when the TLS files are given), an adapter beside
//! `http` over the endpoint layer: Envoy's ADS, Delta and
//! state-of-the-world (`xds::Ads` over `endpoint::proxycfg::Mesh`, fed by
//! this server's proxycfg snapshots; proxyless gRPC clients on the latter)
//! and consul-dataplane's own services from Consul's public protos:
//! `hashicorp.consul.dataplane.DataplaneService` (`dataplane`: the
//! bootstrap parameters of `endpoint::dataplane`),
//! `hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers`
//! (`discovery`) and `hashicorp.consul.acl.ACLService` (`acl`: `Login`,
//! `Logout` of `endpoint::login`).
//!
//! The dataplane's messages are few and small: written here as prost
//! messages rather than generated (no protoc in the build). An endpoint's
//! error is answered through the one table, `From<&Error> for Status`
//! (`crate::error`).
//!
//! Each service is a `Methods` impl behind one generic tower `Service`;
//! TLS negotiates h2 by ALPN. The port is bounded: at most
//! `--grpc-max-conns` connections (`MAX_CONNS`, 4,096; past it a new one is
//! closed at once), a quarter of them from one client IP, and 1,024
//! streams on one connection, so one client cannot take every slot. A
//! gRPC login (`acl`) is held to the login bound of its client IP, as
//! HTTP's callers are.

mod acl;
mod dataplane;
mod discovery;

pub use discovery::{ServerInfo, WatchServersRequest, WatchServersResponse};

use std::convert::Infallible;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use axum::http;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use crate::server::Server;

type App = Arc<Server>;

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
    let mesh = crate::endpoint::proxycfg::Mesh(s.clone());
    let ads = crate::xds::Ads::service(Arc::new(mesh), xds);
    tonic::service::Routes::new(ads)
        .add_service(Service::<dataplane::Dataplane>::new(s.clone()))
        .add_service(Service::<discovery::ServerDiscovery>::new(s.clone()))
        .add_service(Service::<acl::AclService>::new(s.clone()))
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

pub(crate) type BoxFut =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

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

/// The caller's token, from the `x-consul-token` metadata.
fn token_of(req: &http::Request<Body>) -> Option<String> {
    req.headers()
        .get(crate::xds::TOKEN_METADATA)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}
