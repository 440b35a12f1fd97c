//! What agents and servers agree on about an agent's node: the check IDs
//! they reserve, the node meta key that marks an agent's node, the
//! answer to a heartbeat, and how a member is listed.

use std::collections::BTreeMap;

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
    /// The federation's primary datacenter (the agent's `/v1/agent/self`
    /// reports it); empty from servers that predate it.
    pub primary_datacenter: String,
    /// The answering server's node and its network coordinate: the agent
    /// times the heartbeat and moves its own coordinate (Vivaldi).
    pub node: String,
    pub coord: Option<crate::coordinate::Coordinate>,
}

/// Serf's member status codes, as `/v1/agent/members` shows them.
/// The Consul release whose API cairn follows, reported as `Version` in
/// `/v1/agent/self` (clients gate features on it: Nomad places no task
/// with a Consul service below 1.7.0); cairn's own version goes in
/// `VersionMetadata`.
pub const CONSUL_VERSION: &str = "1.18.2";
pub const VERSION_METADATA: &str = concat!("cairn-", env!("CARGO_PKG_VERSION"));
/// The Envoy releases that release supports (`xDS.SupportedProxies`:
/// Nomad and `consul connect envoy` pick an Envoy image from it).
pub const ENVOY_VERSIONS: [&str; 4] = ["1.28.1", "1.27.3", "1.26.7", "1.25.11"];

/// The service every server is registered as (its Raft/RPC port), by
/// the leader, as Consul's; agents' anti-entropy leaves it alone.
pub const CONSUL_SERVICE: &str = "consul";

pub const MEMBER_ALIVE: u8 = 1;
pub const MEMBER_FAILED: u8 = 4;

/// A row of `/v1/agent/members` and the `Member` of `/v1/agent/self`
/// (Consul's `api.AgentMember`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Member {
    pub name: String,
    pub addr: String,
    pub port: u16,
    pub tags: BTreeMap<String, String>,
    pub status: u8,
    pub protocol_min: u8,
    pub protocol_max: u8,
    pub protocol_cur: u8,
    pub delegate_min: u8,
    pub delegate_max: u8,
    pub delegate_cur: u8,
}

impl Member {
    fn new(name: &str, addr: &str, port: u16, tags: BTreeMap<String, String>, status: u8) -> Self {
        // The serf protocol versions a Consul 1.x member reports.
        Member {
            name: name.to_string(),
            addr: addr.to_string(),
            port,
            tags,
            status,
            protocol_min: 1,
            protocol_max: 5,
            protocol_cur: 2,
            delegate_min: 2,
            delegate_max: 5,
            delegate_cur: 4,
        }
    }

    fn tags(role: &str, dc: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("role".to_string(), role.to_string()),
            ("dc".to_string(), dc.to_string()),
            ("build".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ])
    }

    /// An agent's node (role `node`).
    pub fn node(name: &str, addr: &str, port: u16, dc: &str, status: u8) -> Self {
        Member::new(name, addr, port, Member::tags("node", dc), status)
    }

    /// A server (role `consul`) at `host:port`, its port also a tag as
    /// Consul's servers carry it.
    pub fn server(name: &str, host: &str, port: &str, dc: &str) -> Self {
        let mut tags = Member::tags("consul", dc);
        tags.insert("port".into(), port.to_string());
        Member::new(name, host, port.parse().unwrap_or(0), tags, MEMBER_ALIVE)
    }

    /// A server of the WAN pool (`members -wan`): Consul names it
    /// `<node>.<dc>`; failed while its datacenter does not answer.
    pub fn wan_server(name: &str, host: &str, port: &str, dc: &str, alive: bool) -> Self {
        let mut m = Member::server(&format!("{name}.{dc}"), host, port, dc);
        if !alive {
            m.status = MEMBER_FAILED;
        }
        m
    }
}
