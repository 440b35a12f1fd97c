//! A server whose critical background task dies stops, naming the task,
//! instead of answering while broken. The debug build's fault hook
//! (`CAIRN_FAULT_TASK`) makes the named task panic as it starts.

mod common;

use std::time::Duration;

use common::Server;

/// `cairn::tasks::TASK_EXIT`.
const TASK_EXIT: i32 = 70;

#[test]
fn a_dead_critical_task_stops_the_server_naming_it() {
    for task in [
        "raft transport",
        "leader duties",
        "tombstone reaper",
        "write proposer",
        "event publisher",
        "proxycfg rebuilder",
        "agent lease reaper",
        "session TTL expiry",
        "agent sync",
        "coordinate probes",
        "coordinate batches",
        "autopilot dead-server cleanup",
        "federation states",
        "config entry replication",
    ] {
        let s = Server::builder()
            .dev()
            .env("CAIRN_FAULT_TASK", task)
            .spawn();
        let status = s.wait_exit(Duration::from_secs(30));
        let log = s.log();
        let status = status.unwrap_or_else(|| panic!("{task}: server still running:\n{log}"));
        assert_eq!(status.code(), Some(TASK_EXIT), "{task}: {status}\n{log}");
        assert!(
            log.contains(&format!("critical task {task:?} panicked")),
            "{task}: the log names it:\n{log}"
        );
    }
}
