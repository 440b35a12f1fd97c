//! A client agent's leaf certificates (`/v1/agent/connect/ca/leaf/:service`):
//! the agent makes the key and a CSR, a server signs the CSR (Consul's sign
//! flow), and the key never leaves the agent. Leaves are cached per service
//! and signed again after a root rotation or past their renewal time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde_json::json;

use super::Agent;
use crate::connect::ca;
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::{Params, QueryOptions};
use crate::structs::connect::{CaRoots, IssuedCert};

/// Leaves the agent keeps at most: past it the one due for renewal first
/// makes room, so callers naming ever new services cannot grow the agent
/// without bound.
const MAX_LEAVES: usize = 4_096;

/// service → (the active root it was signed under, the leaf).
#[derive(Default)]
pub struct AgentLeaves {
    certs: Mutex<HashMap<String, (String, Arc<IssuedCert>)>>,
    last_index: Mutex<u64>,
}

impl Agent {
    /// The current leaf of `service`: the cached one while its root is
    /// active and it is before its renewal time, else a new one.
    async fn leaf_for(
        &self, service: &str, roots: &CaRoots, roots_index: u64,
    ) -> Result<Arc<IssuedCert>> {
        let now = time::OffsetDateTime::now_utc();
        if let Some((root, cert)) = self.leaves.certs.lock().get(service)
            && *root == roots.active_root_id
            && ca::renew_at(cert) > now
        {
            return Ok(cert.clone());
        }
        // The key is of the active root's type and size, as Consul's
        // agents make it from the CA configuration; made off the async
        // workers (an RSA key takes up to seconds).
        let (key_type, bits) = roots
            .roots
            .iter()
            .find(|r| r.active)
            .map(|r| (r.private_key_type.clone(), r.private_key_bits))
            .unwrap_or_else(|| ("ec".into(), 256));
        let (td, dc, svc) = (
            roots.trust_domain.clone(),
            self.datacenter(),
            service.to_string(),
        );
        let (key, csr) =
            tokio::task::spawn_blocking(move || ca::new_csr(&td, &dc, &svc, &key_type, bits))
                .await
                .map_err(|e| Error::Internal(format!("leaf key: {e}")))??;
        let body = self
            .servers
            .put(crate::connect::SIGN_PATH, &json!({ "CSR": csr }))
            .await?;
        let mut cert: IssuedCert = serde_json::from_slice(&body)
            .map_err(|e| Error::Internal(format!("sign answer: {e}")))?;
        cert.private_key_pem = key;
        let index = {
            let mut last = self.leaves.last_index.lock();
            *last = (*last + 1).max(roots_index);
            *last
        };
        cert.create_index = index;
        cert.modify_index = index;
        let cert = Arc::new(cert);
        self.leaves
            .keep(service, roots.active_root_id.clone(), cert.clone());
        Ok(cert)
    }
}

impl AgentLeaves {
    /// Keeps `cert` as `service`'s leaf, within `MAX_LEAVES`.
    fn keep(&self, service: &str, root: String, cert: Arc<IssuedCert>) {
        let mut certs = self.certs.lock();
        if certs.len() >= MAX_LEAVES && !certs.contains_key(service) {
            let first_due = certs
                .iter()
                .min_by_key(|(_, (_, c))| ca::renew_at(c))
                .map(|(name, _)| name.clone());
            if let Some(name) = first_due {
                certs.remove(&name);
            }
        }
        certs.insert(service.to_string(), (root, cert));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.certs.lock().len()
    }
}

/// `GET /v1/agent/connect/ca/leaf/:service` on a client agent, blocking on
/// `?index` until a new leaf: the roots are watched on a server (a blocking
/// read), and the renewal time bounds each wait.
pub async fn leaf(
    State(a): State<Arc<Agent>>, z: Authz, Path(service): Path<String>, RawQuery(q): RawQuery,
) -> Result<Response> {
    z.require(z.service_write(&service), "service:write", &service)?;
    let p = Params::parse(q.as_deref());
    let opts = QueryOptions::from(&p, &a.datacenter())?;
    crate::connect::check_service_name(&service)?;
    let deadline = opts.deadline();
    let mut roots_index = 0;
    loop {
        let now = tokio::time::Instant::now();
        let wait = deadline.saturating_duration_since(now);
        let (roots, index): (CaRoots, u64) = a
            .servers
            .get(
                &format!(
                    "/v1/connect/ca/roots?index={roots_index}&wait={}ms",
                    wait.as_millis().max(1)
                ),
                wait + Duration::from_secs(30),
            )
            .await?;
        roots_index = index;
        let cert = a.leaf_for(&service, &roots, index).await?;
        let now = tokio::time::Instant::now();
        if opts.index == 0 || cert.modify_index > opts.index || now >= deadline {
            let mut resp = axum::Json(&*cert).into_response();
            resp.headers_mut()
                .insert("x-consul-index", cert.modify_index.into());
            return Ok(resp);
        }
        // The next roots read blocks until a rotation or the wait's end;
        // a leaf due for renewal before that is signed when it comes.
        let until_renew: Duration = (ca::renew_at(&cert) - time::OffsetDateTime::now_utc())
            .try_into()
            .unwrap_or(Duration::ZERO);
        if until_renew < deadline.saturating_duration_since(now) {
            tokio::time::sleep(until_renew).await;
            roots_index = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(after: &str, before: &str) -> Arc<IssuedCert> {
        Arc::new(IssuedCert {
            valid_after: after.into(),
            valid_before: before.into(),
            ..Default::default()
        })
    }

    #[test]
    fn the_cache_stays_within_its_cap_dropping_the_leaf_due_first() {
        let leaves = AgentLeaves::default();
        let late = cert("2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z");
        let early = cert("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z");
        leaves.keep("due-first", "r".into(), early);
        for i in 1..MAX_LEAVES {
            leaves.keep(&format!("s{i}"), "r".into(), late.clone());
        }
        assert_eq!(leaves.len(), MAX_LEAVES);
        // Another service: the one due first makes room.
        leaves.keep("new", "r".into(), late.clone());
        assert_eq!(leaves.len(), MAX_LEAVES);
        let certs = leaves.certs.lock();
        assert!(certs.contains_key("new") && !certs.contains_key("due-first"));
        drop(certs);
        // A leaf renewed in place takes no other's room.
        leaves.keep("s1", "r2".into(), late);
        assert_eq!(leaves.len(), MAX_LEAVES);
        assert!(leaves.certs.lock().contains_key("s2"));
    }
}
