//! The federation scenario: two or three datacenters of three servers
//! each, `dc1` the primary, the others joined to it by `--join-wan`
//! (`run` and `run_with`), every server built as a
//! federated one is (`process::assemble_federated`: WAN greetings over the
//! Raft transport, the primary's federation states and the secondary's
//! replication as leader duties, other datacenters answered by the HTTP
//! router in process), with ACLs on (default deny) in every one.
//!
//! Faults, at times drawn from the seed: the links between datacenters
//! cut and then healed (a WAN partition: every datacenter cut off from
//! every other, or, of three, one cut off from the other two), a
//! secondary's leader crashed and restarted from its stored state, and a
//! primary server likewise.
//!
//! Clients: the KV/catalog workload in each datacenter; a reader of each
//! datacenter's keys through the next one's servers (`?dc=`, default and
//! `?consistent`); the ACL admin in the primary (the workload's policy and
//! tokens, a doomed token deleted mid-run, a policy changed after it); the
//! doomed token's user on each secondary's servers; a writer of config
//! entries in the primary (set and deleted throughout); and checker 5's
//! (`query`): a flipper of a service's checks in each datacenter, the
//! creator of a prepared query in the primary failing over to the others,
//! and an executor of it through each datacenter.
//!
//! Checkers:
//! 1. per datacenter, the history checkers of the other scenarios
//!    (`checks::check_history`: no acknowledged write lost, writes and
//!    `?consistent` reads linearizable), and its servers' states equal;
//! 2. after the heal, every secondary server holds the primary's ACL
//!    policies, roles and global tokens and its config entries;
//! 3. checker (f) (`acl::check`) on each secondary: none of its servers
//!    accepts the token deleted in the primary once it has applied the
//!    delete its replication brought (its own apply of it, the truth);
//! 4. the `?dc=` reads are in the other datacenter's history, so checker 1
//!    holds them linearizable with that datacenter's writes;
//! 5. (`query::check`) no execute of the prepared query, through any
//!    datacenter, returns a datacenter's instance whose check was not
//!    passing at the index of that datacenter the answer reflects.

mod query;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::server::Server;
use cairn::state::State;
use cairn::structs::acl::AclPolicy;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::acl::{self, Access};
use crate::checks;
use crate::linearizability::{Input, Output};
use crate::node::{
    API_PORT, ApiReply, ApiRequest, Boot, Disk, FedBoot, Slot, Truth, call, calls, now_us,
};
use crate::report::{FedStats, Report};
use crate::run::{crash_host, new_sim, state_hash, wait_converged};
use crate::workload::{self, CLIENT_TIMEOUT, History, KEYS, Kind, Record};

/// The datacenters, the primary first (a run has the first two or all).
pub const DCS: [&str; 3] = ["dc1", "dc2", "dc3"];
const PRIMARY: &str = "dc1";
/// Servers per datacenter.
const SERVERS: usize = 3;
/// Every fault has ended by then.
const HEAL_AT: Duration = Duration::from_secs(15);
/// How long the secondary may take, after the heal and its own
/// convergence, to hold what the primary holds.
const REPLICATION_LIMIT: Duration = Duration::from_secs(30);
/// Progress each seed must show for its checks to mean something.
const MIN_ACKED_WRITES: usize = 60;
const MIN_REMOTE_READS: usize = 10;

/// A policy the admin creates with the tokens and changes after the
/// delete: replication must bring the change too.
const FED_POLICY_ID: &str = "5e1f0000-0000-4000-8000-0000000000f0";

/// The services whose `service-defaults` the config writer sets and
/// deletes.
const SERVICES: [&str; 4] = ["api", "web", "db", "cache"];
const PROTOCOLS: [&str; 3] = ["tcp", "http", "grpc"];

fn server_name(dc: usize, i: usize) -> String {
    format!("{}-s{}", DCS[dc], i + 1)
}

/// The replicated objects a server holds, comparable across datacenters:
/// indexes (each datacenter's own) and secrets (never replicated) left out.
#[derive(Debug, PartialEq, Eq)]
struct Replicated {
    policies: BTreeMap<String, String>,
    roles: BTreeMap<String, String>,
    tokens: BTreeMap<String, String>,
    config: BTreeMap<String, String>,
}

