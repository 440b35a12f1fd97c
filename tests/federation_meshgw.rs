//! Mesh gateways across datacenters with real processes: dc1 (the
//! primary) and dc2 joined with `--join-wan`, a mesh gateway registered in
//! each. A dc1 sidecar whose upstream `api` fails over to dc2 gets, over
//! its own Delta ADS stream, dc2's target reached through dc1's gateway
//! (mode `local`, its LAN address), through dc2's (mode `remote`, its WAN
//! address, read from dc2) or at dc2's instances themselves (mode `none`);
//! dc1's mesh gateway gets a filter chain and a cluster for dc2 with dc2's
//! gateway as its endpoint. And `/v1/internal/mesh-gateways`, what dc1
//! reads of dc2's gateways: filtered by the token as health reads are,
//! blocking on the gateways alone.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::acl::{ROOT, as_root, deny_server, token_with_rules, with};
use common::{Server, ads, eventually};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address, transport_socket};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(30);
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

fn register(s: &Server, body: Value) {
    let r = s.put("/v1/catalog/register", &body.to_string());
    assert_eq!(r.status, 200, "register {body}: {}", r.body);
}

/// An `api` instance and its sidecar on `port` at `addr`, passing.
fn api_instance(s: &Server, node: &str, addr: &str, port: u16) {
    let id = format!("api-{node}");
    register(
        s,
        json!({"Node": node, "Address": addr,
               "Service": {"ID": id, "Service": "api", "Port": 8080}}),
    );
    register(
        s,
        json!({"Node": node, "Address": addr,
               "Service": {"ID": format!("{id}-sidecar-proxy"), "Service": "api-sidecar-proxy",
                           "Kind": "connect-proxy", "Port": port,
                           "Proxy": {"DestinationServiceName": "api", "DestinationServiceID": id,
                                     "LocalServicePort": 8080}}}),
    );
}

/// A mesh gateway on node `node`: LAN `lan:8443`, WAN `wan:443`, its
/// check in `status`.
fn mesh_gateway(s: &Server, node: &str, lan: &str, wan: &str, status: &str) {
    register(
        s,
        json!({"Node": node, "Address": lan,
               "Service": {"ID": "mesh-gateway", "Service": "mesh-gateway", "Kind": "mesh-gateway",
                           "Port": 8443, "Address": lan,
                           "TaggedAddresses": {"lan": {"Address": lan, "Port": 8443},
                                               "wan": {"Address": wan, "Port": 443}}},
               "Check": {"CheckID": "mesh-gateway-alive", "Name": "alive",
                         "ServiceID": "mesh-gateway", "Status": status}}),
    );
}

/// `web`'s sidecar on n9 in dc1, upstream `api` in mesh gateway `mode`.
fn web_proxy(s: &Server, mode: &str) {
    register(
        s,
        json!({"Node": "n9", "Address": "10.1.0.9",
               "Service": {"ID": "web-proxy", "Service": "web-sidecar-proxy",
                           "Kind": "connect-proxy", "Port": 21000,
                           "Proxy": {"DestinationServiceName": "web",
                                     "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9191,
                                                    "MeshGateway": {"Mode": mode}}]}}}),
    );
}

/// One Delta ADS stream as Envoy runs it: every cluster and listener, the
/// endpoints of the EDS clusters; each push ACKed, resources kept by type
/// and name.
struct Proxy {
    requests: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    responses: tonic::Streaming<DeltaDiscoveryResponse>,
    state: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    eds: Vec<String>,
}

impl Proxy {
    async fn open(addr: SocketAddr, id: &str, node: &str) -> Proxy {
        let node = ads::envoy_node(id, node);
        let first = [CDS, LDS].map(|t| ads::first(&node, t, Vec::new()));
        let ads::Delta {
            requests: tx,
            responses,
        } = ads::open(addr, None, first.to_vec())
            .await
            .expect("the stream");
        Proxy {
            requests: tx,
            responses,
            state: BTreeMap::new(),
            eds: Vec::new(),
        }
    }

