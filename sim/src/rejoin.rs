//! Checker (i), on a third of the seeds, once the workload is over: a
//! follower stopped past autopilot's dead bound is removed by the leader
//! (`leader::autopilot`; the others keep a quorum), and, restarted from
//! its disk, asks to join again (`raft::cluster`) and is a voter again,
//! without deposing the leader (a restarted server starts no election
//! while another server leads, so its term never rises past the
//! cluster's). The convergence, durability and duties checkers run after
//! it, on the cluster it leaves.

use std::sync::Arc;
use std::time::Duration;

use cairn::server::Server;

use crate::node::Slot;

/// Whether this seed runs the step.
pub fn on_seed(seed: u64) -> bool {
    seed % 3 == 1
}

/// What the step saw.
#[derive(Debug, Default)]
pub struct RejoinStats {
    /// Simulated time from the stop to the removal's commit.
    pub removed_after: Option<Duration>,
    /// From the restart until it was a voter again.
    pub voter_after: Option<Duration>,
}

fn running(slots: &[Slot]) -> Vec<(usize, Arc<Server>)> {
    slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.lock().unwrap().clone().map(|s| (i, s)))
        .collect()
}

fn leader(slots: &[Slot]) -> Option<(usize, Arc<Server>)> {
    running(slots)
        .into_iter()
        .find(|(_, s)| s.cluster().is_ready_leader())
}

/// Whether server `i` (Raft id `i + 1`) is in the leader's committed
/// membership, and as a voter.
fn committed(s: &Server, i: usize) -> (bool, bool) {
    let m = s.cluster().metrics();
    let c = m.committed_membership_config.membership();
    let id = i as u64 + 1;
    (c.get_node(&id).is_some(), c.voter_ids().any(|v| v == id))
}

/// Steps until `done` or `limit`; `sample` sees every step's time.
fn step_until(
    sim: &mut turmoil::Sim, limit: Duration, sample: &mut dyn FnMut(&mut turmoil::Sim),
    mut done: impl FnMut() -> bool,
) -> bool {
    let deadline = sim.elapsed() + limit;
    while sim.elapsed() < deadline {
        if done() {
            return true;
        }
        sample(sim);
        if sim.step().is_err() {
            return false;
        }
    }
    done()
}

/// Runs the step: `crash(sim, i)` stops server `i`, `restart(sim, i)`
/// starts it again from its disk. Failures are returned.
pub fn check(
    sim: &mut turmoil::Sim, slots: &[Slot], crash: &mut dyn FnMut(&mut turmoil::Sim, usize),
    restart: &mut dyn FnMut(&mut turmoil::Sim, usize), sample: &mut dyn FnMut(&mut turmoil::Sim),
    stats: &mut RejoinStats,
) -> Vec<String> {
    let mut failures = Vec::new();
    let mut found = None;
    step_until(sim, Duration::from_secs(30), sample, || {
        found = leader(slots);
        found.is_some()
    });
    let Some((lead, _)) = found else {
        return vec!["rejoin: no ready leader before the step".into()];
    };
    let victim = (lead + 1) % slots.len();
    crash(sim, victim);
    let stopped = sim.elapsed();
    // Removed: the leader's committed membership no longer has it (whoever
    // leads by then).
    let removed = step_until(sim, Duration::from_secs(40), sample, || {
        leader(slots).is_some_and(|(_, s)| !committed(&s, victim).0)
    });
    if !removed {
        failures.push(format!(
            "rejoin: s{} stopped for 40 s was not removed by the leader",
            victim + 1
        ));
        restart(sim, victim);
        return failures;
    }
    stats.removed_after = Some(sim.elapsed() - stopped);
    // Autopilot's floor: nobody is dead before 10 s of silence.
    if sim.elapsed() - stopped < Duration::from_secs(10) {
        failures.push(format!(
            "rejoin: s{} removed {:?} after it stopped, under the dead bound",
            victim + 1,
            sim.elapsed() - stopped
        ));
    }
    let term = leader(slots).map(|(_, s)| s.cluster().metrics().current_term);
    restart(sim, victim);
    let restarted = sim.elapsed();
    let back = step_until(sim, Duration::from_secs(60), sample, || {
        leader(slots).is_some_and(|(_, s)| committed(&s, victim) == (true, true))
    });
    if !back {
        failures.push(format!(
            "rejoin: s{} restarted after its removal is not a voter again within 60 s",
            victim + 1
        ));
        return failures;
    }
    stats.voter_after = Some(sim.elapsed() - restarted);
    let now = leader(slots).map(|(_, s)| s.cluster().metrics().current_term);
    if now != term {
        failures.push(format!(
            "rejoin: s{}'s return changed the leader's term from {term:?} to {now:?}",
            victim + 1
        ));
    }
    failures
}
