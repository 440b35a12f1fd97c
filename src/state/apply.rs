//! Applying one command to a version of the state, deterministically.
//!
//! `Tx` is the only way rows change: every put and remove records the row
//! before and after and the watch keys to wake, so the change set can never
//! disagree with what was written.

use std::sync::Arc;

use serde_json::Value;

use super::{Change, ChangeSet, Command, Payload, Response, Row, State, Table, WatchKey, keys};
use crate::structs::config_entry::{ConfigEntry, Kind};
use crate::structs::{HealthCheck, KvEntry, Node, NodeService, Session};

/// Applies `cmd` at Raft index `index`; returns the answer and the changes.
pub fn apply_command(state: &mut State, index: u64, cmd: &Command) -> (Response, ChangeSet) {
    let mut tx = Tx::new(state, index);
    let response = match cmd {
        Command::Noop => Response::Ok,
        Command::InitCluster { cluster_id } => {
            if tx.state.cluster_id.is_empty() {
                tx.state.cluster_id = cluster_id.clone();
                tx.touch(keys::CLUSTER);
            }
            Response::Ok
        }
        Command::Kv(op) => match super::kv::apply_op(&mut tx, op) {
            Ok(outcome) => Response::Kv(outcome),
            Err(reason) => Response::Rejected(reason),
        },
        Command::Txn(ops) => super::kv::apply_txn(&mut tx, ops),
        Command::Register(req) => result(super::catalog::register(&mut tx, req)),
        Command::Deregister(req) => result(super::catalog::deregister(&mut tx, req)),
        Command::ConfigSet { entry, cas } => super::config::set(&mut tx, entry, *cas),
        Command::ConfigDelete { kind, name, cas } => {
            super::config::delete(&mut tx, kind, name, *cas)
        }
        Command::ReapTombstones { upto } => {
            let (reaped, floors) = super::tombstones::reap(tx.state, *upto);
            for key in reaped {
                tx.record(Table::Index, key.to_string(), None, None);
            }
            // Persisted with their new values; nobody watches them.
            tx.set.watch_keys.extend(floors);
            Response::Ok
        }
        Command::SessionCreate {
            session,
            server_node,
        } => result(super::session::create(&mut tx, session, *server_node)),
        Command::SessionDestroy { id } => {
            super::session::invalidate(&mut tx, id);
            Response::Bool(true)
        }
        Command::Timed { now_ms, cmd } => {
            tx.state.now_ms = Some(*now_ms);
            super::session::tick(&mut tx);
            let (r, s) = apply_command(tx.state, index, &Command::from(cmd.clone()));
            tx.set.changes.extend(s.changes);
            tx.set.watch_keys.extend(s.watch_keys);
            tx.set.replaced |= s.replaced;
            tx.state.now_ms = None;
            r
        }
        Command::RestoreChunk { id, seq, data } => {
            result(super::restore::stage(&mut tx, id, *seq, data))
        }
        Command::RestoreCommit {
            id,
            chunks,
            len,
            crc,
        } => result(super::restore::commit(&mut tx, id, *chunks, *len, *crc)),
        Command::CaSet { ca, cas } => super::connect::set(&mut tx, ca, *cas),
        Command::RestoreAbort { id } => {
            super::restore::abort(&mut tx, id);
            Response::Ok
        }
    };
    let set = tx.finish();
    (response, set)
}

/// Applies a Raft entry's payload at `index`: one command, or a batch of
/// them at one index as one change set, each seeing the ones before it.
pub fn apply_payload(state: &mut State, index: u64, payload: &Payload) -> (Response, ChangeSet) {
    let cmds = match payload {
        Payload::One(cmd) => return apply_command(state, index, cmd),
        Payload::Batch(cmds) => cmds,
    };
    let mut set = ChangeSet {
        index,
        ..Default::default()
    };
    let mut responses = Vec::with_capacity(cmds.len());
    for c in cmds {
        let (r, s) = apply_command(state, index, c);
        set.changes.extend(s.changes);
        set.watch_keys.extend(s.watch_keys);
        set.replaced |= s.replaced;
        responses.push(r);
    }
    state.index = state.index.max(index);
    (Response::Batch(responses), set)
}

fn result(r: Result<(), String>) -> Response {
    match r {
        Ok(()) => Response::Ok,
        Err(reason) => Response::Rejected(reason),
    }
}

/// A write in progress on one version of the state.
pub struct Tx<'a> {
    pub state: &'a mut State,
    pub index: u64,
    set: ChangeSet,
}

/// A service's or check's row key: its node and its ID (`pair_key`).
pub(crate) fn node_key(node: &str, id: &str) -> String {
    pair_key(node, id)
}

