//! Building one proxy's snapshot from one version of the state: a function
//! of the state that also reports what it read (the proxy's watches).
//!
//! Compiled chains and target endpoint lists are shared by every proxy that
//! reads them (`Shared`): built once, kept while the watch keys they read
//! are unchanged, and held by snapshots as `Arc`s, so 10,000 proxies over
//! 500 services hold 500 chains, not 30,000.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::json;

use super::snapshot::{
    Endpoints, Snapshot, TransparentSnapshot, UpstreamSnapshot, ViaGateways, healthy,
};
use super::{Dep, ProxyKey};
use crate::config_check::ConfigEntry;
use crate::discovery_chain::{CompileRequest, CompiledDiscoveryChain, EntryLookup, compile};
use crate::filter::Filter;
use crate::filter::schemas::HEALTH_SERVICE;
use crate::state::catalog::{Instance, instances_of_kind, service_instances};
use crate::state::{State, keys};
use crate::structs::config_entry::{Kind, MESH_CONFIG_NAME, MeshTlsConfig};
use crate::structs::connect::{CaRoots, Intention, IssuedCert};
use crate::structs::{NodeService, ServiceKind};

/// A shared result, valid while the watch keys it read have not changed.
struct Stamped<T> {
    value: T,
    deps: Arc<[Dep]>,
    /// `State::index_of(deps)` when it was built.
    stamp: u64,
}

impl<T: Clone> Stamped<T> {
    fn current(&self, state: &State) -> Option<(T, Arc<[Dep]>)> {
        let now = state.index_of(self.deps.iter());
        (now == self.stamp).then(|| (self.value.clone(), self.deps.clone()))
    }
}

type ChainResult = Result<Arc<CompiledDiscoveryChain>, String>;

/// Chains and endpoint lists shared across proxies and rebuilds.
#[derive(Default)]
pub struct Shared {
    /// (service, datacenter, and the overrides: mesh gateway mode,
    /// protocol, connect timeout in ns) → its compiled chain.
    chains: HashMap<(String, String, String, String, i64), Stamped<ChainResult>>,
    /// (service, subset filter, only passing, connect) → its healthy
    /// connect-capable instances (`connect`), or its healthy instances.
    endpoints: HashMap<(String, String, bool, bool), Stamped<Endpoints>>,
    /// This datacenter's healthy mesh gateways.
    local_gateways: Option<Stamped<Endpoints>>,
    /// The roots as of the CA's index, shared by every snapshot.
    roots: Option<(u64, Arc<CaRoots>)>,
    /// The mesh entry's TLS as of its index, shared by every snapshot
    /// (each proxy's build would otherwise copy the entry's lists).
    mesh_tls: Option<(u64, Option<Arc<MeshTlsConfig>>)>,
    /// (service, extra DNS SANs) → (active root id, its leaf): signed
    /// here, on the server (the key never enters Raft), renewed on
    /// rotation or when due.
    leaves: HashMap<(String, Vec<String>), (String, Arc<IssuedCert>)>,
    /// destination → (its intentions' index, intentions in evaluation order).
    intentions: HashMap<String, (u64, Arc<Vec<Intention>>)>,
    /// No intention matched: deny (ACLs on with default deny, as Consul's).
    pub deny_by_default: bool,
    /// The DNS domain (`--domain`, no trailing dot; `consul` when unset):
    /// an ingress gateway's leaf names `*.ingress.<domain>`.
    pub dns_domain: String,
    /// Other datacenters' endpoints (`None`: other datacenters' targets get
    /// none).
    pub(super) remote: Option<Arc<super::remote::Remotes>>,
}

impl Shared {
    /// Forgets everything cached, keeping the settings (the intentions'
    /// default, the other datacenters' source).
    pub fn reset(&mut self) {
        *self = Shared {
            deny_by_default: self.deny_by_default,
            dns_domain: std::mem::take(&mut self.dns_domain),
            remote: self.remote.take(),
            ..Shared::default()
        };
    }

