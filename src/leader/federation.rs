//! The primary's federation states (`federation::Federation::write_states`):
//! what is known of every datacenter, written into Raft by the primary's
//! leader when it changes. A datacenter that knows no other, and holds no
//! other's state (one forgotten is deleted), writes nothing (an idle lone
//! cluster makes no Raft write), and a secondary none at all: the duty
//! ends at once there.

use std::sync::Arc;

use crate::federation::{Federation, ROUND};

pub async fn write_states(federation: Option<Arc<Federation>>) {
    let Some(fed) = federation else {
        return;
    };
    if fed.is_secondary() {
        return;
    }
    let mut written = None;
    let mut tick = tokio::time::interval(ROUND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if fed.has_others() {
            fed.write_states(&mut written).await;
        }
    }
}
