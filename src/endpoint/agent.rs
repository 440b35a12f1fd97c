//! What every server of the datacenter does for itself when one is asked
//! (Consul spreads it by gossip): forgetting a server of another
//! datacenter (`force-leave -wan`). The server asked runs it, then tells
//! each other server of its datacenter over its channel; each checks the
//! token itself.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Answer, Call, Reply};
use crate::error::{Error, Result};
use crate::federation::Federation;
use crate::server::Server;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// Forget `name` (as `members -wan` lists it, `node.dc`).
    ForgetWan { name: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    /// Whether this server knew it.
    Forgotten(bool),
}

impl Op {
    /// Runs here (`operator:write`).
    pub(super) fn run_here(
        &self, s: &Server, fed: Option<&Federation>, call: &Call,
    ) -> Result<Answer<Value>> {
        let a = call.authz(s)?;
        a.require(a.operator_write(), "operator:write", "")?;
        match self {
            Op::ForgetWan { name } => {
                let (node, dc) = name.rsplit_once('.').ok_or_else(|| {
                    Error::bad(format!(
                        "{name:?} names no WAN member: node.datacenter, as members -wan lists it"
                    ))
                })?;
                let forgot = fed.is_some_and(|f| f.forget(node, dc));
                Ok(Answer::at(
                    s,
                    s.state().index,
                    false,
                    Value::Forgotten(forgot),
                ))
            }
        }
    }
}

/// Runs `op` here, then on every other server of this datacenter (each
/// judges the token; one that cannot be reached is skipped, its own
/// expiry forgets in time). `Forgotten` if any server knew the member.
pub async fn run(
    s: &Arc<Server>, fed: Option<&Federation>, call: Call, op: Op,
) -> Result<Answer<Value>> {
    let here = op.run_here(s, fed, &call)?;
    let Value::Forgotten(mut forgot) = here.value;
    let wrapped = super::Op::Agent(op);
    // All at once: a server that does not answer holds up no other.
    let others = s
        .cluster()
        .members()
        .into_iter()
        .filter(|(id, _, _)| *id != s.cluster().id);
    let told = others.map(|(_, node, _)| {
        let (call, wrapped) = (&call, &wrapped);
        async move {
            (
                super::forward(s, &node.raft_addr, call, wrapped, false).await,
                node.name,
            )
        }
    });
    for (answer, server) in futures_util::future::join_all(told).await {
        match answer {
            Ok(Reply::Answer(Ok(a))) => {
                forgot |= matches!(a.value, super::Value::Agent(Value::Forgotten(true)));
            }
            Ok(Reply::Answer(Err(e))) => return Err(e),
            Ok(Reply::NotLeader) => {}
            Err(e) => tracing::warn!(%server, error = %e, "not told to forget"),
        }
    }
    Ok(here.map(|_| Value::Forgotten(forgot)))
}
