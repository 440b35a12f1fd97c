//! `/v1/config` (config entries) and `/v1/discovery-chain`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::{App, Watch, blocking, json_at, meta_headers};
use crate::config_entry::{ConfigEntryError, decode_and_validate};
use crate::discovery_chain::{
    ChainError, CompileOverrides, CompileRequest, EntryChange, compile, validate_write,
};
use crate::error::{Error, Result};
use crate::request::{Params, QueryOptions, decode_json};
use crate::state::{Command, Response as Applied, keys};
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

impl From<ConfigEntryError> for Error {
    fn from(e: ConfigEntryError) -> Self {
        Error::BadRequest(e.to_string())
    }
}

impl From<ChainError> for Error {
    fn from(e: ChainError) -> Self {
        Error::BadRequest(e.to_string())
    }
}

fn parse_kind(kind: &str) -> Result<Kind> {
    kind.parse().map_err(Error::BadRequest)
}

fn bool_answer(r: Applied) -> Result<Response> {
    match r {
        Applied::Bool(b) => Ok(axum::Json(b).into_response()),
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

async fn put_entry(State(s): State<App>, RawQuery(q): RawQuery, body: Bytes) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    QueryOptions::from(&p, &s.config.datacenter)?;
    let body: Value = decode_json(&body)?;
    let entry = decode_and_validate(&body)?;
    // Refuse early what the state machine would refuse; it checks again on
    // the state the write actually lands on.
    validate_write(&*s.store.state(), &EntryChange::Upsert(entry.clone()))?;
    let mut json = entry.to_json();
    if let Value::Object(m) = &mut json {
        m.remove("CreateIndex");
        m.remove("ModifyIndex");
    }
    bool_answer(
        s.write(Command::ConfigSet {
            entry: json,
            cas: p.u64("cas")?,
        })
        .await?,
    )
}

async fn delete_entry(
    State(s): State<App>,
    Path((kind, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    QueryOptions::from(&p, &s.config.datacenter)?;
    let kind = parse_kind(&kind)?;
    validate_write(
        &*s.store.state(),
        &EntryChange::Delete {
            kind,
            name: name.clone(),
        },
    )?;
    let cmd = Command::ConfigDelete {
        kind: kind.as_str().to_string(),
        name,
        cas: p.u64("cas")?,
    };
    bool_answer(s.write(cmd).await?)
}

async fn get_entry(
    State(s): State<App>,
    Path((kind, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let opts = QueryOptions::from(&p, &s.config.datacenter)?;
    let kind = parse_kind(&kind)?;
    let key = keys::config(kind.as_str(), &name);
    let (index, entry) = blocking(&s, &opts, Watch::Keys(vec![key.clone()]), |st| {
        let e = st.config.get(&(kind, name.clone())).map(|e| e.to_json());
        (st.index_of([&key]), e)
    })
    .await?;
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
    State(s): State<App>,
    Path(kind): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let opts = QueryOptions::from(&p, &s.config.datacenter)?;
    let kind = parse_kind(&kind)?;
    let key = keys::config_kind(kind.as_str());
    let (index, list) = blocking(&s, &opts, Watch::Keys(vec![key.clone()]), |st| {
        let list: Vec<Value> = st
            .config
            .range((kind, String::new())..)
            .take_while(|((k, _), _)| *k == kind)
            .map(|(_, e)| e.to_json())
            .collect();
        (st.index_of([&key]), list)
    })
    .await?;
    Ok(json_at(&s, index, &list))
}

/// A chain reads entries of every chain kind and proxy-defaults.
fn chain_keys() -> Vec<crate::state::WatchKey> {
    Kind::ALL
        .iter()
        .map(|k| keys::config_kind(k.as_str()))
        .collect()
}

async fn chain(
    s: App,
    service: String,
    q: Option<String>,
    overrides: CompileOverrides,
) -> Result<Response> {
    let p = Params::parse(q.as_deref());
    let opts = QueryOptions::from(&p, &s.config.datacenter)?;
    let dc = p
        .get("compile-dc")
        .filter(|d| !d.is_empty())
        .unwrap_or(&s.config.datacenter)
        .to_string();
    let watch = chain_keys();
    let trust_domain = format!("{}.consul", s.cluster_id().await?);
    let (index, result) = blocking(&s, &opts, Watch::Keys(watch.clone()), |st| {
        let mut req =
            CompileRequest::new(&service, &dc, &trust_domain).with_overrides(overrides.clone());
        req.server_datacenter = s.config.datacenter.clone();
        (st.index_of(watch.iter()), compile(&req, st))
    })
    .await?;
    let chain = result?;
    Ok(json_at(&s, index, &json!({ "Chain": chain })))
}

async fn chain_get(
    State(s): State<App>,
    Path(service): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response> {
    chain(s, service, q, CompileOverrides::default()).await
}

async fn chain_post(
    State(s): State<App>,
    Path(service): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response> {
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        decode_json(&body)?
    };
    let overrides = CompileOverrides::from_json(&body)?;
    chain(s, service, q, overrides).await
}
