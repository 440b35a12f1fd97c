//! Consul's DNS interface: `<service>.service.consul`, RFC 2782 SRV,
//! `<node>.node.consul`, `<service>.connect.consul` and the rest, over UDP
//! and TCP on `--dns-addr`.
//!
//! One resolver serves servers and client agents alike: it asks a
//! [`Catalog`] for a service's instances or a node. A server's catalog is
//! its own state ([`StateCatalog`], stale reads, as Consul's default
//! `allow_stale`); a client agent's asks a server over HTTP with `?stale`
//! (`agent::dns`). The wire format is hickory-proto's. Answers show what
//! the DNS token (`--acl-token`, else anonymous) may read; a name it may
//! not read answers as one that does not exist.
//!
//! Prepared queries (`<name>.query[.<dc>].consul`) go through
//! `Catalog::prepared_query`: a server executes them through the endpoint
//! layer (`Queries`, handed in by process assembly:
//! `endpoint::query::Queries`, failover and ACLs as over HTTP), a client
//! agent asks its server. Another datacenter's names
//! (`<name>.service.<dc>.consul`, `<node>.node.<dc>.consul`) go through
//! `Catalog::remote_*`: a server asks that datacenter's health or catalog
//! read through the `Remote` process assembly hands in (`federation`), a
//! client agent its server with `?dc=`; the answer is as that
//! datacenter's ACLs cut it.
//!
//! Records: A, AAAA, CNAME and SRV with the targets' addresses;
//! NXDOMAIN with the SOA, REFUSED, and truncation to the transport's size.
//!
//! | file | job |
//! | --- | --- |
//! | `answer.rs` | a query to an answer: names, health, records, truncation |
//! | `listen.rs` | the UDP and TCP listeners, their caps and timeouts |

mod answer;
mod listen;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::rr::Name;

pub use answer::answer;
pub use listen::{Listeners, bind};

use crate::acl::Authorizer;
use crate::state::Store;
use crate::state::catalog::{Instance, service_instances};
use crate::state::token_resolver::Resolver;
use crate::structs::Node;

/// How the DNS interface answers (`--domain`, `--dns-*` flags).
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// Where to listen, UDP and TCP (port 0: any free port, the same for both).
    pub addr: SocketAddr,
    /// The domain answered for, fully qualified and lower case (`consul.`).
    pub domain: Name,
    /// Leave out instances with a warning check, not only critical ones.
    pub only_passing: bool,
    /// TTL of service records, in seconds (Consul's default: 0).
    pub service_ttl: u32,
    /// TTL of node records, in seconds (Consul's default: 0).
    pub node_ttl: u32,
}

impl DnsConfig {
    /// Consul's defaults on `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        DnsConfig {
            addr,
            domain: parse_domain("consul").expect("a valid name"),
            only_passing: false,
            service_ttl: 0,
            node_ttl: 0,
        }
    }
}

/// `--domain`: a DNS name, with or without its trailing dot, any case.
pub fn parse_domain(s: &str) -> Result<Name, String> {
    let trimmed = s.trim().trim_matches('.');
    if trimmed.is_empty() {
        return Err("the domain must not be empty".into());
    }
    let mut name = Name::from_ascii(trimmed)
        .map_err(|e| format!("not a domain name: {e}"))?
        .to_lowercase();
    name.set_fqdn(true);
    Ok(name)
}

/// Why a lookup could not be answered (the query gets SERVFAIL).
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("catalog unavailable: {0}")]
    Unavailable(String),
    /// The DNS interface's token could not be resolved (unknown, expired,
    /// or no server to ask).
    #[error("DNS token not resolved: {0}")]
    Token(String),
}

