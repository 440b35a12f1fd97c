//! Serving the HTTP API within limits: a cap on open connections and one
//! on those of each client IP (Consul's `http_max_conns_per_client`), a
//! header-read timeout (from a request's first byte to the end of its
//! head), a least rate for a request's body (after the same grace), and an
//! idle timeout (no request in flight and no byte moved).
//! Blocking queries are capped apart (`Blocking`).
//!
//! axum's own `serve` has none of these; a connection here is hyper's
//! HTTP/1.1 with a watchdog beside it. HTTPS (`serve_tls`) is the same
//! within the same limits, its TLS handshake done after the connection is
//! admitted and bounded by the header-read timeout.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::shares::{Share, Shares};

/// The limits of the HTTP port.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections open at once; past it a new one is closed at once.
    pub max_conns: usize,
    /// Connections one client IP holds open at once; past it a new one
    /// from that IP is closed at once (the others' are still taken).
    pub max_conns_per_client: usize,
    /// IPs the per-client cap does not count: the cluster's own servers,
    /// whose followers forward every client's request to the leader here.
    pub exempt: Option<Exempt>,
    /// A request's head must arrive whole within this of its first byte.
    pub header_timeout: Duration,
    /// A connection with no request in flight and no byte read or written
    /// for this long is closed (longer than clients' own idle timeouts, 90 s
    /// in Go, so that they close first and never race a close).
    pub idle_timeout: Duration,
    /// Blocking queries waiting at once; past it one answers 429.
    pub max_blocking: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            // 10,000 watchers (the benchmark) plus room for everything
            // else, within the descriptors the process may open.
            max_conns: 16_384.min(fd_budget()),
            // Consul's default.
            max_conns_per_client: 200,
            exempt: None,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_blocking: 16_384,
        }
    }
}

/// Which client IPs are servers of this cluster (asked only of an IP at
/// its cap).
#[derive(Clone)]
pub struct Exempt(pub Arc<dyn Fn(std::net::IpAddr) -> bool + Send + Sync>);

impl std::fmt::Debug for Exempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exempt")
    }
}

/// The cap on reads waiting at once (`HttpLimits::max_blocking`): blocking
/// queries, and every other read that holds its request open (a proxy's
/// snapshot, a leaf, the event stream, an agent's hash-blocking read), so
/// none of them can take the memory and descriptors the others need. One
/// per server, shared with its own agent.
#[derive(Debug, Clone)]
pub struct Blocking {
    places: Arc<Semaphore>,
    max: usize,
    /// The places each caller holds (ACLs on), so that no token, and no
    /// client IP's anonymous reads, takes them all.
    callers: Arc<Shares<Caller>>,
}

/// Who holds a blocking place, for its share: a token (by its accessor),
/// or the anonymous token from one client IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    Token(String),
    Anonymous(Option<std::net::IpAddr>),
}

impl Caller {
    /// The caller of a request whose token is `authz` from `ip`.
    pub fn of(authz: &crate::acl::Authorizer, ip: Option<std::net::IpAddr>) -> Caller {
        if authz.is_anonymous() {
            Caller::Anonymous(ip)
        } else {
            Caller::Token(authz.accessor().to_string())
        }
    }

    /// The caller of a request sent on unresolved (to another datacenter,
    /// which judges its token): the secret by its hash, or the anonymous
    /// token from `ip`.
    pub fn of_secret(secret: Option<&str>, ip: Option<std::net::IpAddr>) -> Caller {
        match secret.filter(|t| !t.is_empty()) {
            None => Caller::Anonymous(ip),
            Some(t) => Caller::Token(crate::structs::acl::secret_hash(t)),
        }
    }

    /// The most places this caller holds of `max`: a quarter for a token,
    /// an eighth for one IP's anonymous reads (at least one each).
    pub fn share(&self, max: usize) -> usize {
        match self {
            Caller::Token(_) => (max / 4).max(1),
            Caller::Anonymous(_) => (max / 8).max(1),
        }
    }
}

/// A blocking place (and its caller's share of them), held while a read
/// waits.
pub struct Place {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _share: Option<Share<Caller>>,
}

