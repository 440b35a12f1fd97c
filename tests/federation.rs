//! WAN federation with real processes on loopback: dc1 (the primary, three
//! servers) and dc2 (one server) joined with `--join-wan`, then `?dc=`
//! reads and writes, blocking reads, DNS and `members -wan` across them,
//! a secondary that goes away and comes back, and ACLs judged by the
//! datacenter that answers.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::acl::{ROOT, token_with_rules, with};
use common::{Server, cli, eventually, request_with};
use hickory_proto::rr::RecordType;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// The datacenters a server lists.
fn datacenters(s: &Server) -> Vec<String> {
    let v = s.get_json("/v1/catalog/datacenters");
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

/// Waits until `s` lists exactly `want` (in that order).
fn wait_datacenters(s: &Server, want: &[&str]) {
    eventually(WAIT, &format!("{} to list {want:?}", s.name()), || {
        (datacenters(s) == want).then_some(())
    });
}

/// One A query over UDP to `dns`: the response code and the addresses.
fn dns_a(dns: SocketAddr, name: &str) -> (String, Vec<String>) {
    let (code, records) = common::dns::ask(dns, name, RecordType::A);
    (format!("{code:?}"), common::dns::addresses(&records))
}

fn register(s: &Server, node: &str, addr: &str, service: &str, tags: &[&str]) {
    let body = serde_json::json!({
        "Node": node, "Address": addr,
        "Service": {"Service": service, "Port": 80, "Tags": tags},
    });
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
}

/// The rows of `cairn members -wan` against `s`, split on whitespace.
fn members_wan(s: &Server) -> Vec<Vec<String>> {
    let out = cli(&s.http_addr.to_string(), &["members", "-wan"]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// dc2 (one durable server, b0, in `dir`) and dc1 (three servers whose
/// `--join-wan` names b0), each of dc1's with a leader.
fn federated(dir: &std::path::Path) -> (Server, Vec<Server>) {
    let dc2 = Server::durable("b0", dir.join("b0"))
        .datacenter("dc2")
        .primary("dc1")
        .start();
    let join = dc2.raft_addr.to_string();
    let dc1 = common::cluster(3, &["--datacenter", "dc1", "--join-wan", &join]);
    for s in &dc1 {
        s.wait_for_leader(WAIT);
    }
    (dc2, dc1)
}

/// Two datacenters find each other through one `--join-wan` (given to
/// dc1's servers only: dc2 learns of dc1 from their greetings), and every
/// `?dc=` endpoint reaches the other datacenter as if asked there.
#[test]
fn two_datacenters_answer_for_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut dc2, dc1) = federated(tmp.path());
    let join = dc2.raft_addr.to_string();
    let a = &dc1[1];

    // Both list both, their own first.
    wait_datacenters(a, &["dc1", "dc2"]);
    wait_datacenters(&dc2, &["dc2", "dc1"]);
    let out = cli(&a.http_addr.to_string(), &["catalog", "datacenters"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "dc1\ndc2\n",
        "{out:?}"
    );

    // A KV write with ?dc=dc2 from a dc1 server lands in dc2 only.
    let r = a.put("/v1/kv/fed/key?dc=dc2", "in-dc2");
    assert_eq!((r.status, r.body.trim()), (200, "true"), "{}", r.body);
    let local = dc2.get("/v1/kv/fed/key?raw");
    assert_eq!((local.status, local.body.as_str()), (200, "in-dc2"));
    assert_eq!(a.get("/v1/kv/fed/key").status, 404);
    // Read back through dc1, from every dc1 server (followers included).
    for s in &dc1 {
        let r = s.get("/v1/kv/fed/key?dc=dc2&raw");
        assert_eq!((r.status, r.body.as_str()), (200, "in-dc2"), "{}", s.name());
    }
    // ?dc= equal to the local datacenter is local.
    assert_eq!(a.get("/v1/kv/fed/key?dc=dc1").status, 404);

    // Catalog and health of dc2, read from dc1.
    register(&dc2, "web-node", "10.2.0.1", "web", &["v1"]);
    let services = a.get_json("/v1/catalog/services?dc=dc2");
    assert!(services.get("web").is_some(), "{services}");
    assert!(a.get_json("/v1/catalog/services").get("web").is_none());
    let health = a.get_json("/v1/health/service/web?dc=dc2");
    assert_eq!(health[0]["Node"]["Address"], "10.2.0.1", "{health}");
    assert_eq!(health[0]["Node"]["Datacenter"], "dc2", "{health}");
    // Usage: this datacenter's, and with ?global each one's as it counts.
    let usage = a.get_json("/v1/operator/usage");
    assert!(usage["Usage"].get("dc2").is_none(), "{usage}");
    let global = a.get_json("/v1/operator/usage?global");
    assert_eq!(global["Usage"]["dc2"]["Nodes"], 2, "{global}");
    assert_eq!(global["Usage"]["dc1"]["Nodes"], 3, "{global}");

    // A blocking read of dc2 through dc1 is woken by a write in dc2.
    let index = a.get("/v1/kv/fed/key?dc=dc2").index();
    let parked = dc2.parked();
    let addr = a.http_addr;
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let path = format!("/v1/kv/fed/key?dc=dc2&index={index}&wait=20s&raw");
        let r = common::request(addr, "GET", &path, None);
        (r, started.elapsed())
    });
    dc2.wait_parked(parked + 1);
    assert_eq!(dc2.put("/v1/kv/fed/key", "woken").status, 200);
    let (r, took) = waiter.join().unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "woken"));
    assert!(r.index() > index);
    assert!(took < Duration::from_secs(15), "not woken: {took:?}");

    // An unknown datacenter: Consul's 500 and words, nothing written.
    let r = a.put("/v1/kv/fed/nope?dc=nope", "x");
    assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
    let r = a.get("/v1/catalog/services?dc=nope");
    assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
    assert_eq!(a.get("/v1/kv/fed/nope").status, 404);

    // Too large for the other datacenter: 413 here, nothing written there.
    let big = "x".repeat(5 << 20);
    let r = a.put("/v1/kv/fed/big?dc=dc2", &big);
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(dc2.get("/v1/kv/fed/big").status, 404);

    // DNS for dc2 through a dc1 server's DNS port; dc1's own names stay
    // its own, an unknown datacenter's are NXDOMAIN.
    let (code, ips) = dns_a(a.dns_addr, "web.service.dc2.consul.");
    assert_eq!(
        (code.as_str(), ips),
        ("NoError", vec!["10.2.0.1".to_string()])
    );
    let (_, ips) = dns_a(a.dns_addr, "v1.web.service.dc2.consul.");
    assert_eq!(ips, ["10.2.0.1"]);
    let (code, ips) = dns_a(a.dns_addr, "v2.web.service.dc2.consul.");
    assert_eq!((code.as_str(), ips.len()), ("NXDomain", 0));
    let (_, ips) = dns_a(a.dns_addr, "web-node.node.dc2.consul.");
    assert_eq!(ips, ["10.2.0.1"]);
    let (code, _) = dns_a(a.dns_addr, "web.service.consul.");
    assert_eq!(code, "NXDomain");
    let (code, _) = dns_a(a.dns_addr, "web.service.dc9.consul.");
    assert_eq!(code, "NXDomain");

    // members -wan: every server of both datacenters, alive.
    let rows = eventually(WAIT, "four alive WAN members", || {
        let rows = members_wan(a);
        let alive = rows
            .iter()
            .filter(|r| r.get(2).map(String::as_str) == Some("alive"));
        (alive.count() == 4).then_some(rows)
    });
    assert_eq!(
        rows[0][..7],
        [
            "Node", "Address", "Status", "Type", "Build", "Protocol", "DC"
        ]
    );
    let names: Vec<&str> = rows[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(names, ["b0.dc2", "s0.dc1", "s1.dc1", "s2.dc1"]);
    assert!(rows[1..].iter().all(|r| r[3] == "server"));
    let b0 = &rows[1];
    assert_eq!((b0[1].as_str(), b0[6].as_str()), (join.as_str(), "dc2"));

    // The primary's Raft state holds both datacenters' federation states,
    // on every dc1 server.
    for s in &dc1 {
        eventually(WAIT, "federation states on every primary server", || {
            let states = s.get_json("/v1/internal/federation-states?stale");
            let mut dcs: Vec<String> = states
                .as_array()?
                .iter()
                .map(|f| f["Datacenter"].as_str().unwrap_or("").to_string())
                .collect();
            dcs.sort();
            (dcs == ["dc1", "dc2"]).then_some(())
        });
    }

    // dc2 goes away: its member fails, a request for it is refused (500),
    // and the datacenter stays known.
    dc2.stop(Duration::from_secs(10));
    eventually(WAIT, "b0.dc2 failed", || {
        members_wan(a)
            .iter()
            .any(|r| r[0] == "b0.dc2" && r[2] == "failed")
            .then_some(())
    });
    let r = a.get("/v1/kv/fed/key?dc=dc2");
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(datacenters(a), ["dc1", "dc2"]);

    // It comes back (no --join-wan of its own to dc1): found again.
    dc2.restart();
    dc2.wait_for_leader(WAIT);
    eventually(WAIT, "dc2 answering through dc1 again", || {
        let r = a.get("/v1/kv/fed/key?dc=dc2&raw");
        (r.status == 200 && r.body == "woken").then_some(())
    });
    eventually(WAIT, "b0.dc2 alive again", || {
        members_wan(a)
            .iter()
            .any(|r| r[0] == "b0.dc2" && r[2] == "alive")
            .then_some(())
    });
    wait_datacenters(&dc2, &["dc2", "dc1"]);
}

