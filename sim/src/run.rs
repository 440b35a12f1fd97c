//! One simulated run: a cluster of real cairn servers on turmoil hosts,
//! clients, faults chosen by the seed, then heal and check.
//!
//! Determinism: turmoil steps every host's single-threaded tokio runtime in
//! a fixed order with paused (simulated) time, and draws latencies and
//! message loss from its own RNG seeded here. Everything this harness picks
//! (faults, their timing, client operations, each server's election timeout
//! per life) comes from RNGs seeded from the run's seed. Servers run no
//! threads (in-memory log store, state backend and snapshots). The run's
//! trace (every operation with its times and answer, every fault, every
//! leader seen, the final state hashes) is hashed so that two runs of one
//! seed can be compared.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::server::Server;
use cairn::state::State;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::acl::{self, Access};
use crate::checks;
use crate::linearizability::Input;
use crate::node::{Boot, Disk, Slot, Truth, run_server};
use crate::report::{FAULTS, Fault, Report};
use crate::stream_check::check_stream;
use crate::workload::{self, History, StreamLog};

/// What a run does; `Scenario::new` gives the defaults the tests use.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub servers: usize,
    /// Clients doing every kind of operation.
    pub clients: usize,
    /// Clients only reading, from a random server each time.
    pub readers: usize,
    /// Faults are injected from `warmup` to `warmup + faulty`.
    pub warmup: Duration,
    pub faulty: Duration,
    /// Clients go on this long after the heal.
    pub after_heal: Duration,
    pub snapshot_threshold: u64,
}

impl Scenario {
    pub fn new(servers: usize) -> Self {
        Scenario {
            servers,
            clients: 4,
            readers: 1,
            warmup: Duration::from_secs(2),
            faulty: Duration::from_secs(10),
            // Past a client's timeout: a client stuck in a request the
            // faults swallowed (a forward to a leader cut off mid-request)
            // has given up and gone on well before the run ends, so that
            // the progress checks see what the healed cluster does.
            after_heal: workload::CLIENT_TIMEOUT + Duration::from_secs(2),
            snapshot_threshold: 100,
        }
    }
}

struct Active {
    kind: Fault,
    until: Duration,
    undo: Undo,
}

enum Undo {
    Repair(Vec<String>, Vec<String>),
    RepairOneWay(Vec<String>, Vec<String>),
    Restart(usize),
    FailRate(Vec<(String, String)>),
    Latency(Vec<(String, String)>),
}

/// Trace events other than client operations.
#[derive(Hash)]
enum Event<'a> {
    Fault(u64, Fault, &'a str),
    FaultEnds(u64, Fault),
    Heal(u64),
    Leader(u64, usize, Option<u64>, u64),
}

/// Hashes the state a server holds, without the cluster id (a random UUID
/// drawn once per cluster, same on every server).
pub fn state_hash(st: &State) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    st.index.hash(&mut h);
    for (k, e) in &st.kv {
        (
            k,
            &e.value,
            e.flags,
            e.create_index,
            e.modify_index,
            e.lock_index,
            &e.session,
        )
            .hash(&mut h);
    }
    for (id, x) in &st.sessions {
        (id, &x.node, x.create_index).hash(&mut h);
    }
    for (k, d) in &st.lock_delays {
        (k, d.start_ms, d.delay_ms).hash(&mut h);
    }
    for (k, n) in &st.nodes {
        (k, n.address.as_str(), n.create_index, n.modify_index).hash(&mut h);
    }
    for ((n, id), s) in &st.services {
        (n, id, &s.service, s.port, s.create_index, s.modify_index).hash(&mut h);
    }
    for ((n, id), c) in &st.checks {
        (n, id, &c.status, c.create_index, c.modify_index).hash(&mut h);
    }
    for (k, v) in &st.indexes {
        (k, v).hash(&mut h);
    }
    h.finish()
}

fn server_name(i: usize) -> String {
    format!("s{}", i + 1)
}

