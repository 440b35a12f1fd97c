//! ACLs against real servers: default deny, key and service rules with
//! Consul's 403 text and list filtering, bootstrap once, the three token
//! carriers, a deleted token refused by every server of a cluster within a
//! second, an agent's anti-entropy with its token, and no secret in logs.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::acl::{DENY_ARGS, ROOT, as_root, deny_server, token_with_rules, with};
use common::agent::Agent;
use common::{Resp, Server, eventually, request_with};
use serde_json::{Value, json};

/// A token whose one rule grants `policy` on the service "web" (policy
/// "web-<policy>"); returns (accessor, secret).
fn web_token(addr: SocketAddr, policy: &str) -> (String, String) {
    let rules = format!(r#"service "web" {{ policy = "{policy}" }}"#);
    token_with_rules(addr, &format!("web-{policy}"), &rules)
}

/// ACLs on with default deny and no management token yet: the test
/// bootstraps one.
fn unbootstrapped_server() -> Server {
    Server::builder()
        .dev()
        .arg("--acl-enabled")
        .arg("--acl-default-policy")
        .arg("deny")
        .start()
}

/// The rules of a client agent's own token: it writes every node and
/// service (anti-entropy).
const AGENT_RULES: &str =
    "node_prefix \"\" { policy = \"write\" }\nservice_prefix \"\" { policy = \"write\" }";

/// A client agent of `s` named `node`, its agent token of `AGENT_RULES`.
fn agent_of(s: &Server, node: &str) -> Agent {
    let (_, secret) = token_with_rules(s.http_addr, "agent", AGENT_RULES);
    Agent::builder(node, &s.url)
        .arg("--acl-agent-token")
        .arg(&secret)
        .start()
}

/// Writes `v` at each key with the management token.
fn put_keys(addr: SocketAddr, keys: &[&str]) {
    for k in keys {
        let r = with(addr, "PUT", &format!("/v1/kv/{k}"), Some("v"), ROOT);
        assert_eq!(r.status, 200, "{k}: {}", r.body);
    }
}

#[test]
fn default_deny_refuses_anonymous_writes_and_a_key_prefix_token_writes_only_its_prefix() {
    let s = deny_server();
    let r = s.put("/v1/kv/app/x", "v");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.starts_with("Permission denied"), "{}", r.body);
    assert_eq!(s.get("/v1/kv/app/x").status, 403);

    let (accessor, secret) = token_with_rules(
        s.http_addr,
        "app-writer",
        r#"key_prefix "app/" { policy = "write" }"#,
    );
    let r = with(s.http_addr, "PUT", "/v1/kv/app/x", Some("v"), &secret);
    assert_eq!((r.status, r.body.as_str()), (200, "true"));
    let r = with(s.http_addr, "PUT", "/v1/kv/other/x", Some("v"), &secret);
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body,
        format!(
            "Permission denied: token with AccessorID '{accessor}' lacks permission 'key:write' on \"other/x\""
        )
    );
    // Nothing was written by the refused request.
    assert_eq!(
        with(s.http_addr, "GET", "/v1/kv/other/x", None, ROOT).status,
        404
    );

    // The three carriers, in Consul's order of precedence.
    let bearer = format!("Bearer {secret}");
    let r = request_with(
        s.http_addr,
        "GET",
        "/v1/kv/app/x",
        None,
        &[("Authorization", &bearer)],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.get(&format!("/v1/kv/app/x?token={secret}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request_with(
        s.http_addr,
        "GET",
        &format!("/v1/kv/app/x?token={ROOT}"),
        None,
        &[
            ("X-Consul-Token", &secret),
            ("Authorization", "Bearer nonsense"),
        ],
    );
    assert_eq!(r.status, 200, "the header wins over the others: {}", r.body);

    // An unknown secret is not the anonymous token.
    let r = with(s.http_addr, "GET", "/v1/kv/app/x", None, "no-such-secret");
    assert_eq!((r.status, r.body.as_str()), (403, "ACL not found"));

    // A policy with rules that do not parse is refused, naming why.
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/acl/policy",
        Some(
            &json!({ "Name": "bad", "Rules": "key_prefix \"\" { policy = \"bogus\" }" })
                .to_string(),
        ),
        ROOT,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("bogus"), "{}", r.body);
}

#[test]
fn a_service_deny_rule_hides_the_service_from_lists_with_the_filtered_header() {
    let s = deny_server();
    for (node, svc) in [("n1", "web"), ("n2", "db")] {
        let body = json!({ "Node": node, "Address": "10.0.0.1", "Service": { "Service": svc, "Port": 80 } });
        as_root(s.http_addr, "PUT", "/v1/catalog/register", &body);
    }
    let (_, secret) = token_with_rules(
        s.http_addr,
        "reader",
        r#"
service_prefix "" { policy = "read" }
service "web" { policy = "deny" }
node_prefix "" { policy = "read" }
"#,
    );
    let r = with(s.http_addr, "GET", "/v1/catalog/services", None, &secret);
    assert_eq!(r.status, 200, "{}", r.body);
    let names: Vec<String> = r.json().as_object().unwrap().keys().cloned().collect();
    assert!(names.contains(&"db".to_string()), "{names:?}");
    assert!(!names.contains(&"web".to_string()), "{names:?}");
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));

    let r = with(s.http_addr, "GET", "/v1/health/service/web", None, &secret);
    assert_eq!((r.status, r.json()), (200, json!([])));
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));
    let r = with(s.http_addr, "GET", "/v1/catalog/service/db", None, &secret);
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), None);

    // The management token sees everything, unmarked.
    let r = with(s.http_addr, "GET", "/v1/catalog/services", None, ROOT);
    assert!(r.json().get("web").is_some());
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), None);
}

#[test]
fn bootstrap_works_once() {
    let s = unbootstrapped_server();
    let r = s.put("/v1/acl/bootstrap", "");
    assert_eq!(r.status, 200, "{}", r.body);
    let t = r.json();
    let secret = t["SecretID"].as_str().unwrap().to_string();
    assert_eq!(t["Policies"][0]["Name"], "global-management");
    let r = with(s.http_addr, "GET", "/v1/acl/tokens", None, &secret);
    assert_eq!(r.status, 200, "{}", r.body);
    // Later reads show it to acl:write, as Consul's do (a dev server seals
    // it under a key of its own; tests below cover --encrypt and no key).
    assert!(r.body.contains(&secret), "{}", r.body);

    let r = s.put("/v1/acl/bootstrap", "");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        r.body.contains("ACL bootstrap no longer allowed"),
        "{}",
        r.body
    );
    // Not even a management token may bootstrap again.
    let r = with(s.http_addr, "PUT", "/v1/acl/bootstrap", Some(""), &secret);
    assert_eq!(r.status, 403);
}

