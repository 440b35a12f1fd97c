//! Consul-shaped domain types and their JSON, in one place.
//!
//! Every type here serializes exactly as Consul's HTTP API shows it, so the
//! HTTP layer hands them to serde and nothing else re-declares them.
//!
//! What the files hold, beyond their own docs:
//!
//! - `catalog`: a service's `Proxy` block is allocated only for proxies
//!   (`ProxyBlock`).
//! - `config_entry`: each kind is declared through `config_entry!`, around
//!   the envelope every kind shares (Kind, Name, Namespace, Partition,
//!   Meta, the indexes); `shape`'s `entry!` adds the same envelope to
//!   their JSON shapes.
//! - `agent`: `serfHealth`, the agent node meta key, maintenance check IDs,
//!   the heartbeat reply (with the answering server's node and coordinate),
//!   the `Member` row of `/v1/agent/members`.
//! - `acl` (tokens, policies, roles, the built-ins, secret hashing, an
//!   agent's tokens, the `Identities` a token or role holds) and `identity`
//!   (what identities mean, as pure functions: Consul's built-in templates
//!   `builtin/service`, `node`, `dns`, `nomad-server`, `api-gateway` and
//!   `nomad-client`; an identity's rule text in a datacenter; their checks
//!   and deduplication in Consul's words; a template's synthetic policy for
//!   the preview).
//! - `query`: templates are `name_prefix_match`, with an optional `Regexp`.
//! - `schema_drift_tests`: a test per filterable row type checks its JSON
//!   keys against its `filter::schemas` selectors.

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
