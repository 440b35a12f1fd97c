//! The `cairn` command line: Consul-style commands that talk HTTP to a
//! server (`CAIRN_HTTP_ADDR`, then `CONSUL_HTTP_ADDR`, then
//! `http://127.0.0.1:8500`).
//!
//! Layout, so more commands slot in beside these: `CliCommand` is the one
//! list of top-level commands (flattened into the binary's own subcommands
//! in `main.rs`); each area has its own file with its clap types and a
//! `run` taking the shared `Client`; `Client` and `table` are the shared
//! plumbing (address resolution, errors as one line and exit code 1,
//! aligned tables). A command returns `Result<(), CliError>`; `run` prints
//! the error and turns it into the exit code.
//!
//! The `Client` speaks HTTP or HTTPS, with the token of `-token`, else
//! `CAIRN_HTTP_TOKEN`, then `CONSUL_HTTP_TOKEN`, and the TLS files of
//! `CONSUL_CACERT` and `CONSUL_CLIENT_CERT`/`KEY` (or their `CAIRN_`
//! twins). Two commands need no server: `tls` writes local files only, and
//! `snapshot inspect` reads a file offline through a function the binary
//! hands in (decoding is the raft and state layers'). `rtt` computes its
//! estimate here from `/v1/coordinate/nodes` or `/datacenters` with
//! `coordinate::distance`; `kv export|import` use Consul's export JSON.

mod acl;
mod agent;
mod catalog;
pub(crate) mod config;
mod connect;
pub mod debug;
mod event;
mod intention;
mod keyring;
mod kv;
mod lock;
mod login;
mod maint;
mod members;
mod operator;
mod rtt;
pub mod services;
pub mod snapshot;
mod tls;
mod usage;
mod watch;

use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::Value;

pub use crate::definition::service_definition_to_register;
pub use crate::request::enc;

/// Commands that talk to a server over HTTP.
#[derive(Subcommand, Debug)]
pub enum CliCommand {
    /// Read the catalog: nodes, services, datacenters.
    #[command(subcommand)]
    Catalog(catalog::CatalogCmd),
    /// Register or deregister services from definition files.
    #[command(subcommand)]
    Services(services::ServicesCmd),
    /// Cluster operations: Raft peers and leadership, autopilot.
    #[command(subcommand)]
    Operator(operator::OperatorCmd),
    /// List the servers of the cluster.
    Members(members::MembersArgs),
    /// Read and write the key/value store.
    #[command(subcommand)]
    Kv(kv::KvCmd),
    /// Write, read, list and delete config entries.
    #[command(subcommand)]
    Config(config::ConfigCmd),
    /// Print the compiled discovery chain of a service (JSON).
    DiscoveryChain(config::ChainArgs),
    /// Put the node, or one service, into or out of maintenance mode.
    Maint(maint::MaintArgs),
    /// Run a command while holding a lock (or a semaphore slot with -n).
    Lock(lock::LockArgs),
    /// Save, restore and inspect snapshots of the whole state.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCmd),
    /// Create a CA and certificates for TLS (local files; no server).
    #[command(subcommand)]
    Tls(tls::TlsCmd),
    /// ACLs: bootstrap, tokens, policies, roles, templated policies (boxed:
    /// its flags outweigh the other commands').
    #[command(subcommand)]
    Acl(Box<acl::AclCmd>),
    /// Log in through an auth method: the token's SecretID goes to
    /// -token-sink-file.
    Login(login::LoginArgs),
    /// Delete the token this command runs with (one a login made).
    Logout,
    /// Intentions: which services may connect to which.
    #[command(subcommand)]
    Intention(intention::IntentionCmd),
    /// Connect: the CA's configuration, a sidecar's Envoy bootstrap.
    #[command(subcommand)]
    Connect(connect::ConnectCmd),
    /// The servers' encryption keys: list them, or install, use and remove
    /// one.
    Keyring(keyring::KeyringArgs),
    /// Fire a user event, to the nodes its filters match.
    Event(event::EventArgs),
    /// Watch a view (key, keyprefix, services, nodes, service, checks,
    /// event, connect_roots, connect_leaf, agent_service) and run a handler
    /// with its JSON on every change.
    Watch(watch::WatchArgs),
    /// Make the agent read its configuration files again.
    Reload,
    /// Stream the agent's log lines.
    Monitor(agent::MonitorArgs),
    /// Join a server to the cluster of the server at a Raft address, or
    /// give a client agent one more server.
    Join(agent::JoinArgs),
    /// Remove a failed node: a server from Raft, any node from the catalog.
    ForceLeave(agent::ForceLeaveArgs),
    /// Make the agent leave the cluster and stop.
    Leave,
    /// The agent's and its server's state, as `consul info`.
    Info,
    /// Estimated round-trip time between two nodes, from their network
    /// coordinates (`-wan`: between servers).
    Rtt(rtt::RttArgs),
}

