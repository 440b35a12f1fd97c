//! Resources shared across proxies: a global change (a `proxy-defaults`
//! write) rebuilds every proxy's resources at once, and most of them are
//! the same for many proxies: an upstream's clusters for every sidecar of
//! one service (they carry that service's leaf), its endpoints and routes
//! for every sidecar dialing it. Those are built and encoded once, and each
//! stream holds the same `Resource` (its encoding behind an `Arc`, its
//! version the hash computed once). What is a proxy's own (its listeners'
//! addresses and ports, its local app) is built per proxy.
//!
//! A memoized part is a plain `fn` of its key: it cannot read anything
//! else, so nothing it depends on can be left out of the key. Keys name
//! proxycfg's shared pieces (compiled chains, endpoint lists) by their
//! `Arc`'s address (their content never changes; the key holds the `Arc`,
//! so the address is not reused while the entry lives) and the mesh
//! identity by its content: roots, leaf, trust domain and the mesh entry's
//! `TLS.Incoming`/`Outgoing` (an upstream cluster's `UpstreamTlsContext`
//! carries `Outgoing`: without it in the key, a proxy would be served the
//! cluster of the settings before a mesh entry change). Entries unused for a whole
//! generation of the cache are dropped (`Generations`), so what a
//! rebuilt chain or a renewed leaf leaves behind does not stay.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

use super::resources::{Identity, Resource, route_config, target_assignments, target_clusters};
use crate::discovery_chain::CompiledDiscoveryChain;
use crate::proxycfg::{UpstreamSnapshot, ViaGateways};

/// An `Arc` compared and hashed by its address.
#[derive(Debug)]
pub(crate) struct ByPtr<T>(pub Arc<T>);

impl<T> Clone for ByPtr<T> {
    fn clone(&self) -> Self {
        ByPtr(self.0.clone())
    }
}

impl<T> PartialEq for ByPtr<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> Eq for ByPtr<T> {}

impl<T> Hash for ByPtr<T> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (Arc::as_ptr(&self.0) as *const () as usize).hash(h);
    }
}

/// An upstream's snapshot as a key: its chain and endpoint lists by
/// address, the rest by value. Destructured whole, so a field added to
/// `UpstreamSnapshot` does not compile here until it is part of the key.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamKey(pub UpstreamSnapshot);

impl UpstreamKey {
    fn parts(&self) -> impl Iterator<Item = Part<'_>> {
        let UpstreamSnapshot {
            chain,
            error,
            endpoints,
            gateways,
        } = &self.0;
        let chain = chain.as_ref().map(|c| Arc::as_ptr(c) as usize);
        std::iter::once(Part::Chain(chain, error))
            .chain(
                endpoints
                    .iter()
                    .map(|(t, e)| Part::Endpoints(t, Arc::as_ptr(e) as usize)),
            )
            .chain(gateways.iter().map(|(t, via)| {
                let ViaGateways {
                    mode,
                    datacenter,
                    wan,
                    instances,
                } = via;
                Part::Gateways(t, mode, datacenter, *wan, Arc::as_ptr(instances) as usize)
            }))
    }
}

#[derive(PartialEq, Eq, Hash)]
enum Part<'a> {
    Chain(Option<usize>, &'a str),
    Endpoints(&'a str, usize),
    Gateways(&'a str, &'a str, &'a str, bool, usize),
}

impl PartialEq for UpstreamKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts().eq(other.parts())
    }
}

impl Eq for UpstreamKey {}

impl Hash for UpstreamKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        for p in self.parts() {
            p.hash(h);
        }
    }
}

/// Named resources, shared whole.
pub(crate) type Named = Arc<[(String, Resource)]>;

/// One chain target's clusters (with failover: the aggregate and its
/// tiers), as a proxy with mesh identity `id` (its leaf, the roots and the
/// mesh entry's TLS) dials it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ClusterKey {
    pub chain: ByPtr<CompiledDiscoveryChain>,
    pub target: String,
    pub id: ByPtr<Identity>,
}

