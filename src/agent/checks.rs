//! Health checks the agent runs: TTL, HTTP, TCP, script and alias, with interval,
//! timeout, `DeregisterCriticalServiceAfter` and the consecutive-result
//! thresholds (`SuccessBeforePassing`, `FailuresBeforeWarning`,
//! `FailuresBeforeCritical`), as Consul defines them. Results go into the
//! local state; anti-entropy carries status changes to the catalog.
//!
//! Alias checks of a service on this agent have no runner: the local state
//! recomputes them on every change of a check or service
//! (`local::alias_status`), so they follow the aliased service at once and
//! cost nothing while idle. What a check is (`CheckSpec`) is read from its
//! definition in `spec`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::local::Local;
use super::spec::{CheckSpec, Probe, Streak};
use crate::structs::{HEALTH_CRITICAL, HEALTH_PASSING, HEALTH_WARNING, HealthStatus};

/// Consul's default cap on check output.
const MAX_OUTPUT: usize = 4096;

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
    client: &reqwest::Client, url: &str, method: &str, headers: &[(String, String)], body: &str,
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
    skip_verify: bool, server_name: Option<&str>,
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

/// One run of a script check: the command (no shell) with its output,
/// stdout and stderr together, cut at `MAX_OUTPUT`; exit 0 passing, 1
/// warning, anything else, a signal or no end within `timeout` (the
/// process is killed) critical, as Consul's.
async fn script_probe(args: &[String], timeout: Duration) -> (HealthStatus, String) {
    use tokio::io::AsyncReadExt;
    let mut cmd = tokio::process::Command::new(&args[0]);
    cmd.args(&args[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return (HEALTH_CRITICAL, format!("Check failed to start: {e}")),
    };
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return (
            HEALTH_CRITICAL,
            "Check failed to start: no output pipes".into(),
        );
    };
    // Both read to their end (a full pipe would stall the script), only
    // the first MAX_OUTPUT bytes of each kept.
    async fn capped(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> Vec<u8> {
        let (mut kept, mut chunk) = (Vec::new(), [0u8; 4096]);
        while let Ok(n) = r.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            let room = MAX_OUTPUT.saturating_sub(kept.len());
            kept.extend_from_slice(&chunk[..n.min(room)]);
        }
        kept
    }
    let run = async {
        let (o, e) = tokio::join!(capped(&mut out), capped(&mut err));
        (child.wait().await, o, e)
    };
    match tokio::time::timeout(timeout, run).await {
        Err(_) => (
            HEALTH_CRITICAL,
            format!("Timed out ({timeout:?}) running check"),
        ),
        Ok((Err(e), _, _)) => (HEALTH_CRITICAL, format!("Check failed: {e}")),
        Ok((Ok(status), mut o, e)) => {
            o.extend_from_slice(&e);
            let output = truncate(String::from_utf8_lossy(&o).into_owned());
            let code = status.code();
            let health = match code {
                Some(0) => HEALTH_PASSING,
                Some(1) => HEALTH_WARNING,
                _ => HEALTH_CRITICAL,
            };
            (health, output)
        }
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
                    Probe::Script(args) => script_probe(args, spec.timeout).await,
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
    use super::super::local::due_for_deregistration;
    use super::super::spec::*;
    use super::*;
    use crate::structs::HealthCheck;
    use serde_json::Value;
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
            (json!({"Args": []}), "Args must be a non-empty list"),
            (json!({"Args": ["/bin/true"]}), "Interval must be > 0"),
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
