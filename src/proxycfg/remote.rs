//! What proxycfg reads of other datacenters: a chain target's healthy
//! connect-capable instances there (sidecars or connect-native instances,
//! dialled at their own addresses in mesh gateway mode `none`, Consul's
//! default; in modes `local` and `remote` their health decides whether the
//! gateways carry the target), kept live by a blocking read of that
//! datacenter's `/v1/health/connect/<service>`; that datacenter's mesh
//! gateways (`/v1/internal/mesh-gateways` there), for mode `remote` and
//! for this datacenter's mesh gateways; and which other datacenters there
//! are (the federation's list, followed as it grows).
//!
//! One watcher per (datacenter, service, subset filter), or per
//! datacenter for its gateways, shared by every proxy whose snapshot read
//! it: a build asks for the list (`endpoints`, `gateways`), the proxy's
//! watch on the synthetic key (`keys::remote_connect`,
//! `keys::remote_mesh_gateways`) keeps it wanted, and after each rebuild
//! batch `reconcile` starts the watchers wanted and stops those no proxy
//! watches any more, at most `MAX_WATCHERS` of both kinds together. An
//! answer that changes the list marks the proxies watching it dirty, as a
//! local endpoint change does. A datacenter out of reach leaves the last
//! list served (as Consul serves its cache) and is retried with backoff.
//!
//! The proxycfg layer knows no HTTP or federation: process assembly hands
//! in a `Fetcher` (the WAN federation's forwarding).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::Inner;
use super::snapshot::{Endpoints, healthy};
use crate::state::catalog::Instance;
use crate::state::keys;

/// At most this many remote watchers run per server; targets past it have
/// no remote endpoints (counted and logged) until others stop.
pub const MAX_WATCHERS: usize = 256;
/// A blocking read's wait in the other datacenter.
const WAIT: Duration = Duration::from_secs(30);
/// Above the wait: the other side answers at the wait's end (plus its
/// jitter of up to wait/16).
const TIMEOUT: Duration = Duration::from_secs(40);
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// An answer of the other datacenter: status, `X-Consul-Index`, body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub index: u64,
    pub body: Vec<u8>,
}

pub type FetchFuture<'a> = Pin<Box<dyn Future<Output = Result<Answer, String>> + Send + 'a>>;

/// A GET on another datacenter's HTTP API (a server there answers it as if
/// asked there), within `timeout`; and the other datacenters known.
pub trait Fetcher: Send + Sync + 'static {
    fn get(&self, dc: &str, path_and_query: String, timeout: Duration) -> FetchFuture<'_>;

    /// The other datacenters as they become known (never this one). None
    /// by default: a source that knows of no others.
    fn datacenters(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        tokio::sync::watch::channel(Vec::new()).1
    }
}

/// What a remote watcher follows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    /// A service's connect-capable instances (with a subset filter).
    Connect {
        dc: String,
        service: String,
        filter: String,
    },
    /// The datacenter's mesh gateways.
    MeshGateways { dc: String },
}

impl Target {
    fn dc(&self) -> &str {
        match self {
            Target::Connect { dc, .. } | Target::MeshGateways { dc } => dc,
        }
    }

    /// What it reads there, named for the logs.
    fn what(&self) -> &str {
        match self {
            Target::Connect { service, .. } => service,
            Target::MeshGateways { .. } => "its mesh gateways",
        }
    }

    /// The blocking read of it from `index`.
    fn path(&self, index: u64) -> String {
        let wait = WAIT.as_secs();
        match self {
            Target::Connect {
                service, filter, ..
            } => {
                let mut filter_arg = String::new();
                if !filter.is_empty() {
                    filter_arg = format!("&filter={}", crate::request::enc(filter));
                }
                format!(
                    "/v1/health/connect/{}?stale&index={index}&wait={wait}s{filter_arg}",
                    crate::request::enc(service),
                )
            }
            Target::MeshGateways { .. } => {
                format!("/v1/internal/mesh-gateways?stale&index={index}&wait={wait}s")
            }
        }
    }
}

