//! `cairn lock [-n N] PREFIX COMMAND...`, as `consul lock`: runs the command
//! (through `sh -c`) while holding the lock `PREFIX/.lock`, or with `-n N`
//! one of N slots of a semaphore under PREFIX; releases on exit and exits
//! with the command's code.
//!
//! The lock is held by a session with a TTL, renewed while the command runs.
//! If the lock is lost (session invalidated), the command is killed, as
//! Consul's `-monitor-retry 0`; SIGINT or SIGTERM kill it too, and the lock
//! is released before `cairn lock` exits.
//!
//! Semaphore, as Consul's `api.Semaphore`: each contender holds its own key
//! `PREFIX/<session>` with its session; `PREFIX/.lock` holds
//! `{"Limit": N, "Holders": {session: true}}`, updated with cas. Holders
//! whose contender key lost its session are pruned by whoever writes next.

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use super::{CliError, CliResult, Client};

/// Consul's `consul lock` session TTL.
const SESSION_TTL: &str = "15s";
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How long one wait for a change of the lock lasts before trying again
/// (a key held off by lock-delay changes nothing when the delay ends).
const WAIT: &str = "2s";

#[derive(Args, Debug)]
pub struct LockArgs {
    /// Slots of a semaphore (1: a plain lock).
    #[arg(short = 'n', default_value_t = 1)]
    limit: usize,
    /// The session's name.
    #[arg(long)]
    name: Option<String>,
    /// KV prefix of the lock.
    prefix: String,
    /// The command to run while holding it (run by `sh -c`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn key_path(key: &str) -> String {
    key.split('/').map(super::enc).collect::<Vec<_>>().join("/")
}

/// Runs the command under the lock; returns its exit code.
pub fn run(c: &Client, a: LockArgs) -> Result<i32, CliError> {
    if a.limit == 0 {
        return Err(CliError("-n must be at least 1".into()));
    }
    let prefix = a.prefix.trim_matches('/').to_string();
    let script = a.command.join(" ");
    let name = a
        .name
        .unwrap_or_else(|| format!("Consul lock for '{script}' at '{prefix}'"));
    let body = json!({"Name": name, "TTL": SESSION_TTL, "Behavior": "release"});
    let r = c.expect_ok(Method::PUT, "/v1/session/create", Some(body.to_string()))?;
    let session = r.json()?["ID"]
        .as_str()
        .ok_or_else(|| CliError("no session ID in the answer".into()))?
        .to_string();
    let lock = Lock {
        c,
        prefix,
        session,
        limit: a.limit,
    };
    let result = lock.hold_and_run(&script);
    lock.release();
    result
}

/// Contender key → its session, and the `.lock` entry (cas index, value).
type Semaphore = (BTreeMap<String, String>, Option<(u64, Value)>);

struct Lock<'a> {
    c: &'a Client,
    prefix: String,
    session: String,
    limit: usize,
}

