//! Checker (e): locks. Lock clients take sessions, acquire and release a
//! few keys (now and then destroying a session while it holds a lock)
//! under the run's faults, and record when each believed it held a key.
//!
//! - Mutual exclusion: the intervals in which two different sessions
//!   believed they held the same key never overlap. A hold starts when an
//!   acquire answered `true` and ends when the client called release or
//!   destroy (it stops acting as the holder then).
//! - Lock-delay: a key whose holder was destroyed is not acquired by
//!   another session before the delay ran out. The leader stamps both
//!   commands with its clock (simulated time, as the clients'); a client
//!   sees only when it sent the destroy and when its acquire was answered,
//!   which bound the two stamps: an acquire answered sooner than the delay
//!   after the destroy was first sent broke it.
//! - A release by the holder never answers `false` while the holder's
//!   session is sure to live (no checks bind these sessions; a TTL
//!   session lives until its lease, below).
//!
//! Half the sessions have a TTL (`LOCK_TTL`): the client renews it and
//! believes in its locks only until its lease runs out, `LOCK_TTL` after
//! sending the last renewal the leader confirmed (the leader destroys a
//! session 2×TTL after the last renewal it took, so a client that keeps
//! to its lease never overlaps the next holder). Now and then a client
//! holding a lock goes silent: it stops renewing and never releases or
//! destroys, so the lock is freed only by the leader's TTL expiry, on
//! simulated time, through partitions, crashes and leader changes; once
//! the cluster is healed, every such session is destroyed (`await_expired`:
//! a leader that took office before applying a session created just
//! before would never arm its timer).
//!
//! An acquire without an answer may or may not have taken the lock: the
//! client then destroys its session (retrying until answered) so that any
//! such lock is released, and never counts it as held.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::endpoint::{Value, kv};
use cairn::structs::{Behavior, Session};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::node::{API_PORT, ApiReply, ApiRequest, Slot, call, calls, now_us};

pub const LOCK_KEYS: [&str; 2] = ["lock/x", "lock/y"];
/// Shorter than the KV clients' timeout: a lock client's last call (before
/// the heal) must end, and its session go, while the stream subscribers
/// still listen.
const LOCK_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Sessions' lock-delay: long enough that a client often runs into it.
pub const LOCK_DELAY_MS: u64 = 300;
/// A TTL session's TTL (below Consul's 10 s minimum, which the HTTP API
/// enforces, so that runs see many expire).
pub const LOCK_TTL: Duration = Duration::from_secs(1);
/// How long after its last confirmed renewal a client renews again.
const RENEW_AFTER: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockRecord {
    /// `session` believed it held `key` from `from` to `to` (simulated µs).
    Hold {
        key: String,
        session: String,
        from: u64,
        to: u64,
    },
    /// An acquire answered `true` by `session`: when it was sent and when
    /// answered (µs).
    Acquired {
        key: String,
        session: String,
        call: u64,
        answered: u64,
    },
    /// `session` destroyed while it held `key`: the first attempt's time,
    /// and when an attempt was answered.
    DestroyedHolding {
        key: String,
        session: String,
        first_now_ms: u64,
        acked: u64,
    },
    /// `session` went silent holding `key`: only its TTL's expiry frees it.
    Silent { key: String, session: String },
    /// A broken guarantee seen by the client itself.
    Broken(String),
}

pub type LockLog = Arc<Mutex<Vec<LockRecord>>>;

fn now_ms() -> u64 {
    now_us() / 1000
}

/// Asks `req` of the target server; its answer, or `None` (moving to
/// another server) when none came.
async fn ask(
    servers: &[IpAddr], target: &mut usize, rng: &mut StdRng, token: Option<&str>, req: &ApiRequest,
) -> Option<Result<Value, String>> {
    let addr = SocketAddr::new(servers[*target], API_PORT);
    match call(addr, req, token, LOCK_CALL_TIMEOUT).await {
        Ok(ApiReply::Call(r)) => Some(r),
        _ => {
            *target = rng.gen_range(0..servers.len());
            None
        }
    }
}

/// A lock or unlock's outcome: `Some(held)`, or `None` when unknown.
async fn lock(
    servers: &[IpAddr], target: &mut usize, rng: &mut StdRng, token: Option<&str>, key: &str,
    session: &str, acquire: bool,
) -> Option<bool> {
    match ask(
        servers,
        target,
        rng,
        token,
        &calls::lock(key, session, acquire),
    )
    .await
    {
        Some(Ok(Value::Kv(kv::Value::Done(ok)))) => Some(ok),
        _ => None,
    }
}

