//! A client agent's token checks on its own endpoints: the caller's token
//! (else the agent's `--acl-token`, as Consul's agents default it) is
//! resolved by asking a server what it may do (`AUTHORIZER_PATH`: its
//! accessor and its policies' rules), and the answer is kept for 30 s
//! (Consul's `acl.token_ttl`), so a deleted token or a narrowed policy is
//! in force on the agent within that time. The checks themselves are the
//! servers' own (`acl::Authorizer`).
//!
//! With no server reachable, Consul's default down policy
//! (`extend-cache`): a token resolved before is used past its TTL; an
//! unknown one is refused unless the servers were last seen without ACLs.
//! Requests the agent forwards are not resolved here: the server that
//! answers checks them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::Agent;
use super::servers::{ServerError, Servers};
use crate::acl::{Authorizer, parse_rules};
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::structs::acl::{AUTHORIZER_PATH, ResolvedToken, secret_hash};

/// How long a resolved token is used before asking again (Consul's
/// `acl.token_ttl` default).
pub const TOKEN_TTL: Duration = Duration::from_secs(30);

/// How long one resolution may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Past this many cached tokens the cache starts over.
const CACHE_MAX: usize = 4096;

struct Cached {
    at: Instant,
    authz: Arc<Authorizer>,
}

/// The agent's resolved tokens.
#[derive(Default)]
pub struct Tokens {
    /// By the SHA-256 of the secret, as the servers key theirs.
    cache: Mutex<HashMap<String, Cached>>,
    /// Whether the servers last answered with ACLs on (None: no server
    /// answered yet).
    enabled: Mutex<Option<bool>>,
}

impl Tokens {
    /// The authorizer of `token` (none: the anonymous token).
    pub async fn resolve(&self, servers: &Servers, token: Option<&str>) -> Result<Arc<Authorizer>> {
        let key = secret_hash(token.unwrap_or(""));
        if let Some(c) = self.cache.lock().get(&key)
            && c.at.elapsed() < TOKEN_TTL
        {
            return Ok(c.authz.clone());
        }
        let path = format!("{AUTHORIZER_PATH}?stale");
        let resp = match servers
            .send_as(reqwest::Method::GET, &path, None, TIMEOUT, token)
            .await
        {
            Ok(r) => r,
            Err(ServerError::Unreachable(_)) => return self.down(&key),
            Err(e) => return Err(e.into()),
        };
        let status = resp.status().as_u16();
        if status == 403 {
            // `ACL not found`: never cached, the token may be created yet.
            return Err(Error::Forbidden(resp.text().await.unwrap_or_default()));
        }
        if status != 200 {
            let body = resp.text().await.unwrap_or_default();
            tracing::warn!(status, body, "token resolution failed");
            return self.down(&key);
        }
        let resolved: ResolvedToken = resp
            .json()
            .await
            .map_err(|e| Error::Internal(format!("token resolution: {e}")))?;
        *self.enabled.lock() = Some(resolved.enabled);
        let authz = Arc::new(authorizer(&resolved));
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(
            key,
            Cached {
                at: Instant::now(),
                authz: authz.clone(),
            },
        );
        Ok(authz)
    }

    /// No answer from the servers: the cached authorizer whatever its age,
    /// else everything if the servers run without ACLs, else refused.
    fn down(&self, key: &str) -> Result<Arc<Authorizer>> {
        if let Some(c) = self.cache.lock().get(key) {
            return Ok(c.authz.clone());
        }
        match *self.enabled.lock() {
            Some(false) => Ok(Arc::new(Authorizer::allow_all())),
            _ => Err(Error::Internal(
                "ACL not resolved: No known Consul servers".into(),
            )),
        }
    }
}

/// The authorizer a server's answer describes.
fn authorizer(r: &ResolvedToken) -> Authorizer {
    if !r.enabled {
        return Authorizer::allow_all();
    }
    if r.management {
        return Authorizer::management(&r.accessor_id);
    }
    // The server parsed these when they were written.
    let rules: Vec<_> = r.rules.iter().filter_map(|t| parse_rules(t).ok()).collect();
    let refs: Vec<_> = rules.iter().collect();
    Authorizer::new(&r.accessor_id, &refs, r.default_policy)
}

/// `token` (none: anonymous) resolved by asking the servers, through the
/// agent's cache (above).
pub(super) async fn authz_of(a: &Agent, token: Option<String>) -> Result<Authz> {
    // The recovery token works with no server to ask (Consul's: agent
    // write on this node, and reads of nodes).
    if let Some(t) = token.as_deref()
        && a.is_recovery_token(t)
    {
        return Ok(Authz::resolved(
            super::ops::recovery_authorizer(&a.config.node),
            token,
        ));
    }
    let authz = a.tokens.resolve(&a.servers, token.as_deref()).await?;
    Ok(Authz::resolved(authz, token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::DefaultPolicy;

    #[test]
    fn a_described_token_checks_as_its_rules_say() {
        let r = ResolvedToken {
            enabled: true,
            accessor_id: "a1".into(),
            management: false,
            default_policy: DefaultPolicy::Deny,
            rules: vec![r#"service "web" { policy = "write" }"#.into()],
        };
        let a = authorizer(&r);
        assert!(a.service_write("web"));
        assert!(!a.service_write("db"));
        assert!(!a.node_read("n1"));
        let off = authorizer(&ResolvedToken::default());
        assert!(off.service_write("db") && off.acl_write());
    }
}
