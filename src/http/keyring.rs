//! `/v1/operator/keyring` (Consul's gossip keyring, here the Raft
//! transport's `--encrypt` key): `GET` lists the key every server of this
//! datacenter holds (`keyring:read`), LAN and WAN rings as Consul shows
//! them (the WAN ring counted by this datacenter's servers). Without `--encrypt` there is no keyring and every operation is
//! Consul's 500. Online rotation (`POST` install, `PUT` use, `DELETE`
//! remove, `keyring:write`) is not served yet: refused in one line, and
//! the key changes by restarting the servers with the new `--encrypt`.

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::App;
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use axum::extract::State;

pub fn routes() -> Router<App> {
    Router::new().route(
        "/v1/operator/keyring",
        get(list).post(change).put(change).delete(change),
    )
}

fn no_keyring() -> Error {
    Error::Internal(
        "keyring: this server runs without --encrypt (gossip encryption is not enabled), so it has no keyring"
            .into(),
    )
}

async fn list(State(s): State<App>, a: Authz) -> Result<Response> {
    a.require(a.keyring_read(), "keyring:read", "")?;
    let key = s
        .config()
        .encrypt
        .as_ref()
        .ok_or_else(no_keyring)?
        .to_base64();
    // Every server of the datacenter speaks to the others with it: a
    // server without it could not be a member.
    let servers = s.cluster().members().len();
    let ring = |wan: bool| {
        json!({
            "WAN": wan,
            "Datacenter": s.datacenter(),
            "Segment": "",
            "Keys": { &key: servers },
            "PrimaryKeys": { &key: servers },
            "NumNodes": servers,
        })
    };
    Ok(axum::Json(json!([ring(true), ring(false)])).into_response())
}

async fn change(State(s): State<App>, a: Authz) -> Result<Response> {
    a.require(a.keyring_write(), "keyring:write", "")?;
    s.config().encrypt.as_ref().ok_or_else(no_keyring)?;
    Err(Error::bad(
        "keyring: online key rotation is not supported yet; restart each server with the new --encrypt key",
    ))
}
