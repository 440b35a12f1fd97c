//! Budgets and backpressure against real processes: a burst of large
//! writes never wedges a cluster, and whatever was acknowledged is on every
//! server afterwards.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::asynch::*;
use common::{Server, cluster};

/// A value of `len` bytes that names its key (so a value read back under
/// another key, or cut short, is caught).
fn big_value(n: usize, len: usize) -> Vec<u8> {
    let tag = format!("big-{n}:");
    tag.bytes().cycle().take(len).collect()
}

/// The last `n` lines of a server's log, for a failure's message.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_large_writes_never_wedges_the_cluster() {
    const WRITES: usize = 300;
    const LEN: usize = 500 * 1024;
    let procs = cluster(3, &[]);
    let c = cairn::tls::http_client()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    cluster_leader(&c, &procs).await;

    // All at once, spread over the three HTTP ports.
    let burst: Vec<_> = (0..WRITES)
        .map(|n| {
            let url = procs[n % procs.len()].at(&format!("/v1/kv/big/{n}"));
            let c = c.clone();
            tokio::spawn(async move {
                let r = c.put(url).body(big_value(n, LEN)).send().await;
                match r {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let body = r.text().await.unwrap_or_default();
                        (n, status, body)
                    }
                    Err(e) => (n, 0, e.to_string()),
                }
            })
        })
        .collect();
    let mut acked = Vec::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut refused = Vec::new();
    for t in burst {
        let (n, status, body) = t.await.unwrap();
        *statuses.entry(status).or_default() += 1;
        if status == 200 && body.trim() == "true" {
            acked.push(n);
        }
        if status != 200 && status != 429 {
            refused.push(format!("write {n} answered {status}: {body}"));
        }
    }
    let burst_over = Instant::now();
    eprintln!("burst answers: {statuses:?}");
    assert!(!acked.is_empty(), "no large write was acknowledged");

    // Small writes commit at once after the burst, on every server.
    for (i, p) in procs.iter().enumerate() {
        let started = Instant::now();
        let r = put(&c, p, &format!("small/{i}"), "x").await;
        if r != Ok(true) {
            for p in &procs {
                eprintln!("--- {} ---\n{}", p.name(), tail(&p.log(), 40));
            }
        }
        assert_eq!(r, Ok(true), "small write through {}", p.name());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "small write through {} took {:?} after the burst",
            p.name(),
            started.elapsed()
        );
    }
    assert!(
        burst_over.elapsed() < Duration::from_secs(6),
        "three small writes took {:?}",
        burst_over.elapsed()
    );

    // Refused for load (429) is the only other answer the contract allows:
    // never a 500 from a queue that grew or timed out.
    if !refused.is_empty() {
        for p in &procs {
            eprintln!("--- {} ---\n{}", p.name(), tail(&p.log(), 40));
        }
    }
    assert!(refused.is_empty(), "{refused:#?}");

    // Every acknowledged value is on every server, whole.
    for p in &procs {
        for &n in &acked {
            let want = big_value(n, LEN);
            let got = eventually(
                Duration::from_secs(30),
                &format!("big/{n} on {}", p.name()),
                || async {
                    let r = c
                        .get(p.at(&format!("/v1/kv/big/{n}?raw&stale")))
                        .send()
                        .await
                        .ok()?;
                    if r.status() != 200 {
                        return None;
                    }
                    Some(r.bytes().await.ok()?.to_vec())
                },
            )
            .await;
            assert!(got == want, "big/{n} on {} differs", p.name());
        }
    }
}

/// A frame as the Raft transport writes one: `[len u32 BE][body]`.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// An AppendEntries frame whose one entry is `Normal(X)`, where `X` is
/// `levels` times "a batch of one, holding": the nesting that overflowed a
/// server's stack when `Command::Batch` could hold a batch (variant 8 of the
/// command, then a length of 1, repeated).
fn nested_batches(levels: usize) -> Vec<u8> {
    use cairn::raft::network::Request;
    use cairn::raft::{Entry, LogId, Vote};
    use cairn::state::{Command, Payload};
    use openraft::impls::leader_id_adv::LeaderId;
    let leader_id = LeaderId {
        term: 1,
        node_id: 1,
    };
    let req = Request::Append(openraft::raft::AppendEntriesRequest {
        vote: Vote {
            leader_id,
            committed: true,
        },
        prev_log_id: None,
        entries: vec![Entry {
            log_id: LogId {
                leader_id,
                index: 1,
            },
            payload: openraft::EntryPayload::Normal(Payload::One(Command::Noop)),
        }],
        leader_commit: None,
    });
    let mut body = bincode::serialize(&req).unwrap();
    // Cut `One` (u32), `Noop` (u32) and `leader_commit: None` (u8): what is
    // left ends with the entry payload's `Normal` tag.
    body.truncate(body.len() - 9);
    for _ in 0..levels {
        body.extend_from_slice(&8u32.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
    }
    frame(&body)
}

/// Sends `bytes` on a new connection to `addr`, after the greeting a
/// cairn server sends first (so they reach the frame decoder); returns once
/// the server has closed it (or answered and closed), within `within`.
async fn send_and_wait_close(addr: &str, bytes: &[u8], within: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&cairn::raft::network::greeting())
        .await
        .unwrap();
    // The server may close before taking it all: that is fine.
    let _ = s.write_all(bytes).await;
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(within, s.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "{addr} kept a hostile connection open");
}

