//! A cairn server on a simulated host: the real `Server` assembled from
//! in-memory storage and turmoil's network, plus the small API the
//! simulated clients speak.
//!
//! The API stands in for HTTP (hyper over turmoil streams would work but
//! costs build and run time the seeds need). Its clients make the calls the
//! HTTP handlers make once they have decoded a request: KV, session (locks
//! included), catalog and config-entry writes and reads are calls of the
//! server's endpoint layer (`cairn::endpoint::route`: routed to the leader
//! over the Raft port's channel, the token checked where they run, the
//! lock commands stamped by the leader's clock); event streams subscribe
//! through `endpoint::stream`. Only the setup writes of ACL objects and
//! prepared queries, whose areas are not on the endpoint layer yet, are
//! still passed to the leader here (`handle`, as `forward_to_leader`) and
//! checked as their HTTP handlers check them (`check_token`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::acl::DefaultPolicy;
use cairn::endpoint::Call;
use cairn::error::Error;
use cairn::federation::Handler;
use cairn::raft::NodeId;
use cairn::raft::network::{Accept, BoxStream, Connect, Connecting};
use cairn::raft::state_machine::SnapshotStore;
use cairn::raft::wan::{WanRequest, WanResponse};
use cairn::request::QueryOptions;
use cairn::server::{Server, ServerConfig, ServerParts};
use cairn::state::acl::AclRow;
use cairn::state::token_resolver::AclConfig;
use cairn::state::{ChangeSet, MemoryBackend, Response, Row, Table, WriteBehind};
use cairn::stream::{Item, Topic};
use cairn::structs::KvEntry;
use cairn::structs::validate::validate_register;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::mem_log::{LogDisk, MemLogStore};

pub const RAFT_PORT: u16 = 8300;
pub const API_PORT: u16 = 8500;
/// The real gRPC port's services (`cairn::grpc::routes`: ADS, the
/// dataplane's), served over simulated TCP.
pub const GRPC_PORT: u16 = 8502;

/// Opens turmoil TCP streams for the Raft transport.
pub struct SimConnect;