/// With an initial management token, that token is the bootstrap (as in
/// Consul): an anonymous bootstrap is refused with the reset index, and
/// the reset file in the leader's data dir allows exactly one more.
#[test]
fn an_initial_management_token_is_the_bootstrap_and_the_reset_file_allows_one_more() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::durable("s1", dir.path()).acl("deny", ROOT).start();
    eventually(Duration::from_secs(10), "the management token", || {
        (with(s.http_addr, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    let r = s.put("/v1/acl/bootstrap", "");
    assert_eq!(
        r.status, 403,
        "an anonymous bootstrap must be refused: {}",
        r.body
    );
    let reset: u64 = r
        .body
        .split("reset index: ")
        .nth(1)
        .and_then(|rest| {
            rest.trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no reset index in {:?}", r.body));
    assert!(
        r.body
            .starts_with("Permission denied: ACL bootstrap no longer allowed"),
        "{}",
        r.body
    );
    let reset_file = dir.path().join("acl-bootstrap-reset");
    // Another index than the one reported: refused, the file stays.
    std::fs::write(&reset_file, format!("{}\n", reset + 1)).unwrap();
    let r = s.put("/v1/acl/bootstrap", "");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("Invalid bootstrap reset index"),
        "{}",
        r.body
    );
    assert!(reset_file.exists());
    // The reported index: one more bootstrap, and the file is gone.
    std::fs::write(&reset_file, format!("{reset}\n")).unwrap();
    let r = s.put("/v1/acl/bootstrap", "");
    assert_eq!(r.status, 200, "{}", r.body);
    let secret = r.json()["SecretID"].as_str().unwrap().to_string();
    assert_eq!(
        with(s.http_addr, "GET", "/v1/acl/tokens", None, &secret).status,
        200
    );
    assert!(!reset_file.exists());
    let r = s.put("/v1/acl/bootstrap", "");
    assert_eq!(r.status, 403, "{}", r.body);
}

/// A token that expires while its blocking read waits is refused at its
/// expiry (`403 ACL not found`), as a deleted one is at the ACL change,
/// not served to the end of a long wait. On the main before this, the
/// read waited its 30 s and answered 200 with the expired token.
#[test]
fn a_blocking_read_ends_at_its_tokens_expiry() {
    let s = deny_server();
    assert_eq!(
        with(s.http_addr, "PUT", "/v1/kv/k", Some("v"), ROOT).status,
        200
    );
    as_root(
        s.http_addr,
        "PUT",
        "/v1/acl/policy",
        &json!({ "Name": "kv-read", "Rules": r#"key_prefix "" { policy = "read" }"# }),
    );
    let body = json!({ "Policies": [{ "Name": "kv-read" }], "ExpirationTTL": "3s" });
    let secret = as_root(s.http_addr, "PUT", "/v1/acl/token", &body).json()["SecretID"]
        .as_str()
        .unwrap()
        .to_string();
    let r = with(s.http_addr, "GET", "/v1/kv/k", None, &secret);
    assert_eq!(r.status, 200, "{}", r.body);
    let index = r.index();
    let started = Instant::now();
    let r = with(
        s.http_addr,
        "GET",
        &format!("/v1/kv/k?index={index}&wait=30s"),
        None,
        &secret,
    );
    assert_eq!((r.status, r.body.as_str()), (403, "ACL not found"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );
}

/// The leader deletes a token once its `ExpirationTime` has passed (as
/// Consul's token reaping does: logins with a `MaxTokenTTL` would pile up
/// otherwise); a token without one stays.
#[test]
fn the_leader_deletes_expired_tokens() {
    let s = deny_server();
    let short = json!({ "Description": "short", "ExpirationTTL": "1s" });
    let short = as_root(s.http_addr, "PUT", "/v1/acl/token", &short).json();
    let kept = json!({ "Description": "kept" });
    let kept = as_root(s.http_addr, "PUT", "/v1/acl/token", &kept).json();
    let path = |t: &Value| format!("/v1/acl/token/{}", t["AccessorID"].as_str().unwrap());
    eventually(
        Duration::from_secs(30),
        "the expired token's delete",
        || (with(s.http_addr, "GET", &path(&short), None, ROOT).status == 403).then_some(()),
    );
    let listed = with(s.http_addr, "GET", "/v1/acl/tokens", None, ROOT).json();
    let descriptions: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["Description"].as_str())
        .collect();
    assert!(!descriptions.contains(&"short"), "{descriptions:?}");
    assert_eq!(
        with(s.http_addr, "GET", &path(&kept), None, ROOT).status,
        200
    );
}

#[test]
fn a_deleted_token_is_refused_by_every_server_within_a_second() {
    let servers = common::cluster(3, &DENY_ARGS);
    for s in &servers {
        s.wait_for_leader(Duration::from_secs(30));
    }
    let first = servers[0].http_addr;
    eventually(Duration::from_secs(10), "the management token", || {
        (with(first, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    let with_kv = with(first, "PUT", "/v1/kv/shared", Some("v"), ROOT);
    assert_eq!(with_kv.status, 200);
    let (accessor, secret) =
        token_with_rules(first, "kv-reader", r#"key_prefix "" { policy = "read" }"#);
    // `?stale`: each server answers (and resolves the token) itself.
    for s in &servers {
        eventually(Duration::from_secs(5), "the token on every server", || {
            (with(s.http_addr, "GET", "/v1/kv/shared?stale", None, &secret).status == 200)
                .then_some(())
        });
    }
    let r = with(
        first,
        "DELETE",
        &format!("/v1/acl/token/{accessor}"),
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let deleted = Instant::now();
    for s in &servers {
        loop {
            let r = with(s.http_addr, "GET", "/v1/kv/shared?stale", None, &secret);
            if r.status == 403 {
                assert_eq!(r.body, "ACL not found");
                break;
            }
            assert!(
                deleted.elapsed() < Duration::from_secs(1),
                "{} still takes the deleted token after {:?}",
                s.name(),
                deleted.elapsed()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn an_agent_with_its_token_keeps_anti_entropy_working_under_default_deny() {
    let s = deny_server();
    let (_, secret) = token_with_rules(s.http_addr, "agent", AGENT_RULES);
    let mut a = Agent::builder("ac1", &s.url)
        .arg("--acl-agent-token")
        .arg(&secret)
        .arg("--acl-token")
        .arg(&secret)
        .start();
    let r = a.put(
        "/v1/agent/service/register",
        r#"{"Name": "api", "ID": "api-1", "Port": 9000}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(
        Duration::from_secs(15),
        "the agent's service in the catalog",
        || {
            let r = with(s.http_addr, "GET", "/v1/catalog/service/api", None, ROOT);
            (r.status == 200 && r.json().as_array().is_some_and(|l| l.len() == 1)).then_some(())
        },
    );
    // Its node is alive (heartbeats carry the token too).
    let r = with(s.http_addr, "GET", "/v1/health/node/ac1", None, ROOT);
    let checks = r.json();
    let serf = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["CheckID"] == "serfHealth")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(serf["Status"], "passing", "{checks}");
    // A request forwarded without a token acts as the agent's --acl-token.
    let r = a.get("/v1/catalog/service/api");
    assert_eq!(r.json().as_array().unwrap().len(), 1, "{}", r.body);
    a.stop();
}

#[test]
fn a_token_in_the_query_string_never_reaches_the_log() {
    let s = Server::builder()
        .dev()
        .acl("deny", ROOT)
        .env("RUST_LOG", "debug,openraft=warn,sled=warn,hyper=warn")
        .start();
    eventually(Duration::from_secs(10), "the management token", || {
        (s.get(&format!("/v1/acl/token/self?token={ROOT}")).status == 200).then_some(())
    });
    assert_eq!(s.put(&format!("/v1/kv/k?token={ROOT}"), "v").status, 200);
    assert_eq!(s.get(&format!("/v1/kv/k?token={ROOT}")).status, 200);
    let log = s.log();
    assert!(
        log.contains("/v1/kv/k"),
        "requests are logged at debug: {log}"
    );
    assert!(!log.contains(ROOT), "a secret in the log:\n{log}");
}

/// Runs the CLI against `s` with `env` set (tokens unset otherwise).
fn cli_with(s: &Server, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    std::process::Command::new(common::bin())
        .args(args)
        .env("CAIRN_HTTP_ADDR", s.http_addr.to_string())
        .env_remove("CONSUL_HTTP_ADDR")
        .env_remove("CAIRN_HTTP_TOKEN")
        .env_remove("CONSUL_HTTP_TOKEN")
        .envs(env.iter().copied())
        .output()
        .expect("run cairn")
}

fn stdout_ok(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The value of a `Name:   value` line of Consul's CLI output.
fn field(out: &str, name: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}

#[test]
fn the_cli_bootstraps_and_uses_tokens_from_the_environment_and_the_flag() {
    let s = unbootstrapped_server();
    let out = stdout_ok(&cli_with(&s, &[], &["acl", "bootstrap"]));
    let root = field(&out, "SecretID");
    assert!(out.contains("global-management"), "{out}");

    // Without a token the CLI is the anonymous token: refused.
    let o = cli_with(&s, &[], &["acl", "token", "list"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("403"), "{o:?}");

    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("app.hcl");
    std::fs::write(&rules, r#"key_prefix "app/" { policy = "write" }"#).unwrap();
    let root_env = [("CAIRN_HTTP_TOKEN", root.as_str())];
    let out = stdout_ok(&cli_with(
        &s,
        &root_env,
        &[
            "acl",
            "policy",
            "create",
            "-name",
            "app",
            "-rules",
            &format!("@{}", rules.display()),
        ],
    ));
    assert_eq!(field(&out, "Name"), "app");
    let out = stdout_ok(&cli_with(
        &s,
        &root_env,
        &[
            "acl",
            "token",
            "create",
            "-description",
            "app token",
            "-policy-name",
            "app",
        ],
    ));
    let secret = field(&out, "SecretID");
    let accessor = field(&out, "AccessorID");
    assert!(out.contains(" - app"), "{out}");

    // CONSUL_HTTP_TOKEN is the fallback; -token wins over both.
    let consul_env = [("CONSUL_HTTP_TOKEN", secret.as_str())];
    stdout_ok(&cli_with(&s, &consul_env, &["kv", "put", "app/x", "1"]));
    let o = cli_with(&s, &consul_env, &["kv", "put", "other/x", "1"]);
    assert!(!o.status.success(), "outside its prefix");
    let both = [
        ("CAIRN_HTTP_TOKEN", "no-such-secret"),
        ("CONSUL_HTTP_TOKEN", "no-such-secret"),
    ];
    stdout_ok(&cli_with(
        &s,
        &both,
        &["kv", "put", "-token", &secret, "app/y", "1"],
    ));

    let out = stdout_ok(&cli_with(&s, &root_env, &["acl", "token", "list"]));
    // A management token lists the secrets too, as `consul acl token list`.
    assert!(out.contains(&accessor) && out.contains(&secret), "{out}");
    stdout_ok(&cli_with(
        &s,
        &root_env,
        &["acl", "token", "delete", "-id", &accessor],
    ));
    let o = cli_with(&s, &consul_env, &["kv", "put", "app/z", "1"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ACL not found"),
        "{o:?}"
    );
}

#[test]
fn a_servers_agent_endpoints_need_service_write() {
    let s = deny_server();
    let body = r#"{"Name": "web", "ID": "web-1", "Port": 80}"#;
    let r = s.put("/v1/agent/service/register", body);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("'service:write' on \"web\""), "{}", r.body);
    let (_, secret) = web_token(s.http_addr, "write");
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/agent/service/register",
        Some(body),
        &secret,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Listed to its writer, hidden from the anonymous token.
    let r = with(s.http_addr, "GET", "/v1/agent/services", None, &secret);
    assert!(r.json().get("web-1").is_some(), "{}", r.body);
    assert!(s.get("/v1/agent/services").json().get("web-1").is_none());
    // Clients read whether the server enforces ACLs from DebugConfig.
    let me = with(s.http_addr, "GET", "/v1/agent/self", None, ROOT);
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!(me.json()["DebugConfig"]["ACLsEnabled"], true, "{}", me.body);
}

/// Connect under ACLs: the CA configuration is the operator's, intentions
/// are written by who may write intentions towards their destination, and
/// with default deny a pair no intention names is denied.
#[test]
fn connect_endpoints_check_their_permissions_and_intentions_default_to_deny() {
    let s = deny_server();
    let r = s.get("/v1/connect/ca/configuration");
    assert_eq!(r.status, 403, "{}", r.body);
    let r = with(
        s.http_addr,
        "GET",
        "/v1/connect/ca/configuration",
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    let (_, secret) = token_with_rules(
        s.http_addr,
        "db-intentions",
        "service \"db\" {\n  policy = \"read\"\n  intentions = \"write\"\n}",
    );
    let exact = "/v1/connect/intentions/exact?source=web&destination=";
    let r = with(
        s.http_addr,
        "PUT",
        &format!("{exact}api"),
        Some(r#"{"Action":"allow"}"#),
        &secret,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("intention:write"), "{}", r.body);
    let r = with(
        s.http_addr,
        "PUT",
        &format!("{exact}db"),
        Some(r#"{"Action":"allow"}"#),
        &secret,
    );
    assert_eq!((r.status, r.body.as_str()), (200, "true"));

    let check = |src: &str, dst: &str| {
        let r = with(
            s.http_addr,
            "GET",
            &format!("/v1/connect/intentions/check?source={src}&destination={dst}"),
            None,
            ROOT,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["Allowed"].clone()
    };
    assert_eq!(check("web", "db"), json!(true));
    // No intention names web → api: the ACL default (deny) decides.
    assert_eq!(check("web", "api"), json!(false));
}

/// Roles go through the same endpoints as policies: create, read by ID and
/// by name, update, list, delete, with Consul's refusals.
#[test]
fn roles_are_created_read_updated_listed_and_deleted() {
    let s = deny_server();
    let a = s.http_addr;
    let r = with(
        a,
        "PUT",
        "/v1/acl/policy",
        Some(r#"{"Name":"p1","Rules":""}"#),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = with(
        a,
        "PUT",
        "/v1/acl/role",
        Some(r#"{"Name":"r1","Policies":[{"Name":"p1"}]}"#),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["ID"].as_str().unwrap().to_string();
    assert_eq!(r.json()["Policies"][0]["Name"], "p1");
    let r = with(a, "PUT", "/v1/acl/role", Some(r#"{"Name":"r1"}"#), ROOT);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("already exists"), "{}", r.body);
    assert_eq!(
        with(a, "GET", "/v1/acl/role/name/r1", None, ROOT).json()["ID"],
        id.as_str()
    );
    let r = with(
        a,
        "PUT",
        &format!("/v1/acl/role/{id}"),
        Some(r#"{"Name":"r2"}"#),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        with(a, "GET", &format!("/v1/acl/role/{id}"), None, ROOT).json()["Name"],
        "r2"
    );
    assert_eq!(
        with(
            a,
            "PUT",
            "/v1/acl/role/nope",
            Some(r#"{"Name":"r3"}"#),
            ROOT
        )
        .status,
        400
    );
    assert_eq!(
        with(a, "GET", "/v1/acl/roles", None, ROOT)
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Reading roles needs acl:read.
    assert_eq!(s.get("/v1/acl/roles").status, 403);
    assert_eq!(
        with(a, "DELETE", &format!("/v1/acl/role/{id}"), None, ROOT).body,
        "true"
    );
    assert_eq!(
        with(a, "GET", "/v1/acl/roles", None, ROOT).json(),
        json!([])
    );

    // A role or policy that does not exist is 404 in Consul's words
    // (1.17+), by ID and by name; to a caller without acl:read it is the
    // same 403 as one that exists. A token that does not exist is still
    // Consul's 403, a policy ID that is no UUID a 400.
    for (path, kind) in [
        (format!("/v1/acl/role/{id}"), "role"),
        ("/v1/acl/role/name/r2".to_string(), "role"),
        (
            "/v1/acl/policy/00000000-0000-0000-0000-0000000000aa".to_string(),
            "policy",
        ),
        ("/v1/acl/policy/name/nope".to_string(), "policy"),
    ] {
        let r = with(a, "GET", &path, None, ROOT);
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                404,
                format!("Requested {kind} does not exist: ACL not found").as_str()
            ),
            "{path}"
        );
        assert_eq!(s.get(&path).status, 403, "{path}");
    }
    let r = with(
        a,
        "GET",
        "/v1/acl/token/00000000-0000-0000-0000-0000000000aa",
        None,
        ROOT,
    );
    assert_eq!((r.status, r.body.as_str()), (403, "ACL not found"));
    let r = with(a, "GET", "/v1/acl/policy/unknown", None, ROOT);
    assert_eq!(r.status, 400, "{}", r.body);
}

/// Blocking queries parked on this server (read with the management token:
/// metrics need `agent:read`).
fn parked(addr: SocketAddr) -> u64 {
    common::metric_in(
        &with(addr, "GET", common::METRICS, None, ROOT).body,
        "cairn_blocking_queries_parked",
    ) as u64
}

/// Starts a blocking read of `path` (which carries `?index=`) with
/// `token`, and returns once the server holds it parked.
fn park(addr: SocketAddr, path: String, token: &str) -> std::thread::JoinHandle<Resp> {
    let before = parked(addr);
    let token = token.to_string();
    let h = std::thread::spawn(move || with(addr, "GET", &path, None, &token));
    eventually(Duration::from_secs(10), "the query parked", || {
        (parked(addr) > before).then_some(())
    });
    h
}

/// A blocking query is checked against the ACLs of the version it wakes
/// to, not those of its start: a policy narrowed while it waited filters
/// its rows (or refuses a single key), a deleted token is refused.
#[test]
fn a_parked_blocking_query_answers_with_the_acls_in_force_when_it_wakes() {
    let s = deny_server();
    let a = s.http_addr;
    put_keys(a, &["app/a", "app/b"]);
    let (accessor, secret) =
        token_with_rules(a, "app-reader", r#"key_prefix "app/" { policy = "read" }"#);
    let r = with(a, "GET", "/v1/kv/app/?recurse", None, &secret);
    assert_eq!(r.json().as_array().map(Vec::len), Some(2), "{}", r.body);
    let index = r.header("x-consul-index").unwrap().to_string();
    let keys_of = |r: &Resp| -> Vec<String> {
        r.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["Key"].as_str().unwrap().to_string())
            .collect()
    };
    let policy = with(a, "GET", "/v1/acl/policy/name/app-reader", None, ROOT).json();
    let narrow = |rules: &str| {
        let body = json!({ "Name": "app-reader", "Rules": rules }).to_string();
        let path = format!("/v1/acl/policy/{}", policy["ID"].as_str().unwrap());
        assert_eq!(with(a, "PUT", &path, Some(&body), ROOT).status, 200);
    };

    // A list: the rows the narrowed policy no longer grants are dropped.
    let list = park(
        a,
        format!("/v1/kv/app/?recurse&index={index}&wait=30s"),
        &secret,
    );
    let single = park(a, format!("/v1/kv/app/b?index={index}&wait=30s"), &secret);
    narrow(r#"key_prefix "app/a" { policy = "read" }"#);
    // The ACL write does not wake them (nor Consul's); a write to the keys does.
    assert_eq!(with(a, "PUT", "/v1/kv/app/b", Some("w"), ROOT).status, 200);
    let r = list.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(keys_of(&r), ["app/a"]);
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));
    let r = single.join().unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("'key:read' on \"app/b\""), "{}", r.body);

    // A deleted token: refused when the query wakes.
    let index = with(a, "GET", "/v1/kv/app/?recurse", None, ROOT)
        .header("x-consul-index")
        .unwrap()
        .to_string();
    let list = park(
        a,
        format!("/v1/kv/app/?recurse&index={index}&wait=30s"),
        &secret,
    );
    let path = format!("/v1/acl/token/{accessor}");
    assert_eq!(with(a, "DELETE", &path, None, ROOT).status, 200);
    assert_eq!(with(a, "PUT", "/v1/kv/app/a", Some("w"), ROOT).status, 200);
    let r = list.join().unwrap();
    assert_eq!((r.status, r.body.as_str()), (403, "ACL not found"));
}

/// A client agent checks the caller's token on its own endpoints as a
/// server does (resolved through its server), while its anti-entropy keeps
/// writing with its agent token.
#[test]
fn a_client_agents_own_endpoints_check_the_callers_token() {
    let s = deny_server();
    let (_, web) = web_token(s.http_addr, "write");
    let mut ag = agent_of(&s, "ac2");
    let at = ag.http_addr;
    let register = "/v1/agent/service/register";
    let web_body = r#"{"Name": "web", "ID": "web-1", "Port": 80}"#;

    let r = ag.put(register, web_body);
    assert_eq!(r.status, 403, "anonymous: {}", r.body);
    assert!(r.body.contains("'service:write' on \"web\""), "{}", r.body);
    let r = with(at, "PUT", register, Some(web_body), "no-such-secret");
    assert_eq!((r.status, r.body.as_str()), (403, "ACL not found"));
    let r = with(
        at,
        "PUT",
        register,
        Some(r#"{"Name": "db", "Port": 81}"#),
        &web,
    );
    assert_eq!(r.status, 403, "outside its rules: {}", r.body);

    let r = with(at, "PUT", register, Some(web_body), &web);
    assert_eq!(r.status, 200, "{}", r.body);
    // Anti-entropy wrote it with the agent token.
    eventually(Duration::from_secs(15), "web in the catalog", || {
        let r = with(s.http_addr, "GET", "/v1/catalog/service/web", None, ROOT);
        (r.json().as_array().is_some_and(|l| l.len() == 1)).then_some(())
    });
    // Reads are filtered: the anonymous token sees nothing of web.
    assert!(ag.get_json("/v1/agent/services").get("web-1").is_none());
    let r = with(at, "GET", "/v1/agent/services", None, &web);
    assert!(r.json().get("web-1").is_some(), "{}", r.body);
    // A check on web needs service:write on web.
    let check = r#"{"Name": "web-ttl", "ServiceID": "web-1", "TTL": "10m"}"#;
    assert_eq!(ag.put("/v1/agent/check/register", check).status, 403);
    let r = with(at, "PUT", "/v1/agent/check/register", Some(check), &web);
    assert_eq!(r.status, 200, "{}", r.body);
    // The agent itself: agent:read to look, agent:write to make it leave.
    assert_eq!(ag.get("/v1/agent/self").status, 403);
    assert_eq!(with(at, "GET", "/v1/agent/self", None, &web).status, 403);
    assert_eq!(with(at, "GET", "/v1/agent/self", None, ROOT).status, 200);
    assert_eq!(ag.put("/v1/agent/leave", "").status, 403);
    let r = with(at, "PUT", "/v1/agent/service/deregister/web-1", None, &web);
    assert_eq!(r.status, 200, "{}", r.body);
    ag.stop();
}

/// An agent's hash-blocking read of one of its services resolves the
/// token again when it wakes, as Consul's does: a token deleted while it
/// waited gets no answer once the agent's cache of it (30 s) has run out.
#[test]
fn an_agents_hash_blocking_service_read_refuses_a_token_deleted_while_it_waited() {
    let s = deny_server();
    let (accessor, reader) = web_token(s.http_addr, "read");
    let mut ag = agent_of(&s, "ac3");
    let at = ag.http_addr;
    let register = |port: u16| {
        let body = json!({"Name": "web", "ID": "web-1", "Port": port}).to_string();
        let r = with(at, "PUT", "/v1/agent/service/register", Some(&body), ROOT);
        assert_eq!(r.status, 200, "{}", r.body);
    };
    register(80);
    let r = with(at, "GET", "/v1/agent/service/web-1", None, &reader);
    assert_eq!(r.status, 200, "{}", r.body);
    let hash = r.header("x-consul-contenthash").unwrap().to_string();
    let path = format!("/v1/agent/service/web-1?hash={hash}&wait=2m");
    let secret = reader.clone();
    let blocked = std::thread::spawn(move || with(at, "GET", &path, None, &secret));

    let token = format!("/v1/acl/token/{accessor}");
    assert_eq!(with(s.http_addr, "DELETE", &token, None, ROOT).status, 200);
    // Once the agent has forgotten the token (its TTL), a plain read with
    // it is refused; the blocked read, still waiting, has not answered.
    eventually(
        Duration::from_secs(45),
        "the agent to refuse the token",
        || (with(at, "GET", "/v1/agent/service/web-1", None, &reader).status == 403).then_some(()),
    );
    assert!(
        !blocked.is_finished(),
        "the hash did not change: still waiting"
    );
    register(81);
    let r = blocked.join().unwrap();
    assert_eq!((r.status, r.body.as_str()), (403, "ACL not found"));
    ag.stop();
}

/// `POST /v1/internal/acl/authorize` (what Consul's UI asks): each
/// resource and access level answered for the caller's token, with the
/// checks the endpoints make; an unknown one refuses the whole request.
#[test]
fn the_authorize_endpoint_answers_what_the_token_may_do() {
    let s = deny_server();
    let a = s.http_addr;
    let rules = "service \"web\" { policy = \"read\" }\nkey_prefix \"app/\" { policy = \"write\" }";
    let (_, secret) = token_with_rules(a, "asker", rules);
    let ask = |token: &str, questions: Value| {
        with(
            a,
            "POST",
            "/v1/internal/acl/authorize",
            Some(&questions.to_string()),
            token,
        )
    };
    let questions = json!([
        {"Resource": "service", "Segment": "web", "Access": "read"},
        {"Resource": "service", "Segment": "web", "Access": "write"},
        {"Resource": "service", "Segment": "db", "Access": "read"},
        {"Resource": "key", "Segment": "app/x", "Access": "write"},
        {"Resource": "key", "Segment": "app/", "Access": "LIST"},
        {"Resource": "key", "Segment": "other", "Access": "read"},
        {"Resource": "operator", "Access": "read"},
    ]);
    let r = ask(&secret, questions.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    let allow: Vec<bool> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["Allow"].as_bool().unwrap())
        .collect();
    assert_eq!(allow, [true, false, false, true, true, false, false]);
    assert_eq!(
        r.json()[0],
        json!({"Resource": "service", "Segment": "web", "Access": "read", "Allow": true})
    );
    assert_eq!(
        r.json()[6],
        json!({"Resource": "operator", "Access": "read", "Allow": false})
    );
    // The management token may do everything.
    let r = ask(ROOT, questions);
    assert!(
        r.json()
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["Allow"] == true),
        "{}",
        r.body
    );
    // Bad questions: a 400 naming them.
    let r = ask(&secret, json!([{"Resource": "nope", "Access": "read"}]));
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Invalid ACL resource requested: \"nope\"")
    );
    let r = ask(&secret, json!([{"Resource": "operator", "Access": "list"}]));
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Invalid access level for operator resource: list")
    );
    let many: Vec<Value> = (0..65)
        .map(|_| json!({"Resource": "acl", "Access": "read"}))
        .collect();
    let r = ask(&secret, json!(many));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(ask("no-such-secret", json!([])).status, 403);

    // ACLs off: everything is allowed.
    let dev = Server::dev();
    let r = with(
        dev.http_addr,
        "POST",
        "/v1/internal/acl/authorize",
        Some(r#"[{"Resource": "acl", "Access": "write"}]"#),
        "",
    );
    assert_eq!(
        r.json(),
        json!([{"Resource": "acl", "Access": "write", "Allow": true}])
    );
}

/// A txn's reads are filtered, not refused (Consul's output-side
/// filtering); `check-index` needs `key:read` and `delete-tree` write on
/// the whole prefix.
#[test]
fn a_txns_reads_are_filtered_and_its_checks_and_tree_deletes_need_their_permissions() {
    let s = deny_server();
    let a = s.http_addr;
    put_keys(a, &["app/a", "app/secret/b"]);
    let (_, secret) = token_with_rules(
        a,
        "app-rw",
        "key_prefix \"app/\" { policy = \"write\" }\nkey_prefix \"app/secret/\" { policy = \"deny\" }",
    );
    let txn = |ops: Value| with(a, "PUT", "/v1/txn", Some(&ops.to_string()), &secret);
    let r = txn(json!([{ "KV": { "Verb": "get-tree", "Key": "app/" } }]));
    assert_eq!(r.status, 200, "{}", r.body);
    let keys: Vec<String> = r.json()["Results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["KV"]["Key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, ["app/a"]);
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));
    // A get of a key it may not read: no result, no refusal.
    let r = txn(json!([{ "KV": { "Verb": "get", "Key": "app/secret/b" } }]));
    assert_eq!(
        (r.status, r.json()["Results"].clone()),
        (200, json!([])),
        "{}",
        r.body
    );

    let r = txn(json!([{ "KV": { "Verb": "check-index", "Key": "app/secret/b", "Index": 1 } }]));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        r.body.contains("'key:read' on \"app/secret/b\""),
        "{}",
        r.body
    );
    // delete-tree of app/ would reach app/secret/: refused, nothing deleted.
    let r = txn(json!([{ "KV": { "Verb": "delete-tree", "Key": "app/" } }]));
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(with(a, "GET", "/v1/kv/app/a", None, ROOT).status, 200);
    // A write with a read in the same txn: the write commits, the read is
    // filtered.
    let r = txn(json!([
        { "KV": { "Verb": "set", "Key": "app/c", "Value": "dg==" } },
        { "KV": { "Verb": "get-tree", "Key": "app/" } }
    ]));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains("app/secret/b"), "{}", r.body);
    assert!(r.body.contains("app/c"), "{}", r.body);
}

/// `GET /v1/acl/tokens?policy=ID` and `?role=ID` list the tokens that
/// link that policy or role themselves, as Consul's.
#[test]
fn the_token_list_filters_by_policy_and_by_role() {
    let s = deny_server();
    let a = s.http_addr;
    let id_of = |r: Resp, key: &str| {
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()[key].as_str().unwrap().to_string()
    };
    let put = |path: &str, body: Value| with(a, "PUT", path, Some(&body.to_string()), ROOT);
    let p1 = id_of(put("/v1/acl/policy", json!({ "Name": "p1" })), "ID");
    let p2 = id_of(put("/v1/acl/policy", json!({ "Name": "p2" })), "ID");
    let r1 = id_of(
        put(
            "/v1/acl/role",
            json!({ "Name": "r1", "Policies": [{ "ID": p1 }] }),
        ),
        "ID",
    );
    let t1 = id_of(
        put("/v1/acl/token", json!({ "Policies": [{ "ID": p1 }] })),
        "AccessorID",
    );
    let t2 = id_of(
        put("/v1/acl/token", json!({ "Policies": [{ "ID": p2 }] })),
        "AccessorID",
    );
    let t3 = id_of(
        put("/v1/acl/token", json!({ "Roles": [{ "ID": r1 }] })),
        "AccessorID",
    );
    let list = |q: &str| {
        let r = with(a, "GET", &format!("/v1/acl/tokens{q}"), None, ROOT);
        assert_eq!(r.status, 200, "{q}: {}", r.body);
        let mut ids: Vec<String> = r
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["AccessorID"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(list(&format!("?policy={p1}")), vec![t1.clone()]);
    assert_eq!(list(&format!("?policy={p2}")), vec![t2.clone()]);
    assert_eq!(list(&format!("?role={r1}")), vec![t3.clone()]);
    assert_eq!(list("?policy=no-such-policy"), Vec::<String>::new());
    // Unfiltered: the three, the initial management token and anonymous.
    let all = list("");
    assert_eq!(all.len(), 5, "{all:?}");
    assert!([&t1, &t2, &t3].iter().all(|t| all.contains(t)));
    let r = with(
        a,
        "GET",
        &format!("/v1/acl/tokens?policy={p1}&role={r1}"),
        None,
        ROOT,
    );
    assert_eq!(r.status, 400, "{}", r.body);
}

/// A node read shows a token what it may read: a node it may not read is
/// not there (`null`, or `Node: null` with no services, or no checks), a
/// service or a service's check it may not read is left out, and each
/// answer says so in its header.
#[test]
fn node_reads_hide_what_the_token_may_not_read() {
    let s = deny_server();
    let a = s.http_addr;
    for svc in ["web", "db"] {
        let body = json!({
            "Node": "n1", "Address": "10.0.0.1",
            "Service": { "Service": svc, "Port": 80 },
            "Check": { "CheckID": format!("{svc}-up"), "Name": "up", "ServiceID": svc, "Status": "passing" },
        });
        let r = with(
            a,
            "PUT",
            "/v1/catalog/register",
            Some(&body.to_string()),
            ROOT,
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let filtered = |r: &Resp| r.header("x-consul-results-filtered-by-acls") == Some("true");
    let (_, reader) = token_with_rules(
        a,
        "n1-db-reader",
        "node \"n1\" { policy = \"read\" }\nservice \"db\" { policy = \"read\" }",
    );
    let r = with(a, "GET", "/v1/catalog/node/n1", None, &reader);
    assert_eq!(r.status, 200, "{}", r.body);
    let services = r.json()["Services"].clone();
    assert!(
        services.get("db").is_some() && services.get("web").is_none(),
        "{services}"
    );
    assert!(filtered(&r));
    let r = with(a, "GET", "/v1/catalog/node-services/n1", None, &reader);
    assert_eq!(r.json()["Node"]["Node"], "n1", "{}", r.body);
    assert_eq!(
        r.json()["Services"].as_array().unwrap().len(),
        1,
        "{}",
        r.body
    );
    assert_eq!(r.json()["Services"][0]["Service"], "db", "{}", r.body);
    assert!(filtered(&r));
    let r = with(a, "GET", "/v1/health/node/n1", None, &reader);
    assert_eq!(r.json().as_array().unwrap().len(), 1, "{}", r.body);
    assert_eq!(r.json()[0]["CheckID"], "db-up", "{}", r.body);
    assert!(filtered(&r));

    // No node:read on n1: the node is not there.
    let (_, outsider) = token_with_rules(a, "db-reader", "service \"db\" { policy = \"read\" }");
    let r = with(a, "GET", "/v1/catalog/node/n1", None, &outsider);
    assert_eq!((r.status, r.json()), (200, Value::Null), "{}", r.body);
    assert!(filtered(&r));
    let r = with(a, "GET", "/v1/catalog/node-services/n1", None, &outsider);
    assert_eq!(
        r.json(),
        json!({ "Node": null, "Services": [] }),
        "{}",
        r.body
    );
    assert!(filtered(&r));
    let r = with(a, "GET", "/v1/health/node/n1", None, &outsider);
    assert_eq!(r.json(), json!([]), "{}", r.body);
    assert!(filtered(&r));
}

/// Creates a token from `body` as ROOT; its secret.
fn token_from(addr: SocketAddr, body: Value) -> String {
    let t = as_root(addr, "PUT", "/v1/acl/token", &body).json();
    t["SecretID"].as_str().unwrap().to_string()
}

/// Registers node `node` (and service `svc`, unless empty) in the catalog
/// with `token`; the status.
fn register_as(addr: SocketAddr, token: &str, node: &str, svc: &str) -> u16 {
    let mut body = json!({"Node": node, "Address": "10.0.0.1"});
    if !svc.is_empty() {
        body["Service"] = json!({"Service": svc});
    }
    with(
        addr,
        "PUT",
        "/v1/catalog/register",
        Some(&body.to_string()),
        token,
    )
    .status
}

/// Service and node identities and templated policies grant what Consul's
/// synthetic policies grant, in the datacenters they name, on tokens and
/// through roles; they are stored and shown as given (deduplicated), and
/// bad ones are refused with Consul's words, storing nothing.
#[test]
fn identities_grant_what_consuls_synthetic_policies_grant() {
    let s = deny_server();
    let a = s.http_addr;
    // A node the service tokens may register on (node:write is theirs
    // only through a node identity).
    let n1 = token_from(
        a,
        json!({"NodeIdentities": [{"NodeName": "n1", "Datacenter": "dc1"}]}),
    );
    assert_eq!(register_as(a, &n1, "n1", ""), 200);
    assert_eq!(register_as(a, &n1, "n2", ""), 403, "another node");
    let other_dc = token_from(
        a,
        json!({"NodeIdentities": [{"NodeName": "n2", "Datacenter": "dc2"}]}),
    );
    assert_eq!(
        register_as(a, &other_dc, "n2", ""),
        403,
        "a node identity of dc2"
    );

    let created = as_root(
        a,
        "PUT",
        "/v1/acl/token",
        &json!({"ServiceIdentities": [
            {"ServiceName": "web", "Datacenters": ["dc1"]},
            {"ServiceName": "web", "Datacenters": ["dc3"]}]}),
    )
    .json();
    assert_eq!(
        created["ServiceIdentities"],
        json!([{"ServiceName": "web", "Datacenters": ["dc1", "dc3"]}])
    );
    let web = created["SecretID"].as_str().unwrap().to_string();
    let read = as_root(
        a,
        "GET",
        &format!("/v1/acl/token/{}", created["AccessorID"].as_str().unwrap()),
        &json!({}),
    )
    .json();
    assert_eq!(read["ServiceIdentities"], created["ServiceIdentities"]);
    // Service write on web and its sidecar needs node write too: n1's
    // token registered the node; a service-only registration skips it.
    let svc_only = |token: &str, svc: &str| {
        let body = json!({"Node": "n1", "Address": "10.0.0.1", "SkipNodeUpdate": true, "Service": {"Service": svc}});
        with(
            a,
            "PUT",
            "/v1/catalog/register",
            Some(&body.to_string()),
            token,
        )
        .status
    };
    assert_eq!(svc_only(&web, "web"), 200);
    assert_eq!(svc_only(&web, "web-sidecar-proxy"), 200);
    assert_eq!(svc_only(&web, "db"), 403);
    // Reads of every service and node.
    let list = with(a, "GET", "/v1/catalog/services", None, &web);
    assert_eq!(list.status, 200);
    assert!(list.json().get("web").is_some(), "{}", list.body);
    assert_eq!(with(a, "GET", "/v1/kv/k", None, &web).status, 403);
    let elsewhere = token_from(
        a,
        json!({"ServiceIdentities": [{"ServiceName": "db", "Datacenters": ["dc2"]}]}),
    );
    assert_eq!(svc_only(&elsewhere, "db"), 403, "scoped to dc2");

    // Through a role.
    let role = as_root(
        a,
        "PUT",
        "/v1/acl/role",
        &json!({"Name": "db-role", "ServiceIdentities": [{"ServiceName": "db"}],
                "NodeIdentities": [{"NodeName": "n1", "Datacenter": "dc1"}]}),
    )
    .json();
    assert_eq!(role["ServiceIdentities"], json!([{"ServiceName": "db"}]));
    assert_eq!(
        role["NodeIdentities"],
        json!([{"NodeName": "n1", "Datacenter": "dc1"}])
    );
    let db = token_from(a, json!({"Roles": [{"Name": "db-role"}]}));
    assert_eq!(register_as(a, &db, "n1", "db"), 200);
    assert_eq!(register_as(a, &db, "n1", "api"), 403);

    // A templated policy, shown as Consul shows it.
    let t = as_root(
        a,
        "PUT",
        "/v1/acl/token",
        &json!({"TemplatedPolicies": [{"TemplateName": "builtin/service", "TemplateVariables": {"Name": "api"}}]}),
    )
    .json();
    assert_eq!(
        t["TemplatedPolicies"],
        json!([{"TemplateName": "builtin/service", "TemplateVariables": {"name": "api"}}])
    );
    assert_eq!(svc_only(t["SecretID"].as_str().unwrap(), "api"), 200);
    let dns = token_from(
        a,
        json!({"TemplatedPolicies": [{"TemplateName": "builtin/dns"}]}),
    );
    assert_eq!(
        with(a, "GET", "/v1/catalog/services", None, &dns).status,
        200
    );
    assert_eq!(svc_only(&dns, "api"), 403);

    // Refused, in Consul's words, and nothing stored.
    let before = with(a, "GET", "/v1/acl/tokens", None, ROOT)
        .json()
        .as_array()
        .unwrap()
        .len();
    for (body, why) in [
        (
            json!({"ServiceIdentities": [{"ServiceName": ""}]}),
            "Service identity is missing the service name field on this token",
        ),
        (
            json!({"ServiceIdentities": [{"ServiceName": "Web"}]}),
            "Service identity \"Web\" has an invalid name. Only lowercase alphanumeric characters, '-' and '_' are allowed",
        ),
        (
            json!({"Local": true, "ServiceIdentities": [{"ServiceName": "web", "Datacenters": ["dc1"]}]}),
            "Service identity \"web\" cannot specify a list of datacenters on a local token",
        ),
        (
            json!({"NodeIdentities": [{"NodeName": "n1"}]}),
            "Node identity is missing the datacenter field on this token",
        ),
        (
            json!({"TemplatedPolicies": [{"TemplateName": "builtin/nope"}]}),
            "no such ACL templated policy with Name \"builtin/nope\"",
        ),
        (
            json!({"TemplatedPolicies": [{"TemplateName": "builtin/service"}]}),
            "validation error for templated policy \"builtin/service\": name is required",
        ),
    ] {
        let r = with(a, "PUT", "/v1/acl/token", Some(&body.to_string()), ROOT);
        assert_eq!((r.status, r.body.as_str()), (400, why), "{body}");
    }
    let r = with(
        a,
        "PUT",
        "/v1/acl/role",
        Some(&json!({"Name": "r", "NodeIdentities": [{"Datacenter": "dc1"}]}).to_string()),
        ROOT,
    );
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            400,
            "Node identity is missing the node name field on this role"
        )
    );
    assert_eq!(
        with(a, "GET", "/v1/acl/tokens", None, ROOT)
            .json()
            .as_array()
            .unwrap()
            .len(),
        before
    );
    // A policy scoped to another datacenter grants nothing here.
    as_root(
        a,
        "PUT",
        "/v1/acl/policy",
        &json!({"Name": "kv-dc2", "Rules": "key_prefix \"\" { policy = \"read\" }", "Datacenters": ["dc2"]}),
    );
    let scoped = token_from(a, json!({"Policies": [{"Name": "kv-dc2"}]}));
    assert_eq!(with(a, "GET", "/v1/kv/k", None, &scoped).status, 403);
}

/// The built-in templated policies: listed, read and previewed as Consul
/// shows them, with acl:read.
#[test]
fn templated_policies_are_listed_read_and_previewed() {
    let s = deny_server();
    let a = s.http_addr;
    let all = as_root(a, "GET", "/v1/acl/templated-policies", &json!({})).json();
    for name in [
        "builtin/service",
        "builtin/node",
        "builtin/dns",
        "builtin/nomad-server",
        "builtin/api-gateway",
        "builtin/nomad-client",
    ] {
        assert_eq!(all[name]["TemplateName"], name, "{all}");
    }
    let one = as_root(
        a,
        "GET",
        "/v1/acl/templated-policy/name/builtin/service",
        &json!({}),
    )
    .json();
    assert!(
        one["Template"]
            .as_str()
            .unwrap()
            .contains("service \"{{.Name}}\""),
        "{one}"
    );
    assert!(
        one["Schema"]
            .as_str()
            .unwrap()
            .contains("\"required\": [\"name\"]"),
        "{one}"
    );
    assert_eq!(
        with(
            a,
            "GET",
            "/v1/acl/templated-policy/name/builtin/nope",
            None,
            ROOT
        )
        .status,
        404
    );
    let p = with(
        a,
        "POST",
        "/v1/acl/templated-policy/preview/builtin/service",
        Some(r#"{"Name": "api"}"#),
        ROOT,
    );
    assert_eq!(p.status, 200, "{}", p.body);
    let p = p.json();
    assert!(
        p["Name"].as_str().unwrap().starts_with("synthetic-policy-"),
        "{p}"
    );
    assert!(
        p["Rules"]
            .as_str()
            .unwrap()
            .contains("service \"api-sidecar-proxy\""),
        "{p}"
    );
    let r = with(
        a,
        "POST",
        "/v1/acl/templated-policy/preview/builtin/service",
        Some("{}"),
        ROOT,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    // Anonymous (default deny) may not read them, nor a token one
    // permission short (operator:read is not acl:read).
    let (_, short) = token_with_rules(a, "op-read", r#"operator = "read""#);
    for token in ["", short.as_str()] {
        for (method, path) in [
            ("GET", "/v1/acl/templated-policies"),
            ("GET", "/v1/acl/templated-policy/name/builtin/service"),
            ("POST", "/v1/acl/templated-policy/preview/builtin/service"),
        ] {
            let r = with(a, method, path, Some(r#"{"Name": "api"}"#), token);
            assert_eq!(r.status, 403, "{method} {path} as {token:?}: {}", r.body);
        }
    }
    // A preview body past the request cap: 413, nothing rendered.
    let huge = format!(r#"{{"Name": "{}"}}"#, "a".repeat(5 << 20));
    let r = with(
        a,
        "POST",
        "/v1/acl/templated-policy/preview/builtin/service",
        Some(&huge),
        ROOT,
    );
    assert_eq!(r.status, 413, "{}", r.body);
}

/// Every file under `dir`, read whole: whether any holds `needle`.
fn dir_holds(dir: &std::path::Path, needle: &[u8]) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                return true;
            }
        }
    }
    false
}

/// As Consul, a caller with acl:write reads a token's SecretID back (token
/// read, list, update); one with acl:read only sees `<hidden>`. With
/// `--encrypt` the secret is sealed under a key derived from it, so it
/// reads back after a restart with the key, and not with another; the data
/// dir holds no secret in the clear.
#[test]
fn acl_write_reads_secrets_back_and_the_data_dir_holds_none() {
    let dir = tempfile::tempdir().unwrap();
    let key = common::keygen();
    let mut s = Server::durable("s1", dir.path())
        .acl("deny", ROOT)
        .arg("--encrypt")
        .arg(&key)
        .start();
    let a = s.http_addr;
    eventually(Duration::from_secs(10), "the management token", || {
        (with(a, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    let secret = "3b1f0c5e-7d2a-4c66-9e11-5a0b9c8d7e6f";
    let t = as_root(
        a,
        "PUT",
        "/v1/acl/token",
        &json!({"SecretID": secret, "Description": "app"}),
    )
    .json();
    let acc = t["AccessorID"].as_str().unwrap().to_string();
    let read = |token: &str| with(a, "GET", &format!("/v1/acl/token/{acc}"), None, token).json();
    assert_eq!(read(ROOT)["SecretID"], secret);
    let listed = with(a, "GET", "/v1/acl/tokens", None, ROOT).json();
    let by_acc = |list: &Value, id: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|t| t["AccessorID"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_acc(&listed, &acc)["SecretID"], secret);
    assert_eq!(
        by_acc(&listed, "00000000-0000-0000-0000-000000000002")["SecretID"],
        "anonymous"
    );
    let root_row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["Description"] == "Initial Management Token")
        .cloned()
        .unwrap();
    assert_eq!(root_row["SecretID"], ROOT);
    // An update answers with it too.
    let up = as_root(
        a,
        "PUT",
        &format!("/v1/acl/token/{acc}"),
        &json!({"Description": "app2"}),
    )
    .json();
    assert_eq!(up["SecretID"], secret);
    // acl:read is not enough.
    let (_, reader) = token_with_rules(a, "acl-read", r#"acl = "read""#);
    assert_eq!(read(&reader)["SecretID"], "<hidden>");
    let listed = with(a, "GET", "/v1/acl/tokens", None, &reader).json();
    assert_eq!(by_acc(&listed, &acc)["SecretID"], "<hidden>");
    // Nothing in the clear on disk (log, state, snapshots).
    s.stop(Duration::from_secs(10));
    assert!(
        !dir_holds(dir.path(), secret.as_bytes()),
        "the secret is in the data dir"
    );
    assert!(
        !dir_holds(dir.path(), ROOT.as_bytes()),
        "the management secret is in the data dir"
    );
    // The same key after a restart: read back.
    s.restart();
    eventually(Duration::from_secs(20), "the token read back", || {
        (with(
            s.http_addr,
            "GET",
            &format!("/v1/acl/token/{acc}"),
            None,
            ROOT,
        )
        .json()["SecretID"]
            == secret)
            .then_some(())
    });
    // Another key opens nothing: hidden, and the token still works.
    s.stop(Duration::from_secs(10));
    let other = common::keygen();
    let s = Server::durable("s1", dir.path())
        .acl("deny", ROOT)
        .arg("--encrypt")
        .arg(&other)
        .start();
    let r = eventually(Duration::from_secs(20), "the token read", || {
        let r = with(
            s.http_addr,
            "GET",
            &format!("/v1/acl/token/{acc}"),
            None,
            ROOT,
        );
        (r.status == 200).then_some(r.json())
    });
    assert_eq!(r["SecretID"], "<hidden>");
    assert_eq!(
        with(s.http_addr, "GET", "/v1/acl/token/self", None, secret).status,
        200
    );
}

/// A server with no key to seal with (neither `--encrypt` nor `--dev`)
/// keeps only the hash, as before: reads show `<hidden>` even to a
/// management token, and the token still works.
#[test]
fn without_a_key_secrets_stay_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::durable("s1", dir.path()).acl("deny", ROOT).start();
    let a = s.http_addr;
    eventually(Duration::from_secs(10), "the management token", || {
        (with(a, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    let t = as_root(a, "PUT", "/v1/acl/token", &json!({"Description": "app"})).json();
    let secret = t["SecretID"].as_str().unwrap();
    let acc = t["AccessorID"].as_str().unwrap();
    assert_ne!(secret, "<hidden>", "the create answer shows it");
    let read = with(a, "GET", &format!("/v1/acl/token/{acc}"), None, ROOT).json();
    assert_eq!(read["SecretID"], "<hidden>");
    assert_eq!(
        with(a, "GET", "/v1/acl/token/self", None, secret).status,
        200
    );
}
