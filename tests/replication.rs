//! Replication from the primary datacenter, with real processes on
//! loopback: dc1 (the primary) and dc2 (a secondary joined with
//! `--join-wan`), ACLs on (default deny) in both. ACL policies, roles and
//! global tokens, config entries and intentions made in dc1 reach dc2; a
//! token deleted there is refused here; writes of them made in dc2 go to
//! dc1 and come back; a `Local` token stays in dc2; dc2 keeps resolving
//! tokens with dc1 down and resumes when it is back. And a lone datacenter
//! writes no federation state.

mod common;

use std::time::Duration;

use common::acl::{ROOT, acl_started, as_root, token_with_rules, with};
use common::{Server, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The replication token's secret (Consul's permissions for it: ACLs,
/// and reading every service and intention for config entries).
const REPLICATION: &str = "6f1c2a4e-0000-4000-8000-00000000beef";

/// dc2, a secondary of `dc1` (ACLs on, default deny) replicating with
/// the replication token, made in dc1 first.
fn secondary_of(dc1: &Server) -> Server {
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/acl/policy",
        &json!({
            "Name": "replication",
            "Rules": "acl = \"write\"\noperator = \"write\"\n\
                      service_prefix \"\" { policy = \"read\" intentions = \"read\" }",
        }),
    );
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/acl/token",
        &json!({"SecretID": REPLICATION, "Policies": [{"Name": "replication"}]}),
    );
    acl_started(
        Server::builder()
            .node("b0")
            .bootstrap_expect(1)
            .datacenter("dc2")
            .primary("dc1")
            .join_wan(dc1.raft_addr)
            .arg("--acl-replication-token")
            .arg(REPLICATION),
        "deny",
    )
}

/// A metric of `s`, read with the management token.
fn metric(s: &Server, name: &str) -> f64 {
    let r = with(s.http_addr, "GET", common::METRICS, None, ROOT);
    common::metric_in(&r.body, name)
}

