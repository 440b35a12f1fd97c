//! The DNS interface with real clients: `dig` (Debian's dnsutils) for
//! every record shape, on a server and through a client agent, and HAProxy
//! (2.6) following `_web._tcp.service.consul` with a `server-template`,
//! routing real HTTP requests to the instances cairn says are healthy.
//!
//! A test whose client is missing is skipped with a reason when the `CI`
//! variable is unset; under CI it fails.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{Server, connect_from, eventually, free_port};

/// Whether `bin` is on the PATH; missing under CI is a failure.
fn have(bin: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{bin} is missing: CI must install Debian's {package}"
        );
        eprintln!("skipped: {bin} not found (Debian package {package})");
    }
    found
}

/// One dig answer, parsed from its `+comments` output.
#[derive(Debug, Default)]
struct Dig {
    status: String,
    flags: Vec<String>,
    /// (name, ttl, type, data)
    answer: Vec<(String, u32, String, String)>,
    authority: Vec<(String, u32, String, String)>,
    additional: Vec<(String, u32, String, String)>,
}

impl Dig {
    fn data(&self) -> BTreeSet<String> {
        self.answer.iter().map(|r| r.3.clone()).collect()
    }
    /// SRV answers as (port, target).
    fn srv(&self) -> BTreeSet<(u16, String)> {
        self.answer
            .iter()
            .filter(|r| r.2 == "SRV")
            .map(|r| {
                let f: Vec<&str> = r.3.split_whitespace().collect();
                (f[2].parse().unwrap(), f[3].to_string())
            })
            .collect()
    }
    fn extra(&self) -> BTreeSet<(String, String)> {
        self.additional
            .iter()
            .map(|r| (r.0.clone(), r.3.clone()))
            .collect()
    }
}

fn dig(addr: SocketAddr, args: &[&str]) -> Dig {
    let out = Command::new("dig")
        .arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string()])
        .args(["+time=3", "+tries=2", "+noall", "+comments", "+answer"])
        .args(["+authority", "+additional", "+nocookie"])
        .args(args)
        .output()
        .expect("run dig");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "dig {args:?} failed: {text}");
    let mut d = Dig::default();
    let mut section = "";
    for line in text.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            d.status = rest.split(',').next().unwrap_or("").to_string();
        } else if let Some(rest) = line.strip_prefix(";; flags: ") {
            d.flags = rest
                .split(';')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .map(String::from)
                .collect();
        } else if line.starts_with(";; ANSWER") {
            section = "answer";
        } else if line.starts_with(";; AUTHORITY") {
            section = "authority";
        } else if line.starts_with(";; ADDITIONAL") {
            section = "additional";
        } else if line.is_empty() || line.starts_with(';') {
            continue;
        } else {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 5 {
                continue;
            }
            let rec = (
                f[0].to_string(),
                f[1].parse().unwrap_or(u32::MAX),
                f[3].to_string(),
                f[4..].join(" "),
            );
            match section {
                "answer" => d.answer.push(rec),
                "authority" => d.authority.push(rec),
                "additional" => d.additional.push(rec),
                _ => {}
            }
        }
    }
    assert!(!d.status.is_empty(), "no answer from dig {args:?}: {text}");
    d
}

