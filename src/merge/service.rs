//! Laying resolved central config under a registration (Consul's
//! `MergeServiceConfig` and `MergeNodeServiceWithCentralConfig`), and the
//! watch keys that make merged reads block correctly.
//!
//! The registration always wins: central config only fills what it leaves
//! unset. The one exception is Consul's too: a merged proxy's
//! `EnvoyExtensions` are exactly central config's (proxy-defaults', then
//! service-defaults'), replacing any the registration carried.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::flatten::{
    MODE_TRANSPARENT, ResolveRequest, ResolvedServiceConfig, UpstreamKey, mesh_gateway_mode_of,
    resolve_service_config, service_defaults,
};
use crate::discovery_chain::EntryLookup;
use crate::state::catalog::Instance;
use crate::state::{State, WatchKey, keys};
use crate::structs::catalog::{MeshGatewayConfig, NodeService, Upstream};
use crate::structs::config_entry::shape::is_empty;
use crate::structs::config_entry::{Kind, PROXY_CONFIG_GLOBAL};

const DEFAULT_TENANCY: &str = "default";
const MESH_GATEWAY_KEY: &str = "mesh_gateway";

/// Whether `?merge-central-config` applies to an instance: only connect
/// proxies and gateways are merged; every other service reads as registered.
pub fn should_merge(svc: &NodeService) -> bool {
    svc.kind.is_proxy_or_gateway()
}

/// Upstreams central config knows about: those of destination type
/// `service` ("" means service too); prepared queries are left alone.
fn is_service_upstream(u: &Upstream) -> bool {
    u.destination_type.is_empty() || u.destination_type == "service"
}

fn upstream_key(u: &Upstream) -> UpstreamKey {
    UpstreamKey {
        peer: u.destination_peer.clone(),
        name: u.destination_name.clone(),
    }
}

/// What a registration asks of the resolver. A sidecar is configured by the
/// service it fronts and brings its upstreams; anything else (gateways) by
/// its own name, with no upstreams.
pub fn resolve_request_for(svc: &NodeService) -> ResolveRequest {
    let sidecar = svc.is_connect_proxy();
    ResolveRequest {
        name: if sidecar {
            svc.proxy.destination_service_name.clone()
        } else {
            svc.service.clone()
        },
        mode: svc.proxy.mode.clone(),
        mesh_gateway: svc.proxy.mesh_gateway.mode.clone(),
        upstreams: if sidecar {
            svc.proxy
                .upstreams
                .iter()
                .filter(|u| is_service_upstream(u))
                .map(upstream_key)
                .collect()
        } else {
            Vec::new()
        },
    }
}

/// `svc` with central config merged in, whatever its kind (the dataplane
/// bootstrap merges any service it is asked about, as Consul does).
pub fn merge_with_central_config(
    entries: &(impl EntryLookup + ?Sized), svc: &NodeService,
) -> NodeService {
    let resolved = resolve_service_config(entries, &resolve_request_for(svc));
    merge_service_config(&resolved, svc)
}

/// The instance as `?merge-central-config` shows it: proxies and gateways
/// merged with central config, other services as registered. The stored
/// service is never touched.
pub fn merge_node_service(state: &State, svc: &NodeService) -> NodeService {
    if should_merge(svc) {
        merge_with_central_config(state, svc)
    } else {
        svc.clone()
    }
}

/// Replaces each proxy or gateway in `instances` by its merged form, sharing
/// the rest with the state version. One call per read in the endpoints.
///
/// Instances of one service usually ask the resolver the same question (same
/// destination, same upstreams): each distinct question is resolved and
/// prepared once per read, and recognised without building it again.
pub fn merge_instances(state: &State, instances: &mut [Instance]) {
    let mut seen: Vec<(ResolveRequest, ResolvedServiceConfig, Prepared)> = Vec::new();
    for i in instances.iter_mut().filter(|i| should_merge(&i.service)) {
        let at = match seen.iter().position(|(r, ..)| asks(&i.service, r)) {
            Some(at) => at,
            None => {
                let req = resolve_request_for(&i.service);
                let defaults = resolve_service_config(state, &req);
                let prepared = prepare(&defaults, &req.upstreams);
                seen.push((req, defaults, prepared));
                seen.len() - 1
            }
        };
        let (_, defaults, prepared) = &seen[at];
        i.service = Arc::new(merge_prepared(defaults, prepared, &i.service));
    }
}

