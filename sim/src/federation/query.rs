//! Checker 5: a prepared query with failover never returns a datacenter's
//! instances that were critical at that datacenter's applied index.
//!
//! - `flipper` (one per datacenter): registers `INSTANCES` nodes, each with
//!   an instance of `SERVICE` and its one check, passing; then sets one
//!   check or another passing or critical (by registering it again), at
//!   random, until the end: now and then every instance of a datacenter is
//!   critical at once, and queries fail over.
//! - `creator` (the primary, with the workload token, which holds
//!   `query:write`): creates the query `SERVICE`, `OnlyPassing`, failing
//!   over to the other datacenters (`NearestN` on even seeds, the list
//!   `Datacenters` on odd ones), under an ID drawn from the seed (the HTTP
//!   create's random one would differ between two runs of a seed).
//! - `executor` (one per datacenter): executes it by ID or name through a
//!   server of its datacenter, the primary's by itself and the others
//!   with `?dc=` the primary, default or `?stale`, recording each answer.
//! - `check`: an answer names the datacenter whose instances it holds
//!   (`Datacenter`) and the index of that datacenter it reflects (`Index`:
//!   the highest of the service's and the checks' tables there, so the
//!   state read equals the state at that index for both); each instance
//!   must be of that datacenter and its check passing at that index in the
//!   datacenter's committed history (every server's applies, recorded by
//!   the tap: `Committed::checks`).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::structs::health::HealthStatus;
use cairn::structs::query::{PreparedQuery, QueryFailover, ServiceQuery};
use cairn::structs::{HealthCheck, NodeService, RegisterRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::acl::Access;
use crate::node::{API_PORT, ApiReply, ApiRequest, QueryAnswer, Truth, call, calls, now_us};
use crate::report::QueryStats;
use crate::workload::CLIENT_TIMEOUT;

/// The service (and the query's name).
pub const SERVICE: &str = "pq";
/// Instances of it per datacenter.
const INSTANCES: usize = 2;
/// Each instance's one check.
const CHECK_ID: &str = "pq-alive";
/// Answers each seed must check for its check to mean something.
pub const MIN_ANSWERS: usize = 10;

fn node_name(dc: &str, k: usize) -> String {
    format!("pq-{dc}-{k}")
}

/// The query's ID, drawn from the seed.
pub fn query_id(seed: u64) -> String {
    format!("{:08x}-9e11-4000-8000-000000000051", seed as u32)
}

/// The query: `SERVICE`, passing instances only, failing over from the
/// primary to every other datacenter.
fn definition(seed: u64, dcs: &[&str]) -> PreparedQuery {
    let others: Vec<String> = dcs[1..].iter().map(|d| d.to_string()).collect();
    let failover = if seed.is_multiple_of(2) {
        QueryFailover {
            nearest_n: others.len() as i64,
            ..Default::default()
        }
    } else {
        QueryFailover {
            datacenters: others.into_iter().rev().collect(),
            ..Default::default()
        }
    };
    PreparedQuery {
        id: query_id(seed),
        name: SERVICE.into(),
        service: ServiceQuery {
            service: SERVICE.into(),
            only_passing: true,
            failover,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// One execute, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Execution {
    /// The datacenter whose server was asked.
    pub from: usize,
    pub stale: bool,
    pub call: u64,
    pub ret: u64,
    pub answer: QueryAnswer,
}

#[derive(Debug, Default)]
pub struct QueryRecord {
    pub executions: Vec<Execution>,
    /// Executes that got no answer (a fault, the query not made yet).
    pub unanswered: usize,
    /// When the query's create was acknowledged.
    pub created: Option<u64>,
}

pub type QueryLog = Arc<Mutex<QueryRecord>>;

/// Sets the checks of datacenter `d`'s instances until `until`.
pub async fn flipper(
    seed: u64, d: usize, dc: &'static str, servers: Vec<IpAddr>, until: Duration, access: Access,
) -> turmoil::Result {
    let token = access.workload().await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xF11F_0000 ^ ((d as u64) << 24));
    let mut target = 0;
    // Each instance registered passing first, then flipped at random.
    let mut next = 0;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        let (k, status) = if next < INSTANCES {
            (next, HealthStatus::Passing)
        } else if rng.gen_bool(0.55) {
            (rng.gen_range(0..INSTANCES), HealthStatus::Critical)
        } else {
            (rng.gen_range(0..INSTANCES), HealthStatus::Passing)
        };
        let node = node_name(dc, k);
        let req = RegisterRequest {
            node: node.clone(),
            address: format!("{node}.sim"),
            service: Some(NodeService {
                id: SERVICE.into(),
                service: SERVICE.into(),
                port: 9000,
                ..Default::default()
            }),
            check: Some(HealthCheck {
                node,
                check_id: CHECK_ID.into(),
                name: "alive".into(),
                status,
                service_id: SERVICE.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = calls::register(req);
        let addr = SocketAddr::new(servers[target], API_PORT);
        let reply = call(addr, &req, token.as_deref(), Duration::from_secs(2)).await;
        match calls::done(&reply) {
            Some(true) => next += 1,
            _ => target = (target + 1) % servers.len(),
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await;
    }
    Ok(())
}

/// Creates the query in the primary (`servers`), asking again until one
/// create is acknowledged (or refused as made already: an earlier one
/// whose answer was lost committed).
pub async fn creator(
    seed: u64, dcs: Vec<&'static str>, servers: Vec<IpAddr>, until: Duration, access: Access,
    log: QueryLog,
) -> turmoil::Result {
    let token = access.workload().await;
    let q = definition(seed, &dcs);
    q.validate()
        .map_err(|e| format!("the query is invalid: {e}"))?;
    // Its ID the client's (as the server first asked makes one): a retry
    // of a create that committed is refused, never made twice.
    let req = calls::create_query(q);
    let mut target = 0;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        let addr = SocketAddr::new(servers[target], API_PORT);
        match call(addr, &req, token.as_deref(), Duration::from_secs(2)).await {
            Ok(ApiReply::Call(Ok(_))) => {
                log.lock().unwrap().created = Some(now_us());
                return Ok(());
            }
            Ok(ApiReply::Call(Err(e))) if e.contains("already in use") => {
                log.lock().unwrap().created = Some(now_us());
                return Ok(());
            }
            _ => target = (target + 1) % servers.len(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Executes the query through datacenter `d`'s servers until `until`.
pub async fn executor(
    seed: u64, d: usize, primary: &'static str, servers: Vec<IpAddr>, until: Duration,
    access: Access, log: QueryLog,
) -> turmoil::Result {
    let token = access.workload().await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xE8EC_0000 ^ ((d as u64) << 24));
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        let stale = rng.gen_bool(0.5);
        let query = if rng.gen_bool(0.5) {
            query_id(seed)
        } else {
            SERVICE.to_string()
        };
        let req = ApiRequest::Execute {
            query,
            dc: (d != 0).then(|| primary.to_string()),
            stale,
        };
        let asked = rng.gen_range(0..servers.len());
        let call_at = now_us();
        let reply = call(
            SocketAddr::new(servers[asked], API_PORT),
            &req,
            token.as_deref(),
            CLIENT_TIMEOUT,
        )
        .await;
        let ret = now_us();
        match reply {
            Ok(ApiReply::Query(Ok(answer))) => log.lock().unwrap().executions.push(Execution {
                from: d,
                stale,
                call: call_at,
                ret,
                answer,
            }),
            other => {
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!("{} ms: execute through {d}: {other:?}", ret / 1000);
                }
                log.lock().unwrap().unanswered += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..150))).await;
    }
    Ok(())
}

/// Checker 5 on a finished run: every instance answered passing at the
/// answering datacenter's index.
pub fn check(dcs: &[&str], log: &QueryRecord, truths: &[Truth]) -> (QueryStats, Vec<String>) {
    let mut stats = QueryStats {
        unanswered: log.unanswered,
        ..Default::default()
    };
    let mut failures = Vec::new();
    for e in &log.executions {
        let a = &e.answer;
        let Some(d) = dcs.iter().position(|dc| *dc == a.datacenter) else {
            failures.push(format!(
                "an execute through {} answered for an unknown datacenter {:?}",
                dcs[e.from], a.datacenter
            ));
            continue;
        };
        stats.answers += 1;
        stats.failed_over += usize::from(d != 0 && !a.instances.is_empty());
        stats.empty += usize::from(a.instances.is_empty());
        let truth = truths[d].lock().unwrap();
        for (node, node_dc, service) in &a.instances {
            stats.instances += 1;
            let said = format!(
                "an execute through {} ({} ms to {} ms, {}) answered {}'s instance {service} on {node} at {} index {}",
                dcs[e.from],
                e.call / 1000,
                e.ret / 1000,
                if e.stale { "?stale" } else { "default" },
                a.datacenter,
                a.datacenter,
                a.index,
            );
            if node_dc != dcs[d] || !(0..INSTANCES).any(|k| *node == node_name(dcs[d], k)) {
                failures.push(format!("{said}: not an instance of {}", dcs[d]));
                continue;
            }
            let status = truth
                .checks
                .get(&format!("{node}/{CHECK_ID}"))
                .and_then(|h| h.range(..=a.index).next_back())
                .and_then(|(_, s)| s.clone());
            if status.as_deref() != Some(HealthStatus::Passing.as_str()) {
                failures.push(format!(
                    "{said}, where its check was {}",
                    status.as_deref().unwrap_or("not registered")
                ));
            }
        }
    }
    if stats.answers < MIN_ANSWERS {
        failures.push(format!(
            "no progress: {} prepared query executes answered (at least {MIN_ANSWERS} expected)",
            stats.answers
        ));
    }
    (stats, failures)
}
