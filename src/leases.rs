//! The leader's leases on agent nodes (node → last heartbeat): soft state
//! that a heartbeat renews (`crate::http::liveness`) and the leader's
//! reaper reads (`crate::leader::liveness`). A new leader seeds them from
//! the catalog; `leader::revoke` empties them.

use std::collections::HashMap;
use std::time::Duration;
// tokio's clock, which the simulation drives.
use tokio::time::Instant;

/// The leader's leases: node → last heartbeat.
#[derive(Debug, Default)]
pub struct Leases {
    inner: parking_lot::Mutex<LeaseState>,
}

#[derive(Debug, Default)]
struct LeaseState {
    seen: HashMap<String, Instant>,
    /// Whether the leases were seeded for the current term in office.
    in_office: bool,
}

impl Leases {
    fn lock(&self) -> parking_lot::MutexGuard<'_, LeaseState> {
        self.inner.lock()
    }

    pub fn renew(&self, node: &str, now: Instant) {
        self.lock().seen.insert(node.to_string(), now);
    }

    pub fn forget(&self, node: &str) {
        self.lock().seen.remove(node);
    }

    pub fn len(&self) -> usize {
        self.lock().seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Leases held by nodes other than `servers` (servers' own agents hold
    /// leases too, and are already counted as servers).
    pub fn len_except(&self, servers: &[String]) -> usize {
        self.lock()
            .seen
            .keys()
            .filter(|n| !servers.contains(n))
            .count()
    }

    /// Not the leader: leases mean nothing until the next term in office.
    pub fn step_down(&self) {
        let mut l = self.lock();
        l.seen.clear();
        l.in_office = false;
    }

    /// Gives every live agent node without a lease a fresh one (a grace of
    /// one lease), and takes office.
    pub fn seed(&self, live: impl Iterator<Item = String>, now: Instant) {
        let mut l = self.lock();
        for n in live {
            l.seen.entry(n).or_insert(now);
        }
        l.in_office = true;
    }

    pub fn in_office(&self) -> bool {
        self.lock().in_office
    }

    /// Nodes whose lease is older than `ttl`.
    pub fn expired(&self, now: Instant, ttl: Duration) -> Vec<String> {
        let l = self.lock();
        let mut out: Vec<String> = l
            .seen
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) > ttl)
            .map(|(n, _)| n.clone())
            .collect();
        out.sort();
        out
    }

    /// Whether `node`'s lease is still older than `ttl` (re-checked just
    /// before marking it, as a heartbeat may have come in meanwhile).
    pub fn still_expired(&self, node: &str, now: Instant, ttl: Duration) -> bool {
        self.lock()
            .seen
            .get(node)
            .is_some_and(|t| now.saturating_duration_since(*t) > ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE_TTL: Duration = Duration::from_secs(8);

    #[test]
    fn leases_expire_and_seed_once_per_term() {
        let l = Leases::default();
        let t0 = Instant::now();
        l.renew("a", t0);
        assert!(!l.in_office());
        l.seed(
            ["a".to_string(), "b".to_string()].into_iter(),
            t0 + LEASE_TTL,
        );
        assert!(l.in_office());
        let later = t0 + LEASE_TTL + Duration::from_millis(1);
        assert_eq!(l.expired(later, LEASE_TTL), ["a"]);
        l.renew("a", later);
        assert!(l.expired(later, LEASE_TTL).is_empty());
        assert!(!l.still_expired("a", later, LEASE_TTL));
        l.step_down();
        assert!(l.is_empty() && !l.in_office());
    }

    #[test]
    fn servers_leases_are_not_counted_twice() {
        let l = Leases::default();
        let now = Instant::now();
        for n in ["s1", "a1", "a2"] {
            l.renew(n, now);
        }
        let servers = ["s1".to_string(), "s2".to_string()];
        assert_eq!(l.len_except(&servers), 2);
    }
}
