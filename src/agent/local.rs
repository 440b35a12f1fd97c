//! The agent's local state: its node, services and checks — the source of
//! truth that anti-entropy pushes to the catalog — and, per entry, whether
//! the catalog is known to match it.
//!
//! [`Tables`] is plain data with pure mutators (unit-tested without any
//! I/O); [`Local`] wraps it in a mutex and wakes the syncer when something
//! goes out of sync. Every change bumps a generation: a push marks an entry
//! in sync only if it has not changed since the push was planned, so a
//! change racing a push is never lost.
//!
//! Alias checks are computed here, not run: every change of a check or a
//! service recomputes them ([`Tables::refresh_aliases`]). A service
//! registered with a sidecar remembers it (`sidecar_of`), so deregistering
//! or re-registering the parent without one removes the sidecar too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::{Notify, watch};

use super::parse::ServiceDef;
use super::sidecar;
use super::spec::{self, CheckSpec};
use crate::discovery_chain::{EntryLookup, MemoryEntries};
use crate::error::{Error, Result};
use crate::merge::{merge_with_central_config, should_merge};
use crate::structs::config_entry::{ConfigEntry, Kind};
use crate::structs::{
    HEALTH_CRITICAL, HEALTH_PASSING, HealthCheck, HealthStatus, Meta, Node, NodeService,
    RegisterRequest,
};

/// Where an entry came from: definitions in `--config-dir` are read again
/// at every start, so only API registrations are persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Source {
    Api,
    Config,
}

/// Whether the catalog matches an entry, as of generation `gen`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncMark {
    pub in_sync: bool,
    pub generation: u64,
}

/// The agent's own node, as it registers it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub id: String,
    pub address: String,
    pub tagged_addresses: BTreeMap<String, String>,
    pub meta: Meta,
}

impl NodeInfo {
    /// A registration of the node alone.
    pub fn register(&self) -> RegisterRequest {
        RegisterRequest {
            id: self.id.clone(),
            node: self.name.clone(),
            address: self.address.clone(),
            tagged_addresses: self.tagged_addresses.clone(),
            node_meta: self.meta.clone(),
            ..Default::default()
        }
    }

    /// Whether the catalog's node is this one (the fields the agent owns).
    pub fn matches(&self, n: &Node) -> bool {
        n.address == self.address
            && n.tagged_addresses == self.tagged_addresses
            && n.meta == self.meta
            && (self.id.is_empty() || n.id == self.id)
    }
}

#[derive(Debug, Clone)]
pub struct LocalService {
    /// As registered (with catalog tags adopted under `EnableTagOverride`).
    pub registered: NodeService,
    /// What the catalog should hold: `registered` with central config
    /// merged in for proxies and gateways.
    pub effective: NodeService,
    pub source: Source,
    /// A tombstone: the catalog still has it and must lose it.
    pub deleted: bool,
    pub mark: SyncMark,
    /// For a sidecar expanded from `Connect.SidecarService`: its parent's ID.
    pub sidecar_of: Option<String>,
}

#[derive(Debug, Clone)]
pub struct LocalCheck {
    pub check: HealthCheck,
    /// How to run it (`None` for a tombstone).
    pub spec: Option<CheckSpec>,
    pub source: Source,
    pub deleted: bool,
    pub mark: SyncMark,
    /// Since when it has been critical (for `DeregisterCriticalServiceAfter`).
    pub critical_since: Option<Instant>,
    /// Wakes a TTL check's timer when the TTL is renewed.
    pub ttl_reset: Arc<Notify>,
    /// Identifies this registration of the check: a new one restarts its
    /// runner, a status change does not.
    pub run_id: u64,
}

/// Something a push marks as synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Node,
    Service(String),
    Check(String),
}

/// The whole local state.
#[derive(Debug, Default)]
pub struct Tables {
    pub node: NodeInfo,
    pub node_mark: SyncMark,
    pub services: BTreeMap<String, LocalService>,
    pub checks: BTreeMap<String, LocalCheck>,
    /// Central config (proxy-defaults, service-defaults) from the servers.
    pub entries: MemoryEntries,
    generation: u64,
    /// Set by a change that needs a push; taken by [`Local::with`].
    dirty: bool,
    /// Set by any change visible through the API.
    touched: bool,
}

