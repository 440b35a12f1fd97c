//! cairn: a Consul-compatible service catalog and service-mesh control plane.
//!
//! The crate is split by concern; ARCHITECTURE.md is the map. Its layers,
//! from the top (each module imports only those below it; `tests/layers.rs`
//! holds them):
//!
//! - `process`: assembles a server or agent process from the rest;
//! - `http`, `grpc`: the servers' HTTP API and gRPC port, decode, call,
//!   encode;
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
pub(crate) mod config_check;
pub mod config_file;
pub(crate) mod connect;
pub(crate) mod coordinate;
pub(crate) mod definition;
pub(crate) mod discovery_chain;
pub mod disk;
pub mod dns;
pub mod endpoint;
pub mod error;
pub mod federation;
pub mod filter;
pub mod flags;
pub mod grpc;
pub(crate) mod http;
pub mod leader;
pub(crate) mod leases;
pub(crate) mod login;
pub(crate) mod merge;
pub(crate) mod metrics;
pub mod monitor;
pub mod process;
pub mod proxycfg;
pub mod raft;
pub(crate) mod random;
pub mod request;
pub mod server;
pub(crate) mod session_ttl;
pub(crate) mod shares;
pub(crate) mod signal;
pub mod state;
pub mod stream;
pub mod structs;
pub mod tasks;
#[cfg(test)]
pub(crate) mod testing;
pub mod tls;
pub mod xds;
