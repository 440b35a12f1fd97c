//! A cairn server on a simulated host: the real `Server` assembled from
//! in-memory storage and turmoil's network, plus the small API the
//! simulated clients speak.
//!
//! The API stands in for HTTP (hyper over turmoil streams would work but
//! costs build and run time the seeds need). It keeps the decisions of the
//! HTTP request path: a server that is not the leader forwards to the leader
//! (the `forward_to_leader` middleware), writes go through `Server::write`,
//! reads through `http::blocking` with the same consistency options
//! (default = the leader's local state, `consistent` = `linearize()` first).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::http::{Watch, blocking};
use cairn::raft::NodeId;
use cairn::raft::network::{Accept, BoxStream, Connect};
use cairn::raft::state_machine::SnapshotStore;
use cairn::request::QueryOptions;
use cairn::request::authz::Authz;
use cairn::server::{Server, ServerConfig, ServerParts};
use cairn::state::{ChangeSet, Command, MemoryBackend, Response, Row, Table, keys};
use cairn::stream::{Item, Topic};
use cairn::structs::KvEntry;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::mem_log::{LogDisk, MemLogStore};

pub const RAFT_PORT: u16 = 8300;
pub const API_PORT: u16 = 8500;

/// Opens turmoil TCP streams for the Raft transport.
pub struct SimConnect;

impl Connect for SimConnect {
    fn connect<'a>(
        &'a self,
        addr: &'a str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<BoxStream>> + Send + 'a>> {
        Box::pin(async move {
            let addr: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
            let s = turmoil::net::TcpStream::connect(addr).await?;
            Ok(Box::new(s) as BoxStream)
        })
    }
}

/// Accepts turmoil TCP streams for the Raft transport.
pub struct SimListener(pub turmoil::net::TcpListener);

impl Accept for SimListener {
    async fn accept(&mut self) -> std::io::Result<(BoxStream, std::net::IpAddr)> {
        let (s, peer) = self.0.accept().await?;
        Ok((Box::new(s), peer.ip()))
    }
}

/// What survives a crash of one server: its log disk, its state tables and
/// its last snapshot (each shared by the clones handed to its lives).
#[derive(Clone)]
pub struct Disk {
    pub log: LogDisk,
    pub state: MemoryBackend,
    pub snapshots: SnapshotStore,
}

impl Default for Disk {
    fn default() -> Self {
        Disk {
            log: LogDisk::default(),
            state: MemoryBackend::default(),
            snapshots: SnapshotStore::memory(),
        }
    }
}

/// How the harness sees a server: the running instance, if any.
pub type Slot = Arc<Mutex<Option<Arc<Server>>>>;

/// Raft timing for the simulation: a fixed election timeout per server and
/// life, drawn from the seed (openraft's own draws, seeded by `run`, then
/// have a range of one value here).
pub fn raft_config(election_timeout: u64, snapshot_threshold: u64) -> openraft::Config {
    openraft::Config {
        cluster_name: "cairn-sim".into(),
        heartbeat_interval: 50,
        election_timeout_min: election_timeout,
        election_timeout_max: election_timeout + 1,
        max_payload_entries: 64,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_threshold),
        max_in_snapshot_log_to_keep: snapshot_threshold / 4,
        purge_batch_size: 16,
        // As cairn::raft::raft_config: a restarted leader stands for election.
        enable_leader_restore: Some(false),
        ..Default::default()
    }
}

/// Everything one server life needs.
pub struct Boot {
    pub id: NodeId,
    pub name: String,
    pub ip: std::net::IpAddr,
    pub peers: Vec<std::net::IpAddr>,
    pub expect: usize,
    pub election_timeout: u64,
    pub snapshot_threshold: u64,
}

/// What was committed, as every server applied it: per Raft index, each KV
/// key changed there and its entry afterwards (JSON, as events carry it;
/// `None`: deleted). The event-stream checker's ground truth.
#[derive(Debug, Default)]
pub struct Committed {
    pub kv: BTreeMap<u64, BTreeMap<String, Option<String>>>,
    /// Indexes two servers applied differently.
    pub conflicts: Vec<String>,
}

pub type Truth = Arc<Mutex<Committed>>;

