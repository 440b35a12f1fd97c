//! `GET /v1/internal/stream` end to end against a real server: a snapshot,
//! `EndOfSnapshot`, then each committed change of the key in order; resuming
//! from an index; starting over after a restart; health and config topics;
//! bad requests.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Server;
use serde_json::{Value, json};

/// An open stream: reads the chunked NDJSON body line by line.
struct Stream {
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl Stream {
    fn open(s: &Server, query: &str) -> Stream {
        let mut tcp = TcpStream::connect(s.http_addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            tcp,
            "GET /v1/internal/stream?{query} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(tcp);
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.contains(" 200 "), "stream {query}: {status}");
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            if header == "\r\n" {
                break;
            }
            if header.to_ascii_lowercase().starts_with("content-type:") {
                assert!(header.contains("application/x-ndjson"), "{header}");
            }
        }
        Stream {
            reader,
            pending: Vec::new(),
        }
    }

    /// The next NDJSON line (chunk boundaries need not be line boundaries).
    fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return serde_json::from_slice(&line).expect("a JSON line");
            }
            let mut size = String::new();
            self.reader
                .read_line(&mut size)
                .expect("a chunk within 10s");
            let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
            assert!(n > 0, "the stream ended");
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).unwrap();
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }

    /// Events up to and including the end of the snapshot; returns the
    /// events and the snapshot's index.
    fn snapshot(&mut self) -> (Vec<Value>, u64) {
        let mut events = Vec::new();
        loop {
            let v = self.next();
            if v["EndOfSnapshot"] == true {
                return (events, v["Index"].as_u64().expect("an index"));
            }
            events.push(v);
        }
    }
}

fn put(s: &Server, key: &str, value: &str) {
    assert_eq!(s.put(&format!("/v1/kv/{key}"), value).status, 200);
}

