//! The gRPC port and the proxy reads under ACLs, against real servers: an
//! xDS stream ends (PERMISSION_DENIED) once its token is deleted, an
//! unknown proxy is refused as a forbidden one is, idle and anonymous
//! streams hold no slot proxies need, a stream's subscriptions are bounded,
//! `WatchServers` needs a token; `/v1/internal/proxycfg` is checked always
//! and again while it blocks; and every read that holds its request open
//! takes a place among `--http-max-blocking-queries`; the gRPC port's
//! connections are capped, and the streams of one.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::acl::{ROOT, acl_started, as_root, token_with_rules, with};
use common::{Server, ads, connect_from, eventually};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::{Code, Status, Streaming};

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const PROXY: &str = "web-sidecar-proxy";

/// ACLs on, default deny, `ROOT` the management token; `extra` flags.
fn acl_server(extra: &[&str]) -> Server {
    let b = extra.iter().fold(Server::builder().dev(), |b, a| b.arg(a));
    acl_started(b, "deny")
}

/// Registers web's sidecar on node n1 (the management token).
fn register_sidecar(s: &Server) {
    let body = json!({
        "Node": "n1", "Address": "10.0.0.1",
        "Service": {
            "Kind": "connect-proxy", "ID": PROXY, "Service": PROXY, "Port": 21000,
            "Proxy": { "DestinationServiceName": "web", "DestinationServiceID": "web",
                       "LocalServiceAddress": "127.0.0.1", "LocalServicePort": 8080 }
        }
    })
    .to_string();
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/catalog/register",
        Some(&body),
        ROOT,
    );
    assert_eq!(r.status, 200, "register: {}", r.body);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One Delta ADS stream: the requests it sends, the responses it gets.
struct Stream {
    requests: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
}

impl Stream {
    /// Opens a stream (its token in `x-consul-token`), sending nothing.
    async fn open(addr: SocketAddr, token: Option<&str>) -> Result<Stream, Status> {
        let d = ads::open(addr, token, Vec::new()).await?;
        Ok(Stream {
            requests: d.requests,
            responses: d.responses,
        })
    }

    /// Opens a stream and sends the first request of proxy `id` on n1:
    /// the clusters, or the endpoints `names`.
    async fn proxy(
        addr: SocketAddr, token: Option<&str>, id: &str, names: Vec<String>,
    ) -> Result<Stream, Status> {
        let s = Stream::open(addr, token).await?;
        let type_url = if names.is_empty() { CDS } else { EDS };
        s.requests
            .send(ads::first(&ads::envoy_node(id, "n1"), type_url, names))
            .unwrap();
        Ok(s)
    }

    /// The next message within `within` (`None`: nothing came).
    async fn next(
        &mut self, within: Duration,
    ) -> Option<Result<Option<DeltaDiscoveryResponse>, Status>> {
        tokio::time::timeout(within, self.responses.message())
            .await
            .ok()
    }

    /// The web sidecar's stream with `secret`, once its clusters came.
    async fn serving(addr: SocketAddr, secret: &str) -> Stream {
        let mut stream = Stream::proxy(addr, Some(secret), PROXY, vec![])
            .await
            .expect("open");
        match stream.next(Duration::from_secs(10)).await {
            Some(Ok(Some(r))) => assert_eq!(r.type_url, CDS),
            other => panic!("the clusters never came: {other:?}"),
        }
        stream
    }

    /// How the stream ends within `within`: its status (`Ok` for a
    /// response, a clean end, or nothing at all).
    async fn refusal(&mut self, within: Duration) -> Result<(), Status> {
        match self.next(within).await {
            Some(Err(status)) => Err(status),
            _ => Ok(()),
        }
    }
}

/// The status a stream opened as `id` with `token` ends with (or `Ok`).
async fn outcome(addr: SocketAddr, token: Option<&str>, id: &str) -> Result<(), Status> {
    let mut s = Stream::proxy(addr, token, id, vec![]).await?;
    s.refusal(Duration::from_secs(10)).await
}