fn replicated(st: &State) -> Replicated {
    let policies = st
        .acl_policies
        .iter()
        .map(|(id, p)| {
            let mut p = (**p).clone();
            (p.create_index, p.modify_index) = (0, 0);
            (id.clone(), format!("{p:?}"))
        })
        .collect();
    let roles = st
        .acl_roles
        .iter()
        .map(|(id, r)| {
            let mut r = (**r).clone();
            (r.create_index, r.modify_index) = (0, 0);
            (id.clone(), format!("{r:?}"))
        })
        .collect();
    let tokens = st
        .acl_tokens
        .iter()
        .filter(|(_, t)| !t.local)
        .map(|(id, t)| {
            let mut t = (**t).clone();
            (t.create_index, t.modify_index) = (0, 0);
            t.secret_id.clear();
            (id.clone(), format!("{t:?}"))
        })
        .collect();
    let config = st
        .config
        .iter()
        .map(|((kind, name), e)| {
            let mut e = (**e).clone();
            e.set_indexes(0, 0);
            (format!("{}/{name}", kind.as_str()), format!("{e:?}"))
        })
        .collect();
    Replicated {
        policies,
        roles,
        tokens,
        config,
    }
}

/// What differs between the primary's objects and a secondary server's,
/// said briefly.
fn differences(primary: &Replicated, secondary: &Replicated) -> Vec<String> {
    fn diff(what: &str, a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
        let mut out = Vec::new();
        for (k, v) in a {
            match b.get(k) {
                None => out.push(format!("{what} {k} missing")),
                Some(w) if w != v => out.push(format!("{what} {k} differs")),
                Some(_) => {}
            }
        }
        for k in b.keys().filter(|k| !a.contains_key(*k)) {
            out.push(format!("{what} {k} not in the primary"));
        }
        out
    }
    let mut out = diff("policy", &primary.policies, &secondary.policies);
    out.extend(diff("role", &primary.roles, &secondary.roles));
    out.extend(diff("token", &primary.tokens, &secondary.tokens));
    out.extend(diff("config entry", &primary.config, &secondary.config));
    out
}

/// The servers of datacenter `d` that run.
fn running(slots: &[Slot]) -> Vec<Arc<Server>> {
    slots
        .iter()
        .filter_map(|s| s.lock().unwrap().clone())
        .collect()
}

/// Checker 2's question: what each secondary server still lacks of the
/// primary's replicated objects (empty: converged).
fn replication_gaps(slots: &[Vec<Slot>]) -> Vec<String> {
    let primary = running(&slots[0]);
    let Some(leader) = primary
        .iter()
        .find(|s| s.cluster().is_leader())
        .or(primary.first())
    else {
        return vec!["no primary server runs".into()];
    };
    let want = replicated(&leader.state());
    let mut out = Vec::new();
    for (d, secondary) in slots.iter().enumerate().skip(1) {
        for (i, slot) in secondary.iter().enumerate() {
            let Some(s) = slot.lock().unwrap().clone() else {
                out.push(format!("{} not running", server_name(d, i)));
                continue;
            };
            for diff in differences(&want, &replicated(&s.state())) {
                out.push(format!("{}: {diff}", server_name(d, i)));
            }
        }
    }
    out
}

/// The admin's writes besides the tokens: a policy replication must bring,
/// then its change.
fn fed_policy(rules: &str) -> AclPolicy {
    AclPolicy {
        id: FED_POLICY_ID.into(),
        name: "sim-federated".into(),
        rules: rules.into(),
        ..Default::default()
    }
}

fn extra_writes(_: &acl::Tokens) -> (Vec<ApiRequest>, ApiRequest) {
    (
        vec![calls::new_policy(fed_policy(
            r#"service_prefix "" { policy = "read" }"#,
        ))],
        calls::update_policy(fed_policy(r#"service_prefix "" { policy = "write" }"#)),
    )
}

/// Sets and deletes `service-defaults` entries in the primary until
/// `until`, on its servers (the management token), counting what was
/// acknowledged.
async fn config_writer(
    seed: u64, servers: Vec<IpAddr>, until: Duration, acked: Arc<Mutex<usize>>,
) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC0_F1_6E);
    let mut target = 0;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        let name = SERVICES[rng.gen_range(0..SERVICES.len())];
        let req = if rng.gen_ratio(1, 4) {
            calls::config_delete("service-defaults", name)
        } else {
            let protocol = PROTOCOLS[rng.gen_range(0..PROTOCOLS.len())];
            calls::config_set(serde_json::json!({
                "Kind": "service-defaults", "Name": name, "Protocol": protocol,
            }))
        };
        let addr = SocketAddr::new(servers[target], API_PORT);
        let reply = call(addr, &req, Some(acl::MANAGEMENT), Duration::from_secs(2)).await;
        match calls::done(&reply) {
            Some(true) => *acked.lock().unwrap() += 1,
            _ => target = (target + 1) % servers.len(),
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..600))).await;
    }
    Ok(())
}

