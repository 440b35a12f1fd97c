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

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{NodeId, ServerNode, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote};

/// Frames above this are refused: a snapshot chunk is a few MiB.
const MAX_FRAME: usize = 64 << 20;

/// A snapshot travels in chunks of this size (frames stay small, and each
/// chunk gets its own timeout).
const SNAPSHOT_CHUNK: usize = 4 << 20;

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
        data: Vec<u8>,
        done: bool,
    },
    Hello(Hello),
    /// Add the sender to the cluster (answered by the leader).
    Join(NodeId, ServerNode),
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
}

/// A byte stream between two servers.
pub trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> PeerStream for T {}

/// A boxed stream: one type for every transport, so `Conn`, `Network` and
/// the cluster need no type parameter.
pub type BoxStream = Box<dyn PeerStream>;

/// Opens a stream to a peer's Raft address.
pub trait Connect: Send + Sync + 'static {
    fn connect<'a>(
        &'a self,
        addr: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<BoxStream>> + Send + 'a>>;
}

/// Accepts streams on this server's Raft address.
pub trait Accept: Send + 'static {
    fn accept(&mut self) -> impl Future<Output = io::Result<BoxStream>> + Send;
}

/// The production transport: TCP with Nagle off (RPCs are small and
/// latency-bound).
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnect;

impl Connect for TcpConnect {
    fn connect<'a>(
        &'a self,
        addr: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<BoxStream>> + Send + 'a>> {
        Box::pin(async move {
            let s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok(Box::new(s) as BoxStream)
        })
    }
}

impl Accept for TcpListener {
    async fn accept(&mut self) -> io::Result<BoxStream> {
        let (s, _) = TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok(Box::new(s))
    }
}

async fn write_frame<T: Serialize>(s: &mut BoxStream, v: &T) -> std::io::Result<()> {
    let bytes = bincode::serialize(v).map_err(std::io::Error::other)?;
    let mut buf = Vec::with_capacity(bytes.len() + 4);
    buf.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    buf.extend_from_slice(&bytes);
    s.write_all(&buf).await
}

async fn read_frame<T: serde::de::DeserializeOwned>(s: &mut BoxStream) -> std::io::Result<T> {
    let len = s.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes refused"
        )));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    bincode::deserialize(&buf).map_err(std::io::Error::other)
}

/// One connection to a peer, reopened on demand.
pub struct Conn {
    addr: String,
    connector: Arc<dyn Connect>,
    stream: Option<BoxStream>,
}

impl Conn {
    pub fn new(connector: Arc<dyn Connect>, addr: impl Into<String>) -> Self {
        Conn {
            addr: addr.into(),
            connector,
            stream: None,
        }
    }

    /// Sends one request and waits for its answer, within `timeout`.
    pub async fn call(&mut self, req: &Request, timeout: Duration) -> std::io::Result<Reply> {
        let r = tokio::time::timeout(timeout, async {
            if self.stream.is_none() {
                self.stream = Some(self.connector.connect(&self.addr).await?);
            }
            let s = self.stream.as_mut().expect("connected above");
            write_frame(s, req).await?;
            read_frame(s).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "rpc timed out",
            ))
        });
        if r.is_err() {
            // The stream may hold half a frame: never reuse it.
            self.stream = None;
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

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.call(&Request::Append(rpc), option.hard_ttl()).await {
            Ok(Reply::Append(Ok(r))) => Ok(r),
            Ok(Reply::Append(Err(e))) => Err(RPCError::Network(network_err(e))),
            Ok(_) => Err(RPCError::Network(network_err("unexpected reply"))),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.call(&Request::Vote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(Ok(r))) => Ok(r),
            Ok(Reply::Vote(Err(e))) => Err(RPCError::Network(network_err(e))),
            Ok(_) => Err(RPCError::Network(network_err("unexpected reply"))),
            Err(e) => Err(unreachable(e)),
        }
    }

    /// Sends the snapshot in chunks on this connection, each within the
    /// RPC's time limit; stops when replication is closed.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut cancel = std::pin::pin!(cancel);
        let data = &snapshot.snapshot;
        let mut offset = 0usize;
        loop {
            let end = (offset + SNAPSHOT_CHUNK).min(data.len());
            let done = end == data.len();
            let req = Request::SnapshotChunk {
                vote,
                meta: snapshot.meta.clone(),
                offset: offset as u64,
                data: data[offset..end].to_vec(),
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
        &self,
        id: NodeId,
        node: ServerNode,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send;
}

/// Serves Raft and formation RPCs on the Raft port until the listener fails.
pub async fn serve<A: Accept, F: Formation>(mut listener: A, raft: super::Raft, formation: Arc<F>) {
    loop {
        let mut stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "raft accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let raft = raft.clone();
        let formation = formation.clone();
        tokio::spawn(async move {
            // The snapshot being received on this connection: its meta and
            // the bytes so far.
            let mut receiving: Option<(SnapshotMeta, Vec<u8>)> = None;
            while let Ok(req) = read_frame::<Request>(&mut stream).await {
                let reply = match req {
                    Request::Append(r) => {
                        crate::raft::cluster::touch_leader_contact();
                        Reply::Append(raft.append_entries(r).await.map_err(|e| e.to_string()))
                    }
                    Request::Vote(r) => Reply::Vote(raft.vote(r).await.map_err(|e| e.to_string())),
                    Request::SnapshotChunk {
                        vote,
                        meta,
                        offset,
                        data,
                        done,
                    } => {
                        crate::raft::cluster::touch_leader_contact();
                        Reply::Snapshot(
                            receive_chunk(&raft, &mut receiving, vote, meta, offset, data, done)
                                .await,
                        )
                    }
                    Request::Hello(h) => Reply::Hello(formation.hello(h).await),
                    Request::Join(id, node) => Reply::Join(formation.join(id, node).await),
                };
                if write_frame(&mut stream, &reply).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// Adds a chunk to the snapshot being received; installs it after the last.
async fn receive_chunk(
    raft: &super::Raft,
    receiving: &mut Option<(SnapshotMeta, Vec<u8>)>,
    vote: Vote,
    meta: SnapshotMeta,
    offset: u64,
    data: Vec<u8>,
    done: bool,
) -> Result<Option<SnapshotResponse<TypeConfig>>, String> {
    if offset == 0 {
        *receiving = Some((meta.clone(), Vec::new()));
    }
    let Some((m, buf)) = receiving.as_mut() else {
        return Err("snapshot chunk without its start".into());
    };
    if *m != meta || buf.len() as u64 != offset {
        *receiving = None;
        return Err("snapshot chunk out of order".into());
    }
    buf.extend_from_slice(&data);
    if !done {
        return Ok(None);
    }
    let (meta, bytes) = receiving.take().expect("checked above");
    let snapshot = Snapshot {
        meta,
        snapshot: bytes,
    };
    raft.install_full_snapshot(vote, snapshot)
        .await
        .map(Some)
        .map_err(|e| e.to_string())
}