impl Lock<'_> {
    fn lock_key(&self) -> String {
        format!("{}/.lock", self.prefix)
    }

    fn hold_and_run(&self, script: &str) -> Result<i32, CliError> {
        if self.limit == 1 {
            self.acquire_lock()?;
        } else {
            self.acquire_slot()?;
        }
        // SIGINT/SIGTERM stop the command and release the lock (else the
        // default action would leave it held until the session's TTL).
        let (mut term, mut int) = self.c.rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            Ok::<_, std::io::Error>((
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
            ))
        })?;
        let mut child: Child = Command::new("sh").arg("-c").arg(script).spawn()?;
        let mut renewed = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status.code().unwrap_or(1));
            }
            let signalled = self.c.rt.block_on(async {
                let got = async {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                };
                tokio::time::timeout(Duration::from_millis(50), got)
                    .await
                    .is_ok()
            });
            if signalled {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CliError(
                    "Shutdown triggered by a signal: lock released".into(),
                ));
            }
            if renewed.elapsed() >= RENEW_EVERY {
                renewed = Instant::now();
                if !self.renew() || !self.still_held()? {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(CliError("Lock lost: the command was stopped".into()));
                }
            }
        }
    }

    fn renew(&self) -> bool {
        let path = format!("/v1/session/renew/{}", self.session);
        matches!(self.c.send(Method::PUT, &path, None), Ok(r) if r.status == 200)
    }

    /// Blocks until `PREFIX/.lock` is ours.
    fn acquire_lock(&self) -> CliResult {
        let key = key_path(&self.lock_key());
        let mut index = 0u64;
        loop {
            let path = format!("/v1/kv/{key}?acquire={}", self.session);
            let r = self.c.expect_ok(Method::PUT, &path, Some(String::new()))?;
            if r.body.trim() == "true" {
                return Ok(());
            }
            index = self.wait_change(&format!("/v1/kv/{key}"), index)?;
            self.renew();
        }
    }

    /// Waits for the index of a read to move past `index` (or `WAIT`).
    fn wait_change(&self, path: &str, index: u64) -> Result<u64, CliError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = format!("{path}{sep}index={index}&wait={WAIT}");
        let r = self.c.send_with_index(Method::GET, &url)?;
        Ok(r)
    }

    /// The contender entries and the `.lock` entry under the prefix.
    fn read_semaphore(&self) -> Result<Semaphore, CliError> {
        let path = format!("/v1/kv/{}/?recurse", key_path(&self.prefix));
        let r = self.c.send(Method::GET, &path, None)?;
        let mut contenders = BTreeMap::new();
        let mut lock = None;
        if r.status == 404 {
            return Ok((contenders, lock));
        }
        let lock_key = self.lock_key();
        for e in r.json()?.as_array().into_iter().flatten() {
            let key = e["Key"].as_str().unwrap_or_default();
            if key == lock_key {
                let raw = e["Value"].as_str().unwrap_or_default();
                let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, raw)
                    .unwrap_or_default();
                let v: Value = serde_json::from_slice(&bytes).unwrap_or(json!({}));
                lock = Some((e["ModifyIndex"].as_u64().unwrap_or(0), v));
            } else if let Some(s) = e["Session"].as_str() {
                contenders.insert(key.to_string(), s.to_string());
            }
        }
        Ok((contenders, lock))
    }

    /// Holders still alive: those whose contender key keeps their session.
    fn live_holders(&self, lock: &Value, contenders: &BTreeMap<String, String>) -> Vec<String> {
        lock["Holders"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(id, _)| id.clone())
            .filter(|id| contenders.values().any(|s| s == id))
            .collect()
    }

    /// Blocks until one of the semaphore's slots is ours.
    fn acquire_slot(&self) -> CliResult {
        let mine = key_path(&format!("{}/{}", self.prefix, self.session));
        let path = format!("/v1/kv/{mine}?acquire={}", self.session);
        let r = self.c.expect_ok(Method::PUT, &path, Some(String::new()))?;
        if r.body.trim() != "true" {
            return Err(CliError("Could not register as a contender".into()));
        }
        let mut index = 0u64;
        loop {
            let (contenders, lock) = self.read_semaphore()?;
            let (cas, value) = lock.unwrap_or((0, json!({})));
            if let Some(limit) = value["Limit"].as_u64()
                && limit as usize != self.limit
            {
                return Err(CliError(format!(
                    "Semaphore limit conflict (lock: {limit}, local: {})",
                    self.limit
                )));
            }
            let mut holders = self.live_holders(&value, &contenders);
            if holders.contains(&self.session) {
                return Ok(());
            }
            if holders.len() < self.limit {
                holders.push(self.session.clone());
                if self.write_holders(cas, &holders)? {
                    return Ok(());
                }
                continue;
            }
            index = self.wait_change(
                &format!("/v1/kv/{}/?recurse", key_path(&self.prefix)),
                index,
            )?;
            self.renew();
        }
    }

    fn write_holders(&self, cas: u64, holders: &[String]) -> Result<bool, CliError> {
        let body = json!({
            "Limit": self.limit,
            "Holders": holders.iter().map(|h| (h.clone(), json!(true))).collect::<serde_json::Map<_, _>>(),
        });
        let path = format!("/v1/kv/{}?cas={cas}", key_path(&self.lock_key()));
        let r = self
            .c
            .expect_ok(Method::PUT, &path, Some(body.to_string()))?;
        Ok(r.body.trim() == "true")
    }

    fn still_held(&self) -> Result<bool, CliError> {
        if self.limit == 1 {
            let path = format!("/v1/kv/{}", key_path(&self.lock_key()));
            let r = self.c.send(Method::GET, &path, None)?;
            return Ok(r.status == 200 && r.json()?[0]["Session"] == self.session.as_str());
        }
        let (contenders, lock) = self.read_semaphore()?;
        let value = lock.map(|l| l.1).unwrap_or(json!({}));
        Ok(self
            .live_holders(&value, &contenders)
            .contains(&self.session))
    }

    /// Gives the lock or slot back and destroys the session (best effort:
    /// the session's TTL cleans up whatever this misses).
    fn release(&self) {
        if self.limit == 1 {
            let path = format!(
                "/v1/kv/{}?release={}",
                key_path(&self.lock_key()),
                self.session
            );
            let _ = self.c.send(Method::PUT, &path, Some(String::new()));
        } else {
            for _ in 0..10 {
                let Ok((contenders, lock)) = self.read_semaphore() else {
                    break;
                };
                let Some((cas, value)) = lock else { break };
                let holders: Vec<String> = self
                    .live_holders(&value, &contenders)
                    .into_iter()
                    .filter(|h| *h != self.session)
                    .collect();
                if self.write_holders(cas, &holders).unwrap_or(true) {
                    break;
                }
            }
            let mine = key_path(&format!("{}/{}", self.prefix, self.session));
            let _ = self.c.send(Method::DELETE, &format!("/v1/kv/{mine}"), None);
        }
        let path = format!("/v1/session/destroy/{}", self.session);
        let _ = self.c.send(Method::PUT, &path, None);
    }
}
