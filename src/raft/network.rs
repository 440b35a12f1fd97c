//! The TCP transport between servers: length-prefixed bincode frames, one
//! request and its answer at a time per connection, a timeout on every RPC
//! and a reconnect after any failure.
//!
//! Besides Raft's own RPCs it carries the cluster formation messages
//! (`Hello`, `Join`), so servers need only their Raft port to find each other.
//!
//! The byte streams come from a `Connect` (outgoing) and an `Accept`
//! (incoming): tokio's TCP in a server, a simulated network in the
//! deterministic simulation (`sim/`), with the same framing and timeouts.
//!
//! Anything may connect to the Raft port, so nothing a peer sends is
//! trusted: frames are bounded (an oversized one is answered `TooLarge`,
//! which the sender acts on by sending fewer entries), decoding is bounded
//! and never recurses (`state::Payload` is flat), connections are capped in
//! number and closed when idle or slow, a snapshot being received is
//! bounded in size and abandoned with its connection, and Raft messages
//! from a server outside the membership are refused.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use super::frame::{MAX_FRAME, TOO_LARGE_PREFIX, decode};
use super::frame::{encode_frame, read_body};
use super::state_machine::{SnapshotSink, SnapshotStore};
use super::{NodeId, ServerNode, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote};

/// The entries one AppendEntries carries, in log record bytes (at least one
/// entry whatever its size): the log read that fills it stops there.
pub const APPEND_BYTES: usize = 4 << 20;

/// Bytes per second a peer is assumed to take a frame at, at worst: each
/// RPC's timeout grows by its frame's size at this rate.
const SLOW_PEER_RATE: f64 = (4 << 20) as f64;

/// A snapshot travels in chunks of this size (frames stay small, and each
/// chunk gets its own timeout); a larger chunk is refused.
const SNAPSHOT_CHUNK: usize = 4 << 20;

/// The largest snapshot a server receives (into a file of its data dir,
/// never whole in memory; a million KV entries make ~200 MB). Past it the
/// transfer is refused.
pub const MAX_SNAPSHOT_BYTES: u64 = 2 << 30;

/// Snapshots received at once (each a file until installed).
const SNAPSHOT_RECEIVES: usize = 2;

/// An oversized frame up to this is read and discarded so that its sender
/// can read the `TooLarge` answer on the same connection; past it the
/// connection is just closed (no peer of ours sends such a thing).
const DRAIN_MAX: usize = 4 * MAX_FRAME;

/// The limits of the Raft port.
#[derive(Debug, Clone)]
pub struct PortLimits {
    /// Connections open at once; past it a new one is closed at once.
    pub max_conns: usize,
    /// Connections open at once from one IP address.
    pub max_conns_per_ip: usize,
    /// A new connection must send its first frame within this.
    pub first_frame: Duration,
    /// A connection with no frame begun for this long is closed (peers'
    /// connections carry a heartbeat every 150 ms).
    pub idle: Duration,
    /// A connection receiving a snapshot is closed, and the snapshot
    /// abandoned, when no chunk begins for this long.
    pub snapshot_idle: Duration,
    /// A frame, once begun, must arrive whole within this.
    pub frame_read: Duration,
}

impl Default for PortLimits {
    fn default() -> Self {
        PortLimits {
            max_conns: 512,
            max_conns_per_ip: 128,
            first_frame: Duration::from_secs(5),
            idle: Duration::from_secs(60),
            snapshot_idle: Duration::from_secs(15),
            frame_read: Duration::from_secs(30),
        }
    }
}

/// What a server says about itself when servers look for each other.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub id: NodeId,
    pub node: ServerNode,
    /// Whether this server already belongs to a formed cluster.
    pub initialized: bool,
    /// The leader it knows, if any.
    pub leader: Option<(NodeId, ServerNode)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    /// A piece of a snapshot, sent in order on one connection; the receiver
    /// installs it when `done`.
    SnapshotChunk {
        vote: Vote,
        meta: SnapshotMeta,
        offset: u64,
        // Read as one slice, not byte by byte: the same bytes on the wire.
        #[serde(with = "crate::structs::serde_util::raw_bytes")]
        data: Vec<u8>,
        done: bool,
    },
    Hello(Hello),
    /// Add the sender to the cluster (answered by the leader).
    Join(NodeId, ServerNode),
    /// The leader hands office to the receiver (`transfer-leader`).
    TransferLeader(TransferLeaderRequest<TypeConfig>),
    /// A server of another datacenter greets this one (`super::wan`).
    WanHello(super::wan::WanHello),
    /// The connection becomes a channel of endpoint calls
    /// (`super::channel`), answered `Reply::Channel`.
    Channel,
    /// The connection becomes a channel of the requests a server of
    /// datacenter `from` forwards to this one (`?dc=`, replication pulls,
    /// CA signing: `super::wan::WanCalls`), answered `Reply::Channel`.
    WanChannel {
        from: String,
    },
}

/// Raft's answers carry a failure as text: the only failure the local Raft
/// returns to a peer's RPC is that it is shutting down.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Append(Result<AppendEntriesResponse<TypeConfig>, String>),
    Vote(Result<VoteResponse<TypeConfig>, String>),
    /// `None`: chunk received, send the next one.
    Snapshot(Result<Option<SnapshotResponse<TypeConfig>>, String>),
    Hello(Hello),
    Join(Result<(), String>),
    /// The request's frame was over the receiver's limit (in bytes); it
    /// was not processed. An AppendEntries is resent with fewer entries.
    TooLarge(u64),
    TransferLeader(Result<TransferLeaderResponse<TypeConfig>, String>),
    WanHello(Result<super::wan::WanHello, String>),
    Channel(Result<(), String>),
}

