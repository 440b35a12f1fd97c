//! What a proxy's own token lets it see of the endpoints its snapshot
//! lists. Snapshots are shared (one per registration, whatever token
//! streams it; remote watchers read with the server's token), so the
//! stream serving a proxy narrows it to what its token could have read
//! itself, as Consul's proxycfg, which watches a proxy's upstreams with the
//! proxy's token, would have heard:
//!
//! - a target whose service the token may not `service:read` has no
//!   endpoints (Consul's health read, ACL-filtered, answers an empty list:
//!   the cluster stays, empty);
//! - a target in another datacenter has none for a `Local` token (that
//!   datacenter does not know it; a global token is replicated there, so
//!   this datacenter's authorizer answers as that one's would);
//! - the mesh gateways a target goes through, a terminating gateway's
//!   linked services' instances, a mesh gateway's local services and other
//!   datacenters' gateways are kept only where the token reads their
//!   service.
//! - a terminating gateway's linked service is left out whole (its leaf,
//!   its filter chain, its cluster) unless the token may `service:write`
//!   it: the gateway answers as that service, so it must be allowed to be
//!   it, as Consul's proxycfg fetches each linked leaf with the gateway's
//!   own token and signing refuses without `service:write`.
//!
//! `hidden` says what a reader may not see of a snapshot as a value (equal
//! values restrict alike: a stream rebuilds after an ACL change only when
//! it moved); `Snapshot::without` is the narrowed copy. Pure: no state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::snapshot::{Endpoints, Snapshot, UpstreamSnapshot};
use crate::acl::Authorizer;

/// A proxy's token, as its stream's narrowing reads it.
#[derive(Debug, Clone)]
pub struct Reader {
    pub authz: Arc<Authorizer>,
    /// This server's datacenter: a target elsewhere is read there.
    pub datacenter: String,
    /// The token is known in other datacenters (not `Local`).
    pub global: bool,
}

/// What of one snapshot a reader may not see: the services it may not
/// read and the other datacenters it is unknown in, among those the
/// snapshot names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hidden {
    services: BTreeSet<String>,
    datacenters: BTreeSet<String>,
    /// Linked services whose identity (leaf) the reader may not take.
    unwritable: BTreeSet<String>,
}

impl Hidden {
    /// Nothing hidden: the shared snapshot serves as it is.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.datacenters.is_empty() && self.unwritable.is_empty()
    }

    fn target(&self, service: &str, datacenter: &str) -> bool {
        self.services.contains(service) || self.datacenters.contains(datacenter)
    }
}

/// What `reader` may not see of `snap` (`None` reader: ACLs off, nothing).
pub fn hidden(snap: &Snapshot, reader: Option<&Reader>) -> Hidden {
    let Some(r) = reader else {
        return Hidden::default();
    };
    let mut services = BTreeSet::new();
    let mut datacenters = BTreeSet::new();
    let mut service = |name: &str| {
        if !services.contains(name) && !r.authz.service_read(name) {
            services.insert(name.to_string());
        }
    };
    for us in snap.upstreams.values() {
        let Some(chain) = us.chain.as_deref() else {
            continue;
        };
        for id in us.endpoints.keys() {
            let Some(t) = chain.targets.get(id) else {
                continue;
            };
            service(&t.service);
            if !r.global && t.datacenter != r.datacenter {
                datacenters.insert(t.datacenter.clone());
            }
        }
        for via in us.gateways.values() {
            via.instances
                .iter()
                .for_each(|g| service(&g.service.service));
        }
    }
    let mut unwritable = BTreeSet::new();
    if let Some(gw) = &snap.gateway {
        for s in gw.linked.keys() {
            service(s);
            if !r.authz.service_write(s) {
                unwritable.insert(s.clone());
            }
        }
        gw.local.keys().for_each(|s| service(s));
        gw.remote
            .values()
            .flat_map(|rows| rows.iter())
            .for_each(|g| service(&g.service.service));
    }
    Hidden {
        services,
        datacenters,
        unwritable,
    }
}

impl Snapshot {
    /// This snapshot as a reader with `hidden` sees it: hidden targets and
    /// services keep their place with no endpoints, hidden gateways are
    /// left out of the lists that carry them.
    pub fn without(&self, hidden: &Hidden) -> Snapshot {
        let mut out = self.clone();
        if hidden.is_empty() {
            return out;
        }
        for us in out.upstreams.values_mut() {
            narrow_upstream(us, hidden);
        }
        if let Some(gw) = &self.gateway {
            let mut gw = (**gw).clone();
            gw.linked.retain(|svc, _| !hidden.unwritable.contains(svc));
            for (svc, linked) in gw.linked.iter_mut() {
                if hidden.services.contains(svc) {
                    linked.instances = Endpoints::default();
                }
            }
            for (svc, rows) in gw.local.iter_mut() {
                if hidden.services.contains(svc) {
                    *rows = Endpoints::default();
                }
            }
            for rows in gw.remote.values_mut() {
                *rows = readable(rows, hidden);
            }
            out.gateway = Some(Arc::new(gw));
        }
        out
    }
}

