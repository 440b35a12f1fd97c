//! Checker (h): the leader's duties (`cairn::leader`) run on the leader
//! only. Sampled during the run, no two servers may run them for the same
//! term (the leader module's `establish` follows Raft's leadership, which
//! gives a term one leader at most). Once the healed cluster has settled,
//! exactly one server runs them, the leader, for the term it leads: every
//! deposed leader has stopped its own (`revoke`). And a server runs a
//! term's duties only once it has applied an entry of that term (Consul's
//! barrier before `establishLeadership`): before it, its state may lack
//! entries the previous leader committed (a TTL session its expiry would
//! never arm).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cairn::server::Server;

use crate::node::Slot;

/// What the checker saw.
#[derive(Debug, Default)]
pub struct DutyStats {
    /// Terms whose duties were seen running (each a leadership change that
    /// established them).
    pub terms: BTreeSet<u64>,
    pub failures: Vec<String>,
}

impl DutyStats {
    /// One sample of every running server.
    pub fn sample(&mut self, at_ms: u64, slots: &[Slot]) {
        let mut by_term: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, slot) in slots.iter().enumerate() {
            let slot = slot.lock().unwrap();
            let Some(s) = slot.as_ref() else { continue };
            let Some(term) = s.duties().get() else {
                continue;
            };
            by_term.entry(term).or_default().push(i + 1);
            let applied = s
                .cluster()
                .metrics()
                .last_applied
                .as_ref()
                .map(|l| l.leader_id.term);
            if applied.is_none_or(|t| t < term) {
                let msg = format!(
                    "server {} runs term {term}'s duties having applied no entry of it (last applied: term {applied:?})",
                    i + 1
                );
                if !self.failures.iter().any(|f| f.ends_with(&msg)) {
                    self.failures.push(format!("{at_ms} ms: {msg}"));
                }
            }
        }
        for (term, servers) in by_term {
            self.terms.insert(term);
            if servers.len() > 1 {
                let msg = format!("{at_ms} ms: servers {servers:?} all run term {term}'s duties");
                if !self.failures.contains(&msg) {
                    self.failures.push(msg);
                }
            }
        }
    }
}

/// Each server's (term it leads, term whose duties it runs).
fn offices(servers: &[Arc<Server>]) -> Vec<(Option<u64>, Option<u64>)> {
    servers
        .iter()
        .map(|s| (s.cluster().leading_term(), s.duties().get()))
        .collect()
}

/// Whether exactly one server runs the duties, and it leads in their term.
fn settled(offices: &[(Option<u64>, Option<u64>)]) -> bool {
    let running: Vec<_> = offices.iter().filter(|(_, d)| d.is_some()).collect();
    running.len() == 1 && offices.iter().all(|(lead, duties)| lead == duties)
}

/// Steps the settled cluster until its duties are where its leader is, or
/// `limit` passes: a failure names what each server leads and runs.
pub fn check_settled(sim: &mut turmoil::Sim, slots: &[Slot], limit: Duration) -> Option<String> {
    let deadline = sim.elapsed() + limit;
    loop {
        let servers: Vec<Arc<Server>> = slots
            .iter()
            .filter_map(|s| s.lock().unwrap().clone())
            .collect();
        let now = offices(&servers);
        if settled(&now) {
            return None;
        }
        if sim.elapsed() >= deadline || sim.step().is_err() {
            return Some(format!(
                "leader duties not on the leader alone once settled: \
                 (leading term, duties' term) per server {now:?}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_leader_running_its_terms_duties_is_settled() {
        assert!(settled(&[(Some(3), Some(3)), (None, None), (None, None)]));
        // A deposed leader still running its old term's duties.
        assert!(!settled(&[
            (Some(3), Some(3)),
            (None, Some(2)),
            (None, None)
        ]));
        // The leader not (yet) running them.
        assert!(!settled(&[(Some(3), None), (None, None)]));
        // Nobody leads.
        assert!(!settled(&[(None, None), (None, None)]));
    }
}
