//! A client agent's streaming backend (Consul's `use_streaming_backend`):
//! blocking `/v1/health/service/:s` reads on an agent answered from one
//! view per service and token, fed by one `/v1/internal/stream`
//! subscription to a server. Many watchers cost the servers one stream;
//! answers are the server's own (`?passing`, `?tag`, `?filter`), at an
//! index that only moves forward; a killed server's stream is taken up by
//! another; `use_streaming_backend = false` forwards each read as before;
//! with ACLs, a view holds what its token reads and nothing for a token
//! the server refuses.
//!
//! Real processes: servers and `cairn agent`. Nothing sleeps a fixed time:
//! a write follows only once the watchers are parked on the agent.

mod common;

use std::time::{Duration, Instant};

use common::acl::{ROOT, as_root, deny_server, token_with_rules, with};
use common::agent::Agent;
use common::{Resp, Server, cluster, eventually};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// Registers (or updates) instance `id` of `web` on `node`, tagged `tag`,
/// with one service check in `status`, through server `s` (as `ROOT`,
/// which an ACL-less server ignores).
fn register(s: &Server, node: &str, id: &str, tag: &str, status: &str) {
    let body = json!({
        "Node": node,
        "Address": "10.0.0.1",
        "Service": {"ID": id, "Service": "web", "Port": 80, "Tags": [tag]},
        "Check": {"CheckID": format!("{id}-check"), "Name": "up", "Status": status, "ServiceID": id},
    });
    as_root(s.http_addr, "PUT", "/v1/catalog/register", &body);
}

/// The service IDs of a health answer, in its order.
fn ids(rows: &Value) -> Vec<String> {
    rows.as_array()
        .unwrap_or_else(|| panic!("not a list: {rows}"))
        .iter()
        .map(|r| r["Service"]["ID"].as_str().unwrap().to_string())
        .collect()
}

fn streamed(r: &Resp) -> bool {
    r.header("x-consul-query-backend") == Some("streaming")
}

/// Blocking reads of `path` (which ends in `index=`) on the agent at
/// `addr`, `n` at once, each from `index`: their answers, in a thread.
fn watchers(
    addr: std::net::SocketAddr, path: String, index: u64, n: usize, token: Option<String>,
) -> std::thread::JoinHandle<Vec<Resp>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let c = cairn::tls::http_client()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap();
            let url = format!("http://{addr}{path}{index}&wait=90s");
            let calls = (0..n).map(|_| {
                let mut req = c.get(&url);
                if let Some(t) = &token {
                    req = req.header("X-Consul-Token", t);
                }
                async move {
                    let r = req.send().await.expect("the agent answers");
                    let status = r.status().as_u16();
                    let headers = r
                        .headers()
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                        .collect();
                    let body = r.text().await.unwrap();
                    Resp {
                        status,
                        headers,
                        body,
                    }
                }
            });
            futures_util::future::join_all(calls).await
        })
    })
}

/// A metric of the process at `addr`, asked with the management token.
fn metric_as_root(addr: std::net::SocketAddr, name: &str) -> f64 {
    common::metric_in(&with(addr, "GET", common::METRICS, None, ROOT).body, name)
}

/// Waits until `n` reads wait on the agent's views.
fn parked(a: &Agent, n: u64) {
    eventually(DEADLINE, "watchers parked on the agent", || {
        (a.metric("cairn_blocking_queries_parked") as u64 >= n).then_some(())
    });
}

