//! The discovery chain compiler: a pure function of (request, entries) that
//! walks router → splitters → resolvers for one service and produces the
//! graph of nodes and targets Consul produces, with Consul's names, IDs and
//! SNI values (they become Envoy cluster names).

use super::types::*;
use super::{ChainError, CompileRequest, EntryLookup};
use crate::structs::config_entry::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::LazyLock;

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Splitters nested deeper than this are refused: the compiler recurses
/// through them and must not run out of stack on any input.
const MAX_SPLITTER_DEPTH: usize = 64;

/// A flattened splitter with more legs than this is refused: nesting can
/// multiply legs, and weights below 0.01% are meaningless anyway.
const MAX_SPLITS: usize = 1_000;

/// Used for services without a service-resolver entry.
static DEFAULT_RESOLVER: LazyLock<ServiceResolverConfigEntry> =
    LazyLock::new(ServiceResolverConfigEntry::default);

fn or_default<'s>(v: &'s str, default: &'s str) -> &'s str {
    if v.is_empty() { default } else { v }
}

/// Only the default namespace and partition hold entries.
fn in_default_tenancy(namespace: &str, partition: &str) -> bool {
    matches!(namespace, "" | "default") && matches!(partition, "" | "default")
}

/// What a target is made from; unset members are filled from the request.
#[derive(Debug, Clone, Default)]
struct TargetOpts {
    service: String,
    service_subset: String,
    namespace: String,
    partition: String,
    datacenter: String,
    peer: String,
}

impl TargetOpts {
    fn service(service: &str, namespace: &str, partition: &str) -> Self {
        TargetOpts {
            service: service.into(),
            namespace: namespace.into(),
            partition: partition.into(),
            ..Default::default()
        }
    }
}

/// The target ID; also the resolver node's name.
fn chain_id(o: &TargetOpts) -> String {
    if !o.peer.is_empty() {
        return format!("{}.{}.default.external.{}", o.service, o.namespace, o.peer);
    }
    let base = format!(
        "{}.{}.{}.{}",
        o.service, o.namespace, o.partition, o.datacenter
    );
    if o.service_subset.is_empty() {
        base
    } else {
        format!("{}.{base}", o.service_subset)
    }
}

/// The protocol a service speaks, as the chain compiler decides it: its
/// service-defaults' (an entry without one means tcp, not proxy-defaults'),
/// else the global proxy-defaults' config, else tcp; lower case.
pub fn service_protocol(
    service_defaults: Option<&ServiceConfigEntry>, proxy_defaults: Option<&ProxyConfigEntry>,
) -> String {
    let protocol = match service_defaults {
        Some(sd) => sd.protocol.clone(),
        None => proxy_defaults
            .and_then(ProxyConfigEntry::config_protocol)
            .unwrap_or_default(),
    };
    if protocol.is_empty() {
        "tcp".to_string()
    } else {
        protocol.to_lowercase()
    }
}

/// Consul's connect SNI for a service (subset) in a datacenter.
pub fn service_sni(
    service: &str, subset: &str, namespace: &str, partition: &str, datacenter: &str,
    trust_domain: &str,
) -> String {
    let ns = or_default(namespace, "default");
    let mut parts: Vec<&str> = Vec::with_capacity(7);
    if !subset.is_empty() {
        parts.push(subset);
    }
    parts.extend([service, ns]);
    match or_default(partition, "default") {
        "default" => parts.extend([datacenter, "internal"]),
        p => parts.extend([p, datacenter, "internal-v1"]),
    }
    parts.push(trust_domain);
    parts.join(".")
}

#[derive(Default)]
struct Customized {
    mesh_gateway: bool,
    protocol: bool,
    connect_timeout: bool,
}

