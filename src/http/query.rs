//! `/v1/query`: prepared queries — create, list, read, update, delete,
//! execute and explain, in Consul's shapes, words and ACL checks.
//!
//! Execute runs the query here (`state::catalog::query_instances`), filters
//! the instances by the query's stored token (else the caller's), shuffles
//! them, sorts them by distance from `?near` (else the query's `Near`),
//! and cuts them to `?limit`. With nothing left it fails over as Consul
//! does: to the datacenters of `Failover.Targets`, else the `NearestN`
//! nearest then those of `Failover.Datacenters`, in turn, until one has
//! instances. The definition goes along (as Consul's `ExecuteRemote`): the
//! other datacenter need not know the query, and runs it as sent through
//! `/v1/internal/query/execute-remote`, a path answered only for a request
//! that came from another datacenter over the servers' authenticated
//! transport (`federation::Forwarded`), never for a client.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{App, Opts, Watch, blocking, json_at, json_filtered};
use crate::acl::Authorizer;
use crate::error::{Error, Result};
use crate::federation::{Federation, Forwarded};
use crate::raft::wan::WanRequest;
use crate::request::authz::Authz;
use crate::request::{Params, decode_json};
use crate::server::Server;
use crate::state::catalog::Instance;
use crate::state::catalog::query_instances;
use crate::state::query::resolve;
use crate::state::{Command, Response as Applied, keys};
use crate::structs::query::{PreparedQuery, QueryDns, REDACTED};

/// Where another datacenter's server sends a query to run here.
pub const EXECUTE_REMOTE: &str = "/v1/internal/query/execute-remote";

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

const NOT_FOUND: &str = "Query not found";

/// `GET /v1/query/:id`, `/v1/query/:id_or_name/execute` and `/explain`:
/// Consul takes the path's last word as the verb.
async fn get_by_path(
    State(s): State<App>, a: Authz, Path(rest): Path<String>, Opts(p, opts): Opts,
    headers: HeaderMap, fed: Option<axum::Extension<Arc<Federation>>>,
) -> Result<Response> {
    if let Some(id) = rest.strip_suffix("/execute") {
        let fed = fed.map(|axum::Extension(f)| f);
        return execute(&s, a, id, &p, &headers, fed.as_deref()).await;
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
    State(s): State<App>, a: Authz, Path(rest): Path<String>, _: Opts, body: Bytes,
) -> Result<Response> {
    only_id(Method::PUT, &rest)?;
    update(&s, a, &rest, &body).await
}

async fn delete_by_path(
    State(s): State<App>, a: Authz, Path(rest): Path<String>, _: Opts,
) -> Result<Response> {
    only_id(Method::DELETE, &rest)?;
    delete(&s, a, &rest).await
}

fn method_not_allowed(m: &Method) -> Error {
    Error::bad(format!("Method {m} not allowed"))
}

/// A query as `a` may see it: `None` when it may not read it (a query with
/// no name and no template is seen by whoever knows its ID), the stored
/// token `<hidden>` unless `a` has `acl:write` (Consul's filter).
fn visible(a: &Authorizer, q: &PreparedQuery) -> Option<PreparedQuery> {
    let mut q = q.clone();
    if a.acl_write() {
        return Some(q);
    }
    if let Some(prefix) = q.acl_prefix()
        && !a.query_read(prefix)
    {
        return None;
    }
    if !q.token.is_empty() {
        q.token = REDACTED.into();
    }
    Some(q)
}

/// `query:write` on the query's name prefix, when one applies.
fn authorize_write(a: &Authz, q: &PreparedQuery) -> Result<()> {
    match q.acl_prefix() {
        Some(prefix) => a.require(a.query_write(prefix), "query:write", prefix),
        None => Ok(()),
    }
}

fn decode(body: &[u8]) -> Result<PreparedQuery> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::bad(
            "Request decode failed: missing query definition",
        ));
    }
    decode_json(body)
}