fn cluster(k: &ClusterKey) -> Named {
    let chain = &*k.chain.0;
    let target = &chain.targets[&k.target];
    target_clusters(chain, target, &k.id.0)
        .into_iter()
        .map(|c| (c.name.clone(), Resource::of(c)))
        .collect()
}

/// One chain target's endpoints (one assignment per cluster), from its
/// upstream's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct AssignmentKey {
    pub upstream: UpstreamKey,
    pub target: String,
}

fn assignment(k: &AssignmentKey) -> Named {
    let us = &k.upstream.0;
    let chain = us
        .chain
        .as_deref()
        .expect("an upstream with targets has a chain");
    target_assignments(chain, us, &k.target)
        .into_iter()
        .map(|c| (c.cluster_name.clone(), Resource::of(c)))
        .collect()
}

/// An http upstream's route configuration, named `name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RouteKey {
    pub name: String,
    pub chain: ByPtr<CompiledDiscoveryChain>,
}

fn route(k: &RouteKey) -> Resource {
    Resource::of(route_config(&k.name, &k.chain.0))
}

/// A map whose entries live while they are used: lookups move entries of
/// the previous generation into the current one; once the current one has
/// grown to twice the previous (at least `MIN_GENERATION`), the previous
/// is dropped with whatever no proxy asked for since.
struct Generations<K, V> {
    now: HashMap<K, V>,
    before: HashMap<K, V>,
}

const MIN_GENERATION: usize = 4096;

impl<K: Hash + Eq, V: Clone> Generations<K, V> {
    fn new() -> Self {
        Generations {
            now: HashMap::new(),
            before: HashMap::new(),
        }
    }

    /// The value of `key`, built by `build` (a function of the key alone)
    /// when no proxy asked for it lately.
    fn get(&mut self, key: K, build: fn(&K) -> V) -> V {
        if let Some(v) = self.now.get(&key) {
            return v.clone();
        }
        let v = match self.before.remove(&key) {
            Some(v) => v,
            None => build(&key),
        };
        if self.now.len() >= MIN_GENERATION.max(2 * self.before.len()) {
            self.before = std::mem::take(&mut self.now);
        }
        self.now.insert(key, v.clone());
        v
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.now.len() + self.before.len()
    }
}

/// What every stream's resources share.
pub(crate) struct Memo {
    identities: Generations<Identity, Arc<Identity>>,
    clusters: Generations<ClusterKey, Named>,
    assignments: Generations<AssignmentKey, Named>,
    routes: Generations<RouteKey, Resource>,
}

impl Memo {
    fn new() -> Memo {
        Memo {
            identities: Generations::new(),
            clusters: Generations::new(),
            assignments: Generations::new(),
            routes: Generations::new(),
        }
    }

    /// The one shared copy of an identity (equal content, same `Arc`), so
    /// that the parts built with it can name it by address.
    pub fn identity(&mut self, id: Identity) -> Arc<Identity> {
        self.identities.get(id, |id| Arc::new(id.clone()))
    }

    pub fn cluster(&mut self, key: ClusterKey) -> Named {
        self.clusters.get(key, cluster)
    }

    pub fn assignment(&mut self, key: AssignmentKey) -> Named {
        self.assignments.get(key, assignment)
    }

    pub fn route(&mut self, key: RouteKey) -> Resource {
        self.routes.get(key, route)
    }
}

/// The server's memo (one per process: its keys are content or addresses
/// of immutable values, so servers in one process may share it).
static MEMO: std::sync::LazyLock<Mutex<Memo>> =
    std::sync::LazyLock::new(|| Mutex::new(Memo::new()));

/// Runs `f` with the memo (builds run one at a time: it is not contended).
pub(crate) fn with<T>(f: impl FnOnce(&mut Memo) -> T) -> T {
    f(&mut MEMO.lock())
}

#[cfg(test)]
mod tests {
    //! Sharing must not leak one proxy's identity or addresses into
    //! another's resources.

    use std::sync::atomic::{AtomicUsize, Ordering};

    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::tls_parameters::TlsProtocol;
    use prost::Message;