impl Blocking {
    pub fn new(max: usize) -> Self {
        Blocking {
            places: Arc::new(Semaphore::new(max)),
            max,
            callers: Arc::default(),
        }
    }

    /// A place, held while the read waits; none left: 429, as Consul's
    /// limiter answers.
    pub fn permit(&self) -> crate::error::Result<Place> {
        self.permit_for(None)
    }

    /// A place for `caller` (none: counted in no share), within its share.
    pub fn permit_for(&self, caller: Option<Caller>) -> crate::error::Result<Place> {
        let share = match caller {
            None => None,
            Some(c) => {
                let max = c.share(self.max);
                Some(self.callers.take(c, max).ok_or_else(|| {
                    crate::metrics::BLOCKING_REFUSED_BUSY.inc();
                    crate::error::Error::Busy(format!(
                        "Too many blocking queries for this caller (max {max} of {}): try again later",
                        self.max
                    ))
                })?)
            }
        };
        let permit = self.places.clone().try_acquire_owned().map_err(|_| {
            crate::metrics::BLOCKING_REFUSED_BUSY.inc();
            crate::error::Error::Busy(format!(
                "Too many blocking queries on this server (max {}): try again later",
                self.max
            ))
        })?;
        Ok(Place {
            _permit: permit,
            _share: share,
        })
    }
}

/// File descriptors HTTP may use: the soft limit less a reserve for the
/// Raft port, the data dir and outgoing connections.
fn fd_budget() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|n| n.parse::<usize>().ok())
        })
        .unwrap_or(1024);
    soft.saturating_sub(1024).max(64)
}

/// The client IP of a request, as its connection came (an extension).
#[derive(Debug, Clone, Copy)]
pub struct ClientIp(pub std::net::IpAddr);

/// The least rate a request's body arrives at, after the header timeout's
/// grace: a body trickled slower holds its connection no longer than a
/// head that never ends (its request is answered 400 and closed). Any link
/// an API client uses moves far more.
const BODY_MIN_BYTES_PER_SEC: u64 = 16 << 10;

/// A request body, as hyper reads it, that must keep
/// `BODY_MIN_BYTES_PER_SEC` after `grace` (boxed once, by the router's
/// `Body`).
struct RatedBody {
    body: hyper::body::Incoming,
    start: tokio::time::Instant,
    grace: Duration,
    read: u64,
    /// Made only for a body that is waited for (most have arrived whole).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl RatedBody {
    fn new(body: hyper::body::Incoming, grace: Duration) -> Self {
        RatedBody {
            body,
            start: tokio::time::Instant::now(),
            grace,
            read: 0,
            timer: None,
        }
    }

    /// When what was read so far stops being enough.
    fn due(&self) -> tokio::time::Instant {
        self.start + self.grace + Duration::from_millis(self.read * 1000 / BODY_MIN_BYTES_PER_SEC)
    }
}

impl http_body::Body for RatedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            if let Some(Ok(f)) = &frame
                && let Some(d) = f.data_ref()
            {
                self.read += d.len() as u64;
            }
            return Poll::Ready(frame.map(|r| r.map_err(axum::Error::new)));
        }
        let due = self.due();
        if tokio::time::Instant::now() >= due {
            crate::metrics::HTTP_SLOW_BODIES.inc();
            return Poll::Ready(Some(Err(axum::Error::new(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("request body slower than {BODY_MIN_BYTES_PER_SEC} bytes/s"),
            )))));
        }
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        timer.as_mut().reset(due);
        // Pending until the deadline (then polled again, above) or a frame.
        let _ = timer.as_mut().poll(cx);
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What the watchdog of one connection reads.
#[derive(Default)]
struct Clock {
    /// Milliseconds since `start` of the last byte read or written.
    last_io: AtomicU64,
    /// When the head of a request not yet handed to the router began
    /// (ms since `start`, +1; 0: none).
    head_since: AtomicU64,
    /// Requests being answered (until their body has been sent).
    in_flight: AtomicUsize,
}

struct Conn<S> {
    io: S,
    clock: Arc<Clock>,
    start: Instant,
}

