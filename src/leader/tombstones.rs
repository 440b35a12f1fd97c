//! Tombstone reaping (see `state::tombstones`).
//!
//! Deletes are not timed in the state (apply is deterministic, clocks are
//! not): the leader samples the applied index now and then, and every
//! tombstone at or below the index it saw `ttl` ago is at least `ttl` old.
//! Samples start with each term in office, so a new leader waits a full
//! `ttl` before its first reap, as in Consul.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::server::Server;
use crate::state::Command;

pub async fn reap(s: Arc<Server>) {
    let ttl = s.config().tombstone_ttl;
    let every = (ttl / 8).clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut samples: VecDeque<(tokio::time::Instant, u64)> = Default::default();
    let mut reaped = 0;
    loop {
        tick.tick().await;
        let st = s.state();
        let now = tokio::time::Instant::now();
        samples.push_back((now, st.index));
        let mut upto = None;
        while let Some((at, index)) = samples.front().copied() {
            if now.duration_since(at) < ttl {
                break;
            }
            upto = Some(index);
            samples.pop_front();
        }
        let Some(upto) = upto.filter(|u| *u > reaped) else {
            continue;
        };
        if !st.tombstones.values().any(|i| *i <= upto) {
            continue;
        }
        match s
            .raft()
            .client_write(Command::ReapTombstones { upto }.into())
            .await
        {
            Ok(_) => reaped = upto,
            Err(e) => tracing::debug!(error = %e, "tombstone reap not committed"),
        }
    }
}
