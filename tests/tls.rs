//! TLS against real processes: `cairn tls` writes a CA and certificates
//! (read back with Debian's `openssl`), a three-server cluster over mutual
//! TLS Raft that serves HTTPS only, a server of another CA and a plain TCP
//! client refused on the Raft port, HTTPS with and without client
//! certificates (`curl`), the CLI over HTTPS, and an agent talking HTTPS
//! to its server and running HTTPS checks.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::agent::Agent;
use common::pki::{Pki, cairn_tls};
use common::{Server, bin, eventually, free_port};

/// `curl -sS` with `args`: exit code, HTTP status (0 if none) and body.
fn curl(args: &[&str]) -> (i32, u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("curl (Debian package curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        out.status.code().unwrap_or(-1),
        code.trim().parse().unwrap_or(0),
        body.to_string(),
    )
}

/// A GET over HTTPS trusting `ca`: status and body.
fn https_get(ca: &Path, url: &str) -> (u16, String) {
    let (_, status, body) = curl(&["--cacert", &ca.display().to_string(), url]);
    (status, body)
}

fn https_put(ca: &Path, url: &str, body: &str) -> (u16, String) {
    let (_, status, body) = curl(&[
        "--cacert",
        &ca.display().to_string(),
        "-X",
        "PUT",
        "--data-binary",
        body,
        url,
    ]);
    (status, body)
}

fn with_flags(mut b: common::ServerBuilder, flags: &[String]) -> common::ServerBuilder {
    for f in flags {
        b = b.arg(f);
    }
    b
}

/// The TCP ports process `pid` listens on (from /proc: its socket
/// descriptors' inodes among the LISTEN sockets of /proc/net/tcp).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.display().to_string();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local address, state (0A: LISTEN), inode.
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                let port = f[1].rsplit_once(':').unwrap().1;
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports.sort();
    ports
}

#[test]
fn tls_commands_write_consul_named_files_with_its_sans() {
    let pki = Pki::new();
    assert!(pki.path("consul-agent-ca-key.pem").exists());
    let s0 = pki.cert(&["-server"]);
    let s1 = pki.cert(&["-server"]);
    let c0 = pki.cert(&["-client"]);
    assert!(s0.0.ends_with("dc1-server-consul-0.pem"), "{s0:?}");
    assert!(s0.1.ends_with("dc1-server-consul-0-key.pem"), "{s0:?}");
    assert!(s1.0.ends_with("dc1-server-consul-1.pem"), "{s1:?}");
    assert!(c0.0.ends_with("dc1-client-consul-0.pem"), "{c0:?}");
    let dc2 = cairn_tls(pki.dir.path(), &["cert", "create", "-server", "-dc", "dc2"]);
    assert!(dc2.contains("Saved dc2-server-consul-0.pem"), "{dc2}");

    let text = |p: &Path| {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(p)
            .output()
            .expect("openssl (Debian package openssl)");
        assert!(out.status.success(), "openssl on {p:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let server = text(&s0.0);
    assert!(
        server.contains("DNS:server.dc1.consul, DNS:localhost, IP Address:127.0.0.1"),
        "{server}"
    );
    assert!(server.contains("prime256v1"), "EC P-256: {server}");
    assert!(server.contains("TLS Web Server Authentication"), "{server}");
    assert!(server.contains("TLS Web Client Authentication"), "{server}");
    let client = text(&c0.0);
    assert!(
        client.contains("DNS:client.dc1.consul, DNS:localhost, IP Address:127.0.0.1"),
        "{client}"
    );
    let dc2_text = text(&pki.path("dc2-server-consul-0.pem"));
    assert!(dc2_text.contains("DNS:server.dc2.consul"), "{dc2_text}");
    let ca = text(&pki.ca());
    assert!(ca.contains("CA:TRUE"), "{ca}");
    // Signed by the CA, as openssl sees it.
    let verify = Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(pki.ca())
        .arg(&s0.0)
        .arg(&c0.0)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    // The key is private to its owner.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&s0.1).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "key mode {mode:o}");

    // A second CA in the same place is refused, the first left as it was.
    let before = std::fs::read(pki.ca()).unwrap();
    let again = Command::new(bin())
        .args(["tls", "ca", "create"])
        .current_dir(pki.dir.path())
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));
    assert_eq!(std::fs::read(pki.ca()).unwrap(), before);
}

