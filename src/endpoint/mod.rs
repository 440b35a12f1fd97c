//! The server's API as typed calls, below every transport: the HTTP
//! handlers decode a request into a `Call` and an area's operation, call
//! the area's function here, and encode its `Answer`; the simulation's
//! clients make the same calls.
//!
//! Each operation says where it must run (`Place`); `route` is the one
//! forwarding decision: here, or this datacenter's leader, reached over
//! the Raft port's channel (`raft::channel`), so the simulation's network
//! carries the hop too. The server that runs a call resolves its token
//! (after routing, as Consul's `ResolveToken` follows its `ForwardRPC`)
//! and makes the area's checks.
//!
//! Areas moved here so far: `kv` (but `/v1/txn`), `session`, the writes
//! of `catalog`, `config`, `query` and `acl` (tokens, policies, roles,
//! auth methods), `login`, `members`, and `agent` (what every server does
//! for itself: it runs where it is asked, then on the datacenter's other
//! servers); `query` (execute, for HTTP and DNS), `dataplane` and
//! `proxycfg` (for HTTP and gRPC), `snapshot` and `stream` are called in
//! place. The other areas' handlers, and the reads of catalog, config,
//! prepared queries and ACLs, still sit behind `http`'s `forward_to_leader`
//! layer.

pub mod acl;
pub mod agent;
pub mod blocking;
pub mod catalog;
pub mod config;
pub mod coordinate;
pub mod dataplane;
pub mod kv;
pub mod login;
pub mod members;
pub mod proxycfg;
pub mod query;
pub mod session;
pub mod snapshot;
pub mod stream;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::federation::Federation;
use crate::raft::channel::{BUSY, CallFuture, Calls};
use crate::raft::network::TOO_LARGE_PREFIX;
use crate::request::QueryOptions;
use crate::request::authz::Authz;
use crate::server::Server;

/// Who asks, and how: what every call carries besides its operation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Call {
    /// The caller's secret (none: the anonymous token).
    pub token: Option<String>,
    pub opts: QueryOptions,
    /// The caller's IP, for its share of the blocking places.
    pub client: Option<IpAddr>,
    /// The node of the server the call reached first, set when it is
    /// forwarded (none: the server running it); a session's `Node`
    /// defaults to it, as Consul's to the receiving agent's.
    pub origin: Option<String>,
    /// Came over a channel from another server of this datacenter (set by
    /// the receiver, never sent).
    #[serde(skip)]
    pub forwarded: bool,
}

impl Call {
    pub fn new(token: Option<String>, opts: QueryOptions) -> Self {
        Call {
            token,
            opts,
            ..Call::default()
        }
    }

    /// The node of the server the call reached first.
    pub fn origin<'a>(&'a self, s: &'a Server) -> &'a str {
        self.origin.as_deref().unwrap_or(s.node_name())
    }

    /// The caller's authorizer on the server that runs the call.
    pub fn authz(&self, s: &Server) -> Result<Authz> {
        Ok(Authz::resolve(s, self.token.clone())?.from_client(self.client))
    }
}

/// An answer and what the `X-Consul-*` headers say of it, as the server
/// that ran the call saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer<T> {
    pub index: u64,
    pub known_leader: bool,
    /// Milliseconds since this server heard from the leader (0 on it).
    pub last_contact: u64,
    /// ACLs dropped rows the caller may not see.
    pub filtered: bool,
    pub value: T,
}

impl<T> Answer<T> {
    /// `value`, read by `s` at `index`.
    pub fn at(s: &Server, index: u64, filtered: bool, value: T) -> Self {
        let last_contact = if s.cluster().is_leader() {
            0
        } else {
            s.cluster().since_leader_contact()
        };
        Answer {
            index: index.max(1),
            known_leader: s.cluster().leader().is_some(),
            last_contact,
            filtered,
            value,
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Answer<U> {
        Answer {
            index: self.index,
            known_leader: self.known_leader,
            last_contact: self.last_contact,
            filtered: self.filtered,
            value: f(self.value),
        }
    }

    pub fn try_map<U>(self, f: impl FnOnce(T) -> Result<U>) -> Result<Answer<U>> {
        let value = f(self.value)?;
        Ok(Answer {
            index: self.index,
            known_leader: self.known_leader,
            last_contact: self.last_contact,
            filtered: self.filtered,
            value,
        })
    }
}

/// Keeps the rows `allowed` passes; says whether any was dropped (an
/// answer's `filtered`).
pub fn keep<T>(rows: &mut Vec<T>, allowed: impl Fn(&T) -> bool) -> bool {
    let before = rows.len();
    rows.retain(|r| allowed(r));
    rows.len() != before
}

/// Where an operation must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// On the leader: writes, and what must see every write.
    Leader,
    /// On the leader, unless the caller asked `?stale`.
    LeaderUnlessStale,
}

/// Every operation the endpoint layer runs, as it travels to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    Kv(kv::Op),
    Session(session::Op),
    /// Run by each server for itself (`agent::run`), never routed.
    Agent(agent::Op),
    Members(members::Op),
    Login(login::Op),
    Catalog(catalog::Op),
    Config(config::Op),
    Query(query::Op),
    Acl(acl::Op),
}