    /// Takes pushes until `pred` holds of the resources (panics after
    /// `WAIT` with what it has).
    async fn until<T>(&mut self, what: &str, pred: impl Fn(&Proxy) -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(v) = pred(self) {
                return v;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let r = match tokio::time::timeout(left, self.responses.message()).await {
                Ok(Ok(Some(r))) => r,
                Ok(other) => panic!("the stream ended waiting for {what}: {other:?}"),
                Err(_) => panic!(
                    "timed out waiting for {what}; have {:?}",
                    self.state
                        .iter()
                        .map(|(t, m)| (t.rsplit('.').next().unwrap(), m.keys().collect()))
                        .collect::<Vec<(&str, Vec<&String>)>>()
                ),
            };
            let store = self.state.entry(r.type_url.clone()).or_default();
            for res in &r.resources {
                let any = res.resource.as_ref().expect("a resource");
                store.insert(res.name.clone(), any.value.clone());
            }
            for gone in &r.removed_resources {
                store.remove(gone);
            }
            if r.type_url == CDS {
                let mut want: Vec<String> = store
                    .iter()
                    .filter_map(|(name, bytes)| {
                        let c = Cluster::decode(&bytes[..]).unwrap();
                        c.eds_cluster_config.map(|e| {
                            if e.service_name.is_empty() {
                                name.clone()
                            } else {
                                e.service_name
                            }
                        })
                    })
                    .collect();
                want.sort();
                let new: Vec<String> = want
                    .iter()
                    .filter(|w| !self.eds.contains(w))
                    .cloned()
                    .collect();
                let old: Vec<String> = self
                    .eds
                    .iter()
                    .filter(|w| !want.contains(w))
                    .cloned()
                    .collect();
                if !new.is_empty() || !old.is_empty() {
                    self.requests
                        .send(DeltaDiscoveryRequest {
                            type_url: EDS.into(),
                            resource_names_subscribe: new,
                            resource_names_unsubscribe: old,
                            ..Default::default()
                        })
                        .unwrap();
                }
                self.eds = want;
            }
            self.requests
                .send(DeltaDiscoveryRequest {
                    type_url: r.type_url.clone(),
                    response_nonce: r.nonce.clone(),
                    ..Default::default()
                })
                .unwrap();
        }
    }

    fn get<T: Message + Default>(&self, ty: &str, name: &str) -> Option<T> {
        let bytes = self.state.get(ty)?.get(name)?;
        Some(T::decode(&bytes[..]).unwrap())
    }

    /// The cluster whose name starts with `prefix`.
    fn cluster(&self, prefix: &str) -> Option<String> {
        self.state
            .get(CDS)?
            .keys()
            .find(|n| n.starts_with(prefix))
            .cloned()
    }

