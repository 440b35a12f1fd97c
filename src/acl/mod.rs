//! Consul's ACL policy language and the decisions made from it: pure
//! functions over rule text, no I/O and no state, so that every layer that
//! enforces (state filters, HTTP handlers, the agent) can use them.
//!
//! `rules` parses a policy's `Rules` (HCL or JSON) into per-resource tables;
//! `authz` merges a token's policies into an `Authorizer` that answers one
//! yes/no question per Consul permission (`key:read`, `service:write`, ...);
//! `seal` keeps a token's secret sealed beside its hash, for the servers
//! to show again.

pub mod authz;
pub mod rules;
pub mod seal;

pub use authz::{Authorizer, DefaultPolicy, Denied};
pub use rules::{Access, Named, Rules, RulesError, parse_rules};