/// A failed command: the one line to print.
#[derive(Debug)]
pub struct CliError(pub String);

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError(e.to_string())
    }
}

pub type CliResult = Result<(), CliError>;

/// A server's refusal, in the Go client's words:
/// `Unexpected response code: 403 (Permission denied ...)`.
pub fn unexpected(status: u16, body: &[u8]) -> CliError {
    CliError(format!(
        "Unexpected response code: {status} ({})",
        String::from_utf8_lossy(body).trim()
    ))
}

/// Runs one command; returns the process exit code. `snapshots` reads
/// snapshot files (see `snapshot::Readers`).
pub fn run(cmd: CliCommand, snapshots: snapshot::Readers, token: Option<String>) -> i32 {
    // A server is needed by every command but `tls` (local files only).
    let client = || Client::from_env(token.clone());
    let result = match cmd {
        CliCommand::Tls(c) => tls::run(c),
        CliCommand::Catalog(c) => client().and_then(|cl| catalog::run(&cl, c)),
        CliCommand::Services(c) => client().and_then(|cl| services::run(&cl, c)),
        CliCommand::Operator(c) => client().and_then(|cl| operator::run(&cl, c)),
        CliCommand::Members(a) => client().and_then(|cl| members::run(&cl, a)),
        CliCommand::Kv(c) => client().and_then(|cl| kv::run(&cl, c)),
        CliCommand::Config(c) => client().and_then(|cl| config::run(&cl, c)),
        CliCommand::DiscoveryChain(a) => client().and_then(|cl| config::discovery_chain(&cl, a)),
        CliCommand::Maint(a) => client().and_then(|cl| maint::run(&cl, a)),
        CliCommand::Snapshot(c) => client().and_then(|cl| snapshot::run(&cl, c, snapshots)),
        CliCommand::Acl(c) => client().and_then(|cl| acl::run(&cl, *c)),
        CliCommand::Login(a) => client().and_then(|cl| login::login(&cl, a)),
        CliCommand::Logout => client().and_then(|cl| login::logout(&cl)),
        CliCommand::Connect(c) => client().and_then(|cl| connect::run(&cl, c, token.clone())),
        CliCommand::Intention(c) => match client().and_then(|cl| intention::run(&cl, c)) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        CliCommand::Event(a) => client().and_then(|cl| event::run(&cl, a)),
        CliCommand::Keyring(a) => client().and_then(|cl| keyring::run(&cl, a)),
        CliCommand::Watch(a) => match client().and_then(|cl| watch::run(&cl, a)) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        CliCommand::Reload => client().and_then(|cl| agent::reload(&cl)),
        CliCommand::Monitor(a) => client().and_then(|cl| agent::monitor(&cl, a)),
        CliCommand::Join(a) => client().and_then(|cl| agent::join(&cl, a)),
        CliCommand::ForceLeave(a) => client().and_then(|cl| agent::force_leave(&cl, a)),
        CliCommand::Leave => client().and_then(|cl| agent::leave(&cl)),
        CliCommand::Info => client().and_then(|cl| agent::info(&cl)),
        CliCommand::Rtt(a) => client().and_then(|cl| rtt::run(&cl, a)),
        CliCommand::Lock(a) => match client().and_then(|cl| lock::run(&cl, a)) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    finish(result)
}

/// `cairn debug` (a live bundle; its `data-dir` subcommand is the
/// binary's own): the exit code.
pub fn run_debug(a: debug::DebugArgs, token: Option<String>) -> i32 {
    finish(Client::from_env(token).and_then(|c| debug::run(&c, a)))
}

/// Prints a failed command's error; the exit code.
fn finish(result: CliResult) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{}", e.0);
            1
        }
    }
}

/// Consul's `-format` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Pretty,
    Json,
}

/// The first of these variables set and not empty.
fn env_var(names: &[&str]) -> Option<String> {
    names
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty())
}

