//! Health checks the agent runs: TTL, HTTP, TCP and alias, with interval,
//! timeout, `DeregisterCriticalServiceAfter` and the consecutive-result
//! thresholds (`SuccessBeforePassing`, `FailuresBeforeWarning`,
//! `FailuresBeforeCritical`), as Consul defines them. Results go into the
//! local state; anti-entropy carries status changes to the catalog.
//!
//! Alias checks of a service on this agent have no runner: the local state
//! recomputes them on every change of a check or service ([`alias_status`]),
//! so they follow the aliased service at once and cost nothing while idle.
//!
//! A check's definition lives in its `Definition` (the catalog's shape, as
//! `cli::services` builds it); [`CheckSpec::parse`] reads it once, at
//! registration, so a bad definition is refused there with a clear reason.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::local::Local;
use crate::structs::{HEALTH_CRITICAL, HEALTH_PASSING, HEALTH_WARNING, HealthCheck, HealthStatus};

/// Consul's floor for check intervals.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Consul's default timeout for HTTP and TCP checks.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Consul's floor for `DeregisterCriticalServiceAfter`.
pub const MIN_DEREGISTER_AFTER: Duration = Duration::from_secs(60);
/// Consul's default cap on check output.
const MAX_OUTPUT: usize = 4096;

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

