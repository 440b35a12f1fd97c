//! Graph validation of config entry writes: a write (or delete) is refused
//! if any discovery chain it can affect would no longer compile. Only those
//! chains are compiled: the service written and, transitively, the services
//! whose routers, splitters or resolvers lead to it (via a reverse index).
//! A proxy-defaults write can change any protocol, so it checks every
//! service that has a router, splitter or resolver, as Consul does.

use super::{CompileRequest, EntryLookup, compile};
use crate::config_check::ConfigEntryError;
use crate::structs::config_entry::{ConfigEntry, Kind, PROXY_CONFIG_GLOBAL};
use std::collections::{BTreeMap, BTreeSet};

/// A proposed change to the stored entries.
// Short-lived, passed by reference: no point boxing the entry.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum EntryChange {
    Upsert(ConfigEntry),
    Delete { kind: Kind, name: String },
}

impl EntryChange {
    pub fn kind(&self) -> Kind {
        match self {
            EntryChange::Upsert(e) => e.kind(),
            EntryChange::Delete { kind, .. } => *kind,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            EntryChange::Upsert(e) => e.name(),
            EntryChange::Delete { name, .. } => name,
        }
    }
}

fn or<'s>(v: &'s str, default: &'s str) -> &'s str {
    if v.is_empty() { default } else { v }
}

/// Other services a router, splitter or resolver entry sends traffic to
/// (sorted, without the entry's own name). Other kinds refer to none.
pub fn references(entry: &ConfigEntry) -> Vec<String> {
    let me = entry.name();
    let mut out = BTreeSet::new();
    match entry {
        ConfigEntry::ServiceRouter(r) => {
            for d in r.routes.iter().filter_map(|r| r.destination.as_ref()) {
                out.insert(or(&d.service, me));
            }
        }
        ConfigEntry::ServiceSplitter(s) => {
            for split in &s.splits {
                out.insert(or(&split.service, me));
            }
        }
        ConfigEntry::ServiceResolver(r) => {
            if let Some(red) = &r.redirect {
                out.insert(or(&red.service, me));
            }
            for f in r.failover.values() {
                if f.targets.is_empty() {
                    out.insert(or(&f.service, me));
                }
                // Services on cluster peers have no entries here.
                for t in f.targets.iter().filter(|t| t.peer.is_empty()) {
                    out.insert(or(&t.service, me));
                }
            }
        }
        _ => {}
    }
    out.remove(me);
    out.into_iter().map(String::from).collect()
}

/// "Which entries refer to service X", kept up to date as entries change.
#[derive(Debug, Clone, Default)]
pub struct ReverseIndex {
    /// referenced service -> (referring service -> number of its entries)
    by_target: BTreeMap<String, BTreeMap<String, usize>>,
}

impl ReverseIndex {
    pub fn add(&mut self, entry: &ConfigEntry) {
        for r in references(entry) {
            *self
                .by_target
                .entry(r)
                .or_default()
                .entry(entry.name().to_string())
                .or_default() += 1;
        }
    }

    pub fn remove(&mut self, entry: &ConfigEntry) {
        for r in references(entry) {
            if let Some(m) = self.by_target.get_mut(&r) {
                if let Some(n) = m.get_mut(entry.name()) {
                    *n -= 1;
                    if *n == 0 {
                        m.remove(entry.name());
                    }
                }
                if m.is_empty() {
                    self.by_target.remove(&r);
                }
            }
        }
    }

    pub fn referrers(&self, service: &str) -> Vec<String> {
        self.by_target
            .get(service)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// The stored entries as they would be after `change`.
struct Proposed<'a, L: ?Sized> {
    base: &'a L,
    kind: Kind,
    name: &'a str,
    replacement: Option<&'a ConfigEntry>,
}

impl<L: EntryLookup + ?Sized> EntryLookup for Proposed<'_, L> {
    fn get(&self, kind: Kind, name: &str) -> Option<&ConfigEntry> {
        if kind == self.kind && name == self.name {
            self.replacement
        } else {
            self.base.get(kind, name)
        }
    }

    fn list(&self, kind: Kind) -> Vec<&ConfigEntry> {
        let mut out: Vec<&ConfigEntry> = self
            .base
            .list(kind)
            .into_iter()
            .filter(|e| !(kind == self.kind && e.name() == self.name))
            .collect();
        out.extend(self.replacement.filter(|e| e.kind() == kind));
        out
    }