    use super::*;
    use crate::proxycfg::{Shared, Snapshot, build};
    use crate::structs::connect::IssuedCert;
    use crate::structs::{NodeService, Upstream};
    use crate::xds::resources::{CLUSTER, ENDPOINT, LISTENER, Resources};

    fn sidecar(id: &str, dest: &str, addr: &str, port: i64, bind: u16) -> NodeService {
        let mut s = NodeService {
            kind: "connect-proxy".into(),
            id: id.into(),
            service: format!("{dest}-sidecar-proxy"),
            address: addr.into(),
            port,
            ..Default::default()
        };
        s.proxy.destination_service_name = dest.into();
        s.proxy.local_service_port = u16::try_from(port - 13000).unwrap();
        s.proxy.upstreams.push(Upstream {
            destination_name: "db".into(),
            local_bind_port: bind,
            ..Default::default()
        });
        s
    }

    fn leaf(service: &str) -> Arc<IssuedCert> {
        Arc::new(IssuedCert {
            cert_pem: format!("LEAF-OF-{service}"),
            private_key_pem: format!("KEY-OF-{service}"),
            service: service.into(),
            ..Default::default()
        })
    }

    /// Two sidecars of web on two nodes (their own addresses, ports and
    /// bind ports), one of api, all dialing db, and db's.
    fn world() -> crate::testing::World {
        let mut w = crate::testing::World::new();
        w.register_passing(
            "n1",
            "10.0.0.1",
            sidecar("web-1", "web", "10.0.0.1", 21000, 9191),
        );
        w.register_passing(
            "n2",
            "10.0.0.2",
            sidecar("web-2", "web", "10.0.0.2", 21001, 9292),
        );
        w.register_passing(
            "n3",
            "10.0.0.3",
            sidecar("api-1", "api", "10.0.0.3", 21002, 9191),
        );
        let mut db = sidecar("db-proxy", "db", "10.0.0.4", 21003, 1);
        db.proxy.upstreams.clear();
        w.register_passing("n4", "10.0.0.4", db);
        w
    }

    /// The three dialing sidecars' snapshots, built as the manager builds
    /// them (one `Shared`: the same chain and endpoint lists), with the
    /// leaf of their own service each.
    fn built(w: &crate::testing::World, shared: &mut Shared) -> [Snapshot; 3] {
        let state = w.store.state();
        let roots = crate::xds::tests::test_roots();
        let (web, api) = (leaf("web"), leaf("api"));
        let mut one = |node: &str, id: &str, leaf: &Arc<IssuedCert>| {
            let key = (node.to_string(), id.to_string());
            let (mut snap, _) = build(&state, "dc1", &key, shared).expect("a proxy");
            snap.roots = Some(roots.clone());
            snap.leaf = Some(leaf.clone());
            snap
        };
        [
            one("n1", "web-1", &web),
            one("n2", "web-2", &web),
            one("n3", "api-1", &api),
        ]
    }

    fn mesh() -> [Snapshot; 3] {
        built(&world(), &mut Shared::default())
    }

    fn db_cluster(r: &Resources) -> &Resource {
        r[CLUSTER]
            .iter()
            .find(|(n, _)| n.starts_with("db.default.dc1.internal."))
            .expect("db's cluster")
            .1
    }

    /// A cluster's upstream TLS context.
    fn upstream_tls(r: &Resource) -> UpstreamTlsContext {
        let c = Cluster::decode(&*r.any.value).unwrap();
        let Some(ConfigType::TypedConfig(any)) = c.transport_socket.unwrap().config_type else {
            panic!("no TLS");
        };
        UpstreamTlsContext::decode(&*any.value).unwrap()
    }

    /// The leaf certificate a cluster presents.
    fn presented(r: &Resource) -> String {
        let tls = upstream_tls(r);
        let cert = &tls.common_tls_context.unwrap().tls_certificates[0];
        match cert.certificate_chain.as_ref().unwrap().specifier.as_ref() {
            Some(Specifier::InlineString(s)) => s.clone(),
            other => panic!("{other:?}"),
        }
    }

