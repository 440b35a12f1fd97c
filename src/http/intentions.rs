//! The legacy intentions API mapped onto `service-intentions` entries as
//! Consul 1.9+ does (`/v1/connect/intentions`, `/exact`, `/match`,
//! `/check`), and `POST /v1/agent/connect/authorize`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{App, Opts, Watch, blocking, json_at, json_filtered, keep};
use crate::connect::intentions::{self, default_allow};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::{Params, decode_json};
use crate::state::{Command, Response as Applied, keys};
use crate::structs::config_entry::{ConfigEntry, Kind};
use crate::structs::connect::Intention;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/connect/intentions", get(list).post(create))
        .route(
            "/v1/connect/intentions/exact",
            get(get_exact).put(put_exact).delete(delete_exact),
        )
        .route("/v1/connect/intentions/match", get(match_))
        .route("/v1/connect/intentions/check", get(check))
        // By the ID a legacy create answered (Terraform's `consul_intention`).
        .route(
            "/v1/connect/intentions/{id}",
            get(get_by_id).put(put_by_id).delete(delete_by_id),
        )
        // POST as Consul documents it; PUT as py-consul sends it.
        .route(
            "/v1/agent/connect/authorize",
            post(authorize).put(authorize),
        )
}

fn kind_key() -> crate::state::WatchKey {
    keys::config_kind(Kind::ServiceIntentions.as_str())
}

fn required<'a>(p: &'a Params, name: &str, what: &str) -> Result<&'a str> {
    p.get(name).filter(|v| !v.is_empty()).ok_or_else(|| {
        Error::bad(format!(
            "required query parameter '{name}' not set ({what})"
        ))
    })
}

/// A source or destination name: one service or `*`.
fn check_name(what: &str, name: &str) -> Result<()> {
    if name != "*" && name.contains('*') {
        return Err(Error::bad(format!(
            "{what}: wildcard character '*' cannot be used with partial values"
        )));
    }
    if name.contains('/') {
        return Err(Error::bad(format!(
            "{what} {name:?}: namespaces and partitions are not served"
        )));
    }
    Ok(())
}

async fn list(State(s): State<App>, mut a: Authz, Opts(_, opts): Opts) -> Result<Response> {
    let key = kind_key();
    let (index, list) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, a| {
            let mut list = intentions::all(st);
            let filtered = keep(&mut list, |i| a.intention_read(&i.destination_name));
            (st.index_of([&key]), (list, filtered))
        },
    )
    .await?;
    Ok(json_filtered(&s, index, &list.0, list.1))
}

/// A legacy body: an `Intention` (unknown keys refused as Consul's decoder).
fn decode_intention(body: &[u8]) -> Result<Intention> {
    let v: Value = decode_json(body)?;
    serde_json::from_value(v).map_err(|e| Error::bad(format!("Request decode failed: {e}")))
}

/// Writes `intention` (its source replacing the same-named one) into its
/// destination's entry; retried on a racing change of that entry.
async fn write_source(s: &App, intention: &Intention, legacy_id: &str) -> Result<()> {
    check_name("SourceName", &intention.source_name)?;
    check_name("DestinationName", &intention.destination_name)?;
    if intention.source_name.is_empty() || intention.destination_name.is_empty() {
        return Err(Error::bad("SourceName and DestinationName are required"));
    }
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    for _ in 0..5 {
        let state = s.state();
        let existing = state
            .config
            .get(&(Kind::ServiceIntentions, intention.destination_name.clone()))
            .cloned();
        let current = existing.as_deref().and_then(ConfigEntry::as_intentions);
        let body = intentions::upsert_source(current, intention, legacy_id, &now);
        // Checked here for a clear 400 before proposing (apply checks again).
        let entry = crate::config_check::decode_and_validate(&body)?;
        crate::discovery_chain::validate_write(
            &*state,
            &crate::discovery_chain::EntryChange::Upsert(entry),
        )?;
        let cas = Some(current.map_or(0, |e| e.modify_index));
        match s.write(Command::ConfigSet { entry: body, cas }).await? {
            Applied::Bool(true) => return Ok(()),
            Applied::Bool(false) => continue,
            Applied::Rejected(r) => return Err(Error::BadRequest(r)),
            other => return Err(Error::Internal(format!("unexpected answer {other:?}"))),
        }
    }
    Err(Error::Busy(
        "the intentions kept changing; try again".into(),
    ))
}

