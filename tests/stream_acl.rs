//! `GET /v1/internal/stream` with ACLs on (default deny), against a real
//! server: every event, of the snapshot and live, is filtered by the
//! subscriber's token as Consul filters streamed events (KV: `key:read` on
//! the key; health: `service:read` on the service and `node:read` on the
//! node), and a token deleted while subscribed ends the stream.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::Server;
use common::acl::{ROOT, deny_server, token_with_rules, with};
use serde_json::{Value, json};

const ANONYMOUS_ID: &str = "00000000-0000-0000-0000-000000000002";

fn policy(addr: SocketAddr, name: &str, rules: &str) {
    let body = json!({ "Name": name, "Rules": rules }).to_string();
    let r = with(addr, "PUT", "/v1/acl/policy", Some(&body), ROOT);
    assert_eq!(r.status, 200, "policy create: {}", r.body);
}

fn put_kv(addr: SocketAddr, key: &str, value: &str) {
    let r = with(addr, "PUT", &format!("/v1/kv/{key}"), Some(value), ROOT);
    assert_eq!((r.status, r.body.as_str()), (200, "true"), "{key}");
}

fn register(addr: SocketAddr, node: &str, address: &str, port: u16) {
    let body = json!({
        "Node": node,
        "Address": address,
        "Service": { "ID": "db", "Service": "db", "Port": port },
    })
    .to_string();
    let r = with(addr, "PUT", "/v1/catalog/register", Some(&body), ROOT);
    assert_eq!(r.status, 200, "register db on {node}: {}", r.body);
}

/// An open stream: its chunked NDJSON body read line by line.
struct Stream {
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl Stream {
    /// Opens `query` with `token` (none: anonymous): the stream, or the
    /// refusal's (status, body).
    fn open(s: &Server, query: &str, token: Option<&str>) -> Result<Stream, (u16, String)> {
        let mut tcp = TcpStream::connect(s.http_addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let header = token
            .map(|t| format!("X-Consul-Token: {t}\r\n"))
            .unwrap_or_default();
        write!(
            tcp,
            "GET /v1/internal/stream?{query} HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(tcp);
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        let code: u16 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut chunked = false;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            if header == "\r\n" {
                break;
            }
            chunked |= header.to_ascii_lowercase().contains("chunked");
        }
        if code != 200 {
            let mut body = String::new();
            let _ = reader.read_to_string(&mut body);
            return Err((code, body));
        }
        assert!(chunked, "a streamed body");
        Ok(Stream {
            reader,
            pending: Vec::new(),
        })
    }

    /// The next line, or `None` once the stream ended.
    fn next_or_end(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).expect("a JSON line"));
            }
            let mut size = String::new();
            self.reader
                .read_line(&mut size)
                .expect("a chunk within 10s");
            let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
            if n == 0 {
                assert!(self.pending.is_empty(), "half a line before the end");
                return None;
            }
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).unwrap();
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }

    fn next(&mut self) -> Value {
        self.next_or_end().expect("the stream ended")
    }

    /// The snapshot's events (up to `EndOfSnapshot`).
    fn snapshot(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        loop {
            let v = self.next();
            if v["EndOfSnapshot"] == true {
                return events;
            }
            events.push(v);
        }
    }
}

fn keys(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["Key"].as_str().unwrap()).collect()
}

#[test]
fn a_key_token_sees_its_key_and_never_another_key_under_the_same_prefix() {
    let s = deny_server();
    let addr = s.http_addr;
    put_kv(addr, "config/db-password", "hunter2");
    put_kv(addr, "c", "1");
    let (_, secret) = token_with_rules(addr, "c-reader", r#"key "c" { policy = "read" }"#);

    let mut st = Stream::open(&s, "topic=KV&key=c", Some(&secret)).expect("c is readable");
    let snap = st.snapshot();
    assert_eq!(keys(&snap), ["c"], "snapshot: {snap:?}");
    // Live: the password changes first; the next event delivered must be
    // c's (events come in commit order, so the password's would be first).
    put_kv(addr, "config/db-password", "hunter3");
    put_kv(addr, "c", "2");
    let e = st.next();
    assert_eq!(e["Key"], "c", "live: {e}");
    assert_eq!(e["Payload"]["Op"], "Upsert");

    // A subscription to a key it may not read is refused up front.
    let (code, body) = Stream::open(&s, "topic=KV&key=config/", Some(&secret))
        .err()
        .unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.starts_with("Permission denied"), "{body}");
}

