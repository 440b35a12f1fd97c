//! The agent's way to the servers: the `--server` URLs, one in use at a
//! time, moving on to the next when it cannot be reached.
//!
//! A request that never connected was never seen, so it is safe to try it
//! on the next server; one that failed after connecting is reported to the
//! caller (anti-entropy retries it with backoff, the HTTP proxy answers
//! with the error), and after a timeout the next request starts at the
//! next server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;

// Requests sent to servers, by purpose (rendered at the agent's
// `/v1/agent/metrics`; the steady-state sync traffic is read off these).
crate::metrics::counters! { ALL:
    SYNC_READS = (
        "cairn_agent_sync_reads_total",
        "catalog reads made by full anti-entropy syncs"
    );
    SYNC_WRITES = (
        "cairn_agent_sync_writes_total",
        "catalog registrations and deregistrations pushed by anti-entropy"
    );
    HEARTBEATS = (
        "cairn_agent_heartbeats_total",
        "liveness heartbeats sent to the servers"
    );
    CONFIG_WATCHES = (
        "cairn_agent_config_watch_requests_total",
        "blocking reads of central config entries"
    );
    FORWARDED = (
        "cairn_agent_forwarded_total",
        "client requests forwarded to a server"
    );
    FULL_SYNCS = (
        "cairn_agent_full_syncs_total",
        "full anti-entropy syncs completed"
    );
    SYNC_FAILURES = (
        "cairn_agent_sync_failures_total",
        "anti-entropy runs that failed (retried with backoff)"
    );
    STREAM_SUBSCRIPTIONS = (
        "cairn_agent_stream_subscriptions_total",
        "event stream subscriptions opened by health views (the streaming backend)"
    );
    VIEW_READS = (
        "cairn_agent_view_reads_total",
        "blocking health reads answered from a health view, not forwarded"
    );
}

/// Why a request to the servers failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("no server reachable: {0}")]
    Unreachable(String),
    #[error("{what}: server answered {status}: {body}")]
    Refused {
        what: String,
        status: u16,
        body: String,
    },
    #[error("{what}: {reason}")]
    Failed { what: String, reason: String },
}

pub struct Servers {
    /// `PUT /v1/agent/join/:address` adds one.
    urls: parking_lot::RwLock<Vec<String>>,
    current: AtomicUsize,
    pub http: reqwest::Client,
    /// The token of the agent's own calls (anti-entropy, heartbeats,
    /// leave): `--acl-agent-token`, else `--acl-token`.
    /// `PUT /v1/agent/token/agent|default` replaces it.
    own_token: parking_lot::RwLock<Option<String>>,
}

/// How long a sync read or write may take.
pub const SHORT: Duration = Duration::from_secs(30);