/// `POST /v1/connect/intentions`: a new intention with a legacy ID.
async fn create(State(s): State<App>, a: Authz, _: Opts, body: Bytes) -> Result<Response> {
    let ixn = decode_intention(&body)?;
    require_write(&a, &ixn.destination_name)?;
    if !ixn.id.is_empty() {
        return Err(Error::bad("ID must be empty"));
    }
    if intentions::matching(&s.state(), &ixn.source_name, &ixn.destination_name).is_some_and(|m| {
        m.source_name == ixn.source_name && m.destination_name == ixn.destination_name
    }) {
        return Err(Error::bad(format!(
            "duplicate intention found: {} => {}",
            ixn.source_name, ixn.destination_name
        )));
    }
    let id = uuid::Uuid::new_v4().to_string();
    write_source(&s, &ixn, &id).await?;
    Ok(axum::Json(json!({ "ID": id })).into_response())
}

/// Writing intentions towards `destination` (Consul's `intention:write`).
fn require_write(a: &Authz, destination: &str) -> Result<()> {
    a.require(
        a.intention_write(destination),
        "intention:write",
        destination,
    )
}

fn exact_pair(p: &Params) -> Result<(String, String)> {
    let src = required(p, "source", "the source service")?.to_string();
    let dst = required(p, "destination", "the destination service")?.to_string();
    check_name("source", &src)?;
    check_name("destination", &dst)?;
    Ok((src, dst))
}

async fn get_exact(State(s): State<App>, mut a: Authz, Opts(p, opts): Opts) -> Result<Response> {
    let (src, dst) = exact_pair(&p)?;
    a.require(a.intention_read(&dst), "intention:read", &dst)?;
    let key = keys::config(Kind::ServiceIntentions.as_str(), &dst);
    let (index, found) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, _| {
            let found = intentions::for_destination(st, &dst)
                .into_iter()
                .find(|i| i.source_name == src && i.destination_name == dst);
            (st.index_of([&key]), found)
        },
    )
    .await?;
    a.require(a.intention_read(&dst), "intention:read", &dst)?;
    match found {
        Some(i) => Ok(json_at(&s, index, &i)),
        None => Err(Error::NotFound("Intention not found".into())),
    }
}

/// `PUT /v1/connect/intentions/exact`: upsert by name (source and
/// destination from the query win over the body's).
async fn put_exact(
    State(s): State<App>, a: Authz, Opts(p, _): Opts, body: Bytes,
) -> Result<Response> {
    let (src, dst) = exact_pair(&p)?;
    require_write(&a, &dst)?;
    let mut ixn = decode_intention(&body)?;
    ixn.source_name = src;
    ixn.destination_name = dst;
    write_source(&s, &ixn, "").await?;
    Ok(axum::Json(true).into_response())
}

async fn delete_exact(State(s): State<App>, a: Authz, Opts(p, _): Opts) -> Result<Response> {
    let (src, dst) = exact_pair(&p)?;
    require_write(&a, &dst)?;
    remove_source(&s, &dst, |x| x.name == src).await?;
    Ok(axum::Json(true).into_response())
}