pub use super::stream::{Accept, BoxStream, Connect, Connecting, Dial, PeerStream, TcpConnect};

/// How long opening a channel may take (connect, TLS, greetings, answer).
const OPEN_CHANNEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a channel (`super::channel`) to `addr`, a server `dial` names: a
/// connection whose first frame is `first` (`Request::Channel` for a
/// server of this datacenter, `Request::WanChannel` for another's),
/// handed to the channel once the peer took it.
pub async fn open_channel(
    connector: &dyn Connect, addr: &str, dial: &Dial, first: &Request,
) -> io::Result<super::channel::Channel> {
    let opened = tokio::time::timeout(OPEN_CHANNEL_TIMEOUT, async {
        let mut s = connector.connect_to(addr, dial).await?;
        s.write_all(&greeting()).await?;
        s.write_all(&encode_frame(first)?).await?;
        read_greeting(&mut s, addr).await?;
        match read_frame::<Reply>(&mut s).await? {
            Reply::Channel(Ok(())) => Ok(s),
            Reply::Channel(Err(e)) => Err(io::Error::other(e)),
            _ => Err(io::Error::other("unexpected answer to a channel")),
        }
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "opening a channel timed out"))??;
    Ok(super::channel::Channel::over(opened))
}

async fn read_frame<T: serde::de::DeserializeOwned>(s: &mut BoxStream) -> io::Result<T> {
    let len = s.read_u32().await? as usize;
    decode(&read_body(s, len).await?)
}

/// What each side of a connection sends first, before any frame: this
/// magic, then its wire version (u32 BE). Frames are bincode of `Request`
/// and `Reply`, whose shapes change between versions: a peer speaking
/// another one is refused by name instead of failing on a frame.
const GREETING_MAGIC: &[u8; 8] = b"CAIRNRPC";
/// The Raft transport's wire version. Bump it with any change to how
/// frames, `Request`, `Reply` or what they carry encode. 2: ACL commands
/// and the Connect CA's. 3: the WAN frames. 4: `Command::VirtualIpsSet`
/// and the virtual IPs in the snapshot's trailer. 5: channels of endpoint
/// calls (`Request::Channel`). 6: forwarded WAN requests only on channels
/// (`Request::WanChannel`).
pub const WIRE_VERSION: u32 = 6;

/// This server's greeting.
pub fn greeting() -> [u8; 12] {
    let mut g = [0u8; 12];
    g[..8].copy_from_slice(GREETING_MAGIC);
    g[8..].copy_from_slice(&WIRE_VERSION.to_be_bytes());
    g
}

/// A peer whose greeting is not this server's.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("raft peer {peer} speaks wire version {theirs}, this server {ours}: refused")]
    Version {
        peer: String,
        theirs: u32,
        ours: u32,
    },
    #[error(
        "raft peer {peer} sent no cairn greeting (not a cairn server, or one from before wire versions): refused"
    )]
    NoGreeting { peer: String },
}

/// Reads the other side's greeting and checks its version.
async fn read_greeting(s: &mut BoxStream, peer: &str) -> io::Result<()> {
    let mut g = [0u8; 12];
    s.read_exact(&mut g).await?;
    let refuse = |e: WireError| Err(io::Error::new(io::ErrorKind::InvalidData, e));
    if &g[..8] != GREETING_MAGIC {
        return refuse(WireError::NoGreeting { peer: peer.into() });
    }
    let theirs = u32::from_be_bytes(g[8..].try_into().expect("4 bytes"));
    if theirs != WIRE_VERSION {
        return refuse(WireError::Version {
            peer: peer.into(),
            theirs,
            ours: WIRE_VERSION,
        });
    }
    Ok(())
}

/// The accepting side of the greeting: ours is sent whatever the peer's
/// (so a peer of another version learns ours and says so), then theirs is
/// checked. `Err` is why the connection is refused.
async fn exchange_greetings(s: &mut BoxStream, peer: &str) -> Result<(), String> {
    s.write_all(&greeting())
        .await
        .map_err(|e| format!("writing the greeting: {e}"))?;
    read_greeting(s, peer).await.map_err(|e| e.to_string())
}

/// One connection to a peer, reopened on demand.
pub struct Conn {
    addr: String,
    connector: Arc<dyn Connect>,
    dial: Dial,
    stream: Option<BoxStream>,
    /// The largest frame the peer takes: ours until it answers `TooLarge`
    /// with its own.
    peer_max_frame: usize,
    /// The most entries the next AppendEntries carries: halved when one
    /// times out, doubled back on each success.
    append_cap: usize,
    /// A call is between writing its request and reading its answer. Still
    /// set when the next call begins, the last one was cancelled (openraft
    /// puts its own timeout around heartbeats): the stream may hold its
    /// late answer, so it is not reused.
    mid_call: bool,
}

/// A request too large for the peer's frame limit (never sent).
#[derive(Debug, thiserror::Error)]
#[error("request of {len} bytes is over the peer's frame limit of {max}")]
struct FrameTooLarge {
    len: usize,
    max: usize,
}

