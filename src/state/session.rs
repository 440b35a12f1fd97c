//! The sessions table and KV locks (Consul's `session`, `KVSLock`,
//! `KVSUnlock`), applied deterministically.
//!
//! Time: lock-delay needs a clock, and apply must not read one. Commands
//! that need the time are wrapped in `Command::Timed`, stamped with the
//! proposing server's wall clock (ms since the epoch) before they go through
//! Raft; while one applies, `State::now_ms` holds that time. A session
//! invalidated by such a command (destroy, TTL expiry) starts its keys'
//! lock-delay at that time. One invalidated by a catalog write (a check
//! going critical, a node deregistered), which carries no time, leaves the
//! delay pending: it starts at the next timed command applied (at the
//! latest the next acquire of that key, which is then refused). So the
//! delay is never shorter than Consul's, and can only start late.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::tx::Tx;
use super::{Row, State, Table, keys};
use crate::structs::{
    Behavior, HEALTH_CRITICAL, HealthStatus, KvEntry, KvOp, KvOutcome, MAX_LOCK_DELAY_NS, Session,
};

/// A key's lock-delay after its session was invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockDelay {
    /// When it started (ms since the epoch); `None`: at the next timed command.
    pub start_ms: Option<u64>,
    pub delay_ms: u64,
}

impl LockDelay {
    fn holds_at(&self, now_ms: Option<u64>) -> bool {
        match (self.start_ms, now_ms) {
            (Some(start), Some(now)) => now < start.saturating_add(self.delay_ms),
            // Not started yet, or no clock to tell: still held.
            _ => true,
        }
    }
}

/// Creates a session. `server_node`: the node defaulted to the receiving
/// server's own, which counts as registered (servers join the catalog
/// lazily here, while Consul's are always in it).
pub fn create(tx: &mut Tx, session: &Session, server_node: bool) -> Result<(), String> {
    if tx.state.sessions.contains_key(&session.id) {
        return Err(format!("Session ID {:?} already exists", session.id));
    }
    if !server_node && !tx.state.nodes.contains_key(&session.node) {
        return Err(format!(
            "Missing node registration for node {:?}",
            session.node
        ));
    }
    let ids = session
        .node_checks
        .iter()
        .chain(session.service_checks.iter().map(|c| &c.id));
    for id in ids {
        let Some(check) = tx.state.checks.get(&(session.node.clone(), id.clone())) else {
            return Err(format!("Missing check '{id}' registration"));
        };
        if check.status == HEALTH_CRITICAL {
            return Err(format!("Check '{id}' is in {HEALTH_CRITICAL} state"));
        }
    }
    let mut s = session.clone();
    s.create_index = tx.index;
    s.modify_index = tx.index;
    tx.put_session(s);
    Ok(())
}

/// Destroys a session: its locks are released (with lock-delay) or its
/// keys deleted, by its `Behavior`. An unknown id is a no-op, as in Consul.
pub fn invalidate(tx: &mut Tx, id: &str) {
    let Some(session) = tx.state.sessions.get(id).cloned() else {
        return;
    };
    let held: Vec<String> = tx
        .state
        .session_keys
        .get(id)
        .map(|ks| ks.iter().cloned().collect())
        .unwrap_or_default();
    for key in held {
        let Some(e) = tx.state.kv.get(key.as_str()).cloned() else {
            continue;
        };
        match session.behavior {
            Behavior::Delete => tx.remove_kv(&key),
            Behavior::Release => {
                let mut e = (*e).clone();
                e.session.clear();
                e.modify_index = tx.index;
                tx.put_kv(e);
                let delay_ms = session.lock_delay.min(MAX_LOCK_DELAY_NS) / 1_000_000;
                if delay_ms > 0 {
                    let start_ms = tx.state.now_ms;
                    tx.put_lock_delay(&key, LockDelay { start_ms, delay_ms });
                }
            }
        }
    }
    super::query::session_gone(tx, id);
    tx.remove_session(id);
}

