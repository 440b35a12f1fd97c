//! Process metrics, rendered at `/v1/agent/metrics` in Consul's JSON form,
//! or in the OpenMetrics text exposition (by the `prometheus-client` crate)
//! with `?format=prometheus` (what Prometheus scraping Consul asks for).
//!
//! Plain atomics: counting must never contend on the request path.
//!
//! Counters are declared with `counters!`, which writes each counter and
//! the list it is rendered from in one place, so none is left out; the
//! agent's counters are declared the same way.

use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
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

/// Declares counters, `NAME = ("metric_name", "help");` each, and the
/// list `ALL` they are rendered from: each named once, so that no counter
/// is declared and left out of its list.
macro_rules! counters {
    ($all:ident: $($name:ident = ($metric:expr, $help:expr);)*) => {
        $(pub static $name: $crate::metrics::Counter =
            $crate::metrics::Counter::new($metric, $help);)*
        pub static $all: &[&$crate::metrics::Counter] = &[$(&$name),*];
    };
}
pub(crate) use counters;

counters! { ALL:
    HTTP_REQUESTS = ("cairn_http_requests_total", "HTTP requests served");
    HTTP_ERRORS = ("cairn_http_errors_total", "HTTP requests answered 4xx/5xx");
    HTTP_UNROUTED = (
        "cairn_http_unrouted_total",
        "HTTP requests for a path no endpoint serves (a client calling one this server lacks)"
    );
    HTTP_FORWARDED = (
        "cairn_http_forwarded_total",
        "HTTP requests forwarded to the leader"
    );
    ENDPOINT_FORWARDED = (
        "cairn_endpoint_forwarded_total",
        "endpoint calls sent on to the leader over the Raft port's channel"
    );
    PROXYCFG_REMOTE_REFUSED = (
        "cairn_proxycfg_remote_refused_total",
        "other datacenters' chain targets refused a watcher (over proxycfg::MAX_WATCHERS)"
    );
    WAN_FORWARDED = (
        "cairn_wan_forwarded_total",
        "HTTP requests sent to another datacenter (?dc=)"
    );
    APPLIED = (
        "cairn_raft_applied_total",
        "Raft entries applied to the state machine"
    );
    LOG_FSYNCS = ("cairn_raft_log_fsyncs_total", "fsyncs of the Raft log");
    LOG_FSYNC_BATCH = (
        "cairn_raft_log_fsync_appends_total",
        "Raft log appends made durable (divide by fsyncs for the group-commit batch size)"
    );
    WRITES_REFUSED_BUSY = (
        "cairn_writes_refused_busy_total",
        "client writes answered 429: the proposal queue was at its budget"
    );
    BLOCKING_REFUSED_BUSY = (
        "cairn_blocking_queries_refused_total",
        "blocking queries answered 429: the server was at its cap"
    );
    HTTP_CONNS_REFUSED = (
        "cairn_http_conns_refused_total",
        "HTTP connections closed at once: over the connection cap"
    );
    HTTP_SLOW_BODIES = (
        "cairn_http_slow_bodies_total",
        "HTTP requests whose body arrived slower than the least rate: answered and closed"
    );
    GRPC_CONNS_REFUSED = (
        "cairn_grpc_conns_refused_total",
        "gRPC connections closed at once: over the connection cap"
    );
    RAFT_CONNS_REFUSED = (
        "cairn_raft_conns_refused_total",
        "connections to the Raft port closed to make room for a newer one: over a connection cap"
    );
    RAFT_FRAMES_REFUSED = (
        "cairn_raft_frames_refused_total",
        "frames on the Raft port refused: too large, undecodable, or from a non-member"
    );
    BLOCKING_QUERIES = ("cairn_blocking_queries_total", "blocking queries started");
    AUTOPILOT_DEAD_REMOVED = (
        "cairn_autopilot_dead_servers_removed_total",
        "servers the leader removed from Raft as dead (autopilot's CleanupDeadServers)"
    );
    XDS_NACKS = (
        "cairn_xds_nacks_total",
        "xDS pushes a proxy or gRPC client rejected (NACK), on either ADS protocol"
    );
}

/// A value that goes up and down.
pub struct Gauge {
    name: &'static str,
    help: &'static str,
    value: AtomicU64,
}

