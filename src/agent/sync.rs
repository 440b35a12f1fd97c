//! Anti-entropy: keeping the catalog's view of this agent's node equal to
//! the agent's local state, which is authoritative.
//!
//! Two kinds of run, one task, never concurrent:
//!
//! - **changes** (on every local change): push what is marked out of sync —
//!   no reads, one write per service (with all its checks), node-level
//!   check or deletion;
//! - **full** (periodically, at start, after a failure, or when a heartbeat
//!   finds the servers lost the node): read the node's services and checks
//!   from the catalog, [`reconcile`] them with the local state (unknown
//!   catalog entries become tombstones, missing or different ones are
//!   marked out of sync, `EnableTagOverride` services adopt the catalog's
//!   tags), then push.
//!
//! The period grows with the cluster ([`scaled_interval`]) and is staggered
//! at random; failures are logged and retried with capped exponential
//! backoff, never fatal.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::Deserialize;

use super::Agent;
use super::local::{Item, LocalCheck, LocalService, Source, SyncMark, Tables};
use super::servers::{FULL_SYNCS, SHORT, SYNC_FAILURES, SYNC_READS, SYNC_WRITES, ServerError};
use crate::structs::agent::{CONSUL_SERVICE, SERF_CHECK_ID};
use crate::structs::is_server_tagged_address;
use crate::structs::{DeregisterRequest, HealthCheck, Node, NodeService, RegisterRequest};

/// Consul's full-sync period for clusters of up to [`SCALE_THRESHOLD`] nodes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
const SCALE_THRESHOLD: usize = 128;
/// The first retry after a failure; it doubles up to the cap.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(30);

/// The full-sync period for a cluster of `nodes`: `base` up to 128 nodes,
/// one more `base` per doubling beyond (129–256: 2×, 257–512: 3×, ...).
pub fn scaled_interval(base: Duration, nodes: usize) -> Duration {
    let mut factor = 1u32;
    let mut cap = SCALE_THRESHOLD;
    while nodes > cap {
        cap = cap.saturating_mul(2);
        factor += 1;
    }
    base * factor
}

/// The wait before the next full sync: the scaled period, staggered at
/// random by ±50% so agents started together drift apart (the mean stays
/// the period).
pub fn staggered(period: Duration, rng: &mut impl Rng) -> Duration {
    let half = period / 2;
    half + period.mul_f64(rng.gen_range(0.0..1.0))
}

/// The retry delay after `failures` consecutive failures: doubling from
/// one second, capped at 30 s and at the sync period, with jitter.
pub fn backoff(failures: u32, period: Duration, rng: &mut impl Rng) -> Duration {
    let cap = RETRY_CAP.min(period).max(Duration::from_millis(100));
    let exp = RETRY_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let d = exp.min(cap);
    d.mul_f64(rng.gen_range(0.75..1.0))
}

/// The catalog's view of the node.
#[derive(Debug, Clone, Default)]
pub struct Remote {
    pub node: Option<Node>,
    pub services: Vec<NodeService>,
    pub checks: Vec<HealthCheck>,
}

fn same_service(local: &NodeService, remote: &NodeService) -> bool {
    let mut r = remote.clone();
    r.create_index = 0;
    r.modify_index = 0;
    // The servers add virtual IPs (the service's, and a terminating
    // gateway's for each service it links); the agent never sends them.
    r.tagged_addresses
        .retain(|k, _| !is_server_tagged_address(k) || local.tagged_addresses.contains_key(k));
    *local == r
}

fn same_check(expected: &HealthCheck, remote: &HealthCheck) -> bool {
    let mut r = remote.clone();
    r.create_index = 0;
    r.modify_index = 0;
    *expected == r
}