/// A check was written: sessions bound to it die when it is critical.
pub fn check_written(tx: &mut Tx, node: &str, check: &str, status: HealthStatus) {
    if status == HEALTH_CRITICAL {
        check_gone(tx, node, check);
    }
}

/// A check was removed or went critical: sessions bound to it die.
pub fn check_gone(tx: &mut Tx, node: &str, check: &str) {
    for id in node_session_ids(tx.state, node) {
        if tx
            .state
            .sessions
            .get(&id)
            .is_some_and(|s| s.uses_check(check))
        {
            invalidate(tx, &id);
        }
    }
}

/// A node was deregistered: its sessions die.
pub fn node_gone(tx: &mut Tx, node: &str) {
    for id in node_session_ids(tx.state, node) {
        invalidate(tx, &id);
    }
}

fn node_session_ids(state: &State, node: &str) -> Vec<String> {
    state
        .node_sessions
        .get(node)
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default()
}

/// How long a spent lock-delay is kept: a command stamped before it ran
/// out may still be on its way (proposals queue, forwards retry), and must
/// find it.
const SPENT_GRACE_MS: u64 = 60_000;

/// At the start of a timed command: pending lock-delays start now, and
/// those long spent are dropped.
pub fn tick(tx: &mut Tx) {
    let Some(now) = tx.state.now_ms else {
        return;
    };
    let delays: Vec<(String, LockDelay)> = tx
        .state
        .lock_delays
        .iter()
        .map(|(k, d)| (k.clone(), *d))
        .collect();
    for (key, d) in delays {
        if d.start_ms.is_none() {
            tx.put_lock_delay(
                &key,
                LockDelay {
                    start_ms: Some(now),
                    ..d
                },
            );
        } else if !d.holds_at(Some(now.saturating_sub(SPENT_GRACE_MS))) {
            tx.remove_lock_delay(&key);
        }
    }
}

fn live_session(state: &State, op: &KvOp) -> Result<(), String> {
    if op.session.is_empty() {
        return Err("missing session".into());
    }
    if !state.sessions.contains_key(&op.session) {
        return Err(format!("invalid session {:?}", op.session));
    }
    Ok(())
}

/// `?acquire=`: takes (or keeps) the lock and writes the value. `false`
/// when another session holds it, its lock-delay holds, or a `?cas` index
/// (non-zero) is not the key's.
pub fn lock(tx: &mut Tx, op: &KvOp) -> Result<KvOutcome, String> {
    live_session(tx.state, op)?;
    if tx
        .state
        .lock_delays
        .get(&op.key)
        .is_some_and(|d| d.holds_at(tx.state.now_ms))
    {
        return Ok(KvOutcome::Done(false));
    }
    let existing = tx.state.kv.get(op.key.as_str()).cloned();
    if op.index != 0 && existing.as_ref().map(|e| e.modify_index) != Some(op.index) {
        return Ok(KvOutcome::Done(false));
    }
    let (create_index, lock_index) = match &existing {
        Some(e) if e.session == op.session => (e.create_index, e.lock_index),
        Some(e) if !e.session.is_empty() => return Ok(KvOutcome::Done(false)),
        Some(e) => (e.create_index, e.lock_index + 1),
        None => (tx.index, 1),
    };
    tx.put_kv(KvEntry {
        lock_index,
        key: op.key.clone(),
        flags: op.flags,
        value: op.value.clone(),
        session: op.session.clone(),
        create_index,
        modify_index: tx.index,
    });
    Ok(KvOutcome::Done(true))
}

