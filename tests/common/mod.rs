//! Shared helpers for integration tests: start the real `cairn` binary on
//! free ports, wait until it has a leader, talk HTTP to it, and stop it when
//! the test ends (even on panic).
//!
//! The HTTP client here is a deliberately small, synchronous HTTP/1.1 client
//! over `std::net::TcpStream`: tests stay plain `#[test]` functions, a
//! blocking query is just a thread, and nothing depends on which features a
//! client crate was built with. Tests that drive many requests at once use
//! `asynch` (reqwest) over the same `Server`s; `cluster(n, extra)` starts
//! servers that form a cluster by themselves; `Server::restart`, `kill`,
//! `signal` and `stop` are the faults.
//!
//! ```ignore
//! let s = Server::dev();
//! let r = s.put("/v1/catalog/register", r#"{"Node":"n1","Address":"10.0.0.1"}"#);
//! assert_eq!(r.status, 200);
//! let three = Server::builder().node("s1").bootstrap_expect(3).join(other.raft_addr).start();
//! ```

#![allow(dead_code)]

/// The HTTP helpers of a running process over its `http_addr`, servers'
/// and agents' alike: `get`, `put`, `delete`, `get_json` (a 200 required)
/// and `metric` (a gauge or counter from its Prometheus metrics). A macro
/// so that they stay inherent methods of both types: tests call them
/// without importing a trait.
macro_rules! http_helpers {
    () => {
        pub fn get(&self, path: &str) -> crate::common::Resp {
            crate::common::request(self.http_addr, "GET", path, None)
        }
        pub fn put(&self, path: &str, body: &str) -> crate::common::Resp {
            crate::common::request(self.http_addr, "PUT", path, Some(body))
        }
        pub fn delete(&self, path: &str) -> crate::common::Resp {
            crate::common::request(self.http_addr, "DELETE", path, None)
        }
        pub fn get_json(&self, path: &str) -> serde_json::Value {
            let r = self.get(path);
            assert_eq!(r.status, 200, "GET {path}: {}", r.body);
            r.json()
        }
        pub fn metric(&self, name: &str) -> f64 {
            crate::common::metric_in(&self.get(crate::common::METRICS).body, name)
        }
    };
}

pub mod acl;
pub mod ads;
pub mod agent;
pub mod asynch;
pub mod dns;
pub mod pki;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A port nobody listens on right now, and never handed out before in this
/// test binary: tests run in parallel, and two servers given the same port
/// before either bound it had one test talking to the other's server.
/// Drawn below Linux's ephemeral range (32768-60999), which outgoing
/// connections take their source ports from: a port the kernel handed out
/// (`bind(:0)`) could be taken by some connection before the server bound
/// it (seen: "cannot listen on --raft-addr ...: Address already in use").
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    // Spread by process, so that test binaries run at once rarely try the
    // same ports.
    let mut next = 20_000 + (std::process::id() as u64 * 7_919 % 12_000) as u16;
    loop {
        next = if next >= 31_999 { 20_000 } else { next + 1 };
        if !GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(next) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", next)).is_ok() {
            return next;
        }
    }
}

/// A free port for DNS: free for TCP and for UDP.
pub fn free_dns_port() -> u16 {
    loop {
        let port = free_port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `--dns-addr` on a free loopback port, unless the test's own arguments
/// give one: every process would otherwise take the default 8600.
pub fn dns_args(extra: &[String]) -> (Vec<String>, SocketAddr) {
    if let Some(i) = extra.iter().position(|a| a == "--dns-addr") {
        let addr = extra
            .get(i + 1)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        return (Vec::new(), addr);
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], free_dns_port()));
    (vec!["--dns-addr".into(), addr.to_string()], addr)
}

/// `--grpc-addr` on a free loopback port, unless the test's own arguments
/// give one: every server would otherwise take the default 8502.
pub fn grpc_args(extra: &[String]) -> (Vec<String>, SocketAddr) {
    if let Some(i) = extra.iter().position(|a| a == "--grpc-addr") {
        let addr = extra
            .get(i + 1)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        return (Vec::new(), addr);
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    (vec!["--grpc-addr".into(), addr.to_string()], addr)
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cairn")
}

/// A fresh `--encrypt` key from `cairn keygen` (base64 of 32 bytes).
pub fn keygen() -> String {
    let out = Command::new(bin()).arg("keygen").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(key.len(), 44, "{key}");
    assert!(key.ends_with('='), "{key}");
    key
}

/// How to start one server; `start()` runs it and waits for a leader.
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    dev: bool,
    node: Option<String>,
    data_dir: Option<PathBuf>,
    http_port: Option<u16>,
    raft_port: Option<u16>,
    datacenter: Option<String>,
    bootstrap_expect: Option<usize>,
    join: Vec<String>,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    wait_leader: bool,
    https_only: bool,
    wait: bool,
}

