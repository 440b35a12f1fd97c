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
//! Whether they had ACLs is kept in the data dir (`ACLS_SEEN`), so a
//! restart does not forget it; an agent that never reached a server (one
//! started unjoined, as Consul's may be) answers for itself only:
//! `agent:read` and `agent:write` on its own node (`/v1/agent/self`,
//! `/v1/agent/join`), nothing a server would have to judge.
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

/// The file in the data dir saying whether the servers last answered
/// with ACLs on (`true`/`false`).
pub const ACLS_SEEN: &str = "acls-seen";

/// The agent's resolved tokens.
#[derive(Default)]
pub struct Tokens {
    /// By the SHA-256 of the secret, as the servers key theirs.
    cache: Mutex<HashMap<String, Cached>>,
    /// Whether the servers last answered with ACLs on (None: no server
    /// answered yet, in this data dir's life).
    enabled: Mutex<Option<bool>>,
    /// Where that is kept (`ACLS_SEEN`).
    file: Option<std::path::PathBuf>,
}

impl Tokens {
    /// The cache of an agent whose data dir is `dir`, with what it last
    /// learnt of the servers' ACLs.
    pub fn at(dir: &std::path::Path) -> Tokens {
        let file = dir.join(ACLS_SEEN);
        let enabled = match std::fs::read_to_string(&file).as_deref().map(str::trim) {
            Ok("true") => Some(true),
            Ok("false") => Some(false),
            _ => None,
        };
        Tokens {
            cache: Default::default(),
            enabled: Mutex::new(enabled),
            file: Some(file),
        }
    }

    /// Whether no server has said yet if it has ACLs on.
    pub fn unknown(&self) -> bool {
        self.enabled.lock().is_none()
    }

    /// Records whether the servers have ACLs on, in the data dir when it
    /// changed.
    fn seen(&self, enabled: bool) {
        let before = self.enabled.lock().replace(enabled);
        if before != Some(enabled)
            && let Some(f) = &self.file
            && let Err(e) = std::fs::write(f, enabled.to_string())
        {
            tracing::warn!(file = %f.display(), error = %e, "cannot keep whether the servers have ACLs");
        }
    }

    /// The authorizer of `token` (none: the anonymous token).
    pub async fn resolve(&self, servers: &Servers, token: Option<&str>) -> Result<Arc<Authorizer>> {
        self.resolve_or_unjoined(servers, token)
            .await?
            .ok_or_else(|| Error::Internal("ACL not resolved: No known Consul servers".into()))
    }

    /// As `resolve`, but `None` when no server was ever reached.
    async fn resolve_or_unjoined(
        &self, servers: &Servers, token: Option<&str>,
    ) -> Result<Option<Arc<Authorizer>>> {
        let key = secret_hash(token.unwrap_or(""));
        if let Some(c) = self.cache.lock().get(&key)
            && c.at.elapsed() < TOKEN_TTL
        {
            return Ok(Some(c.authz.clone()));
        }
        let path = format!("{AUTHORIZER_PATH}?stale");
        let resp = match servers
            .send_as(reqwest::Method::GET, &path, None, TIMEOUT, token)
            .await
        {
            Ok(r) => r,
            Err(ServerError::Unreachable(_)) => return self.down(&key, true),
            Err(e) => return Err(e.into()),
        };
        let status = resp.status().as_u16();
        if status == 403 {
            // `ACL not found`: never cached, the token may be created yet;
            // but the servers have ACLs on.
            self.seen(true);
            return Err(Error::Forbidden(resp.text().await.unwrap_or_default()));
        }
        if status != 200 {
            let body = resp.text().await.unwrap_or_default();
            tracing::warn!(status, body, "token resolution failed");
            return self.down(&key, false);
        }
        let resolved: ResolvedToken = resp
            .json()
            .await
            .map_err(|e| Error::Internal(format!("token resolution: {e}")))?;
        self.seen(resolved.enabled);
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
        Ok(Some(authz))
    }

    /// No answer from the servers: the cached authorizer whatever its age,
    /// else everything if the servers run without ACLs, else refused; and
    /// `None` when no server was ever reached (`unreachable`) and none
    /// ever answered.
    fn down(&self, key: &str, unreachable: bool) -> Result<Option<Arc<Authorizer>>> {
        if let Some(c) = self.cache.lock().get(key) {
            return Ok(Some(c.authz.clone()));
        }
        match *self.enabled.lock() {
            Some(false) => Ok(Some(Arc::new(Authorizer::allow_all()))),
            None if unreachable => Ok(None),
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
    let authz = a
        .tokens
        .resolve_or_unjoined(&a.servers, token.as_deref())
        .await?
        // Unjoined: the agent answers for itself alone.
        .unwrap_or_else(|| super::ops::recovery_authorizer(&a.config.node));
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
