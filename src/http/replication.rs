//! Replication from the primary datacenter, on the HTTP API: what a
//! secondary's leader pulls from the primary (`leader::replication`), and
//! Consul's `GET /v1/acl/replication` (its progress).
//!
//! The pulls are cairn's own internal endpoints, blocking queries on the
//! primary's state. With a token (`--acl-replication-token`) they need
//! Consul's permissions: `acl:write` for ACL objects (tokens come with the
//! hashes of their secrets), and config entries are cut by what the token
//! may read (marked, so that the secondary applies nothing it cannot see
//! whole). Without one, only a pull a server of another datacenter sent
//! over the authenticated Raft transport (`federation::ReplicationPull`)
//! is trusted; any other caller without `acl:write` is refused.
//!
//! The pulls are `/v1/internal/replication/acl` and `/config`, blocking on
//! the `acl` watch key and on the config kinds' keys.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;

use super::{App, Opts, Watch, blocking, json_at, json_filtered};
use crate::error::Result;
use crate::federation::{Federation, Replicated, ReplicationPull};
use crate::request::authz::{Authz, token_of};
use crate::state::keys;
use crate::structs::config_entry::Kind;
use crate::structs::replication::{
    ACL_PATH, AclReplica, AclReplicationStatus, CONFIG_PATH, ConfigReplica, ZERO_TIME,
};

pub fn routes() -> axum::Router<App> {
    axum::Router::new()
        .route(ACL_PATH, get(acl_replica))
        .route(CONFIG_PATH, get(config_replica))
        .route("/v1/acl/replication", get(status))
}

/// A pull from a server of another datacenter that carries no token: the
/// transport authenticated it (Consul's servers trust each other's RPC).
fn trusted(pull: Option<Extension<ReplicationPull>>, headers: &HeaderMap, q: Option<&str>) -> bool {
    pull.is_some() && token_of(headers, q).is_none()
}

/// Every ACL policy and role and every global token, with its secret's
/// hash, at the `acl` index.
async fn acl_replica(
    State(s): State<App>, mut a: Authz, Opts(_, opts): Opts,
    pull: Option<Extension<ReplicationPull>>, headers: HeaderMap, RawQuery(q): RawQuery,
) -> Result<Response> {
    let trusted = trusted(pull, &headers, q.as_deref());
    if !trusted {
        a.require(a.acl_write(), "acl:write", "")?;
    }
    let (index, replica) = blocking(&s, &opts, &mut a, Watch::Keys(vec![keys::ACL]), |st, _| {
        let replica = AclReplica {
            policies: st.acl_policies.values().map(|p| (**p).clone()).collect(),
            roles: st.acl_roles.values().map(|r| (**r).clone()).collect(),
            tokens: st
                .acl_tokens
                .values()
                .filter(|t| !t.local)
                .map(|t| (**t).clone())
                .collect(),
            auth_methods: st
                .acl_auth_methods
                .values()
                .map(|m| (**m).clone())
                .collect(),
            binding_rules: st
                .acl_binding_rules
                .values()
                .map(|r| (**r).clone())
                .collect(),
        };
        (st.index_of([&keys::ACL]), replica)
    })
    .await?;
    // Checked again with the token as the answered version has it.
    if !trusted {
        a.require(a.acl_write(), "acl:write", "")?;
    }
    Ok(json_at(&s, index, &replica))
}

/// Every config entry of every kind, at their kinds' index; cut by what
/// the token may read (and then marked).
async fn config_replica(
    State(s): State<App>, mut a: Authz, Opts(_, opts): Opts,
    pull: Option<Extension<ReplicationPull>>, headers: HeaderMap, RawQuery(q): RawQuery,
) -> Result<Response> {
    let trusted = trusted(pull, &headers, q.as_deref());
    let watch: Vec<_> = Kind::ALL
        .iter()
        .map(|k| keys::config_kind(k.as_str()))
        .collect();
    let (index, mut entries) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, _| {
        let entries: Vec<_> = st
            .config
            .iter()
            .map(|((kind, name), e)| (*kind, name.clone(), e.to_json()))
            .collect();
        (st.index_of(watch.iter()), entries)
    })
    .await?;
    let filtered = !trusted
        && super::keep(&mut entries, |(kind, name, _)| {
            crate::config_check::readable(&a, *kind, name)
        });
    let replica = ConfigReplica {
        entries: entries.into_iter().map(|(_, _, e)| e).collect(),
    };
    Ok(json_filtered(&s, index, &replica, filtered))
}

fn rfc3339(t: Option<SystemTime>) -> String {
    t.and_then(|t| {
        time::OffsetDateTime::from(t)
            .format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
    .unwrap_or_else(|| ZERO_TIME.to_string())
}

/// `GET /v1/acl/replication`: the ACL replication's progress on the
/// server that answers (the leader, unless `?stale`), as Consul's. No
/// permission needed (Consul's); 401 with ACLs off.
async fn status(
    State(s): State<App>, Opts(_, _): Opts, fed: Option<Extension<Arc<Federation>>>,
) -> Result<Response> {
    if !s.acl().enabled() {
        return Err(crate::error::Error::Unauthorized(
            "ACL support disabled".into(),
        ));
    }
    let mut out = AclReplicationStatus::default();
    if let Some(Extension(fed)) = fed.filter(|f| f.is_secondary()) {
        let r = fed.replication().get(Replicated::Acl);
        out.enabled = true;
        out.running = r.running;
        out.source_datacenter = fed.primary().to_string();
        out.replication_type = "tokens".into();
        out.replicated_index = r.index;
        out.replicated_role_index = r.index;
        out.replicated_token_index = r.index;
        out.last_success = rfc3339(r.last_success);
        out.last_error = rfc3339(r.last_error);
        out.last_error_message = r.last_error_message;
    }
    Ok(json_at(&s, s.state().index_of([&keys::ACL]), &out))
}

/// The replication gauges of the metrics (`cairn_replication_<kind>_index`:
/// the primary's index last applied here; `..._last_success_seconds`: when,
/// in Unix seconds; 0 on a primary, a follower, or before any).
pub fn gauges(fed: Option<&Federation>) -> Vec<(&'static str, &'static str, f64)> {
    let mut out = Vec::new();
    for what in Replicated::ALL {
        let r = fed.map(|f| f.replication().get(what)).unwrap_or_default();
        let secs = r
            .last_success
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        let (index, success) = match what {
            Replicated::Acl => (
                "cairn_replication_acl_index",
                "cairn_replication_acl_last_success_seconds",
            ),
            Replicated::Config => (
                "cairn_replication_config_entries_index",
                "cairn_replication_config_entries_last_success_seconds",
            ),
            Replicated::Ca => (
                "cairn_replication_connect_ca_index",
                "cairn_replication_connect_ca_last_success_seconds",
            ),
        };
        out.push((
            index,
            "the primary's index last replicated here (secondary's leader)",
            r.index as f64,
        ));
        out.push((
            success,
            "when replication from the primary last succeeded, Unix seconds",
            secs,
        ));
    }
    out
}
