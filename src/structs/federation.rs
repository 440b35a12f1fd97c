//! WAN federation's shapes: a server of some datacenter, and a
//! datacenter's federation state (Consul's model: one per datacenter, kept
//! in the primary's Raft state).

use serde::{Deserialize, Serialize};

/// A server as another datacenter knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct WanServer {
    pub name: String,
    /// Its Raft/RPC address: where frames for its datacenter go.
    #[serde(rename = "Address")]
    pub raft_addr: String,
}

/// What the primary knows of one datacenter: its servers, and when that
/// was last confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct FederationState {
    pub datacenter: String,
    pub servers: Vec<WanServer>,
    /// RFC 3339, the writer's clock (set by the proposer: every server
    /// applies the same value).
    pub updated_at: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl FederationState {
    pub fn new(datacenter: &str, servers: Vec<WanServer>) -> Self {
        FederationState {
            datacenter: datacenter.to_string(),
            servers,
            ..Default::default()
        }
    }
}

/// Now, as `UpdatedAt` says it.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
