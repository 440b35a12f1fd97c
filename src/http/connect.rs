//! `/v1/connect/ca/*` (roots, configuration), the server agent's leaf
//! endpoint (`/v1/agent/connect/ca/leaf/:service`), the internal sign
//! endpoint client agents send their CSRs to (the key stays with them), and
//! on the primary the one a secondary's leader sends its intermediate's CSR
//! to (`SIGN_INTERMEDIATE_PATH`: only over the WAN transport, only from
//! another datacenter's server).
//!
//! In a secondary a configuration PUT keeps the primary's roots (only its
//! own settings change). The intermediate's endpoint is answered by any of
//! the primary's servers, never forwarded to the leader: the WAN frame's
//! mark, which alone lets a server ask, would not survive the hop.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::Value;

use super::{App, Opts, Watch, blocking, json_at, meta_headers};
use crate::connect::{SIGN_INTERMEDIATE_PATH, SIGN_PATH, ca};
use crate::error::{Error, Result};
use crate::federation::{Forwarded, ReplicationPull};
use crate::request::authz::Authz;
use crate::request::{QueryOptions, decode_json};
use crate::state::{Command, Response as Applied, keys};
use crate::structs::connect::{CaConfiguration, SignedIntermediate};

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/connect/ca/roots", get(roots))
        .route("/v1/agent/connect/ca/roots", get(roots))
        .route(
            "/v1/connect/ca/configuration",
            get(get_config).put(put_config),
        )
        .route("/v1/agent/connect/ca/leaf/{*service}", get(leaf))
        .route(SIGN_PATH, post(sign).put(sign))
        .route(SIGN_INTERMEDIATE_PATH, post(sign_intermediate))
}

/// The CA exists from the first leader's first duties on; a read before
/// waits for it as for the cluster id.
async fn ca_ready(s: &App) -> Result<()> {
    s.cluster_id().await?;
    let deadline = tokio::time::Instant::now() + crate::server::LEADER_HOLD;
    let mut rx = s.watches().subscribe(&keys::CONNECT_CA);
    while s.state().connect_ca.is_none() {
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            return Err(Error::Internal(
                "the Connect CA is not initialized yet".into(),
            ));
        }
    }
    Ok(())
}

async fn roots(State(s): State<App>, Opts(p, opts): Opts) -> Result<Response> {
    ca_ready(&s).await?;
    let (index, roots) = blocking(
        &s,
        &opts,
        &mut Authz::open(),
        Watch::Keys(vec![keys::CONNECT_CA]),
        |st, _| {
            (
                st.index_of([&keys::CONNECT_CA]),
                crate::state::connect::roots(st).unwrap_or_default(),
            )
        },
    )
    .await?;
    if p.get("pem").is_some_and(|v| matches!(v, "" | "true" | "1")) {
        // Every root and what chains to it, as Consul's `?pem=true`.
        let mut pem = String::new();
        for r in &roots.roots {
            for c in std::iter::once(&r.root_cert).chain(&r.intermediate_certs) {
                pem.push_str(c.trim_end());
                pem.push('\n');
            }
        }
        let mut resp = pem.into_response();
        resp.headers_mut().extend(meta_headers(&s, index));
        resp.headers_mut().insert(
            "content-type",
            axum::http::HeaderValue::from_static("application/pem-certificate-chain"),
        );
        return Ok(resp);
    }
    Ok(json_at(&s, index, &roots))
}

async fn get_config(State(s): State<App>, mut a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    a.require(a.operator_read(), "operator:read", "")?;
    let (_, opts) = QueryOptions::parse(q.as_deref(), s.datacenter())?;
    ca_ready(&s).await?;
    let (index, config) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![keys::CONNECT_CA]),
        |st, _| {
            let mut c = st
                .connect_ca
                .as_ref()
                .map(|c| c.config.clone())
                .unwrap_or_default();
            // An operator's key is never shown back.
            c.config.remove("PrivateKey");
            (st.index_of([&keys::CONNECT_CA]), c)
        },
    )
    .await?;
    a.require(a.operator_read(), "operator:read", "")?;
    Ok(json_at(&s, index, &config))
}

async fn put_config(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery, body: Bytes,
) -> Result<Response> {
    a.require(a.operator_write(), "operator:write", "")?;
    QueryOptions::parse(q.as_deref(), s.datacenter())?;
    let body: Value = decode_json(&body)?;
    let body: CaConfiguration = serde_json::from_value(body)
        .map_err(|e| Error::bad(format!("Request decode failed: {e}")))?;
    // Checked before the CA exists too, so bad input is a 400 at once.
    ca::normalize(body.clone())?;
    ca_ready(&s).await?;
    // A racing change (another PUT) makes the write's CAS fail: build the
    // new CA again on the state it lost to.
    for _ in 0..5 {
        let state = s.state();
        let Some(current) = state.connect_ca.clone() else {
            return Err(Error::Internal(
                "the Connect CA is not initialized yet".into(),
            ));
        };
        let trust_domain = format!("{}.consul", state.cluster_id);
        // A new root's key (RSA: up to seconds) is made off the async
        // workers, here on the leader, and only the result is proposed. A
        // secondary's roots are the primary's: only its settings change
        // here (a new key type gets a new intermediate from the primary).
        let (cur, b) = (current.clone(), body.clone());
        let secondary = s.config().primary() != s.datacenter();
        let next = crate::tasks::off_workers(move || match secondary {
            true => ca::reconfigure_secondary(&cur, b),
            false => ca::reconfigure(&cur, b, &trust_domain),
        })
        .await
        .map_err(|e| Error::Internal(format!("CA reconfigure: {e}")))??;
        let cmd = Command::CaSet {
            ca: Box::new(next),
            cas: Some(current.config.modify_index),
        };
        match s.write(cmd).await? {
            Applied::Bool(true) => return Ok(axum::Json(Value::Null).into_response()),
            Applied::Bool(false) => continue,
            Applied::Rejected(r) => return Err(Error::BadRequest(r)),
            other => return Err(Error::Internal(format!("unexpected answer {other:?}"))),
        }
    }
    Err(Error::Busy(
        "the CA configuration kept changing; try again".into(),
    ))
}