/// What an operation answers with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Kv(kv::Value),
    Session(session::Value),
    Agent(agent::Value),
    Members(members::Value),
    Login(login::Value),
    Catalog(catalog::Value),
    Config(config::Value),
    Query(query::Value),
    Acl(acl::Value),
}

impl Op {
    fn place(&self) -> Place {
        match self {
            Op::Kv(op) => op.place(),
            Op::Session(op) => op.place(),
            Op::Agent(_) => Place::Leader,
            Op::Members(op) => op.place(),
            Op::Login(op) => op.place(),
            Op::Catalog(op) => op.place(),
            Op::Config(op) => op.place(),
            Op::Query(op) => op.place(),
            Op::Acl(op) => op.place(),
        }
    }

    fn is_read(&self) -> bool {
        self.place() == Place::LeaderUnlessStale
    }

    async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        match self {
            Op::Kv(op) => op.run(s, call).await.map(|a| a.map(Value::Kv)),
            Op::Session(op) => op.run(s, call).await.map(|a| a.map(Value::Session)),
            Op::Agent(_) => Err(Error::bad("an agent operation is run by agent::run")),
            // Boxed, as the hop in `route`: a membership change's and a
            // login's futures are kilobytes, and every call's future would
            // be as large (and copied at each move) for two rare areas.
            Op::Members(op) => Box::pin(op.run(s, call))
                .await
                .map(|a| a.map(Value::Members)),
            Op::Login(op) => Box::pin(op.run(s, call)).await.map(|a| a.map(Value::Login)),
            Op::Catalog(op) => op.run(s, call).await.map(|a| a.map(Value::Catalog)),
            Op::Config(op) => op.run(s, call).await.map(|a| a.map(Value::Config)),
            Op::Query(op) => op.run(s, call).await.map(|a| a.map(Value::Query)),
            Op::Acl(op) => op.run(s, call).await.map(|a| a.map(Value::Acl)),
        }
    }
}

/// The leader's word on a frame.
#[derive(Serialize, Deserialize)]
enum Reply {
    Answer(Result<Answer<Value>>),
    /// The receiver does not lead (any more): nothing was run, the sender
    /// asks the leader it knows next.
    NotLeader,
}

/// How long a forwarding server waits for the leader's answer.
fn forward_timeout(call: &Call, read: bool) -> Duration {
    let rpc = crate::request::RPC_CLIENT_TIMEOUT;
    if read && call.opts.index > 0 {
        call.opts.wait + call.opts.wait / 16 + rpc
    } else {
        rpc
    }
}

/// Runs `op` where it must run: here when this server is the ready leader
/// (or the caller asked `?stale` of a read), else on the leader, asked
/// over the channel to it and retried while a new one is elected (within
/// the hold time). A read is asked again of the next leader when the one
/// asked loses office; a write only when it surely never ran.
pub async fn route(s: &Arc<Server>, call: Call, op: Op) -> Result<Answer<Value>> {
    let read = op.is_read();
    let here = match op.place() {
        Place::Leader => s.cluster().is_ready_leader(),
        Place::LeaderUnlessStale => call.opts.stale || s.cluster().is_ready_leader(),
    };
    // BUG (deliberate): a follower answers a default read from its own
    // state instead of asking the leader.
    #[cfg(feature = "bug-follower-reads")]
    let here = here || (read && !call.opts.consistent);
    if here {
        return op.run(s, &call).await;
    }
    // Boxed: the hop's future (the leader awaited, the frame sent, the
    // answer awaited) is only needed off the leader, and inline it would
    // grow every call's future, the leader's included.
    Box::pin(via_leader(s, call, op, read)).await
}

