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
//!
//! Details the files' own docs leave to this one:
//!
//! - `resources`: typed with `envoy-types`' generated Envoy protos. A
//!   `Resource` keeps its encoding behind an `Arc`. The snapshot's
//!   `Identity` carries the mesh entry's `TLS.Incoming`/`Outgoing` as the
//!   TLS parameters of the contexts it accepts and dials with.
//! - `share`: entries are kept while used (two generations). A transparent
//!   proxy's inferred upstreams and gateways' resources are built per
//!   proxy.
//! - `gateway`: an ingress listener's TLS uses the gateway's leaf, which
//!   names `*.ingress.<domain>` and the services' hosts
//!   (`proxycfg::Shared::leaf_with_dns`), or SDS certificates (a filter
//!   chain per service with its own, by SNI, routes `<port>_<svc>`). A
//!   terminating gateway's http service gets the HTTP filter with L7
//!   permissions and RDS routes. A sidecar's target behind mesh gateways
//!   has the gateways as endpoints (`proxycfg::gateway_address`: WAN for
//!   another datacenter's, LAN for this one's) while the target has a
//!   healthy instance, its SNI and SPIFFE ID unchanged.
//! - `stream`: the first request must come within its timeout; the names
//!   a stream subscribes to are bounded; NACKs are logged and counted. The
//!   one build thread takes every build waiting each time it wakes and
//!   hands out at most `WOKEN` (32) results whose streams have not yet
//!   taken them in, so a change every proxy sees leaves the async workers
//!   to HTTP and Raft instead of queueing thousands of woken streams ahead
//!   of them. On a runtime of one thread (the simulation's hosts) it runs
//!   in place, as `tasks::off_workers` runs such work there.
//! - `server`: on a SotW stream the token may come in the node's metadata
//!   (gRPC's bootstrap sets no call metadata).

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