/// Whether `svc` would ask the resolver exactly `req` (what
/// `resolve_request_for` builds, compared without building it).
fn asks(svc: &NodeService, req: &ResolveRequest) -> bool {
    let sidecar = svc.is_connect_proxy();
    let name = if sidecar {
        &svc.proxy.destination_service_name
    } else {
        &svc.service
    };
    if *name != req.name
        || svc.proxy.mode != req.mode
        || svc.proxy.mesh_gateway.mode != req.mesh_gateway
    {
        return false;
    }
    if !sidecar {
        return req.upstreams.is_empty();
    }
    let mut ups = svc
        .proxy
        .upstreams
        .iter()
        .filter(|u| is_service_upstream(u));
    let mut want = req.upstreams.iter();
    loop {
        match (ups.next(), want.next()) {
            (None, None) => return true,
            (Some(u), Some(k)) if u.destination_name == k.name && u.destination_peer == k.peer => {}
            _ => return false,
        }
    }
}

/// What every instance asking the same question gets, worked out once and
/// shared (`Arc`) rather than copied into each.
struct Prepared {
    /// `Proxy.Config` for a registration that set none.
    proxy_config: Option<Arc<Map<String, Value>>>,
    /// One per declared service upstream, in order: `None` where central
    /// config says nothing about it.
    slots: Vec<Option<Slot>>,
}

/// Central config for one declared upstream.
struct Slot {
    /// The resolved opaque config.
    central: Map<String, Value>,
    /// The mesh gateway mode it resolves to.
    mode: String,
    /// What an upstream that registered no `Config` of its own ends up with.
    bare: Option<Arc<Map<String, Value>>>,
}

fn prepare(defaults: &ResolvedServiceConfig, keys: &[UpstreamKey]) -> Prepared {
    let slots = keys
        .iter()
        .map(|k| {
            let central = defaults.upstream_configs.get(k)?;
            let mut bare = Map::new();
            fill_except(&mut bare, central, MESH_GATEWAY_KEY);
            if !k.peer.is_empty() {
                bare.remove("protocol");
            }
            Some(Slot {
                central: central.clone(),
                mode: mesh_gateway_mode_of(central),
                bare: (!bare.is_empty()).then(|| Arc::new(bare)),
            })
        })
        .collect();
    let mut proxy_config = Map::new();
    fill(&mut proxy_config, &defaults.proxy_config);
    Prepared {
        proxy_config: (!proxy_config.is_empty()).then(|| Arc::new(proxy_config)),
        slots,
    }
}

/// Merges resolved central config under a registration (Consul's
/// `MergeServiceConfig`). Registration values win everywhere; central values
/// fill what is unset.
pub fn merge_service_config(defaults: &ResolvedServiceConfig, svc: &NodeService) -> NodeService {
    let keys: Vec<UpstreamKey> = svc
        .proxy
        .upstreams
        .iter()
        .filter(|u| is_service_upstream(u))
        .map(upstream_key)
        .collect();
    merge_prepared(defaults, &prepare(defaults, &keys), svc)
}

