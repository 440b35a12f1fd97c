//! A check's health status and a service's kind: closed sets of Consul
//! strings, typed so that the core matches on variants, and (de)serialized
//! as exactly the strings Consul's JSON carries.
//!
//! Both compare equal to their string (`status == "passing"`), so code that
//! reads a status from a query or a definition can still compare it as text.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A check's status (Consul's `api.HealthPassing` ...).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HealthStatus {
    Passing,
    Warning,
    /// Consul's default for a check registered without a status.
    #[default]
    Critical,
    /// Only ever a filter word (`Status != maintenance`) and a state in
    /// proxycfg's health rules; no registration may set it.
    Maintenance,
}

pub const HEALTH_PASSING: HealthStatus = HealthStatus::Passing;
pub const HEALTH_WARNING: HealthStatus = HealthStatus::Warning;
pub const HEALTH_CRITICAL: HealthStatus = HealthStatus::Critical;
pub const HEALTH_MAINT: HealthStatus = HealthStatus::Maintenance;

/// A status Consul does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid check status {0:?}: must be passing, warning or critical")]
pub struct BadStatus(pub String);

impl HealthStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Passing => "passing",
            HealthStatus::Warning => "warning",
            HealthStatus::Critical => "critical",
            HealthStatus::Maintenance => "maintenance",
        }
    }

    /// What a registration or a check update may set: passing, warning or
    /// critical (maintenance is the agent's own check, critical).
    pub fn settable(s: &str) -> Result<HealthStatus, BadStatus> {
        match s.parse() {
            Ok(HealthStatus::Maintenance) | Err(_) => Err(BadStatus(s.to_string())),
            Ok(st) => Ok(st),
        }
    }

    /// The worse of two statuses (critical > warning > passing), as an
    /// aggregate of several checks is computed.
    pub fn worse(self, other: HealthStatus) -> HealthStatus {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }

    fn rank(self) -> u8 {
        match self {
            HealthStatus::Passing => 0,
            HealthStatus::Warning => 1,
            HealthStatus::Critical | HealthStatus::Maintenance => 2,
        }
    }
}

impl FromStr for HealthStatus {
    type Err = BadStatus;
    fn from_str(s: &str) -> Result<Self, BadStatus> {
        Ok(match s {
            "passing" => HealthStatus::Passing,
            "warning" => HealthStatus::Warning,
            "critical" => HealthStatus::Critical,
            "maintenance" => HealthStatus::Maintenance,
            _ => return Err(BadStatus(s.to_string())),
        })
    }
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for HealthStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for HealthStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for HealthStatus {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl Serialize for HealthStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for HealthStatus {
    /// `""` is Consul's "not given", which it stores as critical.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        if s.is_empty() {
            return Ok(HealthStatus::Critical);
        }
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A service's kind (Consul's `ServiceKind`): `""` for a typical service.
/// Consul stores a kind it does not know as given, and so do we (`Other`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum ServiceKind {
    #[default]
    Typical,
    ConnectProxy,
    MeshGateway,
    TerminatingGateway,
    IngressGateway,
    ApiGateway,
    Other(String),
}

impl ServiceKind {
    pub fn as_str(&self) -> &str {
        match self {
            ServiceKind::Typical => "",
            ServiceKind::ConnectProxy => "connect-proxy",
            ServiceKind::MeshGateway => "mesh-gateway",
            ServiceKind::TerminatingGateway => "terminating-gateway",
            ServiceKind::IngressGateway => "ingress-gateway",
            ServiceKind::ApiGateway => "api-gateway",
            ServiceKind::Other(s) => s,
        }
    }

    pub fn is_typical(&self) -> bool {
        *self == ServiceKind::Typical
    }

    /// Proxies and gateways: the kinds central config is merged into.
    pub fn is_proxy_or_gateway(&self) -> bool {
        !matches!(self, ServiceKind::Typical | ServiceKind::Other(_))
    }
}

impl From<&str> for ServiceKind {
    fn from(s: &str) -> Self {
        match s {
            "" => ServiceKind::Typical,
            "connect-proxy" => ServiceKind::ConnectProxy,
            "mesh-gateway" => ServiceKind::MeshGateway,
            "terminating-gateway" => ServiceKind::TerminatingGateway,
            "ingress-gateway" => ServiceKind::IngressGateway,
            "api-gateway" => ServiceKind::ApiGateway,
            other => ServiceKind::Other(other.to_string()),
        }
    }
}

impl From<String> for ServiceKind {
    fn from(s: String) -> Self {
        match ServiceKind::from(s.as_str()) {
            ServiceKind::Other(_) => ServiceKind::Other(s),
            known => known,
        }
    }
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for ServiceKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ServiceKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for ServiceKind {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl Serialize for ServiceKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ServiceKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(ServiceKind::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_are_consuls_strings_both_ways() {
        for s in ["passing", "warning", "critical", "maintenance"] {
            let st: HealthStatus = serde_json::from_value(json!(s)).unwrap();
            assert_eq!(st, s);
            assert_eq!(serde_json::to_value(st).unwrap(), json!(s));
        }
        let blank: HealthStatus = serde_json::from_value(json!("")).unwrap();
        assert_eq!(blank, HealthStatus::Critical, "Consul's default");
        let e = serde_json::from_value::<HealthStatus>(json!("bogus")).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        assert!(serde_json::from_value::<HealthStatus>(json!("Passing")).is_err());
    }

    #[test]
    fn only_passing_warning_critical_are_settable() {
        assert_eq!(HealthStatus::settable("warning"), Ok(HEALTH_WARNING));
        for bad in ["maintenance", "", "ok"] {
            assert!(HealthStatus::settable(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn worse_orders_critical_over_warning_over_passing() {
        assert_eq!(HEALTH_PASSING.worse(HEALTH_WARNING), HEALTH_WARNING);
        assert_eq!(HEALTH_CRITICAL.worse(HEALTH_WARNING), HEALTH_CRITICAL);
        assert_eq!(HEALTH_PASSING.worse(HEALTH_PASSING), HEALTH_PASSING);
    }

    #[test]
    fn kinds_keep_their_strings_unknown_ones_included() {
        for s in [
            "",
            "connect-proxy",
            "mesh-gateway",
            "terminating-gateway",
            "ingress-gateway",
            "api-gateway",
            "something-new",
        ] {
            let k: ServiceKind = serde_json::from_value(json!(s)).unwrap();
            assert_eq!(k, s);
            assert_eq!(serde_json::to_value(&k).unwrap(), json!(s));
        }
        assert_eq!(ServiceKind::from("mesh-gateway"), ServiceKind::MeshGateway);
        assert!(ServiceKind::from("x").ne(&ServiceKind::Typical));
        assert!(ServiceKind::ApiGateway.is_proxy_or_gateway());
        assert!(!ServiceKind::from("x").is_proxy_or_gateway());
    }
}
