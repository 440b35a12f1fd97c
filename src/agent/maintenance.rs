//! Maintenance mode, as Consul implements it: a critical check that the
//! agent holds and nothing runs. `_node_maintenance` takes every instance
//! on the node out of `?passing` health answers (a node check belongs to
//! every service entry of the node); `_service_maintenance:<id>` takes out
//! that one instance. Disabling removes the check. The check is an ordinary
//! local check otherwise: anti-entropy carries it to the catalog, the data
//! dir keeps it (a restarted agent is still in maintenance), and it shows
//! in `/v1/agent/checks`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Agent;
use super::local::Source;
use super::spec::{CheckSpec, Probe, Thresholds};
use crate::error::{Error, Result};
use crate::structs::agent::{NODE_MAINTENANCE_CHECK_ID, SERVICE_MAINTENANCE_CHECK_PREFIX};
use crate::structs::{HEALTH_CRITICAL, HealthCheck};

/// Consul's check type for these checks.
const CHECK_TYPE: &str = "maintenance";

/// Why a maintenance request was refused (the HTTP codes are in
/// `crate::error`).
#[derive(Debug, thiserror::Error)]
pub enum MaintenanceError {
    #[error("Missing value for enable")]
    MissingEnable,
    #[error("Invalid value for enable: {0:?}")]
    InvalidEnable(String),
    #[error("No service registered with ID {0:?}")]
    UnknownService(String),
}

pub fn service_check_id(service_id: &str) -> String {
    format!("{SERVICE_MAINTENANCE_CHECK_PREFIX}{service_id}")
}

/// `?enable=` as Consul reads it (Go's `strconv.ParseBool`); required.
pub fn parse_enable(v: Option<&str>) -> Result<bool, MaintenanceError> {
    match v {
        None => Err(MaintenanceError::MissingEnable),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(MaintenanceError::InvalidEnable(other.to_string())),
    }
}

fn spec() -> CheckSpec {
    CheckSpec {
        probe: Probe::Maintenance,
        interval: Duration::ZERO,
        timeout: Duration::ZERO,
        deregister_after: None,
        thresholds: Thresholds::default(),
    }
}

/// The spec of a stored maintenance check (the data dir keeps the check,
/// not how to run it; these have no definition to parse).
pub fn spec_of(c: &HealthCheck) -> Option<CheckSpec> {
    let ours = c.check_type == CHECK_TYPE
        && (c.check_id == NODE_MAINTENANCE_CHECK_ID
            || c.check_id.starts_with(SERVICE_MAINTENANCE_CHECK_PREFIX));
    ours.then(spec)
}

fn check(id: String, name: &str, service_id: &str, reason: &str, default: &str) -> HealthCheck {
    HealthCheck {
        check_id: id,
        name: name.into(),
        status: HEALTH_CRITICAL,
        notes: if reason.is_empty() { default } else { reason }.into(),
        service_id: service_id.into(),
        check_type: CHECK_TYPE.into(),
        ..Default::default()
    }
}

impl Agent {
    /// `PUT /v1/agent/maintenance`. Enabling twice keeps the first reason,
    /// disabling when not enabled does nothing (as Consul).
    pub(super) async fn node_maintenance(
        self: &Arc<Self>, enable: bool, reason: &str,
    ) -> Result<()> {
        let changed = self.local.with(|t| {
            let on = t.live_check(NODE_MAINTENANCE_CHECK_ID).is_some();
            match (enable, on) {
                (true, false) => {
                    let c = check(
                        NODE_MAINTENANCE_CHECK_ID.into(),
                        "Node Maintenance Mode",
                        "",
                        reason,
                        "Maintenance mode is enabled for this node, but no reason was provided. This is a default message.",
                    );
                    t.put_check(c, spec(), Source::Api, Instant::now());
                    true
                }
                (false, true) => t.remove_check(NODE_MAINTENANCE_CHECK_ID),
                _ => false,
            }
        });
        if !changed {
            return Ok(());
        }
        tracing::info!(enable, reason, "node maintenance");
        self.persist().await
    }

    /// `PUT /v1/agent/service/maintenance/:id`.
    pub(super) async fn service_maintenance(
        self: &Arc<Self>, service_id: &str, enable: bool, reason: &str,
    ) -> Result<()> {
        let id = service_check_id(service_id);
        let changed = self.local.with(|t| {
            if t.live_service(service_id).is_none() {
                return Err(MaintenanceError::UnknownService(service_id.to_string()));
            }
            let on = t.live_check(&id).is_some();
            Ok(match (enable, on) {
                (true, false) => {
                    let c = check(
                        id.clone(),
                        "Service Maintenance Mode",
                        service_id,
                        reason,
                        "Maintenance mode is enabled for this service, but no reason was provided. This is a default message.",
                    );
                    t.put_check(c, spec(), Source::Api, Instant::now());
                    true
                }
                (false, true) => t.remove_check(&id),
                _ => false,
            })
        })?;
        if !changed {
            return Ok(());
        }
        tracing::info!(service = service_id, enable, reason, "service maintenance");
        self.persist().await
    }
}

/// A refused maintenance request, with Consul's codes: a missing or bad
/// `enable` is 400, an unknown service 404.
impl From<MaintenanceError> for Error {
    fn from(e: MaintenanceError) -> Self {
        use MaintenanceError as M;
        match e {
            M::MissingEnable | M::InvalidEnable(_) => Error::BadRequest(e.to_string()),
            M::UnknownService(_) => Error::NotFound(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enable_is_required_and_read_as_go_does() {
        assert!(matches!(
            parse_enable(None),
            Err(MaintenanceError::MissingEnable)
        ));
        assert!(parse_enable(Some("true")).unwrap());
        assert!(parse_enable(Some("1")).unwrap());
        assert!(!parse_enable(Some("False")).unwrap());
        assert!(matches!(
            parse_enable(Some("yes")),
            Err(MaintenanceError::InvalidEnable(_))
        ));
        assert!(matches!(
            parse_enable(Some("")),
            Err(MaintenanceError::InvalidEnable(_))
        ));
    }

    #[test]
    fn stored_maintenance_checks_get_their_spec_back() {
        let node = check(NODE_MAINTENANCE_CHECK_ID.into(), "n", "", "", "d");
        assert_eq!(spec_of(&node).unwrap().probe, Probe::Maintenance);
        let svc = check(service_check_id("web-1"), "s", "web-1", "why", "d");
        assert_eq!(svc.notes, "why");
        assert!(spec_of(&svc).is_some());
        // A user's check that only borrows the name is parsed as usual.
        let other = HealthCheck {
            check_id: NODE_MAINTENANCE_CHECK_ID.into(),
            check_type: "ttl".into(),
            ..Default::default()
        };
        assert!(spec_of(&other).is_none());
    }
}
