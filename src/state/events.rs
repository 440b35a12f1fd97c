//! User events (`/v1/event/fire`): Consul gossips them; cairn commits each
//! fire through Raft into a ring of the last `event::RING` in the state,
//! which every agent (a server's own and client agents) follows with a
//! blocking read and filters for itself (`agent::events`).
//!
//! The ring is in memory only, as Consul's events are: not in the rows or
//! the snapshots, so a restarted server starts with an empty one (its
//! `events` index persists, so a follower's blocking read is not fooled).
//! Best effort, as gossip is: an agent cut off for more than `RING` fires
//! misses the oldest of them.

use std::sync::Arc;

use super::tx::Tx;
use super::{Response, keys};
use crate::structs::event::{RING, UserEvent};

/// Appends a fired event. Its Lamport time is its entry's Raft index:
/// the same on every server (the ring is in no snapshot, so nothing read
/// from it may decide what apply writes), rising across restarts, and
/// shared only by the events of one batch, which every reader sees
/// together (an agent asks for what is past the newest time it has).
pub fn fire(tx: &mut Tx, event: &UserEvent) -> Response {
    let mut e = event.clone();
    e.ltime = tx.index;
    tx.state.events.push_back(Arc::new(e));
    while tx.state.events.len() > RING {
        tx.state.events.pop_front();
    }
    tx.touch(keys::EVENTS);
    Response::Ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, State, apply_command};
    use crate::structs::event::VERSION;

    fn fired(i: usize) -> Command {
        Command::EventFire {
            event: Box::new(UserEvent {
                id: format!("id-{i}"),
                name: "e".into(),
                payload: None,
                node_filter: String::new(),
                service_filter: String::new(),
                tag_filter: String::new(),
                version: VERSION,
                ltime: 0,
            }),
        }
    }

    #[test]
    fn the_ring_keeps_the_last_256_timed_by_their_index() {
        let mut st = State::default();
        // Two fires per index, as a batch applies them.
        for i in 0..300 {
            apply_command(&mut st, 10 + i as u64 / 2, &fired(i));
        }
        assert_eq!(st.events.len(), RING);
        assert_eq!(st.events[0].id, "id-44");
        assert_eq!(st.events[0].ltime, 10 + 22);
        assert_eq!(st.events[1].ltime, 10 + 22);
        assert_eq!(st.events[RING - 1].ltime, 10 + 149);
        assert_eq!(st.index_of([&keys::EVENTS]), 10 + 149);
        // A server whose ring is empty (restarted, or a snapshot
        // installed) times the next fire as every other server does.
        let mut other = State::default();
        apply_command(&mut st, 200, &fired(300));
        apply_command(&mut other, 200, &fired(300));
        assert_eq!(st.events.last(), other.events.last());
    }

    /// Older log entries decode as before: the new command came last, so
    /// no earlier variant's tag moved.
    #[test]
    fn event_fire_is_the_last_command() {
        let tag = |c: &Command| {
            let b = bincode::serialize(c).unwrap();
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        assert_eq!(tag(&Command::Noop), 7);
        assert_eq!(tag(&fired(0)), 25);
        let back: Command = bincode::deserialize(&bincode::serialize(&fired(1)).unwrap()).unwrap();
        assert_eq!(back, fired(1));
    }
}
