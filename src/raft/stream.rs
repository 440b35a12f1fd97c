//! The byte streams between servers, below every transport: what the Raft
//! transport (`network`) speaks over and what a secure one (`secure`: TLS,
//! or `--encrypt`) wraps, so neither needs the other's types.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

/// A byte stream between two servers (`Any`: a TLS stream is found by
/// its type, `secure::certified`).
pub trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::any::Any {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> PeerStream for T {}

/// A boxed stream: one type for every transport, so `Conn`, `Network` and
/// the cluster need no type parameter.
pub type BoxStream = Box<dyn PeerStream>;

/// A stream being opened (what `Connect::connect` returns).
pub type Connecting<'a> = Pin<Box<dyn Future<Output = io::Result<BoxStream>> + Send + 'a>>;

/// Whom a stream is opened to: a server of this datacenter (Raft,
/// formation), of a named other one, or of one not known yet (a
/// `--join-wan` address: `federation` checks that the datacenter its
/// certificate proved is the one it says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dial {
    Local,
    Datacenter(String),
    AnyDatacenter,
}

/// Opens a stream to a peer's Raft address.
pub trait Connect: Send + Sync + 'static {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a>;

    /// A stream to a server of `dial`: a transport that proves who peers
    /// are (TLS) checks it; the others connect the same way.
    fn connect_to<'a>(&'a self, addr: &'a str, dial: &'a Dial) -> Connecting<'a> {
        let _ = dial;
        self.connect(addr)
    }
}

/// Accepts streams on this server's Raft address, with the peer's IP.
pub trait Accept: Send + 'static {
    fn accept(&mut self) -> impl Future<Output = io::Result<(BoxStream, IpAddr)>> + Send;
}

/// The production transport: TCP with Nagle off (RPCs are small and
/// latency-bound).
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnect;

impl Connect for TcpConnect {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a> {
        Box::pin(async move {
            let s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok(Box::new(s) as BoxStream)
        })
    }
}

impl Accept for TcpListener {
    async fn accept(&mut self) -> io::Result<(BoxStream, IpAddr)> {
        let (s, peer) = TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok((Box::new(s), peer.ip()))
    }
}
