//! What an idle server holds: a fresh `cairn server --dev` with a leader and
//! nothing stored keeps its heap small (issue 21: reserve by the data, not
//! by the maximum). Anonymous RSS only: the binary's mapped text differs
//! between debug and release builds and is not reserved by us.

mod common;

use common::Server;

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Transparent huge pages under the allocator (86 MB), sled's metrics
/// histograms filled in (21 MB) or base2histogram's lookup tables (25.6 MiB,
/// built by openraft's first statistics histogram; `histogram/` replaces
/// it) each took this far past the bound. A started server holds about
/// 4 MiB in a release build, 6.4 MiB in a debug one.
#[test]
fn idle_dev_server_holds_little_anonymous_memory() {
    let s = Server::dev();
    // One write and read: the Raft, apply and HTTP paths have run once.
    assert_eq!(s.put("/v1/kv/idle", "x").status, 200);
    assert_eq!(s.get("/v1/kv/idle?raw").body, "x");
    let pid = s.pid().expect("running");
    let anon = status_kib(pid, "RssAnon");
    let huge = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .map(|v| v.trim().trim_end_matches("kB").trim().to_string())
        .unwrap_or_default();
    assert!(
        anon < 16 * 1024,
        "idle server's anonymous RSS is {anon} KiB (AnonHugePages {huge} kB)"
    );
}
