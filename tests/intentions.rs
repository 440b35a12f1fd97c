//! Intentions against a real server: `service-intentions` entries with
//! Consul's validation (conformance-style cases: body → status and error),
//! precedence and evaluation order, the legacy API mapped onto the
//! entries, `/check` and `/v1/agent/connect/authorize` with Consul's
//! reasons, L7 permissions only on L7 services, and a proxycfg snapshot
//! that picks up a new deny intention.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use serde_json::{Value, json};

fn put_entry(s: &Server, body: &Value) -> common::Resp {
    s.put("/v1/config", &body.to_string())
}

/// (entry, expected error fragment or "" for accepted), after Consul's
/// `TestServiceIntentionsConfigEntry` cases that apply without namespaces
/// and peers.
fn cases() -> Vec<(Value, &'static str)> {
    let e =
        |sources: Value| json!({"Kind": "service-intentions", "Name": "db", "Sources": sources});
    vec![
        (e(json!([{"Name": "web", "Action": "allow"}])), ""),
        (e(json!([{"Name": "*", "Action": "deny"}])), ""),
        (
            e(json!([{"name": "web", "action": "allow", "description": "snake"}])),
            "",
        ),
        (
            json!({"Kind": "service-intentions", "Name": "", "Sources": []}),
            "Name is required",
        ),
        (
            json!({"Kind": "service-intentions", "Name": "d*", "Sources": []}),
            "wildcard character '*' cannot be used with partial values",
        ),
        (
            e(json!([{"Action": "allow"}])),
            "Sources[0].Name is required",
        ),
        (
            e(json!([{"Name": "w*", "Action": "allow"}])),
            "Sources[0].Name: wildcard character '*' cannot be used with partial values",
        ),
        (
            e(json!([{"Name": "web", "Action": "allow"}, {"Name": "web", "Action": "deny"}])),
            "Sources[1] defines \"web\" more than once",
        ),
        (
            e(json!([{"Name": "web"}])),
            "Sources[0].Action must be set to 'allow' or 'deny'",
        ),
        (
            e(json!([{"Name": "web", "Action": "maybe"}])),
            "Sources[0].Action must be set to 'allow' or 'deny'",
        ),
        (
            e(json!([{"Name": "web", "Action": "allow", "Type": "other"}])),
            "Sources[0].Type must be set to 'consul'",
        ),
        (
            e(
                json!([{"Name": "web", "Action": "allow", "LegacyID": "", "LegacyMeta": {"a": "b"}}]),
            ),
            "must be omitted",
        ),
        (
            e(json!([{"Name": "web", "Action": "allow",
                      "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "/a"}}]}])),
            "Sources[0].Action must be omitted if Permissions are specified",
        ),
        (
            e(json!([{"Name": "web", "Permissions": [{"Action": "allow"}]}])),
            "Sources[0].Permissions[0].HTTP is required",
        ),
        (
            e(
                json!([{"Name": "web", "Permissions": [{"Action": "nope", "HTTP": {"PathExact": "/"}}]}]),
            ),
            "Sources[0].Permissions[0].Action must be set to 'allow' or 'deny'",
        ),
        (
            e(json!([{"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {}}]}])),
            "Sources[0].Permissions[0].HTTP should not be empty",
        ),
        (
            e(json!([{"Name": "web", "Permissions": [{"Action": "allow",
                      "HTTP": {"PathExact": "/a", "PathPrefix": "/b"}}]}])),
            "should only contain at most one of PathExact, PathPrefix, or PathRegex",
        ),
        (
            e(
                json!([{"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "a"}}]}]),
            ),
            "Sources[0].Permissions[0].HTTP.PathPrefix doesn't start with '/'",
        ),
        (
            e(json!([{"Name": "web", "Permissions": [{"Action": "allow",
                      "HTTP": {"Header": [{"Exact": "x"}]}}]}])),
            "Sources[0].Permissions[0].HTTP.Header[0] missing required Name field",
        ),
        (
            e(json!([{"Name": "web", "Permissions": [{"Action": "allow",
                      "HTTP": {"Header": [{"Name": "x", "Exact": "a", "Prefix": "b"}]}}]}])),
            "should only contain one of Present, Exact, Prefix, Suffix, or Regex",
        ),
        (
            e(json!([{"Name": "web", "Permissions": [{"Action": "allow",
                      "HTTP": {"Methods": ["GET", "FETCH"]}}]}])),
            "Sources[0].Permissions[0].HTTP.Methods contains an invalid method \"FETCH\"",
        ),
        (
            e(json!([{"Name": "web", "Permissions": [{"Action": "allow",
                      "HTTP": {"Methods": ["get", "GET"]}}]}])),
            "Sources[0].Permissions[0].HTTP.Methods contains \"GET\" more than once",
        ),
        (
            e(json!([{"Name": "web", "Namespace": "other", "Action": "allow"}])),
            "not supported",
        ),
        (
            e(json!([{"Name": "web", "Action": "allow", "Bogus": 1}])),
            "invalid config key",
        ),
        // L7 permissions on a tcp service (no service-defaults: tcp).
        (
            e(
                json!([{"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "/a"}}]}]),
            ),
            "intentions with L7 Permissions need http",
        ),
    ]
}

#[test]
fn entries_are_validated_as_consul() {
    let s = Server::dev();
    for (body, want) in cases() {
        let r = put_entry(&s, &body);
        if want.is_empty() {
            assert_eq!(r.status, 200, "{body}: {}", r.body);
        } else {
            assert_eq!(r.status, 400, "{body} should be refused: {}", r.body);
            assert!(
                r.body.contains(want),
                "{body}: want {want:?}, got {}",
                r.body
            );
        }
    }
    // The last accepted write is what is stored: refused ones changed nothing.
    let e = s.get_json("/v1/config/service-intentions/db");
    assert_eq!(
        e["Sources"],
        json!([{"Name": "web", "Action": "allow", "Description": "snake",
                "Precedence": 9, "Type": "consul"}])
    );
}

#[test]
fn l7_permissions_need_an_l7_destination() {
    let s = Server::dev();
    let l7 = json!({"Kind": "service-intentions", "Name": "api", "Sources": [
        {"Name": "web", "Permissions": [
            {"Action": "deny", "HTTP": {"PathPrefix": "/admin", "Methods": ["post"]}},
            {"Action": "allow", "HTTP": {"PathPrefix": "/"}}]}]});
    assert_eq!(put_entry(&s, &l7).status, 400);
    let http = json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"});
    assert_eq!(put_entry(&s, &http).status, 200);
    let r = put_entry(&s, &l7);
    assert_eq!(r.status, 200, "{}", r.body);
    let stored = s.get_json("/v1/config/service-intentions/api");
    assert_eq!(
        stored["Sources"][0]["Permissions"][0]["HTTP"]["Methods"],
        json!(["POST"]),
        "methods are upper-cased"
    );
    // Making the service tcp again would strand the L7 intentions.
    let tcp = json!({"Kind": "service-defaults", "Name": "api", "Protocol": "tcp"});
    let r = put_entry(&s, &tcp);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        s.get_json("/v1/config/service-defaults/api")["Protocol"],
        "http"
    );
    // L4 check and authorize: an L7 intention denies L4 connections.
    assert_eq!(
        s.get_json("/v1/connect/intentions/check?source=web&destination=api")["Allowed"],
        false
    );
    let r = s.put(
        "/v1/agent/connect/authorize",
        r#"{"Target":"api","ClientCertURI":"spiffe://x.consul/ns/default/dc/dc1/svc/web"}"#,
    );
    assert_eq!(
        r.json(),
        json!({"Authorized": false,
               "Reason": "Matched L7 intention: web => api (Precedence: 9, Permissions: 2)"})
    );
}

#[test]
fn legacy_api_maps_onto_entries_in_precedence_order() {
    let s = Server::dev();
    // Exact upserts create the destination's entry and add sources to it.
    for (src, dst, action) in [
        ("web", "db", "deny"),
        ("*", "db", "allow"),
        ("web", "*", "allow"),
    ] {
        let r = s.put(
            &format!("/v1/connect/intentions/exact?source={}&destination={}", common::enc(src), common::enc(dst)),
            &json!({"SourceType": "consul", "Action": action, "Description": format!("{src}->{dst}")})
                .to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body.trim(), "true");
    }
    let entry = s.get_json("/v1/config/service-intentions/db");
    let names: Vec<&str> = entry["Sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["Name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web", "*"], "sources in evaluation order");

    // The list: every source, highest precedence first (9, 8, 6).
    let list = s.get("/v1/connect/intentions");
    assert!(list.index() > 0);
    let list = list.json();
    let got: Vec<(String, String, i64)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["SourceName"].as_str().unwrap().into(),
                i["DestinationName"].as_str().unwrap().into(),
                i["Precedence"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("web".into(), "db".into(), 9),
            ("*".into(), "db".into(), 8),
            ("web".into(), "*".into(), 6)
        ]
    );
    let first = &list[0];
    assert_eq!(first["Action"], "deny");
    assert_eq!(first["SourceType"], "consul");
    assert_eq!(first["SourceNS"], "default");
    assert_eq!(first["Description"], "web->db");

    // Match by destination (db's own and the `*` destination's) and by
    // source (web's own and the `*` source's), in precedence order.
    let matched = |by: &str, name: &str| -> Vec<String> {
        let m = s.get_json(&format!("/v1/connect/intentions/match?by={by}&name={name}"));
        m[name]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let name = |k: &str| i[k].as_str().unwrap().to_string();
                format!("{}->{}", name("SourceName"), name("DestinationName"))
            })
            .collect()
    };
    let in_order = ["web->db", "*->db", "web->*"];
    assert_eq!(matched("destination", "db"), in_order);
    assert_eq!(matched("source", "web"), in_order);

    // Check: the first match decides.
    let check = |src: &str, dst: &str| {
        s.get_json(&format!(
            "/v1/connect/intentions/check?source={src}&destination={dst}"
        ))["Allowed"]
            .as_bool()
            .unwrap()
    };
    assert!(!check("web", "db"));
    assert!(check("api", "db"));
    assert!(check("web", "cache"));
    assert!(check("api", "cache"), "no match: allowed (ACLs off)");

    // Exact read, delete, 404.
    let one = s.get_json("/v1/connect/intentions/exact?source=web&destination=db");
    assert_eq!(one["Action"], "deny");
    assert_eq!(
        s.delete("/v1/connect/intentions/exact?source=web&destination=db")
            .body
            .trim(),
        "true"
    );
    assert_eq!(
        s.get("/v1/connect/intentions/exact?source=web&destination=db")
            .status,
        404
    );
    assert_eq!(
        s.delete("/v1/connect/intentions/exact?source=web&destination=db")
            .status,
        404
    );
    assert!(check("web", "db"), "the `*` source allows it now");
    // Deleting the last source deletes the entry.
    assert_eq!(
        s.delete("/v1/connect/intentions/exact?source=web&destination=*")
            .status,
        200
    );
    assert_eq!(s.get("/v1/config/service-intentions/*").status, 404);

    // Legacy create: an ID; a duplicate is refused.
    let r = s.put("/v1/connect/intentions", "{}");
    assert_eq!(r.status, 405, "create is a POST");
    let r = common::request(
        s.http_addr,
        "POST",
        "/v1/connect/intentions",
        Some(r#"{"SourceName":"x","DestinationName":"y","Action":"allow","Meta":{"k":"v"}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["ID"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 36);
    let one = s.get_json("/v1/connect/intentions/exact?source=x&destination=y");
    assert_eq!(one["ID"], id.as_str());
    assert_eq!(one["Meta"], json!({"k": "v"}));
    let dup = common::request(
        s.http_addr,
        "POST",
        "/v1/connect/intentions",
        Some(r#"{"SourceName":"x","DestinationName":"y","Action":"deny"}"#),
    );
    assert_eq!(dup.status, 400, "{}", dup.body);

    // Bad input: clear 400s.
    for path in [
        "/v1/connect/intentions/check?source=web",
        "/v1/connect/intentions/match?by=sideways&name=web",
        "/v1/connect/intentions/match?by=source",
        "/v1/connect/intentions/exact?source=w*&destination=db",
    ] {
        assert_eq!(s.get(path).status, 400, "{path}");
    }
    let r = s.put(
        "/v1/connect/intentions/exact?source=a&destination=b",
        r#"{"Action":"sometimes"}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        s.get("/v1/connect/intentions/exact?source=a&destination=b")
            .status,
        404
    );
}

#[test]
fn authorize_answers_with_consuls_reasons() {
    let s = Server::dev();
    let r = put_entry(
        &s,
        &json!({"Kind": "service-intentions", "Name": "db",
                "Sources": [{"Name": "web", "Action": "deny"}, {"Name": "*", "Action": "allow"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let auth = |target: &str, src: &str| {
        let body = json!({"Target": target,
                          "ClientCertURI": format!("spiffe://11111111-2222-3333-4444-555555555555.consul/ns/default/dc/dc1/svc/{src}"),
                          "ClientCertSerial": "01"});
        let r = common::request(
            s.http_addr,
            "POST",
            "/v1/agent/connect/authorize",
            Some(&body.to_string()),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    assert_eq!(
        auth("db", "web"),
        json!({"Authorized": false, "Reason": "Matched L4 intention: web => db (Precedence: 9, Action: DENY)"})
    );
    assert_eq!(
        auth("db", "api"),
        json!({"Authorized": true, "Reason": "Matched L4 intention: * => db (Precedence: 8, Action: ALLOW)"})
    );
    assert_eq!(
        auth("cache", "web"),
        json!({"Authorized": true, "Reason": "Default behavior configured by ACLs"})
    );
    for body in [
        r#"{"ClientCertURI":"spiffe://x.consul/ns/default/dc/dc1/svc/web"}"#,
        r#"{"Target":"db"}"#,
        r#"{"Target":"db","ClientCertURI":"http://web"}"#,
        r#"{"Target":"db","ClientCertURI":"spiffe://x.consul/agent/client/dc/dc1/id/n1"}"#,
        "not json",
    ] {
        let r = common::request(
            s.http_addr,
            "POST",
            "/v1/agent/connect/authorize",
            Some(body),
        );
        assert_eq!(r.status, 400, "{body}: {}", r.body);
    }
}

#[test]
fn a_proxy_snapshot_sees_a_new_deny_intention() {
    let s = Server::dev();
    let r = s.put(
        "/v1/catalog/register",
        &json!({"Node": "n1", "Address": "10.0.0.1",
                "Service": {"ID": "db-proxy", "Service": "db-sidecar-proxy", "Kind": "connect-proxy",
                            "Port": 21000, "Proxy": {"DestinationServiceName": "db"}}})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let path = "/v1/internal/proxycfg/db-proxy?node=n1";
    let first = common::eventually(Duration::from_secs(10), "the snapshot", || {
        let r = s.get(path);
        (r.status == 200 && r.json()["Leaf"].is_object()).then_some(r)
    });
    let snap = first.json();
    let roots = s.get_json("/v1/connect/ca/roots");
    assert_eq!(snap["Roots"]["ActiveRootID"], roots["ActiveRootID"]);
    assert_eq!(snap["Leaf"]["Service"], "db");
    assert_eq!(
        snap["Leaf"]["ServiceURI"],
        format!(
            "spiffe://{}/ns/default/dc/dc1/svc/db",
            roots["TrustDomain"].as_str().unwrap()
        )
    );
    assert_eq!(snap["Intentions"], json!([]));
    assert_eq!(snap["IntentionsDefaultAllow"], true);

    // A blocking read wakes with the deny intention.
    let addr = s.http_addr;
    let index = first.index();
    let parked = s.parked();
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let r = common::request(addr, "GET", &format!("{path}&index={index}&wait=20s"), None);
        (r, started.elapsed())
    });
    s.wait_parked(parked + 1);
    let r = s.put(
        "/v1/connect/intentions/exact?source=web&destination=db",
        r#"{"Action":"deny"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (r, took) = waiter.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        took < Duration::from_secs(5),
        "woken by the write: {took:?}"
    );
    let snap = r.json();
    assert_eq!(snap["Intentions"][0]["SourceName"], "web");
    assert_eq!(snap["Intentions"][0]["DestinationName"], "db");
    assert_eq!(snap["Intentions"][0]["Action"], "deny");

    // A rotation gives the proxy a leaf of the new root.
    let old_serial = snap["Leaf"]["SerialNumber"].clone();
    let r = s.put(
        "/v1/connect/ca/configuration",
        r#"{"Provider":"consul","Config":{"PrivateKeyBits":384}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let active = s.get_json("/v1/connect/ca/roots")["ActiveRootID"].clone();
    common::eventually(Duration::from_secs(10), "a leaf of the new root", || {
        let snap = s.get_json(path);
        (snap["Roots"]["ActiveRootID"] == active && snap["Leaf"]["SerialNumber"] != old_serial)
            .then_some(())
    });
}

/// The legacy API by ID, as Terraform's `consul_intention` uses it: the ID
/// a create answered reads, updates (moving to another destination too)
/// and deletes the intention, and stays the same across a restart; an ID
/// no intention has is a 404; under default deny anonymous is refused and
/// a token reading only another destination too.
#[test]
fn intentions_are_read_updated_and_deleted_by_the_id_a_create_gave() {
    use common::acl::{ROOT, token_with_rules, with};
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::durable("s1", dir.path()).acl("deny", ROOT).start();
    let call = |s: &Server, method: &str, path: &str, body: Option<&str>| {
        with(s.http_addr, method, path, body, ROOT)
    };
    let r = call(
        &s,
        "POST",
        "/v1/connect/intentions",
        Some(r#"{"SourceName":"web","DestinationName":"db","Action":"allow"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["ID"].as_str().unwrap().to_string();
    let path = format!("/v1/connect/intentions/{id}");
    let one = call(&s, "GET", &path, None);
    assert_eq!(one.status, 200, "{}", one.body);
    assert_eq!(
        (
            one.json()["SourceName"].clone(),
            one.json()["Action"].clone()
        ),
        (json!("web"), json!("allow"))
    );

    // Update in place: the action changes, the ID stays.
    let r = call(
        &s,
        "PUT",
        &path,
        Some(r#"{"SourceName":"web","DestinationName":"db","Action":"deny"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let exact = call(
        &s,
        "GET",
        "/v1/connect/intentions/exact?source=web&destination=db",
        None,
    )
    .json();
    assert_eq!(
        (exact["ID"].as_str(), exact["Action"].as_str()),
        (Some(id.as_str()), Some("deny"))
    );

    // Across a restart the ID still finds it.
    s.restart();
    s.wait_for_leader(Duration::from_secs(30));
    assert_eq!(call(&s, "GET", &path, None).json()["Action"], "deny");

    // Permissions: anonymous, and a token reading another destination.
    assert_eq!(s.get(&path).status, 403);
    let (_, other) = token_with_rules(
        s.http_addr,
        "reads-api",
        r#"service "api" { policy = "read" intentions = "read" }"#,
    );
    assert_eq!(with(s.http_addr, "GET", &path, None, &other).status, 403);
    let r = with(
        s.http_addr,
        "PUT",
        &path,
        Some(r#"{"SourceName":"web","DestinationName":"api","Action":"allow"}"#),
        &other,
    );
    assert_eq!(r.status, 403, "{}", r.body);

    // Moved to another destination: the old pair is gone, the ID follows.
    let r = call(
        &s,
        "PUT",
        &path,
        Some(r#"{"SourceName":"web","DestinationName":"api","Action":"allow"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        call(&s, "GET", &path, None).json()["DestinationName"],
        "api"
    );
    assert_eq!(
        call(
            &s,
            "GET",
            "/v1/connect/intentions/exact?source=web&destination=db",
            None
        )
        .status,
        404
    );

    let r = call(&s, "DELETE", &path, None);
    assert_eq!((r.status, r.body.trim()), (200, "true"));
    assert_eq!(call(&s, "GET", &path, None).status, 404);
    assert_eq!(call(&s, "DELETE", &path, None).status, 404);
    let r = call(
        &s,
        "PUT",
        &path,
        Some(r#"{"SourceName":"web","DestinationName":"api","Action":"allow"}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        call(&s, "GET", "/v1/connect/intentions", None).json(),
        json!([])
    );
}