impl Tables {
    pub fn new(node: NodeInfo) -> Self {
        Tables {
            node,
            ..Default::default()
        }
    }

    /// A fresh out-of-sync mark; the syncer will be woken.
    fn change(&mut self) -> SyncMark {
        self.generation += 1;
        self.dirty = true;
        self.touched = true;
        SyncMark {
            in_sync: false,
            generation: self.generation,
        }
    }

    pub fn live_service(&self, id: &str) -> Option<&LocalService> {
        self.services.get(id).filter(|s| !s.deleted)
    }

    pub fn live_check(&self, id: &str) -> Option<&LocalCheck> {
        self.checks.get(id).filter(|c| !c.deleted)
    }

    pub fn live_services(&self) -> impl Iterator<Item = &LocalService> {
        self.services.values().filter(|s| !s.deleted)
    }

    pub fn live_checks(&self) -> impl Iterator<Item = &LocalCheck> {
        self.checks.values().filter(|c| !c.deleted)
    }

    /// The registration as the catalog should hold it.
    fn effective_of(&self, svc: &NodeService) -> NodeService {
        if should_merge(svc) {
            merge_with_central_config(&self.entries, svc)
        } else {
            svc.clone()
        }
    }

    /// Adds or replaces a service and the checks that came with it. With
    /// `replace_checks`, its other checks are removed.
    pub fn put_service(
        &mut self, mut svc: NodeService, checks: Vec<(HealthCheck, CheckSpec)>, source: Source,
        replace_checks: bool, now: Instant,
    ) {
        svc.create_index = 0;
        svc.modify_index = 0;
        let id = svc.id.clone();
        let effective = self.effective_of(&svc);
        let mark = self.change();
        self.services.insert(
            id.clone(),
            LocalService {
                registered: svc,
                effective,
                source,
                deleted: false,
                mark,
                sidecar_of: None,
            },
        );
        if replace_checks {
            let keep: Vec<&str> = checks.iter().map(|(c, _)| c.check_id.as_str()).collect();
            let stale: Vec<String> = self
                .live_checks()
                .filter(|c| c.check.service_id == id && !keep.contains(&c.check.check_id.as_str()))
                .map(|c| c.check.check_id.clone())
                .collect();
            for c in stale {
                self.remove_check(&c);
            }
        }
        for (check, spec) in checks {
            self.put_check(check, spec, source, now);
        }
        self.refresh_aliases(now);
    }

    /// Registers a service definition: the service with its checks, and
    /// its sidecar on a port chosen here (under the state's lock, so two
    /// registrations never pick the same one; `hint` is a port to prefer),
    /// or — when it declares none — without the sidecar an earlier
    /// registration gave it. Nothing changes on error.
    pub fn put_definition(
        &mut self, def: ServiceDef, source: Source, replace_checks: bool, now: Instant,
        hint: Option<u16>,
    ) -> Result<()> {
        let parent = def.service.id.clone();
        let sidecar = match def.sidecar {
            None => None,
            Some(sd) => {
                let port = match u16::try_from(sd.service.port) {
                    Ok(p) if p > 0 => p,
                    _ => sidecar_port(self, &sd.service.id, &parent, def.service.port, hint)
                        .ok_or_else(|| {
                            Error::bad(format!(
                                "No free sidecar port in {}-{} on this agent for {:?}",
                                sidecar::MIN_PORT,
                                sidecar::MAX_PORT,
                                sd.service.id
                            ))
                        })?,
                };
                Some(sidecar::finish(*sd, port)?)
            }
        };
        self.put_service(def.service, def.checks, source, replace_checks, now);
        match sidecar {
            Some(sc) => {
                let id = sc.service.id.clone();
                // The sidecar's checks are all its definition's.
                self.put_service(sc.service, sc.checks, source, true, now);
                self.set_sidecar_of(&id, &parent);
            }
            None => {
                for id in self.sidecars_of(&parent) {
                    self.remove_service(&id);
                }
            }
        }
        Ok(())
    }

