//! Certificates for the tests: a CA and its certificates made by
//! `cairn tls` (`Pki`), and checked as a TLS peer would check them (files
//! written for `openssl verify`, and its verdict).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `cairn tls …` in `dir`; panics unless it succeeds. Its stdout.
pub fn cairn_tls(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(super::bin())
        .arg("tls")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run cairn tls");
    assert!(
        out.status.success(),
        "cairn tls {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A CA (`cairn tls ca create`) in its own directory, and certificates
/// made by it.
pub struct Pki {
    pub dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        cairn_tls(dir.path(), &["ca", "create"]);
        Pki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn ca(&self) -> PathBuf {
        self.path("consul-agent-ca.pem")
    }

    /// A new certificate (`cairn tls cert create` with `args`: `-server`
    /// or `-client`, and `-dc DC`): its file and key.
    pub fn cert(&self, args: &[&str]) -> (PathBuf, PathBuf) {
        let out = cairn_tls(self.dir.path(), &[&["cert", "create"], args].concat());
        let saved: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("==> Saved "))
            .collect();
        assert_eq!(saved.len(), 2, "{out}");
        (self.path(saved[0]), self.path(saved[1]))
    }

    /// The three TLS flags for a certificate of this CA.
    pub fn flags(&self, cert: &(PathBuf, PathBuf)) -> Vec<String> {
        vec![
            "--tls-ca-file".into(),
            self.ca().display().to_string(),
            "--tls-cert-file".into(),
            cert.0.display().to_string(),
            "--tls-key-file".into(),
            cert.1.display().to_string(),
        ]
    }
}

/// Writes `text` to `dir/name`; the path, for openssl's arguments.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// `openssl verify -CAfile ca [-untrusted chain] cert`: whether it said OK.
pub fn verifies(ca: &str, untrusted: Option<&str>, cert: &str) -> bool {
    let mut cmd = Command::new("openssl");
    cmd.args(["verify", "-CAfile", ca]);
    if let Some(u) = untrusted {
        cmd.args(["-untrusted", u]);
    }
    let out = cmd.arg(cert).output().expect("openssl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    out.status.success() && stdout.trim_end().ends_with(": OK")
}
