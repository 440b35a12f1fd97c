//! `/v1/kv` and `/v1/txn` (KV, session, node, service and check operations).

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{App, Called, Opts, answer_headers, answer_json, keep, mark_filtered, meta_headers};
pub use crate::endpoint::kv::MAX_VALUE;
use crate::endpoint::{self, Answer};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::state::kv::read_txn;
use crate::state::{self, Command, Response as Applied, Timeable};
use crate::structs::validate::{check_dc, validate_check, validate_service};
use crate::structs::{CatalogVerb, HealthCheck, KvOp, KvVerb, Node, NodeService, TxnOp, TxnResult};

/// Consul's limit on operations in one transaction.
pub const MAX_TXN_OPS: usize = 128;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/kv", get(get_root).put(put_root).delete(delete_root))
        .route("/v1/kv/", get(get_root).put(put_root).delete(delete_root))
        .route("/v1/kv/{*key}", get(get_kv).put(put_kv).delete(delete_kv))
        .route("/v1/txn", put(txn))
}

async fn get_root(s: State<App>, c: Called) -> Result<Response> {
    get_kv(s, Path(String::new()), c).await
}
async fn put_root(s: State<App>, c: Called, body: Body) -> Result<Response> {
    put_kv(s, Path(String::new()), c, body).await
}
async fn delete_root(s: State<App>, c: Called) -> Result<Response> {
    delete_kv(s, Path(String::new()), c).await
}

/// A 404 that still says whether ACLs hid what was there.
fn not_found<T>(a: &Answer<T>) -> Response {
    (StatusCode::NOT_FOUND, answer_headers(a)).into_response()
}

async fn get_kv(
    State(s): State<App>, Path(key): Path<String>, Called(p, call): Called,
) -> Result<Response> {
    if p.has("keys") {
        let sep = p.get("separator").unwrap_or("").to_string();
        let a = endpoint::kv::keys(&s, call, key, sep).await?;
        if a.value.is_empty() {
            return Ok(not_found(&a));
        }
        return Ok(answer_json(&a));
    }
    let recurse = p.has("recurse");
    let a = endpoint::kv::get(&s, call, key, recurse).await?;
    if a.value.is_empty() {
        return Ok(not_found(&a));
    }
    if p.has("raw") && !recurse {
        let mut resp = a.value[0].value.clone().into_response();
        resp.headers_mut().extend(answer_headers(&a));
        // A writer's bytes, served on the UI's origin: as Consul, a
        // browser that opens them runs nothing (a sandbox without scripts).
        resp.headers_mut().insert(
            axum::http::header::CONTENT_SECURITY_POLICY,
            axum::http::HeaderValue::from_static("sandbox"),
        );
        return Ok(resp);
    }
    Ok(answer_json(&a))
}

async fn put_kv(
    State(s): State<App>, Path(key): Path<String>, Called(p, call): Called, body: Body,
) -> Result<Response> {
    endpoint::kv::refuse_before_value(&s, &call, &key)?;
    let value = axum::body::to_bytes(body, crate::request::MAX_BODY)
        .await
        .map_err(|e| Error::TooLarge(format!("Request body too large or unreadable: {e}")))?;
    let put = endpoint::kv::Put {
        key,
        value: value.to_vec(),
        flags: p.u64("flags")?.unwrap_or(0),
        cas: p.u64("cas")?,
        acquire: p.get("acquire").map(str::to_string),
        release: p.get("release").map(str::to_string),
    };
    Ok(axum::Json(endpoint::kv::put(&s, call, put).await?).into_response())
}

