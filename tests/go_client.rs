//! Every request HashiCorp's official Go API client can make (its `api/`
//! package, listed in `fixtures/go-client-requests.tsv` with the function
//! and file each came from) reaches one of cairn's endpoints on a running
//! server: not the router's "no such path" (`cairn_http_unrouted_total`)
//! and not a 405 for a method the endpoint lacks. Enterprise-only requests
//! and those Consul no longer serves answer 404, as Consul CE answers
//! them. Peering's requests are issue 53's and only counted here.
//!
//! The requests go out anonymous to a default-deny server, so each reaches
//! its handler and is refused there (or answered filtered): nothing the
//! sweep sends changes the server, `PUT /v1/agent/leave` included.

mod common;

use common::acl::{ROOT, deny_server, with};
use common::{METRICS, metric_in};

const LIST: &str = include_str!("fixtures/go-client-requests.tsv");

/// One row of the list.
struct Row<'a> {
    method: &'a str,
    path: &'a str,
    func: &'a str,
    file: &'a str,
    edition: &'a str,
}

fn rows() -> Vec<Row<'static>> {
    LIST.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 5, "a row is METHOD PATH FUNC FILE EDITION: {l:?}");
            Row {
                method: f[0],
                path: f[1],
                func: f[2],
                file: f[3],
                edition: f[4],
            }
        })
        .collect()
}

/// The row's path with each `{placeholder}` given a value.
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').expect("a closed placeholder") + open;
        let name = &rest[open + 1..close];
        out.push_str(match name {
            "key" | "prefix" => "compat/key",
            "address" => "127.0.0.1:1",
            _ => "compat-1",
        });
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

fn unrouted(addr: std::net::SocketAddr) -> f64 {
    let r = with(addr, "GET", METRICS, None, ROOT);
    assert_eq!(r.status, 200, "{}", r.body);
    metric_in(&r.body, "cairn_http_unrouted_total")
}

#[test]
fn every_request_of_the_official_go_client_reaches_an_endpoint() {
    let rows = rows();
    let ce = rows.iter().filter(|r| r.edition == "ce").count();
    // The list is the whole client, not a sample: an emptied or cut file
    // must fail here.
    assert!(ce >= 140, "only {ce} CE requests in the list");
    let s = deny_server();
    let mut wrong = Vec::new();
    let (mut checked, mut skipped) = (0, 0);
    // PUT /v1/agent/leave last: were it ever let through, the sweep
    // would not lose the rest.
    let mut order: Vec<&Row> = rows.iter().collect();
    order.sort_by_key(|r| r.path == "/v1/agent/leave");
    for r in order {
        if r.edition == "peering" {
            skipped += 1;
            continue;
        }
        let path = concrete(r.path);
        let before = unrouted(s.http_addr);
        let body = (r.method != "GET" && r.method != "DELETE").then_some("{}");
        let got = with(s.http_addr, r.method, &path, body, "");
        let missed = unrouted(s.http_addr) > before;
        let served = !missed && got.status != 405;
        let ok = match r.edition {
            "ent" | "gone" => got.status == 404,
            _ => served,
        };
        checked += 1;
        if !ok {
            wrong.push(format!(
                "{} {} ({} in {}, {}): {}{} {}",
                r.method,
                r.path,
                r.func,
                r.file,
                r.edition,
                got.status,
                if missed { " no route" } else { "" },
                got.body.lines().next().unwrap_or("")
            ));
        }
    }
    println!("{checked} requests checked, {skipped} of peering not checked (issue 53)");
    assert!(
        wrong.is_empty(),
        "{} of {checked} requests of the Go client do not reach an endpoint as Consul CE answers them:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // The sweep changed nothing: the server is still there and serving.
    assert_eq!(
        with(s.http_addr, "GET", "/v1/status/leader", None, ROOT).status,
        200
    );
}

#[test]
fn a_path_no_endpoint_serves_is_counted_and_answered_as_consul_does() {
    let s = deny_server();
    let before = unrouted(s.http_addr);
    let r = with(s.http_addr, "GET", "/v1/no-such-endpoint", None, ROOT);
    assert_eq!(
        (r.status, r.body.trim()),
        (404, "Invalid URL path: not a recognized HTTP API endpoint")
    );
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(unrouted(s.http_addr), before + 1.0);
    // An endpoint's own 404 is not counted as a missing endpoint.
    let r = with(s.http_addr, "GET", "/v1/kv/absent", None, ROOT);
    assert_eq!(r.status, 404);
    assert_eq!(unrouted(s.http_addr), before + 1.0);
}
