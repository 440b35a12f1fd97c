//! Session TTLs, enforced by the leader (as Consul's `session_ttl.go`).
//!
//! Timers are soft state on the leader: a session with a TTL is destroyed
//! (through Raft, so every server agrees) when it was not renewed for twice
//! its TTL. Renewals reset the timer without a Raft write. On every change
//! of leadership the new leader arms a fresh timer for every session with a
//! TTL, so a session outlives a leader change by at most one more 2×TTL.
//!
//! A renewal resets the timer only once the leader confirmed it with a
//! quorum (a leader cut off must not keep a session alive), and none is
//! taken once a session's timer ran out: its destroy is under way. The
//! destroys are `leader::session_expiry`'s. `Timers::timed` stamps a
//! command with the server's clock: the wall clock, or simulated time in
//! the simulation.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

// tokio's clock, not std's: the simulation runs these timers on simulated
// time (in production the two are the same clock).
use tokio::time::Instant;

use crate::state::{Command, Timeable};

/// Consul's `SessionTTLMultiplier`: a session lives for twice its TTL.
pub const TTL_MULTIPLIER: u32 = 2;
/// How often the leader looks for expired sessions.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// Milliseconds since the Unix epoch, as the time a command carries
/// (`Command::Timed`). Servers read the wall clock; the simulation passes
/// its simulated time, the same clock its lock clients stamp with.
pub type Clock = fn() -> u64;

pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The leader's timers: session id → when it expires; and the clock that
/// stamps the commands needing the time.
#[derive(Debug)]
pub struct Timers {
    inner: parking_lot::Mutex<TimerState>,
    clock: Clock,
}

impl Default for Timers {
    fn default() -> Self {
        Timers::new(wall_clock_ms)
    }
}

#[derive(Debug, Default)]
struct TimerState {
    deadlines: HashMap<String, Instant>,
    /// Sessions whose timer ran out and whose destroy is under way: no
    /// renewal is taken for them any more (one confirmed between the
    /// decision and the destroy's commit would promise the client a lease
    /// the destroy then breaks).
    expiring: BTreeSet<String>,
    /// The term the timers were armed for. A leader deposed and elected
    /// again between two of its ticks must arm afresh: renewals confirmed
    /// by the leader in between are unknown to it.
    office_term: Option<u64>,
}

impl Timers {
    pub fn new(clock: Clock) -> Timers {
        Timers {
            inner: Default::default(),
            clock,
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, TimerState> {
        self.inner.lock()
    }

    /// Wraps a command that needs the time (lock-delay) with this server's
    /// clock; see `state::session`.
    pub fn timed(&self, cmd: Timeable) -> Command {
        Command::Timed {
            now_ms: (self.clock)(),
            cmd,
        }
    }

    /// (Re)starts a session's timer: created or renewed at `now`. False
    /// if the session is being destroyed for its TTL.
    pub fn arm(&self, id: &str, ttl: Duration, now: Instant) -> bool {
        let mut t = self.lock();
        if t.expiring.contains(id) {
            return false;
        }
        if !ttl.is_zero() {
            t.deadlines
                .insert(id.to_string(), now + ttl * TTL_MULTIPLIER);
        }
        true
    }

    /// The session is gone: its timer goes.
    pub fn disarm(&self, id: &str) {
        let mut t = self.lock();
        t.deadlines.remove(id);
        t.expiring.remove(id);
    }

    pub fn step_down(&self) {
        let mut t = self.lock();
        t.deadlines.clear();
        t.expiring.clear();
        t.office_term = None;
    }

    /// Takes office for `term`: a fresh timer for every session with a TTL
    /// (the old leader's renewals are unknown here).
    pub fn take_office(
        &self, term: u64, sessions: impl Iterator<Item = (String, Duration)>, now: Instant,
    ) {
        let mut t = self.lock();
        t.deadlines.clear();
        t.expiring.clear();
        for (id, ttl) in sessions.filter(|(_, ttl)| !ttl.is_zero()) {
            t.deadlines.insert(id, now + ttl * TTL_MULTIPLIER);
        }
        t.office_term = Some(term);
    }

    /// Whether the timers were armed for `term`.
    pub fn in_office(&self, term: u64) -> bool {
        self.lock().office_term == Some(term)
    }

    /// Sessions to destroy: those whose timer ran out now (from here on
    /// no renewal is taken for them) and those still being destroyed.
    /// Timers of sessions that are gone (`known` says which still exist)
    /// are dropped.
    pub fn expired(&self, now: Instant, known: impl Fn(&str) -> bool) -> Vec<String> {
        let t = &mut *self.lock();
        t.deadlines.retain(|id, _| known(id));
        t.expiring.retain(|id| known(id));
        let (deadlines, expiring) = (&mut t.deadlines, &mut t.expiring);
        deadlines.retain(|id, d| {
            if now >= *d {
                expiring.insert(id.clone());
                return false;
            }
            true
        });
        expiring.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_run_for_twice_the_ttl_and_renewal_resets_them() {
        let t = Timers::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        t.take_office(
            3,
            [("a".to_string(), ttl), ("none".to_string(), Duration::ZERO)].into_iter(),
            t0,
        );
        assert!(t.in_office(3));
        // Elected again in a later term: the timers are armed afresh.
        assert!(!t.in_office(4));
        assert!(t.expired(t0 + ttl, |_| true).is_empty());
        assert_eq!(t.expired(t0 + ttl * 2, |_| true), ["a"]);
        // Once it ran out, no renewal saves it: its destroy is under way.
        assert!(!t.arm("a", ttl, t0 + ttl * 2));
        assert_eq!(t.expired(t0 + ttl * 2, |_| true), ["a"]);
        t.disarm("a");
        assert!(t.arm("a", ttl, t0 + ttl));
        assert!(t.expired(t0 + ttl * 2, |_| true).is_empty());
        // A session that is gone loses its timer.
        assert!(t.expired(t0 + ttl * 5, |_| false).is_empty());
        t.step_down();
        assert!(!t.in_office(3));
    }
}
