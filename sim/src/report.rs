//! What one simulated run found (`Report`), and the kinds of fault it
//! counts: shared by the run and the history checkers that add to it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::acl::AclStats;
use crate::dns::DnsStats;
use crate::stream_check::StreamStats;

/// The kinds of fault, counted per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    Partition,
    OneWayPartition,
    IsolateLeader,
    CrashRestart,
    /// A crash during which part of what the Raft log had not flushed
    /// reached the disk (a torn write).
    TornCrashRestart,
    /// The Raft log's next fsync fails (EIO): part of what it had not
    /// flushed is lost, Raft stops, and the server exits (fail-stop) and is
    /// restarted from its disk, as a supervisor would.
    FailedFsync,
    MessageLoss,
    Delay,
}

pub const FAULTS: [Fault; 8] = [
    Fault::Partition,
    Fault::OneWayPartition,
    Fault::IsolateLeader,
    Fault::CrashRestart,
    Fault::TornCrashRestart,
    Fault::FailedFsync,
    Fault::MessageLoss,
    Fault::Delay,
];

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub servers: usize,
    /// Hash of the whole trace: equal for two runs of one seed.
    pub trace_hash: u64,
    pub faults: BTreeMap<Fault, usize>,
    /// At most this many faults were active at once.
    pub max_concurrent_faults: usize,
    pub ops: usize,
    pub acked_writes: usize,
    pub unknown_writes: usize,
    pub reads: usize,
    pub keys_checked: usize,
    pub sim_time: Duration,
    /// The highest index of a tombstone reaped (0: none was).
    pub reaped_tombstones: u64,
    /// What the event-stream subscriber saw (checker d).
    pub stream: StreamStats,
    /// Locks the lock clients held (checker e).
    pub locks_held: usize,
    /// Locks a silent holder's TTL expiry handed to another session.
    pub ttl_handoffs: usize,
    /// Large writes of the burst acknowledged (and found whole).
    pub burst_acked: usize,
    /// Servers that stopped on a failed fsync (and were restarted).
    pub fsync_stops: usize,
    /// With ACLs on: what checker (f) saw of the deleted token.
    pub acl: Option<AclStats>,
    /// With ACLs on: what checker (g) saw of the DNS answers.
    pub dns: Option<DnsStats>,
    /// With ACLs on: what checker (j) saw of the proxies' xDS streams.
    pub mesh: Option<crate::mesh::MeshStats>,
    /// Terms whose leader duties were seen running (checker h).
    pub duty_terms: usize,
    /// Broken guarantees; empty when the run passed.
    /// Checker (i)'s timings, on the seeds that run it.
    pub rejoin: crate::rejoin::RejoinStats,
    /// The federation scenario's own (`federation`): set on its runs.
    pub federation: Option<FedStats>,
    pub failures: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The one command that replays this run.
    pub fn repro(&self) -> String {
        // The build's injected bug, if any: the replay needs the same one.
        let features = if cfg!(feature = "bug-ack-before-commit") {
            " --features bug-ack-before-commit"
        } else if cfg!(feature = "bug-stale-read") {
            " --features bug-stale-read"
        } else if cfg!(feature = "bug-stream-back-in-time") {
            " --features bug-stream-back-in-time"
        } else if cfg!(feature = "bug-failover-ignores-health") {
            " --features bug-failover-ignores-health"
        } else if cfg!(feature = "bug-xds-acl-unchanged") {
            " --features bug-xds-acl-unchanged"
        } else {
            ""
        };
        if let Some(f) = &self.federation {
            return format!(
                "cargo run -p sim --release{features} -- --federation --datacenters {} --seed {}",
                f.datacenters, self.seed
            );
        }
        format!(
            "cargo run -p sim --release{features} -- --servers {} --seed {}",
            self.servers, self.seed
        )
    }
}

/// What the federation checkers saw in one run.
#[derive(Debug, Clone, Default)]
pub struct FedStats {
    /// How many datacenters ran (two or three).
    pub datacenters: usize,
    /// Acknowledged writes per datacenter.
    pub acked: Vec<usize>,
    /// `?dc=` reads answered through each datacenter (of the next one's
    /// keys: dc2's through dc1, ..., dc1's through the last).
    pub remote_reads: Vec<usize>,
    /// Config entry writes acknowledged by the primary.
    pub config_writes: usize,
    /// What the first secondary held at the end (checker 2): policies,
    /// global tokens, config entries.
    pub replicated: (usize, usize, usize),
    /// Simulated time from the end of the workload until every secondary
    /// server held the primary's objects.
    pub converged_after: Duration,
    /// Checker (f) on the secondaries, their counts summed.
    pub acl: AclStats,
    /// Checker 5: the prepared query's executes.
    pub query: QueryStats,
}

/// What checker 5 saw in one run.
#[derive(Debug, Clone, Default)]
pub struct QueryStats {
    pub answers: usize,
    /// Answers with another datacenter's instances than the primary's.
    pub failed_over: usize,
    /// Answers with no instance at all.
    pub empty: usize,
    pub instances: usize,
    pub unanswered: usize,
}

impl QueryStats {
    /// Adds another run's figures.
    pub fn add(&mut self, o: &QueryStats) {
        self.answers += o.answers;
        self.failed_over += o.failed_over;
        self.empty += o.empty;
        self.instances += o.instances;
        self.unanswered += o.unanswered;
    }
}
