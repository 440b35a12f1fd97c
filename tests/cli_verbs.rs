//! The everyday CLI verbs against a real dev server, each checked by what
//! it changed on the server (read back over HTTP) and by Consul's wording:
//! `kv delete|export|import`, `intention *`, `acl token update|clone`,
//! `acl policy update`, `catalog datacenters`, `connect ca *`.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::acl::{ROOT, acl_started};
use common::{Server, bin, cli};
use serde_json::{Value, json};

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `cairn ARGS` that must succeed; its stdout.
fn ok(s: &Server, args: &[&str]) -> String {
    let o = cli(&s.url, args);
    assert!(o.status.success(), "{args:?}: {}", err(&o));
    out(&o)
}

/// `cairn ARGS` as root (an ACL server), with `stdin` fed in.
fn root(s: &Server, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(bin())
        .args(args)
        .env("CAIRN_HTTP_ADDR", &s.url)
        .env("CAIRN_HTTP_TOKEN", ROOT)
        .env_remove("CONSUL_HTTP_ADDR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn keys(s: &Server, prefix: &str) -> Value {
    let r = s.get(&format!("/v1/kv/{prefix}?keys"));
    if r.status == 404 {
        return json!([]);
    }
    r.json()
}

#[test]
fn kv_delete_export_and_import_round_trip() {
    let s = Server::dev();
    for (k, v) in [("app/a", "1"), ("app/b/c", "two"), ("other", "x")] {
        ok(&s, &["kv", "put", k, v]);
    }
    s.put("/v1/kv/app/flagged?flags=42", "bin\u{1}ary");

    let exported = ok(&s, &["kv", "export", "app/"]);
    let rows: Value = serde_json::from_str(&exported).unwrap();
    assert_eq!(
        rows,
        json!([
            {"key": "app/a", "flags": 0, "value": "MQ=="},
            {"key": "app/b/c", "flags": 0, "value": "dHdv"},
            {"key": "app/flagged", "flags": 42, "value": "YmluAWFyeQ=="},
        ])
    );
    // Consul's layout: tab-indented.
    assert!(exported.contains("\n\t{"), "{exported}");

    // One key, then a prefix.
    assert_eq!(
        ok(&s, &["kv", "delete", "app/a"]).trim(),
        "Success! Deleted key: app/a"
    );
    assert_eq!(keys(&s, "app/"), json!(["app/b/c", "app/flagged"]));
    assert_eq!(
        ok(&s, &["kv", "delete", "-recurse", "app/"]).trim(),
        "Success! Deleted keys with prefix: app/"
    );
    assert_eq!(keys(&s, "app/"), json!([]));
    assert_eq!(keys(&s, ""), json!(["other"]), "the rest is untouched");

    // A missing key is refused before anything is sent.
    let o = cli(&s.url, &["kv", "delete"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("Missing KEY argument"), "{}", err(&o));

    // The export imported back, from a file and under a prefix; values,
    // binary ones included, and flags intact.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("export.json");
    std::fs::write(&file, &exported).unwrap();
    let at = format!("@{}", file.display());
    let text = ok(&s, &["kv", "import", &at]);
    assert!(text.contains("Imported: app/b/c"), "{text}");
    let text = ok(&s, &["kv", "import", "-prefix", "copy/", &at]);
    assert!(text.contains("Imported: copy/app/a"), "{text}");
    let flagged = s.get_json("/v1/kv/copy/app/flagged");
    assert_eq!(flagged[0]["Flags"], 42);
    assert_eq!(flagged[0]["Value"], "YmluAWFyeQ==");
    assert_eq!(s.get("/v1/kv/app/a?raw").body, "1");

    // From stdin; bad JSON changes nothing.
    let o = root(
        &s,
        &["kv", "import", "-"],
        r#"[{"key":"in","value":"aGk="}]"#,
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(s.get("/v1/kv/in?raw").body, "hi");
    let before = keys(&s, "");
    let o = root(&s, &["kv", "import", "-"], r#"{"key": "#);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("Cannot unmarshal data"), "{}", err(&o));
    assert_eq!(keys(&s, ""), before);

    // A CAS delete with a stale index does not delete.
    let idx = s.get_json("/v1/kv/in")[0]["ModifyIndex"].as_u64().unwrap();
    let stale = (idx - 1).to_string();
    let o = cli(
        &s.url,
        &["kv", "delete", "-cas", "-modify-index", &stale, "in"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(s.get("/v1/kv/in?raw").body, "hi");
    let fresh = idx.to_string();
    ok(&s, &["kv", "delete", "-cas", "-modify-index", &fresh, "in"]);
    assert_eq!(s.get("/v1/kv/in").status, 404);
}

#[test]
fn intentions_create_get_check_list_and_delete() {
    let s = Server::dev();
    assert_eq!(
        ok(&s, &["intention", "create", "web", "db"]).trim(),
        "Created: web => db (allow)"
    );
    assert_eq!(
        ok(
            &s,
            &[
                "intention",
                "create",
                "-deny",
                "-meta",
                "team=ops",
                "*",
                "db"
            ]
        )
        .trim(),
        "Created: * => db (deny)"
    );
    // Again without -replace: refused, nothing changed.
    let o = cli(&s.url, &["intention", "create", "-deny", "web", "db"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("already exists"), "{}", err(&o));
    let exact = s.get_json("/v1/connect/intentions/exact?source=web&destination=db");
    assert_eq!(exact["Action"], "allow");

    // check: 0 allowed, 2 denied, as consul's.
    let o = cli(&s.url, &["intention", "check", "web", "db"]);
    assert_eq!((o.status.code(), out(&o).trim()), (Some(0), "Allowed"));
    let o = cli(&s.url, &["intention", "check", "api", "db"]);
    assert_eq!((o.status.code(), out(&o).trim()), (Some(2), "Denied"));

    let text = ok(&s, &["intention", "get", "*", "db"]);
    assert!(text.contains("Action:") && text.contains("deny"), "{text}");
    assert!(
        text.contains("Meta[team]:") && text.contains("ops"),
        "{text}"
    );

    let text = ok(&s, &["intention", "list"]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("ID"), "{text}");
    assert_eq!(lines.len(), 3, "{text}");
    // The more specific source first, by precedence.
    assert!(
        lines[1].contains("web") && lines[1].contains("allow"),
        "{text}"
    );

    // match: what applies to db, in evaluation order; by source, what
    // applies to web (a wildcard source too); none to api as destination.
    assert_eq!(
        ok(&s, &["intention", "match", "db"]),
        "web => db (allow)\n* => db (deny)\n"
    );
    assert_eq!(
        ok(&s, &["intention", "match", "-source", "web"]),
        "web => db (allow)\n* => db (deny)\n"
    );
    assert_eq!(ok(&s, &["intention", "match", "api"]), "");

    // -replace turns the allow into a deny.
    ok(
        &s,
        &[
            "intention",
            "create",
            "-replace",
            "-deny",
            "-meta",
            "a=b",
            "web",
            "db",
        ],
    );
    let o = cli(&s.url, &["intention", "check", "web", "db"]);
    assert_eq!(o.status.code(), Some(2));

    assert_eq!(
        ok(&s, &["intention", "delete", "web", "db"]).trim(),
        "Intention deleted."
    );
    let r = s.get("/v1/connect/intentions/exact?source=web&destination=db");
    assert_eq!(r.status, 404);
    let o = cli(&s.url, &["intention", "get", "web", "db"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn acl_token_update_clone_and_policy_update() {
    let s = acl_started(Server::builder().dev(), "deny");
    let as_root = |args: &[&str]| {
        let o = root(&s, args, "");
        assert!(o.status.success(), "{args:?}: {}", err(&o));
        out(&o)
    };
    let p1: Value = serde_json::from_str(&as_root(&[
        "acl",
        "policy",
        "create",
        "-name",
        "p1",
        "-rules",
        r#"key "a" { policy = "read" }"#,
        "-format",
        "json",
    ]))
    .unwrap();
    as_root(&[
        "acl",
        "policy",
        "create",
        "-name",
        "p2",
        "-rules",
        r#"key "b" { policy = "read" }"#,
    ]);
    let t: Value = serde_json::from_str(&as_root(&[
        "acl",
        "token",
        "create",
        "-description",
        "first",
        "-policy-name",
        "p1",
        "-format",
        "json",
    ]))
    .unwrap();
    let id = t["AccessorID"].as_str().unwrap();
    let secret = t["SecretID"].as_str().unwrap();

    // Update: a new description, p2 merged in; the secret is kept.
    let text = as_root(&[
        "acl",
        "token",
        "update",
        "-id",
        id,
        "-description",
        "second",
        "-policy-name",
        "p2",
        "-merge-policies",
    ]);
    assert!(text.starts_with("Token updated successfully."), "{text}");
    let read = |id: &str| {
        let o = root(
            &s,
            &["acl", "token", "read", "-id", id, "-format", "json"],
            "",
        );
        serde_json::from_str::<Value>(&out(&o)).unwrap()
    };
    let now = read(id);
    assert_eq!(now["Description"], "second");
    // The secret still works, as the same token.
    let me = common::acl::with(s.http_addr, "GET", "/v1/acl/token/self", None, secret);
    assert_eq!(me.json()["AccessorID"], json!(id));
    let names: Vec<&str> = now["Policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p1", "p2"]);
    // Without -merge-policies the given ones replace the old.
    as_root(&["acl", "token", "update", "-id", id, "-policy-name", "p2"]);
    assert_eq!(read(id)["Policies"].as_array().unwrap().len(), 1);
    assert_eq!(read(id)["Policies"][0]["Name"], "p2");

    // Clone: a new accessor and secret, the same policies.
    let c: Value = serde_json::from_str(&as_root(&[
        "acl",
        "token",
        "clone",
        "-id",
        id,
        "-description",
        "copy",
        "-format",
        "json",
    ]))
    .unwrap();
    assert_ne!(c["AccessorID"], json!(id));
    assert_ne!(c["SecretID"], json!(secret));
    assert_eq!(c["Description"], "copy");
    assert_eq!(c["Policies"][0]["Name"], "p2");

    // Policy update by name: new rules, new name; the ID stays.
    as_root(&[
        "acl",
        "policy",
        "update",
        "-name",
        "p1",
        "-new-name",
        "p1b",
        "-rules",
        r#"key "z" { policy = "write" }"#,
    ]);
    let o = root(
        &s,
        &["acl", "policy", "read", "-name", "p1b", "-format", "json"],
        "",
    );
    let p: Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(p["ID"], p1["ID"]);
    assert!(p["Rules"].as_str().unwrap().contains("\"z\""));

    // Without a token the update is refused and nothing changes.
    let o = cli(
        &s.url,
        &["acl", "token", "update", "-id", id, "-description", "anon"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("403"), "{}", err(&o));
    assert_eq!(read(id)["Description"], "second");
}

/// `acl token create` and `acl role create` with Consul's identity flags,
/// and `acl templated-policy list|read|preview`.
#[test]
fn acl_identity_flags_and_templated_policy_verbs() {
    let s = acl_started(Server::builder().dev(), "deny");
    let as_root = |args: &[&str]| {
        let o = root(&s, args, "");
        assert!(o.status.success(), "{args:?}: {}", err(&o));
        out(&o)
    };
    let t: Value = serde_json::from_str(&as_root(&[
        "acl",
        "token",
        "create",
        "-service-identity",
        "web:dc1,dc2",
        "-service-identity",
        "db",
        "-node-identity",
        "n1:dc1",
        "-templated-policy",
        "builtin/service",
        "-var",
        "name:api",
        "-format",
        "json",
    ]))
    .unwrap();
    assert_eq!(
        t["ServiceIdentities"],
        json!([{"ServiceName": "web", "Datacenters": ["dc1", "dc2"]}, {"ServiceName": "db"}])
    );
    assert_eq!(
        t["NodeIdentities"],
        json!([{"NodeName": "n1", "Datacenter": "dc1"}])
    );
    assert_eq!(
        t["TemplatedPolicies"][0]["TemplateVariables"],
        json!({"name": "api"})
    );
    let text = as_root(&[
        "acl",
        "token",
        "read",
        "-id",
        t["AccessorID"].as_str().unwrap(),
    ]);
    assert!(
        text.contains(
            "Service Identities:\n   web (Datacenters: dc1, dc2)\n   db (Datacenters: all)"
        ),
        "{text}"
    );
    assert!(
        text.contains("Node Identities:\n   n1 (Datacenter: dc1)"),
        "{text}"
    );
    let role = as_root(&[
        "acl",
        "role",
        "create",
        "-name",
        "r",
        "-service-identity",
        "web",
    ]);
    assert!(role.contains("web (Datacenters: all)"), "{role}");
    // `acl role update` adds to the role's own; `-no-merge` replaces.
    as_root(&[
        "acl",
        "policy",
        "create",
        "-name",
        "p1",
        "-rules",
        r#"node_prefix "" { policy = "read" }"#,
    ]);
    let listed: Value =
        serde_json::from_str(&as_root(&["acl", "role", "list", "-format", "json"])).unwrap();
    let rid = listed[0]["ID"].as_str().unwrap().to_string();
    let updated: Value = serde_json::from_str(&as_root(&[
        "acl",
        "role",
        "update",
        "-id",
        &rid,
        "-policy-name",
        "p1",
        "-service-identity",
        "db",
        "-description",
        "two",
        "-format",
        "json",
    ]))
    .unwrap();
    assert_eq!(
        updated["ServiceIdentities"],
        json!([{"ServiceName": "web"}, {"ServiceName": "db"}]),
        "{updated}"
    );
    assert_eq!(updated["Policies"][0]["Name"], "p1");
    assert_eq!(updated["Description"], "two");
    let replaced: Value = serde_json::from_str(&as_root(&[
        "acl",
        "role",
        "update",
        "-id",
        &rid,
        "-no-merge",
        "-node-identity",
        "n2:dc1",
        "-format",
        "json",
    ]))
    .unwrap();
    assert_eq!(
        replaced["NodeIdentities"],
        json!([{"NodeName": "n2", "Datacenter": "dc1"}])
    );
    assert!(
        replaced
            .get("ServiceIdentities")
            .is_none_or(|v| v.as_array().is_none_or(|a| a.is_empty())),
        "{replaced}"
    );
    assert!(
        replaced
            .get("Policies")
            .is_none_or(|v| v.as_array().is_none_or(|a| a.is_empty())),
        "{replaced}"
    );
    let o = root(&s, &["acl", "token", "create", "-node-identity", "n1"], "");
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("Malformed -node-identity"), "{}", err(&o));

    let list = as_root(&["acl", "templated-policy", "list"]);
    assert!(
        list.contains("builtin/service") && list.contains("builtin/dns"),
        "{list}"
    );
    let read = as_root(&["acl", "templated-policy", "read", "-name", "builtin/node"]);
    assert!(read.contains("node \"{{.Name}}\""), "{read}");
    let preview = as_root(&[
        "acl",
        "templated-policy",
        "preview",
        "-name",
        "builtin/service",
        "-var",
        "name:api",
    ]);
    assert!(
        preview.contains("service \"api-sidecar-proxy\""),
        "{preview}"
    );
}

#[test]
fn catalog_datacenters_and_the_ca_configuration() {
    let s = Server::builder().dev().datacenter("east").start();
    assert_eq!(ok(&s, &["catalog", "datacenters"]), "east\n");

    let conf: Value = serde_json::from_str(&ok(&s, &["connect", "ca", "get-config"])).unwrap();
    assert_eq!(conf["Provider"], "consul");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ca.json");
    let mut new = conf.clone();
    new["Config"]["LeafCertTTL"] = json!("48h");
    std::fs::write(&file, new.to_string()).unwrap();
    assert_eq!(
        ok(
            &s,
            &[
                "connect",
                "ca",
                "set-config",
                "-config-file",
                file.to_str().unwrap()
            ]
        )
        .trim(),
        "Configuration updated!"
    );
    let got = s.get_json("/v1/connect/ca/configuration");
    assert_eq!(got["Config"]["LeafCertTTL"], "48h");

    // A file that is not JSON changes nothing.
    std::fs::write(&file, "Provider = nope").unwrap();
    let o = cli(
        &s.url,
        &[
            "connect",
            "ca",
            "set-config",
            "-config-file",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(s.get_json("/v1/connect/ca/configuration"), got);
}

/// `cairn debug`, as `consul debug`: a bundle of the agent's self, host and
/// members, its metrics and logs over `-duration`, a CPU profile and a
/// thread dump per interval, archived as `<output>.tar.gz`; refused up
/// front without a token that reads the agent; Consul's checks of the
/// flags. `cairn debug data-dir` keeps inspecting a data dir.
#[test]
fn debug_captures_a_bundle_as_consul_debug() {
    let s = Server::dev();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("bundle");
    let o = cli(
        &s.url,
        &[
            "debug",
            "-duration=5s",
            "-interval=5s",
            "-output",
            output.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(!output.exists(), "the directory goes once archived");
    let gz = std::fs::File::open(dir.path().join("bundle.tar.gz")).unwrap();
    let mut files = std::collections::BTreeMap::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    for e in tar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().display().to_string();
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut body).unwrap();
        files.insert(name, body);
    }
    let text = |name: &str| {
        let f = files
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", files.keys()));
        String::from_utf8_lossy(f).into_owned()
    };
    let json = |name: &str| serde_json::from_str::<Value>(&text(name)).unwrap();
    assert_eq!(
        json("bundle/index.json")["Targets"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    let agent = json("bundle/agent.json");
    assert!(
        agent["Config"]["NodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty()),
        "{agent}"
    );
    assert!(
        json("bundle/host.json")["Memory"]["total"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(!json("bundle/members.json").as_array().unwrap().is_empty());
    let metrics = text("bundle/metrics.json");
    let first: Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert!(first["Counters"].is_array(), "{first}");
    // The bundle's own requests are logged at debug level.
    assert!(
        text("bundle/consul.log").contains("[DEBUG]"),
        "{}",
        text("bundle/consul.log")
    );
    assert_eq!(
        files["bundle/profile.prof"][..2],
        [0x1f, 0x8b],
        "a gzipped pprof profile"
    );
    assert!(
        files.keys().any(|k| k.ends_with("/goroutine.prof")),
        "{:?}",
        files.keys()
    );

    let o = cli(&s.url, &["debug", "-interval=1s"]);
    assert_eq!(err(&o).trim(), "interval must be longer than 5s");
    let o = cli(&s.url, &["debug", "-capture=nope"]);
    assert!(err(&o).starts_with("invalid capture target"), "{}", err(&o));
    let o = cli(&s.url, &["debug", "data-dir", dir.path().to_str().unwrap()]);
    assert!(out(&o).contains("raft-log"), "{}", out(&o));

    let acl = acl_started(Server::builder().dev(), "deny");
    let o = cli(
        &acl.url,
        &[
            "debug",
            "-duration=5s",
            "-interval=5s",
            "-output",
            dir.path().join("anon").to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(
        err(&o).contains("error querying target agent"),
        "{}",
        err(&o)
    );
    assert!(
        !dir.path().join("anon").exists(),
        "nothing written when refused"
    );
}

/// `connect expose`, as Consul's: a listener for the service on the
/// ingress gateway's config entry and an allow intention from the gateway;
/// again, the service's definition updated and the intention kept; another
/// service on another port; a conflicting protocol on the port refused.
#[test]
fn connect_expose_puts_a_service_behind_an_ingress_gateway() {
    let s = Server::dev();
    let args = [
        "connect",
        "expose",
        "-ingress-gateway",
        "ingress",
        "-service",
        "web",
        "-port",
        "8080",
    ];
    assert_eq!(
        ok(&s, &args),
        "Successfully updated config entry for ingress service \"ingress\"\n\
         Successfully set up intention for \"ingress\" -> \"web\"\n"
    );
    let e = s.get_json("/v1/config/ingress-gateway/ingress");
    assert_eq!(e["Listeners"][0]["Port"], 8080, "{e}");
    assert_eq!(e["Listeners"][0]["Protocol"], "tcp");
    assert_eq!(e["Listeners"][0]["Services"][0]["Name"], "web");
    let i = s.get_json("/v1/connect/intentions/exact?source=ingress&destination=web");
    assert_eq!(i["Action"], "allow");

    assert_eq!(
        ok(&s, &args),
        "Updating service definition for \"web\" on listener with port 8080\n\
         Successfully updated config entry for ingress service \"ingress\"\n\
         Intention already exists for \"ingress\" -> \"web\"\n"
    );
    // A second service on another port: a listener of its own (a tcp
    // listener serves one service).
    let mut api = args.to_vec();
    api[5] = "api";
    api[7] = "8081";
    ok(&s, &api);
    let e = s.get_json("/v1/config/ingress-gateway/ingress");
    let ports: Vec<(u64, &str)> = e["Listeners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["Port"].as_u64().unwrap(),
                l["Services"][0]["Name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports, [(8080, "web"), (8081, "api")], "{e}");

    let mut http = args.to_vec();
    http.extend(["-protocol", "http"]);
    let o = cli(&s.url, &http);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err(&o).trim(),
        "Listener on port 8080 already configured with conflicting protocol \"tcp\""
    );
    let o = cli(
        &s.url,
        &["connect", "expose", "-service", "web", "-port", "1"],
    );
    assert_eq!(
        err(&o).trim(),
        "An ingress gateway service must be given via the -ingress-gateway flag."
    );
}

/// `operator usage instances`, as Consul's: the billable total and this
/// datacenter's, the billable services table, the Connect instances by
/// kind; -billable and -connect show one part.
#[test]
fn operator_usage_instances_prints_consuls_tables() {
    let s = Server::dev();
    for (id, port) in [("web1", 80), ("web2", 81)] {
        let body = json!({"ID": id, "Name": "web", "Port": port,
            "Connect": {"SidecarService": {}}});
        let r = s.put("/v1/agent/service/register", &body.to_string());
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let u = s.get_json("/v1/operator/usage");
    let dc = &u["Usage"]["dc1"];
    let billable = dc["BillableServiceInstances"].as_u64().unwrap();
    let text = ok(&s, &["operator", "usage", "instances"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("Billable Service Instances Total: {billable}"),
        "{text}"
    );
    assert_eq!(
        lines[1],
        format!("dc1 Billable Service Instances: {billable}")
    );
    assert_eq!(lines[3], "Billable Services");
    assert_eq!(lines[4], "Services      Service instances");
    assert!(lines[5].ends_with(&billable.to_string()), "{text}");
    assert_eq!(lines[7], "Connect Services");
    assert!(lines[8].starts_with("Type") && lines[8].ends_with("Service instances"));
    let proxies = dc["ConnectServiceInstances"]["connect-proxy"]
        .as_u64()
        .unwrap();
    assert_eq!(proxies, 2, "{u}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("connect-proxy") && l.ends_with(" 2")),
        "{text}"
    );
    let only = ok(&s, &["operator", "usage", "instances", "-connect"]);
    assert!(only.starts_with("Connect Services\n"), "{only}");
    let only = ok(&s, &["operator", "usage", "instances", "-billable"]);
    assert!(!only.contains("Connect Services"), "{only}");
}
