//! Operator verbs on a real cluster: `transfer-leader` moves the Raft
//! leadership where it is asked (forwarded from a follower), and is
//! refused to callers without `operator:write`.

mod common;

use std::time::Duration;

use common::acl::{ROOT, acl_started, as_root, token_with_rules, with};
use common::{Server, agreed_leader, cli, eventually};
use serde_json::json;

/// The agreed leader is `want`; the servers' logs otherwise.
fn expect_leader(servers: &[Server], want: usize) {
    let got = agreed_leader(servers);
    if got != want {
        for s in servers {
            eprintln!("==== {}\n{}", s.name(), s.log());
        }
        panic!("server {got} leads, not {want}");
    }
}

#[test]
fn transfer_leader_moves_office_to_the_named_voter() {
    let servers = Server::cluster(3);
    let first = agreed_leader(&servers);
    let follower = (first + 1) % 3;
    let target = (first + 2) % 3;

    // Asked of a follower: forwarded to the leader, which hands over.
    let o = cli(
        &servers[follower].url,
        &[
            "operator",
            "raft",
            "transfer-leader",
            "-id",
            servers[target].name(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    expect_leader(&servers, target);

    // Without -id: any other voter.
    let r = servers[target].put("/v1/operator/raft/transfer-leader", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["Success"], true);
    assert_ne!(agreed_leader(&servers), target);

    // A name that is no voter: 400, leadership stays.
    let now = agreed_leader(&servers);
    let r = servers[now].put("/v1/operator/raft/transfer-leader?id=nope", "");
    assert_eq!(r.status, 400, "{}", r.body);
    expect_leader(&servers, now);
    // Writes still commit on the new leader.
    assert_eq!(servers[follower].put("/v1/kv/after", "x").body, "true");
}

#[test]
fn transfer_leader_needs_operator_write() {
    let s = acl_started(Server::builder().dev(), "deny");
    let path = "/v1/operator/raft/transfer-leader";
    let r = s.put(path, "");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("operator:write"), "{}", r.body);
    let (_, read_only) = token_with_rules(s.http_addr, "op-read", r#"operator = "read""#);
    let r = with(s.http_addr, "PUT", path, None, &read_only);
    assert_eq!(r.status, 403, "{}", r.body);
    // Allowed, but a lone server has no voter to hand over to.
    let r = with(s.http_addr, "PUT", path, None, ROOT);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("no other voter"), "{}", r.body);
}

#[test]
fn autopilot_configuration_is_replicated_kept_and_cas_guarded() {
    let servers = Server::cluster(3);
    let leader = agreed_leader(&servers);
    let follower = &servers[(leader + 1) % 3];

    // Consul's defaults before anyone sets it.
    let text = {
        let o = cli(&follower.url, &["operator", "autopilot", "get-config"]);
        assert!(o.status.success());
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(text.contains("CleanupDeadServers = true"), "{text}");
    assert!(text.contains("LastContactThreshold = 200ms"), "{text}");
    assert!(text.contains("MaxTrailingLogs = 250"), "{text}");

    // Set through a follower (forwarded), one setting at a time.
    let o = cli(
        &follower.url,
        &[
            "operator",
            "autopilot",
            "set-config",
            "-max-trailing-logs=1000",
            "-last-contact-threshold=1s",
            "-cleanup-dead-servers=false",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "Configuration updated!"
    );
    for s in &servers {
        let c = eventually(Duration::from_secs(10), "the setting everywhere", || {
            let c = s.get_json("/v1/operator/autopilot/configuration?stale");
            (c["MaxTrailingLogs"] == 1000).then_some(c)
        });
        assert_eq!(c["LastContactThreshold"], "1s");
        assert_eq!(c["CleanupDeadServers"], false);
        assert_eq!(c["ServerStabilizationTime"], "10s", "untouched");
    }

    // A stale CAS changes nothing.
    let c = servers[leader].get_json("/v1/operator/autopilot/configuration");
    let stale = c["ModifyIndex"].as_u64().unwrap() - 1;
    let r = servers[leader].put(
        &format!("/v1/operator/autopilot/configuration?cas={stale}"),
        r#"{"MaxTrailingLogs": 5}"#,
    );
    assert_eq!(r.body, "false");
    let now = servers[leader].get_json("/v1/operator/autopilot/configuration");
    assert_eq!(now["MaxTrailingLogs"], 1000);
    // Bad input: 400, nothing changed.
    let r = servers[leader].put(
        "/v1/operator/autopilot/configuration",
        r#"{"LastContactThreshold": "soon"}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        servers[leader].get_json("/v1/operator/autopilot/configuration"),
        now
    );
}

#[test]
fn autopilot_health_marks_a_dead_server_and_answers_429() {
    let mut servers = Server::cluster(3);
    let leader = agreed_leader(&servers);
    let healthy = eventually(Duration::from_secs(20), "all healthy", || {
        let r = servers[leader].get("/v1/operator/autopilot/health");
        (r.status == 200).then(|| r.json())
    });
    assert_eq!(healthy["Healthy"], true);
    assert_eq!(healthy["FailureTolerance"], 1);
    let list = healthy["Servers"].as_array().unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(list.iter().filter(|s| s["Leader"] == true).count(), 1);
    assert!(
        list.iter()
            .all(|s| s["Voter"] == true && s["SerfStatus"] == "alive")
    );

    // One follower dies: unhealthy, no failure tolerance left, 429.
    let dead = (leader + 1) % 3;
    let name = servers[dead].name().to_string();
    servers[dead].kill();
    let sick = eventually(Duration::from_secs(20), "the dead server unhealthy", || {
        let r = servers[leader].get("/v1/operator/autopilot/health");
        (r.status == 429).then(|| r.json())
    });
    assert_eq!(sick["Healthy"], false);
    assert_eq!(sick["FailureTolerance"], 0);
    let gone = sick["Servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["Name"] == name.as_str())
        .unwrap();
    assert_eq!(gone["Healthy"], false);

    let state = servers[leader].get_json("/v1/operator/autopilot/state");
    assert_eq!(state["Healthy"], false);
    assert_eq!(state["Servers"][&name]["Healthy"], false);
    assert_eq!(state["Voters"].as_array().unwrap().len(), 3);
    assert_eq!(state["Servers"][servers[leader].name()]["Status"], "leader");
}

#[test]
fn autopilot_needs_operator_permissions() {
    let s = acl_started(Server::builder().dev(), "deny");
    for path in [
        "/v1/operator/autopilot/configuration",
        "/v1/operator/autopilot/health",
        "/v1/operator/autopilot/state",
    ] {
        let r = s.get(path);
        assert_eq!(r.status, 403, "{path}: {}", r.body);
    }
    let (_, read) = token_with_rules(s.http_addr, "op-r", r#"operator = "read""#);
    let r = with(
        s.http_addr,
        "GET",
        "/v1/operator/autopilot/configuration",
        None,
        &read,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body = r#"{"MaxTrailingLogs": 7}"#;
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/operator/autopilot/configuration",
        Some(body),
        &read,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/operator/autopilot/configuration",
        Some(body),
        ROOT,
    );
    assert_eq!(r.body, "true");
}

/// `/v1/operator/usage`: what the catalog holds, in Consul's shape, with
/// operator:read.
#[test]
fn usage_counts_services_instances_and_nodes() {
    let s = acl_started(Server::builder().dev().node("srv"), "deny");
    let a = s.http_addr;
    for body in [
        serde_json::json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"Service": "web", "ID": "web-1"}}),
        serde_json::json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"Service": "web", "ID": "web-2"}}),
        serde_json::json!({"Node": "n2", "Address": "10.0.0.2", "Service": {"Service": "web-sidecar-proxy", "Kind": "connect-proxy", "Port": 21000, "Proxy": {"DestinationServiceName": "web"}}}),
    ] {
        as_root(a, "PUT", "/v1/catalog/register", &body);
    }
    let (_, reader) = token_with_rules(a, "op-read", r#"operator = "read""#);
    let r = with(a, "GET", "/v1/operator/usage", None, &reader);
    assert_eq!(r.status, 200, "{}", r.body);
    let u = r.json();
    let dc = &u["Usage"]["dc1"];
    assert_eq!(dc["Nodes"], 3, "{u}");
    // web, web-sidecar-proxy and the server's own consul service.
    assert_eq!(dc["Services"], 3, "{u}");
    assert_eq!(dc["ServiceInstances"], 4, "{u}");
    assert_eq!(dc["ConnectServiceInstances"]["connect-proxy"], 1, "{u}");
    assert_eq!(dc["BillableServiceInstances"], 2, "{u}");
    assert_eq!(u["KnownLeader"], true, "{u}");
    // Anonymous (default deny) may not, nor a token one permission short
    // (acl:read is not operator:read).
    assert_eq!(
        common::request(a, "GET", "/v1/operator/usage", None).status,
        403
    );
    let (_, short) = token_with_rules(a, "acl-read", r#"acl = "read""#);
    assert_eq!(
        with(a, "GET", "/v1/operator/usage", None, &short).status,
        403
    );
}

/// `/v1/operator/keyring`: without `--encrypt` every operation is Consul's
/// 500 with the reason; with it the list shows the one key on every
/// server (LAN and WAN rings), and rotation is refused in one line.
#[test]
fn the_keyring_lists_the_encrypt_key_or_says_there_is_none() {
    let plain = Server::dev();
    for method in ["GET", "POST", "PUT", "DELETE"] {
        let body = (method != "GET")
            .then_some(r#"{"Key": "8CooQRX1+VK7MsQQK6lx2LhumpSfQzUjE63HdAu2hgA="}"#);
        let r = common::request(plain.http_addr, method, "/v1/operator/keyring", body);
        assert_eq!(r.status, 500, "{method}: {}", r.body);
        assert!(r.body.contains("without --encrypt"), "{method}: {}", r.body);
    }
    const KEY: &str = "q0rYb3IpZzBYF8kGMfJ0ZV1tqRk3eE2vK7m8Xo1nQ5c=";
    let s = Server::builder().dev().arg("--encrypt").arg(KEY).start();
    let rings = s.get_json("/v1/operator/keyring");
    let rings = rings.as_array().unwrap();
    assert_eq!(rings.len(), 2, "{rings:?}");
    for ring in rings {
        assert_eq!(ring["Keys"], json!({ KEY: 1 }), "{ring}");
        assert_eq!(ring["PrimaryKeys"], json!({ KEY: 1 }), "{ring}");
        assert_eq!(ring["NumNodes"], 1);
    }
    assert_eq!(rings.iter().filter(|r| r["WAN"] == true).count(), 1);
    let r = common::request(
        s.http_addr,
        "POST",
        "/v1/operator/keyring",
        Some(r#"{"Key": "8CooQRX1+VK7MsQQK6lx2LhumpSfQzUjE63HdAu2hgA="}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("not supported"), "{}", r.body);
    // `cairn keyring`, as `consul keyring` prints and fails.
    let o = cli(&s.url, &["keyring", "-list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        text,
        format!(
            "==> Gathering installed encryption keys...\n\nWAN:\n  {KEY} [1/1]\n\ndc1 (LAN):\n  {KEY} [1/1]\n"
        ),
        "{text}"
    );
    let o = cli(
        &s.url,
        &[
            "keyring",
            "-install",
            "8CooQRX1+VK7MsQQK6lx2LhumpSfQzUjE63HdAu2hgA=",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("error: Unexpected response code: 400"),
        "{err}"
    );
    let o = cli(&s.url, &["keyring", "-list", "-remove", KEY]);
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        "Only a single action is allowed"
    );

    // Under default deny: keyring:read to list, keyring:write to change.
    let guarded = acl_started(Server::builder().dev().arg("--encrypt").arg(KEY), "deny");
    assert_eq!(guarded.get("/v1/operator/keyring").status, 403);
    let (_, reader) = token_with_rules(guarded.http_addr, "keyring-read", r#"keyring = "read""#);
    let r = with(
        guarded.http_addr,
        "GET",
        "/v1/operator/keyring",
        None,
        &reader,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = with(
        guarded.http_addr,
        "DELETE",
        "/v1/operator/keyring",
        Some("{}"),
        &reader,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(
        with(guarded.http_addr, "GET", "/v1/operator/keyring", None, ROOT).status,
        200
    );
}

/// Feature gates (Consul's `/v1/operator/features`): cairn stages none of
/// its features behind one, so the list is empty and every name unknown,
/// in Consul's words; reads need operator:read, a setting operator:write;
/// Enterprise's utilization bundle answers as Consul CE answers it.
#[test]
fn feature_gates_are_none_and_said_so_in_consuls_words() {
    let s = common::acl::deny_server();
    let a = s.http_addr;
    let (_, reader) = token_with_rules(a, "or", r#"operator = "read""#);
    let anon = with(a, "GET", "/v1/operator/features", None, "");
    assert_eq!(anon.status, 403, "{}", anon.body);
    let r = with(a, "GET", "/v1/operator/features", None, &reader);
    assert_eq!((r.status, r.json()), (200, json!([])));
    assert!(r.header("x-consul-index").is_some());
    let r = with(
        a,
        "GET",
        "/v1/operator/feature/api-gateway-upstream-routing",
        None,
        &reader,
    );
    assert_eq!(
        (r.status, r.body.trim()),
        (
            404,
            r#"feature gate "api-gateway-upstream-routing" not found"#
        )
    );
    let set = Some(r#"{"Enabled": true}"#);
    let r = with(a, "PUT", "/v1/operator/feature/x", set, &reader);
    assert_eq!(r.status, 403, "one permission short: {}", r.body);
    let r = with(
        a,
        "PUT",
        "/v1/operator/feature/x",
        Some(r#"{"Enabled": "yes"}"#),
        ROOT,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.starts_with("error parsing feature gate setting"),
        "{}",
        r.body
    );
    let r = with(a, "PUT", "/v1/operator/feature/x", set, ROOT);
    assert_eq!(
        (r.status, r.body.trim()),
        (404, r#"feature gate "x" not found"#)
    );
    let r = with(a, "GET", "/v1/operator/feature/", None, ROOT);
    assert_eq!(
        (r.status, r.body.trim()),
        (400, "feature gate name is required")
    );
    let r = with(a, "GET", "/v1/operator/utilization", None, "");
    assert_eq!(
        (r.status, r.body.trim()),
        (404, "operator utilization requires Consul Enterprise")
    );
}
