//! User events (`/v1/event/fire`): Consul gossips them; cairn commits each
//! fire through Raft into a ring of the last `event::RING` in the state,
//! which every agent (a server's own and client agents) follows with a
//! blocking read and filters for itself (`agent::events`).
//!
//! The ring is in memory only, as Consul's events are: not in the rows or
//! the snapshots, so a restarted server starts with an empty one (its
//! `events` index persists, so a follower's blocking read is not fooled).

use std::sync::Arc;

use super::tx::Tx;
use super::{Response, keys};
use crate::structs::event::{RING, UserEvent};

/// Appends a fired event with the next Lamport time: past the last one
/// in the ring and at least the entry's index, so that times keep rising
/// across a restart that emptied the ring.
pub fn fire(tx: &mut Tx, event: &UserEvent) -> Response {
    let last = tx.state.events.last().map_or(0, |e| e.ltime);
    let mut e = event.clone();
    e.ltime = (last + 1).max(tx.index);
    tx.state.events.push_back(Arc::new(e));
    while tx.state.events.len() > RING {
        tx.state.events.pop_front();
    }
    tx.touch(keys::EVENTS);
    Response::Ok
}
