//! ACL initialisation: with ACLs on, the built-in policy and anonymous
//! token, and the initial management token, written once they are missing
//! (each new leader checks again; apply makes it idempotent).

use std::sync::Arc;
use std::time::Duration;

use crate::server::Server;
use crate::state::Command;
use crate::structs::acl::{ANONYMOUS_ID, GLOBAL_MANAGEMENT_ID, management_token, secret_hash};

pub async fn init(s: Arc<Server>) {
    if !s.acl().enabled() {
        return;
    }
    let initial = s.acl().config().initial_management.clone();
    while missing(&s, initial.as_deref()) {
        let token = initial
            .as_deref()
            .map(|secret| management_token("Initial Management Token", secret));
        if let Err(e) = s
            .write(Command::AclInit {
                initial_management: token.map(Box::new),
            })
            .await
        {
            tracing::warn!(error = %e, "ACL init not written yet");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn missing(s: &Server, initial: Option<&str>) -> bool {
    let st = s.state();
    !st.acl_policies.contains_key(GLOBAL_MANAGEMENT_ID)
        || !st.acl_tokens.contains_key(ANONYMOUS_ID)
        || initial.is_some_and(|i| !st.acl_secrets.contains_key(&secret_hash(i)))
}