fn is_too_large(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<FrameTooLarge>())
}

impl Conn {
    pub fn new(connector: Arc<dyn Connect>, addr: impl Into<String>) -> Self {
        Self::to(connector, addr, Dial::Local)
    }

    /// A connection to a server of `dial` (another datacenter's).
    pub fn to(connector: Arc<dyn Connect>, addr: impl Into<String>, dial: Dial) -> Self {
        Conn {
            addr: addr.into(),
            connector,
            dial,
            stream: None,
            peer_max_frame: MAX_FRAME,
            append_cap: usize::MAX,
            mid_call: false,
        }
    }

    /// What the peer of the open stream proved with its certificate
    /// (`None`: no stream, or a transport without certificates).
    pub fn certified(&self) -> Option<crate::tls::Certified> {
        self.stream.as_ref().and_then(super::secure::certified)
    }

    /// Sends one request and waits for its answer, within `timeout`. A
    /// request over the peer's frame limit is not sent (`FrameTooLarge`).
    pub async fn call(&mut self, req: &Request, timeout: Duration) -> std::io::Result<Reply> {
        let frame = encode_frame(req)?;
        if frame.len() - 4 > self.peer_max_frame {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                FrameTooLarge {
                    len: frame.len() - 4,
                    max: self.peer_max_frame,
                },
            ));
        }
        // openraft gives replication one heartbeat interval (150 ms); a
        // large frame also gets the time to move and store its bytes at a
        // slow peer's pace, or it would time out and be resent forever.
        let timeout = timeout + Duration::from_secs_f64(frame.len() as f64 / SLOW_PEER_RATE);
        if self.mid_call {
            self.stream = None;
        }
        self.mid_call = true;
        let r = tokio::time::timeout(timeout, async {
            let fresh = self.stream.is_none();
            if fresh {
                self.stream = Some(self.connector.connect_to(&self.addr, &self.dial).await?);
            }
            let s = self.stream.as_mut().expect("connected above");
            if fresh {
                // Sent with the first request; the peer's comes back
                // before its answer.
                s.write_all(&greeting()).await?;
            }
            s.write_all(&frame).await?;
            if fresh {
                read_greeting(s, &self.addr).await.inspect_err(|e| {
                    if e.get_ref().is_some_and(|i| i.is::<WireError>()) {
                        tracing::warn!("{e}");
                    }
                })?;
            }
            read_frame(s).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "rpc timed out",
            ))
        });
        self.mid_call = false;
        if r.is_err() {
            // The stream may hold half a frame: never reuse it.
            self.stream = None;
        }
        if let Ok(Reply::TooLarge(max)) = &r {
            self.peer_max_frame = (*max as usize).min(MAX_FRAME);
        }
        r
    }
}

/// Builds a client per peer for openraft.
#[derive(Clone)]
pub struct Network {
    connector: Arc<dyn Connect>,
}

impl Network {
    pub fn new(connector: Arc<dyn Connect>) -> Self {
        Network { connector }
    }
}

impl Default for Network {
    /// TCP, as a server uses.
    fn default() -> Self {
        Network::new(Arc::new(TcpConnect))
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, _target: NodeId, node: &ServerNode) -> Conn {
        Conn::new(self.connector.clone(), node.raft_addr.clone())
    }
}

fn unreachable(e: std::io::Error) -> RPCError<TypeConfig> {
    if e.kind() == std::io::ErrorKind::ConnectionRefused || e.kind() == std::io::ErrorKind::TimedOut
    {
        RPCError::Unreachable(Unreachable::new(&e))
    } else {
        RPCError::Network(NetworkError::new(&e))
    }
}

fn network_err(e: impl std::fmt::Display) -> NetworkError<TypeConfig> {
    NetworkError::new(&std::io::Error::other(e.to_string()))
}

impl RaftNetworkV2<TypeConfig> for Conn {
    type SnapshotData = SnapshotData;

    /// Sends the entries, or as many of the first ones as fit the peer's
    /// frame limit (then answers `PartialSuccess`, and openraft sends the
    /// rest next): a request the peer refuses as too large is never resent
    /// as it was.
    async fn append_entries(
        &mut self, rpc: AppendEntriesRequest<TypeConfig>, option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let all = rpc.entries.len();
        let mut req = Request::Append(rpc);
        loop {
            let Request::Append(rpc) = &mut req else {
                unreachable!("built above")
            };
            rpc.entries.truncate(self.append_cap.max(1));
            let sent_last = rpc.entries.last().map(|e| e.log_id);
            let sent = rpc.entries.len();
            match self.call(&req, option.hard_ttl()).await {
                Ok(Reply::Append(Ok(r))) => {
                    self.append_cap = self.append_cap.saturating_mul(2);
                    if r == AppendEntriesResponse::Success && sent < all {
                        return Ok(AppendEntriesResponse::PartialSuccess(sent_last));
                    }
                    return Ok(r);
                }
                Ok(Reply::Append(Err(e))) => return Err(RPCError::Network(network_err(e))),
                // Over the peer's limit (it said so, or we knew): fewer.
                Ok(Reply::TooLarge(_)) => {}
                Err(e) if is_too_large(&e) => {}
                Ok(_) => return Err(RPCError::Network(network_err("unexpected reply"))),
                Err(e) => {
                    // A peer too slow for this much at once (or gone): the
                    // retry openraft makes carries half as many entries.
                    if e.kind() == io::ErrorKind::TimedOut && sent > 1 {
                        self.append_cap = sent / 2;
                    }
                    return Err(unreachable(e));
                }
            }
            let Request::Append(rpc) = &mut req else {
                unreachable!("built above")
            };
            if rpc.entries.len() <= 1 {
                // Cannot happen with cairn's own budgets (one entry is at
                // most `MAX_COMMAND_BYTES`): say so rather than loop.
                return Err(RPCError::Network(network_err(format!(
                    "one log entry is over the frame limit of {}",
                    self.addr
                ))));
            }
            rpc.entries.truncate(rpc.entries.len() / 2);
        }
    }

