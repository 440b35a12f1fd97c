//! `/v1/query`: prepared queries — create, list, read, update, delete,
//! execute and explain, in Consul's shapes, words and ACL checks.
//!
//! Execute and its failover are the endpoint layer's (`endpoint::query`);
//! another datacenter's failover arrives through
//! `/v1/internal/query/execute-remote`, a path answered only for a request
//! that came from another datacenter over the servers' authenticated
//! transport (`federation::Forwarded`), never for a client.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::json;

use super::{App, Called, Opts, Watch, blocking, json_at, json_filtered};
use crate::endpoint::Call;
use crate::endpoint::query::{self, EXECUTE_REMOTE, Execute, NOT_FOUND, RemoteRequest, visible};
use crate::error::{Error, Result};
use crate::federation::{Federation, Forwarded};
use crate::request::authz::Authz;
use crate::request::{Params, decode_json};
use crate::state::keys;
use crate::state::query::resolve;
use crate::structs::query::PreparedQuery;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/query", get(list).post(create))
        .route("/v1/query/", any(missing))
        .route(
            "/v1/query/{*rest}",
            get(get_by_path).put(put_by_path).delete(delete_by_path),
        )
        .route(EXECUTE_REMOTE, post(execute_remote))
}

async fn missing() -> Error {
    Error::bad("Missing query ID")
}

/// `GET /v1/query/:id`, `/v1/query/:id_or_name/execute` and `/explain`:
/// Consul takes the path's last word as the verb.
async fn get_by_path(
    State(s): State<App>, a: Authz, Called(p, call): Called, Path(rest): Path<String>,
    headers: HeaderMap, fed: Option<axum::Extension<Arc<Federation>>>,
) -> Result<Response> {
    let opts = call.opts.clone();
    if let Some(id) = rest.strip_suffix("/execute") {
        let fed = fed.map(|axum::Extension(f)| f);
        return execute(&s, call, id, &p, &headers, fed.as_deref()).await;
    }
    if let Some(id) = rest.strip_suffix("/explain") {
        return explain(&s, a, id).await;
    }
    read(&s, a, &rest, opts).await
}

/// Only GET on `/execute` and `/explain`, as Consul.
fn only_id(method: Method, rest: &str) -> Result<()> {
    if rest.ends_with("/execute") || rest.ends_with("/explain") {
        return Err(method_not_allowed(&method));
    }
    Ok(())
}

async fn put_by_path(
    State(s): State<App>, Path(rest): Path<String>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    only_id(Method::PUT, &rest)?;
    query::update(&s, call, &rest, decode(&body)?).await?;
    Ok(().into_response())
}

async fn delete_by_path(
    State(s): State<App>, Path(rest): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    only_id(Method::DELETE, &rest)?;
    query::delete(&s, call, &rest).await?;
    Ok(().into_response())
}

fn method_not_allowed(m: &Method) -> Error {
    Error::bad(format!("Method {m} not allowed"))
}

fn decode(body: &[u8]) -> Result<PreparedQuery> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::bad(
            "Request decode failed: missing query definition",
        ));
    }
    decode_json(body)
}

/// `POST /v1/query`: `{"ID": ...}`.
async fn create(State(s): State<App>, Called(_, call): Called, body: Bytes) -> Result<Response> {
    let id = query::create(&s, call, decode(&body)?).await?;
    Ok(axum::Json(json!({ "ID": id })).into_response())
}

/// `GET /v1/query`: the queries the token may read (blocking).
async fn list(State(s): State<App>, mut a: Authz, Opts(_, opts): Opts) -> Result<Response> {
    let watch = Watch::Keys(vec![keys::QUERIES]);
    let (index, (queries, filtered)) = blocking(&s, &opts, &mut a, watch, |st, a| {
        let all: Vec<_> = st.queries.values().collect();
        let seen: Vec<PreparedQuery> = all.iter().filter_map(|q| visible(a, q)).collect();
        let filtered = seen.len() != all.len();
        (st.index_of([&keys::QUERIES]), (seen, filtered))
    })
    .await?;
    Ok(json_filtered(&s, index, &queries, filtered))
}

/// `GET /v1/query/:id`: one query by ID, as a list of one; 403 when it
/// exists but the token may not read it (Consul).
async fn read(
    s: &App, mut a: Authz, id: &str, opts: crate::request::QueryOptions,
) -> Result<Response> {
    let watch = Watch::Keys(vec![keys::QUERIES]);
    let (index, found) = blocking(s, &opts, &mut a, watch, |st, a| {
        let found = st.queries.get(id).map(|q| visible(a, q));
        (st.index_of([&keys::QUERIES]), found)
    })
    .await?;
    match found {
        None => Err(Error::NotFound(NOT_FOUND.into())),
        Some(None) => Err(Error::Forbidden("Permission denied".into())),
        Some(Some(q)) => Ok(json_at(s, index, &[q])),
    }
}

/// `GET /v1/query/:id_or_name/explain`: the query an execute would run,
/// rendered; read access as for a read.
async fn explain(s: &App, a: Authz, id_or_name: &str) -> Result<Response> {
    let st = s.state();
    let q = resolve(&st, id_or_name, "").ok_or_else(|| Error::NotFound(NOT_FOUND.into()))?;
    let q = visible(&a, &q).ok_or_else(|| Error::Forbidden("Permission denied".into()))?;
    Ok(json_at(
        s,
        st.index_of([&keys::QUERIES]),
        &json!({ "Query": q }),
    ))
}

fn limit_of(p: &Params) -> Result<usize> {
    match p.get("limit") {
        None | Some("") => Ok(0),
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| Error::bad(format!("Bad limit: {l:?} is not a non-negative integer"))),
    }
}

fn connect_of(p: &Params) -> bool {
    p.flag("connect")
}

async fn execute(
    s: &App, mut call: Call, id_or_name: &str, p: &Params, headers: &HeaderMap,
    fed: Option<&Federation>,
) -> Result<Response> {
    let ex = Execute {
        limit: limit_of(p)?,
        connect: connect_of(p),
        near: p.get("near").filter(|n| !n.is_empty()).map(str::to_string),
    };
    // The server that received the request (`?near=_agent`).
    call.origin = Some(super::session::receiving_node(s, headers));
    let answer = query::execute(s, fed, &call, id_or_name, &ex).await?;
    Ok(json_at(s, answer.index, &answer.value))
}

/// Another datacenter's failover (`endpoint::query::run_remote`), refused
/// to anything that did not come from another datacenter's server.
async fn execute_remote(
    State(s): State<App>, from: Option<axum::Extension<Forwarded>>, headers: HeaderMap,
    RawQuery(q): RawQuery, body: Bytes,
) -> Result<Response> {
    // Before any check of the query string: a client's `?dc=` learns
    // nothing but this.
    if from.is_none() {
        return Err(Error::Forbidden(
            "Permission denied: only another datacenter's servers may run a query here".into(),
        ));
    }
    let token = crate::request::authz::token_of(&headers, q.as_deref());
    let call = Call::new(token, Default::default());
    let req: RemoteRequest = decode_json(&body)?;
    let answer = query::run_remote(&s, &call, req)?;
    Ok(json_at(&s, answer.index, &answer.value))
}
