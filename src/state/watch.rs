//! Wake-ups for blocking queries, per watch key (a KV key, a service, a
//! node...), so that an unrelated write never wakes a query.
//!
//! A query subscribes to its keys *before* reading the state, then waits for
//! any of them to change; a `watch` channel remembers a change that happened
//! in between, so no wake-up is lost.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};

use tokio::sync::watch;

use super::WatchKey;

#[derive(Default)]
pub struct Watches {
    exact: Mutex<HashMap<WatchKey, watch::Sender<u64>>>,
    /// KV prefixes (`kv/foo/`): woken by any key beneath them.
    prefixes: Mutex<HashMap<WatchKey, watch::Sender<u64>>>,
}

/// Channels are dropped once nobody listens; this bounds the sweep cost.
const SWEEP_AT: usize = 4096;

fn subscribe_in(
    map: &Mutex<HashMap<WatchKey, watch::Sender<u64>>>, key: &WatchKey,
) -> watch::Receiver<u64> {
    let mut map = map.lock();
    if map.len() >= SWEEP_AT && !map.contains_key(key) {
        map.retain(|_, tx| tx.receiver_count() > 0);
    }
    map.entry(key.clone())
        .or_insert_with(|| watch::channel(0).0)
        .subscribe()
}

impl Watches {
    pub fn subscribe(&self, key: &WatchKey) -> watch::Receiver<u64> {
        subscribe_in(&self.exact, key)
    }

    pub fn subscribe_prefix(&self, prefix: &WatchKey) -> watch::Receiver<u64> {
        subscribe_in(&self.prefixes, prefix)
    }

    pub fn notify(&self, keys: &BTreeSet<WatchKey>, index: u64) {
        if keys.is_empty() {
            return;
        }
        {
            let map = self.exact.lock();
            for k in keys {
                if let Some(tx) = map.get(k) {
                    tx.send_replace(index);
                }
            }
        }
        let map = self.prefixes.lock();
        if map.is_empty() {
            return;
        }
        for (prefix, tx) in map.iter() {
            if keys.iter().any(|k| k.starts_with(prefix.as_str())) {
                tx.send_replace(index);
            }
        }
    }

    /// Wakes every waiter (the whole state was replaced).
    pub fn notify_all(&self) {
        for map in [&self.exact, &self.prefixes] {
            for tx in map.lock().values() {
                tx.send_modify(|v| *v += 1);
            }
        }
    }

    /// Number of keys with live listeners (for metrics and tests).
    pub fn active(&self) -> usize {
        [&self.exact, &self.prefixes]
            .iter()
            .map(|m| m.lock().values().filter(|t| t.receiver_count() > 0).count())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wakes_only_matching_keys() {
        let w = Watches::default();
        use super::super::keys;
        let mut a = w.subscribe(&keys::service("web"));
        let b = w.subscribe(&keys::service("db"));
        let p = w.subscribe_prefix(&keys::kv("foo/"));
        w.notify(&BTreeSet::from([keys::service("web")]), 7);
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        assert!(!p.has_changed().unwrap());
        assert_eq!(*a.borrow_and_update(), 7);
        w.notify(&BTreeSet::from([keys::kv("foo/bar")]), 8);
        assert!(p.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
    }
}
