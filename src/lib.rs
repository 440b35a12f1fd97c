//! cairn: a Consul-compatible service catalog and service-mesh control plane.
//!
//! The crate is split by concern; ARCHITECTURE.md is the map. Its layers,
//! from the top (each module imports only those below it; `tests/layers.rs`
//! holds them):
//!
//! - `process`: assembles a server or agent process from the rest;
//! - `http`: the servers' HTTP API, decode, call, encode;
//! - `leader`: the leader's duties, one set per term;
//! - `endpoint`: the server's API as typed calls, and where each runs;
//! - `federation`: other datacenters, over the Raft port;
//! - `server`, `xds`: a server's core (Raft, state, publisher, proxycfg),
//!   and what Envoy is sent;
//! - `raft`, `proxycfg`, `agent` and below: the transport and consensus,
//!   the proxies' snapshots, the client agent, the state store, the event
//!   stream, the discovery chain, the domain types (`structs`) and the
//!   small pieces everything uses.
#![deny(unsafe_code)]

pub mod acl;
pub mod agent;
pub mod cli;
pub mod config_check;
pub mod config_file;
pub mod connect;
pub mod coordinate;
pub mod definition;
pub mod discovery_chain;
pub mod disk;
pub mod dns;
pub mod endpoint;
pub mod error;
pub mod federation;
pub mod filter;
pub mod http;
pub mod leader;
pub mod leases;
pub mod login;
pub mod merge;
pub mod metrics;
pub mod monitor;
pub mod process;
pub mod proxycfg;
pub mod raft;
pub mod random;
pub mod request;
pub mod server;
pub mod session_ttl;
pub mod shares;
pub mod signal;
pub mod state;
pub mod stream;
pub mod structs;
pub mod tasks;
#[cfg(test)]
pub(crate) mod testing;
pub mod tls;
pub mod xds;
