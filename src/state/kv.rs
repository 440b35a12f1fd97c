//! The KV table: writes (as Consul's KVS verbs) and reads.

use std::ops::Bound;
use std::sync::Arc;

use super::tx::Tx;
use super::{Response, Row, State, Table, keys};
use crate::structs::{KvEntry, KvOp, KvOutcome, KvVerb, TxnError, TxnOp, TxnResult};

/// Applies one KV verb. `Err` is a failed precondition inside a txn.
pub fn apply_op(tx: &mut Tx, op: &KvOp) -> Result<KvOutcome, String> {
    let existing = tx.state.kv.get(op.key.as_str()).cloned();
    match op.verb {
        KvVerb::Set => {
            set(tx, op, existing.as_deref());
            Ok(KvOutcome::Done(true))
        }
        KvVerb::Cas => {
            let ok = match &existing {
                None => op.index == 0,
                Some(e) => op.index != 0 && e.modify_index == op.index,
            };
            if ok {
                set(tx, op, existing.as_deref());
            }
            Ok(KvOutcome::Done(ok))
        }
        KvVerb::Delete => {
            tx.remove_kv(&op.key);
            Ok(KvOutcome::Done(true))
        }
        KvVerb::DeleteCas => {
            let ok = match &existing {
                None => op.index == 0,
                Some(e) => e.modify_index == op.index,
            };
            if ok {
                tx.remove_kv(&op.key);
            }
            Ok(KvOutcome::Done(ok))
        }
        KvVerb::DeleteTree => {
            let doomed: Vec<String> = prefix_iter(tx.state, &op.key)
                .map(|e| e.key.clone())
                .collect();
            for k in doomed {
                tx.remove_kv(&k);
            }
            Ok(KvOutcome::Done(true))
        }
        KvVerb::Get => match existing {
            Some(e) => Ok(KvOutcome::Entries(vec![(*e).clone()])),
            None => Err(format!("key {:?} doesn't exist", op.key)),
        },
        KvVerb::GetTree => Ok(KvOutcome::Entries(
            prefix_iter(tx.state, &op.key).cloned().collect(),
        )),
        KvVerb::CheckIndex => match existing {
            Some(e) if e.modify_index == op.index => Ok(KvOutcome::Entries(vec![(*e).clone()])),
            Some(e) => Err(format!(
                "current modify index {} != {}",
                e.modify_index, op.index
            )),
            None => Err(format!("key {:?} doesn't exist", op.key)),
        },
        KvVerb::CheckNotExists => match existing {
            Some(_) => Err(format!("key {:?} exists", op.key)),
            None => Ok(KvOutcome::Entries(vec![])),
        },
        KvVerb::Lock => super::session::lock(tx, op),
        KvVerb::Unlock => super::session::unlock(tx, op),
        KvVerb::CheckSession => super::session::check_session(tx.state, op),
    }
}

fn set(tx: &mut Tx, op: &KvOp, existing: Option<&KvEntry>) {
    let create_index = existing.map_or(tx.index, |e| e.create_index);
    tx.put_kv(KvEntry {
        lock_index: existing.map_or(0, |e| e.lock_index),
        key: op.key.clone(),
        flags: op.flags,
        value: op.value.clone(),
        session: existing.map(|e| e.session.clone()).unwrap_or_default(),
        create_index,
        modify_index: tx.index,
    });
}

/// All operations succeed together or none is applied (the state is
/// restored from the copy taken before: persistent maps make it cheap).
pub fn apply_txn(tx: &mut Tx, ops: &[TxnOp]) -> Response {
    let saved = tx.state.clone();
    let mut results = Vec::new();
    let mut errors = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let op = match op {
            TxnOp::Kv(op) => op,
            catalog => {
                match super::catalog::txn_op(tx, catalog) {
                    Ok(r) => results.extend(r),
                    Err(what) => errors.push(TxnError { op_index: i, what }),
                }
                continue;
            }
        };
        match apply_op(tx, op) {
            Ok(KvOutcome::Entries(es)) => results.extend(es.into_iter().map(TxnResult::Kv)),
            Ok(KvOutcome::Done(true)) => {
                if !matches!(
                    op.verb,
                    KvVerb::Delete | KvVerb::DeleteCas | KvVerb::DeleteTree
                ) && let Some(e) = tx.state.kv.get(op.key.as_str())
                {
                    {
                        let mut e = (**e).clone();
                        e.value.clear();
                        results.push(TxnResult::Kv(e));
                    }
                }
            }
            Ok(KvOutcome::Done(false)) => errors.push(TxnError {
                op_index: i,
                what: match op.verb {
                    KvVerb::Lock => {
                        format!("failed to lock key {:?}, lock is already held", op.key)
                    }
                    KvVerb::Unlock => format!(
                        "failed to unlock key {:?}, lock isn't held, or is held by another session",
                        op.key
                    ),
                    _ => format!("failed to {:?} key {:?}: index is stale", op.verb, op.key),
                },
            }),
            Err(what) => errors.push(TxnError { op_index: i, what }),
        }
    }
    if errors.is_empty() {
        Response::Txn(Ok(results))
    } else {
        *tx.state = saved;
        tx.discard();
        Response::Txn(Err(errors))
    }
}

