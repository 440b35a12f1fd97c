//! Certificates checked as a TLS peer would check them: files written for
//! `openssl verify`, and its verdict.

use std::path::Path;
use std::process::Command;

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