/// A row key made of two names, injective whatever they hold: the first
/// one's length in bytes, `:`, then both. Joined by a separator instead,
/// (`a\0b`, `c`) and (`a`, `b\0c`) would share a row on disk.
pub fn pair_key(first: &str, second: &str) -> String {
    format!("{}:{first}{second}", first.len())
}

/// The two names of a `pair_key`; `None` for a key it did not make.
pub fn split_pair_key(key: &str) -> Option<(&str, &str)> {
    let (len, rest) = key.split_once(':')?;
    let len: usize = len.parse().ok()?;
    // `get` is None past the end or inside a character.
    Some((rest.get(..len)?, rest.get(len..)?))
}

impl<'a> Tx<'a> {
    pub fn new(state: &'a mut State, index: u64) -> Self {
        Tx {
            state,
            index,
            set: ChangeSet {
                index,
                ..Default::default()
            },
        }
    }

    /// Marks a watch key changed at this index.
    pub fn touch(&mut self, key: WatchKey) {
        self.state.indexes.insert(key.clone(), self.index);
        self.set.watch_keys.insert(key);
    }

    pub(crate) fn record_row(
        &mut self,
        table: Table,
        key: String,
        before: Option<Row>,
        after: Option<Row>,
    ) {
        self.record(table, key, before, after)
    }

    fn record(&mut self, table: Table, key: String, before: Option<Row>, after: Option<Row>) {
        self.set.changes.push(Change {
            table,
            key,
            before,
            after,
        });
    }

    /// Forgets the changes recorded so far (the caller restored the state).
    pub fn discard(&mut self) {
        self.set.changes.clear();
        self.set.watch_keys.clear();
    }

    pub fn finish(self) -> ChangeSet {
        self.state.index = self.state.index.max(self.index);
        for key in &self.set.watch_keys {
            super::tombstones::track(self.state, key);
        }
        self.set
    }

    pub fn put_kv(&mut self, entry: KvEntry) {
        let key = entry.key.clone();
        let after = Arc::new(entry);
        let before = self.state.kv.insert(key.clone(), after.clone());
        super::session::index_kv(self.state, before.as_deref(), Some(&after));
        self.touch(keys::kv(&key));
        self.record(Table::Kv, key, before.map(Row::Kv), Some(Row::Kv(after)));
    }

    pub fn remove_kv(&mut self, key: &str) {
        if let Some(before) = self.state.kv.remove(key) {
            super::session::index_kv(self.state, Some(&before), None);
            // The index entry left behind is the tombstone that keeps
            // blocking queries on a deleted key monotonic.
            self.touch(keys::kv(key));
            self.record(Table::Kv, key.to_string(), Some(Row::Kv(before)), None);
        }
    }

    /// Wakes everything that shows a node's services (health rows embed the
    /// node and its node-level checks).
    fn touch_node_services(&mut self, node: &str) {
        let services: Vec<(String, String)> = self
            .state
            .services
            .range((node.to_string(), String::new())..)
            .take_while(|((n, _), _)| n == node)
            .map(|(_, s)| (s.service.clone(), s.proxy.destination_service_name.clone()))
            .collect();
        for (name, dest) in services {
            self.touch(keys::service(&name));
            if !dest.is_empty() {
                self.touch(keys::connect(&dest));
            }
        }
    }

    pub fn put_node(&mut self, node: Node) {
        let name = node.node.clone();
        let after = Arc::new(node);
        let before = self.state.nodes.insert(name.clone(), after.clone());
        self.touch(keys::node(&name));
        self.touch(keys::NODES);
        self.touch_node_services(&name);
        self.record(
            Table::Nodes,
            name,
            before.map(Row::Node),
            Some(Row::Node(after)),
        );
    }

    pub fn remove_node(&mut self, name: &str) {
        super::session::node_gone(self, name);
        if let Some(before) = self.state.nodes.remove(name) {
            self.touch(keys::node(name));
            self.touch(keys::NODES);
            self.record(
                Table::Nodes,
                name.to_string(),
                Some(Row::Node(before)),
                None,
            );
        }
    }

    fn touch_service(&mut self, svc: &NodeService, node: &str) {
        self.touch(keys::service(&svc.service));
        self.touch(keys::SERVICES);
        self.touch(keys::node(node));
        if !svc.proxy.destination_service_name.is_empty() {
            self.touch(keys::connect(&svc.proxy.destination_service_name));
        }
        if svc.connect.get("Native").and_then(Value::as_bool) == Some(true) {
            self.touch(keys::connect(&svc.service));
        }
    }

