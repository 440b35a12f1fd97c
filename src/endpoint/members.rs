//! The servers' membership as the leader changes it for a server that
//! leaves gracefully (`PUT /v1/agent/leave` on a server, Consul's
//! `Server.Leave`): the leader takes it out of the Raft configuration,
//! forgets its lease and deregisters its node, so its `consul` service
//! goes with it. Judged on the leader: `agent:write` on the leaving node.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Answer, Call, Place};
use crate::error::{Error, Result};
use crate::server::Server;
use crate::state::Command;
use crate::structs::DeregisterRequest;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// The server `node` leaves the cluster.
    Leave { node: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Left,
}

impl Op {
    pub(super) fn place(&self) -> Place {
        Place::Leader
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        let Op::Leave { node } = self;
        let a = call.authz(s)?;
        a.require(a.agent_write(&node), "agent:write", &node)?;
        if node == s.node_name() {
            // The leaving server hands leadership over before it asks.
            return Err(Error::bad(
                "the leader cannot remove itself: transfer leadership first",
            ));
        }
        if !s.cluster().members().iter().any(|(_, n, _)| n.name == node) {
            return Err(Error::NotFound(format!("no server named {node:?}")));
        }
        s.cluster().remove_server(&node).await?;
        tracing::info!(node = %node, "server left the raft configuration");
        s.liveness().forget(&node);
        let index = s
            .write(Command::Deregister(DeregisterRequest {
                node: node.clone(),
                datacenter: s.datacenter().to_owned(),
                ..Default::default()
            }))
            .await
            .map(|_| s.state().index)?;
        Ok(Answer::at(s, index, false, Value::Left))
    }
}