#[test]
fn two_hundred_watchers_on_an_agent_cost_the_server_one_stream() {
    let s = Server::dev();
    s.settle();
    let a = Agent::builder("a1", &s.url).start();
    register(&s, "n1", "web1", "v1", "passing");
    // Not blocking: forwarded, the server's answer and index.
    let first = a.get("/v1/health/service/web");
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        !streamed(&first),
        "a read that does not block is the server's"
    );
    let index = first.index();
    let streams = s.metric("cairn_stream_subscriptions");
    let blocking = s.metric("cairn_blocking_queries_total");

    let w = watchers(
        a.http_addr,
        "/v1/health/service/web?index=".into(),
        index,
        200,
        None,
    );
    parked(&a, 200);
    // One view, one subscription: the server holds one stream more, and
    // not one blocking query per watcher.
    assert_eq!(s.metric("cairn_stream_subscriptions"), streams + 1.0);
    assert_eq!(a.metric("cairn_agent_health_views"), 1.0);
    assert_eq!(a.metric("cairn_agent_stream_subscriptions_total"), 1.0);
    let more = s.metric("cairn_blocking_queries_total") - blocking;
    assert!(more < 20.0, "{more} blocking queries on the server");

    register(&s, "n2", "web2", "v2", "passing");
    let answers = w.join().unwrap();
    let direct = s.get("/v1/health/service/web");
    assert_eq!(answers.len(), 200);
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(streamed(r), "{:?}", r.headers);
        assert!(r.index() > index);
        // The server's own answer, row for row, at its index.
        assert_eq!(r.index(), direct.index());
        assert_eq!(r.json(), direct.json());
        assert_eq!(ids(&r.json()), ["web1", "web2"]);
    }
    assert_eq!(a.metric("cairn_agent_view_reads_total"), 200.0);
}

#[test]
fn passing_tag_and_filter_select_as_the_server_does_and_the_index_moves_forward() {
    let s = Server::dev();
    s.settle();
    let a = Agent::builder("a1", &s.url).start();
    register(&s, "n1", "web1", "v1", "passing");
    register(&s, "n2", "web2", "v2", "critical");
    let base = a.get("/v1/health/service/web").index();

    // Each selection from the view is the server's own answer.
    for q in [
        "passing",
        "tag=v2",
        "filter=Service.Port%20%3D%3D%2080",
        "passing&tag=v2",
    ] {
        let r = a.get(&format!("/v1/health/service/web?{q}&index=1"));
        let direct = s.get(&format!("/v1/health/service/web?{q}"));
        assert!(streamed(&r), "?{q}: {:?}", r.headers);
        assert_eq!((r.status, r.json()), (200, direct.json()), "?{q}");
        assert_eq!(r.index(), direct.index(), "?{q}");
    }
    assert_eq!(
        ids(&a.get("/v1/health/service/web?passing&index=1").json()),
        ["web1"]
    );
    // What the view does not answer goes to the server.
    for q in ["consistent", "near=n1", "merge-central-config"] {
        let r = a.get(&format!("/v1/health/service/web?{q}&index=1"));
        assert_eq!(r.status, 200, "?{q}: {}", r.body);
        assert!(!streamed(&r), "?{q} is the server's");
    }
    // A bad parameter gets the server's 400, not a view's answer.
    let bad = a.get("/v1/health/service/web?index=1&passing=maybe");
    assert_eq!(bad.status, 400, "{}", bad.body);

    // web2 turns passing, critical, passing: each watcher of ?passing is
    // woken with the new set, at an index above the last.
    let mut last = base;
    for (round, status) in ["passing", "critical", "passing"].into_iter().enumerate() {
        let views_before = a.metric("cairn_blocking_queries_parked") as u64;
        let w = watchers(
            a.http_addr,
            "/v1/health/service/web?passing&index=".into(),
            last,
            3,
            None,
        );
        parked(&a, views_before + 3);
        register(&s, "n2", "web2", "v2", status);
        let want: &[&str] = if status == "passing" {
            &["web1", "web2"]
        } else {
            &["web1"]
        };
        for r in w.join().unwrap() {
            assert!(streamed(&r));
            assert!(
                r.index() > last,
                "round {round}: {} after {last}",
                r.index()
            );
            assert_eq!(ids(&r.json()), want, "round {round}");
        }
        last = s.get("/v1/health/service/web").index();
    }
}