    async fn vote(
        &mut self, rpc: VoteRequest<TypeConfig>, option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.call(&Request::Vote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(Ok(r))) => Ok(r),
            Ok(Reply::Vote(Err(e))) => Err(RPCError::Network(network_err(e))),
            Ok(_) => Err(RPCError::Network(network_err("unexpected reply"))),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn transfer_leader(
        &mut self, req: TransferLeaderRequest<TypeConfig>, option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self
            .call(&Request::TransferLeader(req), option.hard_ttl())
            .await
        {
            Ok(Reply::TransferLeader(Ok(r))) => Ok(r),
            Ok(Reply::TransferLeader(Err(e))) => Err(RPCError::Network(network_err(e))),
            Ok(_) => Err(RPCError::Network(network_err("unexpected reply"))),
            Err(e) => Err(unreachable(e)),
        }
    }

    /// Sends the snapshot in chunks on this connection, each within the
    /// RPC's time limit; stops when replication is closed.
    async fn full_snapshot(
        &mut self, vote: Vote, snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static, option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut cancel = std::pin::pin!(cancel);
        let data = &snapshot.snapshot;
        let mut offset = 0u64;
        loop {
            let chunk = tokio::select! {
                closed = &mut cancel => return Err(StreamingError::Closed(closed)),
                c = data.chunk(offset, SNAPSHOT_CHUNK) => c.map_err(network_err)?,
            };
            let end = offset + chunk.len() as u64;
            let done = end == data.len();
            let req = Request::SnapshotChunk {
                vote,
                meta: snapshot.meta.clone(),
                offset,
                data: chunk,
                done,
            };
            let reply = tokio::select! {
                closed = &mut cancel => return Err(StreamingError::Closed(closed)),
                r = self.call(&req, option.hard_ttl()) => r,
            };
            match reply {
                Ok(Reply::Snapshot(Ok(Some(r)))) if done => return Ok(r),
                Ok(Reply::Snapshot(Ok(None))) if !done => offset = end,
                Ok(Reply::Snapshot(Err(e))) => return Err(network_err(e).into()),
                Ok(_) => return Err(network_err("unexpected reply to a snapshot chunk").into()),
                Err(e) => {
                    return Err(match unreachable(e) {
                        RPCError::Unreachable(u) => u.into(),
                        RPCError::Network(n) => n.into(),
                        other => network_err(other).into(),
                    });
                }
            }
        }
    }
}

/// Answers formation messages; implemented by the cluster module.
pub trait Formation: Send + Sync + 'static {
    fn hello(&self, from: Hello) -> impl std::future::Future<Output = Hello> + Send;
    fn join(
        &self, id: NodeId, node: ServerNode,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send;
    /// The leader spoke to this server (for `X-Consul-LastContact`).
    fn leader_contact(&self);
    /// Who answers the WAN frames (none: federation is not served here,
    /// and they are refused).
    fn wan(&self) -> Option<Arc<dyn super::wan::Wan>> {
        None
    }
    /// Who answers endpoint calls on channels (none: refused).
    fn calls(&self) -> Option<Arc<dyn super::channel::Calls>> {
        None
    }
    /// Whether this server, out of the membership and asking to join
    /// again, awaits entries from `id`, the leader its peers named (a
    /// leader that joined after the membership this server knows).
    fn awaits_leader(&self, id: NodeId) -> bool;
}

/// The connections open on the Raft port. At a cap the least recently
/// active connection (from the same IP, for the per-IP cap) is closed to
/// make room: a peer reconnecting after a timeout always gets in (refusing
/// the new one instead let a peer's stale connections, whose close never
/// arrived, lock it out), and a connection that has not yet sent a frame
/// counts as older than any that has, so idle strangers go first.
struct Conns {
    limits: PortLimits,
    start: tokio::time::Instant,
    open: Mutex<ConnTable>,
}

#[derive(Default)]
struct ConnTable {
    next_id: u64,
    /// By id (ordered: which one is evicted never depends on a hash seed).
    by_id: std::collections::BTreeMap<u64, ConnEntry>,
}

struct ConnEntry {
    ip: IpAddr,
    /// Milliseconds since `start` of its last whole frame (or, before its
    /// first, of its admission less the first-frame timeout).
    active: Arc<std::sync::atomic::AtomicU64>,
    close: Arc<tokio::sync::Notify>,
}

/// One admitted connection; gives its place back when dropped.
struct ConnSlot {
    conns: Arc<Conns>,
    id: u64,
    active: Arc<std::sync::atomic::AtomicU64>,
    close: Arc<tokio::sync::Notify>,
}

impl Conns {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn admit(self: &Arc<Self>, ip: IpAddr) -> ConnSlot {
        use std::sync::atomic::Ordering;
        let mut t = self.open.lock();
        let lru = |t: &ConnTable, same_ip: bool| {
            t.by_id
                .iter()
                .filter(|(_, e)| !same_ip || e.ip == ip)
                .min_by_key(|(id, e)| (e.active.load(Ordering::Relaxed), **id))
                .map(|(id, _)| *id)
        };
        let from_ip = t.by_id.values().filter(|e| e.ip == ip).count();
        let evict = if from_ip >= self.limits.max_conns_per_ip {
            lru(&t, true)
        } else if t.by_id.len() >= self.limits.max_conns {
            lru(&t, false)
        } else {
            None
        };
        if let Some(id) = evict
            && let Some(e) = t.by_id.remove(&id)
        {
            crate::metrics::RAFT_CONNS_REFUSED.inc();
            tracing::debug!(ip = %e.ip, "raft connection closed to make room: over a connection cap");
            e.close.notify_one();
        }
        let id = t.next_id;
        t.next_id += 1;
        let first_frame = self.limits.first_frame.as_millis() as u64;
        let active = Arc::new(std::sync::atomic::AtomicU64::new(
            self.now_ms().saturating_sub(first_frame),
        ));
        let close = Arc::new(tokio::sync::Notify::new());
        t.by_id.insert(
            id,
            ConnEntry {
                ip,
                active: active.clone(),
                close: close.clone(),
            },
        );
        ConnSlot {
            conns: self.clone(),
            id,
            active,
            close,
        }
    }
}

impl ConnSlot {
    /// Marks the connection active now (a whole frame arrived).
    fn touch(&self) {
        self.active
            .store(self.conns.now_ms(), std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.conns.open.lock().by_id.remove(&self.id);
    }
}

/// Serves Raft and formation RPCs on the Raft port, within `limits`,
/// until `stop` turns true: then the listener is dropped and every
/// connection closed, so peers find the port refusing (and back off) from
/// the moment the server shuts down, rather than answering each
/// heartbeat with "raft stopped" for as long as its state takes to write.
pub async fn serve<A: Accept, F: Formation>(
    mut listener: A, raft: super::Raft, formation: Arc<F>, limits: PortLimits,
    snapshots: SnapshotStore, mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let conns = Arc::new(Conns {
        limits,
        start: tokio::time::Instant::now(),
        open: Mutex::default(),
    });
    let receives = Arc::new(tokio::sync::Semaphore::new(SNAPSHOT_RECEIVES));
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => {
                for e in conns.open.lock().by_id.values() {
                    e.close.notify_one();
                }
                return;
            }
            a = listener.accept() => a,
        };
        let (stream, ip) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "raft accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = conns.admit(ip);
        let peer = Peer {
            raft: raft.clone(),
            formation: formation.clone(),
            limits: conns.limits.clone(),
            receives: receives.clone(),
            snapshots: snapshots.clone(),
            ip,
        };
        tokio::spawn(async move {
            let close = slot.close.clone();
            tokio::select! {
                _ = peer.serve(stream, &slot) => {}
                // Evicted to make room for a newer connection.
                _ = close.notified() => {}
            }
        });
    }
}

