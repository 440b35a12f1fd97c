//! On taking office: drop a snapshot restore left half-staged (its proposer
//! lost office or crashed: nobody will commit it), then give the cluster its
//! id and, in a primary (or lone) datacenter, its Connect CA's first root,
//! once. A secondary makes no root: its CA is the primary's roots with an
//! intermediate the primary signs (`leader::connect_ca`), and until that
//! is written it signs nothing (the CA endpoints answer "not initialized
//! yet", as Consul's secondary waits for the primary's roots), so no leaf
//! ever chains to a root the rest of the federation does not know.

use std::sync::Arc;
use std::time::Duration;

use crate::server::Server;
use crate::state::Command;

/// How long a failed write waits before it is tried again.
const RETRY: Duration = Duration::from_millis(200);

pub async fn establish(s: Arc<Server>) {
    // Only the id seen now: a restore this leader starts later has another
    // id and is left alone.
    if let Some(staged) = &s.state().restore {
        let cmd = Command::RestoreAbort {
            id: staged.id.clone(),
        };
        if let Err(e) = s.raft().client_write(cmd.into()).await {
            tracing::warn!(error = %e, "could not drop a half-staged restore");
        }
    }
    while s.state().cluster_id.is_empty() {
        let cmd = Command::InitCluster {
            cluster_id: uuid::Uuid::new_v4().to_string(),
        };
        if let Err(e) = s.raft().client_write(cmd.into()).await {
            tracing::warn!(error = %e, "could not record the cluster id");
            tokio::time::sleep(RETRY).await;
        }
    }
    if s.config().primary() != s.datacenter() {
        return;
    }
    // The Connect CA's first root, once the cluster has its id (the trust
    // domain is made from it).
    loop {
        let state = s.state();
        if state.connect_ca.is_some() {
            return;
        }
        let written = match crate::connect::ca::initial(&state.cluster_id) {
            Ok(ca) => {
                let cmd = Command::CaSet {
                    ca: Box::new(ca),
                    cas: Some(0),
                };
                s.raft()
                    .client_write(cmd.into())
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        match written {
            Ok(()) => tracing::info!("connect: CA initialized with a new root"),
            Err(e) => {
                tracing::warn!(error = %e, "could not make the Connect CA's first root");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}
