//! Node liveness, the agent's side: a heartbeat to the servers every
//! [`HEARTBEAT_EVERY`] renews the node's lease on the leader (see
//! `crate::http::liveness` and `crate::leader::liveness` for the servers'
//! side), and a clean stop leaves the cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::Agent;
use super::servers::HEARTBEATS;
use crate::coordinate::{Coordinate, Update};
use crate::structs::agent::HeartbeatReply;

/// How often an agent renews its lease.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// How often at most a client agent sends its coordinate (Consul's agents
/// send theirs every 15 s or more; the first goes at once).
pub const COORDINATE_EVERY: Duration = Duration::from_secs(10);

/// The agent's side: heartbeats for as long as it runs.
pub async fn heartbeat_loop(a: Arc<Agent>) {
    let mut failing = false;
    let mut coordinate_sent: Option<Instant> = None;
    loop {
        HEARTBEATS.inc();
        let node = a.local.with(|t| t.node.register());
        let talking = a.talking.read().await;
        let started = Instant::now();
        let sent = a.servers.put("/v1/internal/agent/heartbeat", &node).await;
        let rtt = started.elapsed();
        drop(talking);
        match sent {
            Ok(body) => {
                if failing {
                    tracing::info!("heartbeats reach the servers again");
                    failing = false;
                }
                match serde_json::from_slice::<HeartbeatReply>(&body) {
                    Ok(r) => {
                        a.learn(r.members, &r.datacenter, &r.primary_datacenter);
                        // A server's own agent leaves its node's
                        // coordinate to the server's probes.
                        if !a.config.in_server
                            && let Some(coord) = &r.coord
                        {
                            observe(&a, &r.node, coord, rtt, &mut coordinate_sent).await;
                        }
                        if !r.known {
                            tracing::info!("the catalog did not know this node: full sync");
                            a.local.ask_full_sync();
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "odd heartbeat answer"),
                }
            }
            Err(e) if !failing => {
                tracing::warn!(error = %e, "heartbeat failed");
                failing = true;
            }
            Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
        }
        tokio::time::sleep(HEARTBEAT_EVERY).await;
    }
}

/// Moves the agent's coordinate by one heartbeat's RTT to the server that
/// answered, and sends it to the servers when due.
async fn observe(
    a: &Agent, server: &str, coord: &Coordinate, rtt: Duration, sent: &mut Option<Instant>,
) {
    let mine = match a.coordinate.lock().update(server, coord, rtt) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "heartbeat RTT not used for the coordinate");
            return;
        }
    };
    if sent.is_some_and(|at| at.elapsed() < COORDINATE_EVERY) {
        return;
    }
    let update = Update {
        node: a.config.node.clone(),
        segment: String::new(),
        coord: mine,
    };
    match a.servers.put("/v1/coordinate/update", &update).await {
        Ok(_) => *sent = Some(Instant::now()),
        Err(e) => tracing::debug!(error = %e, "coordinate update failed"),
    }
}

/// A clean shutdown: the servers deregister the node. Heartbeats and
/// anti-entropy stop first (what they have in flight finishes), so nothing
/// registers the node again behind the leave.
pub async fn leave_cluster(a: &Agent) {
    let _quiet = tokio::time::timeout(Duration::from_secs(3), a.talking.write()).await;
    let body = json!({"Node": a.config.node});
    match tokio::time::timeout(
        Duration::from_secs(3),
        a.servers.put("/v1/internal/agent/leave", &body),
    )
    .await
    {
        Ok(Ok(_)) => tracing::info!("left the cluster"),
        Ok(Err(e)) => tracing::warn!(error = %e, "could not leave the cluster"),
        Err(_) => tracing::warn!("could not leave the cluster: timed out"),
    }
}
