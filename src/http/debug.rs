//! Consul's `/debug/pprof/`: a CPU profile in pprof's format (sampled with
//! SIGPROF by the `pprof` crate, encoded here as pprof's protobuf, gzipped
//! as Go serves it), a thread dump where Go dumps its goroutines, and the
//! command line. Served, as Consul serves them, when ACLs are on (behind
//! operator:read) or with `--enable-debug` (on with `--dev`). Go's other
//! profiles have no counterpart in a Rust process and say so.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::App;
use crate::error::{Error, Result};
use crate::request::Params;
use crate::request::authz::Authz;

/// Samples per second of a CPU profile (Go's rate).
const HZ: i32 = 100;
/// A profile's length unless `?seconds=` says (Go's default).
const DEFAULT_SECONDS: u64 = 30;
/// The longest profile one request may hold a sampler for.
const MAX_SECONDS: u64 = 600;

pub fn routes(config: &crate::server::ServerConfig) -> Router<App> {
    if !(config.enable_debug || config.acl.enabled) {
        return Router::new();
    }
    Router::new()
        .route("/debug/pprof/", get(index))
        .route("/debug/pprof/profile", get(profile))
        .route("/debug/pprof/goroutine", get(threads))
        .route("/debug/pprof/cmdline", get(cmdline))
        .route("/debug/pprof/{name}", get(unknown))
}

fn allowed(a: &Authz) -> Result<()> {
    a.require(a.operator_read(), "operator:read", "")
}

async fn index(a: Authz) -> Result<Response> {
    allowed(&a)?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "/debug/pprof/\n\n\
         profile    a CPU profile (?seconds=N, 30 by default), pprof's format\n\
         goroutine  the process's threads and the async runtime's tasks\n\
         cmdline    the command line\n",
    )
        .into_response())
}

/// `GET /debug/pprof/profile?seconds=N`: N seconds of CPU samples of every
/// thread. One at a time, as Go's.
async fn profile(a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    allowed(&a)?;
    let p = Params::parse(q.as_deref());
    // Go takes a missing or bad value for its default.
    let seconds = p
        .get("seconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(DEFAULT_SECONDS);
    if seconds > MAX_SECONDS {
        return Err(Error::bad(format!(
            "profile duration exceeds the limit ({MAX_SECONDS} s)"
        )));
    }
    let bytes = tokio::task::spawn_blocking(move || cpu_profile(Duration::from_secs(seconds)))
        .await
        .map_err(|e| Error::Internal(format!("profile: {e}")))??;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"profile\"",
            ),
        ],
        bytes,
    )
        .into_response())
}

fn cpu_profile(length: Duration) -> Result<Vec<u8>> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(HZ)
        // Unwinding through these inside the signal handler can deadlock.
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(|e| Error::Internal(format!("Could not enable CPU profiling: {e}")))?;
    std::thread::sleep(length);
    let report = guard
        .report()
        .build()
        .map_err(|e| Error::Internal(format!("profile: {e}")))?;
    drop(guard);
    let samples = report.data.iter().map(|(frames, count)| {
        let stack = frames
            .frames
            .iter()
            .map(|inlined| {
                inlined
                    .iter()
                    .map(|s| Frame {
                        name: s.name(),
                        file: s
                            .filename
                            .as_ref()
                            .map(|f| f.display().to_string())
                            .unwrap_or_default(),
                        line: s.lineno.unwrap_or(0),
                    })
                    .collect()
            })
            .collect();
        (frames.thread_name_or_id(), stack, *count as i64)
    });
    let start = report
        .timing
        .start_time
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Ok(gzip(&encode(
        samples,
        start.as_nanos() as i64,
        report.timing.duration.as_nanos() as i64,
    )))
}

/// One symbol of a stack frame.
struct Frame {
    name: String,
    file: String,
    line: u32,
}

