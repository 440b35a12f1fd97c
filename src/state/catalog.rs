//! The catalog tables: registration and deregistration of nodes, services
//! and checks (Consul's `EnsureRegistration` / `DeleteNode|Service|Check`),
//! and the reads the catalog and health endpoints are built on.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::tx::Tx;
use super::tx::{node_key, remove_from_index};
use super::{Row, State, Table, keys};
use crate::structs::query::PreparedQuery;
use crate::structs::{
    CatalogVerb, DeregisterRequest, HEALTH_PASSING, HEALTH_WARNING, HealthCheck, Node, NodeService,
    RegisterRequest, ServiceKind, TxnOp, TxnResult,
};

/// Registers a node and optionally a service and checks, all or nothing:
/// a refusal half-way (e.g. a check naming an unknown service) restores the
/// version taken before, so nothing of the request is stored.
pub fn register(tx: &mut Tx, req: &RegisterRequest) -> Result<(), String> {
    let saved = tx.state.clone();
    let result = register_all(tx, req);
    if result.is_err() {
        *tx.state = saved;
        tx.discard();
    }
    result
}

fn register_all(tx: &mut Tx, req: &RegisterRequest) -> Result<(), String> {
    if req.node.is_empty() {
        return Err("Must provide node".into());
    }
    let existing = tx.state.nodes.get(&req.node).cloned();
    if !(req.skip_node_update && existing.is_some()) {
        if req.address.is_empty() {
            return Err("Must provide address".into());
        }
        let mut node = Node {
            id: req.id.clone(),
            node: req.node.clone(),
            address: req.address.clone(),
            datacenter: req.datacenter.clone(),
            tagged_addresses: req.tagged_addresses.clone(),
            meta: req.node_meta.clone(),
            create_index: tx.index,
            modify_index: tx.index,
        };
        if let Some(old) = &existing {
            node.create_index = old.create_index;
            node.modify_index = old.modify_index;
            if node.id.is_empty() {
                node.id = old.id.clone();
            }
        }
        if existing.as_deref() != Some(&node) {
            node.modify_index = tx.index;
            tx.put_node(node);
        }
    } else if existing.is_none() {
        return Err(format!("Node {:?} does not exist", req.node));
    }

    if let Some(svc) = &req.service {
        let mut svc = svc.clone();
        if svc.id.is_empty() {
            svc.id = svc.service.clone();
        }
        if svc.service.is_empty() {
            return Err("Must provide service name with ID".into());
        }
        let k = (req.node.clone(), svc.id.clone());
        match tx.state.services.get(&k).cloned() {
            Some(old) => {
                svc.create_index = old.create_index;
                svc.modify_index = old.modify_index;
                // Compared as it would be stored: the same registration
                // again changes nothing (no new index, no wake-up), as in
                // Consul, though the request lacks the servers' tags.
                tx.add_server_tags(&mut svc);
                if *old != svc {
                    svc.modify_index = tx.index;
                    tx.put_service(&req.node, svc);
                }
            }
            None => {
                svc.create_index = tx.index;
                svc.modify_index = tx.index;
                tx.put_service(&req.node, svc);
            }
        }
    }

    for check in req.check.iter().chain(req.checks.iter()) {
        ensure_check(tx, &req.node, check)?;
    }
    Ok(())
}

fn ensure_check(tx: &mut Tx, node: &str, check: &HealthCheck) -> Result<(), String> {
    let mut check = check.clone();
    check.node = node.to_string();
    if check.check_id.is_empty() {
        check.check_id = check.name.clone();
    }
    if check.check_id.is_empty() {
        return Err("Must provide a CheckID or Name for checks".into());
    }
    if !check.service_id.is_empty() {
        let k = (node.to_string(), check.service_id.clone());
        let Some(svc) = tx.state.services.get(&k) else {
            return Err(format!(
                "Unknown service ID {:?} for check ID {:?}",
                check.service_id, check.check_id
            ));
        };
        check.service_name = svc.service.clone();
        check.service_tags = svc.tags.clone();
    }
    let k = (node.to_string(), check.check_id.clone());
    match tx.state.checks.get(&k).cloned() {
        Some(old) => {
            check.create_index = old.create_index;
            check.modify_index = old.modify_index;
            if *old != check {
                check.modify_index = tx.index;
                tx.put_check(check);
            }
        }
        None => {
            check.create_index = tx.index;
            check.modify_index = tx.index;
            tx.put_check(check);
        }
    }
    Ok(())
}