struct Entry {
    target: Target,
    /// `None` until the first answer.
    endpoints: Option<Endpoints>,
    task: Option<tokio::task::AbortHandle>,
    /// Refused by the cap (logged once until it runs).
    refused: bool,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

#[derive(Default)]
pub(super) struct Remotes {
    fetcher: OnceLock<Arc<dyn Fetcher>>,
    /// dep key text → its watcher.
    entries: Mutex<HashMap<String, Entry>>,
    /// Bumped after every change of a list: a build that began before it
    /// may have read the old list before its watches were registered.
    pub(super) changes: AtomicU64,
    /// The other datacenters known, as the fetcher last said.
    datacenters: Mutex<Vec<String>>,
    /// The task following that list.
    follower: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Remotes {
    fn drop(&mut self) {
        if let Some(t) = self.follower.get_mut().take() {
            t.abort();
        }
    }
}

impl Remotes {
    pub(super) fn set_fetcher(&self, f: Arc<dyn Fetcher>) -> bool {
        self.fetcher.set(f).is_ok()
    }

    /// The healthy connect-capable instances of `service` in `dc` as last
    /// heard (never critical; with `only_passing`, never warning either),
    /// and the key to watch for their changes. Asking makes the target
    /// wanted: its watcher starts at the next `reconcile` if the proxy
    /// watches the key by then.
    pub(super) fn endpoints(
        &self, dc: &str, service: &str, filter: &str, only_passing: bool,
    ) -> (Option<Endpoints>, crate::state::WatchKey) {
        let dep = keys::remote_connect(dc, service, filter);
        let rows = self.wanted(
            &dep,
            Target::Connect {
                dc: dc.to_string(),
                service: service.to_string(),
                filter: filter.to_string(),
            },
        );
        let rows = rows.map(|rows| {
            if only_passing && rows.iter().any(|i| !healthy(&i.checks, true)) {
                Arc::new(
                    rows.iter()
                        .filter(|i| healthy(&i.checks, true))
                        .cloned()
                        .collect(),
                )
            } else {
                rows
            }
        });
        (rows, dep)
    }

    /// The healthy mesh gateways of `dc` as last heard, and the key to
    /// watch for their changes (asking makes them wanted, as `endpoints`).
    pub(super) fn gateways(&self, dc: &str) -> (Option<Endpoints>, crate::state::WatchKey) {
        let dep = keys::remote_mesh_gateways(dc);
        let rows = self.wanted(&dep, Target::MeshGateways { dc: dc.to_string() });
        (rows, dep)
    }

    /// The other datacenters known now (watch `keys::REMOTE_DATACENTERS`).
    pub(super) fn datacenters(&self) -> Vec<String> {
        self.datacenters.lock().clone()
    }

    /// The list of `target` as last heard, its entry made if new.
    fn wanted(&self, dep: &crate::state::WatchKey, target: Target) -> Option<Endpoints> {
        let mut entries = self.entries.lock();
        let entry = entries
            .entry(dep.as_str().to_string())
            .or_insert_with(|| Entry {
                target,
                endpoints: None,
                task: None,
                refused: false,
            });
        entry.endpoints.clone()
    }

    /// Whether a wanted target has no watcher for the cap.
    #[cfg(test)]
    pub(super) fn has_refused(&self) -> bool {
        self.entries.lock().values().any(|e| e.refused)
    }