/// Reads the keys of datacenter `dc` through the servers of another
/// (`?dc=`), default and `?consistent`, until `until`: each read goes
/// into `dc`'s history, as that datacenter's clients' own reads.
async fn remote_reader(
    id: u64, seed: u64, dc: &'static str, servers: Vec<IpAddr>, until: Duration, history: History,
    access: Access,
) -> turmoil::Result {
    let token = access.workload().await;
    let mut rng = StdRng::seed_from_u64(seed ^ id.wrapping_mul(0x51_7C_C1_B7));
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        let key = KEYS[rng.gen_range(0..KEYS.len())];
        let consistent = rng.gen_bool(0.5);
        let asked = rng.gen_range(0..servers.len());
        let req = ApiRequest::RemoteGet {
            dc: dc.into(),
            key: key.into(),
            consistent,
        };
        let started = now_us();
        let reply = call(
            SocketAddr::new(servers[asked], API_PORT),
            &req,
            token.as_deref(),
            CLIENT_TIMEOUT,
        )
        .await;
        let ended = now_us();
        let output = match reply {
            Ok(ApiReply::Get(Ok(entry))) => {
                Some(Output::Value(entry.and_then(|e| {
                    std::str::from_utf8(&e.value).ok()?.parse().ok()
                })))
            }
            other => {
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!("{} ms: ?dc={dc} read: {other:?}", ended / 1000);
                }
                None
            }
        };
        history.lock().unwrap().push(Record {
            client: id,
            kind: Kind::Kv {
                key: key.into(),
                input: Input::Get,
                consistent,
            },
            call: started,
            ret: output.map(|_| ended),
            output,
            server: asked,
        });
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..60))).await;
    }
    Ok(())
}

/// A fault of the scenario, at its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    /// Cut every datacenter off from every other (`None`), or one from the
    /// others.
    CutWan(Option<usize>),
    HealWan,
    /// Crash the leader of the datacenter (else a server drawn).
    CrashLeader(usize),
    /// Crash a server drawn of the datacenter.
    Crash(usize),
    /// Restart what the crash of that datacenter stopped.
    Restart(usize),
}

/// When each fault happens (of `dcs` datacenters): drawn from the seed,
/// all over by `HEAL_AT`.
fn schedule(rng: &mut StdRng, dcs: usize) -> Vec<(Duration, Step)> {
    let ms = Duration::from_millis;
    let cut = rng.gen_range(4000..9000);
    let secondary = rng.gen_range(4000..11000);
    let primary = rng.gen_range(5000..12000);
    // Of three: all apart, or one (the primary too) cut off.
    let apart = (dcs > 2 && rng.gen_bool(0.5)).then(|| rng.gen_range(0..dcs));
    let crashed = rng.gen_range(1..dcs);
    let mut out = vec![
        (ms(cut), Step::CutWan(apart)),
        (ms(cut + rng.gen_range(2000..5000)), Step::HealWan),
        (ms(secondary), Step::CrashLeader(crashed)),
        (
            ms(secondary + rng.gen_range(1000..3000)),
            Step::Restart(crashed),
        ),
        (ms(primary), Step::Crash(0)),
        (ms(primary + rng.gen_range(1000..3000)), Step::Restart(0)),
    ];
    out.sort_by_key(|(t, _)| *t);
    out
}

/// Runs one seed of the federation scenario, two datacenters.
pub fn run(seed: u64) -> Report {
    run_with(seed, 2)
}

