//! proxycfg against a live store and publisher: a proxy's snapshot follows
//! its upstream's chain and endpoints, and deregistration tears every watch
//! down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::state::Command;
use crate::structs::{DeregisterRequest, HealthCheck, NodeService, RegisterRequest, Upstream};

/// The shared store and publisher, with a proxycfg manager on them.
struct World {
    base: crate::testing::World,
    manager: Manager,
}

impl World {
    fn new() -> World {
        let base = crate::testing::World::new();
        let manager = Manager::start(base.store.clone(), &base.publisher, "dc1", true);
        World { base, manager }
    }

    fn apply(&mut self, cmd: Command) {
        self.base.apply(cmd);
    }

    fn register(&mut self, node: &str, svc: NodeService, status: &str) {
        let check = HealthCheck {
            check_id: format!("{}-check", svc.id),
            name: "check".into(),
            status: status.parse().unwrap(),
            service_id: svc.id.clone(),
            ..Default::default()
        };
        self.apply(Command::Register(Box::new(RegisterRequest {
            node: node.into(),
            address: "10.0.0.1".into(),
            service: Some(svc),
            checks: vec![check],
            ..Default::default()
        })));
    }

    /// A `db` instance and its sidecar proxy (carrying the parent's meta,
    /// as an agent copies it), both with a check in `status`.
    fn register_db(&mut self, node: &str, id: &str, version: &str, status: &str) {
        self.register(node, instance(id, "db", version), status);
        let mut sidecar = instance(&format!("{id}-sidecar-proxy"), "db-sidecar-proxy", version);
        sidecar.kind = "connect-proxy".into();
        sidecar.port = SIDECAR_PORT;
        sidecar.proxy.destination_service_name = "db".into();
        sidecar.proxy.destination_service_id = id.into();
        self.register(node, sidecar, status);
    }

