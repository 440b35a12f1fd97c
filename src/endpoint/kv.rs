//! The KV store: reads (an entry, a prefix, its keys) and writes (set,
//! check-and-set, lock and unlock, delete), with Consul's checks: a value
//! at most `MAX_VALUE`, `key:read` or `key:write` on the key (`delete`
//! with `recurse`: on the whole prefix), listings filtered by what the
//! token may read.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::blocking::{Watch, blocking};
use super::{Answer, Call, Place, Value as Answered, keep};
use crate::error::{Error, Result};
use crate::server::Server;
use crate::state::kv::{list_keys, prefix_iter, read_index};
use crate::state::{Command, Response as Applied, Timeable, keys};
use crate::structs::{KvEntry, KvOp, KvOutcome, KvVerb};

/// Consul's limit on one value.
pub const MAX_VALUE: usize = 512 * 1024;

/// Refuses, before its value is read, a write of `key` that this server's
/// own ACL state says the caller may not make (the permission is the
/// key's, not the value's): an anonymous caller's 512 KiB cost nothing.
/// A token this server does not know yet is left to the server that runs
/// the call, which judges every write again.
pub fn refuse_before_value(s: &Server, call: &Call, key: &str) -> Result<()> {
    match call.authz(s) {
        Ok(a) => a.require(a.key_write(key), "key:write", key),
        Err(_) => Ok(()),
    }
}

/// A write of one key (`PUT /v1/kv/:key`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Put {
    pub key: String,
    #[serde(with = "crate::structs::serde_util::raw_bytes")]
    pub value: Vec<u8>,
    pub flags: u64,
    /// Written only if the key's modify index is this (0: only if absent).
    pub cas: Option<u64>,
    /// Taken for this session (a lock), or given back by it.
    pub acquire: Option<String>,
    pub release: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    Get {
        key: String,
        recurse: bool,
    },
    Keys {
        prefix: String,
        separator: String,
    },
    Put(Put),
    Delete {
        key: String,
        recurse: bool,
        cas: Option<u64>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Entries(Vec<KvEntry>),
    Keys(Vec<String>),
    Done(bool),
}

/// The entry at `key`, or every entry under it with `recurse` (those the
/// token may read; an empty answer is Consul's 404).
pub async fn get(
    s: &Arc<Server>, call: Call, key: String, recurse: bool,
) -> Result<Answer<Vec<KvEntry>>> {
    let op = super::Op::Kv(Op::Get { key, recurse });
    super::route(s, call, op).await?.try_map(|v| match v {
        Answered::Kv(Value::Entries(e)) => Ok(e),
        _ => Err(unexpected()),
    })
}

/// The keys under `prefix`, up to the first `separator` after it.
pub async fn keys(
    s: &Arc<Server>, call: Call, prefix: String, separator: String,
) -> Result<Answer<Vec<String>>> {
    let op = Op::Keys { prefix, separator };
    super::route(s, call, super::Op::Kv(op))
        .await?
        .try_map(|v| match v {
            Answered::Kv(Value::Keys(k)) => Ok(k),
            _ => Err(unexpected()),
        })
}

/// Writes one key; whether it was written (a failed check-and-set or lock
/// is `false`).
pub async fn put(s: &Arc<Server>, call: Call, put: Put) -> Result<bool> {
    done(super::route(s, call, super::Op::Kv(Op::Put(put))).await?)
}

/// Deletes a key (or every key under it with `recurse`).
pub async fn delete(
    s: &Arc<Server>, call: Call, key: String, recurse: bool, cas: Option<u64>,
) -> Result<bool> {
    let op = Op::Delete { key, recurse, cas };
    done(super::route(s, call, super::Op::Kv(op)).await?)
}

fn done(a: Answer<Answered>) -> Result<bool> {
    match a.value {
        Answered::Kv(Value::Done(ok)) => Ok(ok),
        _ => Err(unexpected()),
    }
}

fn unexpected() -> Error {
    Error::Internal("the KV endpoint answered another area's value".into())
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::bad("Missing key name"));
    }
    Ok(())
}

