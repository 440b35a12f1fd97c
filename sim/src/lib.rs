//! Deterministic simulation of cairn clusters on turmoil: the real server
//! code (Raft, state store, request path) on simulated hosts, faults chosen
//! by a seed, and checkers that fail when an acknowledged write is lost or
//! a history is not linearizable. See `run` for how a run goes.

pub mod checks;
pub mod linearizability;
pub mod mem_log;
pub mod node;
pub mod run;
pub mod workload;
