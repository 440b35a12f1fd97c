//! `GET /v1/internal/dataplane/bootstrap-params/:proxy_service_id`: the
//! bootstrap parameters of `endpoint::dataplane` (Consul serves them as the
//! gRPC `GetEnvoyBootstrapParams`), that message's fields in PascalCase.
//! The node is named by `?node=` (or `?node-id=`, the gRPC request's other
//! spelling).

use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;

use super::{App, Opts, json_at};
use crate::endpoint::dataplane::{NodeSpec, read};
use crate::error::{Error, Result};
use crate::request::authz::Authz;

pub fn routes() -> Router<App> {
    Router::new().route(
        "/v1/internal/dataplane/bootstrap-params/{proxy_id}",
        get(bootstrap_params),
    )
}

async fn bootstrap_params(
    State(s): State<App>, mut a: Authz, Path(id): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    let spec = match (p.get("node"), p.get("node-id")) {
        (Some(n), _) if !n.is_empty() => NodeSpec::Name(n.to_string()),
        (_, Some(i)) if !i.is_empty() => NodeSpec::Id(i.to_string()),
        _ => return Err(Error::bad("Node ID or name required (?node=NAME)")),
    };
    let (index, params) = read(&s, &mut a, &opts, &id, &spec).await?;
    Ok(json_at(&s, index, &params))
}
