//! Event-stream subscriptions (`/v1/internal/stream`): the checks on the
//! topic key subscribed to, a blocking place for as long as it is held,
//! and the token's filter on every event. Any server answers from its own
//! state (called in place, never routed).

use std::sync::Arc;

use super::Call;
use crate::error::Result;
use crate::request::authz::{Authz, Resolver};
use crate::server::Server;
use crate::stream::{Reader, Subscription, Topic};

/// A subscription and what it holds while open: its blocking place and
/// its unit of the subscriptions gauge, given back when it is dropped.
pub struct Subscribed {
    pub sub: Subscription,
    _held: (crate::request::serve::Place, crate::metrics::Held),
}

/// Subscribes the caller to `topic`'s `key` from `index`. The key (or
/// prefix) is checked up front; every event is then filtered by the token
/// as it is delivered (`stream::Reader`): a prefix may hold keys the token
/// may not read, a service instances on nodes it may not read.
pub fn subscribe(
    s: &Arc<Server>, call: &Call, topic: Topic, key: &str, index: u64,
) -> Result<Subscribed> {
    let a = call.authz(s)?;
    authorize(&a, topic, key)?;
    let held = (
        s.blocking_permit(&a)?,
        crate::metrics::STREAM_SUBSCRIPTIONS.hold(),
    );
    let mut sub = s
        .publisher()
        .subscribe(s.store().clone(), topic, key, index);
    // ACLs off: nothing to filter, nothing to check again.
    if s.acl().enabled() {
        sub = sub.read_as(Reader::new(a, Resolver(s.clone())));
    }
    Ok(Subscribed { sub, _held: held })
}

fn authorize(a: &Authz, topic: Topic, key: &str) -> Result<()> {
    match topic {
        Topic::Kv => a.require(a.key_read(key), "key:read", key),
        Topic::Config(kind) => {
            let permission = crate::config_check::read_permission(kind);
            let readable = crate::config_check::readable(a, kind, key);
            a.require(readable, permission, key)
        }
        // Any valid token (Consul): resolving it refused unknown ones.
        Topic::CaRoots => Ok(()),
        Topic::ServiceHealth | Topic::ServiceHealthConnect => {
            a.require(a.service_read(key), "service:read", key)
        }
    }
}