    /// Forgets what no snapshot holds any more.
    pub fn prune(&mut self) {
        self.chains
            .retain(|_, c| matches!(&c.value, Ok(chain) if Arc::strong_count(chain) > 1));
        self.endpoints
            .retain(|_, e| Arc::strong_count(&e.value) > 1);
        if self
            .local_gateways
            .as_ref()
            .is_some_and(|g| Arc::strong_count(&g.value) == 1)
        {
            self.local_gateways = None;
        }
        self.leaves.retain(|_, (_, l)| Arc::strong_count(l) > 1);
        self.intentions.retain(|_, (_, l)| Arc::strong_count(l) > 1);
    }

    pub(super) fn roots(&mut self, state: &State) -> Option<Arc<CaRoots>> {
        let at = state.index_of([&keys::CONNECT_CA]);
        if let Some((i, r)) = &self.roots
            && *i == at
        {
            return Some(r.clone());
        }
        let roots = Arc::new(crate::state::connect::roots(state)?);
        self.roots = Some((at, roots.clone()));
        Some(roots)
    }

    /// The mesh entry's TLS settings (watched: a change rebuilds the
    /// proxy), read again only when the entry changed.
    pub(super) fn mesh_tls(
        &mut self, state: &State, deps: &mut BTreeSet<Dep>,
    ) -> Option<Arc<MeshTlsConfig>> {
        let key = keys::config(Kind::Mesh.as_str(), MESH_CONFIG_NAME);
        let at = state.index_of([&key]);
        deps.insert(key);
        if let Some((i, tls)) = &self.mesh_tls
            && *i == at
        {
            return tls.clone();
        }
        let tls = state
            .get(Kind::Mesh, MESH_CONFIG_NAME)
            .and_then(|e| e.as_mesh())
            .and_then(|m| m.tls.clone())
            .map(Arc::new);
        self.mesh_tls = Some((at, tls.clone()));
        tls
    }

    /// The leaf of `service`, signed again after a rotation or once due.
    pub(super) fn leaf(
        &mut self, state: &State, dc: &str, service: &str,
    ) -> Option<Arc<IssuedCert>> {
        self.leaf_with_dns(state, dc, service, &[])
    }

    /// The leaf of `service` that also names `dns` (an ingress gateway's
    /// hosts): a leaf of its own, signed again when the names change.
    pub(super) fn leaf_with_dns(
        &mut self, state: &State, dc: &str, service: &str, dns: &[String],
    ) -> Option<Arc<IssuedCert>> {
        let ca = state.connect_ca.as_ref()?;
        let active = ca.active()?.root.id.clone();
        let key = (service.to_string(), dns.to_vec());
        if let Some((root, leaf)) = self.leaves.get(&key)
            && *root == active
            && crate::connect::ca::renew_at(leaf) > time::OffsetDateTime::now_utc()
        {
            return Some(leaf.clone());
        }
        let trust_domain = format!("{}.consul", state.cluster_id);
        match crate::connect::ca::sign_local_with_dns(ca, &trust_domain, dc, service, dns) {
            Ok(leaf) => {
                let leaf = Arc::new(leaf);
                self.leaves.insert(key, (active, leaf.clone()));
                Some(leaf)
            }
            Err(e) => {
                tracing::warn!(service, error = %e, "proxycfg: could not sign a leaf");
                None
            }
        }
    }

    pub(super) fn intentions(&mut self, state: &State, destination: &str) -> Arc<Vec<Intention>> {
        let kind = Kind::ServiceIntentions.as_str();
        let at = state.index_of([&keys::config(kind, destination), &keys::config(kind, "*")]);
        if let Some((i, l)) = self.intentions.get(destination)
            && *i == at
        {
            return l.clone();
        }
        let list = Arc::new(crate::connect::intentions::for_destination(
            state,
            destination,
        ));
        self.intentions
            .insert(destination.to_string(), (at, list.clone()));
        list
    }