/// `route`'s hop: `op` asked of the leader, retried while one is elected.
async fn via_leader(s: &Arc<Server>, mut call: Call, op: Op, read: bool) -> Result<Answer<Value>> {
    // A blocking read answers within its caller's wait, whatever happens
    // to leaders meanwhile: asked again of the next one, it waits what is
    // left.
    let wait_ends =
        (read && call.opts.index > 0).then(|| tokio::time::Instant::now() + call.opts.wait);
    call.origin.get_or_insert_with(|| s.node_name().to_string());
    let mut deadline = tokio::time::Instant::now() + crate::server::LEADER_HOLD;
    loop {
        let (id, leader) = s.await_leader().await?;
        if id == s.cluster().id {
            if s.await_ready_leader().await? {
                return op.run(s, &call).await;
            }
            // Deposed while it waited (a partition healed): the leader
            // it learns of next is asked.
            continue;
        }
        if let Some(ends) = wait_ends {
            call.opts.wait = ends.saturating_duration_since(tokio::time::Instant::now());
        }
        let sent = forward(s, &leader.raft_addr, &call, &op, read);
        match s.while_leads(id, sent).await {
            Ok(Reply::Answer(answer)) => return answer,
            Ok(Reply::NotLeader) | Err(Error::NoLeader)
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(Reply::NotLeader) => return Err(Error::NoLeader),
            // A read changes nothing: the next leader is asked, within a
            // hold time of its own.
            Err(Error::LeadershipLost) if read => {
                deadline = tokio::time::Instant::now() + crate::server::LEADER_HOLD;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Asks the leader at `addr` to run `op`. `NoLeader`: it surely never ran
/// (no channel, or never sent); `LeadershipLost`: it may have.
async fn forward(s: &Server, addr: &str, call: &Call, op: &Op, read: bool) -> Result<Reply> {
    crate::metrics::ENDPOINT_FORWARDED.inc();
    // Borrowed into the frame: a retry sends the same call again, uncopied.
    let body = bincode::serialize(&(call, op)).map_err(|e| Error::Internal(e.to_string()))?;
    let channel = s.cluster().channel_to(addr).await.map_err(|e| {
        tracing::debug!(%addr, error = %e, "no channel to the leader");
        Error::NoLeader
    })?;
    let timeout = forward_timeout(call, read);
    let answer = channel
        .call(body, timeout)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotConnected => Error::NoLeader,
            std::io::ErrorKind::InvalidInput => Error::TooLarge(e.to_string()),
            std::io::ErrorKind::TimedOut => Error::Internal(format!(
                "no answer from the leader within {} s",
                timeout.as_secs()
            )),
            _ => Error::LeadershipLost,
        })?;
    match answer {
        Ok(bytes) => crate::raft::network::decode::<Reply>(&bytes)
            .map_err(|e| Error::Internal(format!("the leader's answer: {e}"))),
        Err(e) if e == BUSY => Err(Error::Busy(format!("The leader is {e}: try again later"))),
        Err(e) if e.starts_with(TOO_LARGE_PREFIX) => Err(Error::TooLarge(e)),
        Err(e) => Err(Error::Internal(e)),
    }
}

/// Answers the calls other servers of this datacenter forward here.
pub struct Dispatch {
    pub server: Arc<Server>,
    pub federation: Option<Arc<Federation>>,
}

impl Calls for Dispatch {
    fn call(&self, body: Vec<u8>) -> CallFuture {
        let (s, fed) = (self.server.clone(), self.federation.clone());
        Box::pin(async move {
            let reply = match crate::raft::network::decode::<(Call, Op)>(&body) {
                Err(e) => Reply::Answer(Err(Error::bad(format!("undecodable call: {e}")))),
                // What every server does for itself: here, leader or not.
                Ok((call, Op::Agent(op))) => Reply::Answer(
                    op.run_here(&s, fed.as_deref(), &call)
                        .map(|a| a.map(Value::Agent)),
                ),
                Ok((mut call, op)) => {
                    call.forwarded = true;
                    run_forwarded(&s, call, op).await
                }
            };
            // Every `Reply` encodes; an empty answer would be the caller's
            // decoding error.
            bincode::serialize(&reply).unwrap_or_default()
        })
    }
}

/// A call sent here as to the leader: run once this server is the ready
/// leader; a server that does not lead runs nothing.
async fn run_forwarded(s: &Arc<Server>, call: Call, op: Op) -> Reply {
    // At once on a server that does not lead; a leader waits to be ready.
    if !s.await_ready_leader().await.unwrap_or(false) {
        return Reply::NotLeader;
    }
    Reply::Answer(op.run(s, &call).await)
}

/// Makes `s` answer the endpoint calls the other servers of its
/// datacenter forward to it (process assembly calls it once).
pub fn serve(s: &Arc<Server>, federation: Option<Arc<Federation>>) {
    let _ = s.cluster().calls.set(Arc::new(Dispatch {
        server: s.clone(),
        federation,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, read from its type alone.
    fn future_size<A, B, C, F, Fut>(_: F) -> usize
    where
        F: FnOnce(A, B, C) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// Every HTTP request's future holds `route`'s, and each move of it
    /// copies all of it: with openraft's read-index future (~4 KB) and the
    /// hop to the leader inline it was 6.6 KB in a debug build, and those
    /// copies showed in the leader's profile (`memmove` 4.5 → 5.9 % of its
    /// cycles, docs/benchmarks.md). The rare, large parts are boxed; this
    /// keeps them so.
    #[test]
    fn a_calls_future_stays_small() {
        let route = future_size(|s: &'static Arc<Server>, c: Call, op: Op| route(s, c, op));
        let run = future_size(|s: &'static Arc<Server>, c: &'static Call, op: Op| op.run(s, c));
        let read = future_size(
            |s: &'static Server, o: &'static QueryOptions, a: &'static mut Authz| {
                blocking::blocking(s, o, a, blocking::Watch::Keys(vec![]), |_, _| (0u64, ()))
            },
        );
        assert!(route <= 3 << 10, "route's future is {route} bytes");
        assert!(run <= 2 << 10, "Op::run's future is {run} bytes");
        assert!(read <= 1 << 10, "a blocking read's future is {read} bytes");
    }
}