/// A txn of reads only, answered from `state` without Raft (Consul's
/// fast path for read-only txns): the same answers apply would give.
pub fn read_txn(state: &State, ops: &[TxnOp]) -> Response {
    let mut st = state.clone();
    let index = st.index;
    let mut tx = Tx::new(&mut st, index);
    apply_txn(&mut tx, ops)
}

/// Entries whose key starts with `prefix`, in key order.
pub fn prefix_iter<'a>(state: &'a State, prefix: &'a str) -> impl Iterator<Item = &'a KvEntry> {
    state
        .kv
        .range::<_, str>((Bound::Included(prefix), Bound::Unbounded))
        .take_while(move |(k, _)| k.starts_with(prefix))
        .map(|(_, v)| &**v)
}

/// The index a read of `key` (or the tree under it) reports.
pub fn read_index(state: &State, key: &str, recurse: bool) -> u64 {
    if recurse {
        state.index_of_prefix(&keys::kv(key))
    } else {
        state.index_of([&keys::kv(key)])
    }
}

/// `?keys&separator=`: keys under `prefix`, folded at the first separator
/// after the prefix (Consul lists `foo/` once for `foo/a`, `foo/b`).
pub fn list_keys(state: &State, prefix: &str, separator: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in prefix_iter(state, prefix) {
        let rest = &e.key[prefix.len()..];
        let key = match (separator.is_empty(), rest.find(separator)) {
            (false, Some(pos)) => &e.key[..prefix.len() + pos + separator.len()],
            _ => &e.key,
        };
        if out.last().map(String::as_str) != Some(key) {
            out.push(key.to_string());
        }
    }
    out
}

