//! One trust domain across datacenters, with real processes on loopback:
//! dc1 (the primary, one server) and dc2 (a secondary of three servers
//! joined with `--join-wan`). dc2's CA is an intermediate signed by dc1's
//! active root: its roots are dc1's (same trust domain), a leaf of either
//! datacenter verifies (`openssl verify`) against the other's roots, and a
//! root rotation in dc1 reaches dc2 (after dc2's leader crashed: the duty
//! resumes on its successor). The signing path answers no client, whatever
//! its token or route.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::acl::{ROOT, acl_started, with};
use common::pki::{verifies, write};
use common::{Server, eventually};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

const SIGN_INTERMEDIATE: &str = "/v1/internal/connect/ca/sign-intermediate";

/// The PEM blocks of a chain, in order.
fn pem_blocks(pem: &str) -> Vec<String> {
    pem.split_inclusive("-----END CERTIFICATE-----")
        .filter(|b| b.contains("BEGIN CERTIFICATE"))
        .map(|b| format!("{}\n", b.trim_start()))
        .collect()
}

/// What `openssl <args>` prints; it must succeed.
fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn roots(s: &Server) -> Value {
    s.get_json("/v1/connect/ca/roots")
}

fn roots_pem(s: &Server) -> String {
    let r = s.get("/v1/connect/ca/roots?pem=true");
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Waits until `s` (a secondary) shows the primary's trust domain and
/// active root `active`; its roots then.
fn wait_roots_of(s: &Server, trust_domain: &str, active: &str) -> Value {
    eventually(WAIT, "the secondary to hold the primary's roots", || {
        let r = s.get("/v1/connect/ca/roots");
        (r.status == 200).then(|| r.json()).filter(|v| {
            v["TrustDomain"] == trust_domain
                && v["ActiveRootID"] == active
                && v["Roots"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["Active"] == true && r["ID"] == active)
        })
    })
}

/// A leaf of `service` from `s`: its JSON, the leaf alone and the rest of
/// its chain as files.
fn leaf(s: &Server, service: &str, dir: &Path, name: &str) -> (Value, String, String) {
    let r = s.get(&format!("/v1/agent/connect/ca/leaf/{service}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let chain = pem_blocks(v["CertPEM"].as_str().unwrap());
    let leaf = write(dir, &format!("{name}.pem"), &chain[0]);
    let rest = write(dir, &format!("{name}-chain.pem"), &chain[1..].concat());
    (v, leaf, rest)
}

/// A CSR for an intermediate CA of `trust_domain`, as a secondary's leader
/// makes one (openssl's: no cairn code is trusted to make it).
fn intermediate_csr(dir: &Path, trust_domain: &str) -> String {
    let key = dir.join("int.key");
    let csr = dir.join("int.csr");
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=int",
        "-addext",
        &format!("subjectAltName=URI:spiffe://{trust_domain}"),
        "-addext",
        "basicConstraints=critical,CA:true,pathlen:0",
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        csr.to_str().unwrap(),
    ]);
    std::fs::read_to_string(csr).unwrap()
}

#[test]
fn leaves_verify_across_datacenters_and_a_rotation_reaches_the_secondary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dc1 = Server::durable("a0", dir.join("a0"))
        .datacenter("dc1")
        .start();
    let join = dc1.raft_addr.to_string();
    let mut dc2 = common::cluster(
        3,
        &[
            "--datacenter",
            "dc2",
            "--primary-datacenter",
            "dc1",
            "--join-wan",
            &join,
        ],
    );
    for s in &dc2 {
        s.wait_for_leader(WAIT);
    }

    // dc2's roots become dc1's: its trust domain, its root certificates,
    // on every server of dc2 (one Raft write there).
    let primary = roots(&dc1);
    let td = primary["TrustDomain"].as_str().unwrap().to_string();
    let active = primary["ActiveRootID"].as_str().unwrap().to_string();
    let mut secondary = Value::Null;
    for s in &dc2 {
        secondary = wait_roots_of(s, &td, &active);
    }
    let p_root = &primary["Roots"][0];
    let s_roots = secondary["Roots"].as_array().unwrap();
    assert_eq!(s_roots.len(), 1, "{secondary}");
    let s_root = &s_roots[0];
    assert_eq!(s_root["RootCert"], p_root["RootCert"]);
    assert_eq!(s_root["ID"], p_root["ID"]);
    // The active root carries dc2's intermediate, signed by dc1's root,
    // and names it as the signing key (Consul's SigningKeyID).
    let ints = s_root["IntermediateCerts"].as_array().unwrap();
    assert_eq!(ints.len(), 1, "{s_root}");
    let p_roots_file = write(dir, "dc1-roots.pem", &roots_pem(&dc1));
    let int1 = write(dir, "int1.pem", ints[0].as_str().unwrap());
    assert!(verifies(&p_roots_file, None, &int1), "dc1's root signed it");
    let ski = openssl(&[
        "x509",
        "-noout",
        "-ext",
        "subjectKeyIdentifier",
        "-in",
        &int1,
    ]);
    let ski = ski.lines().nth(1).unwrap().trim().to_lowercase();
    assert_eq!(s_root["SigningKeyID"], ski.as_str());
    assert_ne!(s_root["SigningKeyID"], p_root["SigningKeyID"]);
    let text = openssl(&["x509", "-noout", "-text", "-in", &int1]);
    assert!(text.contains("CA:TRUE, pathlen:0"), "{text}");
    assert!(text.contains(&format!("URI:spiffe://{td}")), "{text}");

    // A leaf from each server of dc2 (signed there, from its own state):
    // dc1's trust domain with dc2's datacenter, verifying against dc1's
    // roots through the intermediate its chain carries, and not without.
    let s_roots_file = write(dir, "dc2-roots.pem", &roots_pem(&dc2[0]));
    for (i, s) in dc2.iter().enumerate() {
        let (v, cert, chain) = leaf(s, "web", dir, &format!("dc2-web-{i}"));
        assert_eq!(
            v["ServiceURI"],
            format!("spiffe://{td}/ns/default/dc/dc2/svc/web").as_str()
        );
        assert!(
            verifies(&p_roots_file, Some(&chain), &cert),
            "dc2's leaf, dc1's roots"
        );
        assert!(
            verifies(&s_roots_file, Some(&chain), &cert),
            "dc2's leaf, dc2's roots"
        );
        assert!(
            !verifies(&p_roots_file, None, &cert),
            "not signed by the root itself"
        );
    }
    // And dc1's leaf verifies against dc2's roots.
    let (v, p_cert, _) = leaf(&dc1, "api", dir, "dc1-api");
    assert_eq!(
        v["ServiceURI"],
        format!("spiffe://{td}/ns/default/dc/dc1/svc/api").as_str()
    );
    assert!(
        verifies(&s_roots_file, None, &p_cert),
        "dc1's leaf, dc2's roots"
    );
    let (_, old_cert, old_chain) = leaf(&dc2[0], "web", dir, "dc2-web-old");

    // Its own progress, as replication's.
    let l = common::agreed_leader(&dc2);
    assert!(dc2[l].metric("cairn_replication_connect_ca_index") > 0.0);

    // dc2's leader crashes: the next one takes the duty over.
    dc2[l].kill();
    let l = eventually(WAIT, "another leader in dc2", || {
        let n = common::agreed_leader(&dc2);
        (n != l).then_some(n)
    });

    // A rotation in dc1 (a new key size: a new root) reaches dc2: a new
    // intermediate, signed by the new root, and leaves that chain to it.
    let r = dc1.put(
        "/v1/connect/ca/configuration",
        r#"{"Provider":"consul","Config":{"PrivateKeyType":"ec","PrivateKeyBits":384}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let rotated = roots(&dc1);
    let new_active = rotated["ActiveRootID"].as_str().unwrap().to_string();
    assert_ne!(new_active, active);
    let secondary = wait_roots_of(&dc2[l], &td, &new_active);
    assert_eq!(
        secondary["Roots"].as_array().unwrap().len(),
        2,
        "{secondary}"
    );
    let new_root = rotated["Roots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ID"] == new_active.as_str())
        .unwrap();
    let new_root_file = write(
        dir,
        "dc1-new-root.pem",
        new_root["RootCert"].as_str().unwrap(),
    );
    let s_new = secondary["Roots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["Active"] == true)
        .unwrap();
    let int2 = s_new["IntermediateCerts"][0].as_str().unwrap();
    assert_ne!(int2, ints[0].as_str().unwrap(), "a new intermediate");
    let int2 = write(dir, "int2.pem", int2);
    assert!(
        verifies(&new_root_file, None, &int2),
        "signed by the new root"
    );
    for (i, s) in dc2.iter().enumerate().filter(|(_, s)| s.is_running()) {
        let now = wait_roots_of(s, &td, &new_active);
        assert_eq!(now["Roots"], secondary["Roots"], "every server of dc2");
        let (_, cert, chain) = leaf(s, "web", dir, &format!("dc2-web-new-{i}"));
        assert!(
            verifies(&new_root_file, Some(&chain), &cert),
            "a new leaf of dc2 chains to dc1's new root alone"
        );
    }
    // dc2's own CA settings: a key size asks dc1 for a new intermediate of
    // that size, the roots staying dc1's; an operator's key has no place.
    let r = dc2[l].put(
        "/v1/connect/ca/configuration",
        r#"{"Provider":"consul","Config":{"PrivateKey":"-----BEGIN PRIVATE KEY-----"}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let r = dc2[l].put(
        "/v1/connect/ca/configuration",
        r#"{"Provider":"consul","Config":{"PrivateKeyType":"ec","PrivateKeyBits":384}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let int3 = eventually(WAIT, "dc2's P-384 intermediate", || {
        let v = roots(&dc2[l]);
        let active = v["Roots"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["Active"] == true)
            .cloned()
            .unwrap();
        let int = write(
            dir,
            "int3.pem",
            active["IntermediateCerts"][0].as_str().unwrap(),
        );
        let text = openssl(&["x509", "-noout", "-text", "-in", &int]);
        text.contains("NIST CURVE: P-384").then_some((v, int))
    });
    assert_eq!(int3.0["ActiveRootID"], new_active.as_str());
    assert_eq!(int3.0["TrustDomain"], td.as_str());
    assert!(verifies(&new_root_file, None, &int3.1));
    let r = dc2[l].get("/v1/connect/ca/configuration");
    assert_eq!(r.json()["ClusterID"], td.trim_end_matches(".consul"));

    // Leaves of before keep verifying with both datacenters' roots.
    let p_roots_file = write(dir, "dc1-roots-2.pem", &roots_pem(&dc1));
    let s_roots_file = write(dir, "dc2-roots-2.pem", &roots_pem(&dc2[l]));
    for roots in [&p_roots_file, &s_roots_file] {
        assert!(verifies(roots, Some(&old_chain), &old_cert));
        assert!(verifies(roots, None, &p_cert));
    }
}

