//! The one place a request's token is read and resolved: `Authz`, an
//! extractor every handler that reads or writes state takes first, so the
//! check comes before any state is read.
//!
//! The token comes from `X-Consul-Token`, then `Authorization: Bearer`,
//! then `?token=` (Consul's order); none is the anonymous token. Resolution
//! is whoever serves the router's (`Resolver` in the request's
//! extensions): a server resolves against its state, after forwarding, so
//! the server that answers is the one that checks.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;

use crate::acl::Authorizer;
use crate::error::{Error, Result};

/// Header names a token travels in.
pub const TOKEN_HEADER: &str = "x-consul-token";

/// Consul's mark on an answer that lost rows the caller may not see.
pub const FILTERED_HEADER: &str = "x-consul-results-filtered-by-acls";

/// Resolves a secret (none: anonymous) to its authorizer and the ACL
/// generation it holds for (whatever number moves when a token, policy or
/// role changes; 0 where nothing does); `Err` is the answer (Consul's 403
/// `ACL not found`).
pub trait Resolve: Send + Sync {
    fn resolve(&self, token: Option<&str>) -> Result<(Arc<Authorizer>, u64)>;
}

/// What a router resolves tokens with (a request extension).
#[derive(Clone)]
pub struct Resolver(pub Arc<dyn Resolve>);

/// Everything allowed, no lookup: a router with ACLs off.
pub struct AllowAll(Arc<Authorizer>);

impl AllowAll {
    pub fn resolver() -> Resolver {
        Resolver(Arc::new(AllowAll(Arc::new(Authorizer::allow_all()))))
    }
}

impl Resolve for AllowAll {
    fn resolve(&self, _: Option<&str>) -> Result<(Arc<Authorizer>, u64)> {
        Ok((self.0.clone(), 0))
    }
}

/// The token a request carries, in Consul's order of carriers.
pub fn token_of(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(t) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok())
        && !t.is_empty()
    {
        return Some(t.to_string());
    }
    if let Some(t) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        && !t.trim().is_empty()
    {
        return Some(t.trim().to_string());
    }
    super::Params::parse(query)
        .get("token")
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

/// The caller's authorizer, resolved from its token. It keeps the token
/// and the generation it was resolved at, so a blocking query can resolve
/// it again when the generation moved while it waited (`refresh`).
#[derive(Clone)]
pub struct Authz {
    authz: Arc<Authorizer>,
    token: Option<String>,
    generation: u64,
    /// False for a read that checks no token (`open`): nothing to re-check.
    checked: bool,
    /// The client IP the request came from (its connection's), if known.
    client: Option<std::net::IpAddr>,
}

impl<S: Send + Sync> FromRequestParts<S> for Authz {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self> {
        // Resolved already by an async layer (a client agent asks its
        // servers; see `agent::acl`).
        if let Some(a) = parts.extensions.get::<Authz>() {
            return Ok(a.clone());
        }
        let resolver = parts
            .extensions
            .get::<Resolver>()
            .cloned()
            .ok_or_else(|| Error::Internal("no token resolver on this router".into()))?;
        let mut a = Authz::resolve(&*resolver.0, token_of(&parts.headers, parts.uri.query()))?;
        a.client = parts
            .extensions
            .get::<crate::request::serve::ClientIp>()
            .map(|c| c.0);
        Ok(a)
    }
}

impl Authz {
    /// `token` (none: anonymous) resolved by `resolver`, to be checked
    /// again by a blocking query when the ACL generation moves.
    pub fn resolve(resolver: &dyn Resolve, token: Option<String>) -> Result<Self> {
        let (authz, generation) = resolver.resolve(token.as_deref())?;
        Ok(Authz {
            authz,
            token,
            generation,
            checked: true,
            client: None,
        })
    }

    /// What a read open to everyone runs with (Consul checks no token on
    /// the CA roots): everything allowed, never resolved again.
    pub fn open() -> Self {
        Authz {
            authz: Arc::new(Authorizer::allow_all()),
            token: None,
            generation: 0,
            checked: false,
            client: None,
        }
    }

    /// An authorizer resolved before the handler ran, by a layer that puts
    /// it in the request's extensions (never resolved again).
    pub fn resolved(authz: Arc<Authorizer>, token: Option<String>) -> Self {
        Authz {
            authz,
            token,
            generation: 0,
            checked: false,
            client: None,
        }
    }

    /// The same, known to come from `client` (the connection's IP, or the
    /// one a forwarding server says its caller had).
    pub fn from_client(mut self, client: Option<std::net::IpAddr>) -> Self {
        self.client = client;
        self
    }

    /// The client IP the request came from, if known.
    pub fn client(&self) -> Option<std::net::IpAddr> {
        self.client
    }

    /// The authorizer itself, shared.
    pub fn authorizer(&self) -> &Arc<Authorizer> {
        &self.authz
    }

    /// Who this request is, for a share of the blocking places: its token,
    /// or the anonymous token from its client IP.
    pub fn caller(&self) -> crate::request::serve::Caller {
        crate::request::serve::Caller::of(&self.authz, self.client)
    }

    /// The secret the request carried (none: the anonymous token).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Resolves the token again with `resolve` (given the generation it
    /// resolves at) unless `generation` is the one already held: a wake
    /// with no ACL change costs one comparison.
    pub fn refresh(
        &mut self, generation: u64, resolve: impl FnOnce(Option<&str>) -> Result<Arc<Authorizer>>,
    ) -> Result<()> {
        if self.checked && generation != self.generation {
            self.authz = resolve(self.token.as_deref())?;
            self.generation = generation;
        }
        Ok(())
    }

    /// `Ok` if `allowed`, else Consul's 403 naming the permission
    /// (`key:write`) and the resource.
    pub fn require(&self, allowed: bool, permission: &str, resource: &str) -> Result<()> {
        if allowed {
            Ok(())
        } else {
            Err(Error::Forbidden(
                self.authz.deny(permission, resource).to_string(),
            ))
        }
    }
}

impl std::ops::Deref for Authz {
    type Target = Authorizer;
    fn deref(&self) -> &Authorizer {
        &self.authz
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carriers_in_consuls_order() {
        let mut h = HeaderMap::new();
        assert_eq!(token_of(&h, Some("token=q")), Some("q".into()));
        h.insert("authorization", "Bearer b".parse().unwrap());
        assert_eq!(token_of(&h, Some("token=q")), Some("b".into()));
        h.insert(TOKEN_HEADER, "x".parse().unwrap());
        assert_eq!(token_of(&h, Some("token=q")), Some("x".into()));
        assert_eq!(token_of(&HeaderMap::new(), None), None);
    }

    struct Fixed(u64);
    impl Resolve for Fixed {
        fn resolve(&self, _: Option<&str>) -> Result<(Arc<Authorizer>, u64)> {
            Ok((Arc::new(Authorizer::allow_all()), self.0))
        }
    }

    #[test]
    fn refresh_resolves_again_only_when_the_generation_moved() {
        let mut a = Authz::resolve(&Fixed(7), Some("s".into())).unwrap();
        a.refresh(7, |_| panic!("same generation: nothing to resolve"))
            .unwrap();
        let gone = a.refresh(8, |t| {
            assert_eq!(t, Some("s"));
            Err(Error::Forbidden("ACL not found".into()))
        });
        assert!(matches!(gone, Err(Error::Forbidden(_))));
        let mut open = Authz::open();
        open.refresh(9, |_| panic!("an open read checks no token"))
            .unwrap();
    }
}