/// The server address from the environment, as a base URL
/// (`CONSUL_HTTP_SSL=true` makes an address without a scheme `https://`,
/// as Consul's CLI does).
pub fn http_addr_from_env() -> String {
    let addr = env_var(&["CAIRN_HTTP_ADDR", "CONSUL_HTTP_ADDR"])
        .unwrap_or_else(|| "http://127.0.0.1:8500".into());
    let ssl =
        env_var(&["CAIRN_HTTP_SSL", "CONSUL_HTTP_SSL"]).is_some_and(|v| v == "true" || v == "1");
    if ssl && !addr.contains("://") {
        format!("https://{addr}")
    } else {
        addr
    }
}

/// The TLS config for an `https://` server from the environment:
/// `CAIRN_CACERT` / `CONSUL_CACERT` (the CA to trust; without one, the
/// system's roots) and `CAIRN_CLIENT_CERT` / `CONSUL_CLIENT_CERT` with
/// `CAIRN_CLIENT_KEY` / `CONSUL_CLIENT_KEY` (a client certificate, for a
/// server with `--tls-verify-incoming`).
fn tls_from_env() -> Result<Option<rustls::ClientConfig>, CliError> {
    let ca = env_var(&["CAIRN_CACERT", "CONSUL_CACERT"]);
    let cert = env_var(&["CAIRN_CLIENT_CERT", "CONSUL_CLIENT_CERT"]);
    let key = env_var(&["CAIRN_CLIENT_KEY", "CONSUL_CLIENT_KEY"]);
    let Some(ca) = ca else {
        if cert.is_some() {
            return Err(CliError(
                "CONSUL_CLIENT_CERT needs CONSUL_CACERT (the CA to trust) as well".into(),
            ));
        }
        return Ok(None);
    };
    let pair = match (&cert, &key) {
        (Some(c), Some(k)) => Some((std::path::Path::new(c), std::path::Path::new(k))),
        (None, None) => None,
        _ => {
            return Err(CliError(
                "CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY go together".into(),
            ));
        }
    };
    Ok(Some(crate::tls::client_config(
        std::path::Path::new(&ca),
        pair,
    )?))
}

/// Accepts `host:port`, `http://host:port`, `https://host:port` (and a
/// trailing `/`).
pub fn normalize_addr(addr: &str) -> Result<String, CliError> {
    let addr = addr.trim().trim_end_matches('/');
    if addr.starts_with("http://") || addr.starts_with("https://") {
        Ok(addr.to_string())
    } else if addr.contains("://") {
        Err(CliError(format!("Unsupported address scheme in {addr:?}")))
    } else {
        Ok(format!("http://{addr}"))
    }
}

/// A blocking HTTP client over one small runtime (the CLI does one thing
/// at a time).
pub struct Client {
    pub base: String,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
    /// Sent as `X-Consul-Token` on every request.
    token: Option<String>,
}

/// One answer: status and body.
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Result<Value, CliError> {
        serde_json::from_str(&self.body)
            .map_err(|e| CliError(format!("Invalid JSON from the server: {e}")))
    }
}

impl Client {
    /// The server and token from the environment; `-token` (given) wins
    /// over `CAIRN_HTTP_TOKEN`, then `CONSUL_HTTP_TOKEN`.
    pub fn from_env(token: Option<String>) -> Result<Client, CliError> {
        let mut c = Client::new(&http_addr_from_env())?;
        c.token = token
            .filter(|t| !t.is_empty())
            .or_else(|| env_var(&["CAIRN_HTTP_TOKEN", "CONSUL_HTTP_TOKEN"]));
        Ok(c)
    }

