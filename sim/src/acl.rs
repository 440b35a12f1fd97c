//! ACLs in the simulation, on a quarter of the seeds (`acl_seed`): the
//! servers run with ACLs on, default deny and `MANAGEMENT` as the initial
//! management token, and every simulated client carries a token.
//!
//! - `admin`: with the management token, creates through Raft (as any
//!   write, through the API) the workload's policy and two tokens holding
//!   it: the one every other client carries, and a second, "doomed" one;
//!   and the event-stream subscribers' token, which reads every key but a
//!   few (`SUBSCRIBER_RULES`): checker (d) holds every event they receive
//!   to it; and the servers' DNS token with the catalog entries checker
//!   (g) asks for (`dns`). Mid-run (during the faults) it deletes the
//!   doomed token, then narrows the DNS token's policy. On a third of the
//!   ACL seeds the doomed token is a login's (`AuthMethod` set, made as a
//!   login makes it) and goes with its auth method's delete instead: a
//!   method's delete must end its tokens from its apply, as a token's own
//!   delete does. On another third it is a login's with an
//!   `ExpirationTime` at that moment, and nothing deletes it but the
//!   leader's reaping (`leader::token_expiry`): every server must refuse
//!   it from its expiry (all judge it by the one simulated clock), `?stale`
//!   reads too, and the reaping must delete it.
//! - `user`: uses the doomed token, before and after its delete, on random
//!   servers: writes and default and `?consistent` reads (checked by the
//!   leader) and `?stale` reads (checked by the server asked); now and then
//!   the same without a token (the anonymous token).
//! - `check` (checker f), from outside, by when each request was sent: no
//!   request sent after the doomed token's delete was acknowledged was
//!   accepted, but for a `?stale` read sent to a server that had not yet
//!   applied the delete (the time every server's apply recorded), which
//!   may still accept it, as in Consul. No anonymous request is ever
//!   accepted. And the check means something: the token was accepted
//!   before its delete, and refused after it was acknowledged. The
//!   servers' endpoint layer routes these requests and checks their
//!   tokens (`cairn::endpoint`): a forwarding or token-check bug there is
//!   this checker's to catch.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::endpoint::acl::Deleted;
use cairn::structs::acl::{AclPolicy, AclToken, Link, secret_hash};
use cairn::structs::auth::AclAuthMethod;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use crate::node::MANAGEMENT;
use crate::node::{API_PORT, ApiReply, ApiRequest, Committed, call, calls, now_us};

/// What the workload's clients do: KV, catalog, sessions and their locks,
/// and the federation scenario's prepared query.
pub const WORKLOAD_RULES: &str = r#"
key_prefix "" { policy = "write" }
node_prefix "" { policy = "write" }
service_prefix "" { policy = "write" }
session_prefix "" { policy = "write" }
query_prefix "" { policy = "write" }
"#;

const POLICY_ID: &str = "5e1f0000-0000-4000-8000-0000000000b0";
const POLICY_NAME: &str = "sim-workload";

/// What the event-stream subscribers' token may read: every key (so the
/// KV topic from the root is theirs) but part of the workload's, the
/// bursts' large values and one lock key.
pub const SUBSCRIBER_RULES: &str = r#"
key_prefix "" { policy = "read" }
key_prefix "k/c" { policy = "deny" }
key_prefix "big/" { policy = "deny" }
key "lock/y" { policy = "deny" }
"#;

const SUBSCRIBER_POLICY_ID: &str = "5e1f0000-0000-4000-8000-0000000000b1";
const SUBSCRIBER_POLICY_NAME: &str = "sim-subscriber";

/// `SUBSCRIBER_RULES` written out by hand (not through cairn's rules code,
/// which is under test): the keys whose events a subscriber may receive.
pub fn subscriber_may_read(key: &str) -> bool {
    !(key.starts_with("k/c") || key.starts_with("big/") || key == "lock/y")
}

/// Keys the doomed token's user writes (apart from the workload's, which
/// the linearizability checker owns).
const USER_KEYS: [&str; 2] = ["acl/a", "acl/b"];