/// Removes a check, a service with its checks, or a node with everything.
pub fn deregister(tx: &mut Tx, req: &DeregisterRequest) -> Result<(), String> {
    if req.node.is_empty() {
        return Err("Must provide node".into());
    }
    if !req.service_id.is_empty() {
        delete_service(tx, &req.node, &req.service_id);
    }
    if !req.check_id.is_empty() {
        tx.remove_check(&req.node, &req.check_id);
    }
    if req.service_id.is_empty() && req.check_id.is_empty() {
        let services: Vec<String> = node_services(tx.state, &req.node)
            .map(|s| s.id.clone())
            .collect();
        for id in services {
            delete_service(tx, &req.node, &id);
        }
        let checks: Vec<String> = node_checks(tx.state, &req.node)
            .map(|c| c.check_id.clone())
            .collect();
        for id in checks {
            tx.remove_check(&req.node, &id);
        }
        tx.remove_node(&req.node);
    }
    Ok(())
}

fn delete_service(tx: &mut Tx, node: &str, id: &str) {
    let checks: Vec<String> = node_checks(tx.state, node)
        .filter(|c| c.service_id == id)
        .map(|c| c.check_id.clone())
        .collect();
    for c in checks {
        tx.remove_check(node, &c);
    }
    tx.remove_service(node, id);
}

/// One node, service or check operation of a txn (Consul's verbs): its
/// result (none for deletes), or why it failed. Writes go through
/// `register` / `deregister`, so they keep every rule those keep (a
/// service or check needs its node, a check its service; a node's delete
/// takes its services, checks and sessions with it).
pub fn txn_op(tx: &mut Tx, op: &TxnOp) -> Result<Option<TxnResult>, String> {
    match op {
        TxnOp::Kv(_) => Err("not a catalog operation".into()),
        TxnOp::Node { verb, node } => node_op(tx, *verb, node),
        TxnOp::Service {
            verb,
            node,
            service,
        } => service_op(tx, *verb, node, service),
        TxnOp::Check { verb, check } => check_op(tx, *verb, check),
    }
}

/// Whether a cas write may go ahead: an index of 0 writes only what does
/// not exist, any other only over the row with that modify index.
fn cas_holds(existing: Option<u64>, index: u64) -> bool {
    match existing {
        None => index == 0,
        Some(current) => index != 0 && index == current,
    }
}

fn node_op(tx: &mut Tx, verb: CatalogVerb, node: &Node) -> Result<Option<TxnResult>, String> {
    // By ID when one is given and known (Consul's precedence), else by name.
    let by_id = (!node.id.is_empty())
        .then(|| tx.state.nodes.values().find(|n| n.id == node.id).cloned())
        .flatten();
    let existing = by_id.or_else(|| tx.state.nodes.get(&node.node).cloned());
    let name = existing
        .as_ref()
        .map_or(node.node.clone(), |n| n.node.clone());
    match verb {
        CatalogVerb::Get => match existing {
            Some(n) => Ok(Some(TxnResult::Node((*n).clone()))),
            None => Err(format!("node {name:?} doesn't exist")),
        },
        CatalogVerb::Set | CatalogVerb::Cas => {
            if verb == CatalogVerb::Cas
                && !cas_holds(existing.map(|n| n.modify_index), node.modify_index)
            {
                return Err(format!("failed to set node {name:?}, index is stale"));
            }
            let req = RegisterRequest {
                id: node.id.clone(),
                node: node.node.clone(),
                address: node.address.clone(),
                datacenter: node.datacenter.clone(),
                tagged_addresses: node.tagged_addresses.clone(),
                node_meta: node.meta.clone(),
                ..Default::default()
            };
            register(tx, &req)?;
            let now = tx.state.nodes.get(&node.node).map(|n| (**n).clone());
            Ok(now.map(TxnResult::Node))
        }
        CatalogVerb::Delete | CatalogVerb::DeleteCas => {
            if verb == CatalogVerb::DeleteCas
                && existing.as_ref().map(|n| n.modify_index) != Some(node.modify_index)
            {
                return Err(format!("failed to delete node {name:?}, index is stale"));
            }
            if existing.is_some() {
                deregister(
                    tx,
                    &DeregisterRequest {
                        node: name,
                        ..Default::default()
                    },
                )?;
            }
            Ok(None)
        }
    }
}