    pub fn put_service(&mut self, node: &str, svc: NodeService) {
        let k = (node.to_string(), svc.id.clone());
        let after = Arc::new(svc);
        let before = self.state.services.insert(k.clone(), after.clone());
        if let Some(b) = &before {
            self.unindex_service(&k, b);
            self.touch_service(&b.clone(), node);
        }
        self.index_service(&k, &after);
        self.touch_service(&after.clone(), node);
        self.record(
            Table::Services,
            node_key(node, &after.id),
            before.map(Row::Service),
            Some(Row::Service(after)),
        );
    }

    pub fn remove_service(&mut self, node: &str, id: &str) {
        let k = (node.to_string(), id.to_string());
        if let Some(before) = self.state.services.remove(&k) {
            self.unindex_service(&k, &before);
            self.touch_service(&before.clone(), node);
            self.record(
                Table::Services,
                node_key(node, id),
                Some(Row::Service(before)),
                None,
            );
        }
    }

    fn connect_target(svc: &NodeService) -> Option<&str> {
        if svc.is_connect_proxy() && !svc.proxy.destination_service_name.is_empty() {
            Some(&svc.proxy.destination_service_name)
        } else if svc.connect.get("Native").and_then(Value::as_bool) == Some(true) {
            Some(&svc.service)
        } else {
            None
        }
    }

    fn index_service(&mut self, k: &(String, String), svc: &NodeService) {
        self.state
            .service_names
            .entry(svc.service.clone())
            .or_default()
            .insert(k.clone());
        if let Some(dest) = Self::connect_target(svc) {
            self.state
                .connect_names
                .entry(dest.to_string())
                .or_default()
                .insert(k.clone());
        }
    }

    fn unindex_service(&mut self, k: &(String, String), svc: &NodeService) {
        remove_from_index(&mut self.state.service_names, &svc.service, k);
        if let Some(dest) = Self::connect_target(svc) {
            remove_from_index(&mut self.state.connect_names, dest, k);
        }
    }

    fn touch_check(&mut self, check: &HealthCheck) {
        self.touch(keys::CHECKS);
        self.touch(keys::node(&check.node));
        if check.service_id.is_empty() {
            let node = check.node.clone();
            self.touch_node_services(&node);
        } else {
            let k = (check.node.clone(), check.service_id.clone());
            if let Some(svc) = self.state.services.get(&k).cloned() {
                self.touch_service(&svc, &check.node);
            } else {
                self.touch(keys::service(&check.service_name));
            }
        }
    }

    pub fn put_check(&mut self, check: HealthCheck) {
        let k = (check.node.clone(), check.check_id.clone());
        let after = Arc::new(check);
        let before = self.state.checks.insert(k.clone(), after.clone());
        if let Some(b) = &before {
            self.touch_check(&b.clone());
        }
        self.touch_check(&after.clone());
        self.record(
            Table::Checks,
            node_key(&k.0, &k.1),
            before.map(Row::Check),
            Some(Row::Check(after.clone())),
        );
        super::session::check_written(self, &k.0, &k.1, after.status);
    }

    pub fn remove_check(&mut self, node: &str, id: &str) {
        let k = (node.to_string(), id.to_string());
        if let Some(before) = self.state.checks.remove(&k) {
            self.touch_check(&before.clone());
            self.record(
                Table::Checks,
                node_key(node, id),
                Some(Row::Check(before)),
                None,
            );
            super::session::check_gone(self, node, id);
        }
    }

    pub fn put_config(&mut self, entry: ConfigEntry) {
        let key = (entry.kind(), entry.name().to_string());
        let after = Arc::new(entry);
        let before = self.state.config.insert(key.clone(), after.clone());
        if let Some(b) = &before {
            super::config::unindex(self.state, b);
        }
        super::config::index(self.state, &after);
        self.touch(keys::config(key.0.as_str(), &key.1));
        self.touch(keys::config_kind(key.0.as_str()));
        self.record(
            Table::Config,
            pair_key(key.0.as_str(), &key.1),
            before.map(Row::Config),
            Some(Row::Config(after)),
        );
    }

    pub fn remove_config(&mut self, kind: Kind, name: &str) {
        if let Some(before) = self.state.config.remove(&(kind, name.to_string())) {
            super::config::unindex(self.state, &before);
            self.touch(keys::config(kind.as_str(), name));
            self.touch(keys::config_kind(kind.as_str()));
            self.record(
                Table::Config,
                pair_key(kind.as_str(), name),
                Some(Row::Config(before)),
                None,
            );
        }
    }
}

