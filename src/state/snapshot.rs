//! A whole version of the state as bytes, for Raft snapshots and for
//! `GET /v1/snapshot` (`export`: the same without a staged restore).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::acl::AclRow;
use super::session::LockDelay;
use super::{State, WatchKey};
use crate::structs::serde_util::{as_json, raw_bytes};
use crate::structs::{HealthCheck, KvEntry, Node, NodeService, Session};

#[derive(Serialize, Deserialize)]
struct Body {
    index: u64,
    cluster_id: String,
    kv: Vec<KvEntry>,
    #[serde(with = "as_json")]
    nodes: Vec<Node>,
    #[serde(with = "as_json")]
    services: Vec<(String, NodeService)>,
    #[serde(with = "as_json")]
    checks: Vec<HealthCheck>,
    #[serde(with = "as_json")]
    config: Vec<serde_json::Value>,
    indexes: Vec<(WatchKey, u64)>,
    #[serde(with = "as_json")]
    sessions: Vec<Session>,
    lock_delays: Vec<(String, LockDelay)>,
    /// A restore being staged: its id and chunks.
    staged: Option<(String, Vec<Chunk>)>,
    /// ACL tokens (secret hashes, never secrets), policies, roles.
    #[serde(with = "as_json")]
    acl: Vec<AclRow>,
    #[serde(with = "as_json")]
    connect_ca: Option<super::connect::CaState>,
}

#[derive(Serialize, Deserialize)]
struct Chunk(#[serde(with = "raw_bytes")] Vec<u8>);

/// How many rows each table of an encoded state holds, and its index (for
/// `cairn snapshot inspect`).
pub fn counts(bytes: &[u8]) -> anyhow::Result<(u64, Vec<(&'static str, usize)>)> {
    let b: Body = bincode::deserialize(bytes)?;
    Ok((
        b.index,
        vec![
            ("KV", b.kv.len()),
            ("Nodes", b.nodes.len()),
            ("Services", b.services.len()),
            ("Checks", b.checks.len()),
            ("ConfigEntries", b.config.len()),
            ("Sessions", b.sessions.len()),
            ("LockDelays", b.lock_delays.len()),
            ("ACL", b.acl.len()),
            ("Indexes", b.indexes.len()),
        ],
    ))
}

/// The state as a user's snapshot holds it: without a staged restore.
pub fn export(st: &State) -> anyhow::Result<Vec<u8>> {
    if st.restore.is_none() {
        return encode(st);
    }
    let mut st = st.clone();
    st.restore = None;
    encode(&st)
}

pub fn encode(st: &State) -> anyhow::Result<Vec<u8>> {
    let body = Body {
        index: st.index,
        cluster_id: st.cluster_id.clone(),
        kv: st.kv.values().map(|e| (**e).clone()).collect(),
        nodes: st.nodes.values().map(|n| (**n).clone()).collect(),
        services: st
            .services
            .iter()
            .map(|((n, _), s)| (n.clone(), (**s).clone()))
            .collect(),
        checks: st.checks.values().map(|c| (**c).clone()).collect(),
        config: st
            .config
            .values()
            .map(|e| super::config::to_stored(e))
            .collect(),
        indexes: st.indexes.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        sessions: st.sessions.values().map(|s| (**s).clone()).collect(),
        lock_delays: st
            .lock_delays
            .iter()
            .map(|(k, d)| (k.clone(), *d))
            .collect(),
        staged: st.restore.as_ref().map(|r| {
            let chunks = r.chunks.iter().map(|c| Chunk((**c).clone())).collect();
            (r.id.clone(), chunks)
        }),
        acl: super::acl::rows(st).into_iter().map(|(_, r)| r).collect(),
        connect_ca: st.connect_ca.as_ref().map(|c| (**c).clone()),
    };
    Ok(bincode::serialize(&body)?)
}

pub fn decode(bytes: &[u8]) -> anyhow::Result<State> {
    let body: Body = bincode::deserialize(bytes)?;
    let mut st = State {
        index: body.index,
        cluster_id: body.cluster_id,
        ..Default::default()
    };
    for e in body.kv {
        st.kv.insert(e.key.clone(), Arc::new(e));
    }
    for n in body.nodes {
        st.nodes.insert(n.node.clone(), Arc::new(n));
    }
    for (node, s) in body.services {
        st.services.insert((node, s.id.clone()), Arc::new(s));
    }
    for c in body.checks {
        st.checks
            .insert((c.node.clone(), c.check_id.clone()), Arc::new(c));
    }
    for json in body.config {
        let e = super::config::from_stored(&json)?;
        st.config
            .insert((e.kind(), e.name().to_string()), Arc::new(e));
    }
    st.indexes = body.indexes.into_iter().collect();
    for s in body.sessions {
        st.sessions.insert(s.id.clone(), Arc::new(s));
    }
    st.lock_delays = body.lock_delays.into_iter().collect();
    st.connect_ca = body.connect_ca.map(Arc::new);
    st.restore = body.staged.map(|(id, chunks)| super::Staged {
        id,
        chunks: chunks.into_iter().map(|c| Arc::new(c.0)).collect(),
    });
    for r in body.acl {
        super::acl::load(&mut st, r);
    }
    super::derived::reindex(&mut st);
    Ok(st)
}