    /// Records that service `id` is the sidecar of `parent`.
    pub fn set_sidecar_of(&mut self, id: &str, parent: &str) {
        if let Some(s) = self.services.get_mut(id).filter(|s| !s.deleted) {
            s.sidecar_of = Some(parent.to_string());
        }
    }

    fn sidecars_of(&self, parent: &str) -> Vec<String> {
        self.live_services()
            .filter(|s| s.sidecar_of.as_deref() == Some(parent))
            .map(|s| s.registered.id.clone())
            .collect()
    }

    /// Removes a service, its checks and its sidecar; the catalog loses
    /// them at the next push. False if there was no such service.
    pub fn remove_service(&mut self, id: &str) -> bool {
        if self.live_service(id).is_none() {
            return false;
        }
        for sc in self.sidecars_of(id) {
            self.remove_service(&sc);
        }
        // Deregistering the service in the catalog takes its checks along.
        self.checks
            .retain(|_, c| c.check.service_id != id || c.deleted);
        let mark = self.change();
        if let Some(s) = self.services.get_mut(id) {
            s.deleted = true;
            s.sidecar_of = None;
            s.mark = mark;
        }
        // Alias checks of it turn critical.
        self.refresh_aliases(Instant::now());
        true
    }

    /// Adds or replaces a check. Its service (if any) must exist.
    pub fn put_check(
        &mut self, mut check: HealthCheck, spec: CheckSpec, source: Source, now: Instant,
    ) {
        check.node = self.node.name.clone();
        check.create_index = 0;
        check.modify_index = 0;
        let critical_since = (check.status == HEALTH_CRITICAL).then_some(now);
        let mark = self.change();
        self.checks.insert(
            check.check_id.clone(),
            LocalCheck {
                check,
                spec: Some(spec),
                source,
                deleted: false,
                mark,
                critical_since,
                ttl_reset: Arc::new(Notify::new()),
                run_id: mark.generation,
            },
        );
        self.refresh_aliases(now);
    }

    /// Removes a check. False if there was no such check.
    pub fn remove_check(&mut self, id: &str) -> bool {
        if self.live_check(id).is_none() {
            return false;
        }
        let mark = self.change();
        if let Some(c) = self.checks.get_mut(id) {
            c.deleted = true;
            c.spec = None;
            c.mark = mark;
        }
        self.refresh_aliases(Instant::now());
        true
    }

    /// Records a check result. A new status is pushed at once; a new output
    /// alone waits for the next full sync (as Consul defers output-only
    /// updates), so a chatty check does not write on every run. Alias
    /// checks follow.
    pub fn set_check_status(
        &mut self, id: &str, status: HealthStatus, output: &str, now: Instant,
    ) -> bool {
        let changed = self.record_status(id, (status, output), now);
        if changed {
            self.refresh_aliases(now);
        }
        changed
    }

    /// Brings every alias check in line with the service it mirrors. A
    /// chain of aliases settles in as many rounds as there are alias
    /// checks; a cycle stops there.
    pub fn refresh_aliases(&mut self, now: Instant) {
        let aliases: Vec<(String, String)> = self
            .live_checks()
            .filter_map(|c| {
                let target = c.spec.as_ref()?.alias_of()?;
                Some((c.check.check_id.clone(), target.to_string()))
            })
            .collect();
        for _ in 0..=aliases.len() {
            let mut changed = false;
            for (id, target) in &aliases {
                let (status, output) = alias_status(self, target, id);
                changed |= self.record_status(id, (status, &output), now);
            }
            if !changed {
                break;
            }
        }
    }

    /// Records `(status, output)` for check `id`; whether anything changed.
    fn record_status(&mut self, id: &str, result: (HealthStatus, &str), now: Instant) -> bool {
        let (status, output) = result;
        let Some(c) = self.checks.get(id).filter(|c| !c.deleted) else {
            return false;
        };
        if c.check.status == status && c.check.output == output {
            return false;
        }
        let status_changed = c.check.status != status;
        let mark = if status_changed {
            Some(self.change())
        } else {
            self.touched = true;
            None
        };
        let Some(c) = self.checks.get_mut(id) else {
            return false;
        };
        if status_changed {
            c.critical_since = (status == HEALTH_CRITICAL).then_some(now);
        }
        c.check.status = status;
        c.check.output = output.to_string();
        if let Some(m) = mark {
            c.mark = m;
        }
        true
    }

