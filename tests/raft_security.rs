//! Who may join the Raft cluster (issue 33, item 2), against real
//! processes on loopback: with `--encrypt`, only servers holding the key
//! (a raw `Join` frame changes nothing); a peer that never answers stays a
//! non-voter and can always be removed; an unprotected Raft port beyond
//! loopback refuses to start unless `--insecure-raft`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn::raft::ServerNode;
use cairn::raft::network::{Reply, Request, greeting};
use common::{Server, bin, cluster, eventually, free_port, keygen};

/// The servers in the Raft configuration: (Address, Voter).
fn configuration(s: &Server) -> Vec<(String, bool)> {
    s.get_json("/v1/operator/raft/configuration")["Servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["Address"].as_str().unwrap().to_string(),
                v["Voter"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn peers(s: &Server) -> Vec<String> {
    serde_json::from_value(s.get_json("/v1/status/peers")).unwrap()
}

/// A KV write through `s` commits (within the test client's patience).
fn write_commits(s: &Server, key: &str) {
    let r = s.put(&format!("/v1/kv/{key}"), "v");
    assert_eq!((r.status, r.body.trim()), (200, "true"), "write {key}");
}

/// A `Join` of a server nobody runs, as one frame after the plain greeting,
/// sent over plain TCP to a Raft port; returns the stream (open).
fn send_fake_join(raft_addr: &str, id: u64, ghost: &str) -> TcpStream {
    let req = Request::Join(
        id,
        ServerNode {
            name: "ghost".into(),
            raft_addr: ghost.into(),
            http_addr: ghost.into(),
        },
    );
    let body = bincode::serialize(&req).unwrap();
    let mut bytes = greeting().to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&body);
    let mut s = TcpStream::connect(raft_addr).unwrap();
    s.write_all(&bytes).unwrap();
    s
}

#[test]
fn an_encrypted_cluster_forms_and_keeps_out_servers_without_its_key() {
    let key = keygen();
    let procs = cluster(3, &["--encrypt", &key]);
    for p in &procs {
        p.wait_for_leader(Duration::from_secs(30));
    }
    write_commits(&procs[0], "formed");
    let three = eventually(Duration::from_secs(10), "three peers", || {
        let p = peers(&procs[0]);
        (p.len() == 3).then_some(p)
    });
    for p in &procs {
        assert!(three.contains(&p.raft_addr.to_string()));
    }

    // Another key, and none: each asks procs[0] to let it in.
    let other = Server::builder()
        .node("other-key")
        .join(procs[0].raft_addr)
        .arg("--encrypt")
        .arg(&keygen())
        .no_wait()
        .start();
    let keyless = Server::builder()
        .node("no-key")
        .join(procs[0].raft_addr)
        .no_wait()
        .start();
    // Refused at the handshake: the other key's server refuses procs[0]
    // (it did not prove its key), procs[0] refuses the keyless one.
    eventually(Duration::from_secs(20), "both intruders refused", || {
        let other_refused = other.log().contains("did not prove the --encrypt key");
        let keyless_refused = procs[0].log().contains("no key handshake");
        (other_refused && keyless_refused).then_some(())
    });
    // Several rounds of their asking.
    let seen = |log: String| log.matches("key handshake").count();
    let before = (seen(other.log()), seen(procs[0].log()));
    eventually(Duration::from_secs(20), "more attempts refused", || {
        (seen(other.log()) > before.0 + 2 && seen(procs[0].log()) > before.1 + 2).then_some(())
    });
    for p in &procs {
        let config = configuration(p);
        assert_eq!(config.len(), 3, "{config:?}");
        assert_eq!(peers(p).len(), 3);
    }
    for intruder in [&other, &keyless] {
        assert!(intruder.is_running());
        let leader = intruder.get("/v1/status/leader");
        assert_eq!(leader.body.trim(), "\"\"", "{}", intruder.name());
    }
    write_commits(&procs[1], "after-intruders");
}

#[test]
fn a_raw_join_frame_changes_nothing_on_an_encrypted_server() {
    let key = keygen();
    let s = Server::builder()
        .node("s0")
        .bootstrap_expect(1)
        .arg("--encrypt")
        .arg(&key)
        .start();
    write_commits(&s, "before");
    let ghost = format!("127.0.0.1:{}", free_port());
    let mut conn = send_fake_join(&s.raft_addr.to_string(), 0xDEAD_BEEF, &ghost);
    // Closed by the server (a reset: it left our frame unread), unanswered.
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    match conn.read_to_end(&mut answer) {
        Ok(_) => assert!(answer.is_empty(), "answered {answer:?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    eventually(Duration::from_secs(10), "the refusal logged", || {
        s.log().contains("no key handshake").then_some(())
    });
    let config = configuration(&s);
    assert_eq!(config, vec![(s.raft_addr.to_string(), true)]);
    write_commits(&s, "after");
}

/// A forged `Join` for a server that never answers: it stays a learner
/// (never in `/v1/status/peers`), writes go on committing, and removing it
/// succeeds.
fn a_ghost_is_removed(procs: &[Server], by: impl Fn(&str) -> String) {
    let ghost = format!("127.0.0.1:{}", free_port());
    let _conn = send_fake_join(&procs[0].raft_addr.to_string(), 0xDEAD_BEEF, &ghost);
    eventually(
        Duration::from_secs(10),
        "the ghost in the configuration",
        || {
            configuration(&procs[0])
                .iter()
                .any(|(a, _)| *a == ghost)
                .then_some(())
        },
    );
    // Writes commit while it is there, and it is no voter.
    write_commits(&procs[0], "with-ghost");
    for p in procs {
        assert!(!peers(p).contains(&ghost));
    }
    let start = Instant::now();
    let r = procs[0].delete(&format!("/v1/operator/raft/peer?{}", by(&ghost)));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(start.elapsed() < Duration::from_secs(10));
    eventually(Duration::from_secs(10), "the ghost gone", || {
        procs
            .iter()
            .all(|p| !configuration(p).iter().any(|(a, _)| *a == ghost))
            .then_some(())
    });
    write_commits(&procs[0], "after-ghost");
}

#[test]
fn a_peer_that_never_answers_is_removed_from_one_server() {
    let s = Server::builder().node("s0").bootstrap_expect(1).start();
    a_ghost_is_removed(std::slice::from_ref(&s), |ghost| format!("address={ghost}"));
}

#[test]
fn a_peer_that_never_answers_is_removed_from_three_servers() {
    let procs = cluster(3, &[]);
    for p in &procs {
        p.wait_for_leader(Duration::from_secs(30));
    }
    // By id: the name it gave.
    a_ghost_is_removed(&procs, |_| "id=ghost".into());
}

/// Runs `cairn server` with `args` until it exits (killed after `within`).
fn run_server(args: &[&str], within: Duration) -> (Option<std::process::ExitStatus>, String) {
    let mut child = Command::new(bin())
        .arg("server")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    (status, out)
}

#[test]
fn an_unprotected_raft_port_beyond_loopback_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let raft = format!("0.0.0.0:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let base = [
        "--data-dir",
        data.to_str().unwrap(),
        "--raft-addr",
        &raft,
        "--http-addr",
        &http,
        "--dns-addr",
        "",
        "--grpc-addr",
        "",
    ];
    let (status, out) = run_server(&base, Duration::from_secs(20));
    let status = status.expect("it must exit");
    assert!(!status.success());
    let why: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("not a loopback address"))
        .collect();
    assert_eq!(why.len(), 1, "{out}");
    assert!(
        why[0].contains(&raft)
            && why[0].contains("--encrypt")
            && why[0].contains("--insecure-raft"),
        "{out}"
    );
    assert!(!data.exists(), "refused before touching the data dir");

    // A key that is none refuses too, by name.
    for (bad, says) in [
        ("not base64!", "--encrypt: the key is not base64"),
        ("AAAA", "--encrypt: the key is 3 bytes, it must be 32"),
    ] {
        let mut args = base.to_vec();
        args.extend(["--encrypt", bad]);
        let (status, out) = run_server(&args, Duration::from_secs(20));
        assert!(!status.expect("it must exit").success());
        assert_eq!(out.lines().filter(|l| l.contains(says)).count(), 1, "{out}");
    }

    // Told to: it starts and leads (it binds the port, sends nothing).
    let mut args = base.to_vec();
    args.push("--insecure-raft");
    let mut child = Command::new(bin())
        .arg("server")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = http.parse().unwrap();
    let led = (0..300).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        common::try_request(addr, "GET", "/v1/status/leader", None)
            .is_ok_and(|r| r.status == 200 && r.body.trim() == format!("\"{raft}\""))
    });
    let exited = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(led, "--insecure-raft did not start (exit: {exited:?})");
}