/// `?release=`: gives the lock up and writes the value; `false` when the
/// session does not hold it (or a non-zero `?cas` index is not the key's).
pub fn unlock(tx: &mut Tx, op: &KvOp) -> Result<KvOutcome, String> {
    // A session that does not exist holds nothing: `false`, as Consul
    // answers (only an acquire checks that its session exists).
    if op.session.is_empty() {
        return Err("missing session".into());
    }
    let Some(e) = tx.state.kv.get(op.key.as_str()).cloned() else {
        return Ok(KvOutcome::Done(false));
    };
    if e.session != op.session || (op.index != 0 && e.modify_index != op.index) {
        return Ok(KvOutcome::Done(false));
    }
    tx.put_kv(KvEntry {
        lock_index: e.lock_index,
        key: op.key.clone(),
        flags: op.flags,
        value: op.value.clone(),
        session: String::new(),
        create_index: e.create_index,
        modify_index: tx.index,
    });
    Ok(KvOutcome::Done(true))
}

/// Txn `check-session`: the key is locked by the op's session.
pub fn check_session(state: &State, op: &KvOp) -> Result<KvOutcome, String> {
    match state.kv.get(op.key.as_str()) {
        Some(e) if e.session == op.session => Ok(KvOutcome::Entries(vec![(**e).clone()])),
        Some(_) => Err(format!(
            "failed to check session, key {:?} is not locked by session {:?}",
            op.key, op.session
        )),
        None => Err(format!(
            "failed to check session, key {:?} doesn't exist",
            op.key
        )),
    }
}

/// Keeps the derived indexes (node → sessions, session → locked keys) in
/// step with a KV row change.
pub(crate) fn index_kv(state: &mut State, before: Option<&KvEntry>, after: Option<&KvEntry>) {
    let old = before.map(|e| e.session.as_str()).unwrap_or("");
    let new = after.map(|e| e.session.as_str()).unwrap_or("");
    if old == new {
        return;
    }
    let key = before.or(after).map(|e| e.key.clone()).unwrap_or_default();
    if !old.is_empty()
        && let Some(set) = state.session_keys.get_mut(old)
    {
        set.remove(&key);
        if set.is_empty() {
            state.session_keys.remove(old);
        }
    }
    if !new.is_empty() {
        state
            .session_keys
            .entry(new.to_string())
            .or_default()
            .insert(key);
    }
}

pub(crate) fn index_session(state: &mut State, s: &Session, present: bool) {
    if present {
        state
            .node_sessions
            .entry(s.node.clone())
            .or_default()
            .insert(s.id.clone());
    } else if let Some(set) = state.node_sessions.get_mut(&s.node) {
        set.remove(&s.id);
        if set.is_empty() {
            state.node_sessions.remove(&s.node);
        }
    }
}

/// Rebuilds the derived indexes (after a load or a snapshot install).
pub(crate) fn reindex(state: &mut State) {
    state.node_sessions.clear();
    state.session_keys.clear();
    let sessions: Vec<Arc<Session>> = state.sessions.values().cloned().collect();
    for s in sessions {
        index_session(state, &s, true);
    }
    let locked: Vec<(String, String)> = state
        .kv
        .values()
        .filter(|e| !e.session.is_empty())
        .map(|e| (e.session.clone(), e.key.clone()))
        .collect();
    for (s, k) in locked {
        state.session_keys.entry(s).or_default().insert(k);
    }
}

