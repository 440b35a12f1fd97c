//! `cairn watch` as real processes against a real server: each type runs
//! its handler (`/bin/sh -c 'cat >> FILE'`) with the view's JSON on stdin
//! once at start and again on every change, and only then.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, bin, eventually, request};
use serde_json::Value;

/// A running `cairn watch` whose handler appends each input to `out`;
/// killed when dropped.
struct Watch {
    child: Child,
    out: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Watch {
    fn start(s: &Server, args: &[&str]) -> Watch {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let mut all: Vec<String> = vec!["watch".into()];
        all.extend(args.iter().map(|a| a.to_string()));
        all.extend([
            "/bin/sh".into(),
            "-c".into(),
            format!("cat >> {}", out.display()),
        ]);
        let child = Command::new(bin())
            .args(&all)
            .env("CAIRN_HTTP_ADDR", &s.url)
            .env_remove("CONSUL_HTTP_ADDR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start cairn watch");
        Watch {
            child,
            out,
            _tmp: tmp,
        }
    }

    /// The handler's inputs so far, one JSON document per run.
    fn runs(&self) -> Vec<Value> {
        read_runs(&self.out)
    }

    /// Waits until the handler ran with an input `f` accepts (for views
    /// the server's own agent may change too: the catalog's nodes); that
    /// input.
    fn ran_with(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        eventually(Duration::from_secs(15), what, || {
            self.runs().into_iter().rev().find(|v| f(v))
        })
    }

    /// Waits until the handler ran `n` times; its inputs.
    fn ran(&self, n: usize) -> Vec<Value> {
        let runs = eventually(
            Duration::from_secs(15),
            &format!("{n} handler runs"),
            || {
                let r = self.runs();
                (r.len() >= n).then_some(r)
            },
        );
        assert_eq!(runs.len(), n, "more runs than expected: {runs:?}");
        runs
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_runs(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn put(addr: SocketAddr, path: &str, body: &str) {
    let r = request(addr, "PUT", path, Some(body));
    assert_eq!(r.status, 200, "PUT {path}: {}", r.body);
}

/// A write the watch must not react to, then one it must: once the second
/// has run the handler, the first would have too.
fn only_changes_count(w: &Watch, runs: usize, unrelated: impl FnOnce(), related: impl FnOnce()) {
    unrelated();
    related();
    w.ran(runs);
}

#[test]
fn key_and_keyprefix_watches_run_on_each_change() {
    let s = Server::dev();
    let key = Watch::start(&s, &["-type", "key", "-key", "app/cfg"]);
    let prefix = Watch::start(&s, &["-type", "keyprefix", "-prefix", "app/"]);
    // Once at start: the key is missing (null), the prefix empty.
    assert_eq!(key.ran(1)[0], Value::Null);
    assert_eq!(prefix.ran(1)[0], serde_json::json!([]));

    put(s.http_addr, "/v1/kv/app/cfg", "v1");
    let runs = key.ran(2);
    assert_eq!(runs[1]["Key"], "app/cfg");
    assert_eq!(runs[1]["Value"], "djE=");
    let runs = prefix.ran(2);
    assert_eq!(runs[1].as_array().unwrap().len(), 1);

    // Another key outside the prefix changes neither; the next value of
    // the key both.
    only_changes_count(
        &key,
        3,
        || put(s.http_addr, "/v1/kv/other", "x"),
        || put(s.http_addr, "/v1/kv/app/cfg", "v2"),
    );
    assert_eq!(key.runs()[2]["Value"], "djI=");
    prefix.ran(3);
    // A second key under the prefix: the prefix watch only.
    put(s.http_addr, "/v1/kv/app/b", "x");
    assert_eq!(prefix.ran(4)[3].as_array().unwrap().len(), 2);
    assert_eq!(key.runs().len(), 3);
}

#[test]
fn catalog_and_health_watches_run_on_each_change() {
    let s = Server::dev();
    let services = Watch::start(&s, &["-type", "services"]);
    let nodes = Watch::start(&s, &["-type", "nodes"]);
    let service = Watch::start(&s, &["-type", "service", "-service", "web", "-passingonly"]);
    let critical = Watch::start(&s, &["-type", "checks", "-state", "critical"]);
    let web_checks = Watch::start(&s, &["-type", "checks", "-service", "web"]);
    // Once at start each (the catalog may change meanwhile: at least once).
    for w in [&services, &nodes, &critical] {
        eventually(Duration::from_secs(15), "a first run", || {
            (!w.runs().is_empty()).then_some(())
        });
    }
    assert_eq!(service.ran(1)[0], serde_json::json!([]));
    assert_eq!(web_checks.ran(1)[0], serde_json::json!([]));

    // A web instance on a new node, passing.
    put(
        s.http_addr,
        "/v1/catalog/register",
        r#"{"Node":"n1","Address":"10.0.0.1","Service":{"Service":"web","ID":"web-1","Port":80},
            "Check":{"CheckID":"web-alive","Name":"alive","ServiceID":"web-1","Status":"passing"}}"#,
    );
    services.ran_with("web in the services", |v| v.get("web").is_some());
    nodes.ran_with("n1 among the nodes", |v| {
        v.as_array().unwrap().iter().any(|n| n["Node"] == "n1")
    });
    let runs = service.ran(2);
    assert_eq!(runs[1][0]["Service"]["ID"], "web-1");
    let runs = web_checks.ran(2);
    assert_eq!(runs[1][0]["CheckID"], "web-alive");

    // It turns critical: gone from the passing-only view, in the critical one.
    put(
        s.http_addr,
        "/v1/catalog/register",
        r#"{"Node":"n1","Address":"10.0.0.1","Service":{"Service":"web","ID":"web-1","Port":80},
            "Check":{"CheckID":"web-alive","Name":"alive","ServiceID":"web-1","Status":"critical"}}"#,
    );
    assert_eq!(service.ran(3)[2], serde_json::json!([]));
    critical.ran_with("web-alive critical", |v| {
        v.as_array()
            .unwrap()
            .iter()
            .any(|c| c["CheckID"] == "web-alive")
    });
    assert_eq!(web_checks.ran(3)[2][0]["Status"], "critical");

    // A second web instance moves the catalog's index but leaves the
    // services view as it was: no run for it; a new service is one.
    let seen = services.runs().len();
    put(
        s.http_addr,
        "/v1/catalog/register",
        r#"{"Node":"n2","Address":"10.0.0.2","Service":{"Service":"web","ID":"web-2","Port":80}}"#,
    );
    put(
        s.http_addr,
        "/v1/catalog/register",
        r#"{"Node":"n2","Address":"10.0.0.2","Service":{"Service":"api","Port":81}}"#,
    );
    services.ran_with("api in the services", |v| v.get("api").is_some());
    assert_eq!(services.runs().len(), seen + 1, "{:?}", services.runs());
    // Never the same view twice in a row, whatever woke the watch.
    for w in [&services, &nodes, &service, &critical, &web_checks] {
        let runs = w.runs();
        assert!(runs.windows(2).all(|p| p[0] != p[1]), "{runs:?}");
    }
}

#[test]
fn event_watch_hands_on_the_new_events() {
    let s = Server::dev();
    // The server's agent follows the events before any is watched.
    eventually(
        Duration::from_secs(30),
        "the agent following events",
        || {
            put(s.http_addr, "/v1/event/fire/probe", "");
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                let l = s.get_json("/v1/event/list?name=probe");
                if !l.as_array().unwrap().is_empty() {
                    return Some(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            None
        },
    );
    let w = Watch::start(&s, &["-type", "event", "-name", "deploy"]);
    assert_eq!(w.ran(1)[0], serde_json::json!([]));
    put(s.http_addr, "/v1/event/fire/deploy", "one");
    let runs = w.ran(2);
    assert_eq!(runs[1].as_array().unwrap().len(), 1);
    assert_eq!(runs[1][0]["Payload"], "b25l");
    // Another name: nothing; the next deploy: handed on alone.
    only_changes_count(
        &w,
        3,
        || put(s.http_addr, "/v1/event/fire/other", ""),
        || put(s.http_addr, "/v1/event/fire/deploy", "two"),
    );
    let runs = w.runs();
    assert_eq!(runs[2].as_array().unwrap().len(), 1, "{}", runs[2]);
    assert_eq!(runs[2][0]["Payload"], "dHdv");
}

#[test]
fn without_a_handler_it_prints_once_and_exits() {
    let s = Server::dev();
    put(s.http_addr, "/v1/kv/k", "v");
    let out = common::cli(&s.url, &["watch", "-type", "key", "-key", "k"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["Value"], "dg==");
    // A view it needs a name for, without one: Consul's words.
    let out = common::cli(&s.url, &["watch", "-type", "service"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Must specify a single service to watch"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `agent_service` (blocking on the content hash: another service's change
/// does not run it), `connect_roots` and `connect_leaf`, Consul's types.
#[test]
fn agent_service_and_connect_watches() {
    let s = Server::dev();
    let register = |id: &str, port: u16| {
        let body = format!(r#"{{"ID": "{id}", "Name": "web", "Port": {port}}}"#);
        put(s.http_addr, "/v1/agent/service/register", &body);
    };
    register("web1", 80);
    let svc = Watch::start(&s, &["-type", "agent_service", "-service-id", "web1"]);
    assert_eq!(svc.ran(1)[0]["Port"], 80);
    only_changes_count(&svc, 2, || register("web2", 90), || register("web1", 81));
    assert_eq!(svc.runs()[1]["Port"], 81);
    assert_ne!(svc.runs()[0]["ContentHash"], svc.runs()[1]["ContentHash"]);

    let print = |args: &[&str]| {
        let out = common::cli(&s.url, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let roots = print(&["watch", "-type", "connect_roots"]);
    let root = roots["Roots"][0]["RootCert"].as_str().unwrap();
    assert!(root.contains("BEGIN CERTIFICATE"), "{roots}");
    let leaf = print(&["watch", "-type", "connect_leaf", "-service", "web"]);
    assert_eq!(leaf["Service"], "web", "{leaf}");
    assert!(
        leaf["CertPEM"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    let out = common::cli(&s.url, &["watch", "-type", "connect_leaf"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Must specify a single service to watch"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
