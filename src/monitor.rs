//! The process's log lines fanned out to `/v1/agent/monitor` readers: a
//! tracing layer that, while someone listens, formats each event at the
//! most verbose level any listener asked for into a broadcast channel.
//! The channel is bounded: a reader that falls behind loses the oldest
//! lines (and is told how many) rather than growing memory. With nobody
//! listening the layer costs one atomic load per event.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::broadcast;
use tracing::{Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Lines kept for the slowest reader before it starts losing them.
pub const BUFFER: usize = 1024;

/// One log line in both of Consul's monitor formats.
#[derive(Debug)]
pub struct Line {
    pub level: Level,
    /// `2026-01-02T03:04:05.678Z [INFO]  module: message: key=value`
    pub text: String,
    /// `{"@level":"info","@message":…,"@module":…,"@timestamp":…,…}`
    pub json: String,
}

struct Hub {
    tx: broadcast::Sender<Arc<Line>>,
    /// Listeners per level (index: `rank`).
    wanted: Mutex<[usize; 5]>,
    /// The most verbose level listened to, as `rank + 1` (0: none).
    max: AtomicUsize,
}

fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    HUB.get_or_init(|| Hub {
        tx: broadcast::channel(BUFFER).0,
        wanted: Mutex::new([0; 5]),
        max: AtomicUsize::new(0),
    })
}

fn rank(l: Level) -> usize {
    match l {
        Level::ERROR => 0,
        Level::WARN => 1,
        Level::INFO => 2,
        Level::DEBUG => 3,
        Level::TRACE => 4,
    }
}

/// Consul's level names (`warn` and `warning` alike); none for others.
pub fn parse_level(s: &str) -> Option<Level> {
    match s.to_ascii_lowercase().as_str() {
        "" | "info" => Some(Level::INFO),
        "trace" => Some(Level::TRACE),
        "debug" => Some(Level::DEBUG),
        "warn" | "warning" => Some(Level::WARN),
        "err" | "error" => Some(Level::ERROR),
        _ => None,
    }
}

/// Whether anyone listens at `level`; libraries' chatter below a warning
/// stays out, as it does on stderr.
fn wanted(level: &Level, target: &str) -> bool {
    let max = hub().max.load(Ordering::Relaxed);
    if max == 0 || rank(*level) >= max {
        return false;
    }
    *level <= Level::WARN || !(target.starts_with("openraft") || target.starts_with("sled"))
}

/// A listener: lines at its level or more severe, from now on.
pub struct Subscription {
    rx: broadcast::Receiver<Arc<Line>>,
    level: Level,
}

/// Starts listening at `level`.
pub fn subscribe(level: Level) -> Subscription {
    let h = hub();
    let rx = h.tx.subscribe();
    let mut w = h.wanted.lock().unwrap_or_else(|p| p.into_inner());
    w[rank(level)] += 1;
    update_max(&h.max, &w);
    Subscription { rx, level }
}

fn update_max(max: &AtomicUsize, w: &[usize; 5]) {
    let m = w.iter().rposition(|n| *n > 0).map_or(0, |i| i + 1);
    if max.swap(m, Ordering::Relaxed) != m {
        // The filter's level hint changed: let tracing recompute its
        // global maximum, so that with nobody listening a `debug!` stays
        // as cheap as stderr's level makes it.
        tracing::callsite::rebuild_interest_cache();
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let h = hub();
        let mut w = h.wanted.lock().unwrap_or_else(|p| p.into_inner());
        w[rank(self.level)] = w[rank(self.level)].saturating_sub(1);
        update_max(&h.max, &w);
    }
}

/// What a listener receives next.
pub enum Next {
    Line(Arc<Line>),
    /// It fell behind: this many lines were dropped for it.
    Dropped(u64),
}

impl Subscription {
    /// The next line at this listener's level (none once the hub is gone,
    /// which it never is in a running process).
    pub async fn next(&mut self) -> Option<Next> {
        loop {
            match self.rx.recv().await {
                Ok(l) if l.level <= self.level => return Some(Next::Line(l)),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => return Some(Next::Dropped(n)),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

/// The layer to install beside the stderr one (with its own filter: a
/// listener may ask for more than stderr shows).
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    Monitor.with_filter(Wanted)
}

/// Lets through what some listener wants; its hint is the most verbose
/// level listened to (off with none).
struct Wanted;

impl<S> tracing_subscriber::layer::Filter<S> for Wanted {
    fn enabled(&self, meta: &tracing::Metadata<'_>, _: &Context<'_, S>) -> bool {
        wanted(meta.level(), meta.target())
    }

    fn callsite_enabled(
        &self, _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        use tracing::level_filters::LevelFilter;
        Some(match hub().max.load(Ordering::Relaxed) {
            0 => LevelFilter::OFF,
            1 => LevelFilter::ERROR,
            2 => LevelFilter::WARN,
            3 => LevelFilter::INFO,
            4 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        })
    }
}

struct Monitor;

impl<S: Subscriber> Layer<S> for Monitor {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut f = Fields::default();
        event.record(&mut f);
        let now = time::OffsetDateTime::now_utc();
        let ts = format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second(),
            now.millisecond()
        );
        let level = meta.level();
        let mut text = format!("{ts} [{level}] {}: {}", meta.target(), f.message);
        let mut json = serde_json::Map::new();
        json.insert("@level".into(), level.as_str().to_ascii_lowercase().into());
        json.insert("@message".into(), f.message.clone().into());
        json.insert("@module".into(), meta.target().into());
        json.insert("@timestamp".into(), ts.into());
        for (k, v) in f.pairs {
            let _ = write!(text, ": {k}={v}");
            json.insert(k, v.into());
        }
        let line = Line {
            level: *level,
            text,
            json: serde_json::Value::Object(json).to_string(),
        };
        // No receiver left (the last one just went): nothing to do.
        let _ = hub().tx.send(Arc::new(line));
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(String, String)>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.pairs
                .push((field.name().to_string(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        if field.name() == "message" {
            self.message = v;
        } else {
            self.pairs.push((field.name().to_string(), v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[tokio::test]
    async fn lines_at_the_level_asked_and_a_slow_reader_drops() {
        let sub = tracing_subscriber::registry().with(layer());
        let _g = tracing::subscriber::set_default(sub);
        tracing::info!("before anyone listens");
        let mut warn = subscribe(Level::WARN);
        let mut debug = subscribe(Level::DEBUG);
        tracing::debug!(k = 1, "details");
        tracing::warn!("careful");
        let Some(Next::Line(l)) = debug.next().await else {
            panic!()
        };
        assert!(
            l.text.contains("[DEBUG]") && l.text.ends_with("details: k=1"),
            "{}",
            l.text
        );
        let j: serde_json::Value = serde_json::from_str(&l.json).unwrap();
        assert_eq!(
            (j["@level"].as_str(), j["k"].as_str()),
            (Some("debug"), Some("1"))
        );
        let Some(Next::Line(l)) = warn.next().await else {
            panic!()
        };
        assert!(l.text.contains("careful"));
        drop(debug);
        tracing::debug!("nobody wants this");
        for i in 0..BUFFER + 10 {
            tracing::error!(i, "flood");
        }
        // Bounded: the reader that never read lost the oldest lines.
        assert!(matches!(warn.next().await, Some(Next::Dropped(n)) if n > 0));
    }
}
