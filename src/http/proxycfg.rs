//! `GET /v1/internal/proxycfg/:proxy-service-id?node=N[&index=X]`: the
//! server-side snapshot of one proxy, blocking until its version passes
//! `index`. Any server answers from its own state.
//!
//! Who may have a proxy's config, and what of its endpoints the token
//! sees, is `endpoint::proxycfg`'s, as for the xDS streams.

use crate::acl::Authorizer;
use crate::endpoint::proxycfg::{Refused, may_watch, reader};
use crate::proxycfg::Snapshot;
use crate::request::authz::Authz;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;

use super::{App, Opts, json_at};
use crate::error::{Error, Result};

pub fn routes() -> Router<App> {
    Router::new().route("/v1/internal/proxycfg/{*id}", get(snapshot))
}

/// `may_watch` as the HTTP answer: 403, or 404 for an unknown proxy.
fn require_watch(a: &Authorizer, node: &str, id: &str, service: Option<&str>) -> Result<()> {
    may_watch(a, id, service).map_err(|r| match r {
        Refused::Denied(why) => Error::Forbidden(why),
        Refused::Unknown => Error::NotFound(format!("Unknown proxy {id:?} on node {node:?}")),
    })
}

async fn snapshot(
    State(s): State<App>, mut a: Authz, Path(id): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    let node = p
        .get("node")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::bad("Missing node parameter"))?
        .to_string();
    let key = (node.clone(), id.clone());
    // Checked before anything is looked up: a token that may not watch the
    // proxy learns nothing of it, not even whether it exists.
    let destination = |st: &crate::state::State| {
        st.services
            .get(&key)
            .map(|svc| svc.proxy.destination_service_name.clone())
    };
    // (An unknown one the caller may hear of gets a moment to appear.)
    match may_watch(&a, &id, destination(&s.state()).as_deref()) {
        Ok(()) | Err(Refused::Unknown) => {}
        Err(Refused::Denied(why)) => return Err(Error::Forbidden(why)),
    }
    // A blocking read waits in a place among the blocking queries.
    let _permit = if opts.index != 0 {
        Some(s.blocking_permit(&a)?)
    } else {
        None
    };
    let deadline = tokio::time::Instant::now() + opts.wait;
    // A proxy registered a moment ago may not have its first snapshot yet:
    // give it a little time before answering 404.
    let first_by = tokio::time::Instant::now() + Duration::from_secs(2).min(opts.wait);
    let mut rx = loop {
        match s.proxycfg().snapshot(&key) {
            Some(rx) if rx.borrow().is_some() => break rx,
            _ if tokio::time::Instant::now() >= first_by => {
                let st = s.state();
                super::recheck(&s, &mut a, &st)?;
                require_watch(&a, &node, &id, destination(&st).as_deref())?;
                return Err(Error::NotFound(format!(
                    "Unknown proxy {id:?} on node {node:?}"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let mut acl = s.watches().subscribe(&crate::state::keys::ACL);
    loop {
        // Checked again on every wake, with the token as it is now: one
        // deleted or narrowed while the read waited gets no config.
        let st = s.state();
        super::recheck(&s, &mut a, &st)?;
        let current = rx.borrow_and_update().clone();
        let svc = current
            .as_ref()
            .map(|snap| snap.service.proxy.destination_service_name.as_str());
        require_watch(&a, &node, &id, svc)?;
        let Some(snap) = current else {
            return Err(Error::NotFound(format!(
                "Proxy {id:?} on node {node:?} was deregistered"
            )));
        };
        if opts.index == 0 || snap.version > opts.index {
            return Ok(shown(&s, &a, &snap));
        }
        let parked = crate::metrics::BLOCKING_PARKED.hold();
        let changed = tokio::time::timeout_at(deadline, async {
            tokio::select! {
                c = rx.changed() => c.is_ok(),
                // An ACL change: checked at the top (a gone sender: the
                // server is stopping, the proxy's channel says the rest).
                _ = acl.changed() => true,
            }
        })
        .await;
        drop(parked);
        match changed {
            Ok(true) => continue,
            // The proxy was torn down.
            Ok(false) => {
                return Err(Error::NotFound(format!(
                    "Proxy {id:?} on node {node:?} was deregistered"
                )));
            }
            Err(_) => return Ok(shown(&s, &a, &snap)),
        }
    }
}

/// The snapshot as the caller's token sees it (as its xDS stream would be
/// served it: `proxycfg::visible`), at its version.
fn shown(s: &App, a: &Authz, snap: &Snapshot) -> Response {
    let hidden = crate::proxycfg::hidden(snap, reader(s, a.token()).as_ref());
    if hidden.is_empty() {
        json_at(s, snap.version, snap)
    } else {
        json_at(s, snap.version, &snap.without(&hidden))
    }
}
