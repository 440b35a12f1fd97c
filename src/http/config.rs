//! `/v1/config` (config entries) and `/v1/discovery-chain`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::{App, Called, Opts, Watch, blocking, json_at, json_filtered, keep, meta_headers};
use crate::discovery_chain::{CompileOverrides, CompileRequest, compile};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::{QueryOptions, decode_json};
use crate::state::keys;
use crate::structs::config_entry::Kind;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/config", axum::routing::put(put_entry))
        .route("/v1/config/{kind}", get(list_entries))
        .route(
            "/v1/config/{kind}/{name}",
            get(get_entry).delete(delete_entry),
        )
        .route(
            "/v1/discovery-chain/{service}",
            get(chain_get).post(chain_post),
        )
}

/// Consul's permissions on config entries: proxy-defaults is read by any
/// token and written with `mesh:write`; the service kinds go with
/// `service:read` / `service:write` on the entry's name.
fn entry_readable(a: &Authz, kind: Kind, name: &str) -> bool {
    crate::config_check::readable(a, kind, name)
}

fn parse_kind(kind: &str) -> Result<Kind> {
    crate::endpoint::config::parse_kind(kind)
}

/// The entry's JSON as sent; decoded, checked and written on the leader
/// (`endpoint::config`).
async fn put_entry(State(s): State<App>, Called(p, call): Called, body: Bytes) -> Result<Response> {
    let entry: Value = decode_json(&body)?;
    let cas = p.u64("cas")?;
    let ok = crate::endpoint::config::set(&s, call, entry, cas).await?;
    Ok(axum::Json(ok).into_response())
}

async fn delete_entry(
    State(s): State<App>, Path((kind, name)): Path<(String, String)>, Called(p, call): Called,
) -> Result<Response> {
    let cas = p.u64("cas")?;
    let ok = crate::endpoint::config::delete(&s, call, kind, name, cas).await?;
    Ok(axum::Json(ok).into_response())
}

async fn get_entry(
    State(s): State<App>, mut a: Authz, Path((kind, name)): Path<(String, String)>,
    Opts(_, opts): Opts,
) -> Result<Response> {
    let kind = parse_kind(&kind)?;
    let readable = |a: &Authz| {
        if entry_readable(a, kind, &name) {
            Ok(())
        } else {
            let permission = crate::config_check::read_permission(kind);
            Err(Error::Forbidden(a.deny(permission, &name).to_string()))
        }
    };
    readable(&a)?;
    let key = keys::config(kind.as_str(), &name);
    let (index, entry) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, _| {
            let e = st.config.get(&(kind, name.clone())).map(|e| e.to_json());
            (st.index_of([&key]), e)
        },
    )
    .await?;
    // Again with the authorizer of the version answered from.
    readable(&a)?;
    match entry {
        Some(e) => Ok(json_at(&s, index, &e)),
        None => Ok((
            StatusCode::NOT_FOUND,
            meta_headers(&s, index),
            format!(
                "Config entry not found for {:?} / {:?}",
                kind.as_str(),
                name
            ),
        )
            .into_response()),
    }
}

async fn list_entries(
    State(s): State<App>, mut a: Authz, Path(kind): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    let kind = parse_kind(&kind)?;
    let key = keys::config_kind(kind.as_str());
    let (index, mut list) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, _| {
            let list: Vec<(String, Value)> = st
                .config
                .range((kind, String::new())..)
                .take_while(|((k, _), _)| *k == kind)
                .map(|((_, name), e)| (name.clone(), e.to_json()))
                .collect();
            (st.index_of([&key]), list)
        },
    )
    .await?;
    let filtered = keep(&mut list, |(name, _)| entry_readable(&a, kind, name));
    let list: Vec<Value> = list.into_iter().map(|(_, e)| e).collect();
    Ok(json_filtered(&s, index, &list, filtered))
}

/// A chain reads entries of every chain kind and proxy-defaults.
fn chain_keys() -> Vec<crate::state::WatchKey> {
    Kind::ALL
        .iter()
        .map(|k| keys::config_kind(k.as_str()))
        .collect()
}

async fn chain(
    s: App, mut a: Authz, service: String, q: Option<String>, overrides: CompileOverrides,
) -> Result<Response> {
    a.require(a.service_read(&service), "service:read", &service)?;
    let (p, opts) = QueryOptions::parse(q.as_deref(), s.datacenter())?;
    let dc = p
        .get("compile-dc")
        .filter(|d| !d.is_empty())
        .unwrap_or(s.datacenter())
        .to_string();
    let mut watch = chain_keys();
    watch.push(keys::virtual_ip(&service));
    let trust_domain = format!("{}.consul", s.cluster_id().await?);
    let (index, result) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, _| {
        let mut req =
            CompileRequest::new(&service, &dc, &trust_domain).with_overrides(overrides.clone());
        req.server_datacenter = s.datacenter().to_owned();
        crate::state::virtual_ip::fill(st, &mut req);
        (st.index_of(watch.iter()), compile(&req, st))
    })
    .await?;
    a.require(a.service_read(&service), "service:read", &service)?;
    let chain = result?;
    Ok(json_at(&s, index, &json!({ "Chain": chain })))
}

async fn chain_get(
    State(s): State<App>, a: Authz, Path(service): Path<String>, RawQuery(q): RawQuery,
) -> Result<Response> {
    chain(s, a, service, q, CompileOverrides::default()).await
}

async fn chain_post(
    State(s): State<App>, a: Authz, Path(service): Path<String>, RawQuery(q): RawQuery, body: Bytes,
) -> Result<Response> {
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        decode_json(&body)?
    };
    let overrides = CompileOverrides::from_json(&body)?;
    chain(s, a, service, q, overrides).await
}