    fn referrers(&self, service: &str) -> Vec<String> {
        self.base.referrers(service)
    }
}

/// The chains (service names) a write of `kind`/`name` can change.
pub fn affected_chains<L: EntryLookup + ?Sized>(
    entries: &L, kind: Kind, name: &str,
) -> BTreeSet<String> {
    if kind == Kind::ProxyDefaults {
        return Kind::ALL
            .into_iter()
            .filter(|k| k.is_chain_graph())
            .flat_map(|k| entries.list(k))
            .map(|e| e.name().to_string())
            .collect();
    }
    // Everything that can reach `name` reads its entries while compiling.
    let mut seen = BTreeSet::from([name.to_string()]);
    let mut todo = vec![name.to_string()];
    while let Some(s) = todo.pop() {
        for r in entries.referrers(&s) {
            if seen.insert(r.clone()) {
                todo.push(r);
            }
        }
    }
    seen
}

/// Refuses `change` if a discovery chain it affects would stop compiling.
/// The entry of an upsert must already be normalized and validated.
pub fn validate_write<L: EntryLookup + ?Sized>(
    entries: &L, change: &EntryChange,
) -> Result<(), ConfigEntryError> {
    let (kind, name) = (change.kind(), change.name());
    let name = if kind == Kind::ProxyDefaults && name.is_empty() {
        PROXY_CONFIG_GLOBAL
    } else {
        name
    };
    let proposed = Proposed {
        base: entries,
        kind,
        name,
        replacement: match change {
            EntryChange::Upsert(e) => Some(e),
            EntryChange::Delete { .. } => None,
        },
    };
    check_intentions_protocol(&proposed, kind, name)?;
    check_permissive_mtls(entries, change)?;
    check_gateway_clash(&proposed, kind, name)?;
    check_ingress_protocols(&proposed, kind, name)?;
    if !kind.is_chain_graph() && !matches!(kind, Kind::ProxyDefaults | Kind::ServiceDefaults) {
        return Ok(()); // intentions, mesh and gateway entries are in no chain
    }
    for service in affected_chains(entries, kind, name) {
        // The datacenter and trust domain do not change whether a chain
        // compiles; any values will do.
        let req = CompileRequest::new(
            &service,
            "dc1",
            "11111111-2222-3333-4444-555555555555.consul",
        );
        compile(&req, &proposed).map_err(|e| ConfigEntryError::Graph(e.to_string()))?;
    }
    Ok(())
}

/// Turning `MutualTLSMode` to permissive (plaintext accepted beside mTLS)
/// takes the mesh entry's `AllowEnablingPermissiveMutualTLS`, as Consul
/// has it; an entry already permissive may be written again.
fn check_permissive_mtls<L: EntryLookup + ?Sized>(
    entries: &L, change: &EntryChange,
) -> Result<(), ConfigEntryError> {
    let EntryChange::Upsert(entry) = change else {
        return Ok(());
    };
    let mode = |e: &ConfigEntry| match e {
        ConfigEntry::ProxyDefaults(p) => p.mutual_tls_mode.clone(),
        ConfigEntry::ServiceDefaults(d) => d.mutual_tls_mode.clone(),
        _ => String::new(),
    };
    if mode(entry) != "permissive" {
        return Ok(());
    }
    let already = entries
        .get(entry.kind(), entry.name())
        .is_some_and(|e| mode(e) == "permissive");
    let allowed = entries
        .get(Kind::Mesh, crate::structs::config_entry::MESH_CONFIG_NAME)
        .and_then(ConfigEntry::as_mesh)
        .is_some_and(|m| m.allow_enabling_permissive_mutual_tls);
    if already || allowed {
        return Ok(());
    }
    Err(ConfigEntryError::Invalid(
        "MutualTLSMode=permissive is insecure. Set `AllowEnablingPermissiveMutualTLS = true` in the cluster-wide mesh config entry (kind = mesh) to enable it.".into(),
    ))
}

