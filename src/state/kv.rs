//! The KV table: writes (as Consul's KVS verbs) and reads.

use super::apply::Tx;
use super::{Response, State, keys};
use crate::structs::{KvEntry, KvOp, KvOutcome, KvVerb, TxnError};

/// Applies one KV verb. `Err` is a failed precondition inside a txn.
pub fn apply_op(tx: &mut Tx, op: &KvOp) -> Result<KvOutcome, String> {
    let existing = tx.state.kv.get(&op.key).cloned();
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
pub fn apply_txn(tx: &mut Tx, ops: &[KvOp]) -> Response {
    let saved = tx.state.clone();
    let mut results = Vec::new();
    let mut errors = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match apply_op(tx, op) {
            Ok(KvOutcome::Entries(es)) => results.extend(es),
            Ok(KvOutcome::Done(true)) => {
                if !matches!(
                    op.verb,
                    KvVerb::Delete | KvVerb::DeleteCas | KvVerb::DeleteTree
                ) && let Some(e) = tx.state.kv.get(&op.key)
                {
                    {
                        let mut e = (**e).clone();
                        e.value.clear();
                        results.push(e);
                    }
                }
            }
            Ok(KvOutcome::Done(false)) => errors.push(TxnError {
                op_index: i,
                what: format!("failed to {:?} key {:?}: index is stale", op.verb, op.key),
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

/// Entries whose key starts with `prefix`, in key order.
pub fn prefix_iter<'a>(state: &'a State, prefix: &'a str) -> impl Iterator<Item = &'a KvEntry> {
    state
        .kv
        .range(prefix.to_string()..)
        .take_while(move |(k, _)| k.starts_with(prefix))
        .map(|(_, v)| &**v)
}

/// The index a read of `key` (or the tree under it) reports.
pub fn read_index(state: &State, key: &str, recurse: bool) -> u64 {
    if recurse {
        state.index_of_prefix(&keys::kv(key))
    } else {
        state.index_of([keys::kv(key).as_str()])
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