/// The admin's and the user's timeout: short, so that a request stuck
/// behind a fault (a crashed or cut-off server) does not keep them from
/// asking again: the delete must be acknowledged, and the token used
/// after it, before the run ends.
const SHORT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the user goes on after the workload (and the admin's retries
/// of the delete) end: the faults have healed by then, so every server
/// applies the delete and refuses the token.
pub const USER_AFTER: Duration = Duration::from_secs(3);

/// ACLs on for a quarter of the seeds (seed 7, the determinism test's,
/// among them).
pub fn acl_seed(seed: u64) -> bool {
    seed % 4 == 3
}

/// How the doomed token ends, drawn from the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Doom {
    /// Its own delete.
    #[default]
    Deleted,
    /// A login's (through `LOGIN_METHOD`), deleted with its auth method.
    MethodDeleted,
    /// A login's, expiring; deleted only by the leader's reaping.
    Expires,
}

/// The tokens of one ACL run: secrets and accessors drawn from the seed.
#[derive(Debug)]
pub struct Tokens {
    pub workload: String,
    pub workload_accessor: String,
    pub doomed: String,
    pub doomed_accessor: String,
    /// The event-stream subscribers' (`SUBSCRIBER_RULES`).
    pub subscriber: String,
    pub subscriber_accessor: String,
    /// The servers' DNS token (`dns::DNS_RULES`).
    pub dns: String,
    pub dns_accessor: String,
    /// The mesh's proxies' (`mesh::GATEWAY_RULES`, `mesh::SIDECAR_RULES`).
    pub gateway: String,
    pub gateway_accessor: String,
    pub sidecar: String,
    pub sidecar_accessor: String,
    /// How the doomed token ends.
    pub doom: Doom,
    /// Set once the admin has created both tokens.
    ready: AtomicBool,
}

fn uuid_of(seed: u64, n: u64) -> String {
    format!("{:08x}-5157-4000-8000-{n:012x}", seed as u32)
}

/// What a client carries: nothing with ACLs off, else the run's tokens.
#[derive(Debug, Clone, Default)]
pub struct Access(Option<Arc<Tokens>>);

impl Access {
    pub fn new(seed: u64, on: bool) -> Self {
        Access(on.then(|| {
            Arc::new(Tokens {
                workload: uuid_of(seed, 1),
                workload_accessor: uuid_of(seed, 2),
                doomed: uuid_of(seed, 3),
                doomed_accessor: uuid_of(seed, 4),
                subscriber: uuid_of(seed, 5),
                subscriber_accessor: uuid_of(seed, 6),
                dns: uuid_of(seed, 7),
                dns_accessor: uuid_of(seed, 8),
                gateway: uuid_of(seed, 9),
                gateway_accessor: uuid_of(seed, 10),
                sidecar: uuid_of(seed, 11),
                sidecar_accessor: uuid_of(seed, 12),
                doom: match (seed / 4) % 3 {
                    0 => Doom::Deleted,
                    1 => Doom::MethodDeleted,
                    _ => Doom::Expires,
                },
                ready: AtomicBool::new(false),
            })
        }))
    }

    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    pub fn tokens(&self) -> Option<&Arc<Tokens>> {
        self.0.as_ref()
    }

    /// The token the workload's clients send: none with ACLs off; else
    /// the workload token, once the admin has created it (a client waits
    /// for it: a refused operation tells the history checkers nothing).
    pub async fn workload(&self) -> Option<String> {
        let t = self.0.as_ref()?;
        while !t.ready.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Some(t.workload.clone())
    }

    /// The event-stream subscribers' token (as `workload`, once created).
    pub async fn subscriber(&self) -> Option<String> {
        self.workload().await?;
        self.0.as_ref().map(|t| t.subscriber.clone())
    }
}

/// One request of the doomed token's user, as it saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenUse {
    /// Sent without a token (the anonymous token).
    pub anonymous: bool,
    /// Which server the user asked.
    pub asked: usize,
    pub call: u64,
    pub ret: u64,
    /// A `?stale` read (answered by the server asked, from its state).
    pub stale: bool,
    /// The answer was a success (the request was acknowledged).
    pub acked: bool,
    /// The answer was an ACL refusal (`ACL not found`, `Permission denied`).
    pub refused: bool,
}

