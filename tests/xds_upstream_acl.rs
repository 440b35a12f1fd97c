//! A proxy's upstream endpoints as its own token may read them, against a
//! real server with ACLs on (default deny), over a Delta ADS stream as
//! Envoy holds one: a token that may write its own service but not read
//! the upstream's gets the upstream's cluster with no endpoints; a policy
//! granting the read brings them on the live stream, and taking it away
//! removes them, without the stream ending; a `Local` token reads this
//! datacenter's as any token; anonymous is refused as before.
//! A `Local` token gets no endpoints of a failover target in another
//! datacenter (two datacenters), a global one does.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::acl::{ROOT, acl_started, as_root, with};
use common::{Server, ads, eventually};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tonic::{Code, Status, Streaming};

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const PROXY: &str = "web-sidecar-proxy";

fn register(s: &Server, body: Value) {
    as_root(s.http_addr, "PUT", "/v1/catalog/register", &body);
}

/// web's sidecar on n1 with upstream db; db and its sidecar on n2.
fn mesh(s: &Server) {
    register(
        s,
        json!({
            "Node": "n1", "Address": "10.0.0.1",
            "Service": {
                "Kind": "connect-proxy", "ID": PROXY, "Service": PROXY, "Port": 21000,
                "Proxy": { "DestinationServiceName": "web", "DestinationServiceID": "web",
                           "LocalServicePort": 8080,
                           "Upstreams": [{ "DestinationName": "db", "LocalBindPort": 9191 }] }
            }
        }),
    );
    register(
        s,
        json!({
            "Node": "n2", "Address": "10.0.0.2",
            "Service": { "ID": "db", "Service": "db", "Port": 5432 }
        }),
    );
    register(
        s,
        json!({
            "Node": "n2", "Address": "10.0.0.2",
            "Service": {
                "Kind": "connect-proxy", "ID": "db-sidecar-proxy", "Service": "db-sidecar-proxy",
                "Port": 21001,
                "Proxy": { "DestinationServiceName": "db", "DestinationServiceID": "db" }
            }
        }),
    );
}

fn policy(s: &Server, name: &str, rules: &str) {
    as_root(
        s.http_addr,
        "PUT",
        "/v1/acl/policy",
        &json!({ "Name": name, "Rules": rules }),
    );
}

/// A token with `policies` (`local`: `Local: true`); (accessor, secret).
fn token(s: &Server, policies: &[&str], local: bool) -> (String, String) {
    let body = json!({
        "Local": local,
        "Policies": policies.iter().map(|p| json!({ "Name": p })).collect::<Vec<_>>(),
    });
    let t = as_root(s.http_addr, "PUT", "/v1/acl/token", &body).json();
    (
        t["AccessorID"].as_str().unwrap().to_string(),
        t["SecretID"].as_str().unwrap().to_string(),
    )
}