    fn chain(
        &mut self, state: &State, req: &CompileRequest, dc: &str,
    ) -> (ChainResult, Arc<[Dep]>) {
        let key = (
            req.service_name.clone(),
            dc.to_string(),
            req.override_mesh_gateway.mode.clone(),
            req.override_protocol.clone(),
            req.override_connect_timeout.nanos(),
        );
        if let Some(hit) = self.chains.get(&key).and_then(|c| c.current(state)) {
            return hit;
        }
        let lookup = Recording {
            state,
            read: RefCell::default(),
        };
        let value = compile(req, &lookup)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        let mut read = lookup.read.into_inner();
        // The chain carries the service's virtual IPs (`fill`).
        read.insert(keys::virtual_ip(&req.service_name));
        let deps: Arc<[Dep]> = read.into_iter().collect();
        let stamp = state.index_of(deps.iter());
        self.chains.insert(
            key,
            Stamped {
                value: value.clone(),
                deps: deps.clone(),
                stamp,
            },
        );
        (value, deps)
    }

    /// This datacenter's healthy mesh gateways (watch `keys::MESH_GATEWAYS`).
    pub(super) fn local_gateways(&mut self, state: &State) -> Endpoints {
        if let Some((hit, _)) = self.local_gateways.as_ref().and_then(|g| g.current(state)) {
            return hit;
        }
        let rows: Endpoints = Arc::new(
            instances_of_kind(state, ServiceKind::MeshGateway)
                .into_iter()
                .filter(|i| healthy(&i.checks, false))
                .map(Arc::new)
                .collect(),
        );
        self.local_gateways = Some(Stamped {
            value: rows.clone(),
            deps: Arc::new([keys::MESH_GATEWAYS]),
            stamp: state.index_of([&keys::MESH_GATEWAYS]),
        });
        rows
    }

    pub(super) fn endpoints_of(
        &mut self, state: &State, service: &str, filter: &str, only_passing: bool, connect: bool,
    ) -> Endpoints {
        let key = (
            service.to_string(),
            filter.to_string(),
            only_passing,
            connect,
        );
        if let Some((hit, _)) = self.endpoints.get(&key).and_then(|e| e.current(state)) {
            return hit;
        }
        let filter = (!filter.is_empty()).then(|| Filter::parse_for(filter, &HEALTH_SERVICE));
        // A proxy dials the target's sidecars (or connect-native instances),
        // never the application's own port: as Consul's proxycfg asks
        // `Health` with `Connect: true` for every chain target. A proxyless
        // client (`connect` false) dials the instances themselves.
        let rows: Vec<Arc<Instance>> = service_instances(state, service, connect)
            .into_iter()
            .filter(|i| healthy(&i.checks, only_passing))
            .filter(|i| match &filter {
                None => true,
                Some(Ok(f)) => serde_json::to_value(i).is_ok_and(|row| f.matches(&row)),
                // A subset filter is checked for its syntax only when written
                // (as Consul does); one whose selectors the health rows do not
                // have fails to evaluate, which leaves the subset empty.
                Some(Err(_)) => false,
            })
            .map(Arc::new)
            .collect();
        let value = Arc::new(rows);
        let dep = if connect {
            keys::connect(service)
        } else {
            keys::service(service)
        };
        let stamp = state.index_of([&dep]);
        self.endpoints.insert(
            key,
            Stamped {
                value: value.clone(),
                deps: Arc::new([dep]),
                stamp,
            },
        );
        value
    }
}

/// The state seen by the chain compiler, noting every entry it reads.
struct Recording<'a> {
    state: &'a State,
    read: RefCell<BTreeSet<Dep>>,
}

impl EntryLookup for Recording<'_> {
    fn get(&self, kind: Kind, name: &str) -> Option<&ConfigEntry> {
        self.read
            .borrow_mut()
            .insert(keys::config(kind.as_str(), name));
        self.state.get(kind, name)
    }

    fn list(&self, kind: Kind) -> Vec<&ConfigEntry> {
        self.read
            .borrow_mut()
            .insert(keys::config_kind(kind.as_str()));
        self.state.list(kind)
    }

    fn referrers(&self, service: &str) -> Vec<String> {
        // Who refers to a service changes only with entries of the chain
        // kinds, whose writes touch their kind's key.
        for kind in [
            Kind::ServiceRouter,
            Kind::ServiceSplitter,
            Kind::ServiceResolver,
        ] {
            self.read
                .borrow_mut()
                .insert(keys::config_kind(kind.as_str()));
        }
        self.state.referrers(service)
    }
}

