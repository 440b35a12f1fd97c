//! Agentful central config: the agent keeps a copy of the config entries
//! that feed proxies and gateways (proxy-defaults and service-defaults),
//! current by blocking queries on the servers, and merges them into the
//! proxies registered on it (`merge/`). The merged registration is what
//! `/v1/agent/service/:id` shows and what anti-entropy writes to the
//! catalog, as a Consul agent does; a config entry change reaches both
//! within one blocking-query round trip.
//!
//! Nothing is watched while the agent has no proxy or gateway.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::Agent;
use super::servers::CONFIG_WATCHES;
use crate::structs::config_entry::{ConfigEntry, Kind};

/// How long one blocking query waits on the server.
const WAIT: &str = "5m";
/// Our side's limit: the wait plus the server's jitter and some slack.
const TIMEOUT: Duration = Duration::from_secs(5 * 60 + 30);

/// The kinds a merge reads.
const KINDS: [Kind; 2] = [Kind::ProxyDefaults, Kind::ServiceDefaults];

fn decode(list: Vec<Value>) -> Vec<ConfigEntry> {
    list.iter()
        .filter_map(|v| match crate::config_check::decode_entry(v) {
            Ok(mut e) => {
                let _ = crate::config_check::normalize(&mut e);
                Some(e)
            }
            Err(e) => {
                tracing::warn!(error = %e, "central config: entry skipped");
                None
            }
        })
        .collect()
}

/// Keeps the entries of one kind current while any proxy needs them.
async fn watch_kind(a: Arc<Agent>, kind: Kind) {
    let mut index = 0u64;
    let mut failures = 0u32;
    loop {
        // Subscribed before looking, so a change in between is not missed.
        let mut changes = a.local.version.subscribe();
        if !a.local.with(|t| t.wants_central_config()) {
            let _ = changes.changed().await;
            index = 0;
            continue;
        }
        CONFIG_WATCHES.inc();
        let path = format!("/v1/config/{}?index={index}&wait={WAIT}", kind.as_str());
        match a.servers.get::<Vec<Value>>(&path, TIMEOUT).await {
            Ok((list, new_index)) => {
                failures = 0;
                // An index that went backwards means a different (or reset)
                // server: start over rather than wait on a stale index.
                index = if new_index < index { 0 } else { new_index };
                let entries = decode(list);
                a.local.with(|t| t.set_entries(kind, entries));
            }
            Err(e) => {
                failures += 1;
                let wait = super::retry_wait(failures);
                tracing::warn!(kind = kind.as_str(), error = %e, retry_in = ?wait, "central config watch failed");
                index = 0;
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Starts one watch per kind.
pub fn spawn(a: &Arc<Agent>) {
    for kind in KINDS {
        a.tasks
            .spawn("agent central config", watch_kind(a.clone(), kind));
    }
}
