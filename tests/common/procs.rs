//! Async helpers for cluster and fault tests: several real `cairn`
//! processes on loopback, started, killed, frozen and restarted on their
//! data dirs, driven with an async HTTP client.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use super::asynch::*;
pub use super::free_port;

pub const BIN: &str = env!("CARGO_BIN_EXE_cairn");

/// One server process, killed when dropped.
pub struct Proc {
    pub name: String,
    pub http: String,
    pub raft: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// Removed when the process handle is dropped (dev servers).
    _tmp: Option<tempfile::TempDir>,
}

impl Proc {
    /// `cairn server --dev` on free ports.
    pub fn dev() -> Proc {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = Proc::new("dev", tmp.path(), vec!["--dev".into()]);
        p._tmp = Some(tmp);
        p.start();
        p
    }

    /// A cluster member; `extra` holds --bootstrap-expect/--join and the like.
    pub fn new(name: &str, dir: &Path, extra: Vec<String>) -> Proc {
        let http = format!("127.0.0.1:{}", free_port());
        let raft = format!("127.0.0.1:{}", free_port());
        Proc::with_addrs(name, dir, &http, &raft, extra)
    }

    pub fn with_addrs(name: &str, dir: &Path, http: &str, raft: &str, extra: Vec<String>) -> Proc {
        let data_dir = dir.join(name);
        let mut args: Vec<String> = vec![
            "server".into(),
            "--node".into(),
            name.into(),
            "--http-addr".into(),
            http.into(),
            "--raft-addr".into(),
            raft.into(),
        ];
        args.push("--data-dir".into());
        args.push(data_dir.to_string_lossy().into_owned());
        args.extend(extra);
        Proc {
            name: name.into(),
            http: http.into(),
            raft: raft.into(),
            log: dir.join(format!("{name}.log")),
            data_dir,
            args,
            child: None,
            _tmp: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(BIN)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn cairn");
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn signal(&self, sig: &str) {
        Command::new("kill")
            .args([format!("-{sig}"), self.pid().to_string()])
            .status()
            .unwrap();
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit; returns whether it exited 0.
    pub fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        false
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Endpoint for Proc {
    fn at(&self, path: &str) -> String {
        self.url(path)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `n` servers that form a cluster by themselves.
pub fn cluster(dir: &Path, n: usize, extra: &[&str]) -> Vec<Proc> {
    let addrs: Vec<(String, String)> = (0..n)
        .map(|_| {
            (
                format!("127.0.0.1:{}", free_port()),
                format!("127.0.0.1:{}", free_port()),
            )
        })
        .collect();
    let mut procs = Vec::new();
    for i in 0..n {
        let mut args = vec!["--bootstrap-expect".to_string(), n.to_string()];
        for (j, (_, raft)) in addrs.iter().enumerate() {
            if j != i {
                args.push("--join".into());
                args.push(raft.clone());
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = Proc::with_addrs(&format!("s{i}"), dir, &addrs[i].0, &addrs[i].1, args);
        p.start();
        procs.push(p);
    }
    procs
}

/// Index of the server whose Raft address is `raft`.
pub fn by_raft(procs: &[Proc], raft: &str) -> usize {
    procs
        .iter()
        .position(|p| p.raft == raft)
        .unwrap_or_else(|| panic!("leader {raft} is not one of ours"))
}
