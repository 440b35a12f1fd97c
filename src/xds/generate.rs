//! Every resource of a proxy's snapshot, by the proxy's kind: a gateway's
//! (`super::gateway`), else a sidecar's (`super::sidecar`). What a
//! sidecar's or a gateway's stream serves, and `xds::generate` outside.
//! (A proxyless gRPC client's snapshot is another's: `super::grpc`.)

use super::resources::Resources;
use crate::proxycfg::Snapshot;

/// Every resource of one proxy's snapshot.
pub fn generate(snap: &Snapshot) -> Resources {
    match &snap.gateway {
        Some(gw) => super::gateway::generate(snap, gw),
        None => super::sidecar::generate(snap),
    }
}
