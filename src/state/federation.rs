//! WAN federation states in the state: what the primary knows of each
//! datacenter (its servers, when that was confirmed), one meta row each.
//! Written by the primary's leader (`crate::federation`); a restarted
//! primary finds the other datacenters here.

use std::sync::Arc;

use super::tx::Tx;
use super::{Response, Row, Table, keys};
use crate::structs::federation::FederationState;

/// The meta row of `dc`'s state.
pub fn row_key(dc: &str) -> String {
    format!("federation/{dc}")
}

/// Sets one datacenter's state whole.
pub fn set(tx: &mut Tx, new: &FederationState) -> Response {
    let current = tx.state.federation.get(&new.datacenter).cloned();
    let mut next = new.clone();
    next.create_index = current.as_ref().map_or(tx.index, |c| c.create_index);
    next.modify_index = tx.index;
    let next = Arc::new(next);
    tx.state
        .federation
        .insert(next.datacenter.clone(), next.clone());
    tx.record(
        Table::Meta,
        row_key(&next.datacenter),
        current.map(Row::Federation),
        Some(Row::Federation(next)),
    );
    tx.touch(keys::FEDERATION);
    Response::Bool(true)
}

/// Forgets one datacenter's state (nothing to do if there is none).
pub fn delete(tx: &mut Tx, dc: &str) -> Response {
    let Some(current) = tx.state.federation.remove(dc) else {
        return Response::Bool(false);
    };
    tx.record(
        Table::Meta,
        row_key(dc),
        Some(Row::Federation(current)),
        None,
    );
    tx.touch(keys::FEDERATION);
    Response::Bool(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, MemoryBackend, State, Store, apply_command, snapshot};
    use crate::structs::federation::WanServer;

    fn state_of(dc: &str, addr: &str) -> Command {
        let mut f = FederationState::new(
            dc,
            vec![WanServer {
                name: "s1".into(),
                raft_addr: addr.into(),
            }],
        );
        f.updated_at = "2026-01-01T00:00:00Z".into();
        Command::FederationStateSet { state: Box::new(f) }
    }

    /// A state written is kept by the rows on disk and by snapshots, its
    /// create index kept across updates.
    #[test]
    fn federation_states_survive_rows_and_snapshots() {
        let disk = MemoryBackend::default();
        let store = Store::open(Box::new(disk.clone())).unwrap();
        let mut st = State::default();
        apply_command(&mut st, 5, &state_of("dc2", "10.0.0.2:8300"));
        let (_, set) = apply_command(&mut st, 6, &state_of("dc2", "10.0.0.3:8300"));
        apply_command(&mut st, 7, &state_of("dc1", "10.0.0.1:8300"));
        let dc2 = st.federation.get("dc2").unwrap().clone();
        assert_eq!((dc2.create_index, dc2.modify_index), (5, 6));
        assert_eq!(dc2.servers[0].raft_addr, "10.0.0.3:8300");

        let bytes = snapshot::encode(&st).unwrap();
        assert_eq!(snapshot::decode(&bytes).unwrap().federation, st.federation);

        let (_, last) = apply_command(&mut st, 8, &state_of("dc1", "10.0.0.9:8300"));
        store.commit(st.clone(), &[set, last], vec![]).unwrap();
        drop(store);
        let again = Store::open(Box::new(disk)).unwrap();
        assert_eq!(again.state().federation.len(), 2);
        assert_eq!(again.state().federation, st.federation);
    }

    /// A datacenter forgotten is gone from the state and from the rows on
    /// disk; forgetting it again changes nothing.
    #[test]
    fn a_forgotten_datacenters_state_is_deleted_from_rows_too() {
        let disk = MemoryBackend::default();
        let store = Store::open(Box::new(disk.clone())).unwrap();
        let mut st = State::default();
        let (_, a) = apply_command(&mut st, 5, &state_of("dc2", "10.0.0.2:8300"));
        let (_, b) = apply_command(&mut st, 6, &state_of("dc3", "10.0.0.3:8300"));
        store.commit(st.clone(), &[a, b], vec![]).unwrap();
        let forget = Command::FederationStateDelete {
            datacenter: "dc2".into(),
        };
        let (answer, gone) = apply_command(&mut st, 7, &forget);
        assert_eq!(answer, Response::Bool(true));
        assert!(!st.federation.contains_key("dc2"));
        let (again, _) = apply_command(&mut st, 8, &forget);
        assert_eq!(again, Response::Bool(false));
        store.commit(st.clone(), &[gone], vec![]).unwrap();
        drop(store);
        let reopened = Store::open(Box::new(disk)).unwrap();
        let dcs: Vec<String> = reopened.state().federation.keys().cloned().collect();
        assert_eq!(dcs, vec!["dc3".to_string()]);
    }
}