impl Servers {
    /// `urls` are base URLs (`http://host:port` or `https://host:port`),
    /// at least one; `tls` is for the `https://` ones.
    pub fn new(
        urls: Vec<String>, tls: Option<rustls::ClientConfig>, own_token: Option<String>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!urls.is_empty(), "at least one --server is needed");
        if let Some(u) = urls.iter().find(|u| u.starts_with("https://")) {
            anyhow::ensure!(
                tls.is_some(),
                "--server {u} needs --tls-ca-file (the CA that signed the servers' certificates)"
            );
        }
        // reqwest's TLS has no provider of its own here (ring, not aws-lc).
        let mut http = crate::tls::http_client()
            .connect_timeout(Duration::from_secs(3))
            .pool_idle_timeout(Duration::from_secs(90));
        if let Some(tls) = tls {
            http = http.tls_backend_preconfigured(tls);
        }
        let http = http.build()?;
        Ok(Servers {
            urls: parking_lot::RwLock::new(urls),
            current: AtomicUsize::new(0),
            http,
            own_token: parking_lot::RwLock::new(own_token),
        })
    }

    /// How many servers it knows (`consul info`'s `known_servers`).
    pub fn known(&self) -> usize {
        self.urls.read().len()
    }

    /// Adds a server (a base URL); false if it was there already.
    pub fn add(&self, url: String) -> bool {
        let mut urls = self.urls.write();
        if urls.contains(&url) {
            return false;
        }
        urls.push(url);
        true
    }

    /// The agent's own calls use `token` from now on.
    pub fn set_own_token(&self, token: Option<String>) {
        *self.own_token.write() = token;
    }

    /// One of the agent's own requests (with its own token).
    pub async fn send(
        &self, method: reqwest::Method, path_and_query: &str,
        body: Option<(Bytes, Option<String>)>, timeout: Duration,
    ) -> Result<reqwest::Response, ServerError> {
        let token = self.own_token.read().clone();
        self.send_as(method, path_and_query, body, timeout, token.as_deref())
            .await
    }

    /// Sends a request with `token` (none: the anonymous token) to the
    /// server in use, moving on to the next ones while they cannot be
    /// connected to.
    pub async fn send_as(
        &self, method: reqwest::Method, path_and_query: &str,
        body: Option<(Bytes, Option<String>)>, timeout: Duration, token: Option<&str>,
    ) -> Result<reqwest::Response, ServerError> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        let urls = self.urls.read().clone();
        for i in 0..urls.len() {
            let at = (start + i) % urls.len();
            let url = format!("{}{}", urls[at], path_and_query);
            let mut req = self.http.request(method.clone(), &url).timeout(timeout);
            if let Some(t) = token {
                req = req.header(crate::request::authz::TOKEN_HEADER, t);
            }
            if let Some((b, ct)) = &body {
                req = req.body(b.clone());
                if let Some(ct) = ct {
                    req = req.header("content-type", ct);
                }
            }
            match req.send().await {
                Ok(r) => {
                    self.current.store(at, Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e) if e.is_connect() => {
                    tracing::debug!(server = %urls[at], error = %e, "server unreachable");
                    last = format!("{}: {e}", urls[at]);
                }
                Err(e) => {
                    if e.is_timeout() {
                        // Not retried (it may have been applied), but the
                        // next request starts at the next server: one that
                        // stopped answering holds one request, not all.
                        let next = (at + 1) % urls.len();
                        let _ = self.current.compare_exchange(
                            at,
                            next,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        tracing::warn!(server = %urls[at], "server did not answer in time; using the next");
                    }
                    return Err(ServerError::Failed {
                        what: format!("{method} {path_and_query}"),
                        reason: e.to_string(),
                    });
                }
            }
        }
        Err(ServerError::Unreachable(last))
    }

    /// A JSON read, with its `X-Consul-Index`.
    pub async fn get<T: DeserializeOwned>(
        &self, path: &str, timeout: Duration,
    ) -> Result<(T, u64), ServerError> {
        let resp = self.send(reqwest::Method::GET, path, None, timeout).await?;
        let what = || format!("GET {path}");
        let index = resp
            .headers()
            .get("x-consul-index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bytes = success_body(resp, what).await?;
        let value = serde_json::from_slice(&bytes).map_err(|e| ServerError::Failed {
            what: what(),
            reason: format!("invalid JSON: {e}"),
        })?;
        Ok((value, index))
    }

    /// A JSON write; the answer's body on success.
    pub async fn put<B: Serialize>(&self, path: &str, body: &B) -> Result<Bytes, ServerError> {
        let what = || format!("PUT {path}");
        let json = serde_json::to_vec(body).map_err(|e| ServerError::Failed {
            what: what(),
            reason: e.to_string(),
        })?;
        let resp = self
            .send(
                reqwest::Method::PUT,
                path,
                Some((Bytes::from(json), Some("application/json".into()))),
                SHORT,
            )
            .await?;
        success_body(resp, what).await
    }
}

/// The body of a server's answer, or the answer as an error when it is not
/// a success (`what` names the request in either error).
async fn success_body(
    resp: reqwest::Response, what: impl Fn() -> String,
) -> Result<Bytes, ServerError> {
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| ServerError::Failed {
        what: what(),
        reason: e.to_string(),
    })?;
    if !status.is_success() {
        return Err(ServerError::Refused {
            what: what(),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&bytes).trim().to_string(),
        });
    }
    Ok(bytes)
}

/// A client agent's failed request to its servers, as its HTTP API
/// answers it: none reachable is Consul's "No known Consul servers".
impl From<ServerError> for Error {
    fn from(e: ServerError) -> Self {
        match e {
            ServerError::Unreachable(_) => Error::Internal("No known Consul servers".into()),
            other => Error::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that accepts connections (the kernel does) but never reads
    /// or answers, as a frozen process.
    fn frozen() -> (std::net::TcpListener, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        (l, url)
    }

    /// A server that answers every request `200 ok`.
    async fn answering() -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if c.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn after_a_server_times_out_the_next_request_goes_to_the_next() {
        let (_held, stuck) = frozen();
        let good = answering().await;
        let servers = Servers::new(vec![stuck, good], None, None).unwrap();
        let get = || {
            servers.send(
                reqwest::Method::GET,
                "/v1/x",
                None,
                Duration::from_millis(300),
            )
        };
        let first = get().await;
        assert!(
            matches!(&first, Err(ServerError::Failed { .. })),
            "{first:?}"
        );
        let second = get().await.unwrap();
        assert_eq!(second.status(), 200);
        // And it stays there.
        assert_eq!(get().await.unwrap().status(), 200);
    }
}