/// With ACLs on (default deny) in both datacenters, a request sent with
/// `?dc=dc2` is judged by dc2's ACLs with the caller's token: a local token
/// made in dc2 works from dc1 (where it does not exist), anonymous gets
/// what anonymous gets in dc2.
#[test]
fn the_other_datacenter_judges_the_token() {
    let dc2 = common::acl::acl_started(
        Server::builder()
            .node("b0")
            .bootstrap_expect(1)
            .datacenter("dc2")
            .primary("dc1"),
        "deny",
    );
    let join = dc2.raft_addr.to_string();
    let dc1 = common::acl::acl_started(
        Server::builder()
            .node("a0")
            .bootstrap_expect(1)
            .datacenter("dc1")
            .join_wan(&join),
        "deny",
    );
    wait_datacenters(&dc1, &["dc1", "dc2"]);
    // A policy written in dc2 is made in the primary (dc1) and replicated
    // back; a token marked Local stays dc2's own.
    let policy = serde_json::json!({
        "Name": "reader", "Rules": r#"key_prefix "app/" { policy = "write" }"#,
    });
    common::acl::as_root(dc2.http_addr, "PUT", "/v1/acl/policy", &policy);
    let token = r#"{"Local": true, "Policies": [{"Name": "reader"}]}"#;
    let secret = eventually(
        WAIT,
        "a local token in dc2 with the replicated policy",
        || {
            let r = with(dc2.http_addr, "PUT", "/v1/acl/token", Some(token), ROOT);
            (r.status == 200).then(|| r.json()["SecretID"].as_str().unwrap().to_string())
        },
    );
    // The token is dc2's: unknown in dc1.
    let r = with(dc1.http_addr, "GET", "/v1/kv/app/x", None, &secret);
    assert_eq!((r.status, r.body.as_str()), (403, "ACL not found"));

    let r = with(
        dc1.http_addr,
        "PUT",
        "/v1/kv/app/x?dc=dc2",
        Some("v"),
        &secret,
    );
    assert_eq!((r.status, r.body.trim()), (200, "true"), "{}", r.body);
    let r = with(
        dc1.http_addr,
        "GET",
        "/v1/kv/app/x?dc=dc2&raw",
        None,
        &secret,
    );
    assert_eq!((r.status, r.body.as_str()), (200, "v"));
    // The token as a bearer header travels too.
    let bearer = format!("Bearer {secret}");
    let r = request_with(
        dc1.http_addr,
        "GET",
        "/v1/kv/app/x?dc=dc2&raw",
        None,
        &[("Authorization", bearer.as_str())],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // One permission short: outside its prefix.
    let r = with(
        dc1.http_addr,
        "PUT",
        "/v1/kv/other?dc=dc2",
        Some("v"),
        &secret,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // Anonymous: denied in dc2 as it would be there, nothing written.
    let r = dc1.put("/v1/kv/app/y?dc=dc2", "v");
    assert_eq!(r.status, 403, "{}", r.body);
    let direct = dc2.put("/v1/kv/app/y", "v");
    assert_eq!(direct.status, 403);
    let r = with(dc2.http_addr, "GET", "/v1/kv/app/y", None, ROOT);
    assert_eq!(r.status, 404);
    // A list is filtered by dc2's ACLs as there.
    let r = dc1.get("/v1/catalog/services?dc=dc2");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("X-Consul-Results-Filtered-By-ACLs"),
        dc2.get("/v1/catalog/services")
            .header("X-Consul-Results-Filtered-By-ACLs")
    );
    let v: Value = r.json();
    assert_eq!(v, serde_json::json!({}));
    // The federation states need operator:read: anonymous and a token with
    // operator none are refused, one with operator:read reads them.
    let path = "/v1/internal/federation-states";
    assert_eq!(dc1.get(path).status, 403);
    let (_, short) = token_with_rules(
        dc1.http_addr,
        "op-none",
        r#"key_prefix "" { policy = "read" }"#,
    );
    assert_eq!(with(dc1.http_addr, "GET", path, None, &short).status, 403);
    let (_, reader) = token_with_rules(dc1.http_addr, "op-read", r#"operator = "read""#);
    assert_eq!(with(dc1.http_addr, "GET", path, None, &reader).status, 200);
    // One datacenter's state: the same permission, Consul's shape (the
    // state under `State` beside the query meta), 404 for one unknown and
    // Consul's 400 for none named.
    let one = "/v1/internal/federation-state/dc2";
    assert_eq!(dc1.get(one).status, 403);
    assert_eq!(with(dc1.http_addr, "GET", one, None, &short).status, 403);
    // Written by the primary's leader once it heard from dc2.
    let (r, v) = eventually(WAIT, "dc2's federation state", || {
        let r = with(dc1.http_addr, "GET", one, None, &reader);
        let v: Value = (r.status == 200).then(|| r.json())?;
        Some((r, v))
    });
    assert_eq!(v["State"]["Datacenter"], "dc2", "{v}");
    assert_eq!(
        v["Index"].as_u64(),
        r.header("X-Consul-Index").and_then(|i| i.parse().ok())
    );
    assert_eq!(v["KnownLeader"], true);
    let r = with(
        dc1.http_addr,
        "GET",
        "/v1/internal/federation-state/dc9",
        None,
        &reader,
    );
    assert_eq!((r.status, r.body.as_str()), (404, ""));
    let r = with(
        dc1.http_addr,
        "GET",
        "/v1/internal/federation-state/",
        None,
        &reader,
    );
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Missing datacenter name")
    );
    // Forgetting a datacenter needs operator:write: anonymous and
    // operator:read are refused, and dc2 stays known.
    let forget = "/v1/agent/force-leave/b0.dc2?wan";
    assert_eq!(dc1.put(forget, "").status, 403);
    let r = with(dc1.http_addr, "PUT", forget, None, &reader);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(datacenters_as(&dc1, ROOT), ["dc1", "dc2"]);
}

/// The datacenters a server lists to `token`.
fn datacenters_as(s: &Server, token: &str) -> Vec<String> {
    let r = with(s.http_addr, "GET", "/v1/catalog/datacenters", None, token);
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_value(r.json()).unwrap()
}

/// Federation goes only where the transport's authentication lets it:
/// with `--encrypt`, a datacenter holding the key federates, one with
/// another key (or with another primary) is refused and never listed, and
/// `?dc=` to it has no path.
#[test]
fn only_an_authenticated_datacenter_federates() {
    const KEY: &str = "aOuo8+rKl8kUGFS+IYrx/P+aS8tdtDB18tZ4pubeBTg=";
    const OTHER: &str = "lUNH4zUhopAQ/E5KlpI7dIKNl9MeFQUKGnZ3SLyojis=";
    let server = |node: &str, dc: &str, key: &str| {
        Server::builder()
            .node(node)
            .bootstrap_expect(1)
            .datacenter(dc)
            .primary("dc1")
            .arg("--encrypt")
            .arg(key)
    };
    let dc1 = server("a0", "dc1", KEY).start();
    let join = dc1.raft_addr.to_string();
    let dc2 = server("b0", "dc2", KEY).join_wan(&join).start();
    let refused = dc1.metric("cairn_raft_frames_refused_total");
    let stranger = server("c0", "dc3", OTHER).join_wan(&join).start();
    // Another primary, with the right key: its greetings are refused too.
    let rogue = Server::builder()
        .node("d0")
        .bootstrap_expect(1)
        .datacenter("dc4")
        .arg("--encrypt")
        .arg(KEY)
        .join_wan(&join)
        .start();
    wait_datacenters(&dc1, &["dc1", "dc2"]);
    wait_datacenters(&dc2, &["dc2", "dc1"]);
    // The stranger's handshakes were refused at least twice (two rounds),
    // and the rogue primary's greetings too (said in its log).
    eventually(WAIT, "the stranger's handshakes refused", || {
        (dc1.metric("cairn_raft_frames_refused_total") >= refused + 2.0).then_some(())
    });
    eventually(WAIT, "the rogue primary refused", || {
        rogue
            .log()
            .contains("primary datacenter mismatch")
            .then_some(())
    });
    assert_eq!(datacenters(&dc1), ["dc1", "dc2"]);
    assert_eq!(datacenters(&stranger), ["dc3"]);
    assert_eq!(datacenters(&rogue), ["dc4"]);
    for dc in ["dc3", "dc4"] {
        let r = dc1.get(&format!("/v1/kv/x?dc={dc}"));
        assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
    }
    assert_eq!(dc1.get("/v1/kv/x?dc=dc2").status, 404);
}

/// Consul's configuration keys do the same as the flags: a secondary
/// started from a file with `primary_datacenter` and `retry_join_wan`
/// (a host without a port: the server port 8300 would be meant, so the
/// port is given here) federates.
#[test]
fn configuration_files_join_the_wan() {
    let dc1 = Server::builder()
        .node("a0")
        .bootstrap_expect(1)
        .datacenter("dc1")
        .start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.hcl");
    std::fs::write(
        &file,
        format!(
            "datacenter = \"dc2\"\nprimary_datacenter = \"dc1\"\nretry_join_wan = [\"{}\"]\nencrypt = \"{}\"\n",
            dc1.raft_addr,
            common::FEDERATION_KEY
        ),
    )
    .unwrap();
    let dc2 = Server::builder()
        .node("b0")
        .bootstrap_expect(1)
        .arg("--config-file")
        .arg(file.to_str().unwrap())
        .start();
    wait_datacenters(&dc2, &["dc2", "dc1"]);
    wait_datacenters(&dc1, &["dc1", "dc2"]);
    assert!(!dc2.log().contains("retry_join_wan"), "{}", dc2.log());
}

/// A datacenter gone for good is forgotten on the operator's word:
/// `force-leave -wan b0.dc2`, asked of one server, makes every server of
/// dc1 forget dc2 (`catalog datacenters`, `members -wan`) and the primary
/// delete its federation state, and it is not learned back from the
/// state. An unknown member is 404. On the main before this, dc2 stayed
/// listed for good (a fake datacenter too).
#[test]
fn force_leave_wan_forgets_a_datacenter_on_every_server() {
    let tmp = tempfile::tempdir().unwrap();
    let (dc2, dc1) = federated(tmp.path());
    for s in &dc1 {
        wait_datacenters(s, &["dc1", "dc2"]);
    }
    let states = |s: &Server| -> Vec<String> {
        let v = s.get_json("/v1/internal/federation-states");
        let mut dcs: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["Datacenter"].as_str().unwrap().to_string())
            .collect();
        dcs.sort();
        dcs
    };
    eventually(WAIT, "dc2's federation state in dc1", || {
        (states(&dc1[0]) == ["dc1", "dc2"]).then_some(())
    });
    drop(dc2);

    let asked = &dc1[2];
    let unknown = cli(
        &asked.http_addr.to_string(),
        &["force-leave", "-wan", "nobody.dc2"],
    );
    assert!(!unknown.status.success(), "{unknown:?}");
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("No node found"),
        "{unknown:?}"
    );
    let out = cli(
        &asked.http_addr.to_string(),
        &["force-leave", "-wan", "b0.dc2"],
    );
    assert!(out.status.success(), "{out:?}");
    for s in &dc1 {
        assert_eq!(datacenters(s), ["dc1"], "{}", s.name());
        assert!(
            members_wan(s)
                .iter()
                .all(|row| !row.concat().contains("dc2")),
            "{}: {:?}",
            s.name(),
            members_wan(s)
        );
    }
    for s in &dc1 {
        eventually(WAIT, "dc2's state deleted", || {
            (states(s) == ["dc1"]).then_some(())
        });
    }
    // Rounds later (states re-read each round), still forgotten.
    let rounds = Instant::now() + Duration::from_secs(5);
    while Instant::now() < rounds {
        for s in &dc1 {
            assert_eq!(datacenters(s), ["dc1"], "{}", s.name());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