/// Builds the snapshot of sidecar proxy `registered` (at `key`).
pub fn sidecar(
    state: &State, datacenter: &str, key: &ProxyKey, registered: &Arc<NodeService>,
    shared: &mut Shared,
) -> Option<(Snapshot, BTreeSet<Dep>)> {
    let mut deps = BTreeSet::new();
    deps.insert(keys::service(&registered.service));
    // What the merge read: proxy-defaults, service-defaults of the
    // destination, of each upstream and of each override.
    deps.extend(crate::merge::merge_watch_keys(state, registered));
    let service = crate::merge::merge_node_service(state, registered);

    let mut upstreams = BTreeMap::new();
    for up in &service.proxy.upstreams {
        let name = &up.destination_name;
        if name.is_empty() || name == "*" || !up.destination_peer.is_empty() {
            continue;
        }
        let dc = if up.datacenter.is_empty() {
            datacenter
        } else {
            &up.datacenter
        };
        // As Consul: the upstream's own mode over the proxy's (both with
        // central config merged), the chain's override for every target;
        // with neither, each target's service-defaults, else proxy-defaults.
        let mode = if up.mesh_gateway.mode.is_empty() {
            &service.proxy.mesh_gateway.mode
        } else {
            &up.mesh_gateway.mode
        };
        let ov = Overrides::of(up, mode);
        let entry = upstream(state, datacenter, dc, name, &ov, true, shared, &mut deps);
        upstreams.insert(name.clone(), entry);
    }
    // Mesh identity and authorization of the service this proxy fronts.
    deps.insert(keys::CONNECT_CA);
    let destination = service.proxy.destination_service_name.clone();
    let kind = Kind::ServiceIntentions.as_str();
    deps.insert(keys::config(kind, &destination));
    deps.insert(keys::config(kind, "*"));
    let roots = shared.roots(state);
    let leaf = if destination.is_empty() {
        None
    } else {
        shared.leaf(state, datacenter, &destination)
    };
    let intentions = shared.intentions(state, &destination);
    let transparent = (service.proxy.mode == crate::merge::MODE_TRANSPARENT).then(|| {
        Arc::new(transparent(
            state,
            datacenter,
            &service,
            &mut upstreams,
            shared,
            &mut deps,
        ))
    });
    let snapshot = Snapshot {
        proxy_id: json!({ "Node": key.0, "ServiceID": key.1 }),
        version: 0,
        index: state.index,
        service,
        upstreams,
        roots,
        leaf,
        intentions,
        intentions_default_allow: !shared.deny_by_default,
        gateway: None,
        transparent,
        mesh_tls: shared.mesh_tls(state, &mut deps),
    };
    Some((snapshot, deps))
}

/// Envoy's outbound port for a transparent proxy, as Consul's default.
pub const OUTBOUND_LISTENER_PORT: u16 = 15001;

