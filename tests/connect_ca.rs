//! The Connect CA end to end against real servers and agents: the first
//! root in Consul's shape, leaves checked by `openssl verify` (Debian's
//! openssl) against the roots bundle with their SPIFFE SAN, a rotation by a
//! new key that keeps old leaves verifying and chains new ones to the old
//! root through the cross-signed certificate, a blocking leaf read woken by
//! the rotation, a client agent's leaf, and the configuration's checks.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;
use common::agent::Agent;
use serde_json::Value;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// `openssl verify -CAfile ca [-untrusted chain] cert`: whether it said OK.
fn verifies(ca: &str, untrusted: Option<&str>, cert: &str) -> bool {
    let mut cmd = Command::new("openssl");
    cmd.args(["verify", "-CAfile", ca]);
    if let Some(u) = untrusted {
        cmd.args(["-untrusted", u]);
    }
    let out = cmd.arg(cert).output().expect("openssl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    out.status.success() && stdout.trim_end().ends_with(": OK")
}

/// The certificate's subject alternative names, as openssl prints each
/// (`URI:spiffe://...`, `DNS:...`).
fn san(cert: &str) -> Vec<String> {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in", cert])
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let names = text.lines().nth(1).unwrap_or_default();
    names.split(',').map(|n| n.trim().to_string()).collect()
}

/// The PEM blocks of a chain, in order.
fn pem_blocks(pem: &str) -> Vec<String> {
    pem.split_inclusive("-----END CERTIFICATE-----")
        .filter(|b| b.contains("BEGIN CERTIFICATE"))
        .map(|b| format!("{}\n", b.trim_start()))
        .collect()
}

fn roots_pem(s: &Server) -> String {
    let r = s.get("/v1/connect/ca/roots?pem=true");
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

#[test]
fn roots_have_consuls_shape() {
    let s = Server::dev();
    let r = s.get("/v1/connect/ca/roots");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.index() > 0);
    let v = r.json();
    let td = v["TrustDomain"].as_str().unwrap();
    let cluster = td.strip_suffix(".consul").expect("<cluster id>.consul");
    assert_eq!(cluster.len(), 36, "a UUID: {td}");
    let roots = v["Roots"].as_array().unwrap();
    assert_eq!(roots.len(), 1, "{v}");
    let root = &roots[0];
    assert_eq!(v["ActiveRootID"], root["ID"]);
    assert_eq!(root["Active"], true);
    assert_eq!(root["Name"], "Consul CA Primary Cert");
    assert_eq!(root["PrivateKeyType"], "ec");
    assert_eq!(root["PrivateKeyBits"], 256);
    assert!(root["SerialNumber"].as_u64().unwrap() > 0);
    for k in ["ID", "SigningKeyID", "NotBefore", "NotAfter"] {
        assert!(!root[k].as_str().unwrap().is_empty(), "{k}: {root}");
    }
    assert!(
        root["RootCert"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    assert_eq!(root["IntermediateCerts"], Value::Array(vec![]));
    assert!(root["CreateIndex"].as_u64().unwrap() > 0);
    assert!(
        root.get("SigningKey").is_none(),
        "the CA key is never shown"
    );
    // py-consul's agent path answers the same.
    assert_eq!(
        s.get_json("/v1/agent/connect/ca/roots")["ActiveRootID"],
        v["ActiveRootID"]
    );
}

#[test]
fn leaf_verifies_against_the_roots_with_its_spiffe_id() {
    let s = Server::dev();
    let tmp = tempfile::tempdir().unwrap();
    let td = s.get_json("/v1/connect/ca/roots")["TrustDomain"]
        .as_str()
        .unwrap()
        .to_string();
    let leaf = s.get("/v1/agent/connect/ca/leaf/web");
    assert_eq!(leaf.status, 200, "{}", leaf.body);
    let v = leaf.json();
    let uri = format!("spiffe://{td}/ns/default/dc/dc1/svc/web");
    assert_eq!(v["Service"], "web");
    assert_eq!(v["ServiceURI"], uri.as_str());
    assert!(v["PrivateKeyPEM"].as_str().unwrap().contains("PRIVATE KEY"));
    let roots = write(tmp.path(), "roots.pem", &roots_pem(&s));
    let cert = write(tmp.path(), "leaf.pem", v["CertPEM"].as_str().unwrap());
    assert!(
        verifies(&roots, None, &cert),
        "the leaf verifies against the roots"
    );
    let short = &td[..8];
    assert_eq!(
        san(&cert),
        [
            format!("URI:{uri}"),
            format!("DNS:web.svc.default.{short}.consul")
        ]
    );
    // Its key is the certificate's.
    let key = write(tmp.path(), "leaf.key", v["PrivateKeyPEM"].as_str().unwrap());
    let pubkey = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(out.status.success());
        out.stdout
    };
    assert_eq!(
        pubkey(&["x509", "-noout", "-pubkey", "-in", &cert]),
        pubkey(&["pkey", "-pubout", "-in", &key])
    );
    // A second read is the same (cached) leaf, at the same index.
    let again = s.get("/v1/agent/connect/ca/leaf/web");
    assert_eq!(again.json()["SerialNumber"], v["SerialNumber"]);
    // Bad names are refused.
    assert_eq!(s.get("/v1/agent/connect/ca/leaf/we%20b").status, 400);
}

#[test]
fn rotation_keeps_old_leaves_valid_and_wakes_blocking_leaf_reads() {
    let s = Server::dev();
    let tmp = tempfile::tempdir().unwrap();
    let before = s.get_json("/v1/connect/ca/roots");
    let old_root = before["Roots"][0]["RootCert"].as_str().unwrap().to_string();
    let old_root_file = write(tmp.path(), "old-root.pem", &old_root);
    let old = s.get("/v1/agent/connect/ca/leaf/web");
    let old_index = old.index();
    let old_leaf = write(
        tmp.path(),
        "old-leaf.pem",
        old.json()["CertPEM"].as_str().unwrap(),
    );

    // A blocking read of the leaf, waiting for a new one.
    let parked = s.parked();
    let addr = s.http_addr;
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let r = common::request(
            addr,
            "GET",
            &format!("/v1/agent/connect/ca/leaf/web?index={old_index}&wait=30s"),
            None,
        );
        (r, started.elapsed())
    });
    // Rotated only once it waits: a read arriving after would answer at once.
    s.wait_parked(parked + 1);

    // A new key type size asks for a new root.
    let r = s.put(
        "/v1/connect/ca/configuration",
        r#"{"Provider":"consul","Config":{"PrivateKeyType":"ec","PrivateKeyBits":384}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    let after = s.get_json("/v1/connect/ca/roots");
    let roots = after["Roots"].as_array().unwrap();
    assert_eq!(roots.len(), 2, "{after}");
    let (old_r, new_r) = (&roots[0], &roots[1]);
    assert_eq!(old_r["ID"], before["ActiveRootID"]);
    assert_eq!(old_r["Active"], false);
    assert_eq!(new_r["Active"], true);
    assert_eq!(after["ActiveRootID"], new_r["ID"]);
    assert_eq!(new_r["PrivateKeyBits"], 384);
    assert_eq!(
        new_r["IntermediateCerts"].as_array().unwrap().len(),
        1,
        "the old root's cross-signature of the new one"
    );

    let (woken, took) = waiter.join().unwrap();
    assert_eq!(woken.status, 200, "{}", woken.body);
    assert!(
        took < Duration::from_secs(10),
        "the rotation woke the read: {took:?}"
    );
    assert!(woken.index() > old_index);
    let new = woken.json();
    assert_ne!(new["SerialNumber"], old.json()["SerialNumber"]);

    let bundle = write(tmp.path(), "roots.pem", &roots_pem(&s));
    assert!(
        verifies(&bundle, None, &old_leaf),
        "old leaves keep verifying"
    );
    let chain = pem_blocks(new["CertPEM"].as_str().unwrap());
    assert_eq!(chain.len(), 2, "the new leaf and the cross-signed root");
    let new_leaf = write(tmp.path(), "new-leaf.pem", &chain[0]);
    let cross = write(tmp.path(), "cross.pem", &chain[1]);
    let new_root_file = write(
        tmp.path(),
        "new-root.pem",
        new_r["RootCert"].as_str().unwrap(),
    );
    assert!(
        verifies(&new_root_file, None, &new_leaf),
        "signed by the new root"
    );
    assert!(
        !verifies(&old_root_file, None, &new_leaf),
        "not by the old root directly"
    );
    assert!(
        verifies(&old_root_file, Some(&cross), &new_leaf),
        "a peer trusting only the old root verifies it through the cross-signed root"
    );
    assert!(verifies(&bundle, None, &new_leaf));
}

#[test]
fn configuration_is_shown_and_checked() {
    let s = Server::dev();
    let c = s.get_json("/v1/connect/ca/configuration");
    assert_eq!(c["Provider"], "consul");
    assert_eq!(c["Config"]["LeafCertTTL"], "72h0m0s");
    assert_eq!(c["Config"]["PrivateKeyType"], "ec");
    assert_eq!(c["Config"]["PrivateKeyBits"], 256);
    assert_eq!(
        c["ClusterID"].as_str().unwrap(),
        s.get_json("/v1/connect/ca/roots")["TrustDomain"]
            .as_str()
            .unwrap()
            .trim_end_matches(".consul")
    );
    for (body, why) in [
        (r#"{"Provider":"vault","Config":{}}"#, "not supported"),
        (
            r#"{"Provider":"consul","Config":{"LeafCertTTL":"10m"}}"#,
            "leaf cert TTL",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKeyType":"dsa"}}"#,
            "private key type",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKeyBits":1000}}"#,
            "EC key length",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKeyType":"rsa"}}"#,
            "rsa",
        ),
        (
            r#"{"Provider":"consul","Config":{"LeafCertTTL":"1h","IntermediateCertTTL":"2h"}}"#,
            "Intermediate Cert TTL",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKey":"nope"}}"#,
            "private key",
        ),
        ("[1]", "decode"),
    ] {
        let r = s.put("/v1/connect/ca/configuration", body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(
            r.body.to_lowercase().contains(&why.to_lowercase()),
            "{body}: {}",
            r.body
        );
    }
    // Nothing changed.
    assert_eq!(s.get_json("/v1/connect/ca/configuration"), c);
    // A new TTL without a new key changes the configuration, not the root.
    let r = s.put(
        "/v1/connect/ca/configuration",
        r#"{"Provider":"consul","Config":{"LeafCertTTL":"24h"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        s.get_json("/v1/connect/ca/configuration")["Config"]["LeafCertTTL"],
        "24h0m0s"
    );
    assert_eq!(
        s.get_json("/v1/connect/ca/roots")["Roots"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_client_agents_leaf_is_signed_by_a_server() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    let tmp = tempfile::tempdir().unwrap();
    let leaf = a.get("/v1/agent/connect/ca/leaf/api");
    assert_eq!(leaf.status, 200, "{}", leaf.body);
    let v = leaf.json();
    let td = s.get_json("/v1/connect/ca/roots")["TrustDomain"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        v["ServiceURI"],
        format!("spiffe://{td}/ns/default/dc/dc1/svc/api")
    );
    assert!(v["PrivateKeyPEM"].as_str().unwrap().contains("PRIVATE KEY"));
    let roots = write(tmp.path(), "roots.pem", &roots_pem(&s));
    let cert = write(tmp.path(), "leaf.pem", v["CertPEM"].as_str().unwrap());
    assert!(verifies(&roots, None, &cert));
    assert_eq!(
        san(&cert)[0],
        format!("URI:spiffe://{td}/ns/default/dc/dc1/svc/api")
    );
    // The agent keeps it: the same leaf again.
    assert_eq!(
        a.get("/v1/agent/connect/ca/leaf/api").json()["SerialNumber"],
        v["SerialNumber"]
    );
    // The server's sign endpoint refuses a CSR that is not a SPIFFE service
    // ID of this cluster.
    let r = s.put("/v1/internal/connect/ca/sign", r#"{"CSR":"garbage"}"#);
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn the_ca_is_replicated_survives_restarts_and_snapshot_restores() {
    let mut servers = common::cluster(3, &[]);
    let leader = servers
        .iter()
        .position(|s| s.get("/v1/status/leader").json() == Value::String(s.raft_addr.to_string()))
        .unwrap_or(0);
    let first = servers[leader].get_json("/v1/connect/ca/roots");
    // Every server holds the same CA (any of them answers `?stale`).
    for s in &servers {
        let stale = common::eventually(Duration::from_secs(10), "the roots replicated", || {
            let r = s.get("/v1/connect/ca/roots?stale");
            (r.status == 200 && r.json()["ActiveRootID"] == first["ActiveRootID"]).then_some(r)
        });
        assert_eq!(stale.json()["Roots"], first["Roots"]);
    }
    // A follower signs leaves with the same root.
    let follower = (leader + 1) % servers.len();
    let tmp = tempfile::tempdir().unwrap();
    let leaf = servers[follower].get_json("/v1/agent/connect/ca/leaf/web");
    let bundle = write(tmp.path(), "roots.pem", &roots_pem(&servers[leader]));
    let cert = write(tmp.path(), "leaf.pem", leaf["CertPEM"].as_str().unwrap());
    assert!(verifies(&bundle, None, &cert));

    // A snapshot holds the CA: restoring it after a rotation brings the
    // first root back as the active one.
    let file = tmp.path().join("backup.snap");
    let file = file.to_str().unwrap();
    let out = common::cli(&servers[leader].url, &["snapshot", "save", file]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = servers[leader].put(
        "/v1/connect/ca/configuration",
        r#"{"Provider":"consul","Config":{"PrivateKeyBits":384}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(
        servers[leader].get_json("/v1/connect/ca/roots")["ActiveRootID"],
        first["ActiveRootID"]
    );
    let out = common::cli(&servers[leader].url, &["snapshot", "restore", file]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        servers[leader].get_json("/v1/connect/ca/roots")["Roots"],
        first["Roots"]
    );

    // A restarted server loads the CA from its data dir (once it has
    // applied the restore: the leader answers the restore at its own).
    common::eventually(
        Duration::from_secs(20),
        "the follower to apply the restore",
        || {
            let r = servers[follower].get("/v1/connect/ca/roots?stale");
            (r.status == 200 && r.json()["Roots"] == first["Roots"]).then_some(())
        },
    );
    servers[follower].restart();
    let again = common::eventually(
        Duration::from_secs(20),
        "the restarted server's roots",
        || {
            let r = servers[follower].get("/v1/connect/ca/roots?stale");
            (r.status == 200).then(|| r.json())
        },
    );
    assert_eq!(again["Roots"], first["Roots"]);
}