    /// A request to `path` with the token, if any.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{}", self.base, path);
        let req = self.http.request(method, &url);
        match &self.token {
            Some(t) => req.header("x-consul-token", t),
            None => req,
        }
    }

    pub fn new(addr: &str) -> Result<Client, CliError> {
        let base = normalize_addr(addr)?;
        // reqwest's TLS has no provider of its own here (ring, not aws-lc).
        let mut http = crate::tls::http_client()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60));
        if base.starts_with("https://")
            && let Some(tls) = tls_from_env()?
        {
            http = http.tls_backend_preconfigured(tls);
        }
        let http = http.build()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Client {
            base,
            http,
            rt,
            token: None,
        })
    }

    /// Sends a request; any answer (even 4xx/5xx) is a `Reply`, only an
    /// unreachable server is an error.
    pub fn send(
        &self, method: reqwest::Method, path: &str, body: Option<String>,
    ) -> Result<Reply, CliError> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        self.rt.block_on(async {
            let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
            let status = resp.status().as_u16();
            let body = resp.text().await.map_err(|e| self.unreachable(&e))?;
            Ok(Reply { status, body })
        })
    }

    /// Sends raw bytes and reads raw bytes (snapshots): status and body.
    /// Allowed minutes, not the usual minute: a large state takes a while.
    pub fn send_bytes(
        &self, method: reqwest::Method, path: &str, body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), CliError> {
        let mut req = self.request(method, path).timeout(Duration::from_secs(600));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/octet-stream")
                .body(b);
        }
        self.rt.block_on(async {
            let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
            let status = resp.status().as_u16();
            let body = resp.bytes().await.map_err(|e| self.unreachable(&e))?;
            Ok((status, body.to_vec()))
        })
    }

    /// A blocking read (`cairn watch`): status, body and `X-Consul-Index`,
    /// allowed `timeout` (the read's wait and some).
    pub fn get_blocking(
        &self, path: &str, timeout: Duration,
    ) -> Result<(u16, String, u64), CliError> {
        let req = self.request(reqwest::Method::GET, path).timeout(timeout);
        self.rt.block_on(async {
            let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
            let status = resp.status().as_u16();
            let index = resp
                .headers()
                .get("x-consul-index")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let body = resp.text().await.map_err(|e| self.unreachable(&e))?;
            Ok((status, body, index))
        })
    }

    /// A (blocking) read's `X-Consul-Index`, whatever its status.
    pub fn send_with_index(&self, method: reqwest::Method, path: &str) -> Result<u64, CliError> {
        let req = self.request(method, path);
        self.rt.block_on(async {
            let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
            Ok(resp
                .headers()
                .get("x-consul-index")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0))
        })
    }

    fn unreachable(&self, e: &reqwest::Error) -> CliError {
        // reqwest's own message is generic; the cause names the problem.
        let mut cause = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            cause = s.to_string();
            src = s.source();
        }
        CliError(format!(
            "Error connecting to the cairn server at {}: {cause} \
             (is a server running there? set CAIRN_HTTP_ADDR to change the address)",
            self.base
        ))
    }

    /// A request that must succeed (2xx); the answer's body otherwise.
    pub fn expect_ok(
        &self, method: reqwest::Method, path: &str, body: Option<String>,
    ) -> Result<Reply, CliError> {
        let r = self.send(method, path, body)?;
        if !(200..300).contains(&r.status) {
            return Err(unexpected(r.status, r.body.as_bytes()));
        }
        Ok(r)
    }

    /// A streamed answer (`monitor`), a chunk at a time to `each` until
    /// the stream ends or `each` says stop; no overall timeout.
    pub fn stream(&self, path: &str, mut each: impl FnMut(&[u8]) -> bool) -> CliResult {
        let req = self
            .request(reqwest::Method::GET, path)
            .timeout(Duration::from_secs(u64::from(u32::MAX)));
        self.rt.block_on(async {
            let mut resp = req.send().await.map_err(|e| self.unreachable(&e))?;
            if !resp.status().is_success() {
                let status = resp.status().as_u16();
                let body = resp.bytes().await.unwrap_or_default();
                return Err(unexpected(status, &body));
            }
            while let Some(chunk) = resp.chunk().await.map_err(|e| self.unreachable(&e))? {
                if !each(&chunk) {
                    break;
                }
            }
            Ok(())
        })
    }

    pub fn get_json(&self, path: &str) -> Result<Value, CliError> {
        self.expect_ok(reqwest::Method::GET, path, None)?.json()
    }

    /// Runs `f` on the client's runtime (several requests at once).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// A GET that must succeed, its body as bytes, allowed `timeout`.
    pub async fn bytes(&self, path: &str, timeout: Duration) -> Result<Vec<u8>, CliError> {
        let resp = self
            .request(reqwest::Method::GET, path)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|e| self.unreachable(&e))?;
        if !(200..300).contains(&status) {
            return Err(CliError(format!("{path}: {}", unexpected(status, &body).0)));
        }
        Ok(body.to_vec())
    }

    /// A streamed GET (metrics, logs) read until `until`: what came.
    pub async fn stream_until(&self, path: &str, until: Instant) -> Result<Vec<u8>, CliError> {
        let left = until.saturating_duration_since(Instant::now());
        let mut resp = self
            .request(reqwest::Method::GET, path)
            .timeout(left + Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            let body = resp.bytes().await.unwrap_or_default();
            return Err(CliError(format!("{path}: {}", unexpected(status, &body).0)));
        }
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::from_std(until);
        while let Ok(chunk) = tokio::time::timeout_at(deadline, resp.chunk()).await {
            match chunk.map_err(|e| self.unreachable(&e))? {
                Some(c) => out.extend_from_slice(&c),
                None => break,
            }
        }
        Ok(out)
    }

    /// The node name of the agent (server) we talk to.
    pub fn agent_node_name(&self) -> Result<String, CliError> {
        let me = self.get_json("/v1/agent/self")?;
        me["Config"]["NodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(String::from)
            .ok_or_else(|| CliError("The agent did not report its node name".into()))
    }
}

