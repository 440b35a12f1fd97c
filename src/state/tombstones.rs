//! Tombstones: the index rows that deleted KV keys, nodes, services and
//! config entries leave behind, and their reaping.
//!
//! A delete keeps the watch key's index so that a blocking query on the
//! deleted object reports an index that never goes backwards. Kept forever
//! they grow without bound under churn of unique names, so, as Consul does,
//! the leader reaps those older than `--tombstone-ttl` through Raft
//! (`Command::ReapTombstones`). Reaping one raises its family's floor
//! (`reaped/<family>`, the highest index reaped there), which every lookup
//! that finds no row there reports instead: so an index reported before a
//! reap is never above one reported after it.
//!
//! Which rows are tombstones is derived from the tables (an object key whose
//! object is gone), kept up to date by apply and rebuilt on load, so it is
//! never persisted on its own.

use super::{State, WatchKey, keys};
use crate::structs::config_entry::Kind;

/// The family of an object watch key (`kv`, `node`, ...), or `None` for
/// keys that are not one object's (`nodes`, `config/<kind>`, floors).
fn family(key: &str) -> Option<&str> {
    let (family, rest) = key.split_once('/')?;
    match family {
        "kv" | "node" | "service" | "connect" => Some(family),
        "config" if rest.contains('/') => Some(family),
        _ => None,
    }
}

/// Whether the object behind `key` exists; `None` if `key` is not an
/// object's watch key.
fn exists(st: &State, key: &str) -> Option<bool> {
    let (family, rest) = key.split_once('/')?;
    Some(match family {
        "kv" => st.kv.contains_key(rest),
        "node" => st.nodes.contains_key(rest),
        "service" => st.service_names.contains_key(rest),
        "connect" => st.connect_names.contains_key(rest),
        "vip" => st.virtual_ips.contains_key(rest),
        "config" => {
            let (kind, name) = rest.split_once('/')?;
            let kind: Kind = kind.parse().ok()?;
            st.config.contains_key(&(kind, name.to_string()))
        }
        _ => return None,
    })
}

/// Records whether `key` (just changed) is now a tombstone.
pub(crate) fn track(st: &mut State, key: &WatchKey) {
    match exists(st, key) {
        // Looked up first: most keys written were never tombstones, and a
        // remove would copy the map's path to find that out.
        Some(true) if st.tombstones.contains_key(key) => {
            st.tombstones.remove(key);
        }
        Some(true) => {}
        Some(false) => {
            if let Some(index) = st.indexes.get(key).copied() {
                st.tombstones.insert(key.clone(), index);
            }
        }
        None => {}
    }
}

/// Finds every tombstone among the indexes (after a load or a snapshot).
///
/// KV index rows are as many as KV entries: they are matched against the
/// KV table in one ordered walk of both (a lookup each would add a good
/// part of a second to a restart with a million keys).
pub(crate) fn rebuild(st: &mut State) {
    let mut found = imbl::OrdMap::new();
    let mut live = st.kv.keys().peekable();
    for (k, v) in &st.indexes {
        let gone = match k.strip_prefix("kv/") {
            Some(key) => {
                while live.next_if(|l| &***l < key).is_some() {}
                live.peek().is_none_or(|l| &***l != key)
            }
            None => exists(st, k) == Some(false),
        };
        if gone {
            found.insert(k.clone(), *v);
        }
    }
    st.tombstones = found;
}

/// The floor key of `key`'s family.
pub(crate) fn floor_key(key: &str) -> Option<WatchKey> {
    family(key).map(keys::floor)
}

/// The index to report for a key without a row: its family's floor (0 if
/// nothing there was ever reaped), or the last restore's if higher.
pub(crate) fn floor(st: &State, key: &str) -> u64 {
    let family = floor_key(key)
        .and_then(|f| st.indexes.get(&f).copied())
        .unwrap_or(0);
    // A restore's floor counts for every key (see `restore`).
    let restored = st.indexes.get(&keys::RESTORED).copied().unwrap_or(0);
    family.max(restored)
}