impl ServerBuilder {
    /// `--dev`: one server on a throwaway data dir.
    pub fn dev(mut self) -> Self {
        self.dev = true;
        self
    }
    pub fn node(mut self, name: &str) -> Self {
        self.node = Some(name.into());
        self
    }
    /// The data dir to use (kept after the server stops, so a test can
    /// restart on it); without it a fresh temp dir is made and removed.
    pub fn data_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.data_dir = Some(dir.as_ref().to_path_buf());
        self
    }
    pub fn http_port(mut self, port: u16) -> Self {
        self.http_port = Some(port);
        self
    }
    pub fn raft_port(mut self, port: u16) -> Self {
        self.raft_port = Some(port);
        self
    }
    pub fn datacenter(mut self, dc: &str) -> Self {
        self.datacenter = Some(dc.into());
        self
    }
    pub fn bootstrap_expect(mut self, n: usize) -> Self {
        self.bootstrap_expect = Some(n);
        self
    }
    /// Another server's raft address (repeatable).
    pub fn join(mut self, raft_addr: impl ToString) -> Self {
        self.join.push(raft_addr.to_string());
        self
    }
    pub fn arg(mut self, a: &str) -> Self {
        self.extra.push(a.into());
        self
    }
    /// `--primary-datacenter`: the federation's primary, for a secondary.
    pub fn primary(self, dc: &str) -> Self {
        self.arg("--primary-datacenter").arg(dc)
    }
    /// `--join-wan`: a server of another datacenter (repeatable).
    pub fn join_wan(self, raft_addr: impl ToString) -> Self {
        self.arg("--join-wan").arg(&raft_addr.to_string())
    }
    /// Return as soon as the HTTP port answers, without waiting for a
    /// leader (for cluster members that cannot elect one alone).
    pub fn no_wait(mut self) -> Self {
        self.wait_leader = false;
        self
    }
    /// HTTPS only (`--http-addr ""`), on the HTTP port: `url` is
    /// `https://`, and `start` waits only for the port (the helpers here
    /// talk plain HTTP). Needs the TLS flags as `arg`s.
    pub fn https_only(mut self) -> Self {
        self.https_only = true;
        self.wait_leader = false;
        self
    }
    /// ACLs on with `default` (`allow` or `deny`) and `management` as the
    /// initial management token, which the server's own agent uses too.
    pub fn acl(self, default: &str, management: &str) -> Self {
        self.arg("--acl-enabled")
            .arg("--acl-default-policy")
            .arg(default)
            .arg("--acl-initial-management-token")
            .arg(management)
            .arg("--acl-agent-token")
            .arg(management)
    }
    /// An environment variable for the server process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
    /// Starts the process and returns at once, waiting for nothing (for a
    /// server expected to exit).
    pub fn spawn(mut self) -> Server {
        self.wait = false;
        self.start()
    }

    pub fn start(self) -> Server {
        let http_port = self.http_port.unwrap_or_else(free_port);
        let raft_port = self.raft_port.unwrap_or_else(free_port);
        let tmp = tempfile::tempdir().expect("temp dir");
        let data_dir = match (&self.data_dir, self.dev) {
            (Some(d), _) => Some(d.clone()),
            (None, true) => None,
            (None, false) => Some(tmp.path().join("data")),
        };
        let http_addr: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
        let raft_addr: SocketAddr = format!("127.0.0.1:{raft_port}").parse().unwrap();
        let mut args: Vec<String> = vec!["server".into()];
        if self.dev {
            args.push("--dev".into());
        }
        if let Some(n) = &self.node {
            args.extend(["--node".into(), n.clone()]);
        }
        if let Some(d) = &data_dir {
            args.extend(["--data-dir".into(), d.display().to_string()]);
        }
        if self.https_only {
            args.extend(["--http-addr".into(), String::new()]);
            args.extend(["--https-addr".into(), http_addr.to_string()]);
        } else {
            args.extend(["--http-addr".into(), http_addr.to_string()]);
        }
        args.extend(["--raft-addr".into(), raft_addr.to_string()]);
        if let Some(dc) = &self.datacenter {
            args.extend(["--datacenter".into(), dc.clone()]);
        }
        if let Some(n) = self.bootstrap_expect {
            args.extend(["--bootstrap-expect".into(), n.to_string()]);
        }
        for j in &self.join {
            args.extend(["--join".into(), j.clone()]);
        }
        let (dns, dns_addr) = dns_args(&self.extra);
        args.extend(dns);
        let (grpc, grpc_addr) = grpc_args(&self.extra);
        args.extend(grpc);
        args.extend(self.extra.iter().cloned());
        federation_key(&mut args, self.dev);
        let log_path = tmp.path().join("server.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let child = spawn_server(&args, &self.env, log);
        let server = Server {
            args,
            env: self.env.clone(),
            child: Mutex::new(Some(child)),
            http_addr,
            raft_addr,
            dns_addr,
            grpc_addr,
            url: format!(
                "{}://{http_addr}",
                if self.https_only { "https" } else { "http" }
            ),
            node: self.node.clone(),
            data_dir,
            log_path,
            _tmp: tmp,
        };
        if !self.wait {
        } else if self.wait_leader {
            server.wait_for_leader(Duration::from_secs(30));
        } else {
            server.wait_for_http(Duration::from_secs(30));
        }
        server
    }
}

