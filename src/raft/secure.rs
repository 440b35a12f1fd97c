//! Mutual TLS around the Raft transport's streams: a `Connect` and an
//! `Accept` that wrap another's (TCP in a server), so the frame code in
//! `network` never changes and never sees a byte from a peer whose
//! certificate was not verified.
//!
//! Both sides check the other's certificate against the CA and the name
//! `server.<dc>.consul` (`crate::tls`). The accepting side does its
//! handshake lazily, on the connection's first read, inside the connection
//! task: the port's caps admit the connection first and its first-frame
//! timeout bounds the handshake, so a stalled handshake costs what a
//! silent connection does. The connecting side's handshake is inside the
//! RPC's own timeout.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::network::{Accept, BoxStream, Connect, Connecting};

/// Opens TLS streams to peers over another `Connect`.
pub struct TlsConnect {
    inner: Arc<dyn Connect>,
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl TlsConnect {
    /// `config` presents this server's certificate and trusts the CA; the
    /// peer must prove `server.<datacenter>.consul`.
    pub fn new(
        inner: Arc<dyn Connect>, config: rustls::ClientConfig, datacenter: &str,
    ) -> Result<Self, crate::tls::TlsError> {
        let name = crate::tls::server_name(datacenter);
        Ok(TlsConnect {
            inner,
            connector: TlsConnector::from(Arc::new(config)),
            name: ServerName::try_from(name.clone())
                .map_err(|e| crate::tls::TlsError::Invalid(format!("{name}: {e}")))?,
        })
    }
}

impl Connect for TlsConnect {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a> {
        Box::pin(async move {
            let stream = self.inner.connect(addr).await?;
            let tls = self
                .connector
                .connect(self.name.clone(), stream)
                .await
                .inspect_err(
                    |e| tracing::warn!(%addr, error = %e, "raft TLS handshake with peer failed"),
                )?;
            Ok(Box::new(tls) as BoxStream)
        })
    }
}

/// Accepts TLS streams over another `Accept`.
pub struct TlsAccept<A> {
    inner: A,
    acceptor: TlsAcceptor,
}

impl<A: Accept> TlsAccept<A> {
    /// `config` requires a client certificate of the CA for
    /// `server.<dc>.consul` (`Tls::raft_server`).
    pub fn new(inner: A, config: Arc<rustls::ServerConfig>) -> Self {
        TlsAccept {
            inner,
            acceptor: TlsAcceptor::from(config),
        }
    }
}

impl<A: Accept> Accept for TlsAccept<A> {
    async fn accept(&mut self) -> io::Result<(BoxStream, IpAddr)> {
        let (stream, ip) = self.inner.accept().await?;
        let state = State::Handshaking(Box::new(self.acceptor.accept(stream)));
        Ok((Box::new(Accepting { state, ip }), ip))
    }
}

enum State {
    Handshaking(Box<tokio_rustls::Accept<BoxStream>>),
    Ready(Box<tokio_rustls::server::TlsStream<BoxStream>>),
    Failed,
}

/// An accepted stream whose handshake is finished on its first use; a
/// failed handshake fails every read and write.
struct Accepting {
    state: State,
    ip: IpAddr,
}

impl Accepting {
    /// Drives the handshake; `Ready(Ok)` once the stream is usable.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Handshaking(h) => match Pin::new(h.as_mut()).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(s)) => {
                    self.state = State::Ready(Box::new(s));
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Err(e)) => {
                    self.state = State::Failed;
                    crate::metrics::RAFT_FRAMES_REFUSED.inc();
                    tracing::warn!(ip = %self.ip, error = %e, "raft connection refused: TLS handshake failed");
                    Poll::Ready(Err(e))
                }
            },
            State::Ready(_) => Poll::Ready(Ok(())),
            State::Failed => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "TLS handshake failed",
            ))),
        }
    }

    fn ready(&mut self) -> &mut tokio_rustls::server::TlsStream<BoxStream> {
        match &mut self.state {
            State::Ready(s) => s,
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
            State::Ready(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            // Nothing was ever sent: nothing to close politely.
            _ => Poll::Ready(Ok(())),
        }
    }
}