fn service_op(
    tx: &mut Tx, verb: CatalogVerb, node: &str, svc: &NodeService,
) -> Result<Option<TxnResult>, String> {
    let id = if svc.id.is_empty() {
        svc.service.clone()
    } else {
        svc.id.clone()
    };
    let k = (node.to_string(), id.clone());
    let existing = tx.state.services.get(&k).cloned();
    match verb {
        CatalogVerb::Get => match existing {
            Some(s) => Ok(Some(TxnResult::Service((*s).clone()))),
            None => Err(format!("service {id:?} on node {node:?} doesn't exist")),
        },
        CatalogVerb::Set | CatalogVerb::Cas => {
            if verb == CatalogVerb::Cas
                && !cas_holds(existing.map(|s| s.modify_index), svc.modify_index)
            {
                return Err(format!(
                    "failed to set service {id:?} on node {node:?}, index is stale"
                ));
            }
            let req = RegisterRequest {
                node: node.to_string(),
                skip_node_update: true,
                service: Some(svc.clone()),
                ..Default::default()
            };
            register(tx, &req)?;
            let now = tx.state.services.get(&k).map(|s| (**s).clone());
            Ok(now.map(TxnResult::Service))
        }
        CatalogVerb::Delete | CatalogVerb::DeleteCas => {
            if verb == CatalogVerb::DeleteCas
                && existing.as_ref().map(|s| s.modify_index) != Some(svc.modify_index)
            {
                return Err(format!(
                    "failed to delete service {id:?} on node {node:?}, index is stale"
                ));
            }
            if existing.is_some() {
                delete_service(tx, node, &id);
            }
            Ok(None)
        }
    }
}

fn check_op(
    tx: &mut Tx, verb: CatalogVerb, check: &HealthCheck,
) -> Result<Option<TxnResult>, String> {
    let (node, id) = (check.node.clone(), check.check_id.clone());
    let k = (node.clone(), id.clone());
    let existing = tx.state.checks.get(&k).cloned();
    match verb {
        CatalogVerb::Get => match existing {
            Some(c) => Ok(Some(TxnResult::Check((*c).clone()))),
            None => Err(format!("check {id:?} on node {node:?} doesn't exist")),
        },
        CatalogVerb::Set | CatalogVerb::Cas => {
            if verb == CatalogVerb::Cas
                && !cas_holds(existing.map(|c| c.modify_index), check.modify_index)
            {
                return Err(format!(
                    "failed to set check {id:?} on node {node:?}, index is stale"
                ));
            }
            let req = RegisterRequest {
                node: node.clone(),
                skip_node_update: true,
                check: Some(check.clone()),
                ..Default::default()
            };
            register(tx, &req)?;
            let now = tx.state.checks.get(&k).map(|c| (**c).clone());
            Ok(now.map(TxnResult::Check))
        }
        CatalogVerb::Delete | CatalogVerb::DeleteCas => {
            if verb == CatalogVerb::DeleteCas
                && existing.as_ref().map(|c| c.modify_index) != Some(check.modify_index)
            {
                return Err(format!(
                    "failed to delete check {id:?} on node {node:?}, index is stale"
                ));
            }
            tx.remove_check(&node, &id);
            Ok(None)
        }
    }
}