/// A transparent proxy's part: the services its service's intentions let
/// it dial (as Consul infers them) added to `upstreams` beside the registered
/// ones, its outbound port, the mesh entry's passthrough setting. It reads
/// the catalog's service list and every intention, so any of them changing
/// rebuilds it.
fn transparent(
    state: &State, datacenter: &str, proxy: &NodeService,
    upstreams: &mut BTreeMap<String, UpstreamSnapshot>, shared: &mut Shared,
    deps: &mut BTreeSet<Dep>,
) -> TransparentSnapshot {
    use crate::structs::config_entry::MESH_CONFIG_NAME;
    deps.insert(keys::SERVICES);
    deps.insert(keys::config_kind(Kind::ServiceIntentions.as_str()));
    deps.insert(keys::config(Kind::Mesh.as_str(), MESH_CONFIG_NAME));
    let source = &proxy.proxy.destination_service_name;
    let mut inferred = BTreeSet::new();
    let allowed =
        crate::connect::intentions::allowed_upstreams(state, source, !shared.deny_by_default);
    for name in allowed {
        if upstreams.contains_key(&name) {
            continue; // registered: its own settings stand
        }
        // The proxy's own mode (as Consul's inferred upstreams take it).
        let ov = Overrides::mode(&proxy.proxy.mesh_gateway.mode);
        let entry = upstream(
            state, datacenter, datacenter, &name, &ov, true, shared, deps,
        );
        upstreams.insert(name.clone(), entry);
        inferred.insert(name);
    }
    let mesh_destinations_only = state
        .get(Kind::Mesh, MESH_CONFIG_NAME)
        .and_then(|e| e.as_mesh())
        .is_some_and(|m| m.transparent_proxy.mesh_destinations_only);
    TransparentSnapshot {
        outbound_listener_port: u16::try_from(proxy.proxy.transparent_proxy.outbound_listener_port)
            .ok()
            .filter(|p| *p != 0)
            .unwrap_or(OUTBOUND_LISTENER_PORT),
        inferred,
        mesh_destinations_only,
    }
}

/// Builds the snapshot of a proxyless gRPC client: the service instance
/// `instance` (any registration but a proxy's) dialing the services
/// `names`, each through its compiled chain to its healthy instances. No
/// leaf, roots or intentions: such a client speaks plaintext or its own
/// TLS, outside the mesh's mTLS. `None` once the instance is gone.
pub fn build_proxyless(
    state: &State, datacenter: &str, instance: &ProxyKey, names: &BTreeSet<String>,
    shared: &mut Shared,
) -> Option<(Snapshot, BTreeSet<Dep>)> {
    let registered = state.services.get(instance)?;
    if registered.is_connect_proxy() {
        return None;
    }
    let mut deps = BTreeSet::new();
    deps.insert(keys::service(&registered.service));
    let upstreams = names
        .iter()
        .map(|name| {
            let entry = upstream(
                state,
                datacenter,
                datacenter,
                name,
                &Overrides::default(),
                false,
                shared,
                &mut deps,
            );
            (name.clone(), entry)
        })
        .collect();
    let snapshot = Snapshot::bare(
        json!({ "Node": instance.0, "ServiceID": instance.1 }),
        state.index,
        (**registered).clone(),
        upstreams,
    );
    Some((snapshot, deps))
}

/// What an upstream overrides in its chain, as Consul's proxycfg passes
/// them to the compiler: the mesh gateway mode (the upstream's over the
/// proxy's), and from a registered upstream's `Config` (central config
/// merged) its `protocol` and `connect_timeout_ms`. A chain they change is
/// another chain, its clusters named with a hash of them.
#[derive(Debug, Clone, Default)]
pub(super) struct Overrides {
    pub mesh_gateway: String,
    pub protocol: String,
    pub connect_timeout: crate::structs::duration::Duration,
}

impl Overrides {
    pub(super) fn mode(mesh_gateway: &str) -> Self {
        Overrides {
            mesh_gateway: mesh_gateway.to_string(),
            ..Default::default()
        }
    }

    fn of(up: &crate::structs::catalog::Upstream, mesh_gateway: &str) -> Self {
        let cfg = up.config.as_deref();
        let get = |k: &str| cfg.and_then(|c| c.get(k));
        let protocol = get("protocol").and_then(|v| v.as_str()).unwrap_or_default();
        let ms = get("connect_timeout_ms")
            .and_then(crate::structs::serde_util::loose_u64)
            .and_then(|ms| i64::try_from(ms).ok())
            .unwrap_or(0);
        Overrides {
            mesh_gateway: mesh_gateway.to_string(),
            protocol: protocol.to_string(),
            connect_timeout: crate::structs::duration::Duration(ms.saturating_mul(1_000_000)),
        }
    }
}