/// Where the resolver reads the catalog from.
pub trait Catalog: Send + Sync + 'static {
    /// The datacenter answered for (`<name>.service.<dc>.consul`).
    fn datacenter(&self) -> String;

    /// Every instance of `service` with its node and checks, healthy or
    /// not; with `connect`, the service's connect-capable instances
    /// (sidecar proxies and connect-native services) instead.
    fn instances(
        &self, service: &str, connect: bool,
    ) -> impl Future<Output = Result<Vec<Instance>, LookupError>> + Send;

    /// A node of the catalog, if there is one by that name.
    fn node(
        &self, name: &str,
    ) -> impl Future<Output = Result<Option<Arc<Node>>, LookupError>> + Send;

    /// What a query may see: the authorizer of the DNS interface's token
    /// (`--acl-token`; none: the anonymous token), as Consul's DNS reads
    /// with the agent's default token. Asked for every query, from a cache
    /// that follows ACL changes, never kept from one query to the next.
    fn authorizer(&self) -> impl Future<Output = Result<Arc<Authorizer>, LookupError>> + Send;

    /// The virtual IP the servers assigned `service` (transparent proxy,
    /// terminating gateways' services); `None`: it has none.
    fn virtual_ip(
        &self, service: &str,
    ) -> impl Future<Output = Result<Option<std::net::Ipv4Addr>, LookupError>> + Send {
        let _ = service;
        async { Ok(None) }
    }

    /// `service`'s instances in datacenter `dc`, as that datacenter
    /// answers the DNS token; `None`: no path to `dc`.
    fn remote_instances(
        &self, dc: &str, service: &str, connect: bool,
    ) -> impl Future<Output = Result<Option<Vec<Instance>>, LookupError>> + Send {
        let _ = (dc, service, connect);
        async { Ok(None) }
    }

    /// Prepared query `name` executed (in datacenter `dc`, else this one)
    /// as `/v1/query/:name/execute` runs it with the DNS token: its
    /// instances in order, its DNS TTL, the datacenter that answered;
    /// `None`: no such query, or no path to `dc`.
    fn prepared_query(
        &self, dc: Option<&str>, name: &str,
    ) -> impl Future<Output = Result<Option<QueryAnswer>, LookupError>> + Send {
        let _ = (dc, name);
        async { Ok(None) }
    }

    /// A node of datacenter `dc`: `None` no path to `dc`, `Some(None)` no
    /// such node there.
    fn remote_node(
        &self, dc: &str, name: &str,
    ) -> impl Future<Output = Result<Option<Option<Arc<Node>>>, LookupError>> + Send {
        let _ = (dc, name);
        async { Ok(None) }
    }
}

/// A GET answered by a server of another datacenter (WAN federation's
/// forwarding, handed in by process assembly): its status and body, or
/// `None` when there is no path to that datacenter.
pub type RemoteFuture<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Option<(u16, Vec<u8>)>, String>> + Send + 'a>>;

pub trait Remote: Send + Sync + 'static {
    fn get(&self, dc: &str, path_and_query: String, token: Option<String>) -> RemoteFuture<'_>;
}

/// A prepared query executed by the server (`endpoint::query::Queries`),
/// in datacenter `dc` when given: its answer, `None` when there is none to
/// give (not found, refused, no path there).
pub type QueriesFuture<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Option<QueryAnswer>, String>> + Send + 'a>>;

pub trait Queries: Send + Sync + 'static {
    fn execute<'a>(
        &'a self, dc: Option<&'a str>, name: &'a str, token: Option<String>,
    ) -> QueriesFuture<'a>;
}

/// What a prepared query's execute answers, as far as DNS needs it.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct QueryAnswer {
    #[serde(default)]
    pub nodes: Vec<Instance>,
    #[serde(rename = "DNS", default)]
    pub dns: crate::structs::query::QueryDns,
    #[serde(default)]
    pub datacenter: String,
}

/// The path of prepared query `name`'s execute (`?stale`: any server
/// answers), in datacenter `dc` when given.
pub fn query_path(name: &str, dc: Option<&str>) -> String {
    let mut p = format!("/v1/query/{}/execute?stale", crate::request::enc(name));
    if let Some(dc) = dc {
        p.push_str("&dc=");
        p.push_str(&crate::request::enc(dc));
    }
    p
}

/// `/v1/catalog/node/:n`: `null`, or the node with its services.
#[derive(serde::Deserialize)]
pub struct NodeServices {
    #[serde(rename = "Node")]
    pub node: Arc<Node>,
}

