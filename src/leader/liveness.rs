//! Agent liveness, the leader's side: the reaper that marks agents whose
//! lease ran out critical, and the servers' own `consul` registrations.
//! The heartbeat and leave endpoints that renew the leases are
//! `http::liveness`; both share the `serfHealth` helpers here.

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::server::Server;
use crate::state::{self, Command, Response as Applied};
use crate::structs::agent::{AGENT_META, CONSUL_SERVICE, CONSUL_VERSION, SERF_CHECK_ID};
use crate::structs::{
    DeregisterRequest, HEALTH_CRITICAL, HEALTH_PASSING, HealthCheck, HealthStatus, NodeService,
    RegisterRequest,
};

/// A node whose lease is this old is marked critical: four missed
/// heartbeats, so a loaded machine does not flap.
pub const LEASE_TTL: Duration = Duration::from_secs(8);
/// How often the leader looks for expired leases.
const REAP_EVERY: Duration = Duration::from_secs(1);

pub(crate) const ALIVE_OUTPUT: &str = "Agent alive and reachable";
const DEAD_OUTPUT: &str = "Agent not live or unreachable";

pub(crate) fn serf_status(st: &state::State, node: &str) -> Option<HealthStatus> {
    st.checks
        .get(&(node.to_string(), SERF_CHECK_ID.to_string()))
        .map(|c| c.status)
}

pub(crate) fn serf_check(node: &str, status: HealthStatus, output: &str) -> HealthCheck {
    HealthCheck {
        node: node.to_string(),
        check_id: SERF_CHECK_ID.into(),
        name: "Serf Health Status".into(),
        status,
        output: output.into(),
        ..Default::default()
    }
}

fn is_agent_node(st: &state::State, node: &str) -> bool {
    st.nodes
        .get(node)
        .is_some_and(|n| n.meta.contains_key(AGENT_META))
}

/// Agent nodes whose `serfHealth` is passing.
fn live_agent_nodes(st: &state::State) -> impl Iterator<Item = String> + '_ {
    st.nodes
        .values()
        .filter(|n| n.meta.contains_key(AGENT_META))
        .filter(|n| serf_status(st, &n.node) == Some(HEALTH_PASSING))
        .map(|n| n.node.clone())
}

pub(crate) async fn commit(s: &Server, cmd: Command) -> Result<()> {
    match s.write(cmd).await? {
        Applied::Ok | Applied::Bool(true) => Ok(()),
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// Marks agent nodes whose lease ran out critical, and keeps the servers
/// registered as the `consul` service.
pub async fn reap(s: Arc<Server>) {
    let mut tick = tokio::time::interval(REAP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut ticks = 0u64;
    loop {
        tick.tick().await;
        ticks += 1;
        let st = s.state();
        let now = Instant::now();
        // Seed at the start of a term in office (`revoke` emptied the
        // leases), and now and then for agent nodes that became live
        // without a heartbeat here.
        if !s.liveness().in_office() || ticks.is_multiple_of(30) {
            s.liveness().seed(live_agent_nodes(&st), now);
        }
        if let Err(e) = register_servers(&s, &st).await {
            tracing::warn!(error = %e, "could not register the servers' consul service");
        }
        for node in s.liveness().expired(now, LEASE_TTL) {
            if !is_agent_node(&st, &node) || serf_status(&st, &node) != Some(HEALTH_PASSING) {
                // Gone, or already marked: nothing to watch until it
                // heartbeats again.
                s.liveness().forget(&node);
                continue;
            }
            if !s.liveness().still_expired(&node, Instant::now(), LEASE_TTL) {
                continue;
            }
            tracing::warn!(node = %node, "agent missed its heartbeats: marking it critical");
            let req = RegisterRequest {
                node: node.clone(),
                datacenter: s.datacenter().to_owned(),
                skip_node_update: true,
                check: Some(serf_check(&node, HEALTH_CRITICAL, DEAD_OUTPUT)),
                ..Default::default()
            };
            if let Err(e) = commit(&s, Command::Register(Box::new(req))).await {
                // Kept: the next tick tries again.
                tracing::warn!(node = %node, error = %e, "could not mark agent critical");
            }
        }
    }
}

/// Every server in the catalog as the `consul` service on its node, at its
/// Raft/RPC port (`consul.service.consul` in DNS), as Consul's leader
/// registers its servers; a server that left the Raft configuration goes.
/// A Raft write only when that differs from the catalog.
async fn register_servers(s: &Server, st: &state::State) -> Result<()> {
    let members = s.cluster().members();
    for (_, m, voter) in &members {
        let (host, port) = m.raft_addr.rsplit_once(':').unwrap_or((&m.raft_addr, "0"));
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let service = NodeService {
            id: CONSUL_SERVICE.into(),
            service: CONSUL_SERVICE.into(),
            port: port.parse().unwrap_or(0),
            meta: [
                ("non_voter", (!voter).to_string()),
                ("raft_version", "3".to_string()),
                ("read_replica", "false".to_string()),
                ("version", CONSUL_VERSION.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            ..Default::default()
        };
        // Compared by what is set here: the catalog fills in defaults
        // (weights...) that a plain comparison would see as a change.
        let key = (m.name.clone(), CONSUL_SERVICE.to_string());
        if st.services.get(&key).is_some_and(|svc| {
            svc.service == service.service && svc.port == service.port && svc.meta == service.meta
        }) {
            continue;
        }
        let known = st.nodes.contains_key(&m.name);
        let req = RegisterRequest {
            node: m.name.clone(),
            address: host.to_string(),
            datacenter: s.datacenter().to_owned(),
            skip_node_update: known,
            service: Some(service),
            ..Default::default()
        };
        commit(s, Command::Register(Box::new(req))).await?;
    }
    let gone = st
        .service_names
        .get(CONSUL_SERVICE)
        .into_iter()
        .flatten()
        .filter(|(node, _)| !members.iter().any(|(_, m, _)| m.name == *node));
    for (node, id) in gone {
        let req = DeregisterRequest {
            node: node.clone(),
            service_id: id.clone(),
            datacenter: s.datacenter().to_owned(),
            ..Default::default()
        };
        commit(s, Command::Deregister(req)).await?;
    }
    Ok(())
}
