//! Central config merged into proxy registrations (the agentless path).
//!
//! Consul does this in two steps, and so do we:
//!
//! 1. [`resolve_service_config`] flattens the config entries that apply to
//!    one proxy — `proxy-defaults/global`, the `service-defaults` of the
//!    service it fronts, and the `service-defaults` of each of its upstreams
//!    — into one [`ResolvedServiceConfig`] (Consul's
//!    `ComputeResolvedServiceConfig`).
//! 2. [`merge_service_config`] lays that under the registration: what the
//!    registration says wins, central config fills the gaps, and in
//!    transparent mode centrally configured upstreams are added (Consul's
//!    `MergeServiceConfig`).
//!
//! [`merge_node_service`] does both against a state version, for the
//! `?merge-central-config` reads and the dataplane bootstrap endpoint. The
//! stored catalog is never changed: merging returns a new `NodeService`.
//!
//! Blocking queries that merge must also wake when a feeding entry changes:
//! [`merge_watch_keys`] lists the config keys a merge read, and
//! [`merge_index`] the index they imply.
//!
//! Namespaces and partitions are not served: everything is `default`.

mod flatten;
mod service;

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
mod tests;

pub use flatten::MODE_TRANSPARENT;
pub use service::{
    PARAM, merge_instances, merge_node_service, merge_watch_keys, merge_with_central_config,
    read_watch_keys, should_merge,
};