fn replication_status(s: &Server) -> Value {
    let r = with(s.http_addr, "GET", "/v1/acl/replication", None, ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The token `secret` may write `key` in `s` (else the status and body).
fn kv_put(s: &Server, key: &str, secret: &str) -> (u16, String) {
    let r = with(
        s.http_addr,
        "PUT",
        &format!("/v1/kv/{key}"),
        Some("v"),
        secret,
    );
    (r.status, r.body)
}

fn wait_kv_put(s: &Server, key: &str, secret: &str, what: &str) {
    eventually(WAIT, what, || {
        (kv_put(s, key, secret).0 == 200).then_some(())
    });
}

#[test]
fn the_primary_replicates_acls_and_config_entries_to_the_secondary() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dc1 = acl_started(
        Server::durable("a0", tmp.path().join("a0")).datacenter("dc1"),
        "deny",
    );
    // The replication token, made in the primary.
    let dc2 = secondary_of(&dc1);

    // Consul's status: running in the secondary, from dc1; off in dc1.
    let status = eventually(WAIT, "ACL replication's first success", || {
        let v = replication_status(&dc2);
        (v["LastSuccess"] != "0001-01-01T00:00:00Z").then_some(v)
    });
    assert_eq!(status["Enabled"], true, "{status}");
    assert_eq!(status["Running"], true, "{status}");
    assert_eq!(status["SourceDatacenter"], "dc1");
    assert_eq!(status["ReplicationType"], "tokens");
    assert!(status["ReplicatedIndex"].as_u64().unwrap() > 0, "{status}");
    assert!(status["ReplicatedTokenIndex"].as_u64().unwrap() > 0);
    let primary = replication_status(&dc1);
    assert_eq!(primary["Enabled"], false, "{primary}");
    assert_eq!(primary["SourceDatacenter"], "");
    // Anonymous may read it too, as in Consul.
    assert_eq!(dc2.get("/v1/acl/replication").status, 200);
    assert!(metric(&dc2, "cairn_replication_acl_index") > 0.0);

    // A policy and token made in dc1 work in dc2, and no further.
    let (accessor, secret) = token_with_rules(
        dc1.http_addr,
        "app",
        r#"key_prefix "app/" { policy = "write" }"#,
    );
    wait_kv_put(&dc2, "app/one", &secret, "dc1's token to work in dc2");
    assert_eq!(kv_put(&dc2, "other", &secret).0, 403);

    // A Local token made in dc2 stays in dc2 (dc1 never hears of it).
    let local = as_root(
        dc2.http_addr,
        "PUT",
        "/v1/acl/token",
        &json!({"Description": "dc2's own", "Local": true, "Policies": [{"Name": "app"}]}),
    )
    .json();
    let (local_accessor, local_secret) = (
        local["AccessorID"].as_str().unwrap().to_string(),
        local["SecretID"].as_str().unwrap().to_string(),
    );
    assert_eq!(local["Local"], true);
    assert_eq!(kv_put(&dc2, "app/local", &local_secret).0, 200);
    let path = format!("/v1/acl/token/{local_accessor}");
    assert_eq!(with(dc1.http_addr, "GET", &path, None, ROOT).status, 403);
    // Updated in dc2 (it is dc2's); it cannot be made global (Consul's
    // rule: replication would delete it).
    let update = json!({"Description": "still dc2's", "Policies": [{"Name": "app"}]});
    let r = with(dc2.http_addr, "PUT", &path, Some(&update.to_string()), ROOT);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Cannot toggle local mode"), "{}", r.body);
    let update =
        json!({"Description": "still dc2's", "Local": true, "Policies": [{"Name": "app"}]});
    let r = as_root(dc2.http_addr, "PUT", &path, &update).json();
    assert_eq!(
        (r["Local"].as_bool(), r["Description"].as_str()),
        (Some(true), Some("still dc2's"))
    );
    assert_eq!(kv_put(&dc1, "app/local", &local_secret).0, 403);

    // A global token created through dc2 is made in dc1 (forwarded), and
    // comes back to dc2 by replication.
    let global = as_root(
        dc2.http_addr,
        "PUT",
        "/v1/acl/token",
        &json!({"Description": "made through dc2", "Policies": [{"Name": "app"}]}),
    )
    .json();
    let global_secret = global["SecretID"].as_str().unwrap().to_string();
    let global_path = format!("/v1/acl/token/{}", global["AccessorID"].as_str().unwrap());
    assert_eq!(
        with(dc1.http_addr, "GET", &global_path, None, ROOT).status,
        200
    );
    assert_eq!(kv_put(&dc1, "app/global", &global_secret).0, 200);
    wait_kv_put(
        &dc2,
        "app/global",
        &global_secret,
        "the forwarded token back in dc2",
    );

    // A token deleted in dc1 is refused in dc2 once replicated; the
    // local token survives that replication.
    let r = with(
        dc1.http_addr,
        "DELETE",
        &format!("/v1/acl/token/{accessor}"),
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(WAIT, "the deleted token refused in dc2", || {
        let (status, body) = kv_put(&dc2, "app/one", &secret);
        (status == 403 && body == "ACL not found").then_some(())
    });
    assert_eq!(kv_put(&dc2, "app/local", &local_secret).0, 200);
    assert_eq!(with(dc2.http_addr, "GET", &path, None, ROOT).status, 200);

    // A config entry and an intention made in dc1 appear in dc2; the
    // legacy intention endpoints there answer from the replicated entry.
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/config",
        &json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
    );
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/connect/intentions/exact?source=web&destination=db",
        &json!({"Action": "deny"}),
    );
    eventually(WAIT, "dc1's config entry and intention in dc2", || {
        let r = with(
            dc2.http_addr,
            "GET",
            "/v1/config/service-defaults/web",
            None,
            ROOT,
        );
        let ixn = with(
            dc2.http_addr,
            "GET",
            "/v1/connect/intentions/exact?source=web&destination=db",
            None,
            ROOT,
        );
        (r.status == 200 && r.json()["Protocol"] == "http" && ixn.status == 200).then_some(())
    });
    let check = with(
        dc2.http_addr,
        "GET",
        "/v1/connect/intentions/check?source=web&destination=db",
        None,
        ROOT,
    );
    assert_eq!(check.json()["Allowed"], false, "{}", check.body);
    assert!(metric(&dc2, "cairn_replication_config_entries_index") > 0.0);

    // A config entry written to dc2 lands in dc1 (forwarded: there at
    // once) and comes back to dc2.
    as_root(
        dc2.http_addr,
        "PUT",
        "/v1/config",
        &json!({"Kind": "service-defaults", "Name": "api", "Protocol": "grpc"}),
    );
    let there = with(
        dc1.http_addr,
        "GET",
        "/v1/config/service-defaults/api",
        None,
        ROOT,
    );
    assert_eq!(there.status, 200, "{}", there.body);
    eventually(WAIT, "dc2's config write back in dc2", || {
        let r = with(
            dc2.http_addr,
            "GET",
            "/v1/config/service-defaults/api",
            None,
            ROOT,
        );
        (r.status == 200).then_some(())
    });
    // Judged by dc1 with the caller's token: anonymous is refused there,
    // and nothing is written.
    let r = dc2.put(
        "/v1/config",
        &json!({"Kind": "service-defaults", "Name": "nope"}).to_string(),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = with(
        dc1.http_addr,
        "GET",
        "/v1/config/service-defaults/nope",
        None,
        ROOT,
    );
    assert_eq!(r.status, 404);

    // What replication reads is not for everyone: anonymous, a token with
    // acl:read only, and a `?dc=` request from dc2 (not a server's pull)
    // are refused; a management token may read it, hashes and no secrets.
    let acl_path = "/v1/internal/replication/acl";
    assert_eq!(dc1.get(acl_path).status, 403);
    let (_, reader) = token_with_rules(dc1.http_addr, "acl-read", r#"acl = "read""#);
    assert_eq!(
        with(dc1.http_addr, "GET", acl_path, None, &reader).status,
        403
    );
    let r = dc2.get(&format!("{acl_path}?dc=dc1"));
    assert_eq!(r.status, 403, "{}", r.body);
    let all = with(dc1.http_addr, "GET", acl_path, None, ROOT);
    assert_eq!(all.status, 200);
    assert!(!all.body.contains(&global_secret) && !all.body.contains(ROOT));

    // dc1 goes away: dc2 keeps resolving replicated tokens (and its own),
    // and says replication fails.
    let before = replication_status(&dc2)["LastSuccess"].clone();
    dc1.stop(Duration::from_secs(10));
    assert_eq!(kv_put(&dc2, "app/global", &global_secret).0, 200);
    assert_eq!(kv_put(&dc2, "app/local", &local_secret).0, 200);
    eventually(WAIT, "the failure in dc2's replication status", || {
        let v = replication_status(&dc2);
        (v["LastErrorMessage"] != "" && v["LastError"] != "0001-01-01T00:00:00Z").then_some(())
    });
    assert_eq!(kv_put(&dc2, "app/global", &global_secret).0, 200);

    // dc1 back: replication resumes (a new token made there works in dc2,
    // LastSuccess moves on).
    dc1.restart();
    dc1.wait_for_leader(WAIT);
    let (_, later) = token_with_rules(
        dc1.http_addr,
        "later",
        r#"key_prefix "later/" { policy = "write" }"#,
    );
    wait_kv_put(&dc2, "later/x", &later, "a token made after dc1's return");
    let after = replication_status(&dc2)["LastSuccess"].clone();
    assert_ne!(before, after);
}

/// A datacenter that knows no other writes no federation state: an idle
/// lone server's Raft log stays still.
#[test]
fn a_lone_datacenter_writes_no_federation_state() {
    let s = Server::dev();
    s.settle();
    // The server's own coordinate, written once by the first batch.
    eventually(WAIT, "the server's coordinate", || {
        let nodes = s.get_json("/v1/coordinate/nodes");
        (nodes.as_array()?.len() == 1).then_some(())
    });
    let states = s.get_json("/v1/internal/federation-states");
    assert_eq!(states, json!([]), "{states}");
    let before = s.metric("cairn_raft_last_log_index");
    // Past the federation round (2 s) and a coordinate batch (5 s).
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(s.metric("cairn_raft_last_log_index"), before);
    assert_eq!(s.get_json("/v1/internal/federation-states"), json!([]));
}

/// A replication token one permission short (`acl = "read"`, not write)
/// gets no ACL object out of the primary, and the secondary says why; its
/// config entry replication, which that token may read, goes on. (The
/// token is given as `acl { tokens { replication } }` in a file.)
#[test]
fn a_replication_token_without_acl_write_replicates_no_acls() {
    let dc1 = acl_started(
        Server::builder()
            .node("a0")
            .bootstrap_expect(1)
            .datacenter("dc1"),
        "deny",
    );
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/acl/policy",
        &json!({
            "Name": "short",
            "Rules": "acl = \"read\"\n\
                      service_prefix \"\" { policy = \"read\" intentions = \"read\" }",
        }),
    );
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/acl/token",
        &json!({"SecretID": REPLICATION, "Policies": [{"Name": "short"}]}),
    );
    let (_, secret) = token_with_rules(
        dc1.http_addr,
        "app",
        r#"key_prefix "app/" { policy = "write" }"#,
    );
    // The token from Consul's configuration key this time.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("acl.hcl");
    std::fs::write(
        &file,
        format!("acl {{\n  tokens {{\n    replication = \"{REPLICATION}\"\n  }}\n}}\n"),
    )
    .unwrap();
    let dc2 = acl_started(
        Server::builder()
            .node("b0")
            .bootstrap_expect(1)
            .datacenter("dc2")
            .primary("dc1")
            .join_wan(dc1.raft_addr)
            .arg("--config-file")
            .arg(file.to_str().unwrap()),
        "deny",
    );
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/config",
        &json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
    );
    eventually(
        WAIT,
        "config entries replicated with the short token",
        || {
            let r = with(
                dc2.http_addr,
                "GET",
                "/v1/config/service-defaults/web",
                None,
                ROOT,
            );
            (r.status == 200).then_some(())
        },
    );
    let status = eventually(WAIT, "the refusal in dc2's ACL replication status", || {
        let v = replication_status(&dc2);
        v["LastErrorMessage"]
            .as_str()?
            .contains("Permission denied")
            .then_some(v)
    });
    assert_eq!(status["LastSuccess"], "0001-01-01T00:00:00Z", "{status}");
    assert_eq!(status["ReplicatedIndex"], 0);
    // dc1's token and policy never reached dc2.
    let (code, body) = kv_put(&dc2, "app/x", &secret);
    assert_eq!((code, body.as_str()), (403, "ACL not found"));
    let r = with(dc2.http_addr, "GET", "/v1/acl/policy/name/app", None, ROOT);
    assert_ne!(r.status, 200, "{}", r.body);

    // A token with acl:write set on dc2's server at run time (Consul's
    // `PUT /v1/agent/token/replication`): replication proceeds.
    let (_, full) = token_with_rules(
        dc1.http_addr,
        "full-replication",
        "acl = \"write\"\nservice_prefix \"\" { policy = \"read\" intentions = \"read\" }",
    );
    // Made in dc1 and not yet known in dc2: set by the management token.
    let body = json!({ "Token": full }).to_string();
    let r = with(
        dc2.http_addr,
        "PUT",
        "/v1/agent/token/replication",
        Some(&body),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    wait_kv_put(
        &dc2,
        "app/x",
        &secret,
        "dc1's token in dc2 with the new replication token",
    );
}

