//! Network coordinates in the state: one per node, written in batches by
//! `Command::CoordinateBatch` (the leader gathers agents' and servers'
//! updates and applies them together, as Consul does), dropped with their
//! node.

use std::sync::Arc;

use super::tx::Tx;
use super::{Response, Row, Table, keys};
use crate::coordinate::Update;

/// Most updates in one batch (Consul's `coordinate_update_batch_size` times
/// its `coordinate_update_max_batches`): more waiting are dropped.
pub const MAX_BATCH: usize = 640;

/// Stores each update whose node is in the catalog and whose coordinate
/// is sound (checked again here: the log is trusted no more than a
/// request); others are skipped, as Consul's state store skips them.
pub fn apply_batch(tx: &mut Tx, updates: &[Update]) -> Response {
    for u in updates.iter().take(MAX_BATCH) {
        if !tx.state.nodes.contains_key(&u.node) || u.coord.check().is_err() {
            continue;
        }
        tx.put_coordinate(u.clone());
    }
    Response::Ok
}

impl Tx<'_> {
    fn put_coordinate(&mut self, u: Update) {
        let name = u.node.clone();
        let after = Arc::new(u);
        let before = self.state.coordinates.insert(name.clone(), after.clone());
        self.touch(keys::COORDINATES);
        self.record(
            Table::Coordinates,
            name,
            before.map(Row::Coordinate),
            Some(Row::Coordinate(after)),
        );
    }

    /// Forgets a node's coordinate (its node is gone).
    pub(super) fn remove_coordinate(&mut self, node: &str) {
        if let Some(before) = self.state.coordinates.remove(node) {
            self.touch(keys::COORDINATES);
            self.record(
                Table::Coordinates,
                node.to_string(),
                Some(Row::Coordinate(before)),
                None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinate::Coordinate;
    use crate::state::{
        Command, DeregisterRequest, MemoryBackend, State, Store, apply_command, snapshot,
    };
    use crate::structs::RegisterRequest;

    fn register(st: &mut State, at: u64, node: &str) {
        let req = RegisterRequest {
            node: node.into(),
            address: "10.0.0.1".into(),
            ..Default::default()
        };
        apply_command(st, at, &Command::Register(Box::new(req)));
    }

    fn update(node: &str, x: f64) -> Update {
        let mut coord = Coordinate::default();
        coord.vec[0] = x;
        Update {
            node: node.into(),
            segment: String::new(),
            coord,
        }
    }

    #[test]
    fn batch_stores_known_nodes_and_sound_coordinates_only() {
        let mut st = State::default();
        register(&mut st, 1, "a");
        let mut bad = update("a", 0.0);
        bad.coord.vec.push(1.0);
        let batch = vec![update("a", 0.5), update("ghost", 0.1), bad];
        let (r, set) = apply_command(&mut st, 2, &Command::CoordinateBatch { updates: batch });
        assert_eq!(r, Response::Ok);
        assert_eq!(st.coordinates.len(), 1);
        assert_eq!(st.coordinates["a"].coord.vec[0], 0.5);
        assert!(set.watch_keys.contains(&keys::COORDINATES));
        assert_eq!(st.index_of([&keys::COORDINATES]), 2);
    }

    #[test]
    fn coordinates_are_kept_by_the_rows_across_a_restart() {
        let disk = MemoryBackend::default();
        let store = Store::open(Box::new(disk.clone())).unwrap();
        let mut st = State::default();
        let (_, s1) = {
            let req = RegisterRequest {
                node: "a".into(),
                address: "10.0.0.1".into(),
                ..Default::default()
            };
            apply_command(&mut st, 1, &Command::Register(Box::new(req)))
        };
        let batch = vec![update("a", 0.3)];
        let (_, s2) = apply_command(&mut st, 2, &Command::CoordinateBatch { updates: batch });
        store.commit(st.clone(), &[s1, s2], vec![]).unwrap();
        let again = Store::open(Box::new(disk.clone())).unwrap();
        assert_eq!(again.state().coordinates, st.coordinates);
        let dereg = DeregisterRequest {
            node: "a".into(),
            ..Default::default()
        };
        let (_, s3) = apply_command(&mut st, 3, &Command::Deregister(dereg));
        store.commit(st.clone(), &[s3], vec![]).unwrap();
        let again = Store::open(Box::new(disk)).unwrap();
        assert!(again.state().coordinates.is_empty());
    }

    #[test]
    fn coordinates_survive_snapshots_and_leave_with_their_node() {
        let mut st = State::default();
        register(&mut st, 1, "a");
        register(&mut st, 2, "b");
        let batch = vec![update("a", 0.1), update("b", 0.2)];
        apply_command(&mut st, 3, &Command::CoordinateBatch { updates: batch });
        let back = snapshot::decode(&snapshot::encode(&st).unwrap()).unwrap();
        assert_eq!(back.coordinates, st.coordinates);
        let dereg = DeregisterRequest {
            node: "a".into(),
            ..Default::default()
        };
        apply_command(&mut st, 4, &Command::Deregister(dereg));
        assert!(!st.coordinates.contains_key("a"));
        assert!(st.coordinates.contains_key("b"));
        assert_eq!(st.index_of([&keys::COORDINATES]), 4);
    }
}