/// One upstream's compiled chain (in datacenter `dc`, with the upstream's
/// overrides `ov`) and its local targets' healthy
/// endpoints: their connect-capable instances for a proxy (`connect`), the
/// instances themselves for a proxyless client, which dials the
/// applications' own ports.
#[allow(clippy::too_many_arguments)]
pub(super) fn upstream(
    state: &State, datacenter: &str, dc: &str, name: &str, ov: &Overrides, connect: bool,
    shared: &mut Shared, deps: &mut BTreeSet<Dep>,
) -> UpstreamSnapshot {
    let trust_domain = format!("{}.consul", state.cluster_id);
    let mut req = CompileRequest::new(name, dc, &trust_domain);
    req.server_datacenter = datacenter.to_string();
    crate::state::virtual_ip::fill(state, &mut req);
    req.override_mesh_gateway.mode = ov.mesh_gateway.clone();
    req.override_protocol = ov.protocol.clone();
    req.override_connect_timeout = ov.connect_timeout;
    let (chain, chain_deps) = shared.chain(state, &req, dc);
    deps.extend(chain_deps.iter().cloned());
    match chain {
        Ok(chain) => {
            let mut endpoints = BTreeMap::new();
            let mut gateways = BTreeMap::new();
            for (id, target) in &chain.targets {
                if !target.peer.is_empty() {
                    continue; // peers are reached via gateways
                }
                if target.datacenter != datacenter {
                    // A proxy dials another datacenter's instances there;
                    // a proxyless client stays within its own.
                    if connect && let Some((rows, dep)) = remote_endpoints(shared, target) {
                        deps.insert(dep);
                        endpoints.insert(id.clone(), rows);
                        if let Some(via) = via_gateways(state, datacenter, shared, target, deps) {
                            gateways.insert(id.clone(), via);
                        }
                    }
                    continue;
                }
                deps.insert(if connect {
                    keys::connect(&target.service)
                } else {
                    keys::service(&target.service)
                });
                let rows = shared.endpoints_of(
                    state,
                    &target.service,
                    &target.subset.filter,
                    target.subset.only_passing,
                    connect,
                );
                endpoints.insert(id.clone(), rows);
            }
            UpstreamSnapshot {
                chain: Some(chain),
                error: String::new(),
                endpoints,
                gateways,
            }
        }
        Err(error) => UpstreamSnapshot {
            chain: None,
            error,
            endpoints: BTreeMap::new(),
            gateways: BTreeMap::new(),
        },
    }
}

/// A target in another datacenter: its instances there (dialled at their
/// own addresses in mesh gateway mode `none`, the default), empty until
/// first heard; none without a federation to ask.
fn remote_endpoints(
    shared: &Shared, target: &crate::discovery_chain::DiscoveryTarget,
) -> Option<(Endpoints, Dep)> {
    let remote = shared.remote.as_ref()?;
    let (rows, dep) = remote.endpoints(
        &target.datacenter,
        &target.service,
        &target.subset.filter,
        target.subset.only_passing,
    );
    Some((rows.unwrap_or_default(), dep))
}

/// The mesh gateways a target in another datacenter is reached through:
/// this datacenter's in mode `local`, the target's datacenter's in mode
/// `remote` (followed there as its instances are); `None` in mode `none`
/// (or any other word: Consul takes it as the default).
fn via_gateways(
    state: &State, datacenter: &str, shared: &mut Shared,
    target: &crate::discovery_chain::DiscoveryTarget, deps: &mut BTreeSet<Dep>,
) -> Option<ViaGateways> {
    let mode = target.mesh_gateway.mode.as_str();
    let (dc, instances) = match mode {
        "local" => {
            deps.insert(keys::MESH_GATEWAYS);
            (datacenter, shared.local_gateways(state))
        }
        "remote" => {
            let (rows, dep) = shared.remote.as_ref()?.gateways(&target.datacenter);
            deps.insert(dep);
            (target.datacenter.as_str(), rows.unwrap_or_default())
        }
        _ => return None,
    };
    Some(ViaGateways {
        mode: mode.to_string(),
        datacenter: dc.to_string(),
        wan: dc != datacenter,
        instances,
    })
}
