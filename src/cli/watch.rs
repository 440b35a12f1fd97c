//! `cairn watch -type T [flags] [HANDLER...]`, as `consul watch`: runs a
//! blocking query of the view `-type` names and, once at start and on
//! every change after, runs the handler with the view's JSON on its stdin
//! (`CONSUL_INDEX` in its environment). Without a handler the JSON is
//! printed once and the command exits, as Consul's does. A handler given
//! as one argument runs through `sh -c` (Consul's `-shell`); several
//! arguments are run as given.
//!
//! A change is Consul's: the index moved and the answer differs from the
//! last one handled. An `event` watch hands on only the events after the
//! last one handled (the first run: all the agent has). `agent_service`
//! blocks on the service's content hash (the agent's endpoint has no
//! index), as Consul's watch does.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::Value;

use super::{CliError, Client, enc};
use crate::structs::event::id_index;

/// How long one blocking read waits on the server.
const WAIT: &str = "5m";
/// The client's limit on it: the wait, the server's jitter, some slack.
const TIMEOUT: Duration = Duration::from_secs(5 * 60 + 30);

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Key,
    Keyprefix,
    Services,
    Nodes,
    Service,
    Checks,
    Event,
    /// The CA's roots, as the agent serves them.
    #[value(name = "connect_roots")]
    ConnectRoots,
    /// `-service`'s leaf certificate from the agent.
    #[value(name = "connect_leaf")]
    ConnectLeaf,
    /// `-service-id`'s registration on the agent.
    #[value(name = "agent_service")]
    AgentService,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// What to watch.
    #[arg(long = "type")]
    kind: Kind,
    /// `key`: the key.
    #[arg(long)]
    key: Option<String>,
    /// `keyprefix`: the prefix.
    #[arg(long)]
    prefix: Option<String>,
    /// `service`, `checks`, `connect_leaf`: the service.
    #[arg(long)]
    service: Option<String>,
    /// `agent_service`: the service instance's ID.
    #[arg(long)]
    service_id: Option<String>,
    /// `service`: only instances with these tags (repeatable).
    #[arg(long)]
    tag: Vec<String>,
    /// `service`: only instances whose checks all pass (`-passingonly`
    /// or `-passingonly=BOOL`, as Go's flags: never the next argument).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    passingonly: Option<bool>,
    /// `checks`: only checks in this state (any, passing, warning, critical).
    #[arg(long)]
    state: Option<String>,
    /// `event`: only events of this name.
    #[arg(long)]
    name: Option<String>,
    /// Read from any server, not only the leader.
    #[arg(long)]
    stale: bool,
    /// The handler, run on every change with the JSON on stdin.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    handler: Vec<String>,
}

fn need(v: &Option<String>, what: &str) -> Result<String, CliError> {
    v.clone()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| CliError(format!("Must specify a single {what} to watch")))
}

/// The path of the view's read (without index and wait).
fn path_of(a: &WatchArgs) -> Result<String, CliError> {
    Ok(match a.kind {
        Kind::Key => format!("/v1/kv/{}", key_path(&need(&a.key, "key")?)),
        Kind::Keyprefix => format!("/v1/kv/{}?recurse", key_path(&need(&a.prefix, "prefix")?)),
        Kind::Services => "/v1/catalog/services".into(),
        Kind::Nodes => "/v1/catalog/nodes".into(),
        Kind::Service => {
            let mut p = format!("/v1/health/service/{}", enc(&need(&a.service, "service")?));
            let mut q: Vec<String> = a.tag.iter().map(|t| format!("tag={}", enc(t))).collect();
            if a.passingonly == Some(true) {
                q.push("passing".into());
            }
            if !q.is_empty() {
                p = format!("{p}?{}", q.join("&"));
            }
            p
        }
        Kind::Checks => match (&a.service, &a.state) {
            (Some(_), Some(_)) => {
                return Err(CliError("Cannot specify service and state".into()));
            }
            (Some(s), None) => format!("/v1/health/checks/{}", enc(s)),
            (None, Some(s)) => format!("/v1/health/state/{}", enc(s)),
            (None, None) => "/v1/health/state/any".into(),
        },
        Kind::Event => match &a.name {
            Some(n) if !n.is_empty() => format!("/v1/event/list?name={}", enc(n)),
            _ => "/v1/event/list".into(),
        },
        Kind::ConnectRoots => "/v1/agent/connect/ca/roots".into(),
        Kind::ConnectLeaf => format!(
            "/v1/agent/connect/ca/leaf/{}",
            enc(&need(&a.service, "service")?)
        ),
        Kind::AgentService => format!(
            "/v1/agent/service/{}",
            enc(&need(&a.service_id, "service_id")?)
        ),
    })
}