async fn propose(s: &Server, query: PreparedQuery, update: bool) -> Result<()> {
    match s
        .write(Command::QuerySet {
            query: Box::new(query),
            update,
        })
        .await?
    {
        Applied::Ok => Ok(()),
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// `POST /v1/query`: `{"ID": ...}`.
async fn create(State(s): State<App>, a: Authz, _: Opts, body: Bytes) -> Result<Response> {
    let mut q = decode(&body)?;
    if !q.id.is_empty() {
        return Err(Error::bad(
            "ID must be empty when creating a new prepared query",
        ));
    }
    q.validate().map_err(Error::BadRequest)?;
    authorize_write(&a, &q)?;
    // Made here, before proposing, so that apply stays deterministic.
    q.id = uuid::Uuid::new_v4().to_string();
    let id = q.id.clone();
    propose(&s, q, false).await?;
    Ok(axum::Json(json!({ "ID": id })).into_response())
}

/// `PUT /v1/query/:id`: the body replaces the query (its ID from the path).
async fn update(s: &App, a: Authz, id: &str, body: &[u8]) -> Result<Response> {
    let mut q = decode(body)?;
    q.id = id.to_string();
    q.validate().map_err(Error::BadRequest)?;
    authorize_write(&a, &q)?;
    let Some(existing) = s.state().queries.get(id).cloned() else {
        return Err(Error::NotFound(format!(
            "Cannot modify non-existent prepared query: '{id}'"
        )));
    };
    // Write access to what it is, too: no one takes over a query by
    // renaming it into their own prefix.
    authorize_write(&a, &existing)?;
    propose(s, q, true).await?;
    Ok(().into_response())
}

async fn delete(s: &App, a: Authz, id: &str) -> Result<Response> {
    let Some(existing) = s.state().queries.get(id).cloned() else {
        return Err(Error::NotFound(format!(
            "Cannot modify non-existent prepared query: '{id}'"
        )));
    };
    authorize_write(&a, &existing)?;
    match s.write(Command::QueryDelete { id: id.to_string() }).await? {
        Applied::Ok => Ok(().into_response()),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
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

/// What an execute answers (Consul's `PreparedQueryExecuteResponse`).
#[derive(Debug, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct Executed {
    pub service: String,
    pub nodes: Vec<Instance>,
    #[serde(rename = "DNS")]
    pub dns: QueryDns,
    pub datacenter: String,
    pub failovers: u32,
    #[serde(default)]
    pub index: u64,
}

/// What a server sends another datacenter to run (Consul's
/// `PreparedQueryExecuteRemoteRequest`).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RemoteRequest {
    query: PreparedQuery,
    limit: usize,
    connect: bool,
}

/// The authorizer execute filters with: the query's stored token's, else
/// the caller's.
fn executor(s: &Server, a: &Authz, q: &PreparedQuery) -> Result<Arc<Authorizer>> {
    if q.token.is_empty() {
        return Ok(a.authorizer().clone());
    }
    super::acl::resolve_in(s, &s.state(), Some(&q.token))
}

/// Runs `q` here: instances found, readable by `authz`, shuffled.
fn run_here(s: &Server, q: &PreparedQuery, connect: bool, authz: &Authorizer) -> Executed {
    let st = s.state();
    let dc = s.datacenter();
    let mut nodes: Vec<Instance> = query_instances(&st, q, connect)
        .into_iter()
        .filter(|i| authz.service_read(&i.service.service) && authz.node_read(&i.node.node))
        .map(|mut i| {
            // Nodes registered without a datacenter are shown in ours.
            if i.node.datacenter.is_empty() {
                let mut n = (*i.node).clone();
                n.datacenter = dc.to_string();
                i.node = Arc::new(n);
            }
            i
        })
        .collect();
    nodes.shuffle(&mut crate::random::rng());
    Executed {
        service: q.service.service.clone(),
        nodes,
        dns: q.dns.clone(),
        datacenter: dc.to_string(),
        failovers: 0,
        index: st.index_of([&keys::service(&q.service.service), &keys::CHECKS]),
    }
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
    s: &App, a: Authz, id_or_name: &str, p: &Params, headers: &HeaderMap, fed: Option<&Federation>,
) -> Result<Response> {
    let limit = limit_of(p)?;
    let connect = connect_of(p);
    let q = resolve(&s.state(), id_or_name, "").ok_or_else(|| Error::NotFound(NOT_FOUND.into()))?;
    let authz = executor(s, &a, &q)?;
    let mut out = run_here(s, &q, connect, &authz);
    // `?near` wins over the query's own `Near`; `_agent` is the agent
    // that was asked: the server that received the request.
    let near = match p.get("near").filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => q.service.near.clone(),
    };
    if !near.is_empty() {
        let node = if near == "_agent" {
            super::session::receiving_node(s, headers)
        } else {
            near
        };
        super::coordinate::sort_near_node(s, &node, &mut out.nodes, |i| &i.node.node);
        // The node asked from comes first when it has an instance (among
        // the first ten, as Consul looks).
        if let Some(at) = out
            .nodes
            .iter()
            .take(10)
            .position(|i| i.node.node.eq_ignore_ascii_case(&node))
        {
            out.nodes.swap(0, at);
        }
    }
    if limit > 0 {
        out.nodes.truncate(limit);
    }
    if out.nodes.is_empty()
        && let Some(fed) = fed
    {
        fail_over(s, &q, limit, connect, headers, fed, &mut out).await;
    }
    let index = out.index;
    Ok(json_at(s, index, &out))
}

/// The datacenters to try, in order, as Consul picks them: `Targets`'
/// datacenters when set; else the `NearestN` nearest, then those of
/// `Datacenters` not tried yet. Unknown datacenters are skipped.
fn failover_order(q: &PreparedQuery, own: &str, nearest: &[String]) -> Vec<String> {
    let others: Vec<&String> = nearest.iter().filter(|dc| *dc != own).collect();
    let known = |dc: &str| others.iter().any(|o| *o == dc);
    let f = &q.service.failover;
    let mut dcs: Vec<String> = Vec::new();
    if !f.targets.is_empty() {
        for t in &f.targets {
            if known(&t.datacenter) && !dcs.contains(&t.datacenter) {
                dcs.push(t.datacenter.clone());
            }
        }
        return dcs;
    }
    let n = usize::try_from(f.nearest_n).unwrap_or(0);
    dcs.extend(others.iter().take(n).map(|dc| dc.to_string()));
    for dc in &f.datacenters {
        if known(dc) && !dcs.contains(dc) {
            dcs.push(dc.clone());
        }
    }
    dcs
}

async fn fail_over(
    s: &Server, q: &PreparedQuery, limit: usize, connect: bool, headers: &HeaderMap,
    fed: &Federation, out: &mut Executed,
) {
    let dcs = failover_order(q, s.datacenter(), &fed.datacenters());
    let body = match serde_json::to_vec(&RemoteRequest {
        query: q.clone(),
        limit,
        connect,
    }) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "prepared query not encoded for failover");
            return;
        }
    };
    let mut tried = 0;
    for dc in dcs {
        tried += 1;
        let req = WanRequest {
            from: s.datacenter().to_owned(),
            method: "POST".into(),
            path_and_query: EXECUTE_REMOTE.into(),
            headers: ["x-consul-token", "authorization"]
                .iter()
                .filter_map(|h| Some((h.to_string(), headers.get(*h)?.to_str().ok()?.to_string())))
                .chain([("content-type".to_string(), "application/json".to_string())])
                .collect(),
            body: body.clone(),
        };
        let answered = match fed
            .forward(&dc, req, crate::request::RPC_CLIENT_TIMEOUT)
            .await
        {
            Ok(r) if r.status == 200 => serde_json::from_slice::<Executed>(&r.body)
                .map_err(|e| format!("undecodable answer: {e}")),
            Ok(r) => Err(format!(
                "{}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Err(e) => Err(e.to_string()),
        };
        match answered {
            Ok(remote) => {
                out.nodes = remote.nodes;
                out.datacenter = remote.datacenter;
                out.index = remote.index;
                if !out.nodes.is_empty() {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(datacenter = %dc, error = %e, "prepared query failover: datacenter not queried");
            }
        }
    }
    out.failovers = tried;
}

/// Another datacenter's failover: the query as sent runs here, filtered by
/// its stored token (else the token sent), shuffled, cut to its limit.
/// Refused to anything that did not come from another datacenter's server.
async fn execute_remote(
    State(s): State<App>, a: Authz, from: Option<axum::Extension<Forwarded>>, body: Bytes,
) -> Result<Response> {
    if from.is_none() {
        return Err(Error::Forbidden(
            "Permission denied: only another datacenter's servers may run a query here".into(),
        ));
    }
    let req: RemoteRequest = decode_json(&body)?;
    req.query.validate().map_err(Error::BadRequest)?;
    // Planted for the simulation's checker 5: every check ignored.
    #[cfg(feature = "bug-failover-ignores-health")]
    let req = {
        let mut req = req;
        req.query.service.ignore_check_ids = s
            .state()
            .checks
            .values()
            .map(|c| c.check_id.clone())
            .collect();
        req
    };
    let authz = executor(&s, &a, &req.query)?;
    let mut out = run_here(&s, &req.query, req.connect, &authz);
    if req.limit > 0 {
        out.nodes.truncate(req.limit);
    }
    let index = out.index;
    Ok(json_at(&s, index, &out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::query::{QueryTarget, ServiceQuery};

    fn with_failover(n: i64, dcs: &[&str], targets: &[&str]) -> PreparedQuery {
        let mut q = PreparedQuery {
            service: ServiceQuery {
                service: "web".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        q.service.failover.nearest_n = n;
        q.service.failover.datacenters = dcs.iter().map(|d| d.to_string()).collect();
        q.service.failover.targets = targets
            .iter()
            .map(|d| QueryTarget {
                datacenter: d.to_string(),
                ..Default::default()
            })
            .collect();
        q
    }

    /// Consul's order: NearestN first, then the listed ones not yet
    /// tried; unknown ones skipped; Targets alone when set.
    #[test]
    fn failover_order_is_consuls() {
        let nearest: Vec<String> = ["dc1", "dc3", "dc2", "dc4"].map(String::from).to_vec();
        let order = |q| failover_order(&q, "dc1", &nearest);
        assert_eq!(
            order(with_failover(2, &["dc4", "dc3", "dcX"], &[])),
            ["dc3", "dc2", "dc4"]
        );
        assert_eq!(order(with_failover(0, &["dc2", "dc1"], &[])), ["dc2"]);
        assert_eq!(order(with_failover(9, &[], &[])), ["dc3", "dc2", "dc4"]);
        assert_eq!(
            order(with_failover(0, &[], &["dc4", "dcX", "dc2"])),
            ["dc4", "dc2"]
        );
        assert!(order(with_failover(0, &[], &[])).is_empty());
    }
}
