//! Sessions: create, destroy and renew (on the leader), info, a node's and
//! every session (blocking reads), with Consul's checks: `session:write`
//! on the session's node to create, destroy or renew it, `session:read`
//! to see it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::blocking::{Watch, blocking};
use super::{Answer, Call, Place, Value as Answered};
use crate::error::{Error, Result};
use crate::server::Server;
use crate::state::{Command, Response as Applied, Timeable, keys};
use crate::structs::{Session, SessionRequest};

/// Consul's node health check, the default a session is bound to.
const SERF_CHECK: &str = "serfHealth";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// A session checked on the server first asked (its ID made there),
    /// and whether its request named no checks (then it is bound to the
    /// node's `serfHealth`, if there is one).
    Create {
        session: Session,
        no_checks: bool,
    },
    Destroy {
        id: String,
    },
    Renew {
        id: String,
    },
    Info {
        id: String,
    },
    Node {
        node: String,
    },
    List,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Created { id: String },
    Destroyed(bool),
    Sessions(Vec<Session>),
}

/// Creates a session; its ID.
pub async fn create(s: &Arc<Server>, call: Call, req: SessionRequest) -> Result<String> {
    let no_checks = req.no_checks();
    let id = uuid::Uuid::new_v4().to_string();
    let session = req
        .into_session(id, call.origin(s))
        .map_err(Error::BadRequest)?;
    let op = Op::Create { session, no_checks };
    match super::route(s, call, super::Op::Session(op)).await?.value {
        Answered::Session(Value::Created { id }) => Ok(id),
        _ => Err(unexpected()),
    }
}

/// Destroys a session (true also when there was none).
pub async fn destroy(s: &Arc<Server>, call: Call, id: String) -> Result<bool> {
    match super::route(s, call, super::Op::Session(Op::Destroy { id }))
        .await?
        .value
    {
        Answered::Session(Value::Destroyed(ok)) => Ok(ok),
        _ => Err(unexpected()),
    }
}

/// Resets a session's TTL timer on the leader; the session.
pub async fn renew(s: &Arc<Server>, call: Call, id: String) -> Result<Answer<Vec<Session>>> {
    sessions(s, call, Op::Renew { id }).await
}

/// The session `id` (none, or one).
pub async fn info(s: &Arc<Server>, call: Call, id: String) -> Result<Answer<Vec<Session>>> {
    sessions(s, call, Op::Info { id }).await
}

/// The sessions of `node`.
pub async fn node(s: &Arc<Server>, call: Call, node: String) -> Result<Answer<Vec<Session>>> {
    sessions(s, call, Op::Node { node }).await
}

/// Every session the token may read.
pub async fn list(s: &Arc<Server>, call: Call) -> Result<Answer<Vec<Session>>> {
    sessions(s, call, Op::List).await
}

async fn sessions(s: &Arc<Server>, call: Call, op: Op) -> Result<Answer<Vec<Session>>> {
    super::route(s, call, super::Op::Session(op))
        .await?
        .try_map(|v| match v {
            Answered::Session(Value::Sessions(x)) => Ok(x),
            _ => Err(unexpected()),
        })
}

fn unexpected() -> Error {
    Error::Internal("the session endpoint answered another area's value".into())
}

/// Destroying or renewing a session takes `session:write` on its node.
pub fn authorize_session(s: &Server, a: &crate::request::authz::Authz, id: &str) -> Result<()> {
    match s.state().sessions.get(id) {
        Some(x) => a.require(a.session_write(&x.node), "session:write", &x.node),
        None => Ok(()),
    }
}

