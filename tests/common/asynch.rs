//! Async access to the harness's processes (`Server`), for tests driving
//! them with many requests at once: a reqwest client and helpers over any
//! `Endpoint`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// A process answering HTTP.
pub trait Endpoint {
    /// `http://IP:PORT` + `path`.
    fn at(&self, path: &str) -> String;
}

impl<T: Endpoint + ?Sized> Endpoint for &T {
    fn at(&self, path: &str) -> String {
        (**self).at(path)
    }
}

impl Endpoint for super::Server {
    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }
}

pub fn client() -> reqwest::Client {
    cairn::tls::http_client()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// `GET url`, decoded from JSON (panics on any failure: tests want the
/// answer).
pub async fn get_json<T: serde::de::DeserializeOwned>(
    c: &reqwest::Client, url: impl reqwest::IntoUrl,
) -> T {
    c.get(url).send().await.unwrap().json().await.unwrap()
}

/// Sends `req` and reads the answer's body as text (panics on a transport
/// failure).
pub async fn send_text(req: reqwest::RequestBuilder) -> String {
    req.send().await.unwrap().text().await.unwrap()
}

/// An answer's `X-Consul-Index` (panics when it has none).
pub fn consul_index(r: &reqwest::Response) -> u64 {
    r.headers()["x-consul-index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Polls until `f` returns Some, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `n` blocking queries are parked on `p` (see
/// `Server::wait_parked`).
pub async fn wait_parked(c: &reqwest::Client, p: &impl Endpoint, n: u64) {
    eventually(
        Duration::from_secs(10),
        "parked blocking queries",
        || async {
            let body = c
                .get(p.at(super::METRICS))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (super::metric_in(&body, "cairn_blocking_queries_parked") as u64 >= n).then_some(())
        },
    )
    .await
}

/// The leader's Raft address as `p` reports it, if any.
pub async fn leader_of(c: &reqwest::Client, p: &impl Endpoint) -> Option<String> {
    let r = c.get(p.at("/v1/status/leader")).send().await.ok()?;
    let s: String = r.json().await.ok()?;
    (!s.is_empty()).then_some(s)
}

/// The leader every server of `servers` names, once they agree.
pub async fn cluster_leader(c: &reqwest::Client, servers: &[super::Server]) -> String {
    agreed_leader(c, &servers.iter().collect::<Vec<_>>()).await
}

/// Every server of `servers` but the `skip`th (the survivors of a kill).
pub fn all_but(servers: &[super::Server], skip: usize) -> Vec<&super::Server> {
    servers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != skip)
        .map(|(_, s)| s)
        .collect()
}

/// The HTTP addresses of `servers` (for load generators).
pub fn http_addrs(servers: &[&super::Server]) -> Vec<String> {
    servers.iter().map(|s| s.http_addr.to_string()).collect()
}

/// Waits until every live server in `procs` names the same leader.
pub async fn agreed_leader<E: Endpoint>(c: &reqwest::Client, procs: &[&E]) -> String {
    eventually(Duration::from_secs(20), "an agreed leader", || async {
        let mut seen = None;
        for p in procs {
            let l = leader_of(c, *p).await?;
            if seen.get_or_insert(l.clone()) != &l {
                return None;
            }
        }
        seen
    })
    .await
}

pub async fn put(
    c: &reqwest::Client, p: &impl Endpoint, key: &str, value: &str,
) -> Result<bool, String> {
    let r = c
        .put(p.at(&format!("/v1/kv/{key}")))
        .body(value.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let text = r.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {text}"));
    }
    Ok(text.trim() == "true")
}

pub async fn get_raw(
    c: &reqwest::Client, p: &impl Endpoint, key: &str, mode: &str,
) -> Option<String> {
    let r = c
        .get(p.at(&format!("/v1/kv/{key}?raw&{mode}")))
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.text().await.ok()
}

pub fn base64_decode(s: &str) -> String {
    use base64::Engine;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
}

/// Every KV entry under `prefix` as `p` has it (`?stale`: its own state).
pub async fn kv_tree(
    c: &reqwest::Client, p: &impl Endpoint, prefix: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    let r = c
        .get(p.at(&format!("/v1/kv/{prefix}?recurse&stale")))
        .send()
        .await
        .ok()?;
    if r.status() == 404 {
        return Some(Default::default());
    }
    let entries: Vec<serde_json::Value> = r.json().await.ok()?;
    Some(
        entries
            .iter()
            .map(|e| {
                (
                    e["Key"].as_str().unwrap_or_default().to_string(),
                    base64_decode(e["Value"].as_str().unwrap_or("")),
                )
            })
            .collect(),
    )
}

/// A connection to `addr` from the loopback address `from` (a client IP
/// of its own, for the per-IP caps).
#[allow(dead_code)]
pub async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind((std::net::Ipv4Addr::from(from), 0).into())
        .unwrap();
    sock.connect(addr).await.unwrap()
}