/// Small writes through every server commit, each within `within`. An
/// answer that leadership moved is retried within that time, as a Consul
/// client retries it: on a loaded two-core machine an election can come
/// from CPU starvation alone (the neighbouring tests of this file run at
/// once), and what this asserts is that every server still commits, soon.
/// A failure shows each server's log tail, so an election caused by the
/// hostile input itself can be told from one caused by the machine.
async fn writes_commit(c: &reqwest::Client, procs: &[Server], key: &str, within: Duration) {
    for p in procs {
        let started = Instant::now();
        let r = loop {
            let r = put(c, p, &format!("{key}/{}", p.name()), "x").await;
            let moved = matches!(&r, Err(e) if e.contains("leadership lost") || e.contains("No cluster leader"));
            if !moved || started.elapsed() >= within {
                break r;
            }
            cluster_leader(c, procs).await;
        };
        let logs = || {
            procs
                .iter()
                .map(|s| format!("--- {}:\n{}", s.name(), tail(&s.log(), 30)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(r, Ok(true), "write through {}\n{}", p.name(), logs());
        assert!(
            started.elapsed() < within,
            "write through {} took {:?}\n{}",
            p.name(),
            started.elapsed(),
            logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_bytes_on_the_raft_port_crash_nothing() {
    let procs = cluster(3, &[]);
    let c = client();
    cluster_leader(&c, &procs).await;
    writes_commit(&c, &procs, "before", Duration::from_secs(5)).await;

    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    let within = Duration::from_secs(10);
    for p in &procs {
        // Garbage behind a plausible length; a length prefix of 4 GiB; a
        // frame nested 200,000 levels deep (2.4 MB).
        send_and_wait_close(&p.raft_addr.to_string(), &frame(&garbage), within).await;
        send_and_wait_close(
            &p.raft_addr.to_string(),
            &[0xff, 0xff, 0xff, 0xff, 1, 2, 3],
            within,
        )
        .await;
        send_and_wait_close(&p.raft_addr.to_string(), &nested_batches(200_000), within).await;
    }
    // Everyone is still up and the cluster still commits.
    writes_commit(&c, &procs, "after-frames", Duration::from_secs(3)).await;

    // Thousands of idle connections to every server's Raft port, held
    // while the cluster keeps committing.
    let mut idle = Vec::new();
    for p in &procs {
        for _ in 0..1500 {
            if let Ok(s) = tokio::net::TcpStream::connect(p.raft_addr).await {
                idle.push(s);
            }
        }
    }
    assert!(idle.len() > 3000, "only {} connections opened", idle.len());
    writes_commit(&c, &procs, "while-idle", Duration::from_secs(3)).await;
    // Past the first-frame timeout the server has closed every one of them.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut open = 0;
        for s in &idle {
            let mut b = [0u8; 1];
            if let Err(e) = s.try_read(&mut b)
                && e.kind() == std::io::ErrorKind::WouldBlock
            {
                open += 1;
            }
        }
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} idle connections still open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(idle);
    writes_commit(&c, &procs, "after-idle", Duration::from_secs(3)).await;
    for p in &procs {
        assert!(
            !p.log().contains("panicked"),
            "{} panicked:\n{}",
            p.name(),
            tail(&p.log(), 40)
        );
    }
}

#[tokio::test]
async fn control_characters_in_names_and_ids_answer_400_and_change_nothing() {
    use serde_json::json;
    let p = Server::dev();
    let c = client();
    let service = |id: &str, name: &str| {
        json!({"Node": "n1", "Address": "10.0.0.1",
               "Service": {"ID": id, "Service": name, "Port": 80}})
    };
    let cases: Vec<(&str, &str, serde_json::Value)> = vec![
        (
            "node name",
            "/v1/catalog/register",
            json!({"Node": "n\u{0}1", "Address": "10.0.0.1"}),
        ),
        (
            "node name",
            "/v1/catalog/register",
            json!({"Node": "n\u{1b}1", "Address": "10.0.0.1"}),
        ),
        (
            "service ID",
            "/v1/catalog/register",
            service("web\u{0}1", "web"),
        ),
        (
            "service name",
            "/v1/catalog/register",
            service("web1", "we\nb"),
        ),
        (
            "check ID",
            "/v1/catalog/register",
            json!({"Node": "n1", "Address": "10.0.0.1",
                   "Check": {"CheckID": "c\u{0}1", "Name": "c", "Status": "passing"}}),
        ),
        (
            "node name",
            "/v1/catalog/deregister",
            json!({"Node": "n\u{0}1"}),
        ),
        (
            "key",
            "/v1/txn",
            json!([{"KV": {"Verb": "set", "Key": "t\u{0}k", "Value": "eA=="}}]),
        ),
    ];
    for (what, path, body) in cases {
        let r = c.put(p.at(path)).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{what} in {body}: {text}");
        assert!(text.contains(what), "{what} not in {text:?}");
    }
    // A NUL in a KV key, as a client sends it in the path.
    for key in ["a%00b", "a%0Ab", "a%7Fb"] {
        let r = c
            .put(p.at(&format!("/v1/kv/{key}")))
            .body("v")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "key {key}");
    }
    // Nothing of it was written.
    let nodes: Vec<serde_json::Value> = get_json(&c, p.at("/v1/catalog/nodes")).await;
    assert!(nodes.iter().all(|n| n["Node"] != "n1"), "{nodes:?}");
    let r = c.get(p.at("/v1/kv/?keys")).send().await.unwrap();
    assert_eq!(r.status(), 404, "some key was written");
    // A plain name still registers.
    let r = c
        .put(p.at("/v1/catalog/register"))
        .json(&service("web1", "web"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Reads from `s` until the server closes it; the time that took, or None
/// if it stayed open past `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let started = Instant::now();
    let mut sink = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut sink))
        .await
        .ok()
        .map(|_| started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_limits_hold_with_their_flags() {
    use tokio::io::AsyncWriteExt;
    let mut p = Server::builder()
        .node("limits")
        .arg("--http-max-conns")
        .arg("40")
        .arg("--http-read-header-timeout")
        .arg("1s")
        .arg("--http-idle-timeout")
        .arg("3s")
        .arg("--http-max-blocking-queries")
        .arg("4")
        .start();
    let c = client();
    assert_eq!(put(&c, &p, "k", "v").await, Ok(true));

    // A head that never ends is cut at the header timeout.
    let mut slow = tokio::net::TcpStream::connect(p.http_addr).await.unwrap();
    slow.write_all(b"GET /v1/kv/k HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let took = closed_within(&mut slow, Duration::from_secs(10)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(6)),
        "a half-sent head was kept {took:?}"
    );

    // An idle keep-alive connection is closed at the idle timeout, but one
    // whose blocking query waits longer than that is not.
    let mut idle = tokio::net::TcpStream::connect(p.http_addr).await.unwrap();
    idle.write_all(b"GET /v1/kv/k HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let index = c.get(p.at("/v1/kv/k")).send().await.unwrap();
    let index = index.headers()["x-consul-index"]
        .to_str()
        .unwrap()
        .to_string();
    let mut waiting = tokio::net::TcpStream::connect(p.http_addr).await.unwrap();
    waiting
        .write_all(
            format!("GET /v1/kv/k?index={index}&wait=5s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let took = closed_within(&mut idle, Duration::from_secs(15)).await;
    assert!(
        took.is_some_and(|t| t > Duration::from_secs(2) && t < Duration::from_secs(10)),
        "an idle connection was closed after {took:?}"
    );
    let mut answer = Vec::new();
    {
        use tokio::io::AsyncReadExt;
        waiting.read_to_end(&mut answer).await.unwrap();
    }
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "the blocking query was cut: {:?}",
        String::from_utf8_lossy(&answer)
    );

    // Past 4 blocking queries at once: 429, and other reads still answer.
    // A fresh client: the old one's pooled connections were idle past the
    // server's idle timeout, and a request sent on one being closed is lost.
    let c = client();
    let parked: Vec<_> = (0..4)
        .map(|_| {
            let (c, url) = (c.clone(), p.at(&format!("/v1/kv/k?index={index}&wait=15s")));
            tokio::spawn(async move { c.get(url).send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    wait_parked(&c, &p, 4).await;
    eventually(Duration::from_secs(30), "a 429", || async {
        let r = c
            .get(p.at(&format!("/v1/kv/k?index={index}&wait=15s")))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        (r.status() == 429).then_some(())
    })
    .await;
    assert_eq!(c.get(p.at("/v1/kv/k")).send().await.unwrap().status(), 200);
    for t in parked {
        assert_eq!(t.await.unwrap().unwrap(), 200);
    }

    // Past 40 connections, a new one is closed at once; once they go, the
    // server takes connections again.
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(tokio::net::TcpStream::connect(p.http_addr).await.unwrap());
    }
    let mut extra = tokio::net::TcpStream::connect(p.http_addr).await.unwrap();
    let took = closed_within(&mut extra, Duration::from_secs(2)).await;
    assert!(took.is_some(), "a connection past the cap was kept");
    drop(held);
    eventually(
        Duration::from_secs(10),
        "a request after the cap",
        || async {
            let r = client().get(p.at("/v1/kv/k")).send().await.ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    p.kill();
}

/// One client IP cannot hold every HTTP connection (Consul's
/// `http_max_conns_per_client`): past its share its new connections close
/// at once while another IP is still served; and a body trickled in is cut
/// after the header timeout's grace, storing nothing. On the main before
/// this, the 9th connection was kept and the trickled PUT held its
/// connection for as long as it trickled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_ip_holds_its_share_and_slow_bodies_are_cut() {
    use tokio::io::AsyncWriteExt;
    let mut p = Server::builder()
        .node("per-ip")
        .arg("--http-max-conns")
        .arg("48")
        .arg("--http-max-conns-per-client")
        .arg("8")
        .arg("--http-read-header-timeout")
        .arg("1s")
        .start();
    let mut held = Vec::new();
    // 127.0.0.1 is the server's own (its followers' forwards are not
    // capped): the client here is 127.0.0.2, the other 127.0.0.3.
    for _ in 0..8 {
        let mut s = connect_from([127, 0, 0, 2], p.http_addr).await;
        // Each holds a request in flight: a PUT whose body never comes
        // faster than a byte a second (cut by the least rate, later).
        s.write_all(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
            .await
            .unwrap();
        held.push(s);
    }
    let mut ninth = connect_from([127, 0, 0, 2], p.http_addr).await;
    let took = closed_within(&mut ninth, Duration::from_secs(2)).await;
    assert!(took.is_some(), "a 9th connection from one IP was kept");
    // Another client IP is served meanwhile.
    let mut other = connect_from([127, 0, 0, 3], p.http_addr).await;
    other
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    {
        use tokio::io::AsyncReadExt;
        tokio::time::timeout(Duration::from_secs(5), other.read_to_end(&mut answer))
            .await
            .expect("the other IP answered")
            .unwrap();
    }
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    // The trickled bodies: each connection is answered and closed soon
    // after the grace, though a byte keeps coming every 300 ms.
    let started = Instant::now();
    let first = held.pop().unwrap();
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            for s in held.iter_mut() {
                let _ = s.write_all(b"x").await;
            }
        }
    };
    let watch = async move {
        let mut first = first;
        closed_within(&mut first, Duration::from_secs(10)).await
    };
    let took = tokio::select! {
        t = watch => t,
        _ = trickle => unreachable!(),
    };
    assert!(
        took.is_some() && started.elapsed() < Duration::from_secs(8),
        "a trickled body held its connection {:?}",
        started.elapsed()
    );
    drop(held);
    let c = client();
    let r = c.get(p.at("/v1/kv/slow")).send().await.unwrap();
    assert_eq!(r.status(), 404, "a cut body stored nothing");
    // Its connections gone, the first IP is served again.
    eventually(
        Duration::from_secs(10),
        "127.0.0.2 served again",
        || async {
            let mut s = connect_from([127, 0, 0, 2], p.http_addr).await;
            s.write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut answer = Vec::new();
            use tokio::io::AsyncReadExt;
            s.read_to_end(&mut answer).await.ok()?;
            answer.starts_with(b"HTTP/1.1 200").then_some(())
        },
    )
    .await;
    p.kill();
}

/// Sends `GET path` from `from` with `token` (none: anonymous); the
/// connection, whose answer is read later.
async fn get_from(
    from: [u8; 4], addr: std::net::SocketAddr, path: &str, token: Option<&str>,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = connect_from(from, addr).await;
    let token = token
        .map(|t| format!("X-Consul-Token: {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{token}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    s
}

/// The status of the answer on `s`, within `within` (None: none came).
async fn status_within(s: &mut tokio::net::TcpStream, within: Duration) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Anonymous callers cannot take every blocking place (ACLs on): one
/// client IP's anonymous reads hold at most an eighth of them, a token a
/// quarter, so a management token's blocking read still waits and is
/// answered. On the main before this, 32 anonymous reads of an
/// ACL-filtered list took all 32 places and the management read was 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_blocking_reads_take_only_their_share() {
    use common::acl::{ROOT, acl_started};
    let p = tokio::task::spawn_blocking(|| {
        acl_started(
            Server::builder()
                .dev()
                .arg("--http-max-blocking-queries")
                .arg("32"),
            "deny",
        )
    })
    .await
    .unwrap();
    let index = {
        let r = client()
            .get(p.at("/v1/catalog/services"))
            .header("X-Consul-Token", ROOT)
            .send()
            .await
            .unwrap();
        r.headers()["x-consul-index"].to_str().unwrap().to_string()
    };
    let path = format!("/v1/catalog/services?index={index}&wait=20s");
    let parked_now = || async {
        let body = client()
            .get(p.at(common::METRICS))
            .header("X-Consul-Token", ROOT)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        common::metric_in(&body, "cairn_blocking_queries_parked") as u64
    };
    let parked = parked_now().await;
    let mut anonymous = Vec::new();
    for _ in 0..32 {
        anonymous.push(get_from([127, 0, 0, 2], p.http_addr, &path, None).await);
    }
    // 4 wait (an eighth of 32); the other 28 are refused at once.
    let mut refused = 0;
    for s in anonymous.iter_mut() {
        if status_within(s, Duration::from_millis(1500)).await == Some(429) {
            refused += 1;
        }
    }
    assert_eq!(refused, 28, "anonymous reads past their share");
    // Management's reads take their own share, up to a quarter.
    let mut root: Vec<_> = Vec::new();
    for _ in 0..8 {
        root.push(get_from([127, 0, 0, 3], p.http_addr, &path, Some(ROOT)).await);
    }
    eventually(Duration::from_secs(10), "4 + 8 reads waiting", || async {
        (parked_now().await >= parked + 12).then_some(())
    })
    .await;
    let mut ninth = get_from([127, 0, 0, 3], p.http_addr, &path, Some(ROOT)).await;
    assert_eq!(
        status_within(&mut ninth, Duration::from_secs(5)).await,
        Some(429)
    );
    // A change wakes the management reads with their answer.
    let r = client()
        .put(p.at("/v1/catalog/register"))
        .header("X-Consul-Token", ROOT)
        .body(r#"{"Node": "n1", "Address": "10.0.0.1", "Service": {"Service": "web"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for s in root.iter_mut() {
        assert_eq!(status_within(s, Duration::from_secs(10)).await, Some(200));
    }
}

/// Anonymous blocking reads forwarded to another datacenter (`?dc=`) take
/// only their share of the requests in flight there, so a management
/// token's blocking read of that datacenter still waits its whole wait
/// and is answered; on the main before this every forwarded read opened
/// its own connection to the other datacenter, whose per-IP share of its
/// Raft port then cut the long-lived ones (a 500 after 4.6 s of a 12 s
/// wait, replication broken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_forwarded_reads_take_only_their_share() {
    use common::acl::{ROOT, acl_started};
    let (dc1, dc2) = tokio::task::spawn_blocking(|| {
        let dc2 = acl_started(
            Server::builder()
                .node("b0")
                .bootstrap_expect(1)
                .datacenter("dc2")
                .primary("dc1"),
            "deny",
        );
        let join = dc2.raft_addr.to_string();
        let dc1 = acl_started(
            Server::builder()
                .node("a0")
                .bootstrap_expect(1)
                .datacenter("dc1")
                .join_wan(&join),
            "deny",
        );
        (dc1, dc2)
    })
    .await
    .unwrap();
    let index = eventually(Duration::from_secs(30), "dc1 through dc2", || async {
        let r = client()
            .get(dc2.at("/v1/catalog/services?dc=dc1"))
            .header("X-Consul-Token", ROOT)
            .send()
            .await
            .ok()?;
        (r.status() == 200).then(|| r.headers()["x-consul-index"].to_str().unwrap().to_string())
    })
    .await;
    let path = format!("/v1/catalog/services?dc=dc1&index={index}&wait=20s");
    let mut anonymous = Vec::new();
    for _ in 0..40 {
        anonymous.push(get_from([127, 0, 0, 2], dc2.http_addr, &path, None).await);
    }
    // An eighth of the 256 places wait; the rest are refused at once.
    let mut refused = 0;
    for s in anonymous.iter_mut() {
        if status_within(s, Duration::from_millis(300)).await == Some(429) {
            refused += 1;
        }
    }
    assert_eq!(refused, 8, "anonymous forwarded reads past their share");
    let started = Instant::now();
    let mut root = get_from(
        [127, 0, 0, 3],
        dc2.http_addr,
        &format!("/v1/catalog/services?dc=dc1&index={index}&wait=3s"),
        Some(ROOT),
    )
    .await;
    assert_eq!(
        status_within(&mut root, Duration::from_secs(15)).await,
        Some(200)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    drop(dc1);
}

/// Requests forwarded to another datacenter share one Raft-port connection
/// per remote server (a channel): 40 blocking `?dc=dc1` reads parked from
/// dc2 at once, against a dc1 taking at most 4 Raft connections per IP,
/// are each answered by the write that wakes them, and dc1 closes none of
/// its connections to make room. On the main before this (a connection
/// per forwarded request, as the issue found with 200 of them), dc1 closed
/// all but 4 of them and their callers were answered 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_reads_share_one_connection_per_remote_server() {
    let (dc1, dc2) = tokio::task::spawn_blocking(|| {
        let dc2 = Server::builder()
            .node("b0")
            .bootstrap_expect(1)
            .datacenter("dc2")
            .primary("dc1")
            .start();
        let join = dc2.raft_addr.to_string();
        let dc1 = Server::builder()
            .node("a0")
            .bootstrap_expect(1)
            .datacenter("dc1")
            .join_wan(&join)
            .arg("--raft-max-conns")
            .arg("16")
            .start();
        (dc1, dc2)
    })
    .await
    .unwrap();
    let c = client();
    let index = eventually(Duration::from_secs(30), "dc1 through dc2", || async {
        let r = c.get(dc2.at("/v1/kv/shared?dc=dc1")).send().await.ok()?;
        (r.status() == 404).then(|| consul_index(&r))
    })
    .await;
    let path = format!("/v1/kv/shared?dc=dc1&index={index}&wait=30s");
    let mut parked = Vec::new();
    for i in 0..40u8 {
        // From several client IPs: one IP's share of forwarded blocking
        // reads is an eighth of the places.
        parked.push(get_from([127, 0, 0, 2 + i % 4], dc2.http_addr, &path, None).await);
    }
    wait_parked(&c, &dc1, 40).await;
    let refused = || async {
        let body = send_text(c.get(dc1.at(common::METRICS))).await;
        common::metric_in(&body, "cairn_raft_conns_refused_total")
    };
    let refused_before = refused().await;
    let r = c
        .put(dc1.at("/v1/kv/shared"))
        .body("woken")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for (i, s) in parked.iter_mut().enumerate() {
        assert_eq!(
            status_within(s, Duration::from_secs(15)).await,
            Some(200),
            "forwarded read {i}"
        );
    }
    assert_eq!(
        refused().await,
        refused_before,
        "dc1 closed Raft connections to make room"
    );
    drop(dc2);
}

/// A write the caller may not make is refused before its body is read
/// (the permission is the key's, not the value's): an anonymous PUT that
/// declares 400 KB and sends none of it is answered 403 at once, and the
/// key is not written. On the main before this, the server waited for the
/// whole body first (until the slow-body cut, seconds later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_write_is_refused_before_its_body_is_read() {
    use common::acl::{ROOT, acl_started};
    use tokio::io::AsyncWriteExt;
    let s = tokio::task::spawn_blocking(|| {
        acl_started(Server::builder().node("a0").bootstrap_expect(1), "deny")
    })
    .await
    .unwrap();
    let mut conn = tokio::net::TcpStream::connect(s.http_addr).await.unwrap();
    conn.write_all(
        b"PUT /v1/kv/secret HTTP/1.1\r\nHost: x\r\nContent-Length: 400000\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(
        status_within(&mut conn, Duration::from_secs(2)).await,
        Some(403)
    );
    let r = client()
        .get(s.at("/v1/kv/secret"))
        .header("X-Consul-Token", ROOT)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
