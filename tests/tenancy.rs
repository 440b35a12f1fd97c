//! Namespaces and admin partitions are Consul Enterprise features: a request
//! naming one is refused with Consul's open-source 400, on servers and on
//! client agents, and changes nothing; the default partition and empty
//! values pass.

mod common;

use common::Server;
use common::agent::Agent;
use common::asynch::*;

const NS: &str = r#"Invalid query parameter: "ns" - Namespaces are a Consul Enterprise feature"#;
const NS_HEADER: &str =
    r#"Invalid header: "X-Consul-Namespace" - Namespaces are a Consul Enterprise feature"#;
const AP: &str =
    r#"Invalid query parameter: "partition" - Partitions are a Consul Enterprise feature"#;
const AP_HEADER: &str =
    r#"Invalid header: "X-Consul-Partition" - Partitions are a Consul Enterprise feature"#;

#[tokio::test]
async fn namespaces_and_partitions_are_refused_on_every_endpoint() {
    let p = Server::dev();
    let c = client();

    let refused = [
        ("GET", "/v1/catalog/services?ns=foo", None, NS),
        ("GET", "/v1/health/service/web?ns=default", None, NS),
        ("GET", "/v1/kv/a?partition=team", None, AP),
        ("PUT", "/v1/kv/a?ns=foo", None, NS),
        (
            "GET",
            "/v1/config/service-defaults",
            Some(("X-Consul-Namespace", "team")),
            NS_HEADER,
        ),
        (
            "PUT",
            "/v1/kv/a",
            Some(("X-Consul-Partition", "team")),
            AP_HEADER,
        ),
        ("GET", "/v1/agent/members?ns=foo", None, NS),
        ("GET", "/v1/discovery-chain/web?partition=x", None, AP),
    ];
    for (method, path, header, reason) in refused {
        let mut req = c.request(method.parse().unwrap(), p.at(path)).body("v");
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(
            (status, body.trim()),
            (400, reason),
            "{method} {path} {header:?}"
        );
    }
    // Nothing was written by the refused PUTs.
    let r = c.get(p.at("/v1/kv/a")).send().await.unwrap();
    assert_eq!(r.status(), 404);

    let accepted = [
        ("/v1/catalog/services?ns=", None),
        ("/v1/catalog/services?partition=default", None),
        (
            "/v1/catalog/services",
            Some(("X-Consul-Partition", "default")),
        ),
        ("/v1/catalog/services", Some(("X-Consul-Namespace", ""))),
    ];
    for (path, header) in accepted {
        let mut req = c.get(p.at(path));
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} {header:?}");
    }
}

#[test]
fn a_client_agent_refuses_them_too() {
    let server = Server::dev();
    let agent = Agent::builder("a1", &server.at("")).start();
    for (path, reason) in [
        ("/v1/agent/services?ns=foo", NS),
        ("/v1/catalog/nodes?partition=team", AP),
    ] {
        let r = agent.get(path);
        assert_eq!((r.status, r.body.trim()), (400, reason), "{path}");
    }
    assert_eq!(agent.get("/v1/agent/services").status, 200);
}
