//! Config entries' writes (`PUT /v1/config`, `DELETE
//! /v1/config/:kind/:name`), run on the leader: the entry decoded and
//! validated as Consul validates it, Consul's `CanWrite` checks, and the
//! graph check that refuses a write which would break a discovery chain,
//! made on the leader's state (the state machine checks again on the state
//! the write lands on). Reads are still `http::config`'s.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::{Answer, Call, Place, Value as Answered};
use crate::config_check::{ConfigEntryError, decode_and_validate};
use crate::discovery_chain::{ChainError, EntryChange, validate_write};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::server::Server;
use crate::state::{Command, Response as Applied};
use crate::structs::config_entry::{ConfigEntry, Kind};
use crate::structs::serde_util::as_json;

impl From<ConfigEntryError> for Error {
    fn from(e: ConfigEntryError) -> Self {
        Error::BadRequest(e.to_string())
    }
}

impl From<ChainError> for Error {
    fn from(e: ChainError) -> Self {
        Error::BadRequest(e.to_string())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// An entry as its writer sent it (Consul's JSON), written only if its
    /// modify index is `cas` when set.
    Set {
        #[serde(with = "as_json")]
        entry: Json,
        cas: Option<u64>,
    },
    Delete {
        kind: String,
        name: String,
        cas: Option<u64>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    /// Consul's answer: whether the write took (false: its `cas` lost).
    Written(bool),
}

/// Writes an entry; whether it took.
pub async fn set(s: &Arc<Server>, call: Call, entry: Json, cas: Option<u64>) -> Result<bool> {
    written(super::route(s, call, super::Op::Config(Op::Set { entry, cas })).await?)
}

/// Deletes an entry; whether it took.
pub async fn delete(
    s: &Arc<Server>, call: Call, kind: String, name: String, cas: Option<u64>,
) -> Result<bool> {
    let op = Op::Delete { kind, name, cas };
    written(super::route(s, call, super::Op::Config(op)).await?)
}

fn written(a: Answer<Answered>) -> Result<bool> {
    match a.value {
        Answered::Config(Value::Written(ok)) => Ok(ok),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

pub fn parse_kind(kind: &str) -> Result<Kind> {
    kind.parse().map_err(Error::BadRequest)
}

/// A put: the write on the entry's name, and for a discovery-chain entry
/// `service:read` on every service it sends traffic to (Consul's: whoever
/// may discover a service may route their own service's traffic to it).
fn authorize_put(a: &Authz, entry: &ConfigEntry) -> Result<()> {
    authorize_write(a, entry.kind(), entry.name())?;
    for svc in entry.related_services() {
        a.require(a.service_read(svc), "service:read", svc)?;
    }
    Ok(())
}

/// Consul's `CanWrite`: the mesh-wide kinds and the gateways' entries
/// (which route traffic of services other than their own) need
/// `mesh:write`, intentions `intention:write`, the rest `service:write`.
pub fn authorize_write(a: &Authz, kind: Kind, name: &str) -> Result<()> {
    match kind {
        Kind::ProxyDefaults
        | Kind::Mesh
        | Kind::IngressGateway
        | Kind::TerminatingGateway
        | Kind::ExportedServices => a.require(a.mesh_write(), "mesh:write", ""),
        Kind::ServiceIntentions => a.require(a.intention_write(name), "intention:write", name),
        _ => a.require(a.service_write(name), "service:write", name),
    }
}

impl Op {
    pub(super) fn place(&self) -> Place {
        Place::Leader
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        let a = call.authz(s)?;
        let cmd = match self {
            Op::Set { entry, cas } => {
                let entry = decode_and_validate(&entry)?;
                authorize_put(&a, &entry)?;
                // Refuse early what the state machine would refuse; it
                // checks again on the state the write actually lands on.
                validate_write(&*s.state(), &EntryChange::Upsert(entry.clone()))?;
                let mut json = entry.to_json();
                if let Json::Object(m) = &mut json {
                    m.remove("CreateIndex");
                    m.remove("ModifyIndex");
                }
                Command::ConfigSet { entry: json, cas }
            }
            Op::Delete { kind, name, cas } => {
                let kind = parse_kind(&kind)?;
                authorize_write(&a, kind, &name)?;
                let change = EntryChange::Delete {
                    kind,
                    name: name.clone(),
                };
                validate_write(&*s.state(), &change)?;
                Command::ConfigDelete {
                    kind: kind.as_str().to_string(),
                    name,
                    cas,
                }
            }
        };
        match s.write(cmd).await? {
            Applied::Bool(ok) => Ok(Answer::at(s, s.state().index, false, Value::Written(ok))),
            Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
            other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
        }
    }
}