/// Registers `service` on `node` (at `addr`) with one check in `status`.
fn register(s: &Server, node: &str, addr: &str, service: serde_json::Value, status: &str) {
    let id = service["ID"]
        .as_str()
        .or(service["Service"].as_str())
        .unwrap()
        .to_string();
    let body = serde_json::json!({
        "Node": node, "Address": addr, "Service": service,
        "Check": {"CheckID": format!("{id}-check"), "Name": "check", "Status": status,
                  "ServiceID": id},
    });
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_record_shape_through_dig() {
    if !have("dig", "dnsutils") {
        return;
    }
    let s = Server::dev();
    let d = s.dns_addr;
    let web = |port: u16, tags: &[&str], addr: &str| {
        serde_json::json!({"Service": "web", "ID": format!("web-{port}"), "Port": port,
                           "Tags": tags, "Address": addr})
    };
    register(&s, "n1", "10.0.0.1", web(80, &["v1"], ""), "passing");
    register(
        &s,
        "n2",
        "10.0.0.2",
        web(81, &["v2"], "10.1.0.2"),
        "passing",
    );
    register(&s, "n3", "10.0.0.3", web(82, &["v1"], ""), "critical");
    register(&s, "n4", "10.0.0.4", web(83, &["v2"], ""), "warning");

    // A: healthy instances (warning counts), a service's own address
    // before its node's.
    for name in ["web.service.consul", "WEB.service.dc1.consul."] {
        let a = dig(d, &[name, "A"]);
        assert_eq!(a.status, "NOERROR");
        assert!(a.flags.contains(&"aa".to_string()), "{:?}", a.flags);
        assert!(!a.flags.contains(&"ra".to_string()), "{:?}", a.flags);
        assert_eq!(
            a.data(),
            set(&["10.0.0.1", "10.1.0.2", "10.0.0.4"]),
            "{name}"
        );
        assert!(a.answer.iter().all(|r| r.1 == 0), "TTL 0 by default");
    }
    // Tags, both forms.
    assert_eq!(
        dig(d, &["v1.web.service.consul"]).data(),
        set(&["10.0.0.1"])
    );
    let srv = dig(d, &["_web._v2.service.consul", "SRV"]);
    assert_eq!(
        srv.srv(),
        [
            (81, "0a010002.addr.dc1.consul.".to_string()),
            (83, "n4.node.dc1.consul.".to_string())
        ]
        .into()
    );
    // RFC 2782 with `_tcp`: every healthy instance; each target's address
    // in the additional section.
    let srv = dig(d, &["_web._tcp.service.consul", "SRV"]);
    assert_eq!(srv.status, "NOERROR");
    assert_eq!(
        srv.srv(),
        [
            (80, "n1.node.dc1.consul.".to_string()),
            (81, "0a010002.addr.dc1.consul.".to_string()),
            (83, "n4.node.dc1.consul.".to_string()),
        ]
        .into()
    );
    assert_eq!(
        srv.extra(),
        [
            ("n1.node.dc1.consul.".to_string(), "10.0.0.1".to_string()),
            (
                "0a010002.addr.dc1.consul.".to_string(),
                "10.1.0.2".to_string()
            ),
            ("n4.node.dc1.consul.".to_string(), "10.0.0.4".to_string()),
        ]
        .into()
    );
    // The targets resolve on their own too.
    assert_eq!(dig(d, &["n1.node.dc1.consul"]).data(), set(&["10.0.0.1"]));
    assert_eq!(dig(d, &["n3.node.consul"]).data(), set(&["10.0.0.3"]));
    assert_eq!(
        dig(d, &["0a010002.addr.dc1.consul"]).data(),
        set(&["10.1.0.2"])
    );

    // Connect: the sidecar's port, on its node.
    let proxy = serde_json::json!({"Kind": "connect-proxy", "Service": "web-sidecar-proxy",
        "ID": "web-proxy", "Port": 21000,
        "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web-80"}});
    register(&s, "n1", "10.0.0.1", proxy, "passing");
    let c = dig(d, &["web.connect.consul", "SRV"]);
    assert_eq!(c.srv(), [(21000, "n1.node.dc1.consul.".to_string())].into());
    assert_eq!(dig(d, &["web.connect.consul"]).data(), set(&["10.0.0.1"]));

    // web's virtual IP (it has a sidecar), as its chain carries it.
    let chain = s.get_json("/v1/discovery-chain/web");
    let vip = chain["Chain"]["AutoVirtualIPs"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(dig(d, &["web.virtual.consul"]).data(), set(&[&vip]));

    // Unknown names: NXDOMAIN with the SOA.
    for name in [
        "nope.service.consul",
        "nope.node.consul",
        "web.service.dc9.consul",
        "web.ingress.consul",
        "what.consul",
    ] {
        let n = dig(d, &[name]);
        assert_eq!(n.status, "NXDOMAIN", "{name}");
        assert_eq!(n.authority.len(), 1, "{name}: {n:?}");
        assert_eq!(n.authority[0].2, "SOA");
        assert_eq!(n.authority[0].0, "consul.");
    }
    // A name outside the domain: no recursion.
    let r = dig(d, &["example.com", "A"]);
    assert_eq!(r.status, "REFUSED");
    assert!(r.answer.is_empty());

    // The agent API reports the port.
    let me = s.get_json("/v1/agent/self");
    assert_eq!(me["DebugConfig"]["DNSPort"], d.port());
}

#[test]
fn maintenance_and_critical_checks_take_instances_out() {
    if !have("dig", "dnsutils") {
        return;
    }
    let s = Server::dev();
    let d = s.dns_addr;
    // Through the server's own agent, as `consul agent -dev` users do.
    let r = s.put(
        "/v1/agent/service/register",
        r#"{"Name": "db", "Port": 5432, "Check": {"CheckID": "db-ttl", "TTL": "60s"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // A TTL check starts critical.
    assert_eq!(dig(d, &["db.service.consul"]).status, "NXDOMAIN");
    assert_eq!(s.put("/v1/agent/check/pass/db-ttl", "").status, 200);
    eventually(Duration::from_secs(10), "db in DNS", || {
        (dig(d, &["db.service.consul"]).data() == set(&["127.0.0.1"])).then_some(())
    });
    let r = s.put("/v1/agent/service/maintenance/db?enable=true&reason=x", "");
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(Duration::from_secs(10), "db out in maintenance", || {
        (dig(d, &["db.service.consul"]).status == "NXDOMAIN").then_some(())
    });
    let r = s.put("/v1/agent/service/maintenance/db?enable=false", "");
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(Duration::from_secs(10), "db back", || {
        (dig(d, &["db.service.consul"]).status == "NOERROR").then_some(())
    });
    assert_eq!(s.put("/v1/agent/check/fail/db-ttl", "").status, 200);
    eventually(Duration::from_secs(10), "db out when critical", || {
        (dig(d, &["db.service.consul"]).status == "NXDOMAIN").then_some(())
    });
}

#[test]
fn only_passing_leaves_warning_out() {
    if !have("dig", "dnsutils") {
        return;
    }
    let s = Server::builder().dev().arg("--dns-only-passing").start();
    let web = |id: &str| serde_json::json!({"Service": "web", "ID": id, "Port": 80});
    register(&s, "n1", "10.0.0.1", web("a"), "passing");
    register(&s, "n2", "10.0.0.2", web("b"), "warning");
    assert_eq!(
        dig(s.dns_addr, &["web.service.consul"]).data(),
        set(&["10.0.0.1"])
    );
}

#[test]
fn udp_answers_are_truncated_and_tcp_answers_whole() {
    if !have("dig", "dnsutils") {
        return;
    }
    let s = Server::dev();
    for i in 0..60 {
        let svc = serde_json::json!({"Service": "big", "ID": "big", "Port": 80});
        register(
            &s,
            &format!("node-{i}"),
            &format!("10.2.0.{i}"),
            svc,
            "passing",
        );
    }
    // Plain UDP (512 bytes): cut, with TC; `+ignore` keeps dig from
    // retrying over TCP itself.
    let udp = dig(s.dns_addr, &["big.service.consul", "+ignore", "+noedns"]);
    assert!(udp.flags.contains(&"tc".to_string()), "{:?}", udp.flags);
    assert!(!udp.answer.is_empty() && udp.answer.len() < 60, "{udp:?}");
    // EDNS0 with room for all: whole, over UDP.
    let edns = dig(
        s.dns_addr,
        &["big.service.consul", "+ignore", "+bufsize=4096"],
    );
    assert!(!edns.flags.contains(&"tc".to_string()), "{:?}", edns.flags);
    assert_eq!(edns.answer.len(), 60);
    // TCP: whole.
    let tcp = dig(s.dns_addr, &["big.service.consul", "+tcp"]);
    assert!(!tcp.flags.contains(&"tc".to_string()), "{:?}", tcp.flags);
    assert_eq!(tcp.answer.len(), 60);
    // SRV over plain UDP: each target kept keeps its address.
    let srv = dig(
        s.dns_addr,
        &["_big._tcp.service.consul", "SRV", "+ignore", "+noedns"],
    );
    assert!(srv.flags.contains(&"tc".to_string()), "{:?}", srv.flags);
    assert_eq!(srv.answer.len(), srv.additional.len());
    // Random order: two TCP answers of 60 differ (1 in 60! that they match).
    let again = dig(s.dns_addr, &["big.service.consul", "+tcp"]);
    let order = |d: &Dig| d.answer.iter().map(|r| r.3.clone()).collect::<Vec<_>>();
    assert_ne!(order(&tcp), order(&again));
}

#[test]
fn a_client_agent_answers_from_the_servers() {
    if !have("dig", "dnsutils") {
        return;
    }
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    let d = a.dns_addr;
    let r = a.put(
        "/v1/agent/service/register",
        r#"{"Name": "api", "Port": 9000, "Tags": ["blue"],
            "Check": {"CheckID": "api-ttl", "TTL": "60s"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(a.put("/v1/agent/check/pass/api-ttl", "").status, 200);
    eventually(Duration::from_secs(15), "api in the agent's DNS", || {
        (dig(d, &["api.service.consul"]).data() == set(&["127.0.0.1"])).then_some(())
    });
    let srv = dig(d, &["_api._blue.service.consul", "SRV"]);
    assert_eq!(
        srv.srv(),
        [(9000, "a1.node.dc1.consul.".to_string())].into()
    );
    assert_eq!(
        srv.extra(),
        [("a1.node.dc1.consul.".to_string(), "127.0.0.1".to_string())].into()
    );
    assert_eq!(dig(d, &["a1.node.consul"]).data(), set(&["127.0.0.1"]));
    assert_eq!(dig(d, &["nope.node.consul"]).status, "NXDOMAIN");
    // A label no catalog name can hold is simply not found.
    assert_eq!(dig(d, &["a\\001b.service.consul"]).status, "NXDOMAIN");
    assert_eq!(dig(d, &["a\\001b.node.consul"]).status, "NXDOMAIN");
    assert_eq!(dig(d, &["example.com"]).status, "REFUSED");
    // Over TCP as well.
    assert_eq!(
        dig(d, &["api.service.consul", "+tcp"]).data(),
        set(&["127.0.0.1"])
    );
    assert_eq!(a.put("/v1/agent/check/fail/api-ttl", "").status, 200);
    eventually(Duration::from_secs(15), "api gone when critical", || {
        (dig(d, &["api.service.consul"]).status == "NXDOMAIN").then_some(())
    });
    assert_eq!(
        a.get_json("/v1/agent/self")["DebugConfig"]["DNSPort"],
        d.port()
    );
}

#[test]
fn hostile_packets_get_formerr_or_nothing_and_service_goes_on() {
    if !have("dig", "dnsutils") {
        return;
    }
    let s = Server::dev();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A header, then labels that run off the end.
    let mut junk = vec![0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0];
    junk.extend_from_slice(&[0x3f, b'x', b'y']);
    sock.send_to(&junk, s.dns_addr).unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = sock.recv_from(&mut buf).expect("a FORMERR answer");
    assert!(n >= 12);
    assert_eq!(&buf[..2], &[0xab, 0xcd], "the query's id");
    assert_eq!(buf[3] & 0x0f, 1, "FORMERR");
    // Too short for a header, and a response: no answer (nothing to send
    // it to, or a loop to avoid); both dropped quietly.
    sock.send_to(&[1, 2, 3], s.dns_addr).unwrap();
    let mut resp = junk.clone();
    resp[2] |= 0x80;
    sock.send_to(&resp, s.dns_addr).unwrap();
    // A TCP client that promises a message and sends half of it holds one
    // connection, not the server.
    let mut slow = std::net::TcpStream::connect(s.dns_addr).unwrap();
    slow.write_all(&[0x01, 0x00, 0xab]).unwrap();
    assert_eq!(dig(s.dns_addr, &["example.com", "+tcp"]).status, "REFUSED");
    assert_eq!(dig(s.dns_addr, &["example.com"]).status, "REFUSED");
    // ...and only for a while: the server closes it (within its 10 s).
    let started = Instant::now();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut one = [0u8; 1];
    match slow.read(&mut one) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the half-sent connection was not closed: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(s.is_running());
}

/// The connection past a cap is closed at once.
fn closed_at_once(mut extra: std::net::TcpStream) {
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut one = [0u8; 1];
    match extra.read(&mut one) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a connection past the cap was kept: {other:?}"),
    }
}

/// TCP connections are capped in all (dns::listen's TCP_CONNS, 512) and
/// per client IP (TCP_CONNS_PER_IP, 64), all held here by idle clients,
/// while UDP goes on; once they go, TCP answers again. (On the main before
/// the per-IP cap, one IP could hold all 512.)
#[test]
fn tcp_connections_are_capped_and_udp_goes_on() {
    if !have("dig", "dnsutils") {
        return;
    }
    let s = Server::dev();
    let mut held: Vec<_> = (0..64)
        .map(|_| connect_from([127, 0, 0, 10], s.dns_addr))
        .collect();
    closed_at_once(connect_from([127, 0, 0, 10], s.dns_addr));
    for ip in 11..18 {
        held.extend((0..64).map(|_| connect_from([127, 0, 0, ip], s.dns_addr)));
    }
    closed_at_once(connect_from([127, 0, 0, 18], s.dns_addr));
    assert_eq!(dig(s.dns_addr, &["example.com"]).status, "REFUSED");
    drop(held);
    eventually(Duration::from_secs(10), "TCP answers again", || {
        (dig(s.dns_addr, &["example.com", "+tcp"]).status == "REFUSED").then_some(())
    });
}

#[test]
fn a_dns_port_in_use_refuses_the_start() {
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("stderr");
    let mut child = KillOnDrop(
        Command::new(common::bin())
            .args(["server", "--dev"])
            .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--raft-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--dns-addr", &addr.to_string()])
            .args(["--grpc-addr", ""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let status = eventually(Duration::from_secs(30), "the server to refuse", || {
        child.0.try_wait().unwrap()
    });
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!("cannot listen on --dns-addr {addr}")),
        "{err}"
    );
}

// ------------------------------------------------------------ HAProxy

/// A tiny HTTP server on loopback answering every request with its name.
fn backend(name: &'static str) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
            });
        }
    });
    port
}