    /// The minimum TLS version a cluster dials with.
    fn min_version(r: &Resource) -> TlsProtocol {
        let tls = upstream_tls(r);
        let params = tls.common_tls_context.unwrap().tls_params.unwrap();
        TlsProtocol::try_from(params.tls_minimum_protocol_version).unwrap()
    }

    /// Every listener's name and the address:port it binds.
    fn listeners(r: &Resources) -> Vec<(String, String)> {
        r[LISTENER]
            .iter()
            .map(|(name, res)| {
                let l = Listener::decode(&*res.any.value).unwrap();
                let Some(address::Address::SocketAddress(s)) = l.address.unwrap().address else {
                    panic!("no socket address");
                };
                let Some(socket_address::PortSpecifier::PortValue(p)) = s.port_specifier else {
                    panic!("no port");
                };
                (name.clone(), format!("{}:{p}", s.address))
            })
            .collect()
    }

    #[test]
    fn sidecars_of_one_service_share_upstreams_and_keep_their_own_listeners() {
        let [web1, web2, _] = mesh();
        let (r1, r2) = (crate::xds::generate(&web1), crate::xds::generate(&web2));
        // Their upstream's cluster and endpoints are one encoding.
        assert!(Arc::ptr_eq(&db_cluster(&r1).any, &db_cluster(&r2).any));
        let cla = |r: &Resources| r[ENDPOINT].values().next().unwrap().any.clone();
        assert!(Arc::ptr_eq(&cla(&r1), &cla(&r2)));
        // Their listeners are their own.
        assert_eq!(
            listeners(&r1),
            [
                (
                    "db:127.0.0.1:9191".to_string(),
                    "127.0.0.1:9191".to_string()
                ),
                (
                    "public_listener:10.0.0.1:21000".to_string(),
                    "10.0.0.1:21000".to_string()
                ),
            ]
        );
        assert_eq!(
            listeners(&r2),
            [
                (
                    "db:127.0.0.1:9292".to_string(),
                    "127.0.0.1:9292".to_string()
                ),
                (
                    "public_listener:10.0.0.2:21001".to_string(),
                    "10.0.0.2:21001".to_string()
                ),
            ]
        );
        // And so are their local apps' ports.
        let app = |r: &Resources| {
            let c = Cluster::decode(&*r[CLUSTER]["local_app"].any.value).unwrap();
            format!(
                "{:?}",
                c.load_assignment.unwrap().endpoints[0].lb_endpoints[0]
            )
        };
        assert!(app(&r1).contains("8000") && app(&r2).contains("8001"));
        // Generated again, the same: nothing differs, nothing is resent.
        assert_eq!(crate::xds::generate(&web1), r1);
    }

    #[test]
    fn a_shared_upstream_carries_each_services_own_leaf() {
        let [web1, _, api1] = mesh();
        assert!(Arc::ptr_eq(
            web1.upstreams["db"].chain.as_ref().unwrap(),
            api1.upstreams["db"].chain.as_ref().unwrap()
        ));
        let web = crate::xds::generate(&web1);
        let api = crate::xds::generate(&api1);
        assert_eq!(presented(db_cluster(&web)), "LEAF-OF-web");
        assert_eq!(presented(db_cluster(&api)), "LEAF-OF-api");
        assert_ne!(db_cluster(&web).version, db_cluster(&api).version);
        // The endpoints, which carry no identity, are shared.
        let cla = |r: &Resources| r[ENDPOINT].values().next().unwrap().any.clone();
        assert!(Arc::ptr_eq(&cla(&web), &cla(&api)));
    }

    #[test]
    fn a_renewed_leaf_or_new_endpoints_make_new_resources() {
        let [web1, _, _] = mesh();
        let before = crate::xds::generate(&web1);
        let mut renewed = web1.clone();
        renewed.leaf = Some(leaf("web-renewed"));
        let after = crate::xds::generate(&renewed);
        assert_eq!(presented(db_cluster(&after)), "LEAF-OF-web-renewed");
        assert_ne!(db_cluster(&after).version, db_cluster(&before).version);
        // db's endpoint list replaced (as proxycfg replaces it when db's
        // sidecars change): its assignment is built again from it.
        let mut moved = web1.clone();
        let us = moved.upstreams.get_mut("db").unwrap();
        let (target, rows) = us.endpoints.iter().next().unwrap();
        let mut row = (*rows[0]).clone();
        let mut moved_service = (*row.service).clone();
        moved_service.port = 31000;
        row.service = Arc::new(moved_service);
        let target = target.clone();
        us.endpoints.insert(target, Arc::new(vec![Arc::new(row)]));
        let after = crate::xds::generate(&moved);
        assert_ne!(
            after[ENDPOINT].values().next().unwrap().version,
            before[ENDPOINT].values().next().unwrap().version
        );
    }

