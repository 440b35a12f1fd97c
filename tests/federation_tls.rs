//! WAN federation over the Raft port's mutual TLS, with real processes:
//! each datacenter's servers hold `server.<dc>.consul` certificates of one
//! CA (`cairn tls`, checked with `openssl verify`). A server dialing
//! another datacenter checks that datacenter's name; the port takes a
//! server of any datacenter, but a greeting or request only from a server
//! of the datacenter it claims, and no client certificate at all.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::pki::Pki;
use common::{Server, eventually};

const WAIT: Duration = Duration::from_secs(30);

/// A new certificate of `kind` (`-server`/`-client`) for `dc`, checked by
/// openssl against the CA: its file and key.
fn cert(pki: &Pki, kind: &str, dc: &str) -> (PathBuf, PathBuf) {
    let cert = pki.cert(&[kind, "-dc", dc]);
    assert!(
        common::pki::verifies(&pki.ca().to_string_lossy(), None, &cert.0.to_string_lossy()),
        "openssl does not verify {:?}",
        cert.0
    );
    cert
}

/// A server of `dc` holding `cert`.
fn server(pki: &Pki, node: &str, dc: &str, cert: &(PathBuf, PathBuf)) -> common::ServerBuilder {
    let mut b = Server::builder().node(node).datacenter(dc).primary("dc1");
    for f in pki.flags(cert) {
        b = b.arg(&f);
    }
    b
}

fn datacenters(s: &Server) -> Vec<String> {
    serde_json::from_value(s.get_json("/v1/catalog/datacenters")).unwrap()
}

/// dc1 and dc2, each with its own datacenter's server certificate, find
/// each other through dc2's `--join-wan` and answer `?dc=` for each other.
#[test]
fn two_datacenters_federate_over_mutual_tls() {
    let pki = Pki::new();
    let dc1 = server(&pki, "a0", "dc1", &cert(&pki, "-server", "dc1")).start();
    let dc2 = server(&pki, "b0", "dc2", &cert(&pki, "-server", "dc2"))
        .join_wan(dc1.raft_addr)
        .start();
    eventually(WAIT, "both datacenters listed on both", || {
        (datacenters(&dc1) == ["dc1", "dc2"] && datacenters(&dc2) == ["dc2", "dc1"]).then_some(())
    });

    // A write in dc2 read from dc1, and one asked of dc1 from dc2.
    assert_eq!(dc2.put("/v1/kv/tls/where", "dc2").status, 200);
    let r = dc1.get("/v1/kv/tls/where?dc=dc2&raw");
    assert_eq!((r.status, r.body.as_str()), (200, "dc2"), "{}", r.body);
    assert_eq!(dc1.get("/v1/kv/tls/where").status, 404);
    let r = dc2.put("/v1/kv/tls/there?dc=dc1", "dc1");
    assert_eq!((r.status, r.body.trim()), (200, "true"), "{}", r.body);
    assert_eq!(dc1.get("/v1/kv/tls/there?raw").body, "dc1");
    // The primary signed dc2's intermediate over the same transport: dc2
    // serves dc1's trust domain.
    let td = dc1.get_json("/v1/connect/ca/roots")["TrustDomain"].clone();
    assert!(td.is_string(), "{td}");
    eventually(WAIT, "dc2 to hold dc1's CA roots", || {
        (dc2.get_json("/v1/connect/ca/roots")["TrustDomain"] == td).then_some(())
    });
    for s in [&dc1, &dc2] {
        assert!(
            !s.log().contains("raft TLS handshake with peer failed"),
            "{}",
            s.log()
        );
    }
}

/// A server claiming dc2 with a dc1 server's certificate is refused both
/// ways: its greeting on dc1's port (the certificate does not make it a
/// dc2 server) and its answer to dc1's greeting; a server presenting a
/// client certificate does not get through dc1's handshake. dc1 never
/// lists dc2.
#[test]
fn a_server_of_another_datacenters_certificate_or_a_client_is_refused() {
    let pki = Pki::new();
    let impostor = server(&pki, "x0", "dc2", &cert(&pki, "-server", "dc1")).start();
    let dc1 = server(&pki, "a0", "dc1", &cert(&pki, "-server", "dc1"))
        .join_wan(impostor.raft_addr)
        .start();
    let client = server(&pki, "y0", "dc3", &cert(&pki, "-client", "dc3"))
        .join_wan(dc1.raft_addr)
        .start();

    // dc1 greets the impostor (any server's certificate, to a `--join-wan`
    // address) and refuses its answer for dc2; the impostor, having learnt
    // dc1 from the greeting, greets it back and is refused on dc1's port.
    eventually(WAIT, "dc1 refusing the impostor's answer", || {
        dc1.log()
            .contains("wan greeting's answer refused: its certificate is for another datacenter")
            .then_some(())
    });
    eventually(WAIT, "dc1 refusing the impostor's greeting", || {
        dc1.log()
            .contains(r#"greeting from datacenter "dc2" with a certificate for ["dc1"]"#)
            .then_some(())
    });
    // The client certificate fails dc1's handshake.
    eventually(WAIT, "dc1 refusing the client certificate", || {
        dc1.log()
            .contains("raft connection refused: TLS handshake failed")
            .then_some(())
    });
    assert!(dc1.metric("cairn_raft_frames_refused_total") >= 3.0);

    // Nothing learnt: dc1 knows no other datacenter and forwards nowhere.
    assert_eq!(datacenters(&dc1), ["dc1"]);
    let r = dc1.get("/v1/kv/x?dc=dc2");
    assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
    // And neither gets an answer from dc1.
    let r = impostor.get("/v1/kv/x?dc=dc1");
    assert_eq!(r.status, 500, "{}", r.body);
    let r = client.get("/v1/kv/x?dc=dc1");
    assert_eq!((r.status, r.body.as_str()), (500, "No path to datacenter"));
}