/// One incoming connection.
struct Peer<F> {
    raft: super::Raft,
    formation: Arc<F>,
    limits: PortLimits,
    receives: Arc<tokio::sync::Semaphore>,
    /// Where received snapshots are written.
    snapshots: SnapshotStore,
    ip: IpAddr,
}

/// A snapshot being received on a connection: its meta, where its bytes
/// go, and its place among the receives allowed at once.
struct Receiving {
    meta: SnapshotMeta,
    sink: SnapshotSink,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Why a connection is closed.
#[derive(Debug)]
enum Close {
    Idle,
    Io(io::Error),
    /// Refused, with the reason (logged).
    Refused(String),
}

impl<F: Formation> Peer<F> {
    async fn serve(self, mut stream: BoxStream, slot: &ConnSlot) {
        let mut receiving: Option<Receiving> = None;
        let mut first = true;
        let greeted = tokio::time::timeout(
            self.limits.first_frame,
            exchange_greetings(&mut stream, &self.ip.to_string()),
        )
        .await;
        match greeted {
            Err(_) => return self.closed(Close::Idle),
            Ok(Err(reason)) => return self.closed(Close::Refused(reason)),
            Ok(Ok(())) => {}
        }
        // Through the TLS handshake by now (the greeting was read).
        let certified = super::secure::certified(&stream);
        let why = loop {
            let idle = if first {
                self.limits.first_frame
            } else if receiving.is_some() {
                self.limits.snapshot_idle
            } else {
                self.limits.idle
            };
            first = false;
            let len = match tokio::time::timeout(idle, stream.read_u32()).await {
                Err(_) => break Close::Idle,
                Ok(Err(e)) => break Close::Io(e),
                Ok(Ok(len)) => len as usize,
            };
            let body = if len > MAX_FRAME {
                // Answered, so that a sender with a larger limit learns ours;
                // read away first (within the frame timeout) if small enough.
                if len > DRAIN_MAX {
                    let _ = write_reply(&mut stream, &Reply::TooLarge(MAX_FRAME as u64)).await;
                    break Close::Refused(format!("frame of {len} bytes"));
                }
                let mut body = (&mut stream).take(len as u64);
                let mut sink = tokio::io::sink();
                let drain = tokio::io::copy(&mut body, &mut sink);
                match tokio::time::timeout(self.limits.frame_read, drain).await {
                    Ok(Ok(n)) if n == len as u64 => {}
                    _ => break Close::Refused(format!("frame of {len} bytes, not read whole")),
                }
                crate::metrics::RAFT_FRAMES_REFUSED.inc();
                tracing::warn!(ip = %self.ip, len, max = MAX_FRAME, "raft frame over the limit: answered TooLarge");
                if let Err(e) = write_reply(&mut stream, &Reply::TooLarge(MAX_FRAME as u64)).await {
                    break Close::Io(e);
                }
                continue;
            } else {
                match tokio::time::timeout(self.limits.frame_read, read_body(&mut stream, len))
                    .await
                {
                    Err(_) => {
                        break Close::Refused(format!(
                            "frame of {len} bytes not whole within {:?}",
                            self.limits.frame_read
                        ));
                    }
                    Ok(Err(e)) => break Close::Io(e),
                    Ok(Ok(b)) => b,
                }
            };
            slot.touch();
            let req = match decode::<Request>(&body) {
                Ok(r) => r,
                Err(e) => break Close::Refused(format!("undecodable frame: {e}")),
            };
            drop(body);
            // The connection becomes a channel: served by it until it closes.
            let calls = match &req {
                Request::Channel => Some(self.local_calls(certified.as_ref())),
                Request::WanChannel { from } => Some(self.wan_calls(from, certified.as_ref())),
                _ => None,
            };
            if let Some(calls) = calls {
                let answer = Reply::Channel(calls.as_ref().map(|_| ()).map_err(Clone::clone));
                if let Err(e) = write_reply(&mut stream, &answer).await {
                    break Close::Io(e);
                }
                match calls {
                    Ok(calls) => {
                        let touch = || slot.touch();
                        super::channel::serve(stream, calls, self.limits.frame_read, &touch).await;
                        return;
                    }
                    Err(refused) => break Close::Refused(refused),
                }
            }
            let reply = match self.handle(req, certified.as_ref(), &mut receiving).await {
                Ok(r) => r,
                Err(reason) => break Close::Refused(reason),
            };
            if let Err(e) = write_reply(&mut stream, &reply).await {
                break Close::Io(e);
            }
        };
        self.closed(why);
    }