fn decoded(v: &Value) -> String {
    use base64::Engine;
    let b64 = v["Payload"]["Value"]["Value"].as_str().unwrap_or_default();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn kv_stream_snapshot_then_each_change_in_order_and_resume() {
    let s = Server::dev();
    put(&s, "app/a", "1");
    put(&s, "other/x", "1");

    let mut st = Stream::open(&s, "topic=KV&key=app/");
    let (snap, at) = st.snapshot();
    assert_eq!(snap.len(), 1, "{snap:?}");
    assert_eq!(snap[0]["Key"], "app/a");
    assert_eq!(snap[0]["Payload"]["Op"], "Upsert");
    assert_eq!(decoded(&snap[0]), "1");

    put(&s, "app/b", "2");
    put(&s, "other/y", "ignored");
    put(&s, "app/a", "3");
    assert_eq!(s.delete("/v1/kv/app/b").status, 200);
    let mut last = at;
    let mut seen = Vec::new();
    let mut a_index = 0;
    for _ in 0..3 {
        let e = st.next();
        let index = e["Index"].as_u64().unwrap();
        assert!(index > last, "indexes rise: {index} after {last}");
        last = index;
        let (key, op) = (
            e["Key"].as_str().unwrap(),
            e["Payload"]["Op"].as_str().unwrap(),
        );
        if key == "app/a" {
            a_index = index;
        }
        seen.push((key.to_string(), op.to_string()));
    }
    assert_eq!(
        seen,
        [
            ("app/b".into(), "Upsert".into()),
            ("app/a".into(), "Upsert".into()),
            ("app/b".into(), "Delete".into())
        ]
    );
    // The index an event carries is its commit's: a KV read agrees.
    let read = s.get("/v1/kv/app/a").json();
    assert_eq!(read[0]["ModifyIndex"].as_u64().unwrap(), a_index);
    drop(st);

    // Reconnecting from the last index seen: no snapshot, the next change.
    put(&s, "app/c", "4");
    let mut resumed = Stream::open(&s, &format!("topic=KV&key=app/&index={last}"));
    let e = resumed.next();
    assert_eq!(e["Key"], "app/c", "{e}");
    assert!(e["Index"].as_u64().unwrap() > last);
}

#[test]
fn health_and_config_topics() {
    let s = Server::dev();
    let mut health = Stream::open(&s, "topic=ServiceHealth&key=web");
    let (snap, _) = health.snapshot();
    assert!(snap.is_empty());
    let mut connect = Stream::open(&s, "topic=ServiceHealthConnect&key=web");
    connect.snapshot();
    let mut defaults = Stream::open(&s, "topic=ServiceDefaults&key=web");
    defaults.snapshot();

    let reg = |body: Value| {
        let r = s.put("/v1/catalog/register", &body.to_string());
        assert_eq!(r.status, 200, "{}", r.body);
    };
    reg(json!({"Node": "n1", "Address": "10.0.0.1",
               "Service": {"ID": "web1", "Service": "web", "Port": 80}}));
    let e = health.next();
    assert_eq!(
        (
            &e["Key"],
            &e["Payload"]["Op"],
            &e["Payload"]["Value"]["Service"]["ID"]
        ),
        (&json!("web"), &json!("Register"), &json!("web1"))
    );
    assert_eq!(e["Payload"]["Value"]["Node"]["Node"], "n1");

    // A proxy for web shows on the connect topic under web.
    reg(json!({"Node": "n1", "Address": "10.0.0.1",
               "Service": {"ID": "web1-proxy", "Service": "web-proxy", "Kind": "connect-proxy",
                           "Port": 21000, "Proxy": {"DestinationServiceName": "web"}}}));
    let e = connect.next();
    assert_eq!(e["Payload"]["Value"]["Service"]["ID"], "web1-proxy");

    // A failing node check is a new Register of web1 with the check.
    reg(json!({"Node": "n1", "Address": "10.0.0.1",
               "Check": {"CheckID": "disk", "Name": "disk", "Status": "critical"}}));
    let e = health.next();
    assert_eq!(e["Payload"]["Value"]["Checks"][0]["Status"], "critical");

    let entry = json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"});
    assert_eq!(s.put("/v1/config", &entry.to_string()).status, 200);
    let e = defaults.next();
    assert_eq!(
        (&e["Payload"]["Op"], &e["Payload"]["Value"]["Protocol"]),
        (&json!("Upsert"), &json!("http"))
    );

    let r = s.put(
        "/v1/catalog/deregister",
        &json!({"Node": "n1", "ServiceID": "web1"}).to_string(),
    );
    assert_eq!(r.status, 200);
    let e = health.next();
    assert_eq!(
        (&e["Payload"]["Op"], &e["Payload"]["Value"]["Service"]["ID"]),
        (&json!("Deregister"), &json!("web1"))
    );
}

#[test]
fn a_restarted_server_tells_an_old_subscriber_to_start_over() {
    let dir = tempfile::tempdir().unwrap();
    let builder = Server::durable("s1", dir.path());
    let mut s = builder.clone().start();
    put(&s, "k/1", "a");
    let mut st = Stream::open(&s, "topic=KV&key=k/");
    let (_, at) = st.snapshot();
    drop(st);
    // Committed while the subscriber is away, before the restart.
    put(&s, "k/2", "b");
    s.stop(Duration::from_secs(10));

    // The restarted server's buffers start at the state it loaded: the
    // event of k/2 is not among them, so a subscriber resuming from before
    // it must start over rather than silently miss it.
    let s = builder.start();
    let mut st = Stream::open(&s, &format!("topic=KV&key=k/&index={at}"));
    assert_eq!(st.next(), json!({"NewSnapshotToFollow": true}));
    let (snap, _) = st.snapshot();
    let keys: Vec<&str> = snap.iter().map(|e| e["Key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["k/1", "k/2"]);

    // One resuming from the restarted server's own events resumes.
    let (_, now) = Stream::open(&s, "topic=KV&key=k/").snapshot();
    put(&s, "k/3", "c");
    let mut st = Stream::open(&s, &format!("topic=KV&key=k/&index={now}"));
    assert_eq!(st.next()["Key"], "k/3");
}

#[test]
fn bad_stream_requests_are_400() {
    let s = Server::dev();
    for (q, why) in [
        ("", "Missing topic"),
        ("topic=Nope", "Unknown topic"),
        ("topic=KV&index=abc", "Invalid index"),
    ] {
        let r = s.get(&format!("/v1/internal/stream?{q}"));
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        assert!(r.body.contains(why), "{q}: {}", r.body);
    }
}
