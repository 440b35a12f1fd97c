//! `GET /v1/internal/proxycfg/:proxy-service-id?node=N[&index=X]`: the
//! server-side snapshot of one proxy, blocking until its version passes
//! `index`. Any server answers from its own state.
//!
//! Who may have a proxy's config (`may_watch`), and what of its endpoints
//! the token sees (`reader`), is decided here for the xDS streams too
//! (`http::grpc`).

use crate::acl::Authorizer;
use crate::proxycfg::{Reader, Snapshot};
use crate::request::authz::Authz;
use crate::structs::acl::{ANONYMOUS_SECRET, secret_hash};
use std::sync::Arc;
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

/// Why a caller does not get a proxy's config.
pub enum Refused {
    /// Consul's `Permission denied: …` text.
    Denied(String),
    /// No such proxy, and the caller may hear so.
    Unknown,
}

/// May `a` have the config of proxy `id`, whose destination is `service`
/// (`None`: no such proxy)? Consul asks `service:write` on the destination:
/// the config carries its leaf key. An unknown proxy is refused as a
/// forbidden one is, in the same words (naming the proxy's ID either way),
/// so a token learns nothing of proxies it may not watch; only a token that
/// may do anything (management, or ACLs off) hears that it is unknown.
pub fn may_watch(
    a: &Authorizer, id: &str, service: Option<&str>,
) -> std::result::Result<(), Refused> {
    match service {
        Some(svc) if a.service_write(svc) => Ok(()),
        None if a.acl_write() => Err(Refused::Unknown),
        _ => Err(Refused::Denied(a.deny("service:write", id).to_string())),
    }
}

/// The token as a proxy's config is narrowed for it (`proxycfg::visible`;
/// `None`: ACLs off, nothing hidden): its authorizer, and whether other
/// datacenters know it (not `Local`). A secret that no longer resolves
/// reads nothing (its stream or read is refused at its next check anyway).
pub fn reader(s: &App, token: Option<&str>) -> Option<Reader> {
    let acl = s.acl();
    if !acl.enabled() {
        return None;
    }
    let st = s.state();
    let datacenter = s.datacenter().to_string();
    let Ok(authz) = acl.resolve(&st, token) else {
        let none = Authorizer::new("", &[], crate::acl::DefaultPolicy::Deny);
        return Some(Reader {
            authz: Arc::new(none),
            datacenter,
            global: false,
        });
    };
    // The anonymous token (no secret) is known everywhere.
    let secret = token.filter(|t| !t.is_empty()).unwrap_or(ANONYMOUS_SECRET);
    let global =
        crate::state::acl::token_by_secret_hash(&st, &secret_hash(secret)).is_none_or(|t| !t.local);
    Some(Reader {
        authz,
        datacenter,
        global,
    })
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
