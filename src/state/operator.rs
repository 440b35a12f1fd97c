//! Operator settings in the state: autopilot's configuration.

use std::sync::Arc;

use super::tx::Tx;
use super::{Response, Row, Table, keys};
use crate::structs::operator::AutopilotConfig;

/// Autopilot's configuration as it applies: the stored one, or Consul's
/// defaults.
pub fn autopilot(state: &super::State) -> AutopilotConfig {
    state.autopilot.as_deref().cloned().unwrap_or_default()
}

/// Sets autopilot's configuration whole. `cas`: the `ModifyIndex` the
/// writer read (0: never set); a mismatch answers `false`, changing
/// nothing.
pub fn set_autopilot(tx: &mut Tx, new: &AutopilotConfig, cas: Option<u64>) -> Response {
    let current = tx.state.autopilot.clone();
    if let Some(cas) = cas
        && current.as_ref().map_or(0, |c| c.modify_index) != cas
    {
        return Response::Bool(false);
    }
    let mut next = new.clone();
    next.create_index = current.as_ref().map_or(tx.index, |c| c.create_index);
    next.modify_index = tx.index;
    let next = Arc::new(next);
    tx.state.autopilot = Some(next.clone());
    tx.record(
        Table::Meta,
        super::persist::AUTOPILOT_ROW.into(),
        current.map(Row::Autopilot),
        Some(Row::Autopilot(next)),
    );
    tx.touch(keys::AUTOPILOT);
    Response::Bool(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, MemoryBackend, State, Store, apply_command, snapshot};
    use crate::structs::duration::Duration;

    fn set(st: &mut State, at: u64, threshold_ms: i64, cas: Option<u64>) -> Response {
        let config = AutopilotConfig {
            last_contact_threshold: Duration(threshold_ms * 1_000_000),
            ..Default::default()
        };
        apply_command(st, at, &Command::AutopilotSet { config, cas }).0
    }

    #[test]
    fn autopilot_is_set_with_cas_and_kept_by_restarts_and_snapshots() {
        let disk = MemoryBackend::default();
        let store = Store::open(Box::new(disk.clone())).unwrap();
        let mut st = State::default();
        assert_eq!(autopilot(&st), AutopilotConfig::default());
        // A CAS against "never set" (0) succeeds once.
        assert_eq!(set(&mut st, 5, 300, Some(0)), Response::Bool(true));
        assert_eq!(set(&mut st, 6, 400, Some(0)), Response::Bool(false));
        assert_eq!(autopilot(&st).last_contact_threshold, Duration(300_000_000));
        let (r, s2) = {
            let config = AutopilotConfig {
                max_trailing_logs: 9,
                ..Default::default()
            };
            apply_command(
                &mut st,
                7,
                &Command::AutopilotSet {
                    config,
                    cas: Some(5),
                },
            )
        };
        assert_eq!(r, Response::Bool(true));
        let now = autopilot(&st);
        assert_eq!(
            (now.create_index, now.modify_index, now.max_trailing_logs),
            (5, 7, 9)
        );

        // Kept by the rows (a restart) and by a Raft snapshot.
        store.commit(st.clone(), &[s2], vec![]).unwrap();
        let again = Store::open(Box::new(disk)).unwrap();
        assert_eq!(again.state().autopilot, st.autopilot);
        let decoded = snapshot::decode(&snapshot::encode(&st).unwrap()).unwrap();
        assert_eq!(decoded.autopilot, st.autopilot);
    }

    #[test]
    fn a_snapshot_without_the_trailer_decodes_with_the_defaults() {
        let mut st = State::default();
        set(&mut st, 3, 300, None);
        let bytes = snapshot::encode(&st).unwrap();
        // The trailer is the last bincode value: a length and JSON.
        let json_len = serde_json::to_vec(&serde_json::json!({
            "Autopilot": &*st.autopilot.clone().unwrap()
        }))
        .unwrap()
        .len();
        let old = &bytes[..bytes.len() - json_len - 8];
        let decoded = snapshot::decode(old).unwrap();
        assert!(decoded.autopilot.is_none());
        assert_eq!(decoded.index, st.index);
    }
}