    /// Watchers running.
    pub(super) fn running(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|e| e.task.is_some())
            .count()
    }
}

/// Starts the watchers of the remote keys some proxy watches (within the
/// cap) and drops those none watches.
pub(super) fn reconcile(inner: &Arc<Inner>) {
    let wanted: HashSet<String> = inner
        .deps
        .lock()
        .keys()
        .filter(|k| k.starts_with(keys::REMOTE_PREFIX))
        .map(|k| k.to_string())
        .collect();
    let remotes = &inner.remotes;
    if let Some(fetcher) = remotes.fetcher.get() {
        follow_datacenters(inner, fetcher);
    }
    let mut entries = remotes.entries.lock();
    // Dropping an entry aborts its watcher.
    entries.retain(|dep, _| wanted.contains(dep));
    let Some(fetcher) = remotes.fetcher.get() else {
        return; // no federation (a lone datacenter, a unit test)
    };
    let mut running = entries.values().filter(|e| e.task.is_some()).count();
    for (dep, e) in entries.iter_mut().filter(|(_, e)| e.task.is_none()) {
        if running >= MAX_WATCHERS {
            if !e.refused {
                e.refused = true;
                crate::metrics::PROXYCFG_REMOTE_REFUSED.inc();
                tracing::warn!(
                    datacenter = %e.target.dc(),
                    reading = %e.target.what(),
                    max = MAX_WATCHERS,
                    "proxycfg: too many remote datacenter watchers; this target gets no remote endpoints until others stop"
                );
            }
            continue;
        }
        running += 1;
        e.refused = false;
        let task = tokio::spawn(watch(
            Arc::downgrade(inner),
            fetcher.clone(),
            dep.clone(),
            e.target.clone(),
        ));
        e.task = Some(task.abort_handle());
    }
}

/// Follows one target in its datacenter with blocking reads resumed at the
/// last index; errors back off and keep the last list.
async fn watch(inner: Weak<Inner>, fetcher: Arc<dyn Fetcher>, dep: String, t: Target) {
    let mut index = 0u64;
    let mut backoff = MIN_BACKOFF;
    loop {
        let path = t.path(index);
        let asked = tokio::time::Instant::now();
        let error = match fetcher.get(t.dc(), path, TIMEOUT).await {
            Ok(a) if a.status == 200 => match serde_json::from_slice::<Vec<Instance>>(&a.body) {
                Ok(rows) => {
                    backoff = MIN_BACKOFF;
                    // An answer at once with nothing new (a server that
                    // does not block): no tighter loop than this.
                    if index != 0 && a.index == index && asked.elapsed() < MIN_BACKOFF {
                        tokio::time::sleep(MIN_BACKOFF).await;
                    }
                    // An index going backwards (the other side restored a
                    // snapshot, or another server answered): start over.
                    index = if a.index < index { 0 } else { a.index };
                    let rows: Endpoints = Arc::new(
                        rows.into_iter()
                            .filter(|i| healthy(&i.checks, false))
                            .map(Arc::new)
                            .collect(),
                    );
                    let Some(inner) = inner.upgrade() else { return };
                    if update(&inner, &dep, rows) {
                        inner.remotes.changes.fetch_add(1, Ordering::SeqCst);
                        inner.mark_dep(&dep);
                    }
                    continue;
                }
                Err(e) => format!("undecodable answer: {e}"),
            },
            Ok(a) => format!(
                "status {}: {}",
                a.status,
                String::from_utf8_lossy(&a.body[..a.body.len().min(200)]).trim()
            ),
            Err(e) => e,
        };
        if inner.strong_count() == 0 {
            return;
        }
        tracing::warn!(
            datacenter = %t.dc(),
            reading = %t.what(),
            error = %error,
            retry_in_ms = backoff.as_millis() as u64,
            "proxycfg: could not read the instances of another datacenter; its last endpoints stay in use"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Follows the fetcher's list of other datacenters (once: the first
/// reconcile after the fetcher is set starts it), marking what reads it
/// on every change.
fn follow_datacenters(inner: &Arc<Inner>, fetcher: &Arc<dyn Fetcher>) {
    let mut follower = inner.remotes.follower.lock();
    if follower.is_some() {
        return;
    }
    let mut rx = fetcher.datacenters();
    let weak = Arc::downgrade(inner);
    let task = tokio::spawn(async move {
        loop {
            let list = rx.borrow_and_update().clone();
            let Some(inner) = weak.upgrade() else { return };
            let changed = {
                let mut known = inner.remotes.datacenters.lock();
                let changed = *known != list;
                *known = list;
                changed
            };
            if changed {
                inner.remotes.changes.fetch_add(1, Ordering::SeqCst);
                inner.mark_dep(&keys::REMOTE_DATACENTERS);
            }
            drop(inner);
            if rx.changed().await.is_err() {
                return; // the source is gone: the last list stays
            }
        }
    });
    *follower = Some(task.abort_handle());
}

/// Stores a new list; whether it differs from the last.
fn update(inner: &Inner, dep: &str, rows: Endpoints) -> bool {
    let mut entries = inner.remotes.entries.lock();
    let Some(e) = entries.get_mut(dep) else {
        return false; // no longer wanted
    };
    if e.endpoints.as_ref() == Some(&rows) {
        return false;
    }
    e.endpoints = Some(rows);
    true
}
