//! Health checks the agent runs: TTL, HTTP and TCP, with interval, timeout
//! and `DeregisterCriticalServiceAfter`, as Consul defines them. Results go
//! into the local state; anti-entropy carries status changes to the catalog.
//!
//! A check's definition lives in its `Definition` (the catalog's shape, as
//! `cli::services` builds it); [`CheckSpec::parse`] reads it once, at
//! registration, so a bad definition is refused there with a clear reason.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::local::Local;
use crate::structs::{HEALTH_CRITICAL, HEALTH_PASSING, HEALTH_WARNING, HealthCheck};

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
    },
    Tcp(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CheckSpec {
    pub probe: Probe,
    pub interval: Duration,
    pub timeout: Duration,
    /// The service is deregistered after its check was critical this long.
    pub deregister_after: Option<Duration>,
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
        let probe = match (ttl, text(c, "HTTP"), text(c, "TCP")) {
            (Some(ttl), None, None) => Probe::Ttl(ttl),
            (None, Some(url), None) => {
                if !url.starts_with("http://") {
                    return Err(format!(
                        "Invalid HTTP check {:?}: only http:// URLs are supported, got {url:?}",
                        c.check_id
                    ));
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
                }
            }
            (None, None, Some(addr)) => Probe::Tcp(addr),
            (None, None, None) => {
                let kind = if c.check_type.is_empty() {
                    "without TTL, HTTP or TCP".to_string()
                } else {
                    format!("of type {:?}", c.check_type)
                };
                return Err(format!(
                    "Check {:?} {kind} is not supported: cairn agents run TTL, HTTP and TCP checks",
                    c.check_id
                ));
            }
            _ => {
                return Err(format!(
                    "Check {:?} must have exactly one of TTL, HTTP or TCP",
                    c.check_id
                ));
            }
        };
        let interval = match (&probe, interval) {
            (Probe::Ttl(_), i) => i.unwrap_or_default(),
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
        })
    }

    pub fn is_ttl(&self) -> bool {
        matches!(self.probe, Probe::Ttl(_))
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

fn truncate(mut s: String) -> String {
    if s.len() > MAX_OUTPUT {
        let mut cut = MAX_OUTPUT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str(" ...");
    }
    s
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
) -> (&'static str, String) {
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
            let text = resp.text().await.unwrap_or_default();
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
        Err(e) => (HEALTH_CRITICAL, format!("HTTP {method} {url}: {e}")),
    }
}

async fn tcp_probe(addr: &str, timeout: Duration) -> (&'static str, String) {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => (HEALTH_PASSING, format!("TCP connect {addr}: Success")),
        Ok(Err(e)) => (HEALTH_CRITICAL, format!("dial tcp {addr}: {e}")),
        Err(_) => (HEALTH_CRITICAL, format!("dial tcp {addr}: i/o timeout")),
    }
}

/// Runs one check until aborted (the agent aborts it when the check is
/// replaced or removed).
pub async fn run(local: Arc<Local>, client: reqwest::Client, id: String, spec: CheckSpec) {
    match spec.probe.clone() {
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
        probe => loop {
            let (status, output) = match &probe {
                Probe::Http {
                    url,
                    method,
                    headers,
                    body,
                } => http_probe(&client, url, method, headers, body, spec.timeout).await,
                Probe::Tcp(addr) => tcp_probe(addr, spec.timeout).await,
                Probe::Ttl(_) => unreachable!("handled above"),
            };
            let changed = local.with(|t| t.set_check_status(&id, status, &output, Instant::now()));
            if changed {
                tracing::debug!(check = %id, status, "check result");
            }
            tokio::time::sleep(spec.interval).await;
        },
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
                json!({"HTTP": "https://x", "Interval": "1s"}),
                "only http://",
            ),
            (json!({"TTL": "ten"}), "Invalid TTL"),
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