impl CheckSpec {
    /// Reads a check's definition; an error is the one-line reason to
    /// refuse it.
    pub fn parse(c: &HealthCheck) -> Result<CheckSpec, String> {
        let interval = duration(c, "Interval")?;
        let timeout = duration(c, "Timeout")?.unwrap_or(DEFAULT_TIMEOUT);
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
        let kinds = [
            ttl.is_some(),
            http.is_some(),
            tcp.is_some(),
            alias.is_some(),
        ];
        match kinds.iter().filter(|k| **k).count() {
            0 => {
                let kind = if c.check_type.is_empty() {
                    "without TTL, HTTP, TCP or AliasService".to_string()
                } else {
                    format!("of type {:?}", c.check_type)
                };
                return Err(format!(
                    "Check {:?} {kind} is not supported: cairn agents run TTL, HTTP, TCP and alias checks",
                    c.check_id
                ));
            }
            1 => {}
            _ => {
                return Err(format!(
                    "Check {:?} must have exactly one of TTL, HTTP, TCP or AliasService",
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
        } else {
            Probe::Alias(alias.unwrap_or_default())
        };
        let interval = match (&probe, interval) {
            (Probe::Ttl(_) | Probe::Alias(_), i) => i.unwrap_or_default(),
            (_, None) => {
                return Err(format!(
                    "Check {:?}: Interval must be > 0 for HTTP and TCP checks",
                    c.check_id
                ));
            }
            (_, Some(i)) => i.max(MIN_INTERVAL),
        };
        Ok(CheckSpec {
            probe,
            interval,
            timeout,
            deregister_after: deregister_after.map(|d| d.max(MIN_DEREGISTER_AFTER)),
            thresholds: thresholds(c)?,
        })
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

/// Services whose check has been critical longer than its
/// `DeregisterCriticalServiceAfter`, at `now`.
pub fn due_for_deregistration(t: &super::local::Tables, now: Instant) -> Vec<String> {
    let mut out: Vec<String> = t
        .live_checks()
        .filter(|c| !c.check.service_id.is_empty())
        .filter_map(|c| {
            let after = c.spec.as_ref()?.deregister_after?;
            let since = c.critical_since?;
            (now.saturating_duration_since(since) >= after).then(|| c.check.service_id.clone())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What an alias check of `service` shows: critical if the service is not
/// on this agent or any of its checks (or of this node's) is critical,
/// warning if one warns, passing otherwise. `own` (the alias check itself)
/// is left out.
pub fn alias_status(t: &super::local::Tables, service: &str, own: &str) -> (HealthStatus, String) {
    if t.live_service(service).is_none() {
        return (
            HEALTH_CRITICAL,
            format!("Service {service:?} is not registered on this agent"),
        );
    }
    let worst = t
        .live_checks()
        .filter(|c| c.check.check_id != own)
        .filter(|c| c.check.service_id == service || c.check.service_id.is_empty())
        .map(|c| c.check.status)
        .fold(HEALTH_PASSING, HealthStatus::worse);
    let output = match worst {
        HealthStatus::Passing => "All checks passing".to_string(),
        HealthStatus::Warning => format!("Aliased service {service:?} has a check warning"),
        _ => format!("Aliased service {service:?} has a check critical"),
    };
    (worst, output)
}

/// At most `MAX_OUTPUT` bytes, cut on a character boundary.
fn truncate(mut s: String) -> String {
    if s.len() > MAX_OUTPUT {
        let mut cut = MAX_OUTPUT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// A response body's first `MAX_OUTPUT` bytes: the rest is never read, so
/// a URL answering without end costs no memory.
async fn read_capped(mut resp: reqwest::Response) -> String {
    let mut buf = Vec::new();
    while buf.len() < MAX_OUTPUT {
        match resp.chunk().await {
            Ok(Some(c)) => buf.extend_from_slice(&c[..c.len().min(MAX_OUTPUT - buf.len())]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// One run of an HTTP check: 2xx passing, 429 warning, anything else (or
/// no answer in time) critical.
async fn http_probe(
    client: &reqwest::Client,
    url: &str,
    method: &str,
    headers: &[(String, String)],
    body: &str,
    timeout: Duration,
) -> (HealthStatus, String) {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
    let mut req = client.request(m, url).timeout(timeout);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    if !body.is_empty() {
        req = req.body(body.to_string());
    }
    match req.send().await {
        Ok(resp) => {
            let code = resp.status();
            let text = read_capped(resp).await;
            let status = if code.is_success() {
                HEALTH_PASSING
            } else if code.as_u16() == 429 {
                HEALTH_WARNING
            } else {
                HEALTH_CRITICAL
            };
            (
                status,
                truncate(format!("HTTP {method} {url}: {code} Output: {text}")),
            )
        }
        Err(e) => {
            // reqwest's own message is generic; the innermost cause names
            // the problem (a refused certificate, a refused connection).
            let mut cause = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                cause = s.to_string();
                src = s.source();
            }
            (
                HEALTH_CRITICAL,
                truncate(format!("HTTP {method} {url}: {cause}")),
            )
        }
    }
}

/// The client an HTTPS check uses: its own, with the check's TLS options
/// (never the agent's client certificate, which is for its servers).
fn https_check_client(
    skip_verify: bool,
    server_name: Option<&str>,
) -> Result<reqwest::Client, String> {
    let tls =
        crate::tls::check_client_config(skip_verify, server_name).map_err(|e| e.to_string())?;
    crate::tls::http_client()
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| e.to_string())
}

async fn tcp_probe(addr: &str, timeout: Duration) -> (HealthStatus, String) {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => (HEALTH_PASSING, format!("TCP connect {addr}: Success")),
        Ok(Err(e)) => (HEALTH_CRITICAL, format!("dial tcp {addr}: {e}")),
        Err(_) => (HEALTH_CRITICAL, format!("dial tcp {addr}: i/o timeout")),
    }
}

/// Runs one check until aborted (the agent aborts it when the check is
/// replaced or removed). Alias checks need no runner.
pub async fn run(local: Arc<Local>, client: reqwest::Client, id: String, spec: CheckSpec) {
    let mut streak = Streak::default();
    match spec.probe.clone() {
        Probe::Alias(_) | Probe::Maintenance => {}
        Probe::Ttl(ttl) => {
            let Some(reset) = local.with(|t| t.live_check(&id).map(|c| c.ttl_reset.clone())) else {
                return;
            };
            loop {
                if tokio::time::timeout(ttl, reset.notified()).await.is_ok() {
                    continue;
                }
                tracing::debug!(check = %id, "TTL expired");
                local.with(|t| {
                    t.set_check_status(&id, HEALTH_CRITICAL, "TTL expired", Instant::now())
                });
                reset.notified().await;
            }
        }
        probe => {
            let client = match &probe {
                Probe::Http {
                    url,
                    tls_skip_verify,
                    tls_server_name,
                    ..
                } if url.starts_with("https://") => {
                    match https_check_client(*tls_skip_verify, tls_server_name.as_deref()) {
                        Ok(c) => c,
                        Err(e) => {
                            local.with(|t| {
                                t.set_check_status(&id, HEALTH_CRITICAL, &e, Instant::now())
                            });
                            return;
                        }
                    }
                }
                _ => client.clone(),
            };
            loop {
                let (status, output) = match &probe {
                    Probe::Http {
                        url,
                        method,
                        headers,
                        body,
                        ..
                    } => http_probe(&client, url, method, headers, body, spec.timeout).await,
                    Probe::Tcp(addr) => tcp_probe(addr, spec.timeout).await,
                    Probe::Ttl(_) | Probe::Alias(_) | Probe::Maintenance => {
                        unreachable!("handled above")
                    }
                };
                match streak.observe(&spec.thresholds, status) {
                    Some(status) => {
                        let changed = local
                            .with(|t| t.set_check_status(&id, status, &output, Instant::now()));
                        if changed {
                            tracing::debug!(check = %id, status = status.as_str(), "check result");
                        }
                    }
                    None => {
                        tracing::debug!(check = %id, result = status.as_str(), "below its threshold: status kept");
                    }
                }
                tokio::time::sleep(spec.interval).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(def: Value) -> HealthCheck {
        HealthCheck {
            check_id: "c".into(),
            definition: def.as_object().unwrap().clone(),
            ..Default::default()
        }
    }

    #[test]
    fn parses_the_three_kinds() {
        let s = CheckSpec::parse(&check(json!({"TTL": "15s"}))).unwrap();
        assert_eq!(s.probe, Probe::Ttl(Duration::from_secs(15)));
        let s = CheckSpec::parse(&check(json!({
            "HTTP": "http://127.0.0.1:1/h", "Interval": "500ms", "Timeout": "2s",
            "Header": {"X-A": ["1", "2"]}, "Method": "POST",
            "DeregisterCriticalServiceAfter": "10s",
        })))
        .unwrap();
        assert_eq!(s.interval, MIN_INTERVAL);
        assert_eq!(s.timeout, Duration::from_secs(2));
        assert_eq!(s.deregister_after, Some(MIN_DEREGISTER_AFTER));
        let Probe::Http {
            headers, method, ..
        } = &s.probe
        else {
            panic!("not http")
        };
        assert_eq!(headers.len(), 2);
        assert_eq!(method, "POST");
        let s = CheckSpec::parse(&check(
            json!({"TCP": "127.0.0.1:1", "Interval": 3_000_000_000u64}),
        ))
        .unwrap();
        assert_eq!(s.interval, Duration::from_secs(3));
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn https_checks_keep_their_tls_options() {
        let s = CheckSpec::parse(&check(json!({
            "HTTP": "https://127.0.0.1:1/h", "Interval": "1s",
            "TLSSkipVerify": true, "TLSServerName": "web.internal",
        })))
        .unwrap();
        let Probe::Http {
            tls_skip_verify,
            tls_server_name,
            ..
        } = &s.probe
        else {
            panic!("not http")
        };
        assert!(*tls_skip_verify);
        assert_eq!(tls_server_name.as_deref(), Some("web.internal"));
    }

    #[test]
    fn output_is_cut_at_four_kib() {
        let cut = truncate("é".repeat(3000));
        assert!(cut.len() <= MAX_OUTPUT && cut.len() >= MAX_OUTPUT - 1);
        assert_eq!(truncate("short".into()), "short");
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        for (def, want) in [
            (json!({}), "not supported"),
            (
                json!({"Args": ["/bin/true"], "Interval": "1s"}),
                "not supported",
            ),
            (
                json!({"HTTP": "http://x", "TCP": "x:1", "Interval": "1s"}),
                "exactly one",
            ),
            (json!({"HTTP": "http://x"}), "Interval must be > 0"),
            (
                json!({"HTTP": "ftp://x", "Interval": "1s"}),
                "only http:// and https://",
            ),
            (
                json!({"HTTP": "https://x", "Interval": "1s", "TLSSkipVerify": "yes"}),
                "TLSSkipVerify must be a boolean",
            ),
            (json!({"TTL": "ten"}), "Invalid TTL"),
            (
                json!({"AliasService": "web", "AliasNode": "n2"}),
                "AliasNode is not supported",
            ),
            (json!({"TTL": "1s", "AliasService": "web"}), "exactly one"),
            (
                json!({"TCP": "x:1", "Interval": "1s", "FailuresBeforeCritical": -1}),
                "Invalid FailuresBeforeCritical",
            ),
            (
                json!({"TCP": "x:1", "Interval": "1s", "SuccessBeforePassing": "many"}),
                "Invalid SuccessBeforePassing",
            ),
            (
                json!({"TCP": "x:1", "Interval": "1s", "FailuresBeforeWarning": 3, "FailuresBeforeCritical": 2}),
                "more than FailuresBeforeCritical",
            ),
            (json!({"TTL": "-1s"}), "negative"),
            (
                json!({"HTTP": "http://x", "Interval": "1s", "Header": 3}),
                "Invalid Header",
            ),
        ] {
            let err = CheckSpec::parse(&check(def.clone())).unwrap_err();
            assert!(err.contains(want), "{def}: {err}");
        }
    }

    #[test]
    fn parses_aliases_and_thresholds() {
        let s = CheckSpec::parse(&check(json!({"AliasService": "web"}))).unwrap();
        assert_eq!(s.alias_of(), Some("web"));
        assert_eq!(s.thresholds, Thresholds::default());
        let s = CheckSpec::parse(&check(json!({
            "TCP": "x:1", "Interval": "1s", "SuccessBeforePassing": 2, "FailuresBeforeCritical": "3",
        })))
        .unwrap();
        assert_eq!(
            s.thresholds,
            Thresholds {
                success_before_passing: 2,
                failures_before_warning: 3,
                failures_before_critical: 3,
            },
            "warning defaults to the critical threshold"
        );
    }

    /// Feeds results and collects what would be recorded.
    fn feed(t: Thresholds, results: &[HealthStatus]) -> Vec<Option<HealthStatus>> {
        let mut streak = Streak::default();
        results.iter().map(|r| streak.observe(&t, *r)).collect()
    }

    #[test]
    fn thresholds_count_consecutive_results() {
        const P: HealthStatus = HEALTH_PASSING;
        const W: HealthStatus = HEALTH_WARNING;
        const C: HealthStatus = HEALTH_CRITICAL;
        // No thresholds: every result counts.
        assert_eq!(
            feed(Thresholds::default(), &[P, C, W]),
            [Some(P), Some(C), Some(W)]
        );
        let t = Thresholds {
            success_before_passing: 3,
            failures_before_warning: 2,
            failures_before_critical: 2,
        };
        // Three passes in a row to pass; a failure in between starts over.
        assert_eq!(
            feed(t, &[P, P, C, P, P, P, P]),
            [None, None, None, None, None, Some(P), Some(P)]
        );
        // Two failures in a row to turn critical; a warning result is not
        // a failure, and counts toward passing.
        assert_eq!(
            feed(t, &[C, W, C, C, C]),
            [None, None, None, Some(C), Some(C)]
        );
        // Warning earlier than critical when asked.
        let t = Thresholds {
            success_before_passing: 0,
            failures_before_warning: 1,
            failures_before_critical: 3,
        };
        assert_eq!(feed(t, &[C, C, C, P]), [Some(W), Some(W), Some(C), Some(P)]);
    }

    #[test]
    fn alias_checks_mirror_the_aliased_service() {
        use crate::agent::local::Source;
        use crate::agent::local::fixtures::{add, svc, tables, ttl};
        let mut t = tables();
        let now = Instant::now();
        let alias = |id: &str, of: &str, owner: &str| {
            let c = HealthCheck {
                check_id: id.into(),
                service_id: owner.into(),
                definition: json!({"AliasService": of}).as_object().unwrap().clone(),
                ..Default::default()
            };
            let spec = CheckSpec::parse(&c).unwrap();
            (c, spec)
        };
        add(
            &mut t,
            svc("proxy", &[]),
            vec![alias("a", "web", "proxy")],
            now,
        );
        let status = |t: &super::super::local::Tables, id: &str| t.checks[id].check.status;
        assert_eq!(status(&t, "a"), HEALTH_CRITICAL, "no such service yet");
        add(&mut t, svc("web", &[]), vec![], now);
        assert_eq!(status(&t, "a"), HEALTH_PASSING, "a service without checks");
        t.put_check(ttl("w1", "web").0, ttl("w1", "web").1, Source::Api, now);
        assert_eq!(status(&t, "a"), HEALTH_CRITICAL);
        t.set_check_status("w1", HEALTH_WARNING, "", now);
        assert_eq!(status(&t, "a"), HEALTH_WARNING);
        assert!(!t.checks["a"].mark.in_sync, "an alias change is pushed");
        t.set_check_status("w1", HEALTH_PASSING, "", now);
        assert_eq!(status(&t, "a"), HEALTH_PASSING);
        // Node-level checks count; the proxy's own checks do not.
        t.put_check(ttl("node", "").0, ttl("node", "").1, Source::Api, now);
        assert_eq!(status(&t, "a"), HEALTH_CRITICAL);
        t.remove_check("node");
        assert_eq!(status(&t, "a"), HEALTH_PASSING);
        t.put_check(ttl("p1", "proxy").0, ttl("p1", "proxy").1, Source::Api, now);
        assert_eq!(status(&t, "a"), HEALTH_PASSING);
        // A chain: an alias of the proxy follows through the first alias.
        add(
            &mut t,
            svc("outer", &[]),
            vec![alias("b", "proxy", "outer")],
            now,
        );
        t.set_check_status("p1", HEALTH_PASSING, "", now);
        assert_eq!(status(&t, "b"), HEALTH_PASSING);
        t.set_check_status("w1", HEALTH_CRITICAL, "", now);
        assert_eq!(status(&t, "a"), HEALTH_CRITICAL);
        assert_eq!(status(&t, "b"), HEALTH_CRITICAL);
        t.remove_service("web");
        assert_eq!(status(&t, "a"), HEALTH_CRITICAL);
        // A cycle settles without looping forever (each holds the other
        // critical, as each started).
        add(&mut t, svc("x", &[]), vec![alias("cx", "y", "x")], now);
        add(&mut t, svc("y", &[]), vec![alias("cy", "x", "y")], now);
        assert_eq!(status(&t, "cx"), HEALTH_CRITICAL);
        assert_eq!(status(&t, "cy"), HEALTH_CRITICAL);
    }

    #[test]
    fn deregistration_is_due_after_the_critical_period() {
        use crate::agent::local::fixtures::{add, svc, tables};
        let mut t = tables();
        let t0 = Instant::now();
        let c = check(json!({"TTL": "5s", "DeregisterCriticalServiceAfter": "1m"}));
        let c = HealthCheck {
            service_id: "web".into(),
            ..c
        };
        let spec = CheckSpec::parse(&c).unwrap();
        add(&mut t, svc("web", &[]), vec![(c, spec)], t0);
        assert!(due_for_deregistration(&t, t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(
            due_for_deregistration(&t, t0 + Duration::from_secs(60)),
            ["web"]
        );
        // Passing resets the clock.
        t.set_check_status("c", HEALTH_PASSING, "", t0 + Duration::from_secs(30));
        assert!(due_for_deregistration(&t, t0 + Duration::from_secs(120)).is_empty());
    }
}