/// The primary signs an intermediate for another datacenter's server
/// only: never for a client, be it anonymous, holding the management
/// token, or going through a secondary's `?dc=`; and a secondary under
/// default deny still gets its intermediate (its servers ask without a
/// token, the transport vouching for them).
#[test]
fn no_client_may_have_an_intermediate_signed() {
    let tmp = tempfile::tempdir().unwrap();
    let dc1 = acl_started(
        Server::durable("a0", tmp.path().join("a0")).datacenter("dc1"),
        "deny",
    );
    let dc2 = acl_started(
        Server::builder()
            .node("b0")
            .bootstrap_expect(1)
            .datacenter("dc2")
            .primary("dc1")
            .join_wan(dc1.raft_addr),
        "deny",
    );
    let primary = roots(&dc1);
    let td = primary["TrustDomain"].as_str().unwrap();
    wait_roots_of(&dc2, td, primary["ActiveRootID"].as_str().unwrap());

    // A well-formed request: had any of these been answered, the caller
    // would hold a CA of the whole trust domain.
    let body = serde_json::json!({ "CSR": intermediate_csr(tmp.path(), td) }).to_string();
    let refused = |r: common::Resp, who: &str| {
        assert_eq!(r.status, 403, "{who}: {}", r.body);
        assert!(r.body.contains("Permission denied"), "{who}: {}", r.body);
        assert!(!r.body.contains("BEGIN CERTIFICATE"), "{who}");
    };
    refused(
        common::request(dc1.http_addr, "POST", SIGN_INTERMEDIATE, Some(&body)),
        "anonymous",
    );
    refused(
        with(dc1.http_addr, "POST", SIGN_INTERMEDIATE, Some(&body), ROOT),
        "the management token",
    );
    refused(
        with(
            dc2.http_addr,
            "POST",
            &format!("{SIGN_INTERMEDIATE}?dc=dc1"),
            Some(&body),
            ROOT,
        ),
        "?dc=dc1 through dc2",
    );
    refused(
        with(dc2.http_addr, "POST", SIGN_INTERMEDIATE, Some(&body), ROOT),
        "dc2's own",
    );
    // A huge body costs a bounded read: refused (or the connection cut
    // once past the limit), nothing signed, the server still answering.
    let huge = format!(r#"{{"CSR":"{}"}}"#, "A".repeat(12 << 20));
    let headers = [("X-Consul-Token", ROOT)];
    if let Ok(r) = common::try_request_with(
        dc1.http_addr,
        "POST",
        SIGN_INTERMEDIATE,
        huge.as_bytes(),
        &headers,
    ) {
        assert!(matches!(r.status, 403 | 413), "{}", r.status);
        assert!(!r.body.contains("BEGIN CERTIFICATE"));
    }
    // The primary's CA is unchanged by all of it, and dc2 still signs.
    assert_eq!(roots(&dc1)["Roots"], primary["Roots"]);
    let r = with(
        dc2.http_addr,
        "GET",
        "/v1/agent/connect/ca/leaf/web",
        None,
        ROOT,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.json()["ServiceURI"]
            .as_str()
            .unwrap()
            .starts_with(&format!("spiffe://{td}/")),
    );
}