impl Tx<'_> {
    pub fn put_kv(&mut self, entry: KvEntry) {
        // An overwrite keeps the map's key: no allocation for it.
        let key = match self.state.kv.get_key_value(entry.key.as_str()) {
            Some((k, _)) => k.clone(),
            None => Arc::from(entry.key.as_str()),
        };
        let after = Arc::new(entry);
        let before = self.state.kv.insert(key.clone(), after.clone());
        super::session::index_kv(self.state, before.as_deref(), Some(&after));
        self.touch(keys::kv(&key));
        self.record(
            Table::Kv,
            key.to_string(),
            before.map(Row::Kv),
            Some(Row::Kv(after)),
        );
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, apply_command};

    fn op(verb: KvVerb, key: &str, value: &str, index: u64) -> KvOp {
        KvOp {
            verb,
            key: key.into(),
            value: value.as_bytes().to_vec(),
            flags: 0,
            index,
            session: String::new(),
        }
    }

    fn run(st: &mut State, index: u64, cmd: Command) -> Response {
        apply_command(st, index, &cmd).0
    }

    #[test]
    fn set_keeps_create_index_and_bumps_modify_index() {
        let mut st = State::default();
        run(&mut st, 5, Command::Kv(op(KvVerb::Set, "a", "1", 0)));
        run(&mut st, 9, Command::Kv(op(KvVerb::Set, "a", "2", 0)));
        let e = st.kv.get("a").unwrap();
        assert_eq!(
            (e.create_index, e.modify_index, e.value.as_slice()),
            (5, 9, &b"2"[..])
        );
        assert_eq!(read_index(&st, "a", false), 9);
    }

    #[test]
    fn cas_follows_consul_rules() {
        let mut st = State::default();
        // index 0: only if absent
        assert_eq!(
            run(&mut st, 2, Command::Kv(op(KvVerb::Cas, "a", "x", 0))),
            Response::Kv(KvOutcome::Done(true))
        );
        assert_eq!(
            run(&mut st, 3, Command::Kv(op(KvVerb::Cas, "a", "y", 0))),
            Response::Kv(KvOutcome::Done(false))
        );
        // a stale index fails, the current one succeeds
        assert_eq!(
            run(&mut st, 4, Command::Kv(op(KvVerb::Cas, "a", "y", 1))),
            Response::Kv(KvOutcome::Done(false))
        );
        assert_eq!(
            run(&mut st, 5, Command::Kv(op(KvVerb::Cas, "a", "y", 2))),
            Response::Kv(KvOutcome::Done(true))
        );
        assert_eq!(st.kv.get("a").unwrap().value, b"y");
        assert_eq!(
            run(&mut st, 6, Command::Kv(op(KvVerb::DeleteCas, "a", "", 2))),
            Response::Kv(KvOutcome::Done(false))
        );
        assert_eq!(
            run(&mut st, 7, Command::Kv(op(KvVerb::DeleteCas, "a", "", 5))),
            Response::Kv(KvOutcome::Done(true))
        );
        assert!(st.kv.is_empty());
    }

    #[test]
    fn deletes_leave_a_tombstone_index() {
        let mut st = State::default();
        run(&mut st, 2, Command::Kv(op(KvVerb::Set, "a/1", "x", 0)));
        run(&mut st, 3, Command::Kv(op(KvVerb::Set, "a/2", "x", 0)));
        run(&mut st, 4, Command::Kv(op(KvVerb::Set, "b", "x", 0)));
        run(&mut st, 8, Command::Kv(op(KvVerb::DeleteTree, "a/", "", 0)));
        assert_eq!(st.kv.len(), 1);
        // The index of a deleted key moves forward, never back to 1.
        assert_eq!(read_index(&st, "a/1", false), 8);
        assert_eq!(read_index(&st, "a/", true), 8);
        assert_eq!(read_index(&st, "b", false), 4);
        assert_eq!(read_index(&st, "never", false), 1);
    }

    #[test]
    fn keys_fold_at_the_separator() {
        let mut st = State::default();
        for (i, k) in ["web/a", "web/b/c", "web/b/d", "webx", "zed"]
            .iter()
            .enumerate()
        {
            run(
                &mut st,
                i as u64 + 2,
                Command::Kv(op(KvVerb::Set, k, "", 0)),
            );
        }
        assert_eq!(list_keys(&st, "web", "/"), vec!["web/", "webx"]);
        assert_eq!(list_keys(&st, "web/", "/"), vec!["web/a", "web/b/"]);
        assert_eq!(
            list_keys(&st, "", ""),
            vec!["web/a", "web/b/c", "web/b/d", "webx", "zed"]
        );
    }

    #[test]
    fn a_failed_txn_changes_nothing() {
        let mut st = State::default();
        run(&mut st, 2, Command::Kv(op(KvVerb::Set, "a", "1", 0)));
        let before = st.kv.clone();
        let (resp, set) = apply_command(
            &mut st,
            3,
            &Command::Txn(
                [
                    op(KvVerb::Set, "b", "2", 0),
                    op(KvVerb::Delete, "a", "", 0),
                    op(KvVerb::CheckIndex, "a", "", 99),
                ]
                .map(TxnOp::Kv)
                .to_vec(),
            ),
        );
        match resp {
            Response::Txn(Err(errors)) => assert_eq!(errors[0].op_index, 2),
            other => panic!("expected txn errors, got {other:?}"),
        }
        assert_eq!(st.kv, before);
        assert!(set.changes.is_empty() && set.watch_keys.is_empty());
    }

    #[test]
    fn a_good_txn_applies_all_and_returns_entries() {
        let mut st = State::default();
        let (resp, set) = apply_command(
            &mut st,
            3,
            &Command::Txn(
                [op(KvVerb::Set, "b", "2", 0), op(KvVerb::Get, "b", "", 0)]
                    .map(TxnOp::Kv)
                    .to_vec(),
            ),
        );
        match resp {
            Response::Txn(Ok(entries)) => {
                assert_eq!(entries.len(), 2);
                let kv = |r: &TxnResult| match r {
                    TxnResult::Kv(e) => e.clone(),
                    other => panic!("not KV: {other:?}"),
                };
                assert!(
                    kv(&entries[0]).value.is_empty(),
                    "writes come back without their value"
                );
                assert_eq!(kv(&entries[1]).value, b"2");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(set.watch_keys.contains("kv/b"));
    }
}
