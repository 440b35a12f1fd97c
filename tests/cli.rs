//! The `cairn` CLI against a real dev server: output, exit codes, and the
//! address fallbacks.

mod common;

use std::time::Duration;

use common::{Server, cli};
use serde_json::json;

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn services_register_list_and_deregister() {
    let s = Server::builder().dev().node("cli-node").start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.json");
    std::fs::write(
        &file,
        json!({"service": {
            "name": "web", "id": "web-1", "port": 8080, "tags": ["v1", "blue"],
            "meta": {"team_name": "x"},
            // The server's own port: the agent runs the check, and it passes.
            "check": {"http": format!("{}/v1/status/leader", s.url), "interval": "10s", "status": "passing"},
        }})
        .to_string(),
    )
    .unwrap();
    let o = cli(&s.url, &["services", "register", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "Registered service: web");

    // What the catalog holds: on the server's node (registered by the
    // server's own agent), address 127.0.0.1.
    let rows = s.get_json("/v1/catalog/service/web");
    assert_eq!(rows[0]["Node"], "cli-node");
    assert_eq!(rows[0]["Address"], "127.0.0.1");
    assert_eq!(rows[0]["ServiceID"], "web-1");
    assert_eq!(rows[0]["ServicePort"], 8080);
    assert_eq!(rows[0]["ServiceMeta"], json!({"team_name": "x"}));
    // The node's serfHealth (the server's agent is alive) and the service's.
    let health = s.get_json("/v1/health/service/web?passing");
    assert_eq!(health[0]["Checks"][0]["CheckID"], "serfHealth");
    assert_eq!(health[0]["Checks"][1]["CheckID"], "service:web-1");
    assert_eq!(health[0]["Checks"][1]["Type"], "http");

    // A bare PascalCase object works too; host:port addresses as well.
    let file2 = dir.path().join("db.json");
    std::fs::write(&file2, r#"{"Name": "db", "Port": 5432}"#).unwrap();
    let bare = s.http_addr.to_string();
    let o = cli(&bare, &["services", "register", file2.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));

    let o = cli(&s.url, &["catalog", "services"]);
    assert!(o.status.success());
    // The `consul` service (the server itself) is listed once the leader
    // has registered it.
    let listed: Vec<String> = out(&o)
        .lines()
        .filter(|l| *l != "consul")
        .map(String::from)
        .collect();
    assert_eq!(listed, ["db", "web"]);
    let o = cli(&s.url, &["catalog", "services", "-tags"]);
    let text = out(&o);
    assert!(
        text.lines()
            .any(|l| l.starts_with("web") && l.ends_with("blue,v1")),
        "{text}"
    );

    let o = cli(&s.url, &["catalog", "nodes"]);
    assert!(o.status.success());
    let text = out(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("Node") && lines[0].contains("Address"));
    assert!(lines[1].starts_with("cli-node") && lines[1].contains("127.0.0.1"));
    // Columns line up.
    assert_eq!(lines[0].find("Address"), lines[1].find("127.0.0.1"));

    let o = cli(&s.url, &["catalog", "nodes", "-format=json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["Node"], "cli-node");

    let o = cli(&s.url, &["services", "deregister", "web-1"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "Deregistered service: web-1");
    assert_eq!(s.get_json("/v1/catalog/service/web"), json!([]));
    assert_eq!(s.get_json("/v1/health/checks/web"), json!([]));
    let o = cli(&s.url, &["services", "deregister", "-id=web-1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("web-1"));

    // A broken definition is refused with a reason and changes nothing.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"service": {"name": "x", "port": 70000}}"#).unwrap();
    let o = cli(&s.url, &["services", "register", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("port"), "{}", err(&o));
    std::fs::write(&bad, "{not json").unwrap();
    let o = cli(&s.url, &["services", "register", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(s.get_json("/v1/catalog/services").get("x").is_none());
}

/// The check-definition fields Consul filters on survive the definition
/// parser, the catalog and `?filter` (HCL, snake_case).
#[test]
fn check_definition_fields_are_filterable() {
    let s = Server::builder().dev().node("cli-node").start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.hcl");
    std::fs::write(
        &file,
        r#"service {
  name = "web"
  port = 8080
  check {
    ttl               = "30s"
    disable_redirects = true
    h2ping_use_tls    = false
    output_max_size   = 8192
  }
}
"#,
    )
    .unwrap();
    let o = cli(&s.url, &["services", "register", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    let all = s.get_json("/v1/health/checks/web");
    let def = &all[0]["Definition"];
    assert_eq!(def["DisableRedirects"], true, "{all}");
    assert_eq!(def["H2PingUseTLS"], false, "{all}");
    assert_eq!(def["OutputMaxSize"], 8192, "{all}");
    for (filter, n) in [
        ("Definition.OutputMaxSize == 8192", 1),
        ("Definition.OutputMaxSize == 4096", 0),
        ("Definition.DisableRedirects == true", 1),
        ("Definition.H2PingUseTLS == true", 0),
    ] {
        let q = format!("/v1/health/checks/web?filter={}", common::enc(filter));
        let rows = s.get_json(&q);
        assert_eq!(rows.as_array().unwrap().len(), n, "{filter}: {rows}");
    }
}

#[test]
fn operator_members_and_kv() {
    let s = Server::builder().dev().node("solo").start();
    // Right after the election the leader may not show in the table yet.
    let text = common::eventually(
        Duration::from_secs(5),
        "list-peers shows the leader",
        || {
            let o = cli(&s.url, &["operator", "raft", "list-peers"]);
            assert!(o.status.success(), "{}", err(&o));
            let text = out(&o);
            text.contains("leader").then_some(text)
        },
    );
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["Node", "ID", "Address", "State", "Voter", "RaftProtocol"]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[0], "solo");
    assert_eq!(row[2], s.raft_addr.to_string());
    assert_eq!(&row[3..], ["leader", "true", "3"]);

    let o = cli(&s.url, &["members"]);
    assert!(o.status.success());
    let text = out(&o);
    assert!(text.starts_with("Node"), "{text}");
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["solo", &s.raft_addr.to_string(), "alive", "server"]
    );

    let o = cli(&s.url, &["kv", "put", "app/config", "hello world"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "Success! Data written to: app/config");
    let o = cli(&s.url, &["kv", "get", "app/config"]);
    assert_eq!(out(&o), "hello world\n");
    let o = cli(&s.url, &["kv", "get", "app/missing"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("No key exists at: app/missing"));

    let o = cli(&s.url, &["operator", "raft", "remove-peer", "-id=ghost"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("ghost"), "{}", err(&o));
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let port = common::free_port();
    for addr in [
        format!("127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}"),
    ] {
        let o = cli(&addr, &["catalog", "nodes"]);
        assert_eq!(o.status.code(), Some(1));
        let e = err(&o);
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(e.to_lowercase().contains("refused"), "{e}");
        assert!(out(&o).is_empty());
    }
    // CONSUL_HTTP_ADDR is the fallback when CAIRN_HTTP_ADDR is unset.
    let o = std::process::Command::new(common::bin())
        .args(["members"])
        .env_remove("CAIRN_HTTP_ADDR")
        .env("CONSUL_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains(&format!("127.0.0.1:{port}")));
}

#[test]
fn config_entries_and_discovery_chain() {
    let s = Server::builder().dev().node("cfg").start();
    let dir = tempfile::tempdir().unwrap();

    // HCL, Consul's CamelCase and snake_case keys alike.
    let hcl = dir.path().join("web.hcl");
    std::fs::write(
        &hcl,
        "Kind = \"service-defaults\"\nName = \"web\"\nprotocol = \"http\"\n",
    )
    .unwrap();
    let o = cli(&s.url, &["config", "write", hcl.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "Config entry written: service-defaults/web");
    let e = s.get_json("/v1/config/service-defaults/web");
    assert_eq!(e["Protocol"], "http");

    // JSON, and a second entry of the kind.
    let js = dir.path().join("api.json");
    std::fs::write(
        &js,
        json!({"Kind": "service-defaults", "Name": "api", "Protocol": "grpc"}).to_string(),
    )
    .unwrap();
    let o = cli(&s.url, &["config", "write", js.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "Config entry written: service-defaults/api");

    // Standard input.
    let mut child = std::process::Command::new(common::bin())
        .args(["config", "write", "-"])
        .env("CAIRN_HTTP_ADDR", &s.url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"kind = \"proxy-defaults\"\nname = \"global\"\nconfig {\n  local_connect_timeout_ms = 1000\n}\n")
            .unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        out(&o).trim(),
        "Config entry written: proxy-defaults/global"
    );

    // read (Consul's single-dash flags and clap's double-dash ones), list.
    let o = cli(
        &s.url,
        &[
            "config",
            "read",
            "-kind",
            "service-defaults",
            "-name",
            "web",
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).contains("\n  \"Protocol\": \"http\""),
        "{}",
        out(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["Kind"], "service-defaults");
    assert_eq!(v["Name"], "web");
    let o = cli(&s.url, &["config", "list", "--kind=service-defaults"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "api\nweb\n");

    // The compiled chain of an http service.
    let o = cli(&s.url, &["discovery-chain", "web"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["Chain"]["ServiceName"], "web");
    assert_eq!(v["Chain"]["Protocol"], "http");

    // A refused write: routes on a tcp service. The server's reason, exit 1.
    let bad = dir.path().join("router.hcl");
    std::fs::write(
        &bad,
        r#"Kind = "service-router"
Name = "db"
Routes = [
  {
    Match = { HTTP = { PathPrefix = "/admin" } }
    Destination = { Service = "admin" }
  }
]
"#,
    )
    .unwrap();
    let o = cli(&s.url, &["config", "write", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("400"), "{}", err(&o));
    assert!(
        err(&o).contains("does not permit advanced routing"),
        "{}",
        err(&o)
    );
    assert!(out(&o).is_empty());
    assert_eq!(s.get("/v1/config/service-router/db").status, 404);
    // Unparsable input is an error too.
    std::fs::write(&bad, "Kind = ").unwrap();
    let o = cli(&s.url, &["config", "write", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("router.hcl"), "{}", err(&o));

    // delete; reading it afterwards fails.
    let o = cli(
        &s.url,
        &["config", "delete", "-kind=service-defaults", "-name=api"],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "Config entry deleted: service-defaults/api");
    let o = cli(&s.url, &["config", "list", "-kind", "service-defaults"]);
    assert_eq!(out(&o), "web\n");
    let o = cli(
        &s.url,
        &["config", "read", "-kind=service-defaults", "-name=api"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("not found"), "{}", err(&o));
}

#[test]
fn services_register_hcl() {
    let s = Server::builder().dev().node("hcl-node").start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.hcl");
    std::fs::write(
        &file,
        format!(
            r#"service {{
  name = "web"
  id   = "web-1"
  port = 80
  tags = ["a"]
  meta {{
    team = "x"
  }}
  check {{
    http     = "{url}/v1/status/leader"
    interval = "10s"
    status   = "passing"
  }}
}}
"#,
            url = s.url
        ),
    )
    .unwrap();
    let o = cli(&s.url, &["services", "register", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "Registered service: web");
    let rows = s.get_json("/v1/catalog/service/web");
    assert_eq!(rows[0]["ServiceID"], "web-1");
    assert_eq!(rows[0]["ServicePort"], 80);
    assert_eq!(rows[0]["ServiceTags"], json!(["a"]));
    assert_eq!(rows[0]["ServiceMeta"], json!({"team": "x"}));
    let health = s.get_json("/v1/health/service/web?passing");
    let checks = health[0]["Checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2, "{checks:?}");
    assert_eq!(checks[0]["CheckID"], "serfHealth");
    assert_eq!(checks[1]["CheckID"], "service:web-1");
    assert_eq!(checks[1]["Type"], "http");

    // Two check blocks are two checks; two service blocks two services.
    std::fs::write(
        &file,
        r#"service {
  name = "db"
  check {
    ttl = "30s"
  }
  check {
    tcp      = "127.0.0.1:5432"
    interval = "5s"
  }
}
service {
  name = "cache"
}
"#,
    )
    .unwrap();
    let o = cli(&s.url, &["services", "register", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        out(&o),
        "Registered service: db\nRegistered service: cache\n"
    );
    let checks = s.get_json("/v1/health/checks/db");
    let mut ids: Vec<&str> = checks
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["CheckID"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["service:db:1", "service:db:2"]);
    assert_eq!(
        s.get_json("/v1/catalog/service/cache")[0]["ServiceName"],
        "cache"
    );
}

/// Logs sent to a file carry no terminal colour codes (`cairn server 2> log`
/// is read by people and log shippers), as Consul's.
#[test]
fn a_servers_log_written_to_a_file_has_no_colour_codes() {
    let s = Server::builder().dev().start();
    // Its agent's registration is logged once the node takes part.
    common::eventually(Duration::from_secs(10), "log lines", || {
        s.log().contains("INFO").then_some(())
    });
    let log = s.log();
    assert!(!log.contains('\u{1b}'), "escape codes in the log:\n{log}");
}

/// `cairn version` and `GET /v1/agent/version` (Consul's shape, no ACL)
/// name the Consul release whose API cairn follows, and cairn's own.
#[test]
fn version_is_told_by_the_cli_and_the_agent_endpoint() {
    let s = Server::builder()
        .dev()
        .acl("deny", "6f1c2a4e-0000-4000-8000-00000000000c")
        .start();
    // ACLs on: /v1/agent/self needs agent:read, /v1/agent/version nothing.
    assert_eq!(s.get("/v1/agent/self").status, 403);
    let v = s.get_json("/v1/agent/version");
    let human = v["HumanVersion"].as_str().unwrap().to_string();
    let (api, meta) = human.split_once('+').unwrap();
    assert!(api.split('.').count() == 3, "{human}");
    assert_eq!(meta, concat!("cairn-", env!("CARGO_PKG_VERSION")));
    let o = std::process::Command::new(common::bin())
        .arg("version")
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = out(&o);
    assert!(
        text.starts_with(concat!("cairn v", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(text.contains(&format!("Consul API v{api}")), "{text}");
}
