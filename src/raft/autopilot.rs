//! Autopilot's view of the servers, computed on the leader from what Raft
//! knows of each follower (its last acknowledged contact and the log it
//! has matched) against the operator's thresholds.

use std::collections::HashMap;
use std::time::SystemTime;

use openraft::Instant as _;
use parking_lot::Mutex;

use super::{NodeId, ServerNode, TypeConfig};
use crate::structs::duration::Duration;
use crate::structs::operator::{AutopilotConfig, OperatorHealth, ServerHealth};

/// A follower silent for longer than this is "failed", not just unhealthy.
const FAILED_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// When each server became healthy (for `StableSince`), kept by the server
/// that answers health, the leader.
#[derive(Default)]
pub struct Stability(Mutex<HashMap<NodeId, SystemTime>>);

/// The servers' health as the leader (`me`, with its Raft metrics `m` and
/// its `members`: id, node, voter) sees it now. On a follower (asked with
/// `?stale`) only what it knows: itself and the membership.
pub fn health(
    m: &openraft::RaftMetrics<TypeConfig>, members: Vec<(NodeId, ServerNode, bool)>, me: NodeId,
    config: &AutopilotConfig, stable: &Stability,
) -> OperatorHealth {
    let leader = m.current_leader;
    let last_index = m.last_log_index.unwrap_or(0);
    // A follower is heard from once a heartbeat interval at best: a
    // threshold under two would call healthy servers unhealthy between
    // heartbeats (Consul's default, 200ms, assumes its 100ms ones).
    let floor = Duration(2 * super::HEARTBEAT_MS as i64 * 1_000_000);
    let threshold = if config.last_contact_threshold.is_zero() {
        Duration(0)
    } else {
        config.last_contact_threshold.max(floor)
    };
    let mut since = stable.0.lock();
    let now = SystemTime::now();
    let mut servers = Vec::new();
    for (id, node, voter) in members {
        let (contact, matched) = if Some(id) == leader && id == me {
            (
                Some(std::time::Duration::ZERO),
                m.last_log_index.map(|i| (m.current_term, i)),
            )
        } else {
            let contact = m
                .heartbeat
                .as_ref()
                .and_then(|h| h.get(&id).cloned().flatten())
                .map(|t| t.elapsed());
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map(|l| (l.leader_id.term, l.index));
            (contact, matched)
        };
        let (last_term, index) = matched.unwrap_or((0, 0));
        let in_touch = contact
            .is_some_and(|c| threshold.is_zero() || (c.as_nanos() as i64) <= threshold.nanos());
        let healthy = in_touch && last_index.saturating_sub(index) <= config.max_trailing_logs;
        let since_ok = if healthy {
            *since.entry(id).or_insert(now)
        } else {
            since.remove(&id);
            now
        };
        servers.push(ServerHealth {
            id: node.name.clone(),
            name: node.name.clone(),
            address: node.raft_addr.clone(),
            serf_status: if contact.is_some_and(|c| c < FAILED_AFTER) {
                "alive".into()
            } else {
                "failed".into()
            },
            version: crate::structs::agent::CONSUL_VERSION.into(),
            leader: Some(id) == leader,
            last_contact: Duration(contact.map_or(-1, |c| c.as_nanos() as i64)),
            last_term,
            last_index: index,
            healthy,
            voter,
            stable_since: time::OffsetDateTime::from(if healthy { since_ok } else { now })
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        });
    }
    let voters = servers.iter().filter(|s| s.voter).count();
    let healthy_voters = servers.iter().filter(|s| s.voter && s.healthy).count();
    let quorum = voters / 2 + 1;
    OperatorHealth {
        healthy: servers.iter().all(|s| s.healthy),
        failure_tolerance: healthy_voters.saturating_sub(quorum),
        servers,
    }
}
