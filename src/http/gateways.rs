//! What gateways front: `/v1/catalog/gateway-services/:gateway` (the
//! services linked to a gateway by its config entry) and
//! `/v1/health/ingress/:service` (the ingress gateways exposing a service,
//! with their health). Both are blocking queries; both ask `service:read`
//! on what was named and show only the rows whose other side the token
//! may read too, as Consul does. And `/v1/internal/mesh-gateways`: this
//! datacenter's mesh gateways with their health, what another
//! datacenter's proxycfg follows to route through them (Consul asks its
//! servers' internal service dump by kind for the same).

use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;

use super::{App, Opts, Watch, blocking, json_filtered, keep};
use crate::error::Result;
use crate::request::NamedRoutes;
use crate::request::authz::Authz;
use crate::request::list_filter::{RowFilter, Rows, apply_filter, passing_flag};
use crate::state::catalog::{Instance, instances_of_kind, service_instances};
use crate::state::gateways::{gateway_services, ingress_gateways_for, watch_keys};
use crate::state::keys;
use crate::stream::view::{all_passing, shown_nodes};
use crate::structs::ServiceKind;
use crate::structs::config_entry::Kind;
use crate::structs::rows::CheckServiceNode;

pub fn routes() -> Router<App> {
    Router::new()
        .named(
            "/v1/catalog/gateway-services/",
            "Missing gateway name",
            get(catalog_gateway_services),
        )
        .named(
            "/v1/health/ingress/",
            "Missing service name",
            get(health_ingress),
        )
        .route("/v1/internal/mesh-gateways", get(mesh_gateways))
}

async fn catalog_gateway_services(
    State(s): State<App>, mut a: Authz, Path(gateway): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    a.require(a.service_read(&gateway), "service:read", &gateway)?;
    let watch = watch_keys(&gateway);
    let (index, mut list) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, _| {
        (st.index_of(watch.iter()), gateway_services(st, &gateway))
    })
    .await?;
    a.require(a.service_read(&gateway), "service:read", &gateway)?;
    let filtered = keep(&mut list, |g| a.service_read(&g.service.name));
    Ok(json_filtered(&s, index, &list, filtered))
}

/// Healthy (`?passing`: passing only) instances of every ingress gateway
/// whose entry exposes `service`, as `/v1/health/service` rows.
async fn health_ingress(
    State(s): State<App>, mut a: Authz, Path(service): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    a.require(a.service_read(&service), "service:read", &service)?;
    let passing = passing_flag(&p)?;
    let filter = RowFilter::from_params(&p, Rows::CheckServiceNodes)?;
    // Which gateways expose it moves with the ingress entries and the
    // catalog's services (for `*`); their instances' health with checks.
    let watch = vec![
        keys::config_kind(Kind::IngressGateway.as_str()),
        keys::SERVICES,
        keys::CHECKS,
        keys::NODES,
    ];
    let (index, found) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, _| {
        let mut rows: Vec<Instance> = Vec::new();
        for gw in ingress_gateways_for(st, &service) {
            rows.extend(
                service_instances(st, &gw, false)
                    .into_iter()
                    .filter(|i| i.service.kind == ServiceKind::IngressGateway),
            );
        }
        (st.index_of(watch.iter()), rows)
    })
    .await?;
    a.require(a.service_read(&service), "service:read", &service)?;
    let nodes = shown_nodes(&found, s.datacenter());
    let mut rows: Vec<CheckServiceNode> = found
        .iter()
        .zip(nodes.iter())
        .filter(|(i, _)| !passing || all_passing(i))
        .map(|(i, n)| CheckServiceNode {
            node: n,
            service: &i.service,
            checks: &i.checks,
        })
        .collect();
    let filtered = keep(&mut rows, |r| {
        a.service_read(&r.service.service) && a.node_read(&r.node.node)
    });
    apply_filter(&filter, &mut rows);
    Ok(json_filtered(&s, index, &rows, filtered))
}

/// This datacenter's mesh gateways (every instance of that kind, whatever
/// its health: the reader judges), as `/v1/health/service` rows, blocking
/// on their own key; each row shown to a token that may read its service
/// and its node.
async fn mesh_gateways(
    State(s): State<App>, mut a: Authz, Opts(p, opts): Opts,
) -> Result<Response> {
    let filter = RowFilter::from_params(&p, Rows::CheckServiceNodes)?;
    let watch = vec![keys::MESH_GATEWAYS];
    let (index, found) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, _| {
        (
            st.index_of(watch.iter()),
            instances_of_kind(st, ServiceKind::MeshGateway),
        )
    })
    .await?;
    let nodes = shown_nodes(&found, s.datacenter());
    let mut rows: Vec<CheckServiceNode> = found
        .iter()
        .zip(nodes.iter())
        .map(|(i, n)| CheckServiceNode {
            node: n,
            service: &i.service,
            checks: &i.checks,
        })
        .collect();
    let filtered = keep(&mut rows, |r| {
        a.service_read(&r.service.service) && a.node_read(&r.node.node)
    });
    apply_filter(&filter, &mut rows);
    Ok(json_filtered(&s, index, &rows, filtered))
}