/// Runs one seed of the federation scenario with `dcs` datacenters (two
/// or three).
pub fn run_with(seed: u64, dcs: usize) -> Report {
    assert!((2..=DCS.len()).contains(&dcs), "two or three datacenters");
    let n = dcs;
    let dcs: Vec<&'static str> = DCS[..n].to_vec();
    let mut report = Report {
        seed,
        servers: SERVERS * n,
        federation: Some(FedStats {
            datacenters: n,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut stats = FedStats {
        datacenters: n,
        acked: vec![0; n],
        remote_reads: vec![0; n],
        ..Default::default()
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0xFED_E2A7E ^ ((n as u64) << 48));
    let mut sim = new_sim(seed);

    let names: Vec<Vec<String>> = (0..n)
        .map(|d| (0..SERVERS).map(|i| server_name(d, i)).collect())
        .collect();
    let slots: Vec<Vec<Slot>> = names
        .iter()
        .map(|n| n.iter().map(|_| Arc::new(Mutex::new(None))).collect())
        .collect();
    let truths: Vec<Truth> = dcs.iter().map(|_| Truth::default()).collect();
    // ACLs on in every seed: replication's ACL half and checker (f) need it.
    let access = Access::new(seed, true);
    for d in 0..n {
        for i in 0..SERVERS {
            let (slot, disk, truth) = (slots[d][i].clone(), Disk::default(), truths[d].clone());
            let (host, names) = (names[d][i].clone(), names.clone());
            let lives = Arc::new(Mutex::new(0u64));
            sim.host(host.as_str(), move || {
                let (slot, disk, names, truth) =
                    (slot.clone(), disk.clone(), names.clone(), truth.clone());
                let life = {
                    let mut l = lives.lock().unwrap();
                    *l += 1;
                    *l
                };
                let mut t =
                    StdRng::seed_from_u64(seed ^ ((d as u64) << 40) ^ ((i as u64) << 32) ^ life);
                let election_timeout = t.gen_range(200..400);
                async move {
                    let ip = turmoil::lookup(names[d][i].as_str());
                    let peers: Vec<IpAddr> = names[d]
                        .iter()
                        .filter(|m| **m != names[d][i])
                        .map(|m| turmoil::lookup(m.as_str()))
                        .collect();
                    // The secondary joins the primary (`--join-wan`); the
                    // primary learns of it from its greetings, and a
                    // restarted primary server from its federation states.
                    let join_wan = if DCS[d] == PRIMARY {
                        Vec::new()
                    } else {
                        names[0]
                            .iter()
                            .map(|m| turmoil::lookup(m.as_str()))
                            .collect()
                    };
                    let boot = Boot {
                        id: i as u64 + 1,
                        name: names[d][i].clone(),
                        ip,
                        peers,
                        expect: SERVERS,
                        election_timeout,
                        snapshot_threshold: 100,
                        acl: true,
                        dns_token: None,
                        federation: Some(FedBoot {
                            datacenter: DCS[d].into(),
                            primary: PRIMARY.into(),
                            join_wan,
                        }),
                    };
                    crate::node::run_server(boot, disk, slot, truth).await
                }
            });
        }
    }
    let ips: Vec<Vec<IpAddr>> = names
        .iter()
        .map(|n| n.iter().map(|h| sim.lookup(h.as_str())).collect())
        .collect();
    let histories: Vec<History> = dcs.iter().map(|_| History::default()).collect();
    let workload_end = HEAL_AT + CLIENT_TIMEOUT + Duration::from_secs(2);
    let mut clients: Vec<String> = Vec::new();
    let queries: query::QueryLog = Arc::default();
    for d in 0..n {
        // Two writers and a reader per datacenter.
        for c in 0..3u64 {
            let name = format!("{}-c{}", DCS[d], c + 1);
            let (ips, history, a) = (ips[d].clone(), histories[d].clone(), access.clone());
            let id = d as u64 * 10 + c + 1;
            sim.client(name.as_str(), async move {
                workload::client(id, seed, ips, workload_end, history, c == 2, a).await
            });
            clients.push(name);
        }
        // The next datacenter's keys, through this one's servers.
        let other = (d + 1) % n;
        let name = format!("{}-remote", DCS[d]);
        let (ips_d, history, a) = (ips[d].clone(), histories[other].clone(), access.clone());
        let id = 100 + d as u64;
        sim.client(name.as_str(), async move {
            remote_reader(id, seed, DCS[other], ips_d, workload_end, history, a).await
        });
        clients.push(name);
        let name = format!("{}-checker", DCS[d]);
        let (ips_d, history, a) = (ips[d].clone(), histories[d].clone(), access.clone());
        sim.client(name.as_str(), async move {
            tokio::time::sleep(workload_end).await;
            workload::final_reads(ips_d, history, a).await
        });
        clients.push(name);
        // Checker 5's: this datacenter's instances flipped, the query
        // executed through it.
        let name = format!("{}-flipper", DCS[d]);
        let (ips_d, a) = (ips[d].clone(), access.clone());
        sim.client(name.as_str(), async move {
            query::flipper(seed, d, DCS[d], ips_d, workload_end, a).await
        });
        clients.push(name);
        let name = format!("{}-executor", DCS[d]);
        let (ips_d, a, log) = (ips[d].clone(), access.clone(), queries.clone());
        sim.client(name.as_str(), async move {
            query::executor(seed, d, PRIMARY, ips_d, workload_end, a, log).await
        });
        clients.push(name);
    }
    {
        let (to, a, log, dcs) = (ips[0].clone(), access.clone(), queries.clone(), dcs.clone());
        sim.client("query-creator", async move {
            query::creator(seed, dcs, to, workload_end, a, log).await
        });
        clients.push("query-creator".into());
    }
    let acl_log: acl::AclLog = Arc::default();
    // Per secondary, its user's requests (`user_logs[d - 1]`).
    let user_logs: Vec<acl::AclLog> = (1..n).map(|_| acl::AclLog::default()).collect();
    {
        let delete_at = Duration::from_millis(rng.gen_range(7000..13000));
        let (to, log, a) = (ips[0].clone(), acl_log.clone(), access.clone());
        sim.client("admin", async move {
            acl::admin(a, to, delete_at, workload_end, log, extra_writes).await
        });
        for d in 1..n {
            let (to, log, a) = (ips[d].clone(), user_logs[d - 1].clone(), access.clone());
            let name = format!("{}-user", DCS[d]);
            sim.client(name.as_str(), async move {
                let seed = seed ^ ((d as u64) << 36);
                acl::user(a, seed, to, workload_end + acl::USER_AFTER, log).await
            });
            clients.push(name);
        }
        let config_acked: Arc<Mutex<usize>> = Arc::default();
        let (to, acked) = (ips[0].clone(), config_acked.clone());
        sim.client("config", async move {
            config_writer(seed, to, workload_end, acked).await
        });
        clients.extend(["admin", "config"].map(String::from));
        let mut trace = std::hash::DefaultHasher::new();
        run_faults(
            &mut sim,
            &mut rng,
            &names,
            &slots,
            &clients,
            &mut trace,
            &mut report,
        );
        if !report.failures.is_empty() {
            return report;
        }
        stats.config_writes = *config_acked.lock().unwrap();
        let run = Finished {
            names: &names,
            slots: &slots,
            truths: &truths,
            histories: &histories,
            acl_log: &acl_log,
            user_logs: &user_logs,
            queries: &queries,
            access: &access,
        };
        finish(sim, run, trace, stats, &mut report);
    }
    report
}

/// Cuts (or repairs) every link between the servers `a` and `b`.
fn wan_links(sim: &mut turmoil::Sim, a: &[String], b: &[String], cut: bool) {
    for x in a {
        for y in b {
            if cut {
                sim.partition(x.as_str(), y.as_str());
            } else {
                sim.repair(x.as_str(), y.as_str());
            }
        }
    }
}

/// Steps the simulation to the end of the workload, injecting the
/// schedule's faults.
fn run_faults(
    sim: &mut turmoil::Sim, rng: &mut StdRng, names: &[Vec<String>], slots: &[Vec<Slot>],
    clients: &[String], trace: &mut std::hash::DefaultHasher, report: &mut Report,
) {
    let mut hosts: Vec<String> = names.concat();
    hosts.extend(clients.iter().cloned());
    let n = names.len();
    let mut steps = schedule(rng, n).into_iter().peekable();
    // Per datacenter, the server its crash stopped.
    let mut down: Vec<Option<usize>> = vec![None; n];
    // The pairs of datacenters (lower first) whose links are cut.
    let mut cut: Vec<(usize, usize)> = Vec::new();
    let trace_on = std::env::var_os("SIM_TRACE").is_some();
    loop {
        let now = sim.elapsed();
        while let Some(&(at, step)) = steps.peek() {
            if at > now {
                break;
            }
            steps.next();
            let what = match step {
                Step::CutWan(apart) => {
                    let pairs = (0..n).flat_map(|d| (d + 1..n).map(move |e| (d, e)));
                    cut.extend(pairs.filter(|&(d, e)| apart.is_none_or(|x| x == d || x == e)));
                    for &(d, e) in &cut {
                        wan_links(sim, &names[d], &names[e], true);
                    }
                    *report
                        .faults
                        .entry(crate::report::Fault::Partition)
                        .or_default() += 1;
                    apart.map(|x| DCS[x].to_string()).unwrap_or_default()
                }
                Step::HealWan => {
                    for (d, e) in cut.drain(..) {
                        wan_links(sim, &names[d], &names[e], false);
                    }
                    String::new()
                }
                Step::CrashLeader(d) | Step::Crash(d) => {
                    let leader = slots[d].iter().position(|s| {
                        s.lock()
                            .unwrap()
                            .as_ref()
                            .is_some_and(|s| s.cluster().is_leader())
                    });
                    let drawn = rng.gen_range(0..SERVERS);
                    let victim = match step {
                        Step::CrashLeader(_) => leader.unwrap_or(drawn),
                        _ => drawn,
                    };
                    crash_host(sim, victim, &names[d], &hosts, &slots[d]);
                    // The crash repaired its links: the WAN cut stays.
                    for &(a, b) in cut.iter().filter(|&&(a, b)| a == d || b == d) {
                        let other = if a == d { b } else { a };
                        wan_links(sim, &names[d][victim..=victim], &names[other], true);
                    }
                    down[d] = Some(victim);
                    *report
                        .faults
                        .entry(crate::report::Fault::CrashRestart)
                        .or_default() += 1;
                    names[d][victim].clone()
                }
                Step::Restart(d) => match down[d].take() {
                    Some(i) => {
                        sim.bounce(names[d][i].as_str());
                        names[d][i].clone()
                    }
                    None => String::new(),
                },
            };
            (now.as_millis() as u64, step, &what).hash(trace);
            if trace_on {
                eprintln!("{} ms: {step:?} {what}", now.as_millis());
            }
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                report.failures.push(format!("simulation error: {e}"));
                return;
            }
        }
    }
}

/// What a finished run hands its checkers.
struct Finished<'a> {
    names: &'a [Vec<String>],
    slots: &'a [Vec<Slot>],
    truths: &'a [Truth],
    histories: &'a [History],
    acl_log: &'a acl::AclLog,
    user_logs: &'a [acl::AclLog],
    queries: &'a query::QueryLog,
    access: &'a Access,
}

/// After the workload: convergence, then the checkers.
fn finish(
    mut sim: turmoil::Sim, run: Finished, mut trace: std::hash::DefaultHasher, mut stats: FedStats,
    report: &mut Report,
) {
    let Finished {
        names,
        slots,
        truths,
        histories,
        acl_log,
        user_logs,
        queries,
        access,
    } = run;
    let n = names.len();
    // Each datacenter's servers agree, as in the other scenarios.
    for d in 0..n {
        let converged = wait_converged(&mut sim, &slots[d], Duration::from_secs(30));
        let servers = running(&slots[d]);
        let hashes: Vec<u64> = servers.iter().map(|s| state_hash(&s.state())).collect();
        hashes.hash(&mut trace);
        if servers.len() != names[d].len() {
            report.failures.push(format!(
                "{}: only {} of {} servers running at the end",
                DCS[d],
                servers.len(),
                names[d].len()
            ));
        }
        if !converged || hashes.windows(2).any(|w| w[0] != w[1]) {
            let indexes: Vec<u64> = servers.iter().map(|s| s.state().index).collect();
            report.failures.push(format!(
                "{}: servers differ after heal: applied indexes {indexes:?}",
                DCS[d]
            ));
        }
    }
    // Checker 2: every secondary holds what the primary holds.
    let started = sim.elapsed();
    let deadline = started + REPLICATION_LIMIT;
    loop {
        let gaps = replication_gaps(slots);
        if gaps.is_empty() {
            stats.converged_after = sim.elapsed() - started;
            break;
        }
        if sim.elapsed() >= deadline {
            let shown: Vec<String> = gaps.iter().take(6).cloned().collect();
            report.failures.push(format!(
                "replication: the secondaries do not hold the primary's objects {} s after the heal ({} differences): {shown:?}",
                REPLICATION_LIMIT.as_secs(),
                gaps.len()
            ));
            break;
        }
        if sim.step().is_err() {
            break;
        }
    }
    if let Some(s) = running(&slots[1]).first() {
        let r = replicated(&s.state());
        stats.replicated = (r.policies.len(), r.tokens.len(), r.config.len());
    }
    report.sim_time = sim.elapsed();

    // Checkers 1 and 4: each datacenter's history, its `?dc=` reads from
    // the previous one included.
    for d in 0..n {
        let history = histories[d].lock().unwrap().clone();
        for r in &history {
            r.hash(&mut trace);
        }
        if std::env::var_os("SIM_TRACE").is_some() {
            for r in &history {
                eprintln!("{}: {r:?}", DCS[d]);
            }
        }
        let reader = (d + n - 1) % n;
        stats.remote_reads[reader] = history
            .iter()
            .filter(|r| r.client == 100 + reader as u64 && r.output.is_some())
            .count();
        let servers = running(&slots[d]);
        let Some(s) = servers.first() else { continue };
        let mut r = Report::default();
        checks::check_history(&history, &s.state(), &mut r);
        stats.acked[d] = r.acked_writes;
        report.ops += r.ops;
        report.acked_writes += r.acked_writes;
        report.unknown_writes += r.unknown_writes;
        report.reads += r.reads;
        report.keys_checked += r.keys_checked;
        report
            .failures
            .extend(r.failures.into_iter().map(|f| format!("{}: {f}", DCS[d])));
        if r.acked_writes < MIN_ACKED_WRITES {
            report.failures.push(format!(
                "{}: no progress: {} acknowledged writes (at least {MIN_ACKED_WRITES} expected)",
                DCS[d], r.acked_writes
            ));
        }
    }
    for (d, reads) in stats.remote_reads.iter().enumerate() {
        if *reads < MIN_REMOTE_READS {
            report.failures.push(format!(
                "no progress: {reads} ?dc={} reads answered through {} (at least {MIN_REMOTE_READS} expected)",
                DCS[(d + 1) % n],
                DCS[d]
            ));
        }
    }
    // Checker 3: checker (f) on each secondary, against its own applies:
    // the admin's record with that secondary's user's requests.
    if let Some(tokens) = access.tokens() {
        let admin = acl_log.lock().unwrap().clone();
        admin.hash(&mut trace);
        for d in 1..n {
            let mut log = admin.clone();
            log.uses = user_logs[d - 1].lock().unwrap().uses.clone();
            log.uses.hash(&mut trace);
            let a = acl::check(tokens, &log, &truths[d].lock().unwrap(), true);
            report
                .failures
                .extend(a.failures.iter().map(|f| format!("{}: {f}", DCS[d])));
            stats.acl.accepted_before += a.accepted_before;
            stats.acl.refused_after += a.refused_after;
            stats.acl.anonymous_refused += a.anonymous_refused;
            stats.acl.delete_index = a.delete_index;
            stats.acl.doom = a.doom;
        }
    }
    // Checker 5: the prepared query's answers, against each datacenter's
    // applies.
    {
        let log = queries.lock().unwrap();
        log.executions.hash(&mut trace);
        let (q, failures) = query::check(&DCS[..n], &log, truths);
        report
            .failures
            .extend(failures.into_iter().map(|f| format!("prepared query: {f}")));
        stats.query = q;
    }
    for (d, t) in truths.iter().enumerate() {
        for c in &t.lock().unwrap().conflicts {
            report.failures.push(format!("{}: {c}", DCS[d]));
        }
    }
    if stats.config_writes == 0 {
        report
            .failures
            .push("no progress: no config entry write acknowledged".into());
    }
    stats.converged_after.as_millis().hash(&mut trace);
    report.trace_hash = trace.finish();
    report.federation = Some(stats);
}
