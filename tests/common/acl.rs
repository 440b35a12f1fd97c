//! What the ACL tests share: the management token, requests that carry a
//! token, tokens made from rules, and servers that deny by default.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use super::{Resp, Server, ServerBuilder, eventually, request_with};

/// The management token (`--acl-initial-management-token`) of every ACL
/// server the tests start.
pub const ROOT: &str = "6f1c2a4e-0000-4000-8000-000000000001";

/// The flags of a default-deny server whose management (and agent) token
/// is `ROOT`, for `cluster(n, &DENY_ARGS)`.
pub const DENY_ARGS: [&str; 7] = [
    "--acl-enabled",
    "--acl-default-policy",
    "deny",
    "--acl-initial-management-token",
    ROOT,
    "--acl-agent-token",
    ROOT,
];

/// A request carrying `token` in `X-Consul-Token`.
pub fn with(addr: SocketAddr, method: &str, path: &str, body: Option<&str>, token: &str) -> Resp {
    request_with(addr, method, path, body, &[("X-Consul-Token", token)])
}

/// A management request (`ROOT`) that must succeed; its answer.
pub fn as_root(addr: SocketAddr, method: &str, path: &str, body: &serde_json::Value) -> Resp {
    let r = with(addr, method, path, Some(&body.to_string()), ROOT);
    assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
    r
}

/// Creates a policy `name` with `rules` and a token holding it; returns
/// (accessor, secret).
pub fn token_with_rules(addr: SocketAddr, name: &str, rules: &str) -> (String, String) {
    as_root(
        addr,
        "PUT",
        "/v1/acl/policy",
        &json!({ "Name": name, "Rules": rules }),
    );
    let body = json!({ "Description": name, "Policies": [{ "Name": name }] });
    let t = as_root(addr, "PUT", "/v1/acl/token", &body).json();
    (
        t["AccessorID"].as_str().unwrap().to_string(),
        t["SecretID"].as_str().unwrap().to_string(),
    )
}

/// Starts `b` with ACLs on (`default` policy, `ROOT` the management token)
/// and returns once the leader's ACL init has written `ROOT`.
pub fn acl_started(b: ServerBuilder, default: &str) -> Server {
    let s = b.acl(default, ROOT).start();
    eventually(Duration::from_secs(10), "the management token", || {
        (with(s.http_addr, "GET", "/v1/acl/token/self", None, ROOT).status == 200).then_some(())
    });
    s
}

/// A dev server that denies what no token grants, `ROOT` its management
/// token, ready once this returns.
pub fn deny_server() -> Server {
    acl_started(Server::builder().dev(), "deny")
}