/// Gives token `accessor` exactly `policies`.
fn set_policies(s: &Server, accessor: &str, policies: &[&str]) {
    let body = json!({
        "Policies": policies.iter().map(|p| json!({ "Name": p })).collect::<Vec<_>>(),
    });
    as_root(
        s.http_addr,
        "PUT",
        &format!("/v1/acl/token/{accessor}"),
        &body,
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// web's sidecar's Delta stream, as Envoy holds it: every response
/// ACKed; as the clusters come, db's clusters' endpoints subscribed (its
/// targets in each datacenter).
struct Envoy {
    requests: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
    /// db's clusters, as the clusters came.
    db: Vec<String>,
    /// The latest load assignment of each cluster.
    assignments: BTreeMap<String, ClusterLoadAssignment>,
}

impl Envoy {
    async fn open(addr: SocketAddr, token: Option<&str>) -> Result<Envoy, Status> {
        let first = ads::first(&ads::envoy_node(PROXY, "n1"), CDS, Vec::new());
        let d = ads::open(addr, token, vec![first]).await?;
        Ok(Envoy {
            requests: d.requests,
            responses: d.responses,
            db: Vec::new(),
            assignments: BTreeMap::new(),
        })
    }

    /// Takes in the next response (within `within`), ACKs it and, for the
    /// clusters, subscribes to db's endpoints. `Err`: the stream ended.
    async fn step(&mut self, within: Duration) -> Result<(), Status> {
        let Ok(msg) = tokio::time::timeout(within, self.responses.message()).await else {
            return Ok(()); // nothing came
        };
        let r = msg?.ok_or_else(|| Status::aborted("the server closed the stream"))?;
        let mut ack = DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        };
        let mut new = Vec::new();
        if r.type_url == CDS {
            for res in &r.resources {
                let db = res.name.starts_with("db.") || res.name.starts_with("failover-target~");
                if db && !self.db.contains(&res.name) {
                    self.db.push(res.name.clone());
                    new.push(res.name.clone());
                }
            }
        }
        if r.type_url == EDS {
            for res in &r.resources {
                let any = res.resource.as_ref().expect("a resource");
                let cla = ClusterLoadAssignment::decode(&*any.value).unwrap();
                self.assignments.insert(res.name.clone(), cla);
            }
        }
        self.requests.send(ack.clone()).unwrap();
        if !new.is_empty() {
            ack.type_url = EDS.into();
            ack.response_nonce.clear();
            ack.resource_names_subscribe = new;
            self.requests.send(ack).unwrap();
        }
        Ok(())
    }

    /// The endpoints served for db's target in `dc` (`None`: no assignment
    /// yet): db's cluster's, or with failover (to dc2) its aggregate's
    /// tier for that datacenter.
    fn endpoints_in(&self, dc: &str) -> Option<usize> {
        let tier = format!("failover-target~{}~db.", if dc == "dc1" { 0 } else { 1 });
        let prefix = format!("db.default.{dc}.internal.");
        let name = self
            .db
            .iter()
            .find(|n| n.starts_with(&tier))
            .or_else(|| self.db.iter().find(|n| n.starts_with(&prefix)))?;
        let cla = self.assignments.get(name)?;
        Some(cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum())
    }

    /// db's endpoints in dc1.
    fn db_endpoints(&self) -> Option<usize> {
        self.endpoints_in("dc1")
    }

    /// Steps the stream until db's endpoints number `n`, within 10 s; the
    /// stream must not end meanwhile.
    async fn until_db(&mut self, n: usize, what: &str) {
        self.until(what, |e| e.db_endpoints() == Some(n)).await;
    }

    /// Steps the stream until `done`, within 10 s; the stream must not end
    /// meanwhile.
    async fn until(&mut self, what: &str, done: impl Fn(&Envoy) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: db's endpoints are {:?} in dc1, {:?} in dc2",
                self.db_endpoints(),
                self.endpoints_in("dc2"),
            );
            if let Err(status) = self.step(Duration::from_millis(200)).await {
                panic!("the stream ended waiting for {what}: {status:?}");
            }
        }
    }
}

