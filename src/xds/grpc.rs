//! Resources for gRPC's proxyless xDS client (gRFC A27): a client dialing
//! `xds:///web` asks for the listener `web` and follows it to its route,
//! clusters and endpoints. Each service it dials is an upstream of its
//! snapshot (`proxycfg::build_proxyless`), answered with that service's
//! compiled discovery chain, as a sidecar's upstream is, but:
//!
//! - the listener is an API listener (no address, no filter chain): an
//!   HTTP connection manager taking its routes by RDS over ADS, with the
//!   router filter gRPC requires;
//! - the route configuration's virtual host is the service's name, the
//!   authority the client dials;
//! - clusters carry no mesh TLS (the client speaks to the applications'
//!   own ports, not to their sidecars) and endpoints are the instances
//!   themselves;
//! - each priority of a load assignment is one locality of weight 1, and
//!   priorities are contiguous from 0 (gRPC ignores a locality without a
//!   weight and refuses gaps): an empty failover tier is left out.

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

use super::resources::{
    CLUSTER, ENDPOINT, Identity, LISTENER, ROUTE, Resource, Resources, ads, every_type, hcm_base,
    load_assignment, put, route_config, target_cluster,
};
use crate::proxycfg::Snapshot;

/// Every resource of a proxyless client's snapshot: for each service it
/// dials (whose chain compiled), its listener, route, clusters and
/// endpoints.
pub fn generate(snap: &Snapshot) -> Resources {
    let mut out = every_type();
    // No mesh identity: the clusters carry no TLS.
    let plaintext = Identity::default();
    for (name, us) in &snap.upstreams {
        // A chain that does not compile: no listener, which the client
        // takes as "does not exist" (the error is the snapshot's).
        let Some(chain) = us.chain.as_deref() else {
            continue;
        };
        for target in chain.targets.values() {
            if !us.endpoints.contains_key(&target.id) {
                continue; // another datacenter: not served here
            }
            let mut c = target_cluster(chain, target, &plaintext);
            // gRPC ejects on its own success-rate rules once outlier
            // detection is present; a proxyless client balances as before.
            c.outlier_detection = None;
            put(&mut out, CLUSTER, c.name.clone(), Resource::of(c));
            let mut cla = load_assignment(chain, us, &target.id);
            as_localities(&mut cla);
            put(
                &mut out,
                ENDPOINT,
                cla.cluster_name.clone(),
                Resource::of(cla),
            );
        }
        let mut routes = route_config(name, chain);
        for vh in &mut routes.virtual_hosts {
            vh.domains = vec![name.clone()];
        }
        put(&mut out, ROUTE, name.clone(), Resource::of(routes));
        let l = api_listener(name);
        put(&mut out, LISTENER, name.clone(), Resource::of(l));
    }
    out
}

/// The listener a client dialing `xds:///<name>` asks for.
fn api_listener(name: &str) -> listener::Listener {
    let mut m = hcm_base(name);
    m.route_specifier = Some(hcm::http_connection_manager::RouteSpecifier::Rds(
        hcm::Rds {
            config_source: ads(),
            route_config_name: name.to_string(),
        },
    ));
    listener::Listener {
        name: name.to_string(),
        api_listener: Some(listener::ApiListener {
            api_listener: Some(pack_any(m)),
        }),
        ..Default::default()
    }
}

/// Each non-empty priority as one locality of weight 1, renumbered from 0.
fn as_localities(cla: &mut endpoint::ClusterLoadAssignment) {
    cla.endpoints.retain(|l| !l.lb_endpoints.is_empty());
    for (priority, l) in cla.endpoints.iter_mut().enumerate() {
        l.priority = priority as u32;
        l.load_balancing_weight = Some(UInt32Value { value: 1 });
        l.locality = Some(core::Locality {
            sub_zone: format!("priority-{priority}"),
            ..Default::default()
        });
    }
}