/// A TCP connection to `addr` from the loopback address `from` (a client
/// IP of its own, for the per-IP caps); not from inside a runtime.
#[allow(dead_code)]
pub fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = asynch::connect_from(from, addr).await.into_std().unwrap();
        s.set_nonblocking(false).unwrap();
        s
    })
}

/// The `--encrypt` key every test server of a federation shares: WAN
/// federation is served only on an authenticated Raft transport (a dev
/// server aside), so a server naming a datacenter gets it unless it
/// brings its own key, its TLS files or `--insecure-raft`.
pub const FEDERATION_KEY: &str = "q0rYb3IpZzBYF8kGMfJ0ZV1tqRk3eE2vK7m8Xo1nQ5c=";

fn federation_key(args: &mut Vec<String>, dev: bool) {
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let federates = ["--datacenter", "--join-wan", "--primary-datacenter"]
        .iter()
        .any(|f| has(f));
    let own = ["--encrypt", "--tls-cert-file", "--insecure-raft"]
        .iter()
        .any(|f| has(f));
    if !dev && federates && !own {
        args.extend(["--encrypt".into(), FEDERATION_KEY.into()]);
    }
}

/// Starts `n` servers (nodes `s0`, `s1`...) that form a cluster by
/// themselves (`--bootstrap-expect n`, each joining the others), each with
/// `extra` arguments; returns once their HTTP ports answer, before a leader
/// is elected (`asynch::agreed_leader` waits for one).
pub fn cluster(n: usize, extra: &[&str]) -> Vec<Server> {
    let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
    let builders: Vec<ServerBuilder> = (0..n)
        .map(|i| {
            let mut b = Server::builder()
                .node(&format!("s{i}"))
                .http_port(ports[i].0)
                .raft_port(ports[i].1)
                .bootstrap_expect(n)
                .no_wait();
            for (j, (_, raft)) in ports.iter().enumerate() {
                if j != i {
                    b = b.join(format!("127.0.0.1:{raft}"));
                }
            }
            extra.iter().fold(b, |b, a| b.arg(a))
        })
        .collect();
    // All spawned first: none can elect a leader alone.
    let servers: Vec<Server> = builders.into_iter().map(ServerBuilder::spawn).collect();
    for s in &servers {
        s.wait_for_http(Duration::from_secs(30));
    }
    servers
}

/// Index of the server whose Raft address is `raft`.
pub fn by_raft(servers: &[Server], raft: &str) -> usize {
    servers
        .iter()
        .position(|s| s.raft_addr.to_string() == raft)
        .unwrap_or_else(|| panic!("leader {raft} is not one of ours"))
}

