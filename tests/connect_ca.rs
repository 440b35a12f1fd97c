//! The Connect CA end to end against real servers and agents: the first
//! root in Consul's shape, leaves checked by `openssl verify` (Debian's
//! openssl) against the roots bundle with their SPIFFE SAN, a rotation by a
//! new key that keeps old leaves verifying and chains new ones to the old
//! root through the cross-signed certificate, a blocking leaf read woken by
//! the rotation, a client agent's leaf, and the configuration's checks.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;
use common::agent::Agent;
use common::pki::{verifies, write};
use serde_json::Value;

/// The certificate's subject alternative names, as openssl prints each
/// (`URI:spiffe://...`, `DNS:...`).
fn san(cert: &str) -> Vec<String> {
    let text = openssl(&["x509", "-noout", "-ext", "subjectAltName", "-in", cert]);
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

/// `openssl <what> -noout -text -in file`: what openssl reads in a
/// certificate (`x509`) or a key (`pkey`).
fn openssl_text(what: &str, file: &str) -> String {
    openssl(&[what, "-noout", "-text", "-in", file])
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

/// The subject key identifier openssl reads in a certificate, as Consul
/// shows `SigningKeyID` (lowercase, colon-separated).
fn subject_key_id(cert: &str) -> String {
    let out = Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-ext",
            "subjectKeyIdentifier",
            "-in",
            cert,
        ])
        .output()
        .expect("openssl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    text.lines().nth(1).unwrap_or_default().trim().to_string()
}

/// Puts a CA configuration that must be taken.
fn set_ca_config(s: &Server, body: &str) {
    let r = s.put("/v1/connect/ca/configuration", body);
    assert_eq!(r.status, 200, "{body}: {}", r.body);
}

/// `/v1/connect/ca/roots`, which must list `n` roots: the answer and its
/// list.
fn roots_n(s: &Server, n: usize) -> (Value, Vec<Value>) {
    let roots = s.get_json("/v1/connect/ca/roots");
    let list = roots["Roots"].as_array().unwrap().clone();
    assert_eq!(list.len(), n, "{roots}");
    (roots, list)
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
    assert_eq!(
        openssl(&["x509", "-noout", "-pubkey", "-in", &cert]),
        openssl(&["pkey", "-pubout", "-in", &key])
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
    set_ca_config(
        &s,
        r#"{"Provider":"consul","Config":{"PrivateKeyType":"ec","PrivateKeyBits":384}}"#,
    );

    let (after, roots) = roots_n(&s, 2);
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

/// The key openssl reads in a certificate or key text: RSA of `bits`, or
/// EC P-256.
fn assert_key(text: &str, key_type: &str, bits: u32, what: &str) {
    match key_type {
        "rsa" => assert!(
            text.to_lowercase().contains("modulus:") && text.contains(&format!("({bits} bit")),
            "{what} should be RSA {bits}: {text}"
        ),
        _ => assert!(
            !text.to_lowercase().contains("modulus:") && text.contains("prime256v1"),
            "{what} should be EC P-256: {text}"
        ),
    }
}

/// A rotation to RSA and back to EC, as Consul's built-in provider does:
/// each new root of the configured type, cross-signed by the one before so
/// leaves of the old type keep verifying, new leaves (a server's and a
/// client agent's) of the new type.
#[test]
fn rotations_between_ec_and_rsa_keep_leaves_verifying() {
    let s = Server::dev();
    let a = Agent::builder("a1", &s.url).start();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ec_root = write(
        dir,
        "ec-root.pem",
        s.get_json("/v1/connect/ca/roots")["Roots"][0]["RootCert"]
            .as_str()
            .unwrap(),
    );
    let ec_leaf = write(
        dir,
        "ec-leaf.pem",
        s.get_json("/v1/agent/connect/ca/leaf/web")["CertPEM"]
            .as_str()
            .unwrap(),
    );
    assert_key(&openssl_text("x509", &ec_leaf), "ec", 256, "the first leaf");

    set_ca_config(
        &s,
        r#"{"Provider":"consul","Config":{"PrivateKeyType":"rsa","PrivateKeyBits":2048}}"#,
    );
    let c = s.get_json("/v1/connect/ca/configuration");
    assert_eq!(c["Config"]["PrivateKeyType"], "rsa");
    assert_eq!(c["Config"]["PrivateKeyBits"], 2048);
    let (roots, list) = roots_n(&s, 2);
    let rsa_r = &list[1];
    assert_eq!(rsa_r["Active"], true);
    assert_eq!(roots["ActiveRootID"], rsa_r["ID"]);
    assert_eq!(
        (&rsa_r["PrivateKeyType"], &rsa_r["PrivateKeyBits"]),
        (&"rsa".into(), &2048.into())
    );
    assert_eq!(
        (&list[0]["PrivateKeyType"], &list[0]["PrivateKeyBits"]),
        (&"ec".into(), &256.into())
    );
    let rsa_root = write(dir, "rsa-root.pem", rsa_r["RootCert"].as_str().unwrap());
    let text = openssl_text("x509", &rsa_root);
    assert_key(&text, "rsa", 2048, "the new root");
    assert!(
        text.contains("sha256WithRSAEncryption"),
        "self-signed with its RSA key: {text}"
    );
    assert_eq!(
        rsa_r["SigningKeyID"].as_str().unwrap(),
        subject_key_id(&rsa_root)
    );
    let cross = rsa_r["IntermediateCerts"].as_array().unwrap();
    assert_eq!(cross.len(), 1, "{rsa_r}");
    let cross = write(dir, "cross-rsa.pem", cross[0].as_str().unwrap());
    assert!(
        openssl_text("x509", &cross).contains("ecdsa-with-SHA256"),
        "the RSA root's cross-signature is the old EC root's"
    );

    // New leaves are RSA, a server's and a client agent's alike.
    let bundle = write(dir, "roots-1.pem", &roots_pem(&s));
    let mut rsa_leaves = Vec::new();
    for (who, leaf) in [
        ("server", s.get_json("/v1/agent/connect/ca/leaf/web")),
        ("agent", a.get("/v1/agent/connect/ca/leaf/api").json()),
    ] {
        let chain = pem_blocks(leaf["CertPEM"].as_str().unwrap());
        assert_eq!(chain.len(), 2, "{who}: the leaf and the cross-signed root");
        let cert = write(dir, &format!("rsa-leaf-{who}.pem"), &chain[0]);
        let key = write(
            dir,
            &format!("rsa-key-{who}.pem"),
            leaf["PrivateKeyPEM"].as_str().unwrap(),
        );
        assert_key(&openssl_text("x509", &cert), "rsa", 2048, who);
        assert_key(&openssl_text("pkey", &key), "rsa", 2048, who);
        assert!(
            verifies(&bundle, None, &cert),
            "{who}: the RSA leaf verifies"
        );
        assert!(
            verifies(&rsa_root, None, &cert),
            "{who}: signed by the RSA root"
        );
        assert!(
            verifies(&ec_root, Some(&cross), &cert),
            "{who}: a peer trusting only the EC root verifies it through the cross-signed root"
        );
        rsa_leaves.push(cert);
    }
    assert!(
        verifies(&bundle, None, &ec_leaf),
        "the EC leaf keeps verifying"
    );

    // And back to EC: a third root, cross-signed by the RSA one.
    set_ca_config(
        &s,
        r#"{"Provider":"consul","Config":{"PrivateKeyType":"ec","PrivateKeyBits":256}}"#,
    );
    let (roots, list) = roots_n(&s, 3);
    let ec2 = &list[2];
    assert_eq!(roots["ActiveRootID"], ec2["ID"]);
    assert_eq!(
        (&ec2["PrivateKeyType"], &ec2["PrivateKeyBits"]),
        (&"ec".into(), &256.into())
    );
    let ec2_root = write(dir, "ec2-root.pem", ec2["RootCert"].as_str().unwrap());
    assert_key(
        &openssl_text("x509", &ec2_root),
        "ec",
        256,
        "the third root",
    );
    assert_eq!(
        ec2["SigningKeyID"].as_str().unwrap(),
        subject_key_id(&ec2_root)
    );
    let cross2 = write(
        dir,
        "cross-ec2.pem",
        ec2["IntermediateCerts"][0].as_str().unwrap(),
    );
    assert!(openssl_text("x509", &cross2).contains("sha256WithRSAEncryption"));
    let leaf = s.get_json("/v1/agent/connect/ca/leaf/web");
    let chain = pem_blocks(leaf["CertPEM"].as_str().unwrap());
    let cert = write(dir, "ec2-leaf.pem", &chain[0]);
    assert_key(
        &openssl_text("x509", &cert),
        "ec",
        256,
        "the leaf after going back",
    );
    let bundle = write(dir, "roots-2.pem", &roots_pem(&s));
    assert!(verifies(&bundle, None, &cert));
    assert!(
        verifies(&rsa_root, Some(&cross2), &cert),
        "through the RSA root's cross-signature"
    );
    for old in rsa_leaves.iter().chain([&ec_leaf]) {
        assert!(verifies(&bundle, None, old), "{old} keeps verifying");
    }
}

#[test]
fn configuration_is_shown_and_checked() {
    let s = Server::dev();
    let c = s.get_json("/v1/connect/ca/configuration");
    assert_eq!(c["Provider"], "consul");
    assert_eq!(c["Config"]["LeafCertTTL"], "72h");
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
            "private key type must be either 'ec' or 'rsa'",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKeyBits":1000}}"#,
            "EC key length",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKeyType":"rsa","PrivateKeyBits":1024}}"#,
            "RSA key length must be at least 2048 bits",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKeyType":"rsa","PrivateKeyBits":2049}}"#,
            "RSA key length 2049 is not supported",
        ),
        (
            r#"{"Provider":"consul","Config":{"PrivateKeyType":"ec","PrivateKeyBits":2048}}"#,
            "EC key length",
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
    set_ca_config(
        &s,
        r#"{"Provider":"consul","Config":{"LeafCertTTL":"24h"}}"#,
    );
    assert_eq!(
        s.get_json("/v1/connect/ca/configuration")["Config"]["LeafCertTTL"],
        "24h"
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
    set_ca_config(
        &servers[leader],
        r#"{"Provider":"consul","Config":{"PrivateKeyBits":384}}"#,
    );
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
    // Its data dir is its rows and its Raft log. The rows are written
    // behind (`state::write_behind`): killed a few ms after it applied
    // the restore, it finds rows from before it, and answers `?stale`
    // from them until the leader's first heartbeat tells it the commit
    // index; it then applies the restore again from its own log (as
    // Consul's followers answer from their last snapshot after a restart).
    common::eventually(
        Duration::from_secs(20),
        "the restarted server to serve the restored roots",
        || {
            let r = servers[follower].get("/v1/connect/ca/roots?stale");
            (r.status == 200 && r.json()["Roots"] == first["Roots"]).then_some(())
        },
    );
}