impl Op {
    pub(super) fn place(&self) -> Place {
        match self {
            Op::Create { .. } | Op::Destroy { .. } | Op::Renew { .. } => Place::Leader,
            Op::Info { .. } | Op::Node { .. } | Op::List => Place::LeaderUnlessStale,
        }
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        let a = call.authz(s)?;
        match self {
            Op::Create { session, no_checks } => create_here(s, call, &a, session, no_checks).await,
            Op::Destroy { id } => {
                authorize_session(s, &a, &id)?;
                destroy_here(s, id).await
            }
            Op::Renew { id } => {
                authorize_session(s, &a, &id)?;
                let (index, session) = renew_session(s, &id).await?;
                let value = Value::Sessions(vec![(*session).clone()]);
                Ok(Answer::at(s, index, false, value))
            }
            Op::Info { id } => {
                read(s, call, a, keys::session(&id), |st| {
                    st.sessions
                        .get(&id)
                        .map(|x| (**x).clone())
                        .into_iter()
                        .collect()
                })
                .await
            }
            Op::Node { node } => {
                read(s, call, a, keys::node_sessions(&node), |st| {
                    crate::state::session::node_sessions(st, &node)
                        .into_iter()
                        .map(|x| (*x).clone())
                        .collect()
                })
                .await
            }
            Op::List => {
                read(s, call, a, keys::SESSIONS, |st| {
                    st.sessions.values().map(|x| (**x).clone()).collect()
                })
                .await
            }
        }
    }
}

/// The sessions `pick` finds, blocking on `key`, those the token may read.
async fn read(
    s: &Arc<Server>, call: &Call, mut a: crate::request::authz::Authz, key: crate::state::WatchKey,
    pick: impl Fn(&crate::state::State) -> Vec<Session>,
) -> Result<Answer<Value>> {
    let watch = Watch::Keys(vec![key.clone()]);
    let (index, mut sessions) = blocking(s, &call.opts, &mut a, watch, |st, _| {
        (st.index_of([&key]), pick(st))
    })
    .await?;
    let filtered = super::keep(&mut sessions, |x| a.session_read(&x.node));
    Ok(Answer::at(s, index, filtered, Value::Sessions(sessions)))
}

async fn create_here(
    s: &Arc<Server>, call: &Call, a: &crate::request::authz::Authz, mut session: Session,
    no_checks: bool,
) -> Result<Answer<Value>> {
    let id = session.id.clone();
    a.require(
        a.session_write(&session.node),
        "session:write",
        &session.node,
    )?;
    if no_checks
        && s.store()
            .state()
            .checks
            .contains_key(&(session.node.clone(), SERF_CHECK.to_string()))
    {
        session.node_checks.push(SERF_CHECK.to_string());
    }
    let ttl = session.ttl();
    let server_node = session.node == call.origin(s);
    match s
        .write(Command::SessionCreate {
            session,
            server_node,
        })
        .await?
    {
        Applied::Ok => {
            s.sessions().arm(&id, ttl, Instant::now());
            Ok(Answer::at(s, s.state().index, false, Value::Created { id }))
        }
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

async fn destroy_here(s: &Arc<Server>, id: String) -> Result<Answer<Value>> {
    // Destroying what is not there changes nothing: no Raft entry (an
    // anonymous caller could otherwise grow the log at will), and the
    // answer Consul gives.
    if !s.state().sessions.contains_key(&id) {
        return Ok(Answer::at(
            s,
            s.state().index,
            false,
            Value::Destroyed(true),
        ));
    }
    match s
        .write(
            s.sessions()
                .timed(Timeable::SessionDestroy { id: id.clone() }),
        )
        .await?
    {
        Applied::Bool(ok) => {
            s.sessions().disarm(&id);
            Ok(Answer::at(s, s.state().index, false, Value::Destroyed(ok)))
        }
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// Renews `id` on this server, which must lead: leadership is confirmed
/// with a quorum first (Consul trusts its local belief here). A leader cut
/// off from the others could otherwise answer a renewal while the new
/// leader's timer (armed when it took office) runs out, and the client
/// would go on believing it holds its locks after they were handed on. A
/// renewal confirmed at time t resets a timer that cannot expire before
/// t + 2×TTL on this leader or any later one. Returns the session and the
/// index of its last change.
pub async fn renew_session(s: &Server, id: &str) -> Result<(u64, Arc<Session>)> {
    s.linearize().await?;
    let st = s.state();
    let Some(session) = st.sessions.get(id) else {
        return Err(Error::NotFound(format!("Session id '{id}' not found")));
    };
    if !s.sessions().arm(id, session.ttl(), Instant::now()) {
        // Its TTL ran out and its destroy is under way.
        return Err(Error::NotFound(format!("Session id '{id}' not found")));
    }
    Ok((st.index_of([&keys::session(id)]), session.clone()))
}
