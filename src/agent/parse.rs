//! One service or check definition read into the agent's shapes:
//! `ServiceDef` (a service with its checks and `CheckSpec`s, validated as
//! the catalog validates a registration) and `SidecarDef`. The sidecar
//! expansion (`sidecar`) and the entry points (`define`) both build on it.

use serde_json::{Map, Value};

use super::spec::CheckSpec;
use crate::definition::{normalize, service_definition_to_register, text};
use crate::error::{Error, Result};
use crate::structs::agent::SERF_CHECK_ID;
use crate::structs::{HEALTH_MAINT, HealthCheck, NodeService, RegisterRequest};

/// A service with the checks that came with it, and its sidecar if it
/// declared one.
#[derive(Debug, Clone)]
pub struct ServiceDef {
    pub service: NodeService,
    pub checks: Vec<(HealthCheck, CheckSpec)>,
    pub sidecar: Option<Box<SidecarDef>>,
}

impl ServiceDef {
    /// What each check it defines is, its sidecar's included.
    pub fn specs(&self) -> impl Iterator<Item = &CheckSpec> {
        let sidecar = self.sidecar.iter().flat_map(|s| s.checks.iter().flatten());
        self.checks.iter().chain(sidecar).map(|(_, spec)| spec)
    }
}

pub(super) fn object(body: Value) -> Result<Map<String, Value>> {
    match normalize(body) {
        Value::Object(m) => Ok(m),
        _ => Err(Error::bad(
            "Request decode failed: the body must be a JSON object",
        )),
    }
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    crate::request::json::from_value(v)
        .map_err(|e| Error::bad(format!("Request decode failed: {e}")))
}

/// A definition field as text ("" when absent).
pub(super) fn text_field(m: &Map<String, Value>, key: &str) -> String {
    text(m.get(key))
}

pub(super) fn with_spec(check: HealthCheck) -> Result<(HealthCheck, CheckSpec)> {
    if check.check_id == SERF_CHECK_ID {
        return Err(Error::bad(format!(
            "Check ID {SERF_CHECK_ID:?} is reserved for the servers"
        )));
    }
    if check.status == HEALTH_MAINT {
        return Err(Error::bad(
            crate::structs::BadStatus(HEALTH_MAINT.to_string()).to_string(),
        ));
    }
    let spec = CheckSpec::parse(&check).map_err(Error::BadRequest)?;
    Ok((check, spec))
}

/// A sidecar waiting for its port.
#[derive(Debug, Clone)]
pub struct SidecarDef {
    /// Port 0 until one is assigned.
    pub service: NodeService,
    /// The sidecar's own checks; `None` for Consul's default pair, which
    /// need the port.
    pub checks: Option<Vec<(HealthCheck, CheckSpec)>>,
}

/// One service definition, already normalized, without a sidecar.
pub(super) fn parse_service(mut def: Map<String, Value>, node: &str) -> Result<ServiceDef> {
    // HCL writes one `upstreams { ... }` block as an object: it is a list
    // of one, as Consul reads it.
    if let Some(Value::Object(proxy)) = def.get_mut("Proxy")
        && let Some(up) = proxy.get_mut("Upstreams")
        && up.is_object()
    {
        *up = Value::Array(vec![up.take()]);
    }
    let reg = service_definition_to_register(def, node).map_err(|e| Error::BadRequest(e.0))?;
    let service: NodeService = decode(reg["Service"].clone())?;
    let checks: Vec<HealthCheck> = decode(reg["Checks"].clone())?;
    // The catalog's own validation (ports, proxy fields, check statuses).
    let mut req = RegisterRequest {
        node: node.to_string(),
        address: "-".into(),
        service: Some(service),
        checks,
        ..Default::default()
    };
    crate::structs::validate::validate_register(&mut req, "")?;
    let checks = req
        .checks
        .into_iter()
        .map(with_spec)
        .collect::<Result<Vec<_>>>()?;
    let mut ids: Vec<&str> = checks.iter().map(|(c, _)| c.check_id.as_str()).collect();
    ids.sort();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::bad("Check IDs of a service must be unique"));
    }
    Ok(ServiceDef {
        service: req.service.unwrap_or_default(),
        checks,
        sidecar: None,
    })
}