/// The index of the server the running ones agree leads (within 30 s).
pub fn agreed_leader(servers: &[Server]) -> usize {
    eventually(Duration::from_secs(30), "one agreed leader", || {
        let named: Vec<String> = servers
            .iter()
            .filter(|s| s.is_running())
            .map(|s| {
                s.get("/v1/status/leader")
                    .json()
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        (!named[0].is_empty() && named.iter().all(|n| *n == named[0]))
            .then(|| by_raft(servers, &named[0]))
    })
}

fn spawn_server(args: &[String], env: &[(String, String)], log: std::fs::File) -> Child {
    Command::new(bin())
        .args(args)
        .env("RUST_LOG", "info,openraft=warn,sled=warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start cairn")
}

/// A running `cairn server`, killed when dropped.
pub struct Server {
    /// How it was started, to start it again (`restart`).
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Mutex<Option<Child>>,
    pub http_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    /// Where its DNS answers (UDP and TCP).
    pub dns_addr: SocketAddr,
    /// The gRPC port (xDS, the dataplane's services).
    pub grpc_addr: SocketAddr,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub node: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub log_path: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Server {
    /// `cairn server --dev` on free ports, with a leader.
    pub fn dev() -> Server {
        Server::builder().dev().start()
    }

    /// `n` servers `s0`.. that formed a cluster (`--bootstrap-expect n`)
    /// and all know its leader.
    pub fn cluster(n: usize) -> Vec<Server> {
        let servers = cluster(n, &[]);
        for s in &servers {
            s.wait_for_leader(Duration::from_secs(30));
        }
        servers
    }

    /// A lone server (`--bootstrap-expect 1`) keeping its state in `dir`,
    /// on ports fixed now, so that a restart finds its data and answers at
    /// the same address.
    pub fn durable(node: &str, dir: impl AsRef<Path>) -> ServerBuilder {
        Server::builder()
            .node(node)
            .data_dir(dir)
            .http_port(free_port())
            .raft_port(free_port())
            .bootstrap_expect(1)
    }

    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            dev: false,
            node: None,
            data_dir: None,
            http_port: None,
            raft_port: None,
            datacenter: None,
            bootstrap_expect: None,
            join: Vec::new(),
            extra: Vec::new(),
            env: Vec::new(),
            wait_leader: true,
            https_only: false,
            wait: true,
        }
    }

    /// Its node name (`--node`; "" for a dev server left to its host name).
    pub fn name(&self) -> &str {
        self.node.as_deref().unwrap_or_default()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// A server that exited early will never answer: fail with its log
    /// rather than wait out the timeout.
    fn check_alive(&self) {
        let mut guard = self.child.lock().unwrap();
        if let Some(c) = guard.as_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            guard.take();
            drop(guard);
            panic!(
                "server on {} exited with {st}; log:\n{}",
                self.http_addr,
                self.log()
            );
        }
    }

    pub fn is_running(&self) -> bool {
        let mut guard = self.child.lock().unwrap();
        guard
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn wait_for_http(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if TcpStream::connect(self.http_addr).is_ok() {
                return;
            }
            self.check_alive();
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "server on {} did not open its HTTP port; log:\n{}",
            self.http_addr,
            self.log()
        );
    }

    /// Waits until `/v1/status/leader` names a leader.
    pub fn wait_for_leader(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(r) = try_request(self.http_addr, "GET", "/v1/status/leader", None)
                && r.status == 200
                && r.body.trim() != "\"\""
                && !r.body.trim().is_empty()
            {
                return;
            }
            self.check_alive();
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "server on {} found no leader in {timeout:?}; log:\n{}",
            self.http_addr,
            self.log()
        );
    }

    http_helpers!();

    /// Waits until this server's own node is in the catalog with its
    /// `serfHealth` and the leader has registered it as the `consul`
    /// service (as in Consul), so that what a test writes next is all that
    /// changes the catalog after (ACLs off, or allowing `agent:read`).
    pub fn settle(&self) {
        let node = self.get_json("/v1/agent/self")["Config"]["NodeName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        eventually(Duration::from_secs(30), "the server's own node", || {
            let checks = self.get_json(&format!("/v1/health/node/{}", enc(&node)));
            let consul = self.get_json("/v1/catalog/service/consul?stale");
            let serf = checks
                .as_array()?
                .iter()
                .any(|c| c["CheckID"] == "serfHealth" && c["Status"] == "passing");
            let registered = consul.as_array()?.iter().any(|c| c["Node"] == node);
            // The server's own agent has synced its node (meta, addresses).
            let synced = self.metric("cairn_agent_full_syncs_total") >= 1.0
                && self.get_json(&format!("/v1/catalog/node/{}", enc(&node)))["Node"]["Meta"]
                    .get("cairn-agent")
                    .is_some();
            (serf && registered && synced).then_some(())
        });
    }

    /// Waits until `n` blocking queries are parked on this server, so that
    /// a write that follows tests their wake-up (a query arriving after the
    /// write would answer at once and prove nothing).
    pub fn wait_parked(&self, n: u64) {
        eventually(Duration::from_secs(10), "parked blocking queries", || {
            (self.parked() >= n).then_some(())
        });
    }

    /// Blocking queries parked on this server now (its own agent may hold
    /// some: a test waits for `parked() + 1` after starting its own).
    pub fn parked(&self) -> u64 {
        self.metric("cairn_blocking_queries_parked") as u64
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// SIGTERM, then waits for a clean exit (SIGKILL after `timeout`).
    pub fn stop(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.lock().unwrap().take()?;
        terminate(child, timeout)
    }

    /// Waits for the process to exit by itself (`None` if it still runs
    /// after `timeout`).
    pub fn wait_exit(&self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(c) = self.child.lock().unwrap().as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Starts the process again (killed first if it runs) with the same
    /// arguments, so on the same data dir; its log continues the same file.
    /// Returns once the HTTP port answers.
    pub fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .expect("log file");
        *self.child.lock().unwrap() = Some(spawn_server(&self.args, &self.env, log));
        self.wait_for_http(Duration::from_secs(30));
    }

    /// Sends a signal (`STOP`, `CONT`...) to the process.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("running");
        Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
            .unwrap();
    }

    /// SIGKILL at once (a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// SIGTERM, then waits for a clean exit (SIGKILL after `timeout`).
