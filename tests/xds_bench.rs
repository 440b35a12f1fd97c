//! The xDS benchmark (`examples/xds_bench`, `make bench` part `xds`) run
//! small against a real dev server: every stream gets its initial
//! resources, a deregistered upstream sidecar leaves every affected
//! stream's endpoints, and a proxy-defaults write reaches every stream,
//! with no stream ending in error. The figures are not judged here (a
//! shared test machine), only that each row is measured at all.
//!
//! The example is built by `cargo test` (examples are compiled with the
//! tests); alone: `cargo build --example xds_bench && cargo test --test xds_bench`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Server;

fn example() -> PathBuf {
    // target/<profile>/deps/xds_bench-<hash> → target/<profile>/examples/
    let exe = std::env::current_exe().expect("test executable");
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("examples")
        .join("xds_bench");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --example xds_bench` first",
        bin.display()
    );
    bin
}

/// `key=value` of a row line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[test]
fn a_small_run_measures_every_row_without_errors() {
    let s = Server::dev();
    let out = Command::new(example())
        .args(["--http", &s.http_addr.to_string()])
        .args(["--grpc", &s.grpc_addr.to_string()])
        .args([
            "--streams",
            "60",
            "--conns",
            "3",
            "--runs",
            "2",
            "--kv-clients",
            "1",
        ])
        .args(["--timeout", "60"])
        .output()
        .expect("run xds_bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "xds_bench failed:\n{stdout}\n{stderr}"
    );
    let row = |name: &str| -> Vec<&str> {
        stdout
            .lines()
            .filter(|l| l.starts_with(&format!("row={name} ")))
            .collect()
    };

    let initial = row("initial");
    assert_eq!(initial.len(), 1, "{stdout}");
    assert_eq!(field(initial[0], "streams"), "60");
    assert_eq!(field(initial[0], "errors"), "0", "{stderr}");

    // 60 proxies over 4 services with 3 upstreams each: every other
    // service's proxies (45 streams, less the deregistered ones) update.
    let eds = row("eds");
    assert_eq!(eds.len(), 1, "{stdout}");
    let affected: usize = field(eds[0], "affected").parse().unwrap();
    assert!(affected >= 2 * 40, "too few streams measured: {}", eds[0]);

    let defaults = row("defaults");
    assert_eq!(defaults.len(), 2, "tcp → http and back: {stdout}");
    for d in defaults {
        // All but the two deregistered proxies' streams.
        assert_eq!(field(d, "streams"), "58", "{d}");
        assert_ne!(
            field(d, "kv_writes"),
            "0",
            "KV writes measured meanwhile: {d}"
        );
        assert_eq!(field(d, "kv_errors"), "0", "{d}");
    }
    assert!(
        stderr.contains("0 streams ended with an error"),
        "streams ended in error:\n{stderr}"
    );
}
