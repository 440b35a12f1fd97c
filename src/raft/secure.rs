//! Mutual TLS around the Raft transport's streams: a `Connect` and an
//! `Accept` that wrap another's (TCP in a server), so the frame code in
//! `network` never changes and never sees a byte from a peer whose
//! certificate was not verified.
//!
//! Both sides check the other's certificate against the CA and a server
//! name `server.<dc>.<domain>` (`crate::tls`): a server dialing checks the
//! name of the datacenter it dials (its own for Raft, another's for WAN
//! federation, any for a `--join-wan` address not yet known); the port
//! takes a server of any datacenter, and what its certificate proved
//! (`Certified`, [`certified`]) decides which frames it may send
//! (`network`: Raft's only from this datacenter's servers, a greeting or
//! request only from a server of the datacenter it claims). The accepting
//! side does its
//! handshake lazily, on the connection's first read, inside the connection
//! task: the port's caps admit the connection first and its first-frame
//! timeout bounds the handshake, so a stalled handshake costs what a
//! silent connection does. The connecting side's handshake is inside the
//! RPC's own timeout.

use std::any::Any;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::stream::{Accept, BoxStream, Connect, Connecting, Dial};
use crate::tls::{Certified, TlsError, server_name};

/// Opens TLS streams to peers over another `Connect`.
pub struct TlsConnect {
    inner: Arc<dyn Connect>,
    /// Checks the name of the datacenter dialed.
    named: TlsConnector,
    /// Takes a server of any datacenter (`Dial::AnyDatacenter`).
    any: TlsConnector,
    datacenter: String,
    domain: String,
}

impl TlsConnect {
    /// Presents this server's certificate and trusts the CA; the peer must
    /// prove `server.<dc>.<domain>` for the datacenter dialed (this one's
    /// unless told otherwise).
    pub fn new(
        inner: Arc<dyn Connect>, tls: &crate::tls::Tls, datacenter: &str, domain: &str,
    ) -> Result<Self, TlsError> {
        Ok(TlsConnect {
            inner,
            named: TlsConnector::from(Arc::new(tls.client()?)),
            any: TlsConnector::from(Arc::new(tls.client_any_server(domain)?)),
            datacenter: datacenter.to_string(),
            domain: domain.to_string(),
        })
    }

    fn name(&self, dc: &str) -> io::Result<ServerName<'static>> {
        let name = server_name(dc, &self.domain);
        ServerName::try_from(name.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: {e}")))
    }
}

impl Connect for TlsConnect {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a> {
        self.connect_to(addr, &Dial::Local)
    }

    fn connect_to<'a>(&'a self, addr: &'a str, dial: &'a Dial) -> Connecting<'a> {
        Box::pin(async move {
            let (connector, name) = match dial {
                Dial::Local => (&self.named, self.name(&self.datacenter)?),
                Dial::Datacenter(dc) => (&self.named, self.name(dc)?),
                // The name sent is only a hint; the verifier takes any
                // server's.
                Dial::AnyDatacenter => (&self.any, self.name(&self.datacenter)?),
            };
            let stream = self.inner.connect(addr).await?;
            let tls = connector.connect(name, stream).await.inspect_err(
                |e| tracing::warn!(%addr, error = %e, "raft TLS handshake with peer failed"),
            )?;
            let certified = match tls.get_ref().1.peer_certificates() {
                Some([leaf, ..]) => Certified::of(leaf, &self.datacenter, &self.domain),
                _ => return Err(io::Error::other("the peer presented no certificate")),
            };
            Ok(Box::new(Connected {
                stream: tls,
                certified,
            }) as BoxStream)
        })
    }
}

/// A dialed TLS stream with what the peer's certificate proved.
struct Connected {
    stream: tokio_rustls::client::TlsStream<BoxStream>,
    certified: Certified,
}