#[test]
fn a_deleted_token_ends_its_xds_stream_with_permission_denied() {
    let s = acl_server(&[]);
    register_sidecar(&s);
    let (accessor, secret) = token_with_rules(
        s.http_addr,
        "web-write",
        r#"service "web" { policy = "write" }"#,
    );
    runtime().block_on(async {
        let mut stream = Stream::serving(s.grpc_addr, &secret).await;
        let r = with(
            s.http_addr,
            "DELETE",
            &format!("/v1/acl/token/{accessor}"),
            None,
            ROOT,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let status = stream
            .refusal(Duration::from_secs(5))
            .await
            .expect_err("the stream outlived its token");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    });
}

#[test]
fn an_expired_token_ends_its_xds_stream_with_permission_denied() {
    let s = acl_server(&[]);
    register_sidecar(&s);
    let rules = r#"service "web" { policy = "write" }"#;
    as_root(
        s.http_addr,
        "PUT",
        "/v1/acl/policy",
        &json!({ "Name": "web-write", "Rules": rules }),
    );
    let body = json!({ "Policies": [{ "Name": "web-write" }], "ExpirationTTL": "3s" });
    let r = as_root(s.http_addr, "PUT", "/v1/acl/token", &body);
    let secret = r.json()["SecretID"].as_str().unwrap().to_string();
    runtime().block_on(async {
        let mut stream = Stream::serving(s.grpc_addr, &secret).await;
        // No ACL write happens: the expiry alone must end it.
        let status = stream
            .refusal(Duration::from_secs(8))
            .await
            .expect_err("the stream outlived its token's expiry");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    });
}

#[test]
fn an_unknown_proxy_and_a_forbidden_one_get_the_same_status() {
    let s = acl_server(&[]);
    register_sidecar(&s);
    let (_, other) = token_with_rules(
        s.http_addr,
        "other-write",
        r#"service "other" { policy = "write" }"#,
    );
    runtime().block_on(async {
        let forbidden = outcome(s.grpc_addr, Some(&other), PROXY)
            .await
            .expect_err("a forbidden proxy's config was served");
        let unknown = outcome(s.grpc_addr, Some(&other), "ghost-sidecar-proxy")
            .await
            .expect_err("an unknown proxy was served");
        assert_eq!(forbidden.code(), Code::PermissionDenied, "{forbidden:?}");
        assert_eq!(unknown.code(), Code::PermissionDenied, "{unknown:?}");
        // A secret that names no token is refused as the stream opens.
        let bogus = outcome(
            s.grpc_addr,
            Some("00000000-dead-4000-8000-000000000000"),
            PROXY,
        )
        .await
        .expect_err("an unknown secret was served");
        assert_eq!(bogus.code(), Code::PermissionDenied, "{bogus:?}");
        // The management token may hear that a proxy does not exist.
        let root = outcome(s.grpc_addr, Some(ROOT), "ghost-sidecar-proxy")
            .await
            .expect_err("an unknown proxy was served");
        assert_eq!(root.code(), Code::NotFound, "{root:?}");
    });
}

#[test]
fn a_stream_with_no_first_request_is_closed_after_the_bound() {
    let s = Server::builder()
        .dev()
        .arg("--xds-first-request-timeout")
        .arg("1s")
        .start();
    runtime().block_on(async {
        let started = Instant::now();
        let mut idle = Stream::open(s.grpc_addr, None).await.expect("open");
        let status = idle
            .refusal(Duration::from_secs(8))
            .await
            .expect_err("an idle stream was kept open");
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn anonymous_streams_cannot_take_the_slots_of_streams_with_a_token() {
    let s = acl_server(&[
        "--grpc-max-streams",
        "2",
        "--xds-max-anonymous-streams",
        "2",
    ]);
    register_sidecar(&s);
    let (_, secret) = token_with_rules(
        s.http_addr,
        "web-write",
        r#"service "web" { policy = "write" }"#,
    );
    runtime().block_on(async {
        // Two anonymous streams that say nothing hold the anonymous slots.
        let _a = Stream::open(s.grpc_addr, None).await.expect("first");
        let _b = Stream::open(s.grpc_addr, None).await.expect("second");
        let third = match Stream::open(s.grpc_addr, None).await {
            Ok(mut st) => st.refusal(Duration::from_secs(2)).await,
            Err(status) => Err(status),
        }
        .expect_err("a third anonymous stream was admitted");
        assert_eq!(third.code(), Code::ResourceExhausted, "{third:?}");
        // A proxy with its token still gets its config.
        let mut proxy = Stream::proxy(s.grpc_addr, Some(&secret), PROXY, vec![])
            .await
            .expect("the proxy's stream");
        match proxy.next(Duration::from_secs(10)).await {
            Some(Ok(Some(r))) => assert_eq!(r.type_url, CDS),
            other => panic!("the proxy got no config: {other:?}"),
        }
    });
}

#[test]
fn a_stream_subscribing_too_many_names_ends() {
    let s = Server::dev();
    let body = json!({
        "Node": "n1", "Address": "10.0.0.1",
        "Service": {
            "Kind": "connect-proxy", "ID": PROXY, "Service": PROXY, "Port": 21000,
            "Proxy": { "DestinationServiceName": "web", "LocalServicePort": 8080 }
        }
    })
    .to_string();
    assert_eq!(s.put("/v1/catalog/register", &body).status, 200);
    runtime().block_on(async {
        let names: Vec<String> = (0..10_001).map(|i| format!("c{i}")).collect();
        let mut st = Stream::proxy(s.grpc_addr, None, PROXY, names)
            .await
            .expect("open");
        let status = st
            .refusal(Duration::from_secs(10))
            .await
            .expect_err("10,001 names were taken");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    });
}

/// The first answer of `WatchServers` with `token`.
async fn watch_servers(
    addr: SocketAddr, token: Option<&str>,
) -> Result<cairn::grpc::WatchServersResponse, Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(cairn::grpc::WatchServersRequest { wan: false });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("x-consul-token", t.parse().unwrap());
    }
    let path = axum::http::uri::PathAndQuery::from_static(
        "/hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers",
    );
    let mut stream = grpc
        .server_streaming(req, path, tonic_prost::ProstCodec::default())
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no answer"))??;
    first.ok_or_else(|| Status::unknown("the stream ended with no answer"))
}

#[test]
fn watch_servers_needs_a_valid_token_under_acls() {
    let s = acl_server(&[]);
    let (_, secret) = token_with_rules(s.http_addr, "nothing", r#"key "x" { policy = "read" }"#);
    runtime().block_on(async {
        let none = watch_servers(s.grpc_addr, None)
            .await
            .expect_err("served without a token");
        assert_eq!(none.code(), Code::PermissionDenied, "{none:?}");
        let bogus = watch_servers(s.grpc_addr, Some("00000000-dead-4000-8000-000000000000"))
            .await
            .expect_err("served with an unknown secret");
        assert_eq!(bogus.code(), Code::Unauthenticated, "{bogus:?}");
        // Any valid token will do, as in Consul.
        let ok = watch_servers(s.grpc_addr, Some(&secret))
            .await
            .expect("a valid token");
        assert_eq!(ok.servers.len(), 1);
    });
}

#[test]
fn proxycfg_refuses_an_unknown_proxy_as_a_forbidden_one() {
    let s = acl_server(&[]);
    let (_, other) = token_with_rules(
        s.http_addr,
        "other-write",
        r#"service "other" { policy = "write" }"#,
    );
    let path = format!("/v1/internal/proxycfg/{PROXY}?node=n1");
    let unknown = with(s.http_addr, "GET", &path, None, &other);
    register_sidecar(&s);
    let forbidden = with(s.http_addr, "GET", &path, None, &other);
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    assert_eq!(unknown.status, 403, "{}", unknown.body);
    assert_eq!(unknown.body, forbidden.body);
}

/// Blocking reads parked on `s` (its metrics need a token under ACLs).
fn parked_of(s: &Server) -> u64 {
    let r = with(s.http_addr, "GET", common::METRICS, None, ROOT);
    common::metric_in(&r.body, "cairn_blocking_queries_parked") as u64
}

#[test]
fn a_blocking_proxycfg_read_ends_with_403_once_its_token_is_deleted() {
    let s = acl_server(&[]);
    register_sidecar(&s);
    let (accessor, secret) = token_with_rules(
        s.http_addr,
        "web-write",
        r#"service_prefix "web" { policy = "write" }"#,
    );
    let path = format!("/v1/internal/proxycfg/{PROXY}?node=n1");
    let first = eventually(Duration::from_secs(10), "the snapshot", || {
        let r = with(s.http_addr, "GET", &path, None, &secret);
        (r.status == 200).then_some(r)
    });
    let parked = parked_of(&s);
    let addr = s.http_addr;
    let blocked = std::thread::spawn(move || {
        let path = format!("{path}&index={}&wait=20s", first.index());
        let started = Instant::now();
        (with(addr, "GET", &path, None, &secret), started.elapsed())
    });
    eventually(Duration::from_secs(10), "the read parked", || {
        (parked_of(&s) > parked).then_some(())
    });
    let r = with(
        s.http_addr,
        "DELETE",
        &format!("/v1/acl/token/{accessor}"),
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (r, took) = blocked.join().unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
}

/// The status line's code of `GET path`, without reading the body (an
/// event stream's never ends).
fn status_of(addr: SocketAddr, path: &str) -> u16 {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        if c.read(&mut byte).unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line:?}"))
}

#[test]
fn reads_that_hold_their_request_take_a_blocking_query_place() {
    let s = Server::builder()
        .dev()
        .arg("--http-max-blocking-queries")
        .arg("1")
        .start();
    let body = json!({
        "Node": "n1", "Address": "10.0.0.1",
        "Service": {
            "Kind": "connect-proxy", "ID": PROXY, "Service": PROXY, "Port": 21000,
            "Proxy": { "DestinationServiceName": "web", "LocalServiceAddress": "127.0.0.1",
                       "LocalServicePort": 8080 }
        }
    })
    .to_string();
    assert_eq!(s.put("/v1/catalog/register", &body).status, 200);
    let r = s.put(
        "/v1/agent/service/register",
        &json!({ "Name": "api", "ID": "api1", "Port": 80 }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let proxycfg = format!("/v1/internal/proxycfg/{PROXY}?node=n1");
    let snap = eventually(Duration::from_secs(10), "the snapshot", || {
        let r = s.get(&proxycfg);
        (r.status == 200).then_some(r)
    });
    let leaf = eventually(Duration::from_secs(20), "a leaf", || {
        let r = s.get("/v1/agent/connect/ca/leaf/web");
        (r.status == 200).then_some(r)
    });
    let hash = s.get_json("/v1/agent/service/api1")["ContentHash"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s.put("/v1/kv/hold", "x").status, 200);
    let kv = s.get("/v1/kv/hold").index();

    // One blocking query holds the one place.
    let parked = s.parked();
    let addr = s.http_addr;
    let holder = std::thread::spawn(move || {
        common::request(
            addr,
            "GET",
            &format!("/v1/kv/hold?index={kv}&wait=30s"),
            None,
        )
    });
    s.wait_parked(parked + 1);
    for path in [
        format!("{proxycfg}&index={}&wait=1s", snap.index()),
        format!(
            "/v1/agent/connect/ca/leaf/web?index={}&wait=1s",
            leaf.index()
        ),
        "/v1/internal/stream?topic=ServiceHealth&key=web".to_string(),
        format!("/v1/agent/service/api1?hash={hash}&wait=1s"),
    ] {
        assert_eq!(status_of(s.http_addr, &path), 429, "GET {path}");
    }
    assert_eq!(s.put("/v1/kv/hold", "y").status, 200);
    assert_eq!(holder.join().unwrap().status, 200);
    // With the place free they are served again.
    assert_eq!(
        status_of(
            s.http_addr,
            &format!("{proxycfg}&index={}&wait=1s", snap.index())
        ),
        200
    );
}

/// The server's first SETTINGS frame on a fresh HTTP/2 connection, as
/// (identifier, value) pairs; None when the server closed it instead.
fn h2_settings(addr: SocketAddr) -> Option<Vec<(u16, u32)>> {
    h2_settings_on(TcpStream::connect(addr).unwrap())
}

/// The same on a connection already open.
fn h2_settings_on(mut c: TcpStream) -> Option<Vec<(u16, u32)>> {
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The client preface and an empty SETTINGS frame.
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .ok()?;
    let mut head = [0u8; 9];
    c.read_exact(&mut head).ok()?;
    assert_eq!(head[3], 4, "the server's first frame is its SETTINGS");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).unwrap();
    Some(
        body.chunks(6)
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                )
            })
            .collect(),
    )
}

/// Connections past `--grpc-max-conns` are closed at once and counted, a
/// place freed is taken again, and one connection may not open more than
/// 1,024 streams at once (its SETTINGS say so): a client cannot hold every
/// descriptor or every xDS slot by itself.
#[test]
fn the_grpc_port_caps_connections_and_the_streams_of_one() {
    let s = Server::builder()
        .dev()
        .arg("--grpc-max-conns")
        .arg("2")
        .start();
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(s.grpc_addr).unwrap())
        .collect();
    // The held ones are admitted first: wait until the port saw them.
    let mut c = TcpStream::connect(s.grpc_addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    let r = c.read(&mut b);
    let closed = match &r {
        Ok(n) => *n == 0,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    assert!(closed, "a third connection was served: {r:?}");
    eventually(Duration::from_secs(5), "the refusal counted", || {
        (s.metric("cairn_grpc_conns_refused_total") >= 1.0).then_some(())
    });
    drop(held);
    // A freed place is taken again (once the closes reach the server).
    let settings = eventually(
        Duration::from_secs(5),
        "a connection admitted again",
        || h2_settings(s.grpc_addr),
    );
    // SETTINGS_MAX_CONCURRENT_STREAMS (0x3).
    assert!(settings.contains(&(3, 1024)), "{settings:?}");
}

/// One client IP holds at most a quarter of `--grpc-max-conns`: past it
/// its new connections close at once while another IP is still served.
/// On the main before this, one IP could hold every gRPC connection.
#[test]
fn one_client_ip_holds_a_quarter_of_the_grpc_connections() {
    let s = Server::builder()
        .dev()
        .arg("--grpc-max-conns")
        .arg("8")
        .start();
    let held: Vec<TcpStream> = (0..2)
        .map(|_| connect_from([127, 0, 0, 2], s.grpc_addr))
        .collect();
    let refused = s.metric("cairn_grpc_conns_refused_total");
    let third = connect_from([127, 0, 0, 2], s.grpc_addr);
    assert_eq!(
        h2_settings_on(third),
        None,
        "a third connection from one IP was served"
    );
    assert!(s.metric("cairn_grpc_conns_refused_total") >= refused + 1.0);
    let other = connect_from([127, 0, 0, 3], s.grpc_addr);
    assert!(h2_settings_on(other).is_some(), "another IP was refused");
    drop(held);
}
