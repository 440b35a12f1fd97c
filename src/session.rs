//! Session TTLs, enforced by the leader (as Consul's `session_ttl.go`).
//!
//! Timers are soft state on the leader: a session with a TTL is destroyed
//! (through Raft, so every server agrees) when it was not renewed for twice
//! its TTL. Renewals reset the timer without a Raft write. On every change
//! of leadership the new leader arms a fresh timer for every session with a
//! TTL, so a session outlives a leader change by at most one more 2×TTL.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::state::{Command, Timeable};

/// Consul's `SessionTTLMultiplier`: a session lives for twice its TTL.
pub const TTL_MULTIPLIER: u32 = 2;
/// How often the leader looks for expired sessions.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The leader's timers: session id → when it expires.
#[derive(Debug, Default)]
pub struct Timers {
    inner: parking_lot::Mutex<TimerState>,
}

#[derive(Debug, Default)]
struct TimerState {
    deadlines: HashMap<String, Instant>,
    /// Whether the timers were armed for the current term in office.
    in_office: bool,
}

impl Timers {
    fn lock(&self) -> parking_lot::MutexGuard<'_, TimerState> {
        self.inner.lock()
    }

    /// (Re)starts a session's timer: created or renewed at `now`.
    pub fn arm(&self, id: &str, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        self.lock()
            .deadlines
            .insert(id.to_string(), now + ttl * TTL_MULTIPLIER);
    }

    pub fn disarm(&self, id: &str) {
        self.lock().deadlines.remove(id);
    }

    pub fn step_down(&self) {
        let mut t = self.lock();
        t.deadlines.clear();
        t.in_office = false;
    }

    /// Takes office: a fresh timer for every session with a TTL (the old
    /// leader's renewals are unknown here).
    pub fn take_office(&self, sessions: impl Iterator<Item = (String, Duration)>, now: Instant) {
        let mut t = self.lock();
        t.deadlines.clear();
        for (id, ttl) in sessions.filter(|(_, ttl)| !ttl.is_zero()) {
            t.deadlines.insert(id, now + ttl * TTL_MULTIPLIER);
        }
        t.in_office = true;
    }

    pub fn in_office(&self) -> bool {
        self.lock().in_office
    }

    /// Sessions whose timer ran out, and timers of sessions that are gone
    /// (`known` says which still exist) dropped.
    pub fn expired(&self, now: Instant, known: impl Fn(&str) -> bool) -> Vec<String> {
        let mut t = self.lock();
        t.deadlines.retain(|id, _| known(id));
        let mut out: Vec<String> = t
            .deadlines
            .iter()
            .filter(|(_, d)| now >= **d)
            .map(|(id, _)| id.clone())
            .collect();
        out.sort();
        out
    }

    /// Whether `id`'s timer is still run out (a renewal may have come in).
    pub fn still_expired(&self, id: &str, now: Instant) -> bool {
        self.lock().deadlines.get(id).is_some_and(|d| now >= *d)
    }
}

/// Wraps a command that needs the time (lock-delay) with this server's
/// clock; see `state::session`.
pub fn timed(cmd: Timeable) -> Command {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Command::Timed { now_ms, cmd }
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
            [("a".to_string(), ttl), ("none".to_string(), Duration::ZERO)].into_iter(),
            t0,
        );
        assert!(t.in_office());
        assert!(t.expired(t0 + ttl, |_| true).is_empty());
        assert_eq!(t.expired(t0 + ttl * 2, |_| true), ["a"]);
        t.arm("a", ttl, t0 + ttl);
        assert!(t.expired(t0 + ttl * 2, |_| true).is_empty());
        assert!(!t.still_expired("a", t0 + ttl * 2));
        // A session that is gone loses its timer.
        assert!(t.expired(t0 + ttl * 5, |_| false).is_empty());
        t.step_down();
        assert!(!t.in_office());
    }
}