/// pprof's `Profile` message (profile.proto), the parts a CPU profile uses.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The profile of `samples` (thread, stack leaf first with each frame's
/// inlined symbols innermost first, count), as Go's CPU profiles are
/// typed: samples/count and cpu/nanoseconds.
fn encode(
    samples: impl Iterator<Item = (String, Vec<Vec<Frame>>, i64)>, time_nanos: i64,
    duration_nanos: i64,
) -> Vec<u8> {
    use prost::Message;
    #[derive(Default)]
    struct Tables {
        strings: Vec<String>,
        string_ids: HashMap<String, i64>,
        functions: Vec<proto::Function>,
        function_ids: HashMap<(String, String), u64>,
        locations: Vec<proto::Location>,
        location_ids: HashMap<Vec<(u64, i64)>, u64>,
    }
    impl Tables {
        fn string(&mut self, s: &str) -> i64 {
            if let Some(id) = self.string_ids.get(s) {
                return *id;
            }
            let id = self.strings.len() as i64;
            self.strings.push(s.to_string());
            self.string_ids.insert(s.to_string(), id);
            id
        }
        fn function(&mut self, f: &Frame) -> u64 {
            let key = (f.name.clone(), f.file.clone());
            if let Some(id) = self.function_ids.get(&key) {
                return *id;
            }
            let id = self.functions.len() as u64 + 1;
            let (name, filename) = (self.string(&f.name), self.string(&f.file));
            self.functions.push(proto::Function {
                id,
                name,
                system_name: name,
                filename,
            });
            self.function_ids.insert(key, id);
            id
        }
        fn location(&mut self, inlined: &[Frame]) -> u64 {
            let lines: Vec<(u64, i64)> = inlined
                .iter()
                .map(|f| (self.function(f), i64::from(f.line)))
                .collect();
            if let Some(id) = self.location_ids.get(&lines) {
                return *id;
            }
            let id = self.locations.len() as u64 + 1;
            self.locations.push(proto::Location {
                id,
                line: lines
                    .iter()
                    .map(|(function_id, line)| proto::Line {
                        function_id: *function_id,
                        line: *line,
                    })
                    .collect(),
            });
            self.location_ids.insert(lines, id);
            id
        }
    }
    let mut t = Tables::default();
    // String 0 is "" by the format's rule.
    t.string("");
    let period = 1_000_000_000 / i64::from(HZ);
    let value_type = |t: &mut Tables, ty: &str, unit: &str| proto::ValueType {
        r#type: t.string(ty),
        unit: t.string(unit),
    };
    let sample_type = vec![
        value_type(&mut t, "samples", "count"),
        value_type(&mut t, "cpu", "nanoseconds"),
    ];
    let period_type = Some(value_type(&mut t, "cpu", "nanoseconds"));
    let thread_key = t.string("thread");
    let sample: Vec<proto::Sample> = samples
        .map(|(thread, stack, count)| proto::Sample {
            location_id: stack.iter().map(|inlined| t.location(inlined)).collect(),
            value: vec![count, count * period],
            label: vec![proto::Label {
                key: thread_key,
                str: t.string(&thread),
            }],
        })
        .collect();
    proto::Profile {
        sample_type,
        sample,
        location: t.locations,
        function: t.functions,
        string_table: t.strings,
        time_nanos,
        duration_nanos,
        period_type,
        period,
    }
    .encode_to_vec()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = z.write_all(bytes);
    z.finish().unwrap_or_default()
}

/// `GET /debug/pprof/goroutine`: what a Rust process has in place of Go's
/// goroutines: its threads (name and scheduler state, from /proc) and the
/// async runtime's counts.
async fn threads(a: Authz) -> Result<Response> {
    allowed(&a)?;
    let m = tokio::runtime::Handle::current().metrics();
    let mut out = format!(
        "async runtime: {} workers, {} tasks alive, {} blocking threads\n\nthreads:\n",
        m.num_workers(),
        m.num_alive_tasks(),
        m.num_blocking_threads(),
    );
    let mut tids: Vec<u64> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    for tid in tids {
        let read = |what: &str| std::fs::read_to_string(format!("/proc/self/task/{tid}/{what}"));
        let name = read("comm").unwrap_or_default();
        // The state is the field after the parenthesised name.
        let stat = read("stat").unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?");
        out.push_str(&format!("{tid} {state} {}\n", name.trim()));
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response())
}

/// `GET /debug/pprof/cmdline`: the command line, NUL-separated as Go's.
async fn cmdline(a: Authz) -> Result<Response> {
    allowed(&a)?;
    let args: Vec<String> = std::env::args().collect();
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        args.join("\0"),
    )
        .into_response())
}

/// Go's other profiles (heap, allocs, block, mutex, threadcreate, trace):
/// Go's 404, with why cairn has none.
async fn unknown(a: Authz, Path(name): Path<String>) -> Result<Response> {
    allowed(&a)?;
    let why = match name.as_str() {
        "heap" | "allocs" => ": the allocator (mimalloc) keeps no heap profile",
        "trace" => ": Go's execution trace has no counterpart in a Rust process",
        "block" | "mutex" | "threadcreate" => ": a Go runtime profile, none in a Rust process",
        _ => "",
    };
    Err(Error::NotFound(format!("Unknown profile{why}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// A profile decodes as pprof's format with Go's CPU types, each
    /// sample's stack through locations to named functions.
    #[test]
    fn a_profile_is_pprofs_format() {
        let frame = |name: &str, line| Frame {
            name: name.into(),
            file: "src/x.rs".into(),
            line,
        };
        let samples = vec![
            (
                "worker".to_string(),
                vec![vec![frame("leaf", 3)], vec![frame("main", 9)]],
                4,
            ),
            ("worker".to_string(), vec![vec![frame("main", 9)]], 1),
        ];
        let bytes = encode(samples.into_iter(), 7, 30_000_000_000);
        let p = proto::Profile::decode(&bytes[..]).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.duration_nanos, 30_000_000_000);
        assert_eq!(p.sample[0].value, [4, 40_000_000]);
        // The shared frame is one location and one function.
        assert_eq!(p.location.len(), 2);
        assert_eq!(p.function.len(), 2);
        let name_of = |loc: u64| {
            let l = p.location.iter().find(|l| l.id == loc).unwrap();
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .unwrap();
            (s(f.name), l.line[0].line)
        };
        let stack: Vec<_> = p.sample[0]
            .location_id
            .iter()
            .map(|l| name_of(*l))
            .collect();
        assert_eq!(stack, [("leaf", 3), ("main", 9)]);
        assert_eq!(p.sample[1].location_id, [p.sample[0].location_id[1]]);
        assert_eq!(s(p.sample[0].label[0].key), "thread");
        assert_eq!(s(p.sample[0].label[0].str), "worker");
    }
}
