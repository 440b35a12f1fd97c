//! The Connect CA table: one row holding the CA configuration and every
//! root with its signing key (the only private keys that enter Raft;
//! leaves' keys never do). Written whole by `Command::CaSet`, proposed by
//! the leader (first root, rotation) or a configuration PUT.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::tx::Tx;
use super::{Response, Row, State, Table, keys};
use crate::structs::connect::{CaConfiguration, CaRoot, CaRoots};

/// A root and the key it signs with (PEM, PKCS#8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRoot {
    pub root: CaRoot,
    pub signing_key: String,
}

/// The CA as Raft holds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CaState {
    pub config: CaConfiguration,
    /// Oldest first; exactly one is active.
    pub roots: Vec<StoredRoot>,
}

impl CaState {
    pub fn active(&self) -> Option<&StoredRoot> {
        self.roots.iter().find(|r| r.root.active)
    }
}

/// The roots as `/v1/connect/ca/roots` shows them (no keys).
pub fn roots(state: &State) -> Option<CaRoots> {
    let ca = state.connect_ca.as_ref()?;
    Some(CaRoots {
        active_root_id: ca.active().map(|r| r.root.id.clone()).unwrap_or_default(),
        trust_domain: format!("{}.consul", state.cluster_id),
        roots: ca.roots.iter().map(|r| r.root.clone()).collect(),
    })
}

/// Applies a new CA whole. `cas`: the configuration's `ModifyIndex` the
/// proposer read (0: no CA yet); a mismatch answers `false`, changing
/// nothing (two leaders' first roots, or racing rotations).
pub fn set(tx: &mut Tx, new: &CaState, cas: Option<u64>) -> Response {
    let current = tx.state.connect_ca.clone();
    if let Some(cas) = cas {
        let at = current.as_ref().map_or(0, |c| c.config.modify_index);
        if at != cas {
            return Response::Bool(false);
        }
    }
    if new.roots.iter().filter(|r| r.root.active).count() != 1 {
        return Response::Rejected("a CA needs exactly one active root".into());
    }
    let mut next = new.clone();
    let index = tx.index;
    next.config.create_index = current.as_ref().map_or(index, |c| c.config.create_index);
    next.config.modify_index = index;
    for r in &mut next.roots {
        let old = current
            .as_ref()
            .and_then(|c| c.roots.iter().find(|o| o.root.id == r.root.id));
        match old {
            Some(o) => {
                r.root.create_index = o.root.create_index;
                let mut same = o.root.clone();
                same.modify_index = r.root.modify_index;
                r.root.modify_index = if same == r.root {
                    o.root.modify_index
                } else {
                    index
                };
            }
            None => {
                r.root.create_index = index;
                r.root.modify_index = index;
            }
        }
    }
    let cluster_id = &next.config.cluster_id;
    if !cluster_id.is_empty() && *cluster_id != tx.state.cluster_id {
        tx.state.cluster_id = cluster_id.clone();
        tx.touch(keys::CLUSTER);
    }
    tx.put_connect_ca(next);
    Response::Bool(true)
}

impl Tx<'_> {
    pub fn put_connect_ca(&mut self, ca: CaState) {
        let ca = Arc::new(ca);
        let before = self.state.connect_ca.replace(ca.clone());
        self.record(
            Table::ConnectCa,
            "ca".into(),
            before.map(Row::ConnectCa),
            Some(Row::ConnectCa(ca)),
        );
        self.touch(keys::CONNECT_CA);
    }
}
