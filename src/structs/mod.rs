//! Consul-shaped domain types and their JSON, in one place.
//!
//! Every type here serializes exactly as Consul's HTTP API shows it, so the
//! HTTP layer hands them to serde and nothing else re-declares them.

pub mod acl;
pub mod agent;
pub mod auth;
pub mod catalog;
pub mod config_entry;
pub mod connect;
pub mod duration;
pub mod event;
pub mod federation;
pub mod health;
pub mod identity;
pub mod kv;
pub mod operator;
pub mod query;
pub mod replication;
pub mod rows;
pub mod serde_util;
pub mod session;
pub mod txn;
pub mod validate;

pub use catalog::*;
pub use health::*;
pub use kv::*;
pub use session::*;
pub use txn::*;
#[cfg(test)]
mod schema_drift_tests;
