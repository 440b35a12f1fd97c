//! Sessions and locks on a real dev server: contention, destroy, lock-delay,
//! TTL expiry, and invalidation by a critical check or a deregistered node.

mod common;

use std::time::{Duration, Instant};

use common::{Server, eventually};
use serde_json::{Value, json};

fn register(s: &Server, node: &str, checks: Value) {
    let body = json!({"Node": node, "Address": "10.0.0.9", "Checks": checks});
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
}

fn create(s: &Server, body: Value) -> String {
    let r = s.put("/v1/session/create", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["ID"].as_str().unwrap().to_string()
}

fn acquire(s: &Server, key: &str, session: &str) -> bool {
    let r = s.put(&format!("/v1/kv/{key}?acquire={session}"), "held");
    assert_eq!(r.status, 200, "{}", r.body);
    r.body.trim() == "true"
}

fn holder(s: &Server, key: &str) -> Value {
    let e = &s.get_json(&format!("/v1/kv/{key}"))[0];
    json!({"Session": e.get("Session"), "LockIndex": e["LockIndex"]})
}

fn exists(s: &Server, id: &str) -> bool {
    let list = s.get_json(&format!("/v1/session/info/{id}"));
    !list.as_array().unwrap().is_empty()
}

#[test]
fn one_holder_destroy_releases_and_lock_delay_holds_off_the_next() {
    let s = Server::builder().dev().node("srv").start();
    register(
        &s,
        "n1",
        json!([{"CheckID": "serfHealth", "Name": "Serf", "Status": "passing"}]),
    );
    let a = create(&s, json!({"Node": "n1", "Name": "a", "LockDelay": "3s"}));
    let b = create(&s, json!({"Node": "n1", "Name": "b"}));

    // Consul's shape, with serfHealth as the default check.
    let info = s.get(&format!("/v1/session/info/{a}"));
    let row = &info.json()[0];
    assert_eq!(row["ID"], a.as_str());
    assert_eq!(row["NodeChecks"], json!(["serfHealth"]));
    assert_eq!(row["LockDelay"], 3_000_000_000u64);
    assert_eq!(row["Behavior"], "release");
    assert!(row["CreateIndex"].as_u64().unwrap() > 0);
    assert_eq!(
        s.get_json("/v1/session/node/n1").as_array().unwrap().len(),
        2
    );
    assert_eq!(s.get_json("/v1/session/list").as_array().unwrap().len(), 2);

    assert!(acquire(&s, "leader", &a));
    assert!(!acquire(&s, "leader", &b), "the key is held by a");
    assert!(acquire(&s, "leader", &a), "the holder may acquire again");
    assert_eq!(holder(&s, "leader"), json!({"Session": a, "LockIndex": 1}));
    // Releasing needs the holder.
    assert_eq!(
        s.put(&format!("/v1/kv/leader?release={b}"), "").body,
        "false"
    );

    // A blocking read of a's info wakes when it is destroyed.
    let index = info.index();
    let (addr, id) = (s.http_addr, a.clone());
    let parked = s.parked();
    let waiter = std::thread::spawn(move || {
        common::request(
            addr,
            "GET",
            &format!("/v1/session/info/{id}?index={index}&wait=30s"),
            None,
        )
    });
    s.wait_parked(parked + 1);
    assert_eq!(s.put(&format!("/v1/session/destroy/{a}"), "").body, "true");
    let destroyed = Instant::now();
    let woke = waiter.join().unwrap();
    assert!(
        destroyed.elapsed() < Duration::from_secs(5),
        "the destroy did not wake the blocking read"
    );
    assert_eq!(woke.json(), json!([]));
    assert!(woke.index() > index);

    assert_eq!(
        holder(&s, "leader"),
        json!({"Session": null, "LockIndex": 1})
    );
    // Lock-delay: b cannot take the released key for a's 3 s.
    assert!(!acquire(&s, "leader", &b), "lock-delay must hold b off");
    eventually(
        Duration::from_secs(10),
        "b to acquire after the lock-delay",
        || acquire(&s, "leader", &b).then_some(()),
    );
    assert!(
        destroyed.elapsed() >= Duration::from_millis(2500),
        "acquired {:?} after the destroy, before the 3 s lock-delay",
        destroyed.elapsed()
    );
    assert_eq!(holder(&s, "leader"), json!({"Session": b, "LockIndex": 2}));
    // Unknown sessions: renew is 404, acquire is refused.
    assert_eq!(s.put("/v1/session/renew/nope", "").status, 404);
    assert_eq!(s.put("/v1/kv/other?acquire=nope", "").status, 400);
    // No ID (or node) at all: Consul's 400s, and b's session stays.
    for (r, want) in [
        (s.put("/v1/session/destroy/", ""), "Missing session"),
        (s.put("/v1/session/renew/", ""), "Missing session"),
        (s.get("/v1/session/info/"), "Missing session"),
        (s.get("/v1/session/node/"), "Missing node name"),
    ] {
        assert_eq!((r.status, r.body.as_str()), (400, want));
    }
    assert!(exists(&s, &b));
}

#[test]
fn ttl_expiry_destroys_the_session_and_releases_its_lock() {
    let s = Server::builder().dev().node("srv").start();
    let id = create(&s, json!({"TTL": "10s", "LockDelay": "0s"}));
    let created = Instant::now();
    assert_eq!(s.put("/v1/session/create", r#"{"TTL": "5s"}"#).status, 400);
    assert!(acquire(&s, "ttl-lock", &id));
    let r = s.put(&format!("/v1/session/renew/{id}"), "");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()[0]["TTL"], "10s");
    // Servers wait twice the TTL, as Consul's: still there past the TTL.
    std::thread::sleep(Duration::from_secs(11).saturating_sub(created.elapsed()));
    assert!(exists(&s, &id), "expired before twice its TTL");
    eventually(Duration::from_secs(30), "the session to expire", || {
        (!exists(&s, &id)).then_some(())
    });
    assert_eq!(holder(&s, "ttl-lock")["Session"], Value::Null);
    assert_eq!(s.put(&format!("/v1/session/renew/{id}"), "").status, 404);
}

#[test]
fn a_critical_check_and_a_deregistered_node_invalidate_sessions() {
    let s = Server::builder().dev().node("srv").start();
    register(
        &s,
        "n2",
        json!([
            {"CheckID": "serfHealth", "Name": "Serf", "Status": "passing"},
            {"CheckID": "db", "Name": "db", "Status": "passing"},
        ]),
    );
    let on_check = create(
        &s,
        json!({"Node": "n2", "Checks": ["db"], "LockDelay": "0s"}),
    );
    let plain = create(
        &s,
        json!({"Node": "n2", "NodeChecks": [], "Behavior": "delete"}),
    );
    assert!(acquire(&s, "a", &on_check));
    assert!(acquire(&s, "b", &plain));
    // A session cannot be bound to a critical or missing check.
    register(
        &s,
        "n2",
        json!([{"CheckID": "bad", "Name": "bad", "Status": "critical"}]),
    );
    assert_eq!(
        s.put("/v1/session/create", r#"{"Node": "n2", "Checks": ["bad"]}"#)
            .status,
        400
    );
    assert_eq!(
        s.put(
            "/v1/session/create",
            r#"{"Node": "n2", "Checks": ["nope"]}"#
        )
        .status,
        400
    );
    assert_eq!(
        s.put("/v1/session/create", r#"{"Node": "ghost"}"#).status,
        400
    );

    register(
        &s,
        "n2",
        json!([{"CheckID": "db", "Name": "db", "Status": "critical"}]),
    );
    assert!(!exists(&s, &on_check), "db went critical");
    assert!(exists(&s, &plain), "bound to no check");
    assert_eq!(holder(&s, "a")["Session"], Value::Null);

    let r = s.put("/v1/catalog/deregister", &json!({"Node": "n2"}).to_string());
    assert_eq!(r.status, 200);
    assert!(!exists(&s, &plain), "its node is gone");
    assert_eq!(
        s.get("/v1/kv/b").status,
        404,
        "Behavior delete removes the key"
    );
}

/// The greatest number of commands running at once, from their `+`/`-` log.
fn max_running(log: &str) -> i32 {
    let (mut now, mut max) = (0, 0);
    for c in log.chars() {
        match c {
            '+' => now += 1,
            '-' => now -= 1,
            _ => {}
        }
        max = max.max(now);
    }
    max
}

fn spawn_lock(s: &Server, args: &[&str]) -> std::process::Child {
    std::process::Command::new(common::bin())
        .arg("lock")
        .args(args)
        .env("CAIRN_HTTP_ADDR", &s.url)
        .env_remove("CONSUL_HTTP_ADDR")
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("run cairn lock")
}

#[test]
fn cairn_lock_runs_commands_one_at_a_time_and_n_at_a_time_with_a_semaphore() {
    let s = Server::builder().dev().node("srv").start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!("printf + >> {0}; sleep 1; printf - >> {0}", log.display());
    let run_all = |args: &[&str], n: usize| {
        std::fs::write(&log, "").unwrap();
        let mut children: Vec<_> = (0..n).map(|_| spawn_lock(&s, args)).collect();
        for c in &mut children {
            assert!(c.wait().unwrap().success());
        }
        std::fs::read_to_string(&log).unwrap()
    };
    let ran = run_all(&["jobs/one", &script], 3);
    assert_eq!(ran.len(), 6, "every command ran: {ran:?}");
    assert_eq!(max_running(&ran), 1, "a lock runs one at a time: {ran:?}");
    let ran = run_all(&["-n", "2", "jobs/two", &script], 3);
    assert_eq!(ran.len(), 6, "every command ran: {ran:?}");
    assert_eq!(
        max_running(&ran),
        2,
        "a semaphore of 2 runs two at a time: {ran:?}"
    );

    // The command's exit code is cairn lock's; the lock is released after.
    let o = common::cli(&s.url, &["lock", "jobs/one", "exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    let held = s.get_json("/v1/kv/jobs/one/.lock");
    assert_eq!(held[0].get("Session"), None, "released: {held}");
    assert_eq!(
        s.get_json("/v1/session/list"),
        json!([]),
        "sessions destroyed"
    );
}

#[test]
fn cairn_lock_releases_the_lock_when_it_is_terminated() {
    let s = Server::builder().dev().node("srv").start();
    let mut child = spawn_lock(&s, &["jobs/sig", "sleep 30"]);
    eventually(
        Duration::from_secs(10),
        "cairn lock to hold the lock",
        || {
            let r = s.get("/v1/kv/jobs/sig/.lock");
            (r.status == 200 && r.json()[0].get("Session").is_some()).then_some(())
        },
    );
    let pid = child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "cairn lock did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = s.get_json("/v1/kv/jobs/sig/.lock");
    assert_eq!(held[0].get("Session"), None, "released: {held}");
    assert_eq!(
        s.get_json("/v1/session/list"),
        json!([]),
        "session destroyed"
    );
}

/// Destroying a session that is not there changes nothing, so it makes no
/// Raft entry: an anonymous caller cannot grow the log by repeating it.
#[test]
fn destroying_an_unknown_session_appends_nothing_to_the_log() {
    const ROOT: &str = "6f1c2a4e-0000-4000-8000-00000000000a";
    let s = Server::builder().dev().acl("deny", ROOT).start();
    let last_index = || {
        let path = "/v1/agent/metrics?format=prometheus";
        let r = common::request_with(s.http_addr, "GET", path, None, &[("X-Consul-Token", ROOT)]);
        common::metric_in(&r.body, "cairn_raft_last_log_index")
    };
    // The leader's ACL init has written the management token once it works.
    eventually(Duration::from_secs(10), "the management token", || {
        let path = "/v1/acl/token/self";
        let r = common::request_with(s.http_addr, "GET", path, None, &[("X-Consul-Token", ROOT)]);
        (r.status == 200).then_some(())
    });
    let before = last_index();
    for _ in 0..50 {
        let r = s.put(
            "/v1/session/destroy/9e1f3c2a-1111-4222-8333-444455556666",
            "",
        );
        assert_eq!((r.status, r.body.trim()), (200, "true"));
    }
    // Background duties (heartbeats, anti-entropy) may write a few entries
    // meanwhile; 50 calls appending one each would add 50.
    let added = last_index() - before;
    assert!(
        added < 10.0,
        "50 destroys of nothing appended {added} entries"
    );
}