pub(crate) struct Compiler<'a, L: EntryLookup + ?Sized> {
    req: &'a CompileRequest,
    entries: &'a L,
    namespace: &'a str,
    partition: &'a str,
    disable_advanced_routing: bool,
    uses_advanced_routing: bool,
    customized: Customized,
    protocol: String,
    start_node: String,
    nodes: BTreeMap<String, DiscoveryGraphNode>,
    /// Resolver node key by the target it resolves.
    resolve_nodes: HashMap<String, String>,
    targets: BTreeMap<String, DiscoveryTarget>,
    retained_targets: HashSet<String>,
    splitter_depth: usize,
}

impl<'a, L: EntryLookup + ?Sized> Compiler<'a, L> {
    pub(crate) fn new(req: &'a CompileRequest, entries: &'a L) -> Self {
        Compiler {
            req,
            entries,
            namespace: or_default(&req.evaluate_in_namespace, "default"),
            partition: or_default(&req.evaluate_in_partition, "default"),
            disable_advanced_routing: !req.override_protocol.is_empty()
                && !is_http_like(&req.override_protocol),
            uses_advanced_routing: false,
            customized: Customized::default(),
            protocol: String::new(),
            start_node: String::new(),
            nodes: BTreeMap::new(),
            resolve_nodes: HashMap::new(),
            targets: BTreeMap::new(),
            retained_targets: HashSet::new(),
            splitter_depth: 0,
        }
    }

    // ---- entry access ------------------------------------------------------

