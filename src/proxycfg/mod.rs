//! Server-side proxycfg: a live snapshot for every connect proxy in the
//! catalog — its registration with central config merged, and per upstream
//! the compiled discovery chain and the healthy endpoints of each target.
//!
//! One manager serves every proxy. It subscribes to the publisher once per
//! topic (service health, connect health, each config kind) and keeps a dependency index:
//! each proxy holds *watches* (`Watch`, one per resource it read: a
//! service's instances, a config entry), and an event marks dirty exactly the
//! proxies watching what changed. Watches are derived from each rebuild, so
//! they are started and cancelled as chains change; dropping a watch
//! unregisters it. Rebuilds of dirty proxies are coalesced and run in
//! batches on the blocking pool (built and installed there), so one global
//! change cannot starve Raft.
//!
//! The watch index is keyed by the state's watch keys: what each snapshot
//! read, merge inputs included (a chain's are the entries the compiler
//! read). A rebuild is built and installed (watches, comparison, the
//! streams' wake-up) on a blocking thread, so a change every proxy sees
//! holds no async worker in a long poll. Chains, endpoint lists, the roots
//! and the mesh entry's TLS are shared `Arc`s across snapshots, reused
//! while the keys they read are unchanged.
//!
//! What a snapshot holds, beyond the registration and chains: per target
//! its healthy connect-capable endpoints (the target's sidecars or
//! connect-native instances, never the application's own port), with the
//! subset filter and `OnlyPassing` applied; the CA roots; the leaf of the
//! service it fronts, signed on the server, re-signed after a rotation and
//! when due (checked every minute); the intentions towards that service in
//! evaluation order, with the default decision.
//!
//! - `build`: a sidecar's snapshot (this module's `build` dispatches a
//!   registration to it or to `gateway`'s). A sidecar's upstream is
//!   compiled with its mesh gateway mode (the upstream's, else the
//!   proxy's, merged) as the chain's override; a target in another
//!   datacenter in mode `local` or `remote` also gets the gateways it goes
//!   through (`UpstreamSnapshot::gateways`: this datacenter's, read on
//!   `keys::MESH_GATEWAYS`, or the target's through `remote`).
//! - A transparent proxy (merged `Mode: transparent`) also gets as
//!   upstreams the typical services its service's intentions allow
//!   (`connect::intentions::allowed_upstreams`, Consul's
//!   `IntentionTopology`; every one under default allow), reading the
//!   service list and every intention, with its outbound port and the mesh
//!   entry's `MeshDestinationsOnly` (`snapshot::TransparentSnapshot`).
//! - A proxyless gRPC client (`Manager::proxyless`, one handle per stream)
//!   gets a snapshot of its own, keyed apart from registrations: per
//!   service it dials, the chain and the targets' healthy instances
//!   themselves (`build_proxyless`).
//! - `gateway`: a gateway's snapshot (ingress, terminating, mesh).
//! - `remote`: other datacenters' instances and mesh gateways, one watcher
//!   per (datacenter, service, subset filter) or per datacenter, at most
//!   `MAX_WATCHERS`; the other datacenters' names come from the `Fetcher`'s
//!   list (`keys::REMOTE_DATACENTERS`).
//! - `visible`: what a stream's token may see of a shared snapshot's
//!   endpoints (`hidden`, `Snapshot::without`), pure; `snapshot`: the
//!   shapes, and `healthy`, below `build`.

mod build;
mod gateway;
mod remote;
mod snapshot;
#[cfg(test)]
mod tests;
mod visible;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, watch};

pub use build::{Shared, build_proxyless};
pub use remote::{Answer, FetchFuture, Fetcher, MAX_WATCHERS};
pub use snapshot::{
    Endpoints, GatewaySnapshot, LinkedService, Snapshot, TransparentSnapshot, UpstreamSnapshot,
    ViaGateways, gateway_address, healthy,
};
pub use visible::{Hidden, Reader, hidden};

