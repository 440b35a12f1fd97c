//! Snapshots on real servers: `cairn snapshot save|restore|inspect` and
//! `/v1/snapshot`. A restore goes through Raft, so every server of a live
//! cluster ends with exactly the snapshot's content, and no index a query
//! reports goes back; a damaged file is refused and changes nothing.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Server, cli, eventually, try_request_bytes};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn put_ok(s: &Server, path: &str, body: Value) -> String {
    let text = match &body {
        Value::String(t) => t.clone(),
        other => other.to_string(),
    };
    let r = s.put(path, &text);
    assert_eq!(r.status, 200, "PUT {path}: {}", r.body);
    r.body
}

/// KV, catalog, a config entry, and a session holding a lock.
fn write_content(s: &Server, tag: &str) {
    put_ok(s, "/v1/kv/app/a", json!(format!("{tag}-a")));
    put_ok(s, "/v1/kv/app/b", json!(format!("{tag}-b")));
    put_ok(
        s,
        "/v1/catalog/register",
        json!({"Node": format!("{tag}-n1"), "Address": "10.0.0.1",
               "Service": {"Service": "web", "Port": 80, "Tags": [tag]},
               "Check": {"CheckID": "web-ok", "Name": "web", "ServiceID": "web",
                         "Status": "passing"}}),
    );
    put_ok(
        s,
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
    );
    let r = put_ok(
        s,
        "/v1/session/create",
        json!({"Name": tag, "Node": format!("{tag}-n1"), "NodeChecks": []}),
    );
    let id = serde_json::from_str::<Value>(&r).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let lock = format!("/v1/kv/app/lock-{tag}?acquire={id}");
    assert_eq!(put_ok(s, &lock, json!("me")).trim(), "true");
}

/// What every read of the content answers (with `?stale`: this server's
/// own state).
fn content(s: &Server) -> Value {
    let get = |p: &str| {
        let r = s.get(&format!(
            "{p}{}stale",
            if p.contains('?') { "&" } else { "?" }
        ));
        if r.status == 404 {
            return Value::Null;
        }
        assert_eq!(r.status, 200, "{p}: {}", r.body);
        r.json()
    };
    // The servers' own nodes and their `consul` service are each cluster's
    // own (the leader registers its members): the content is what the test
    // wrote.
    let mut nodes = get("/v1/catalog/nodes");
    if let Some(list) = nodes.as_array_mut() {
        list.retain(|n| n["Node"].as_str().is_some_and(|n| n.ends_with("-n1")));
    }
    let mut services = get("/v1/catalog/services");
    if let Some(map) = services.as_object_mut() {
        map.remove("consul");
    }
    json!({
        "kv": get("/v1/kv/?recurse"),
        "nodes": nodes,
        "services": services,
        "health": get("/v1/health/service/web"),
        "config": get("/v1/config/service-defaults"),
        "sessions": get("/v1/session/list"),
    })
}

