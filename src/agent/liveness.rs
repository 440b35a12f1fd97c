//! Node liveness, the agent's side: a heartbeat to the servers every
//! [`HEARTBEAT_EVERY`] renews the node's lease on the leader (see
//! `crate::http::liveness` and `crate::leader::liveness` for the servers'
//! side), and a clean stop leaves the cluster.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::Agent;
use super::servers::HEARTBEATS;
use crate::structs::agent::HeartbeatReply;

/// How often an agent renews its lease.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);

/// The agent's side: heartbeats for as long as it runs.
pub async fn heartbeat_loop(a: Arc<Agent>) {
    let mut failing = false;
    loop {
        HEARTBEATS.inc();
        let node = a.local.with(|t| t.node.register());
        let talking = a.talking.read().await;
        let sent = a.servers.put("/v1/internal/agent/heartbeat", &node).await;
        drop(talking);
        match sent {
            Ok(body) => {
                if failing {
                    tracing::info!("heartbeats reach the servers again");
                    failing = false;
                }
                match serde_json::from_slice::<HeartbeatReply>(&body) {
                    Ok(r) => {
                        a.learn(r.members, &r.datacenter);
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
