//! What agents and servers agree on about an agent's node: the check IDs
//! they reserve, the node meta key that marks an agent's node, and the
//! answer to a heartbeat.

use serde::{Deserialize, Serialize};

/// The check the servers own on every agent's node (Consul's name).
pub const SERF_CHECK_ID: &str = "serfHealth";
/// Node meta key of agent nodes: the agent's HTTP address.
pub const AGENT_META: &str = "cairn-agent";
/// Maintenance mode's critical checks (Consul's IDs).
pub const NODE_MAINTENANCE_CHECK_ID: &str = "_node_maintenance";
pub const SERVICE_MAINTENANCE_CHECK_PREFIX: &str = "_service_maintenance:";

/// What a heartbeat answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HeartbeatReply {
    /// Live agents plus servers: the cluster size anti-entropy scales by.
    pub members: usize,
    /// Whether the catalog had the node (if not, the agent re-syncs now).
    pub known: bool,
    pub datacenter: String,
}
