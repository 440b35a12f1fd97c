//! ACL token reaping (Consul's `startACLTokenReaping`): the leader deletes
//! tokens whose `ExpirationTime` has passed, so that the tokens logins make
//! with a `MaxTokenTTL` do not pile up in the state for good. Every server
//! already refuses an expired token when it resolves it; this only takes
//! the row away. A secondary reaps only its local tokens: the primary
//! reaps the global ones and replication takes them away here.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::server::Server;
use crate::state::token_resolver::expiry;
use crate::state::{Command, Response};

/// How often the leader looks for expired tokens.
pub const EVERY: Duration = Duration::from_secs(5);
/// At most this many deletes per round (the rest wait for the next).
const BATCH: usize = 256;

pub async fn reap(s: Arc<Server>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let secondary = s.config().datacenter != s.config().primary();
        let expired = expired(&s, s.acl().now(), secondary);
        if expired.is_empty() {
            continue;
        }
        tracing::info!(tokens = expired.len(), "deleting expired ACL tokens");
        for accessor in expired {
            match s
                .write(Command::AclTokenDelete {
                    accessor: accessor.clone(),
                })
                .await
            {
                Ok(Response::Ok) => {}
                // Gone already, or not now: the next round looks again.
                Ok(other) => tracing::debug!(%accessor, ?other, "expired token not deleted"),
                Err(e) => {
                    tracing::warn!(%accessor, error = %e, "could not delete an expired token");
                    break;
                }
            }
        }
    }
}

/// The accessors of the tokens expired at `now` (a secondary's: only its
/// local ones), at most `BATCH`.
fn expired(s: &Server, now: SystemTime, secondary: bool) -> Vec<String> {
    s.state()
        .acl_tokens
        .values()
        .filter(|t| !secondary || t.local)
        .filter(|t| expiry(t).is_some_and(|e| e <= now))
        .take(BATCH)
        .map(|t| t.accessor_id.clone())
        .collect()
}