    fn entry(&self, kind: Kind, name: &str, ns: &str, partition: &str) -> Option<&'a ConfigEntry> {
        let entries: &'a L = self.entries;
        in_default_tenancy(ns, partition)
            .then(|| entries.get(kind, name))
            .flatten()
    }

    fn service_defaults(&self, name: &str, ns: &str, part: &str) -> Option<&'a ServiceConfigEntry> {
        self.entry(Kind::ServiceDefaults, name, ns, part)
            .and_then(ConfigEntry::as_service_defaults)
    }

    fn proxy_defaults(&self, part: &str) -> Option<&'a ProxyConfigEntry> {
        self.entry(Kind::ProxyDefaults, PROXY_CONFIG_GLOBAL, "", part)
            .and_then(ConfigEntry::as_proxy_defaults)
    }

    fn resolver(&self, name: &str, ns: &str, part: &str) -> &'a ServiceResolverConfigEntry {
        self.entry(Kind::ServiceResolver, name, ns, part)
            .and_then(ConfigEntry::as_resolver)
            .unwrap_or(&DEFAULT_RESOLVER)
    }

    // ---- protocol ----------------------------------------------------------

    fn record_service_protocol(
        &mut self, service: &str, ns: &str, part: &str,
    ) -> Result<(), ChainError> {
        let protocol = service_protocol(
            self.service_defaults(service, ns, part),
            self.proxy_defaults(part),
        );
        if self.protocol.is_empty() {
            self.protocol = protocol;
        } else if self.protocol != protocol {
            return Err(ChainError::Graph(format!(
                "discovery chain {:?} uses inconsistent protocols; service {:?} has {:?} which is not {:?}",
                self.req.service_name, service, protocol, self.protocol
            )));
        }
        Ok(())
    }

    // ---- targets -------------------------------------------------------------

    fn new_target(&mut self, mut o: TargetOpts) -> String {
        if o.peer.is_empty() {
            o.datacenter = or_default(&o.datacenter, &self.req.evaluate_in_datacenter).into();
            o.namespace = or_default(&o.namespace, self.namespace).into();
            o.partition = or_default(&o.partition, self.partition).into();
        } else {
            o.datacenter.clear();
            o.partition = "default".into();
            o.namespace = or_default(&o.namespace, "default").into();
        }
        let id = chain_id(&o);
        if !self.targets.contains_key(&id) {
            let sni = if o.peer.is_empty() {
                service_sni(
                    &o.service,
                    &o.service_subset,
                    &o.namespace,
                    &o.partition,
                    &o.datacenter,
                    &self.req.trust_domain,
                )
            } else {
                // A peer's trust domain is not known here.
                String::new()
            };
            self.targets.insert(
                id.clone(),
                DiscoveryTarget {
                    id: id.clone(),
                    service: o.service,
                    service_subset: o.service_subset,
                    namespace: o.namespace,
                    partition: o.partition,
                    datacenter: o.datacenter,
                    peer: o.peer,
                    mesh_gateway: MeshGatewayConfig::default(),
                    subset: ServiceResolverSubset::default(),
                    transparent_proxy: TransparentProxyConfig::default(),
                    connect_timeout: Duration::default(),
                    external: false,
                    name: sni.clone(),
                    sni,
                },
            );
        }
        id
    }

    /// A target like `id` with `o`'s non-empty members applied.
    fn rewrite_target(&mut self, id: &str, o: TargetOpts) -> String {
        let t = &self.targets[id];
        let mut m = TargetOpts {
            service: t.service.clone(),
            service_subset: t.service_subset.clone(),
            namespace: t.namespace.clone(),
            partition: t.partition.clone(),
            datacenter: t.datacenter.clone(),
            peer: t.peer.clone(),
        };
        if !o.service.is_empty() && o.service != m.service {
            m.service = o.service;
            // Another service's subsets are not ours.
            m.service_subset.clear();
        }
        if !o.service_subset.is_empty() {
            m.service_subset = o.service_subset;
        }
        if !o.partition.is_empty() {
            m.partition = o.partition;
        }
        if !o.namespace.is_empty() || !o.peer.is_empty() {
            m.namespace = o.namespace;
        }
        if !o.datacenter.is_empty() {
            m.datacenter = o.datacenter;
        }
        m.peer = o.peer;
        self.new_target(m)
    }

    // ---- assembly ------------------------------------------------------------

    fn record_node(&mut self, node: DiscoveryGraphNode) -> String {
        let key = node.key();
        if let Some(r) = &node.resolver {
            self.resolve_nodes.insert(r.target.clone(), key.clone());
        }
        self.nodes.insert(key.clone(), node);
        key
    }

    fn assemble(&mut self) -> Result<(), ChainError> {
        let service = self.req.service_name.as_str();
        let (ns, part) = (self.namespace, self.partition);

        let mut router = self
            .entry(Kind::ServiceRouter, service, ns, part)
            .and_then(ConfigEntry::as_router);
        if router.is_some() && self.disable_advanced_routing {
            router = None;
            self.customized.protocol = true;
        }
        let Some(router) = router else {
            let t = self.new_target(TargetOpts::service(service, "", ""));
            self.start_node = self.splitter_or_resolver(&t)?;
            return Ok(());
        };

        self.uses_advanced_routing = true;
        self.record_service_protocol(service, ns, part)?;
        let mut routes = Vec::with_capacity(router.routes.len() + 1);
        for route in &router.routes {
            let dest = route.destination.clone().unwrap_or_default();
            let svc = or_default(&dest.service, service);
            let dest_ns = or_default(&dest.namespace, ns);
            let dest_part = or_default(&dest.partition, part);
            let next_node = if dest.service_subset.is_empty() {
                let t = self.new_target(TargetOpts::service(svc, dest_ns, dest_part));
                self.splitter_or_resolver(&t)?
            } else {
                let mut o = TargetOpts::service(svc, dest_ns, dest_part);
                o.service_subset = dest.service_subset.clone();
                let t = self.new_target(o);
                self.resolver_node(t, false)?.0
            };
            routes.push(DiscoveryRoute {
                definition: route.clone(),
                next_node,
            });
        }

        // Unmatched traffic goes on to the service itself.
        let t = self.new_target(TargetOpts::service(service, ns, part));
        let next_node = self.splitter_or_resolver(&t)?;
        routes.push(DiscoveryRoute {
            definition: ServiceRoute {
                match_: Some(ServiceRouteMatch {
                    http: Some(ServiceRouteHttpMatch {
                        path_prefix: "/".into(),
                        ..Default::default()
                    }),
                }),
                destination: Some(ServiceRouteDestination {
                    service: service.into(),
                    namespace: ns.into(),
                    partition: part.into(),
                    ..Default::default()
                }),
            },
            next_node,
        });

        self.start_node = self.record_node(DiscoveryGraphNode {
            node_type: NodeType::Router,
            name: format!("{service}.{ns}.{part}"),
            routes,
            splits: Vec::new(),
            resolver: None,
            load_balancer: None,
        });
        Ok(())
    }

    fn splitter_or_resolver(&mut self, target: &str) -> Result<String, ChainError> {
        let t = &self.targets[target];
        let (svc, ns, part) = (t.service.clone(), t.namespace.clone(), t.partition.clone());
        if let Some(key) = self.splitter_node(&svc, &ns, &part)? {
            return Ok(key);
        }
        Ok(self.resolver_node(target.to_string(), false)?.0)
    }

    fn splitter_node(
        &mut self, service: &str, ns: &str, part: &str,
    ) -> Result<Option<String>, ChainError> {
        let name = format!("{service}.{ns}.{part}");
        let key = node_key(NodeType::Splitter, &name);
        if self.nodes.contains_key(&key) {
            return Ok(Some(key));
        }
        let mut splitter = self
            .entry(Kind::ServiceSplitter, service, ns, part)
            .and_then(ConfigEntry::as_splitter);
        if splitter.is_some() && self.disable_advanced_routing {
            splitter = None;
            self.customized.protocol = true;
        }
        let Some(splitter) = splitter else {
            return Ok(None);
        };

        if self.splitter_depth >= MAX_SPLITTER_DEPTH {
            return Err(ChainError::Graph(format!(
                "discovery chain {:?} nests splitters more than {MAX_SPLITTER_DEPTH} deep",
                self.req.service_name
            )));
        }
        self.splitter_depth += 1;
        let result = self.build_splitter(key, name, splitter, service, ns, part);
        self.splitter_depth -= 1;
        result.map(Some)
    }

    fn build_splitter(
        &mut self, key: String, name: String, splitter: &'a ServiceSplitterConfigEntry,
        service: &str, ns: &str, part: &str,
    ) -> Result<String, ChainError> {
        // Recorded before recursing so that a loop ends here (and is reported
        // by the circular reference check).
        self.record_node(DiscoveryGraphNode {
            node_type: NodeType::Splitter,
            name,
            routes: Vec::new(),
            splits: Vec::new(),
            resolver: None,
            load_balancer: None,
        });

        let mut splits = Vec::with_capacity(splitter.splits.len());
        let mut load_balancer = None;
        for split in &splitter.splits {
            let svc = or_default(&split.service, service);
            let split_ns = or_default(&split.namespace, ns);
            let split_part = or_default(&split.partition, part);
            let same_service = svc == service && split_ns == ns && split_part == part;

            let mut next_node = None;
            if !same_service && split.service_subset.is_empty() {
                next_node = self.splitter_node(svc, split_ns, split_part)?;
            }
            let next_node = match next_node {
                Some(k) => k,
                None => {
                    let mut o = TargetOpts::service(svc, split_ns, split_part);
                    o.service_subset = split.service_subset.clone();
                    let t = self.new_target(o);
                    let (k, _) = self.resolver_node(t, false)?;
                    // A route can carry only one hash policy: the first wins.
                    if load_balancer.is_none() {
                        load_balancer = self.nodes[&k]
                            .load_balancer
                            .clone()
                            .filter(LoadBalancer::is_hash_based);
                    }
                    k
                }
            };
            splits.push(DiscoverySplit {
                definition: split.clone(),
                weight: split.weight,
                next_node,
            });
        }
        let node = self.nodes.get_mut(&key).expect("recorded above");
        node.splits = splits;
        node.load_balancer = load_balancer;
        self.uses_advanced_routing = true;
        Ok(key)
    }

    /// Resolves `target` through redirects and default subsets to a resolver
    /// node. Returns the node key and the final target. Failover targets are
    /// resolved the same way (`for_failover`) but get no node of their own.
    fn resolver_node(
        &mut self, mut target: String, for_failover: bool,
    ) -> Result<(String, String), ChainError> {
        let mut history: Vec<String> = Vec::new();
        loop {
            if let Some(key) = self.resolve_nodes.get(&target) {
                return Ok((key.clone(), target));
            }
            let t = &self.targets[&target];
            let (svc, subset, ns, part, peer) = (
                t.service.clone(),
                t.service_subset.clone(),
                t.namespace.clone(),
                t.partition.clone(),
                t.peer.clone(),
            );
            if peer.is_empty() {
                self.record_service_protocol(&svc, &ns, &part)?;
            }
            let resolver = self.resolver(&svc, &ns, &part);

            if history.contains(&target) {
                history.push(target);
                return Err(ChainError::Graph(format!(
                    "detected circular resolver redirect: [{}]",
                    history.join(" -> ")
                )));
            }
            history.push(target.clone());

            if let Some(r) = &resolver.redirect {
                let redirected = self.rewrite_target(
                    &target,
                    TargetOpts {
                        service: r.service.clone(),
                        service_subset: r.service_subset.clone(),
                        namespace: r.namespace.clone(),
                        partition: r.partition.clone(),
                        datacenter: r.datacenter.clone(),
                        peer: r.peer.clone(),
                    },
                );
                if redirected != target {
                    target = redirected;
                    continue;
                }
            }
            if subset.is_empty() && !resolver.default_subset.is_empty() {
                let o = TargetOpts {
                    service_subset: resolver.default_subset.clone(),
                    ..Default::default()
                };
                target = self.rewrite_target(&target, o);
                continue;
            }
            if !resolver.subset_exists(&subset) {
                return Err(ChainError::Graph(format!(
                    "service {svc:?} does not have a subset named {subset:?}"
                )));
            }
            return self.finish_resolver(target, resolver, for_failover);
        }
    }

    fn finish_resolver(
        &mut self, target: String, resolver: &'a ServiceResolverConfigEntry, for_failover: bool,
    ) -> Result<(String, String), ChainError> {
        let mut connect_timeout = resolver.connect_timeout;
        if connect_timeout.nanos() < 1 {
            connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        }
        let ov = self.req.override_connect_timeout;
        if ov.nanos() > 0 && connect_timeout != ov {
            connect_timeout = ov;
            self.customized.connect_timeout = true;
        }

        let t = &self.targets[&target];
        let (svc, subset, ns, part) = (
            t.service.clone(),
            t.service_subset.clone(),
            t.namespace.clone(),
            t.partition.clone(),
        );
        let service_defaults = self.service_defaults(&svc, &ns, &part);
        let proxy_defaults = self.proxy_defaults(&part);
        let external_sni = service_defaults.map_or("", |sd| sd.external_sni.as_str());
        let external = !external_sni.is_empty();
        if external {
            let what = if resolver.redirect.is_some() {
                Some("redirects")
            } else if !resolver.subsets.is_empty() {
                Some("subsets")
            } else if !resolver.failover.is_empty() {
                Some("failover")
            } else {
                None
            };
            if let Some(what) = what {
                return Err(ChainError::Graph(format!(
                    "service {svc:?} has an external SNI set; cannot define {what} for external services"
                )));
            }
        }

        let override_mg = &self.req.override_mesh_gateway.mode;
        let mut customized_mg = false;
        let t = self.targets.get_mut(&target).expect("target exists");
        t.connect_timeout = connect_timeout;
        t.subset = resolver.subsets.get(&subset).cloned().unwrap_or_default();
        if external {
            t.sni = external_sni.to_string();
            t.external = true;
            // External services are reached directly, never via gateways.
            t.mesh_gateway.mode.clear();
        } else {
            if let Some(sd) = service_defaults {
                t.mesh_gateway = sd.mesh_gateway.clone();
                t.transparent_proxy.dialed_directly = sd.transparent_proxy.dialed_directly;
            }
            if let Some(pd) = proxy_defaults {
                if t.mesh_gateway.mode.is_empty() {
                    t.mesh_gateway.mode = pd.mesh_gateway.mode.clone();
                }
                if !t.transparent_proxy.dialed_directly {
                    t.transparent_proxy.dialed_directly = pd.transparent_proxy.dialed_directly;
                }
            }
            if !override_mg.is_empty() && t.mesh_gateway.mode != *override_mg {
                t.mesh_gateway.mode = override_mg.clone();
                customized_mg = true;
            }
        }
        self.customized.mesh_gateway |= customized_mg;
        self.retained_targets.insert(target.clone());

        let node = DiscoveryGraphNode {
            node_type: NodeType::Resolver,
            name: target.clone(),
            routes: Vec::new(),
            splits: Vec::new(),
            resolver: Some(DiscoveryResolver {
                default: resolver.is_default(),
                connect_timeout,
                request_timeout: resolver.request_timeout,
                target: target.clone(),
                failover: None,
            }),
            load_balancer: resolver.load_balancer.clone(),
        };
        if for_failover {
            // Failover only needs the resolved target; its own failover is
            // not followed (failover is not recursive).
            return Ok((node.key(), target));
        }
        let key = self.record_node(node);

        let failover = resolver
            .failover
            .get(&subset)
            .or_else(|| resolver.failover.get("*"));
        if let Some(f) = failover {
            let mut opts = Vec::new();
            let base = TargetOpts {
                service: f.service.clone(),
                service_subset: f.service_subset.clone(),
                namespace: f.namespace.clone(),
                ..Default::default()
            };
            if !f.datacenters.is_empty() {
                for dc in &f.datacenters {
                    opts.push(TargetOpts {
                        datacenter: dc.clone(),
                        ..base.clone()
                    });
                }
            } else if !f.targets.is_empty() {
                for ft in &f.targets {
                    opts.push(TargetOpts {
                        service: ft.service.clone(),
                        service_subset: ft.service_subset.clone(),
                        namespace: ft.namespace.clone(),
                        partition: ft.partition.clone(),
                        datacenter: ft.datacenter.clone(),
                        peer: ft.peer.clone(),
                    });
                }
            } else {
                opts.push(base);
            }
            let mut failover_targets = Vec::new();
            for o in opts {
                let ft = self.rewrite_target(&target, o);
                // Never fail over to yourself.
                if ft != target {
                    failover_targets.push(ft);
                }
            }
            if !failover_targets.is_empty() {
                let policy = match &f.policy {
                    Some(p) if !p.mode.is_empty() => Some(p.clone()),
                    _ => proxy_defaults.and_then(|pd| pd.failover_policy.clone()),
                };
                let mut targets = Vec::with_capacity(failover_targets.len());
                for ft in failover_targets {
                    targets.push(self.resolver_node(ft, true)?.1);
                }
                let node = self.nodes.get_mut(&key).expect("recorded above");
                if let Some(r) = node.resolver.as_mut() {
                    r.failover = Some(DiscoveryFailover { targets, policy });
                }
            }
        }
        Ok((key, target))
    }

    // ---- post-processing -------------------------------------------------------

    fn detect_circular_references(&self) -> Result<(), ChainError> {
        fn visit<'n>(
            nodes: &'n BTreeMap<String, DiscoveryGraphNode>, key: &'n str, path: &mut Vec<&'n str>,
        ) -> Result<(), ChainError> {
            if path.contains(&key) {
                path.push(key);
                return Err(ChainError::Graph(format!(
                    "detected circular reference: [{}]",
                    path.join(" -> ")
                )));
            }
            let Some(node) = nodes.get(key) else {
                return Ok(());
            };
            path.push(key);
            let nexts = node
                .routes
                .iter()
                .map(|r| r.next_node.as_str())
                .chain(node.splits.iter().map(|s| s.next_node.as_str()));
            for next in nexts {
                visit(nodes, next, path)?;
            }
            path.pop();
            Ok(())
        }
        visit(&self.nodes, &self.start_node, &mut Vec::new())
    }

    /// Replaces a split that leads to another splitter by that splitter's
    /// splits, with weights multiplied out and header edits merged, until no
    /// split leads to a splitter. Each splitter is expanded once (bottom-up,
    /// memoized); the graph is acyclic here.
    fn flatten_adjacent_splitters(&mut self) -> Result<(), ChainError> {
        let keys: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.node_type == NodeType::Splitter)
            .map(|(k, _)| k.clone())
            .collect();
        let mut flat: HashMap<String, Vec<DiscoverySplit>> = HashMap::new();
        for key in &keys {
            self.flatten_splitter(key, &mut flat)?;
        }
        for (key, splits) in flat {
            if let Some(n) = self.nodes.get_mut(&key) {
                n.splits = splits;
            }
        }
        Ok(())
    }

    fn flatten_splitter(
        &self, key: &str, flat: &mut HashMap<String, Vec<DiscoverySplit>>,
    ) -> Result<(), ChainError> {
        if flat.contains_key(key) {
            return Ok(());
        }
        let mut out: Vec<DiscoverySplit> = Vec::new();
        for split in &self.nodes[key].splits {
            let nested = self
                .nodes
                .get(&split.next_node)
                .is_some_and(|n| n.node_type == NodeType::Splitter);
            if !nested {
                out.push(split.clone());
            } else {
                self.flatten_splitter(&split.next_node, flat)?;
                for inner in &flat[&split.next_node] {
                    out.push(DiscoverySplit {
                        definition: inner.definition.merge_parent(&split.definition),
                        weight: normalize_split_weight(split.weight * inner.weight / 100.0),
                        next_node: inner.next_node.clone(),
                    });
                }
            }
            // Nesting multiplies legs; stop before that gets out of hand.
            if out.len() > MAX_SPLITS {
                return Err(ChainError::Graph(format!(
                    "discovery chain {:?} splits traffic more than {MAX_SPLITS} ways",
                    self.req.service_name
                )));
            }
        }
        flat.insert(key.to_string(), out);
        Ok(())
    }

    fn remove_unused_nodes(&mut self) {
        let mut seen: HashSet<String> = HashSet::new();
        let mut todo = vec![self.start_node.clone()];
        while let Some(key) = todo.pop() {
            if !seen.insert(key.clone()) {
                continue;
            }
            if let Some(n) = self.nodes.get(&key) {
                todo.extend(n.routes.iter().map(|r| r.next_node.clone()));
                todo.extend(n.splits.iter().map(|s| s.next_node.clone()));
            }
        }
        self.nodes.retain(|k, _| seen.contains(k));
    }

    fn customization_hash(&self) -> String {
        let c = &self.customized;
        if !(c.mesh_gateway || c.protocol || c.connect_timeout) {
            return String::new();
        }
        // Consul's own value, so cluster names match its proxies': Go's
        // hashstructure (v1, FNV-1) of the struct of the overrides that
        // took effect (the others zero), its first 8 hex digits.
        let mode = if c.mesh_gateway {
            self.req.override_mesh_gateway.mode.as_str()
        } else {
            ""
        };
        let protocol = if c.protocol {
            self.req.override_protocol.as_str()
        } else {
            ""
        };
        let timeout = if c.connect_timeout {
            self.req.override_connect_timeout.nanos()
        } else {
            0
        };
        let mesh_gateway = go_struct_hash("MeshGatewayConfig", &[("Mode", fnv1(mode.as_bytes()))]);
        let h = go_struct_hash(
            "",
            &[
                ("OverrideMeshGateway", mesh_gateway),
                ("OverrideProtocol", fnv1(protocol.as_bytes())),
                ("OverrideConnectTimeout", fnv1(&timeout.to_le_bytes())),
            ],
        );
        format!("{h:016x}")[..8].to_string()
    }

    /// A chain is "default" when it is just the plain resolver of the
    /// requested service (redirecting elsewhere does not count).
    fn is_default_chain(&self) -> bool {
        let Some(node) = self.nodes.get(&self.start_node) else {
            return true;
        };
        let Some(r) = node.resolver.as_ref().filter(|r| r.default) else {
            return false;
        };
        self.targets.get(&r.target).is_some_and(|t| {
            t.service == self.req.service_name
                && t.namespace == self.namespace
                && t.partition == self.partition
        })
    }

    pub(crate) fn compile(mut self) -> Result<CompiledDiscoveryChain, ChainError> {
        let req = self.req;
        for (what, v) in [
            ("serviceName", &req.service_name),
            ("evaluateInDatacenter", &req.evaluate_in_datacenter),
            ("evaluateInTrustDomain", &req.trust_domain),
        ] {
            if v.is_empty() {
                return Err(ChainError::InvalidRequest(format!("{what} is required")));
            }
        }

        let (ns, part) = (self.namespace, self.partition);
        let mut envoy_extensions = self
            .proxy_defaults(part)
            .map(|pd| pd.envoy_extensions.clone())
            .unwrap_or_default();
        let mut service_meta = BTreeMap::new();
        if let Some(sd) = self.service_defaults(&req.service_name, ns, part) {
            service_meta = sd.meta.clone();
            envoy_extensions.extend(sd.envoy_extensions.iter().cloned());
        }

        self.assemble()?;
        self.detect_circular_references()?;
        self.flatten_adjacent_splitters()?;
        self.remove_unused_nodes();
        let retained = std::mem::take(&mut self.retained_targets);
        self.targets.retain(|id, _| retained.contains(id));

        if self.uses_advanced_routing && !is_http_like(&self.protocol) {
            return Err(ChainError::Graph(format!(
                "discovery chain {:?} uses a protocol {:?} that does not permit advanced routing or splitting behavior",
                req.service_name, self.protocol
            )));
        }
        if !req.override_protocol.is_empty() && req.override_protocol != self.protocol {
            self.protocol = req.override_protocol.clone();
            self.customized.protocol = true;
        }

        Ok(CompiledDiscoveryChain {
            service_name: req.service_name.clone(),
            namespace: ns.into(),
            partition: part.into(),
            datacenter: req.evaluate_in_datacenter.clone(),
            customization_hash: self.customization_hash(),
            default: self.is_default_chain(),
            protocol: self.protocol.clone(),
            service_meta,
            envoy_extensions,
            start_node: self.start_node,
            nodes: self.nodes,
            targets: self.targets,
            auto_virtual_ips: req.auto_virtual_ips.clone(),
            manual_virtual_ips: req.manual_virtual_ips.clone(),
        })
    }
}

/// 64-bit FNV-1 (Go's `hash/fnv.New64`).
fn fnv1(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h = h.wrapping_mul(0x100000001b3);
        h ^= u64::from(*b);
    }
    h
}

/// hashstructure's hash of a struct named `type_name` from its fields'
/// names and value hashes: each field's ordered pair, combined unordered.
fn go_struct_hash(type_name: &str, fields: &[(&str, u64)]) -> u64 {
    fields
        .iter()
        .fold(fnv1(type_name.as_bytes()), |h, (name, value)| {
            let mut pair = [0u8; 16];
            pair[..8].copy_from_slice(&fnv1(name.as_bytes()).to_le_bytes());
            pair[8..].copy_from_slice(&value.to_le_bytes());
            h ^ fnv1(&pair)
        })
}
