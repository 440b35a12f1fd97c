//! Prepared queries: who may see and write one (`visible`,
//! `authorize_write`), and execute — the query run here
//! (`state::catalog::query_instances`), its instances filtered by the
//! query's stored token (else the caller's), shuffled, sorted by distance
//! from `near` (else the query's `Near`) and cut to `limit`; with nothing
//! left it fails over as Consul does: to the datacenters of
//! `Failover.Targets`, else the `NearestN` nearest then those of
//! `Failover.Datacenters`, in turn, until one has instances. The
//! definition goes along (as Consul's `ExecuteRemote`): the other
//! datacenter need not know the query, and runs it as sent (`run_remote`).
//! HTTP (`http::query`) and DNS (`Queries`) execute through here. The
//! writes (`Op`: create, update, delete) run on the leader, with their
//! `query:write` checks on the query as sent and as stored.

use std::sync::Arc;

use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use super::{Answer, Call};
use crate::acl::Authorizer;
use crate::error::{Error, Result};
use crate::federation::Federation;
use crate::raft::wan::WanRequest;
use crate::request::authz::Authz;
use crate::server::Server;
use crate::state::catalog::{Instance, query_instances};
use crate::state::query::resolve;
use crate::state::{Command, Response as Applied, keys};
use crate::structs::query::{PreparedQuery, QueryDns, REDACTED};
use crate::structs::serde_util::as_json;

/// Where another datacenter's server sends a query to run here.
pub const EXECUTE_REMOTE: &str = "/v1/internal/query/execute-remote";

pub const NOT_FOUND: &str = "Query not found";