/// Three servers over mutual-TLS Raft, HTTPS only: they form, a write sent
/// to a follower is forwarded to the leader over HTTPS and replicates; a
/// server with a certificate of another CA never joins, and a plain TCP
/// client writing frames to a Raft port is dropped before any decode.
#[test]
fn mutual_tls_cluster_forms_and_refuses_outsiders() {
    let pki = Pki::new();
    let ca = pki.ca();
    let raft: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let servers: Vec<Server> = (0..3)
        .map(|i| {
            let mut b = Server::builder()
                .node(&format!("s{i}"))
                .raft_port(raft[i])
                .bootstrap_expect(3)
                .https_only();
            for (j, r) in raft.iter().enumerate() {
                if j != i {
                    b = b.join(format!("127.0.0.1:{r}"));
                }
            }
            with_flags(b, &pki.flags(&pki.cert(&["-server"]))).start()
        })
        .collect();
    let leader = eventually(Duration::from_secs(30), "a leader on every server", || {
        let leaders: Vec<String> = servers
            .iter()
            .map(|s| https_get(&ca, &format!("{}/v1/status/leader", s.url)).1)
            .collect();
        (leaders.iter().all(|l| l == &leaders[0]) && leaders[0].len() > 2)
            .then(|| leaders[0].trim_matches('"').to_string())
    });
    let peers = |s: &Server| -> Vec<String> {
        let (status, body) = https_get(&ca, &format!("{}/v1/status/peers", s.url));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    assert_eq!(peers(&servers[0]).len(), 3);

    // A follower forwards the write to the leader, over HTTPS.
    let follower = servers
        .iter()
        .find(|s| s.raft_addr.to_string() != leader)
        .unwrap();
    let (status, body) = https_put(&ca, &format!("{}/v1/kv/tls/one", follower.url), "1");
    assert_eq!((status, body.trim()), (200, "true"));
    for s in &servers {
        eventually(Duration::from_secs(10), "the write on every server", || {
            let (st, body) = https_get(&ca, &format!("{}/v1/kv/tls/one?stale&raw", s.url));
            (st == 200 && body == "1").then_some(())
        });
    }

    // A server whose certificate another CA signed (trusting the cluster's
    // CA, which is no secret): its join is refused at the handshake by the
    // server it joins, again and again.
    let other = Pki::new();
    let refusals = |s: &Server| {
        s.log()
            .matches("raft connection refused: TLS handshake failed")
            .count()
    };
    let before = refusals(&servers[0]);
    let (ocert, okey) = other.cert(&["-server"]);
    let outsider = Server::builder()
        .node("intruder")
        .join(servers[0].raft_addr)
        .https_only()
        .arg("--tls-ca-file")
        .arg(&ca.display().to_string())
        .arg("--tls-cert-file")
        .arg(&ocert.display().to_string())
        .arg("--tls-key-file")
        .arg(&okey.display().to_string())
        .start();
    eventually(
        Duration::from_secs(20),
        "the outsider's join refused three times",
        || (refusals(&servers[0]) >= before + 3).then_some(()),
    );
    for s in &servers {
        assert_eq!(peers(s).len(), 3, "peers on {}", s.url);
        let (_, conf) = https_get(&ca, &format!("{}/v1/operator/raft/configuration", s.url));
        assert!(!conf.contains("intruder"), "{conf}");
    }
    let (_, no_leader) = https_get(&other.ca(), &format!("{}/v1/status/leader", outsider.url));
    assert_eq!(no_leader.trim(), "\"\"", "the outsider found no leader");
    assert!(outsider.is_running());

    // A plain TCP client writing a frame: closed without an answer, and the
    // frame never reached the decoder.
    let before = refusals(&servers[0]);
    let mut plain = TcpStream::connect(servers[0].raft_addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut frame = 16u32.to_be_bytes().to_vec();
    frame.extend_from_slice(&[1u8; 16]);
    plain.write_all(&frame).unwrap();
    let mut got = Vec::new();
    match plain.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the plain client was not dropped: {e}"),
    }
    // At most a TLS alert record (content type 21), never a frame.
    assert!(got.is_empty() || got[0] == 21, "answered {got:?}");
    eventually(Duration::from_secs(5), "the refusal logged", || {
        (refusals(&servers[0]) > before).then_some(())
    });
    assert!(!servers[0].log().contains("undecodable frame"));
    assert!(servers[0].is_running());
    let (status, _) = https_put(&ca, &format!("{}/v1/kv/tls/two", follower.url), "2");
    assert_eq!(status, 200, "the cluster still commits");
    assert_eq!(peers(&servers[0]).len(), 3);
}

/// HTTPS beside HTTP with `--tls-verify-incoming`: curl needs a client
/// certificate of the CA; the CLI talks HTTPS with `CONSUL_CACERT` and a
/// client certificate.
#[test]
fn https_verify_incoming_needs_a_client_certificate() {
    let pki = Pki::new();
    let ca = pki.ca().display().to_string();
    let https_port = free_port();
    let server = with_flags(
        Server::builder().dev().node("tls-dev"),
        &pki.flags(&pki.cert(&["-server"])),
    )
    .arg("--https-addr")
    .arg(&format!("127.0.0.1:{https_port}"))
    .arg("--tls-verify-incoming")
    .start();
    let url = format!("https://127.0.0.1:{https_port}/v1/status/leader");
    let (client_cert, client_key) = pki.cert(&["-client"]);
    let (cert, key) = (
        client_cert.display().to_string(),
        client_key.display().to_string(),
    );

    let (_, status, _) = curl(&["--cacert", &ca, &url]);
    assert_ne!(status, 200, "no client certificate: refused");
    let (code, status, body) = curl(&["--cacert", &ca, "--cert", &cert, "--key", &key, &url]);
    assert_eq!((code, status), (0, 200), "{body}");
    assert!(body.contains(&server.raft_addr.to_string()), "{body}");
    // The CA is needed to trust the server.
    let (code, _, _) = curl(&["--cert", &cert, "--key", &key, &url]);
    assert_ne!(code, 0, "an unknown CA must fail");
    // Another CA's client certificate is refused too.
    let other = Pki::new();
    let (ocert, okey) = other.cert(&["-client"]);
    let (_, status, _) = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &ocert.display().to_string(),
        "--key",
        &okey.display().to_string(),
        &url,
    ]);
    assert_ne!(status, 200, "another CA's client certificate");
    // Plain HTTP still answers beside it.
    assert_eq!(server.get("/v1/status/leader").status, 200);

    // The CLI, over HTTPS.
    let cli = |extra: &[(&str, &str)], args: &[&str]| {
        let mut c = Command::new(bin());
        c.args(args)
            .env("CAIRN_HTTP_ADDR", format!("https://127.0.0.1:{https_port}"))
            .env("CONSUL_CACERT", &ca)
            .env_remove("CONSUL_HTTP_ADDR")
            .env_remove("CONSUL_CLIENT_CERT")
            .env_remove("CONSUL_CLIENT_KEY")
            .stdin(Stdio::null());
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let certs = [
        ("CONSUL_CLIENT_CERT", cert.as_str()),
        ("CONSUL_CLIENT_KEY", key.as_str()),
    ];
    let put = cli(&certs, &["kv", "put", "cli/tls", "over-https"]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = cli(&certs, &["kv", "get", "cli/tls"]);
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "over-https");
    let refused = cli(&[], &["kv", "get", "cli/tls"]);
    assert!(!refused.status.success(), "no client certificate");
}

