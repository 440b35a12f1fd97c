//! A secondary's Connect CA from its start, with real processes: dc2 (a
//! secondary) starts before its primary exists and makes no root of its
//! own: its CA endpoints answer "not initialized yet" and no leaf is
//! signed until dc1's roots and an intermediate dc1 signed are held; then
//! every leaf of dc2 verifies (`openssl verify`) against dc1's roots.

mod common;

use std::time::Duration;

use common::pki::{verifies, write};
use common::{Server, eventually};

const WAIT: Duration = Duration::from_secs(40);

/// The PEM blocks of a chain, in order.
fn pem_blocks(pem: &str) -> Vec<String> {
    pem.split_inclusive("-----END CERTIFICATE-----")
        .filter(|b| b.contains("BEGIN CERTIFICATE"))
        .map(|b| format!("{}\n", b.trim_start()))
        .collect()
}

#[test]
fn a_secondary_signs_no_leaf_before_it_holds_the_primarys_roots() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dc2 = Server::builder()
        .node("b0")
        .datacenter("dc2")
        .primary("dc1")
        .start();

    // Alone: a leader, a cluster id, but no CA, so no leaf and no roots.
    let r = dc2.get("/v1/agent/connect/ca/leaf/web");
    assert_eq!(
        r.status, 500,
        "a leaf signed by a dc2-only root: {}",
        r.body
    );
    assert!(r.body.contains("not initialized yet"), "{}", r.body);
    let r = dc2.get("/v1/connect/ca/roots");
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(!dc2.log().contains("CA initialized with a new root"));

    // The primary comes and federates; leaves asked of dc2 meanwhile are
    // refused until it holds dc1's roots, and the first one signed (and
    // every one after) chains to dc1's root.
    let dc1 = Server::builder()
        .node("a0")
        .datacenter("dc1")
        .join_wan(dc2.raft_addr)
        .start();
    let p_roots = dc1.get("/v1/connect/ca/roots?pem=true");
    assert_eq!(p_roots.status, 200, "{}", p_roots.body);
    let p_roots_file = write(dir, "dc1-roots.pem", &p_roots.body);
    let leaf = eventually(WAIT, "a leaf from dc2", || {
        let r = dc2.get("/v1/agent/connect/ca/leaf/web");
        if r.status != 200 {
            assert_eq!(r.status, 500, "{}", r.body);
            assert!(r.body.contains("not initialized yet"), "{}", r.body);
            return None;
        }
        Some(r.json())
    });
    let chain = pem_blocks(leaf["CertPEM"].as_str().unwrap());
    let cert = write(dir, "web.pem", &chain[0]);
    let rest = write(dir, "web-chain.pem", &chain[1..].concat());
    assert!(verifies(&p_roots_file, Some(&rest), &cert), "dc1's roots");

    // dc2's roots are dc1's, and only those.
    let ids = |s: &Server| -> Vec<String> {
        let v = s.get_json("/v1/connect/ca/roots");
        let mut ids: Vec<String> = v["Roots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["ID"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&dc2), ids(&dc1));
    assert!(!dc2.log().contains("CA initialized with a new root"));
}