/// A default-deny server with web's and db's proxies, policies `web-write`
/// (`service:write` on web) and `db-read`.
fn server() -> Server {
    let s = acl_started(Server::builder().dev(), "deny");
    mesh(&s);
    policy(&s, "web-write", r#"service "web" { policy = "write" }"#);
    policy(&s, "db-read", r#"service "db" { policy = "read" }"#);
    // The proxy's snapshot lists db's sidecar (read as management).
    eventually(
        Duration::from_secs(10),
        "db's endpoint in the snapshot",
        || {
            let r = with(
                s.http_addr,
                "GET",
                &format!("/v1/internal/proxycfg/{PROXY}?node=n1"),
                None,
                ROOT,
            );
            (r.status == 200 && r.body.contains("db-sidecar-proxy")).then_some(())
        },
    );
    s
}

/// `/v1/internal/proxycfg` of web's proxy, read with `secret`.
fn debug_snapshot(s: &Server, secret: &str) -> String {
    let r = with(
        s.http_addr,
        "GET",
        &format!("/v1/internal/proxycfg/{PROXY}?node=n1"),
        None,
        secret,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Read on db is what brings db's endpoints to web's proxy, on the live
/// stream both ways: none with `service:write` on web alone (the cluster
/// is there, empty), they arrive when a policy grants `service:read db`,
/// and go when it is taken away, the stream never ending; the debug read
/// of the snapshot (`/v1/internal/proxycfg`) shows the same.
#[test]
fn an_upstreams_endpoints_follow_the_proxys_read_on_it() {
    let s = server();
    let (accessor, secret) = token(&s, &["web-write"], false);
    runtime().block_on(async {
        let mut envoy = Envoy::open(s.grpc_addr, Some(&secret)).await.unwrap();
        envoy.until_db(0, "db's cluster with no endpoints").await;
        // Nothing more comes: the narrowing is stable.
        for _ in 0..5 {
            envoy.step(Duration::from_millis(100)).await.unwrap();
        }
        assert_eq!(envoy.db_endpoints(), Some(0));

        // The debug read of the snapshot shows what the stream serves.
        assert!(!debug_snapshot(&s, &secret).contains("db-sidecar-proxy"));

        set_policies(&s, &accessor, &["web-write", "db-read"]);
        envoy
            .until_db(1, "db's endpoint once read is granted")
            .await;
        assert!(debug_snapshot(&s, &secret).contains("db-sidecar-proxy"));

        set_policies(&s, &accessor, &["web-write"]);
        envoy
            .until_db(0, "db's endpoint gone once read is taken")
            .await;

        // Granted through the policy's own rules, as well.
        let r = with(
            s.http_addr,
            "GET",
            "/v1/acl/policy/name/web-write",
            None,
            ROOT,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let id = r.json()["ID"].as_str().unwrap().to_string();
        let rules =
            "service \"web\" { policy = \"write\" }\nservice_prefix \"d\" { policy = \"read\" }";
        as_root(
            s.http_addr,
            "PUT",
            &format!("/v1/acl/policy/{id}"),
            &json!({ "Name": "web-write", "Rules": rules }),
        );
        envoy
            .until_db(1, "db's endpoint once the policy reads db")
            .await;
    });
}

/// A `Local` token is this datacenter's own: it reads this datacenter's
/// endpoints as any token with its rules does.
#[test]
fn a_local_token_reads_this_datacenters_endpoints_and_anonymous_is_refused() {
    let s = server();
    let (_, local) = token(&s, &["web-write", "db-read"], true);
    runtime().block_on(async {
        let mut envoy = Envoy::open(s.grpc_addr, Some(&local)).await.unwrap();
        envoy.until_db(1, "db's endpoint for a Local token").await;

        // Anonymous (no token): refused as before, nothing served.
        let mut anon = Envoy::open(s.grpc_addr, None).await.unwrap();
        let status = anon
            .step(Duration::from_secs(10))
            .await
            .expect_err("anonymous was not refused");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    });
}

/// dc1 (ACLs on, default deny) fails db over to dc2 (ACLs off: dc1's
/// server reads it with its own token, what it serves is judged in dc1):
/// a `Local` token reading every service gets dc1's db endpoint and dc2's
/// cluster empty (dc2 does not know the token), no dc2 tier either; a
/// global token with the same policies gets dc2's endpoint in both.
#[test]
fn a_local_token_gets_no_endpoints_in_another_datacenter() {
    let dc1 = acl_started(
        Server::builder()
            .node("a0")
            .bootstrap_expect(1)
            .datacenter("dc1"),
        "deny",
    );
    let dc2 = Server::builder()
        .node("b0")
        .bootstrap_expect(1)
        .datacenter("dc2")
        .primary("dc1")
        .join_wan(dc1.raft_addr)
        .start();
    eventually(Duration::from_secs(30), "dc1 to know dc2", || {
        let r = with(dc1.http_addr, "GET", "/v1/catalog/datacenters", None, ROOT);
        (r.status == 200 && r.json() == json!(["dc1", "dc2"])).then_some(())
    });
    mesh(&dc1);
    register(
        &dc2,
        json!({
            "Node": "far", "Address": "10.2.0.2",
            "Service": {
                "Kind": "connect-proxy", "ID": "db-sidecar-proxy", "Service": "db-sidecar-proxy",
                "Port": 22001, "Proxy": { "DestinationServiceName": "db" }
            }
        }),
    );
    as_root(
        dc1.http_addr,
        "PUT",
        "/v1/config",
        &json!({"Kind": "service-resolver", "Name": "db",
                "Failover": {"*": {"Datacenters": ["dc2"]}}}),
    );
    policy(&dc1, "web-write", r#"service "web" { policy = "write" }"#);
    policy(&dc1, "all-read", r#"service_prefix "" { policy = "read" }"#);
    eventually(
        Duration::from_secs(30),
        "dc2's endpoint in the snapshot",
        || {
            let r = with(
                dc1.http_addr,
                "GET",
                &format!("/v1/internal/proxycfg/{PROXY}?node=n1"),
                None,
                ROOT,
            );
            (r.status == 200 && r.body.contains("10.2.0.2")).then_some(())
        },
    );
    let (_, local) = token(&dc1, &["web-write", "all-read"], true);
    let (_, global) = token(&dc1, &["web-write", "all-read"], false);
    runtime().block_on(async {
        let mut envoy = Envoy::open(dc1.grpc_addr, Some(&local)).await.unwrap();
        envoy
            .until("dc1's endpoint alone for the Local token", |e| {
                e.endpoints_in("dc1") == Some(1) && e.endpoints_in("dc2") == Some(0)
            })
            .await;
        let mut envoy = Envoy::open(dc1.grpc_addr, Some(&global)).await.unwrap();
        envoy
            .until("dc2's endpoint for the global token", |e| {
                e.endpoints_in("dc1") == Some(1) && e.endpoints_in("dc2") == Some(1)
            })
            .await;
    });
}