    fn closed(&self, why: Close) {
        match why {
            Close::Refused(reason) => {
                crate::metrics::RAFT_FRAMES_REFUSED.inc();
                tracing::warn!(ip = %self.ip, %reason, "raft connection closed");
            }
            Close::Idle => tracing::debug!(ip = %self.ip, "idle raft connection closed"),
            Close::Io(e) => tracing::debug!(ip = %self.ip, error = %e, "raft connection ended"),
        }
    }

    /// Answers one request; `Err` closes the connection.
    async fn handle(
        &self, req: Request, certified: Option<&crate::tls::Certified>,
        receiving: &mut Option<Receiving>,
    ) -> Result<Reply, String> {
        let raft = &self.raft;
        // With TLS, a server's certificate says which datacenter it serves:
        // Raft and formation only from this one's, a greeting or request
        // only from the datacenter it claims (a server of dc2 cannot speak
        // for dc3, nor vote here).
        match (&req, certified) {
            (_, None) => {}
            (Request::WanHello(h), Some(c)) if !c.serves(&h.datacenter) => {
                return Err(format!(
                    "greeting from datacenter {:?} with a certificate for {:?}",
                    h.datacenter, c.datacenters
                ));
            }
            (Request::WanHello(_), Some(_)) => {}
            (_, Some(c)) if !c.local => {
                return Err(format!(
                    "raft message from a server of {:?}, not of this datacenter",
                    c.datacenters
                ));
            }
            _ => {}
        }
        Ok(match req {
            Request::Append(r) => {
                self.member_or_awaited(&r.vote)?;
                self.formation.leader_contact();
                Reply::Append(raft.append_entries(r).await.map_err(|e| e.to_string()))
            }
            Request::Vote(r) => {
                self.member(&r.vote)?;
                Reply::Vote(raft.vote(r).await.map_err(|e| e.to_string()))
            }
            Request::SnapshotChunk {
                vote,
                meta,
                offset,
                data,
                done,
            } => {
                self.member_or_awaited(&vote)?;
                self.formation.leader_contact();
                Reply::Snapshot(
                    self.receive_chunk(receiving, vote, meta, offset, data, done)
                        .await,
                )
            }
            Request::Hello(h) => Reply::Hello(self.formation.hello(h).await),
            Request::Join(id, node) => Reply::Join(self.formation.join(id, node).await),
            Request::TransferLeader(r) => {
                self.member(r.from_leader())?;
                Reply::TransferLeader(
                    raft.handle_transfer_leader(r)
                        .await
                        .map_err(|e| e.to_string()),
                )
            }
            Request::WanHello(h) => Reply::WanHello(match self.formation.wan() {
                Some(w) => w.hello(h).await,
                None => Err(NO_WAN.into()),
            }),
            // Taken over by `serve` before it gets here.
            Request::Channel | Request::WanChannel { .. } => {
                return Err("a channel frame after the first".into());
            }
        })
    }