    /// Replaces the central config entries of one kind and re-merges the
    /// proxies and gateways they may feed.
    pub fn set_entries(&mut self, kind: Kind, entries: Vec<ConfigEntry>) {
        let old: Vec<String> = self
            .entries
            .list(kind)
            .iter()
            .map(|e| e.name().to_string())
            .collect();
        for name in old {
            self.entries.delete(kind, &name);
        }
        for e in entries {
            self.entries.upsert(e);
        }
        let ids: Vec<String> = self
            .live_services()
            .filter(|s| should_merge(&s.registered))
            .map(|s| s.registered.id.clone())
            .collect();
        for id in ids {
            let Some(s) = self.services.get(&id) else {
                continue;
            };
            let effective = self.effective_of(&s.registered);
            if effective != s.effective {
                let mark = self.change();
                if let Some(s) = self.services.get_mut(&id) {
                    s.effective = effective;
                    s.mark = mark;
                }
            }
        }
    }

    /// Whether any service needs central config (so the agent watches it).
    pub fn wants_central_config(&self) -> bool {
        self.live_services().any(|s| should_merge(&s.registered))
    }

    /// A check as the catalog should hold it: on this node, with its
    /// service's name and (effective) tags.
    pub fn expected_check(&self, c: &HealthCheck) -> HealthCheck {
        let mut out = c.clone();
        // Thresholds are the agent's business, not the catalog's.
        for k in spec::AGENT_ONLY_FIELDS {
            out.definition.remove(*k);
        }
        out.node = self.node.name.clone();
        out.create_index = 0;
        out.modify_index = 0;
        if let Some(s) = self.live_service(&c.service_id) {
            out.service_name = s.effective.service.clone();
            out.service_tags = s.effective.tags.clone();
        } else {
            out.service_name.clear();
            out.service_tags.clear();
        }
        out
    }

    /// Marks what a successful push carried as in sync, unless it changed
    /// since; synced tombstones are dropped.
    pub fn synced(&mut self, items: &[(Item, u64)]) {
        for (item, generation) in items {
            let mark = match item {
                Item::Node => Some(&mut self.node_mark),
                Item::Service(id) => self.services.get_mut(id).map(|s| &mut s.mark),
                Item::Check(id) => self.checks.get_mut(id).map(|c| &mut c.mark),
            };
            if let Some(m) = mark
                && m.generation == *generation
            {
                m.in_sync = true;
            }
        }
        self.drop_synced_tombstones();
    }

    /// Whether the catalog has everything as of now (nothing to push).
    pub fn all_in_sync(&self) -> bool {
        self.node_mark.in_sync
            && self.services.values().all(|s| s.mark.in_sync)
            && self.checks.values().all(|c| c.mark.in_sync)
    }

    pub fn drop_synced_tombstones(&mut self) {
        self.services.retain(|_, s| !(s.deleted && s.mark.in_sync));
        self.checks.retain(|_, c| !(c.deleted && c.mark.in_sync));
    }

    /// Marks everything out of sync (e.g. the servers lost their state).
    pub fn mark_all_dirty(&mut self) {
        self.node_mark.in_sync = false;
        for s in self.services.values_mut() {
            s.mark.in_sync = false;
        }
        for c in self.checks.values_mut() {
            c.mark.in_sync = false;
        }
        self.dirty = true;
    }

    /// Out-of-sync mark for an entry found different from the catalog by a
    /// full sync (without touching the API-visible state).
    pub(super) fn stale_mark(&mut self) -> SyncMark {
        self.generation += 1;
        self.dirty = true;
        SyncMark {
            in_sync: false,
            generation: self.generation,
        }
    }

    pub(super) fn note_touched(&mut self) {
        self.touched = true;
    }
}

