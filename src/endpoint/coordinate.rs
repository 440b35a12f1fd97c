//! Network coordinates as the endpoints use them: rows sorted by their
//! node's estimated distance from a node (`?near`, a prepared query's
//! `Near`).

use std::time::Duration;

use crate::coordinate::distance;
use crate::server::Server;

/// Sorts `rows` by their node's estimated distance from node `near`
/// (those without a coordinate last); unchanged when `near` has none.
pub fn sort_near_node<T>(s: &Server, near: &str, rows: &mut [T], node_of: impl Fn(&T) -> &str) {
    let st = s.state();
    let Some(from) = st.coordinates.get(near) else {
        return;
    };
    rows.sort_by_cached_key(|r| {
        match st
            .coordinates
            .get(node_of(r))
            .and_then(|c| distance(&from.coord, &c.coord))
        {
            Some(d) => (false, d),
            None => (true, Duration::ZERO),
        }
    });
}
