//! Operator types: autopilot's configuration and health, in Consul's JSON.

use serde::{Deserialize, Serialize};

use super::duration::Duration;

/// Autopilot's settings (`/v1/operator/autopilot/configuration`), kept in
/// the Raft state; absent, these defaults (Consul's) apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AutopilotConfig {
    /// Remove a failed server from Raft once a replacement joins.
    pub cleanup_dead_servers: bool,
    /// A server that has not heard from the leader for longer is unhealthy.
    pub last_contact_threshold: Duration,
    /// A server more entries behind the leader than this is unhealthy.
    pub max_trailing_logs: u64,
    /// Dead servers are not cleaned up below this many voters.
    pub min_quorum: u32,
    /// How long a new server must be healthy before it counts as stable.
    pub server_stabilization_time: Duration,
    pub redundancy_zone_tag: String,
    pub disable_upgrade_migration: bool,
    pub upgrade_version_tag: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Default for AutopilotConfig {
    fn default() -> Self {
        AutopilotConfig {
            cleanup_dead_servers: true,
            last_contact_threshold: Duration(200_000_000),
            max_trailing_logs: 250,
            min_quorum: 0,
            server_stabilization_time: Duration::from_secs(10),
            redundancy_zone_tag: String::new(),
            disable_upgrade_migration: false,
            upgrade_version_tag: String::new(),
            create_index: 0,
            modify_index: 0,
        }
    }
}

/// One server in `/v1/operator/autopilot/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServerHealth {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub address: String,
    /// "alive" or "failed" (Consul's Serf status; cairn's: whether the
    /// leader hears from it).
    pub serf_status: String,
    pub version: String,
    pub leader: bool,
    /// Since the leader last heard from it (Go duration).
    pub last_contact: Duration,
    pub last_term: u64,
    pub last_index: u64,
    pub healthy: bool,
    pub voter: bool,
    /// RFC 3339: since when it has been healthy without a break.
    pub stable_since: String,
}

/// `/v1/operator/autopilot/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct OperatorHealth {
    pub healthy: bool,
    /// How many voters could fail with a quorum of healthy ones left.
    pub failure_tolerance: usize,
    pub servers: Vec<ServerHealth>,
}
