//! Gateways on real processes: the `mesh`, `ingress-gateway`,
//! `terminating-gateway` and `exported-services` config entries (Consul's
//! validations refused with its words and a 400 that changes nothing,
//! accepted entries round-tripping through `/v1/config`, the CLI and a
//! snapshot), `/v1/catalog/gateway-services/:gw` and
//! `/v1/health/ingress/:svc` (shapes, `?passing`, blocking queries), and
//! their ACLs with default deny: anonymous callers, and tokens one
//! permission short.

mod common;

use std::time::{Duration, Instant};

use common::acl::{ROOT, as_root, deny_server, token_with_rules, with};
use common::{Server, cli, enc};
use serde_json::{Value, json};

fn put_entry(s: &Server, entry: &Value) -> common::Resp {
    s.put("/v1/config", &entry.to_string())
}

fn put_ok(s: &Server, path: &str, body: &Value) {
    let r = s.put(path, &body.to_string());
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    assert_ne!(r.body.trim(), "false", "{path}: {}", r.body);
}

fn register(s: &Server, body: Value) {
    put_ok(s, "/v1/catalog/register", &body);
}

fn http_defaults(s: &Server, svc: &str) {
    put_ok(
        s,
        "/v1/config",
        &json!({"Kind": "service-defaults", "Name": svc, "Protocol": "http"}),
    );
}

/// A 400 whose body is `says`, and no entry `kind/name` afterwards.
fn refused(s: &Server, entry: Value, says: &str) {
    let r = put_entry(s, &entry);
    assert_eq!(r.status, 400, "{entry}: {}", r.body);
    assert_eq!(r.body.trim(), says, "{entry}");
    let kind = entry["Kind"].as_str().unwrap();
    let name = entry["Name"].as_str().unwrap_or("");
    if !name.is_empty() {
        let r = s.get(&format!("/v1/config/{kind}/{}", enc(name)));
        assert_eq!(r.status, 404, "{kind}/{name} was written: {}", r.body);
    }
}

fn ingress(listeners: Value) -> Value {
    json!({"Kind": "ingress-gateway", "Name": "ig", "Listeners": listeners})
}