    /// A channel of endpoint calls: only from a server of this datacenter
    /// (with TLS, its certificate says so), to a server that serves them.
    fn local_calls(
        &self, certified: Option<&crate::tls::Certified>,
    ) -> Result<Arc<dyn super::channel::Calls>, String> {
        match (certified, self.formation.calls()) {
            (Some(c), _) if !c.local => Err("a channel from another datacenter".into()),
            (_, None) => Err("this server answers no endpoint calls".into()),
            (_, Some(calls)) => Ok(calls),
        }
    }

    /// A channel of another datacenter's forwarded requests: only where
    /// this server federates (its transport authenticates its peers), and
    /// with TLS only from a server certified for `from`.
    fn wan_calls(
        &self, from: &str, certified: Option<&crate::tls::Certified>,
    ) -> Result<Arc<dyn super::channel::Calls>, String> {
        let Some(wan) = self.formation.wan() else {
            return Err(NO_WAN.into());
        };
        if let Some(c) = certified
            && !c.serves(from)
        {
            return Err(format!(
                "requests from datacenter {from:?} with a certificate for {:?}",
                c.datacenters
            ));
        }
        Ok(Arc::new(super::wan::WanCalls {
            wan,
            from: from.to_string(),
        }))
    }

    /// Raft messages come only from members (any sender while this server
    /// knows no membership yet: that is how it is first reached).
    fn member(&self, vote: &Vote) -> Result<(), String> {
        let id = vote.leader_id.node_id;
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        if membership.nodes().next().is_none() || membership.get_node(&id).is_some() {
            return Ok(());
        }
        Err(format!("raft message from {id}, not a member"))
    }

    /// A leader's entries: from a member, or from the leader this server
    /// awaits while it rejoins (never a vote: a non-member's elections
    /// stay refused).
    fn member_or_awaited(&self, vote: &Vote) -> Result<(), String> {
        if self.formation.awaits_leader(vote.leader_id.node_id) {
            return Ok(());
        }
        self.member(vote)
    }

