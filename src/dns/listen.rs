//! The DNS listeners: one UDP socket and one TCP listener on the same
//! address, each bounded so that no client can wedge them.
//!
//! UDP: a query is at most `MAX_QUERY` bytes (a longer datagram is cut by
//! the read and then fails to decode); at most `UDP_IN_FLIGHT` queries are
//! answered at once, past it a query is dropped (the client retries).
//! TCP: at most `TCP_CONNS` connections, and `TCP_CONNS_PER_IP` from one
//! client IP, past them a new one is closed at once; each message must arrive whole within `TCP_READ` of the last
//! answer (slow or idle clients are closed), each answer be written within
//! `TCP_WRITE`. Every lookup is bounded by `LOOKUP` (an agent's may wait on
//! a server): past it the query gets SERVFAIL.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::answer::{EDNS_PAYLOAD, answer};
use super::{Catalog, DnsConfig};

const MAX_QUERY: usize = EDNS_PAYLOAD as usize;
const UDP_IN_FLIGHT: usize = 1024;
const TCP_CONNS: usize = 512;
const TCP_CONNS_PER_IP: usize = 64;
const TCP_READ: Duration = Duration::from_secs(10);
const TCP_WRITE: Duration = Duration::from_secs(10);
const LOOKUP: Duration = Duration::from_secs(5);

/// The bound sockets; `addr` is where they listen (the real port when
/// `--dns-addr` asked for port 0).
pub struct Listeners {
    udp: UdpSocket,
    tcp: TcpListener,
    pub addr: SocketAddr,
}

/// Why the DNS interface could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on --dns-addr {addr} ({proto}): {source}")]
pub struct BindError {
    addr: SocketAddr,
    proto: &'static str,
    source: std::io::Error,
}

/// Binds UDP, then TCP on the same port. A port in use refuses the start,
/// as Consul's agent does.
pub async fn bind(addr: SocketAddr) -> Result<Listeners, BindError> {
    let err = |proto, source| BindError {
        addr,
        proto,
        source,
    };
    let udp = UdpSocket::bind(addr).await.map_err(|e| err("udp", e))?;
    let addr = udp.local_addr().map_err(|e| err("udp", e))?;
    let tcp = TcpListener::bind(addr).await.map_err(|e| err("tcp", e))?;
    Ok(Listeners { udp, tcp, addr })
}

pub async fn serve<C: Catalog>(l: Listeners, cfg: Arc<DnsConfig>, catalog: Arc<C>) {
    tracing::info!(addr = %l.addr, domain = %cfg.domain, "DNS listening (UDP and TCP)");
    let udp = Arc::new(l.udp);
    tokio::join!(
        serve_udp(udp, cfg.clone(), catalog.clone()),
        serve_tcp(l.tcp, cfg, catalog)
    );
}

async fn resolve<C: Catalog>(
    cfg: &DnsConfig, catalog: &C, raw: &[u8], udp: bool,
) -> Option<Vec<u8>> {
    match tokio::time::timeout(LOOKUP, answer(cfg, catalog, raw, udp)).await {
        Ok(out) => out,
        Err(_) => servfail(raw),
    }
}

/// SERVFAIL for a query whose lookup ran out of time.
fn servfail(raw: &[u8]) -> Option<Vec<u8>> {
    let req = hickory_proto::op::Message::from_vec(raw).ok()?;
    let mut m = hickory_proto::op::Message::response(req.metadata.id, req.metadata.op_code);
    m.metadata.response_code = hickory_proto::op::ResponseCode::ServFail;
    m.add_queries(req.queries);
    m.to_vec().ok()
}

async fn serve_udp<C: Catalog>(udp: Arc<UdpSocket>, cfg: Arc<DnsConfig>, catalog: Arc<C>) {
    let in_flight = Arc::new(Semaphore::new(UDP_IN_FLIGHT));
    let mut buf = vec![0u8; MAX_QUERY];
    loop {
        let (n, peer) = match udp.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "DNS UDP receive failed");
                continue;
            }
        };
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "DNS: too many queries in flight, one dropped");
            continue;
        };
        let raw = buf[..n].to_vec();
        let (udp, cfg, catalog) = (udp.clone(), cfg.clone(), catalog.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(out) = resolve(&cfg, &*catalog, &raw, true).await {
                let _ = udp.send_to(&out, peer).await;
            }
        });
    }
}

async fn serve_tcp<C: Catalog>(tcp: TcpListener, cfg: Arc<DnsConfig>, catalog: Arc<C>) {
    let conns = Arc::new(Semaphore::new(TCP_CONNS));
    let per_ip: Arc<crate::shares::Shares<std::net::IpAddr>> = Arc::default();
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors, most likely: let some close.
                tracing::debug!(error = %e, "DNS TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(share) = per_ip.take(peer.ip(), TCP_CONNS_PER_IP) else {
            tracing::debug!(%peer, "DNS: too many TCP connections from one IP, one closed");
            continue;
        };
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "DNS: too many TCP connections, one closed");
            continue;
        };
        let permit = (permit, share);
        let (cfg, catalog) = (cfg.clone(), catalog.clone());
        tokio::spawn(async move {
            let _permit = permit;
            connection(stream, &cfg, &*catalog).await;
        });
    }
}

/// Queries on one TCP connection, each a 2-byte length and the message,
/// answered in order until the client closes or is too slow.
async fn connection<C: Catalog>(mut stream: TcpStream, cfg: &DnsConfig, catalog: &C) {
    let mut buf = Vec::new();
    loop {
        let read = async {
            let len = stream.read_u16().await? as usize;
            buf.resize(len, 0);
            stream.read_exact(&mut buf).await
        };
        match tokio::time::timeout(TCP_READ, read).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let Some(out) = resolve(cfg, catalog, &buf, false).await else {
            // Not a query at all: nothing sensible follows on this stream.
            return;
        };
        let write = async {
            let len = u16::try_from(out.len()).unwrap_or(u16::MAX);
            stream.write_u16(len).await?;
            stream.write_all(&out[..usize::from(len)]).await?;
            stream.flush().await
        };
        if !matches!(tokio::time::timeout(TCP_WRITE, write).await, Ok(Ok(()))) {
            return;
        }
    }
}
