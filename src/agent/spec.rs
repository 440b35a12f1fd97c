//! What a check is, read once from its definition: the probe (TTL, HTTP,
//! TCP, alias, maintenance), interval, timeout, thresholds and
//! `DeregisterCriticalServiceAfter`, with Consul's floors and defaults.
//!
//! A check's definition lives in its `Definition` (the catalog's shape, as
//! `definition` builds it); [`CheckSpec::parse`] reads it at registration,
//! so a bad definition is refused there with a clear reason. The runner
//! (`checks`) and the local state both take it from here.

use std::time::Duration;

use serde_json::Value;

use crate::structs::{HEALTH_CRITICAL, HEALTH_WARNING, HealthCheck, HealthStatus};

/// Consul's floor for check intervals.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Consul's default timeout for HTTP and TCP checks.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Consul's default for a script check.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Consul's floor for `DeregisterCriticalServiceAfter`.
pub const MIN_DEREGISTER_AFTER: Duration = Duration::from_secs(60);

/// How a check learns its status.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// Set from outside (`/v1/agent/check/pass|warn|fail|update`); critical
    /// when not renewed within the TTL.
    Ttl(Duration),
    Http {
        url: String,
        method: String,
        headers: Vec<(String, String)>,
        body: String,
        /// `TLSSkipVerify`: an `https://` URL's certificate is not checked.
        tls_skip_verify: bool,
        /// `TLSServerName`: the name an `https://` URL's certificate is
        /// checked against instead of the URL's host.
        tls_server_name: Option<String>,
    },
    Tcp(String),
    /// `Args`: a command run every interval, its exit code the status (0
    /// passing, 1 warning, else critical), only where the agent's
    /// `enable_script_checks` (or, for its files, `enable_local_script_checks`)
    /// allows it.
    Script(Vec<String>),
    /// Mirrors the health of a service on this agent (by ID).
    Alias(String),
    /// Maintenance mode (`agent::maintenance`): critical for as long as
    /// it is registered; nothing runs it.
    Maintenance,
}

/// Definition fields only the agent reads: the catalog's copy of a check
/// goes without them, as Consul's does.
pub const AGENT_ONLY_FIELDS: &[&str] = &[
    "SuccessBeforePassing",
    "FailuresBeforeWarning",
    "FailuresBeforeCritical",
];

/// Consecutive results needed before a check changes status (Consul's
/// `SuccessBeforePassing`, `FailuresBeforeWarning`,
/// `FailuresBeforeCritical`); all 0 means every result counts at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Thresholds {
    pub success_before_passing: u32,
    pub failures_before_warning: u32,
    pub failures_before_critical: u32,
}

/// The current run of results of one check.
#[derive(Debug, Clone, Copy, Default)]
pub struct Streak {
    successes: u32,
    failures: u32,
}