/// Progress every seed must show for its checks to mean something.
const MIN_ACKED_WRITES: usize = 100;
/// Clients of a burst of large writes (one write each, at once).
const BURST_CLIENTS: usize = 8;
/// Small writes acknowledged after a burst's last write answered (or
/// timed out): the cluster was not wedged by it.
const MIN_WRITES_AFTER_BURST: usize = 20;

/// The burst's acknowledged writes are in the converged state, whole;
/// one not acknowledged is there whole or not at all; small writes
/// committed after it.
fn check_burst(
    burst: &[workload::BurstRecord], history: &[workload::Record], st: &State, report: &mut Report,
) {
    if burst.is_empty() {
        return;
    }
    let mut end = 0;
    for b in burst {
        end = end.max(
            b.ret
                .unwrap_or(b.call + workload::CLIENT_TIMEOUT.as_micros() as u64),
        );
        match st.kv.get(b.key.as_str()) {
            Some(e) if e.value.len() == b.len && e.value.iter().all(|x| *x == b.fill) => {
                report.burst_acked += usize::from(b.ret.is_some());
            }
            Some(e) => report.failures.push(format!(
                "burst write {} holds {} bytes, not the {} written",
                b.key,
                e.value.len(),
                b.len
            )),
            None if b.ret.is_some() => report
                .failures
                .push(format!("acknowledged burst write {} lost", b.key)),
            None => {}
        }
    }
    let after = history
        .iter()
        .filter(|r| r.call > end && r.output.is_some())
        .filter(|r| match &r.kind {
            workload::Kind::Kv { input, .. } => !matches!(input, Input::Get),
            _ => true,
        })
        .count();
    if after < MIN_WRITES_AFTER_BURST {
        report.failures.push(format!(
            "no progress after the burst: {after} writes acknowledged after it (at least {MIN_WRITES_AFTER_BURST} expected)"
        ));
    }
}
const MIN_STREAM_INDEXES: usize = 100;

/// The simulated network of a seed (1 ms ticks, 1 to 5 ms per message),
/// every scenario's.
pub(crate) fn new_sim(seed: u64) -> turmoil::Sim<'static> {
    let sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(5))
        .simulation_duration(Duration::from_secs(600))
        .build();
    // openraft's own random draws (the first tick's phase) come from this
    // thread's generator: seeded, they replay with the run.
    cairn::raft::runtime::seed_rng(seed);
    sim
}

