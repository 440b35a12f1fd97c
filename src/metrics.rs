//! Process metrics, rendered at `/v1/agent/metrics` in Prometheus text.
//!
//! Plain atomics: counting must never contend on the request path.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counter {
    name: &'static str,
    help: &'static str,
    value: AtomicU64,
}

impl Counter {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Counter {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }
    pub fn inc(&self) {
        self.add(1)
    }
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

pub static HTTP_REQUESTS: Counter =
    Counter::new("cairn_http_requests_total", "HTTP requests served");
pub static HTTP_ERRORS: Counter =
    Counter::new("cairn_http_errors_total", "HTTP requests answered 4xx/5xx");
pub static HTTP_FORWARDED: Counter = Counter::new(
    "cairn_http_forwarded_total",
    "HTTP requests forwarded to the leader",
);
pub static APPLIED: Counter = Counter::new(
    "cairn_raft_applied_total",
    "Raft entries applied to the state machine",
);
pub static LOG_FSYNCS: Counter =
    Counter::new("cairn_raft_log_fsyncs_total", "fsyncs of the Raft log");
pub static LOG_FSYNC_BATCH: Counter = Counter::new(
    "cairn_raft_log_fsync_appends_total",
    "Raft log appends made durable (divide by fsyncs for the group-commit batch size)",
);
pub static BLOCKING_QUERIES: Counter =
    Counter::new("cairn_blocking_queries_total", "blocking queries started");
pub static WRITES_REFUSED_BUSY: Counter = Counter::new(
    "cairn_writes_refused_busy_total",
    "client writes answered 429: the proposal queue was at its budget",
);
pub static BLOCKING_REFUSED_BUSY: Counter = Counter::new(
    "cairn_blocking_queries_refused_total",
    "blocking queries answered 429: the server was at its cap",
);
pub static HTTP_CONNS_REFUSED: Counter = Counter::new(
    "cairn_http_conns_refused_total",
    "HTTP connections closed at once: over the connection cap",
);
pub static RAFT_CONNS_REFUSED: Counter = Counter::new(
    "cairn_raft_conns_refused_total",
    "connections to the Raft port closed to make room for a newer one: over a connection cap",
);
pub static RAFT_FRAMES_REFUSED: Counter = Counter::new(
    "cairn_raft_frames_refused_total",
    "frames on the Raft port refused: too large, undecodable, or from a non-member",
);

static ALL: &[&Counter] = &[
    &HTTP_REQUESTS,
    &HTTP_ERRORS,
    &HTTP_FORWARDED,
    &APPLIED,
    &LOG_FSYNCS,
    &LOG_FSYNC_BATCH,
    &WRITES_REFUSED_BUSY,
    &BLOCKING_REFUSED_BUSY,
    &HTTP_CONNS_REFUSED,
    &RAFT_CONNS_REFUSED,
    &RAFT_FRAMES_REFUSED,
    &BLOCKING_QUERIES,
];

/// Renders the counters plus gauges supplied by the caller.
pub fn render(gauges: &[(&str, &str, f64)]) -> String {
    render_with(ALL, gauges)
}

/// Renders the given counters (e.g. a client agent's own) plus gauges.
pub fn render_with(counters: &[&Counter], gauges: &[(&str, &str, f64)]) -> String {
    let mut out = String::new();
    for c in counters {
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} counter\n{} {}",
            c.name,
            c.help,
            c.name,
            c.name,
            c.get()
        );
    }
    for (name, help, v) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    out
}