#[test]
fn a_service_token_gets_no_instance_on_a_node_it_may_not_read() {
    let s = deny_server();
    let addr = s.http_addr;
    register(addr, "n1", "10.0.0.1", 5432);
    register(addr, "n2", "10.0.0.2", 5432);
    let (_, db_only) = token_with_rules(addr, "db-only", r#"service "db" { policy = "read" }"#);
    let (_, db_n2) = token_with_rules(
        addr,
        "db-n2",
        "service \"db\" { policy = \"read\" }\nnode \"n2\" { policy = \"read\" }",
    );

    // Service read alone: no node may be read, so no instance is sent.
    let mut st = Stream::open(&s, "topic=ServiceHealth&key=db", Some(&db_only)).expect("db");
    let snap = st.snapshot();
    assert!(snap.is_empty(), "instances on unreadable nodes: {snap:?}");

    // With n2 readable: n2's instance, never n1's (nor its address).
    let mut st = Stream::open(&s, "topic=ServiceHealth&key=db", Some(&db_n2)).expect("db");
    let snap = st.snapshot();
    let nodes: Vec<&Value> = snap
        .iter()
        .map(|e| &e["Payload"]["Value"]["Node"]["Node"])
        .collect();
    assert_eq!(nodes, [&json!("n2")], "snapshot: {snap:?}");
    register(addr, "n1", "10.0.0.1", 5433);
    register(addr, "n2", "10.0.0.2", 5433);
    let e = st.next();
    assert_eq!(e["Payload"]["Value"]["Node"]["Node"], "n2", "live: {e}");
    assert_eq!(e["Payload"]["Value"]["Service"]["Port"], 5433, "live: {e}");
    assert!(!e.to_string().contains("10.0.0.1"), "{e}");
}

#[test]
fn a_token_deleted_while_subscribed_ends_the_stream() {
    let s = deny_server();
    let addr = s.http_addr;
    let (accessor, secret) = token_with_rules(
        addr,
        "app-reader",
        r#"key_prefix "app/" { policy = "read" }"#,
    );
    let mut st = Stream::open(&s, "topic=KV&key=app/", Some(&secret)).expect("app/");
    assert!(st.snapshot().is_empty());
    put_kv(addr, "app/1", "v");
    assert_eq!(st.next()["Key"], "app/1");

    let r = with(
        addr,
        "DELETE",
        &format!("/v1/acl/token/{accessor}"),
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    put_kv(addr, "app/2", "v");
    // The stream ends with the reason, and app/2 never arrives.
    let e = st.next();
    assert_eq!(
        e,
        json!({ "Error": "ACL not found" }),
        "after the delete: {e}"
    );
    assert_eq!(st.next_or_end(), None, "the stream ends");
    // And cannot be opened again.
    let (code, body) = Stream::open(&s, "topic=KV&key=app/", Some(&secret))
        .err()
        .unwrap();
    assert_eq!((code, body.as_str()), (403, "ACL not found"));
}

#[test]
fn anonymous_under_default_deny_gets_only_what_it_may_read() {
    let s = deny_server();
    let addr = s.http_addr;
    put_kv(addr, "pub/a", "1");
    put_kv(addr, "pub/secret/x", "hidden");
    // Without a token, nothing: the anonymous token has no policy yet.
    let (code, _) = Stream::open(&s, "topic=KV&key=pub", None).err().unwrap();
    assert_eq!(code, 403);

    policy(
        addr,
        "anonymous-pub",
        "key_prefix \"pub\" { policy = \"read\" }\nkey_prefix \"pub/secret\" { policy = \"deny\" }",
    );
    let body = json!({ "Policies": [{ "Name": "anonymous-pub" }] }).to_string();
    let r = with(
        addr,
        "PUT",
        &format!("/v1/acl/token/{ANONYMOUS_ID}"),
        Some(&body),
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    let mut st = Stream::open(&s, "topic=KV&key=pub", None).expect("pub is readable");
    let snap = st.snapshot();
    assert_eq!(keys(&snap), ["pub/a"], "snapshot: {snap:?}");
    put_kv(addr, "pub/secret/y", "hidden");
    put_kv(addr, "pub/b", "2");
    let e = st.next();
    assert_eq!(e["Key"], "pub/b", "live: {e}");
    assert!(!e.to_string().contains("hidden"), "{e}");

    // Still nothing else: the whole KV, health, an unknown token.
    assert_eq!(Stream::open(&s, "topic=KV", None).err().unwrap().0, 403);
    let health = Stream::open(&s, "topic=ServiceHealth&key=db", None);
    assert_eq!(health.err().unwrap().0, 403);
    let unknown = Stream::open(&s, "topic=CARoots", Some("no-such-secret"));
    assert_eq!(unknown.err().unwrap(), (403, "ACL not found".to_string()));
    // The CA roots are any valid token's to read (Consul).
    let mut roots = Stream::open(&s, "topic=CARoots", None).expect("CA roots");
    roots.snapshot();
}
