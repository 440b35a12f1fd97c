//! Sessions, as Consul's `structs.Session` and `/v1/session/create` body.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::duration::Duration;

/// Consul's TTL bounds (`SessionTTLMin`, `SessionTTLMax`).
pub const TTL_MIN_SECS: i64 = 10;
pub const TTL_MAX_SECS: i64 = 24 * 3600;
/// Consul's default lock-delay, and its cap when a lock is released.
pub const DEFAULT_LOCK_DELAY_NS: u64 = 15_000_000_000;
pub const MAX_LOCK_DELAY_NS: u64 = 60_000_000_000;

/// What happens to a session's locks when it is invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Behavior {
    #[default]
    Release,
    Delete,
}

/// A service check a session is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceCheck {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(default)]
    pub namespace: String,
}

/// One session, as stored and as `/v1/session/info` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Session {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub node: String,
    /// Node-level checks (legacy `Checks` land here, as in Consul).
    pub node_checks: Vec<String>,
    pub service_checks: Vec<ServiceCheck>,
    /// Nanoseconds, as Consul's JSON shows a `time.Duration`.
    pub lock_delay: u64,
    pub behavior: Behavior,
    /// As given (`"30s"`), empty without a TTL.
    #[serde(rename = "TTL")]
    pub ttl: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Session {
    /// The TTL as a duration (zero: none).
    pub fn ttl(&self) -> std::time::Duration {
        Duration::parse(&self.ttl)
            .map(|d| std::time::Duration::from_nanos(d.nanos().max(0) as u64))
            .unwrap_or_default()
    }

    /// Whether the session is bound to `check` on its node.
    pub fn uses_check(&self, check: &str) -> bool {
        self.node_checks.iter().any(|c| c == check)
            || self.service_checks.iter().any(|c| c.id == check)
    }
}

/// The body of `PUT /v1/session/create`; absent lists are `None` so that
/// "no checks given" (default: `serfHealth`) differs from `[]` (none).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SessionRequest {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub checks: Option<Vec<String>>,
    #[serde(default)]
    pub node_checks: Option<Vec<String>>,
    #[serde(default)]
    pub service_checks: Option<Vec<ServiceCheck>>,
    #[serde(default)]
    pub lock_delay: Option<Value>,
    #[serde(default)]
    pub behavior: String,
    #[serde(default, rename = "TTL")]
    pub ttl: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

impl SessionRequest {
    /// Whether the request names no checks at all (Consul then binds the
    /// session to the node's `serfHealth`).
    pub fn no_checks(&self) -> bool {
        self.checks.is_none() && self.node_checks.is_none() && self.service_checks.is_none()
    }

    /// Validates the request into a session (ID, indexes and the default
    /// checks are the caller's). `Err` is a one-line reason for a 400.
    pub fn into_session(self, id: String, default_node: &str) -> Result<Session, String> {
        let behavior = match self.behavior.as_str() {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => return Err(format!("Invalid Behavior setting '{other}'")),
        };
        if !self.ttl.is_empty() {
            let ttl = Duration::parse(&self.ttl)
                .map_err(|e| format!("Request decode failed: TTL: {e}"))?;
            let secs = ttl.nanos() as f64 / 1e9;
            if ttl.nanos() != 0 && !((TTL_MIN_SECS as f64)..=(TTL_MAX_SECS as f64)).contains(&secs)
            {
                return Err(format!(
                    "Invalid Session TTL '{}', must be between [{}s={}h0m0s]",
                    ttl.nanos(),
                    TTL_MIN_SECS,
                    TTL_MAX_SECS / 3600
                ));
            }
        }
        let lock_delay = match &self.lock_delay {
            None | Some(Value::Null) => DEFAULT_LOCK_DELAY_NS,
            Some(v) => parse_lock_delay(v)?,
        };
        let mut node_checks = self.node_checks.unwrap_or_default();
        for c in self.checks.unwrap_or_default() {
            if !node_checks.contains(&c) {
                node_checks.push(c);
            }
        }
        Ok(Session {
            id,
            name: self.name,
            node: if self.node.is_empty() {
                default_node.to_string()
            } else {
                self.node
            },
            node_checks,
            service_checks: self.service_checks.unwrap_or_default(),
            lock_delay,
            behavior,
            ttl: self.ttl,
            create_index: 0,
            modify_index: 0,
        })
    }
}

/// Consul's `FixupLockDelay`: a Go duration string, or a number that is
/// seconds below 1000 and nanoseconds from there.
fn parse_lock_delay(v: &Value) -> Result<u64, String> {
    let bad = || format!("Request decode failed: invalid LockDelay {v}");
    match v {
        Value::String(s) => {
            let d = Duration::parse(s).map_err(|_| bad())?;
            u64::try_from(d.nanos()).map_err(|_| bad())
        }
        Value::Number(n) => {
            let n = n.as_f64().filter(|n| *n >= 0.0).ok_or_else(bad)?;
            Ok(if n < 1000.0 {
                (n * 1e9) as u64
            } else {
                n as u64
            })
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> Result<Session, String> {
        serde_json::from_value::<SessionRequest>(v)
            .unwrap()
            .into_session("id".into(), "me")
    }

    #[test]
    fn defaults_and_consul_shape() {
        let s = req(json!({})).unwrap();
        assert_eq!(s.node, "me");
        assert_eq!(s.lock_delay, DEFAULT_LOCK_DELAY_NS);
        assert_eq!(s.behavior, Behavior::Release);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["LockDelay"], 15_000_000_000u64);
        assert_eq!(v["Behavior"], "release");
        assert_eq!(v["TTL"], "");
        assert!(v.get("ID").is_some() && v.get("NodeChecks").is_some());
    }

    #[test]
    fn ttl_bounds_behavior_and_lock_delay_forms() {
        assert!(req(json!({"TTL": "9s"})).is_err());
        assert!(req(json!({"TTL": "25h"})).is_err());
        assert!(req(json!({"TTL": "10s"})).is_ok());
        assert!(req(json!({"TTL": "0s"})).is_ok());
        assert!(req(json!({"Behavior": "explode"})).is_err());
        assert_eq!(
            req(json!({"Behavior": "delete"})).unwrap().behavior,
            Behavior::Delete
        );
        assert_eq!(
            req(json!({"LockDelay": "1s"})).unwrap().lock_delay,
            1_000_000_000
        );
        assert_eq!(
            req(json!({"LockDelay": 2})).unwrap().lock_delay,
            2_000_000_000
        );
        assert_eq!(req(json!({"LockDelay": 5000})).unwrap().lock_delay, 5000);
        let s = req(json!({"Checks": ["a"], "NodeChecks": ["b"]})).unwrap();
        assert_eq!(s.node_checks, ["b", "a"]);
    }
}
