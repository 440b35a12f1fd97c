//! Consul's agent configuration files (`--config-file`, `--config-dir`)
//! starting real servers and agents: a team's `server.hcl`, flags over the
//! file, unused keys warned once, wrong types refused naming the key and
//! the file, `cairn validate`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::acl::{ROOT, with};
use common::{bin, eventually, free_dns_port, free_port, request, terminate};

/// A cairn process with its stderr in a file.
struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn start(dir: &Path, args: &[&str]) -> Proc {
        let log = dir.join(format!("cairn-{}.log", free_port()));
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        Proc {
            child: Some(child),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status, waiting at most 20 s.
    fn exit(&mut self) -> std::process::ExitStatus {
        let c = self.child.as_mut().unwrap();
        for _ in 0..200 {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("still running: {}", self.log());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            terminate(c, Duration::from_secs(10));
        }
    }
}

/// Waits until the server at `addr` knows its leader.
fn wait_leader(p: &Proc, addr: std::net::SocketAddr) {
    eventually(Duration::from_secs(30), "a leader", || {
        assert!(!p.log().contains("Error:"), "{}", p.log());
        let r = common::try_request(addr, "GET", "/v1/status/leader", None).ok()?;
        (r.status == 200 && r.body.len() > 4).then_some(())
    });
}

/// Consul's documented server configuration, on free ports, with an ACL
/// block and keys cairn does not use.
fn server_hcl(dir: &Path, http: u16, raft: u16) -> PathBuf {
    let path = dir.join("server.hcl");
    let text = format!(
        r#"# A team's existing Consul server configuration.
datacenter = "east"
data_dir = "{data}"
node_name = "cfg-server"
server = true
bootstrap_expect = 1
bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
ui_config {{
  enabled = true
}}
addresses {{
  http = "127.0.0.1"
}}
ports {{
  http = {http}
  server = {raft}
  grpc = {grpc}
  dns = {dns}
}}
acl {{
  enabled = true
  default_policy = "deny"
  enable_token_persistence = true
  tokens {{
    initial_management = "{ROOT}"
    agent = "{ROOT}"
  }}
}}
performance {{
  raft_multiplier = 1
}}
"#,
        data = dir.join("data").display(),
        grpc = free_port(),
        dns = free_dns_port(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_teams_server_hcl_starts_a_cairn_server() {
    let dir = tempfile::tempdir().unwrap();
    let (http, raft) = (free_port(), free_port());
    let file = server_hcl(dir.path(), http, raft);
    let p = Proc::start(
        dir.path(),
        &["server", "-config-file", file.to_str().unwrap()],
    );
    let addr = format!("127.0.0.1:{http}").parse().unwrap();
    wait_leader(&p, addr);
    // The file's ACLs: deny by default, its management token works.
    eventually(Duration::from_secs(10), "the management token", || {
        (with(addr, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    assert_eq!(request(addr, "GET", "/v1/agent/self", None).status, 403);
    let me = with(addr, "GET", "/v1/agent/self", None, ROOT).json();
    assert_eq!(me["Config"]["Datacenter"], "east", "{me}");
    assert_eq!(me["Config"]["NodeName"], "cfg-server");
    let peers = with(addr, "GET", "/v1/operator/raft/configuration", None, ROOT).json();
    assert_eq!(
        peers["Servers"][0]["Address"],
        format!("127.0.0.1:{raft}"),
        "{peers}"
    );
    // One line per key cairn does not use, nested ones named by path.
    let log = p.log();
    for key in ["performance", "acl.enable_token_persistence"] {
        let n = log
            .lines()
            .filter(|l| l.contains("not used by cairn") && l.contains(&format!("key={key} ")))
            .count();
        assert_eq!(n, 1, "{key}: {log}");
    }
    // `ui_config { enabled = true }` is used: the UI is served.
    assert!(!log.contains("key=ui_config "), "{log}");
    assert_eq!(request(addr, "GET", "/ui/", None).status, 200);
}

#[test]
fn flags_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (http, raft) = (free_port(), free_port());
    let file = server_hcl(dir.path(), free_port(), raft);
    let p = Proc::start(
        dir.path(),
        &[
            "server",
            "--config-file",
            file.to_str().unwrap(),
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--datacenter",
            "west",
            "--node",
            "from-flag",
            "--acl-default-policy",
            "allow",
        ],
    );
    let addr = format!("127.0.0.1:{http}").parse().unwrap();
    wait_leader(&p, addr);
    eventually(Duration::from_secs(10), "ACL init", || {
        (with(addr, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    // default_policy from the flag: allow, so anonymous reads the agent.
    let me = request(addr, "GET", "/v1/agent/self", None);
    assert_eq!(me.status, 200, "{}", me.body);
    let me = me.json();
    assert_eq!(me["Config"]["Datacenter"], "west");
    assert_eq!(me["Config"]["NodeName"], "from-flag");
}

#[test]
fn a_wrong_type_is_refused_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.hcl");
    std::fs::write(
        &bad,
        format!(
            "data_dir = \"{}\"\nbootstrap_expect = \"three\"\n",
            dir.path().join("d").display()
        ),
    )
    .unwrap();
    let mut p = Proc::start(
        dir.path(),
        &["server", "--config-file", bad.to_str().unwrap()],
    );
    assert!(!p.exit().success());
    let log = p.log();
    assert!(
        log.contains("bad.hcl") && log.contains("bootstrap_expect"),
        "{log}"
    );
    assert!(!dir.path().join("d").exists(), "nothing started");
    // `cairn validate` reads with the same loader.
    let out = Command::new(bin())
        .args(["validate", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("bootstrap_expect"),
        "{err}"
    );
    let good = tempfile::tempdir().unwrap();
    std::fs::write(
        good.path().join("a.hcl"),
        "datacenter = \"x\"\nservice {\n name = \"web\"\n port = 80\n}\n",
    )
    .unwrap();
    std::fs::write(good.path().join("b.json"), r#"{"telemetry": {}}"#).unwrap();
    let out = Command::new(bin())
        .args(["validate", good.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("Configuration is valid!") && text.contains("telemetry"),
        "{text}"
    );
    // An invalid service definition fails validation too.
    std::fs::write(good.path().join("c.json"), r#"{"service": {"port": 1}}"#).unwrap();
    let out = Command::new(bin())
        .args(["validate", good.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn an_agent_from_a_config_dir_joins_and_registers_its_services() {
    let s = common::Server::dev();
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    std::fs::write(
        dir.path().join("agent.hcl"),
        format!(
            "node_name = \"cfg-agent\"\ndata_dir = \"{}\"\nserver = false\n\
             retry_join = [\"{}\"]\nports {{\n  http = {http}\n  dns = -1\n}}\n\
             telemetry {{\n  disable_hostname = true\n}}\n",
            dir.path().join("data").display(),
            s.http_addr
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("web.json"),
        r#"{"service": {"name": "cfg-web", "port": 8080}, "telemetry": {"x": 1}}"#,
    )
    .unwrap();
    let p = Proc::start(
        dir.path(),
        &["agent", "--config-dir", dir.path().to_str().unwrap()],
    );
    eventually(Duration::from_secs(30), "cfg-web in the catalog", || {
        let r = request(s.http_addr, "GET", "/v1/catalog/service/cfg-web", None);
        let rows = r.json();
        (rows.as_array().is_some_and(|a| !a.is_empty())).then_some(rows)
    });
    let addr = format!("127.0.0.1:{http}").parse().unwrap();
    let me = request(addr, "GET", "/v1/agent/self", None).json();
    assert_eq!(me["Config"]["NodeName"], "cfg-agent");
    // Two files with the same unused key: warned once.
    let n = p
        .log()
        .lines()
        .filter(|l| l.contains("key=telemetry "))
        .count();
    assert_eq!(n, 1, "{}", p.log());
    // A server's file given to an agent is refused.
    std::fs::write(dir.path().join("z.hcl"), "server = true\n").unwrap();
    let mut bad = Proc::start(
        dir.path(),
        &["agent", "--config-dir", dir.path().to_str().unwrap()],
    );
    assert!(!bad.exit().success());
    assert!(bad.log().contains("server = true"), "{}", bad.log());
}

#[test]
fn an_agents_recovery_token_from_its_file_works_with_its_servers_gone() {
    let mut s = common::acl::deny_server();
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    std::fs::write(
        dir.path().join("agent.json"),
        serde_json::json!({
            "node_name": "rec-agent",
            "data_dir": dir.path().join("data"),
            "retry_join": [s.http_addr.to_string()],
            "ports": {"http": http, "dns": -1},
            "acl": {"tokens": {"agent": ROOT, "agent_recovery": "rec-from-file"}},
        })
        .to_string(),
    )
    .unwrap();
    let file = dir.path().join("agent.json");
    let _p = Proc::start(
        dir.path(),
        &["agent", "--config-file", file.to_str().unwrap()],
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    eventually(Duration::from_secs(30), "the agent's node", || {
        let r = with(s.http_addr, "GET", "/v1/catalog/node/rec-agent", None, ROOT);
        (!r.json().is_null()).then_some(())
    });
    s.kill();
    // No server to resolve a token: only the recovery token is taken.
    let r = with(addr, "PUT", "/v1/agent/reload", None, "some-other");
    assert_eq!(r.status, 500, "{}", r.body);
    let r = with(addr, "PUT", "/v1/agent/reload", None, "rec-from-file");
    assert_eq!(r.status, 200, "{}", r.body);
}