async fn delete_kv(
    State(s): State<App>, Path(key): Path<String>, Called(p, call): Called,
) -> Result<Response> {
    let recurse = p.has("recurse");
    let cas = p.u64("cas")?;
    Ok(axum::Json(endpoint::kv::delete(&s, call, key, recurse, cas).await?).into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct TxnKv {
    verb: String,
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    flags: u64,
    #[serde(default)]
    index: u64,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    partition: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct TxnNode {
    verb: String,
    node: Node,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct TxnService {
    verb: String,
    node: String,
    service: NodeService,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct TxnCheck {
    verb: String,
    check: HealthCheck,
}

fn parse_op<T: serde::de::DeserializeOwned>(i: usize, v: Value) -> Result<T> {
    serde_json::from_value(v)
        .map_err(|e| Error::bad(format!("Failed to parse body: operation {i}: {e}")))
}

fn catalog_verb(i: usize, what: &str, verb: &str) -> Result<CatalogVerb> {
    CatalogVerb::parse(verb)
        .ok_or_else(|| Error::bad(format!("Operation {i}: unknown {what} verb {verb:?}")))
}

/// Decodes and checks a txn body as the single endpoints would: a bad
/// operation refuses the whole txn (400, or 413 for sizes), nothing
/// proposed.
fn decode_txn(body: &[u8], dc: &str) -> Result<Vec<TxnOp>> {
    let ops: Vec<Value> = crate::request::decode_json(body)?;
    if ops.len() > MAX_TXN_OPS {
        return Err(Error::TooLarge(format!(
            "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
            ops.len()
        )));
    }
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.into_iter().enumerate() {
        let Value::Object(m) = op else {
            return Err(Error::bad(format!("Operation {i} is not an object")));
        };
        let mut entries = m.into_iter();
        let (Some((kind, v)), None) = (entries.next(), entries.next()) else {
            return Err(Error::bad(format!(
                "Operation {i} must have exactly one of KV, Node, Service or Check"
            )));
        };
        out.push(match kind.as_str() {
            "KV" => TxnOp::Kv(decode_kv(i, parse_op(i, v)?)?),
            "Node" => decode_node(i, parse_op(i, v)?, dc)?,
            "Service" => decode_service(i, parse_op(i, v)?)?,
            "Check" => decode_check(i, parse_op(i, v)?)?,
            other => {
                return Err(Error::bad(format!(
                    "Operation {i}: unknown operation {other:?} (KV, Node, Service or Check)"
                )));
            }
        });
    }
    Ok(out)
}

fn decode_kv(i: usize, kv: TxnKv) -> Result<KvOp> {
    let verb = KvVerb::parse(&kv.verb)
        .ok_or_else(|| Error::bad(format!("Operation {i}: unknown KV verb {:?}", kv.verb)))?;
    let value = match kv.value {
        Some(v) => base64::engine::general_purpose::STANDARD
            .decode(v.as_bytes())
            .map_err(|e| Error::bad(format!("Operation {i}: Value is not base64: {e}")))?,
        None => Vec::new(),
    };
    if value.len() > MAX_VALUE {
        return Err(Error::TooLarge(format!(
            "Value for key {:?} is too large ({} > {MAX_VALUE} bytes)",
            kv.key,
            value.len()
        )));
    }
    if kv.key.is_empty() && !matches!(verb, KvVerb::GetTree | KvVerb::DeleteTree) {
        return Err(Error::bad(format!("Operation {i}: Missing key name")));
    }
    let _ = (kv.namespace, kv.partition);
    Ok(KvOp {
        verb,
        key: kv.key,
        value,
        flags: kv.flags,
        index: kv.index,
        session: kv.session.unwrap_or_default(),
    })
}

fn decode_node(i: usize, op: TxnNode, dc: &str) -> Result<TxnOp> {
    let verb = catalog_verb(i, "Node", &op.verb)?;
    let mut node = op.node;
    let at = |e: Error| Error::bad(format!("Operation {i}: {e}"));
    if node.node.is_empty()
        && (node.id.is_empty() || matches!(verb, CatalogVerb::Set | CatalogVerb::Cas))
    {
        return Err(at(Error::bad("Must provide node")));
    }
    if matches!(verb, CatalogVerb::Set | CatalogVerb::Cas) {
        check_dc(&node.datacenter, dc).map_err(at)?;
        node.datacenter = dc.to_string();
        if node.address.is_empty() {
            return Err(at(Error::bad("Must provide address")));
        }
    }
    Ok(TxnOp::Node { verb, node })
}

fn decode_service(i: usize, op: TxnService) -> Result<TxnOp> {
    let verb = catalog_verb(i, "Service", &op.verb)?;
    let at = |e: Error| Error::bad(format!("Operation {i}: {e}"));
    if op.node.is_empty() {
        return Err(at(Error::bad("Must provide node")));
    }
    if matches!(verb, CatalogVerb::Set | CatalogVerb::Cas) {
        validate_service(&op.service).map_err(at)?;
    } else if op.service.id.is_empty() && op.service.service.is_empty() {
        return Err(at(Error::bad("Must provide service ID")));
    }
    Ok(TxnOp::Service {
        verb,
        node: op.node,
        service: op.service,
    })
}

fn decode_check(i: usize, op: TxnCheck) -> Result<TxnOp> {
    let verb = catalog_verb(i, "Check", &op.verb)?;
    let at = |e: Error| Error::bad(format!("Operation {i}: {e}"));
    let mut check = op.check;
    if check.node.is_empty() {
        return Err(at(Error::bad("Must provide node")));
    }
    if check.check_id.is_empty() {
        check.check_id = check.name.clone();
    }
    if check.check_id.is_empty() {
        return Err(at(Error::bad("Must provide a CheckID or Name for checks")));
    }
    if matches!(verb, CatalogVerb::Set | CatalogVerb::Cas) {
        let node = check.node.clone();
        validate_check(&check, &node).map_err(at)?;
    }
    Ok(TxnOp::Check { verb, check })
}

/// Whether a txn body holds reads only (the forwarding layer lets such a
/// txn with `?stale` be answered by any server, as Consul does).
pub(super) fn read_only(body: &[u8], dc: &str) -> bool {
    decode_txn(body, dc).is_ok_and(|ops| ops.iter().all(TxnOp::is_read))
}

/// Every operation of a txn is checked before any runs (one refused
/// refuses the txn), as Consul checks them: reads (`get`, `get-tree`, and
/// the catalog's `get`) are not refused but filtered from the results
/// (`filter_results`); `check-index` and `check-session` need `key:read`
/// (their outcome tells of the key); `delete-tree` needs write on the
/// whole prefix; every other KV verb, `check-not-exists` included, needs
/// `key:write`; a service write, what a catalog registration of it needs
/// (`NodeService::authorize_write`).
fn authorize_txn(a: &Authz, st: &state::State, ops: &[TxnOp]) -> Result<()> {
    for op in ops {
        match op {
            TxnOp::Kv(op) => match op.verb {
                KvVerb::Get | KvVerb::GetTree => {}
                KvVerb::DeleteTree => {
                    a.require(a.key_write_prefix(&op.key), "key:write", &op.key)?
                }
                KvVerb::CheckIndex | KvVerb::CheckSession => {
                    a.require(a.key_read(&op.key), "key:read", &op.key)?
                }
                _ => a.require(a.key_write(&op.key), "key:write", &op.key)?,
            },
            TxnOp::Node { verb, .. } | TxnOp::Service { verb, .. } | TxnOp::Check { verb, .. }
                if verb.is_read() => {}
            TxnOp::Node { node, .. } => {
                a.require(a.node_write(&node.node), "node:write", &node.node)?
            }
            // Catalog registration's rule: a set or delete by ID also
            // needs write on the instance already there under that ID.
            TxnOp::Service { node, service, .. } => {
                let id = if service.id.is_empty() {
                    &service.service
                } else {
                    &service.id
                };
                let replaced = st.services.get(&(node.clone(), id.clone()));
                service.authorize_write(a, replaced.map(|r| r.service.as_str()))?
            }
            TxnOp::Check { check, .. } => authorize_txn_check(a, st, check)?,
        }
    }
    Ok(())
}

/// A check set or deleted by a txn, judged by what the state holds rather
/// than the names the body gives (as a registration's checks are): write
/// on the service of its `ServiceID` (`node:write` for a node check), and
/// on the service of the check it replaces under the same ID.
fn authorize_txn_check(a: &Authz, st: &state::State, check: &HealthCheck) -> Result<()> {
    let service_of = |id: &str, named: &str| {
        st.services
            .get(&(check.node.clone(), id.to_string()))
            .map_or_else(|| named.to_string(), |s| s.service.clone())
    };
    let replaced = st
        .checks
        .get(&(check.node.clone(), check.check_id.clone()))
        .filter(|c| !c.service_id.is_empty())
        .map(|c| service_of(&c.service_id, &c.service_name));
    if check.service_id.is_empty() {
        a.require(a.node_write(&check.node), "node:write", &check.node)?;
    } else {
        let name = service_of(&check.service_id, &check.service_name);
        a.require(a.service_write(&name), "service:write", &name)?;
    }
    match replaced {
        Some(name) => a.require(a.service_write(&name), "service:write", &name),
        None => Ok(()),
    }
}

/// Drops the results the caller may not read (Consul filters a txn's
/// reads on the output side); says whether any was dropped.
fn filter_results(a: &Authz, results: &mut Vec<TxnResult>) -> bool {
    keep(results, |r| match r {
        TxnResult::Kv(e) => a.key_read(&e.key),
        TxnResult::Node(n) => a.node_read(&n.node),
        TxnResult::Service(x) => a.service_read(&x.service),
        TxnResult::Check(c) => {
            a.node_read(&c.node) && (c.service_name.is_empty() || a.service_read(&c.service_name))
        }
    })
}

async fn txn(State(s): State<App>, a: Authz, Opts(_, opts): Opts, body: Bytes) -> Result<Response> {
    let ops = decode_txn(&body, s.datacenter())?;
    authorize_txn(&a, &s.state(), &ops)?;
    // Reads only: answered from this server's state without Raft, in the
    // request's consistency mode (Consul's fast path).
    if ops.iter().all(TxnOp::is_read) {
        if opts.consistent {
            s.linearize().await?;
        }
        let st = s.state();
        let mut resp = answer(&a, read_txn(&st, &ops))?;
        resp.headers_mut().extend(meta_headers(&s, st.index));
        return Ok(resp);
    }
    let lock = ops
        .iter()
        .any(|op| matches!(op, TxnOp::Kv(op) if op.verb == KvVerb::Lock));
    let cmd = if lock {
        s.sessions().timed(Timeable::Txn(ops))
    } else {
        Command::Txn(ops)
    };
    answer(&a, s.write(cmd).await?)
}

/// Consul's txn answer: 200 with the results the caller may read (marked
/// when some were dropped), or 409 with the errors of a txn rolled back.
fn answer(a: &Authz, r: Applied) -> Result<Response> {
    match r {
        Applied::Txn(Ok(mut results)) => {
            let filtered = filter_results(a, &mut results);
            let mut resp =
                axum::Json(json!({ "Results": results, "Errors": null })).into_response();
            if filtered {
                mark_filtered(&mut resp);
            }
            Ok(resp)
        }
        Applied::Txn(Err(errors)) => Ok((
            StatusCode::CONFLICT,
            axum::Json(json!({ "Results": null, "Errors": errors })),
        )
            .into_response()),
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}