/// Services registered on a node, by service id.
pub fn node_services<'a>(state: &'a State, node: &'a str) -> impl Iterator<Item = &'a NodeService> {
    state
        .services
        .range((node.to_string(), String::new())..)
        .take_while(move |((n, _), _)| n == node)
        .map(|(_, s)| &**s)
}

/// Checks on a node (node-level and service-level), by check id.
pub fn node_checks<'a>(state: &'a State, node: &'a str) -> impl Iterator<Item = &'a HealthCheck> {
    state
        .checks
        .range((node.to_string(), String::new())..)
        .take_while(move |((n, _), _)| n == node)
        .map(|(_, c)| &**c)
}

/// One instance of a service with its node and the checks that decide its
/// health (node checks and its own); its JSON is a health row (a client
/// agent's DNS reads them back from a server),
/// `{Node, Service, Checks}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Instance {
    pub node: Arc<Node>,
    pub service: Arc<NodeService>,
    pub checks: Vec<Arc<HealthCheck>>,
}

impl Instance {
    pub fn service_node_name(&self) -> String {
        self.node.node.clone()
    }
}

/// Instances of `name` (or, with `connect`, the proxies and native services
/// for `name`), in node order.
pub fn service_instances(state: &State, name: &str, connect: bool) -> Vec<Instance> {
    let index = if connect {
        &state.connect_names
    } else {
        &state.service_names
    };
    let Some(set) = index.get(name) else {
        return Vec::new();
    };
    set.iter()
        .filter_map(|k| instance_of(state, &k.0, state.services.get(k)?))
        .collect()
}

/// Every instance of kind `kind` (mesh gateways, say), in name then node
/// order.
pub fn instances_of_kind(state: &State, kind: ServiceKind) -> Vec<Instance> {
    state
        .service_names
        .values()
        .flat_map(|set| set.iter())
        .filter_map(|k| {
            let svc = state.services.get(k)?;
            if svc.kind != kind {
                return None;
            }
            instance_of(state, &k.0, svc)
        })
        .collect()
}

/// What `query` finds in this datacenter, as Consul's `execute`: the
/// instances of its service (with `connect`, the connect-capable ones),
/// those with a critical check dropped (with `OnlyPassing` also those with
/// a warning; checks in `IgnoreCheckIDs` do not count), then its node
/// meta, service meta and tag filters (`!tag`: must not have it; tags in
/// any case). Unordered: the caller filters by ACLs, shuffles and sorts.
pub fn query_instances(state: &State, query: &PreparedQuery, connect: bool) -> Vec<Instance> {
    let svc = &query.service;
    let connect = connect || svc.connect;
    let (must, not): (Vec<String>, Vec<String>) = {
        let lower: Vec<String> = svc.tags.iter().map(|t| t.to_ascii_lowercase()).collect();
        let (not, must): (Vec<String>, Vec<String>) =
            lower.into_iter().partition(|t| t.starts_with('!'));
        (must, not.into_iter().map(|t| t[1..].to_string()).collect())
    };
    let mut found = service_instances(state, &svc.service, connect);
    found.retain(|i| {
        let healthy = i.checks.iter().all(|c| {
            svc.ignore_check_ids.contains(&c.check_id)
                || c.status == HEALTH_PASSING
                || (c.status == HEALTH_WARNING && !svc.only_passing)
        });
        let has = |t: &String| i.service.tags.iter().any(|x| x.eq_ignore_ascii_case(t));
        healthy
            && svc
                .node_meta
                .iter()
                .all(|(k, v)| i.node.meta.get(k) == Some(v))
            && svc
                .service_meta
                .iter()
                .all(|(k, v)| i.service.meta.get(k) == Some(v))
            && must.iter().all(has)
            && !not.iter().any(has)
    });
    found
}

/// `service` on `node` with its node and health checks (none if the node
/// is missing).
pub fn instance_of(state: &State, node: &str, service: &Arc<NodeService>) -> Option<Instance> {
    let node = state.nodes.get(node)?.clone();
    let checks = state
        .checks
        .range((node.node.clone(), String::new())..)
        .take_while(|((n, _), _)| *n == node.node)
        .filter(|(_, c)| c.service_id.is_empty() || c.service_id == service.id)
        .map(|(_, c)| c.clone())
        .collect();
    Some(Instance {
        node,
        service: service.clone(),
        checks,
    })
}