impl Tx<'_> {
    pub fn put_session(&mut self, s: Session) {
        let id = s.id.clone();
        let after = Arc::new(s);
        let before = self.state.sessions.insert(id.clone(), after.clone());
        super::session::index_session(self.state, &after, true);
        self.touch_session(&after);
        self.record(
            Table::Sessions,
            id,
            before.map(Row::Session),
            Some(Row::Session(after)),
        );
    }

    pub fn remove_session(&mut self, id: &str) {
        if let Some(before) = self.state.sessions.remove(id) {
            super::session::index_session(self.state, &before, false);
            self.touch_session(&before);
            self.record(
                Table::Sessions,
                id.to_string(),
                Some(Row::Session(before)),
                None,
            );
        }
    }

    fn touch_session(&mut self, s: &Session) {
        self.touch(keys::session(&s.id));
        self.touch(keys::node_sessions(&s.node));
        self.touch(keys::SESSIONS);
    }

    /// Stages chunk `seq` of restore `id` (see `restore`).
    pub(crate) fn put_restore_chunk(&mut self, id: &str, seq: usize, data: Arc<Vec<u8>>) {
        if let Some(s) = &mut self.state.restore {
            s.chunks.push_back(data.clone());
        }
        let key = super::restore::chunk_key(id, seq);
        self.record(Table::Restore, key, None, Some(Row::RestoreChunk(data)));
    }

    /// Forgets the row of staged chunk `seq` of restore `id`.
    pub(crate) fn remove_restore_chunk(&mut self, id: &str, seq: usize) {
        let key = super::restore::chunk_key(id, seq);
        self.record(Table::Restore, key, None, None);
    }

    /// The whole state was replaced (see `ChangeSet::replaced`).
    pub(crate) fn mark_replaced(&mut self) {
        self.set.replaced = true;
    }

    /// Lock-delays are not shown by any read: no watch key.
    pub fn put_lock_delay(&mut self, key: &str, d: super::session::LockDelay) {
        let before = self.state.lock_delays.insert(key.to_string(), d);
        self.record(
            Table::LockDelays,
            key.to_string(),
            before.map(Row::LockDelay),
            Some(Row::LockDelay(d)),
        );
    }

    pub fn remove_lock_delay(&mut self, key: &str) {
        if let Some(before) = self.state.lock_delays.remove(key) {
            self.record(
                Table::LockDelays,
                key.to_string(),
                Some(Row::LockDelay(before)),
                None,
            );
        }
    }
}

/// Rebuilds the name indexes from the services table (after a load).
pub(crate) fn reindex(state: &mut State) {
    state.service_names.clear();
    state.connect_names.clear();
    state.config_refs.clear();
    for e in state.config.values().cloned().collect::<Vec<_>>() {
        super::config::index(state, &e);
    }
    let services: Vec<_> = state
        .services
        .iter()
        .map(|(k, s)| (k.clone(), s.clone()))
        .collect();
    let mut tx = Tx::new(state, 0);
    for (k, s) in services {
        tx.index_service(&k, &s);
    }
    super::tombstones::rebuild(state);
    super::session::reindex(state);
}

fn remove_from_index(
    index: &mut imbl::OrdMap<String, imbl::OrdSet<(String, String)>>,
    name: &str,
    k: &(String, String),
) {
    if let Some(set) = index.get_mut(name) {
        set.remove(k);
        if set.is_empty() {
            index.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{KvOp, KvOutcome, KvVerb};

    fn op(verb: KvVerb, key: &str, value: &str, index: u64) -> Command {
        Command::Kv(KvOp {
            verb,
            key: key.into(),
            value: value.into(),
            flags: 0,
            index,
            session: String::new(),
        })
    }

    #[test]
    fn a_batch_applies_in_order_at_one_index_with_one_answer_each() {
        let mut st = State::default();
        apply_command(&mut st, 5, &op(KvVerb::Set, "b", "old", 0));
        let batch = Payload::Batch(vec![
            op(KvVerb::Set, "a", "1", 0),
            // Sees the write before it: the key exists, so cas 0 fails.
            op(KvVerb::Cas, "a", "2", 0),
            op(KvVerb::Cas, "b", "new", 5),
            op(KvVerb::Delete, "missing", "", 0),
        ]);
        let (resp, set) = apply_payload(&mut st, 9, &batch);
        assert_eq!(
            resp,
            Response::Batch(vec![
                Response::Kv(KvOutcome::Done(true)),
                Response::Kv(KvOutcome::Done(false)),
                Response::Kv(KvOutcome::Done(true)),
                Response::Kv(KvOutcome::Done(true)),
            ])
        );
        assert_eq!(set.index, 9);
        assert_eq!(set.changes.len(), 2);
        assert!(set.watch_keys.contains("kv/a") && set.watch_keys.contains("kv/b"));
        assert_eq!(st.index, 9);
        assert_eq!(st.kv["a"].value, b"1");
        assert_eq!(st.kv["b"].value, b"new");
        assert_eq!(st.kv["b"].modify_index, 9);
        assert_eq!(st.kv["b"].create_index, 5);
    }
}