/// Compares the local state with the catalog's view and marks what differs
/// out of sync; entries only the catalog has become tombstones. Returns
/// whether local registrations changed (tags adopted under
/// `EnableTagOverride`), which must then be persisted.
pub fn reconcile(t: &mut Tables, remote: &Remote) -> bool {
    let mut adopted = false;
    let node_ok = remote.node.as_ref().is_some_and(|n| t.node.matches(n));
    set_mark(t, Item::Node, node_ok);

    // A server's `consul` service is the leader's, not its agent's.
    let remote_services: BTreeMap<&str, &NodeService> = remote
        .services
        .iter()
        .filter(|s| s.id != CONSUL_SERVICE)
        .map(|s| (s.id.as_str(), s))
        .collect();
    for (id, _) in remote_services.iter() {
        if !t.services.contains_key(*id) {
            let mark = t.stale_mark();
            t.services.insert(
                id.to_string(),
                LocalService {
                    registered: NodeService::default(),
                    effective: NodeService::default(),
                    source: Source::Api,
                    deleted: true,
                    mark,
                    sidecar_of: None,
                },
            );
        }
    }
    let ids: Vec<String> = t.services.keys().cloned().collect();
    for id in ids {
        let rs = remote_services.get(id.as_str()).copied();
        let Some(s) = t.services.get_mut(&id) else {
            continue;
        };
        let in_sync = if s.deleted {
            rs.is_none()
        } else {
            match rs {
                None => false,
                Some(rs) => {
                    if s.registered.enable_tag_override && s.registered.tags != rs.tags {
                        s.registered.tags = rs.tags.clone();
                        s.effective.tags = rs.tags.clone();
                        adopted = true;
                    }
                    same_service(&s.effective, rs)
                }
            }
        };
        set_mark(t, Item::Service(id), in_sync);
    }

    let remote_checks: BTreeMap<&str, &HealthCheck> = remote
        .checks
        .iter()
        .filter(|c| c.check_id != SERF_CHECK_ID)
        .map(|c| (c.check_id.as_str(), c))
        .collect();
    for (id, rc) in remote_checks.iter() {
        // A check of a service the agent does not have goes with it.
        let orphan = !rc.service_id.is_empty() && t.live_service(&rc.service_id).is_none();
        if !t.checks.contains_key(*id) && !orphan {
            let mark = t.stale_mark();
            t.checks.insert(
                id.to_string(),
                LocalCheck {
                    check: (*rc).clone(),
                    spec: None,
                    source: Source::Api,
                    deleted: true,
                    mark,
                    critical_since: None,
                    ttl_reset: Default::default(),
                    run_id: 0,
                },
            );
        }
    }
    let ids: Vec<String> = t.checks.keys().cloned().collect();
    for id in ids {
        let rc = remote_checks.get(id.as_str()).copied();
        let Some(c) = t.checks.get(&id) else {
            continue;
        };
        let in_sync = if c.deleted {
            rc.is_none()
        } else {
            rc.is_some_and(|rc| same_check(&t.expected_check(&c.check), rc))
        };
        set_mark(t, Item::Check(id), in_sync);
    }
    t.drop_synced_tombstones();
    if adopted {
        t.note_touched();
    }
    adopted
}

/// Sets an entry's mark from a comparison: in sync, or out of sync with a
/// fresh generation (keeping the one it has if it already was).
fn set_mark(t: &mut Tables, item: Item, in_sync: bool) {
    let current: Option<SyncMark> = match &item {
        Item::Node => Some(t.node_mark),
        Item::Service(id) => t.services.get(id).map(|s| s.mark),
        Item::Check(id) => t.checks.get(id).map(|c| c.mark),
    };
    let Some(current) = current else {
        return;
    };
    let mark = if in_sync {
        SyncMark {
            in_sync: true,
            ..current
        }
    } else if current.in_sync {
        t.stale_mark()
    } else {
        current
    };
    match item {
        Item::Node => t.node_mark = mark,
        Item::Service(id) => {
            if let Some(s) = t.services.get_mut(&id) {
                s.mark = mark;
            }
        }
        Item::Check(id) => {
            if let Some(c) = t.checks.get_mut(&id) {
                c.mark = mark;
            }
        }
    }
}

