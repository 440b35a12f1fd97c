//! Token resolution: a secret (or none: the anonymous token) to the
//! `Authorizer` a request is checked with, from one version of the state.
//!
//! Cached per server by the hash of the secret; an entry is good only for
//! the ACL generation it was built at (the index of the `acl` watch key,
//! moved by every apply that changes a token, policy or role), so a
//! deleted token is refused by a server as soon as that server applied the
//! delete.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;

use super::{State, acl, keys};
use crate::acl::{Authorizer, DefaultPolicy, parse_rules};
use crate::structs::acl::{
    ANONYMOUS_ID, ANONYMOUS_SECRET, AclRole, AclToken, GLOBAL_MANAGEMENT_ID, ResolvedToken,
    secret_hash,
};
use crate::structs::identity;

/// Past this many cached tokens the cache starts over (it refills with the
/// tokens in use).
const CACHE_MAX: usize = 4096;

/// How ACLs are configured on a server.
#[derive(Debug, Clone)]
pub struct AclConfig {
    pub enabled: bool,
    pub default_policy: DefaultPolicy,
    /// `--acl-initial-management-token`: created by the first leader.
    pub initial_management: Option<String>,
}

impl Default for AclConfig {
    fn default() -> Self {
        AclConfig {
            enabled: false,
            default_policy: DefaultPolicy::Allow,
            initial_management: None,
        }
    }
}

/// The secret names no token, or its token expired: Consul's 403.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ACL not found")]
pub struct AclNotFound;

struct Cached {
    generation: u64,
    expires: Option<SystemTime>,
    authz: Arc<Authorizer>,
}

/// A server's token resolver and its cache.
pub struct Resolver {
    config: AclConfig,
    /// Policies and identities scoped to datacenters hold only in theirs.
    datacenter: String,
    allow_all: Arc<Authorizer>,
    cache: Mutex<HashMap<String, Cached>>,
    /// What tokens' `ExpirationTime` is judged against, in milliseconds
    /// since the Unix epoch: the wall clock, or in the simulation its
    /// simulated one (the same on every server). The server's
    /// `session_ttl::Clock`, the type written out (that module sits above).
    clock: fn() -> u64,
}