#[test]
fn watchers_get_correct_answers_after_the_server_they_stream_from_is_killed() {
    let mut servers = cluster(3, &[]);
    common::agreed_leader(&servers);
    let a = Agent::builder("a1", &servers[0].url)
        .server(&servers[1].url)
        .server(&servers[2].url)
        .start();
    register(&servers[0], "n1", "web1", "v1", "passing");
    let index = a.get("/v1/health/service/web").index();
    let first = a.get(&format!("/v1/health/service/web?index={}", index - 1));
    assert!(streamed(&first) && ids(&first.json()) == ["web1"]);
    let streaming = eventually(DEADLINE, "the server streaming to the agent", || {
        servers
            .iter()
            .position(|s| s.metric("cairn_stream_subscriptions") == 1.0)
    });

    // A watcher parked on the view while its server dies.
    let w = watchers(
        a.http_addr,
        "/v1/health/service/web?index=".into(),
        first.index(),
        5,
        None,
    );
    parked(&a, 5);
    servers[streaming].kill();
    let alive: Vec<usize> = (0..3).filter(|&i| i != streaming).collect();
    // Written through a survivor once a leader is there again.
    eventually(DEADLINE, "a write after the kill", || {
        let body = json!({
            "Node": "n2", "Address": "10.0.0.2",
            "Service": {"ID": "web2", "Service": "web", "Port": 80},
        });
        let r = servers[alive[0]].put("/v1/catalog/register", &body.to_string());
        (r.status == 200).then_some(())
    });
    for r in w.join().unwrap() {
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(streamed(&r));
        assert!(r.index() > first.index());
        assert_eq!(ids(&r.json()), ["web1", "web2"]);
    }
    // The agent streams from a survivor now, one subscription.
    eventually(DEADLINE, "the stream taken up by a survivor", || {
        let open: f64 = alive
            .iter()
            .map(|&i| servers[i].metric("cairn_stream_subscriptions"))
            .sum();
        (open == 1.0).then_some(())
    });
    // And later changes still arrive: web1 deregistered.
    let at = a.get("/v1/health/service/web").index();
    let w = watchers(
        a.http_addr,
        "/v1/health/service/web?index=".into(),
        at,
        5,
        None,
    );
    parked(&a, 5);
    let r = servers[alive[0]].put(
        "/v1/catalog/deregister",
        &json!({"Node": "n1", "ServiceID": "web1"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let answers = w.join().unwrap();
    // A survivor's own answer once it has applied the deregistration too.
    let direct =
        servers[alive[1]].get(&format!("/v1/health/service/web?stale&wait=20s&index={at}"));
    for r in answers {
        assert!(streamed(&r));
        assert!(r.index() > at);
        assert_eq!(ids(&r.json()), ["web2"]);
        assert_eq!(r.json(), direct.json());
    }
}

#[test]
fn with_use_streaming_backend_false_each_watcher_is_a_blocking_query_on_the_server() {
    let s = Server::dev();
    s.settle();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.hcl"),
        "use_streaming_backend = false\n",
    )
    .unwrap();
    let a = Agent::builder("a1", &s.url).config_dir(dir.path()).start();
    register(&s, "n1", "web1", "v1", "passing");
    let index = a.get("/v1/health/service/web").index();
    let blocking = s.metric("cairn_blocking_queries_total");
    let parked_before = s.parked();
    let w = watchers(
        a.http_addr,
        "/v1/health/service/web?index=".into(),
        index,
        50,
        None,
    );
    // Parked on the server, one query each; no stream.
    s.wait_parked(parked_before + 50);
    assert!(s.metric("cairn_blocking_queries_total") - blocking >= 50.0);
    assert_eq!(s.metric("cairn_stream_subscriptions"), 0.0);
    assert_eq!(a.metric("cairn_agent_health_views"), 0.0);
    register(&s, "n2", "web2", "v2", "passing");
    for r in w.join().unwrap() {
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(!streamed(&r), "forwarded: {:?}", r.headers);
        assert_eq!(ids(&r.json()), ["web1", "web2"]);
    }
    assert_eq!(a.metric("cairn_agent_view_reads_total"), 0.0);
}

#[test]
fn with_acls_a_view_holds_what_its_token_reads_and_a_refused_token_gets_the_servers_answer() {
    let s = deny_server();
    let a = Agent::builder("a1", &s.url)
        .arg("--acl-agent-token")
        .arg(ROOT)
        .start();
    register(&s, "n1", "web1", "v1", "passing");
    register(&s, "n2", "web2", "v2", "passing");
    let (_, full) = token_with_rules(
        s.http_addr,
        "full",
        r#"service "web" { policy = "read" }
node_prefix "" { policy = "read" }"#,
    );
    // One permission short: n2 is not readable.
    let (_, short) = token_with_rules(
        s.http_addr,
        "short",
        r#"service "web" { policy = "read" }
node "n1" { policy = "read" }"#,
    );
    // Nodes but not the service.
    let (_, nodes_only) = token_with_rules(
        s.http_addr,
        "nodes",
        r#"node_prefix "" { policy = "read" }"#,
    );
    let streams = metric_as_root(s.http_addr, "cairn_stream_subscriptions");

    let read = |addr, token: Option<&str>| {
        let path = "/v1/health/service/web?index=1&wait=5s";
        match token {
            Some(t) => with(addr, "GET", path, None, t),
            None => common::request(addr, "GET", path, None),
        }
    };
    let direct = |token: Option<&str>| {
        let path = "/v1/health/service/web";
        match token {
            Some(t) => with(s.http_addr, "GET", path, None, t),
            None => common::request(s.http_addr, "GET", path, None),
        }
    };
    // Tokens that may read the service: views, holding what the server
    // shows the same token.
    for (token, want) in [(&full, vec!["web1", "web2"]), (&short, vec!["web1"])] {
        let r = read(a.http_addr, Some(token));
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(streamed(&r), "{:?}", r.headers);
        assert_eq!(ids(&r.json()), want);
        assert_eq!(r.json(), direct(Some(token)).json());
    }
    // One view, one stream per token.
    assert_eq!(metric_as_root(a.http_addr, "cairn_agent_health_views"), 2.0);
    assert_eq!(
        metric_as_root(s.http_addr, "cairn_stream_subscriptions"),
        streams + 2.0
    );

    // Anonymous (default deny) and a token without service:read: the
    // server refuses their subscription; each read gets the server's own
    // answer to it, which holds nothing.
    for token in [None, Some(nodes_only.as_str())] {
        let r = read(a.http_addr, token);
        let d = direct(token);
        assert!(!streamed(&r), "{token:?}: {:?}", r.headers);
        assert_eq!(r.status, d.status, "{token:?}: {}", r.body);
        assert_eq!(r.json(), d.json(), "{token:?}");
        assert_eq!(ids(&r.json()), Vec::<String>::new(), "{token:?}");
    }
    // Their refused views hold no stream open on the server.
    assert_eq!(
        metric_as_root(s.http_addr, "cairn_stream_subscriptions"),
        streams + 2.0
    );

    // A change reaches the short token's view only where it may read it:
    // a new instance on n2 wakes nobody with it.
    let at = read(a.http_addr, Some(&short)).index();
    let w = watchers(
        a.http_addr,
        "/v1/health/service/web?index=".into(),
        at,
        1,
        Some(short.clone()),
    );
    eventually(DEADLINE, "the watcher parked", || {
        (metric_as_root(a.http_addr, "cairn_blocking_queries_parked") >= 1.0).then_some(())
    });
    register(&s, "n2", "web3", "v3", "passing");
    register(&s, "n1", "web4", "v4", "passing");
    let started = Instant::now();
    for r in w.join().unwrap() {
        assert!(streamed(&r));
        assert_eq!(ids(&r.json()), ["web1", "web4"]);
    }
    assert!(started.elapsed() < DEADLINE);

    // The short token narrowed to no node at all: its view starts over
    // under the new rules, and its watcher is told it holds nothing (not
    // the instances it read before, kept for good).
    let at = read(a.http_addr, Some(&short)).index();
    let w = watchers(
        a.http_addr,
        "/v1/health/service/web?index=".into(),
        at,
        1,
        Some(short.clone()),
    );
    eventually(DEADLINE, "the watcher parked", || {
        (metric_as_root(a.http_addr, "cairn_blocking_queries_parked") >= 1.0).then_some(())
    });
    let id = with(s.http_addr, "GET", "/v1/acl/policy/name/short", None, ROOT).json()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    common::acl::as_root(
        s.http_addr,
        "PUT",
        &format!("/v1/acl/policy/{id}"),
        &json!({"Name": "short", "Rules": r#"service "web" { policy = "read" }"#}),
    );
    for r in w.join().unwrap() {
        assert!(streamed(&r));
        assert!(r.index() > at, "woken by the change of rights");
        assert_eq!(ids(&r.json()), Vec::<String>::new());
        assert_eq!(r.json(), direct(Some(&short)).json());
    }
}

/// The pid of agent `a`: the process whose command line has its HTTP
/// address.
fn agent_pid(a: &Agent) -> u32 {
    let want = "agent\0";
    let addr = a.http_addr.to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains(want) && cmd.contains(&addr)
        })
        .expect("the agent's process")
}

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's closing parenthesis: state is field 3, utime
    // field 14 and stime field 15, in clock ticks (100 a second).
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// The measurement behind `docs/benchmarks.md`'s "client agent streaming
/// backend" rows (not a test: `cargo test --test agent_streaming --
/// --ignored --nocapture`): 1,000 watchers of one service on one agent,
/// each asking again at once after every answer (as consul-template
/// does), and one change of the service a second for 30 s; the server's
/// and the agent's CPU time over those 30 s, with the streaming backend
/// and without.
#[test]
#[ignore]
fn measure_server_cpu_with_and_without_the_streaming_backend() {
    const WATCHERS: usize = 1000;
    const SECONDS: u64 = 30;
    for streaming in [true, false] {
        let s = Server::dev();
        s.settle();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("agent.hcl"),
            format!("use_streaming_backend = {streaming}\n"),
        )
        .unwrap();
        let a = Agent::builder("a1", &s.url).config_dir(dir.path()).start();
        register(&s, "n1", "web1", "v1", "passing");
        let index = a.get("/v1/health/service/web").index();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answers = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let url = format!("{}/v1/health/service/web?wait=60s&index=", a.url);
        let loops = {
            let (stop, answers) = (stop.clone(), answers.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(async move {
                    let c = cairn::tls::http_client()
                        .timeout(Duration::from_secs(120))
                        .build()
                        .unwrap();
                    let tasks = (0..WATCHERS).map(|_| {
                        let (c, url, stop, answers) =
                            (c.clone(), url.clone(), stop.clone(), answers.clone());
                        async move {
                            let mut at = index;
                            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                                let Ok(r) = c.get(format!("{url}{at}")).send().await else {
                                    continue;
                                };
                                at = common::asynch::consul_index(&r).max(at);
                                let _ = r.bytes().await;
                                answers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    });
                    futures_util::future::join_all(tasks).await;
                })
            })
        };
        if streaming {
            parked(&a, WATCHERS as u64);
        } else {
            s.wait_parked(WATCHERS as u64);
        }
        let (server, agent) = (s.pid().unwrap(), agent_pid(&a));
        let (s0, a0) = (cpu_seconds(server), cpu_seconds(agent));
        let answered0 = answers.load(std::sync::atomic::Ordering::Relaxed);
        let t0 = Instant::now();
        for i in 0..SECONDS {
            let status = if i % 2 == 0 { "warning" } else { "passing" };
            register(&s, "n1", "web1", "v1", status);
            let next = t0 + Duration::from_secs(i + 1);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        let (s1, a1) = (cpu_seconds(server), cpu_seconds(agent));
        let answered = answers.load(std::sync::atomic::Ordering::Relaxed) - answered0;
        println!(
            "streaming backend {}: {WATCHERS} watchers, {SECONDS} changes in {:.1}s: server CPU {:.2}s ({:.1}% of one core), agent CPU {:.2}s, {answered} answers",
            if streaming { "on" } else { "off" },
            t0.elapsed().as_secs_f64(),
            s1 - s0,
            (s1 - s0) * 100.0 / t0.elapsed().as_secs_f64(),
            a1 - a0,
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // One more change lets every parked watcher return and stop.
        register(&s, "n1", "web1", "v1", "critical");
        loops.join().unwrap();
    }
}