/// An ingress and a terminating gateway may not share a name (Consul's
/// `checkGatewayClash`): a gateway service is one or the other.
fn check_gateway_clash<L: EntryLookup + ?Sized>(
    entries: &L, kind: Kind, name: &str,
) -> Result<(), ConfigEntryError> {
    let other = match kind {
        Kind::IngressGateway => Kind::TerminatingGateway,
        Kind::TerminatingGateway => Kind::IngressGateway,
        _ => return Ok(()),
    };
    if entries.get(kind, name).is_some() && entries.get(other, name).is_some() {
        return Err(ConfigEntryError::Invalid(format!(
            "cannot create a {:?} config entry with name {name:?}, a {:?} config entry with the same name exists",
            kind.as_str(),
            other.as_str()
        )));
    }
    Ok(())
}

/// An ingress listener serves its services with its own protocol: each
/// named service's protocol (its chain's, from service-defaults or
/// proxy-defaults) must be the listener's. Checked when the gateway is
/// written and when a write changes the protocol of a service a gateway
/// names, as Consul does.
fn check_ingress_protocols<L: EntryLookup + ?Sized>(
    entries: &L, kind: Kind, name: &str,
) -> Result<(), ConfigEntryError> {
    let gateways: Vec<&ConfigEntry> = match kind {
        Kind::IngressGateway => entries.get(kind, name).into_iter().collect(),
        Kind::ServiceIntentions
        | Kind::Mesh
        | Kind::TerminatingGateway
        | Kind::ExportedServices => {
            return Ok(());
        }
        _ => {
            let affected = affected_chains(entries, kind, name);
            entries
                .list(Kind::IngressGateway)
                .into_iter()
                .filter(|g| {
                    kind == Kind::ProxyDefaults
                        || g.as_ingress_gateway().is_some_and(|g| {
                            g.listeners
                                .iter()
                                .flat_map(|l| &l.services)
                                .any(|s| affected.contains(&s.name))
                        })
                })
                .collect()
        }
    };
    for g in gateways {
        let Some(g) = g.as_ingress_gateway() else {
            continue;
        };
        for l in &g.listeners {
            for s in l.services.iter().filter(|s| s.name != "*") {
                let req = CompileRequest::new(
                    &s.name,
                    "dc1",
                    "11111111-2222-3333-4444-555555555555.consul",
                );
                let protocol = compile(&req, entries)
                    .map(|c| c.protocol.clone())
                    .unwrap_or_else(|_| "tcp".into());
                if protocol != l.protocol {
                    return Err(ConfigEntryError::Invalid(format!(
                        "service {:?} has protocol {protocol:?}, which does not match defined listener protocol {:?}",
                        s.name, l.protocol
                    )));
                }
            }
        }
    }
    Ok(())
}

/// L7 intention permissions need an L7 destination: refuses a write that
/// leaves a `service-intentions` entry with `Permissions` on a service
/// whose protocol (resolved as its chain resolves it) is not http, http2
/// or grpc, whether the write is the intentions or the defaults.
fn check_intentions_protocol<L: EntryLookup + ?Sized>(
    entries: &L, kind: Kind, name: &str,
) -> Result<(), ConfigEntryError> {
    let to_check: Vec<&ConfigEntry> = match kind {
        Kind::ServiceIntentions => entries.get(kind, name).into_iter().collect(),
        Kind::ServiceDefaults => entries
            .get(Kind::ServiceIntentions, name)
            .into_iter()
            .collect(),
        Kind::ProxyDefaults => entries.list(Kind::ServiceIntentions),
        _ => Vec::new(),
    };
    for e in to_check {
        let Some(ixn) = e.as_intentions() else {
            continue;
        };
        if ixn.sources.iter().all(|s| s.permissions.is_empty()) {
            continue;
        }
        let req = CompileRequest::new(
            &ixn.name,
            "dc1",
            "11111111-2222-3333-4444-555555555555.consul",
        );
        let protocol = compile(&req, entries)
            .map(|c| c.protocol.clone())
            .unwrap_or_else(|_| "tcp".into());
        if !matches!(protocol.as_str(), "http" | "http2" | "grpc") {
            return Err(ConfigEntryError::Invalid(format!(
                "service {:?} has protocol {protocol:?}; intentions with L7 Permissions need http, http2 or grpc",
                ixn.name
            )));
        }
    }
    Ok(())
}