/// [`merge_service_config`] with `prepared` for `svc`'s service upstreams,
/// in their order.
fn merge_prepared(
    defaults: &ResolvedServiceConfig, prepared: &Prepared, svc: &NodeService,
) -> NodeService {
    let mut ns = svc.clone();
    let p = &mut ns.proxy;

    match (&mut p.config, &prepared.proxy_config) {
        (_, None) => {}
        (Some(cfg), Some(_)) if !cfg.is_empty() => fill(Arc::make_mut(cfg), &defaults.proxy_config),
        (cfg, Some(central)) => *cfg = Some(central.clone()),
    }

    if !p.expose.checks {
        p.expose.checks = defaults.expose.checks;
    }
    if p.expose.paths.is_empty() {
        p.expose.paths = defaults.expose.paths.clone();
    }

    let logs = &mut p.access_logs;
    let central = &defaults.access_logs;
    logs.enabled |= central.enabled;
    logs.disable_listener_logs |= central.disable_listener_logs;
    fill_str(&mut logs.log_type, &central.log_type);
    fill_str(&mut logs.path, &central.path);
    fill_str(&mut logs.json_format, &central.json_format);
    fill_str(&mut logs.text_format, &central.text_format);

    // Central config is the whole truth about extensions once merged.
    p.envoy_extensions = defaults.envoy_extensions.clone();

    fill_str(&mut p.mesh_gateway.mode, &defaults.mesh_gateway);
    fill_str(&mut p.mode, &defaults.mode);
    if p.transparent_proxy.outbound_listener_port == 0 {
        p.transparent_proxy.outbound_listener_port =
            defaults.transparent_proxy.outbound_listener_port;
    }
    p.transparent_proxy.dialed_directly |= defaults.transparent_proxy.dialed_directly;
    fill_str(&mut p.mutual_tls_mode, &defaults.mutual_tls_mode);

    let ups = p.upstreams.iter_mut().filter(|u| is_service_upstream(u));
    for (us, slot) in ups.zip(&prepared.slots) {
        if let Some(slot) = slot {
            merge_upstream(us, slot);
        }
    }

    // A transparent proxy dials upstreams it never declared, so centrally
    // configured ones (and the `*` defaults) join the list. Outside
    // transparent mode every upstream is declared already.
    if p.mode == MODE_TRANSPARENT {
        let declared: BTreeSet<UpstreamKey> = p
            .upstreams
            .iter()
            .filter(|u| is_service_upstream(u))
            .map(upstream_key)
            .collect();
        for (k, cfg) in &defaults.upstream_configs {
            if !declared.contains(k) {
                p.upstreams.push(central_upstream(k, cfg));
            }
        }
    }
    ns
}

/// Fills a declared upstream from its resolved central config.
fn merge_upstream(us: &mut Upstream, slot: &Slot) {
    // The upstream's own mode is the most specific of all.
    fill_str(&mut us.mesh_gateway.mode, &slot.mode);
    let Some(cfg) = us.config.as_mut().filter(|c| !c.is_empty()) else {
        // The common case: nothing registered, so the prepared result.
        us.config = slot.bare.clone();
        return;
    };
    // Copies the registration's map (shared with the stored catalog) before
    // changing it.
    let cfg = Arc::make_mut(cfg);
    let registered_protocol = cfg.get("protocol").cloned();
    fill_except(cfg, &slot.central, MESH_GATEWAY_KEY);
    // A peer's protocol is the peer's business: central config of this
    // cluster never changes it.
    if !us.destination_peer.is_empty() {
        match registered_protocol {
            Some(p) => cfg.insert("protocol".into(), p),
            None => cfg.remove("protocol"),
        };
    }
    // The resolved mode is in the typed field, where it may have lost to the
    // upstream's own; a copy in the map would only mislead.
    cfg.remove(MESH_GATEWAY_KEY);
    if cfg.is_empty() {
        us.config = None;
    }
}

/// An upstream only central config knows about, as a transparent proxy
/// gets it: no local bind, tenancy spelled out, `CentrallyConfigured`.
fn central_upstream(k: &UpstreamKey, cfg: &Map<String, Value>) -> Upstream {
    Upstream {
        destination_namespace: DEFAULT_TENANCY.into(),
        destination_partition: DEFAULT_TENANCY.into(),
        destination_name: k.name.clone(),
        destination_peer: k.peer.clone(),
        config: (!cfg.is_empty()).then(|| Arc::new(cfg.clone())),
        mesh_gateway: MeshGatewayConfig {
            mode: mesh_gateway_mode_of(cfg),
        },
        centrally_configured: true,
        ..Default::default()
    }
}

fn fill_str(dst: &mut String, src: &str) {
    if dst.is_empty() && !src.is_empty() {
        *dst = src.to_string();
    }
}

/// Merges `src` into `dst` without overwriting (Go's `mergo.Merge`): a key
/// `dst` has with a non-empty value stays; nested objects are merged the
/// same way; empty or missing values are taken from `src`.
fn fill(dst: &mut Map<String, Value>, src: &Map<String, Value>) {
    fill_except(dst, src, "");
}