/// What the admin and the user did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AclRecord {
    /// When both tokens were acknowledged.
    pub created: Option<u64>,
    /// When the doomed token's delete was acknowledged.
    pub deleted: Option<u64>,
    pub uses: Vec<TokenUse>,
    /// Admin writes the servers refused (none expected).
    pub errors: Vec<String>,
}

pub type AclLog = Arc<Mutex<AclRecord>>;

/// What checker (f) saw in one run.
#[derive(Debug, Clone, Default)]
pub struct AclStats {
    /// The index whose apply removed the doomed token.
    pub delete_index: u64,
    /// How it ended: deleted, with its auth method, or expired.
    pub doom: Doom,
    /// Requests with the doomed token accepted, sent before its delete was
    /// acknowledged.
    pub accepted_before: usize,
    /// Requests with the doomed token refused, sent after its delete was
    /// acknowledged.
    pub refused_after: usize,
    /// Anonymous requests refused.
    pub anonymous_refused: usize,
    pub failures: Vec<String>,
}

/// Sends `req` with the management token until it is acknowledged (or
/// `until` passes), moving to the next server after each failure. A
/// create refused as made already was made by an earlier attempt whose
/// answer was lost.
pub(crate) async fn until_acked(
    servers: &[IpAddr], req: ApiRequest, until: Duration, log: &AclLog,
) -> bool {
    let mut target = 0;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        let addr = SocketAddr::new(servers[target], API_PORT);
        match call(addr, &req, Some(MANAGEMENT), SHORT_TIMEOUT).await {
            Ok(ApiReply::Call(Ok(_))) => return true,
            Ok(ApiReply::Call(Err(e)))
                if e.contains("already in use") || e.contains("already exists") =>
            {
                return true;
            }
            Ok(ApiReply::Call(Err(e))) if e.contains("Invalid") || e.contains("annot find") => {
                // Refused for good: the run's own setup is wrong.
                log.lock().unwrap().errors.push(format!("{req:?}: {e}"));
                return false;
            }
            // No leader, a timeout, or ACL init not applied yet.
            other => {
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!("{} ms: admin: {other:?}", now_us() / 1000);
                }
                target = (target + 1) % servers.len();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The auth method whose login made the doomed token on half the seeds.
const LOGIN_METHOD: &str = "sim-login";

/// A `jwt` method with one static key (no login runs through it here:
/// only its delete matters).
fn login_method() -> AclAuthMethod {
    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----";
    let config = serde_json::json!({"JWTValidationPubKeys": [KEY]});
    AclAuthMethod {
        name: LOGIN_METHOD.into(),
        kind: "jwt".into(),
        config: config.as_object().cloned().unwrap_or_default(),
        ..Default::default()
    }
}

fn token(accessor: &str, secret: &str, description: &str) -> AclToken {
    token_of(accessor, secret, description, POLICY_ID, POLICY_NAME)
}

pub(crate) fn token_of(
    accessor: &str, secret: &str, description: &str, id: &str, name: &str,
) -> AclToken {
    AclToken {
        accessor_id: accessor.into(),
        description: description.into(),
        policies: vec![Link {
            id: id.into(),
            name: name.into(),
        }],
        secret_hash: secret_hash(secret),
        ..Default::default()
    }
}

/// The admin client: creates the policy and both tokens, then at
/// `delete_at` deletes the doomed one (retried until acknowledged, at the
/// latest by `until`).
/// What else the admin writes, with the other tokens, and the update it
/// makes after the delete: handed in, so that this module knows nothing of
/// the checkers they serve (the DNS checker's `dns::setup` and
/// `dns::narrow`; the federation scenario's replicated policy).
pub type ExtraWrites = fn(&Tokens) -> (Vec<ApiRequest>, ApiRequest);

pub async fn admin(
    access: Access, servers: Vec<IpAddr>, delete_at: Duration, until: Duration, log: AclLog,
    dns: ExtraWrites,
) -> turmoil::Result {
    let Some(t) = access.tokens().cloned() else {
        return Ok(());
    };
    let (dns_setup, dns_narrow) = dns(&t);
    let policy = AclPolicy {
        id: POLICY_ID.into(),
        name: POLICY_NAME.into(),
        rules: WORKLOAD_RULES.into(),
        ..Default::default()
    };
    let mut doomed = token(&t.doomed_accessor, &t.doomed, "doomed");
    let mut method = Vec::new();
    if t.doom != Doom::Deleted {
        doomed.auth_method = LOGIN_METHOD.into();
        method.push(calls::new_auth_method(login_method()));
    }
    let delete = match t.doom {
        Doom::Deleted => Some(calls::acl_delete(Deleted::Token(t.doomed_accessor.clone()))),
        Doom::MethodDeleted => Some(calls::acl_delete(Deleted::AuthMethod(LOGIN_METHOD.into()))),
        Doom::Expires => {
            // The simulated clock is the Unix epoch plus the run's time.
            let at = time::OffsetDateTime::UNIX_EPOCH
                + time::Duration::milliseconds(delete_at.as_millis() as i64);
            doomed.expiration_time = at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            None
        }
    };
    let writes = [
        calls::new_policy(policy),
        calls::new_token(token(&t.workload_accessor, &t.workload, "workload")),
    ];
    let writes = writes.into_iter().chain(method).chain([
        calls::new_token(doomed),
        calls::new_policy(AclPolicy {
            id: SUBSCRIBER_POLICY_ID.into(),
            name: SUBSCRIBER_POLICY_NAME.into(),
            rules: SUBSCRIBER_RULES.into(),
            ..Default::default()
        }),
        calls::new_token(token_of(
            &t.subscriber_accessor,
            &t.subscriber,
            "subscriber",
            SUBSCRIBER_POLICY_ID,
            SUBSCRIBER_POLICY_NAME,
        )),
    ]);
    let writes = writes.chain(dns_setup);
    for req in writes {
        if !until_acked(&servers, req, until, &log).await {
            return Ok(());
        }
    }
    log.lock().unwrap().created = Some(now_us());
    t.ready.store(true, Ordering::Release);
    let now = turmoil::sim_elapsed().unwrap_or_default();
    tokio::time::sleep(delete_at.saturating_sub(now)).await;
    match delete {
        Some(delete) => {
            if until_acked(&servers, delete, until, &log).await {
                log.lock().unwrap().deleted = Some(now_us());
            }
        }
        // Expired now, on every server at once.
        None => log.lock().unwrap().deleted = Some(delete_at.as_micros() as u64),
    }
    // And takes a service from the DNS token: servers must stop answering
    // it once they apply that.
    until_acked(&servers, dns_narrow, until, &log).await;
    Ok(())
}

/// The doomed token's user: until `until`, one request every few tens of
/// milliseconds to a random server, recording the answer and the answering
/// server's decision.
pub async fn user(
    access: Access, seed: u64, servers: Vec<IpAddr>, until: Duration, log: AclLog,
) -> turmoil::Result {
    let Some(t) = access.tokens().cloned() else {
        return Ok(());
    };
    access.workload().await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xAC1_D00D);
    let mut n = 0u64;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        n += 1;
        let key = USER_KEYS[rng.gen_range(0..USER_KEYS.len())].to_string();
        let req = match rng.gen_range(0..4) {
            0 => calls::put(&key, n.to_string().into_bytes(), None),
            1 => ApiRequest::Get {
                key,
                consistent: false,
            },
            2 => ApiRequest::Get {
                key,
                consistent: true,
            },
            _ => ApiRequest::StaleGet { key },
        };
        let anonymous = rng.gen_ratio(1, 8);
        let token = (!anonymous).then_some(t.doomed.as_str());
        let asked = rng.gen_range(0..servers.len());
        let addr = SocketAddr::new(servers[asked], API_PORT);
        let call_at = now_us();
        let stale = matches!(req, ApiRequest::StaleGet { .. });
        let answer = call(addr, &req, token, SHORT_TIMEOUT).await;
        let (acked, refused) = match answer {
            Ok(reply) => {
                let error = match &reply {
                    ApiReply::Call(Err(e)) | ApiReply::Get(Err(e)) => Some(e.as_str()),
                    _ => None,
                };
                let refused = error.is_some_and(|e| {
                    e.contains("ACL not found") || e.contains("Permission denied")
                });
                (
                    matches!(reply, ApiReply::Call(Ok(_)) | ApiReply::Get(Ok(_))),
                    refused,
                )
            }
            Err(_) => (false, false),
        };
        log.lock().unwrap().uses.push(TokenUse {
            anonymous,
            asked,
            call: call_at,
            ret: now_us(),
            stale,
            acked,
            refused,
        });
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..40))).await;
    }
    Ok(())
}