    /// A load assignment's endpoints as (priority, `address:port`).
    fn endpoints(&self, cluster: &str) -> Option<Vec<(u32, String)>> {
        let cla: ClusterLoadAssignment = self.get(EDS, cluster)?;
        let mut out = Vec::new();
        for tier in &cla.endpoints {
            for e in &tier.lb_endpoints {
                if let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier
                    && let Some(address::Address::SocketAddress(s)) =
                        ep.address.as_ref().and_then(|a| a.address.as_ref())
                    && let Some(socket_address::PortSpecifier::PortValue(p)) = s.port_specifier
                {
                    out.push((tier.priority, format!("{}:{p}", s.address)));
                }
            }
        }
        Some(out)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn pairs(v: &[(u32, &str)]) -> Vec<(u32, String)> {
    v.iter().map(|(p, a)| (*p, a.to_string())).collect()
}

/// dc2's target (and dc1's failover tier) through dc1's gateway in mode
/// `local`, dc2's gateway in mode `remote`, dc2's instances in mode
/// `none`, following the registration as it changes; dc2's gateway going
/// critical there leaves mode `remote` with nothing to dial; dc1's mesh
/// gateway routes `*.dc2.internal.<td>` to dc2's gateway.
#[test]
fn sidecars_and_mesh_gateways_route_another_datacenter_through_gateways() {
    let dc2 = Server::builder()
        .dev()
        .datacenter("dc2")
        .primary("dc1")
        .start();
    let dc1 = Server::builder()
        .dev()
        .datacenter("dc1")
        .join_wan(dc2.raft_addr)
        .start();
    eventually(WAIT, "dc1 to know dc2", || {
        (dc1.get_json("/v1/catalog/datacenters") == json!(["dc1", "dc2"])).then_some(())
    });
    api_instance(&dc1, "n1", "10.1.0.1", 21001);
    api_instance(&dc2, "far1", "10.2.0.1", 22001);
    mesh_gateway(&dc1, "gw1", "10.1.0.100", "192.0.2.1", "passing");
    mesh_gateway(&dc2, "gw2", "10.2.0.100", "198.51.100.2", "passing");
    let r = dc1.put(
        "/v1/config",
        &json!({"Kind": "service-resolver", "Name": "api",
                "Failover": {"*": {"Datacenters": ["dc2"]}}})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let td = dc1.get_json("/v1/connect/ca/roots")["TrustDomain"]
        .as_str()
        .unwrap()
        .to_string();
    let local = format!("api.default.dc1.internal.{td}");
    let far = format!("api.default.dc2.internal.{td}");

    web_proxy(&dc1, "local");
    runtime().block_on(async {
        let mut web = Proxy::open(dc1.grpc_addr, "web-proxy", "n9").await;
        // api's aggregate cluster (its name carries the chain's
        // customization hash: the upstream's mode overrides the chain):
        // dc1's target as tier 0, dc2's as tier 1.
        let tier = |p: &Proxy, i: usize| -> Option<String> {
            let agg = p.cluster("failover-target~0~")?;
            Some(agg.replacen("failover-target~0~", &format!("failover-target~{i}~"), 1))
        };
        let through = |want: &[(u32, &str)]| {
            let want = pairs(want);
            move |p: &Proxy| {
                let far_want: Vec<(u32, String)> =
                    want.iter().map(|(_, a)| (0, a.clone())).collect();
                (p.endpoints(&tier(p, 1)?)? == far_want
                    && p.endpoints(&tier(p, 0)?)? == pairs(&[(0, "10.1.0.1:21001")]))
                .then_some(())
            }
        };
        web.until(
            "dc1's gateway (LAN) for dc2's target",
            through(&[(1, "10.1.0.100:8443")]),
        )
        .await;
        // dc2's target keeps its own SNI: the gateways pass TLS through.
        let c: Cluster = web.get(CDS, &tier(&web, 1).unwrap()).unwrap();
        assert!(c.name.ends_with(&local), "{}", c.name);
        let Some(transport_socket::ConfigType::TypedConfig(tls)) =
            c.transport_socket.and_then(|t| t.config_type)
        else {
            panic!("no upstream TLS")
        };
        assert_eq!(UpstreamTlsContext::decode(&*tls.value).unwrap().sni, far);
        assert!(web.cluster(&far).is_none(), "no cluster of its own");

        web_proxy(&dc1, "remote");
        web.until(
            "dc2's gateway (WAN) for dc2's target",
            through(&[(1, "198.51.100.2:443")]),
        )
        .await;
        // dc2's gateway critical there: mode remote has none to go through.
        mesh_gateway(&dc2, "gw2", "10.2.0.100", "198.51.100.2", "critical");
        web.until("no gateway of dc2's left", |p| {
            p.endpoints(&tier(p, 1)?)?.is_empty().then_some(())
        })
        .await;
        mesh_gateway(&dc2, "gw2", "10.2.0.100", "198.51.100.2", "passing");
        web.until("dc2's gateway back", through(&[(1, "198.51.100.2:443")]))
            .await;

        web_proxy(&dc1, "none");
        web.until(
            "dc2's instances themselves",
            through(&[(1, "10.2.0.1:22001")]),
        )
        .await;

        // dc1's mesh gateway: a chain for dc2's names, to dc2's gateway.
        let mut gw = Proxy::open(dc1.grpc_addr, "mesh-gateway", "gw1").await;
        let dc2_cluster = format!("dc2.internal.{td}");
        gw.until("dc2's gateway behind dc1's", |p| {
            (p.endpoints(&dc2_cluster)? == pairs(&[(0, "198.51.100.2:443")])).then_some(())
        })
        .await;
        let l: Listener = gw
            .until("its listener", |p| p.get(LDS, "default:10.1.0.100:8443"))
            .await;
        let names: Vec<Vec<String>> = l
            .filter_chains
            .iter()
            .map(|fc| {
                fc.filter_chain_match
                    .clone()
                    .unwrap_or_default()
                    .server_names
            })
            .collect();
        assert!(
            names.contains(&vec![format!("*.{dc2_cluster}")]),
            "{names:?}"
        );
        assert!(names.contains(&vec![local.clone()]), "{names:?}");
        assert!(gw.cluster(&dc2_cluster).is_some());
    });
}

/// `/v1/internal/mesh-gateways` under default deny: nothing for an
/// anonymous caller or a token one permission short (the rows hidden, the
/// filtered header set), the gateway for `service:read` with
/// `node:read`; a blocking read is woken by the gateway's health and not
/// by another service's registration.
#[test]
fn mesh_gateways_are_read_as_health_rows_are() {
    let s = deny_server();
    let body = json!({"Node": "gw1", "Address": "10.1.0.100",
                      "Service": {"ID": "mesh-gateway", "Service": "mesh-gateway",
                                  "Kind": "mesh-gateway", "Port": 8443},
                      "Check": {"CheckID": "alive", "Name": "alive",
                                "ServiceID": "mesh-gateway", "Status": "passing"}});
    as_root(s.http_addr, "PUT", "/v1/catalog/register", &body);
    let read = |token: Option<&str>, query: &str| {
        let path = format!("/v1/internal/mesh-gateways{query}");
        match token {
            Some(t) => with(s.http_addr, "GET", &path, None, t),
            None => common::request(s.http_addr, "GET", &path, None),
        }
    };
    let anonymous = read(None, "");
    assert_eq!(anonymous.status, 200, "{}", anonymous.body);
    assert_eq!(anonymous.json(), json!([]));
    assert_eq!(
        anonymous.header("X-Consul-Results-Filtered-By-ACLs"),
        Some("true")
    );
    let (_, short) = token_with_rules(
        s.http_addr,
        "gw-read",
        r#"service "mesh-gateway" { policy = "read" }"#,
    );
    let r = read(Some(&short), "");
    assert_eq!(r.json(), json!([]));
    assert_eq!(r.header("X-Consul-Results-Filtered-By-ACLs"), Some("true"));
    let (_, reader) = token_with_rules(
        s.http_addr,
        "gw-and-node-read",
        r#"service "mesh-gateway" { policy = "read" }
           node "gw1" { policy = "read" }"#,
    );
    let r = read(Some(&reader), "");
    assert_eq!(r.status, 200);
    let rows = r.json();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["Service"]["Kind"], "mesh-gateway");
    assert_eq!(rows[0]["Checks"][0]["Status"], "passing");
    let index = r.index();
    assert!(index > 0);

    // Another service registered: a blocking read sleeps through it.
    let other = json!({"Node": "n1", "Address": "10.1.0.1",
                       "Service": {"ID": "web", "Service": "web", "Port": 80}});
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/catalog/register",
        Some(&other.to_string()),
        ROOT,
    );
    assert_eq!(r.status, 200);
    let started = Instant::now();
    let r = read(Some(&reader), &format!("?index={index}&wait=1s"));
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "woken by another service"
    );
    assert_eq!(r.index(), index);

    // The gateway's check turns critical: the parked read answers at once.
    // Parked queries, read with the management token (the metrics need
    // agent:read under default deny).
    let parked_now = || {
        let r = with(s.http_addr, "GET", common::METRICS, None, ROOT);
        common::metric_in(&r.body, "cairn_blocking_queries_parked") as u64
    };
    let parked = parked_now();
    let addr = s.http_addr;
    let reader2 = reader.clone();
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let r = with(
            addr,
            "GET",
            &format!("/v1/internal/mesh-gateways?index={index}&wait=30s"),
            None,
            &reader2,
        );
        (started.elapsed(), r)
    });
    eventually(Duration::from_secs(10), "the read to park", || {
        (parked_now() > parked).then_some(())
    });
    let mut critical = body.clone();
    critical["Check"]["Status"] = json!("critical");
    let r = with(
        s.http_addr,
        "PUT",
        "/v1/catalog/register",
        Some(&critical.to_string()),
        ROOT,
    );
    assert_eq!(r.status, 200);
    let (took, r) = waiter.join().unwrap();
    assert!(took < Duration::from_secs(10), "not woken: {took:?}");
    assert!(r.index() > index);
    assert_eq!(r.json()[0]["Checks"][0]["Status"], "critical");
}
