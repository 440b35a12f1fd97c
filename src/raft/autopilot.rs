//! Autopilot's view of the servers, computed on the leader from what Raft
//! knows of each follower (its last acknowledged contact and the log it
//! has matched) against the operator's thresholds; and which dead servers
//! its cleanup (`leader::autopilot`) may remove.
//!
//! **Dead.** Consul removes a server once gossip marks it failed; cairn has
//! no gossip, so a server is dead when the leader has had no answer from it
//! for [`dead_after`]: twenty times `LastContactThreshold`, and never under
//! ten seconds. Conservative on purpose: a removal costs the server a
//! rejoin (learner, catch-up, promotion) and the cluster a failure
//! tolerance meanwhile, so a GC pause, a slow disk or a short partition
//! (which only make a server *unhealthy*) must not cause one; ten seconds
//! is also about when Consul's LAN gossip declares a silent member failed.
//! Health reports the same servers as `SerfStatus: failed`.
//!
//! **Quorum.** As Consul's autopilot (`canRemoveServers`): dead voters are
//! removed only all together and only if they are at most `(voters-1)/2`
//! (a minority: what is left still holds a majority of the configuration)
//! and the voters left are at least `MinQuorum`; else none is. Dead
//! non-voters count toward no quorum and are always removed. The leader
//! never removes itself.

use std::collections::HashMap;
use std::time::SystemTime;

use openraft::Instant as _;
use parking_lot::Mutex;

use super::{NodeId, ServerNode, TypeConfig};
use crate::structs::duration::Duration;
use crate::structs::operator::{AutopilotConfig, OperatorHealth, ServerHealth};

/// The least silence after which a server is "failed", not just unhealthy.
const FAILED_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// How many `LastContactThreshold`s of silence make a server dead.
const DEAD_FACTOR: u64 = 20;

/// How long the leader must hear nothing from a server before calling it
/// dead (failed): see the module's doc.
pub fn dead_after(config: &AutopilotConfig) -> std::time::Duration {
    let threshold = config.last_contact_threshold.nanos().max(0) as u64;
    FAILED_AFTER.max(std::time::Duration::from_nanos(
        threshold.saturating_mul(DEAD_FACTOR),
    ))
}

/// What the dead-server cleanup removes now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Dead non-voters: always removed.
    pub non_voters: Vec<NodeId>,
    /// Dead voters, when removing them all leaves a safe majority.
    pub voters: Vec<NodeId>,
    /// Why dead voters stay, when they do.
    pub refused: Option<String>,
}

/// Which servers to remove, given each member's (`id`, voter, how long the
/// leader `me` has heard nothing from it).
pub fn cleanup(
    members: &[(NodeId, bool, std::time::Duration)], me: NodeId, config: &AutopilotConfig,
) -> Cleanup {
    let dead_after = dead_after(config);
    let dead = |id: NodeId, silent: std::time::Duration| id != me && silent >= dead_after;
    let mut plan = Cleanup::default();
    for &(id, voter, silent) in members {
        if dead(id, silent) {
            if voter {
                plan.voters.push(id);
            } else {
                plan.non_voters.push(id);
            }
        }
    }
    let peers = members.iter().filter(|m| m.1).count();
    let failed = plan.voters.len();
    if failed > 0 {
        if peers - failed < config.min_quorum as usize {
            plan.refused = Some(format!(
                "removing {failed}/{peers} servers would leave fewer than MinQuorum ({})",
                config.min_quorum
            ));
        } else if failed > (peers - 1) / 2 {
            plan.refused = Some(format!(
                "removing the majority of servers ({failed}/{peers}) is not safe"
            ));
        }
        if plan.refused.is_some() {
            plan.voters.clear();
        }
    }
    plan
}

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
            serf_status: if contact.is_some_and(|c| c < dead_after(config)) {
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

#[cfg(test)]
mod tests {
    use std::time::Duration as D;

    use super::*;

    fn config(min_quorum: u32) -> AutopilotConfig {
        AutopilotConfig {
            min_quorum,
            ..Default::default()
        }
    }

    const DEAD: D = D::from_secs(60);
    const ALIVE: D = D::from_millis(100);

    #[test]
    fn dead_means_ten_seconds_at_least_or_twenty_thresholds() {
        assert_eq!(dead_after(&config(0)), D::from_secs(10));
        let slow = AutopilotConfig {
            last_contact_threshold: Duration::from_secs(2),
            ..Default::default()
        };
        assert_eq!(dead_after(&slow), D::from_secs(40));
        // A silence just under the bound is not death.
        let plan = cleanup(
            &[
                (1, true, D::ZERO),
                (2, true, D::from_millis(9_999)),
                (3, true, ALIVE),
            ],
            1,
            &config(0),
        );
        assert_eq!(plan, Cleanup::default());
    }

    #[test]
    fn a_minority_of_dead_voters_is_removed() {
        let plan = cleanup(
            &[(1, true, D::ZERO), (2, true, DEAD), (3, true, ALIVE)],
            1,
            &config(0),
        );
        assert_eq!(plan.voters, vec![2]);
        let five = [
            (1, true, D::ZERO),
            (2, true, DEAD),
            (3, true, DEAD),
            (4, true, ALIVE),
            (5, true, ALIVE),
        ];
        assert_eq!(cleanup(&five, 1, &config(0)).voters, vec![2, 3]);
    }

    #[test]
    fn a_majority_of_dead_voters_stays() {
        let plan = cleanup(
            &[(1, true, D::ZERO), (2, true, DEAD), (3, true, DEAD)],
            1,
            &config(0),
        );
        assert!(plan.voters.is_empty());
        assert!(plan.refused.unwrap().contains("majority"));
        // Two of four: half is not a minority.
        let four = [
            (1, true, D::ZERO),
            (2, true, DEAD),
            (3, true, DEAD),
            (4, true, ALIVE),
        ];
        assert!(cleanup(&four, 1, &config(0)).voters.is_empty());
    }

    #[test]
    fn min_quorum_and_the_leader_itself_are_kept() {
        let three = [(1, true, D::ZERO), (2, true, DEAD), (3, true, ALIVE)];
        let plan = cleanup(&three, 1, &config(3));
        assert!(plan.voters.is_empty());
        assert!(plan.refused.unwrap().contains("MinQuorum"));
        // The leader never calls itself dead, however its own entry reads.
        let plan = cleanup(
            &[(1, true, DEAD), (2, true, ALIVE), (3, true, ALIVE)],
            1,
            &config(0),
        );
        assert_eq!(plan, Cleanup::default());
    }

    #[test]
    fn dead_non_voters_go_whatever_the_voters() {
        let plan = cleanup(
            &[
                (1, true, D::ZERO),
                (2, true, DEAD),
                (3, true, DEAD),
                (4, false, DEAD),
            ],
            1,
            &config(0),
        );
        assert_eq!(plan.non_voters, vec![4]);
        assert!(plan.voters.is_empty());
    }
}
