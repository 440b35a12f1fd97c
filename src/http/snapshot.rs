//! `/v1/snapshot`: the whole state as one file (`GET`) and restoring one on
//! the running cluster (`PUT`), `endpoint::snapshot`'s.

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::{App, meta_headers};
use crate::endpoint::snapshot::{self, MAX_SNAPSHOT};
use crate::error::{Error, Result};
use crate::request::QueryOptions;
use crate::request::authz::Authz;

pub fn routes() -> Router<App> {
    Router::new().route("/v1/snapshot", get(save).put(restore))
}

/// `GET /v1/snapshot`: default mode is answered by the leader (forwarded),
/// `?stale` by any server, `?consistent` after a leadership check.
async fn save(State(s): State<App>, a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    let (_, opts) = QueryOptions::parse(q.as_deref(), s.datacenter())?;
    let (index, bytes) = snapshot::save(&s, &a, &opts).await?;
    let mut resp = bytes.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    resp.headers_mut().extend(meta_headers(&s, index));
    Ok(resp)
}

/// `PUT /v1/snapshot`: an upload whose token is checked before its body
/// is read, here and on a follower that passes it on (`forward_upload`).
pub(super) fn is_upload(parts: &axum::http::request::Parts) -> bool {
    parts.method == axum::http::Method::PUT && parts.uri.path() == "/v1/snapshot"
}

/// `PUT /v1/snapshot`: the body is read only once the token is known to
/// hold management rights, then restored (`endpoint::snapshot::restore`).
async fn restore(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery, body: Body,
) -> Result<Response> {
    snapshot::management(&a)?;
    QueryOptions::parse(q.as_deref(), s.datacenter())?;
    let body = axum::body::to_bytes(body, MAX_SNAPSHOT)
        .await
        .map_err(|e| Error::TooLarge(format!("Request body too large or unreadable: {e}")))?;
    snapshot::restore(&s, body).await?;
    Ok(().into_response())
}