impl Streak {
    /// Counts a result and says which status to record, if any: a passing
    /// (or warning) result after `SuccessBeforePassing` in a row; a
    /// critical one as critical after `FailuresBeforeCritical` in a row,
    /// as warning after `FailuresBeforeWarning`. `None`: the check keeps
    /// the status (and output) it has.
    pub fn observe(&mut self, t: &Thresholds, status: HealthStatus) -> Option<HealthStatus> {
        if status == HEALTH_CRITICAL {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= t.failures_before_critical {
                Some(HEALTH_CRITICAL)
            } else if self.failures >= t.failures_before_warning {
                Some(HEALTH_WARNING)
            } else {
                None
            }
        } else {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            (self.successes >= t.success_before_passing).then_some(status)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CheckSpec {
    pub probe: Probe,
    pub interval: Duration,
    pub timeout: Duration,
    /// The service is deregistered after its check was critical this long.
    pub deregister_after: Option<Duration>,
    /// Only for checks with a runner (HTTP, TCP); TTL and alias statuses
    /// are taken as they come, as in Consul.
    pub thresholds: Thresholds,
}

fn field<'a>(c: &'a HealthCheck, name: &str) -> Option<&'a Value> {
    c.definition.get(name).filter(|v| !v.is_null())
}

fn text(c: &HealthCheck, name: &str) -> Option<String> {
    match field(c, name)? {
        Value::String(s) if s.is_empty() => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// A Go duration ("10s") or integer nanoseconds, as Consul accepts both.
fn duration(c: &HealthCheck, name: &str) -> Result<Option<Duration>, String> {
    let nanos = match field(c, name) {
        None => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => crate::structs::duration::Duration::parse(s)
            .map_err(|e| format!("Invalid {name} for check {:?}: {e}", c.check_id))?
            .nanos(),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| format!("Invalid {name} for check {:?}: {n}", c.check_id))?,
        Some(other) => {
            return Err(format!(
                "Invalid {name} for check {:?}: {other} is not a duration",
                c.check_id
            ));
        }
    };
    if nanos < 0 {
        return Err(format!(
            "Invalid {name} for check {:?}: must not be negative",
            c.check_id
        ));
    }
    Ok((nanos > 0).then(|| Duration::from_nanos(nanos as u64)))
}

/// A non-negative count (JSON number, or digits in a string as HCL may
/// give), 0 when absent.
fn count(c: &HealthCheck, name: &str) -> Result<u32, String> {
    let bad = |v: &Value| {
        format!(
            "Invalid {name} for check {:?}: {v} is not a non-negative integer",
            c.check_id
        )
    };
    match field(c, name) {
        None => Ok(0),
        Some(v @ Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(v)),
        Some(v @ Value::String(s)) => s.trim().parse().map_err(|_| bad(v)),
        Some(v) => Err(bad(v)),
    }
}

fn thresholds(c: &HealthCheck) -> Result<Thresholds, String> {
    let critical = count(c, "FailuresBeforeCritical")?;
    let warning = match field(c, "FailuresBeforeWarning") {
        // Unset: warn no earlier than turning critical (Consul's default).
        None => critical,
        Some(_) => count(c, "FailuresBeforeWarning")?,
    };
    if warning > critical {
        return Err(format!(
            "Invalid FailuresBeforeWarning for check {:?}: {warning} is more than FailuresBeforeCritical ({critical})",
            c.check_id
        ));
    }
    Ok(Thresholds {
        success_before_passing: count(c, "SuccessBeforePassing")?,
        failures_before_warning: warning,
        failures_before_critical: critical,
    })
}

fn headers(c: &HealthCheck) -> Result<Vec<(String, String)>, String> {
    let Some(h) = field(c, "Header") else {
        return Ok(Vec::new());
    };
    let bad = || {
        format!(
            "Invalid Header for check {:?}: want {{\"Name\": [\"value\"]}}",
            c.check_id
        )
    };
    let map = h.as_object().ok_or_else(bad)?;
    let mut out = Vec::new();
    for (k, vs) in map {
        match vs {
            Value::Array(a) => {
                for v in a {
                    out.push((k.clone(), v.as_str().ok_or_else(bad)?.to_string()));
                }
            }
            Value::String(s) => out.push((k.clone(), s.clone())),
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

/// Where an agent runs script checks, as Consul's two keys say:
/// `enable_script_checks` (any source, the HTTP API too) and
/// `enable_local_script_checks` (its configuration files only). Neither:
/// refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptChecks {
    pub enabled: bool,
    pub local: bool,
}

impl ScriptChecks {
    /// Whether `specs`, from the API (`from_api`) or the files, may be
    /// registered; the refusal in Consul's words.
    pub fn permit<'a>(
        &self, from_api: bool, mut specs: impl Iterator<Item = &'a CheckSpec>,
    ) -> Result<(), String> {
        let allowed = self.enabled || (self.local && !from_api);
        if allowed || !specs.any(CheckSpec::is_script) {
            Ok(())
        } else if self.local {
            Err("Scripts are disabled on this agent from remote calls; to enable, configure 'enable_script_checks' to true".into())
        } else {
            Err("Scripts are disabled on this agent; to enable, configure 'enable_script_checks' or 'enable_local_script_checks' to true".into())
        }
    }
}

/// `Args` (or the older `ScriptArgs`): a non-empty list of strings.
fn script_args(c: &HealthCheck) -> Result<Option<Vec<String>>, String> {
    let Some(v) = field(c, "Args").or_else(|| field(c, "ScriptArgs")) else {
        return Ok(None);
    };
    let bad = || {
        format!(
            "Check {:?}: Args must be a non-empty list of strings",
            c.check_id
        )
    };
    let list = v.as_array().ok_or_else(bad)?;
    let args: Vec<String> = list
        .iter()
        .map(|a| a.as_str().map(String::from))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if args.is_empty() || args[0].is_empty() {
        return Err(bad());
    }
    Ok(Some(args))
}

impl CheckSpec {
    /// Reads a check's definition; an error is the one-line reason to
    /// refuse it.
    pub fn parse(c: &HealthCheck) -> Result<CheckSpec, String> {
        let interval = duration(c, "Interval")?;
        let timeout = duration(c, "Timeout")?;
        let deregister_after = duration(c, "DeregisterCriticalServiceAfter")?;
        let ttl = duration(c, "TTL")?;
        if text(c, "AliasNode").is_some() {
            return Err(format!(
                "Check {:?}: AliasNode is not supported: cairn agents alias services on their own node",
                c.check_id
            ));
        }
        let http = text(c, "HTTP");
        let tcp = text(c, "TCP");
        let alias = text(c, "AliasService");
        let script = script_args(c)?;
        let kinds = [
            ttl.is_some(),
            http.is_some(),
            tcp.is_some(),
            alias.is_some(),
            script.is_some(),
        ];
        match kinds.iter().filter(|k| **k).count() {
            0 => {
                let kind = if c.check_type.is_empty() {
                    "without TTL, HTTP, TCP, Args or AliasService".to_string()
                } else {
                    format!("of type {:?}", c.check_type)
                };
                return Err(format!(
                    "Check {:?} {kind} is not supported: cairn agents run TTL, HTTP, TCP, script and alias checks",
                    c.check_id
                ));
            }
            1 => {}
            _ => {
                return Err(format!(
                    "Check {:?} must have exactly one of TTL, HTTP, TCP, Args or AliasService",
                    c.check_id
                ));
            }
        }
        let probe = if let Some(ttl) = ttl {
            Probe::Ttl(ttl)
        } else if let Some(url) = http {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return Err(format!(
                    "Invalid HTTP check {:?}: only http:// and https:// URLs are supported, got {url:?}",
                    c.check_id
                ));
            }
            let tls_skip_verify = match field(c, "TLSSkipVerify") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(format!(
                        "Check {:?}: TLSSkipVerify must be a boolean, got {other}",
                        c.check_id
                    ));
                }
            };
            let tls_server_name = text(c, "TLSServerName");
            if let Some(n) = &tls_server_name {
                rustls_pki_types::ServerName::try_from(n.as_str()).map_err(|e| {
                    format!("Check {:?}: invalid TLSServerName {n:?}: {e}", c.check_id)
                })?;
            }
            let method = text(c, "Method").unwrap_or_else(|| "GET".into());
            if reqwest::Method::from_bytes(method.as_bytes()).is_err() {
                return Err(format!(
                    "Invalid Method {method:?} for check {:?}",
                    c.check_id
                ));
            }
            Probe::Http {
                url,
                method,
                headers: headers(c)?,
                body: text(c, "Body").unwrap_or_default(),
                tls_skip_verify,
                tls_server_name,
            }
        } else if let Some(addr) = tcp {
            Probe::Tcp(addr)
        } else if let Some(args) = script {
            Probe::Script(args)
        } else {
            Probe::Alias(alias.unwrap_or_default())
        };
        let interval = match (&probe, interval) {
            (Probe::Ttl(_) | Probe::Alias(_), i) => i.unwrap_or_default(),
            (_, None) => {
                return Err(format!(
                    "Check {:?}: Interval must be > 0 for HTTP, TCP and script checks",
                    c.check_id
                ));
            }
            (_, Some(i)) => i.max(MIN_INTERVAL),
        };
        let timeout = timeout.unwrap_or(match probe {
            Probe::Script(_) => SCRIPT_TIMEOUT,
            _ => DEFAULT_TIMEOUT,
        });
        Ok(CheckSpec {
            probe,
            interval,
            timeout,
            deregister_after: deregister_after.map(|d| d.max(MIN_DEREGISTER_AFTER)),
            thresholds: thresholds(c)?,
        })
    }

    pub fn is_script(&self) -> bool {
        matches!(self.probe, Probe::Script(_))
    }

    pub fn is_ttl(&self) -> bool {
        matches!(self.probe, Probe::Ttl(_))
    }

    /// Whether a task runs this check (alias checks are computed by the
    /// local state, maintenance checks are fixed).
    pub fn has_runner(&self) -> bool {
        !matches!(self.probe, Probe::Alias(_) | Probe::Maintenance)
    }

    /// The service an alias check mirrors.
    pub fn alias_of(&self) -> Option<&str> {
        match &self.probe {
            Probe::Alias(s) => Some(s),
            _ => None,
        }
    }
}
