//! Connect: the built-in CA (`ca`: roots, rotation with cross-signing,
//! leaf signing), the leaf certificates a server hands out (`Leaves`), and
//! intentions (`intentions`: the legacy API's view of `service-intentions`
//! entries, matching and authorization).
//!
//! Above the state (it reads the CA and the entries from a version) and
//! below proxycfg, the agent and HTTP, which all use it.

pub mod ca;
pub mod intentions;

/// Where a client agent sends a CSR to be signed (Consul's `ConnectCA.Sign`
/// RPC): `{"CSR": PEM}` → an `IssuedCert` without a key.
pub const SIGN_PATH: &str = "/v1/internal/connect/ca/sign";

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::state::State;
use crate::structs::connect::IssuedCert;

/// Leaves signed here for local use (a server's agent endpoint, its proxies'
/// snapshots), one per service: kept while signed by the active root and
/// before their renewal time; re-signed after a rotation or at renewal.
#[derive(Default)]
pub struct Leaves {
    /// service → (active root id it was signed by, the leaf).
    certs: Mutex<HashMap<String, (String, Arc<IssuedCert>)>>,
    /// The last index handed out: a re-signed leaf's index is above every
    /// one before it, so a blocking read on the previous one wakes.
    last_index: Mutex<u64>,
}

impl Leaves {
    /// The current leaf of `service`, signed now if there is none or it is
    /// due (another root is active, or past its renewal time).
    pub fn get(&self, state: &State, dc: &str, service: &str) -> Result<Arc<IssuedCert>> {
        let ca = state
            .connect_ca
            .as_ref()
            .ok_or_else(|| Error::Internal("the Connect CA is not initialized yet".into()))?;
        let active = ca.active().map(|r| r.root.id.clone()).unwrap_or_default();
        let now = time::OffsetDateTime::now_utc();
        if let Some((root, cert)) = self.certs.lock().get(service)
            && *root == active
            && ca::renew_at(cert) > now
        {
            return Ok(cert.clone());
        }
        let trust_domain = format!("{}.consul", state.cluster_id);
        let mut cert = ca::sign_local(ca, &trust_domain, dc, service)?;
        let mut last = self.last_index.lock();
        let index = (*last + 1).max(ca.config.modify_index).max(state.index);
        *last = index;
        cert.create_index = index;
        cert.modify_index = index;
        let cert = Arc::new(cert);
        self.certs
            .lock()
            .insert(service.to_string(), (active, cert.clone()));
        Ok(cert)
    }
}

/// A service name that can be a SPIFFE ID's last segment.
pub fn check_service_name(service: &str) -> Result<()> {
    let ok = !service.is_empty()
        && service
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::bad(format!(
            "invalid service name {service:?}: letters, digits, '-', '_' and '.' only"
        )))
    }
}