/// Checker (f) on a finished run, of the datacenter whose applies `truth`
/// recorded: where the delete was written (`replicated` false), or one
/// that learnt it through ACL replication.
pub fn check(tokens: &Tokens, log: &AclRecord, truth: &Committed, replicated: bool) -> AclStats {
    let mut stats = AclStats {
        doom: tokens.doom,
        ..Default::default()
    };
    let fail = |stats: &mut AclStats, f: String| stats.failures.push(f);
    for e in &log.errors {
        fail(&mut stats, format!("acl: an admin write was refused: {e}"));
    }
    let Some(deleted_at) = log.deleted else {
        fail(
            &mut stats,
            "acl: the doomed token's delete was never acknowledged".into(),
        );
        return stats;
    };
    let Some(&delete_index) = truth.acl_deleted.get(&tokens.doomed_accessor) else {
        fail(
            &mut stats,
            "acl: the doomed token's delete was acknowledged, but no server applied it".into(),
        );
        return stats;
    };
    stats.delete_index = delete_index;
    // From when on any leader of this datacenter refuses the token: where
    // the delete was written, once acknowledged (its leader applied it
    // first); where replication brought it, once every server applied it
    // (which one led as it did, the truth does not say).
    let expired = tokens.doom == Doom::Expires;
    let refused_from = if expired {
        // Every server judges expiry by the one simulated clock.
        deleted_at
    } else if replicated {
        truth
            .acl_deleted_at
            .iter()
            .filter(|((accessor, _), _)| *accessor == tokens.doomed_accessor)
            .map(|(_, &at)| at)
            .max()
            .unwrap_or(u64::MAX)
    } else {
        deleted_at
    };
    // Judged from outside, by when each request was sent: the servers'
    // endpoint layer decides where a token is checked (the leader, but for
    // `?stale` reads), and the checker holds it to that.
    for u in &log.uses {
        if u.anonymous {
            if u.acked {
                fail(
                    &mut stats,
                    format!("acl: an anonymous request was accepted under default deny: {u:?}"),
                );
            } else if u.refused {
                stats.anonymous_refused += 1;
            }
            continue;
        }
        if u.acked {
            let server = format!("s{}", u.asked + 1);
            if u.stale && expired && u.call > deleted_at {
                fail(
                    &mut stats,
                    format!(
                        "acl: {server} accepted the expired token on a ?stale read asked at {} µs, after its expiry at {deleted_at} µs: {u:?}",
                        u.call
                    ),
                );
                continue;
            }
            if u.stale {
                // The server asked answers from its own state: it may accept
                // the token until it has applied the delete, never after.
                let applied = truth
                    .acl_deleted_at
                    .get(&(tokens.doomed_accessor.clone(), server.clone()));
                if let Some(&at) = applied.filter(|&&at| u.call > at) {
                    fail(
                        &mut stats,
                        format!(
                            "acl: {server} accepted the deleted token on a ?stale read asked at {} µs, after it applied the delete at {at} µs: {u:?}",
                            u.call
                        ),
                    );
                    continue;
                }
            } else if u.call > refused_from {
                // Checked by the leader, which had applied the delete: by
                // any leader from then on.
                fail(
                    &mut stats,
                    format!(
                        "acl: the deleted token was accepted on a request sent to {server} at {} µs, after every leader refuses it (from {refused_from} µs; delete acknowledged at {deleted_at} µs): {u:?}",
                        u.call
                    ),
                );
                continue;
            }
            if u.call < deleted_at {
                stats.accepted_before += 1;
            }
        } else if u.refused && u.call > deleted_at {
            stats.refused_after += 1;
        }
    }
    if stats.accepted_before == 0 {
        fail(
            &mut stats,
            "acl: no progress: the doomed token was never accepted before its delete".into(),
        );
    }
    if stats.refused_after == 0 {
        fail(
            &mut stats,
            format!(
                "acl: no progress: the doomed token was never refused after its delete (acknowledged at {deleted_at} µs)"
            ),
        );
    }
    stats
}
