//! Autopilot's dead-server cleanup (`CleanupDeadServers`): while it is
//! on, the leader removes servers it has not heard from for autopilot's
//! dead bound, within Consul's quorum rule (`raft::autopilot`: which
//! servers, and why so). A removed server that comes back asks to join
//! again (`raft::cluster`'s `stay_member`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::server::Server;
use crate::state::operator;

/// How often the leader looks for dead servers.
const EVERY: Duration = Duration::from_secs(1);

pub async fn cleanup(s: Arc<Server>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // When this term first saw each member: silence counts from then at
    // most, so a new leader gives every server the full bound.
    let mut seen = HashMap::new();
    let mut refused: Option<String> = None;
    loop {
        tick.tick().await;
        let config = operator::autopilot(&s.state());
        let Some(silences) = s.cluster().silences(&mut seen) else {
            continue;
        };
        if !config.cleanup_dead_servers {
            continue;
        }
        let plan = crate::raft::autopilot::cleanup(&silences, s.cluster().id, &config);
        // Said once per reason, not every second.
        if plan.refused != refused {
            if let Some(why) = &plan.refused {
                tracing::warn!("autopilot: dead servers kept: {why}");
            }
            refused = plan.refused.clone();
        }
        let removals = plan
            .non_voters
            .iter()
            .map(|id| (*id, false))
            .chain(plan.voters.iter().map(|id| (*id, true)));
        for (id, voter) in removals {
            let name = s
                .cluster()
                .members()
                .into_iter()
                .find(|(m, _, _)| *m == id)
                .map(|(_, n, _)| n.name)
                .unwrap_or_default();
            match s.cluster().remove_id(id, voter).await {
                Ok(()) => {
                    crate::metrics::AUTOPILOT_DEAD_REMOVED.inc();
                    tracing::warn!(
                        id,
                        server = %name,
                        voter,
                        silent_for = ?silences.iter().find(|m| m.0 == id).map(|m| m.2),
                        "autopilot: removed a dead server"
                    );
                }
                Err(e) => {
                    tracing::warn!(id, server = %name, error = %e, "autopilot: could not remove a dead server");
                    break;
                }
            }
        }
    }
}