fn record(truth: &Truth, server: &str, set: &ChangeSet) {
    let changes: BTreeMap<String, Option<String>> = set
        .changes
        .iter()
        .filter(|c| c.table == Table::Kv && (c.before.is_some() || c.after.is_some()))
        .map(|c| {
            let after = match &c.after {
                Some(Row::Kv(e)) => serde_json::to_value(&**e).ok().map(|v| v.to_string()),
                _ => None,
            };
            (c.key.clone(), after)
        })
        .collect();
    if changes.is_empty() {
        return;
    }
    let mut t = truth.lock().unwrap();
    match t.kv.get(&set.index) {
        Some(seen) if *seen != changes => {
            let msg = format!(
                "{server} applied index {} as {changes:?}, another server as {seen:?}",
                set.index
            );
            t.conflicts.push(msg);
        }
        Some(_) => {}
        None => {
            t.kv.insert(set.index, changes);
        }
    }
}

/// Simulated time since the run began, in microseconds: the one clock of
/// the servers, the clients and the checkers.
pub fn now_us() -> u64 {
    turmoil::sim_elapsed().unwrap_or_default().as_micros() as u64
}

fn sim_clock_ms() -> u64 {
    now_us() / 1000
}

/// Runs one life of a server until the host crashes.
pub async fn run_server(boot: Boot, disk: Disk, slot: Slot, truth: Truth) -> turmoil::Result {
    let raft_addr = SocketAddr::new(boot.ip, RAFT_PORT);
    let config = ServerConfig {
        node: boot.name.clone(),
        datacenter: "dc1".into(),
        data_dir: PathBuf::from("/nonexistent"),
        http_addr: SocketAddr::new(boot.ip, API_PORT),
        raft_addr,
        bootstrap_expect: boot.expect,
        join: boot
            .peers
            .iter()
            .map(|ip| SocketAddr::new(*ip, RAFT_PORT).to_string())
            .collect(),
        snapshot_threshold: boot.snapshot_threshold,
        log_segment_bytes: cairn::raft::log_store::SEGMENT_BYTES,
        // Short, so that runs reap tombstones (deterministically, on every
        // server) while faults come and go.
        tombstone_ttl: std::time::Duration::from_secs(2),
        limits: Default::default(),
        tls: None,
        acl: Default::default(),
        agent_tokens: Default::default(),
    };
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", RAFT_PORT)).await?;
    let parts = ServerParts {
        id: boot.id,
        raft_config: raft_config(boot.election_timeout, boot.snapshot_threshold),
        log: MemLogStore::open(disk.log.clone()),
        persist: Box::new(disk.state.clone()),
        snapshots: disk.snapshots.clone(),
        connector: Arc::new(SimConnect),
        listener: SimListener(listener),
        sled: None,
        // Lock-delays measured on simulated time, the clock the lock
        // clients stamp their own commands with.
        clock: sim_clock_ms,
        tap: Some({
            let name = boot.name.clone();
            Arc::new(move |set: &ChangeSet| record(&truth, &name, set))
        }),
    };
    let server = Server::assemble(config, parts)
        .await
        .map_err(|e| e.to_string())?;
    *slot.lock().unwrap() = Some(server.clone());
    // The leader's session TTL expiry, as `http::run` starts it.
    tokio::spawn(cairn::http::session::expire(server.clone()));
    let api = turmoil::net::TcpListener::bind(("0.0.0.0", API_PORT)).await?;
    loop {
        let (stream, _) = api.accept().await?;
        let server = server.clone();
        tokio::spawn(async move {
            let _ = serve_api(stream, server).await;
        });
    }
}

/// A client request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ApiRequest {
    Write(Box<Command>),
    Get {
        key: String,
        consistent: bool,
    },
    /// The KV topic's event stream, as `/v1/internal/stream?topic=KV`:
    /// answered by this server from its own state, one `ApiReply::Stream`
    /// per batch until the connection closes.
    Subscribe {
        index: u64,
    },
    /// `PUT /v1/session/renew/:id`: answered `Write(Ok(Response::Ok))`
    /// once the leader (confirmed by a quorum) has reset the session's
    /// timer.
    Renew {
        id: String,
    },
}

/// One stream item: an event (`value`: the entry's JSON; `None` for a
/// delete), or a marker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StreamItem {
    Event {
        index: u64,
        key: String,
        value: Option<String>,
    },
    EndOfSnapshot(u64),
    NewSnapshotToFollow,
}

impl From<Item> for StreamItem {
    fn from(item: Item) -> Self {
        match item {
            Item::Event(e) => StreamItem::Event {
                index: e.index,
                key: e.key.clone(),
                value: (e.op() != "Delete").then(|| e.payload()["Value"].to_string()),
            },
            Item::EndOfSnapshot(i) => StreamItem::EndOfSnapshot(i),
            Item::NewSnapshotToFollow => StreamItem::NewSnapshotToFollow,
        }
    }
}

