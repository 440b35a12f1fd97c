//! A secondary datacenter's Connect CA, Consul's model: one trust domain
//! for the whole federation. The secondary's leader holds the primary's
//! roots (their certificates, never their keys) and an intermediate CA of
//! its own, signed by the primary's active root, whose key signs this
//! datacenter's leaves; so a leaf of any datacenter verifies against the
//! roots of any other.
//!
//! The duty keeps that true: it watches the primary's roots (a blocking
//! read over the WAN transport, `Federation::ask_primary`), and whenever
//! they, this datacenter's CA configuration or the intermediate's age call
//! for it, it makes a new key and CSR here, has the primary sign it
//! (`Federation::sign_intermediate`: only another datacenter's server may
//! ask), checks what came back, and writes the primary's roots with the
//! intermediate under the active one as one `Command::CaSet` (the state's
//! cluster id, so the trust domain, becomes the primary's in that write).
//! A root rotation in the primary thus reaches every secondary. Nothing is
//! written when nothing differs; failures are retried with a growing pause
//! while the secondary signs with what it has. A new term starts over from
//! a plain read, so a new leader resumes where the state is.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::connect::ca::{self, Intermediate};
use crate::federation::{Federation, Replicated};
use crate::server::Server;
use crate::state::{Command, Response, keys};
use crate::structs::connect::{CaRoots, SignedIntermediate};

/// How long one read of the primary's roots waits for a change.
const WAIT: Duration = Duration::from_secs(60);
/// A plain read's or a signing's time limit.
const TIMEOUT: Duration = Duration::from_secs(10);
/// CAS losses in a row (a configuration PUT racing) before a pause.
const CAS_TRIES: usize = 5;

pub async fn run(s: Arc<Server>, federation: Option<Arc<Federation>>) {
    let Some(fed) = federation else {
        return;
    };
    if !fed.is_secondary() {
        return;
    }
    let _running = super::replication::Running::start(fed.clone(), Replicated::Ca);
    // The primary's roots last read, at their index there.
    let mut roots: Option<(u64, CaRoots)> = None;
    // Block past this index; None: a plain read.
    let mut after: Option<u64> = None;
    let mut backoff = super::replication::Backoff::new(&fed);
    loop {
        backoff.attempt();
        // Subscribed before the state is read: a configuration PUT after
        // it wakes the wait below.
        let mut local = s.watches().subscribe(&keys::CONNECT_CA);
        let mut renew = None;
        if let Some((index, primary)) = &roots {
            match reconcile(&s, &fed, primary).await {
                Ok(at) => {
                    renew = Some(at);
                    backoff.succeeded();
                    fed.replication().update(Replicated::Ca, |r| {
                        r.index = *index;
                        r.last_success = Some(SystemTime::now());
                    });
                }
                Err(e) => {
                    failed(&fed, e);
                    backoff.failed().await;
                    after = None;
                    continue;
                }
            }
        }
        let until_renew = renew
            .map(|at: time::OffsetDateTime| {
                (at - time::OffsetDateTime::now_utc())
                    .try_into()
                    .unwrap_or(Duration::ZERO)
            })
            .unwrap_or(WAIT);
        tokio::select! {
            r = pull(&fed, after) => match r {
                Ok((index, r)) => {
                    // An answer older than what is held (a server of the
                    // primary behind the one before) never undoes it.
                    if roots.as_ref().is_none_or(|(held, _)| index >= *held) {
                        roots = Some((index, r));
                    }
                    after = roots.as_ref().map(|(i, _)| *i);
                }
                Err(e) => {
                    failed(&fed, e);
                    backoff.failed().await;
                    after = None;
                }
            },
            _ = local.changed() => {}
            _ = tokio::time::sleep(until_renew) => {}
        }
    }
}

fn failed(fed: &Federation, e: String) {
    tracing::warn!(error = %e, "connect CA from the primary failed");
    fed.replication().update(Replicated::Ca, |r| {
        r.last_error = Some(SystemTime::now());
        r.last_error_message = e;
    });
}

