//! The xDS server: a proxy's proxycfg snapshot in, Envoy resources out.
//! `resources` builds listeners, clusters, routes and endpoints from a
//! snapshot (as Consul's `agent/xds` names them), `rbac` turns intentions
//! into RBAC filters, `delta` is the incremental protocol of one stream,
//! and `server` serves Envoy's Aggregated Discovery Service (Delta) over
//! gRPC. It reads no state: the proxy's snapshot comes through a `Source`.

pub mod delta;
pub mod rbac;
pub mod resources;
pub mod server;
#[cfg(test)]
mod tests;

pub use resources::{Identity, Resources, generate};
pub use server::{Ads, Source};

use crate::proxycfg::Snapshot;

/// The mesh identity a snapshot carries: every CA root (the active one and
/// those still trusted after a rotation), the proxy's leaf, and the trust
/// domain (from the roots, else from the chain targets' SNI
/// `<svc>.default.<dc>.internal.<trust-domain>`).
pub fn identity(snap: &Snapshot) -> Identity {
    let trust_domain = snap
        .roots
        .as_ref()
        .map(|r| r.trust_domain.clone())
        .filter(|t| !t.is_empty())
        .or_else(|| {
            snap.upstreams
                .values()
                .filter_map(|u| u.chain.as_ref())
                .flat_map(|c| c.targets.values())
                .find_map(|t| t.sni.split_once(".internal.").map(|(_, td)| td.to_string()))
        })
        .unwrap_or_default();
    let mut roots_pem = String::new();
    for root in snap.roots.iter().flat_map(|r| r.roots.iter()) {
        roots_pem.push_str(root.root_cert.trim_end());
        roots_pem.push('\n');
    }
    Identity {
        roots_pem,
        leaf: snap
            .leaf
            .as_ref()
            .map(|l| (l.cert_pem.clone(), l.private_key_pem.clone())),
        trust_domain,
    }
}

/// The intentions with this proxy's service as destination (highest
/// precedence first) as L4 rules, and the default decision. Intentions
/// with L7 permissions instead of an action are left out.
pub fn intention_rules(snap: &Snapshot) -> (Vec<rbac::Rule>, bool) {
    let rules = snap
        .intentions
        .iter()
        .filter_map(|i| {
            let allow = match i.action.as_deref()? {
                "allow" => true,
                "deny" => false,
                _ => return None,
            };
            Some(rbac::Rule {
                source: i.source_name.clone(),
                allow,
            })
        })
        .collect();
    (rules, snap.intentions_default_allow)
}
