//! Network coordinates: the leader applies the updates it gathered (agents'
//! `PUT /v1/coordinate/update`, the servers' own from its probes, its
//! own) as one Raft write every [`UPDATE_PERIOD`], as Consul's
//! `coordinate_update_period`. Unlike Consul, an update that moved the
//! node less than [`MIN_MOVE`] from its stored coordinate is left out: a
//! coordinate jitters with every sample, and a quiet cluster should write
//! nothing to Raft (its estimates stay within `MIN_MOVE` of the live ones).

use std::sync::Arc;
use std::time::Duration;

use crate::coordinate::{Update, moved};
use crate::server::Server;
use crate::state::Command;

pub const UPDATE_PERIOD: Duration = Duration::from_secs(5);
/// Seconds: less movement than this is not written.
pub const MIN_MOVE: f64 = 0.001;

pub async fn apply(s: Arc<Server>) {
    let mut tick = tokio::time::interval(UPDATE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        // Its own estimate, unless an update for its node is waiting (one
        // sent by hand, which Consul keeps until the agent's next sync).
        let own = s.coordinate().lock().coordinate();
        s.coordinate_updates().offer(Update {
            node: s.node_name().to_owned(),
            segment: String::new(),
            coord: own,
        });
        let st = s.state();
        let updates: Vec<Update> = s
            .coordinate_updates()
            .take()
            .into_iter()
            .filter(|u| {
                st.coordinates
                    .get(&u.node)
                    .is_none_or(|c| moved(&c.coord, &u.coord) >= MIN_MOVE)
            })
            .filter(|u| st.nodes.contains_key(&u.node))
            .collect();
        if updates.is_empty() {
            continue;
        }
        if let Err(e) = s.write(Command::CoordinateBatch { updates }).await {
            tracing::debug!(error = %e, "coordinate batch not committed");
        }
    }
}
