//! The xDS server: a proxy's proxycfg snapshot in, Envoy resources out.
//! It reads no state: the proxy's snapshot comes through a `Source`.
//!
//! From the bottom up: `rbac` turns intentions into RBAC filters;
//! `resources` holds what every generator shares (Envoy's pieces, as
//! Consul's `agent/xds` names them); `sidecar` builds a sidecar's
//! listeners, clusters, routes and endpoints (`transparent` its outbound
//! listener when it is a transparent proxy), `gateway` a gateway's and
//! `grpc` a proxyless gRPC client's; `generate` picks a proxy's generator
//! by its kind; `share` holds what the proxies' resources share (an
//! upstream's clusters, endpoints and routes, built once for all the
//! proxies with the same ones). `stream` is
//! what every ADS stream shares, with the one task that serves a stream
//! whatever its protocol; `delta` (incremental) and `sotw` (state of the
//! world) are the protocols, each a session without I/O that the task
//! drives; `server` is the gRPC service that admits streams and spawns
//! their tasks.

pub mod delta;
pub mod gateway;
pub mod generate;
pub mod grpc;
pub mod rbac;
pub mod resources;
pub mod server;
mod share;
pub mod sidecar;
pub mod sotw;
pub mod stream;
#[cfg(test)]
mod tests;
pub mod transparent;

pub use generate::generate;
pub use resources::{Identity, Resources};
pub use server::Ads;
pub use stream::{Caller, Limits, Source, TOKEN_METADATA};