/// One write to the catalog and what it brings in sync.
#[derive(Debug, Clone, PartialEq)]
pub struct Push {
    pub request: PushRequest,
    pub marks: Vec<(Item, u64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PushRequest {
    Register(Box<RegisterRequest>),
    Deregister(DeregisterRequest),
}

/// The writes that bring the catalog in line with what is out of sync. A
/// service is always written with all its checks.
pub fn plan(t: &Tables) -> Vec<Push> {
    let mut out = Vec::new();
    if !t.node_mark.in_sync {
        out.push(Push {
            request: PushRequest::Register(Box::new(t.node.register())),
            marks: vec![(Item::Node, t.node_mark.generation)],
        });
    }
    for (id, s) in &t.services {
        if s.deleted {
            if !s.mark.in_sync {
                out.push(Push {
                    request: PushRequest::Deregister(DeregisterRequest {
                        node: t.node.name.clone(),
                        service_id: id.clone(),
                        ..Default::default()
                    }),
                    marks: vec![(Item::Service(id.clone()), s.mark.generation)],
                });
            }
            continue;
        }
        let checks: Vec<&LocalCheck> = t
            .live_checks()
            .filter(|c| c.check.service_id == *id)
            .collect();
        if s.mark.in_sync && checks.iter().all(|c| c.mark.in_sync) {
            continue;
        }
        let mut req = t.node.register();
        req.service = Some(s.effective.clone());
        req.checks = checks.iter().map(|c| t.expected_check(&c.check)).collect();
        let mut marks = vec![(Item::Service(id.clone()), s.mark.generation)];
        marks.extend(
            checks
                .iter()
                .map(|c| (Item::Check(c.check.check_id.clone()), c.mark.generation)),
        );
        out.push(Push {
            request: PushRequest::Register(Box::new(req)),
            marks,
        });
    }
    for (id, c) in &t.checks {
        if c.mark.in_sync {
            continue;
        }
        let marks = vec![(Item::Check(id.clone()), c.mark.generation)];
        if c.deleted {
            out.push(Push {
                request: PushRequest::Deregister(DeregisterRequest {
                    node: t.node.name.clone(),
                    check_id: id.clone(),
                    ..Default::default()
                }),
                marks,
            });
        } else if c.check.service_id.is_empty() {
            let mut req = t.node.register();
            req.check = Some(t.expected_check(&c.check));
            out.push(Push {
                request: PushRequest::Register(Box::new(req)),
                marks,
            });
        }
    }
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct NodeServices {
    node: Option<Node>,
    #[serde(default, deserialize_with = "crate::structs::serde_util::null_default")]
    services: Vec<NodeService>,
}

/// Reads the catalog's view of the node: two reads.
async fn fetch_remote(a: &Agent) -> Result<Remote, ServerError> {
    let node = crate::request::enc(&a.config.node);
    SYNC_READS.add(2);
    let (ns, _): (Option<NodeServices>, u64) = a
        .servers
        .get(&format!("/v1/catalog/node-services/{node}"), SHORT)
        .await?;
    let (checks, _): (Vec<HealthCheck>, u64) = a
        .servers
        .get(&format!("/v1/health/node/{node}"), SHORT)
        .await?;
    let (node, services) = match ns {
        Some(ns) => (ns.node, ns.services),
        None => (None, Vec::new()),
    };
    Ok(Remote {
        node,
        services,
        checks,
    })
}

/// Pushes everything out of sync; stops at the first failure (the next
/// run starts over from what is still out of sync).
async fn sync_changes(a: &Agent) -> Result<usize, ServerError> {
    let pushes = a.local.with(|t| plan(t));
    let n = pushes.len();
    for p in pushes {
        SYNC_WRITES.inc();
        match &p.request {
            PushRequest::Register(r) => a.servers.put("/v1/catalog/register", r).await?,
            PushRequest::Deregister(r) => a.servers.put("/v1/catalog/deregister", r).await?,
        };
        a.local.with(|t| t.synced(&p.marks));
    }
    Ok(n)
}

async fn sync_full(a: &Agent) -> Result<usize, ServerError> {
    let remote = fetch_remote(a).await?;
    let adopted = a.local.with(|t| reconcile(t, &remote));
    if adopted {
        // A failure is logged there; the tags are kept in memory regardless.
        let _ = a.persist().await;
    }
    let n = sync_changes(a).await?;
    FULL_SYNCS.inc();
    Ok(n)
}

/// The longest an API write waits for its change to reach the catalog.
const PUSH_WAIT: Duration = Duration::from_secs(10);

/// Waits until the local state is in the catalog (every change made before
/// the call pushed), a push fails, or [`PUSH_WAIT`] passes. Consul's agent
/// endpoints sync their change before answering (a failure is only
/// logged), so a client that registers through the agent and then reads
/// the catalog finds its service; the pushing itself stays the sync
/// task's, so writes to the catalog never race each other.
pub async fn pushed(a: &Agent) {
    let mut runs = a.sync_runs.subscribe();
    runs.borrow_and_update();
    let deadline = tokio::time::Instant::now() + PUSH_WAIT;
    loop {
        if a.local.with(|t| t.all_in_sync()) {
            return;
        }
        match tokio::time::timeout_at(deadline, runs.changed()).await {
            Ok(Ok(())) if runs.borrow_and_update().1 => {}
            _ => return,
        }
    }
}

/// The anti-entropy task: a full sync at start, then changes as they come
/// and a full sync every staggered period.
pub async fn run(a: Arc<Agent>) {
    let mut failures = 0u32;
    let mut next_full = tokio::time::Instant::now();
    loop {
        let full = tokio::select! {
            _ = tokio::time::sleep_until(next_full) => true,
            _ = a.local.changed.notified() => a.local.take_full_ask(),
        };
        let period = scaled_interval(a.config.sync_interval, a.cluster_size());
        // Before anything is pushed: whether the servers have ACLs, so that
        // once they know this agent it never answers as an unjoined one.
        if a.tokens.unknown() {
            let own = a.config.tokens.own().map(String::from);
            let _ = a.tokens.resolve(&a.servers, own.as_deref()).await;
        }
        let talking = a.talking.read().await;
        let result = if full {
            sync_full(&a).await
        } else {
            sync_changes(&a).await
        };
        drop(talking);
        let ok = result.is_ok();
        a.sync_runs.send_modify(|(runs, last_ok)| {
            *runs += 1;
            *last_ok = ok;
        });
        let mut rng = rand::thread_rng();
        match result {
            Ok(n) => {
                if failures > 0 {
                    tracing::info!("anti-entropy: catalog in sync again");
                }
                failures = 0;
                if full {
                    tracing::debug!(pushed = n, "anti-entropy: full sync done");
                    next_full = tokio::time::Instant::now() + staggered(period, &mut rng);
                } else if n > 0 {
                    tracing::debug!(pushed = n, "anti-entropy: changes synced");
                }
            }
            Err(e) => {
                SYNC_FAILURES.inc();
                failures += 1;
                let wait = backoff(failures, period, &mut rng);
                tracing::warn!(error = %e, retry_in = ?wait, "anti-entropy sync failed");
                next_full = tokio::time::Instant::now() + wait;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::local::fixtures::*;
    use rand::SeedableRng;
    use std::time::Instant;

    /// What the catalog holds after applying every push of `plan` (a tiny
    /// model of the server's register/deregister).
    fn apply(remote: &mut Remote, pushes: &[Push]) {
        for p in pushes {
            match &p.request {
                PushRequest::Register(r) => {
                    remote.node = Some(Node {
                        id: r.id.clone(),
                        node: r.node.clone(),
                        address: r.address.clone(),
                        tagged_addresses: r.tagged_addresses.clone(),
                        meta: r.node_meta.clone(),
                        create_index: 7,
                        modify_index: 7,
                        ..Default::default()
                    });
                    if let Some(s) = &r.service {
                        remote.services.retain(|x| x.id != s.id);
                        let mut s = s.clone();
                        s.modify_index = 9;
                        remote.services.push(s);
                    }
                    for c in r.check.iter().chain(r.checks.iter()) {
                        remote.checks.retain(|x| x.check_id != c.check_id);
                        let mut c = c.clone();
                        c.modify_index = 9;
                        remote.checks.push(c);
                    }
                }
                PushRequest::Deregister(d) => {
                    if !d.service_id.is_empty() {
                        remote.services.retain(|x| x.id != d.service_id);
                        remote.checks.retain(|x| x.service_id != d.service_id);
                    }
                    if !d.check_id.is_empty() {
                        remote.checks.retain(|x| x.check_id != d.check_id);
                    }
                }
            }
        }
    }

    fn synced_all(t: &mut Tables, pushes: &[Push]) {
        for p in pushes {
            t.synced(&p.marks);
        }
    }

    /// The virtual IPs the servers add to a row (a service's
    /// `consul-virtual`, a terminating gateway's `consul-virtual:<svc>`)
    /// are no difference to sync, unless the agent's own definition names
    /// that key; any other tagged address is.
    #[test]
    fn server_set_virtual_ips_are_no_difference() {
        let local = svc("tg", &[]);
        let mut remote = local.clone();
        remote.modify_index = 12;
        for key in ["consul-virtual", "consul-virtual:billing"] {
            remote.tagged_addresses.insert(
                key.into(),
                crate::structs::ServiceAddress {
                    address: "240.0.0.1".into(),
                    port: 0,
                },
            );
        }
        assert!(same_service(&local, &remote));
        let mut named = local.clone();
        named.tagged_addresses.insert(
            "consul-virtual:billing".into(),
            crate::structs::ServiceAddress {
                address: "10.9.9.9".into(),
                port: 0,
            },
        );
        assert!(
            !same_service(&named, &remote),
            "the agent's own value differs"
        );
        remote.tagged_addresses.insert(
            "consul-virtualx".into(),
            crate::structs::ServiceAddress::default(),
        );
        assert!(!same_service(&local, &remote), "not a server-set key");
    }

    #[test]
    fn interval_scales_with_cluster_size() {
        let m = Duration::from_secs(60);
        assert_eq!(scaled_interval(m, 1), m);
        assert_eq!(scaled_interval(m, 128), m);
        assert_eq!(scaled_interval(m, 129), 2 * m);
        assert_eq!(scaled_interval(m, 256), 2 * m);
        assert_eq!(scaled_interval(m, 257), 3 * m);
        assert_eq!(scaled_interval(m, 1024), 4 * m);
        assert_eq!(scaled_interval(m, 1025), 5 * m);
        assert_eq!(scaled_interval(m, usize::MAX), 58 * m);
    }

    #[test]
    fn stagger_and_backoff_stay_in_bounds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let p = Duration::from_secs(60);
        let mut sum = Duration::ZERO;
        for _ in 0..1000 {
            let s = staggered(p, &mut rng);
            assert!(s >= p / 2 && s < p * 3 / 2, "{s:?}");
            sum += s;
        }
        let mean = sum / 1000;
        assert!(mean > Duration::from_secs(55) && mean < Duration::from_secs(65));
        assert!(backoff(1, p, &mut rng) <= Duration::from_secs(1));
        assert!(backoff(3, p, &mut rng) >= Duration::from_secs(3));
        assert!(backoff(30, p, &mut rng) <= Duration::from_secs(30));
        // Capped by a short test period.
        assert!(backoff(10, Duration::from_secs(2), &mut rng) <= Duration::from_secs(2));
    }

    #[test]
    fn empty_catalog_gets_everything_then_nothing() {
        let mut t = tables();
        let now = Instant::now();
        add(&mut t, svc("web", &["a"]), vec![ttl("c1", "web")], now);
        t.put_check(
            ttl("node-check", "").0,
            ttl("node-check", "").1,
            Source::Api,
            now,
        );
        let mut remote = Remote::default();
        reconcile(&mut t, &remote);
        let pushes = plan(&t);
        // Node, the service with its check, the node-level check.
        assert_eq!(pushes.len(), 3);
        let PushRequest::Register(r) = &pushes[1].request else {
            panic!("want a registration")
        };
        assert_eq!(r.service.as_ref().unwrap().id, "web");
        assert_eq!(r.checks.len(), 1);
        assert_eq!(r.checks[0].service_name, "web");
        apply(&mut remote, &pushes);
        synced_all(&mut t, &pushes);
        assert!(plan(&t).is_empty());
        // The next full sync finds nothing to do.
        reconcile(&mut t, &remote);
        assert!(plan(&t).is_empty(), "{:?}", plan(&t));
    }

    #[test]
    fn catalog_drift_is_undone() {
        let mut t = tables();
        let now = Instant::now();
        add(&mut t, svc("web", &["a"]), vec![ttl("c1", "web")], now);
        let mut remote = Remote::default();
        reconcile(&mut t, &remote);
        let p = plan(&t);
        apply(&mut remote, &p);
        synced_all(&mut t, &p);

        // Someone deletes web, adds a stranger with a check, edits the
        // node, adds a node check; serfHealth is the servers' and stays.
        remote.services.clear();
        remote.checks.clear();
        remote.services.push(svc("stranger", &[]));
        remote.checks.push(HealthCheck {
            check_id: "stranger-check".into(),
            service_id: "stranger".into(),
            ..Default::default()
        });
        remote.checks.push(HealthCheck {
            check_id: "odd".into(),
            ..Default::default()
        });
        remote.checks.push(HealthCheck {
            check_id: SERF_CHECK_ID.into(),
            status: crate::structs::HEALTH_PASSING,
            ..Default::default()
        });
        remote.node.as_mut().unwrap().address = "10.9.9.9".into();

        reconcile(&mut t, &remote);
        let p = plan(&t);
        apply(&mut remote, &p);
        synced_all(&mut t, &p);
        let ids: Vec<&str> = remote.services.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["web"]);
        let mut checks: Vec<&str> = remote.checks.iter().map(|c| c.check_id.as_str()).collect();
        checks.sort();
        assert_eq!(checks, ["c1", SERF_CHECK_ID]);
        assert_eq!(remote.node.as_ref().unwrap().address, "10.0.0.1");
        // Tombstones are gone once synced.
        assert!(t.services.values().all(|s| !s.deleted));
        reconcile(&mut t, &remote);
        assert!(plan(&t).is_empty());
    }

    #[test]
    fn a_changed_check_resends_its_service_with_all_checks() {
        let now = Instant::now();
        let mut t = web_with(&["c1", "c2"], now);
        let p = plan(&t);
        synced_all(&mut t, &p);
        t.set_check_status("c2", crate::structs::HEALTH_PASSING, "ok", now);
        let p = plan(&t);
        assert_eq!(p.len(), 1);
        let PushRequest::Register(r) = &p[0].request else {
            panic!()
        };
        assert!(r.service.is_some());
        assert_eq!(r.checks.len(), 2);
    }

    #[test]
    fn tag_override_keeps_catalog_tags_and_other_fields_revert() {
        let mut t = tables();
        let now = Instant::now();
        let mut s = svc("web", &["v1"]);
        s.enable_tag_override = true;
        s.port = 80;
        add(&mut t, s, vec![], now);
        add(&mut t, svc("plain", &["v1"]), vec![], now);
        let mut remote = Remote::default();
        reconcile(&mut t, &remote);
        let p = plan(&t);
        apply(&mut remote, &p);
        synced_all(&mut t, &p);

        for s in remote.services.iter_mut() {
            s.tags = vec!["primary".into()];
            s.port = 81;
        }
        assert!(reconcile(&mut t, &remote), "tags adopted");
        let p = plan(&t);
        apply(&mut remote, &p);
        let web = remote.services.iter().find(|s| s.id == "web").unwrap();
        assert_eq!(web.tags, ["primary"]);
        assert_eq!(web.port, 80);
        let plain = remote.services.iter().find(|s| s.id == "plain").unwrap();
        assert_eq!(plain.tags, ["v1"]);
        assert_eq!(t.services["web"].registered.tags, ["primary"]);
    }

    #[test]
    fn local_removals_are_pushed_as_deregistrations() {
        let now = Instant::now();
        let mut t = web_with(&["c1"], now);
        t.put_check(ttl("n1", "").0, ttl("n1", "").1, Source::Api, now);
        let p = plan(&t);
        synced_all(&mut t, &p);
        t.remove_check("n1");
        t.remove_service("web");
        let p = plan(&t);
        let kinds: Vec<(String, String)> = p
            .iter()
            .map(|p| match &p.request {
                PushRequest::Deregister(d) => (d.service_id.clone(), d.check_id.clone()),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("web".to_string(), String::new()),
                (String::new(), "n1".to_string())
            ]
        );
        synced_all(&mut t, &p);
        assert!(t.services.is_empty() && t.checks.is_empty());
    }
}