fn save(s: &Server, file: &Path) {
    let out = cli(&s.url, &["snapshot", "save", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "save: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn restore(s: &Server, file: &Path) {
    let out = cli(&s.url, &["snapshot", "restore", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until every server answers `want` from its own state.
fn all_answer(servers: &[Server], want: &Value) {
    for s in servers {
        eventually(DEADLINE, "the snapshot's content on every server", || {
            (content(s) == *want).then_some(())
        });
    }
}

fn leader_of(servers: &[Server]) -> usize {
    let leader = servers[0].get_json("/v1/status/leader");
    let addr = leader.as_str().unwrap().to_string();
    servers
        .iter()
        .position(|s| s.raft_addr.to_string() == addr)
        .expect("the leader is one of ours")
}

#[test]
fn a_restore_brings_every_server_of_a_live_cluster_back_and_no_index_goes_back() {
    let servers = Server::cluster(3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("before.snap");
    let s0 = &servers[0];
    write_content(s0, "old");
    // The servers' own nodes may still be joining the catalog: the content
    // to save is what every server has come to agree on.
    let want = eventually(DEADLINE, "every server to agree on the content", || {
        let want = content(s0);
        servers.iter().all(|s| content(s) == want).then_some(want)
    });
    save(s0, &file);

    // A series of writes after the snapshot, on every table.
    put_ok(s0, "/v1/kv/app/a", json!("changed"));
    assert_eq!(s0.delete("/v1/kv/app/b").status, 200);
    put_ok(s0, "/v1/kv/app/new", json!("new"));
    put_ok(s0, "/v1/catalog/deregister", json!({"Node": "old-n1"}));
    write_content(s0, "new");
    assert_eq!(s0.delete("/v1/config/service-defaults/web").status, 200);
    assert_ne!(content(s0), want);

    // Every index reported before the restore, on keys that the snapshot
    // has, has not, and a prefix.
    let reads = [
        "/v1/kv/app/a",
        "/v1/kv/app/new",
        "/v1/kv/app/?recurse",
        "/v1/catalog/nodes",
        "/v1/catalog/node/new-n1",
        "/v1/health/service/web",
        "/v1/session/list",
        "/v1/config/service-defaults",
    ];
    let before: Vec<u64> = reads.iter().map(|p| s0.get(p).index()).collect();
    let top = *before.iter().max().unwrap();

    // A blocking query on a follower, parked before the restore, must
    // wake with the snapshot's value at a higher index.
    let follower = (leader_of(&servers) + 1) % 3;
    let (addr, path) = (
        servers[follower].http_addr,
        format!("/v1/kv/app/a?stale&index={top}&wait=60s"),
    );
    // Others may be parked there already (the server's own agent's).
    let parked = servers[follower].metric("cairn_blocking_queries_parked") as u64;
    let blocked = std::thread::spawn(move || common::request(addr, "GET", &path, None));
    // And one on a service's health, answered from the materialized view
    // the event publisher feeds (reset by the restore).
    let health = format!("/v1/health/service/web?stale&index={top}&wait=60s");
    let blocked_health = std::thread::spawn(move || common::request(addr, "GET", &health, None));
    servers[follower].wait_parked(parked + 2);

    // Restored through another follower (forwarded to the leader).
    let other = 3 - leader_of(&servers) - follower;
    restore(&servers[other], &file);
    all_answer(&servers, &want);

    let woke = blocked.join().unwrap();
    assert_eq!(woke.status, 200);
    assert!(woke.index() > top, "{} <= {top}", woke.index());
    assert_eq!(woke.json()[0]["Value"], json!(base64("old-a")));
    let woke = blocked_health.join().unwrap();
    assert_eq!(woke.status, 200);
    assert!(woke.index() > top, "{} <= {top}", woke.index());
    assert_eq!(woke.json(), want["health"]);
    for s in &servers {
        for (p, b) in reads.iter().zip(&before) {
            let now = s.get(&format!(
                "{p}{}stale",
                if p.contains('?') { "&" } else { "?" }
            ));
            assert!(now.index() >= *b, "{p} on {}: {} < {b}", s.url, now.index());
        }
    }
    // The restored cluster takes writes as before, on every server.
    put_ok(s0, "/v1/kv/app/after", json!("x"));
    for s in &servers {
        eventually(DEADLINE, "a write after the restore", || {
            (s.get("/v1/kv/app/after?stale").status == 200).then_some(())
        });
    }
}

fn base64(s: &str) -> String {
    // The few values here are short ASCII: a tiny encoder, not a crate.
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn a_snapshot_moves_between_clusters_of_different_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let one = Server::dev();
    write_content(&one, "single");
    // Larger than a plain request body may be (4 MiB), and than one
    // restore chunk (512 KiB).
    for i in 0..12 {
        let big = char::from(b'a' + i).to_string().repeat(400 << 10);
        assert_eq!(one.put(&format!("/v1/kv/big/{i}"), &big).status, 200);
    }
    let want = content(&one);
    let file = dir.path().join("one.snap");
    save(&one, &file);
    drop(one);

    // 1 server → a fresh cluster of 3.
    let three = Server::cluster(3);
    restore(&three[0], &file);
    all_answer(&three, &want);

    // 3 → a fresh single server, with a write made on the three.
    put_ok(&three[1], "/v1/kv/app/three", json!("3"));
    let want = content(&three[leader_of(&three)]);
    let file = dir.path().join("three.snap");
    save(&three[2], &file);
    drop(three);
    let single = Server::dev();
    restore(&single, &file);
    all_answer(std::slice::from_ref(&single), &want);
}

#[test]
fn a_damaged_snapshot_is_refused_and_changes_nothing() {
    let s = Server::dev();
    let dir = tempfile::tempdir().unwrap();
    write_content(&s, "v1");
    let file = dir.path().join("good.snap");
    save(&s, &file);
    put_ok(&s, "/v1/kv/app/a", json!("later"));
    let want = content(&s);
    let index = s.get("/v1/kv/?recurse").index();
    let archive = std::fs::read(&file).unwrap();
    // Consul's envelope: tools list it and check its sums.
    let listed = std::process::Command::new("tar")
        .args(["tzf", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "meta.json\nstate.bin\nSHA256SUMS\n"
    );
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let x = std::process::Command::new("tar")
        .args(["xzf", file.to_str().unwrap(), "-C", out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(x.success());
    let sums = std::process::Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&out)
        .output()
        .unwrap();
    assert!(
        sums.status.success(),
        "{}",
        String::from_utf8_lossy(&sums.stdout)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("meta.json")).unwrap()).unwrap();
    assert!(meta["Index"].as_u64().unwrap() > 0, "{meta}");
    assert_eq!(meta["Version"], 1, "{meta}");
    // The state inside: cairn's framed snapshot, which a restore also
    // takes bare (as cairn saved it before the envelope).
    let good = std::fs::read(out.join("state.bin")).unwrap();

    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let mut version = good.clone();
    version[8] = 99;
    let mut archive_flipped = archive.clone();
    let amid = archive.len() / 2;
    archive_flipped[amid] ^= 0x40;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("a flipped byte", flipped, "checksum"),
        (
            "cut short",
            good[..good.len() - 100].to_vec(),
            "bytes where",
        ),
        ("another version", version, "format version 99"),
        ("not a snapshot", b"hello".to_vec(), "Invalid snapshot"),
        (
            "a flipped byte in the archive",
            archive_flipped,
            "Invalid snapshot",
        ),
        (
            "an archive cut short",
            archive[..archive.len() - 100].to_vec(),
            "Invalid snapshot archive",
        ),
    ];
    for (what, bytes, says) in cases {
        let r = try_request_bytes(s.http_addr, "PUT", "/v1/snapshot", &bytes).unwrap();
        assert_eq!(r.status, 400, "{what}: {}", r.body);
        assert!(r.body.contains(says), "{what}: {}", r.body);
        // The CLI says so too, and fails.
        let path = dir.path().join("bad.snap");
        std::fs::write(&path, &bytes).unwrap();
        let out = cli(&s.url, &["snapshot", "restore", path.to_str().unwrap()]);
        assert!(!out.status.success(), "{what}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("400"),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Nothing was proposed: same content, same index.
    assert_eq!(content(&s), want);
    assert_eq!(s.get("/v1/kv/?recurse").index(), index);
    // The bare state restores.
    let r = try_request_bytes(s.http_addr, "PUT", "/v1/snapshot", &good).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(content(&s), want, "the state saved before the later write");
}

/// A dev server with the content and one more key, saved to a file.
fn saved_content() -> (Server, tempfile::TempDir, std::path::PathBuf) {
    let s = Server::dev();
    s.settle();
    let dir = tempfile::tempdir().unwrap();
    write_content(&s, "x");
    put_ok(&s, "/v1/kv/other", json!("y"));
    let file = dir.path().join("s.snap");
    save(&s, &file);
    (s, dir, file)
}

#[test]
fn inspect_prints_index_term_and_rows_per_table() {
    let (s, _dir, file) = saved_content();
    let index = s.get("/v1/kv/other").index();

    let out = cli(&s.url, &["snapshot", "inspect", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(name)).then(|| w.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    };
    assert!(field("Index") >= index, "{text}");
    assert!(field("Term") >= 1, "{text}");
    assert_eq!(
        field("Size"),
        std::fs::metadata(&file).unwrap().len(),
        "{text}"
    );
    // app/a, app/b, app/lock-x, other.
    assert_eq!(field("KV"), 4, "{text}");
    // The content's, and the server's own node with its serfHealth and
    // its `consul` service.
    assert_eq!(field("Nodes"), 2, "{text}");
    assert_eq!(field("Services"), 2, "{text}");
    assert_eq!(field("Checks"), 2, "{text}");
    assert_eq!(field("ConfigEntries"), 1, "{text}");
    assert_eq!(field("Sessions"), 1, "{text}");

    // A damaged file does not inspect.
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let out = cli(&s.url, &["snapshot", "inspect", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("checksum"));
}

/// `snapshot decode`, as Consul's: a header line, then a `{"Type",
/// "Data"}` JSON line per row, each row once, in Consul's record names.
#[test]
fn decode_prints_every_row_as_a_json_line() {
    let (s, _dir, file) = saved_content();
    let out = cli(&s.url, &["snapshot", "decode", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["Type"], "SnapshotHeader");
    assert!(
        lines[0]["Data"]["Index"].as_u64().unwrap() > 0,
        "{}",
        lines[0]
    );
    let of = |kind: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["Type"] == kind)
            .map(|l| &l["Data"])
            .collect()
    };
    // The same rows `inspect` counts: app/a, app/b, app/lock-x, other.
    let mut keys: Vec<&str> = of("KVS")
        .iter()
        .map(|k| k["Key"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["app/a", "app/b", "app/lock-x", "other"]);
    let other = of("KVS").into_iter().find(|k| k["Key"] == "other").unwrap();
    assert_eq!(other["Value"], "eQ==", "base64 of y: {other}");
    // Two nodes, two services, two checks, each a registration.
    let regs = of("Register");
    assert_eq!(regs.iter().filter(|r| r["Service"].is_object()).count(), 2);
    assert_eq!(regs.iter().filter(|r| r["Check"].is_object()).count(), 2);
    assert_eq!(regs.iter().filter(|r| r["Address"].is_string()).count(), 2);
    assert_eq!(of("Session").len(), 1);
    assert_eq!(of("ConfigEntry").len(), 1);

    std::fs::write(&file, b"not a snapshot").unwrap();
    let out = cli(&s.url, &["snapshot", "decode", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("Error extracting snapshot data"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_cli_round_trip_restores_what_was_saved() {
    let s = Server::dev();
    let dir = tempfile::tempdir().unwrap();
    write_content(&s, "rt");
    let want = content(&s);
    let file = dir.path().join("rt.snap");
    save(&s, &file);
    // Everything changed or gone after the save.
    assert_eq!(s.delete("/v1/kv/?recurse").status, 200);
    put_ok(&s, "/v1/catalog/deregister", json!({"Node": "rt-n1"}));
    assert_eq!(s.delete("/v1/config/service-defaults/web").status, 200);
    assert_eq!(content(&s)["kv"], Value::Null);
    restore(&s, &file);
    assert_eq!(content(&s), want);
    // The restored session still holds its lock, and its TTL-less life
    // goes on: a second acquire by another session fails.
    let other = put_ok(
        &s,
        "/v1/session/create",
        json!({"Node": "rt-n1", "NodeChecks": []}),
    );
    let other = serde_json::from_str::<Value>(&other).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        put_ok(
            &s,
            &format!("/v1/kv/app/lock-rt?acquire={other}"),
            json!("x")
        )
        .trim(),
        "false"
    );
}

/// Sends the head of a `PUT /v1/snapshot` that announces `announced` bytes,
/// then 1 MiB of them, and reads the answer without sending the rest: a
/// server that reads the body before checking the token never answers.
fn upload_head(addr: std::net::SocketAddr, announced: usize, token: Option<&str>) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let token = token.map_or(String::new(), |t| format!("X-Consul-Token: {t}\r\n"));
    write!(
        c,
        "PUT /v1/snapshot HTTP/1.1\r\nHost: x\r\n{token}Content-Length: {announced}\r\n\r\n"
    )
    .unwrap();
    // The server may answer and close before it has taken all of this.
    let _ = c.write_all(&vec![b'x'; 1 << 20]);
    let mut answer = [0u8; 512];
    let n = c
        .read(&mut answer)
        .unwrap_or_else(|e| panic!("no answer before the body was sent whole: {e}"));
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// A restore needs a management token, and a server checks it before it
/// reads any of the body: an anonymous 400 MB upload is refused at once by
/// the leader and by a follower (which, for a caller it lets through,
/// passes the body on as a stream).
#[test]
fn a_snapshot_upload_is_refused_before_its_body_is_read() {
    use common::acl::{DENY_ARGS, ROOT};
    let servers = common::cluster(3, &DENY_ARGS);
    for s in &servers {
        s.wait_for_leader(DEADLINE);
    }
    let leader = leader_of(&servers);
    for (i, s) in servers.iter().enumerate() {
        let answer = upload_head(s.http_addr, 400 << 20, None);
        assert!(
            answer.starts_with("HTTP/1.1 403"),
            "server {i} (leader: {}): {answer}",
            i == leader
        );
        assert!(answer.contains("Permission denied"), "{answer}");
    }
    // A management token gets past the check: its upload (here a damaged
    // one) reaches the leader through a follower, whole.
    let follower = (leader + 1) % 3;
    // The follower checks the token itself: once it has applied the
    // leader's write of the management token.
    eventually(DEADLINE, "the management token on the follower", || {
        let r = common::request_with(
            servers[follower].http_addr,
            "GET",
            "/v1/acl/token/self?stale",
            None,
            &[("X-Consul-Token", ROOT)],
        );
        (r.status == 200).then_some(())
    });
    let r = common::request_with(
        servers[follower].http_addr,
        "PUT",
        "/v1/snapshot",
        Some("not a snapshot"),
        &[("X-Consul-Token", ROOT)],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Invalid snapshot"), "{}", r.body);
}