use crate::state::{Store, keys};
use crate::stream::{Item, Publisher, Topic};
use crate::structs::config_entry::Kind;

/// (node, proxy service id).
pub type ProxyKey = (String, String);

/// A resource a proxy's snapshot was built from, named by the state
/// store's watch key (`crate::state::keys`): a service's instances, a
/// config entry.
pub type Dep = crate::state::WatchKey;

/// What building a proxy gives: its snapshot and what it read, or `None`
/// when its registration is gone.
type Built = Option<(Snapshot, BTreeSet<Dep>)>;

/// Builds the snapshot of proxy `key` (a sidecar or a gateway), or `None`
/// if it is not registered (any more) as one.
pub fn build(
    state: &crate::state::State, datacenter: &str, key: &ProxyKey, shared: &mut Shared,
) -> Built {
    let registered = state.services.get(key)?;
    if registered.is_gateway() {
        gateway::build(state, datacenter, key, registered, shared)
    } else if registered.is_connect_proxy() {
        build::sidecar(state, datacenter, key, registered, shared)
    } else {
        None
    }
}

/// Builds one proxy's snapshot. A panic (a bug on some input) is caught
/// here and logged with the proxy: that proxy keeps its last snapshot until
/// its next change, and the others in the batch and after it keep
/// updating. The shared cache may be half-updated by the panic: it starts
/// over empty (its settings kept).
fn build_one(
    state: &crate::state::State, dc: &str, key: ProxyKey, proxyless: Option<&Dialing>,
    shared: &mut Shared,
) -> Option<(ProxyKey, Built)> {
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        #[cfg(test)]
        tests::maybe_panic(&key);
        match proxyless {
            Some((instance, names)) => build_proxyless(state, dc, instance, names, shared),
            None => build(state, dc, &key, shared),
        }
    }));
    match built {
        Ok(r) => Some((key, r)),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(
                node = %key.0,
                proxy = %key.1,
                panic = %why,
                "proxycfg: building this proxy's snapshot panicked; it keeps its last snapshot"
            );
            shared.reset();
            None
        }
    }
}

/// Proxies rebuilt per batch before yielding.
const BATCH: usize = 256;
/// How often proxies' leaves are checked for renewal.
const LEAF_CHECK: Duration = Duration::from_secs(60);
/// Pause after a wake-up so a burst of events becomes one rebuild.
const COALESCE: Duration = Duration::from_millis(5);

