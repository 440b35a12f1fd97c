//! Connect: the built-in CA (`ca`: roots, rotation with cross-signing,
//! leaf signing), the leaf certificates a server hands out (`Leaves`), and
//! intentions (`intentions`: the legacy API's view of `service-intentions`
//! entries, matching and authorization).
//!
//! Above the state (it reads the CA and the entries from a version) and
//! below proxycfg, the agent and HTTP, which all use it.
//!
//! - `ca`: rotation has the old root cross-sign the new. A CSR is signed
//!   with the SPIFFE URI and Consul's DNS SAN, by the certificate the
//!   root's `signing_key` belongs to (the root, or in a secondary its
//!   intermediate); a leaf's renewal time is `renew_at`. A secondary's
//!   intermediate: `intermediate_csr`; `sign_intermediate` (on the
//!   primary: only the trust domain's signing ID, path length 0,
//!   `IntermediateCertTTL`); `check_intermediate`; `secondary_ca` (the
//!   primary's roots without keys, the intermediate first in the active
//!   one's `IntermediateCerts` and its key as that root's `signing_key`,
//!   the primary's `ClusterID`); `reusable_intermediate`.
//! - `Leaves`: a server's own leaves, per service, re-signed after a
//!   rotation or when due; at most 4096, the least recently requested
//!   dropped first (the leaf endpoint signs for any name a token may
//!   write, so the cache is bounded).
//! - `intentions`: match by source or destination in precedence order, the
//!   L4 decision and its reason. `default_allow` is the decision when
//!   nothing matches: allow with ACLs off, else `--acl-default-policy`.

pub mod ca;
pub mod intentions;

/// Where a client agent sends a CSR to be signed (Consul's `ConnectCA.Sign`
/// RPC): `{"CSR": PEM}` → an `IssuedCert` without a key.
pub const SIGN_PATH: &str = "/v1/internal/connect/ca/sign";

/// Where a secondary datacenter's leader asks the primary to sign its
/// intermediate CA (Consul's `ConnectCA.SignIntermediate`): `{"CSR": PEM}`
/// → `structs::connect::SignedIntermediate`. Answered only for a server of
/// another datacenter, over the authenticated WAN transport.
pub const SIGN_INTERMEDIATE_PATH: &str = "/v1/internal/connect/ca/sign-intermediate";

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::state::State;
use crate::structs::connect::IssuedCert;

/// Leaves a server keeps at most: the leaf endpoint signs for any service
/// name a token may write (a `service_prefix ""` token: any name), so the
/// cache is bounded; past it the leaf requested least recently goes.
const MAX_LEAVES: usize = 4096;