/// Takes the source `which` picks out of `dst`'s entry (the entry with
/// it when it was the last); 404 when there is none. Retried on a racing
/// change of that entry.
async fn remove_source(
    s: &App, dst: &str, which: impl Fn(&crate::structs::config_entry::SourceIntention) -> bool,
) -> Result<()> {
    for _ in 0..5 {
        let state = s.state();
        let existing = state
            .config
            .get(&(Kind::ServiceIntentions, dst.to_string()))
            .cloned();
        let Some(current) = existing.as_deref().and_then(ConfigEntry::as_intentions) else {
            return Err(Error::NotFound("Intention not found".into()));
        };
        if !current.sources.iter().any(&which) {
            return Err(Error::NotFound("Intention not found".into()));
        }
        let mut next = current.clone();
        next.sources.retain(|x| !which(x));
        let cas = Some(current.modify_index);
        let cmd = if next.sources.is_empty() {
            Command::ConfigDelete {
                kind: Kind::ServiceIntentions.as_str().into(),
                name: dst.to_string(),
                cas,
            }
        } else {
            Command::ConfigSet {
                entry: intentions::entry_body(&next),
                cas,
            }
        };
        match s.write(cmd).await? {
            Applied::Bool(true) => return Ok(()),
            Applied::Bool(false) => continue,
            Applied::Rejected(r) => return Err(Error::BadRequest(r)),
            other => return Err(Error::Internal(format!("unexpected answer {other:?}"))),
        }
    }
    Err(Error::Busy(
        "the intentions kept changing; try again".into(),
    ))
}

/// The intention a legacy create named `id`, as it is in `st`.
fn by_id(st: &crate::state::State, id: &str) -> Option<Intention> {
    intentions::all(st).into_iter().find(|i| i.id == id)
}

/// `GET /v1/connect/intentions/:id`: `intention:read` on its destination;
/// an ID no intention has is Consul's 404.
async fn get_by_id(
    State(s): State<App>, mut a: Authz, Path(id): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    let key = kind_key();
    let (index, found) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, _| (st.index_of([&key]), by_id(st, &id)),
    )
    .await?;
    let found = found.ok_or_else(|| Error::NotFound("Intention not found".into()))?;
    a.require(
        a.intention_read(&found.destination_name),
        "intention:read",
        &found.destination_name,
    )?;
    Ok(json_at(&s, index, &found))
}

/// `PUT /v1/connect/intentions/:id`: the intention replaced, keeping its
/// ID; moved to another source or destination, it leaves the old pair
/// (write on both destinations needed).
async fn put_by_id(
    State(s): State<App>, a: Authz, Path(id): Path<String>, _: Opts, body: Bytes,
) -> Result<Response> {
    let mut ixn = decode_intention(&body)?;
    if !ixn.id.is_empty() && ixn.id != id {
        return Err(Error::bad("ID in the body does not match the URL"));
    }
    ixn.id.clear();
    let old =
        by_id(&s.state(), &id).ok_or_else(|| Error::bad("Cannot modify non-existent intention"))?;
    require_write(&a, &old.destination_name)?;
    require_write(&a, &ixn.destination_name)?;
    let moved = old.source_name != ixn.source_name || old.destination_name != ixn.destination_name;
    if moved {
        if intentions::matching(&s.state(), &ixn.source_name, &ixn.destination_name).is_some_and(
            |m| m.source_name == ixn.source_name && m.destination_name == ixn.destination_name,
        ) {
            return Err(Error::bad(format!(
                "duplicate intention found: {} => {}",
                ixn.source_name, ixn.destination_name
            )));
        }
        write_source(&s, &ixn, &id).await?;
        remove_source(&s, &old.destination_name, |x| {
            x.legacy_id == id && x.name == old.source_name
        })
        .await?;
    } else {
        write_source(&s, &ixn, &id).await?;
    }
    Ok(axum::http::StatusCode::OK.into_response())
}

/// `DELETE /v1/connect/intentions/:id`.
async fn delete_by_id(
    State(s): State<App>, a: Authz, Path(id): Path<String>, _: Opts,
) -> Result<Response> {
    let old =
        by_id(&s.state(), &id).ok_or_else(|| Error::NotFound("Intention not found".into()))?;
    require_write(&a, &old.destination_name)?;
    remove_source(&s, &old.destination_name, |x| x.legacy_id == id).await?;
    Ok(axum::Json(true).into_response())
}