impl Connect for SimConnect {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a> {
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
    /// ACLs on, default deny, with `MANAGEMENT` as the initial
    /// management token.
    pub acl: bool,
    /// The DNS interface's token (`--acl-token`; none: anonymous).
    pub dns_token: Option<String>,
    /// Its datacenter in a federation (the federation scenario); none:
    /// the lone `dc1` of the other scenarios, without WAN federation.
    pub federation: Option<FedBoot>,
}

/// A server's place in a WAN federation.
#[derive(Debug, Clone)]
pub struct FedBoot {
    /// `--datacenter`.
    pub datacenter: String,
    /// `--primary-datacenter`.
    pub primary: String,
    /// `--join-wan`: servers of the other datacenters (their Raft ports).
    pub join_wan: Vec<std::net::IpAddr>,
}

/// What a federated server answers besides the simulated API: requests
/// from other datacenters (the HTTP router in process, behind the leader
/// forwarding the simulated API stands in for), and `?dc=` reads sent
/// there through its federation.
#[derive(Clone)]
struct Wan {
    answer: Handler,
    federation: Arc<cairn::federation::Federation>,
}

/// The initial management token's secret (`--acl-initial-management-token`)
/// of servers with ACLs on; the ACL clients (`acl`) hold it too.
pub const MANAGEMENT: &str = "5e1f0000-0000-4000-8000-00000000000a";

/// What was committed, as every server applied it: per Raft index, each KV
/// key changed there and its entry afterwards (JSON, as events carry it;
/// `None`: deleted). The event-stream checker's ground truth.
#[derive(Debug, Default)]
pub struct Committed {
    pub kv: BTreeMap<u64, BTreeMap<String, Option<String>>>,
    /// Per ACL token deleted (by accessor), the index whose apply removed
    /// it: the ACL checker's ground truth.
    pub acl_deleted: BTreeMap<String, u64>,
    /// Per ACL token deleted and server (its name), when (µs of simulated
    /// time) that server first applied the delete: until then a `?stale`
    /// read it answers may still accept the token.
    pub acl_deleted_at: BTreeMap<(String, String), u64>,
    /// Per ACL row (its key: `t/<accessor>`, `p/<policy id>`), the
    /// indexes that changed it and what it was after each: a policy's
    /// rules, `Some("")` for any other row, `None` once removed. The DNS
    /// checker's ground truth of what its token could read at an index.
    pub acl_rows: BTreeMap<String, BTreeMap<u64, Option<String>>>,
    /// Per health check (`<node>/<check id>`), the indexes that changed
    /// it and its status after each (`None`: removed). Checker 5's ground
    /// truth of what a prepared query could return at an index.
    pub checks: BTreeMap<String, BTreeMap<u64, Option<String>>>,
    /// Per ACL row, index and server: when (µs) that server applied that
    /// index's change of the row (again after a restart that started from
    /// state before it). With `starts`, checker (j)'s ground truth of when
    /// a server's xDS streams had to see a policy change.
    pub acl_applied_at: BTreeMap<(String, u64, String), Vec<u64>>,
    /// Per server, when (µs) each of its lives began, and the index its
    /// state had once assembled (restored, or re-applied since).
    pub starts: BTreeMap<String, Vec<(u64, u64)>>,
    /// Per server, when (µs) its whole state was replaced (a snapshot
    /// installed from the leader, or restored) and at what index:
    /// everything up to it applied at once, which no per-row change lists.
    pub installs: BTreeMap<String, Vec<(u64, u64)>>,
    /// Indexes two servers applied differently.
    pub conflicts: Vec<String>,
}

pub type Truth = Arc<Mutex<Committed>>;

fn record(truth: &Truth, server: &str, set: &ChangeSet) {
    if set.replaced {
        (truth.lock().unwrap().installs.entry(server.to_string()))
            .or_default()
            .push((now_us(), set.index));
    }
    record_acl(truth, server, set);
    record_checks(truth, set);
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

/// The health checks `set` changed, each with its status after `set.index`.
fn record_checks(truth: &Truth, set: &ChangeSet) {
    for c in set.changes.iter().filter(|c| c.table == Table::Checks) {
        let (key, after) = match (&c.after, &c.before) {
            (Some(Row::Check(h)), _) => (
                format!("{}/{}", h.node, h.check_id),
                Some(h.status.as_str().to_string()),
            ),
            (None, Some(Row::Check(h))) => (format!("{}/{}", h.node, h.check_id), None),
            _ => continue,
        };
        truth
            .lock()
            .unwrap()
            .checks
            .entry(key)
            .or_default()
            .insert(set.index, after);
    }
}

/// The ACL rows `set` changed, and the tokens it removed, each at
/// `set.index`.
fn record_acl(truth: &Truth, server: &str, set: &ChangeSet) {
    for c in set.changes.iter().filter(|c| c.table == Table::Acl) {
        let after = match &c.after {
            Some(Row::Acl(AclRow::Policy(p))) => Some(p.rules.clone()),
            Some(_) => Some(String::new()),
            None => None,
        };
        let mut t = truth.lock().unwrap();
        t.acl_rows
            .entry(c.key.clone())
            .or_default()
            .insert(set.index, after);
        t.acl_applied_at
            .entry((c.key.clone(), set.index, server.to_string()))
            .or_default()
            .push(now_us());
    }
    let removed = set.changes.iter().filter(|c| {
        c.table == Table::Acl && c.before.is_some() && c.after.is_none() && c.key.starts_with("t/")
    });
    for c in removed {
        let accessor = c.key["t/".len()..].to_string();
        let mut t = truth.lock().unwrap();
        t.acl_deleted_at
            .entry((accessor.clone(), server.to_string()))
            .or_insert_with(now_us);
        match t.acl_deleted.get(&accessor) {
            Some(&seen) if seen != set.index => {
                let msg = format!(
                    "{server} removed token {accessor} at index {}, another server at {seen}",
                    set.index
                );
                t.conflicts.push(msg);
            }
            Some(_) => {}
            None => {
                t.acl_deleted.insert(accessor, set.index);
            }
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
    let started = now_us();
    let raft_addr = SocketAddr::new(boot.ip, RAFT_PORT);
    let config = ServerConfig {
        http_addr: SocketAddr::new(boot.ip, API_PORT),
        raft_addr,
        bootstrap_expect: boot.expect,
        join: boot
            .peers
            .iter()
            .map(|ip| SocketAddr::new(*ip, RAFT_PORT).to_string())
            .collect(),
        snapshot_threshold: boot.snapshot_threshold,
        // Short, so that runs reap tombstones (deterministically, on every
        // server) while faults come and go.
        tombstone_ttl: std::time::Duration::from_secs(2),
        acl: if boot.acl {
            AclConfig {
                enabled: true,
                default_policy: DefaultPolicy::Deny,
                initial_management: Some(MANAGEMENT.into()),
            }
        } else {
            AclConfig::default()
        },
        // As `--acl-token`: what the DNS interface reads with.
        agent_tokens: cairn::structs::acl::AgentTokens {
            default: boot.dns_token.clone(),
            agent: None,
        },
        ..ServerConfig::new(boot.name.clone(), PathBuf::from("/nonexistent"))
    };
    let config = match &boot.federation {
        Some(f) => ServerConfig {
            datacenter: f.datacenter.clone(),
            primary_datacenter: Some(f.primary.clone()),
            join_wan: f
                .join_wan
                .iter()
                .map(|ip| SocketAddr::new(*ip, RAFT_PORT).to_string())
                .collect(),
            ..config
        },
        None => config,
    };
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", RAFT_PORT)).await?;
    let parts = ServerParts {
        id: boot.id,
        raft_config: raft_config(boot.election_timeout, boot.snapshot_threshold),
        log: MemLogStore::open(disk.log.clone()),
        // Written behind as a real server's rows are (there on a thread,
        // here every few batches, deterministically): a crash loses the
        // rows not yet written, which the restart must re-apply.
        persist: Box::new(WriteBehind::every(Box::new(disk.state.clone()), 4)),
        snapshots: disk.snapshots.clone(),
        connector: Arc::new(SimConnect),
        listener: SimListener(listener),
        sled: None,
        // Lock-delays measured on simulated time, the clock the lock
        // clients stamp their own commands with.
        clock: sim_clock_ms,
        tap: Some({
            let (name, truth) = (boot.name.clone(), truth.clone());
            Arc::new(move |set: &ChangeSet| record(&truth, &name, set))
        }),
    };
    // Built as every server is (`process::assemble`): the core and the
    // leader module, every leader duty included. The HTTP and DNS
    // listeners stand aside: the simulated clients speak `serve_api`; the
    // gRPC port's own services (xDS) are served on simulated TCP.
    // In a federation, with its WAN federation as `process::server` has
    // it, answering other datacenters with the HTTP router in process.
    let (server, wan) = if boot.federation.is_some() {
        let f = cairn::process::assemble_federated(config, parts)
            .await
            .map_err(|e| e.to_string())?;
        f.federation
            .serve(wan_handler(f.server.clone(), f.answer.clone()));
        let wan = Wan {
            answer: f.answer,
            federation: f.federation.clone(),
        };
        (f.server, Some(wan))
    } else {
        let server = cairn::process::assemble(config, parts)
            .await
            .map_err(|e| e.to_string())?;
        (server, None)
    };
    *slot.lock().unwrap() = Some(server.clone());
    (truth.lock().unwrap().starts.entry(boot.name.clone()))
        .or_default()
        .push((started, server.state().index));
    let grpc = turmoil::net::TcpListener::bind(("0.0.0.0", GRPC_PORT)).await?;
    let routes = cairn::grpc::routes(&server, cairn::xds::Limits::default());
    tokio::spawn(async move {
        let incoming = futures_util::stream::unfold(grpc, |l| async move {
            let conn = l.accept().await.map(|(s, _)| GrpcConn(s));
            Some((conn, l))
        });
        let _ = tonic::transport::Server::builder()
            .serve_with_incoming(routes, incoming)
            .await;
    });
    let api = turmoil::net::TcpListener::bind(("0.0.0.0", API_PORT)).await?;
    loop {
        let (stream, _) = api.accept().await?;
        let (server, wan) = (server.clone(), wan.clone());
        tokio::spawn(async move {
            let _ = serve_api(stream, server, wan).await;
        });
    }
}

/// A simulated TCP connection as the gRPC server takes it.
struct GrpcConn(turmoil::net::TcpStream);

impl tonic::transport::server::Connected for GrpcConn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for GrpcConn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for GrpcConn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Whether the HTTP path answers `req` on the leader only (as
/// `forward_to_leader` decides for the requests other datacenters send
/// here: replication pulls are `?stale`, `?dc=` reads are not).
fn needs_leader(req: &WanRequest) -> bool {
    let query = req.path_and_query.split_once('?').map(|(_, q)| q);
    let read = matches!(req.method.as_str(), "GET" | "HEAD");
    !(read && cairn::request::Params::parse(query).has("stale"))
}

/// Requests from other datacenters: the router's answer here, or, where
/// the leader must answer and this server does not lead, the leader's,
/// asked over the simulated API (which stands in for the HTTP hop of
/// `forward_to_leader`: the router's own uses real sockets, not turmoil's).
fn wan_handler(server: Arc<Server>, answer: Handler) -> Handler {
    Arc::new(move |req: WanRequest| {
        let (s, answer) = (server.clone(), answer.clone());
        Box::pin(async move {
            if !needs_leader(&req) {
                return answer(req).await;
            }
            let failed = |e: String| WanResponse {
                status: 500,
                headers: Vec::new(),
                body: e.into_bytes(),
            };
            let read = matches!(req.method.as_str(), "GET" | "HEAD");
            let api = ApiRequest::Wan(req.clone());
            match via_leader(&s, &api, None, read).await {
                None => answer(req).await,
                Some(Ok(Answer {
                    reply: ApiReply::Wan(r),
                    ..
                })) => r,
                Some(Ok(other)) => failed(format!("unexpected {other:?}")),
                Some(Err(e)) => failed(e),
            }
        })
    })
}

/// A KV read of another datacenter (`GET /v1/kv/:key?dc=`), sent there
/// through this server's federation with the caller's token, as the
/// router's `?dc=` layer sends it.
async fn remote_get(
    wan: &Wan, dc: &str, key: &str, consistent: bool, token: Option<String>,
) -> ApiReply {
    let mode = if consistent { "&consistent" } else { "" };
    let req = WanRequest {
        from: wan.federation.datacenter().to_string(),
        method: "GET".into(),
        path_and_query: format!("/v1/kv/{key}?dc={dc}{mode}"),
        headers: token
            .map(|t| vec![("x-consul-token".to_string(), t)])
            .unwrap_or_default(),
        body: Vec::new(),
    };
    let sent = wan.federation.forward(dc, req, FORWARD_TIMEOUT).await;
    ApiReply::Get(match sent {
        Ok(r) if r.status == 200 => serde_json::from_slice::<Vec<KvEntry>>(&r.body)
            .map(|mut e| e.pop())
            .map_err(|e| e.to_string()),
        Ok(r) if r.status == 404 => Ok(None),
        Ok(r) => Err(format!(
            "{}: {}",
            r.status,
            String::from_utf8_lossy(&r.body).trim()
        )),
        Err(e) => Err(e.to_string()),
    })
}

/// A prepared query's execute through the endpoint layer
/// (`endpoint::query::execute_in`: here, or in the datacenter named) with
/// the caller's token. A local, non-`?stale` one is answered by the
/// leader: passed to it over the simulated API (as `handle` does).
async fn execute(
    s: &Arc<Server>, w: &Wan, req: &ApiRequest, token: Option<String>, forwarded: bool,
) -> ApiReply {
    let ApiRequest::Execute { query, dc, stale } = req else {
        return error_reply(req, "not an execute".into());
    };
    if !forwarded && !*stale && dc.is_none() {
        match via_leader(s, req, token.as_deref(), true).await {
            None => {}
            Some(Ok(a)) => return a.reply,
            Some(Err(e)) => return error_reply(req, e),
        }
    }
    let call = Call::new(
        token,
        QueryOptions {
            stale: *stale,
            ..Default::default()
        },
    );
    let ex = cairn::endpoint::query::Execute::default();
    let fed = Some(&*w.federation);
    let executed =
        cairn::endpoint::query::execute_in(s, fed, &call, dc.as_deref(), query, &ex).await;
    let answer = executed
        .map(|e| {
            let mut instances: Vec<(String, String, String)> = e
                .nodes
                .iter()
                .map(|i| {
                    (
                        i.node.node.clone(),
                        i.node.datacenter.clone(),
                        i.service.id.clone(),
                    )
                })
                .collect();
            // Execute shuffles them with an unseeded RNG: sorted, the
            // answer is the same in two runs of a seed.
            instances.sort();
            QueryAnswer {
                datacenter: e.datacenter,
                failovers: e.failovers,
                index: e.index,
                instances,
            }
        })
        .map_err(|e| e.to_string());
    ApiReply::Query(answer)
}

/// A client request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ApiRequest {
    /// A call of the server's endpoint layer (`cairn::endpoint::route`), as
    /// an HTTP handler makes it once it has decoded its request: routed to
    /// where it must run, its token checked there.
    Call(Box<cairn::endpoint::Op>),
    Get {
        key: String,
        consistent: bool,
    },
    /// A `?stale` read: answered (and its token checked) by the server
    /// asked, from its own state.
    StaleGet {
        key: String,
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
    /// A DNS query (its wire bytes, as a UDP datagram carries them):
    /// answered by this server from its own state through the DNS
    /// interface's resolver (`cairn::dns::answer` over a `StateCatalog`
    /// with the server's DNS token), as its listener would.
    Dns {
        query: Vec<u8>,
    },
    /// `GET /v1/kv/:key?dc=<dc>` (`?consistent` too when set): answered by
    /// the server asked, through its HTTP router in process, which sends
    /// it to that datacenter (federated servers only).
    RemoteGet {
        dc: String,
        key: String,
        consistent: bool,
    },
    /// A request from another datacenter, passed by a server of this one
    /// to its leader (federated servers only; always `forwarded`).
    Wan(WanRequest),
    /// `GET /v1/query/:query/execute` (`?dc=`, `?stale` when set),
    /// answered through the HTTP router in process (federated servers
    /// only): by the leader unless `stale` or `dc` is set, as
    /// `forward_to_leader` decides.
    Execute {
        query: String,
        dc: Option<String>,
        stale: bool,
    },
}

/// The clients' writes, as endpoint calls (`ApiRequest::Call`).
pub mod calls {
    use cairn::endpoint::kv::{self, Put};
    use cairn::endpoint::{Op, Value, acl, catalog, config, query, session};
    use cairn::structs::acl::{AclPolicy, AclToken};
    use cairn::structs::auth::AclAuthMethod;
    use cairn::structs::query::PreparedQuery;
    use cairn::structs::{DeregisterRequest, RegisterRequest, Session};

    use super::{ApiReply, ApiRequest};

    fn call(op: Op) -> ApiRequest {
        ApiRequest::Call(Box::new(op))
    }

    /// `PUT /v1/kv/:key` (with `?cas=`).
    pub fn put(key: &str, value: Vec<u8>, cas: Option<u64>) -> ApiRequest {
        call(Op::Kv(kv::Op::Put(Put {
            key: key.into(),
            value,
            cas,
            ..Put::default()
        })))
    }

    /// `PUT /v1/kv/:key?acquire=` (or `?release=`) for `session`.
    pub fn lock(key: &str, session: &str, acquire: bool) -> ApiRequest {
        let id = Some(session.to_string());
        call(Op::Kv(kv::Op::Put(Put {
            key: key.into(),
            value: session.as_bytes().to_vec(),
            acquire: if acquire { id.clone() } else { None },
            release: if acquire { None } else { id },
            ..Put::default()
        })))
    }

    /// `DELETE /v1/kv/:key`.
    pub fn delete(key: &str) -> ApiRequest {
        call(Op::Kv(kv::Op::Delete {
            key: key.into(),
            recurse: false,
            cas: None,
        }))
    }

    pub fn register(req: RegisterRequest) -> ApiRequest {
        call(Op::Catalog(catalog::Op::Register(Box::new(req))))
    }

    pub fn deregister(req: DeregisterRequest) -> ApiRequest {
        call(Op::Catalog(catalog::Op::Deregister(req)))
    }

    /// A session as the server first asked would make it (its ID chosen
    /// by the client, so that a retry cannot make a second one; its TTL
    /// below the HTTP API's 10 s minimum, which decoding enforces).
    pub fn create_session(session: Session) -> ApiRequest {
        call(Op::Session(session::Op::Create {
            session,
            no_checks: false,
        }))
    }

    pub fn destroy_session(id: &str) -> ApiRequest {
        call(Op::Session(session::Op::Destroy { id: id.into() }))
    }

    /// `PUT /v1/config` with an entry's JSON.
    pub fn config_set(entry: serde_json::Value) -> ApiRequest {
        call(Op::Config(config::Op::Set { entry, cas: None }))
    }

    /// `DELETE /v1/config/:kind/:name`.
    pub fn config_delete(kind: &str, name: &str) -> ApiRequest {
        call(Op::Config(config::Op::Delete {
            kind: kind.into(),
            name: name.into(),
            cas: None,
        }))
    }

    /// A new ACL object (`create`) or the replacement of one.
    pub fn acl_set(object: acl::Object, create: bool) -> ApiRequest {
        call(Op::Acl(acl::Op::Set { object, create }))
    }

    pub fn new_policy(p: AclPolicy) -> ApiRequest {
        acl_set(acl::Object::Policy(Box::new(p)), true)
    }

    pub fn update_policy(p: AclPolicy) -> ApiRequest {
        acl_set(acl::Object::Policy(Box::new(p)), false)
    }

    /// A new token (its secret's hash in it, the secret itself kept by
    /// the client).
    pub fn new_token(t: AclToken) -> ApiRequest {
        let object = acl::Object::Token {
            token: Box::new(t),
            secret: None,
        };
        acl_set(object, true)
    }

    pub fn new_auth_method(m: AclAuthMethod) -> ApiRequest {
        acl_set(acl::Object::AuthMethod(Box::new(m)), true)
    }

    pub fn acl_delete(what: acl::Deleted) -> ApiRequest {
        call(Op::Acl(acl::Op::Delete(what)))
    }

    /// A prepared query with its ID made (as by the server first asked).
    pub fn create_query(q: PreparedQuery) -> ApiRequest {
        call(Op::Query(query::Op::Create(Box::new(q))))
    }

    /// A KV, catalog or config write's outcome (`None`: unknown, or
    /// refused).
    pub fn done(reply: &std::io::Result<ApiReply>) -> Option<bool> {
        match reply {
            Ok(ApiReply::Call(Ok(
                Value::Kv(kv::Value::Done(ok))
                | Value::Catalog(catalog::Value::Written(ok))
                | Value::Config(config::Value::Written(ok)),
            ))) => Some(*ok),
            Ok(ApiReply::Call(Ok(Value::Session(
                session::Value::Created { .. } | session::Value::Destroyed(true),
            )))) => Some(true),
            _ => None,
        }
    }
}

/// A prepared query's execute, as checker 5 needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueryAnswer {
    /// The datacenter whose instances these are (`Datacenter`).
    pub datacenter: String,
    pub failovers: u32,
    /// The index of that datacenter the answer reflects (`Index`, as
    /// `X-Consul-Index`).
    pub index: u64,
    /// Per instance: its node, the node's datacenter, the service ID.
    pub instances: Vec<(String, String, String)>,
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
    /// An endpoint call's value, or its error's text.
    Call(Result<cairn::endpoint::Value, String>),
    Write(Result<Response, String>),
    Get(Result<Option<KvEntry>, String>),
    Stream(Vec<StreamItem>),
    /// The leader's answer to a `Wan` request.
    Wan(WanResponse),
    /// A prepared query's execute.
    Query(Result<QueryAnswer, String>),
    /// A DNS answer (none: the resolver sent nothing back), with the
    /// index the server had applied before and after it resolved it.
    Dns {
        answer: Option<Vec<u8>>,
        before: u64,
        after: u64,
    },
}

/// What a server answers a request with (a stream's batches excepted).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    pub reply: ApiReply,
}

#[derive(Serialize, Deserialize)]
pub struct Envelope {
    pub req: ApiRequest,
    /// The request's token (`X-Consul-Token`); forwarded with it.
    pub token: Option<String>,
    /// Sent by a server forwarding to the leader (`X-Cairn-Forwarded`).
    pub forwarded: bool,
}

pub async fn write_msg<T: Serialize>(
    s: &mut turmoil::net::TcpStream, v: &T,
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

/// Sends one request with `token` on a fresh connection, within
/// `timeout`.
pub async fn call(
    addr: SocketAddr, req: &ApiRequest, token: Option<&str>, timeout: Duration,
) -> std::io::Result<ApiReply> {
    send(addr, req, token, false, timeout)
        .await
        .map(|a| a.reply)
}

/// `call`, `forwarded` as a server passing a request to its leader.
async fn send(
    addr: SocketAddr, req: &ApiRequest, token: Option<&str>, forwarded: bool, timeout: Duration,
) -> std::io::Result<Answer> {
    let env = Envelope {
        req: req.clone(),
        token: token.map(str::to_string),
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
    mut stream: turmoil::net::TcpStream, server: Arc<Server>, wan: Option<Wan>,
) -> std::io::Result<()> {
    let env: Envelope = read_msg(&mut stream).await?;
    // What is answered here whole: the federated requests (by the router in
    // process) and DNS queries.
    let whole = match (&env.req, &wan) {
        // Sent by a server of this datacenter to its leader: answered only
        // while it leads (the router would pass it on over real sockets).
        (ApiRequest::Wan(req), Some(w)) if env.forwarded => Some(if server.cluster().is_leader() {
            ApiReply::Wan((w.answer)(req.clone()).await)
        } else {
            error_reply(&env.req, "not the leader".into())
        }),
        (
            ApiRequest::RemoteGet {
                dc,
                key,
                consistent,
            },
            Some(w),
        ) => Some(remote_get(w, dc, key, *consistent, env.token.clone()).await),
        (ApiRequest::Execute { .. }, Some(w)) => {
            Some(execute(&server, w, &env.req, env.token.clone(), env.forwarded).await)
        }
        (ApiRequest::Wan(_) | ApiRequest::RemoteGet { .. } | ApiRequest::Execute { .. }, _) => {
            Some(error_reply(&env.req, "not federated".into()))
        }
        (ApiRequest::Dns { query }, _) => Some(dns(&server, query).await),
        (ApiRequest::Subscribe { .. }, _) => None,
        // The rest go through the server's own endpoint layer
        // (`cairn::endpoint`), which routes them to the leader over the
        // Raft port's channel (turmoil's network) and checks the token
        // where they run, as the HTTP handlers call it.
        _ => Some(endpoint_call(&server, &env.req, env.token.clone()).await),
    };
    if let Some(reply) = whole {
        return write_msg(&mut stream, &Answer { reply }).await;
    }
    if let ApiRequest::Subscribe { index } = env.req {
        // As `/v1/internal/stream?topic=KV`: answered by this server
        // (`endpoint::stream`); a refused subscriber is hung up on, a
        // token gone ends the stream.
        let call = Call::new(env.token.clone(), QueryOptions::default());
        let Ok(mut sub) = cairn::endpoint::stream::subscribe(&server, &call, Topic::Kv, "", index)
        else {
            return Ok(());
        };
        loop {
            let Ok(items) = sub.sub.next_batch().await else {
                return Ok(());
            };
            let batch = items.into_iter().map(StreamItem::from).collect();
            write_msg(&mut stream, &ApiReply::Stream(batch)).await?;
        }
    }
    Ok(())
}

/// `req` as the HTTP handlers call the endpoint layer.
async fn endpoint_call(s: &Arc<Server>, req: &ApiRequest, token: Option<String>) -> ApiReply {
    let call = |consistent, stale| {
        Call::new(
            token.clone(),
            QueryOptions {
                index: 0,
                wait: Duration::from_secs(1),
                consistent,
                stale,
            },
        )
    };
    let get = |call: Call, key: &str| {
        let key = key.to_string();
        async move {
            let read = cairn::endpoint::kv::get(s, call, key, false).await;
            ApiReply::Get(
                read.map(|a| a.value.into_iter().next())
                    .map_err(|e| e.to_string()),
            )
        }
    };
    match req {
        ApiRequest::Get { key, consistent } => get(call(*consistent, false), key).await,
        ApiRequest::StaleGet { key } => get(call(false, true), key).await,
        ApiRequest::Renew { id } => ApiReply::Write(
            cairn::endpoint::session::renew(s, call(false, false), id.clone())
                .await
                .map(|_| Response::Ok)
                .map_err(|e| e.to_string()),
        ),
        ApiRequest::Call(op) => {
            use cairn::endpoint::{Op, catalog, session};
            let mut op = (**op).clone();
            // The HTTP handlers' decoding: validation and defaults, made
            // where the request arrives, before the call.
            match &mut op {
                Op::Catalog(catalog::Op::Register(req)) => {
                    if let Err(e) = validate_register(req, s.datacenter()) {
                        return ApiReply::Call(Err(e.to_string()));
                    }
                }
                // A session's node defaults to the receiving server's.
                Op::Session(session::Op::Create { session, .. }) if session.node.is_empty() => {
                    session.node = s.node_name().to_string()
                }
                _ => {}
            }
            let answer = cairn::endpoint::route(s, call(false, false), op).await;
            ApiReply::Call(answer.map(|a| a.value).map_err(|e| e.to_string()))
        }
        _ => error_reply(req, "not an endpoint call".into()),
    }
}

/// A DNS query answered as the server's listener answers it (`process::server`
/// builds the same catalog): the server's own state, read with its DNS
/// token. The DNS listener's sockets are tokio's, not turmoil's, so the
/// query comes through the simulated API instead of UDP.
async fn dns(s: &Arc<Server>, query: &[u8]) -> ApiReply {
    let catalog = cairn::dns::StateCatalog {
        store: s.store().clone(),
        datacenter: s.datacenter().to_owned(),
        acl: s.acl().clone(),
        token: s.config().agent_tokens.default.clone(),
        remote: None,
        queries: None,
    };
    let config = cairn::dns::DnsConfig::new(s.config().http_addr);
    let before = s.state().index;
    let answer = cairn::dns::answer(&config, &catalog, query, true).await;
    ApiReply::Dns {
        answer,
        before,
        after: s.state().index,
    }
}

fn error_reply(req: &ApiRequest, e: String) -> ApiReply {
    match req {
        ApiRequest::Call(_) => ApiReply::Call(Err(e)),
        ApiRequest::Renew { .. } => ApiReply::Write(Err(e)),
        ApiRequest::Get { .. } | ApiRequest::StaleGet { .. } | ApiRequest::RemoteGet { .. } => {
            ApiReply::Get(Err(e))
        }
        ApiRequest::Wan(_) => ApiReply::Wan(WanResponse {
            status: 500,
            headers: Vec::new(),
            body: e.into_bytes(),
        }),
        ApiRequest::Subscribe { .. } => ApiReply::Stream(Vec::new()),
        ApiRequest::Dns { .. } => ApiReply::Dns {
            answer: None,
            before: 0,
            after: 0,
        },
        ApiRequest::Execute { .. } => ApiReply::Query(Err(e)),
    }
}

/// How long a forwarding server waits for the leader's answer: past the
/// leader's own hold time on a write.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(9);

/// `req` passed to the leader over the simulated API, as
/// `forward_to_leader` passes the requests of the areas not on the
/// endpoint layer yet (another datacenter's, a prepared query's execute:
/// the router's own hop uses real sockets, not turmoil's), its answer
/// ending with the leader's leadership
/// (`Server::while_leads`). `None`: this server leads and answers itself.
/// A leadership lost is asked again of the next leader when `retry` (a
/// read); for a write it is an error (its outcome unknown).
async fn via_leader(
    s: &Arc<Server>, req: &ApiRequest, token: Option<&str>, retry: bool,
) -> Option<Result<Answer, String>> {
    while !s.cluster().is_leader() {
        let (id, leader) = match s.await_leader().await {
            Ok((id, _)) if id == s.cluster().id => break,
            Ok(found) => found,
            Err(e) => return Some(Err(e.to_string())),
        };
        let Ok(addr) = leader.http_addr.parse::<SocketAddr>() else {
            return Some(Err("bad leader address".into()));
        };
        let sent = async {
            send(addr, req, token, true, FORWARD_TIMEOUT)
                .await
                .map_err(|e| Error::Internal(e.to_string()))
        };
        match s.while_leads(id, sent).await {
            Ok(a) => return Some(Ok(a)),
            Err(Error::LeadershipLost) if retry => {}
            Err(e) => return Some(Err(e.to_string())),
        }
    }
    None
}