/// Columns aligned with two spaces between them, as Consul prints tables.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; cols];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Prints a JSON value the way `-format=json` does: indented.
pub fn print_json(v: &Value) -> CliResult {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Go's `flag` package takes `-name=value` as well as `--name=value`, and
/// Consul's docs write the single-dash form. Clap wants two dashes for long
/// options, so single-dash words of two or more letters become long
/// options (`-format=json` → `--format=json`); `-`, `-h`, negative numbers
/// and everything after `--` are left alone.
pub fn go_style_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = false;
    for a in args {
        if rest {
            out.push(a);
            continue;
        }
        if a == "--" {
            rest = true;
            out.push(a);
            continue;
        }
        let name = a
            .strip_prefix('-')
            .filter(|r| !r.starts_with('-'))
            .map(|r| r.split('=').next().unwrap_or(""));
        match name {
            Some(n)
                if n.len() >= 2
                    && n.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
            {
                out.push(format!("-{a}"));
            }
            _ => out.push(a),
        }
    }
    out
}

// ---- helpers of the JSON API verbs (`acl`, `login`) ----

/// A request whose answer must be 2xx JSON.
fn send(
    c: &Client, method: reqwest::Method, path: &str, body: Option<Value>,
) -> Result<Value, CliError> {
    let body = body.map(|b| b.to_string());
    c.expect_ok(method, path, body)?.json()
}

fn show(format: Format, v: &Value, pretty: fn(&Value)) -> CliResult {
    if format == Format::Json {
        return print_json(v);
    }
    pretty(v);
    Ok(())
}

/// `PUT path` with `body` (a create), its answer shown.
fn create(c: &Client, path: &str, body: Value, format: Format, pretty: fn(&Value)) -> CliResult {
    let v = send(c, reqwest::Method::PUT, path, Some(body))?;
    show(format, &v, pretty)
}

/// `GET path` (a listing), each item shown.
fn list(c: &Client, path: &str, format: Format, pretty: fn(&Value)) -> CliResult {
    let v = &send(c, reqwest::Method::GET, path, None)?;
    if format == Format::Json {
        return print_json(v);
    }
    for (i, item) in v.as_array().into_iter().flatten().enumerate() {
        if i > 0 {
            println!();
        }
        pretty(item);
    }
    Ok(())
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Rules as given, or read from `@file`.
fn rules_arg(rules: String) -> Result<String, CliError> {
    match rules.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| CliError(format!("Failed to read rules from {file}: {e}"))),
        None => Ok(rules),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            normalize_addr("127.0.0.1:8500").unwrap(),
            "http://127.0.0.1:8500"
        );
        assert_eq!(
            normalize_addr("http://localhost:1/").unwrap(),
            "http://localhost:1"
        );
        assert_eq!(normalize_addr("https://x:1").unwrap(), "https://x:1");
        assert!(normalize_addr("unix:///tmp/s").is_err());
    }

    #[test]
    fn single_dash_long_flags() {
        let got = go_style_args(
            [
                "cairn",
                "members",
                "-format=json",
                "-id",
                "x",
                "-h",
                "-",
                "-5",
                "--",
                "-detailed",
            ]
            .map(String::from),
        );
        assert_eq!(
            got,
            [
                "cairn",
                "members",
                "--format=json",
                "--id",
                "x",
                "-h",
                "-",
                "-5",
                "--",
                "-detailed"
            ]
        );
    }

    #[test]
    fn tables_align() {
        let t = table(&[
            vec!["Node".into(), "Address".into(), "DC".into()],
            vec!["узел".into(), "10.0.0.1".into(), "dc1".into()],
        ]);
        assert_eq!(t, "Node  Address   DC\nузел  10.0.0.1  dc1\n");
    }
}