/// Runs one seed of a scenario.
pub fn run(scenario: &Scenario, seed: u64) -> Report {
    let mut report = Report {
        seed,
        servers: scenario.servers,
        ..Default::default()
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sim = new_sim(seed);

    let n = scenario.servers;
    let names: Vec<String> = (0..n).map(server_name).collect();
    let slots: Vec<Slot> = (0..n).map(|_| Arc::new(Mutex::new(None))).collect();
    let disks: Vec<Disk> = (0..n).map(|_| Disk::default()).collect();
    let truth: Truth = Arc::default();
    // A quarter of the seeds run with ACLs on (default deny).
    let access = Access::new(seed, acl::acl_seed(seed));
    let acl_on = access.enabled();
    for i in 0..n {
        let (slot, disk, truth) = (slots[i].clone(), disks[i].clone(), truth.clone());
        let host = names[i].clone();
        let names = names.clone();
        let lives = Arc::new(Mutex::new(0u64));
        let threshold = scenario.snapshot_threshold;
        let dns_token = access.tokens().map(|t| t.dns.clone());
        sim.host(host.as_str(), move || {
            let (slot, disk, names, truth) =
                (slot.clone(), disk.clone(), names.clone(), truth.clone());
            let dns_token = dns_token.clone();
            let life = {
                let mut l = lives.lock().unwrap();
                *l += 1;
                *l
            };
            // A fixed election timeout per server and life, from the seed.
            let mut t = StdRng::seed_from_u64(seed ^ ((i as u64) << 32) ^ life);
            let election_timeout = t.gen_range(200..400);
            async move {
                let ip = turmoil::lookup(names[i].as_str());
                let peers: Vec<IpAddr> = names
                    .iter()
                    .filter(|m| **m != names[i])
                    .map(|m| turmoil::lookup(m.as_str()))
                    .collect();
                let boot = Boot {
                    id: i as u64 + 1,
                    name: names[i].clone(),
                    ip,
                    peers,
                    expect: names.len(),
                    election_timeout,
                    snapshot_threshold: threshold,
                    acl: acl_on,
                    dns_token,
                    federation: None,
                };
                run_server(boot, disk, slot, truth).await
            }
        });
    }
    let ips: Vec<IpAddr> = names.iter().map(|h| sim.lookup(h.as_str())).collect();
    let history: History = Arc::default();
    let workload_end = scenario.warmup + scenario.faulty + scenario.after_heal;
    for c in 0..scenario.clients + scenario.readers {
        let (ips, history, access) = (ips.clone(), history.clone(), access.clone());
        let reader = c >= scenario.clients;
        sim.client(format!("c{}", c + 1), async move {
            workload::client(
                c as u64 + 1,
                seed,
                ips,
                workload_end,
                history,
                reader,
                access,
            )
            .await
        });
    }
    // A third of the seeds get a burst of large writes, concurrent, early
    // in the faults: every acknowledged one must survive, and small writes
    // must go on committing after it.
    let burst_log: workload::BurstLog = Arc::default();
    let bursters: Vec<String> = if seed.is_multiple_of(3) {
        (1..=BURST_CLIENTS).map(|b| format!("b{b}")).collect()
    } else {
        Vec::new()
    };
    let burst_at = scenario.warmup + Duration::from_millis(rng.gen_range(0..2000));
    for (b, name) in bursters.iter().enumerate() {
        let (ips, log, access) = (ips.clone(), burst_log.clone(), access.clone());
        sim.client(name.as_str(), async move {
            workload::burst(b as u64 + 1, seed, ips, burst_at, log, access).await
        });
    }
    // Lock clients work through the faults and stop at the heal, so that
    // their last releases commit while the stream subscribers still listen.
    let lock_log: crate::locks::LockLog = Arc::default();
    let lockers = ["l1", "l2", "l3"];
    let locks_end = scenario.warmup + scenario.faulty;
    for (i, name) in lockers.iter().enumerate() {
        let (ips, log, access) = (ips.clone(), lock_log.clone(), access.clone());
        sim.client(*name, async move {
            crate::locks::client(i as u64 + 1, seed, ips, locks_end, log, access).await
        });
    }
    // Two subscribers follow the stream past the workload's end, to catch
    // up: one stays 0.3-3 s on a server, the other hops every 50-600 ms, so
    // it often lands on a server still catching up (after a restart or a
    // partition) while it holds a later index than that server.
    let subscribers: [(&str, std::ops::Range<u64>); 2] =
        [("subscriber", 300..3000), ("hopper", 50..600)];
    let stream_logs: Vec<StreamLog> = subscribers.iter().map(|_| Arc::default()).collect();
    for ((name, stay), log) in subscribers.iter().zip(&stream_logs) {
        let (ips, log, stay) = (ips.clone(), log.clone(), stay.clone());
        let access = access.clone();
        let until = workload_end + Duration::from_secs(4);
        sim.client(*name, async move {
            workload::subscriber(seed, ips, until, stay, log, access).await
        });
    }
    {
        let (ips, history, access) = (ips.clone(), history.clone(), access.clone());
        sim.client("checker", async move {
            tokio::time::sleep(workload_end).await;
            workload::final_reads(ips, history, access).await
        });
    }
    // With ACLs on: the admin deletes the doomed token at a time drawn
    // (from an RNG of its own, so that the other seeds run as they did)
    // within the faults; its user goes on until the workload ends.
    let acl_log: acl::AclLog = Arc::default();
    let dns_log: crate::dns::DnsLog = Arc::default();
    let mesh_log: crate::mesh::MeshLog = Arc::default();
    let heal_at = scenario.warmup + scenario.faulty;
    let acl_clients: Vec<String> = if acl_on {
        let mut c: Vec<String> = vec!["admin".into(), "user".into(), "dns".into()];
        c.push("mesh-admin".into());
        c.extend(crate::mesh::Proxy::ALL.map(|p| p.host().to_string()));
        c
    } else {
        Vec::new()
    };
    if acl_on {
        let mut r = StdRng::seed_from_u64(seed ^ 0xAC1_0DE1);
        let delete_at = scenario.warmup + Duration::from_millis(r.gen_range(1000..8000));
        let (to, log, a) = (ips.clone(), acl_log.clone(), access.clone());
        sim.client("admin", async move {
            let dns_writes: acl::ExtraWrites = |t| (crate::dns::setup(t), crate::dns::narrow());
            acl::admin(a, to, delete_at, workload_end, log, dns_writes).await
        });
        let (to, log, a) = (ips.clone(), acl_log.clone(), access.clone());
        sim.client("user", async move {
            acl::user(a, seed, to, workload_end + acl::USER_AFTER, log).await
        });
        let (to, log, a) = (ips.clone(), dns_log.clone(), access.clone());
        sim.client("dns", async move {
            crate::dns::client(a, seed, to, workload_end + acl::USER_AFTER, log).await
        });
        // The mesh's policies narrow during the faults, or on half these
        // seeds after the heal (the proxies' last streams then see it
        // happen), once the proxies hold what it takes away.
        let narrow_at = if seed % 8 == 7 {
            heal_at + Duration::from_millis(r.gen_range(500..1500))
        } else {
            scenario.warmup + Duration::from_millis(r.gen_range(1000..8000))
        };
        let cap = narrow_at.max(heal_at) + Duration::from_secs(1);
        let (to, log, a, acl_log) = (
            ips.clone(),
            mesh_log.clone(),
            access.clone(),
            acl_log.clone(),
        );
        sim.client("mesh-admin", async move {
            crate::mesh::admin(a, to, narrow_at, cap, workload_end, log, acl_log).await
        });
        for p in crate::mesh::Proxy::ALL {
            let (to, log, a) = (ips.clone(), mesh_log.clone(), access.clone());
            let until = workload_end + acl::USER_AFTER;
            sim.client(p.host(), async move {
                crate::mesh::proxy(p, a, seed, to, heal_at, until, log).await
            });
        }
    }

    let mut hosts: Vec<String> = names.clone();
    hosts.extend((0..scenario.clients + scenario.readers).map(|c| format!("c{}", c + 1)));
    hosts.push("checker".into());
    hosts.extend(lockers.iter().map(|l| l.to_string()));
    hosts.extend(subscribers.iter().map(|(name, _)| name.to_string()));
    hosts.extend(bursters.iter().cloned());
    hosts.extend(acl_clients.iter().cloned());
    let mut trace = std::hash::DefaultHasher::new();
    let mut active: Vec<Active> = Vec::new();
    let mut crashed: BTreeSet<usize> = BTreeSet::new();
    // Servers whose next log flush fails and which have not stopped yet.
    let mut failing: BTreeSet<usize> = BTreeSet::new();
    let mut next_fault = scenario.warmup;
    let mut healed = false;
    let mut leaders: Vec<(Option<u64>, u64)> = vec![(None, 0); n];
    let mut duties = crate::duties::DutyStats::default();
    let ms = |d: Duration| d.as_millis() as u64;

    loop {
        let now = sim.elapsed();
        // A server whose log flush failed stops (fail-stop: Raft cannot go
        // on, so the process exits); it is restarted when its fault ends.
        for i in failing.clone() {
            if disks[i].log.failed() {
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!("{} ms: s{} stops on its failed fsync", ms(now), i + 1);
                }
                crash_host(&mut sim, i, &names, &hosts, &slots);
                failing.remove(&i);
                report.fsync_stops += 1;
            }
        }
        // End faults whose time is up (or all of them at the heal).
        let mut i = 0;
        while i < active.len() {
            if active[i].until <= now || (now >= heal_at && !healed) {
                let a = active.remove(i);
                // One whose flush never came is restarted all the same.
                if let Undo::Restart(v) = a.undo
                    && failing.remove(&v)
                {
                    crash_host(&mut sim, v, &names, &hosts, &slots);
                }
                Event::FaultEnds(ms(now), a.kind).hash(&mut trace);
                undo(&mut sim, a.undo, &names, &mut crashed);
            } else {
                i += 1;
            }
        }
        if now >= heal_at && !healed {
            heal(&mut sim, &names);
            for c in std::mem::take(&mut crashed) {
                sim.bounce(names[c].as_str());
            }
            Event::Heal(ms(now)).hash(&mut trace);
            healed = true;
        }
        if !healed && now >= next_fault {
            let kind = *FAULTS.choose(&mut rng).expect("faults");
            let length = Duration::from_millis(rng.gen_range(300..3000));
            if let Some((undo, what)) = inject(
                &mut sim,
                &mut rng,
                kind,
                &names,
                &hosts,
                &slots,
                &disks,
                &mut crashed,
                &mut failing,
            ) {
                Event::Fault(ms(now), kind, &what).hash(&mut trace);
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!("{} ms: fault {kind:?} {what}", ms(now));
                }
                *report.faults.entry(kind).or_default() += 1;
                active.push(Active {
                    kind,
                    until: now + length,
                    undo,
                });
                report.max_concurrent_faults = report.max_concurrent_faults.max(active.len());
            }
            next_fault = now + Duration::from_millis(rng.gen_range(200..1500));
        }
        if now.as_millis() % 50 == 0 {
            duties.sample(ms(now), &slots);
            for (i, slot) in slots.iter().enumerate() {
                if let Some(s) = slot.lock().unwrap().as_ref() {
                    let m = s.cluster().metrics();
                    let seen = (m.current_leader, m.current_term);
                    if seen != leaders[i] {
                        leaders[i] = seen;
                        if std::env::var_os("SIM_TRACE").is_some() {
                            eprintln!(
                                "{} ms: s{} sees leader {:?} term {}",
                                ms(now),
                                i + 1,
                                seen.0,
                                seen.1
                            );
                        }
                        Event::Leader(ms(now), i, seen.0, seen.1).hash(&mut trace);
                    }
                }
            }
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                report.failures.push(format!("simulation error: {e}"));
                return report;
            }
        }
    }

    // Checker (i): a dead server removed, and back as a voter.
    if crate::rejoin::on_seed(seed) {
        let mut sample = |sim: &mut turmoil::Sim| {
            let now = sim.elapsed();
            if now.as_millis() % 50 == 0 {
                duties.sample(ms(now), &slots);
            }
        };
        let failures = crate::rejoin::check(
            &mut sim,
            &slots,
            &mut |sim, i| crash_host(sim, i, &names, &hosts, &slots),
            &mut |sim, i| sim.bounce(names[i].as_str()),
            &mut sample,
            &mut report.rejoin,
        );
        report.failures.extend(failures);
        (report.rejoin.removed_after, report.rejoin.voter_after).hash(&mut trace);
    }
    // The leader duties settle where the leader is (checker h); then every
    // server catches up, and they are compared.
    let duties_settled = crate::duties::check_settled(&mut sim, &slots, Duration::from_secs(30));
    // Checker (e): the silent holders' TTL sessions are all destroyed.
    let not_expired = {
        let log = lock_log.lock().unwrap().clone();
        crate::locks::await_expired(&mut sim, &slots, &log, Duration::from_secs(20))
    };
    report.failures.extend(not_expired);
    let converged = wait_converged(&mut sim, &slots, Duration::from_secs(30));
    report.failures.extend(duties_settled);
    report.duty_terms = duties.terms.len();
    report.failures.extend(duties.failures);
    report.sim_time = sim.elapsed();
    let servers: Vec<Arc<Server>> = slots
        .iter()
        .filter_map(|s| s.lock().unwrap().clone())
        .collect();
    let hashes: Vec<u64> = servers.iter().map(|s| state_hash(&s.state())).collect();
    hashes.hash(&mut trace);
    report.reaped_tombstones = servers
        .iter()
        .map(|s| {
            s.store()
                .state()
                .indexes
                .range(cairn::state::keys::floor("")..)
                .take_while(|(k, _)| k.starts_with("reaped/"))
                .map(|(_, v)| *v)
                .max()
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    if servers.len() != n {
        report.failures.push(format!(
            "only {} of {n} servers running at the end",
            servers.len()
        ));
    }
    if !converged || hashes.windows(2).any(|w| w[0] != w[1]) {
        let indexes: Vec<u64> = servers.iter().map(|s| s.state().index).collect();
        report.failures.push(format!(
            "servers differ after heal: applied indexes {indexes:?}, state hashes {hashes:x?}"
        ));
    }

    let history = history.lock().unwrap().clone();
    for r in &history {
        r.hash(&mut trace);
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("{r:?}");
        }
    }
    if std::env::var_os("SIM_TRACE").is_some() {
        eprintln!("final state hashes {hashes:x?}");
    }
    if let Some(s) = servers.first() {
        checks::check_history(&history, &s.state(), &mut report);
    }
    {
        let burst = burst_log.lock().unwrap().clone();
        burst.hash(&mut trace);
        if let Some(s) = servers.first() {
            check_burst(&burst, &history, &s.state(), &mut report);
        }
    }
    {
        let log = lock_log.lock().unwrap().clone();
        log.hash(&mut trace);
        report.locks_held = log
            .iter()
            .filter(|r| matches!(r, crate::locks::LockRecord::Hold { .. }))
            .count();
        report.ttl_handoffs = crate::locks::ttl_handoffs(&log);
        report.failures.extend(crate::locks::check(&log));
    }
    // With ACLs on the subscribers' token reads only some keys.
    let may_read = |key: &str| !acl_on || acl::subscriber_may_read(key);
    for log in &stream_logs {
        let log = log.lock().unwrap().clone();
        log.hash(&mut trace);
        report
            .stream
            .add(check_stream(&log, &truth.lock().unwrap(), &may_read));
    }
    report
        .failures
        .extend(report.stream.failures.iter().cloned());
    if let Some(tokens) = access.tokens() {
        let log = acl_log.lock().unwrap().clone();
        log.hash(&mut trace);
        let stats = acl::check(tokens, &log, &truth.lock().unwrap(), false);
        report.failures.extend(stats.failures.iter().cloned());
        report.acl = Some(stats);
        let log = dns_log.lock().unwrap().clone();
        log.hash(&mut trace);
        let stats = crate::dns::check(tokens, &log, &truth.lock().unwrap());
        report.failures.extend(stats.failures.iter().cloned());
        report.dns = Some(stats);
        let log = mesh_log.lock().unwrap().clone();
        log.hash(&mut trace);
        let end = (workload_end + acl::USER_AFTER).as_micros() as u64;
        let stats = crate::mesh::check(&log, &truth.lock().unwrap(), end);
        report.failures.extend(stats.failures.iter().cloned());
        report.mesh = Some(stats);
    }
    // A run that made no progress checks nothing: every seed must show
    // acknowledged writes and a followed event stream (seeds commonly
    // reach 400-650 and 450-700).
    if report.acked_writes < MIN_ACKED_WRITES {
        report.failures.push(format!(
            "no progress: {} acknowledged writes (at least {MIN_ACKED_WRITES} expected)",
            report.acked_writes
        ));
    }
    if report.stream.indexes < MIN_STREAM_INDEXES {
        report.failures.push(format!(
            "no progress: the event stream checked {} indexes (at least {MIN_STREAM_INDEXES} expected)",
            report.stream.indexes
        ));
    }
    report.trace_hash = trace.finish();
    report
}

