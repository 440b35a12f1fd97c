//! The checkers run on a finished run's history.
//!
//! 1. Linearizability, per key, of every write and every `?consistent`
//!    read (including the reads made after the heal): must hold.
//! 2. Durability: every write, plus one observation of the final state
//!    (taken after all servers converged, later than anything else), must
//!    be linearizable. An acknowledged write that was lost, or an answer
//!    that claimed a CAS which never happened, breaks this. The same check
//!    runs on each catalog service (register = set, deregister = delete).
//! 3. Default-mode reads: the history with them added must be
//!    linearizable too. Only a leader holding its lease answers them (a
//!    follower asks the leader; a leader cut off from its quorum answers
//!    none, and one deposed while a read waited sends it on), and no other
//!    leader can be elected within the lease, so in the simulation's exact
//!    clocks they are as fresh as `?consistent` ones. Consul allows them a
//!    small stale window; a run that uses it is a bug here (a follower
//!    answering from its own state, a lease that outlives an election).
//!
//! Server state equality after the heal is checked by the runner.

use std::collections::BTreeMap;

use cairn::state::State;

use crate::linearizability::{Input, Op, Output, Verdict, check};
use crate::report::Report;
use crate::workload::{KEYS, Kind, Record};

/// States one key's search may explore before it gives up.
const BUDGET: usize = 2_000_000;

/// Later than any operation of the run.
const END: u64 = u64::MAX - 1;

fn final_observation(v: Option<u64>) -> Op {
    Op {
        client: u64::MAX,
        input: Input::Get,
        output: Some(Output::Value(v)),
        call: END,
        ret: Some(END),
    }
}

fn describe(ops: &[Op], v: &Verdict) -> String {
    let Verdict::Violation { deepest, stuck_on } = v else {
        return format!("{v:?}");
    };
    let mut s = String::new();
    let tail = deepest.len().saturating_sub(6);
    for &i in &deepest[tail..] {
        s.push_str(&format!("\n      linearized: {:?}", ops[i]));
    }
    if let Some(i) = stuck_on {
        s.push_str(&format!("\n      cannot place: {:?}", ops[*i]));
    }
    s
}

pub fn check_history(history: &[Record], final_state: &State, report: &mut Report) {
    let mut by_key: BTreeMap<&str, Vec<(Op, bool)>> = BTreeMap::new();
    let mut by_service: BTreeMap<(&str, &str), Vec<Op>> = BTreeMap::new();
    for r in history {
        report.ops += 1;
        match &r.kind {
            Kind::Kv {
                key,
                input,
                consistent,
            } => {
                let op = Op {
                    client: r.client,
                    input: *input,
                    output: r.output,
                    call: r.call,
                    ret: r.ret,
                };
                if op.is_write() {
                    if r.ret.is_some() {
                        report.acked_writes += 1;
                    } else {
                        report.unknown_writes += 1;
                    }
                } else if r.ret.is_some() {
                    report.reads += 1;
                }
                by_key.entry(key).or_default().push((op, *consistent));
            }
            Kind::Register { node, service } | Kind::Deregister { node, service } => {
                let input = if matches!(r.kind, Kind::Register { .. }) {
                    Input::Put(1)
                } else {
                    Input::Delete
                };
                if r.ret.is_some() {
                    report.acked_writes += 1;
                } else {
                    report.unknown_writes += 1;
                }
                by_service.entry((node, service)).or_default().push(Op {
                    client: r.client,
                    input,
                    output: r.output,
                    call: r.call,
                    ret: r.ret,
                });
            }
        }
    }

    for key in KEYS {
        let ops = by_key.remove(key).unwrap_or_default();
        report.keys_checked += 1;
        let final_value = final_state
            .kv
            .get(key)
            .and_then(|e| std::str::from_utf8(&e.value).ok()?.parse().ok());

        let strict: Vec<Op> = ops
            .iter()
            .filter(|(o, consistent)| o.is_write() || *consistent)
            .map(|(o, _)| o.clone())
            .collect();
        let strict_holds = match check(None, &strict, BUDGET) {
            Verdict::Linearizable => true,
            v => {
                report.failures.push(format!(
                    "key {key}: writes and consistent reads are not linearizable ({} ops):{}",
                    strict.len(),
                    describe(&strict, &v)
                ));
                false
            }
        };

        let mut durable: Vec<Op> = ops
            .iter()
            .filter(|(o, _)| o.is_write())
            .map(|(o, _)| o.clone())
            .collect();
        durable.push(final_observation(final_value));
        match check(None, &durable, BUDGET) {
            Verdict::Linearizable => {}
            v => report.failures.push(format!(
                "key {key}: acknowledged writes do not explain the final value {final_value:?}:{}",
                describe(&durable, &v)
            )),
        }

        // Judged only when (1) holds for the key, so that a failure here
        // names the default-mode reads.
        if strict_holds {
            let all: Vec<Op> = ops.iter().map(|(o, _)| o.clone()).collect();
            match check(None, &all, BUDGET) {
                Verdict::Linearizable => {}
                v => report.failures.push(format!(
                    "key {key}: a default-mode read saw a state older than an acknowledged write ({} ops):{}",
                    all.len(),
                    describe(&all, &v)
                )),
            }
        }
    }

    for ((node, service), mut ops) in by_service {
        let present = final_state
            .services
            .contains_key(&(node.to_string(), service.to_string()));
        ops.push(final_observation(present.then_some(1)));
        match check(None, &ops, BUDGET) {
            Verdict::Linearizable => {}
            v => report.failures.push(format!(
                "service {node}/{service}: acknowledged register/deregister do not explain its final presence ({present}):{}",
                describe(&ops, &v)
            )),
        }
    }
}