/// The primary's roots: a plain read, or one blocking past `after`.
/// Answered by the primary's leader (no `?stale`), so a rotation it
/// acknowledged is in the answer.
async fn pull(fed: &Federation, after: Option<u64>) -> Result<(u64, CaRoots), String> {
    let (path, timeout) = match after {
        Some(i) => (
            format!("/v1/connect/ca/roots?index={i}&wait={}s", WAIT.as_secs()),
            WAIT + WAIT / 16 + TIMEOUT,
        ),
        None => ("/v1/connect/ca/roots".to_string(), TIMEOUT),
    };
    // The roots need no token (Consul's): none is sent.
    let r = fed
        .ask_primary(path, None, timeout)
        .await
        .map_err(|e| format!("asking datacenter {} for its roots: {e}", fed.primary()))?;
    if r.status != 200 {
        return Err(format!(
            "datacenter {} answered {} for its roots: {}",
            fed.primary(),
            r.status,
            String::from_utf8_lossy(&r.body).trim()
        ));
    }
    let index = r
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("x-consul-index"))
        .and_then(|(_, v)| v.parse().ok())
        .ok_or("the primary's roots came without X-Consul-Index")?;
    let roots: CaRoots =
        serde_json::from_slice(&r.body).map_err(|e| format!("the primary's roots: {e}"))?;
    Ok((index, roots))
}

/// Makes this datacenter's CA the primary's roots with a valid
/// intermediate under the active one; answers when that intermediate is
/// due for renewal.
async fn reconcile(
    s: &Server, fed: &Federation, primary: &CaRoots,
) -> Result<time::OffsetDateTime, String> {
    for _ in 0..CAS_TRIES {
        let state = s.state();
        let local = state.connect_ca.clone();
        let cas = local.as_ref().map_or(0, |c| c.config.modify_index);
        let int = match ca::reusable_intermediate(local.as_deref(), primary) {
            Some(int) => int,
            None => new_intermediate(fed, local.as_deref(), primary).await?,
        };
        let renew_at = ca::intermediate_renew_at(&int.cert_pem);
        let next = ca::secondary_ca(local.as_deref(), primary, &int).map_err(|e| e.to_string())?;
        if local.as_ref().is_some_and(|l| ca::same_ca(l, &next)) {
            return Ok(renew_at);
        }
        let cmd = Command::CaSet {
            ca: Box::new(next),
            cas: Some(cas),
        };
        match s.write(cmd).await {
            Ok(Response::Bool(true)) => {
                tracing::info!(
                    root = %primary.active_root_id,
                    "connect CA: the primary's roots with a new intermediate or root list"
                );
                return Ok(renew_at);
            }
            // Another write changed the CA (a configuration PUT): again,
            // on what it wrote.
            Ok(Response::Bool(false)) => continue,
            Ok(other) => return Err(format!("CA write refused: {other:?}")),
            Err(e) => return Err(format!("CA write failed: {e}")),
        }
    }
    Err("the CA kept changing under the write; tried again later".into())
}

/// A new key and CSR made here (the key never leaves this datacenter),
/// signed by the primary's active root, and checked.
async fn new_intermediate(
    fed: &Federation, local: Option<&crate::state::connect::CaState>, primary: &CaRoots,
) -> Result<Intermediate, String> {
    let active = primary
        .active()
        .filter(|r| r.id == primary.active_root_id)
        .ok_or("the primary's roots have no active root")?
        .clone();
    let provider = match local {
        Some(l) => ca::provider_of(l),
        None => ca::provider_of(&Default::default()),
    };
    let td = primary.trust_domain.clone();
    // An RSA key takes up to seconds: off the async workers.
    let (key_pem, csr_pem) = crate::tasks::off_workers(move || {
        ca::intermediate_csr(&td, &provider.key_type, provider.key_bits)
    })
    .await
    .map_err(|e| format!("intermediate key: {e}"))?
    .map_err(|e| e.to_string())?;
    let r = fed
        .sign_intermediate(&csr_pem, TIMEOUT)
        .await
        .map_err(|e| format!("asking datacenter {} to sign: {e}", fed.primary()))?;
    if r.status != 200 {
        return Err(format!(
            "datacenter {} refused to sign the intermediate ({}): {}",
            fed.primary(),
            r.status,
            String::from_utf8_lossy(&r.body).trim()
        ));
    }
    let signed: SignedIntermediate =
        serde_json::from_slice(&r.body).map_err(|e| format!("the signed intermediate: {e}"))?;
    // Signed by another root than the one held (a rotation in between):
    // the roots are read again first.
    if signed.root_id != active.id {
        return Err(format!(
            "the primary signed with root {} while {} is the active one here: roots read again",
            signed.root_id, active.id
        ));
    }
    let td = primary.trust_domain.clone();
    let int = Intermediate {
        cert_pem: signed.intermediate_cert,
        key_pem,
    };
    let checked = int.clone();
    crate::tasks::off_workers(move || {
        ca::check_intermediate(&active.root_cert, &checked.cert_pem, &checked.key_pem, &td)
    })
    .await
    .map_err(|e| format!("intermediate check: {e}"))?
    .map_err(|e| e.to_string())?;
    Ok(int)
}
