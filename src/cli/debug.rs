//! `cairn debug`, as `consul debug`: a live bundle of what an operator
//! sends when asking for help — the agent's self, host and members at
//! once; its metrics (`/v1/agent/metrics/stream`) and logs (`monitor`,
//! debug level) for the whole `-duration`; a CPU profile over it and a
//! thread dump per `-interval` (`/debug/pprof/`); in one directory, by
//! default archived as `<output>.tar.gz`. The caller needs operator:read
//! for the profiles and agent:read for the rest, as Consul's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::{CliError, CliResult, Client};

/// Consul's shortest interval.
const MIN_INTERVAL: Duration = Duration::from_secs(5);
/// What `-capture` may name (Consul's targets).
const TARGETS: [&str; 6] = ["agent", "host", "members", "metrics", "logs", "pprof"];

#[derive(Args, Debug)]
pub struct DebugArgs {
    /// How long to capture metrics, logs and the CPU profile.
    #[arg(long, value_parser = go_duration, default_value = "5m")]
    duration: Duration,
    /// How often to take the interval captures (a thread dump); at least 5s.
    #[arg(long, value_parser = go_duration, default_value = "30s")]
    interval: Duration,
    /// What to capture (repeatable): agent, host, members, metrics, logs,
    /// pprof. Default: all.
    #[arg(long)]
    capture: Vec<String>,
    /// The bundle's directory (and archive's name); default
    /// `consul-debug-<unix time>` here, as Consul's.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Archive the directory as `<output>.tar.gz` and remove it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    archive: bool,
}

fn go_duration(s: &str) -> Result<Duration, String> {
    let d = crate::structs::duration::Duration::parse(s)?;
    u64::try_from(d.nanos())
        .map(Duration::from_nanos)
        .map_err(|_| "must not be negative".into())
}

pub fn run(c: &Client, a: DebugArgs) -> CliResult {
    if a.interval < MIN_INTERVAL {
        return Err(CliError(format!(
            "interval must be longer than {}s",
            MIN_INTERVAL.as_secs()
        )));
    }
    if a.duration < a.interval {
        return Err(CliError(format!(
            "duration ({:?}) must be longer than interval ({:?})",
            a.duration, a.interval
        )));
    }
    let targets: Vec<&str> = if a.capture.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in &a.capture {
            if !TARGETS.contains(&t.as_str()) {
                return Err(CliError(format!(
                    "invalid capture target {t:?}: one of {}",
                    TARGETS.join(", ")
                )));
            }
        }
        TARGETS
            .into_iter()
            .filter(|t| a.capture.iter().any(|c| c == t))
            .collect()
    };
    let wants = |t: &str| targets.contains(&t);
    // Reachable, and the token may read the agent: before anything runs.
    let me = c
        .get_json("/v1/agent/self")
        .map_err(|e| CliError(format!("error querying target agent: {}", e.0)))?;
    let output = a.output.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        PathBuf::from(format!("consul-debug-{}", now.as_secs()))
    });
    let archive = output.with_file_name(format!(
        "{}.tar.gz",
        output.file_name().unwrap_or_default().to_string_lossy()
    ));
    if output.exists() || (a.archive && archive.exists()) {
        return Err(CliError(format!(
            "output directory already exists: {}",
            output.display()
        )));
    }
    std::fs::create_dir_all(&output)?;
    let write = |name: &str, bytes: &[u8]| -> CliResult {
        std::fs::write(output.join(name), bytes)
            .map_err(|e| CliError(format!("writing {name}: {e}")))
    };
    let pretty = |v: &serde_json::Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    println!(
        "==> Starting debugger and capturing static information...\n     Agent Version: '{}'\n          Interval: '{:?}'\n          Duration: '{:?}'\n           Capture: '{}'",
        me["Config"]["Version"].as_str().unwrap_or(""),
        a.interval,
        a.duration,
        targets.join(", ")
    );
    write(
        "index.json",
        &pretty(&json!({
            "Version": 2,
            "AgentVersion": me["Config"]["Version"],
            "Interval": format!("{:?}", a.interval),
            "Duration": format!("{:?}", a.duration),
            "Targets": targets,
        })),
    )?;
    if wants("agent") {
        write("agent.json", &pretty(&me))?;
    }
    if wants("host") {
        write("host.json", &pretty(&c.get_json("/v1/agent/host")?))?;
    }
    if wants("members") {
        write("members.json", &pretty(&c.get_json("/v1/agent/members")?))?;
    }
    println!("==> Beginning capture interval (up to {:?})", a.duration);
    let captured = c.block_on(capture(c, &a, &targets, &output))?;
    for (name, bytes) in captured {
        write(&name, &bytes)?;
    }
    if a.archive {
        archive_dir(&output, &archive)?;
        std::fs::remove_dir_all(&output)?;
        println!("Saved debug archive: {}", archive.display());
    } else {
        println!("Saved debug directory: {}", output.display());
    }
    Ok(())
}

/// The captures over the duration, at once: the metrics and log streams,
/// the CPU profile, and a thread dump at the start of each interval.
async fn capture(
    c: &Client, a: &DebugArgs, targets: &[&str], output: &Path,
) -> Result<Vec<(String, Vec<u8>)>, CliError> {
    let wants = |t: &str| targets.contains(&t);
    let until = Instant::now() + a.duration;
    let streamed = |path: &'static str, name: &'static str, on: bool| async move {
        if !on {
            return Ok(None);
        }
        c.stream_until(path, until)
            .await
            .map(|b| Some((name.to_string(), b)))
    };
    let profile = async {
        if !wants("pprof") {
            return Ok(None);
        }
        let path = format!(
            "/debug/pprof/profile?seconds={}",
            a.duration.as_secs().max(1)
        );
        c.bytes(&path, a.duration + Duration::from_secs(30))
            .await
            .map(|b| Some(("profile.prof".to_string(), b)))
    };
    let dumps = async {
        let mut out = Vec::new();
        if !wants("pprof") {
            return Ok(out);
        }
        let mut at = Instant::now();
        while at < until {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            let b = c
                .bytes("/debug/pprof/goroutine", Duration::from_secs(30))
                .await?;
            // One directory per interval, as Consul's.
            std::fs::create_dir_all(output.join(stamp.to_string()))?;
            out.push((format!("{stamp}/goroutine.prof"), b));
            at += a.interval;
            if at >= until {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
        }
        Ok::<_, CliError>(out)
    };
    let (metrics, logs, profile, dumps) = tokio::join!(
        streamed("/v1/agent/metrics/stream", "metrics.json", wants("metrics")),
        streamed(
            "/v1/agent/monitor?loglevel=debug",
            "consul.log",
            wants("logs")
        ),
        profile,
        dumps
    );
    let mut all: Vec<(String, Vec<u8>)> =
        [metrics?, logs?, profile?].into_iter().flatten().collect();
    all.extend(dumps?);
    Ok(all)
}

/// `dir` as a gzipped tar at `to`, its entries under the directory's name.
fn archive_dir(dir: &Path, to: &Path) -> CliResult {
    let file = std::fs::File::create(to)?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let name = dir.file_name().unwrap_or_default();
    tar.append_dir_all(name, dir)?;
    tar.into_inner()?.finish()?;
    Ok(())
}