fn key_path(key: &str) -> String {
    key.split('/').map(enc).collect::<Vec<_>>().join("/")
}

/// The view's JSON from an answer: a missing key is null, a missing
/// prefix an empty list; any other failure is the server's error.
fn view_of(kind: Kind, status: u16, body: &str) -> Result<Value, CliError> {
    if status == 404 {
        match kind {
            Kind::Key => return Ok(Value::Null),
            Kind::Keyprefix => return Ok(Value::Array(Vec::new())),
            _ => {}
        }
    }
    if !(200..300).contains(&status) {
        return Err(super::unexpected(status, body.as_bytes()));
    }
    let v: Value = serde_json::from_str(body)
        .map_err(|e| CliError(format!("Invalid JSON from the server: {e}")))?;
    Ok(match kind {
        // `/v1/kv/K` answers a list of one.
        Kind::Key => v.as_array().and_then(|l| l.first()).cloned().unwrap_or(v),
        _ => v,
    })
}

/// The events after the one whose ID stands for `index` (all of them if
/// it is not among them any more).
fn events_after(list: &Value, index: u64) -> Value {
    let all = list.as_array().cloned().unwrap_or_default();
    let from = all
        .iter()
        .position(|e| e["ID"].as_str().map(id_index) == Some(index))
        .map_or(0, |i| i + 1);
    Value::Array(all[from..].to_vec())
}

/// Runs the watch; the exit code (a handler's failure is reported and the
/// watch goes on, as Consul's).
pub fn run(c: &Client, a: WatchArgs) -> Result<i32, CliError> {
    let path = path_of(&a)?;
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut index = 0u64;
    let mut last: Option<Value> = None;
    let mut failures = 0u32;
    let by_hash = a.kind == Kind::AgentService;
    loop {
        let mut query = Vec::new();
        let hash = last.as_ref().and_then(|v| v["ContentHash"].as_str());
        match (by_hash, hash) {
            (true, Some(h)) => query.push(format!("hash={}&wait={WAIT}", enc(h))),
            (false, _) if index > 0 => query.push(format!("index={index}&wait={WAIT}")),
            _ => {}
        }
        if a.stale {
            query.push("stale".to_string());
        }
        let url = match query.is_empty() {
            true => path.clone(),
            false => format!("{path}{sep}{}", query.join("&")),
        };
        let answer = c
            .get_blocking(&url, TIMEOUT)
            .and_then(|(status, body, at)| Ok((view_of(a.kind, status, &body)?, at)));
        let (view, at) = match answer {
            Ok(x) => x,
            // Without a handler there is no watch to keep: the error is it.
            Err(e) if a.handler.is_empty() => return Err(e),
            Err(e) => {
                failures += 1;
                eprintln!("watch: {}: retrying", e.0);
                std::thread::sleep(Duration::from_secs(1 << failures.min(5)));
                continue;
            }
        };
        failures = 0;
        let before = index;
        // Event indexes are hashes of IDs, not ordered: only equality says
        // nothing happened. Others going back mean a reset: start over.
        index = if a.kind != Kind::Event && at < before {
            0
        } else {
            at
        };
        if !by_hash && last.is_some() && at == before {
            continue;
        }
        if last.as_ref() == Some(&view) {
            continue;
        }
        let out = match (a.kind, &last) {
            (Kind::Event, Some(_)) => events_after(&view, before),
            _ => view.clone(),
        };
        last = Some(view);
        if a.handler.is_empty() {
            println!("{}", serde_json::to_string_pretty(&out)?);
            return Ok(0);
        }
        handle(&a.handler, &out, at);
    }
}

/// Runs the handler with `data` on stdin and waits for it.
fn handle(handler: &[String], data: &Value, index: u64) {
    let mut cmd = match handler {
        [one] => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(one);
            c
        }
        [program, args @ ..] => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
        [] => return,
    };
    cmd.env("CONSUL_INDEX", index.to_string())
        .stdin(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("watch: cannot run the handler {handler:?}: {e}");
            return;
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        let mut json = serde_json::to_vec(data).unwrap_or_default();
        json.push(b'\n');
        // A handler that does not read its input is no failure.
        let _ = stdin.write_all(&json);
    }
    match child.wait() {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!("watch: handler {handler:?} exited with {s}"),
        Err(e) => eprintln!("watch: handler {handler:?}: {e}"),
    }
}