pub struct Manager {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<Store>,
    datacenter: String,
    proxies: Mutex<HashMap<ProxyKey, Proxy>>,
    /// resource → proxies watching it, with the number of their watches on
    /// it (a rebuild registers its new watches before dropping the old).
    /// Keys and proxies are shared `Arc`s: 10,000 proxies with 18 watches
    /// each hold one copy of every name.
    deps: Mutex<HashMap<Arc<str>, Watchers>>,
    dirty: Mutex<BTreeSet<ProxyKey>>,
    /// Chains and endpoint lists shared by snapshots (only the rebuild
    /// loop, one batch at a time, uses it).
    shared: Arc<Mutex<Shared>>,
    wake: Notify,
    live_watches: AtomicUsize,
    /// The proxyless gRPC clients served, by their key here: the service
    /// instance each is and the services it dials.
    proxyless: Mutex<HashMap<ProxyKey, Dialing>>,
    next_proxyless: AtomicU64,
    /// Other datacenters' endpoints of chain targets.
    remotes: Arc<remote::Remotes>,
    /// Its tasks until a server takes them to supervise.
    tasks: Mutex<Vec<(&'static str, tokio::task::JoinHandle<()>)>>,
}

/// A proxyless client's service instance and the services it dials.
type Dialing = (ProxyKey, Arc<BTreeSet<String>>);

/// The proxies watching one resource, with how many watches each has on it.
type Watchers = HashMap<Arc<ProxyKey>, usize>;

struct Proxy {
    key: Arc<ProxyKey>,
    snapshot: watch::Sender<Option<Arc<Snapshot>>>,
    watches: Vec<Watch>,
}

impl Proxy {
    /// A proxy with no snapshot yet and no watches.
    fn new(key: &ProxyKey) -> Proxy {
        Proxy {
            key: Arc::new(key.clone()),
            snapshot: watch::channel(None).0,
            watches: Vec::new(),
        }
    }
}

/// A proxy's interest in one resource; unregistered when dropped.
pub struct Watch {
    inner: Weak<Inner>,
    dep: Arc<str>,
    proxy: Arc<ProxyKey>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            let mut deps = inner.deps.lock();
            if let Some(set) = deps.get_mut(&self.dep) {
                if let Some(n) = set.get_mut(&self.proxy) {
                    *n -= 1;
                    if *n == 0 {
                        set.remove(&self.proxy);
                    }
                }
                if set.is_empty() {
                    deps.remove(&self.dep);
                }
            }
            inner.live_watches.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Inner {
    /// Registers `proxy`'s watches on `deps`.
    fn watch_all(self: &Arc<Self>, deps: &BTreeSet<Dep>, proxy: &Arc<ProxyKey>) -> Vec<Watch> {
        let mut index = self.deps.lock();
        let watches: Vec<Watch> = deps
            .iter()
            .map(|dep| {
                let dep: Arc<str> = match index.get_key_value(dep.as_str()) {
                    Some((shared, _)) => shared.clone(),
                    None => Arc::from(dep.as_str()),
                };
                *index
                    .entry(dep.clone())
                    .or_default()
                    .entry(proxy.clone())
                    .or_default() += 1;
                Watch {
                    inner: Arc::downgrade(self),
                    dep,
                    proxy: proxy.clone(),
                }
            })
            .collect();
        self.live_watches
            .fetch_add(watches.len(), Ordering::Relaxed);
        watches
    }

    fn mark(&self, keys: impl IntoIterator<Item = ProxyKey>) {
        let mut dirty = self.dirty.lock();
        let before = dirty.len();
        dirty.extend(keys);
        if dirty.len() != before {
            self.wake.notify_one();
        }
    }

    fn mark_dep(&self, dep: &str) {
        let keys: Vec<ProxyKey> = match self.deps.lock().get(dep) {
            Some(set) => set.keys().map(|k| (**k).clone()).collect(),
            None => return,
        };
        self.mark(keys);
    }

    /// Rebuilds dirty proxies until none is left.
    async fn rebuild_dirty(self: &Arc<Self>) {
        loop {
            let batch: Vec<ProxyKey> = {
                let mut dirty = self.dirty.lock();
                let take: Vec<ProxyKey> = dirty.iter().take(BATCH).cloned().collect();
                for k in &take {
                    dirty.remove(k);
                }
                take
            };
            if batch.is_empty() {
                self.shared.lock().prune();
                remote::reconcile(self);
                return;
            }
            let state = self.store.state();
            let built_at = state.index;
            let remote_seen = self.remotes.changes.load(Ordering::SeqCst);
            let dc = self.datacenter.clone();
            let shared = self.shared.clone();
            let proxyless: HashMap<ProxyKey, Dialing> = {
                let all = self.proxyless.lock();
                batch
                    .iter()
                    .filter_map(|k| Some((k.clone(), all.get(k)?.clone())))
                    .collect()
            };
            // Installed on the blocking thread too: a batch's installs
            // (watches registered, snapshots compared, streams woken) held
            // an async worker for one long poll, and HTTP and Raft waited
            // behind it during a change every proxy sees.
            let inner = self.clone();
            // (`off_workers`: in place on a runtime of one thread, the
            // simulation's hosts, so that a seed replays the same.)
            let done = crate::tasks::off_workers(move || {
                let built: Vec<_> = {
                    let mut shared = shared.lock();
                    batch
                        .into_iter()
                        .filter_map(|k| {
                            let dialing = proxyless.get(&k);
                            build_one(&state, &dc, k, dialing, &mut shared)
                        })
                        .collect()
                };
                for (key, result) in built {
                    inner.install(key, result, built_at, remote_seen);
                }
            })
            .await;
            if let Err(e) = done {
                std::panic::resume_unwind(Box::new(e)); // as if it ran here
            }
            tokio::task::yield_now().await;
        }
    }

    /// Installs a rebuilt snapshot and its watches (or tears the proxy down
    /// when its registration is gone).
    /// `built_at`: the index of the state it was built from;
    /// `remote_seen`: the remote lists' change count before it was built.
    fn install(self: &Arc<Self>, key: ProxyKey, result: Built, built_at: u64, remote_seen: u64) {
        let Some((snapshot, deps)) = result else {
            let gone = self.proxies.lock().remove(&key);
            drop(gone); // its watches unregister here, outside the lock
            return;
        };
        // Only this loop removes proxies: the entry made here is still
        // there below.
        let shared_key = self
            .proxies
            .lock()
            .entry(key.clone())
            .or_insert_with(|| Proxy::new(&key))
            .key
            .clone();
        let mut watches = self.watch_all(&deps, &shared_key);
        // A write to something this build read, committed after the state
        // it read and before its watches were registered, marked no one
        // (a first build reads keys nobody watched yet): look once more
        // now that the watches are in, or the snapshot would stay stale.
        if self.store.state().index_of(deps.iter()) > built_at {
            self.mark([key.clone()]);
        }
        // The same for another datacenter's lists, which no index orders.
        if self.remotes.changes.load(Ordering::SeqCst) != remote_seen
            && deps
                .iter()
                .any(|d| d.as_str().starts_with(keys::REMOTE_PREFIX))
        {
            self.mark([key.clone()]);
        }
        let mut proxies = self.proxies.lock();
        let Some(proxy) = proxies.get_mut(&key) else {
            return;
        };
        std::mem::swap(&mut proxy.watches, &mut watches);
        let changed = proxy
            .snapshot
            .borrow()
            .as_ref()
            .is_none_or(|old| !old.same_content(&snapshot));
        if changed {
            let version = proxy.snapshot.borrow().as_ref().map_or(0, |s| s.version) + 1;
            proxy.snapshot.send_replace(Some(Arc::new(Snapshot {
                version,
                ..snapshot
            })));
        }
        drop(proxies);
        drop(watches); // the previous watches, outside the lock
    }
}

/// Follows one topic for as long as the manager lives: each event goes to
/// `on_event`; on a restart of the stream every known proxy is checked
/// again (those gone are torn down by their rebuild).
fn follow(
    inner: &Arc<Inner>, publisher: &Publisher, topic: Topic,
    on_event: impl Fn(&Inner, &crate::stream::Event) + Send + 'static,
) {
    let mut sub = publisher.subscribe(inner.store.clone(), topic, "", 0);
    let weak = Arc::downgrade(inner);
    let task = tokio::spawn(async move {
        loop {
            // No reader (the manager's own): never refused.
            let Ok(item) = sub.next().await else { return };
            let Some(inner) = weak.upgrade() else { return };
            match item {
                Item::Event(e) => on_event(&inner, &e),
                Item::NewSnapshotToFollow => {
                    let all: Vec<ProxyKey> = inner.proxies.lock().keys().cloned().collect();
                    inner.mark(all);
                }
                Item::EndOfSnapshot(_) => {}
            }
        }
    });
    inner.tasks.lock().push(("proxycfg subscription", task));
}

impl Manager {
    /// Starts the manager: subscriptions and the rebuild loop.
    /// `default_allow`: the intentions' decision when none matches.
    pub fn start(
        store: Arc<Store>, publisher: &Publisher, datacenter: &str, default_allow: bool,
    ) -> Manager {
        let inner = Arc::new(Inner {
            store: store.clone(),
            datacenter: datacenter.to_string(),
            proxies: Mutex::new(HashMap::new()),
            deps: Mutex::new(HashMap::new()),
            dirty: Mutex::new(BTreeSet::new()),
            shared: Arc::default(),
            wake: Notify::new(),
            live_watches: AtomicUsize::new(0),
            proxyless: Mutex::new(HashMap::new()),
            next_proxyless: AtomicU64::new(0),
            remotes: Arc::default(),
            tasks: Mutex::new(Vec::new()),
        });
        inner.shared.lock().deny_by_default = !default_allow;
        follow(&inner, publisher, Topic::ServiceHealth, |inner, e| {
            inner.mark_dep(&keys::service(&e.key));
            // What reads the catalog's service list (a gateway linking `*`,
            // a mesh gateway) may gain or lose a service with any event.
            inner.mark_dep(&keys::SERVICES);
            if let Some(i) = e.instance.as_ref().filter(|i| i.service.is_xds_proxy()) {
                inner.mark([(i.node.node.clone(), i.service.id.clone())]);
            }
            // Sidecars in mode `local` read this datacenter's mesh gateways.
            if e.instance
                .as_ref()
                .is_some_and(|i| i.service.kind == crate::structs::ServiceKind::MeshGateway)
            {
                inner.mark_dep(&keys::MESH_GATEWAYS);
            }
        });
        // Chain targets' endpoints are their connect-capable instances,
        // keyed on this topic by the service they front.
        follow(
            &inner,
            publisher,
            Topic::ServiceHealthConnect,
            |inner, e| inner.mark_dep(&keys::connect(&e.key)),
        );
        follow(&inner, publisher, Topic::CaRoots, |inner, _| {
            inner.mark_dep(&keys::CONNECT_CA)
        });
        for kind in Kind::ALL {
            follow(&inner, publisher, Topic::Config(kind), move |inner, e| {
                inner.mark_dep(&keys::config(kind.as_str(), &e.key));
                // What reads a whole kind (a transparent proxy, every
                // intention).
                inner.mark_dep(&keys::config_kind(kind.as_str()));
            });
        }
        let worker = inner.clone();
        let rebuild = tokio::spawn(crate::tasks::fault("proxycfg rebuilder", async move {
            loop {
                if worker.dirty.lock().is_empty() {
                    worker.wake.notified().await;
                    tokio::time::sleep(COALESCE).await;
                }
                worker.rebuild_dirty().await;
            }
        }));
        inner.tasks.lock().push(("proxycfg rebuilder", rebuild));
        // Leaves are renewed before they expire: proxies whose leaf is due
        // are rebuilt (which signs a new one).
        let renewer = Arc::downgrade(&inner);
        let renew = tokio::spawn(crate::tasks::fault("proxycfg leaf renewal", async move {
            let mut tick = tokio::time::interval(LEAF_CHECK);
            loop {
                tick.tick().await;
                let Some(inner) = renewer.upgrade() else {
                    return;
                };
                let now = time::OffsetDateTime::now_utc();
                let due: Vec<ProxyKey> = inner
                    .proxies
                    .lock()
                    .iter()
                    .filter(|(_, p)| {
                        p.snapshot.borrow().as_ref().is_some_and(|s| {
                            s.leaf
                                .as_ref()
                                .is_some_and(|l| crate::connect::ca::renew_at(l) <= now)
                        })
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                inner.mark(due);
            }
        }));
        inner.tasks.lock().push(("proxycfg leaf renewal", renew));
        Manager { inner }
    }

    /// The manager's tasks (its subscriptions and the rebuild loop), for a
    /// server to supervise: they run as long as the manager.
    pub fn take_tasks(&self) -> Vec<(&'static str, tokio::task::JoinHandle<()>)> {
        std::mem::take(&mut *self.inner.tasks.lock())
    }

    /// The current snapshot of a proxy and a way to wait for the next one.
    pub fn snapshot(&self, key: &ProxyKey) -> Option<watch::Receiver<Option<Arc<Snapshot>>>> {
        self.inner
            .proxies
            .lock()
            .get(key)
            .map(|p| p.snapshot.subscribe())
    }

    /// Serves a proxyless gRPC client, the service instance `instance`:
    /// its snapshot is built and rebuilt as a proxy's, for the services
    /// `Proxyless::dial` names, under a key of its own for as long as the
    /// handle lives (one per stream; never a registration's key: a node
    /// name cannot hold a NUL).
    pub fn proxyless(&self, instance: ProxyKey) -> Proxyless {
        let id = self.inner.next_proxyless.fetch_add(1, Ordering::Relaxed);
        let key = ("\0proxyless".to_string(), id.to_string());
        self.inner
            .proxyless
            .lock()
            .insert(key.clone(), (instance, Arc::default()));
        let snapshot = self
            .inner
            .proxies
            .lock()
            .entry(key.clone())
            .or_insert_with(|| Proxy::new(&key))
            .snapshot
            .subscribe();
        self.inner.mark([key.clone()]);
        Proxyless {
            inner: Arc::downgrade(&self.inner),
            key,
            snapshot,
        }
    }

    /// The DNS domain (`--domain`) an ingress gateway's leaf names its
    /// `*.ingress.<domain>` hosts in; `consul` until set.
    pub fn set_dns_domain(&self, domain: &str) {
        let domain = crate::tls::tls_domain(domain);
        let mut shared = self.inner.shared.lock();
        if shared.dns_domain != domain {
            shared.dns_domain = domain;
            drop(shared);
            let all: Vec<ProxyKey> = self.inner.proxies.lock().keys().cloned().collect();
            self.inner.mark(all);
        }
    }

    /// Hands in how other datacenters are read (process assembly: the WAN
    /// federation). Until then, and without it, chain targets in other
    /// datacenters get no endpoints. Proxies already built are rebuilt.
    pub fn set_remote(&self, fetcher: Arc<dyn Fetcher>) {
        if self.inner.remotes.set_fetcher(fetcher) {
            self.inner.shared.lock().remote = Some(self.inner.remotes.clone());
            let all: Vec<ProxyKey> = self.inner.proxies.lock().keys().cloned().collect();
            self.inner.mark(all);
        }
    }

    /// Other datacenters' watchers running (at most `MAX_WATCHERS`).
    pub fn remote_watchers(&self) -> usize {
        self.inner.remotes.running()
    }

    /// Proxies with state, and watches registered for them (for tests and
    /// metrics: a torn-down proxy leaves none behind).
    pub fn counts(&self) -> (usize, usize) {
        (
            self.inner.proxies.lock().len(),
            self.inner.live_watches.load(Ordering::Relaxed),
        )
    }
}

/// A proxyless client served by the manager; dropped, its state goes.
pub struct Proxyless {
    inner: Weak<Inner>,
    key: ProxyKey,
    snapshot: watch::Receiver<Option<Arc<Snapshot>>>,
}

impl Proxyless {
    /// Its snapshot and its rebuilds (the sender dropped: the instance
    /// was deregistered).
    pub fn snapshot(&self) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.snapshot.clone()
    }

    /// The services it dials now; a change rebuilds its snapshot.
    pub fn dial(&self, names: BTreeSet<String>) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut all = inner.proxyless.lock();
        let Some(entry) = all.get_mut(&self.key) else {
            return;
        };
        if *entry.1 != names {
            entry.1 = Arc::new(names);
            drop(all);
            inner.mark([self.key.clone()]);
        }
    }
}

impl Drop for Proxyless {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.proxyless.lock().remove(&self.key);
            // Rebuilt without its entry, it finds no registration: torn down.
            inner.mark([self.key.clone()]);
        }
    }
}