/// Crashes server `i` (its process ends).
pub(crate) fn crash_host(
    sim: &mut turmoil::Sim, i: usize, names: &[String], hosts: &[String], slots: &[Slot],
) {
    // Dropping the host's tasks closes its sockets, in an order set by
    // tokio's process-wide task ids: cut its links first so those last
    // messages go nowhere and draw nothing from turmoil's RNG (else a run
    // depends on what ran before it in the process).
    let me = names[i].as_str();
    for other in hosts.iter().filter(|h| h.as_str() != me) {
        sim.set_link_fail_rate(me, other.as_str(), 0.0);
        sim.partition(me, other.as_str());
    }
    sim.crash(me);
    for other in hosts.iter().filter(|h| h.as_str() != me) {
        sim.repair(me, other.as_str());
    }
    *slots[i].lock().unwrap() = None;
}

fn all_pairs(names: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            out.push((a.clone(), b.clone()));
        }
    }
    out
}

// The run's parts it may touch, each its own argument as before.
#[allow(clippy::too_many_arguments)]
fn inject(
    sim: &mut turmoil::Sim, rng: &mut StdRng, kind: Fault, names: &[String], hosts: &[String],
    slots: &[Slot], disks: &[Disk], crashed: &mut BTreeSet<usize>, failing: &mut BTreeSet<usize>,
) -> Option<(Undo, String)> {
    let n = names.len();
    match kind {
        Fault::Partition => {
            let mut order: Vec<usize> = (0..n).collect();
            order.shuffle(rng);
            let cut = rng.gen_range(1..=n / 2);
            let a: Vec<String> = order[..cut].iter().map(|&i| names[i].clone()).collect();
            let b: Vec<String> = order[cut..].iter().map(|&i| names[i].clone()).collect();
            for x in &a {
                for y in &b {
                    sim.partition(x.as_str(), y.as_str());
                }
            }
            let what = format!("{a:?} | {b:?}");
            Some((Undo::Repair(a, b), what))
        }
        Fault::OneWayPartition => {
            let from = rng.gen_range(0..n);
            let to: Vec<String> = (0..n)
                .filter(|&j| j != from && rng.gen_bool(0.6))
                .map(|j| names[j].clone())
                .collect();
            if to.is_empty() {
                return None;
            }
            for t in &to {
                sim.partition_oneway(names[from].as_str(), t.as_str());
            }
            let what = format!("{} -> {to:?}", names[from]);
            Some((Undo::RepairOneWay(vec![names[from].clone()], to), what))
        }
        Fault::IsolateLeader => {
            let leader = slots.iter().enumerate().find_map(|(i, s)| {
                let s = s.lock().unwrap();
                s.as_ref().filter(|s| s.cluster().is_leader()).map(|_| i)
            })?;
            let others: Vec<String> = (0..n)
                .filter(|&j| j != leader)
                .map(|j| names[j].clone())
                .collect();
            for o in &others {
                sim.partition(names[leader].as_str(), o.as_str());
            }
            let what = names[leader].clone();
            Some((Undo::Repair(vec![what.clone()], others), what))
        }
        Fault::CrashRestart | Fault::TornCrashRestart => {
            // Keep a majority running so that the run makes progress.
            if crashed.len() + 1 > (n - 1) / 2 {
                return None;
            }
            let up: Vec<usize> = (0..n).filter(|i| !crashed.contains(i)).collect();
            let victim = *up.choose(rng)?;
            let mut what = names[victim].clone();
            if kind == Fault::TornCrashRestart {
                let log = &disks[victim].log;
                let ops = rng.gen_range(0..=log.pending());
                let entries = rng.gen_range(0..64);
                log.tear(ops, entries);
                what = format!("{what} torn {ops}+{entries}");
            }
            crash_host(sim, victim, names, hosts, slots);
            crashed.insert(victim);
            Some((Undo::Restart(victim), what))
        }
        Fault::FailedFsync => {
            // Counted as down from now: it stops at its next flush.
            if crashed.len() + 1 > (n - 1) / 2 {
                return None;
            }
            let up: Vec<usize> = (0..n).filter(|i| !crashed.contains(i)).collect();
            let victim = *up.choose(rng)?;
            let keep = rng.gen_range(0..=disks[victim].log.pending() + 1);
            disks[victim].log.fail_next_flush(keep);
            crashed.insert(victim);
            failing.insert(victim);
            let what = format!("{} keeps {keep}", names[victim]);
            Some((Undo::Restart(victim), what))
        }
        Fault::MessageLoss => {
            let pairs: Vec<(String, String)> = all_pairs(names)
                .into_iter()
                .filter(|_| rng.gen_bool(0.5))
                .collect();
            for (a, b) in &pairs {
                sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.05);
            }
            let what = format!("{pairs:?}");
            Some((Undo::FailRate(pairs), what))
        }
        Fault::Delay => {
            let pairs: Vec<(String, String)> = all_pairs(names)
                .into_iter()
                .filter(|_| rng.gen_bool(0.5))
                .collect();
            let max = Duration::from_millis(rng.gen_range(20..400));
            for (a, b) in &pairs {
                sim.set_link_max_message_latency(a.as_str(), b.as_str(), max);
            }
            let what = format!("{pairs:?} {max:?}");
            Some((Undo::Latency(pairs), what))
        }
    }
}