/// A leaf not requested for this long is dropped when another is signed (a
/// watcher asks again at least every blocking wait, at most 10 minutes).
const LEAF_IDLE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Leaves signed here for local use (a server's agent endpoint), one per
/// service: kept while signed by the active root and before their renewal
/// time; re-signed after a rotation or at renewal. At most `cap` of them,
/// those not requested for `LEAF_IDLE` dropped first.
pub struct Leaves {
    /// service → the leaf.
    certs: Mutex<HashMap<String, Held>>,
    /// The last index handed out: a re-signed leaf's index is above every
    /// one before it, so a blocking read on the previous one wakes.
    last_index: Mutex<u64>,
    cap: usize,
}

struct Held {
    /// The active root's id and modify index when it was signed.
    root: String,
    cert: Arc<IssuedCert>,
    /// When it was last requested.
    used: Instant,
}

impl Default for Leaves {
    fn default() -> Self {
        Leaves::with_cap(MAX_LEAVES)
    }
}

impl Leaves {
    /// A cache of at most `cap` leaves.
    pub fn with_cap(cap: usize) -> Self {
        Leaves {
            certs: Mutex::new(HashMap::new()),
            last_index: Mutex::new(0),
            cap: cap.max(1),
        }
    }

    /// Leaves held now.
    pub fn len(&self) -> usize {
        self.certs.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current leaf of `service`, signed now if there is none or it is
    /// due (another root is active, or past its renewal time).
    pub fn get(&self, state: &State, dc: &str, service: &str) -> Result<Arc<IssuedCert>> {
        let ca = state
            .connect_ca
            .as_ref()
            .ok_or_else(|| Error::Internal("the Connect CA is not initialized yet".into()))?;
        // The active root and its version: in a secondary a new
        // intermediate under the same root changes the root's row.
        let active = ca
            .active()
            .map(|r| format!("{}@{}", r.root.id, r.root.modify_index))
            .unwrap_or_default();
        let now = time::OffsetDateTime::now_utc();
        if let Some(held) = self.certs.lock().get_mut(service)
            && held.root == active
            && ca::renew_at(&held.cert) > now
        {
            held.used = Instant::now();
            return Ok(held.cert.clone());
        }
        let trust_domain = format!("{}.consul", state.cluster_id);
        let mut cert = ca::sign_local(ca, &trust_domain, dc, service)?;
        let mut last = self.last_index.lock();
        let index = (*last + 1).max(ca.config.modify_index).max(state.index);
        *last = index;
        cert.create_index = index;
        cert.modify_index = index;
        let cert = Arc::new(cert);
        let mut certs = self.certs.lock();
        let used = Instant::now();
        if !certs.contains_key(service) && certs.len() >= self.cap {
            certs.retain(|_, h| used.duration_since(h.used) < LEAF_IDLE);
            if certs.len() >= self.cap
                && let Some(oldest) = certs
                    .iter()
                    .min_by_key(|(_, h)| h.used)
                    .map(|(k, _)| k.clone())
            {
                certs.remove(&oldest);
            }
        }
        certs.insert(
            service.to_string(),
            Held {
                root: active,
                cert: cert.clone(),
                used,
            },
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_are_bounded_dropping_the_least_recently_requested() {
        let st = State {
            connect_ca: Some(Arc::new(
                ca::initial("11111111-2222-3333-4444-555555555555").unwrap(),
            )),
            ..Default::default()
        };
        let leaves = Leaves::with_cap(2);
        let web = leaves.get(&st, "dc1", "web").unwrap();
        leaves.get(&st, "dc1", "api").unwrap();
        // "web" requested again: "api" is now the least recent.
        assert!(Arc::ptr_eq(&web, &leaves.get(&st, "dc1", "web").unwrap()));
        leaves.get(&st, "dc1", "db").unwrap();
        assert_eq!(leaves.len(), 2);
        assert!(Arc::ptr_eq(&web, &leaves.get(&st, "dc1", "web").unwrap()));
        for i in 0..10 {
            leaves.get(&st, "dc1", &format!("svc{i}")).unwrap();
        }
        assert_eq!(leaves.len(), 2);
    }

    /// In a secondary a new intermediate under the same root (its key
    /// size changed, or renewed) changes the root's row: leaves held are
    /// signed again by it.
    #[test]
    fn a_new_intermediate_under_the_same_root_signs_leaves_again() {
        let td = "11111111-2222-3333-4444-555555555555.consul";
        let primary = ca::initial("11111111-2222-3333-4444-555555555555").unwrap();
        let shown = crate::state::connect::roots(&State {
            cluster_id: "11111111-2222-3333-4444-555555555555".into(),
            connect_ca: Some(Arc::new(primary.clone())),
            ..Default::default()
        })
        .unwrap();
        let secondary = |index: u64| {
            let (key_pem, csr) = ca::intermediate_csr(td, "ec", 256).unwrap();
            let cert_pem = ca::sign_intermediate(&primary, td, "dc2", &csr).unwrap();
            let int = ca::Intermediate { cert_pem, key_pem };
            let mut sec = ca::secondary_ca(None, &shown, &int).unwrap();
            sec.roots[0].root.modify_index = index;
            let st = State {
                cluster_id: "11111111-2222-3333-4444-555555555555".into(),
                connect_ca: Some(Arc::new(sec)),
                ..Default::default()
            };
            (st, int)
        };
        let leaves = Leaves::default();
        let (st1, int1) = secondary(5);
        let a = leaves.get(&st1, "dc2", "web").unwrap();
        assert!(a.cert_pem.contains(int1.cert_pem.trim()));
        assert!(Arc::ptr_eq(&a, &leaves.get(&st1, "dc2", "web").unwrap()));
        let (st2, int2) = secondary(9);
        let b = leaves.get(&st2, "dc2", "web").unwrap();
        assert!(b.cert_pem.contains(int2.cert_pem.trim()), "signed again");
        assert!(b.modify_index > a.modify_index);
    }
}