/// The service a proxy or connect-native instance is an endpoint of.
fn connect_target(svc: &NodeService) -> Option<&str> {
    let native = svc
        .connect
        .get("Native")
        .and_then(serde_json::Value::as_bool)
        == Some(true);
    if svc.is_connect_proxy() && !svc.proxy.destination_service_name.is_empty() {
        Some(&svc.proxy.destination_service_name)
    } else if native {
        Some(&svc.service)
    } else {
        None
    }
}

/// Adds instance `k` to the by-name and by-connect-target indexes.
pub(super) fn index_service(state: &mut State, k: &(String, String), svc: &NodeService) {
    state
        .service_names
        .entry(svc.service.clone())
        .or_default()
        .insert(k.clone());
    if let Some(dest) = connect_target(svc) {
        state
            .connect_names
            .entry(dest.to_string())
            .or_default()
            .insert(k.clone());
    }
}

fn unindex_service(state: &mut State, k: &(String, String), svc: &NodeService) {
    remove_from_index(&mut state.service_names, &svc.service, k);
    if let Some(dest) = connect_target(svc) {
        remove_from_index(&mut state.connect_names, dest, k);
    }
}

impl Tx<'_> {
    /// Wakes everything that shows a node's services (health rows embed the
    /// node and its node-level checks).
    fn touch_node_services(&mut self, node: &str) {
        let services: Vec<(String, String, bool)> = self
            .state
            .services
            .range((node.to_string(), String::new())..)
            .take_while(|((n, _), _)| n == node)
            .map(|(_, s)| {
                (
                    s.service.clone(),
                    s.proxy.destination_service_name.clone(),
                    s.kind == ServiceKind::MeshGateway,
                )
            })
            .collect();
        for (name, dest, mesh_gateway) in services {
            self.touch(keys::service(&name));
            if !dest.is_empty() {
                self.touch(keys::connect(&dest));
            }
            if mesh_gateway {
                self.touch(keys::MESH_GATEWAYS);
            }
        }
    }

    pub fn put_node(&mut self, node: Node) {
        let name = node.node.clone();
        let after = Arc::new(node);
        let before = self.state.nodes.insert(name.clone(), after.clone());
        self.touch(keys::node(&name));
        self.touch(keys::NODES);
        self.touch_node_services(&name);
        self.record(
            Table::Nodes,
            name,
            before.map(Row::Node),
            Some(Row::Node(after)),
        );
    }

    pub fn remove_node(&mut self, name: &str) {
        super::session::node_gone(self, name);
        self.remove_coordinate(name);
        if let Some(before) = self.state.nodes.remove(name) {
            self.touch(keys::node(name));
            self.touch(keys::NODES);
            self.record(
                Table::Nodes,
                name.to_string(),
                Some(Row::Node(before)),
                None,
            );
        }
    }

    fn touch_service(&mut self, svc: &NodeService, node: &str) {
        self.touch(keys::service(&svc.service));
        self.touch(keys::SERVICES);
        self.touch(keys::node(node));
        if svc.kind == ServiceKind::MeshGateway {
            self.touch(keys::MESH_GATEWAYS);
        }
        if !svc.proxy.destination_service_name.is_empty() {
            self.touch(keys::connect(&svc.proxy.destination_service_name));
        }
        if svc
            .connect
            .get("Native")
            .and_then(serde_json::Value::as_bool)
            == Some(true)
        {
            self.touch(keys::connect(&svc.service));
        }
    }

    /// The tagged addresses the servers set on a row: a connect-capable
    /// instance shows its service's virtual IP (assigned now if it is the
    /// service's first), a terminating gateway those of the services it
    /// links, as Consul stores them.
    fn add_server_tags(&mut self, svc: &mut NodeService) {
        if let Some(t) = connect_target(svc).map(str::to_string)
            && let Some(ip) = self.ensure_virtual_ip(&t)
        {
            svc.tagged_addresses.insert(
                super::virtual_ip::TAGGED_ADDRESS.into(),
                crate::structs::ServiceAddress {
                    address: ip.to_string(),
                    port: u16::try_from(svc.port).unwrap_or(0),
                },
            );
        }
        if svc.kind == ServiceKind::TerminatingGateway {
            self.gateway_virtual_ips(svc);
        }
    }

    pub fn put_service(&mut self, node: &str, mut svc: NodeService) {
        let k = (node.to_string(), svc.id.clone());
        self.add_server_tags(&mut svc);
        let target = connect_target(&svc).map(str::to_string);
        let after = Arc::new(svc);
        let before = self.state.services.insert(k.clone(), after.clone());
        if let Some(b) = &before {
            unindex_service(self.state, &k, b);
            self.touch_service(&b.clone(), node);
        }
        index_service(self.state, &k, &after);
        self.touch_service(&after.clone(), node);
        if let Some(old) = before.as_deref().and_then(connect_target)
            && Some(old) != target.as_deref()
        {
            self.release_virtual_ip(old);
        }
        self.record(
            Table::Services,
            node_key(node, &after.id),
            before.map(Row::Service),
            Some(Row::Service(after)),
        );
    }

    pub fn remove_service(&mut self, node: &str, id: &str) {
        let k = (node.to_string(), id.to_string());
        if let Some(before) = self.state.services.remove(&k) {
            unindex_service(self.state, &k, &before);
            self.touch_service(&before.clone(), node);
            if let Some(target) = connect_target(&before) {
                self.release_virtual_ip(target);
            }
            self.record(
                Table::Services,
                node_key(node, id),
                Some(Row::Service(before)),
                None,
            );
        }
    }

    fn touch_check(&mut self, check: &HealthCheck) {
        self.touch(keys::CHECKS);
        self.touch(keys::node(&check.node));
        if check.service_id.is_empty() {
            let node = check.node.clone();
            self.touch_node_services(&node);
        } else {
            let k = (check.node.clone(), check.service_id.clone());
            if let Some(svc) = self.state.services.get(&k).cloned() {
                self.touch_service(&svc, &check.node);
            } else {
                self.touch(keys::service(&check.service_name));
            }
        }
    }

    pub fn put_check(&mut self, check: HealthCheck) {
        let k = (check.node.clone(), check.check_id.clone());
        let after = Arc::new(check);
        let before = self.state.checks.insert(k.clone(), after.clone());
        if let Some(b) = &before {
            self.touch_check(&b.clone());
        }
        self.touch_check(&after.clone());
        self.record(
            Table::Checks,
            node_key(&k.0, &k.1),
            before.map(Row::Check),
            Some(Row::Check(after.clone())),
        );
        super::session::check_written(self, &k.0, &k.1, after.status);
    }

    pub fn remove_check(&mut self, node: &str, id: &str) {
        let k = (node.to_string(), id.to_string());
        if let Some(before) = self.state.checks.remove(&k) {
            self.touch_check(&before.clone());
            self.record(
                Table::Checks,
                node_key(node, id),
                Some(Row::Check(before)),
                None,
            );
            super::session::check_gone(self, node, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Response, apply_command};

    #[test]
    fn refused_registration_stores_nothing() {
        let mut state = State::default();
        let req: RegisterRequest = serde_json::from_value(serde_json::json!({
            "Node": "n1", "Address": "10.0.0.1",
            "Service": {"Service": "web"},
            "Check": {"Name": "c", "ServiceID": "nope"},
        }))
        .unwrap();
        let (resp, set) = apply_command(&mut state, 5, &Command::Register(Box::new(req)));
        assert!(matches!(resp, Response::Rejected(r) if r.contains("nope")));
        assert!(set.changes.is_empty() && set.watch_keys.is_empty());
        assert!(state.nodes.is_empty() && state.services.is_empty());
        assert!(state.service_names.is_empty() && state.indexes.is_empty());
    }
}
