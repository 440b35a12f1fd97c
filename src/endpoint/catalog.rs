//! The catalog's writes: register and deregister, on the leader, with
//! Consul's checks (`authorize_register`, `authorize_deregister`). The
//! caller validates the request first (`structs::validate`), so bad input
//! is refused before it travels; the state machine re-checks what only
//! the state can tell and answers `Rejected` (a 400).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Answer, Call, Place, Value as Answered};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::server::Server;
use crate::state::{self, Command, Response as Applied, keys};
use crate::structs::serde_util::as_json;
use crate::structs::{DeregisterRequest, RegisterRequest};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    Register(#[serde(with = "as_json")] Box<RegisterRequest>),
    Deregister(#[serde(with = "as_json")] DeregisterRequest),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    /// Whether the write did anything (Consul answers `true` or `false`).
    Written(bool),
}

impl Op {
    pub(super) fn place(&self) -> Place {
        Place::Leader
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        let a = call.authz(s)?;
        let cmd = match self {
            Op::Register(req) => {
                authorize_register(&a, &s.state(), &req)?;
                Command::Register(req)
            }
            Op::Deregister(req) => {
                authorize_deregister(&a, &s.state(), &req)?;
                Command::Deregister(req)
            }
        };
        let done = match s.write(cmd).await? {
            Applied::Ok | Applied::Bool(true) => true,
            Applied::Bool(false) => false,
            Applied::Rejected(reason) => return Err(Error::BadRequest(reason)),
            other => return Err(Error::Internal(format!("unexpected answer {other:?}"))),
        };
        let index = s.state().index_of([&keys::NODES]);
        Ok(Answer::at(s, index, false, Value::Written(done)))
    }
}

async fn call(s: &Arc<Server>, call: Call, op: Op) -> Result<bool> {
    match super::route(s, call, super::Op::Catalog(op)).await?.value {
        Answered::Catalog(Value::Written(done)) => Ok(done),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// Registers a node, service or checks (validated by the caller).
pub async fn register(s: &Arc<Server>, c: Call, req: RegisterRequest) -> Result<bool> {
    call(s, c, Op::Register(Box::new(req))).await
}

/// Deregisters a node, service or check (validated by the caller).
pub async fn deregister(s: &Arc<Server>, c: Call, req: DeregisterRequest) -> Result<bool> {
    call(s, c, Op::Deregister(req)).await
}

/// Consul's checks on a registration: `service:write` on its service (as
/// `NodeService::authorize_write` has it: a proxy's destination and the
/// instance it replaces too) and on the services its checks belong to;
/// `node:write` when the node is new or changes, or for a node-level check.
pub fn authorize_register(a: &Authz, st: &state::State, req: &RegisterRequest) -> Result<()> {
    let node_changes = !req.skip_node_update
        && match st.nodes.get(&req.node) {
            None => true,
            Some(n) => {
                n.address != req.address
                    || (!req.node_meta.is_empty() && n.meta != req.node_meta)
                    || (!req.tagged_addresses.is_empty()
                        && n.tagged_addresses != req.tagged_addresses)
            }
        };
    if node_changes {
        a.require(a.node_write(&req.node), "node:write", &req.node)?;
    }
    if let Some(svc) = &req.service {
        let replaced = st.services.get(&(req.node.clone(), svc.id.clone()));
        svc.authorize_write(a, replaced.map(|r| r.service.as_str()))?;
    }
    for c in req.check.iter().chain(&req.checks) {
        if c.service_id.is_empty() {
            a.require(a.node_write(&req.node), "node:write", &req.node)?;
            continue;
        }
        let name = req
            .service
            .as_ref()
            .filter(|svc| svc.id == c.service_id)
            .map(|svc| svc.service.clone())
            .or_else(|| {
                st.services
                    .get(&(req.node.clone(), c.service_id.clone()))
                    .map(|svc| svc.service.clone())
            })
            .unwrap_or_else(|| c.service_name.clone());
        a.require(a.service_write(&name), "service:write", &name)?;
    }
    Ok(())
}

/// A service or check goes with `service:write` on its service (a node's
/// check and the node itself with `node:write`).
pub fn authorize_deregister(a: &Authz, st: &state::State, req: &DeregisterRequest) -> Result<()> {
    let service_of = |id: &str| {
        st.services
            .get(&(req.node.clone(), id.to_string()))
            .map(|svc| svc.service.clone())
    };
    let service = if !req.service_id.is_empty() {
        service_of(&req.service_id)
    } else if !req.check_id.is_empty() {
        st.checks
            .get(&(req.node.clone(), req.check_id.clone()))
            .filter(|c| !c.service_id.is_empty())
            .and_then(|c| service_of(&c.service_id).or(Some(c.service_name.clone())))
    } else {
        None
    };
    match service {
        Some(name) => a.require(a.service_write(&name), "service:write", &name),
        None => a.require(a.node_write(&req.node), "node:write", &req.node),
    }
}