    /// Adds a chunk to the snapshot being received; installs it after the
    /// last.
    async fn receive_chunk(
        &self, receiving: &mut Option<Receiving>, vote: Vote, meta: SnapshotMeta, offset: u64,
        data: Vec<u8>, done: bool,
    ) -> Result<Option<SnapshotResponse<TypeConfig>>, String> {
        if data.len() > SNAPSHOT_CHUNK {
            *receiving = None;
            return Err(format!(
                "snapshot chunk of {} bytes refused (max {SNAPSHOT_CHUNK})",
                data.len()
            ));
        }
        if offset == 0 {
            // A new transfer replaces one in progress on this connection.
            *receiving = None;
            let permit =
                self.receives.clone().try_acquire_owned().map_err(|_| {
                    "too many snapshots being received: try again later".to_string()
                })?;
            let sink = self.snapshots.receive(&meta).map_err(|e| e.to_string())?;
            *receiving = Some(Receiving {
                meta: meta.clone(),
                sink,
                _permit: permit,
            });
        }
        let Some(r) = receiving.as_mut() else {
            return Err("snapshot chunk without its start".into());
        };
        if r.meta != meta || r.sink.len() != offset {
            *receiving = None;
            return Err("snapshot chunk out of order".into());
        }
        if offset + data.len() as u64 > MAX_SNAPSHOT_BYTES {
            *receiving = None;
            return Err(format!("snapshot over {MAX_SNAPSHOT_BYTES} bytes refused"));
        }
        if let Err(e) = r.sink.write(data).await {
            *receiving = None;
            return Err(e);
        }
        if !done {
            return Ok(None);
        }
        let Receiving { meta, sink, .. } = receiving.take().expect("checked above");
        let snapshot = Snapshot {
            meta,
            snapshot: sink.finish().await?,
        };
        self.raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

const NO_WAN: &str = "this server serves no WAN federation";

async fn write_reply(s: &mut BoxStream, reply: &Reply) -> io::Result<()> {
    s.write_all(&encode_frame(reply)?).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Payload};
    use crate::structs::KvOp;
    use openraft::impls::leader_id_adv::LeaderId;

    /// Hands out the client end of an in-memory stream whose other end a
    /// test serves.
    struct Pipe(Mutex<Option<tokio::io::DuplexStream>>);

    impl Connect for Pipe {
        fn connect<'a>(&'a self, _addr: &'a str) -> Connecting<'a> {
            let s = self.0.lock().take();
            Box::pin(async move {
                s.map(|s| Box::new(s) as BoxStream)
                    .ok_or_else(|| io::ErrorKind::ConnectionRefused.into())
            })
        }
    }

    fn entry(index: u64, value_len: usize) -> super::super::Entry {
        let leader_id = LeaderId {
            term: 1,
            node_id: 1,
        };
        super::super::Entry {
            log_id: super::super::LogId { leader_id, index },
            payload: openraft::EntryPayload::Normal(Payload::One(Command::Kv(KvOp::set(
                format!("k{index}"),
                vec![b'x'; value_len],
            )))),
        }
    }

    /// A call cancelled between its request and its answer (openraft times
    /// heartbeats out around the call) does not leave that answer for the
    /// next call to read.
    #[tokio::test]
    async fn a_cancelled_call_leaves_no_answer_behind() {
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut server: BoxStream = Box::new(server);
            exchange_greetings(&mut server, "client").await.unwrap();
            // Answers each vote late, with the term it was asked about.
            while let Ok(req) = read_frame::<Request>(&mut server).await {
                let Request::Vote(v) = req else { return };
                tokio::time::sleep(Duration::from_millis(50)).await;
                let reply = Reply::Vote(Ok(VoteResponse::new(v.vote, None, false)));
                if write_reply(&mut server, &reply).await.is_err() {
                    return;
                }
            }
        });
        // One stream only: a reconnect is refused, so reusing the stream
        // is the only way the second call could succeed.
        let mut conn = Conn::new(Arc::new(Pipe(Mutex::new(Some(client)))), "peer");
        let vote = |term| {
            VoteRequest::new(
                Vote {
                    leader_id: LeaderId { term, node_id: 1 },
                    committed: false,
                },
                None,
            )
        };
        let cancelled = tokio::time::timeout(
            Duration::from_millis(10),
            conn.call(&Request::Vote(vote(1)), Duration::from_secs(5)),
        )
        .await;
        assert!(cancelled.is_err());
        let second = conn
            .call(&Request::Vote(vote(2)), Duration::from_secs(5))
            .await;
        match second {
            // The late answer to term 1 would have been taken for term 2's.
            Ok(Reply::Vote(Ok(r))) => panic!("read a stale answer: {r:?}"),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused),
        }
    }

    /// A follower whose frame limit is smaller than the leader's answers
    /// `TooLarge`; the leader sends the entries that fit and reports
    /// `PartialSuccess` (openraft sends the rest next) instead of resending
    /// the same request.
    #[tokio::test]
    async fn a_frame_too_large_for_the_peer_is_resent_smaller() {
        const PEER_LIMIT: usize = 300 << 10;
        let (client, server) = tokio::io::duplex(1 << 20);
        let peer = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut server: BoxStream = Box::new(server);
            exchange_greetings(&mut server, "client").await.unwrap();
            loop {
                let Ok(len) = server.read_u32().await else {
                    return seen;
                };
                let len = len as usize;
                let mut body = vec![0u8; len];
                server.read_exact(&mut body).await.unwrap();
                let reply = if len > PEER_LIMIT {
                    seen.push(None);
                    Reply::TooLarge(PEER_LIMIT as u64)
                } else {
                    let Request::Append(r) = decode::<Request>(&body).unwrap() else {
                        panic!("not an append")
                    };
                    seen.push(Some(r.entries.len()));
                    Reply::Append(Ok(AppendEntriesResponse::Success))
                };
                write_reply(&mut server, &reply).await.unwrap();
            }
        });
        let mut conn = Conn::new(Arc::new(Pipe(Mutex::new(Some(client)))), "peer");
        let entries: Vec<_> = (1..=8).map(|i| entry(i, 100 << 10)).collect();
        let second = entries[1].log_id;
        let rpc = AppendEntriesRequest {
            vote: Vote {
                leader_id: entries[0].log_id.leader_id,
                committed: true,
            },
            prev_log_id: None,
            entries,
            leader_commit: None,
        };
        let r = conn
            .append_entries(rpc, RPCOption::new(Duration::from_secs(5)))
            .await
            .unwrap();
        // 8 refused, then 4 (still over the peer's limit, now known to the
        // sender: not sent), then 2 accepted.
        assert_eq!(r, AppendEntriesResponse::PartialSuccess(Some(second)));
        drop(conn);
        assert_eq!(peer.await.unwrap(), vec![None, Some(2)]);
    }

    /// A peer of another wire version is refused on both sides with an
    /// error naming it and both versions, before any frame is decoded.
    #[tokio::test]
    async fn a_peer_of_another_wire_version_is_refused_by_name() {
        let other = |version: u32| {
            let mut g = greeting();
            g[8..].copy_from_slice(&version.to_be_bytes());
            g
        };
        // Calling a server of version 7: it greets, then closes.
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut server = server;
            server.write_all(&other(7)).await.unwrap();
            let mut sink = Vec::new();
            let _ = server.read_to_end(&mut sink).await;
        });
        let mut conn = Conn::new(Arc::new(Pipe(Mutex::new(Some(client)))), "10.0.0.9:8300");
        let vote = VoteRequest::new(
            Vote {
                leader_id: LeaderId {
                    term: 1,
                    node_id: 1,
                },
                committed: false,
            },
            None,
        );
        let e = conn
            .call(&Request::Vote(vote), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "raft peer 10.0.0.9:8300 speaks wire version 7, this server {WIRE_VERSION}: refused"
            )
        );

        // Called by a peer of version 7: refused, and told our version.
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut client: BoxStream = Box::new(client);
        client.write_all(&other(7)).await.unwrap();
        let mut server: BoxStream = Box::new(server);
        let why = exchange_greetings(&mut server, "10.0.0.8")
            .await
            .unwrap_err();
        assert!(
            why.contains("10.0.0.8")
                && why.contains("version 7")
                && why.contains(&format!("this server {WIRE_VERSION}")),
            "{why}"
        );
        assert!(read_greeting(&mut client, "server").await.is_ok());

        // Bytes that are no greeting at all (a frame from a server before
        // versions, a stranger): refused as such, nothing decoded.
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut client: BoxStream = Box::new(client);
        client
            .write_all(&encode_frame(&Request::Join(1, ServerNode::default())).unwrap())
            .await
            .unwrap();
        let mut server: BoxStream = Box::new(server);
        let why = exchange_greetings(&mut server, "10.0.0.7")
            .await
            .unwrap_err();
        assert!(why.contains("sent no cairn greeting"), "{why}");
    }
}