#[test]
fn tls_and_a_key_together_form_a_cluster() {
    let pki = common::pki::Pki::new();
    let key = keygen();
    let mut flags = vec!["--encrypt".to_string(), key];
    flags.extend(pki.flags(&pki.cert(&["-server"])));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let procs = cluster(3, &flags);
    for p in &procs {
        p.wait_for_leader(Duration::from_secs(30));
    }
    // Through every server: a follower forwards to the leader.
    for (i, p) in procs.iter().enumerate() {
        write_commits(p, &format!("both/{i}"));
    }
    assert_eq!(peers(&procs[2]).len(), 3);
}

/// One frame after the plain greeting on a fresh connection to
/// `raft_addr`; the reply frame's body (bincode of a `Reply`), if any.
fn one_frame(raft_addr: std::net::SocketAddr, req: &Request) -> Option<Vec<u8>> {
    let body = bincode::serialize(req).unwrap();
    let mut bytes = greeting().to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&body);
    let mut s = TcpStream::connect(raft_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&bytes).unwrap();
    // The server's greeting, then a reply frame (or a close).
    let mut head = vec![0u8; greeting().len()];
    s.read_exact(&mut head).ok()?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut reply = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut reply).ok()?;
    Some(reply)
}

/// On a plain Raft port (loopback, neither `--encrypt` nor TLS) a server
/// serves no WAN frame: a greeting claiming datacenter `evil` declares
/// nothing, a request "from evil" marked as a replication pull gets no
/// token, a CSR sent to the intermediate-signing path is signed by no one.
/// And federation flags on such a transport refuse to start, naming the
/// fix. On the main before this, `evil` showed in /v1/catalog/datacenters
/// for good.
#[test]
fn a_plain_raft_port_serves_no_wan_frame() {
    use cairn::raft::wan::WanHello;
    let s = Server::builder()
        .node("plain")
        .bootstrap_expect(1)
        .arg("--acl-enabled")
        .arg("--acl-initial-management-token")
        .arg(common::acl::ROOT)
        .start();
    let hello = Request::WanHello(WanHello {
        datacenter: "evil".into(),
        // This server's own primary: a greeting naming another is refused
        // whatever the transport.
        primary: "dc1".into(),
        server: cairn::structs::federation::WanServer {
            name: "evil-0".into(),
            raft_addr: "127.0.0.1:1".into(),
        },
        known: Vec::new(),
    });
    let reply = one_frame(s.raft_addr, &hello);
    let text = reply
        .map(|r| String::from_utf8_lossy(&r).to_string())
        .unwrap_or_default();
    assert!(
        !text.contains("evil"),
        "a WAN greeting on a plain port was answered: {text}"
    );
    // The channel a replication pull "from evil" would travel on is
    // refused before any request on it is read.
    let open = Request::WanChannel {
        from: "evil".into(),
    };
    let reply: Reply = bincode::deserialize(&one_frame(s.raft_addr, &open).expect("an answer"))
        .expect("a reply frame");
    assert!(
        matches!(&reply, Reply::Channel(Err(e)) if e.contains("serves no WAN")),
        "{reply:?}"
    );
    let dcs = common::acl::with(
        s.http_addr,
        "GET",
        "/v1/catalog/datacenters",
        None,
        common::acl::ROOT,
    );
    assert_eq!(dcs.json(), serde_json::json!(["dc1"]), "{}", dcs.body);
    drop(s);

    // Federation flags on a plain transport: refused at start, with the fix.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let raft = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let (status, out) = run_server(
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--raft-addr",
            &raft,
            "--http-addr",
            &http,
            "--dns-addr",
            "",
            "--grpc-addr",
            "",
            "--datacenter",
            "dc2",
            "--primary-datacenter",
            "dc1",
        ],
        Duration::from_secs(20),
    );
    assert!(status.is_some_and(|s| !s.success()), "{status:?}: {out}");
    assert!(
        out.contains("needs an authenticated Raft transport"),
        "{out}"
    );
    assert!(out.contains("--encrypt"), "{out}");
}
