//! `cargo run -p sim --release -- --seeds N`: runs N seeds of the 3- and
//! 5-server scenarios and prints, for any failing seed, the one command that
//! replays it (`--servers S --seed X`); `--federation` runs the seeds of
//! the federation scenario instead, each with two and with three
//! datacenters (`--datacenters N`: only N).

use std::time::Instant;

use sim::run::{Scenario, run};

fn arg(args: &[String], name: &str) -> Option<u64> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

/// Log lines stamped with simulated time, so two runs of a seed can be
/// compared line by line (`SIM_LOG=debug`, a `RUST_LOG`-style filter).
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let t = turmoil::sim_elapsed().unwrap_or_default();
        write!(w, "{:>10.3}ms", t.as_secs_f64() * 1000.0)
    }
}

fn main() {
    if let Ok(filter) = std::env::var("SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(SimTime)
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().collect();
    let seeds = arg(&args, "--seeds").unwrap_or(50);
    let first = arg(&args, "--first").unwrap_or(0);
    let single = arg(&args, "--seed");
    let sizes: Vec<usize> = match arg(&args, "--servers") {
        Some(n) => vec![n as usize],
        None => vec![3, 5],
    };
    let verbose = single.is_some() || args.iter().any(|a| a == "-v");
    let repeat = arg(&args, "--repeat").unwrap_or(1) as usize;
    let range: Vec<u64> = match single {
        Some(s) => vec![s; repeat],
        None => (first..first + seeds).collect(),
    };
    if args.iter().any(|a| a == "--federation") {
        let dcs: Vec<usize> = match arg(&args, "--datacenters") {
            Some(n) => vec![n as usize],
            None => vec![2, 3],
        };
        return federation(&range, &dcs, verbose);
    }
    let started = Instant::now();
    let mut failed = Vec::new();
    let mut runs = 0;
    let mut faults = std::collections::BTreeMap::new();
    let (mut ops, mut acked, mut indexes, mut locks, mut handoffs) = (0, 0, 0, 0, 0);
    for &n in &sizes {
        let scenario = Scenario::new(n);
        for &seed in &range {
            let t = Instant::now();
            let r = run(&scenario, seed);
            runs += 1;
            for (kind, n) in &r.faults {
                *faults.entry(*kind).or_insert(0) += n;
            }
            ops += r.ops;
            acked += r.acked_writes;
            indexes += r.stream.indexes;
            locks += r.locks_held;
            handoffs += r.ttl_handoffs;
            if verbose || !r.passed() {
                println!(
                    "servers={n} seed={seed} {} in {:.1?}: {} ops ({} acked writes, {} unknown, {} reads), faults {:?} (max {} at once), stream: {} indexes, {} resumes, {} snapshots, {} restarts, tombstones reaped up to {}, burst writes acked {}, fsync fail-stops {}, rejoin {:?}, trace {:016x}",
                    if r.passed() { "ok" } else { "FAILED" },
                    t.elapsed(),
                    r.ops,
                    r.acked_writes,
                    r.unknown_writes,
                    r.reads,
                    r.faults,
                    r.max_concurrent_faults,
                    r.stream.indexes,
                    r.stream.resumes,
                    r.stream.snapshots,
                    r.stream.restarts,
                    r.reaped_tombstones,
                    r.burst_acked,
                    r.fsync_stops,
                    r.rejoin,
                    r.trace_hash,
                );
            }
            if let Some(a) = r.acl.as_ref().filter(|_| verbose || !r.passed()) {
                println!(
                    "  acl: token {} at index {}, accepted {} times before, refused {} times after; {} anonymous requests refused",
                    match a.doom {
                        sim::acl::Doom::Deleted => "deleted",
                        sim::acl::Doom::MethodDeleted => "deleted with its auth method",
                        sim::acl::Doom::Expires => "expired, then reaped",
                    },
                    a.delete_index,
                    a.accepted_before,
                    a.refused_after,
                    a.anonymous_refused
                );
            }
            if let Some(d) = r.dns.as_ref().filter(|_| verbose || !r.passed()) {
                println!(
                    "  dns: {} answers checked ({} after the narrowing): {} with a readable service, {} with a readable node, {} NXDOMAIN for an unreadable name",
                    d.answers,
                    d.after_narrowing,
                    d.services_answered,
                    d.nodes_answered,
                    d.denied_nxdomain
                );
            }
            if let Some(m) = r.mesh.as_ref().filter(|_| verbose || !r.passed()) {
                println!(
                    "  mesh: {} xDS pushes on {} streams checked ({} held to the narrowed rules), {} streams' final holdings narrowed",
                    m.pushes, m.streams, m.strict_pushes, m.ends_checked
                );
            }
            if !r.passed() {
                for f in &r.failures {
                    println!("  {f}");
                }
                println!("  reproduce: {}", r.repro());
                failed.push(r.repro());
            }
        }
    }
    println!(
        "{} passed, {} failed ({runs} runs in {:.1?})",
        runs - failed.len(),
        failed.len(),
        started.elapsed()
    );
    println!(
        "checked: {ops} operations ({acked} acknowledged writes), {indexes} event-stream indexes, {locks} lock holds ({handoffs} freed by a TTL's expiry); faults injected: {faults:?}"
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

/// `--federation`: the seeds of the federation scenario, with each number
/// of datacenters in `dcs`.
fn federation(seeds: &[u64], dcs: &[usize], verbose: bool) {
    let started = Instant::now();
    let mut failed = 0;
    for (&n, &seed) in dcs.iter().flat_map(|n| seeds.iter().map(move |s| (n, s))) {
        let t = Instant::now();
        let r = sim::federation::run_with(seed, n);
        if verbose || !r.passed() {
            println!(
                "federation datacenters={n} seed={seed} {} in {:.1?}: {} ops ({} acked writes), faults {:?}, {:?}, trace {:016x}",
                if r.passed() { "ok" } else { "FAILED" },
                t.elapsed(),
                r.ops,
                r.acked_writes,
                r.faults,
                r.federation,
                r.trace_hash
            );
        }
        if !r.passed() {
            for f in &r.failures {
                println!("  {f}");
            }
            println!("  reproduce: {}", r.repro());
            failed += 1;
        }
    }
    println!(
        "federation: {} passed, {failed} failed in {:.1?}",
        dcs.len() * seeds.len() - failed,
        started.elapsed()
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