/// Sessions on `node`, by id.
pub fn node_sessions(state: &State, node: &str) -> Vec<Arc<Session>> {
    state
        .node_sessions
        .get(node)
        .into_iter()
        .flatten()
        .filter_map(|id| state.sessions.get(id).cloned())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Timeable;
    use crate::state::{Command, Response, apply_command};
    use crate::structs::{KvVerb, RegisterRequest, ServiceCheck};

    fn session(id: &str, node: &str, checks: &[&str], behavior: Behavior) -> Session {
        Session {
            id: id.into(),
            name: String::new(),
            node: node.into(),
            node_checks: checks.iter().map(|c| c.to_string()).collect(),
            service_checks: Vec::<ServiceCheck>::new(),
            lock_delay: 15_000_000_000,
            behavior,
            ttl: String::new(),
            create_index: 0,
            modify_index: 0,
        }
    }

    fn register(st: &mut State, index: u64, node: &str, check: &str, status: &str) {
        let req: RegisterRequest = serde_json::from_value(serde_json::json!({
            "Node": node, "Address": "10.0.0.1",
            "Check": {"CheckID": check, "Name": check, "Status": status},
        }))
        .unwrap();
        let (r, _) = apply_command(st, index, &Command::Register(Box::new(req)));
        assert_eq!(r, Response::Ok);
    }

    fn create(st: &mut State, index: u64, s: Session) -> Response {
        let cmd = Command::SessionCreate {
            session: s,
            server_node: false,
        };
        apply_command(st, index, &cmd).0
    }

    fn kv(verb: KvVerb, key: &str, session: &str, now_ms: u64) -> Command {
        Command::Timed {
            now_ms,
            cmd: Timeable::Kv(KvOp {
                verb,
                key: key.into(),
                value: b"v".to_vec(),
                flags: 0,
                index: 0,
                session: session.into(),
            }),
        }
    }

    fn done(r: Response) -> bool {
        match r {
            Response::Kv(KvOutcome::Done(ok)) => ok,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Two sessions on a node with a passing serfHealth.
    fn setup() -> State {
        let mut st = State::default();
        register(&mut st, 2, "n1", "serfHealth", "passing");
        assert_eq!(
            create(
                &mut st,
                3,
                session("a", "n1", &["serfHealth"], Behavior::Release)
            ),
            Response::Ok
        );
        assert_eq!(
            create(&mut st, 4, session("b", "n1", &[], Behavior::Release)),
            Response::Ok
        );
        st
    }

    #[test]
    fn create_checks_node_and_checks() {
        let mut st = setup();
        assert!(matches!(
            create(&mut st, 5, session("c", "nope", &[], Behavior::Release)),
            Response::Rejected(_)
        ));
        assert!(matches!(
            create(
                &mut st,
                5,
                session("c", "n1", &["missing"], Behavior::Release)
            ),
            Response::Rejected(_)
        ));
        assert!(matches!(
            create(&mut st, 5, session("a", "n1", &[], Behavior::Release)),
            Response::Rejected(_)
        ));
        register(&mut st, 6, "n1", "bad", "critical");
        assert!(matches!(
            create(&mut st, 7, session("c", "n1", &["bad"], Behavior::Release)),
            Response::Rejected(_)
        ));
        assert_eq!(st.sessions["a"].create_index, 3);
        assert_eq!(st.index_of([&crate::state::keys::node_sessions("n1")]), 4);
    }

    #[test]
    fn one_holder_at_a_time_with_lock_index() {
        let mut st = setup();
        assert!(done(
            apply_command(&mut st, 10, &kv(KvVerb::Lock, "k", "a", 1_000)).0
        ));
        assert!(!done(
            apply_command(&mut st, 11, &kv(KvVerb::Lock, "k", "b", 1_000)).0
        ));
        // Re-acquiring by the holder keeps the lock index.
        assert!(done(
            apply_command(&mut st, 12, &kv(KvVerb::Lock, "k", "a", 1_000)).0
        ));
        assert_eq!(
            (st.kv["k"].session.as_str(), st.kv["k"].lock_index),
            ("a", 1)
        );
        // Only the holder releases.
        assert!(!done(
            apply_command(&mut st, 13, &kv(KvVerb::Unlock, "k", "b", 1_000)).0
        ));
        assert!(done(
            apply_command(&mut st, 14, &kv(KvVerb::Unlock, "k", "a", 1_000)).0
        ));
        assert_eq!(st.kv["k"].session, "");
        // An explicit release has no lock-delay.
        assert!(done(
            apply_command(&mut st, 15, &kv(KvVerb::Lock, "k", "b", 1_000)).0
        ));
        assert_eq!(st.kv["k"].lock_index, 2);
        // An unknown session is refused.
        assert!(matches!(
            apply_command(&mut st, 16, &kv(KvVerb::Lock, "x", "zz", 1_000)).0,
            Response::Rejected(_)
        ));
        // But releasing with one is just `false`: it holds nothing.
        assert!(!done(
            apply_command(&mut st, 16, &kv(KvVerb::Unlock, "k", "zz", 1_000)).0
        ));
        // A plain write to a locked key keeps its holder.
        let set = Command::Kv(KvOp::set("k", b"w".to_vec()));
        apply_command(&mut st, 17, &set);
        assert_eq!(
            (st.kv["k"].session.as_str(), st.kv["k"].lock_index),
            ("b", 2)
        );
    }

    #[test]
    fn destroy_releases_with_lock_delay() {
        let mut st = setup();
        assert!(done(
            apply_command(&mut st, 10, &kv(KvVerb::Lock, "k", "a", 1_000)).0
        ));
        let destroy = Command::Timed {
            now_ms: 2_000,
            cmd: Timeable::SessionDestroy { id: "a".into() },
        };
        apply_command(&mut st, 11, &destroy);
        assert!(!st.sessions.contains_key("a"));
        assert_eq!(
            (st.kv["k"].session.as_str(), st.kv["k"].modify_index),
            ("", 11)
        );
        // Held off for LockDelay (15 s) from the destroy.
        assert!(!done(
            apply_command(&mut st, 12, &kv(KvVerb::Lock, "k", "b", 16_999)).0
        ));
        assert!(done(
            apply_command(&mut st, 13, &kv(KvVerb::Lock, "k", "b", 17_000)).0
        ));
        assert!(done(
            apply_command(&mut st, 14, &kv(KvVerb::Unlock, "k", "b", 17_000)).0
        ));
        // A command stamped before the delay ran out, applied late, still
        // finds it; it is dropped a grace period later.
        assert!(!done(
            apply_command(&mut st, 15, &kv(KvVerb::Lock, "k", "b", 16_000)).0
        ));
        apply_command(
            &mut st,
            16,
            &kv(KvVerb::Lock, "k", "b", 17_000 + SPENT_GRACE_MS),
        );
        assert!(st.lock_delays.is_empty(), "a spent delay is dropped");
    }

    #[test]
    fn a_critical_check_or_deregistration_invalidates() {
        let mut st = setup();
        assert!(done(
            apply_command(&mut st, 10, &kv(KvVerb::Lock, "k", "a", 1_000)).0
        ));
        register(&mut st, 11, "n1", "serfHealth", "critical");
        assert!(!st.sessions.contains_key("a"), "bound to serfHealth");
        assert!(st.sessions.contains_key("b"), "bound to nothing");
        assert_eq!(st.kv["k"].session, "");
        // The delay starts at the next timed command (no clock in a register).
        assert!(!done(
            apply_command(&mut st, 12, &kv(KvVerb::Lock, "k", "b", 50_000)).0
        ));
        assert!(!done(
            apply_command(&mut st, 13, &kv(KvVerb::Lock, "k", "b", 64_999)).0
        ));
        assert!(done(
            apply_command(&mut st, 14, &kv(KvVerb::Lock, "k", "b", 65_000)).0
        ));
        let dereg = Command::Deregister(crate::structs::DeregisterRequest {
            node: "n1".into(),
            ..Default::default()
        });
        apply_command(&mut st, 15, &dereg);
        assert!(st.sessions.is_empty() && st.node_sessions.is_empty());
        assert!(st.session_keys.is_empty());
    }

    #[test]
    fn delete_behavior_deletes_the_keys() {
        let mut st = setup();
        assert_eq!(
            create(&mut st, 5, session("d", "n1", &[], Behavior::Delete)),
            Response::Ok
        );
        assert!(done(
            apply_command(&mut st, 10, &kv(KvVerb::Lock, "k", "d", 1_000)).0
        ));
        apply_command(&mut st, 11, &Command::SessionDestroy { id: "d".into() });
        assert!(!st.kv.contains_key("k"));
        assert!(st.lock_delays.is_empty());
    }

    #[test]
    fn txn_lock_unlock_and_check_session() {
        let mut st = setup();
        let op = |verb, session: &str| KvOp {
            verb,
            key: "k".into(),
            value: vec![],
            flags: 0,
            index: 0,
            session: session.into(),
        };
        let txn = |ops: Vec<KvOp>| Command::Timed {
            now_ms: 1,
            cmd: Timeable::Txn(ops.into_iter().map(crate::structs::TxnOp::Kv).collect()),
        };
        let (r, _) = apply_command(
            &mut st,
            10,
            &txn(vec![
                op(KvVerb::CheckNotExists, ""),
                op(KvVerb::Lock, "a"),
                op(KvVerb::CheckSession, "a"),
            ]),
        );
        assert!(matches!(r, Response::Txn(Ok(_))), "{r:?}");
        let (r, _) = apply_command(&mut st, 11, &txn(vec![op(KvVerb::Lock, "b")]));
        assert!(matches!(r, Response::Txn(Err(_))));
        let (r, _) = apply_command(&mut st, 12, &txn(vec![op(KvVerb::CheckSession, "b")]));
        assert!(matches!(r, Response::Txn(Err(_))));
        let (r, _) = apply_command(
            &mut st,
            13,
            &txn(vec![op(KvVerb::Unlock, "a"), op(KvVerb::Lock, "b")]),
        );
        assert!(matches!(r, Response::Txn(Ok(_))), "{r:?}");
        assert_eq!(st.kv["k"].session, "b");
    }

    #[test]
    fn snapshot_and_persist_keep_sessions_and_delays() {
        let mut st = setup();
        apply_command(&mut st, 10, &kv(KvVerb::Lock, "k", "a", 1_000));
        apply_command(&mut st, 11, &kv(KvVerb::Lock, "j", "b", 1_000));
        apply_command(
            &mut st,
            12,
            &Command::Timed {
                now_ms: 2_000,
                cmd: Timeable::SessionDestroy { id: "a".into() },
            },
        );
        let back =
            crate::state::snapshot::decode(&crate::state::snapshot::encode(&st).unwrap()).unwrap();
        assert_eq!(back.sessions, st.sessions);
        assert_eq!(back.lock_delays, st.lock_delays);
        assert_eq!(back.session_keys, st.session_keys);
        let disk = crate::state::MemoryBackend::default();
        crate::state::persist::replace_all(&disk, &State::default(), vec![]).unwrap();
        let mut fresh = State::default();
        let mut sets = Vec::new();
        for (i, c) in [
            Command::Register(Box::new(serde_json::from_value(serde_json::json!({"Node": "n1", "Address": "a", "Check": {"CheckID": "serfHealth", "Status": "passing"}})).unwrap())),
            Command::SessionCreate { session: session("b", "n1", &[], Behavior::Release), server_node: false },
            Command::SessionCreate { session: session("c", "n1", &[], Behavior::Release), server_node: false },
            kv(KvVerb::Lock, "j", "b", 1),
            kv(KvVerb::Lock, "k", "c", 1),
            Command::Timed { now_ms: 5, cmd: Timeable::SessionDestroy { id: "c".into() } },
        ]
        .iter()
        .enumerate()
        {
            sets.push(apply_command(&mut fresh, i as u64 + 1, c).1);
        }
        crate::state::persist::write_changes(&disk, &sets, &fresh, vec![]).unwrap();
        let loaded = crate::state::persist::load_state(&disk).unwrap();
        assert_eq!(loaded.sessions, fresh.sessions);
        assert_eq!(loaded.lock_delays, fresh.lock_delays);
        assert_eq!(loaded.session_keys, fresh.session_keys);
        assert_eq!(loaded.node_sessions, fresh.node_sessions);
        assert_eq!(loaded.lock_delays.len(), 1);
    }
}
