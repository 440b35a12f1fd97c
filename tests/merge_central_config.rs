//! `?merge-central-config` on the catalog and health reads of a real dev
//! server: merged answers, unmerged without the flag, and blocking reads
//! that wake when an entry feeding the merge changes (and only then).

mod common;

use std::time::{Duration, Instant};

use common::{Server, request};
use serde_json::{Value, json};

fn put_ok(s: &Server, path: &str, body: Value) {
    let r = s.put(path, &body.to_string());
    assert_eq!(r.status, 200, "PUT {path} {body}: {}", r.body);
}

fn seed(s: &Server) {
    put_ok(
        s,
        "/v1/config",
        json!({ "Kind": "proxy-defaults", "Name": "global", "Config": { "foo": "bar" } }),
    );
    put_ok(
        s,
        "/v1/catalog/register",
        json!({ "Node": "n1", "Address": "10.0.0.1",
                "Service": { "Kind": "connect-proxy", "ID": "web-proxy", "Service": "web-proxy",
                             "Port": 21000,
                             "Proxy": { "DestinationServiceName": "web",
                                        "Upstreams": [ { "DestinationName": "db", "LocalBindPort": 9191 } ] } } }),
    );
}

#[test]
fn four_reads_merge_only_when_asked() {
    let s = Server::dev();
    seed(&s);
    for (path, proxy) in [
        ("/v1/health/connect/web", "/0/Service/Proxy"),
        ("/v1/health/service/web-proxy", "/0/Service/Proxy"),
        ("/v1/catalog/connect/web", "/0/ServiceProxy"),
        ("/v1/catalog/service/web-proxy", "/0/ServiceProxy"),
    ] {
        let merged = s.get(&format!("{path}?merge-central-config")).json();
        assert_eq!(
            merged.pointer(&format!("{proxy}/Config")),
            Some(&json!({ "foo": "bar" })),
            "{path}"
        );
        let plain = s.get(path).json();
        assert_eq!(plain.pointer(&format!("{proxy}/Config")), None, "{path}");
    }
}

/// Starts a blocking read at `index`, runs `write`, and returns the answer
/// and how long it took.
fn block_then(
    s: &Server, path: &str, index: u64, write: impl FnOnce(),
) -> (common::Resp, Duration) {
    let addr = s.http_addr;
    let path = format!("{path}&index={index}&wait=2s");
    let started = Instant::now();
    let waiter = std::thread::spawn(move || request(addr, "GET", &path, None));
    s.wait_parked(1);
    write();
    let r = waiter.join().unwrap();
    (r, started.elapsed())
}

#[test]
fn merged_reads_wake_on_the_entries_they_read() {
    let s = Server::dev();
    seed(&s);
    let path = "/v1/health/connect/web?merge-central-config";
    let index = s.get(path).index();

    // The upstream's own service-defaults feeds the merge: wakes, new index.
    let (r, took) = block_then(&s, path, index, || {
        put_ok(
            &s,
            "/v1/config",
            json!({ "Kind": "service-defaults", "Name": "db", "Protocol": "http" }),
        )
    });
    assert!(took < Duration::from_millis(1800), "woke early: {took:?}");
    assert!(r.index() > index);
    let v = r.json();
    assert_eq!(
        v.pointer("/0/Service/Proxy/Upstreams/0/Config/protocol"),
        Some(&json!("http"))
    );

    // An entry the merge does not read: no wake, same index.
    let index = r.index();
    let (r, took) = block_then(&s, path, index, || {
        put_ok(
            &s,
            "/v1/config",
            json!({ "Kind": "service-defaults", "Name": "unrelated", "Protocol": "http" }),
        )
    });
    assert!(
        took >= Duration::from_millis(1900),
        "woke for nothing: {took:?}"
    );
    assert_eq!(r.index(), index);

    // Without the flag, central config is not part of the read at all.
    let plain = "/v1/health/connect/web?stale";
    let index = s.get(plain).index();
    let (r, took) = block_then(&s, plain, index, || {
        put_ok(
            &s,
            "/v1/config",
            json!({ "Kind": "proxy-defaults", "Name": "global", "Config": { "foo": "baz" } }),
        )
    });
    assert!(
        took >= Duration::from_millis(1900),
        "unmerged read woke: {took:?}"
    );
    assert_eq!(r.index(), index);
}