pub fn terminate(mut child: Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait().ok()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One HTTP answer.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
    /// `X-Consul-Index` as a number.
    pub fn index(&self) -> u64 {
        self.header("x-consul-index")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no X-Consul-Index in {self:?}"))
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Percent-encodes a query value.
pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Resp {
    try_request(addr, method, path, body)
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

pub fn try_request(
    addr: SocketAddr, method: &str, path: &str, body: Option<&str>,
) -> std::io::Result<Resp> {
    try_request_bytes(addr, method, path, body.unwrap_or("").as_bytes())
}

/// A request with a body of any bytes (snapshots).
pub fn try_request_bytes(
    addr: SocketAddr, method: &str, path: &str, body: &[u8],
) -> std::io::Result<Resp> {
    try_request_with(addr, method, path, body, &[])
}

/// A request with extra headers (`X-Consul-Token`, `Authorization`).
pub fn request_with(
    addr: SocketAddr, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)],
) -> Resp {
    try_request_with(addr, method, path, body.unwrap_or("").as_bytes(), headers)
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

pub fn try_request_with(
    addr: SocketAddr, method: &str, path: &str, body: &[u8], headers: &[(&str, &str)],
) -> std::io::Result<Resp> {
    // Long enough for a blocking query's longest wait in tests.
    try_request_within(addr, method, path, body, headers, Duration::from_secs(120))
}

/// A request whose answer may take up to `timeout` (a large restore).
pub fn try_request_within(
    addr: SocketAddr, method: &str, path: &str, body: &[u8], headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<Resp> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(timeout))?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> std::io::Result<Resp> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut payload = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        payload = dechunk(&payload).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&payload).into_owned(),
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_txt = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_txt.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// Runs the `cairn` binary as a CLI with `CAIRN_HTTP_ADDR` set to `addr`.
pub fn cli(addr: &str, args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .env("CAIRN_HTTP_ADDR", addr)
        .env_remove("CONSUL_HTTP_ADDR")
        .stdin(Stdio::null())
        .output()
        .expect("run cairn")
}

/// Where a server's metrics are scraped in Prometheus text.
pub const METRICS: &str = "/v1/agent/metrics?format=prometheus";

/// The value of metric `name` in a Prometheus text exposition.
pub fn metric_in(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}

/// Polls `f` until it returns `Some`, or panics after `timeout`.
pub fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
