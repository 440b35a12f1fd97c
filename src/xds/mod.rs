//! The xDS server: a proxy's proxycfg snapshot in, Envoy resources out.
//! `resources` builds listeners, clusters, routes and endpoints from a
//! snapshot (as Consul's `agent/xds` names them), `rbac` turns intentions
//! into RBAC filters, `delta` is the incremental protocol of one stream,
//! `sotw` the state-of-the-world one (and its stream's task), `grpc` the
//! resources of gRPC's proxyless client, and `server` serves Envoy's
//! Aggregated Discovery Service (both variants) over gRPC. It reads no
//! state: the proxy's snapshot comes through a `Source`.

pub mod delta;
pub mod gateway;
pub mod generate;
pub mod grpc;
pub mod rbac;
pub mod resources;
pub mod server;
pub mod sotw;
#[cfg(test)]
mod tests;

pub use generate::generate;
pub use resources::{Identity, Resources};
pub use server::{Ads, Caller, Limits, Source, TOKEN_METADATA};