/// `GET /v1/agent/connect/ca/leaf/:service` on a server: signed here,
/// blocking on `?index` until a new leaf (after a rotation, or renewal).
async fn leaf(
    State(s): State<App>, mut a: Authz, Path(service): Path<String>, RawQuery(q): RawQuery,
) -> Result<Response> {
    a.require(a.service_write(&service), "service:write", &service)?;
    let (_, opts) = QueryOptions::parse(q.as_deref(), s.datacenter())?;
    crate::connect::check_service_name(&service)?;
    ca_ready(&s).await?;
    // A read that may wait holds a place among the blocking queries.
    let _permit = match opts.index {
        0 => None,
        _ => Some(s.blocking_permit(&a)?),
    };
    let deadline = opts.deadline();
    let mut rx = s.watches().subscribe(&keys::CONNECT_CA);
    loop {
        let state = s.state();
        // A token deleted or narrowed while the read waited gets no leaf.
        super::recheck(&s, &mut a, &state)?;
        a.require(a.service_write(&service), "service:write", &service)?;
        // Signing may make a key (RSA: up to seconds): off the workers.
        let (s2, svc) = (s.clone(), service.clone());
        let cert =
            crate::tasks::off_workers(move || s2.leaves().get(&state, s2.datacenter(), &svc))
                .await
                .map_err(|e| Error::Internal(format!("leaf: {e}")))??;
        let now = tokio::time::Instant::now();
        if opts.index == 0 || cert.modify_index > opts.index || now >= deadline {
            return Ok(json_at(&s, cert.modify_index, &*cert));
        }
        // Wake on a CA change, at the leaf's renewal time, or at the end.
        let until_renew = (ca::renew_at(&cert) - time::OffsetDateTime::now_utc())
            .try_into()
            .unwrap_or(std::time::Duration::ZERO);
        let wake = deadline.min(now + until_renew);
        let _parked = crate::metrics::BLOCKING_PARKED.hold();
        let _ = tokio::time::timeout_at(wake, rx.changed()).await;
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SignRequest {
    #[serde(rename = "CSR")]
    csr: String,
}

/// A client agent's CSR, signed with the active root (the key never
/// leaves the agent).
async fn sign(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    let req: SignRequest = decode_json(&body)?;
    ca_ready(&s).await?;
    let state = s.state();
    let ca = state
        .connect_ca
        .as_ref()
        .ok_or_else(|| Error::Internal("the Connect CA is not initialized yet".into()))?;
    let trust_domain = format!("{}.consul", state.cluster_id);
    let csr = ca::parse_csr(&req.csr, &trust_domain, s.datacenter())?;
    // The CSR names the service: only its writers get a certificate.
    a.require(a.service_write(&csr.service), "service:write", &csr.service)?;
    let cert = ca::sign_csr(ca, &trust_domain, csr)?;
    Ok(json_at(&s, state.index, &cert))
}

/// A secondary datacenter's intermediate CA, signed here by the active
/// root. An intermediate lets its holder mint any identity of the trust
/// domain, so no client may ask, whatever its token: only a request a
/// server of another datacenter sent itself over the authenticated WAN
/// transport (`ReplicationPull`, set from that frame's own mark, never from
/// a client's header; a client's `?dc=` never reaches this path:
/// `http::wan::local_only`).
async fn sign_intermediate(
    State(s): State<App>, pull: Option<axum::Extension<ReplicationPull>>,
    from: Option<axum::Extension<Forwarded>>, body: Bytes,
) -> Result<Response> {
    let from = match (pull, from) {
        (Some(_), Some(axum::Extension(f))) if f.from != s.datacenter() => f.from,
        _ => {
            return Err(Error::Forbidden(
                "Permission denied: only another datacenter's servers may ask for an intermediate CA"
                    .into(),
            ));
        }
    };
    if s.config().primary() != s.datacenter() {
        return Err(Error::bad(format!(
            "datacenter {} is not the primary ({}): only the primary signs intermediates",
            s.datacenter(),
            s.config().primary()
        )));
    }
    let req: SignRequest = decode_json(&body)?;
    ca_ready(&s).await?;
    let state = s.state();
    let ca = state
        .connect_ca
        .clone()
        .ok_or_else(|| Error::Internal("the Connect CA is not initialized yet".into()))?;
    let trust_domain = format!("{}.consul", state.cluster_id);
    let root_id = ca.active().map(|r| r.root.id.clone()).unwrap_or_default();
    // An RSA signature is quick, but parsing and signing stay off the
    // workers as every CA operation here does.
    let cert = crate::tasks::off_workers(move || {
        ca::sign_intermediate(&ca, &trust_domain, &from, &req.csr)
    })
    .await
    .map_err(|e| Error::Internal(format!("sign intermediate: {e}")))??;
    let out = SignedIntermediate {
        intermediate_cert: cert,
        root_id,
    };
    Ok(json_at(&s, state.index, &out))
}
