//! `--advertise` / `advertise_addr` (Consul's `-advertise`): the address a
//! node is known by when it differs from the one it binds, as behind NAT or
//! in a container. A server's peers, its member entry and the catalog see
//! the advertised address; a client agent's node is registered at it.

mod common;

use std::time::Duration;

use common::agent::Agent;
use common::{Server, eventually};

fn node_address(s: &Server, node: &str) -> Option<String> {
    let r = s.get(&format!("/v1/catalog/node/{node}"));
    (r.status == 200).then(|| r.json()["Node"]["Address"].as_str().map(String::from))?
}

#[test]
fn a_server_is_known_by_its_advertised_address() {
    let s = Server::builder()
        .dev()
        .node("adv1")
        .arg("--advertise")
        .arg("127.0.0.2")
        .start();
    let port = s.raft_addr.port();
    // The Raft membership names it there (peers dial it there).
    let leader = s.get_json("/v1/status/leader");
    assert_eq!(leader, format!("127.0.0.2:{port}"));
    let peers = s.get_json("/v1/status/peers");
    assert_eq!(peers, serde_json::json!([format!("127.0.0.2:{port}")]));
    let me = s.get_json("/v1/agent/self");
    assert_eq!(me["Member"]["Addr"], "127.0.0.2", "{me}");
    // Its own node in the catalog, as its agent registers it.
    let addr = eventually(Duration::from_secs(10), "the server's node", || {
        node_address(&s, "adv1")
    });
    assert_eq!(addr, "127.0.0.2");
}

#[test]
fn a_client_agent_registers_its_node_at_the_advertised_address_from_its_config() {
    let s = Server::dev();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.hcl"),
        "advertise_addr = \"127.0.0.3\"\n",
    )
    .unwrap();
    let _agent = Agent::builder("adv-agent", &s.url)
        .config_dir(dir.path())
        .start();
    let addr = eventually(Duration::from_secs(10), "the agent's node", || {
        node_address(&s, "adv-agent")
    });
    assert_eq!(addr, "127.0.0.3");
    // A flag that is not an address is refused before anything starts.
    let out = std::process::Command::new(common::bin())
        .args(["server", "--dev", "--advertise", "not-an-ip"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--advertise"));
}
