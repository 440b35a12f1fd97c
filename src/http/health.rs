//! `/v1/health`: checks by node, by service and by state, and service
//! instances with their health (`{Node, Service, Checks}` rows).
//!
//! An instance's health is its node's checks plus its own, as
//! `state::catalog::service_instances` gathers them; `?passing` keeps the
//! instances whose checks all pass.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;

use super::catalog::read_instances;
use super::{App, Opts, Watch, blocking, json_filtered, keep};
use crate::error::{Error, Result};
use crate::request::NamedRoutes;
use crate::request::authz::Authz;
use crate::request::list_filter::{RowFilter, Rows, apply_filter, node_matches, node_meta_filters};
use crate::request::{Params, QueryOptions};
use crate::server::Server;
use crate::state::catalog::{Instance, node_checks, service_instances};
use crate::state::{WatchKey, keys};
use crate::stream::Topic;
use crate::stream::view::{Selection, shown_nodes};
use crate::structs::{HealthCheck, HealthStatus};

pub fn routes() -> Router<App> {
    Router::new()
        .named("/v1/health/node/", "Missing node name", get(node))
        .named(
            "/v1/health/checks/",
            "Missing service name",
            get(service_checks),
        )
        .named(
            "/v1/health/service/",
            "Missing service name",
            get(instances::<false>),
        )
        .named(
            "/v1/health/connect/",
            "Missing service name",
            get(instances::<true>),
        )
        .route("/v1/health/state/", get(missing_state))
        .route("/v1/health/state/{*state}", get(by_state))
}

async fn missing_state() -> Error {
    Error::bad("Missing check state")
}

/// The checks on a node, node-level and service-level.
async fn node(
    State(s): State<App>, a: Authz, Path(name): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    checks(&s, a, &p, &opts, vec![keys::node(&name)], |st| {
        node_checks(st, &name).cloned().collect()
    })
    .await
}

/// The checks of a service's instances (their own checks, not node checks).
async fn service_checks(
    State(s): State<App>, a: Authz, Path(name): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    let meta = node_meta_filters(&p);
    checks(&s, a, &p, &opts, vec![keys::service(&name)], |st| {
        let mut checks = Vec::new();
        for i in service_instances(st, &name, false) {
            if !node_matches(&i.node, &meta) {
                continue;
            }
            let own = i.checks.iter().filter(|c| c.service_id == i.service.id);
            checks.extend(own.map(|c| (**c).clone()));
        }
        checks
    })
    .await
}

/// `GET /v1/health/state/:state`: checks in one state, or all with `any`.
async fn by_state(
    State(s): State<App>, a: Authz, Path(state): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    if state != "any" && HealthStatus::settable(&state).is_err() {
        return Err(Error::bad(format!(
            "Invalid check state {state:?}: must be any, passing, warning or critical"
        )));
    }
    let meta = node_meta_filters(&p);
    let mut watch = vec![keys::CHECKS];
    if !meta.is_empty() {
        watch.push(keys::NODES);
    }
    checks(&s, a, &p, &opts, watch, |st| {
        st.checks
            .values()
            .filter(|c| state == "any" || c.status == state)
            .filter(|c| {
                meta.is_empty()
                    || st
                        .nodes
                        .get(&c.node)
                        .is_some_and(|n| node_matches(n, &meta))
            })
            .map(|c| (**c).clone())
            .collect()
    })
    .await
}

/// What every check listing does: `read` on the version `watch` wakes
/// (a blocking query), then the checks the token may see, then `?filter`,
/// with the filtered header when the token hid any.
async fn checks(
    s: &Server, mut a: Authz, p: &Params, opts: &QueryOptions, watch: Vec<WatchKey>,
    read: impl Fn(&crate::state::State) -> Vec<HealthCheck>,
) -> Result<Response> {
    let filter = RowFilter::from_params(p, Rows::Checks)?;
    let (index, mut checks) = blocking(s, opts, &mut a, Watch::Keys(watch.clone()), |st, _| {
        (st.index_of(watch.iter()), read(st))
    })
    .await?;
    let filtered = keep(&mut checks, |c| check_visible(&a, c));
    apply_filter(&filter, &mut checks);
    super::coordinate::sort_near(s, p, &mut checks, |c| &c.node);
    Ok(json_filtered(s, index, &checks, filtered))
}

/// A check is shown to a token that may read its node, and its service
/// if it has one (Consul's filter).
fn check_visible(a: &Authz, c: &HealthCheck) -> bool {
    a.node_read(&c.node) && (c.service_name.is_empty() || a.service_read(&c.service_name))
}

/// `/v1/health/service/:name` (`CONNECT` false) and
/// `/v1/health/connect/:name` (true): instances with their checks.
async fn instances<const CONNECT: bool>(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    let connect = CONNECT;
    let select = Selection::parse(&p)?;
    let merge = p.has(crate::merge::PARAM);
    // Blocking reads come from the service's materialized view (they wake
    // on its events only). `?consistent` reads the state after confirming
    // leadership, and merged reads also depend on config entries: both read
    // the state, waking on their watch keys only (Consul, too, serves
    // merged reads from its blocking-query path, not its streaming views).
    let topic = if connect {
        Topic::ServiceHealthConnect
    } else {
        Topic::ServiceHealth
    };
    let view = (opts.index > 0 && !opts.consistent && !merge)
        .then(|| s.views().get(topic, &name))
        .flatten();
    let (index, found): (u64, Vec<Arc<Instance>>) = if let Some(view) = view {
        let _permit = s.blocking_permit(&a)?;
        crate::metrics::BLOCKING_QUERIES.inc();
        let answer = view.wait(opts.index, opts.deadline()).await;
        // The token is checked again as `blocking` does after a wait.
        super::recheck(&s, &mut a, &s.state())?;
        (answer.index, answer.instances.values().cloned().collect())
    } else {
        let (index, found) = read_instances(&s, &opts, &mut a, &name, connect, merge).await?;
        (index, found.into_iter().map(Arc::new).collect())
    };
    let nodes = shown_nodes(&found, s.datacenter());
    let mut rows = select.select(&found, &nodes);
    let filtered = keep(&mut rows, |r| {
        a.service_read(&r.service.service) && a.node_read(&r.node.node)
    });
    select.filter(&mut rows);
    super::coordinate::sort_near(&s, &p, &mut rows, |r| &r.node.node);
    Ok(json_filtered(&s, index, &rows, filtered))
}