/// A child process killed when the test ends, however it ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn haproxy_follows_the_catalog_through_dns() {
    if !have("haproxy", "haproxy") {
        return;
    }
    let s = Server::dev();
    let web = |name: &str, port: u16| serde_json::json!({"Service": "web", "ID": format!("web-{name}"), "Port": port});
    let (a, b, c) = (backend("A"), backend("B"), backend("C"));
    register(&s, "node-a", "127.0.0.1", web("a", a), "passing");
    register(&s, "node-b", "127.0.0.1", web("b", b), "passing");

    let tmp = tempfile::tempdir().unwrap();
    let front: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let cfg = format!(
        "global\n  nbthread 1\n\
         defaults\n  mode http\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\n\
         resolvers cairn\n  nameserver cairn {dns}\n  accepted_payload_size 4096\n\
         \x20 resolve_retries 3\n  timeout resolve 200ms\n  timeout retry 200ms\n\
         \x20 hold valid 1s\n  hold obsolete 0s\n  hold nx 1s\n  hold other 1s\n\
         frontend fe\n  bind {front}\n  default_backend web\n\
         backend web\n  balance roundrobin\n\
         \x20 server-template web 5 _web._tcp.service.consul resolvers cairn \
         resolve-prefer ipv4 resolve-opts allow-dup-ip init-addr none\n",
        dns = s.dns_addr,
    );
    let path = tmp.path().join("haproxy.cfg");
    std::fs::write(&path, cfg).unwrap();
    let log = std::fs::File::create(tmp.path().join("haproxy.log")).unwrap();
    let mut proc = KillOnDrop(
        Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start haproxy"),
    );
    let pid = proc.0.id();
    let haproxy_log =
        || std::fs::read_to_string(tmp.path().join("haproxy.log")).unwrap_or_default();
    let get = || {
        common::try_request(front, "GET", "/", None)
            .ok()
            .filter(|r| r.status == 200)
            .map(|r| r.body)
    };
    // Requests reach both registered instances.
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen != set(&["A", "B"]) {
        if let Ok(Some(st)) = proc.0.try_wait() {
            panic!("haproxy exited with {st}: {}", haproxy_log());
        }
        assert!(
            Instant::now() < deadline,
            "haproxy never reached both A and B (saw {seen:?}): {}",
            haproxy_log()
        );
        if let Some(name) = get() {
            seen.insert(name);
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // B's check turns critical: haproxy stops sending to it.
    register(&s, "node-b", "127.0.0.1", web("b", b), "critical");
    eventually(
        Duration::from_secs(30),
        "haproxy to stop sending to B",
        || (0..10).all(|_| get().as_deref() == Some("A")).then_some(()),
    );
    for _ in 0..20 {
        assert_eq!(get().as_deref(), Some("A"), "B is critical");
    }
    // A new instance is picked up.
    register(&s, "node-c", "127.0.0.1", web("c", c), "passing");
    eventually(Duration::from_secs(30), "haproxy to send to C", || {
        (get().as_deref() == Some("C")).then_some(())
    });
    let mut names = BTreeSet::new();
    for _ in 0..20 {
        names.extend(get());
    }
    assert_eq!(names, set(&["A", "C"]));
    // All without a reload: the same process throughout.
    assert!(proc.0.try_wait().unwrap().is_none());
    assert_eq!(proc.0.id(), pid);
}

/// `<service>.virtual.consul` under ACLs (default deny), on a server and
/// through client agents: a caller without `service:read` on the service
/// (the anonymous token, or a token reading only another service) gets
/// the empty NOERROR of a service without a virtual IP, so nothing tells
/// the IP or that the service exists; a token with it gets the IP. A
/// name as long as a label may be is just not found.
#[test]
fn virtual_names_answer_only_who_may_read_the_service() {
    use common::acl::{ROOT, acl_started, as_root, token_with_rules, with};
    use hickory_proto::rr::RecordType;
    let q = |addr: SocketAddr, name: &str| {
        let (code, records) = common::dns::ask(addr, name, RecordType::A);
        (common::dns::status(code), common::dns::addresses(&records))
    };
    let s = acl_started(Server::builder().dev(), "deny");
    // A terminating gateway's link gives billing a virtual IP.
    as_root(
        s.http_addr,
        "PUT",
        "/v1/config",
        &serde_json::json!({"Kind": "terminating-gateway", "Name": "tg",
            "Services": [{"Name": "billing"}]}),
    );
    let chain = with(
        s.http_addr,
        "GET",
        "/v1/discovery-chain/billing",
        None,
        ROOT,
    )
    .json();
    let vip = chain["Chain"]["AutoVirtualIPs"][0]
        .as_str()
        .expect("billing's virtual IP")
        .to_string();
    let empty = ("NOERROR".to_string(), Vec::<String>::new());
    // The server answers with the anonymous token.
    assert_eq!(q(s.dns_addr, "billing.virtual.consul"), empty);
    let long = format!("{}.virtual.consul", "b".repeat(63));
    assert_eq!(q(s.dns_addr, &long), empty);

    let (_, short) = token_with_rules(
        s.http_addr,
        "other",
        "service \"other\" { policy = \"read\" }",
    );
    let (_, reader) = token_with_rules(
        s.http_addr,
        "billing",
        "service \"billing\" { policy = \"read\" }",
    );
    let agent = |node: &str, token: &str| {
        Agent::builder(node, &s.url)
            .arg("--acl-agent-token")
            .arg(ROOT)
            .arg("--acl-token")
            .arg(token)
            .start()
    };
    let mut one_short = agent("vip-agent-1", &short);
    let mut may_read = agent("vip-agent-2", &reader);
    assert_eq!(q(one_short.dns_addr, "billing.virtual.consul"), empty);
    assert_eq!(
        q(may_read.dns_addr, "billing.virtual.consul"),
        ("NOERROR".to_string(), vec![vip])
    );
    assert_eq!(q(may_read.dns_addr, "nope.virtual.consul"), empty);
    one_short.stop();
    may_read.stop();
}
