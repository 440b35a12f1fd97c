//! `Tx`: a write in progress on one version of the state, and the only
//! way rows change. Every put and remove records the row before and after
//! and the watch keys to wake, so the change set can never disagree with
//! what was written. Each table's own file adds its `put_*`/`remove_*`
//! methods (`impl Tx` there), so this file knows no table and every table
//! imports it, never the other way round.

use super::{Change, ChangeSet, Row, State, Table, WatchKey};

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

    /// Records one row's change (the tables' `impl Tx` blocks call it).
    pub(crate) fn record(
        &mut self, table: Table, key: String, before: Option<Row>, after: Option<Row>,
    ) {
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

    /// Index rows persisted at their current values though nobody watches
    /// them (tombstone floors after a reap).
    pub(crate) fn keep_indexes(&mut self, keys: impl IntoIterator<Item = WatchKey>) {
        self.set.watch_keys.extend(keys);
    }

    /// Takes in the changes of a command applied inside this one.
    pub(crate) fn absorb(&mut self, s: ChangeSet) {
        self.set.changes.extend(s.changes);
        self.set.watch_keys.extend(s.watch_keys);
        self.set.replaced |= s.replaced;
    }

    /// The whole state was replaced (see `ChangeSet::replaced`).
    pub(crate) fn mark_replaced(&mut self) {
        self.set.replaced = true;
    }
}

pub(crate) fn remove_from_index(
    index: &mut imbl::OrdMap<String, imbl::OrdSet<(String, String)>>, name: &str,
    k: &(String, String),
) {
    if let Some(set) = index.get_mut(name) {
        set.remove(k);
        if set.is_empty() {
            index.remove(name);
        }
    }
}
