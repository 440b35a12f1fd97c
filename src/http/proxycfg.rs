//! `GET /v1/internal/proxycfg/:proxy-service-id?node=N[&index=X]`: the
//! server-side snapshot of one proxy, blocking until its version passes
//! `index`. Any server answers from its own state.

use crate::request::authz::Authz;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;

use super::{App, Opts, json_at};
use crate::error::{Error, Result};

pub fn routes() -> Router<App> {
    Router::new().route("/v1/internal/proxycfg/{id}", get(snapshot))
}

async fn snapshot(
    State(s): State<App>, a: Authz, Path(id): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    let node = p
        .get("node")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::bad("Missing node parameter"))?
        .to_string();
    let key = (node.clone(), id.clone());
    // A proxy's own token holds `service:write` on it (Consul's check).
    if let Some(svc) = s.store.state().services.get(&key) {
        a.require(a.service_write(&svc.service), "service:write", &svc.service)?;
    }
    let deadline = tokio::time::Instant::now() + opts.wait;
    // A proxy registered a moment ago may not have its first snapshot yet:
    // give it a little time before answering 404.
    let first_by = tokio::time::Instant::now() + Duration::from_secs(2).min(opts.wait);
    let mut rx = loop {
        match s.proxycfg.snapshot(&key) {
            Some(rx) if rx.borrow().is_some() => break rx,
            _ if tokio::time::Instant::now() >= first_by => {
                return Err(Error::NotFound(format!(
                    "Unknown proxy {id:?} on node {node:?}"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    loop {
        let current = rx.borrow_and_update().clone();
        let Some(snap) = current else {
            return Err(Error::NotFound(format!(
                "Proxy {id:?} on node {node:?} was deregistered"
            )));
        };
        if opts.index == 0 || snap.version > opts.index {
            return Ok(json_at(&s, snap.version, &*snap));
        }
        let parked = crate::metrics::BLOCKING_PARKED.hold();
        let changed = tokio::time::timeout_at(deadline, rx.changed()).await;
        drop(parked);
        match changed {
            Ok(Ok(())) => continue,
            // Timed out, or the proxy was torn down.
            Ok(Err(_)) => {
                return Err(Error::NotFound(format!(
                    "Proxy {id:?} on node {node:?} was deregistered"
                )));
            }
            Err(_) => return Ok(json_at(&s, snap.version, &*snap)),
        }
    }
}