/// `GET /v1/connect/intentions/match?by=source|destination&name=N`:
/// `{N: [intentions in evaluation order]}`.
async fn match_(State(s): State<App>, mut a: Authz, Opts(p, opts): Opts) -> Result<Response> {
    let by = required(&p, "by", "source or destination")?.to_string();
    if by != "source" && by != "destination" {
        return Err(Error::bad(format!(
            "'by' parameter must be one of 'source' or 'destination', got {by:?}"
        )));
    }
    let names: Vec<String> = p
        .all("name")
        .into_iter()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    if names.is_empty() {
        return Err(Error::bad("required query parameter 'name' not set"));
    }
    for n in &names {
        check_name("name", n)?;
    }
    let key = kind_key();
    let (index, out) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, a| {
            let mut out = serde_json::Map::new();
            let mut filtered = false;
            for n in &names {
                let mut list = if by == "source" {
                    intentions::for_source(st, n)
                } else {
                    intentions::for_destination(st, n)
                };
                filtered |= keep(&mut list, |i| a.intention_read(&i.destination_name));
                out.insert(n.clone(), serde_json::to_value(list).unwrap_or_default());
            }
            (st.index_of([&key]), (Value::Object(out), filtered))
        },
    )
    .await?;
    Ok(json_filtered(&s, index, &out.0, out.1))
}

/// `GET /v1/connect/intentions/check?source=&destination=`: `{"Allowed"}`.
async fn check(State(s): State<App>, mut a: Authz, Opts(p, opts): Opts) -> Result<Response> {
    let (src, dst) = exact_pair(&p)?;
    // Consul's: the caller may read the destination service.
    a.require(a.service_read(&dst), "service:read", &dst)?;
    let key = kind_key();
    let (index, allowed) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![key.clone()]),
        |st, _| {
            let (allowed, _) =
                intentions::authorize(st, &src, &dst, default_allow(&s.config().acl));
            (st.index_of([&key]), allowed)
        },
    )
    .await?;
    a.require(a.service_read(&dst), "service:read", &dst)?;
    Ok(json_at(&s, index, &json!({ "Allowed": allowed })))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AuthorizeRequest {
    #[serde(default)]
    target: String,
    #[serde(default, rename = "ClientCertURI")]
    client_cert_uri: String,
    #[serde(default)]
    #[allow(dead_code)] // accepted as Consul's body has it; not checked
    client_cert_serial: String,
}

/// `POST /v1/agent/connect/authorize`: may the service named by the
/// client certificate's SPIFFE ID connect to `Target`?
async fn authorize(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    let req: AuthorizeRequest = decode_json(&body)?;
    if req.target.is_empty() {
        return Err(Error::bad("Target service must be specified"));
    }
    // Consul's: only the target service's own token may ask.
    a.require(a.service_write(&req.target), "service:write", &req.target)?;
    if req.client_cert_uri.is_empty() {
        return Err(Error::bad("ClientCertURI must be specified"));
    }
    let source = parse_service_uri(&req.client_cert_uri)?;
    let state = s.state();
    let (authorized, reason) =
        intentions::authorize(&state, &source, &req.target, default_allow(&s.config().acl));
    let index = state.index_of([&kind_key()]);
    Ok(json_at(
        &s,
        index,
        &json!({ "Authorized": authorized, "Reason": reason }),
    ))
}

/// The service of a SPIFFE service ID
/// (`spiffe://<td>/ns/<ns>/dc/<dc>/svc/<name>`).
fn parse_service_uri(uri: &str) -> Result<String> {
    let path = uri
        .strip_prefix("spiffe://")
        .and_then(|rest| rest.split_once('/'))
        .map(|(_, path)| path)
        .ok_or_else(|| Error::bad("ClientCertURI not a valid Connect identifier"))?;
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["ns", _, "dc", _, "svc", name] if !name.is_empty() => Ok(name.to_string()),
        ["ap", _, "ns", _, "dc", _, "svc", name] if !name.is_empty() => Ok(name.to_string()),
        _ => Err(Error::bad("ClientCertURI not a valid Service identifier")),
    }
}
