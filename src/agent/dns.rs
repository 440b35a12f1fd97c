//! A client agent's DNS catalog: asks a server over HTTP (`?stale`, as
//! Consul's agents answer DNS from any server), through the agent's
//! server client with its failover.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::{Agent, ServerError};
use crate::acl::Authorizer;
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
        match self
            .0
            .servers
            .get::<Option<Vec<Instance>>>(&path, TIMEOUT)
            .await
        {
            Ok((rows, _)) => Ok(rows.unwrap_or_default()),
            Err(e) => none_if_refused(e).map(|()| Vec::new()),
        }
    }

    async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, LookupError> {
        let path = format!("/v1/catalog/node/{}?stale", enc(name));
        match self
            .0
            .servers
            .get::<Option<NodeServices>>(&path, TIMEOUT)
            .await
        {
            Ok((found, _)) => Ok(found.map(|n| n.node)),
            Err(e) => none_if_refused(e).map(|()| None),
        }
    }

    /// Another datacenter's, through a server with `?dc=` (it forwards).
    async fn remote_instances(
        &self, dc: &str, service: &str, connect: bool,
    ) -> Result<Option<Vec<Instance>>, LookupError> {
        let path = format!(
            "{}&dc={}",
            crate::dns::health_path(service, connect),
            enc(dc)
        );
        match self
            .0
            .servers
            .get::<Option<Vec<Instance>>>(&path, TIMEOUT)
            .await
        {
            Ok((rows, _)) => Ok(Some(rows.unwrap_or_default())),
            Err(e) if no_path(&e) => Ok(None),
            Err(e) => none_if_refused(e).map(|()| Some(Vec::new())),
        }
    }

    async fn remote_node(
        &self, dc: &str, name: &str,
    ) -> Result<Option<Option<Arc<Node>>>, LookupError> {
        let path = format!("{}&dc={}", crate::dns::node_path(name), enc(dc));
        match self
            .0
            .servers
            .get::<Option<NodeServices>>(&path, TIMEOUT)
            .await
        {
            Ok((found, _)) => Ok(Some(found.map(|n| n.node))),
            Err(e) if no_path(&e) => Ok(None),
            Err(e) => none_if_refused(e).map(|()| Some(None)),
        }
    }

    /// The service's compiled chain carries its virtual IP
    /// (`AutoVirtualIPs`, filled from the servers' table): read from a
    /// server's `/v1/discovery-chain/:s`; the answer checks the DNS
    /// token's `service:read` (`dns::answer`).
    async fn virtual_ip(&self, service: &str) -> Result<Option<std::net::Ipv4Addr>, LookupError> {
        #[derive(Deserialize)]
        struct Chain {
            #[serde(rename = "AutoVirtualIPs", default)]
            auto_virtual_ips: Vec<String>,
        }
        #[derive(Deserialize)]
        struct Answer {
            #[serde(rename = "Chain")]
            chain: Chain,
        }
        let path = format!("/v1/discovery-chain/{}?stale", enc(service));
        match self.0.servers.get::<Answer>(&path, TIMEOUT).await {
            Ok((a, _)) => Ok(a
                .chain
                .auto_virtual_ips
                .first()
                .and_then(|ip| ip.parse().ok())),
            Err(e) => none_if_refused(e).map(|()| None),
        }
    }

    /// Executed by a server (with `?dc=` it forwards); the instances cut
    /// to what the DNS token may read, as the other lookups are.
    async fn prepared_query(
        &self, dc: Option<&str>, name: &str,
    ) -> Result<Option<crate::dns::QueryAnswer>, LookupError> {
        let path = crate::dns::query_path(name, dc);
        let mut found = match self
            .0
            .servers
            .get::<crate::dns::QueryAnswer>(&path, TIMEOUT)
            .await
        {
            Ok((found, _)) => found,
            Err(e) if no_path(&e) => return Ok(None),
            Err(e) => return none_if_refused(e).map(|()| None),
        };
        let authz = self.authorizer().await?;
        found
            .nodes
            .retain(|i| authz.service_read(&i.service.service) && authz.node_read(&i.node.node));
        Ok(Some(found))
    }

    /// Its DNS token (`PUT /v1/agent/token/dns`), else its default token
    /// (`--acl-token`), else anonymous, through its token cache
    /// (`agent::acl`, 30 s): the reads above use the agent's own token,
    /// what they show is cut to this one's rights by the resolver.
    async fn authorizer(&self) -> Result<Arc<Authorizer>, LookupError> {
        let a = &self.0;
        a.tokens
            .resolve(&a.servers, a.dns_token().as_deref())
            .await
            .map_err(|e| LookupError::Token(e.to_string()))
    }
}

/// The server knows no such datacenter (Consul's 500 and words).
fn no_path(e: &ServerError) -> bool {
    matches!(e, ServerError::Refused { status: 500, body, .. } if body.contains("No path to datacenter"))
}

/// A name the server refuses (a 4xx: not a name it can hold) has nothing
/// to answer, as on a server; anything else is the server's trouble.
fn none_if_refused(e: ServerError) -> Result<(), LookupError> {
    match e {
        ServerError::Refused { status, .. } if (400..500).contains(&status) => Ok(()),
        e => Err(LookupError::Unavailable(e.to_string())),
    }
}
