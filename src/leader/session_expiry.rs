//! Session TTL expiry: destroys sessions whose timer (`session_ttl::Timers`,
//! armed afresh for each term in office) ran out.

use std::sync::Arc;

use tokio::time::Instant;

use crate::server::Server;
use crate::session_ttl::CHECK_EVERY;
use crate::state::{Response as Applied, Timeable};

pub async fn expire(s: Arc<Server>, term: u64) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let st = s.state();
        // Not armed for this term: just taken office, or a snapshot
        // restore replaced the sessions (their timers start afresh).
        if !s.sessions().in_office(term) {
            let with_ttl = st.sessions.values().map(|x| (x.id.clone(), x.ttl()));
            s.sessions().take_office(term, with_ttl, Instant::now());
            continue;
        }
        for id in s
            .sessions()
            .expired(Instant::now(), |id| st.sessions.contains_key(id))
        {
            tracing::info!(session = %id, "session TTL expired: destroying it");
            match s
                .write(
                    s.sessions()
                        .timed(Timeable::SessionDestroy { id: id.clone() }),
                )
                .await
            {
                Ok(Applied::Bool(true)) => s.sessions().disarm(&id),
                // Still expiring: the next tick tries again.
                Ok(other) => tracing::warn!(session = %id, ?other, "odd answer to a destroy"),
                Err(e) => tracing::warn!(session = %id, error = %e, "could not destroy session"),
            }
        }
    }
}