    /// The mesh entry's `TLS.Outgoing` is in the upstream clusters
    /// (`UpstreamTlsContext`): a change of it reaches every proxy sharing
    /// one, and a snapshot from before the change (a stream not rebuilt
    /// yet) keeps the cluster of its own settings, not the new one.
    #[test]
    fn a_mesh_tls_change_reaches_every_proxy_sharing_an_upstream_cluster() {
        let mut w = world();
        let mut shared = Shared::default();
        let [web1, web2, api1] = built(&w, &mut shared);
        let old = crate::xds::generate(&web1);
        assert_eq!(min_version(db_cluster(&old)), TlsProtocol::TlsAuto);

        let entry = crate::config_check::decode_and_validate(&serde_json::json!({
            "Kind": "mesh", "Name": "mesh",
            "TLS": {"Outgoing": {"TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "TLSv1_2",
                                 "CipherSuites": ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"]}}}))
        .unwrap()
        .to_json();
        w.apply(crate::state::Command::ConfigSet { entry, cas: None });
        let [new1, new2, new_api] = built(&w, &mut shared);
        // Nothing else moved: the chain and endpoint lists are the same
        // Arcs, so only the mesh TLS tells the clusters apart.
        assert!(Arc::ptr_eq(
            new1.upstreams["db"].chain.as_ref().unwrap(),
            web1.upstreams["db"].chain.as_ref().unwrap()
        ));
        let (r1, r2) = (crate::xds::generate(&new1), crate::xds::generate(&new2));
        for r in [&r1, &r2] {
            assert_eq!(min_version(db_cluster(r)), TlsProtocol::TlSv12);
            let params = upstream_tls(db_cluster(r))
                .common_tls_context
                .unwrap()
                .tls_params
                .unwrap();
            assert_eq!(params.cipher_suites, ["ECDHE-ECDSA-AES256-GCM-SHA384"]);
        }
        assert!(Arc::ptr_eq(&db_cluster(&r1).any, &db_cluster(&r2).any));
        assert_ne!(db_cluster(&r1).version, db_cluster(&old).version);
        // The other service's sidecar: the new settings, its own leaf.
        let api = crate::xds::generate(&new_api);
        assert_eq!(min_version(db_cluster(&api)), TlsProtocol::TlSv12);
        assert_eq!(presented(db_cluster(&api)), "LEAF-OF-api");
        // Snapshots from before the change, generated after it (either
        // order): their own, older settings.
        for s in [&web2, &web1, &api1] {
            assert_eq!(
                min_version(db_cluster(&crate::xds::generate(s))),
                TlsProtocol::TlsAuto
            );
        }
        assert_eq!(crate::xds::generate(&web1), old);
    }

    static BUILT: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn entries_no_proxy_asked_for_in_a_generation_go() {
        let mut g: Generations<usize, usize> = Generations::new();
        let build = |k: &usize| {
            BUILT.fetch_add(1, Ordering::Relaxed);
            *k
        };
        for k in 0..4 * MIN_GENERATION {
            g.get(k, build);
            g.get(0, build); // kept alive by use
        }
        assert!(g.len() < 4 * MIN_GENERATION, "bounded: {}", g.len());
        let built = BUILT.load(Ordering::Relaxed);
        g.get(0, build);
        assert_eq!(BUILT.load(Ordering::Relaxed), built, "a used entry stays");
        g.get(1, build);
        assert_eq!(
            BUILT.load(Ordering::Relaxed),
            built + 1,
            "an unused one went"
        );
    }
}
