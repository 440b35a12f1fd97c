//! The indexes derived from the tables (service names, connect targets,
//! config references, tombstones, session indexes), rebuilt whole after a
//! load from disk or a snapshot; apply keeps them current after that.

use super::State;

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
    for (k, s) in services {
        super::catalog::index_service(state, &k, &s);
    }
    super::tombstones::rebuild(state);
    super::session::reindex(state);
    super::virtual_ip::reindex(state);
}