fn narrow_upstream(us: &mut UpstreamSnapshot, hidden: &Hidden) {
    let Some(chain) = us.chain.clone() else {
        return;
    };
    let mut endpoints = BTreeMap::new();
    for (id, rows) in &us.endpoints {
        let shown = match chain.targets.get(id) {
            Some(t) if hidden.target(&t.service, &t.datacenter) => Endpoints::default(),
            _ => rows.clone(),
        };
        endpoints.insert(id.clone(), shown);
    }
    us.endpoints = endpoints;
    for via in us.gateways.values_mut() {
        via.instances = readable(&via.instances, hidden);
    }
}

/// The instances whose service is not hidden.
fn readable(rows: &Endpoints, hidden: &Hidden) -> Endpoints {
    if rows
        .iter()
        .all(|i| !hidden.services.contains(&i.service.service))
    {
        return rows.clone();
    }
    Arc::new(
        rows.iter()
            .filter(|i| !hidden.services.contains(&i.service.service))
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{DefaultPolicy, parse_rules};
    use crate::proxycfg::{GatewaySnapshot, LinkedService};
    use crate::state::catalog::Instance;

    fn row(service: &str, id: &str) -> Arc<Instance> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "Node": {"Node": format!("{id}-node"), "Address": "10.0.0.9"},
                "Service": {"ID": id, "Service": service, "Port": 8443},
                "Checks": []
            }))
            .unwrap(),
        )
    }

    fn reader(rules: &str) -> Reader {
        Reader {
            authz: Arc::new(Authorizer::new(
                "t",
                &[&parse_rules(rules).unwrap()],
                DefaultPolicy::Deny,
            )),
            datacenter: "dc1".into(),
            global: true,
        }
    }

    fn ids(rows: &Endpoints) -> Vec<&str> {
        rows.iter().map(|i| i.service.id.as_str()).collect()
    }

    /// A gateway's lists of other services' endpoints follow its token: a
    /// mesh gateway's local services and other datacenters' gateways, a
    /// terminating gateway's linked services' instances.
    #[test]
    fn a_gateway_sees_only_the_services_its_token_reads() {
        let snap = gateway_snapshot();
        let token = reader(
            r#"service "gw" { policy = "write" }
               service "web" { policy = "read" }"#,
        );
        let hidden = hidden(&snap, Some(&token));
        let seen = snap.without(&hidden);
        let gw = seen.gateway.as_deref().unwrap();
        assert_eq!(ids(&gw.local["web"]), ["web-proxy"]);
        assert_eq!(ids(&gw.local["db"]), Vec::<&str>::new(), "db kept, empty");
        assert_eq!(ids(&gw.remote["dc2"]), Vec::<&str>::new());
        assert!(
            !gw.linked.contains_key("db"),
            "db's leaf is not the gateway's to take"
        );
        // The shared snapshot is untouched.
        let orig = snap.gateway.as_deref().unwrap();
        assert_eq!(ids(&orig.local["db"]), ["db-proxy"]);

        let all = reader(
            r#"service "gw" { policy = "write" }
               service_prefix "" { policy = "read" }
               service "db" { policy = "write" }"#,
        );
        assert!(super::hidden(&snap, Some(&all)).is_empty());
        let seen = snap.without(&super::hidden(&snap, Some(&all)));
        assert_eq!(seen.gateway, snap.gateway);
    }

    /// A terminating gateway's linked service comes with its leaf and its
    /// private key: the gateway's token must be allowed to be that service
    /// (`service:write`), reading it is not enough; and the rule follows
    /// the token as it changes.
    #[test]
    fn a_linked_services_leaf_needs_service_write() {
        let snap = gateway_snapshot();
        let reads = reader(
            r#"service "gw" { policy = "write" }
               service "db" { policy = "read" }"#,
        );
        let h = hidden(&snap, Some(&reads));
        assert!(!h.is_empty());
        let seen = snap.without(&h);
        assert!(seen.gateway.as_deref().unwrap().linked.is_empty());

        let writes = reader(
            r#"service "gw" { policy = "write" }
               service "db" { policy = "write" }"#,
        );
        let h2 = hidden(&snap, Some(&writes));
        assert_ne!(h, h2, "an ACL change that grants db moves what is hidden");
        let seen = snap.without(&h2);
        let gw = seen.gateway.as_deref().unwrap();
        assert_eq!(ids(&gw.linked["db"].instances), ["db-1"]);
    }

    fn gateway_snapshot() -> Snapshot {
        let gw = GatewaySnapshot {
            kind: "mesh-gateway".into(),
            datacenter: "dc1".into(),
            trust_domain: "td.consul".into(),
            ingress: None,
            terminating: None,
            services: Vec::new(),
            linked: [(
                "db".to_string(),
                LinkedService {
                    instances: Arc::new(vec![row("db", "db-1")]),
                    intentions: Arc::default(),
                    leaf: None,
                    protocol: "tcp".into(),
                },
            )]
            .into(),
            local: [
                ("web".to_string(), Arc::new(vec![row("web", "web-proxy")])),
                ("db".to_string(), Arc::new(vec![row("db", "db-proxy")])),
            ]
            .into(),
            remote: [(
                "dc2".to_string(),
                Arc::new(vec![row("mesh-gateway", "gw2")]),
            )]
            .into(),
        };
        Snapshot {
            proxy_id: serde_json::Value::Null,
            version: 1,
            index: 1,
            service: Default::default(),
            upstreams: BTreeMap::new(),
            roots: None,
            leaf: None,
            intentions: Arc::default(),
            intentions_default_allow: false,
            gateway: Some(Arc::new(gw)),
            transparent: None,
            mesh_tls: None,
        }
    }
}
