//! Building one proxy's snapshot from one version of the state: a pure
//! function that also reports what it read (the proxy's watches).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use super::{Dep, ProxyKey};
use crate::discovery_chain::{CompileRequest, CompiledDiscoveryChain, compile};
use crate::filter::Filter;
use crate::state::catalog::service_instances;
use crate::state::{State, keys};
use crate::structs::config_entry::Kind;
use crate::structs::{HEALTH_CRITICAL, HEALTH_MAINT, HEALTH_PASSING, NodeService};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Snapshot {
    #[serde(rename = "ProxyID")]
    pub proxy_id: Value,
    /// Bumped whenever the content changes.
    pub version: u64,
    /// The state index the content was last built from.
    pub index: u64,
    /// The proxy's registration with central config merged.
    pub service: NodeService,
    pub upstreams: BTreeMap<String, UpstreamSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct UpstreamSnapshot {
    pub chain: Option<Arc<CompiledDiscoveryChain>>,
    /// Chain compile error, if the upstream's chain does not compile.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// target ID → healthy endpoints (`{Node, Service, Checks}`).
    pub endpoints: BTreeMap<String, Vec<Value>>,
}

impl Snapshot {
    /// Equal apart from version and index.
    pub fn same_content(&self, other: &Snapshot) -> bool {
        self.service == other.service && self.upstreams == other.upstreams
    }
}

/// Builds the snapshot of proxy `key`, or `None` if it is not registered
/// (any more) as a connect proxy.
pub fn build(state: &State, datacenter: &str, key: &ProxyKey) -> Option<(Snapshot, BTreeSet<Dep>)> {
    let registered = state.services.get(key)?;
    if !registered.is_connect_proxy() {
        return None;
    }
    let mut deps = BTreeSet::new();
    deps.insert(keys::service(&registered.service));
    // What the merge read: proxy-defaults, service-defaults of the
    // destination, of each upstream and of each override.
    deps.extend(crate::merge::merge_watch_keys(state, registered));
    let service = crate::merge::merge_node_service(state, registered);
    let trust_domain = format!("{}.consul", state.cluster_id);

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
        chain_deps(&mut deps, name);
        let req = CompileRequest::new(name, dc, &trust_domain);
        let entry = match compile(&req, state) {
            Ok(chain) => {
                let mut endpoints = BTreeMap::new();
                for (id, target) in &chain.targets {
                    chain_deps(&mut deps, &target.service);
                    deps.insert(keys::service(&target.service));
                    if target.datacenter != datacenter || !target.peer.is_empty() {
                        continue; // other datacenters are reached via gateways
                    }
                    let filter = Filter::parse_optional(&target.subset.filter).ok().flatten();
                    let rows: Vec<Value> = service_instances(state, &target.service, false)
                        .into_iter()
                        .filter(|i| healthy(&i.checks, target.subset.only_passing))
                        .map(
                            |i| json!({ "Node": i.node, "Service": i.service, "Checks": i.checks }),
                        )
                        .filter(|row| filter.as_ref().is_none_or(|f| f.matches(row)))
                        .collect();
                    endpoints.insert(id.clone(), rows);
                }
                UpstreamSnapshot {
                    chain: Some(Arc::new(chain)),
                    error: String::new(),
                    endpoints,
                }
            }
            Err(e) => UpstreamSnapshot {
                chain: None,
                error: e.to_string(),
                endpoints: BTreeMap::new(),
            },
        };
        upstreams.insert(name.clone(), entry);
    }
    let snapshot = Snapshot {
        proxy_id: json!({ "Node": key.0, "ServiceID": key.1 }),
        version: 0,
        index: state.index,
        service,
        upstreams,
    };
    Some((snapshot, deps))
}

/// A chain through `service` reads its router, splitter, resolver and
/// defaults, present or not (creating one changes the chain).
fn chain_deps(deps: &mut BTreeSet<Dep>, service: &str) {
    for kind in [
        Kind::ServiceRouter,
        Kind::ServiceSplitter,
        Kind::ServiceResolver,
        Kind::ServiceDefaults,
    ] {
        deps.insert(keys::config(kind.as_str(), service));
    }
}

/// As Consul serves endpoints: never critical (or in maintenance); with
/// OnlyPassing, warning is out too.
fn healthy(checks: &[Arc<crate::structs::HealthCheck>], only_passing: bool) -> bool {
    checks.iter().all(|c| match c.status.as_str() {
        HEALTH_PASSING => true,
        HEALTH_CRITICAL | HEALTH_MAINT => false,
        _ => !only_passing,
    })
}