impl Gauge {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Gauge {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
    /// Counts one more until the guard is dropped.
    pub fn hold(&'static self) -> Held {
        self.value.fetch_add(1, Ordering::Relaxed);
        Held(self)
    }
}

/// One unit of a [`Gauge`], given back on drop.
pub struct Held(&'static Gauge);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.value.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Blocking queries waiting for a change right now: tests wait for their
/// query to be parked before they write, so a wake-up is really tested.
pub static BLOCKING_PARKED: Gauge = Gauge::new(
    "cairn_blocking_queries_parked",
    "blocking queries waiting for a change",
);

/// Open `/v1/internal/stream` subscriptions (a client agent's health
/// views are among them: one per service and token it serves).
pub static STREAM_SUBSCRIPTIONS: Gauge = Gauge::new(
    "cairn_stream_subscriptions",
    "open /v1/internal/stream subscriptions",
);

static GAUGES: &[&Gauge] = &[&BLOCKING_PARKED, &STREAM_SUBSCRIPTIONS];

/// Renders the given counters (e.g. a client agent's own) plus gauges.
pub fn render_with(counters: &[&Counter], gauges: &[(&str, &str, f64)]) -> String {
    let mut registry = Registry::default();
    for c in counters {
        // The crate appends `_total` to a counter family's samples; ours
        // are named with it already (Prometheus convention).
        debug_assert!(c.name.ends_with("_total"), "{}", c.name);
        let family = c.name.strip_suffix("_total").unwrap_or(c.name);
        registry.register(family, c.help, ConstCounter::new(c.get()));
    }
    for g in GAUGES {
        registry.register(g.name, g.help, ConstGauge::new(g.get() as i64));
    }
    for (name, help, v) in gauges {
        // Whole values as integers (`1`, not `1.0`), as they always were.
        if v.fract() == 0.0 && v.abs() < 2f64.powi(53) {
            registry.register(*name, *help, ConstGauge::new(*v as i64));
        } else {
            registry.register(*name, *help, ConstGauge::new(*v));
        }
    }
    let mut out = String::new();
    text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

/// Consul's JSON form (go-metrics' in-memory summary). Consul reports each
/// counter over its last 10 s interval; cairn's counters are totals since
/// the process started, so `Count` and `Sum` are that total and the
/// per-increment figures are those of unit increments. `Points` (Consul's
/// rarely used raw points) and `Samples` (timings: cairn keeps none) are
/// empty lists, as in a Consul agent with nothing recorded.
pub fn render_json(
    counters: &[&Counter], gauges: &[(&str, &str, f64)], now: std::time::SystemTime,
) -> serde_json::Value {
    use serde_json::json;
    let gauges: Vec<_> = GAUGES
        .iter()
        .map(|g| (g.name, g.get() as f64))
        .chain(gauges.iter().map(|(name, _, v)| (*name, *v)))
        .map(|(name, v)| json!({"Name": name, "Value": v, "Labels": {}}))
        .collect();
    let counters: Vec<_> = counters
        .iter()
        .map(|c| {
            let n = c.get();
            let unit = if n > 0 { 1.0 } else { 0.0 };
            json!({
                "Name": c.name, "Count": n, "Rate": 0.0, "Sum": n as f64,
                "Min": unit, "Max": unit, "Mean": unit, "Stddev": 0.0, "Labels": {},
            })
        })
        .collect();
    json!({
        "Timestamp": go_utc(now),
        "Gauges": gauges,
        "Points": [],
        "Counters": counters,
        "Samples": [],
    })
}

/// A time as Go prints a UTC `time.Time` (`2017-08-08 02:55:10 +0000 UTC`),
/// which is how Consul writes `Timestamp`.
fn go_utc(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} +0000 UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn go_timestamps() {
        assert_eq!(go_utc(UNIX_EPOCH), "1970-01-01 00:00:00 +0000 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_502_160_910);
        assert_eq!(go_utc(t), "2017-08-08 02:55:10 +0000 UTC");
        let leap = UNIX_EPOCH + Duration::from_secs(951_825_600);
        assert_eq!(go_utc(leap), "2000-02-29 12:00:00 +0000 UTC");
    }

    #[test]
    fn text_form_keeps_the_metric_names() {
        static C: Counter = Counter::new("cairn_test_things_total", "things counted");
        C.add(3);
        let out = render_with(&[&C], &[("cairn_test_level", "a level", 2.5)]);
        let sample = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name} in {out}"))
        };
        assert_eq!(sample("cairn_test_things_total"), 3.0);
        assert_eq!(sample("cairn_test_level"), 2.5);
        assert_eq!(sample("cairn_blocking_queries_parked"), 0.0);
        assert!(out.contains("# TYPE cairn_test_things counter"), "{out}");
        assert!(out.contains("# TYPE cairn_test_level gauge"), "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
        let whole = render_with(&[], &[("cairn_test_whole", "h", 3.0)]);
        assert!(whole.contains("\ncairn_test_whole 3\n"), "{whole}");
        for c in ALL {
            assert!(
                c.name.ends_with("_total"),
                "{}: counters end in _total",
                c.name
            );
        }
    }

    #[test]
    fn json_form() {
        static C: Counter = Counter::new("c_total", "help");
        C.add(3);
        let v = render_json(&[&C], &[("g", "help", 2.5)], UNIX_EPOCH);
        let gauge = |name: &str| {
            v["Gauges"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["Name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("no gauge {name} in {v}"))
        };
        assert_eq!(gauge("g")["Value"], 2.5);
        // The process's own gauges are there too.
        assert_eq!(gauge("cairn_blocking_queries_parked")["Value"], 0.0);
        assert_eq!(v["Counters"][0]["Count"], 3);
        assert_eq!(v["Counters"][0]["Sum"], 3.0);
        assert_eq!(v["Points"], serde_json::json!([]));
        assert_eq!(v["Samples"], serde_json::json!([]));
    }
}