/// Destroys `session`, retrying until a server answers; returns the first
/// attempt's time and when it was answered.
async fn destroy(
    servers: &[IpAddr], target: &mut usize, rng: &mut StdRng, token: Option<&str>, session: &str,
) -> (u64, u64) {
    let first = now_ms();
    let req = calls::destroy_session(session);
    loop {
        if let Some(Ok(_)) = ask(servers, target, rng, token, &req).await {
            return (first, now_us());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One lock client until `until` (and then until its last session is gone).
pub async fn client(
    id: u64, seed: u64, servers: Vec<IpAddr>, until: Duration, log: LockLog,
    access: crate::acl::Access,
) -> turmoil::Result {
    let token = access.workload().await;
    let token = token.as_deref();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x10C4 ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut target = rng.gen_range(0..servers.len());
    let record = |r: LockRecord| log.lock().unwrap().push(r);
    let mut n = 0u64;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        n += 1;
        let session = format!("l{id}-{n}");
        let with_ttl = rng.gen_bool(0.5);
        let create = calls::create_session(Session {
            id: session.clone(),
            name: String::new(),
            // The server asked's own node, as the HTTP API defaults it.
            node: String::new(),
            node_checks: vec![],
            service_checks: vec![],
            lock_delay: LOCK_DELAY_MS * 1_000_000,
            behavior: Behavior::Release,
            ttl: if with_ttl {
                format!("{}s", LOCK_TTL.as_secs())
            } else {
                String::new()
            },
            create_index: 0,
            modify_index: 0,
        });
        // Retried with the same ID: an earlier attempt may have committed.
        loop {
            match ask(&servers, &mut target, &mut rng, token, &create).await {
                Some(Ok(_)) => break,
                Some(Err(r)) if r.contains("already exists") => break,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        // Until when the session is sure to live (µs): forever without a
        // TTL; with one, only a confirmed renewal starts a lease.
        let mut lease = Lease {
            until: if with_ttl { 0 } else { u64::MAX },
            renewed: 0,
        };
        let mut silent = false;
        for _ in 0..rng.gen_range(1..6) {
            if with_ttl {
                lease
                    .renew(&servers, &mut target, &mut rng, token, &session)
                    .await;
                if now_us() >= lease.until {
                    // Cannot vouch for the session: leave it.
                    break;
                }
            }
            let key = LOCK_KEYS[rng.gen_range(0..LOCK_KEYS.len())];
            let call_at = now_us();
            match lock(&servers, &mut target, &mut rng, token, key, &session, true).await {
                Some(true) => {}
                Some(false) => {
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(10..100))).await;
                    continue;
                }
                // Unknown: maybe held. Destroyed below, never counted as held.
                _ => break,
            }
            let from = now_us();
            if from >= lease.until {
                // Held by a session that may be gone already: not counted;
                // destroyed below.
                break;
            }
            record(LockRecord::Acquired {
                key: key.into(),
                session: session.clone(),
                call: call_at,
                answered: from,
            });
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..150))).await;
            if with_ttl && rng.gen_bool(0.25) {
                // Goes silent: believes in the lock until its lease ends,
                // then stops; only the TTL's expiry frees the lock.
                let until = lease.until;
                let now = now_us();
                if until > now {
                    tokio::time::sleep(Duration::from_micros(until - now)).await;
                }
                record(LockRecord::Hold {
                    key: key.into(),
                    session: session.clone(),
                    from,
                    to: until,
                });
                record(LockRecord::Silent {
                    key: key.into(),
                    session: session.clone(),
                });
                silent = true;
                break;
            }
            if rng.gen_bool(0.2) {
                let to = now_us().min(lease.until);
                let (first_now_ms, acked) =
                    destroy(&servers, &mut target, &mut rng, token, &session).await;
                record(LockRecord::Hold {
                    key: key.into(),
                    session: session.clone(),
                    from,
                    to,
                });
                record(LockRecord::DestroyedHolding {
                    key: key.into(),
                    session: session.clone(),
                    first_now_ms,
                    acked,
                });
                break;
            }
            let to = now_us().min(lease.until);
            record(LockRecord::Hold {
                key: key.into(),
                session: session.clone(),
                from,
                to,
            });
            match lock(&servers, &mut target, &mut rng, token, key, &session, false).await {
                // The session may have expired if the answer came after
                // its lease.
                Some(false) if now_us() < lease.until => record(LockRecord::Broken(format!(
                    "release of {key} by its holder {session} answered false"
                ))),
                Some(_) => {}
                // Unknown: the session goes, which releases it for sure.
                None => break,
            }
        }
        if !silent {
            // Gone for sure (a no-op when already destroyed).
            destroy(&servers, &mut target, &mut rng, token, &session).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..50))).await;
    }
    Ok(())
}

/// A TTL session's lease as its client sees it.
struct Lease {
    /// The session surely lives until then (µs of simulated time).
    until: u64,
    /// When the last confirmed renewal was sent.
    renewed: u64,
}

impl Lease {
    /// Renews (one try) if the last confirmed renewal is older than
    /// `RENEW_AFTER`: the lease then runs `LOCK_TTL` from the send time.
    async fn renew(
        &mut self, servers: &[IpAddr], target: &mut usize, rng: &mut StdRng, token: Option<&str>,
        session: &str,
    ) {
        let sent = now_us();
        if self.until > 0 && sent < self.renewed + RENEW_AFTER.as_micros() as u64 {
            return;
        }
        let addr = SocketAddr::new(servers[*target], API_PORT);
        let req = ApiRequest::Renew { id: session.into() };
        match call(addr, &req, token, LOCK_CALL_TIMEOUT).await {
            Ok(ApiReply::Write(Ok(_))) => {
                self.renewed = sent;
                self.until = self.until.max(sent + LOCK_TTL.as_micros() as u64);
            }
            _ => *target = rng.gen_range(0..servers.len()),
        }
    }
}

