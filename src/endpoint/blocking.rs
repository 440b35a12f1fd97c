//! Blocking queries: a read answered once its index moves past the
//! caller's `?index`, or its wait runs out; and the token checks that stay
//! in force while it waits.

use std::sync::Arc;

use futures_util::future::select_all;

use crate::acl::Authorizer;
use crate::error::{Error, Result};
use crate::request::QueryOptions;
use crate::request::authz::{Authz, Resolve};
use crate::server::Server;
use crate::state::{self, WatchKey};

/// What a blocking query waits on.
pub enum Watch {
    Keys(Vec<WatchKey>),
    Prefix(WatchKey),
}

/// Runs a read, blocking while its index is not past `?index`.
///
/// Subscribes before reading so a change in between is never missed; wakes
/// only when a watched key changes (or the wait runs out). The caller's
/// authorizer is checked again against every version read (`recheck`), so
/// a token deleted or a policy narrowed while the query waited is in force
/// in its answer; `read` and the caller after it see the current one.
pub async fn blocking<T>(
    s: &Server, opts: &QueryOptions, a: &mut Authz, watch: Watch,
    read: impl Fn(&state::State, &Authz) -> (u64, T),
) -> Result<(u64, T)> {
    if opts.consistent {
        s.linearize().await?;
    }
    let answer = |a: &mut Authz| -> Result<(u64, T)> {
        let st = s.state();
        recheck(s, a, &st)?;
        Ok(read(&st, a))
    };
    if opts.index == 0 {
        return answer(a);
    }
    let _permit = s.blocking_permit(a)?;
    crate::metrics::BLOCKING_QUERIES.inc();
    let deadline = opts.deadline();
    // A token that expires while the read waits is refused then, as a
    // deleted one is at the ACL change: not served until the wait ends.
    let expires = token_expiry(s, a.token()).map(|e| {
        let left = e.duration_since(s.acl().now()).unwrap_or_default();
        tokio::time::Instant::now() + left
    });
    let wake_by = expires.map_or(deadline, |e| e.min(deadline));
    // Subscribed once: a receiver that woke keeps its place, so a wake that
    // does not move the index waits on the same channels (10,000 watchers
    // of one key woken at once do not queue on the watch map's lock again).
    let mut rxs: Vec<_> = match &watch {
        Watch::Keys(keys) => keys.iter().map(|k| s.watches().subscribe(k)).collect(),
        Watch::Prefix(p) => vec![s.watches().subscribe_prefix(p)],
    };
    loop {
        let (index, value) = answer(a)?;
        if index > opts.index || tokio::time::Instant::now() >= deadline {
            return Ok((index, value));
        }
        let changed = select_all(rxs.iter_mut().map(|r| Box::pin(r.changed())));
        let _parked = crate::metrics::BLOCKING_PARKED.hold();
        if tokio::time::timeout_at(wake_by, changed).await.is_err() {
            if expires.is_some_and(|e| tokio::time::Instant::now() >= e) {
                resolve_in(s, &s.state(), a.token())?;
            }
            return answer(a);
        }
    }
}

/// Resolves the caller's token again against `st` when the ACL generation
/// moved since it was resolved (a deleted token: 403 `ACL not found`); a
/// version with no ACL change costs one comparison, so 10,000 woken
/// watchers resolve nothing.
pub fn recheck(s: &Server, a: &mut Authz, st: &state::State) -> Result<()> {
    if !s.acl().enabled() {
        return Ok(());
    }
    a.refresh(state::token_resolver::generation(st), |token| {
        resolve_in(s, st, token)
    })
}

/// A server resolves tokens against its own state: the one that answers a
/// call checks it (after routing, as Consul's `ResolveToken` follows its
/// `ForwardRPC`).
impl Resolve for Server {
    fn resolve(&self, token: Option<&str>) -> Result<(Arc<Authorizer>, u64)> {
        let st = self.state();
        Ok((
            resolve_in(self, &st, token)?,
            state::token_resolver::generation(&st),
        ))
    }
}

/// `token`'s authorizer against the version `st` (a blocking query's
/// re-check reads the version it answers from).
pub fn resolve_in(s: &Server, st: &state::State, token: Option<&str>) -> Result<Arc<Authorizer>> {
    s.acl()
        .resolve(st, token)
        .map_err(|e| Error::Forbidden(e.to_string()))
}

/// When the token `token` expires (its `ExpirationTime`; none: never, or
/// ACLs off), for a read that holds its request open past it.
pub fn token_expiry(s: &Server, token: Option<&str>) -> Option<std::time::SystemTime> {
    let secret = token.filter(|t| !t.is_empty() && s.acl().enabled())?;
    let hash = crate::structs::acl::secret_hash(secret);
    crate::state::acl::token_by_secret_hash(&s.state(), &hash)
        .and_then(|t| crate::state::token_resolver::expiry(t))
}