/// The path of `service`'s health read (`?stale`: any server answers, as
/// Consul's DNS reads).
pub fn health_path(service: &str, connect: bool) -> String {
    let kind = if connect { "connect" } else { "service" };
    format!("/v1/health/{kind}/{}?stale", crate::request::enc(service))
}

/// The path of a node's catalog read.
pub fn node_path(name: &str) -> String {
    format!("/v1/catalog/node/{}?stale", crate::request::enc(name))
}

/// A server's catalog: its own current state version, whatever its Raft
/// role (a stale read; Consul's DNS allows stale reads by default).
pub struct StateCatalog {
    pub store: Arc<Store>,
    pub datacenter: String,
    /// The server's resolver (its cache is keyed by the ACL generation).
    pub acl: Arc<Resolver>,
    /// `--acl-token`.
    pub token: Option<String>,
    /// How other datacenters are asked (none: only this one is known).
    pub remote: Option<Arc<dyn Remote>>,
    /// Prepared queries, executed through the server's endpoint layer
    /// (failover and ACLs included). None: no queries.
    pub queries: Option<Arc<dyn Queries>>,
}

impl StateCatalog {
    /// A GET of `dc` decoded; `None`: no path there. A refusal (4xx) has
    /// nothing to answer with, as a name not found.
    async fn remote_get<T: serde::de::DeserializeOwned + Default>(
        &self, dc: &str, path: String,
    ) -> Result<Option<T>, LookupError> {
        let Some(remote) = &self.remote else {
            return Ok(None);
        };
        match remote.get(dc, path, self.token.clone()).await {
            Err(e) => Err(LookupError::Unavailable(e)),
            Ok(None) => Ok(None),
            Ok(Some((200, body))) => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| LookupError::Unavailable(e.to_string())),
            Ok(Some((status, _))) if (400..500).contains(&status) => Ok(Some(T::default())),
            Ok(Some((status, body))) => Err(LookupError::Unavailable(format!(
                "datacenter {dc} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ))),
        }
    }
}

impl Catalog for StateCatalog {
    fn datacenter(&self) -> String {
        self.datacenter.clone()
    }

    async fn instances(&self, service: &str, connect: bool) -> Result<Vec<Instance>, LookupError> {
        Ok(service_instances(&self.store.state(), service, connect))
    }

    async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, LookupError> {
        Ok(self.store.state().nodes.get(name).cloned())
    }

    async fn virtual_ip(&self, service: &str) -> Result<Option<std::net::Ipv4Addr>, LookupError> {
        Ok(crate::state::virtual_ip::of(&self.store.state(), service).map(|v| v.ip))
    }

    async fn authorizer(&self) -> Result<Arc<Authorizer>, LookupError> {
        self.acl
            .resolve(&self.store.state(), self.token.as_deref())
            .map_err(|e| LookupError::Token(e.to_string()))
    }

    async fn remote_instances(
        &self, dc: &str, service: &str, connect: bool,
    ) -> Result<Option<Vec<Instance>>, LookupError> {
        let rows: Option<Option<Vec<Instance>>> =
            self.remote_get(dc, health_path(service, connect)).await?;
        Ok(rows.map(Option::unwrap_or_default))
    }

    async fn remote_node(
        &self, dc: &str, name: &str,
    ) -> Result<Option<Option<Arc<Node>>>, LookupError> {
        let found: Option<Option<NodeServices>> = self.remote_get(dc, node_path(name)).await?;
        Ok(found.map(|n| n.map(|n| n.node)))
    }

    async fn prepared_query(
        &self, dc: Option<&str>, name: &str,
    ) -> Result<Option<QueryAnswer>, LookupError> {
        let Some(queries) = &self.queries else {
            return Ok(None);
        };
        queries
            .execute(dc, name, self.token.clone())
            .await
            .map_err(LookupError::Unavailable)
    }
}

/// Serves DNS on bound listeners until the task is dropped.
pub async fn serve<C: Catalog>(listeners: Listeners, config: DnsConfig, catalog: Arc<C>) {
    listen::serve(listeners, Arc::new(config), catalog).await
}
