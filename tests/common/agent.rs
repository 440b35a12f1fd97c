//! `cairn agent` processes for tests: started against servers on a free
//! port with a short `--sync-interval`, restartable on the same data dir
//! and port, killed when dropped.
//!
//! ```ignore
//! let s = Server::dev();
//! let mut a = Agent::builder("a1", &s.url).start();
//! a.put("/v1/agent/service/register", r#"{"Name": "web"}"#);
//! a.kill();
//! a.restart();
//! ```

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{bin, free_dns_port, free_port, terminate};

pub struct AgentBuilder {
    node: String,
    servers: Vec<String>,
    config_dir: Option<PathBuf>,
    sync_interval: String,
    extra: Vec<String>,
}

impl AgentBuilder {
    pub fn server(mut self, url: &str) -> Self {
        self.servers.push(url.to_string());
        self
    }
    pub fn config_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config_dir = Some(dir.into());
        self
    }
    pub fn sync_interval(mut self, d: &str) -> Self {
        self.sync_interval = d.to_string();
        self
    }
    /// Another command-line argument (`--dns-only-passing`, TLS flags...).
    pub fn arg(mut self, a: impl ToString) -> Self {
        self.extra.push(a.to_string());
        self
    }

    fn args(
        &self, data_dir: &std::path::Path, http_addr: SocketAddr, dns_addr: SocketAddr,
    ) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--node".into(),
            self.node.clone(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--http-addr".into(),
            http_addr.to_string(),
            "--sync-interval".into(),
            self.sync_interval.clone(),
            "--dns-addr".into(),
            dns_addr.to_string(),
        ];
        for s in &self.servers {
            args.extend(["--server".into(), s.clone()]);
        }
        if let Some(d) = &self.config_dir {
            args.extend(["--config-dir".into(), d.display().to_string()]);
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Starts the agent and waits for its HTTP port.
    pub fn start(self) -> Agent {
        let tmp = tempfile::tempdir().expect("temp dir");
        let http_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let dns_addr: SocketAddr = format!("127.0.0.1:{}", free_dns_port()).parse().unwrap();
        let args = self.args(&tmp.path().join("data"), http_addr, dns_addr);
        let mut a = Agent {
            child: None,
            args,
            http_addr,
            dns_addr,
            url: format!("http://{http_addr}"),
            node: self.node,
            log_path: tmp.path().join("agent.log"),
            _tmp: tmp,
        };
        a.spawn();
        a.wait_for_http();
        a
    }

    /// Starts the agent without waiting: for agents expected to refuse to
    /// start. Returns its exit status and log once it exits (or `None`).
    pub fn start_and_wait_exit(
        self, timeout: Duration,
    ) -> (Option<std::process::ExitStatus>, String) {
        let tmp = tempfile::tempdir().expect("temp dir");
        let http_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let out = Command::new(bin())
            .args(self.args(
                &tmp.path().join("data"),
                http_addr,
                format!("127.0.0.1:{}", free_dns_port()).parse().unwrap(),
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cairn agent");
        let mut child = out;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                let out = child.wait_with_output().expect("output");
                let log = String::from_utf8_lossy(&out.stderr).into_owned();
                return (Some(st), log);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        (None, String::new())
    }
}

/// A running `cairn agent`.
pub struct Agent {
    child: Option<Child>,
    args: Vec<String>,
    pub http_addr: SocketAddr,
    /// Where its DNS answers (UDP and TCP).
    pub dns_addr: SocketAddr,
    pub url: String,
    pub node: String,
    pub log_path: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Agent {
    /// An agent named `node` joined to the server at `server_url`, syncing
    /// every second.
    pub fn builder(node: &str, server_url: &str) -> AgentBuilder {
        AgentBuilder {
            node: node.to_string(),
            servers: vec![server_url.to_string()],
            config_dir: None,
            sync_interval: "1s".into(),
            extra: Vec::new(),
        }
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("log file");
        let child = Command::new(bin())
            .args(&self.args)
            .env("RUST_LOG", "info,cairn::agent=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start cairn agent");
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn wait_for_http(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if TcpStream::connect(self.http_addr).is_ok() {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("agent exited with {st}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "agent did not open {}; log:\n{}",
            self.http_addr,
            self.log()
        );
    }

    http_helpers!();

    /// SIGKILL (a crash: no leave).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        terminate(self.child.take()?, Duration::from_secs(20))
    }

    /// Starts it again on the same data dir and port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_for_http();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}
