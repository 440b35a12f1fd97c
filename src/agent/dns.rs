//! A client agent's DNS catalog: asks a server over HTTP (`?stale`, as
//! Consul's agents answer DNS from any server), through the agent's
//! server client with its failover.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::Agent;
use crate::dns::{Catalog, LookupError};
use crate::request::enc;
use crate::state::catalog::Instance;
use crate::structs::Node;

/// Below the DNS listener's own bound on a lookup, so a slow server
/// answers SERVFAIL rather than nothing.
const TIMEOUT: Duration = Duration::from_secs(4);

pub struct AgentCatalog(pub Arc<Agent>);

/// `/v1/catalog/node/:n`: `null`, or the node with its services.
#[derive(Deserialize)]
struct NodeServices {
    #[serde(rename = "Node")]
    node: Arc<Node>,
}

impl Catalog for AgentCatalog {
    fn datacenter(&self) -> String {
        self.0.datacenter()
    }

    async fn instances(&self, service: &str, connect: bool) -> Result<Vec<Instance>, LookupError> {
        let kind = if connect { "connect" } else { "service" };
        let path = format!("/v1/health/{kind}/{}?stale", enc(service));
        let (rows, _) = self
            .0
            .servers
            .get::<Option<Vec<Instance>>>(&path, TIMEOUT)
            .await
            .map_err(|e| LookupError::Unavailable(e.to_string()))?;
        Ok(rows.unwrap_or_default())
    }

    async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, LookupError> {
        let path = format!("/v1/catalog/node/{}?stale", enc(name));
        let (found, _) = self
            .0
            .servers
            .get::<Option<NodeServices>>(&path, TIMEOUT)
            .await
            .map_err(|e| LookupError::Unavailable(e.to_string()))?;
        Ok(found.map(|n| n.node))
    }
}