fn ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let now = ms(self.start);
            self.clock.last_io.store(now, Ordering::Relaxed);
            // Bytes with nothing in flight start a request's head.
            if self.clock.in_flight.load(Ordering::Relaxed) == 0 {
                let _ = self.clock.head_since.compare_exchange(
                    0,
                    now + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r
            && *n > 0
        {
            self.clock.last_io.store(ms(self.start), Ordering::Relaxed);
        }
        r
    }

    // Passed through, so hyper writes head and body without copying them
    // into one buffer first.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r
            && *n > 0
        {
            self.clock.last_io.store(ms(self.start), Ordering::Relaxed);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A request counted in flight until its response body is done.
struct InFlight(Arc<Clock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted in flight.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves `app` on `listener` within `limits` until `stop` is notified.
pub async fn serve(
    listener: TcpListener, app: Router, limits: HttpLimits, stop: Arc<tokio::sync::Notify>,
) {
    serve_with(listener, app, limits, stop, None).await
}

/// Serves `app` over HTTPS on `listener`, as [`serve`] does over HTTP.
pub async fn serve_tls(
    listener: TcpListener, app: Router, limits: HttpLimits, stop: Arc<tokio::sync::Notify>,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    serve_with(listener, app, limits, stop, Some(acceptor)).await
}

async fn serve_with(
    listener: TcpListener, app: Router, limits: HttpLimits, stop: Arc<tokio::sync::Notify>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let conns = Arc::new(Semaphore::new(limits.max_conns));
    let clients: Arc<Shares<std::net::IpAddr>> = Arc::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.notified() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors, most likely: let some close.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let slot = clients.take(peer.ip(), limits.max_conns_per_client);
        if slot.is_none() && !limits.exempt.as_ref().is_some_and(|e| (e.0)(peer.ip())) {
            crate::metrics::HTTP_CONNS_REFUSED.inc();
            tracing::debug!(%peer, "HTTP connection refused: over the client's connection cap");
            continue;
        }
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            // Closed at once (dropped): it holds no descriptor.
            crate::metrics::HTTP_CONNS_REFUSED.inc();
            tracing::debug!(%peer, "HTTP connection refused: over the connection cap");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let limits = limits.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = (permit, slot);
            let Some(acceptor) = tls else {
                return serve_conn(stream, peer.ip(), app, &limits).await;
            };
            // A handshake is a request's head as far as time goes: a peer
            // that stalls in it holds a connection no longer than one that
            // stalls sending headers.
            match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
                Ok(Ok(s)) => serve_conn(s, peer.ip(), app, &limits).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "HTTPS handshake failed"),
                Err(_) => tracing::debug!(%peer, "HTTPS handshake timed out"),
            }
        });
    }
}

async fn serve_conn<S>(stream: S, ip: std::net::IpAddr, app: Router, limits: &HttpLimits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt;
    let start = Instant::now();
    let clock = Arc::new(Clock::default());
    let io = Conn {
        io: stream,
        clock: clock.clone(),
        start,
    };
    let grace = limits.header_timeout;
    let service = {
        let clock = clock.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            clock.in_flight.fetch_add(1, Ordering::Relaxed);
            clock.head_since.store(0, Ordering::Relaxed);
            let in_flight = InFlight(clock.clone());
            let app = app.clone();
            async move {
                let mut req = req.map(|b| Body::new(RatedBody::new(b, grace)));
                req.extensions_mut().insert(ClientIp(ip));
                let resp = app.oneshot(req).await?;
                Ok::<_, std::convert::Infallible>(resp.map(|body| {
                    Body::new(Tracked {
                        body,
                        _in_flight: in_flight,
                    })
                }))
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let header_ms = limits.header_timeout.as_millis() as u64;
    let idle_ms = limits.idle_timeout.as_millis() as u64;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tick.tick() => {
                let now = ms(start);
                let head = clock.head_since.load(Ordering::Relaxed);
                let busy = clock.in_flight.load(Ordering::Relaxed) > 0;
                let slow_head = !busy && head > 0 && now + 1 - head > header_ms;
                let idle = !busy && head == 0
                    && now.saturating_sub(clock.last_io.load(Ordering::Relaxed)) > idle_ms;
                if slow_head || idle {
                    tracing::debug!(slow_head, idle, "HTTP connection closed");
                    // Nothing is in flight: closing loses no answer.
                    return;
                }
            }
        }
    }
}