/// The HTTPS port keeps the HTTP port's limits: a connection that never
/// finishes its TLS handshake is closed after the header-read timeout.
#[test]
fn a_stalled_https_handshake_is_closed() {
    let pki = Pki::new();
    let https_port = free_port();
    let _server = with_flags(Server::builder().dev(), &pki.flags(&pki.cert(&["-server"])))
        .arg("--https-addr")
        .arg(&format!("127.0.0.1:{https_port}"))
        .arg("--http-read-header-timeout")
        .arg("1s")
        .start();
    let mut s = TcpStream::connect(("127.0.0.1", https_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    // Half a ClientHello's record header, then nothing.
    s.write_all(&[22, 3, 1]).unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let r = s.read_to_end(&mut buf);
    assert!(
        r.is_ok()
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "not closed: {r:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// `--http-addr ""`: the server listens on its HTTPS, Raft, DNS and gRPC
/// (TLS) ports only,
/// and its own agent reaches it over HTTPS (a service registered through
/// the agent API reaches the catalog).
#[test]
fn https_only_leaves_no_plain_port() {
    let pki = Pki::new();
    let ca = pki.ca();
    let server = with_flags(
        Server::builder().dev().node("only-https").https_only(),
        &pki.flags(&pki.cert(&["-server"])),
    )
    .start();
    eventually(Duration::from_secs(30), "a leader", || {
        let (_, l) = https_get(&ca, &format!("{}/v1/status/leader", server.url));
        (l.len() > 2).then_some(())
    });
    let mut want = vec![
        server.http_addr.port(),
        server.raft_addr.port(),
        server.dns_addr.port(),
        server.grpc_addr.port(),
    ];
    want.sort();
    assert_eq!(listening_ports(server.pid().unwrap()), want);
    // Plain HTTP on the HTTPS port gets no answer.
    assert!(!matches!(
        common::try_request(server.http_addr, "GET", "/v1/status/leader", None),
        Ok(r) if r.status == 200
    ));

    let (status, body) = https_put(
        &ca,
        &format!("{}/v1/agent/service/register", server.url),
        r#"{"Name": "secure-web", "Port": 443}"#,
    );
    assert_eq!(status, 200, "{body}");
    eventually(
        Duration::from_secs(10),
        "the service in the catalog",
        || {
            let (_, body) = https_get(
                &ca,
                &format!("{}/v1/catalog/service/secure-web", server.url),
            );
            body.contains("only-https").then_some(())
        },
    );
    // What clients read to find the ports: gRPC speaks TLS only here.
    let (_, body) = https_get(&ca, &format!("{}/v1/agent/self", server.url));
    let debug = &serde_json::from_str::<serde_json::Value>(&body).unwrap()["DebugConfig"];
    assert_eq!(debug["GRPCTLSPort"], server.grpc_addr.port(), "{body}");
    assert_eq!(debug["GRPCPort"], -1, "{body}");
    assert_eq!(debug["HTTPSPort"], server.http_addr.port(), "{body}");
    assert_eq!(debug["HTTPPort"], -1, "{body}");
}

/// An agent talks HTTPS (with its client certificate) to a server that
/// requires one, serves HTTPS itself, and runs HTTPS checks: one with
/// `TLSSkipVerify` passes against its own certificate (a CA the system
/// does not know), one without fails; both reach the catalog.
#[test]
fn agent_over_https_with_https_checks() {
    let pki = Pki::new();
    let https_port = free_port();
    let server = with_flags(
        Server::builder().dev().node("tls-server"),
        &pki.flags(&pki.cert(&["-server"])),
    )
    .arg("--https-addr")
    .arg(&format!("127.0.0.1:{https_port}"))
    .arg("--tls-verify-incoming")
    .start();
    let agent_https = free_port();
    let mut b = Agent::builder("tls-agent", &format!("https://127.0.0.1:{https_port}"))
        .arg("--https-addr")
        .arg(format!("127.0.0.1:{agent_https}"));
    for f in pki.flags(&pki.cert(&["-client"])) {
        b = b.arg(f);
    }
    let agent = b.start();
    let check_url = format!("https://127.0.0.1:{agent_https}/v1/agent/self");
    let r = agent.put(
        "/v1/agent/service/register",
        &serde_json::json!({
            "Name": "web",
            "Port": 80,
            "Checks": [
                {"CheckID": "skip", "Name": "skip", "HTTP": check_url,
                 "Interval": "1s", "TLSSkipVerify": true},
                {"CheckID": "strict", "Name": "strict", "HTTP": check_url,
                 "Interval": "1s"},
            ]
        })
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let checks = eventually(Duration::from_secs(20), "both checks run", || {
        let v = server.get_json("/v1/health/checks/web");
        let status = |id: &str| {
            v.as_array()?.iter().find(|c| c["CheckID"] == id).map(|c| {
                (
                    c["Status"].as_str().unwrap().to_string(),
                    c["Output"].clone(),
                )
            })
        };
        let (skip, strict) = (status("skip")?, status("strict")?);
        // Critical is also where a check starts: wait for its output, which
        // says why it failed.
        let why = strict.1.as_str().unwrap_or("").to_string();
        (skip.0 == "passing" && strict.0 == "critical" && !why.is_empty()).then_some(why)
    });
    assert!(checks.contains("certificate"), "{checks}");
    // The agent's node reached the catalog through the HTTPS server.
    let nodes = server.get_json("/v1/catalog/nodes");
    assert!(nodes.to_string().contains("tls-agent"), "{nodes}");
}