#[test]
fn invalid_gateway_entries_are_refused_in_consuls_words() {
    let s = Server::dev();
    refused(
        &s,
        ingress(json!([{"Port": 8080, "Protocol": "tcp",
            "Services": [{"Name": "a"}, {"Name": "b"}]}])),
        "Multiple services per listener are only supported for L7 protocols, 'http', 'grpc' and 'http2' (listener on port 8080)",
    );
    refused(
        &s,
        ingress(json!([{"Port": 8080, "Protocol": "tcp", "Services": [{"Name": "*"}]}])),
        "Wildcard service name is only valid for L7 protocols, 'http', 'grpc' and 'http2' (listener on port 8080)",
    );
    refused(
        &s,
        ingress(json!([{"Port": 8080, "Protocol": "tcp",
            "Services": [{"Name": "a", "Hosts": ["a.example.com"]}]}])),
        "Associating hosts to a service is not supported for the tcp protocol (listener on port 8080)",
    );
    refused(
        &s,
        ingress(json!([{"Port": 8080, "Protocol": "http",
            "Services": [{"Name": "*", "Hosts": ["a.example.com"]}]}])),
        "Associating hosts to a wildcard service is not supported (listener on port 8080)",
    );
    refused(
        &s,
        ingress(json!([{"Port": 8080, "Services": [{"Name": "a"}]},
            {"Port": 8080, "Services": [{"Name": "b"}]}])),
        "port 8080 declared on two listeners",
    );
    refused(
        &s,
        ingress(json!([{"Port": 8080, "Protocol": "udp", "Services": [{"Name": "a"}]}])),
        "protocol must be 'tcp', 'http', 'http2', or 'grpc'. 'udp' is an unsupported protocol",
    );
    refused(
        &s,
        json!({"Kind": "ingress-gateway", "Name": "ig", "TLS": {"Enabled": true},
            "Listeners": [{"Port": 1, "Protocol": "http", "Services": [{"Name": "*"}, {"Name": "a", "Hosts": ["*"]}]}]}),
        "Host '*' is not allowed when TLS is enabled, all hosts must be valid DNS records to add as a DNSSAN",
    );
    refused(
        &s,
        json!({"Kind": "terminating-gateway", "Name": "tg",
            "Services": [{"Name": "db", "CertFile": "/etc/c.pem", "KeyFile": "/etc/k.pem"}]}),
        "Service \"db\" must have a CertFile, CAFile, and KeyFile specified for TLS origination",
    );
    refused(
        &s,
        json!({"Kind": "terminating-gateway", "Name": "tg",
            "Services": [{"Name": "db"}, {"Name": "db"}]}),
        "Service \"db\" was specified more than once within a namespace",
    );
    refused(
        &s,
        json!({"Kind": "mesh", "Name": "other"}),
        "invalid name (\"other\"), only \"mesh\" is supported",
    );
    refused(
        &s,
        json!({"Kind": "mesh", "TLS": {"Outgoing": {"TLSMinVersion": "TLSv1_3", "CipherSuites": ["TLS_RSA_WITH_AES_128_GCM_SHA256"]}}}),
        "error in outgoing TLS configuration: configuring CipherSuites is only applicable to connections negotiated with TLS 1.2 or earlier, TLSMinVersion is set to TLSv1_3",
    );
    refused(
        &s,
        json!({"Kind": "exported-services", "Name": "default",
            "Services": [{"Name": "web", "Consumers": [{}]}]}),
        "Services[0]: Consumers[0]: Service consumer must define at least one of Peer, Partition, or SamenessGroup",
    );
    refused(
        &s,
        json!({"Kind": "exported-services", "Name": "other", "Services": []}),
        "exported-services Name must be \"default\"",
    );
    // Unknown members are refused as for every kind.
    let r = put_entry(
        &s,
        &json!({"Kind": "terminating-gateway", "Name": "tg", "Bogus": 1}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("invalid config key \"Bogus\""),
        "{}",
        r.body
    );
}

#[test]
fn an_ingress_listener_and_its_services_must_agree_on_the_protocol() {
    let s = Server::dev();
    let http_ig =
        ingress(json!([{"Port": 8080, "Protocol": "http", "Services": [{"Name": "web"}]}]));
    // web is tcp until its defaults say otherwise.
    refused(
        &s,
        http_ig.clone(),
        "service \"web\" has protocol \"tcp\", which does not match defined listener protocol \"http\"",
    );
    http_defaults(&s, "web");
    put_ok(&s, "/v1/config", &http_ig);
    // Nor may web's defaults move it away from the listener afterwards.
    let r = put_entry(
        &s,
        &json!({"Kind": "service-defaults", "Name": "web", "Protocol": "tcp"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.body.trim(),
        "service \"web\" has protocol \"tcp\", which does not match defined listener protocol \"http\""
    );
    assert_eq!(
        s.get_json("/v1/config/service-defaults/web")["Protocol"],
        "http"
    );
    // A gateway is an ingress or a terminating gateway, not both.
    let r = put_entry(
        &s,
        &json!({"Kind": "terminating-gateway", "Name": "ig", "Services": [{"Name": "db"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.body.trim(),
        "cannot create a \"terminating-gateway\" config entry with name \"ig\", a \"ingress-gateway\" config entry with the same name exists"
    );
}

#[test]
fn accepted_entries_round_trip_through_the_api_the_cli_and_a_snapshot() {
    let s = Server::dev();
    http_defaults(&s, "web");
    let entries = [
        json!({"Kind": "mesh", "Name": "mesh",
            "TransparentProxy": {"MeshDestinationsOnly": true},
            "AllowEnablingPermissiveMutualTLS": true,
            "TLS": {"Incoming": {"TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "TLSv1_3",
                                 "CipherSuites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]}},
            "HTTP": {"SanitizeXForwardedClientCert": true},
            "Peering": {"PeerThroughMeshGateways": true}}),
        json!({"Kind": "ingress-gateway", "Name": "ig",
            "TLS": {"Enabled": true},
            "Listeners": [
                {"Port": 8080, "Protocol": "http", "Services": [
                    {"Name": "web", "Hosts": ["web.example.com"],
                     "RequestHeaders": {"Add": {"X-Via": "ig"}, "Remove": ["X-Debug"]}}]},
                {"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "db"}]}],
            "Defaults": {"MaxConnections": 10}}),
        json!({"Kind": "terminating-gateway", "Name": "tg", "Services": [
            {"Name": "billing", "CAFile": "/etc/ca.pem", "CertFile": "/etc/c.pem",
             "KeyFile": "/etc/k.pem", "SNI": "billing.example.com"},
            {"Name": "ledger"}]}),
        json!({"Kind": "exported-services", "Name": "default", "Services": [
            {"Name": "web", "Consumers": [{"Peer": "east"}, {"SamenessGroup": "all"}]}]}),
    ];
    for e in &entries {
        put_ok(&s, "/v1/config", e);
        let kind = e["Kind"].as_str().unwrap();
        let name = e["Name"].as_str().unwrap();
        let mut got = s.get_json(&format!("/v1/config/{kind}/{name}"));
        assert!(got["CreateIndex"].as_u64().unwrap() > 0);
        let m = got.as_object_mut().unwrap();
        m.remove("CreateIndex");
        m.remove("ModifyIndex");
        assert_eq!(&got, e, "{kind}/{name}");
        let list = s.get_json(&format!("/v1/config/{kind}"));
        assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    }
    // CAS: a stale index writes nothing.
    let tg = s.get_json("/v1/config/terminating-gateway/tg");
    let r = put_entry(
        &s,
        &json!({"Kind": "terminating-gateway", "Name": "tg", "Services": []}),
    );
    assert_eq!(r.status, 200);
    let stale = tg["ModifyIndex"].as_u64().unwrap();
    let r = s.put(&format!("/v1/config?cas={stale}"), &entries[2].to_string());
    assert_eq!(r.body.trim(), "false");
    put_ok(&s, "/v1/config", &entries[2]);

    // The CLI reads them as the API answers them.
    let out = cli(
        &s.url,
        &["config", "read", "-kind", "ingress-gateway", "-name", "ig"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read["Listeners"], entries[1]["Listeners"]);

    // Written from HCL, listed and deleted by the CLI.
    let dir = tempfile::tempdir().unwrap();
    let hcl = dir.path().join("tg2.hcl");
    std::fs::write(
        &hcl,
        "Kind = \"terminating-gateway\"\nName = \"tg2\"\nServices = [\n  { Name = \"billing\", CAFile = \"/etc/ca.pem\", SNI = \"b.example.com\" }\n]\n",
    )
    .unwrap();
    let out = cli(&s.url, &["config", "write", hcl.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Config entry written: terminating-gateway/tg2"
    );
    let tg2 = s.get_json("/v1/config/terminating-gateway/tg2");
    assert_eq!(
        tg2["Services"],
        json!([{"Name": "billing", "CAFile": "/etc/ca.pem", "SNI": "b.example.com"}])
    );
    let out = cli(&s.url, &["config", "list", "-kind", "terminating-gateway"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tg\ntg2\n");
    let out = cli(
        &s.url,
        &[
            "config",
            "delete",
            "-kind",
            "terminating-gateway",
            "-name",
            "tg2",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.get("/v1/config/terminating-gateway/tg2").status, 404);

    // A snapshot holds them: restored after they are deleted, they are back.
    let file = dir.path().join("gw.snap");
    let out = cli(&s.url, &["snapshot", "save", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (kind, name) in [
        ("mesh", "mesh"),
        ("ingress-gateway", "ig"),
        ("terminating-gateway", "tg"),
        ("exported-services", "default"),
    ] {
        let r = s.delete(&format!("/v1/config/{kind}/{name}"));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(s.get(&format!("/v1/config/{kind}/{name}")).status, 404);
    }
    let out = cli(&s.url, &["snapshot", "restore", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for e in &entries {
        let kind = e["Kind"].as_str().unwrap();
        let name = e["Name"].as_str().unwrap();
        let got = s.get_json(&format!("/v1/config/{kind}/{name}"));
        assert_eq!(got["Kind"], e["Kind"]);
        for (k, v) in e.as_object().unwrap() {
            assert_eq!(&got[k], v, "{kind}/{name}: {k} after the restore");
        }
    }
}

/// web and api (http), db (tcp), each with an instance; an ingress gateway
/// `ig` on node gw1, passing.
fn gateway_world(s: &Server) {
    http_defaults(s, "web");
    http_defaults(s, "api");
    for (svc, port) in [("web", 80), ("api", 81), ("db", 5432)] {
        register(
            s,
            json!({"Node": "n1", "Address": "10.0.0.1",
                "Service": {"ID": svc, "Service": svc, "Port": port}}),
        );
    }
    register(
        s,
        json!({"Node": "gw1", "Address": "10.0.1.1",
            "Service": {"Kind": "ingress-gateway", "ID": "ig", "Service": "ig", "Port": 8443},
            "Check": {"CheckID": "ig-alive", "Name": "alive", "ServiceID": "ig", "Status": "passing"}}),
    );
}

#[test]
fn gateway_services_and_health_ingress_follow_the_entries() {
    let s = Server::dev();
    gateway_world(&s);
    // No entry: nothing linked, and no gateway exposes web.
    assert_eq!(s.get_json("/v1/catalog/gateway-services/ig"), json!([]));
    assert_eq!(s.get_json("/v1/health/ingress/web"), json!([]));
    let before = s.get("/v1/health/ingress/web").index();

    // A blocking read of health/ingress is woken by the entry's write.
    let addr = s.http_addr;
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let r = common::request(
            addr,
            "GET",
            &format!("/v1/health/ingress/web?index={before}&wait=20s"),
            None,
        );
        (started.elapsed(), r)
    });
    std::thread::sleep(Duration::from_millis(300));
    put_ok(
        &s,
        "/v1/config",
        &json!({"Kind": "ingress-gateway", "Name": "ig", "Listeners": [
            {"Port": 8080, "Protocol": "http", "Services": [
                {"Name": "web", "Hosts": ["web.example.com"]}, {"Name": "*"}]},
            {"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "db"}]}]}),
    );
    let (took, r) = waiter.join().unwrap();
    assert!(took < Duration::from_secs(10), "woken after {took:?}");
    let rows = r.json();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["Service"]["ID"], "ig");
    assert_eq!(rows[0]["Service"]["Kind"], "ingress-gateway");
    assert_eq!(rows[0]["Node"]["Node"], "gw1");
    assert_eq!(rows[0]["Checks"][0]["Status"], "passing");

    // Consul's GatewayService rows: named links and those of `*`.
    let gs = s.get_json("/v1/catalog/gateway-services/ig");
    let rows: Vec<(String, i64, String, bool)> = gs
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["Service"]["Name"].as_str().unwrap().to_string(),
                g["Port"].as_i64().unwrap(),
                g["Protocol"].as_str().unwrap().to_string(),
                g["FromWildcard"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert!(
        rows.contains(&("web".into(), 8080, "http".into(), false)),
        "{gs}"
    );
    assert!(
        rows.contains(&("api".into(), 8080, "http".into(), true)),
        "{gs}"
    );
    assert!(
        rows.contains(&("db".into(), 9090, "tcp".into(), false)),
        "{gs}"
    );
    let web = gs
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["Service"]["Name"] == "web")
        .unwrap();
    assert_eq!(web["Gateway"], json!({"Name": "ig"}));
    assert_eq!(web["GatewayKind"], "ingress-gateway");
    assert_eq!(web["Hosts"], json!(["web.example.com"]));
    // The gateway's own instance is no service of its own wildcard.
    assert!(!rows.iter().any(|r| r.0 == "ig"), "{gs}");

    // A terminating gateway's rows carry its TLS settings.
    put_ok(
        &s,
        "/v1/config",
        &json!({"Kind": "terminating-gateway", "Name": "tg", "Services": [
            {"Name": "billing", "CAFile": "/etc/ca.pem", "SNI": "billing.example.com"}]}),
    );
    assert_eq!(
        s.get_json("/v1/catalog/gateway-services/tg"),
        json!([{"Gateway": {"Name": "tg"}, "Service": {"Name": "billing"},
            "GatewayKind": "terminating-gateway", "CAFile": "/etc/ca.pem",
            "SNI": "billing.example.com",
            "CreateIndex": s.get_json("/v1/config/terminating-gateway/tg")["CreateIndex"],
            "ModifyIndex": s.get_json("/v1/config/terminating-gateway/tg")["ModifyIndex"]}])
    );

    // ?passing leaves a failing gateway out; without it, it is listed.
    register(
        &s,
        json!({"Node": "gw1", "Address": "10.0.1.1",
            "Check": {"CheckID": "ig-alive", "Name": "alive", "ServiceID": "ig", "Status": "critical"}}),
    );
    assert_eq!(s.get_json("/v1/health/ingress/web?passing"), json!([]));
    assert_eq!(
        s.get_json("/v1/health/ingress/web")
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // A service the gateway does not expose has no ingress.
    put_ok(
        &s,
        "/v1/config",
        &json!({"Kind": "ingress-gateway", "Name": "ig", "Listeners": [
            {"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "db"}]}]}),
    );
    assert_eq!(s.get_json("/v1/health/ingress/web"), json!([]));
    assert_eq!(
        s.get_json("/v1/health/ingress/db")
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // The UI's summary of a gateway's services is the same list.
    let ui = s.get_json("/v1/internal/ui/gateway-services-nodes/ig");
    assert_eq!(ui.as_array().unwrap().len(), 1, "{ui}");
    assert_eq!(ui[0]["Name"], "db");
    assert_eq!(
        ui[0]["GatewayConfig"]["Addresses"],
        json!(["db.ingress.*:9090"])
    );
    assert_eq!(s.get("/v1/catalog/gateway-services/").status, 400);
}

#[test]
fn gateway_reads_and_writes_under_default_deny() {
    let s = deny_server();
    let addr = s.http_addr;
    let root = |m: &str, p: &str, b: Value| as_root(addr, m, p, &b);
    root(
        "PUT",
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
    );
    for (svc, port) in [("web", 80), ("secret", 81)] {
        root(
            "PUT",
            "/v1/catalog/register",
            json!({"Node": "n1", "Address": "10.0.0.1",
                "Service": {"ID": svc, "Service": svc, "Port": port}}),
        );
    }
    root(
        "PUT",
        "/v1/catalog/register",
        json!({"Node": "gw1", "Address": "10.0.1.1",
            "Service": {"Kind": "ingress-gateway", "ID": "ig", "Service": "ig", "Port": 8443}}),
    );
    let entry = json!({"Kind": "ingress-gateway", "Name": "ig", "Listeners": [
        {"Port": 8080, "Protocol": "http", "Services": [{"Name": "web"}]},
        {"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "secret"}]}]});

    // Writing a gateway's entry takes mesh:write: service:write on the
    // gateway is one permission short.
    let (_, gw_writer) =
        token_with_rules(addr, "gw-writer", r#"service "ig" { policy = "write" }"#);
    let r = with(
        addr,
        "PUT",
        "/v1/config",
        Some(&entry.to_string()),
        &gw_writer,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("mesh:write"), "{}", r.body);
    let r = with(addr, "PUT", "/v1/config", Some(&entry.to_string()), "");
    assert_eq!(r.status, 403, "{}", r.body);
    let (_, mesh_writer) = token_with_rules(addr, "mesh-writer", r#"mesh = "write""#);
    let r = with(
        addr,
        "PUT",
        "/v1/config",
        Some(&entry.to_string()),
        &mesh_writer,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // Anonymous: nothing of the gateway.
    for path in [
        "/v1/catalog/gateway-services/ig",
        "/v1/health/ingress/web",
        "/v1/config/ingress-gateway/ig",
        "/v1/config/exported-services/default",
    ] {
        let r = with(addr, "GET", path, None, "");
        assert_eq!(r.status, 403, "{path}: {}", r.body);
    }
    // mesh is readable by anyone, as proxy-defaults is.
    root(
        "PUT",
        "/v1/config",
        json!({"Kind": "mesh", "TransparentProxy": {"MeshDestinationsOnly": true}}),
    );
    assert_eq!(
        with(addr, "GET", "/v1/config/mesh/mesh", None, "").status,
        200
    );

    // service:read on the gateway only: its links to services the token
    // may not read are hidden, and said to be.
    let (_, gw_reader) = token_with_rules(
        addr,
        "gw-reader",
        "service \"ig\" { policy = \"read\" }\nservice \"web\" { policy = \"read\" }",
    );
    let r = with(
        addr,
        "GET",
        "/v1/catalog/gateway-services/ig",
        None,
        &gw_reader,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let names: Vec<Value> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["Service"]["Name"].clone())
        .collect();
    assert_eq!(names, vec![json!("web")]);
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));

    // service:read on web but not on the gateway: the gateway's instances
    // are not shown for web's ingress.
    let (_, web_reader) = token_with_rules(
        addr,
        "web-reader",
        "service \"web\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }",
    );
    let r = with(addr, "GET", "/v1/health/ingress/web", None, &web_reader);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!([]));
    assert_eq!(r.header("x-consul-results-filtered-by-acls"), Some("true"));
    let r = with(
        addr,
        "GET",
        "/v1/catalog/gateway-services/ig",
        None,
        &web_reader,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // Both (and the node): the row.
    let (_, both) = token_with_rules(
        addr,
        "both",
        "service \"web\" { policy = \"read\" }\nservice \"ig\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }",
    );
    let r = with(addr, "GET", "/v1/health/ingress/web", None, &both);
    assert_eq!(r.json().as_array().unwrap().len(), 1, "{}", r.body);
    // exported-services needs mesh:read.
    root(
        "PUT",
        "/v1/config",
        json!({"Kind": "exported-services", "Name": "default",
        "Services": [{"Name": "web", "Consumers": [{"Peer": "east"}]}]}),
    );
    let r = with(
        addr,
        "GET",
        "/v1/config/exported-services/default",
        None,
        &both,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("mesh:read"), "{}", r.body);
    let (_, mesh_reader) = token_with_rules(addr, "mesh-reader", r#"mesh = "read""#);
    let r = with(
        addr,
        "GET",
        "/v1/config/exported-services/default",
        None,
        &mesh_reader,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let _ = ROOT;
}

#[test]
fn a_huge_ingress_entry_is_refused_or_bounded() {
    let s = Server::dev();
    // 70,000 listeners: over the body limit or refused by validation
    // (ports past 65535), never a panic and never stored.
    let listeners: Vec<Value> = (1..=70_000)
        .map(|p| json!({"Port": p, "Services": [{"Name": format!("s{p}")}]}))
        .collect();
    let r = put_entry(&s, &ingress(Value::Array(listeners)));
    assert!(
        r.status == 400 || r.status == 413,
        "{}: {}",
        r.status,
        &r.body[..r.body.len().min(200)]
    );
    assert_eq!(s.get("/v1/config/ingress-gateway/ig").status, 404);
    assert_eq!(s.get("/v1/status/leader").status, 200);
}

#[test]
fn permissive_mutual_tls_takes_the_mesh_entrys_consent() {
    let s = Server::dev();
    let permissive =
        json!({"Kind": "service-defaults", "Name": "web", "MutualTLSMode": "permissive"});
    refused(
        &s,
        permissive.clone(),
        "MutualTLSMode=permissive is insecure. Set `AllowEnablingPermissiveMutualTLS = true` in the cluster-wide mesh config entry (kind = mesh) to enable it.",
    );
    put_ok(
        &s,
        "/v1/config",
        &json!({"Kind": "mesh", "AllowEnablingPermissiveMutualTLS": true}),
    );
    put_ok(&s, "/v1/config", &permissive);
    // Once permissive, it may be written again after the consent is gone.
    put_ok(&s, "/v1/config", &json!({"Kind": "mesh"}));
    put_ok(&s, "/v1/config", &permissive);
    let r = put_entry(
        &s,
        &json!({"Kind": "proxy-defaults", "Name": "global", "MutualTLSMode": "permissive"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
}