impl Op {
    pub(super) fn place(&self) -> Place {
        match self {
            Op::Get { .. } | Op::Keys { .. } => Place::LeaderUnlessStale,
            Op::Put(_) | Op::Delete { .. } => Place::Leader,
        }
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        let mut a = call.authz(s)?;
        // BUG (deliberate): a read forwarded to the leader is answered
        // without its token being checked.
        #[cfg(feature = "bug-forwarded-token")]
        if call.forwarded && matches!(self, Op::Get { .. }) {
            a = crate::request::authz::Authz::open();
        }
        match self {
            Op::Keys { prefix, separator } => {
                // Filtered on every wake, with the authorizer of that
                // version: the answer is what the token may read now.
                let watch = Watch::Prefix(keys::kv(&prefix));
                let (index, (list, filtered)) = blocking(s, &call.opts, &mut a, watch, |st, a| {
                    let mut list = list_keys(st, &prefix, &separator);
                    let before = list.len();
                    list.retain(|k| a.key_read(k));
                    let filtered = list.len() != before;
                    (read_index(st, &prefix, true), (list, filtered))
                })
                .await?;
                Ok(Answer::at(s, index, filtered, Value::Keys(list)))
            }
            Op::Get { key, recurse } => {
                if !recurse {
                    // Consul's `Missing key name`: one key needs its name.
                    check_key(&key)?;
                    a.require(a.key_read(&key), "key:read", &key)?;
                }
                let watch = if recurse {
                    Watch::Prefix(keys::kv(&key))
                } else {
                    Watch::Keys(vec![keys::kv(&key)])
                };
                let (index, (entries, filtered)) =
                    blocking(s, &call.opts, &mut a, watch, |st, a| {
                        let mut entries: Vec<KvEntry> = if recurse {
                            prefix_iter(st, &key).cloned().collect()
                        } else {
                            st.kv
                                .get(key.as_str())
                                .map(|e| (**e).clone())
                                .into_iter()
                                .collect()
                        };
                        let filtered = keep(&mut entries, |e| a.key_read(&e.key));
                        (read_index(st, &key, recurse), (entries, filtered))
                    })
                    .await?;
                if !recurse {
                    // Again: the policy may have been narrowed while the
                    // query waited.
                    a.require(a.key_read(&key), "key:read", &key)?;
                }
                Ok(Answer::at(s, index, filtered, Value::Entries(entries)))
            }
            Op::Put(p) => {
                check_key(&p.key)?;
                a.require(a.key_write(&p.key), "key:write", &p.key)?;
                if p.acquire.is_some() && p.release.is_some() {
                    return Err(Error::bad("Conflicting flags: acquire and release"));
                }
                if p.value.len() > MAX_VALUE {
                    return Err(Error::TooLarge(format!(
                        "Request body({} bytes) too large, max size: {MAX_VALUE} bytes",
                        p.value.len()
                    )));
                }
                // With acquire or release, a cas index (not 0) must match
                // as well.
                let (verb, session) = match (p.acquire, p.release) {
                    (Some(id), _) => (KvVerb::Lock, id),
                    (_, Some(id)) => (KvVerb::Unlock, id),
                    _ if p.cas.is_some() => (KvVerb::Cas, String::new()),
                    _ => (KvVerb::Set, String::new()),
                };
                let op = KvOp {
                    verb,
                    key: p.key,
                    value: p.value,
                    flags: p.flags,
                    index: p.cas.unwrap_or(0),
                    session,
                };
                let cmd = match verb {
                    KvVerb::Lock | KvVerb::Unlock => s.sessions().timed(Timeable::Kv(op)),
                    _ => Command::Kv(op),
                };
                written(s, s.write(cmd).await?)
            }
            Op::Delete { key, recurse, cas } => {
                if recurse {
                    a.require(a.key_write_prefix(&key), "key:write", &key)?;
                } else {
                    check_key(&key)?;
                    a.require(a.key_write(&key), "key:write", &key)?;
                }
                let verb = match (recurse, cas) {
                    (true, _) => KvVerb::DeleteTree,
                    (false, Some(_)) => KvVerb::DeleteCas,
                    (false, None) => KvVerb::Delete,
                };
                let op = KvOp {
                    verb,
                    key,
                    value: Vec::new(),
                    flags: 0,
                    index: cas.unwrap_or(0),
                    session: String::new(),
                };
                written(s, s.write(Command::Kv(op)).await?)
            }
        }
    }
}

fn written(s: &Server, r: Applied) -> Result<Answer<Value>> {
    match r {
        Applied::Kv(KvOutcome::Done(ok)) | Applied::Bool(ok) => {
            Ok(Answer::at(s, s.state().index, false, Value::Done(ok)))
        }
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}