/// A primary of three servers and no replication token (the servers trust
/// each other's pulls over the authenticated transport): whichever of its
/// servers a pull reaches answers it (a follower too, from its own state,
/// never passing it to its leader, where the pull's mark would be lost),
/// so tokens come and go in dc2 with no pull refused.
#[test]
fn any_server_of_the_primary_answers_a_pull_without_a_token() {
    let mut args: Vec<&str> = common::acl::DENY_ARGS.to_vec();
    args.extend(["--datacenter", "dc1"]);
    let dc1 = common::cluster(3, &args);
    let leader = common::agreed_leader(&dc1);
    eventually(WAIT, "the management token in dc1", || {
        let r = with(
            dc1[leader].http_addr,
            "GET",
            "/v1/acl/token/self",
            None,
            ROOT,
        );
        (r.status == 200).then_some(())
    });
    let joins: Vec<String> = dc1.iter().map(|s| s.raft_addr.to_string()).collect();
    let mut b = Server::builder()
        .node("b0")
        .bootstrap_expect(1)
        .datacenter("dc2")
        .primary("dc1");
    for j in &joins {
        b = b.join_wan(j);
    }
    let dc2 = acl_started(b, "deny");
    // Tokens made and deleted in dc1, one after another: each reaches dc2.
    for round in 0..3 {
        let follower = &dc1[(leader + 1 + round) % 3];
        let (accessor, secret) = token_with_rules(
            follower.http_addr,
            &format!("app{round}"),
            r#"key_prefix "app/" { policy = "write" }"#,
        );
        wait_kv_put(&dc2, "app/x", &secret, "dc1's token in dc2");
        let r = with(
            follower.http_addr,
            "DELETE",
            &format!("/v1/acl/token/{accessor}"),
            None,
            ROOT,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        eventually(WAIT, "the deleted token refused in dc2", || {
            (kv_put(&dc2, "app/x", &secret).0 == 403).then_some(())
        });
    }
    let status = replication_status(&dc2);
    let error = status["LastErrorMessage"].as_str().unwrap();
    assert!(!error.contains("answered 403"), "{status}");
}

/// A JWT signed with the Ed25519 key of `seed`, and that key's PEM.
fn ed25519_jwt(seed: u8, claims: &Value) -> (String, String) {
    use base64::Engine;
    let key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap();
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signed = format!(
        "{}.{}",
        url.encode(br#"{"alg":"EdDSA","typ":"JWT"}"#),
        url.encode(claims.to_string())
    );
    use ring::signature::KeyPair;
    let sig = key.sign(signed.as_bytes());
    // SubjectPublicKeyInfo of an Ed25519 key: a fixed prefix, the key.
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(key.public_key().as_ref());
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(spki)
    );
    (format!("{signed}.{}", url.encode(sig.as_ref())), pem)
}

/// Auth methods and binding rules live in the primary: written through
/// dc2 they are made in dc1 and replicate back. A login in dc2 through a
/// global method is made by dc1 (its token global, in both); one through
/// a local method stays in dc2; a logout of the global token through dc2
/// deletes it in dc1; a rule and a method deleted in dc1 leave dc2.
#[test]
fn auth_methods_live_in_the_primary_and_global_logins_are_made_there() {
    let dc1 = acl_started(
        Server::builder()
            .node("a0")
            .bootstrap_expect(1)
            .datacenter("dc1"),
        "deny",
    );
    let dc2 = secondary_of(&dc1);
    eventually(WAIT, "ACL replication's first success", || {
        let v = replication_status(&dc2);
        (v["LastSuccess"] != "0001-01-01T00:00:00Z").then_some(())
    });

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({"iss": "https://issuer.test", "svc": "web", "iat": now, "exp": now + 300});
    let (bearer, pem) = ed25519_jwt(7, &claims);
    // Both methods and their rules written through dc2.
    for (name, locality) in [("fleet", "global"), ("here", "local")] {
        as_root(
            dc2.http_addr,
            "PUT",
            "/v1/acl/auth-method",
            &json!({
                "Name": name, "Type": "jwt", "TokenLocality": locality,
                "Config": {
                    "JWTValidationPubKeys": [pem],
                    "JWTSupportedAlgs": ["EdDSA"],
                    "BoundIssuer": "https://issuer.test",
                    "ClaimMappings": {"svc": "svc"},
                },
            }),
        );
        as_root(
            dc2.http_addr,
            "PUT",
            "/v1/acl/binding-rule",
            &json!({"AuthMethod": name, "BindType": "service", "BindName": "${value.svc}"}),
        );
        let there = with(
            dc1.http_addr,
            "GET",
            &format!("/v1/acl/auth-method/{name}"),
            None,
            ROOT,
        );
        assert_eq!(there.status, 200, "{name} in dc1: {}", there.body);
    }
    eventually(WAIT, "both methods and their rules in dc2", || {
        let methods = with(dc2.http_addr, "GET", "/v1/acl/auth-methods", None, ROOT).json();
        let rules = with(dc2.http_addr, "GET", "/v1/acl/binding-rules", None, ROOT).json();
        (methods.as_array()?.len() == 2 && rules.as_array()?.len() == 2).then_some(())
    });

    let login = |method: &str| {
        let r = request_login(&dc2, method, &bearer);
        assert_eq!(r.status, 200, "login via {method}: {}", r.body);
        r.json()
    };
    // The global login is made by dc1, at once, and is global.
    let global = login("fleet");
    assert_eq!(global["Local"], false, "{global}");
    let gpath = format!("/v1/acl/token/{}", global["AccessorID"].as_str().unwrap());
    let in_dc1 = with(dc1.http_addr, "GET", &gpath, None, ROOT);
    assert_eq!(in_dc1.status, 200, "{}", in_dc1.body);
    assert_eq!(in_dc1.json()["AuthMethod"], "fleet");
    eventually(WAIT, "the global login token in dc2", || {
        (with(dc2.http_addr, "GET", &gpath, None, ROOT).status == 200).then_some(())
    });
    // The local login stays in dc2.
    let local = login("here");
    assert_eq!(local["Local"], true, "{local}");
    let lpath = format!("/v1/acl/token/{}", local["AccessorID"].as_str().unwrap());
    assert_eq!(with(dc2.http_addr, "GET", &lpath, None, ROOT).status, 200);
    assert_eq!(with(dc1.http_addr, "GET", &lpath, None, ROOT).status, 403);

    // A logout of the global token through dc2 deletes it in dc1.
    let secret = global["SecretID"].as_str().unwrap();
    let r = with(dc2.http_addr, "POST", "/v1/acl/logout", None, secret);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(with(dc1.http_addr, "GET", &gpath, None, ROOT).status, 403);
    // The local one logs out in dc2.
    let secret = local["SecretID"].as_str().unwrap();
    let r = with(dc2.http_addr, "POST", "/v1/acl/logout", None, secret);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(with(dc2.http_addr, "GET", &lpath, None, ROOT).status, 403);

    // Deleted in dc1: the global method (and its rule) leaves dc2, whose
    // login through it is then refused.
    let r = with(
        dc1.http_addr,
        "DELETE",
        "/v1/acl/auth-method/fleet",
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(WAIT, "the deleted method gone from dc2", || {
        let rules = with(dc2.http_addr, "GET", "/v1/acl/binding-rules", None, ROOT).json();
        let gone = with(
            dc2.http_addr,
            "GET",
            "/v1/acl/auth-method/fleet",
            None,
            ROOT,
        )
        .status;
        (gone == 404 && rules.as_array()?.len() == 1).then_some(())
    });
    assert_eq!(request_login(&dc2, "fleet", &bearer).status, 403);
}

fn request_login(s: &Server, method: &str, bearer: &str) -> common::Resp {
    let body = json!({"AuthMethod": method, "BearerToken": bearer}).to_string();
    common::request_with(s.http_addr, "POST", "/v1/acl/login", Some(&body), &[])
}
