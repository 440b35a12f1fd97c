//! Who a subscription delivers to, with ACLs on: the subscriber's token.
//!
//! Consul filters every streamed event by the subscriber's token, and so
//! does a subscription with a `Reader`: each event, of a snapshot or live,
//! reaches the subscriber only if `visible` says its token may read it. The
//! token is checked against the newest version the server has each time
//! the subscription delivers or wakes (`Reader::check`): when the ACL
//! generation moved it is resolved again, so a narrowed policy is in force
//! for the next event and a deleted token ends the subscription.

use crate::acl::Authorizer;
use crate::error::Result;
use crate::request::authz::{Authz, Resolver};
use crate::state::{State, token_resolver};

use super::{Event, Topic};

/// Whether `a` may read what `e` carries (Consul's `HasReadPermission`):
/// a KV event needs `key:read` on its key; a health event `service:read`
/// on the instance's service and `node:read` on its node; a config entry
/// its kind's read (`config_entry::readable`); the CA roots any token.
pub fn visible(a: &Authorizer, e: &Event) -> bool {
    match e.topic {
        Topic::Kv => a.key_read(&e.key),
        Topic::ServiceHealth | Topic::ServiceHealthConnect => e
            .instance
            .as_ref()
            .is_some_and(|i| a.service_read(&i.service.service) && a.node_read(&i.node.node)),
        Topic::Config(kind) => crate::config_check::readable(a, kind, &e.key),
        Topic::CaRoots => true,
    }
}

/// A subscriber's token and how to resolve it again.
pub struct Reader {
    authz: Authz,
    resolver: Resolver,
}

impl Reader {
    /// `authz`, resolved by `resolver` (the server's, as its handlers').
    pub fn new(authz: Authz, resolver: Resolver) -> Self {
        Reader { authz, resolver }
    }

    /// The token's authorizer for a version at least as new as `st`:
    /// resolved again if `st`'s ACL generation is not the one it was
    /// resolved at (one comparison otherwise), and whether what it allows
    /// changed since the last check (its policies, roles or the token
    /// itself were rewritten); `Err` (403 `ACL not found`) once the token
    /// is gone.
    pub fn check(&mut self, st: &State) -> Result<(&Authorizer, bool)> {
        let resolver = &self.resolver;
        let before = self.authz.authorizer().clone();
        self.authz
            .refresh(token_resolver::generation(st), |token| {
                resolver.0.resolve(token).map(|(a, _)| a)
            })?;
        let now = self.authz.authorizer();
        let changed = !std::sync::Arc::ptr_eq(&before, now) && *before != **now;
        Ok((&self.authz, changed))
    }
}