impl AsyncRead for Connected {
    fn poll_read(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connected {
    fn poll_write(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What the peer of a stream proved with its certificate: `None` on a
/// transport without certificates (TCP, `--encrypt`: the key or the
/// network is all the proof there is). Streams are boxed whatever their
/// transport, so the TLS ones are recognized by their type; TLS is the
/// outermost layer when it is on (`Server::start_tls`).
pub fn certified(s: &BoxStream) -> Option<Certified> {
    let any: &dyn Any = &**s;
    if let Some(c) = any.downcast_ref::<Connected>() {
        return Some(c.certified.clone());
    }
    any.downcast_ref::<Accepting>().map(|a| match &a.state {
        State::Ready(_, c) => c.clone(),
        // Not through its handshake: nothing proved.
        _ => Certified {
            datacenters: Vec::new(),
            local: false,
        },
    })
}

/// Accepts TLS streams over another `Accept`.
pub struct TlsAccept<A> {
    inner: A,
    acceptor: TlsAcceptor,
    datacenter: Arc<str>,
    domain: Arc<str>,
}

impl<A: Accept> TlsAccept<A> {
    /// `config` requires a client certificate of the CA for
    /// `server.<dc>.<domain>` of any datacenter (`Tls::raft_server`);
    /// `datacenter` is this server's.
    pub fn new(
        inner: A, config: Arc<rustls::ServerConfig>, datacenter: &str, domain: &str,
    ) -> Self {
        TlsAccept {
            inner,
            acceptor: TlsAcceptor::from(config),
            datacenter: datacenter.into(),
            domain: domain.into(),
        }
    }
}

impl<A: Accept> Accept for TlsAccept<A> {
    async fn accept(&mut self) -> io::Result<(BoxStream, IpAddr)> {
        let (stream, ip) = self.inner.accept().await?;
        let state = State::Handshaking(Box::new(self.acceptor.accept(stream)));
        Ok((
            Box::new(Accepting {
                state,
                ip,
                datacenter: self.datacenter.clone(),
                domain: self.domain.clone(),
            }),
            ip,
        ))
    }
}

enum State {
    Handshaking(Box<tokio_rustls::Accept<BoxStream>>),
    Ready(Box<tokio_rustls::server::TlsStream<BoxStream>>, Certified),
    Failed,
}

/// An accepted stream whose handshake is finished on its first use; a
/// failed handshake fails every read and write.
struct Accepting {
    state: State,
    ip: IpAddr,
    datacenter: Arc<str>,
    domain: Arc<str>,
}

impl Accepting {
    /// Drives the handshake; `Ready(Ok)` once the stream is usable.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Handshaking(h) => match Pin::new(h.as_mut()).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(s)) => {
                    // The verifier required a certificate.
                    let certified = match s.get_ref().1.peer_certificates() {
                        Some([leaf, ..]) => Certified::of(leaf, &self.datacenter, &self.domain),
                        _ => Certified {
                            datacenters: Vec::new(),
                            local: false,
                        },
                    };
                    self.state = State::Ready(Box::new(s), certified);
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Err(e)) => {
                    self.state = State::Failed;
                    crate::metrics::RAFT_FRAMES_REFUSED.inc();
                    tracing::warn!(ip = %self.ip, error = %e, "raft connection refused: TLS handshake failed");
                    Poll::Ready(Err(e))
                }
            },
            State::Ready(..) => Poll::Ready(Ok(())),
            State::Failed => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "TLS handshake failed",
            ))),
        }
    }

    fn ready(&mut self) -> &mut tokio_rustls::server::TlsStream<BoxStream> {
        match &mut self.state {
            State::Ready(s, _) => s,
            _ => unreachable!("poll_handshake returned Ready(Ok)"),
        }
    }
}

impl AsyncRead for Accepting {
    fn poll_read(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_handshake(cx))?;
        Pin::new(self.ready()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepting {
    fn poll_write(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_handshake(cx))?;
        Pin::new(self.ready()).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_handshake(cx))?;
        Pin::new(self.ready()).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Ready(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
            // Nothing was ever sent: nothing to close politely.
            _ => Poll::Ready(Ok(())),
        }
    }
}