    /// Waits (≤ 1 s) for the proxy's snapshot to satisfy `pred`.
    async fn until(
        &self, key: &ProxyKey, what: &str, pred: impl Fn(&Snapshot) -> bool,
    ) -> Arc<Snapshot> {
        // Generous: it bounds a failure only, and a loaded machine (CI's
        // two cores) can take over a second to rebuild.
        const WITHIN: Duration = Duration::from_secs(10);
        let deadline = Instant::now() + WITHIN;
        loop {
            if let Some(rx) = self.manager.snapshot(key)
                && let Some(s) = rx.borrow().clone()
                && pred(&s)
            {
                return s;
            }
            if Instant::now() >= deadline {
                let snap = self
                    .manager
                    .snapshot(key)
                    .and_then(|rx| rx.borrow().clone());
                panic!(
                    "within {WITHIN:?}: {what}; have {:?}",
                    snap.map(|s| serde_json::to_string(&s.upstreams).unwrap())
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn instance(id: &str, name: &str, version: &str) -> NodeService {
    NodeService {
        id: id.into(),
        service: name.into(),
        port: 8080,
        meta: [("version".to_string(), version.to_string())].into(),
        ..Default::default()
    }
}

fn proxy() -> NodeService {
    let mut p = instance("web-proxy", "web-proxy", "");
    p.kind = "connect-proxy".into();
    p.proxy.destination_service_name = "web".into();
    p.proxy.upstreams = vec![Upstream {
        destination_name: "db".into(),
        local_bind_port: 9191,
        ..Default::default()
    }];
    p
}

const SIDECAR_PORT: i64 = 21001;

/// The endpoints' service IDs, checking each is a sidecar on its proxy
/// port (a proxy never dials the application's own port).
fn endpoint_ids(s: &Snapshot, target: &str) -> Vec<String> {
    s.upstreams["db"]
        .endpoints
        .get(target)
        .map_or(vec![], |rows| {
            rows.iter()
                .map(|r| {
                    assert!(r.service.is_connect_proxy(), "{:?}", r.service);
                    assert_eq!(r.service.port, SIDECAR_PORT);
                    r.service.id.clone()
                })
                .collect()
        })
}

const DB: &str = "db.default.default.dc1";

/// The proxy ids whose build panics (a stand-in for a bug on some input).
static PANICS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

pub(super) fn maybe_panic(key: &ProxyKey) {
    if PANICS.lock().unwrap().contains(&key.1) {
        panic!("injected panic for {}", key.1);
    }
}

#[tokio::test]
async fn a_panic_building_one_proxy_leaves_the_others_updating() {
    PANICS.lock().unwrap().push("bad-proxy".into());
    let mut w = World::new();
    let mut bad = proxy();
    bad.id = "bad-proxy".into();
    w.register("n1", proxy(), "passing");
    w.register("n1", bad, "passing");
    w.register_db("n2", "db1", "v1", "passing");
    let good = ("n1".to_string(), "web-proxy".to_string());
    w.until(&good, "db1 healthy", |s| {
        endpoint_ids(s, DB) == ["db1-sidecar-proxy"]
    })
    .await;
    // Later changes still reach the good proxy: the rebuild loop survived.
    w.register_db("n3", "db2", "v1", "passing");
    w.until(&good, "db1 and db2", |s| {
        endpoint_ids(s, DB) == ["db1-sidecar-proxy", "db2-sidecar-proxy"]
    })
    .await;
    let bad = ("n1".to_string(), "bad-proxy".to_string());
    assert!(
        w.manager
            .snapshot(&bad)
            .is_none_or(|rx| rx.borrow().is_none()),
        "the panicking proxy has no snapshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_follows_chain_health_and_instances() {
    let mut w = World::new();
    w.register_db("n1", "db1", "v1", "passing");
    w.register("n2", proxy(), "passing");
    let key = ("n2".to_string(), "web-proxy".to_string());
    let s = w
        .until(&key, "the upstream's chain and endpoint", |s| {
            endpoint_ids(s, DB) == ["db1-sidecar-proxy"]
        })
        .await;
    assert!(s.upstreams["db"].chain.is_some());

    // A new instance shows up.
    w.register_db("n3", "db2", "v2", "passing");
    w.until(&key, "a new instance", |s| {
        endpoint_ids(s, DB) == ["db1-sidecar-proxy", "db2-sidecar-proxy"]
    })
    .await;

    // A failing check takes it out.
    w.register_db("n1", "db1", "v1", "critical");
    w.until(&key, "the critical instance gone", |s| {
        endpoint_ids(s, DB) == ["db2-sidecar-proxy"]
    })
    .await;

    // A splitter (with the resolver subsets it needs) reshapes the chain and
    // starts watches on the new targets.
    for entry in [
        json!({"Kind": "service-defaults", "Name": "db", "Protocol": "http"}),
        json!({"Kind": "service-resolver", "Name": "db", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}}),
        json!({"Kind": "service-splitter", "Name": "db", "Splits": [
            {"Weight": 90, "ServiceSubset": "v1"}, {"Weight": 10, "ServiceSubset": "v2"}]}),
    ] {
        w.apply(Command::ConfigSet { entry, cas: None });
    }
    let s = w
        .until(&key, "the split chain", |s| {
            s.upstreams["db"]
                .chain
                .as_ref()
                .is_some_and(|c| c.start_node.starts_with("splitter:"))
        })
        .await;
    assert_eq!(
        endpoint_ids(&s, "v2.db.default.default.dc1"),
        ["db2-sidecar-proxy"]
    );
    assert!(
        endpoint_ids(&s, "v1.db.default.default.dc1").is_empty(),
        "v1's only instance is critical"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregistering_the_proxy_tears_down_its_watches() {
    let mut w = World::new();
    w.register_db("n1", "db1", "v1", "passing");
    // db's sidecar is a proxy too: what it holds is the baseline.
    let sidecar = ("n1".to_string(), "db1-sidecar-proxy".to_string());
    w.until(&sidecar, "the sidecar's snapshot", |_| true).await;
    let baseline = w.manager.counts();
    w.register("n2", proxy(), "passing");
    let key = ("n2".to_string(), "web-proxy".to_string());
    w.until(&key, "first snapshot", |s| !endpoint_ids(s, DB).is_empty())
        .await;
    let (proxies, watches) = w.manager.counts();
    assert_eq!(proxies, baseline.0 + 1);
    assert!(watches > baseline.1);
    w.apply(Command::Deregister(DeregisterRequest {
        node: "n2".into(),
        service_id: "web-proxy".into(),
        ..Default::default()
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.manager.counts() != baseline {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            w.manager.counts()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_with_the_same_upstream_share_its_chain_and_endpoints() {
    let mut w = World::new();
    w.register_db("n1", "db1", "v1", "passing");
    w.register("n2", proxy(), "passing");
    let mut other = proxy();
    other.id = "api-proxy".into();
    other.proxy.destination_service_name = "api".into();
    w.register("n3", other, "passing");
    let a = w
        .until(&("n2".into(), "web-proxy".into()), "first", |s| {
            !endpoint_ids(s, DB).is_empty()
        })
        .await;
    let b = w
        .until(&("n3".into(), "api-proxy".into()), "second", |s| {
            !endpoint_ids(s, DB).is_empty()
        })
        .await;
    let (ua, ub) = (&a.upstreams["db"], &b.upstreams["db"]);
    assert!(Arc::ptr_eq(
        ua.chain.as_ref().unwrap(),
        ub.chain.as_ref().unwrap()
    ));
    assert!(Arc::ptr_eq(&ua.endpoints[DB], &ub.endpoints[DB]));

    // A change to db's instances gives both the same new list.
    w.register_db("n4", "db2", "v2", "passing");
    let a = w
        .until(&("n2".into(), "web-proxy".into()), "db2 in web's", |s| {
            endpoint_ids(s, DB) == ["db1-sidecar-proxy", "db2-sidecar-proxy"]
        })
        .await;
    let b = w
        .until(&("n3".into(), "api-proxy".into()), "db2 in api's", |s| {
            endpoint_ids(s, DB) == ["db1-sidecar-proxy", "db2-sidecar-proxy"]
        })
        .await;
    assert!(Arc::ptr_eq(
        &a.upstreams["db"].endpoints[DB],
        &b.upstreams["db"].endpoints[DB]
    ));
}

/// A proxyless client's snapshot: the services it dials (a change of them
/// rebuilds it), their instances themselves as endpoints (not their
/// sidecars), health followed; the handle dropped, its state goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxyless_client_dials_instances_and_goes_with_its_handle() {
    let mut w = World::new();
    w.register("n1", instance("client-1", "client", ""), "passing");
    w.register_db("n2", "db1", "v1", "passing");
    w.register_db("n3", "db2", "v1", "passing");
    let handle = w
        .manager
        .proxyless(("n1".to_string(), "client-1".to_string()));
    let mut rx = handle.snapshot();
    let until = |rx: &mut watch::Receiver<Option<Arc<Snapshot>>>,
                 what: &str,
                 pred: &dyn Fn(&Snapshot) -> bool| {
        // Generous: it bounds a failure only, and a loaded machine (CI's
        // two cores) can take over a second to rebuild.
        const WITHIN: Duration = Duration::from_secs(10);
        let deadline = Instant::now() + WITHIN;
        loop {
            if let Some(s) = rx.borrow_and_update().clone()
                && pred(&s)
            {
                return s;
            }
            assert!(Instant::now() < deadline, "within {WITHIN:?}: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let ids = |s: &Snapshot| -> Vec<String> {
        s.upstreams
            .get("db")
            .and_then(|u| u.endpoints.get(DB))
            .map_or(vec![], |rows| {
                rows.iter()
                    .map(|r| {
                        assert!(
                            !r.service.is_connect_proxy(),
                            "the instance, not its sidecar"
                        );
                        r.service.id.clone()
                    })
                    .collect()
            })
    };
    until(&mut rx, "built, dialing nothing", &|s| {
        s.upstreams.is_empty()
    });
    handle.dial(["db".to_string()].into());
    until(&mut rx, "db's instances", &|s| ids(s) == ["db1", "db2"]);
    w.register("n2", instance("db1", "db", "v1"), "critical");
    until(&mut rx, "the critical instance gone", &|s| {
        ids(s) == ["db2"]
    });
    let (proxies, _) = w.manager.counts();
    drop(handle);
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.manager.counts().0 != proxies - 1 {
        assert!(
            Instant::now() < deadline,
            "the dropped client's state is gone"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Another datacenter as a `Fetcher`: its rows of `db`'s sidecars at an
/// index; a blocking read past the index waits (up to 1 s) for a change.
#[derive(Default)]
struct FakeDc {
    rows: parking_lot::Mutex<(u64, Vec<serde_json::Value>, bool)>,
    changed: tokio::sync::Notify,
    calls: AtomicUsize,
}

impl FakeDc {
    fn set(&self, rows: Vec<serde_json::Value>) {
        let mut r = self.rows.lock();
        r.0 += 1;
        r.1 = rows;
        drop(r);
        self.changed.notify_waiters();
    }

    fn fail(&self, failing: bool) {
        self.rows.lock().2 = failing;
        self.changed.notify_waiters();
    }
}

impl Fetcher for FakeDc {
    fn get(&self, dc: &str, path: String, _timeout: Duration) -> FetchFuture<'_> {
        assert_eq!(dc, "dc2");
        assert!(path.starts_with("/v1/health/connect/db?"), "{path}");
        let asked: u64 = path
            .split(['?', '&'])
            .find_map(|p| p.strip_prefix("index="))
            .and_then(|i| i.parse().ok())
            .unwrap();
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(1);
            loop {
                let changed = self.changed.notified();
                let (index, rows, failing) = self.rows.lock().clone();
                if failing {
                    return Err("connection refused".into());
                }
                if index > asked || Instant::now() >= deadline {
                    return Ok(Answer {
                        status: 200,
                        index,
                        body: serde_json::to_vec(&rows).unwrap(),
                    });
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), changed).await;
            }
        })
    }
}

fn far_row(id: &str, status: &str) -> serde_json::Value {
    json!({"Node": {"Node": format!("{id}-node"), "Address": "10.9.0.1", "Datacenter": "dc2"},
           "Service": {"ID": id, "Service": "db-sidecar-proxy", "Kind": "connect-proxy",
                       "Port": SIDECAR_PORT, "Proxy": {"DestinationServiceName": "db"}},
           "Checks": [{"Node": format!("{id}-node"), "CheckID": "alive", "Status": status}]})
}

/// A failover target in another datacenter: its instances there (never
/// critical) come from one watcher shared by the proxies, follow the
/// other datacenter's changes, stay while it is out of reach, and the
/// watcher stops with the last proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_in_another_datacenter_follows_its_instances_there() {
    const FAR: &str = "db.default.default.dc2";
    let mut w = World::new();
    w.apply(Command::ConfigSet {
        entry: json!({"Kind": "service-resolver", "Name": "db",
                      "Failover": {"*": {"Datacenters": ["dc2"]}}}),
        cas: None,
    });
    w.register_db("n1", "db1", "v1", "passing");
    let dc2 = Arc::new(FakeDc::default());
    dc2.set(vec![
        far_row("far1", "passing"),
        far_row("far2", "critical"),
    ]);
    w.register("n2", proxy(), "passing");
    let key = ("n2".to_string(), "web-proxy".to_string());
    // Before a federation is handed in: no endpoints for dc2's target.
    w.until(&key, "the local endpoint", |s| {
        endpoint_ids(s, DB) == ["db1-sidecar-proxy"]
    })
    .await;
    assert!(
        !w.manager
            .snapshot(&key)
            .unwrap()
            .borrow()
            .as_ref()
            .unwrap()
            .upstreams["db"]
            .endpoints
            .contains_key(FAR)
    );
    w.manager.set_remote(dc2.clone());
    w.until(&key, "dc2's healthy instance", |s| {
        endpoint_ids(s, FAR) == ["far1"]
    })
    .await;
    assert_eq!(w.manager.remote_watchers(), 1);

    // A change there reaches the snapshot.
    dc2.set(vec![far_row("far1", "passing"), far_row("far2", "passing")]);
    w.until(&key, "both of dc2's", |s| {
        endpoint_ids(s, FAR) == ["far1", "far2"]
    })
    .await;

    // A second proxy shares the watcher.
    let mut other = proxy();
    other.id = "web-proxy-2".into();
    w.register("n2", other, "passing");
    let key2 = ("n2".to_string(), "web-proxy-2".to_string());
    w.until(&key2, "dc2's for the second proxy", |s| {
        endpoint_ids(s, FAR) == ["far1", "far2"]
    })
    .await;
    assert_eq!(w.manager.remote_watchers(), 1);

    // Out of reach: retried, the last list stays.
    let before = dc2.calls.load(Ordering::SeqCst);
    dc2.fail(true);
    let deadline = Instant::now() + Duration::from_secs(5);
    while dc2.calls.load(Ordering::SeqCst) < before + 2 {
        assert!(Instant::now() < deadline, "not retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let snap = w.manager.snapshot(&key).unwrap().borrow().clone().unwrap();
    assert_eq!(endpoint_ids(&snap, FAR), ["far1", "far2"]);
    dc2.fail(false);
    dc2.set(vec![far_row("far2", "passing")]);
    // Back at the next retry (the backoff is at most 2 s by now).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let snap = w.manager.snapshot(&key).unwrap().borrow().clone().unwrap();
        if endpoint_ids(&snap, FAR) == ["far2"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dc2's change not seen after it came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // No proxy reads it any more: the watcher stops.
    for id in ["web-proxy", "web-proxy-2"] {
        w.apply(Command::Deregister(DeregisterRequest {
            node: "n2".into(),
            service_id: id.into(),
            ..Default::default()
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.manager.remote_watchers() != 0 {
        assert!(Instant::now() < deadline, "the watcher still runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A datacenter that never answers.
struct Silent;

impl Fetcher for Silent {
    fn get(&self, _dc: &str, _path: String, _timeout: Duration) -> FetchFuture<'_> {
        Box::pin(std::future::pending())
    }
}

/// More remote targets than `MAX_WATCHERS`: that many watchers run, the
/// rest are refused (counted), and a refused one starts once a slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_watchers_are_capped() {
    let mut w = World::new();
    w.manager.set_remote(Arc::new(Silent));
    let mut p = proxy();
    p.proxy.upstreams = (0..=MAX_WATCHERS)
        .map(|i| Upstream {
            destination_name: format!("svc{i}"),
            datacenter: "dc2".into(),
            local_bind_port: 10000 + i as u16,
            ..Default::default()
        })
        .collect();
    let refused = crate::metrics::PROXYCFG_REMOTE_REFUSED.get();
    w.register("n2", p.clone(), "passing");
    let key = ("n2".to_string(), "web-proxy".to_string());
    w.until(&key, "every upstream", |s| {
        s.upstreams.len() == MAX_WATCHERS + 1
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while w.manager.remote_watchers() < MAX_WATCHERS {
        assert!(Instant::now() < deadline, "watchers not started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(w.manager.remote_watchers(), MAX_WATCHERS);
    assert_eq!(crate::metrics::PROXYCFG_REMOTE_REFUSED.get(), refused + 1);

    // One upstream fewer: the refused target gets the freed slot.
    p.proxy.upstreams.remove(0);
    w.register("n2", p, "passing");
    w.until(&key, "one upstream fewer", |s| {
        s.upstreams.len() == MAX_WATCHERS
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n = w.manager.remote_watchers();
        if n == MAX_WATCHERS && !w.manager.inner.remotes.has_refused() {
            break;
        }
        assert!(Instant::now() < deadline, "{n} running");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Other datacenters as a `Fetcher`: per (datacenter, path prefix) the
/// rows it answers (at once: these tests do not block), and the list of
/// datacenters it knows.
struct Federated {
    rows: parking_lot::Mutex<std::collections::HashMap<(String, String), Vec<serde_json::Value>>>,
    index: AtomicU64,
    others: tokio::sync::watch::Sender<Vec<String>>,
}

impl Federated {
    fn new(others: &[&str]) -> Arc<Federated> {
        Arc::new(Federated {
            rows: Default::default(),
            index: AtomicU64::new(1),
            others: tokio::sync::watch::Sender::new(others.iter().map(|d| d.to_string()).collect()),
        })
    }

    fn set(&self, dc: &str, prefix: &str, rows: Vec<serde_json::Value>) {
        self.rows
            .lock()
            .insert((dc.to_string(), prefix.to_string()), rows);
        self.index.fetch_add(1, Ordering::SeqCst);
    }
}

impl Fetcher for Federated {
    fn get(&self, dc: &str, path: String, _timeout: Duration) -> FetchFuture<'_> {
        let dc = dc.to_string();
        Box::pin(async move {
            let asked: u64 = path
                .split(['?', '&'])
                .find_map(|p| p.strip_prefix("index="))
                .and_then(|i| i.parse().ok())
                .unwrap_or(0);
            // Block (briefly) while nothing changed past the index asked.
            let deadline = Instant::now() + Duration::from_millis(200);
            while self.index.load(Ordering::SeqCst) <= asked && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let rows = self
                .rows
                .lock()
                .iter()
                .find(|((d, prefix), _)| *d == dc && path.starts_with(prefix.as_str()))
                .map(|(_, r)| r.clone())
                .unwrap_or_default();
            Ok(Answer {
                status: 200,
                index: self.index.load(Ordering::SeqCst),
                body: serde_json::to_vec(&rows).unwrap(),
            })
        })
    }

    fn datacenters(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        self.others.subscribe()
    }
}

/// A mesh gateway row of datacenter `dc`: LAN address `lan`, WAN `wan`.
fn gateway_row(dc: &str, id: &str, lan: &str, wan: &str, status: &str) -> serde_json::Value {
    json!({"Node": {"Node": format!("{id}-node"), "Address": lan, "Datacenter": dc},
           "Service": {"ID": id, "Service": "mesh-gateway", "Kind": "mesh-gateway",
                       "Port": 8443, "Address": lan,
                       "TaggedAddresses": {"lan": {"Address": lan, "Port": 8443},
                                           "wan": {"Address": wan, "Port": 443}}},
           "Checks": [{"Node": format!("{id}-node"), "CheckID": "alive", "Status": status}]})
}

const FAR: &str = "db.default.default.dc2";

/// The gateways a target goes through: (mode, datacenter, wan, ids).
fn via(s: &Snapshot, target: &str) -> Option<(String, String, bool, Vec<String>)> {
    let v = s.upstreams["db"].gateways.get(target)?;
    Some((
        v.mode.clone(),
        v.datacenter.clone(),
        v.wan,
        v.instances.iter().map(|i| i.service.id.clone()).collect(),
    ))
}

/// A failover target in dc2 with mesh gateway mode `local` goes through
/// dc1's healthy mesh gateways (a critical one leaves), with `remote`
/// through dc2's as dc2 lists them, with `none` straight to its
/// instances; the proxy's mode yields to its upstream's, and without
/// either proxy-defaults decide. Its own instances stay in the snapshot
/// (their health decides), and a local target never goes through one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_gateway_modes_pick_the_gateways_a_remote_target_goes_through() {
    let mut w = World::new();
    w.apply(Command::ConfigSet {
        entry: json!({"Kind": "service-resolver", "Name": "db",
                      "Failover": {"*": {"Datacenters": ["dc2"]}}}),
        cas: None,
    });
    w.register_db("n1", "db1", "v1", "passing");
    let fed = Federated::new(&["dc2"]);
    fed.set(
        "dc2",
        "/v1/health/connect/db?",
        vec![far_row("far1", "passing")],
    );
    fed.set(
        "dc2",
        "/v1/internal/mesh-gateways?",
        vec![gateway_row(
            "dc2",
            "gw2",
            "10.2.0.9",
            "203.0.113.2",
            "passing",
        )],
    );
    w.manager.set_remote(fed.clone());
    let mut gw = instance("gw1", "mesh-gateway", "");
    gw.kind = "mesh-gateway".into();
    gw.port = 8443;
    w.register("g1", gw.clone(), "passing");

    let mut p = proxy();
    p.proxy.upstreams[0].mesh_gateway.mode = "local".into();
    w.register("n2", p.clone(), "passing");
    let key = ("n2".to_string(), "web-proxy".to_string());
    let s = w
        .until(
            &key,
            "dc1's gateway for dc2's target, and its instances",
            |s| {
                via(s, FAR) == Some(("local".into(), "dc1".into(), false, vec!["gw1".into()]))
                    && endpoint_ids(s, FAR) == ["far1"]
            },
        )
        .await;
    assert_eq!(via(&s, DB), None, "a local target goes direct");

    // dc1's gateway critical: none left to go through.
    w.register("g1", gw.clone(), "critical");
    w.until(&key, "no healthy local gateway", |s| {
        via(s, FAR).is_some_and(|v| v.3.is_empty())
    })
    .await;
    w.register("g1", gw, "passing");

    // The proxy says remote, its upstream local: the upstream's wins.
    p.proxy.mesh_gateway.mode = "remote".into();
    w.register("n2", p.clone(), "passing");
    w.until(&key, "the upstream's own mode", |s| {
        via(s, FAR).is_some_and(|v| v.0 == "local" && v.3 == ["gw1"])
    })
    .await;
    // The upstream says nothing: the proxy's remote, dc2's gateway at WAN.
    p.proxy.upstreams[0].mesh_gateway.mode = String::new();
    w.register("n2", p.clone(), "passing");
    w.until(&key, "dc2's gateway", |s| {
        via(s, FAR) == Some(("remote".into(), "dc2".into(), true, vec!["gw2".into()]))
    })
    .await;
    // dc2 lists another gateway: it reaches the snapshot.
    fed.set(
        "dc2",
        "/v1/internal/mesh-gateways?",
        vec![
            gateway_row("dc2", "gw2", "10.2.0.9", "203.0.113.2", "passing"),
            gateway_row("dc2", "gw3", "10.2.0.10", "203.0.113.3", "passing"),
        ],
    );
    w.until(&key, "dc2's second gateway", |s| {
        via(s, FAR).is_some_and(|v| v.3 == ["gw2", "gw3"])
    })
    .await;

    // Mode none on the proxy: straight to dc2's instances.
    p.proxy.mesh_gateway.mode = "none".into();
    w.register("n2", p.clone(), "passing");
    let s = w
        .until(&key, "no gateway in mode none", |s| via(s, FAR).is_none())
        .await;
    assert_eq!(endpoint_ids(&s, FAR), ["far1"]);

    // Neither says: proxy-defaults' local.
    p.proxy.mesh_gateway.mode = String::new();
    w.apply(Command::ConfigSet {
        entry: json!({"Kind": "proxy-defaults", "Name": "global",
                      "MeshGateway": {"Mode": "local"}}),
        cas: None,
    });
    w.register("n2", p, "passing");
    w.until(&key, "proxy-defaults' mode", |s| {
        via(s, FAR).is_some_and(|v| v.0 == "local")
    })
    .await;
}

/// A mesh gateway routes to every other datacenter the federation knows,
/// each through that datacenter's healthy gateways as listed there; a
/// datacenter learned later is added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_gateway_follows_every_other_datacenters_gateways() {
    let mut w = World::new();
    let fed = Federated::new(&["dc2"]);
    fed.set(
        "dc2",
        "/v1/internal/mesh-gateways?",
        vec![
            gateway_row("dc2", "gw2", "10.2.0.9", "203.0.113.2", "passing"),
            gateway_row("dc2", "gw2b", "10.2.0.8", "203.0.113.4", "critical"),
        ],
    );
    fed.set(
        "dc3",
        "/v1/internal/mesh-gateways?",
        vec![gateway_row(
            "dc3",
            "gw3",
            "10.3.0.9",
            "203.0.113.3",
            "passing",
        )],
    );
    w.manager.set_remote(fed.clone());
    let mut gw = instance("gw1", "mesh-gateway", "");
    gw.kind = "mesh-gateway".into();
    gw.port = 8443;
    w.register("g1", gw, "passing");
    let key = ("g1".to_string(), "gw1".to_string());
    let remote = |s: &Snapshot| -> Vec<(String, Vec<String>)> {
        s.gateway
            .as_ref()
            .unwrap()
            .remote
            .iter()
            .map(|(dc, rows)| {
                (
                    dc.clone(),
                    rows.iter().map(|i| i.service.id.clone()).collect(),
                )
            })
            .collect()
    };
    w.until(&key, "dc2's healthy gateway", |s| {
        remote(s) == [("dc2".to_string(), vec!["gw2".to_string()])]
    })
    .await;
    fed.others.send_replace(vec!["dc2".into(), "dc3".into()]);
    w.until(&key, "dc3 too", |s| {
        remote(s)
            == [
                ("dc2".to_string(), vec!["gw2".to_string()]),
                ("dc3".to_string(), vec!["gw3".to_string()]),
            ]
    })
    .await;
    assert_eq!(w.manager.remote_watchers(), 2);
}

/// An ingress gateway's linked service failing over to dc2 goes through
/// mesh gateways as the gateway's own merged mode says (its registration's
/// here), as a sidecar's upstream does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_gateways_remote_targets_follow_its_mesh_gateway_mode() {
    let mut w = World::new();
    for entry in [
        json!({"Kind": "service-resolver", "Name": "db",
               "Failover": {"*": {"Datacenters": ["dc2"]}}}),
        json!({"Kind": "ingress-gateway", "Name": "ig", "Listeners": [
            {"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "db"}]}]}),
    ] {
        w.apply(Command::ConfigSet { entry, cas: None });
    }
    w.register_db("n1", "db1", "v1", "passing");
    let fed = Federated::new(&["dc2"]);
    fed.set(
        "dc2",
        "/v1/health/connect/db?",
        vec![far_row("far1", "passing")],
    );
    w.manager.set_remote(fed);
    let mut gw = instance("gw1", "mesh-gateway", "");
    gw.kind = "mesh-gateway".into();
    gw.port = 8443;
    w.register("g1", gw, "passing");
    let mut ig = instance("ig", "ig", "");
    ig.kind = "ingress-gateway".into();
    ig.port = 8443;
    ig.proxy.mesh_gateway.mode = "local".into();
    w.register("g2", ig, "passing");
    let key = ("g2".to_string(), "ig".to_string());
    w.until(&key, "dc1's mesh gateway for dc2's db", |s| {
        via(s, FAR) == Some(("local".into(), "dc1".into(), false, vec!["gw1".into()]))
    })
    .await;
}