/// Removes the tombstones at or below `upto`; returns the keys removed and
/// the floors raised (their new values are in `st.indexes`).
pub(crate) fn reap(st: &mut State, upto: u64) -> (Vec<WatchKey>, Vec<WatchKey>) {
    let doomed: Vec<(WatchKey, u64)> = st
        .tombstones
        .iter()
        .filter(|(_, i)| **i <= upto)
        .map(|(k, i)| (k.clone(), *i))
        .collect();
    let mut floors = Vec::new();
    for (k, i) in &doomed {
        st.tombstones.remove(k);
        st.indexes.remove(k);
        let f = floor_key(k).expect("a tombstone is an object key");
        let old = st.indexes.get(&f).copied().unwrap_or(0);
        if *i > old {
            st.indexes.insert(f.clone(), *i);
            if !floors.contains(&f) {
                floors.push(f);
            }
        }
    }
    (doomed.into_iter().map(|(k, _)| k).collect(), floors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, apply_command};
    use crate::structs::{KvOp, KvVerb};

    fn kv(verb: KvVerb, key: &str) -> Command {
        Command::Kv(KvOp {
            verb,
            key: key.into(),
            value: b"v".to_vec(),
            flags: 0,
            index: 0,
            session: String::new(),
        })
    }

    #[test]
    fn reaping_keeps_every_reported_index_monotonic() {
        let mut st = State::default();
        apply_command(&mut st, 10, &kv(KvVerb::Set, "a/1"));
        apply_command(&mut st, 11, &kv(KvVerb::Set, "a/2"));
        apply_command(&mut st, 12, &kv(KvVerb::Delete, "a/2"));
        apply_command(&mut st, 13, &kv(KvVerb::Set, "b/1"));
        apply_command(&mut st, 14, &kv(KvVerb::Delete, "b/1"));
        assert_eq!(st.tombstones.len(), 2);
        let before = (
            st.index_of([&super::keys::kv("a/2")]),
            st.index_of_prefix(&super::keys::kv("a/")),
            st.index_of_prefix(&super::keys::kv("b/")),
            st.index_of([&super::keys::kv("never")]),
        );
        assert_eq!(before, (12, 12, 14, 1));

        // Reaps the tombstone of a/2 only.
        apply_command(&mut st, 20, &Command::ReapTombstones { upto: 12 });
        assert_eq!(st.tombstones.len(), 1);
        assert!(!st.indexes.contains_key("kv/a/2"));
        let after = (
            st.index_of([&super::keys::kv("a/2")]),
            st.index_of_prefix(&super::keys::kv("a/")),
            st.index_of_prefix(&super::keys::kv("b/")),
            st.index_of([&super::keys::kv("never")]),
        );
        assert!(after.0 >= before.0 && after.1 >= before.1, "{after:?}");
        assert!(after.2 >= before.2 && after.3 >= before.3, "{after:?}");
        // A live key keeps its own index.
        assert_eq!(st.index_of([&super::keys::kv("a/1")]), 10);

        // Put back, it is no tombstone; deleted again, it is one.
        apply_command(&mut st, 21, &kv(KvVerb::Set, "a/2"));
        assert!(!st.tombstones.contains_key("kv/a/2"));
        apply_command(&mut st, 22, &kv(KvVerb::Delete, "a/2"));
        assert_eq!(st.tombstones.get("kv/a/2"), Some(&22));

        // The derived set is what a load finds.
        for i in 0..50 {
            apply_command(&mut st, 30 + i, &kv(KvVerb::Set, &format!("c/{i}")));
            if i % 3 == 0 {
                apply_command(&mut st, 30 + i, &kv(KvVerb::Delete, &format!("c/{i}")));
            }
        }
        let mut loaded = st.clone();
        loaded.tombstones = Default::default();
        rebuild(&mut loaded);
        assert_eq!(loaded.tombstones, st.tombstones);
        // b/1 and a/2, and every third c/.
        assert_eq!(st.tombstones.len(), 2 + 17);
    }
}