/// The answer, or the error text the HTTP API would have sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ApiReply {
    Write(Result<Response, String>),
    Get(Result<Option<KvEntry>, String>),
    Stream(Vec<StreamItem>),
}

#[derive(Serialize, Deserialize)]
pub struct Envelope {
    pub req: ApiRequest,
    /// Sent by a server forwarding to the leader (`X-Cairn-Forwarded`).
    pub forwarded: bool,
}

pub async fn write_msg<T: Serialize>(
    s: &mut turmoil::net::TcpStream,
    v: &T,
) -> std::io::Result<()> {
    let bytes = bincode::serialize(v).map_err(std::io::Error::other)?;
    s.write_u32(bytes.len() as u32).await?;
    s.write_all(&bytes).await
}

pub async fn read_msg<T: serde::de::DeserializeOwned>(
    s: &mut turmoil::net::TcpStream,
) -> std::io::Result<T> {
    let len = s.read_u32().await? as usize;
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    bincode::deserialize(&buf).map_err(std::io::Error::other)
}

/// Sends one request on a fresh connection, within `timeout`.
pub async fn call(
    addr: SocketAddr,
    req: &ApiRequest,
    forwarded: bool,
    timeout: Duration,
) -> std::io::Result<ApiReply> {
    let env = Envelope {
        req: req.clone(),
        forwarded,
    };
    tokio::time::timeout(timeout, async {
        let mut s = turmoil::net::TcpStream::connect(addr).await?;
        write_msg(&mut s, &env).await?;
        read_msg(&mut s).await
    })
    .await
    .unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "request timed out",
        ))
    })
}

async fn serve_api(
    mut stream: turmoil::net::TcpStream,
    server: Arc<Server>,
) -> std::io::Result<()> {
    let env: Envelope = read_msg(&mut stream).await?;
    if let ApiRequest::Subscribe { index } = env.req {
        let mut sub = server
            .publisher
            .subscribe(server.store.clone(), Topic::Kv, "", index);
        loop {
            let items = sub.next_batch().await;
            let batch = items.into_iter().map(StreamItem::from).collect();
            write_msg(&mut stream, &ApiReply::Stream(batch)).await?;
        }
    }
    let reply = handle(&server, env.req, env.forwarded).await;
    write_msg(&mut stream, &reply).await
}

fn error_reply(req: &ApiRequest, e: String) -> ApiReply {
    match req {
        ApiRequest::Write(_) | ApiRequest::Renew { .. } => ApiReply::Write(Err(e)),
        ApiRequest::Get { .. } => ApiReply::Get(Err(e)),
        ApiRequest::Subscribe { .. } => ApiReply::Stream(Vec::new()),
    }
}

/// How long a forwarding server waits for the leader's answer: past the
/// leader's own hold time on a write.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(9);

async fn handle(s: &Arc<Server>, req: ApiRequest, forwarded: bool) -> ApiReply {
    // As `forward_to_leader`: the leader (or a forwarded request) is
    // answered here, anything else goes to the leader.
    if !forwarded && !s.cluster.is_leader() {
        match s.await_leader().await {
            Ok((id, _)) if id == s.cluster.id => {}
            Ok((_, leader)) => {
                let Ok(addr) = leader.http_addr.parse::<SocketAddr>() else {
                    return error_reply(&req, "bad leader address".into());
                };
                return match call(addr, &req, true, FORWARD_TIMEOUT).await {
                    Ok(r) => r,
                    Err(e) => error_reply(&req, e.to_string()),
                };
            }
            Err(e) => return error_reply(&req, e.to_string()),
        }
    }
    match req {
        ApiRequest::Write(cmd) => ApiReply::Write(s.write(*cmd).await.map_err(|e| e.to_string())),
        ApiRequest::Get { key, consistent } => {
            let opts = QueryOptions {
                index: 0,
                wait: Duration::from_secs(1),
                consistent,
                stale: false,
            };
            // The simulated clients carry no token (ACLs are off here).
            let mut authz = Authz::open();
            let watch = Watch::Keys(vec![keys::kv(&key)]);
            let read = blocking(s, &opts, &mut authz, watch, |st, _| {
                (st.index, st.kv.get(&key).map(|e| (**e).clone()))
            })
            .await;
            ApiReply::Get(read.map(|(_, e)| e).map_err(|e| e.to_string()))
        }
        ApiRequest::Subscribe { .. } => ApiReply::Stream(Vec::new()),
        ApiRequest::Renew { id } => ApiReply::Write(
            cairn::http::session::renew_session(s, &id)
                .await
                .map(|_| Response::Ok)
                .map_err(|e| e.to_string()),
        ),
    }
}