/// A query as `a` may see it: `None` when it may not read it (a query with
/// no name and no template is seen by whoever knows its ID), the stored
/// token `<hidden>` unless `a` has `acl:write` (Consul's filter).
pub fn visible(a: &Authorizer, q: &PreparedQuery) -> Option<PreparedQuery> {
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
pub fn authorize_write(a: &Authz, q: &PreparedQuery) -> Result<()> {
    match q.acl_prefix() {
        Some(prefix) => a.require(a.query_write(prefix), "query:write", prefix),
        None => Ok(()),
    }
}

/// The writes, run on the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// A new query (`POST /v1/query`), its ID made on the server first
    /// asked.
    Create(#[serde(with = "as_json")] Box<PreparedQuery>),
    /// `PUT /v1/query/:id`: the query replaced (its ID the path's).
    Update(#[serde(with = "as_json")] Box<PreparedQuery>),
    Delete {
        id: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Created { id: String },
    Done,
}

/// Creates `q` (no ID yet); its new ID.
pub async fn create(s: &Arc<Server>, call: Call, mut q: PreparedQuery) -> Result<String> {
    if !q.id.is_empty() {
        return Err(Error::bad(
            "ID must be empty when creating a new prepared query",
        ));
    }
    q.validate().map_err(Error::BadRequest)?;
    // Made here, before proposing, so that apply stays deterministic.
    q.id = uuid::Uuid::new_v4().to_string();
    match write(s, call, Op::Create(Box::new(q))).await? {
        Value::Created { id } => Ok(id),
        Value::Done => Err(Error::Internal("a create answered no ID".into())),
    }
}

/// Replaces the query `id` with `q`.
pub async fn update(s: &Arc<Server>, call: Call, id: &str, mut q: PreparedQuery) -> Result<()> {
    q.id = id.to_string();
    q.validate().map_err(Error::BadRequest)?;
    write(s, call, Op::Update(Box::new(q))).await.map(|_| ())
}

pub async fn delete(s: &Arc<Server>, call: Call, id: &str) -> Result<()> {
    let op = Op::Delete { id: id.to_string() };
    write(s, call, op).await.map(|_| ())
}

async fn write(s: &Arc<Server>, call: Call, op: Op) -> Result<Value> {
    match super::route(s, call, super::Op::Query(op)).await?.value {
        super::Value::Query(v) => Ok(v),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

fn not_there(id: &str) -> Error {
    Error::NotFound(format!("Cannot modify non-existent prepared query: '{id}'"))
}

impl Op {
    pub(super) fn place(&self) -> super::Place {
        super::Place::Leader
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        let a = call.authz(s)?;
        let (cmd, value) = match self {
            Op::Create(q) => {
                authorize_write(&a, &q)?;
                let id = q.id.clone();
                let cmd = Command::QuerySet {
                    query: q,
                    update: false,
                };
                (cmd, Value::Created { id })
            }
            Op::Update(q) => {
                authorize_write(&a, &q)?;
                let existing = s.state().queries.get(&q.id).cloned();
                let existing = existing.ok_or_else(|| not_there(&q.id))?;
                // Write access to what it is, too: no one takes over a
                // query by renaming it into their own prefix.
                authorize_write(&a, &existing)?;
                let cmd = Command::QuerySet {
                    query: q,
                    update: true,
                };
                (cmd, Value::Done)
            }
            Op::Delete { id } => {
                let existing = s.state().queries.get(&id).cloned();
                let existing = existing.ok_or_else(|| not_there(&id))?;
                authorize_write(&a, &existing)?;
                (Command::QueryDelete { id }, Value::Done)
            }
        };
        match s.write(cmd).await? {
            Applied::Ok => Ok(Answer::at(s, s.state().index, false, value)),
            Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
            other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
        }
    }
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
pub struct RemoteRequest {
    pub query: PreparedQuery,
    pub limit: usize,
    pub connect: bool,
}

/// An execute's parameters (`?limit`, `?connect`, `?near`).
#[derive(Debug, Clone, Default)]
pub struct Execute {
    /// 0: no limit.
    pub limit: usize,
    /// The Connect-capable instances (proxies and native services).
    pub connect: bool,
    /// A node to sort by distance from (`_agent`: the server the call
    /// reached first); none: the query's own `Near`.
    pub near: Option<String>,
}

/// The authorizer execute filters with: the query's stored token's, else
/// the caller's.
fn executor(s: &Server, a: &Authz, q: &PreparedQuery) -> Result<Arc<Authorizer>> {
    if q.token.is_empty() {
        return Ok(a.authorizer().clone());
    }
    super::blocking::resolve_in(s, &s.state(), Some(&q.token))
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

/// Executes query `id_or_name` on this server's state, failing over
/// through `fed` when nothing is left.
pub async fn execute(
    s: &Server, fed: Option<&Federation>, call: &Call, id_or_name: &str, ex: &Execute,
) -> Result<Answer<Executed>> {
    let a = call.authz(s)?;
    let q = resolve(&s.state(), id_or_name, "").ok_or_else(|| Error::NotFound(NOT_FOUND.into()))?;
    let authz = executor(s, &a, &q)?;
    let mut out = run_here(s, &q, ex.connect, &authz);
    // `near` wins over the query's own `Near`; `_agent` is the agent
    // that was asked: the server that received the request.
    let near = ex.near.clone().unwrap_or_else(|| q.service.near.clone());
    if !near.is_empty() {
        let node = if near == "_agent" {
            call.origin(s).to_string()
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
    if ex.limit > 0 {
        out.nodes.truncate(ex.limit);
    }
    if out.nodes.is_empty()
        && let Some(fed) = fed
    {
        fail_over(s, &q, ex, call.token.as_deref(), fed, &mut out).await;
    }
    Ok(Answer::at(s, out.index, false, out))
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
    s: &Server, q: &PreparedQuery, ex: &Execute, token: Option<&str>, fed: &Federation,
    out: &mut Executed,
) {
    let dcs = failover_order(q, s.datacenter(), &fed.datacenters());
    let body = match serde_json::to_vec(&RemoteRequest {
        query: q.clone(),
        limit: ex.limit,
        connect: ex.connect,
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
            headers: token
                .map(|t| ("x-consul-token".to_string(), t.to_string()))
                .into_iter()
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
/// its stored token (else the caller's), shuffled, cut to its limit. The
/// caller (the transport) has checked that another datacenter's server
/// sent it.
pub fn run_remote(s: &Server, call: &Call, req: RemoteRequest) -> Result<Answer<Executed>> {
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
    let a = call.authz(s)?;
    let authz = executor(s, &a, &req.query)?;
    let mut out = run_here(s, &req.query, req.connect, &authz);
    if req.limit > 0 {
        out.nodes.truncate(req.limit);
    }
    Ok(Answer::at(s, out.index, false, out))
}

/// DNS's prepared queries (`dns::Queries`): executed here as `?stale`
/// (any server answers, as Consul's DNS reads), failing over as an HTTP
/// execute does; another datacenter's are executed there.
pub struct Queries {
    pub server: Arc<Server>,
    pub federation: Option<Arc<Federation>>,
}

impl crate::dns::Queries for Queries {
    fn execute<'a>(
        &'a self, dc: Option<&'a str>, name: &'a str, token: Option<String>,
    ) -> crate::dns::QueriesFuture<'a> {
        Box::pin(async move {
            let opts = crate::request::QueryOptions {
                stale: true,
                ..Default::default()
            };
            let call = Call::new(token, opts);
            let fed = self.federation.as_deref();
            let ex = Execute::default();
            match execute_in(&self.server, fed, &call, dc, name, &ex).await {
                Ok(e) => Ok(Some(crate::dns::QueryAnswer {
                    nodes: e.nodes,
                    dns: e.dns,
                    datacenter: e.datacenter,
                })),
                // Not found, refused, or no way there: nothing to answer with.
                Err(
                    Error::NotFound(_)
                    | Error::Forbidden(_)
                    | Error::BadRequest(_)
                    | Error::NoPathToDatacenter,
                ) => Ok(None),
                Err(e) => Err(format!("prepared query {name}: {e}")),
            }
        })
    }
}

/// Query `name` executed in datacenter `dc` (none: this one): here, or by
/// that datacenter's servers (`?stale` if the call is).
pub async fn execute_in(
    s: &Server, fed: Option<&Federation>, call: &Call, dc: Option<&str>, name: &str, ex: &Execute,
) -> Result<Executed> {
    let Some(dc) = dc.filter(|dc| *dc != s.datacenter()) else {
        return execute(s, fed, call, name, ex).await.map(|a| a.value);
    };
    let fed = fed.ok_or(Error::NoPathToDatacenter)?;
    let mut path = format!("/v1/query/{}/execute", crate::request::enc(name));
    if call.opts.stale {
        path.push_str("?stale");
    }
    let req = WanRequest {
        from: s.datacenter().to_string(),
        method: "GET".into(),
        path_and_query: path,
        headers: call
            .token
            .iter()
            .map(|t| ("x-consul-token".to_string(), t.clone()))
            .collect(),
        body: Vec::new(),
    };
    let r = fed
        .forward(dc, req, crate::federation::DNS_TIMEOUT)
        .await
        .map_err(Error::from)?;
    let text = || String::from_utf8_lossy(&r.body).into_owned();
    match r.status {
        200 => serde_json::from_slice(&r.body).map_err(|e| Error::Internal(e.to_string())),
        404 => Err(Error::NotFound(text())),
        403 => Err(Error::Forbidden(text())),
        400..=499 => Err(Error::BadRequest(text())),
        status => Err(Error::Internal(format!(
            "datacenter {dc} answered {status}: {}",
            text()
        ))),
    }
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