/// [`fill`], leaving out `src`'s member `skip` (a copy the caller would only
/// delete again).
fn fill_except(dst: &mut Map<String, Value>, src: &Map<String, Value>, skip: &str) {
    for (k, sv) in src {
        if sv.is_null() || k == skip {
            continue;
        }
        match dst.get_mut(k) {
            Some(Value::Object(d)) if sv.is_object() => {
                if let Value::Object(s) = sv {
                    fill(d, s);
                }
            }
            Some(dv) if !is_empty(dv) => {}
            _ => {
                dst.insert(k.clone(), sv.clone());
            }
        }
    }
}

/// The config entries a merge of `svc` reads, as watch keys: proxy-defaults,
/// the service-defaults of the service that configures it, and for a sidecar
/// the service-defaults of each local upstream and of each upstream its
/// service-defaults overrides. A blocking read that merges must wake on
/// these too. Services that are not merged read nothing.
pub fn merge_watch_keys(state: &State, svc: &NodeService) -> Vec<WatchKey> {
    let mut out = BTreeSet::new();
    if should_merge(svc) {
        add_watch_keys(state, svc, &mut out);
    }
    out.into_iter().collect()
}

fn add_watch_keys(state: &State, svc: &NodeService, out: &mut BTreeSet<WatchKey>) {
    let sd = Kind::ServiceDefaults.as_str();
    let req = resolve_request_for(svc);
    out.insert(keys::config(
        Kind::ProxyDefaults.as_str(),
        PROXY_CONFIG_GLOBAL,
    ));
    out.insert(keys::config(sd, &req.name));
    for u in req.upstreams.iter().filter(|u| u.peer.is_empty()) {
        out.insert(keys::config(sd, &u.name));
    }
    // Overrides come from the destination's entry, whose own key is watched:
    // when the list changes, that key wakes the read first.
    if let Some(uc) = service_defaults(state, &req.name).and_then(|e| e.upstream_config.as_ref()) {
        for o in uc.overrides.iter().filter(|o| o.peer.is_empty()) {
            out.insert(keys::config(sd, &o.name));
        }
    }
}

/// The watch keys of merging every instance in `instances`, deduplicated.
/// Instances asking the same question read the same entries, so each
/// distinct question is looked at once.
pub fn watch_keys_for_instances(state: &State, instances: &[Instance]) -> Vec<WatchKey> {
    let mut out = BTreeSet::new();
    let mut asked: Vec<ResolveRequest> = Vec::new();
    for i in instances.iter().filter(|i| should_merge(&i.service)) {
        if asked.iter().any(|r| asks(&i.service, r)) {
            continue;
        }
        add_watch_keys(state, &i.service, &mut out);
        asked.push(resolve_request_for(&i.service));
    }
    out.into_iter().collect()
}

/// The query parameter that asks a catalog or health read to merge.
pub const PARAM: &str = "merge-central-config";

/// The watch keys of a read of the instances of `name` (or, with `connect`,
/// of its proxies): the read's own catalog key, and when it merges, the
/// config entries the merge of the current instances reads.
pub fn read_watch_keys(
    state: &State, catalog_key: WatchKey, name: &str, connect: bool, merge: bool,
) -> Vec<WatchKey> {
    let mut keys = vec![catalog_key];
    if merge {
        keys.extend(service_watch_keys(state, name, connect));
    }
    keys
}

/// The extra watch keys of a `?merge-central-config` read of the instances
/// of `name` (or, with `connect`, of its proxies), taken from the version
/// the endpoint sees before it blocks. If the instances change, their own
/// catalog key wakes the read first, so the set never goes stale unseen.
pub fn service_watch_keys(state: &State, name: &str, connect: bool) -> Vec<WatchKey> {
    watch_keys_for_instances(
        state,
        &crate::state::catalog::service_instances(state, name, connect),
    )
}

#[cfg(test)]
/// The index of the config entries a merge of `svc` reads (1 when none was
/// ever written): combine with the catalog keys' index for `X-Consul-Index`.
pub fn merge_index(state: &State, svc: &NodeService) -> u64 {
    let keys = merge_watch_keys(state, svc);
    state.index_of(&keys)
}