fn undo(sim: &mut turmoil::Sim, u: Undo, names: &[String], crashed: &mut BTreeSet<usize>) {
    match u {
        Undo::Repair(a, b) => {
            for x in &a {
                for y in &b {
                    sim.repair(x.as_str(), y.as_str());
                }
            }
        }
        Undo::RepairOneWay(a, b) => {
            for x in &a {
                for y in &b {
                    sim.repair_oneway(x.as_str(), y.as_str());
                }
            }
        }
        Undo::Restart(i) => {
            if crashed.remove(&i) {
                sim.bounce(names[i].as_str());
            }
        }
        Undo::FailRate(pairs) => {
            for (a, b) in &pairs {
                sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0);
                sim.repair(a.as_str(), b.as_str());
            }
        }
        Undo::Latency(pairs) => {
            for (a, b) in &pairs {
                sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(5));
            }
        }
    }
}

/// Ends every fault (faults only ever touch links between servers).
fn heal(sim: &mut turmoil::Sim, names: &[String]) {
    for (a, b) in all_pairs(names) {
        sim.repair(a.as_str(), b.as_str());
        sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0);
        sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(5));
    }
}

/// Steps until every server has applied the same index as the leader's
/// last log entry, or `limit` passes.
pub(crate) fn wait_converged(sim: &mut turmoil::Sim, slots: &[Slot], limit: Duration) -> bool {
    let deadline = sim.elapsed() + limit;
    while sim.elapsed() < deadline {
        let servers: Vec<Arc<Server>> = slots
            .iter()
            .filter_map(|s| s.lock().unwrap().clone())
            .collect();
        if servers.len() == slots.len() {
            let metrics: Vec<_> = servers.iter().map(|s| s.cluster().metrics()).collect();
            let last = metrics[0].last_log_index;
            let same = metrics.iter().all(|m| {
                m.last_log_index == last
                    && m.last_applied.map(|l| l.index) == last
                    && m.current_leader.is_some()
            });
            if same {
                return true;
            }
        }
        if sim.step().is_err() {
            return false;
        }
    }
    false
}