impl Resolver {
    pub fn new(config: AclConfig, datacenter: &str, clock: fn() -> u64) -> Self {
        Resolver {
            config,
            datacenter: datacenter.to_string(),
            allow_all: Arc::new(Authorizer::allow_all()),
            cache: Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// The time tokens expire by.
    pub fn now(&self) -> SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_millis((self.clock)())
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    pub fn config(&self) -> &AclConfig {
        &self.config
    }

    /// The authorizer of `secret` (none or empty: the anonymous token)
    /// against `st`. ACLs off: everything is allowed, nothing looked up.
    pub fn resolve(
        &self, st: &State, secret: Option<&str>,
    ) -> Result<Arc<Authorizer>, AclNotFound> {
        if !self.config.enabled {
            return Ok(self.allow_all.clone());
        }
        let secret = secret.filter(|s| !s.is_empty()).unwrap_or(ANONYMOUS_SECRET);
        let hash = secret_hash(secret);
        let generation = generation(st);
        let now = self.now();
        {
            let cache = self.cache.lock();
            if let Some(c) = cache.get(&hash)
                && c.generation == generation
            {
                if c.expires.is_some_and(|e| e <= now) {
                    return Err(AclNotFound);
                }
                return Ok(c.authz.clone());
            }
        }
        let (authz, expires) = match acl::token_by_secret_hash(st, &hash) {
            Some(t) => (self.build(st, t), expiry(t)),
            // Before the first leader's init wrote it: no policies.
            None if secret == ANONYMOUS_SECRET => (
                Authorizer::new(ANONYMOUS_ID, &[], self.config.default_policy),
                None,
            ),
            None => return Err(AclNotFound),
        };
        if expires.is_some_and(|e| e <= now) {
            return Err(AclNotFound);
        }
        let authz = Arc::new(authz);
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_MAX || cache.values().any(|c| c.generation != generation) {
            cache.clear();
        }
        cache.insert(
            hash,
            Cached {
                generation,
                expires,
                authz: authz.clone(),
            },
        );
        Ok(authz)
    }

    /// A token's policies, its own and its roles'; `global-management`
    /// among them makes it a management token.
    fn build(&self, st: &State, t: &AclToken) -> Authorizer {
        let Some(texts) = policy_rules(st, t, &self.datacenter) else {
            return Authorizer::management(&t.accessor_id);
        };
        // Rules were checked when written.
        let rules: Vec<_> = texts.iter().filter_map(|r| parse_rules(r).ok()).collect();
        let refs: Vec<_> = rules.iter().collect();
        Authorizer::new(&t.accessor_id, &refs, self.config.default_policy)
    }

    /// What a client agent needs to check `secret` itself (`ResolvedToken`),
    /// against `st`; an unknown or expired secret is `AclNotFound`.
    pub fn describe(&self, st: &State, secret: Option<&str>) -> Result<ResolvedToken, AclNotFound> {
        let default_policy = self.config.default_policy;
        if !self.config.enabled {
            return Ok(ResolvedToken {
                default_policy,
                ..Default::default()
            });
        }
        let secret = secret.filter(|s| !s.is_empty()).unwrap_or(ANONYMOUS_SECRET);
        let (accessor_id, rules) = match acl::token_by_secret_hash(st, &secret_hash(secret)) {
            Some(t) if expiry(t).is_some_and(|e| e <= self.now()) => {
                return Err(AclNotFound);
            }
            Some(t) => (t.accessor_id.clone(), policy_rules(st, t, &self.datacenter)),
            None if secret == ANONYMOUS_SECRET => (ANONYMOUS_ID.to_string(), Some(Vec::new())),
            None => return Err(AclNotFound),
        };
        Ok(ResolvedToken {
            enabled: true,
            accessor_id,
            management: rules.is_none(),
            default_policy,
            rules: rules
                .unwrap_or_default()
                .into_iter()
                .map(Cow::into_owned)
                .collect(),
        })
    }
}

/// The rules of a token's policies and identities, its own and its roles',
/// that hold in datacenter `dc` (a policy deleted since is gone); `None`
/// for a management token (it holds `global-management`).
fn policy_rules<'a>(st: &'a State, t: &'a AclToken, dc: &str) -> Option<Vec<Cow<'a, str>>> {
    let roles: Vec<&AclRole> = t
        .roles
        .iter()
        .filter_map(|r| st.acl_roles.get(&r.id).map(|r| &**r))
        .collect();
    let mut ids: Vec<&str> = t.policies.iter().map(|p| p.id.as_str()).collect();
    for role in &roles {
        ids.extend(role.policies.iter().map(|p| p.id.as_str()));
    }
    if ids.contains(&GLOBAL_MANAGEMENT_ID) {
        return None;
    }
    let mut rules: Vec<Cow<'a, str>> = ids
        .iter()
        .filter_map(|id| st.acl_policies.get(*id))
        .filter(|p| identity::holds_in(&p.datacenters, dc))
        .map(|p| Cow::Borrowed(p.rules.as_str()))
        .collect();
    let identities = std::iter::once(&t.identities).chain(roles.iter().map(|r| &r.identities));
    for i in identities.filter(|i| !i.is_empty()) {
        rules.extend(identity::rules_in(i, dc).into_iter().map(Cow::Owned));
    }
    Some(rules)
}

/// The ACL generation of `st`: the index of the `acl` watch key, moved by
/// every apply that changes a token, policy or role.
pub fn generation(st: &State) -> u64 {
    st.indexes.get(&keys::ACL).copied().unwrap_or(0)
}

/// When a token stops working (`ExpirationTime`, RFC 3339).
pub fn expiry(t: &AclToken) -> Option<SystemTime> {
    if t.expiration_time.is_empty() {
        return None;
    }
    time::OffsetDateTime::parse(
        &t.expiration_time,
        &time::format_description::well_known::Rfc3339,
    )
    .ok()
    .map(SystemTime::from)
}
