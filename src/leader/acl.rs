//! ACL initialisation: with ACLs on, the built-in policy and anonymous
//! token, and the initial management token, written once they are missing
//! (each new leader checks again; apply makes it idempotent). A secondary
//! writes its initial management token only while it holds no global
//! token yet (see `init`).

use std::sync::Arc;
use std::time::Duration;

use crate::federation::Federation;
use crate::server::Server;
use crate::state::Command;
use crate::structs::acl::{ANONYMOUS_ID, GLOBAL_MANAGEMENT_ID, management_token, secret_hash};

pub async fn init(s: Arc<Server>, federation: Option<Arc<Federation>>) {
    if !s.acl().enabled() {
        return;
    }
    let mut initial = s.acl().config().initial_management.clone();
    // In a secondary the primary's global tokens rule (replication makes
    // them these): its own initial management token only lets it be run
    // before anything came from the primary, and replication replaces it
    // (or drops it, if the primary has no token of that secret).
    if federation.is_some_and(|f| f.is_secondary()) && replicated_into(&s) {
        initial = None;
    }
    while missing(&s, initial.as_deref()) {
        let token = initial.as_deref().map(|secret| {
            let mut t = management_token("Initial Management Token", secret);
            s.seal_secret(&mut t, secret);
            t
        });
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

/// Whether the state holds a global token besides the anonymous one: what
/// the primary's replication brings.
fn replicated_into(s: &Server) -> bool {
    s.state()
        .acl_tokens
        .values()
        .any(|t| !t.local && t.accessor_id != ANONYMOUS_ID)
}

fn missing(s: &Server, initial: Option<&str>) -> bool {
    let st = s.state();
    !st.acl_policies.contains_key(GLOBAL_MANAGEMENT_ID)
        || !st.acl_tokens.contains_key(ANONYMOUS_ID)
        || initial.is_some_and(|i| !st.acl_secrets.contains_key(&secret_hash(i)))
}