/// Services whose check has been critical longer than its
/// `DeregisterCriticalServiceAfter`, at `now`.
pub fn due_for_deregistration(t: &Tables, now: Instant) -> Vec<String> {
    let mut out: Vec<String> = t
        .live_checks()
        .filter(|c| !c.check.service_id.is_empty())
        .filter_map(|c| {
            let after = c.spec.as_ref()?.deregister_after?;
            let since = c.critical_since?;
            (now.saturating_duration_since(since) >= after).then(|| c.check.service_id.clone())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What an alias check of `service` shows: critical if the service is not
/// on this agent or any of its checks (or of this node's) is critical,
/// warning if one warns, passing otherwise. `own` (the alias check itself)
/// is left out.
pub fn alias_status(t: &Tables, service: &str, own: &str) -> (HealthStatus, String) {
    if t.live_service(service).is_none() {
        return (
            HEALTH_CRITICAL,
            format!("Service {service:?} is not registered on this agent"),
        );
    }
    let worst = t
        .live_checks()
        .filter(|c| c.check.check_id != own)
        .filter(|c| c.check.service_id == service || c.check.service_id.is_empty())
        .map(|c| c.check.status)
        .fold(HEALTH_PASSING, HealthStatus::worse);
    let output = match worst {
        HealthStatus::Passing => "All checks passing".to_string(),
        HealthStatus::Warning => format!("Aliased service {service:?} has a check warning"),
        _ => format!("Aliased service {service:?} has a check critical"),
    };
    (worst, output)
}

/// The port for sidecar `id`: the one it already has (a re-registration
/// keeps it), else `hint` (the one it had before a restart), else the
/// lowest in the range no other service on this agent uses. `parent` is
/// being (re)registered with `parent_port`. `None`: the range is full.
pub fn sidecar_port(
    t: &Tables, id: &str, parent: &str, parent_port: i64, hint: Option<u16>,
) -> Option<u16> {
    let used: std::collections::BTreeSet<i64> = t
        .live_services()
        .filter(|s| s.registered.id != id && s.registered.id != parent)
        .map(|s| s.registered.port)
        .chain([parent_port])
        .collect();
    let free = |p: u16| {
        (sidecar::MIN_PORT..=sidecar::MAX_PORT).contains(&p) && !used.contains(&i64::from(p))
    };
    let current = t
        .live_service(id)
        .and_then(|s| u16::try_from(s.registered.port).ok());
    current
        .into_iter()
        .chain(hint)
        .find(|p| free(*p))
        .or_else(|| (sidecar::MIN_PORT..=sidecar::MAX_PORT).find(|p| free(*p)))
}

/// The shared local state, and the signals around it.
pub struct Local {
    tables: std::sync::Mutex<Tables>,
    /// Wakes the syncer: something is out of sync (or a full sync is asked).
    pub changed: Notify,
    full_asked: AtomicBool,
    /// Bumped on every API-visible change (hash-blocking reads wait on it).
    pub version: watch::Sender<u64>,
}

impl Local {
    pub fn new(tables: Tables) -> Self {
        Local {
            tables: std::sync::Mutex::new(tables),
            changed: Notify::new(),
            full_asked: AtomicBool::new(false),
            version: watch::Sender::new(0),
        }
    }

    /// Runs `f` on the tables (never across an await), then wakes whoever
    /// the change concerns.
    pub fn with<R>(&self, f: impl FnOnce(&mut Tables) -> R) -> R {
        let (r, dirty, touched) = {
            let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
            let r = f(&mut t);
            let flags = (t.dirty, t.touched);
            t.dirty = false;
            t.touched = false;
            (r, flags.0, flags.1)
        };
        if dirty {
            self.changed.notify_one();
        }
        if touched {
            self.version.send_modify(|v| *v += 1);
        }
        r
    }

    /// Asks the syncer for a full sync now.
    pub fn ask_full_sync(&self) {
        self.full_asked.store(true, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Whether a full sync was asked since the last call.
    pub fn take_full_ask(&self) -> bool {
        self.full_asked.swap(false, Ordering::SeqCst)
    }
}

/// Builders shared by the agent's unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// An empty local state for node `a1`.
    pub fn tables() -> Tables {
        Tables::new(NodeInfo {
            name: "a1".into(),
            address: "10.0.0.1".into(),
            ..Default::default()
        })
    }

    pub fn svc(id: &str, tags: &[&str]) -> NodeService {
        NodeService {
            id: id.into(),
            service: id.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        }
    }

    /// A TTL check (critical until passed) of `service` ("" for the node).
    pub fn ttl(id: &str, service: &str) -> (HealthCheck, CheckSpec) {
        let c = HealthCheck {
            check_id: id.into(),
            name: id.into(),
            service_id: service.into(),
            check_type: "ttl".into(),
            definition: serde_json::json!({"TTL": "10s"})
                .as_object()
                .unwrap()
                .clone(),
            ..Default::default()
        };
        let spec = CheckSpec::parse(&c).unwrap();
        (c, spec)
    }

    /// Registers a service with its checks through the API.
    pub fn add(
        t: &mut Tables, s: NodeService, checks: Vec<(HealthCheck, CheckSpec)>, now: Instant,
    ) {
        t.put_service(s, checks, Source::Api, false, now);
    }

    /// `tables()` holding the service `web` with the TTL checks `checks`.
    pub fn web_with(checks: &[&str], now: Instant) -> Tables {
        let mut t = tables();
        let checks = checks.iter().map(|id| ttl(id, "web")).collect();
        add(&mut t, svc("web", &[]), checks, now);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn changes_mark_out_of_sync_and_pushes_mark_back_only_if_unchanged() {
        let now = Instant::now();
        let mut t = web_with(&["c1"], now);
        let g = t.services["web"].mark.generation;
        assert!(!t.services["web"].mark.in_sync);
        assert_eq!(t.checks["c1"].check.status, HEALTH_CRITICAL);
        assert_eq!(t.checks["c1"].critical_since, Some(now));
        // A change after the push was planned: the push does not mark it.
        t.set_check_status("c1", HealthStatus::Passing, "", now);
        let cg = t.checks["c1"].mark.generation;
        t.synced(&[
            (Item::Service("web".into()), g),
            (Item::Check("c1".into()), cg - 1),
        ]);
        assert!(t.services["web"].mark.in_sync);
        assert!(!t.checks["c1"].mark.in_sync);
        assert_eq!(t.checks["c1"].critical_since, None);
    }

    #[test]
    fn output_only_changes_do_not_ask_for_a_push() {
        let now = Instant::now();
        let mut t = web_with(&["c1"], now);
        let g = t.checks["c1"].mark.generation;
        t.synced(&[(Item::Check("c1".into()), g)]);
        t.dirty = false;
        assert!(t.set_check_status("c1", HEALTH_CRITICAL, "new output", now));
        assert!(t.checks["c1"].mark.in_sync);
        assert!(!t.dirty);
        assert!(t.touched);
    }

    #[test]
    fn removing_a_service_takes_its_checks_and_leaves_a_tombstone() {
        let now = Instant::now();
        let mut t = web_with(&["c1"], now);
        assert!(t.remove_service("web"));
        assert!(!t.remove_service("web"));
        assert!(t.checks.is_empty());
        assert!(t.services["web"].deleted);
        let g = t.services["web"].mark.generation;
        t.synced(&[(Item::Service("web".into()), g)]);
        assert!(t.services.is_empty());
    }

    #[test]
    fn replace_existing_checks_removes_the_others() {
        let now = Instant::now();
        let mut t = web_with(&["c1", "c2"], now);
        t.put_service(
            svc("web", &[]),
            vec![ttl("c2", "web")],
            Source::Api,
            true,
            now,
        );
        assert!(t.checks["c1"].deleted);
        assert!(!t.checks["c2"].deleted);
    }

    fn with_sidecar(body: serde_json::Value) -> ServiceDef {
        crate::agent::define::service(body, "a1").unwrap()
    }

    #[test]
    fn a_sidecar_is_registered_with_its_parent_and_goes_with_it() {
        let mut t = tables();
        let now = Instant::now();
        let def = || {
            with_sidecar(serde_json::json!({"Name": "web", "Port": 8080,
            "Connect": {"SidecarService": {}}}))
        };
        t.put_definition(def(), Source::Api, false, now, None)
            .unwrap();
        let sc = t.live_service("web-sidecar-proxy").expect("the sidecar");
        assert_eq!(sc.sidecar_of.as_deref(), Some("web"));
        assert_eq!(sc.registered.port, 21000);
        assert!(sc.effective.is_connect_proxy());
        assert_eq!(
            t.checks["service:web-sidecar-proxy:2"].check.status, "passing",
            "the alias of a web without checks"
        );
        // Re-registered (another service took 21001 since): the same port.
        let mut other = svc("other", &[]);
        other.port = 21001;
        add(&mut t, other, vec![], now);
        t.put_definition(def(), Source::Api, false, now, None)
            .unwrap();
        assert_eq!(t.services["web-sidecar-proxy"].registered.port, 21000);
        // A second parent gets the next free port.
        let api = with_sidecar(serde_json::json!({"Name": "api",
            "Connect": {"SidecarService": {}}}));
        t.put_definition(api, Source::Api, false, now, None)
            .unwrap();
        assert_eq!(t.services["api-sidecar-proxy"].registered.port, 21002);
        // Deregistering the parent takes the sidecar and its checks.
        assert!(t.remove_service("web"));
        assert!(t.live_service("web-sidecar-proxy").is_none());
        assert!(
            t.live_checks()
                .all(|c| c.check.service_id != "web-sidecar-proxy")
        );
        // Re-registered without one: its old sidecar goes; a proxy
        // registered on its own for the same parent stays.
        let mut own = svc("api-proxy", &[]);
        own.kind = "connect-proxy".into();
        own.proxy.destination_service_id = "api".into();
        add(&mut t, own, vec![], now);
        let plain = with_sidecar(serde_json::json!({"Name": "api"}));
        t.put_definition(plain, Source::Api, false, now, None)
            .unwrap();
        assert!(t.live_service("api-sidecar-proxy").is_none());
        assert!(t.live_service("api-proxy").is_some());
    }

    #[test]
    fn a_full_sidecar_range_is_refused_and_changes_nothing() {
        let mut t = tables();
        let now = Instant::now();
        for p in sidecar::MIN_PORT..=sidecar::MAX_PORT {
            let mut s = svc(&format!("s{p}"), &[]);
            s.port = i64::from(p);
            add(&mut t, s, vec![], now);
        }
        let before = t.services.len();
        let def = with_sidecar(serde_json::json!({"Name": "web",
            "Connect": {"SidecarService": {}}}));
        let err = t
            .put_definition(def, Source::Api, false, now, None)
            .unwrap_err();
        assert!(err.to_string().contains("No free sidecar port"), "{err}");
        assert_eq!(t.services.len(), before);
        assert!(t.live_service("web").is_none());
    }

    #[test]
    fn thresholds_stay_out_of_the_catalogs_copy() {
        let mut t = tables();
        let d = with_sidecar(serde_json::json!({"Name": "web", "Check": {
            "TCP": "127.0.0.1:1", "Interval": "5s", "FailuresBeforeCritical": 3}}));
        t.put_definition(d, Source::Api, false, Instant::now(), None)
            .unwrap();
        let c = &t.checks["service:web"].check;
        assert_eq!(c.definition["FailuresBeforeCritical"], 3);
        let e = t.expected_check(c);
        assert!(e.definition.get("FailuresBeforeCritical").is_none());
        assert_eq!(e.definition["TCP"], "127.0.0.1:1");
    }

    #[test]
    fn expected_check_carries_the_service_name_and_tags() {
        let mut t = tables();
        let mut s = svc("web", &[]);
        s.tags = vec!["a".into()];
        add(&mut t, s, vec![ttl("c1", "web")], Instant::now());
        let e = t.expected_check(&t.checks["c1"].check);
        assert_eq!(e.node, "a1");
        assert_eq!(e.service_name, "web");
        assert_eq!(e.service_tags, vec!["a".to_string()]);
    }
}