/// How many locks were freed by a TTL's expiry: a silent holder's key
/// acquired later by another session (the log is in the order the clients
/// recorded).
pub fn ttl_handoffs(log: &[LockRecord]) -> usize {
    let mut waiting: Vec<(&str, &str)> = Vec::new();
    let mut n = 0;
    for r in log {
        match r {
            LockRecord::Silent { key, session } => waiting.push((key, session)),
            LockRecord::Acquired { key, session, .. } => {
                let before = waiting.len();
                waiting.retain(|(k, s)| !(k == key && s != session));
                n += before - waiting.len();
            }
            _ => {}
        }
    }
    n
}

/// Steps the healed cluster until no server holds a session whose client
/// went silent (the leader's TTL expiry destroyed each, whatever leader
/// changes came between its creation and its silence), or `limit` passes:
/// a failure names each session left.
pub fn await_expired(
    sim: &mut turmoil::Sim, slots: &[Slot], log: &[LockRecord], limit: Duration,
) -> Vec<String> {
    let silent: Vec<&str> = log
        .iter()
        .filter_map(|r| match r {
            LockRecord::Silent { session, .. } => Some(session.as_str()),
            _ => None,
        })
        .collect();
    let deadline = sim.elapsed() + limit;
    loop {
        let left: Vec<&str> = silent
            .iter()
            .copied()
            .filter(|id| {
                slots.iter().any(|s| {
                    s.lock()
                        .unwrap()
                        .as_ref()
                        .is_some_and(|s| s.state().sessions.contains_key(*id))
                })
            })
            .collect();
        if left.is_empty() {
            return Vec::new();
        }
        if sim.elapsed() >= deadline || sim.step().is_err() {
            return left
                .iter()
                .map(|id| {
                    format!(
                        "session {id} went silent holding a lock and was not destroyed by its TTL within {limit:?} of the heal"
                    )
                })
                .collect();
        }
    }
}

/// Checks a run's lock log; returns what broke.
pub fn check(log: &[LockRecord]) -> Vec<String> {
    let mut failures = Vec::new();
    let holds: Vec<(&str, &str, u64, u64)> = log
        .iter()
        .filter_map(|r| match r {
            LockRecord::Hold {
                key,
                session,
                from,
                to,
            } => Some((key.as_str(), session.as_str(), *from, *to)),
            _ => None,
        })
        .collect();
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if a.0 == b.0 && a.1 != b.1 && a.2 < b.3 && b.2 < a.3 {
                failures.push(format!(
                    "lock {} held by {} ({}..{} us) and {} ({}..{} us) at once",
                    a.0, a.1, a.2, a.3, b.1, b.2, b.3
                ));
            }
        }
    }
    for r in log {
        let LockRecord::DestroyedHolding {
            key,
            session,
            first_now_ms,
            acked,
        } = r
        else {
            continue;
        };
        for a in log {
            // The acquire's stamp is at most its answer's time, the
            // destroy's at least its first send's.
            if let LockRecord::Acquired {
                key: k,
                session: s,
                call,
                answered,
            } = a
                && k == key
                && s != session
                && *call > *acked
                && answered / 1000 < first_now_ms + LOCK_DELAY_MS
            {
                failures.push(format!(
                    "{s} acquired {key}, answered at {} ms, within the lock-delay of {session} destroyed at {first_now_ms} ms",
                    answered / 1000
                ));
            }
        }
    }
    failures.extend(log.iter().filter_map(|r| match r {
        LockRecord::Broken(m) => Some(m.clone()),
        _ => None,
    }));
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(key: &str, session: &str, from: u64, to: u64) -> LockRecord {
        LockRecord::Hold {
            key: key.into(),
            session: session.into(),
            from,
            to,
        }
    }

    #[test]
    fn overlapping_holds_and_an_early_acquire_are_caught() {
        assert!(
            check(&[
                hold("k", "a", 0, 10),
                hold("k", "b", 11, 20),
                hold("j", "c", 5, 15)
            ])
            .is_empty()
        );
        assert_eq!(
            check(&[hold("k", "a", 0, 10), hold("k", "b", 9, 20)]).len(),
            1
        );
        let destroyed = LockRecord::DestroyedHolding {
            key: "k".into(),
            session: "a".into(),
            first_now_ms: 100,
            acked: 100_500,
        };
        let early = LockRecord::Acquired {
            key: "k".into(),
            session: "b".into(),
            call: 100_600,
            answered: 399_999,
        };
        let late = LockRecord::Acquired {
            key: "k".into(),
            session: "b".into(),
            call: 100_600,
            answered: 400_000,
        };
        assert_eq!(check(&[destroyed.clone(), early]).len(), 1);
        assert!(check(&[destroyed, late]).is_empty());
    }
}
